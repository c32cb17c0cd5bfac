-- The wake-up trigger fires per row and names the row's tenant: PostgreSQL folds the
-- identical notifications of one transaction into one, so a write of one tenant's
-- events still sends one notification naming it once (decision 170).
--
-- The statement trigger of the previous migration had PostgreSQL keep every inserted
-- row in a transition table and grouped them into payloads; on the create path, one
-- event a transaction, that cost more than the notification itself. A row trigger reads
-- nothing but the new row.
--
-- Expand-only: the payload stays a list of tenant ids, of one id now, which every relay
-- since the previous migration reads. On Citus the trigger does not exist (a
-- distributed table has none) and is left so; the function is replaced all the same,
-- for `orderd citus undistribute`, which makes the trigger again, per row.
CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_event', NEW.tenant_id::text);
    RETURN NULL;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify'
                 AND tgrelid = 'outbox_event'::regclass) THEN
        DROP TRIGGER outbox_event_notify ON outbox_event;
        CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
            FOR EACH ROW EXECUTE FUNCTION outbox_event_notify();
    END IF;
END $$;
