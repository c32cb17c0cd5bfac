//! The replay cache: retries of completed requests are answered from memory, with the
//! guarantees of the database path (docs/contract.md §4): the same bytes, 422 for a
//! changed request, never another tenant's answer, and nothing after the key expired.
//!
//! To prove an answer came from memory, the test locks `idempotency_record` and gives
//! statements a short timeout: any request that reaches the table waits on the lock
//! and answers 503 instead.
//!
//! The cache learns a response from the first replay, which reads the database; the
//! request that created it does not fill it.

use sqlx::{Executor, Postgres, Transaction};
use uuid::Uuid;

use crate::support::{Reply, TestApp, new_key, order_body, spawn_app_with};

/// An app whose statements give up after 200 ms.
async fn app_with_cache(bytes: &str) -> TestApp {
    spawn_app_with(&[
        ("ORDERD_REPLAY_CACHE_BYTES", bytes),
        ("ORDERD_DB_STATEMENT_TIMEOUT_MS", "200"),
    ])
    .await
}

/// Sends a completed request again while the table is readable, so that the cache
/// learns it; checks that it was a replay.
async fn replay_once(app: &TestApp, token: &str, key: &str, body: &serde_json::Value) -> Reply {
    let replay = app.create(token, key, body).await;
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    replay
}

/// Holds an exclusive lock on the idempotency table until dropped (rolled back).
async fn lock_idempotency_table(app: &TestApp) -> Transaction<'static, Postgres> {
    let mut tx = app.db.pool.begin().await.unwrap();
    tx.execute("LOCK TABLE idempotency_record IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_replay_is_answered_without_the_database_byte_for_byte() {
    let app = app_with_cache("1048576").await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let first = app.create(&token, &key, &order_body("CACHE-1", 2)).await;
    assert_eq!(first.status, 201);
    // Creating it did not put it in the cache: a retry now needs the table.
    let lock = lock_idempotency_table(&app).await;
    app.create(&token, &key, &order_body("CACHE-1", 2))
        .await
        .assert_problem(503, "service-unavailable");
    drop(lock);
    // The first replay reads it from the table and the cache learns it.
    assert_eq!(
        replay_once(&app, &token, &key, &order_body("CACHE-1", 2))
            .await
            .body,
        first.body
    );

    let lock = lock_idempotency_table(&app).await;
    let replay = app.create(&token, &key, &order_body("CACHE-1", 2)).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body, "byte for byte");
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(replay.header("location"), first.header("location"));
    // The cancel endpoint has its own scope: the same key there is a new request, which
    // must reach the (locked) table.
    let id = first.json()["id"].as_str().unwrap().to_string();
    app.cancel(&token, &key, &id)
        .await
        .assert_problem(503, "service-unavailable");
    drop(lock);
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cache_off_the_same_replay_needs_the_database() {
    let app = app_with_cache("0").await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    assert_eq!(
        app.create(&token, &key, &order_body("CACHE-2", 1))
            .await
            .status,
        201
    );
    replay_once(&app, &token, &key, &order_body("CACHE-2", 1)).await;
    let lock = lock_idempotency_table(&app).await;
    app.create(&token, &key, &order_body("CACHE-2", 1))
        .await
        .assert_problem(503, "service-unavailable");
    drop(lock);
    let replay = app.create(&token, &key, &order_body("CACHE-2", 1)).await;
    assert_eq!(
        replay.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_request_under_a_cached_key_is_still_422() {
    let app = app_with_cache("1048576").await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    assert_eq!(
        app.create(&token, &key, &order_body("CACHE-3", 1))
            .await
            .status,
        201
    );
    replay_once(&app, &token, &key, &order_body("CACHE-3", 1)).await;
    let lock = lock_idempotency_table(&app).await;
    app.create(&token, &key, &order_body("CACHE-3", 2))
        .await
        .assert_problem(422, "idempotency-key-reused");
    drop(lock);
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_answers_another_tenant() {
    let app = app_with_cache("1048576").await;
    let (alice, bob) = (app.token(Uuid::new_v4()), app.token(Uuid::new_v4()));
    let key = new_key();
    let hers = app.create(&alice, &key, &order_body("CACHE-4", 1)).await;
    assert_eq!(hers.status, 201);
    // Bob's request with the same key and body is his own first request.
    let his = app.create(&bob, &key, &order_body("CACHE-4", 1)).await;
    assert_eq!(his.status, 201);
    assert_eq!(his.header("idempotent-replayed"), None);
    assert_ne!(his.json()["id"], hers.json()["id"]);
    replay_once(&app, &alice, &key, &order_body("CACHE-4", 1)).await;
    replay_once(&app, &bob, &key, &order_body("CACHE-4", 1)).await;
    // And each one's retry, from memory, is their own.
    let lock = lock_idempotency_table(&app).await;
    assert_eq!(
        app.create(&alice, &key, &order_body("CACHE-4", 1))
            .await
            .body,
        hers.body
    );
    assert_eq!(
        app.create(&bob, &key, &order_body("CACHE-4", 1)).await.body,
        his.body
    );
    drop(lock);
    assert_eq!(app.count("orders").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_key_past_its_retention_is_a_new_request() {
    let app = spawn_app_with(&[
        ("ORDERD_REPLAY_CACHE_BYTES", "1048576"),
        ("ORDERD_IDEMPOTENCY_TTL_SECS", "1"),
    ])
    .await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let first = app.create(&token, &key, &order_body("CACHE-5", 1)).await;
    assert_eq!(first.status, 201);
    replay_once(&app, &token, &key, &order_body("CACHE-5", 1)).await;

    // Let the record expire on the database's clock.
    loop {
        let expired: bool = sqlx::query_scalar(
            "SELECT bool_and(expires_at <= clock_timestamp()) FROM idempotency_record",
        )
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
        if expired {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Even a different request is no conflict now: the key is forgotten, cached or not.
    let again = app.create(&token, &key, &order_body("CACHE-5", 7)).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(again.json()["quantity"], 7);
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (2, 2)
    );
    // One key, re-claimed in place and completed with the new request's answer.
    assert_eq!(app.count("idempotency_record").await, 1);
}
