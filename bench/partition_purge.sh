#!/usr/bin/env bash
# One-off measurement for docs/scaling.md, not part of CI: the cost of the outbox
# retention purge on 10 million published events spread over ten days, two ways.
#
#   1. Today's schema: the purge's own DELETE (bounded batches of 1000, each its own
#      transaction, SKIP LOCKED) removes the oldest day.
#   2. `outbox_event` partitioned by day on occurred_at, managed by pg_partman
#      (Debian: postgresql-NN-partman): retention drops the oldest day's partition.
#
# Prints, for each: the time, the WAL written, and the table's size before and after.
#   bench/partition_purge.sh [ADMIN_URL]   (default postgres://postgres@127.0.0.1:5432/postgres)
set -euo pipefail
ADMIN="${1:-postgres://postgres@127.0.0.1:5432/postgres}"
ROWS="${ROWS:-10000000}"
DAYS=10
cd "$(dirname "$0")/.."
BIN="${ORDERD_BIN:-target/release/orderd}"
[ -x "$BIN" ] || cargo build --release --bin orderd

db_url() { printf '%s' "${ADMIN%/*}/$1"; }
fresh() {
    psql -q "$ADMIN" -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1"
    DATABASE_URL="$(db_url "$1")" "$BIN" migrate 2>/dev/null
}
q() { psql -qAtX "$(db_url "$1")" -c "$2"; }

# The rows: one OrderCreated per order, published a second after it occurred,
# ROWS / DAYS per day over the DAYS days before today's midnight. Both ways remove the
# oldest of those days.
LOAD="INSERT INTO %s (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload,
                      occurred_at, next_attempt_at, status, published_at)
      SELECT md5((g %% 1000)::text)::uuid, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
             jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1,
                                'order', jsonb_build_object('sku', 'SKU-' || g %% 5000, 'quantity', 1, 'status', 'CREATED')),
             t, t, 'PUBLISHED', t + interval '1 second'
      FROM generate_series(1, $ROWS) g,
           LATERAL (SELECT (current_date - $DAYS)::timestamptz
                           + ((g - 1)::float8 / $ROWS) * interval '$DAYS days' AS t) at"

measure() { # db, label, sql...
    local db=$1 label=$2 sql=$3
    local before_size before_rows before_lsn start end after_size wal
    before_size=$(q "$db" "SELECT pg_total_relation_size('outbox_event')")
    [ "$before_size" = 0 ] && before_size=$(q "$db" "SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = 'outbox_event'::regclass")
    before_rows=$(q "$db" "SELECT count(*) FROM outbox_event")
    before_lsn=$(q "$db" "SELECT pg_current_wal_lsn()")
    start=$(date +%s.%N)
    psql -qAtX "$(db_url "$db")" -c "$sql" >/dev/null
    end=$(date +%s.%N)
    wal=$(q "$db" "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$before_lsn')")
    after_size=$(q "$db" "SELECT pg_total_relation_size('outbox_event')")
    [ "$after_size" = 0 ] && after_size=$(q "$db" "SELECT sum(pg_total_relation_size(inhrelid)) FROM pg_inherits WHERE inhparent = 'outbox_event'::regclass")
    printf '%-46s %7.2f s  WAL %7.1f MiB  size %7.1f -> %7.1f MiB  rows removed %s\n' "$label" \
        "$(echo "$end - $start" | bc)" "$(echo "$wal / 1048576" | bc -l)" \
        "$(echo "$before_size / 1048576" | bc -l)" "$(echo "$after_size / 1048576" | bc -l)" \
        "$((before_rows - $(q "$db" "SELECT count(*) FROM outbox_event")))"
}

echo "== $ROWS published events over $DAYS days; purge the oldest day"

# 1. Batched DELETE, the statement of src/outbox/store.rs (PURGE_PUBLISHED), looped in a
#    procedure that commits after every batch, as the purge job does.
fresh orderd_purge_delete
q orderd_purge_delete "$(printf "$LOAD" outbox_event)"
q orderd_purge_delete "VACUUM ANALYZE outbox_event"
q orderd_purge_delete "CREATE PROCEDURE purge_in_batches(retention_secs bigint) LANGUAGE plpgsql AS \$\$
DECLARE n bigint;
BEGIN
  LOOP
    DELETE FROM outbox_event WHERE (tenant_id, event_id) IN (
        SELECT tenant_id, event_id FROM outbox_event
        WHERE status = 'PUBLISHED' AND published_at <= clock_timestamp() - retention_secs * interval '1 second'
        ORDER BY published_at LIMIT 1000 FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    COMMIT;
    EXIT WHEN n < 1000;
  END LOOP;
END \$\$"
measure orderd_purge_delete "batched DELETE (1000 per transaction)" \
    "CALL purge_in_batches(extract(epoch FROM now() - (current_date - $((DAYS - 1)))::timestamptz)::bigint)"
measure orderd_purge_delete "VACUUM afterwards (space reusable, not freed)" "VACUUM outbox_event"

# 2. The same rows in daily partitions (pg_partman), retention drops a partition.
fresh orderd_purge_partition
q orderd_purge_partition "CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman"
q orderd_purge_partition "
    ALTER TABLE outbox_event RENAME TO outbox_event_unpartitioned;
    CREATE TABLE outbox_event (LIKE outbox_event_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (occurred_at);
    ALTER TABLE outbox_event ADD PRIMARY KEY (tenant_id, event_id, occurred_at);
    CREATE INDEX ON outbox_event (next_attempt_at) WHERE status = 'PENDING';
    CREATE INDEX ON outbox_event (tenant_id, aggregate_id, aggregate_seq) WHERE status <> 'PUBLISHED';
    CREATE INDEX ON outbox_event (occurred_at) WHERE status = 'PENDING';
    CREATE INDEX ON outbox_event (published_at) WHERE status = 'PUBLISHED';
    DROP TABLE outbox_event_unpartitioned;"
q orderd_purge_partition "SELECT partman.create_parent('public.outbox_event', 'occurred_at', 'native', 'daily',
        p_premake := 2, p_start_partition := (current_date - $DAYS)::text)"
q orderd_purge_partition "$(printf "$LOAD" outbox_event)"
q orderd_purge_partition "VACUUM ANALYZE outbox_event"
q orderd_purge_partition "UPDATE partman.part_config SET retention = '$((DAYS - 1)) days', retention_keep_table = false
                           WHERE parent_table = 'public.outbox_event'"
measure orderd_purge_partition "pg_partman retention (DROP of one partition)" \
    "SELECT partman.run_maintenance('public.outbox_event')"

psql -q "$ADMIN" -c "DROP DATABASE orderd_purge_delete" -c "DROP DATABASE orderd_purge_partition"
