//! Many identical requests at once: the database must end with exactly one effect.

use std::collections::HashSet;

use futures::future::join_all;
use uuid::Uuid;

use crate::support::{Reply, new_key, order_body, spawn_app, spawn_app_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_creates_at_once_make_exactly_one_order() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let body = order_body("RACE-1", 7);

    let replies: Vec<Reply> = join_all((0..50).map(|_| app.create(&token, &key, &body))).await;

    let created: Vec<&Reply> = replies.iter().filter(|r| r.status == 201).collect();
    assert!(!created.is_empty(), "at least the owner answered 201");
    for reply in &replies {
        assert!(
            reply.status == 201 || reply.status == 409,
            "unexpected {}: {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        if reply.status == 409 {
            reply.assert_problem(409, "idempotency-key-in-flight");
            assert!(reply.header("retry-after").is_some());
        }
    }
    let bodies: HashSet<&Vec<u8>> = created.iter().map(|r| &r.body).collect();
    assert_eq!(
        bodies.len(),
        1,
        "every 201 is the first answer, byte for byte"
    );
    assert_eq!(
        created
            .iter()
            .filter(|r| r.header("idempotent-replayed").is_none())
            .count(),
        1,
        "one executed"
    );
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox_event").await, 1);
    assert_eq!(app.count("idempotency_record").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_cancels_at_once_emit_one_event() {
    let app = spawn_app_with(&[("ORDERD_INFLIGHT_WAIT_MS", "2000")]).await;
    let token = app.token(Uuid::new_v4());
    let created = app
        .create(&token, &new_key(), &order_body("RACE-2", 1))
        .await;
    let id = created.json()["id"].as_str().unwrap().to_string();
    let key = new_key();

    let replies: Vec<Reply> = join_all((0..50).map(|_| app.cancel(&token, &key, &id))).await;
    for reply in &replies {
        assert!(
            reply.status == 200 || reply.status == 409,
            "unexpected {}",
            reply.status
        );
    }
    let bodies: HashSet<&Vec<u8>> = replies
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| &r.body)
        .collect();
    assert_eq!(bodies.len(), 1);
    assert_eq!(
        app.count("outbox_event").await,
        2,
        "one OrderCreated, one OrderCancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_in_parallel_all_create() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let keys: Vec<String> = (0..40).map(|_| new_key()).collect();
    let body = order_body("PAR-1", 1);
    let replies = join_all(keys.iter().map(|k| app.create(&token, k, &body))).await;
    assert!(replies.iter().all(|r| r.status == 201));
    let ids: HashSet<String> = replies
        .iter()
        .map(|r| r.json()["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 40);
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (40, 40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cancels_with_different_keys_cancel_once() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let id = app
        .create(&token, &new_key(), &order_body("RACE-3", 1))
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let keys: Vec<String> = (0..20).map(|_| new_key()).collect();
    let replies = join_all(keys.iter().map(|k| app.cancel(&token, k, &id))).await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == 200 && r.json()["status"] == "CANCELLED")
    );
    assert_eq!(
        app.count("outbox_event").await,
        2,
        "only the cancel that changed the order emitted an event"
    );
    let version: i32 = sqlx::query_scalar("SELECT version FROM orders")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(version, 2);
}
