# The image's supply chain, with stock tools: the SBOM of the Rust dependencies
# (cargo-cyclonedx), their licences against the allow list in deny.toml (cargo-deny's
# licence check alone: advisory databases cannot be fetched on every machine), and the
# image signed with a GnuPG key and checked through a podman trust policy. Sourced after
# .ci/lib.sh, not run.

# Where the cargo-installed tools live: outside any checkout, so that a machine builds
# each of them once.
ORDERD_TOOLS="${ORDERD_TOOLS:-/var/tmp/orderd-tools}"

# Prints the path of cargo subcommand binary $1 (crate $1, version $2), installing it
# with `cargo install --locked` when missing or of another version.
cargo_tool() {
    local name="$1" version="$2" bin="$ORDERD_TOOLS/bin/$1"
    if [ ! -x "$bin" ] || ! cargo install --list --root "$ORDERD_TOOLS" | grep -qxF "$name v$version:"; then
        log "building $name $version into $ORDERD_TOOLS (once per machine)"
        cargo install --quiet --locked --root "$ORDERD_TOOLS" --version "$version" "$name" >&2
    fi
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
