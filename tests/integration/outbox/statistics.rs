//! The relay keeps the outbox's planner statistics in step with a backlog that landed
//! after the last `ANALYZE` (decisions 141 and 167): statistics taken while every event
//! was published say no event is pending, and the relay's statements then read every
//! pending row. On Citus the statistics that count are each shard's, on its worker.
//! Read from the database's own counters, not from a clock.

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{
    TestDb, on_citus, settings,
    sns::{Topic, moto_endpoint, publisher},
};

/// Manual `ANALYZE`s of `outbox_event` so far (`analyzed`), and rows changed since the
/// last one (`changed`): on Citus, of its shards, summed.
fn counters() -> &'static str {
    if on_citus() {
        "SELECT sum(split_part(result, ',', 1)::bigint)::bigint AS analyzed,
                sum(split_part(result, ',', 2)::bigint)::bigint AS changed
         FROM run_command_on_shards('outbox_event',
             $$SELECT pg_stat_get_analyze_count('%1$s'::regclass) || ',' || pg_stat_get_mod_since_analyze('%1$s'::regclass)$$)"
    } else {
        "SELECT pg_stat_get_analyze_count('outbox_event'::regclass) AS analyzed,
                pg_stat_get_mod_since_analyze('outbox_event'::regclass) AS changed"
    }
}

/// What [`counters`] reads now.
async fn analysed(db: &TestDb) -> (i64, i64) {
    sqlx::query_as(counters())
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Waits until the counters meet `condition` (SQL over `analyzed` and `changed`).
async fn until_analysed(db: &TestDb, condition: &str) {
    db.until_count(
        &format!("SELECT ({condition})::int::bigint FROM ({}) c", counters()),
        1,
    )
    .await;
}

/// The tenant whose backlog lands after the last `ANALYZE`.
const BACKLOG: Uuid = Uuid::from_u128(0xb);

/// A database that ran a while (2,000 published events of one tenant, analysed), then
/// 30,000 events of a new tenant laid down by SQL, in retry backoff for an hour (so
/// that the relay has nothing to publish and only its statistics check runs).
async fn stale() -> TestDb {
    let db = TestDb::new().await;
    let published = "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload,
                                   occurred_at, next_attempt_at, status, published_at)
         SELECT '00000000-0000-0000-0000-00000000000a', gen_random_uuid(), gen_random_uuid(), 1,
                'OrderCreated', '{}', now(), now(), 'PUBLISHED', now()
         FROM generate_series(1, 2000)";
    let backlog = "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload,
                                   occurred_at, next_attempt_at)
         SELECT '00000000-0000-0000-0000-00000000000b', gen_random_uuid(), gen_random_uuid(), 1,
                'OrderCreated', '{}', now(), now() + interval '1 hour'
         FROM generate_series(1, 30000)";
    // A session publishes its counters when it goes idle, at most once a second (on
    // Citus the sessions are the coordinator's to the workers): the `ANALYZE` waits for
    // the first rows' count, or their count would land after it.
    let run = async |statement: &str| {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "{statement}; SELECT pg_stat_force_next_flush()"
        )))
        .execute(&db.pool)
        .await
        .unwrap();
    };
    run(published).await;
    until_analysed(&db, "changed >= 2000").await;
    run("ANALYZE outbox_event").await;
    until_analysed(&db, "changed = 0").await;
    run(backlog).await;
    until_analysed(&db, "changed >= 30000").await;
    db
}

/// A relay on `db` with the settings `overrides`, running until the returned token is
/// cancelled (the handle ends then).
async fn relay(
    db: &TestDb,
    overrides: &[(&str, &str)],
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let topic = Topic::create(false).await;
    let config = settings(db, overrides);
    let relay = orderd::outbox::relay::Relay::new(
        db.direct_sized(3),
        db.session_options(),
        publisher(&moto_endpoint(), &topic.arn, &config).await,
        config.outbox.clone(),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(relay.run(stop.clone()));
    (stop, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_analyses_the_outbox_when_a_backlog_outgrew_its_statistics_and_only_then() {
    let db = stale().await;
    let (before, _) = analysed(&db).await;
    let (stop, running) = relay(&db, &[]).await;
    // On Citus: the backlog's shard, the one that changed.
    until_analysed(&db, &format!("analyzed > {before}")).await;
    stop.cancel();
    running.await.unwrap();
    let (after, changed) = analysed(&db).await;
    assert_eq!(after, before + 1, "one ANALYZE by the relay, not two");
    assert!(changed < 1_000, "{changed} rows changed since");
    // With fresh statistics the claim reads the backlog's pending rows by tenant, not
    // all of them by another index, and looks up each candidate's order by its index
    // (statistics that called the shard empty made Citus's workers read every row of
    // the tenant for each candidate).
    let claim = if on_citus() {
        orderd::outbox::store::CLAIM_TENANTS_DISTRIBUTED
    } else {
        orderd::outbox::store::CLAIM_TENANTS
    };
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {claim}")))
        .bind(vec![BACKLOG])
        .bind(chrono::Utc::now())
        .bind(vec![100i64])
        .bind(16_000i64)
        .bind(Uuid::new_v4())
        .bind(orderd::outbox::store::PARK_WINDOW)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("outbox_event_pending_by_tenant"), "{plan}");
    assert!(!plan.contains("Bitmap"), "{plan}");
    assert!(!plan.contains("outbox_event_pending_age"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");

    // A few more changes, far below the threshold: the check leaves the table alone.
    sqlx::query("UPDATE outbox_event SET attempts = 1 WHERE event_id IN (SELECT event_id FROM outbox_event LIMIT 500)")
        .execute(&db.pool)
        .await
        .unwrap();
    let direct = db.direct_sized(1);
    assert!(
        !orderd::outbox::statistics::analyze_if_stale(&direct)
            .await
            .unwrap()
    );
    assert_eq!(analysed(&db).await.0, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_orderd_outbox_analyze_off_the_relay_leaves_the_statistics_alone() {
    let db = stale().await;
    let (before, _) = analysed(&db).await;
    let (stop, running) = relay(&db, &[("ORDERD_OUTBOX_ANALYZE", "off")]).await;
    // The relay is at work (nothing is due, so it polls); the statistics job, off,
    // would have looked at once.
    tokio::time::sleep(2 * orderd::outbox::statistics::CHECK_EVERY).await;
    stop.cancel();
    running.await.unwrap();
    assert_eq!(analysed(&db).await.0, before);
}
