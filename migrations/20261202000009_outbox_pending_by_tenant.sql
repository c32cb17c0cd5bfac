-- no-transaction
-- The relay's fair claim (docs/contract.md §6, decision 124) walks the tenants that have
-- pending events, one index probe each from a random point (a loose index scan), and
-- takes each one's oldest due events; both read this index, which holds only pending
-- rows, so it stays as small as the backlog however many published rows there are.
--
-- Expand-only and online: CONCURRENTLY builds it without blocking writes, so the
-- previous release keeps serving while this runs. It cannot run inside a transaction
-- (hence the first line) and must be the file's only statement. Should the build fail
-- midway, PostgreSQL leaves an INVALID index that IF NOT EXISTS would then skip:
-- `DROP INDEX CONCURRENTLY outbox_event_pending_by_tenant;` and run the migration again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_event_pending_by_tenant
    ON outbox_event (tenant_id, next_attempt_at) WHERE status = 'PENDING';
