-- On Citus (the `citus` extension present in this database): the three tables of tenant
-- data distributed by `tenant_id` and co-located, so that a tenant's order, its event
-- and its stored answer live in shards on one worker and commit in one transaction
-- there; the erasure marks a reference table (a copy on every node), so that the
-- statements that check them run on the tenant's worker alone. On plain PostgreSQL
-- this does nothing.
--
-- A table with a trigger cannot be distributed: the trigger that woke the relays on
-- every insert into outbox_event goes (on Citus only), and the writers wake them
-- instead (`outbox::wake`).
--
-- Expand-only: the columns, keys and indexes stay as they are; a release before this
-- one keeps working against a distributed schema only where its statements run on
-- Citus, so distribute before or with this release, not under an older one.
--
-- On a database that already holds data, distributing copies it into the shards and
-- blocks writes to each table meanwhile: `orderd citus distribute` does it online
-- instead (docs/scaling.md).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        RETURN;
    END IF;
    DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event;
    -- No statement of this release reads it, and on a shard it is the one way into the
    -- pending rows that is not the tenant's own range (see `CLAIM_TENANT_DISTRIBUTED`).
    DROP INDEX IF EXISTS outbox_event_pending;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass) THEN
        PERFORM create_distributed_table('orders', 'tenant_id');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_record'::regclass) THEN
        PERFORM create_distributed_table('idempotency_record', 'tenant_id', colocate_with => 'orders');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'outbox_event'::regclass) THEN
        PERFORM create_distributed_table('outbox_event', 'tenant_id', colocate_with => 'orders');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'tenant_erasure'::regclass) THEN
        PERFORM create_reference_table('tenant_erasure');
    END IF;
END $$;
