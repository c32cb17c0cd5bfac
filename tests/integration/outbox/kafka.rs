//! Kafka as the bus (docs/contract.md §6), against tansu, a Kafka-compatible broker,
//! through the real librdkafka producer: the record's key is the order id, its value
//! the stored event JSON, its headers the event's identity; each order's events stay
//! in order across relays and partitions; a broker outage costs no event an attempt
//! and loses none; a record too large for the producer goes DEAD alone.

use std::{collections::HashMap, sync::Arc, time::Duration};

use orderd::outbox::publisher::Publisher;
use serde_json::Value;
use uuid::Uuid;

use crate::support::{
    TestApp, TestDb, failures,
    kafka::{Broker, Record, consume, create_topic, publisher, shared_brokers, unique_topic},
    new_key, order_body, settings, spawn_app_on, spawn_app_publishing_through, until_failures,
};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Each order's event types in the order its records were read (one partition per
/// key, so read order is offset order).
fn by_key(records: &[Record]) -> HashMap<String, Vec<String>> {
    let mut orders: HashMap<String, Vec<String>> = HashMap::new();
    for r in records {
        orders
            .entry(r.key.clone())
            .or_default()
            .push(r.value["event_type"].as_str().unwrap().to_string());
    }
    orders
}

async fn create_and_cancel(app: &TestApp, token: &str) -> String {
    let created = app
        .create(token, &new_key(), &order_body("KAFKA-1", 2))
        .await;
    assert_eq!(created.status, 201);
    let id = created.json()["id"].as_str().unwrap().to_string();
    assert_eq!(app.cancel(token, &new_key(), &id).await.status, 200);
    id
}

/// Waits until `done` holds (or a generous deadline passes, which fails the test).
async fn until(done: impl Fn() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the condition did not come true");
}

/// Runs a relay with `publisher` over `db` until `stop` is cancelled.
async fn start_relay(
    db: &TestDb,
    publisher: Arc<dyn orderd::outbox::publisher::Publisher>,
    overrides: &[(&str, &str)],
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let config = settings(db, overrides);
    let direct = db.direct_sized(3);
    let relay = orderd::outbox::relay::Relay::new(
        direct,
        db.session_options(),
        publisher,
        config.outbox.clone(),
    );
    tokio::spawn(relay.run(stop))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_reaches_kafka_keyed_by_its_id_with_the_stored_event_and_its_headers() {
    let brokers = shared_brokers();
    let topic = unique_topic();
    create_topic(&brokers, &topic, 3).await;
    let kafka = publisher(&brokers, &topic, Duration::from_secs(5)).await;
    let app = spawn_app_publishing_through(TestDb::new().await, kafka, &[]).await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    let created = app
        .client
        .post(format!("{}/v1/orders", app.base))
        .bearer_auth(&token)
        .header("Idempotency-Key", new_key())
        .header("traceparent", PARENT)
        .json(&order_body("KAFKA-1", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let order: Value = created.json().await.unwrap();
    let id = order["id"].as_str().unwrap().to_string();
    assert_eq!(app.cancel(&token, &new_key(), &id).await.status, 200);

    let records = consume(&brokers, &topic, 2).await;
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0].partition, records[1].partition,
        "one partition per order"
    );
    assert!(records[0].offset < records[1].offset);
    // The value is the event exactly as the outbox stored it.
    let stored: Vec<(Uuid, Value, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT event_id, payload, occurred_at FROM outbox_event ORDER BY aggregate_seq",
    )
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    for (record, (event_id, payload, occurred_at)) in records.iter().zip(&stored) {
        assert_eq!(record.key, id);
        assert_eq!(&record.value, payload);
        assert_eq!(record.headers["event_id"], event_id.to_string());
        assert_eq!(record.headers["event_type"], record.value["event_type"]);
        assert_eq!(record.headers["tenant_id"], tenant.to_string());
        assert_eq!(record.headers["schema_version"], "1");
        // The same event as a CloudEvent (binary content mode of the Kafka binding).
        assert_eq!(record.headers["ce_specversion"], "1.0");
        assert_eq!(record.headers["ce_id"], event_id.to_string());
        assert_eq!(
            record.headers["ce_source"],
            format!("/orderd/tenants/{tenant}")
        );
        assert_eq!(record.headers["ce_type"], record.value["event_type"]);
        assert_eq!(record.headers["ce_subject"], id);
        assert_eq!(record.headers["content-type"], "application/json");
        let time: chrono::DateTime<chrono::Utc> = record.headers["ce_time"].parse().unwrap();
        assert_eq!(&time, occurred_at);
    }
    assert_eq!(records[0].value["event_type"], "OrderCreated");
    assert_eq!(records[0].value["order"], order);
    assert_eq!(records[1].value["event_type"], "OrderCancelled");
    // The create came with a trace, the cancel without one (and tracing is off here).
    assert_eq!(
        records[0].headers.get("traceparent").map(String::as_str),
        Some(PARENT)
    );
    assert!(!records[1].headers.contains_key("traceparent"));
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_keep_every_orders_events_in_commit_order_on_a_three_partition_topic() {
    let brokers = shared_brokers();
    let topic = unique_topic();
    create_topic(&brokers, &topic, 3).await;
    let db = TestDb::new().await;
    // 300 orders with three events each, committed up front.
    sqlx::raw_sql(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         SELECT t, gen_random_uuid(), o, s, 'OrderCreated',
                jsonb_build_object('seq', s, 'event_type', 'OrderCreated', 'schema_version', 1),
                now(), now()
         FROM (SELECT gen_random_uuid() AS o, gen_random_uuid() AS t FROM generate_series(1, 300)) orders,
              generate_series(1, 3) s",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut relays = Vec::new();
    for _ in 0..2 {
        let kafka = publisher(&brokers, &topic, Duration::from_secs(5)).await;
        relays.push(
            start_relay(
                &db,
                kafka,
                &[("ORDERD_OUTBOX_BATCH_SIZE", "40")],
                stop.clone(),
            )
            .await,
        );
    }
    db.until_count(
        "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
        900,
    )
    .await;
    stop.cancel();
    for relay in relays {
        relay.await.unwrap();
    }

    let records = consume(&brokers, &topic, 900).await;
    assert_eq!(records.len(), 900, "every event once");
    let partitions: std::collections::HashSet<i32> = records.iter().map(|r| r.partition).collect();
    assert_eq!(partitions.len(), 3, "the keys spread over the partitions");
    let mut seqs: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut partition_of: HashMap<&str, i32> = HashMap::new();
    for r in &records {
        seqs.entry(&r.key)
            .or_default()
            .push(r.value["seq"].as_i64().unwrap());
        assert_eq!(
            *partition_of.entry(&r.key).or_insert(r.partition),
            r.partition
        );
    }
    assert_eq!(seqs.len(), 300);
    assert!(
        seqs.values().all(|s| s == &[1, 2, 3]),
        "per-order order broken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_broker_down_writes_succeed_no_event_is_charged_and_all_flow_when_it_returns() {
    let mut broker = Broker::start();
    let brokers = broker.brokers();
    let topic = unique_topic();
    create_topic(&brokers, &topic, 3).await;
    let kafka = publisher(&brokers, &topic, Duration::from_millis(1500)).await;
    let app = spawn_app_publishing_through(
        TestDb::new().await,
        kafka.clone(),
        &[
            ("ORDERD_OUTBOX_BACKOFF_INITIAL_MS", "100"),
            ("ORDERD_OUTBOX_BACKOFF_MAX_MS", "500"),
            // A single refusal would make an event DEAD: an outage must not count.
            ("ORDERD_OUTBOX_MAX_ATTEMPTS", "1"),
        ],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    let first = create_and_cancel(&app, &token).await;
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            2,
        )
        .await;

    broker.kill();
    let down = ["timeout", "network", "not_found", "producer_fatal"];
    let before = failures(&down);
    let mut ids = vec![first];
    for _ in 0..10 {
        ids.push(create_and_cancel(&app, &token).await);
    }
    // Several rounds of failed deliveries, seen in the metric...
    until_failures(&down, before, 20.0).await;
    // ...and none of it charged to an event: all wait, none is DEAD.
    assert_eq!(app.db.pending_charged_dead().await, (20, 0, 0));
    // The relay's watch noticed: not ready while the broker does not answer.
    until(|| kafka.not_ready().is_some()).await;

    // The broker returns with its memory gone: no topic, no producer ids. The operator
    // creates the topic again; everything flows, in order, nothing charged.
    broker.restart();
    create_topic(&brokers, &topic, 3).await;
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED' AND attempts = 0",
            22,
        )
        .await;
    until(|| kafka.not_ready().is_none()).await;
    let records = consume(&brokers, &topic, 20).await;
    let orders = by_key(&records);
    for id in &ids[1..] {
        // At least once: a delivery the broker took just before it died may repeat.
        let mut events = orders[id].clone();
        events.dedup();
        assert_eq!(events, ["OrderCreated", "OrderCancelled"], "order {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_the_size_limit_goes_dead_alone_while_its_batch_mates_are_published() {
    let brokers = shared_brokers();
    let topic = unique_topic();
    create_topic(&brokers, &topic, 1).await;
    // The relay is off while the rows are written, so they are claimed as one batch.
    let app = spawn_app_on(TestDb::new().await, &[]).await;
    let tenant = Uuid::new_v4();
    let huge: Uuid = sqlx::query_scalar(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         VALUES ($1, gen_random_uuid(), gen_random_uuid(), 1, 'OrderCreated',
                 jsonb_build_object('event_type', 'OrderCreated', 'pad', repeat('x', 1100000)), now(), now())
         RETURNING event_id",
    )
    .bind(tenant)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    let token = app.token(tenant);
    for _ in 0..3 {
        create_and_cancel(&app, &token).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let kafka = publisher(&brokers, &topic, Duration::from_secs(5)).await;
    let relay = start_relay(&app.db, kafka, &[], stop.clone()).await;
    app.db.until_published_and_dead(6, 1).await;
    stop.cancel();
    relay.await.unwrap();
    let (dead, error): (Uuid, String) =
        sqlx::query_as("SELECT event_id, last_error FROM outbox_event WHERE status = 'DEAD'")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(dead, huge);
    assert!(error.starts_with("too_large"), "{error}");
    let records = consume(&brokers, &topic, 6).await;
    assert_eq!(records.len(), 6);
    assert!(records.iter().all(|r| r.event_id() != huge.to_string()));
}

/// `GET /readyz` on a relay process's metrics address: status and body.
async fn readyz(base: &str) -> (u16, String) {
    match reqwest::get(format!("{base}/readyz")).await {
        Ok(response) => (response.status().as_u16(), response.text().await.unwrap()),
        Err(e) => (0, e.to_string()),
    }
}

async fn until_ready_is(base: &str, want: u16) -> String {
    let mut last = (0, String::new());
    for _ in 0..600 {
        last = readyz(base).await;
        if last.0 == want {
            return last.1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/readyz stayed {last:?}, wanted {want}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_process_is_ready_while_its_broker_answers_and_will_not_start_without_its_topic() {
    let mut broker = Broker::start();
    let brokers = broker.brokers();
    let db = TestDb::new().await;
    let relay = |topic: &str, extra: &[(&str, &str)]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"));
        command
            .arg("relay")
            .env("DATABASE_URL", &db.url)
            .env("ORDERD_KAFKA_BROKERS", &brokers)
            .env("ORDERD_KAFKA_TOPIC", topic)
            .envs(extra.iter().copied());
        command
    };

    // Each refuses to start, says why in one line, and never prints a secret.
    let refused = |extra: &[(&str, &str)]| {
        let out = relay("absent-topic", extra).output().unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refused(&[]);
    assert!(
        stderr.contains("ORDERD_KAFKA_TOPIC") && stderr.contains("absent-topic"),
        "{stderr}"
    );
    let stderr = refused(&[("ORDERD_SNS_TOPIC_ARN", "arn:aws:sns:us-east-1:1:x")]);
    assert!(stderr.contains("exactly one sink"), "{stderr}");
    let stderr = refused(&[("ORDERD_KAFKA_CONFIG", "acks=0,sasl.password=hunter2")]);
    assert!(
        stderr.contains("ORDERD_KAFKA_CONFIG may not set `acks`"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    // librdkafka's side doors (a `topic.` prefix, the partitioner) are refused as well,
    // at start, naming the variable and the property: only known-safe properties pass.
    for (property, named) in [
        (
            "topic.message.timeout.ms=600000",
            "topic.message.timeout.ms",
        ),
        ("topic.acks=1", "topic.acks"),
        ("partitioner=random", "partitioner"),
        (
            "queue.buffering.backpressure.threshold=1",
            "queue.buffering.backpressure.threshold",
        ),
        // A size limit every record could fail locally would turn the backlog DEAD.
        ("message.max.bytes=1000", "message.max.bytes"),
        // Switches that turn TLS verification off, whatever else is accepted.
        (
            "security.protocol=ssl,enable.ssl.certificate.verification=false",
            "enable.ssl.certificate.verification",
        ),
        (
            "ssl.endpoint.identification.algorithm=none",
            "ssl.endpoint.identification.algorithm",
        ),
    ] {
        let stderr = refused(&[("ORDERD_KAFKA_CONFIG", property)]);
        assert!(
            stderr.contains(&format!("ORDERD_KAFKA_CONFIG may not set `{named}`")),
            "{property}: {stderr}"
        );
    }

    let topic = unique_topic();
    create_topic(&brokers, &topic, 1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bind = format!("127.0.0.1:{port}");
    let _relay = crate::support::KillOnDrop(
        relay(&topic, &[("ORDERD_METRICS_BIND", &bind)])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://{bind}");
    assert_eq!(until_ready_is(&base, 200).await, "ready");
    broker.kill();
    let why = until_ready_is(&base, 503).await;
    assert!(why.contains("Kafka broker"), "{why}");
    // Back, but without its topic (memory storage): still not ready, and says why.
    broker.restart();
    let why = until_ready_is(&base, 503).await;
    assert!(why.contains("Kafka"), "{why}");
    create_topic(&brokers, &topic, 1).await;
    assert_eq!(until_ready_is(&base, 200).await, "ready");
}
