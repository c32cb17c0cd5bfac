-- The idempotency records and the outbox events are queues: each row lives for its
-- retention and is then deleted by orderd's purges, so these tables turn over their
-- whole content every day (or every TTL), and an outbox row is updated twice on the
-- way (claimed, marked). PostgreSQL's default is to vacuum a table once a fifth of it
-- is dead: at ten million rows, two million dead rows and their index entries before
-- the space is reused, which the claim's and the purge's index scans walk meanwhile.
-- Vacuumed at 2 % (and analysed at 2 %, so that the planner's picture of the pending
-- rows stays current), the tables keep a plateau (docs/performance.md, steady state).
--
-- Storage parameters only: ALTER TABLE ... SET takes a lock that blocks neither reads
-- nor writes, and the running release is unaffected.
ALTER TABLE idempotency_record SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE outbox_event SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
