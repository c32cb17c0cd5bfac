-- Stored responses sealed at rest (docs/contract.md §12): the id of the key a sealed
-- `response_body` is sealed under (NULL: the body is stored as it is), and the id of
-- the resource the stored answer names (the order), kept in clear so that
-- reconciliation can join a stored success to its order without opening the body.
-- Expand-only: nullable columns without defaults are added instantly; the release
-- before this one neither writes nor reads them and keeps working beside this one,
-- as long as no key is configured (its replays would return a sealed body as it is).
ALTER TABLE idempotency_record
    ADD COLUMN response_key_id text,
    ADD COLUMN resource_id uuid;
