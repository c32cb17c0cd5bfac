-- What the relay needs beyond the table itself.

-- The per-order "is an earlier event still unpublished?" probe of the claim query looks
-- only at unpublished rows, so it stays a tiny index lookup however many published
-- rows the table holds.
CREATE INDEX outbox_event_unpublished_by_order
    ON outbox_event (tenant_id, aggregate_id, aggregate_seq) WHERE status <> 'PUBLISHED';

-- The oldest-pending-age gauge reads the minimum of this small partial index.
CREATE INDEX outbox_event_pending_age ON outbox_event (occurred_at) WHERE status = 'PENDING';

-- The DEAD count and the re-drive read only DEAD rows.
CREATE INDEX outbox_event_dead ON outbox_event (event_id) WHERE status = 'DEAD';

-- The retention purge walks published rows oldest first, in batches.
CREATE INDEX outbox_event_published ON outbox_event (published_at) WHERE status = 'PUBLISHED';

-- Wake the relays when events commit. NOTIFY is transactional (delivered on commit,
-- dropped on rollback) and identical notifications of one transaction are merged, so a
-- statement-level trigger adds no round trip to the write and at most one tiny
-- notification per transaction.
CREATE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_event', '');
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
