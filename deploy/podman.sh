# Podman for orderd's scripts: installed from Debian when missing (podman, runc, and
# catatonit for `podman kube play`), run with the project's containers.conf. Sourced
# after .ci/lib.sh, not run.

ensure_podman() {
    local missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    [ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null 2>&1 || missing+=(catatonit)
    [ "${#missing[@]}" = 0 ] || apt_install "${missing[@]}"
    export CONTAINERS_CONF="$ORDERD_ROOT/deploy/containers.conf"
}
