//! The relay is fair across tenants (docs/contract.md §6): one tenant's backlog, laid
//! down by SQL as a bulk import or a re-drive would leave it, does not hold back another
//! tenant's events. The quiet tenant's events are published while the backlog is still
//! there, not after it drained.

use uuid::Uuid;

use crate::support::{
    TestDb, new_key, order_body,
    sns::{bare_topic, start_moto},
    spawn_publishing_app_on,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_events_are_published_while_another_tenants_backlog_of_60_000_waits() {
    // moto takes about a thousand messages a second, so the backlog lasts about a
    // minute; a topic of its own, without a queue, on a moto of its own.
    let moto = start_moto();
    let arn = bare_topic(&moto, "fairness").await;
    let db = TestDb::new().await;
    let noisy = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT $1, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                jsonb_build_object('event_type', 'OrderCreated', 'schema_version', 1, 'tenant_id', $1::text),
                now(), now()
         FROM generate_series(1, 60000);
         ",
    )
    .bind(noisy)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox_event")
        .execute(&db.pool)
        .await
        .unwrap();
    let app = spawn_publishing_app_on(db, &moto, &arn, &[]).await;

    // The quiet tenant creates an order every 100 ms while the relay works the backlog.
    let quiet = Uuid::new_v4();
    let token = app.token(quiet);
    for i in 0..20 {
        let created = app
            .create(&token, &new_key(), &order_body(&format!("QUIET-{i}"), 1))
            .await;
        assert_eq!(created.status, 201);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    app.db
        .until_count(
            &format!(
                "SELECT count(*) FROM outbox_event WHERE tenant_id = '{quiet}' AND status = 'PUBLISHED'"
            ),
            20,
        )
        .await;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event WHERE tenant_id = $1 AND status = 'PENDING'",
    )
    .bind(noisy)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    let lags: Vec<f64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM published_at - occurred_at)::float8 * 1000
         FROM outbox_event WHERE tenant_id = $1 ORDER BY 1",
    )
    .bind(quiet)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    println!(
        "the quiet tenant's 20 events: commit to publish median {:.0} ms, worst {:.0} ms; \
         {left} of the other tenant's 60,000 still pending",
        lags[10], lags[19]
    );
    // Published while the backlog was still there: before the fair claim they waited
    // for all of it.
    assert!(left > 30_000, "only {left} of the backlog were left");
}
