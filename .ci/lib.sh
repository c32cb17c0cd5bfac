# Shared set-up for .ci/test and .ci/serve: makes sure a PostgreSQL server is reachable
# and exports DATABASE_URL. Sourced, not run.
#
# Order of preference, reusing what is there:
#   1. DATABASE_URL from the environment, when it answers;
#   2. a server on 127.0.0.1:5432 that lets user `postgres` in;
#   3. a throwaway cluster owned by this project under target/pg (started if needed),
#      installing Debian's PostgreSQL first when no server binaries exist.

ORDERD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PG_PORT="${ORDERD_PG_PORT:-55432}"

log() { printf '[orderd] %s\n' "$*" >&2; }

apt_install() {
    if [ -z "${ORDERD_APT_UPDATED:-}" ]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        ORDERD_APT_UPDATED=1
    fi
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

pg_bindir() {
    local initdb
    initdb="$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1)"
    [ -n "$initdb" ] && dirname "$initdb"
}

answers() { psql "$1" -XAtqc 'SELECT 1' >/dev/null 2>&1; }

ensure_postgres() {
    command -v psql >/dev/null 2>&1 || apt_install postgresql-client
    if [ -n "${DATABASE_URL:-}" ] && answers "$DATABASE_URL"; then
        log "using DATABASE_URL from the environment"
        return
    fi
    local local_url="postgres://postgres@127.0.0.1:5432/postgres"
    if answers "$local_url"; then
        log "using the PostgreSQL server on 127.0.0.1:5432"
        export DATABASE_URL="$local_url"
        return
    fi
    local bindir
    bindir="$(pg_bindir || true)"
    if [ -z "$bindir" ]; then
        apt_install postgresql
        bindir="$(pg_bindir)"
    fi
    local dir="$ORDERD_ROOT/target/pg"
    mkdir -p "$dir"
    # initdb refuses to run as root: the cluster belongs to the postgres user.
    local as=()
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
        chown -R postgres "$dir"
        as=(runuser -u postgres --)
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        log "creating a throwaway cluster in $dir/data"
        "${as[@]}" "$bindir/initdb" -D "$dir/data" --auth=trust --username=postgres >/dev/null
    fi
    if ! "${as[@]}" "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        log "starting it on 127.0.0.1:$PG_PORT"
        "${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
            -o "-p $PG_PORT -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300" start >/dev/null
    fi
    export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
    answers "$DATABASE_URL" || { log "PostgreSQL did not come up; see $dir/server.log"; return 1; }
}
