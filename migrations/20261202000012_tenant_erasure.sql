-- Tenants being erased (`orderd tenant erase`): while a tenant has a row here, every
-- process refuses its writes (409 tenant-erasure-in-progress), and the claim and the
-- fenced completion of `idempotency_record` refuse them in the database too, so that no
-- write of the tenant can begin or commit however a process learnt of the erasure. The
-- row is the erasure's own state: it survives a killed erase, a re-run resumes it, and
-- only an erase that found no row of the tenant left deletes it.
-- Expand-only: a new table; the release before this one never reads it (run no erase
-- while it still serves).
CREATE TABLE tenant_erasure (
    tenant_id  uuid PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    -- Who started it (`--actor`, default the operating-system user), for the audit.
    actor      text NOT NULL
);
