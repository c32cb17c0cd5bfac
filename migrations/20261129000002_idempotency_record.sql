-- One row per (tenant, endpoint, Idempotency-Key): the claim, its lease and, once
-- completed, the exact response to replay (contract section 4).
CREATE TABLE idempotency_record (
    tenant_id         uuid        NOT NULL,
    -- Method and route template, e.g. 'POST /v1/orders/{id}/cancel'.
    endpoint          text        NOT NULL,
    idem_key          text        NOT NULL,
    -- SHA-256 of the canonical request; a different one under the same key is a 422.
    fingerprint       bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    state             text        NOT NULL CHECK (state IN ('PROCESSING', 'COMPLETED')),
    -- Random token of the request that owns a PROCESSING claim; completion is fenced on it.
    owner_token       uuid,
    -- A PROCESSING claim may be taken over once this passes (database clock).
    lease_until       timestamptz,
    response_status   smallint,
    response_location text,
    response_content_type text,
    response_body     bytea,
    created_at        timestamptz NOT NULL,
    completed_at      timestamptz,
    -- A COMPLETED key is forgotten after this; the same key is then a new request.
    expires_at        timestamptz,
    PRIMARY KEY (tenant_id, endpoint, idem_key),
    CHECK (state <> 'PROCESSING' OR (owner_token IS NOT NULL AND lease_until IS NOT NULL)),
    CHECK (state <> 'COMPLETED' OR (response_status IS NOT NULL AND response_body IS NOT NULL AND expires_at IS NOT NULL))
);

-- The retention purge walks expired completed keys in bounded batches.
CREATE INDEX idempotency_record_expired ON idempotency_record (expires_at) WHERE state = 'COMPLETED';
-- ... and PROCESSING claims abandoned long ago (a killed worker never retried).
CREATE INDEX idempotency_record_abandoned ON idempotency_record (lease_until) WHERE state = 'PROCESSING';
