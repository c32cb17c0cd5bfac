//! The hot-path queries use the indexes they were designed for (EXPLAIN, on a table
//! big enough that the planner would rather not scan it).

use crate::helpers::TestDb;

async fn plan(db: &TestDb, sql: &str) -> String {
    let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
        .fetch_all(&db.pool)
        .await
        .unwrap();
    rows.join("\n")
}

async fn seeded() -> TestDb {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until,
                                         response_status, response_body, created_at, completed_at, expires_at)
         SELECT gen_random_uuid(), 'POST /v1/orders', 'key-' || g, sha256(g::text::bytea),
                CASE WHEN g % 50 = 0 THEN 'PROCESSING' ELSE 'COMPLETED' END,
                CASE WHEN g % 50 = 0 THEN gen_random_uuid() END,
                CASE WHEN g % 50 = 0 THEN now() + interval '30 seconds' END,
                CASE WHEN g % 50 = 0 THEN NULL ELSE 201 END,
                CASE WHEN g % 50 = 0 THEN NULL ELSE '\\x7b7d'::bytea END,
                now(), now(),
                CASE WHEN g % 50 = 0 THEN NULL ELSE now() + (g % 1000) * interval '1 minute' END
         FROM generate_series(1, 20000) g;
         INSERT INTO orders (tenant_id, id, sku, quantity, status, created_at, updated_at)
         SELECT ('00000000-0000-0000-0000-0000000000' || lpad((g % 50)::text, 2, '0'))::uuid, gen_random_uuid(), 'S', 1, 'CREATED',
                now() - g * interval '1 second', now()
         FROM generate_series(1, 20000) g;
         ANALYZE idempotency_record; ANALYZE orders;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_replay_purge_and_list_queries_use_their_indexes() {
    let db = seeded().await;
    let claim = plan(
        &db,
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until, created_at)
         VALUES (gen_random_uuid(), 'POST /v1/orders', 'k', '\\x00'::bytea, 'PROCESSING', gen_random_uuid(), now(), now())
         ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING",
    )
    .await;
    assert!(
        claim.contains("Conflict Arbiter Indexes: idempotency_record_pkey"),
        "{claim}"
    );

    let replay = plan(
        &db,
        "SELECT state FROM idempotency_record
         WHERE tenant_id = '00000000-0000-0000-0000-000000000001' AND endpoint = 'POST /v1/orders' AND idem_key = 'key-1'",
    )
    .await;
    assert!(replay.contains("idempotency_record_pkey"), "{replay}");

    let purge_expired = plan(
        &db,
        "SELECT tenant_id FROM idempotency_record WHERE state = 'COMPLETED' AND expires_at <= clock_timestamp()
         ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED",
    )
    .await;
    assert!(
        purge_expired.contains("idempotency_record_expired"),
        "{purge_expired}"
    );

    let purge_abandoned = plan(
        &db,
        "SELECT tenant_id FROM idempotency_record WHERE state = 'PROCESSING' AND lease_until <= clock_timestamp() - interval '1 hour'
         ORDER BY lease_until LIMIT 1000 FOR UPDATE SKIP LOCKED",
    )
    .await;
    assert!(
        purge_abandoned.contains("idempotency_record_abandoned"),
        "{purge_abandoned}"
    );

    let list = plan(
        &db,
        "SELECT id FROM orders WHERE tenant_id = '00000000-0000-0000-0000-000000000001'
           AND (created_at, id) < (now(), '00000000-0000-0000-0000-000000000000')
         ORDER BY created_at DESC, id DESC LIMIT 21",
    )
    .await;
    assert!(list.contains("orders_tenant_newest"), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_claim_and_the_outbox_gauges_stay_on_partial_indexes_among_many_published_rows() {
    let db = TestDb::new().await;
    // 200,000 published rows, a handful pending and dead: the shape of a healthy outbox.
    sqlx::raw_sql(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at, status, published_at)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{}', now(), now(),
                CASE WHEN g % 20000 = 0 THEN 'PENDING' WHEN g % 50000 = 1 THEN 'DEAD' ELSE 'PUBLISHED' END,
                CASE WHEN g % 20000 = 0 OR g % 50000 = 1 THEN NULL ELSE now() END
         FROM generate_series(1, 200000) g;
         ANALYZE outbox_event;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let stats = plan(
        &db,
        "SELECT (SELECT count(*) FROM outbox_event WHERE status = 'PENDING'),
                (SELECT min(occurred_at) FROM outbox_event WHERE status = 'PENDING'),
                (SELECT count(*) FROM outbox_event WHERE status = 'DEAD')",
    )
    .await;
    assert!(!stats.contains("Seq Scan"), "{stats}");
    assert!(
        stats.contains("outbox_event_pending") && stats.contains("outbox_event_dead"),
        "{stats}"
    );

    let claim = plan(
        &db,
        "SELECT e.tenant_id, e.event_id FROM outbox_event e
         WHERE e.status = 'PENDING' AND e.next_attempt_at <= clock_timestamp()
           AND NOT EXISTS (SELECT 1 FROM outbox_event earlier
                           WHERE earlier.tenant_id = e.tenant_id AND earlier.aggregate_id = e.aggregate_id
                             AND earlier.aggregate_seq < e.aggregate_seq AND earlier.status <> 'PUBLISHED')
         ORDER BY e.next_attempt_at LIMIT 100 FOR UPDATE OF e SKIP LOCKED",
    )
    .await;
    assert!(!claim.contains("Seq Scan"), "{claim}");
    assert!(claim.contains("outbox_event_pending"), "{claim}");
    assert!(
        claim.contains("outbox_event_unpublished_by_order"),
        "{claim}"
    );

    let purge = plan(
        &db,
        "SELECT tenant_id FROM outbox_event WHERE status = 'PUBLISHED' AND published_at <= clock_timestamp() - interval '1 day'
         ORDER BY published_at LIMIT 1000 FOR UPDATE SKIP LOCKED",
    )
    .await;
    assert!(purge.contains("outbox_event_published"), "{purge}");
}
