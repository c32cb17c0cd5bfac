-- The transactional outbox: one row per committed change, written in the same
-- transaction as the change, published to SNS by the relay (contract section 6).
CREATE TABLE outbox_event (
    tenant_id       uuid        NOT NULL,
    event_id        uuid        NOT NULL,
    -- Commit-ordered per aggregate: the relay publishes an order's events by this.
    aggregate_id    uuid        NOT NULL,
    aggregate_seq   integer     NOT NULL,
    event_type      text        NOT NULL,
    -- The SNS message body, exactly as published.
    payload         jsonb       NOT NULL,
    occurred_at     timestamptz NOT NULL,
    status          text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'PUBLISHED', 'DEAD')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_error      text,
    published_at    timestamptz,
    PRIMARY KEY (tenant_id, event_id),
    UNIQUE (tenant_id, aggregate_id, aggregate_seq)
);

-- The relay's claim query scans only rows still to publish; published rows (the vast
-- majority over time) never enter this index.
CREATE INDEX outbox_event_pending ON outbox_event (next_attempt_at) WHERE status = 'PENDING';
