//! Past one process (docs/contract.md §11): orderd behind PgBouncer in transaction
//! pooling mode, and several `serve` and `relay` processes on one database, with the
//! guarantees of §4 and §6 holding across them.

use std::{collections::BTreeSet, time::Duration};

use futures::future::join_all;
use serde_json::Value;
use uuid::Uuid;

use crate::support::{
    KillOnDrop, Reply, ServeProcess, TestDb, new_key, order_body, pgbouncer, post_order,
    sns::{Topic, aws_env, moto_endpoint},
    spawn_publishing_app_on, token,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode_writes_races_and_the_relay_hold() {
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    let through = pgbouncer::url_through(&db.url);
    let direct = db.url.clone();
    let app = spawn_publishing_app_on(
        db,
        &moto_endpoint(),
        &topic.arn,
        &[
            ("DATABASE_URL", &through),
            ("ORDERD_DATABASE_DIRECT_URL", &direct),
            ("ORDERD_DB_POOLER", "transaction"),
            ("ORDERD_TENANT_RATE_PER_SEC", "0"),
            ("ORDERD_TENANT_MAX_IN_FLIGHT", "100"),
        ],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    // 80 different creates at once, then 50 identical ones.
    let distinct = join_all((0..80).map(|i| {
        let (base, token) = (app.base.clone(), token.clone());
        async move {
            let reply = Reply::read(
                post_order(
                    &base,
                    &token,
                    &new_key(),
                    &order_body("PGB-1", i % 100 + 1),
                    None,
                )
                .await,
            )
            .await;
            reply.status
        }
    }))
    .await;
    assert!(distinct.iter().all(|s| *s == 201), "{distinct:?}");
    let key = new_key();
    let race = join_all((0..50).map(|_| {
        let (base, token, key) = (app.base.clone(), token.clone(), key.clone());
        async move {
            Reply::read(post_order(&base, &token, &key, &order_body("PGB-RACE", 1), None).await)
                .await
        }
    }))
    .await;
    let bodies: BTreeSet<Vec<u8>> = race
        .iter()
        .filter(|r| r.status == 201)
        .map(|r| r.body.clone())
        .collect();
    assert!(
        race.iter().all(|r| r.status == 201 || r.status == 409),
        "{:?}",
        race.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(bodies.len(), 1, "every 201 is the same answer");
    // Reads, a cancel, and every event published by the relay (LISTEN on the direct URL).
    let id = serde_json::from_slice::<Value>(bodies.first().unwrap()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(app.cancel(&token, &new_key(), &id).await.status, 200);
    assert_eq!(
        app.get(&token, &format!("/v1/orders/{id}")).await.json()["status"],
        "CANCELLED"
    );
    assert_eq!(
        app.get(&token, "/v1/orders?limit=100").await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        81
    );
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (81, 82)
    );
    app.db
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            82,
        )
        .await;
}

/// `orderd relay` as a child process publishing to `topic`.
fn relay_process(db: &TestDb, topic: &Topic) -> KillOnDrop {
    KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
            .arg("relay")
            .env("DATABASE_URL", &db.url)
            .env("ORDERD_SNS_TOPIC_ARN", &topic.arn)
            .env("ORDERD_DB_POOL_SIZE", "3")
            .env("ORDERD_OUTBOX_POLL_MS", "200")
            .env("ORDERD_OUTBOX_BATCH_SIZE", "5")
            .envs(aws_env(&topic.endpoint))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn serve_env() -> Vec<(&'static str, String)> {
    vec![
        ("ORDERD_DB_POOL_SIZE", "4".into()),
        ("ORDERD_TENANT_RATE_PER_SEC", "0".into()),
        ("ORDERD_TENANT_MAX_IN_FLIGHT", "100".into()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_serve_and_two_relay_processes_keep_every_guarantee() {
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    let serves: Vec<ServeProcess> = (0..3)
        .map(|_| ServeProcess::start(&db, &serve_env()))
        .collect();
    let _relays = [relay_process(&db, &topic), relay_process(&db, &topic)];
    let token = token(Uuid::new_v4(), "orders:read orders:write");

    // 60 identical creates spread over the three processes: one order, one event.
    let key = new_key();
    let answers = join_all((0..60).map(|i| {
        let (base, token, key) = (serves[i % 3].base.clone(), token.clone(), key.clone());
        async move {
            Reply::read(post_order(&base, &token, &key, &order_body("MULTI-1", 1), None).await)
                .await
        }
    }))
    .await;
    let created: BTreeSet<Vec<u8>> = answers
        .iter()
        .filter(|r| r.status == 201)
        .map(|r| r.body.clone())
        .collect();
    assert!(answers.iter().all(|r| r.status == 201 || r.status == 409));
    assert_eq!(created.len(), 1);
    let id = serde_json::from_slice::<Value>(created.first().unwrap()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // 30 cancels with distinct keys over the three: one change, one event.
    let client = reqwest::Client::new();
    let cancels = join_all((0..30).map(|i| {
        let request = client
            .post(format!("{}/v1/orders/{id}/cancel", serves[i % 3].base))
            .bearer_auth(&token)
            .header("Idempotency-Key", new_key());
        async move { request.send().await.unwrap().status().as_u16() }
    }))
    .await;
    assert!(cancels.iter().all(|s| *s == 200), "{cancels:?}");
    assert_eq!(
        (db.count("orders").await, db.count("outbox_event").await),
        (1, 2)
    );

    // More orders, each created then cancelled on different processes; both relays
    // publish, and every order's events arrive in commit order.
    for i in 0..20 {
        let base = &serves[i % 3].base;
        let created = Reply::read(
            post_order(base, &token, &new_key(), &order_body("MULTI-2", 1), None).await,
        )
        .await;
        let other = &serves[(i + 1) % 3].base;
        let order = created.json()["id"].as_str().unwrap().to_string();
        let cancel = client
            .post(format!("{other}/v1/orders/{order}/cancel"))
            .bearer_auth(&token)
            .header("Idempotency-Key", new_key())
            .send()
            .await
            .unwrap();
        assert_eq!(cancel.status(), 200);
    }
    db.until_count(
        "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
        42,
    )
    .await;
    let messages = topic.collect(42).await;
    let mut per_order: std::collections::HashMap<String, Vec<String>> = Default::default();
    for message in &messages {
        per_order
            .entry(message.body["order"]["id"].as_str().unwrap().to_string())
            .or_default()
            .push(message.body["event_type"].as_str().unwrap().to_string());
    }
    assert_eq!(per_order.len(), 21);
    for events in per_order.values() {
        let mut deduplicated = events.clone();
        deduplicated.dedup();
        assert_eq!(
            deduplicated,
            ["OrderCreated", "OrderCancelled"],
            "{events:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_killed_mid_request_leaves_a_lease_another_process_takes_over() {
    let db = TestDb::new().await;
    let mut env = serve_env();
    env.push(("ORDERD_LEASE_SECS", "2".into()));
    env.push(("ORDERD_INFLIGHT_WAIT_MS", "0".into()));
    let mut doomed = ServeProcess::start(&db, &env);
    let survivor = ServeProcess::start(&db, &env);
    let token = token(Uuid::new_v4(), "orders:read orders:write");
    let key = new_key();
    let body = order_body("KILLED-1", 1);

    // Stall the business transaction: the doomed process claims the key, then waits
    // on the lock while inserting the order (on every node: on Citus the insert runs on
    // the tenant's).
    let locks = db.lock_everywhere("orders").await;
    let in_flight = tokio::spawn({
        let (base, token, key, body) = (
            doomed.base.clone(),
            token.clone(),
            key.clone(),
            body.clone(),
        );
        async move { post_order(&base, &token, &key, &body, None).await }
    });
    db.until_count(
        "SELECT count(*) FROM idempotency_record WHERE state = 'PROCESSING'",
        1,
    )
    .await;
    db.until_count(&db.lock_waiters(), 1).await;
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let _ = in_flight.await;
    // Its statement was cut off by the server, which looks for its client every few
    // seconds (`client_connection_check_interval`), not left to commit once the lock
    // goes: a create is one statement (or one call), and a dead client's statement
    // that runs to its end commits.
    db.until_count(&db.lock_waiters(), 0).await;
    locks.release().await;

    // The survivor answers 409 while the dead process's lease runs, then takes it over.
    let mut status = 0;
    for _ in 0..100 {
        status = post_order(&survivor.base, &token, &key, &body, None)
            .await
            .status()
            .as_u16();
        if status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(status, 201);
    let metrics = survivor.metrics().await;
    assert_eq!(
        crate::support::sample(
            &metrics,
            r#"idempotency_requests_total{endpoint="POST /v1/orders",outcome="lease_takeover"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        (db.count("orders").await, db.count("outbox_event").await),
        (1, 1)
    );
}
