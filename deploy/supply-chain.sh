# The image's supply chain, with stock tools: the SBOM of the Rust dependencies
# (cargo-cyclonedx), their licences against the allow list in deny.toml and their known
# advisories against a snapshot of the RustSec database (cargo-deny; the live database
# cannot be fetched on every machine), and the image signed with a GnuPG key and checked
# through a podman trust policy. Sourced after .ci/lib.sh, not run.

# Where the cargo-installed tools (and the unpacked advisory database) live: outside any
# checkout, so that a user's clones build each tool once, and in a directory of that
# user's alone: CI runs what it finds there, and in a shared one (/var/tmp) anyone on the
# machine could leave a cargo-deny of their own for it to run.
ORDERD_TOOLS="${ORDERD_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/orderd-tools}"

# Fails, naming what is wrong, unless path $1 can be changed by the current user alone:
# it and everything between it and ORDERD_TOOLS owned by this user and writable by no
# group or other user; each directory above ORDERD_TOOLS owned by this user or root, and
# writable by others only when sticky (/var/tmp: there others cannot rename or remove
# what is ours). Symlinks are resolved first, so the check is of what would be run.
owner_only() {
    local path cache uid inside owner mode
    path="$(realpath -e -- "$1" 2>/dev/null)" || { log "$1 does not exist"; return 1; }
    cache="$(realpath -e -- "$ORDERD_TOOLS" 2>/dev/null)" || { log "$ORDERD_TOOLS does not exist"; return 1; }
    uid="$(id -u)"
    inside=1
    while :; do
        [ "$path" = "$(dirname -- "$cache")" ] && inside=0
        read -r owner mode < <(stat -c '%u %a' -- "$path")
        if [ "$inside" = 1 ]; then
            [ "$owner" = "$uid" ] || { log "$path belongs to uid $owner, not to this user ($uid)"; return 1; }
            (( (8#$mode & 8#022) == 0 )) || { log "$path is writable by others (mode $mode)"; return 1; }
        else
            [ "$owner" = "$uid" ] || [ "$owner" = 0 ] \
                || { log "$path, above $cache, belongs to uid $owner"; return 1; }
            (( (8#$mode & 8#022) == 0 || (8#$mode & 8#1000) != 0 )) \
                || { log "$path, above $cache, is writable by others (mode $mode) and not sticky"; return 1; }
        fi
        [ "$path" = / ] && return 0
        path="$(dirname -- "$path")"
    done
}

# Creates ORDERD_TOOLS (mode 0700) when missing; fails unless only its owner can change it.
tools_dir() {
    [ -d "$ORDERD_TOOLS" ] || (umask 077 && mkdir -p -- "$ORDERD_TOOLS")
    owner_only "$ORDERD_TOOLS" \
        || { log "refusing the tool cache $ORDERD_TOOLS: remove it, or set ORDERD_TOOLS to a directory of your own"; return 1; }
}

# Prints the path of cargo subcommand binary $1 (crate $1, version $2), installing it
# with `cargo install --locked` when missing. Each version has a root of its own under
# ORDERD_TOOLS, and the binary's sha256, recorded when it was built, is checked on every
# use: a binary that changed since, or that someone else could have changed, is refused,
# not run.
cargo_tool() {
    local name="$1" version="$2" root sum bin digest
    tools_dir || return 1
    root="$ORDERD_TOOLS/$name-$version"
    sum="$root.sha256"
    bin="$root/bin/$name"
    if [ ! -f "$sum" ]; then
        log "building $name $version into $root (once per user and machine)"
        # Under umask 077, whatever the user's: with Debian's usual 002 the binary would
        # be group-writable, and refused below.
        (umask 077 && cargo install --quiet --locked --force --root "$root" --version "$version" "$name") >&2 \
            || return 1
        digest="$(sha256sum <"$bin" | cut -d ' ' -f 1)" || return 1
        (umask 077 && printf '%s\n' "$digest" >"$sum")
    fi
    owner_only "$bin" && owner_only "$sum" \
        || { log "refusing $bin: others could have changed it"; return 1; }
    [ "$(sha256sum <"$bin" | cut -d ' ' -f 1)" = "$(cat "$sum")" ] \
        || { log "refusing $bin: it is not the binary built there (its sha256 differs from $sum's)"; return 1; }
    printf '%s\n' "$bin"
}

# Writes the CycloneDX SBOM of orderd's Rust dependencies (what the release binary
# links) to $1.
sbom() {
    local out="$1" tool
    tool="$(cargo_tool cargo-cyclonedx 0.5.9)"
    "$tool" cyclonedx --quiet --format json --spec-version 1.5 --target x86_64-unknown-linux-gnu \
        --no-build-deps --override-filename orderd.cdx --manifest-path "$ORDERD_ROOT/Cargo.toml"
    mv "$ORDERD_ROOT/orderd.cdx.json" "$out"
}

# Fails unless every dependency's licence is on the allow list of deny.toml (or of the
# cargo-deny configuration $1).
check_licences() {
    local tool
    tool="$(cargo_tool cargo-deny 0.20.2)"
    "$tool" deny --manifest-path "$ORDERD_ROOT/Cargo.toml" --log-level error \
        --config "${1:-$ORDERD_ROOT/deny.toml}" check licenses
}

# Where cargo-deny 0.20 looks for the default RustSec database under its `db-path`: the
# URL's last segment and the XxHash64 of the URL.
RUSTSEC_DB_DIR=advisory-db-3157b0e258782691

# Unpacks RustSec database snapshot $1 (a .tar.gz of a clone of rustsec/advisory-db, its
# one folder advisory-db/) into ORDERD_TOOLS, once per snapshot; prints the directory to
# give cargo-deny as `db-path`.
advisory_dbs() {
    local snapshot="$1" root db partial
    tools_dir || return 1
    root="$ORDERD_TOOLS/advisory-dbs/$(basename "$snapshot" .tar.gz)-$(sha256sum <"$snapshot" | cut -c 1-12)"
    db="$root/$RUSTSEC_DB_DIR"
    if [ ! -d "$db" ]; then
        log "unpacking $snapshot into $root (once per snapshot)"
        partial="$root.partial"
        rm -rf "$partial"
        (umask 077 && mkdir -p "$partial" \
            && tar xzf "$snapshot" -C "$partial" --no-same-owner --no-same-permissions \
            && mv "$partial/advisory-db" "$partial/$RUSTSEC_DB_DIR") || return 1
        # Offline, cargo-deny dates a database by .git/HEAD's modification time when it
        # is newer than the last commit's; the archive's is the day it was packed. Set to
        # the commit's, so that maximum-db-staleness (deny.toml) counts from the day the
        # snapshot was taken.
        touch -d "@$(advisory_db_time "$partial")" "$partial/$RUSTSEC_DB_DIR/.git/HEAD"
        rm -rf "$root"
        mv "$partial" "$root"
    fi
    owner_only "$db" || { log "refusing the advisory database in $db: others could have changed it"; return 1; }
    printf '%s\n' "$root"
}

# When the database under `db-path` $1 was taken: its last commit's time, in seconds
# since the epoch.
advisory_db_time() {
    git -C "$1/$RUSTSEC_DB_DIR" log -1 --format=%ct
}

# Fails when a crate in the lock file of manifest $2 (default orderd's) has an advisory in
# the database under `db-path` $1 (advisory_dbs) that deny.toml does not ignore, or when
# that database is older than deny.toml allows. Offline: nothing is fetched, neither the
# database nor crates. deny.toml names no database (elsewhere cargo-deny fetches the live
# one): the path is added to a copy of it, under [advisories].
check_advisories() {
    local dbs="$1" manifest="${2:-$ORDERD_ROOT/Cargo.toml}" tool config rc=0
    tool="$(cargo_tool cargo-deny 0.20.2)" || return 1
    config="$(mktemp)"
    sed "s|^\[advisories\]\$|&\ndb-path = \"$dbs\"|" "$ORDERD_ROOT/deny.toml" >"$config"
    grep -q '^db-path = ' "$config" || { log "deny.toml has no [advisories] section"; rm -f "$config"; return 1; }
    # cargo reads its configuration from the directory it runs in, the manifest's.
    (cd "$(dirname "$manifest")" && "$tool" deny --offline --manifest-path "$manifest" --log-level warn \
        --config "$config" check advisories) || rc=$?
    rm -f "$config"
    return "$rc"
}
