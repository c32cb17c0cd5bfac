//! docs/contract.md §6: every committed change reaches SNS (moto, through the real
//! aws-sdk-sns client), in commit order per order, at least once, whatever SNS, the
//! relay or the network do meanwhile. Messages are read back from an SQS queue
//! subscribed to the topic.

use std::{collections::HashMap, future::Future, pin::Pin, time::Duration};

use orderd::outbox::publisher::{Message, Outcome, Outcomes, Publisher};

use serde_json::Value;
use uuid::Uuid;

use crate::{
    support::proxy::{Mode, Proxy},
    support::sns::{Received, Topic, aws_env, moto_address, moto_endpoint, publisher},
    support::{
        SECRET, TestApp, TestDb, create_order_in, failures, new_key, order_body, settings,
        spawn_publishing_app, until_failures,
    },
};

async fn status_counts(db: &TestDb) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>("SELECT status, count(*) FROM outbox_event GROUP BY status")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Each order's event types in arrival order.
fn by_order(messages: &[Received]) -> HashMap<String, Vec<String>> {
    let mut orders: HashMap<String, Vec<String>> = HashMap::new();
    for m in messages {
        orders
            .entry(m.body["order"]["id"].as_str().unwrap().to_string())
            .or_default()
            .push(m.body["event_type"].as_str().unwrap().to_string());
    }
    orders
}

async fn create_and_cancel(app: &TestApp, token: &str) -> (Value, Value) {
    let created = app.create(token, &new_key(), &order_body("PUB-1", 2)).await;
    assert_eq!(created.status, 201);
    let id = created.json()["id"].as_str().unwrap().to_string();
    let cancelled = app.cancel(token, &new_key(), &id).await;
    assert_eq!(cancelled.status, 200);
    (created.json(), cancelled.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_then_cancelled_order_reaches_sns_as_two_events_in_order() {
    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(&moto_endpoint(), &topic.arn, &[]).await;
    let tenant = Uuid::new_v4();
    let (created, cancelled) = create_and_cancel(&app, &app.token(tenant)).await;

    let messages = topic.collect(2).await;
    assert_eq!(messages.len(), 2);
    let (first, second) = (&messages[0], &messages[1]);
    assert_eq!(first.body["event_type"], "OrderCreated");
    assert_eq!(second.body["event_type"], "OrderCancelled");
    assert_eq!(first.body["order"], created);
    assert_eq!(second.body["order"], cancelled);
    for (message, order) in [(first, &created), (second, &cancelled)] {
        assert_eq!(message.body["tenant_id"], tenant.to_string());
        assert_eq!(message.body["occurred_at"], order["updated_at"]);
        assert_eq!(
            message.attribute("event_id"),
            message.body["event_id"].as_str()
        );
        assert_eq!(
            message.attribute("event_type"),
            message.body["event_type"].as_str()
        );
        assert_eq!(
            message.attribute("tenant_id"),
            Some(tenant.to_string().as_str())
        );
        assert_eq!(message.attribute("aggregate_id"), order["id"].as_str());
        let keys: Vec<&String> = message.body.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "event_id",
                "event_type",
                "occurred_at",
                "order",
                "schema_version",
                "tenant_id"
            ]
        );
    }
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_fifo_topic_messages_carry_group_and_deduplication_ids() {
    let topic = Topic::create(true).await;
    let app = spawn_publishing_app(&moto_endpoint(), &topic.arn, &[]).await;
    let (created, _) = create_and_cancel(&app, &app.token(Uuid::new_v4())).await;

    let messages = topic.collect(2).await;
    assert_eq!(messages.len(), 2);
    assert_eq!(
        by_order(&messages)[created["id"].as_str().unwrap()],
        ["OrderCreated", "OrderCancelled"]
    );
    for m in &messages {
        assert_eq!(
            m.system["MessageGroupId"].as_str(),
            created["id"].as_str(),
            "{:?}",
            m.system
        );
        assert_eq!(
            m.system["MessageDeduplicationId"].as_str(),
            Some(m.event_id().as_str()),
            "{:?}",
            m.system
        );
    }
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_write_leaves_no_event_and_a_committed_one_always_has_one() {
    let db = TestDb::new().await;
    let tenant = orderd::tenant::TenantId(Uuid::new_v4());
    let new = orderd::orders::NewOrder::parse(
        serde_json::json!({"sku": "ATOM-1", "quantity": 1})
            .as_object()
            .unwrap(),
    )
    .unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    create_order_in(&mut tx, tenant, &new).await;
    tx.rollback().await.unwrap();
    let counts: (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_event)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(counts, (0, 0));

    for _ in 0..10 {
        let mut tx = db.pool.begin().await.unwrap();
        let order = create_order_in(&mut tx, tenant, &new).await;
        orderd::orders::store::cancel(
            &mut orderd::db::Sql::direct(&mut tx),
            tenant,
            order.id,
            None,
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let unmatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o
         WHERE (SELECT count(*) FROM outbox_event e WHERE e.tenant_id = o.tenant_id AND e.aggregate_id = o.id) <> o.version",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(unmatched, 0, "every committed change has exactly one event");
}

/// A round that read its time before another round's mark committed, and claims after
/// it, must not take the order's next event: it would mark it with an earlier
/// `published_at` than the event before it. The mark moves the next event to its own
/// round's time, so only a round that began at or after it can claim it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_began_before_a_mark_does_not_take_the_order_s_next_event() {
    use orderd::outbox::store;
    let db = TestDb::new().await;
    let tenant = orderd::tenant::TenantId(Uuid::new_v4());
    let new = orderd::orders::NewOrder::parse(
        serde_json::json!({"sku": "ROUND-1", "quantity": 1})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    // An order with two events, both due.
    let mut tx = db.pool.begin().await.unwrap();
    let order = create_order_in(&mut tx, tenant, &new).await;
    orderd::orders::store::cancel(
        &mut orderd::db::Sql::direct(&mut tx),
        tenant,
        order.id,
        None,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let relay = db.direct();
    let lease_ms = 60_000;
    // Round B reads its time; round A begins after it, claims the first event and
    // marks it published.
    let b_began = relay
        .run(async |c| store::round_time(c).await)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let a_began = relay
        .run(async |c| store::round_time(c).await)
        .await
        .unwrap();
    let a = Uuid::new_v4();
    let first = relay
        .run(async |c| store::claim_tenant(c, tenant.0, a_began, 10, lease_ms, a).await)
        .await
        .unwrap();
    assert_eq!(first.events.len(), 1, "the order's first event alone");
    let ids: Vec<Uuid> = first.events.iter().map(|e| e.event_id).collect();
    relay
        .run(async |c| {
            let events: Vec<(Uuid, Uuid)> = ids.iter().map(|id| (tenant.0, *id)).collect();
            store::mark_published(c, &events, a, a_began).await
        })
        .await
        .unwrap();
    // Round B claims now, by its earlier time: nothing of the order.
    let b = relay
        .run(async |c| {
            store::claim_tenant(c, tenant.0, b_began, 10, lease_ms, Uuid::new_v4()).await
        })
        .await
        .unwrap();
    assert!(
        b.events.is_empty(),
        "a round older than the mark took {:?}",
        b.events
    );
    // A round that began with the mark, or after it, does.
    let next = relay
        .run(async |c| {
            store::claim_tenant(c, tenant.0, a_began, 10, lease_ms, Uuid::new_v4()).await
        })
        .await
        .unwrap();
    assert_eq!(next.events.len(), 1);
    assert_eq!(next.events[0].event_type, "OrderCancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sns_down_writes_succeed_no_event_is_charged_and_the_backlog_drains_in_order_when_it_returns()
 {
    let topic = Topic::create(false).await;
    let proxy = Proxy::start(moto_address()).await;
    let app = spawn_publishing_app(
        &proxy.endpoint(),
        &topic.arn,
        &[
            ("ORDERD_OUTBOX_BACKOFF_INITIAL_MS", "100"),
            ("ORDERD_OUTBOX_BACKOFF_MAX_MS", "400"),
            // A single refusal would make an event DEAD: an outage must not count.
            ("ORDERD_OUTBOX_MAX_ATTEMPTS", "1"),
        ],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    proxy.set(Mode::Refuse);
    let down = ["network", "timeout", "server"];
    let before = failures(&down);

    let started = std::time::Instant::now();
    let mut ids = Vec::new();
    for _ in 0..10 {
        let (created, _) = create_and_cancel(&app, &token).await;
        ids.push(created["id"].as_str().unwrap().to_string());
    }
    println!("20 writes with SNS down took {:?}", started.elapsed());
    // Several rounds of failed calls, seen in the metric...
    until_failures(&down, before, 30.0).await;
    // ...and none of it charged to an event: all wait, none is DEAD, per-order order kept.
    assert_eq!(app.db.pending_charged_dead().await, (20, 0, 0));
    assert!(
        topic.drain().await.is_empty(),
        "nothing got through while SNS was down"
    );

    proxy.set(Mode::Forward);
    let messages = topic.collect(20).await;
    assert_eq!(messages.len(), 20);
    let orders = by_order(&messages);
    for id in &ids {
        assert_eq!(orders[id], ["OrderCreated", "OrderCancelled"], "order {id}");
    }
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            20,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_holds_the_backlog_uncharged_until_the_topic_exists_then_it_flows() {
    let name = crate::support::sns::unique_name(false);
    let proxy = Proxy::start(moto_address()).await;
    let app = spawn_publishing_app(
        &proxy.endpoint(),
        &crate::support::sns::arn_of(&name),
        &[
            ("ORDERD_OUTBOX_BACKOFF_INITIAL_MS", "100"),
            ("ORDERD_OUTBOX_BACKOFF_MAX_MS", "300"),
            ("ORDERD_OUTBOX_MAX_ATTEMPTS", "1"),
        ],
    )
    .await;
    let before = failures(&["not_found"]);
    let token = app.token(Uuid::new_v4());
    for _ in 0..25 {
        create_and_cancel(&app, &token).await;
    }
    until_failures(&["not_found"], before, 25.0).await;
    let (charged, dead): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE attempts > 0), count(*) FILTER (WHERE status = 'DEAD') FROM outbox_event",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (charged, dead),
        (0, 0),
        "a misconfiguration never turns the backlog DEAD"
    );

    // The operator creates the topic: everything flows by itself, in order, no re-drive.
    // The relay is kept from SNS meanwhile: an event published between the topic's
    // creation and the test queue's subscription would be acknowledged, yet never
    // reach the queue this test reads.
    proxy.set(Mode::Refuse);
    let topic = Topic::create_named(&moto_endpoint(), &name, false).await;
    proxy.set(Mode::Forward);
    let messages = topic.collect(50).await;
    assert_eq!(messages.len(), 50);
    for events in by_order(&messages).values() {
        assert_eq!(events, &["OrderCreated", "OrderCancelled"]);
    }
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            50,
        )
        .await;
}

/// The real SNS publisher, except that while `refusing` it answers every entry with an
/// entry-level transient refusal, as SNS does for one entry of a batch it could not take
/// (`InternalError` in `Failed`); moto never answers that way by itself.
struct RefusingEntries {
    inner: std::sync::Arc<dyn Publisher>,
    refusing: std::sync::atomic::AtomicBool,
}

impl Publisher for RefusingEntries {
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move {
            if self.refusing.load(std::sync::atomic::Ordering::SeqCst) {
                let refusal = orderd::outbox::publisher::PublishError {
                    retry: orderd::outbox::publisher::Retry::Transient,
                    reason: orderd::outbox::FailureReason::Server,
                    detail: "InternalError: entry refused".into(),
                };
                return vec![Outcome::Rejected(refusal); messages.len()];
            }
            self.inner.publish(messages).await
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_entries_go_dead_after_the_attempt_limit_and_redrive_all_publishes_them() {
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    let config = settings(
        &db,
        &[
            ("ORDERD_OUTBOX_MAX_ATTEMPTS", "3"),
            ("ORDERD_OUTBOX_BACKOFF_INITIAL_MS", "50"),
            ("ORDERD_OUTBOX_BACKOFF_MAX_MS", "100"),
        ],
    );
    let refusing = std::sync::Arc::new(RefusingEntries {
        inner: publisher(&moto_endpoint(), &topic.arn, &config).await,
        refusing: true.into(),
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let direct = db.direct_sized(4);
    let relay = orderd::outbox::relay::Relay::new(
        direct,
        db.session_options(),
        refusing.clone(),
        config.outbox.clone(),
    );
    let relay = tokio::spawn(relay.run(stop.clone()));
    let app = crate::support::spawn_app_on(db, &[]).await;
    let token = app.token(Uuid::new_v4());
    for _ in 0..2 {
        app.create(&token, &new_key(), &order_body("DEAD-1", 1))
            .await;
    }
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DEAD' AND attempts = 3",
            2,
        )
        .await;
    let stats = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(["outbox", "stats"])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&stats.stdout).to_string();
    assert!(
        stats.contains("pending 0") && stats.contains("dead 2"),
        "{stats}"
    );

    refusing
        .refusing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    // New writes flow although older events are dead.
    app.create(&token, &new_key(), &order_body("DEAD-2", 1))
        .await;
    assert_eq!(topic.collect(1).await.len(), 1);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(["outbox", "redrive", "--all-dead"])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "re-drove 2 dead events"
    );
    assert_eq!(topic.collect(2).await.len(), 2);
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            3,
        )
        .await;
    stop.cancel();
    relay.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_between_publishing_and_marking_redelivers_with_the_same_event_id() {
    let topic = Topic::create(false).await;
    let proxy = Proxy::start(moto_address()).await;
    let app = crate::support::spawn_app().await;
    let (created, cancelled) = create_and_cancel(&app, &app.token(Uuid::new_v4())).await;
    proxy.set(Mode::HoldResponses);

    let relay_env = |endpoint: String| {
        let mut env = aws_env(&endpoint);
        env.extend([
            ("DATABASE_URL", app.db.url.clone()),
            ("ORDERD_SNS_TOPIC_ARN", topic.arn.clone()),
            ("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", "2000".into()),
            ("ORDERD_OUTBOX_POLL_MS", "100".into()),
            ("ORDERD_JWT_HS256_SECRET", SECRET.into()),
        ]);
        env
    };
    let mut first = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .arg("relay")
        .envs(relay_env(proxy.endpoint()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // SNS has the first event (it reached the queue) but the relay has no answer yet.
    let delivered = topic.collect(1).await;
    assert_eq!(delivered.len(), 1);
    first.kill().unwrap(); // SIGKILL: no chance to mark anything
    first.wait().unwrap();
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_event WHERE status = 'PENDING'")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(pending, 2, "the killed relay marked nothing");

    proxy.set(Mode::Forward);
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .arg("relay")
        .envs(relay_env(moto_endpoint()))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;
    second.kill().unwrap();
    second.wait().unwrap();

    let mut all = delivered;
    all.extend(topic.drain().await);
    let ids: Vec<String> = all.iter().map(Received::event_id).collect();
    assert_eq!(
        ids.len(),
        3,
        "the first event twice, the second once: {ids:?}"
    );
    assert_eq!(ids[0], ids[1], "the redelivery carries the same event_id");
    assert_eq!(all[0].body, all[1].body);
    assert_eq!(all[1].body["order"], created);
    assert_eq!(all[2].body["order"], cancelled);
}

/// Wraps the real SNS publisher and records every acknowledged message, in the order
/// the acknowledgements arrived (the relay marks a row only after this returns).
struct Observed {
    inner: std::sync::Arc<dyn Publisher>,
    acknowledged: std::sync::Mutex<Vec<(Uuid, Uuid, i64)>>,
}

impl Publisher for Observed {
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move {
            let outcomes = self.inner.publish(messages).await;
            let mut log = self.acknowledged.lock().unwrap();
            for (message, outcome) in messages.iter().zip(&outcomes) {
                if *outcome == Outcome::Published {
                    let seq = serde_json::from_str::<Value>(&message.body).unwrap()["seq"]
                        .as_i64()
                        .unwrap();
                    log.push((message.event_id, message.aggregate_id, seq));
                }
            }
            outcomes
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_deliver_thousands_of_events_once_each_in_per_order_commit_order() {
    // moto delivers to SQS at only ~100 messages/s, so this volume goes to a topic of
    // its own with no queue; what SNS acknowledged is observed at the publisher.
    let moto = crate::support::sns::start_moto();
    let arn = crate::support::sns::bare_topic(&moto, "bulk").await;
    let db = TestDb::new().await;
    // 1,000 orders with three events each, committed up front.
    sqlx::raw_sql(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT t, gen_random_uuid(), o, s, 'OrderCreated',
                jsonb_build_object('seq', s, 'order', jsonb_build_object('id', o::text), 'event_type', 'OrderCreated'),
                now(), now()
         FROM (SELECT gen_random_uuid() AS o, gen_random_uuid() AS t FROM generate_series(1, 1000)) orders,
              generate_series(1, 3) s",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let config = settings(&db, &[("ORDERD_OUTBOX_BATCH_SIZE", "50")]);
    let observed = std::sync::Arc::new(Observed {
        inner: publisher(&moto, &arn, &config).await,
        acknowledged: Default::default(),
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let mut relays = Vec::new();
    for _ in 0..3 {
        let direct = db.direct_sized(4);
        let relay = orderd::outbox::relay::Relay::new(
            direct,
            db.session_options(),
            observed.clone(),
            config.outbox.clone(),
        );
        relays.push(tokio::spawn(relay.run(stop.clone())));
    }
    db.until_count(
        "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
        3000,
    )
    .await;
    stop.cancel();
    for relay in relays {
        relay.await.unwrap();
    }

    // In the database: each order's events were marked in sequence.
    let out_of_order: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_event a JOIN outbox_event b
           ON a.tenant_id = b.tenant_id AND a.aggregate_id = b.aggregate_id
          AND a.aggregate_seq < b.aggregate_seq
         WHERE a.published_at > b.published_at",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(out_of_order, 0);
    // At SNS: every event acknowledged once, each order's in sequence.
    let acknowledged = observed.acknowledged.lock().unwrap().clone();
    assert_eq!(acknowledged.len(), 3000);
    let unique: std::collections::HashSet<Uuid> = acknowledged.iter().map(|a| a.0).collect();
    assert_eq!(unique.len(), 3000, "no event published twice");
    let mut seqs: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for (_, order, seq) in acknowledged {
        seqs.entry(order).or_default().push(seq);
    }
    assert_eq!(seqs.len(), 1000);
    assert!(
        seqs.values().all(|s| s == &[1, 2, 3]),
        "per-order order broken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanently_failing_event_goes_dead_at_once_while_other_orders_flow_and_redrive_publishes_it()
 {
    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(&moto_endpoint(), &topic.arn, &[]).await;
    let tenant = Uuid::new_v4();
    let stuck = Uuid::new_v4();
    // An event SNS refuses (over 256 KiB), followed by a second event of the same order.
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         VALUES ($1, gen_random_uuid(), $2, 1, 'OrderCreated', jsonb_build_object('order', jsonb_build_object('id', $2::text), 'event_type', 'OrderCreated', 'pad', repeat('x', 300000)), now(), now()),
                ($1, gen_random_uuid(), $2, 2, 'OrderCancelled', jsonb_build_object('order', jsonb_build_object('id', $2::text), 'event_type', 'OrderCancelled'), now(), now())",
    )
    .bind(tenant)
    .bind(stuck)
    .execute(&app.db.pool)
    .await
    .unwrap();
    let token = app.token(tenant);
    for _ in 0..3 {
        create_and_cancel(&app, &token).await;
    }
    app.db.until_published_and_dead(6, 1).await;
    let error: String =
        sqlx::query_scalar("SELECT last_error FROM outbox_event WHERE status = 'DEAD'")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert!(error.starts_with("invalid_parameter"), "{error}");
    let blocked: String = sqlx::query_scalar(
        "SELECT status FROM outbox_event WHERE aggregate_id = $1 AND aggregate_seq = 2",
    )
    .bind(stuck)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(
        blocked, "PENDING",
        "the order's next event waits behind its dead one"
    );
    assert_eq!(topic.collect(6).await.len(), 6);

    // An operator repairs the event and re-drives it: it goes, then its successor.
    let dead_id: Uuid = sqlx::query_scalar("UPDATE outbox_event SET payload = payload - 'pad' WHERE status = 'DEAD' RETURNING event_id")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(["outbox", "redrive", "--id", &dead_id.to_string()])
        .env("DATABASE_URL", &app.db.url)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "re-drove 1 dead events"
    );
    let messages = topic.collect(2).await;
    assert_eq!(
        by_order(&messages)[&stuck.to_string()],
        ["OrderCreated", "OrderCancelled"]
    );
    // The bus acknowledges a publish before the relay marks it: the mark follows.
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            8,
        )
        .await;
    assert_eq!(status_counts(&app.db).await.get("PUBLISHED"), Some(&8));
}

/// A park reads the events before its row in its statement's snapshot: one that began
/// before a re-drive committed parks the order's next event behind an event it still
/// sees DEAD, after the mark that published the re-driven event looked for a row to wake.
/// The row must come back by itself: the race's outcome, set up directly, is an order
/// whose first event is published and whose next one is parked behind nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_parked_behind_a_dead_one_comes_back_when_a_wake_up_missed_it() {
    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(
        &moto_endpoint(),
        &topic.arn,
        &[("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", "400")],
    )
    .await;
    let (tenant, order) = (Uuid::new_v4(), Uuid::new_v4());
    sqlx::query(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at, status, attempts)
         VALUES ($1, gen_random_uuid(), $2, 1, 'OrderCreated', jsonb_build_object('order', jsonb_build_object('id', $2::text), 'event_type', 'OrderCreated'), now(), now(), 'DEAD', 1),
                ($1, gen_random_uuid(), $2, 2, 'OrderCancelled', jsonb_build_object('order', jsonb_build_object('id', $2::text), 'event_type', 'OrderCancelled'), now(), now(), 'PENDING', 0)",
    )
    .bind(tenant)
    .bind(order)
    .execute(&app.db.pool)
    .await
    .unwrap();
    let parked = format!(
        "SELECT count(*) FROM outbox_event WHERE tenant_id = '{tenant}' AND aggregate_seq = 2
           AND status = 'PENDING' AND next_attempt_at > now()"
    );
    app.db.until_count(&parked, 1).await;
    // The re-drive's publish and mark, as the race leaves them: no wake-up reached the
    // parked row.
    sqlx::query(
        "UPDATE outbox_event SET status = 'PUBLISHED', published_at = now()
         WHERE tenant_id = $1 AND aggregate_id = $2 AND aggregate_seq = 1",
    )
    .bind(tenant)
    .bind(order)
    .execute(&app.db.pool)
    .await
    .unwrap();
    app.db
        .until_count(
            &format!(
                "SELECT count(*) FROM outbox_event WHERE tenant_id = '{tenant}' AND status = 'PUBLISHED'"
            ),
            2,
        )
        .await;
    let messages = topic.collect(1).await;
    assert_eq!(by_order(&messages)[&order.to_string()], ["OrderCancelled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_commits_late_is_not_skipped() {
    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(&moto_endpoint(), &topic.arn, &[]).await;
    let tenant = Uuid::new_v4();
    let mut late = app.db.pool.begin().await.unwrap();
    let new = orderd::orders::NewOrder::parse(
        serde_json::json!({"sku": "LATE-1", "quantity": 1})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    let late_order = create_order_in(&mut late, orderd::tenant::TenantId(tenant), &new).await;

    // A newer write commits and is published first.
    let newer = app
        .create(&app.token(tenant), &new_key(), &order_body("NEW-1", 1))
        .await
        .json();
    let first = topic.collect(1).await;
    assert_eq!(first[0].body["order"]["id"], newer["id"]);
    late.commit().await.unwrap();

    let second = topic.collect(1).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].body["order"]["id"], late_order.id.to_string());
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_listener_falls_back_to_polling_and_it_reconnects() {
    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(
        &moto_endpoint(),
        &topic.arn,
        &[("ORDERD_OUTBOX_POLL_MS", "300")],
    )
    .await;
    let listening = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE 'LISTEN%outbox_event%'",
        app.db.name
    );
    app.db.until_count(&listening, 1).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE 'LISTEN%outbox_event%'",
        app.db.name
    )))
    .execute(&app.db.pool)
    .await
    .unwrap();
    let token = app.token(Uuid::new_v4());
    app.create(&token, &new_key(), &order_body("LSN-1", 1))
        .await;
    assert_eq!(
        topic.collect(1).await.len(),
        1,
        "published without the listener"
    );
    app.db.until_count(&listening, 1).await;
    app.create(&token, &new_key(), &order_body("LSN-2", 1))
        .await;
    assert_eq!(topic.collect(1).await.len(), 1);
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_row_retention_deletes_in_batches_and_never_touches_pending_or_dead_rows() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at,
                                   next_attempt_at, status, published_at)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{}', now() - interval '3 days',
                now(), st, CASE WHEN st = 'PUBLISHED' THEN now() - age END
         FROM (VALUES ('PUBLISHED', interval '2 days', 25), ('PUBLISHED', interval '1 minute', 5),
                      ('PENDING', interval '2 days', 3), ('DEAD', interval '2 days', 2)) AS v(st, age, n),
              LATERAL generate_series(1, n)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let deleted = orderd::retention::purge_outbox_once(&db.direct(), Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert_eq!(deleted, 25);
    let counts = status_counts(&db).await;
    assert_eq!(
        (counts["PUBLISHED"], counts["PENDING"], counts["DEAD"]),
        (5, 3, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_without_a_topic_refuses_to_start_the_relay() {
    let db = TestDb::new().await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_JWT_HS256_SECRET", SECRET)
        .env_remove("ORDERD_SNS_TOPIC_ARN")
        .env("ORDERD_RELAY", "on")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("ORDERD_SNS_TOPIC_ARN"),
        "{stderr}"
    );
}

/// The relay works on connections of its own: requests holding every connection of
/// the API's pool (here, cancels stalled on a row lock, and more queued behind them)
/// do not hold back the publishing of what another writer committed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_while_stalled_requests_hold_every_api_connection() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use sqlx::{Connection, Executor, PgConnection};

    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(
        &moto_endpoint(),
        &topic.arn,
        &[
            ("ORDERD_DB_POOL_SIZE", "2"),
            ("ORDERD_DB_STATEMENT_TIMEOUT_MS", "60000"),
        ],
    )
    .await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    let created = app
        .create(&token, &new_key(), &order_body("HELD-1", 1))
        .await;
    assert_eq!(created.status, 201);
    let held = created.json()["id"].as_str().unwrap().to_string();
    assert_eq!(topic.collect(1).await.len(), 1);

    let mut locker = PgConnection::connect(&app.db.url).await.unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM orders WHERE tenant_id = '{tenant}' AND id = '{held}' FOR UPDATE"
        )))
        .await
        .unwrap();
    let answered = AtomicUsize::new(0);
    let cancels = futures::future::join_all((0..4).map(|_| async {
        let reply = app.cancel(&token, &new_key(), &held).await;
        answered.fetch_add(1, Ordering::SeqCst);
        reply
    }));
    let meanwhile = async {
        // Both API connections wait on the lock; the other two cancels wait for them.
        // (On a distributed database they wait on the worker: Citus's view of every
        // node's sessions.)
        app.db.until_count(&app.db.lock_waiters(), 2).await;
        // Another writer (another orderd, say) commits an order and its event.
        let mut other = app.db.pool.begin().await.unwrap();
        let new = orderd::orders::NewOrder::parse(
            serde_json::json!({"sku": "OTHER-1", "quantity": 1})
                .as_object()
                .unwrap(),
        )
        .unwrap();
        let other_order = create_order_in(&mut other, orderd::tenant::TenantId(tenant), &new).await;
        other.commit().await.unwrap();
        let published = topic.collect(1).await;
        let still_stalled = answered.load(Ordering::SeqCst) == 0;
        locker.execute("ROLLBACK").await.unwrap();
        (published, other_order, still_stalled)
    };
    let (replies, (published, other_order, still_stalled)) = tokio::join!(cancels, meanwhile);

    assert_eq!(published.len(), 1);
    assert_eq!(published[0].body["order"]["id"], other_order.id.to_string());
    assert!(
        still_stalled,
        "published while every API connection was held"
    );
    for reply in &replies {
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["status"], "CANCELLED");
    }
    // One cancel changed the order; the others found it cancelled. Nothing was lost.
    let cancelled = topic.collect(1).await;
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].body["event_type"], "OrderCancelled");
    assert_eq!(cancelled[0].body["order"]["id"], held.as_str());
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (2, 3)
    );
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            3,
        )
        .await;
}

/// On one server the insert trigger wakes the relays with the tenants an insert wrote
/// events for, as the writers do on Citus: one notification per tenant of the
/// transaction, its rows' identical notifications folded into one (decision 170).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_insert_trigger_names_each_tenant_of_a_transaction_once() {
    if crate::support::one_server_only(
        "the trigger of one server; on Citus the writers notify (decision 147), and no table of a cluster has the trigger",
    ) {
        return;
    }
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener
        .listen(orderd::outbox::relay::CHANNEL)
        .await
        .unwrap();
    let insert = "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT t, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated', '{}', now(), now()
         FROM unnest($1::uuid[]) t";
    let (a, b, last) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    let mut tx = db.pool.begin().await.unwrap();
    for tenants in [vec![a, b, a], vec![b, a]] {
        sqlx::query(insert)
            .bind(tenants)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    // A later transaction's notification marks the end of the first one's.
    sqlx::query(insert)
        .bind(vec![last])
        .execute(&db.pool)
        .await
        .unwrap();
    let mut named = Vec::new();
    loop {
        let heard = listener.recv().await.unwrap();
        let tenants = orderd::outbox::wake::tenants_of(heard.payload());
        if tenants == [last] {
            break;
        }
        named.extend(tenants);
    }
    named.sort();
    let mut want = vec![a, b];
    want.sort();
    assert_eq!(named, want, "each tenant of the transaction named once");
}
