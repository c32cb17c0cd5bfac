# Shared by the scripts of bench/: orderd on a scratch database, set up the way every
# measurement here wants it (relay, per-tenant limits and reconciliation off), so that
# two scripts never measure two different servers, and the measuring itself (wrk and
# pgbench runs, their rates, the CPU they cost, the alternating create pairs). Sourced
# after .ci/lib.sh and `ensure_postgres`, not run.

# Where relay_bench's diagnostics go (its last stdout line is the figure each script
# keeps): a step that fails names this file instead of losing why.
RELAY_LOG="$(target_dir)/bench-relay.log"
relay_run() { # command...: runs relay_bench, prints its last line
    "$@" 2>>"$RELAY_LOG" | tail -n 1 || {
        log "relay_bench failed ($*); its log: $RELAY_LOG"
        tail -n 20 "$RELAY_LOG" >&2
        return 1
    }
}

# Creates database $2 on the server of DATABASE_URL, migrates it and serves it with the
# binary $1, logging to $3. One worker thread (ORDERD_WORKER_THREADS=1, overridable):
# PostgreSQL and the load tool share the two cores, and a second worker spent more on
# waking threads than it gained (docs/performance.md). Sets BENCH_URL, PORT, BASE, ORDERD_PID and exports TOKEN (a
# fresh tenant's, BENCH_TENANT, valid an hour).
bench_orderd_start() {
    local bin="$1" log="$3"
    BENCH_DB="$2"
    BENCH_URL="${DATABASE_URL%/*}/$BENCH_DB"
    psql -qX "$DATABASE_URL" -c "CREATE DATABASE $BENCH_DB" >/dev/null
    DATABASE_URL="$BENCH_URL" "$bin" migrate 2>/dev/null
    bench_orderd_serve "$bin" "$log"
}

# Serves the (migrated) database at BENCH_URL with the binary $1, logging to $2, set up
# as bench_orderd_start does (BENCH_RELAY=on runs its relay too, publishing where the
# environment says); sets PORT, BASE, ORDERD_PID and exports TOKEN.
bench_orderd_serve() {
    local bin="$1" log="$2"
    export ORDERD_JWT_HS256_SECRET="bench-secret-0123456789abcdef0123456789"
    PORT="$(free_port)"
    DATABASE_URL="$BENCH_URL" ORDERD_BIND="127.0.0.1:$PORT" ORDERD_RELAY="${BENCH_RELAY:-off}" ORDERD_MIGRATE=off \
        ORDERD_TENANT_RATE_PER_SEC=0 ORDERD_TENANT_MAX_IN_FLIGHT=10000 \
        ORDERD_RECONCILE_INTERVAL_SECS=0 ORDERD_WORKER_THREADS="${ORDERD_WORKER_THREADS:-1}" \
        RUST_LOG=warn "$bin" serve 2>"$log" &
    ORDERD_PID=$!
    wait_healthy "$PORT"
    BASE="http://127.0.0.1:$PORT"
    export TOKEN BENCH_TENANT
    BENCH_TENANT="$(python3 -c 'import uuid; print(uuid.uuid4())')"
    TOKEN="$("$bin" token --tenant "$BENCH_TENANT" --ttl 1h)"
}

# Stops the orderd that bench_orderd_serve started; safe to call twice.
bench_orderd_halt() {
    [ -n "${ORDERD_PID:-}" ] && kill "$ORDERD_PID" 2>/dev/null && wait "$ORDERD_PID" 2>/dev/null
    ORDERD_PID=""
    return 0
}

# Stops what bench_orderd_start started and drops its database; safe to call twice or
# before it ran (an EXIT trap).
bench_orderd_stop() {
    bench_orderd_halt
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

# The completed record bench/replay.pgbench reads (its own tenant and key, a body of
# 300 bytes), in the database at BENCH_URL; there already, it stays.
bench_seed_replay_record() {
    psql -qX "$BENCH_URL" -c "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state,
            response_status, response_content_type, response_body, created_at, completed_at, expires_at)
        VALUES ('00000000-0000-0000-0000-0000000000be', 'POST /v1/orders', 'bench-replay-key-0001',
            sha256('x'), 'COMPLETED', 201, 'application/json', convert_to(repeat('x', 300), 'UTF8'),
            now(), now(), now() + interval '1 day') ON CONFLICT DO NOTHING" >/dev/null
}

# Fills the database at BENCH_URL with $1 rows per table, in the shape a service that ran
# for a day has: 1,000 tenants, skewed (log-uniform: the first tenant has about as many
# rows as the last hundred together); keys spread over the day of their TTL; 95 % of the
# events published, the rest pending, a few DEAD. Vacuumed, analysed and checkpointed.
bench_fill() {
    psql -qX "$BENCH_URL" -v rows="$1" <<'SQL' >/dev/null
INSERT INTO orders (tenant_id, id, sku, quantity, customer_ref, status, version, created_at, updated_at)
SELECT md5('tenant-' || t)::uuid, gen_random_uuid(), 'SKU-' || (n % 500), 1 + n % 9,
       CASE WHEN n % 3 = 0 THEN 'customer-' || n END,
       CASE WHEN n % 10 = 0 THEN 'CANCELLED' ELSE 'CREATED' END, CASE WHEN n % 10 = 0 THEN 2 ELSE 1 END,
       at, at
FROM (SELECT n, least(1000, floor(exp(random() * ln(1000)))::int) AS t,
             now() - random() * interval '24 hours' AS at
      FROM generate_series(1, :rows) n) g;
INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, response_status,
                                response_location, response_content_type, response_body, resource_id,
                                created_at, completed_at, expires_at)
SELECT tenant_id, 'POST /v1/orders', 'fill-' || id, sha256(id::text::bytea), 'COMPLETED', 201,
       '/v1/orders/' || id, 'application/json; charset=utf-8',
       convert_to(json_build_object('id', id, 'sku', sku, 'quantity', quantity, 'customer_ref', customer_ref,
                                    'status', 'CREATED', 'created_at', created_at, 'updated_at', created_at)::text, 'UTF8'),
       id, created_at, created_at, created_at + interval '24 hours'
FROM orders;
INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                          next_attempt_at, status, published_at, attempts, last_error)
SELECT tenant_id, gen_random_uuid(), id, 1, 'OrderCreated',
       jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1, 'tenant_id', tenant_id,
                          'order', jsonb_build_object('id', id, 'sku', sku, 'quantity', quantity)),
       created_at, created_at,
       CASE WHEN r < 0.95 THEN 'PUBLISHED' WHEN r < 0.999 THEN 'PENDING' ELSE 'DEAD' END,
       CASE WHEN r < 0.95 THEN created_at + interval '20 milliseconds' END,
       CASE WHEN r >= 0.999 THEN 10 ELSE 0 END,
       CASE WHEN r >= 0.999 THEN 'invalid_parameter: too large' END
FROM (SELECT *, random() AS r FROM orders) o;
VACUUM ANALYZE orders, idempotency_record, outbox_event;
CHECKPOINT;
SQL
}

# $2 keys of the bench tenant, named $1-1 .. $1-$2, created through the API (what
# bench/wrk/replay_many.lua replays).
bench_replay_keys() {
    python3 - "$BASE" "$TOKEN" "$1" "$2" <<'PY'
import http.client, sys, urllib.parse
base, token, prefix, keys = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
url = urllib.parse.urlsplit(base)
conn = http.client.HTTPConnection(url.hostname, url.port)
for i in range(1, keys + 1):
    conn.request("POST", "/v1/orders", body='{"sku":"SKU-BENCH","quantity":1}', headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "Idempotency-Key": f"{prefix}-{i}"})
    response = conn.getresponse()
    response.read()
    assert response.status == 201, response.status
PY
}

# k6's steady load (k6/load.js: creates at RATE a second, a replay of one in five, a
# list of one in three) against BASE for $2 seconds, in the background, every request
# written as a point to $1 (JSON lines); sets K6_PID. K6 names the k6 binary.
bench_k6_points() {
    "$K6" run --quiet --no-color --out "json=$1" -e "BASE_URL=$BASE" \
        -e "ORDERD_JWT_HS256_SECRET=$ORDERD_JWT_HS256_SECRET" -e "RATE=$RATE" \
        -e "DURATION=${2}s" k6/load.js >/dev/null 2>&1 &
    K6_PID=$!
}

# The requests of kind $2 (create, replay or list) in k6's points file $1 that ended
# between the epoch seconds $3 and $4 (k6 stamps a request's point when its answer
# came), and the others of the same run: how many, by status, and their latency.
bench_k6_split() {
    python3 - "$@" <<'PY'
import json, sys
from collections import Counter
from datetime import datetime
path, kind, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
inside, outside = [], []
for line in open(path):
    point = json.loads(line)
    if point.get("type") != "Point" or point.get("metric") != "http_req_duration":
        continue
    tags = point["data"]["tags"]
    if tags.get("kind") != kind:
        continue
    at = datetime.fromisoformat(point["data"]["time"]).timestamp()
    (inside if start <= at <= end else outside).append((point["data"]["value"], tags.get("status")))
def line(name, requests):
    if not requests:
        return f"{name}: no {kind}s"
    values = sorted(v for v, _ in requests)
    statuses = dict(sorted(Counter(s for _, s in requests).items()))
    pick = lambda p: values[min(len(values) - 1, int(len(values) * p))]
    return (f"{name}: {len(values)} {kind}s {statuses}, {pick(0.5):.1f} ms p50, "
            f"{pick(0.99):.1f} ms p99, {values[-1]:.1f} ms max")
print(line("meanwhile", inside))
print(line("the rest of that run", outside))
PY
}

# --- Measuring: shared by bench/run and bench/scale. They set OUT (a scratch folder),
# RUN_SECS, PGBENCH and ADMIN, and start orderd (ORDERD_PID, BASE, BENCH_URL) first.

# wrk's "Requests/sec" and a latency percentile (in ms) from its --latency report.
wrk_rate() { awk '/Requests\/sec/ {print $2}' "$1"; }
wrk_ms() {
    awk -v p="$2%" '$1 == p {
        v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
        if (u == "us") v /= 1000; else if (u == "s") v *= 1000; else if (u == "m") v *= 60000;
        printf "%.2f", v }' "$1"
}
wrk_errors() { awk '/Non-2xx/ {n += $NF} /Socket errors/ {n += 0} END {print n + 0}' "$1"; }
pgbench_tps() { awk '/^tps = / {printf "%.0f", $3}' "$1"; }
run_wrk() { # script connections output [KEY]
    KEY="${4:-}" wrk -t2 -c"$2" -d"${RUN_SECS}s" --latency -s "bench/wrk/$1.lua" "$BASE" >"$3"
}
run_pgbench() { # script clients output
    "$PGBENCH" -n -M prepared -c "$2" -j 2 -T "$RUN_SECS" -f "bench/$1.pgbench" "$BENCH_URL" >"$3" 2>&1
}

# Every create run starts from the same state, as pgbench's own runs do (it vacuums
# first unless told not to): the rows the previous run left dead are vacuumed and a
# checkpoint is taken, so that an autovacuum or a checkpoint one run caused is not
# billed to the next, and every run pays the same full-page writes after its start.
settle() {
    psql -qX "$BENCH_URL" -c "VACUUM ANALYZE idempotency_record, orders, outbox_event" -c "CHECKPOINT" >/dev/null
}

# CPU seconds (user + system) spent during a create run, to explain its ratio: by
# orderd, by PostgreSQL (live backends plus those that ended, which the postmaster
# collects as its children's time) and by the load tool itself (bash's `time`).
bench_measure_init() {
    TICK="$(getconf CLK_TCK)"
    POSTMASTER="$(head -n 1 "$(psql -XAtc 'SHOW data_directory' "$ADMIN")/postmaster.pid" 2>/dev/null || true)"
    TIMEFORMAT='%U %S'
}
ticks_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
pg_ticks() { # [postmaster pid, default POSTMASTER]
    local t=0 p postmaster="${1:-$POSTMASTER}"
    [ -n "$postmaster" ] || { echo 0; return; }
    t="$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster/stat")"
    for p in $(pgrep -P "$postmaster"); do t=$((t + $(ticks_of "$p"))); done
    echo "$t"
}
measured() { # output-prefix command...: runs it, writing PREFIX.cpu as "orderd pg tool" seconds
    local prefix="$1" o0 p0 o1 p1 tool
    shift
    o0="$(ticks_of "$ORDERD_PID")"; p0="$(pg_ticks)"
    tool="$({ time "$@" >/dev/null; } 2>&1 | tail -n 1)"
    o1="$(ticks_of "$ORDERD_PID")"; p1="$(pg_ticks)"
    echo "$(( (o1 - o0) )) $(( (p1 - p0) )) $tool $TICK" >"$prefix.cpu"
}

# PAIRS alternating create runs of orderd (wrk) and pgbench at $1 connections, each
# after `settle`; the median pair becomes $OUT/create-$1 and $OUT/pg-create-$1 (with
# their .cpu), and PAIR_RATIOS lists every pair's ratio in order.
create_pairs() {
    local c="$1" i ratios="" median f
    for i in $(seq 1 "$PAIRS"); do
        settle
        measured "$OUT/create-$c-$i" run_wrk create "$c" "$OUT/create-$c-$i"
        settle
        measured "$OUT/pg-create-$c-$i" run_pgbench create "$c" "$OUT/pg-create-$c-$i"
        ratios+="$(python3 -c "print(f'{$(wrk_rate "$OUT/create-$c-$i") / $(pgbench_tps "$OUT/pg-create-$c-$i"):.2f} $i')")"$'\n'
    done
    median="$(sort -n <<<"${ratios%$'\n'}" | sed -n "$(( (PAIRS + 1) / 2 ))p" | cut -d' ' -f2)"
    for f in create pg-create; do
        cp "$OUT/$f-$c-$median" "$OUT/$f-$c"
        cp "$OUT/$f-$c-$median.cpu" "$OUT/$f-$c.cpu"
    done
    PAIR_RATIOS="$(cut -d' ' -f1 <<<"${ratios%$'\n'}" | tr '\n' ' ')"
}

# The replay beside GET /healthz in PAIRS alternating pairs at $1 connections, the pair
# with the median ratio kept as replay-$1 and healthz-$1 (a single pair of the same build
# spread from 0.71 to 0.91 on this shared machine); sets REPLAY_RATIOS. KEY must name a
# completed create.
replay_pairs() {
    local c="$1" i ratios="" median f
    for i in $(seq 1 "$PAIRS"); do
        run_wrk replay "$c" "$OUT/replay-$c-$i" "$KEY"
        run_wrk healthz "$c" "$OUT/healthz-$c-$i"
        ratios+="$(python3 -c "print(f'{$(wrk_rate "$OUT/replay-$c-$i") / $(wrk_rate "$OUT/healthz-$c-$i"):.2f} $i')")"$'\n'
    done
    median="$(sort -n <<<"${ratios%$'\n'}" | sed -n "$(( (PAIRS + 1) / 2 ))p" | cut -d' ' -f2)"
    for f in replay healthz; do cp "$OUT/$f-$c-$median" "$OUT/$f-$c"; done
    REPLAY_RATIOS="$(cut -d' ' -f1 <<<"${ratios%$'\n'}" | tr '\n' ' ')"
}

# A service runs on a server that vacuums, and that is what a measurement should see. A
# server with autovacuum off (some CI images ship one; orderd warns about it at start)
# gets it on for the run: `autovacuum_on` before, `autovacuum_restore` in the script's
# cleanup. $1 says what for, in the log line.
autovacuum_on() {
    AUTOVACUUM_WAS="$(psql -XAtq "$DATABASE_URL" -c "SHOW autovacuum")"
    [ "$AUTOVACUUM_WAS" = off ] || return 0
    if psql -qX "$DATABASE_URL" -c "ALTER SYSTEM SET autovacuum = on" -c "SELECT pg_reload_conf()" >/dev/null 2>&1; then
        log "autovacuum is off on this server: on for $1, off again afterwards"
    else
        log "autovacuum is off on this server and this user cannot turn it on: $1 runs without it"
        AUTOVACUUM_WAS=kept
    fi
}
autovacuum_restore() {
    [ "${AUTOVACUUM_WAS:-}" = off ] || return 0
    # SET, not RESET: where `off` came from ALTER SYSTEM itself, RESET would leave it on.
    psql -qX "$DATABASE_URL" -c "ALTER SYSTEM SET autovacuum = off" -c "SELECT pg_reload_conf()" >/dev/null 2>&1
    AUTOVACUUM_WAS=on
}
