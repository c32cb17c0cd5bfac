-- The relay round that last claimed an event. Recording an outcome (published,
-- refused, put back) is fenced on it, so a relay whose lease ran out cannot overwrite
-- what the relay that claimed the event after it recorded (docs/contract.md §6).
-- Expand-only: a nullable column without a default is added instantly, and a previous
-- release, which neither sets nor reads it, keeps working beside this one.
ALTER TABLE outbox_event ADD COLUMN claimed_by uuid;
