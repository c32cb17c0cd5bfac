//! The relay forwards each row as it was stored (docs/contract.md §6): a type this
//! release does not know, as a newer release writes it during a rolling deploy, is
//! published like any other; a row that cannot be read at all goes DEAD alone, and its
//! batch-mates are published. The rows are written by SQL, as another release or a
//! broken hand would write them.

use uuid::Uuid;

use crate::support::{
    TestApp, TestDb, new_key, order_body, settings,
    sns::{Topic, moto_endpoint, publisher},
};

/// A topic, an app with the relay off (so that rows pile up before a relay claims them
/// together), a tenant and its token.
async fn set_up() -> (Topic, TestApp, Uuid, String) {
    let topic = Topic::create(false).await;
    let app = crate::support::spawn_app_on(TestDb::new().await, &[]).await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    (topic, app, tenant, token)
}

/// Runs a relay over `app`'s database until `stop` is cancelled.
async fn start_relay(
    app: &TestApp,
    topic: &Topic,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let config = settings(&app.db, &[]);
    let publisher = publisher(&moto_endpoint(), &topic.arn, &config).await;
    let direct = app.db.direct_sized(2);
    let relay = orderd::outbox::relay::Relay::new(
        direct,
        app.db.session_options(),
        publisher,
        config.outbox.clone(),
    );
    tokio::spawn(relay.run(stop))
}

/// Inserts one event row for an order of its own, as another writer would.
async fn insert_row(app: &TestApp, tenant: Uuid, event_type: &str, payload: &str) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         VALUES ($1, gen_random_uuid(), gen_random_uuid(), 1, $2, $3::jsonb, now(), now())
         RETURNING event_id",
    )
    .bind(tenant)
    .bind(event_type)
    .bind(payload)
    .fetch_one(&app.db.pool)
    .await
    .unwrap()
}

async fn create_orders(app: &TestApp, token: &str, count: usize) {
    for i in 0..count {
        app.create(token, &new_key(), &order_body(&format!("FWD-{i}"), 1))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_type_from_a_newer_release_is_published_with_its_batch() {
    let (topic, app, tenant, token) = set_up().await;
    create_orders(&app, &token, 5).await;
    let refund = insert_row(
        &app,
        tenant,
        "OrderRefunded",
        r#"{"event_type": "OrderRefunded", "schema_version": 1, "refund": {"amount": 3}}"#,
    )
    .await;
    create_orders(&app, &token, 5).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let relay = start_relay(&app, &topic, stop.clone()).await;
    let messages = topic.collect(11).await;
    stop.cancel();
    relay.await.unwrap();

    let refunded: Vec<_> = messages
        .iter()
        .filter(|m| m.attribute("event_type") == Some("OrderRefunded"))
        .collect();
    assert_eq!(refunded.len(), 1, "the unknown type is forwarded");
    assert_eq!(
        refunded[0].attribute("event_id"),
        Some(&*refund.to_string())
    );
    assert_eq!(
        refunded[0].body["refund"]["amount"], 3,
        "its body as stored"
    );
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.attribute("event_type") == Some("OrderCreated"))
            .count(),
        10
    );
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            11,
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_cannot_be_read_goes_dead_alone_and_its_batch_mates_are_published() {
    let (topic, app, tenant, token) = set_up().await;
    create_orders(&app, &token, 3).await;
    let not_an_object = insert_row(&app, tenant, "OrderCreated", r#"["not", "an", "event"]"#).await;
    let no_type = insert_row(&app, tenant, "", r#"{"event_type": ""}"#).await;
    let forged_type = insert_row(&app, tenant, "Order\nCreated", r#"{"a": 1}"#).await;
    create_orders(&app, &token, 3).await;

    let stop = tokio_util::sync::CancellationToken::new();
    let relay = start_relay(&app, &topic, stop.clone()).await;
    let messages = topic.collect(6).await;
    app.db
        .until_count("SELECT count(*) FROM outbox_event WHERE status = 'DEAD'", 3)
        .await;
    stop.cancel();
    relay.await.unwrap();

    assert_eq!(messages.len(), 6, "every readable row of the batch went");
    for (id, why) in [
        (not_an_object, "the payload is not a JSON object"),
        (no_type, "event_type must be"),
        (forged_type, "event_type must be"),
    ] {
        let (status, error): (String, String) =
            sqlx::query_as("SELECT status, last_error FROM outbox_event WHERE event_id = $1")
                .bind(id)
                .fetch_one(&app.db.pool)
                .await
                .unwrap();
        assert_eq!(status, "DEAD");
        assert!(
            error.starts_with("unreadable: ") && error.contains(why),
            "{error}"
        );
    }
    assert_eq!(
        app.db
            .count("outbox_event WHERE status = 'PUBLISHED'")
            .await,
        6
    );
}
