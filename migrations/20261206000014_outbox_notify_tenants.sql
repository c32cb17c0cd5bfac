-- The wake-up names its tenants: the insert trigger's notification carries the ids of
-- the tenants whose events the statement inserted (comma-separated, at most 200 to a
-- notification, within PostgreSQL's 8000-byte payload), as the writers' own
-- notifications do on Citus. A relay then visits the tenants it hears of and those a
-- look at the index by due time finds, instead of walking every tenant with a pending
-- event (decision 165).
--
-- Expand-only: a relay of the previous release reads any payload as "something
-- committed", as it read the empty one. On Citus the trigger does not exist (a
-- distributed table has none) and is left so; the function is replaced all the same,
-- for `orderd citus undistribute`, which makes the trigger again.
CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_event', string_agg(tenant_id::text, ','))
    FROM (SELECT tenant_id, (row_number() OVER (ORDER BY tenant_id) - 1) / 200 AS part
          FROM (SELECT DISTINCT tenant_id FROM inserted) d) t
    GROUP BY part;
    RETURN NULL;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify'
                 AND tgrelid = 'outbox_event'::regclass) THEN
        DROP TRIGGER outbox_event_notify ON outbox_event;
        CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
            REFERENCING NEW TABLE AS inserted
            FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
    END IF;
END $$;
