//! Reading and cancelling orders (docs/contract.md §3).

use std::collections::HashSet;

use serde_json::Value;
use uuid::Uuid;

use crate::support::{new_key, order_body, spawn_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_order_can_be_read_back_as_created() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let created = app
        .create(&token, &new_key(), &order_body("READ-1", 4))
        .await;
    let location = created.header("location").unwrap();
    let read = app.get(&token, &location).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json(), created.json());
    assert_eq!(
        read.json()["customer_ref"],
        Value::Null,
        "absent customer_ref is null, not missing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_sets_cancelled_and_a_second_cancel_returns_it_unchanged() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let id = app
        .create(&token, &new_key(), &order_body("CAN-1", 1))
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = app.cancel(&token, &new_key(), &id).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["status"], "CANCELLED");
    let second = app.cancel(&token, &new_key(), &id).await;
    assert_eq!(second.status, 200);
    assert_eq!(
        second.json(),
        first.json(),
        "unchanged, including updated_at"
    );
    assert_eq!(app.event_types().await, ["OrderCreated", "OrderCancelled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_committed_change_writes_one_event_with_the_contract_body() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    let order = app
        .create(&token, &new_key(), &order_body("EVT-1", 2))
        .await
        .json();
    let payload: Value = sqlx::query_scalar("SELECT payload FROM outbox_event")
        .fetch_one(&app.db.pool)
        .await
        .unwrap();
    assert_eq!(payload["event_type"], "OrderCreated");
    assert_eq!(payload["tenant_id"], tenant.to_string());
    assert_eq!(payload["order"], order);
    assert!(Uuid::parse_str(payload["event_id"].as_str().unwrap()).is_ok());
    assert_eq!(payload["occurred_at"], order["updated_at"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_is_newest_first_and_pages_without_gaps_or_repeats() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let mut created = Vec::new();
    for i in 0..7 {
        created.push(
            app.create(&token, &new_key(), &order_body(&format!("LIST-{i}"), 1))
                .await
                .json()["id"]
                .clone(),
        );
    }
    let mut seen = Vec::new();
    let mut path = "/v1/orders?limit=3".to_string();
    loop {
        let page = app.get(&token, &path).await.json();
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 3);
        seen.extend(items.iter().map(|o| o["id"].clone()));
        match page["next"].as_str() {
            Some(cursor) => path = format!("/v1/orders?limit=3&after={cursor}"),
            None => break,
        }
    }
    created.reverse();
    assert_eq!(seen, created, "newest first, every order once");
    assert_eq!(
        seen.iter()
            .map(|v| v.to_string())
            .collect::<HashSet<_>>()
            .len(),
        7
    );

    let default_page = app.get(&token, "/v1/orders").await.json();
    assert_eq!(default_page["items"].as_array().unwrap().len(), 7);
    assert_eq!(default_page["next"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_order_is_a_404_problem() {
    let app = spawn_app().await;
    let reply = app
        .get(
            &app.token(Uuid::new_v4()),
            &format!("/v1/orders/{}", Uuid::new_v4()),
        )
        .await;
    reply.assert_problem(404, "not-found");
}
