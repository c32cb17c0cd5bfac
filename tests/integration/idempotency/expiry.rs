//! A key's expiry, told (docs/contract.md §4): every answer stored for replay carries
//! `Idempotency-Key-Expires`, the instant the record is forgotten, as an HTTP date; the
//! first answer and every replay carry the same one, which is the stored `expires_at`;
//! answers that are not stored carry none.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::support::{Reply, TestApp, create_fingerprint, new_key, order_body, spawn_app};

const HEADER: &str = "idempotency-key-expires";

/// The header as an instant (an HTTP date: whole seconds, GMT).
fn expires(reply: &Reply) -> DateTime<Utc> {
    let value = reply
        .header(HEADER)
        .unwrap_or_else(|| panic!("no {HEADER} on a {}", reply.status));
    DateTime::parse_from_rfc2822(&value.replace("GMT", "+0000"))
        .unwrap_or_else(|e| panic!("`{value}` is not an HTTP date: {e}"))
        .with_timezone(&Utc)
}

/// The stored `expires_at` of `key`, to the second the header can carry.
async fn stored_expiry(app: &TestApp, key: &str) -> DateTime<Utc> {
    let at: DateTime<Utc> =
        sqlx::query_scalar("SELECT expires_at FROM idempotency_record WHERE idem_key = $1")
            .bind(key)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    DateTime::from_timestamp(at.timestamp(), 0).unwrap()
}

/// An app, a tenant with its token, and a fresh key with a create body for `sku`.
async fn started(sku: &str) -> (TestApp, Uuid, String, String, serde_json::Value) {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    (app, tenant, token, new_key(), order_body(sku, 1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_answer_and_its_replays_tell_when_the_key_is_forgotten() {
    let (app, _, token, key, body) = started("EXP-1").await;

    let first = app.create(&token, &key, &body).await;
    assert_eq!(first.status, 201);
    let at = expires(&first);
    assert_eq!(at, stored_expiry(&app, &key).await);
    let ttl = at - Utc::now();
    assert!(
        ttl > chrono::TimeDelta::hours(23) && ttl <= chrono::TimeDelta::hours(24),
        "the default TTL is a day: {ttl}"
    );
    // A replay from the database, then one from the replay cache: the same instant.
    for _ in 0..2 {
        let again = app.create(&token, &key, &body).await;
        assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
        assert_eq!(expires(&again), at);
    }

    // A cancel's stored 404 is stored for replay too, and says so.
    let missing = Uuid::new_v4().to_string();
    let cancel_key = new_key();
    let refused = app.cancel(&token, &cancel_key, &missing).await;
    assert_eq!(refused.status, 404);
    let refused_at = expires(&refused);
    assert_eq!(refused_at, stored_expiry(&app, &cancel_key).await);
    let replayed = app.cancel(&token, &cancel_key, &missing).await;
    assert_eq!((replayed.status, expires(&replayed)), (404, refused_at));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_are_not_stored_carry_no_expiry() {
    let (app, tenant, token, key, body) = started("EXP-2").await;
    assert_eq!(app.create(&token, &key, &body).await.status, 201);

    // 422: the key with another request.
    let reused = app.create(&token, &key, &order_body("EXP-2", 2)).await;
    reused.assert_problem(422, "idempotency-key-reused");
    assert_eq!(reused.header(HEADER), None);

    // 400: an invalid body.
    let invalid = app
        .create(&token, &new_key(), &serde_json::json!({"sku": ""}))
        .await;
    assert_eq!(invalid.status, 400);
    assert_eq!(invalid.header(HEADER), None);

    // 409: a request with the key still in flight.
    let in_flight = new_key();
    app.db
        .insert_processing(
            tenant,
            &in_flight,
            &create_fingerprint(&body),
            "30 seconds",
            Uuid::new_v4(),
        )
        .await;
    let busy = app.create(&token, &in_flight, &body).await;
    busy.assert_problem(409, "idempotency-key-in-flight");
    assert_eq!(busy.header(HEADER), None);

    // A read is not stored.
    let listed = app.get(&token, "/v1/orders").await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.header(HEADER), None);
}
