# Shared by bench/run and bench/profile: orderd on a scratch database, set up the way
# every measurement here wants it (relay, per-tenant limits and reconciliation off), so
# that two scripts never measure two different servers. Sourced after .ci/lib.sh and
# `ensure_postgres`, not run.

# Creates database $2 on the server of DATABASE_URL, migrates it and serves it with the
# binary $1, logging to $3. One worker thread (ORDERD_WORKER_THREADS=1, overridable):
# PostgreSQL and the load tool share the two cores, and a second worker spent more on
# waking threads than it gained (docs/performance.md). Sets BENCH_URL, PORT, BASE, ORDERD_PID and exports TOKEN (a
# fresh tenant's, valid an hour).
bench_orderd_start() {
    local bin="$1" log="$3"
    BENCH_DB="$2"
    BENCH_URL="${DATABASE_URL%/*}/$BENCH_DB"
    psql -qX "$DATABASE_URL" -c "CREATE DATABASE $BENCH_DB" >/dev/null
    export ORDERD_JWT_HS256_SECRET="bench-secret-0123456789abcdef0123456789"
    DATABASE_URL="$BENCH_URL" "$bin" migrate 2>/dev/null
    PORT="$(free_port)"
    DATABASE_URL="$BENCH_URL" ORDERD_BIND="127.0.0.1:$PORT" ORDERD_RELAY=off ORDERD_MIGRATE=off \
        ORDERD_TENANT_RATE_PER_SEC=0 ORDERD_TENANT_MAX_IN_FLIGHT=10000 \
        ORDERD_RECONCILE_INTERVAL_SECS=0 ORDERD_WORKER_THREADS="${ORDERD_WORKER_THREADS:-1}" \
        RUST_LOG=warn "$bin" serve 2>"$log" &
    ORDERD_PID=$!
    wait_healthy "$PORT"
    BASE="http://127.0.0.1:$PORT"
    export TOKEN
    TOKEN="$("$bin" token --tenant "$(python3 -c 'import uuid; print(uuid.uuid4())')" --ttl 1h)"
}

# Stops what bench_orderd_start started and drops its database; safe to call twice or
# before it ran (an EXIT trap).
bench_orderd_stop() {
    [ -n "${ORDERD_PID:-}" ] && kill "$ORDERD_PID" 2>/dev/null && wait "$ORDERD_PID" 2>/dev/null
    ORDERD_PID=""
    [ -n "${BENCH_DB:-}" ] &&
        psql -qX "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)" >/dev/null 2>&1
    BENCH_DB=""
    return 0
}

# Completes one create under Idempotency-Key $1, so that sending it again is a replay.
bench_create_key() {
    curl -fsS -o /dev/null -X POST "$BASE/v1/orders" -H "Authorization: Bearer $TOKEN" \
        -H 'Content-Type: application/json' -H "Idempotency-Key: $1" \
        -d '{"sku":"SKU-BENCH","quantity":1}'
}
