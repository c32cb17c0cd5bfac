-- The W3C trace context of the request that caused an event, published with it as the
-- message attributes `traceparent` and `tracestate`. Expand-only: the columns are
-- nullable, so the release before this one keeps inserting rows without them, and
-- relays of either release read every row.
ALTER TABLE outbox_event
    ADD COLUMN trace_parent text,
    ADD COLUMN trace_state text;
