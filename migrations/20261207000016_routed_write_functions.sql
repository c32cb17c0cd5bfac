-- The claim and the create as one function call each, for a distributed database
-- (Citus), where every statement that touches a distributed table is planned by Citus
-- as well as by PostgreSQL, and every round trip inside a transaction is one more
-- statement to plan. On the node that holds the tenant's shard, a call runs its
-- statements there, one after another, in one implicit transaction: two round trips a
-- create instead of ten (six statements, and each transaction's BEGIN and COMMIT)
-- (decision 173). On plain PostgreSQL the functions exist too (for a database
-- distributed later) and orderd does not call them: its one-statement claim and
-- create are cheaper there.
--
-- On Citus, `CREATE FUNCTION` reaches every node (Citus propagates it, and gives it to a
-- node added later); `orderd citus distribute` does the same for a database migrated
-- before Citus was there. The functions are not co-located with the tables: a call
-- Citus would delegate to the tenant's node takes a lock on `orders` first (so a claim
-- would wait for whatever holds that table), and orderd sends its calls to that node
-- itself. A call the coordinator receives (routing off, or the node unreachable) runs
-- there, its statements forwarded one by one, as they were before.
--
-- Both plan every statement for its parameters (`plan_cache_mode`): on a node that
-- holds the shard, Citus 13.2.2 caches a new generic plan at every execution of a
-- statement with `tenant_id = $1`, and a backend's memory would grow without bound.
--
-- Expand-only: new functions; no table changes.

-- Claims an unknown key for `p_owner`, or reads the record that holds it: one row,
-- `claimed` true, when this call claimed it (`read_at` is the claim's time); one row,
-- `claimed` false, with the record; no row when the record it ran into was gone again
-- when read (released meanwhile). While the tenant is being erased it claims nothing and raises
-- SQLSTATE OD001. The claim goes first: from it on this is a distributed transaction
-- that an erasure beginning meanwhile waits for, so the mark read after it is either
-- seen here or set after this call ended (and the erasure then deletes what it wrote).
CREATE OR REPLACE FUNCTION orderd_claim(
    p_tenant uuid, p_endpoint text, p_key text, p_fingerprint bytea, p_owner uuid,
    p_lease_ms bigint,
    OUT claimed boolean, OUT state text, OUT fingerprint bytea, OUT owner_token uuid,
    OUT lease_until timestamptz, OUT expires_at timestamptz, OUT response_status smallint,
    OUT response_location text, OUT response_content_type text, OUT response_body bytea,
    OUT response_key_id text, OUT response_seal_version smallint, OUT resource_id uuid,
    OUT read_at timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    claimed_at timestamptz;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO idempotency_record AS r
           (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until, created_at)
    VALUES (p_tenant, p_endpoint, p_key, p_fingerprint, 'PROCESSING', p_owner,
            statement_timestamp() + p_lease_ms * interval '1 millisecond', statement_timestamp())
    ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING
    RETURNING r.created_at INTO claimed_at;
    IF EXISTS (SELECT 1 FROM tenant_erasure e WHERE e.tenant_id = p_tenant) THEN
        RAISE EXCEPTION 'tenant % is being erased', p_tenant USING ERRCODE = 'OD001';
    END IF;
    IF claimed_at IS NOT NULL THEN
        claimed := true;
        read_at := claimed_at;
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT false, r.state, r.fingerprint, r.owner_token, r.lease_until, r.expires_at,
           r.response_status, r.response_location, r.response_content_type, r.response_body,
           r.response_key_id, r.response_seal_version, r.resource_id, clock_timestamp()
    FROM idempotency_record r
    WHERE r.tenant_id = p_tenant AND r.endpoint = p_endpoint AND r.idem_key = p_key;
END $$;

-- Inserts the order and its event, then completes the record `p_owner` holds with the
-- response, only while it still holds it and the tenant is not being erased, then wakes
-- the relays of this node: all of it, or nothing and SQLSTATE OD002 when the record was
-- not completed. In this order the call locks nothing of the record until its last
-- write, as the one-statement create does (which takes every table's lock before it
-- begins): a call that stalls (on a lock, a slow disk) while its lease runs out leaves
-- the key free for a takeover and is refused at its fence, rather than holding the
-- record and winning over the request that took the key over.
CREATE OR REPLACE FUNCTION orderd_create(
    p_tenant uuid, p_endpoint text, p_key text, p_owner uuid, p_status smallint,
    p_location text, p_content_type text, p_body bytea, p_expires_at timestamptz,
    p_key_id text, p_resource uuid, p_seal_version smallint,
    o_tenant uuid, o_id uuid, o_sku text, o_quantity integer, o_customer_ref text,
    o_at timestamptz,
    e_tenant uuid, e_id uuid, e_aggregate uuid, e_seq integer, e_type text, e_payload jsonb,
    e_occurred_at timestamptz, e_trace_parent text, e_trace_state text)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    INSERT INTO orders (tenant_id, id, sku, quantity, customer_ref, status, created_at, updated_at)
    VALUES (o_tenant, o_id, o_sku, o_quantity, o_customer_ref, 'CREATED', o_at, o_at);
    INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type,
                              payload, occurred_at, trace_parent, trace_state, next_attempt_at)
    VALUES (e_tenant, e_id, e_aggregate, e_seq, e_type, e_payload, e_occurred_at,
            e_trace_parent, e_trace_state, statement_timestamp());
    UPDATE idempotency_record
    SET state = 'COMPLETED', response_status = p_status, response_location = p_location,
        response_content_type = p_content_type, response_body = p_body,
        response_key_id = p_key_id, response_seal_version = p_seal_version,
        resource_id = p_resource, completed_at = statement_timestamp(),
        expires_at = p_expires_at, lease_until = NULL
    WHERE tenant_id = p_tenant AND endpoint = p_endpoint AND idem_key = p_key
      AND state = 'PROCESSING' AND owner_token = p_owner
      AND NOT EXISTS (SELECT 1 FROM tenant_erasure e WHERE e.tenant_id = p_tenant);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the record of key % is no longer held by %', p_key, p_owner
            USING ERRCODE = 'OD002';
    END IF;
    PERFORM pg_notify('outbox_event', p_tenant::text);
END $$;
