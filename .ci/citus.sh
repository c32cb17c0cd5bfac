# A local Citus cluster for .ci/citus, .ci/test and .ci/serve --citus. Sourced after
# lib.sh, not run.

# Ports below the kernel's ephemeral range (32768 to 60999 on Linux): a port in it can be
# held by any client connection's local end (a test's connection to 5432, say), and a node
# started later then cannot bind it. The nodes' directory is named by the port, since
# each node's configuration and the coordinator's worker list hold the ports.
CITUS_PORT="${ORDERD_CITUS_PORT:-25600}"
CITUS_DIR="${ORDERD_CITUS_DIR:-/var/tmp/orderd-citus-$CITUS_PORT}"
CITUS_NODES=(coordinator worker1 worker2)

# The port of node $1 (0 the coordinator, 1 and 2 the workers).
citus_port() { printf '%s\n' "$((CITUS_PORT + $1))"; }

# The URL of database $2 (default postgres) on node $1 (default the coordinator).
citus_url() { printf 'postgres://postgres@127.0.0.1:%s/%s\n' "$(citus_port "${1:-0}")" "${2:-postgres}"; }

# Citus in the PostgreSQL whose server binaries are installed: the installation's own
# (Citus's packages), or built once from ORDERD_CITUS_SOURCE and installed into it.
ensure_citus_installed() {
    local bindir pg_config
    bindir="$(pg_bindir || true)"
    if [ -z "$bindir" ]; then
        apt_install postgresql
        bindir="$(pg_bindir)"
    fi
    pg_config="$bindir/pg_config"
    [ -x "$pg_config" ] || pg_config="$(command -v pg_config)"
    if [ -f "$("$pg_config" --pkglibdir)/citus.so" ]; then
        return
    fi
    local source="${ORDERD_CITUS_SOURCE:-$ORDERD_ROOT/../shared/vendor/citus-13.2.2.tar.gz}"
    local patch="${ORDERD_CITUS_PATCH:-${source%.tar.gz}-pg15.patch}"
    [ -f "$source" ] || { log "no Citus installed and no source at $source (set ORDERD_CITUS_SOURCE)"; return 1; }
    local major
    major="$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
    ensure_build_deps
    [ -f "/usr/include/postgresql/$major/server/postgres.h" ] \
        || apt_install "postgresql-server-dev-$major" libkrb5-dev liblz4-dev libzstd-dev
    local build
    build="$(target_dir)/citus-build"
    rm -rf "$build"
    mkdir -p "$build"
    log "building Citus from $source into PostgreSQL $major (once: a few minutes on two cores)"
    tar xzf "$source" -C "$build" --strip-components=1
    if [ -f "$patch" ]; then
        (cd "$build" && patch -p1 -s < "$patch")
    fi
    (cd "$build" && ./configure --without-libcurl PG_CONFIG="$pg_config" >/dev/null \
        && make -s -j2 >/dev/null 2>&1 && make -s install >/dev/null)
    rm -rf "$build"
}

# Runs a command as the postgres user when we are root (initdb and the server refuse root).
as_postgres() {
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir "$CITUS_DIR" postgres
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# SQL $2 on database $3 (default postgres) of node $1.
# Citus's notices (CREATE DATABASE is not propagated, and so on) are left out.
citus_sql() { PGOPTIONS='-c client_min_messages=warning' psql "$(citus_url "$1" "${3:-postgres}")" -XAtqv ON_ERROR_STOP=1 -c "$2"; }

# Starts the nodes that are not running (CITUS_STARTED=1 when it started any).
citus_start() {
    command -v psql >/dev/null 2>&1 || apt_install postgresql-client
    ensure_citus_installed
    local bindir i node dir port
    bindir="$(pg_bindir)"
    mkdir -p "$CITUS_DIR"
    [ "$(id -u)" = 0 ] && { id postgres >/dev/null 2>&1 || useradd --system --home-dir "$CITUS_DIR" postgres; chown postgres "$CITUS_DIR"; }
    for i in 0 1 2; do
        node="${CITUS_NODES[$i]}"
        dir="$CITUS_DIR/$node"
        port="$(citus_port "$i")"
        if [ ! -f "$dir/data/PG_VERSION" ]; then
            log "creating Citus node $node in $dir"
            as_postgres mkdir -p "$dir"
            as_postgres "$bindir/initdb" -D "$dir/data" --auth=trust --username=postgres >/dev/null
            # max_prepared_transactions: Citus commits a transaction that wrote on more
            # than one worker in two phases; wal_level and the replication settings let
            # shards move online (logical replication between the workers).
            cat >>"$dir/data/postgresql.conf" <<EOF
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 300
max_prepared_transactions = 200
wal_level = logical
max_wal_senders = 20
max_replication_slots = 20
EOF
        fi
        citus_worker_slots "$dir"
        if ! answers "$(citus_url "$i")"; then
            citus_clear_stale_locks "$dir" "$port"
            log "starting Citus node $node on 127.0.0.1:$port"
            if ! as_postgres "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null; then
                log "Citus node $node did not start; the end of $dir/server.log:"
                tail -n 20 "$dir/server.log" >&2 || true
                return 1
            fi
            CITUS_STARTED=1
        fi
        citus_allow_output_plugin "$i"
    done
    citus_prepare postgres
}

# Citus runs a maintenance daemon, a background worker, for every database that has the
# extension, and a shard move's logical replication needs background workers of its
# own; PostgreSQL's default of 8 is used up by a few test databases, and a move then
# waits forever for an apply worker that cannot start ("out of background worker
# slots"). Node dir $1 gets room for both, restarted when it runs without it.
citus_worker_slots() {
    local conf="$1/data/postgresql.conf"
    grep -q '^max_worker_processes = 128' "$conf" && return 0
    printf '%s\n' 'max_worker_processes = 128' 'max_logical_replication_workers = 32' |
        as_postgres tee -a "$conf" >/dev/null
    if as_postgres "$(pg_bindir)/pg_ctl" -D "$1/data" status >/dev/null 2>&1; then
        log "restarting Citus node $1 with more background workers"
        as_postgres "$(pg_bindir)/pg_ctl" -D "$1/data" -l "$1/server.log" -w restart >/dev/null
    fi
}

# PostgreSQL releases from 15.20 on name the libraries a logical decoding session may
# load (output_plugin_libraries: pgoutput and test_decoding by default); Citus moves
# and splits shards through an output plugin of its own, so each node lists it too.
# Servers without the setting load any plugin.
citus_allow_output_plugin() {
    local allowed
    allowed="$(citus_sql "$1" "SELECT setting FROM pg_settings WHERE name = 'output_plugin_libraries'")"
    [ -n "$allowed" ] || return 0
    grep -qw citus <<<"$allowed" && return 0
    # A list setting: each library its own quoted item.
    allowed="$(tr -d '" ' <<<"$allowed" | sed "s/[^,]*/'&'/g")"
    citus_sql "$1" "ALTER SYSTEM SET output_plugin_libraries = $allowed, 'citus'" >/dev/null
    citus_sql "$1" "SELECT pg_reload_conf()" >/dev/null
}

# Removes the lock files a node left when it was killed, once their process is gone or is
# no longer that node: a machine restored from a snapshot reuses process ids, and a
# server whose lock names a living process of another kind refuses to start.
citus_clear_stale_locks() {
    local dir="$1" port="$2" lock pid
    for lock in "$dir/data/postmaster.pid" "$dir/.s.PGSQL.$port.lock"; do
        [ -f "$lock" ] || continue
        pid="$(head -n 1 "$lock" | tr -dc 0-9)"
        if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$dir/data"; then
            continue
        fi
        log "removing the stale lock $lock (process ${pid:-?} is not that node)"
        rm -f "$lock"
    done
}

# The extension on every node's database $1, and the coordinator knowing its workers
# there (Citus keeps its node list per database).
citus_prepare() {
    local db="$1" i
    for i in 0 1 2; do
        citus_sql "$i" "CREATE EXTENSION IF NOT EXISTS citus" "$db" >/dev/null
    done
    citus_sql 0 "SELECT citus_set_coordinator_host('127.0.0.1', $(citus_port 0))" "$db" >/dev/null
    for i in 1 2; do
        citus_sql 0 "SELECT citus_add_node('127.0.0.1', $(citus_port "$i"))
                     WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node
                                       WHERE nodename = '127.0.0.1' AND nodeport = $(citus_port "$i"))" "$db" >/dev/null
    done
}

citus_createdb() {
    local db="$1" i
    for i in 0 1 2; do
        citus_sql "$i" "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
            || citus_sql "$i" "CREATE DATABASE \"$db\""
    done
    citus_prepare "$db"
}

citus_dropdb() {
    local db="$1" i
    for i in 0 1 2; do
        citus_sql "$i" "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" || true
    done
}

citus_stop() {
    local bindir i dir
    bindir="$(pg_bindir || true)"
    [ -n "$bindir" ] || return 0
    for i in 2 1 0; do
        dir="$CITUS_DIR/${CITUS_NODES[$i]}"
        [ -f "$dir/data/PG_VERSION" ] || continue
        # Only a node that answers on its port: a stale lock may name another process.
        if answers "$(citus_url "$i")"; then
            log "stopping Citus node ${CITUS_NODES[$i]}"
            as_postgres "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
        fi
    done
}

citus_status() {
    local i
    for i in 0 1 2; do
        if answers "$(citus_url "$i")"; then
            echo "${CITUS_NODES[$i]}: running on 127.0.0.1:$(citus_port "$i")"
        else
            echo "${CITUS_NODES[$i]}: stopped"
        fi
    done
    citus_sql 0 "SELECT 'worker ' || nodename || ':' || nodeport FROM pg_dist_node WHERE noderole = 'primary' AND groupid <> 0 ORDER BY nodeport" 2>/dev/null || true
}
