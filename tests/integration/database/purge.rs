//! Retention: expired keys and long-abandoned claims go, in batches; nothing else does.

use orderd::retention::{IdempotencyPurge, purge_idempotency_once};

use crate::support::TestDb;

async fn seed(db: &TestDb, n: i32, state: &str, expires: &str, lease: &str) {
    sqlx::query(
        "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until,
                                         response_status, response_body, created_at, completed_at, expires_at)
         SELECT gen_random_uuid(), 'POST /v1/orders', 'key-' || gen_random_uuid(), sha256(g::text::bytea), $2,
                CASE WHEN $2 = 'PROCESSING' THEN gen_random_uuid() END,
                CASE WHEN $2 = 'PROCESSING' THEN clock_timestamp() + $4::interval END,
                CASE WHEN $2 = 'COMPLETED' THEN 201 END,
                CASE WHEN $2 = 'COMPLETED' THEN '\\x7b7d'::bytea END,
                now(), now(),
                CASE WHEN $2 = 'COMPLETED' THEN clock_timestamp() + $3::interval END
         FROM generate_series(1, $1) g",
    )
    .bind(n)
    .bind(state)
    .bind(expires)
    .bind(lease)
    .execute(&db.pool)
    .await
    .unwrap();
}

async fn count(db: &TestDb, state: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idempotency_record WHERE state = $1")
        .bind(state)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_deletes_expired_and_abandoned_rows_in_batches_and_keeps_the_rest() {
    let db = TestDb::new().await;
    seed(&db, 25, "COMPLETED", "-1 minute", "0 seconds").await; // expired
    seed(&db, 5, "COMPLETED", "1 hour", "0 seconds").await; // still remembered
    seed(&db, 7, "PROCESSING", "0 seconds", "-2 hours").await; // abandoned long ago
    seed(&db, 3, "PROCESSING", "0 seconds", "-1 minute").await; // expired lease, recent: a retry may take it over
    seed(&db, 4, "PROCESSING", "0 seconds", "30 seconds").await; // in flight

    // A batch of 10 forces several rounds.
    let report = purge_idempotency_once(&db.direct(), 10).await.unwrap();
    assert_eq!(
        report,
        IdempotencyPurge {
            expired_keys: 25,
            abandoned_claims: 7
        }
    );
    assert_eq!(count(&db, "COMPLETED").await, 5);
    assert_eq!(count(&db, "PROCESSING").await, 7);
    // A second pass finds nothing.
    assert_eq!(
        purge_idempotency_once(&db.direct(), 10).await.unwrap(),
        IdempotencyPurge::default()
    );
}

/// The purge reads its candidates without locks and deletes them one tenant per
/// statement, checking the condition again: a claim that a retry took over between the
/// two (its lease moved on) is kept, and so is a row another transaction holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_or_held_after_the_purge_read_it_is_kept() {
    use orderd::idempotency::store as idem;
    use uuid::Uuid;
    let db = TestDb::new().await;
    seed(&db, 3, "PROCESSING", "0 seconds", "-2 hours").await;
    let groups: Vec<idem::PurgeGroup> = sqlx::query_as(idem::PURGEABLE_ABANDONED.as_str())
        .bind(3600i64)
        .bind(10i64)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(groups.len(), 3, "one group per tenant");
    let (taken, held, free) = (&groups[0], &groups[1], &groups[2]);
    // A retry takes the first over: its lease now runs into the future.
    sqlx::query("UPDATE idempotency_record SET lease_until = now() + interval '30 seconds' WHERE tenant_id = $1")
        .bind(taken.0)
        .execute(&db.pool)
        .await
        .unwrap();
    // Another transaction holds the second.
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idempotency_record WHERE tenant_id = $1 FOR UPDATE")
        .bind(held.0)
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut deleted = Vec::new();
    for (tenant, endpoints, keys, cutoff) in &groups {
        let done = sqlx::query(idem::PURGE_ABANDONED.as_str())
            .bind(tenant)
            .bind(endpoints)
            .bind(keys)
            .bind(cutoff)
            .execute(&db.pool)
            .await
            .unwrap();
        deleted.push(done.rows_affected());
    }
    assert_eq!(deleted, [0, 0, 1]);
    holder.rollback().await.unwrap();
    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT tenant_id FROM idempotency_record ORDER BY tenant_id")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let mut kept = vec![taken.0, held.0];
    kept.sort();
    assert_eq!(left, kept);
    assert!(!left.contains(&free.0));
    // The next pass takes the one that was held, and never the one taken over.
    let report = purge_idempotency_once(&db.direct(), 10).await.unwrap();
    assert_eq!(report.abandoned_claims, 1);
    assert_eq!(count(&db, "PROCESSING").await, 1);
}

/// The purged tables are vacuumed at 2 % of dead rows, not the server's default of a
/// fifth, and orderd reads (and warns about) a server that does not vacuum at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purged_tables_are_vacuumed_early_and_a_server_without_autovacuum_is_noticed() {
    let db = TestDb::new().await;
    for table in ["idempotency_record", "outbox_event"] {
        let options: Vec<String> = sqlx::query_scalar(
            "SELECT unnest(reloptions) FROM pg_class WHERE oid = $1::regclass ORDER BY 1",
        )
        .bind(table)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            options,
            [
                "autovacuum_analyze_scale_factor=0.02",
                "autovacuum_vacuum_insert_scale_factor=0.02",
                "autovacuum_vacuum_scale_factor=0.02",
            ],
            "{table}"
        );
    }
    // The business record keeps the server's defaults: it is not a queue.
    let orders: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = 'orders'::regclass")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(orders, None);

    let server: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let config = crate::support::settings(&db, &[]);
    let orderd_db = orderd::db::connect_db(&config.db).await.unwrap();
    let on = orderd::db::check_autovacuum(&orderd_db).await.unwrap();
    assert_eq!(on, server == "on");
}
