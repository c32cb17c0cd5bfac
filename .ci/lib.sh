# Shared set-up for .ci/test and .ci/serve: makes sure a PostgreSQL server is reachable
# and exports DATABASE_URL. Sourced, not run.
#
# Order of preference, reusing what is there:
#   1. DATABASE_URL from the environment, when it answers;
#   2. a server on 127.0.0.1:5432 that lets user `postgres` in;
#   3. a throwaway cluster owned by this project in /var/tmp/orderd-pg-PORT (started if needed),
#      installing Debian's PostgreSQL first when no server binaries exist.

ORDERD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Below the kernel's ephemeral range (32768 to 60999 on Linux): a port in it can be held
# by any client connection's local end, and a server started later then cannot bind it.
PG_PORT="${ORDERD_PG_PORT:-25432}"

log() { printf '[orderd %s] %s\n' "$(date +%T)" "$*" >&2; }

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
    # Outside the checkout: the postgres user must reach it even when the checkout
    # lives in a private home directory.
    local dir="${ORDERD_PG_DIR:-/var/tmp/orderd-pg-$PG_PORT}"
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

# Where cargo builds: honours CARGO_TARGET_DIR and .cargo/config.
target_dir() {
    if [ -z "${ORDERD_TARGET_DIR:-}" ]; then
        ORDERD_TARGET_DIR="$(cargo metadata --format-version 1 --no-deps \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
        mkdir -p "$ORDERD_TARGET_DIR"
    fi
    printf '%s\n' "$ORDERD_TARGET_DIR"
}

# The release targets every script builds, always together. One set of targets is one
# set of features: the example's dev-dependencies turn on features of crates orderd
# shares with them (rmcp's client side, reqwest's), and a build of the binary alone
# would compile those crates, and orderd, a second time.
RELEASE_TARGETS=(--bin orderd --example relay_bench)

# Builds the orderd binary and prints its path (wherever the target dir is); extra
# arguments go to cargo build: `--release` builds RELEASE_TARGETS; after `cargo test
# --all-targets`, `--all-targets` finds the binary that build made instead of building
# it again with other features (see RELEASE_TARGETS).
orderd_bin() {
    local args=("$@")
    [[ " ${args[*]} " == *" --release "* ]] && args+=("${RELEASE_TARGETS[@]}")
    [[ " ${args[*]} " == *" --all-targets "* ]] || args+=(--bin orderd)
    cargo build --quiet --message-format=json-render-diagnostics "${args[@]}" \
        | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target", {})
    if (m.get("reason") == "compiler-artifact" and t.get("name") == "orderd"
            and t.get("kind") == ["bin"] and not m["profile"]["test"] and m.get("executable")):
        print(m["executable"])'
}

# Prints the path of the command $1, installing the PyPI package $2 into the project's
# own venv (under the target dir) when the command is not on PATH already.
py_tool() {
    local command="$1" package="$2" found
    found="$(command -v "$command" || true)"
    if [ -n "$found" ]; then
        printf '%s\n' "$found"
        return
    fi
    local venv
    venv="$(target_dir)/py-venv"
    if [ ! -x "$venv/bin/$command" ]; then
        [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" >/dev/null 2>&1 \
            || { apt_install python3-venv python3-pip; python3 -m venv "$venv"; }
        log "installing $package into $venv"
        "$venv/bin/pip" install --quiet "$package" >&2
    fi
    printf '%s\n' "$venv/bin/$command"
}

# Makes moto's server available (pip, into the project's venv when it is not
# installed) and running on 127.0.0.1:$1; exports ORDERD_MOTO_ENDPOINT and MOTO_PID
# (empty when an already running server was reused).
ensure_moto() {
    local port="$1" moto
    moto="$(py_tool moto_server 'moto[server]')"
    MOTO_PID=""
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        "$moto" -H 127.0.0.1 -p "$port" >"$(target_dir)/moto-$port.log" 2>&1 &
        MOTO_PID=$!
        local i
        for i in $(seq 1 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
            sleep 0.1
        done
    fi
    export ORDERD_MOTO_ENDPOINT="http://127.0.0.1:$port"
    # The tests start extra moto servers themselves: make sure they find the binary.
    export PATH="$(dirname "$moto"):$PATH"
}

# What the bundled librdkafka (the Kafka producer) needs to build: a C compiler, make,
# pkg-config, OpenSSL and zlib headers. A fresh Debian with Rust has most of them.
ensure_build_deps() {
    local missing=()
    command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
    command -v make >/dev/null 2>&1 || missing+=(make)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
    pkg-config --exists zlib 2>/dev/null || missing+=(zlib1g-dev)
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

# Prints the path of tansu, a Kafka-compatible broker from crates.io (Apache Kafka
# itself ships through a registry this machine cannot reach): the one on PATH, else
# one built once under the target dir (about nine minutes on two cores) and reused.
tansu_bin() {
    local found root
    found="$(command -v tansu || true)"
    if [ -n "$found" ]; then
        printf '%s\n' "$found"
        return
    fi
    # Installed once per machine, as Citus and the apt packages are, so that every clone
    # and checkout reuses it: /usr/local when it is writable, else the user's own.
    root="${ORDERD_TOOLS_ROOT:-}"
    if [ -z "$root" ]; then
        if [ -w /usr/local/bin ]; then root=/usr/local; else root="$HOME/.local"; fi
    fi
    if [ ! -x "$root/bin/tansu" ]; then
        log "building tansu 0.6.0 into $root (once per machine: about nine minutes on two cores)"
        local build
        build="$(mktemp -d)"
        CARGO_TARGET_DIR="$build" cargo install tansu --version 0.6.0 --locked \
            --features dynostore --root "$root" --quiet >&2
        rm -rf "$build"
    fi
    printf '%s\n' "$root/bin/tansu"
}

# Starts tansu with memory storage on 127.0.0.1:$1 and waits for it; exports
# KAFKA_BROKERS and KAFKA_PID. Topics are not created automatically: see kafka_topic.
start_kafka() {
    local port="$1" tansu i
    tansu="$(tansu_bin)"
    "$tansu" broker --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine memory://tansu/ \
        >"$(target_dir)/tansu-$port.log" 2>&1 &
    KAFKA_PID=$!
    for i in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.1
    done
    export KAFKA_BROKERS="127.0.0.1:$port"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until http://127.0.0.1:$1/healthz answers (at most 60 s).
wait_healthy() {
    local i
    for i in $(seq 1 600); do
        curl -fs "http://127.0.0.1:$1/healthz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "orderd on port $1 did not become healthy"
    return 1
}

# Starts `orderd serve` on a fresh database of its own on the server at DATABASE_URL,
# relay off, per-tenant rate limit off, for a black-box tool; sets BLACKBOX_PORT,
# BLACKBOX_PID, BLACKBOX_DB and BLACKBOX_TOKEN. Extra VAR=value arguments go to orderd.
start_blackbox() {
    local bin="$1"; shift
    BLACKBOX_PORT="$(free_port)"
    BLACKBOX_DB="orderd_blackbox_$(cat /proc/sys/kernel/random/uuid | tr -d -)"
    psql "$DATABASE_URL" -Xqc "CREATE DATABASE $BLACKBOX_DB"
    local url="${DATABASE_URL%/*}/$BLACKBOX_DB"
    BLACKBOX_SECRET="blackbox-secret-$(cat /proc/sys/kernel/random/uuid)"
    env DATABASE_URL="$url" ORDERD_BIND="127.0.0.1:$BLACKBOX_PORT" ORDERD_RELAY=off \
        ORDERD_JWT_HS256_SECRET="$BLACKBOX_SECRET" ORDERD_TENANT_RATE_PER_SEC=0 "$@" \
        "$bin" serve >"$(target_dir)/blackbox-$BLACKBOX_PORT.log" 2>&1 &
    BLACKBOX_PID=$!
    wait_healthy "$BLACKBOX_PORT"
    BLACKBOX_TOKEN="$(ORDERD_JWT_HS256_SECRET="$BLACKBOX_SECRET" "$bin" token \
        --tenant "$(cat /proc/sys/kernel/random/uuid)" --ttl 1h)"
}

stop_blackbox() {
    [ -n "${BLACKBOX_PID:-}" ] || return 0
    kill "$BLACKBOX_PID" 2>/dev/null || true
    wait "$BLACKBOX_PID" 2>/dev/null || true
    psql "$DATABASE_URL" -Xqc "DROP DATABASE IF EXISTS $BLACKBOX_DB WITH (FORCE)" || true
    BLACKBOX_PID=""
}

# One SQS call on moto at $1, in SQS's JSON protocol: ENDPOINT ACTION JSON.
moto_sqs() {
    curl -s -X POST "$1/" -H "X-Amz-Target: AmazonSQS.$2" \
        -H 'Content-Type: application/x-amz-json-1.0' \
        -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=0' \
        -d "$3"
}

# One SNS call on moto at $1, in SNS's query protocol: ENDPOINT QUERY-STRING.
moto_sns() {
    curl -s -X POST "$1/" -H 'Content-Type: application/x-www-form-urlencoded' \
        -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sns/aws4_request, SignedHeaders=host, Signature=0' \
        -d "Version=2010-03-31&$2"
}

# A topic named $2 on moto at $1 with an SQS queue of the same name subscribed to it
# (raw delivery), so what is published can be read back; sets TOPIC_ARN and QUEUE_URL.
moto_topic() {
    local endpoint="$1" name="$2"
    TOPIC_ARN="$(moto_sns "$endpoint" "Action=CreateTopic&Name=$name" | sed -n 's:.*<TopicArn>\(.*\)</TopicArn>.*:\1:p')"
    QUEUE_URL="$(moto_sqs "$endpoint" CreateQueue "{\"QueueName\":\"$name\"}" | sed -n 's/.*"QueueUrl": *"\([^"]*\)".*/\1/p')"
    moto_sns "$endpoint" "Action=Subscribe&TopicArn=$TOPIC_ARN&Protocol=sqs&Endpoint=arn:aws:sqs:us-east-1:123456789012:$name&Attributes.entry.1.key=RawMessageDelivery&Attributes.entry.1.value=true" >/dev/null
}

# Prints the python of the project's venv (under the target dir), with the PyPI
# packages given installed.
py_venv() {
    local venv
    venv="$(target_dir)/py-venv"
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" >/dev/null 2>&1 \
        || { apt_install python3-venv python3-pip; python3 -m venv "$venv"; }
    "$venv/bin/pip" install --quiet "$@" >&2
    printf '%s\n' "$venv/bin/python"
}

# Prints the path of an npm package's command, installed under the target dir:
# PACKAGE@VERSION COMMAND.
npm_tool() {
    local dir
    dir="$(target_dir)/node-tools"
    command -v npm >/dev/null 2>&1 || apt_install nodejs npm
    if [ ! -x "$dir/node_modules/.bin/$2" ]; then
        log "installing $1 into $dir"
        npm install --prefix "$dir" --no-audit --no-fund --silent "$1" >&2
    fi
    printf '%s\n' "$dir/node_modules/.bin/$2"
}
