-- Which layout of associated data a sealed `response_body` was sealed with: NULL or 1,
-- the record's (tenant, endpoint, key) alone, as the first sealing release wrote it;
-- 2, also everything a replay sends and reconciliation reads beside the body (status,
-- location, content type, resource id), so that none of them can be changed in the
-- table without the body failing to open. `orderd keys rewrap` upgrades 1 to 2.
-- Expand-only: a nullable column without a default is added instantly; the release
-- before this one neither writes nor reads it, and its records (NULL) keep opening.
ALTER TABLE idempotency_record ADD COLUMN response_seal_version smallint;
