//! PostgreSQL goes silent: every packet between orderd and the server is dropped, and
//! nothing closes (on Citus, between orderd and every node: the coordinator and the
//! workers its routes reach, which the cluster's own connections cross too). Each request still answers, 503 `service-unavailable` with
//! `Retry-After`, within the statement timeout and the pool's wait (orderd keeps a
//! deadline of its own on every database call); once the network heals, the retries
//! succeed and no key makes a second order. Beside it, the database's other quiet
//! faults: a commit whose answer is lost, a transaction dropped half-way, a transaction
//! pooler killed and started again.

use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::support::{
    Reply, TestDb, citus_workers,
    db::node_address,
    new_key, order_body,
    pgbouncer::OwnPgBouncer,
    proxy::{Mode, database_behind_network},
    spawn_app_on,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_answers_503_while_the_database_is_silent_and_nothing_doubles_after() {
    let (db, network, through) = database_behind_network().await;
    let app = spawn_app_on(
        db,
        &[
            ("DATABASE_URL", &through),
            ("ORDERD_DB_STATEMENT_TIMEOUT_MS", "1000"),
            ("ORDERD_LEASE_SECS", "2"),
        ],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    for i in 0..4 {
        let warm = app
            .create(&token, &new_key(), &order_body(&format!("WARM-{i}"), 1))
            .await;
        assert_eq!(warm.status, 201);
    }

    network.set(Mode::Silent);
    let keys: Vec<String> = (0..8).map(|_| new_key()).collect();
    // A client of its own whose timeout is far past any bound orderd keeps: what it
    // catches is a request left hanging, not a slow one.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let attempts = keys.iter().map(|key| {
        let (client, base, token, key) =
            (client.clone(), app.base.clone(), token.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let sent = client
                .post(format!("{base}/v1/orders"))
                .bearer_auth(token)
                .header("Idempotency-Key", key)
                .json(&order_body("SILENT-1", 1))
                .send()
                .await;
            let reply = match sent {
                Ok(response) => Some(Reply::read(response).await),
                Err(_) => None,
            };
            (reply, started.elapsed())
        })
    });
    let mut took = Vec::new();
    for attempt in attempts {
        let (reply, elapsed) = attempt.await.unwrap();
        let reply = reply.expect("a request left hanging on a silent database");
        reply.assert_problem(503, "service-unavailable");
        assert!(reply.header("retry-after").is_some());
        took.push(elapsed.as_millis());
    }
    took.sort_unstable();
    println!("answers while silent (ms): {took:?}");

    // Healed: what was held goes through, and every retry ends in one order.
    network.set(Mode::Forward);
    for key in &keys {
        let mut tries = 0;
        loop {
            tries += 1;
            let reply = app.create(&token, key, &order_body("SILENT-1", 1)).await;
            if reply.status == 201 {
                break;
            }
            assert!(
                matches!(reply.status, 409 | 503) && tries < 100,
                "{} {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            );
            let wait: u64 = reply
                .header("retry-after")
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            tokio::time::sleep(Duration::from_millis(wait * 1000 / 4)).await;
        }
    }
    let per_key: Vec<(String, i64)> = sqlx::query_as(
        "SELECT r.idem_key, count(o.id) FROM idempotency_record r
         LEFT JOIN orders o ON o.tenant_id = r.tenant_id AND o.id = r.resource_id
         WHERE r.idem_key = ANY($1) GROUP BY r.idem_key",
    )
    .bind(&keys)
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(per_key.len(), keys.len());
    assert!(per_key.iter().all(|(_, n)| *n == 1), "{per_key:?}");
    assert_eq!(
        app.count("orders").await,
        12,
        "one order per key, nothing doubled"
    );
    assert_eq!(
        app.count("outbox_event").await,
        12,
        "and one event per order"
    );
}

/// An ambiguous commit: the connection is cut just after the create's commit went out
/// (on one server the order, its event and the fenced completion are one statement that
/// commits on its own; on Citus a transaction and its `COMMIT`), so orderd cannot know
/// whether it committed (it did: the server had the message). The request answers 503 with `Retry-After`; the claim's completion was
/// fenced into that same commit, so the retry with the same key replays the stored
/// answer, and the key made one order and one event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_answers_503_and_the_retry_replays_it() {
    let (db, network, through) = database_behind_network().await;
    let app = spawn_app_on(db, &[("DATABASE_URL", &through)]).await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    let warm = app
        .create(&token, &new_key(), &order_body("WARM-1", 1))
        .await;
    assert_eq!(warm.status, 201);

    // The create's statement (on Citus, its call) commits on its own.
    network.set(Mode::CutAfter("AMBIGUOUS-1"));
    let key = new_key();
    let body = order_body("AMBIGUOUS-1", 1);
    let cut = app.create(&token, &key, &body).await;
    network.set(Mode::Forward);
    cut.assert_problem(503, "service-unavailable");
    assert!(cut.header("retry-after").is_some());

    let retry = app.create(&token, &key, &body).await;
    assert_eq!(retry.status, 201, "{}", retry.json());
    assert_eq!(
        retry.header("idempotent-replayed").as_deref(),
        Some("true"),
        "the first attempt committed: the retry replays it"
    );
    let again = app.create(&token, &key, &body).await;
    assert_eq!(again.body, retry.body, "byte-exact");
    let (orders, events): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE tenant_id = $1),
                (SELECT count(*) FROM outbox_event WHERE tenant_id = $1)",
    )
    .bind(tenant)
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!((orders, events), (2, 2), "one order and one event per key");
}

/// A transaction dropped half-way (a request cancelled, a deadline passed) is rolled
/// back at once, not when the pool next hands its connection out: on a quiet pool that
/// could be never before the server's idle-in-transaction timeout (here 30 s, the
/// statement timeout of the handle), and meanwhile its locks, a claim's row among them,
/// would stay held. Another session waiting for the row gets it well within its 10 s
/// `lock_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_dropped_half_way_lets_go_of_its_locks_at_once() {
    let db = TestDb::new().await;
    sqlx::raw_sql("CREATE TABLE held (id int PRIMARY KEY); INSERT INTO held VALUES (1)")
        .execute(&db.pool)
        .await
        .unwrap();
    let orderd_db = db.direct_sized(2);
    let mut conn = orderd_db.begin().await.unwrap();
    sqlx::query("SELECT id FROM held WHERE id = 1 FOR UPDATE")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);

    let mut other = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '10s'")
        .execute(&mut *other)
        .await
        .unwrap();
    let locked = sqlx::query("SELECT id FROM held WHERE id = 1 FOR UPDATE")
        .execute(&mut *other)
        .await;
    assert!(
        locked.is_ok(),
        "the dropped transaction still held its lock: {locked:?}"
    );
    other.rollback().await.unwrap();
    // The connection went back to the pool settled, and serves the next user.
    let mut again = orderd_db.conn().await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut *again)
        .await
        .unwrap();
    assert_eq!(one, 1);
}

/// The transaction poolers killed (`kill -9`: every connection cut mid-flight) and
/// started again on its port: while it is down each request answers 503 with
/// `Retry-After` (never 500, never a hang); once it is back every retry of every key
/// succeeds on fresh connections, and no key made two orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_killed_and_started_again_costs_503s_and_nothing_else() {
    let db = TestDb::new().await;
    // One pooler per server, as an operator puts one in front of each Citus node and
    // names the workers' in `ORDERD_CITUS_NODE_URLS`.
    let bouncer = OwnPgBouncer::start();
    let through = bouncer.url_through(&db.url);
    let workers: Vec<(String, OwnPgBouncer)> = citus_workers()
        .iter()
        .map(|worker| (node_address(worker), OwnPgBouncer::in_front_of(worker)))
        .collect();
    let node_urls: Vec<String> = workers
        .iter()
        .map(|(node, pooler)| format!("{node}={}", pooler.url_through(&db.url)))
        .collect();
    let direct = db.url.clone();
    let app = spawn_app_on(
        db,
        &[
            ("DATABASE_URL", &through),
            ("ORDERD_DATABASE_DIRECT_URL", &direct),
            ("ORDERD_DB_POOLER", "transaction"),
            ("ORDERD_CITUS_NODE_URLS", &node_urls.join(",")),
        ],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    let keys: Vec<String> = (0..6).map(|_| new_key()).collect();
    for key in &keys[..3] {
        assert_eq!(
            app.create(&token, key, &order_body("POOLER-1", 1))
                .await
                .status,
            201
        );
    }

    bouncer.kill();
    workers.iter().for_each(|(_, pooler)| pooler.kill());
    for key in &keys {
        let reply = app.create(&token, key, &order_body("POOLER-1", 1)).await;
        reply.assert_problem(503, "service-unavailable");
        assert!(reply.header("retry-after").is_some());
    }

    bouncer.restart();
    workers.iter().for_each(|(_, pooler)| pooler.restart());
    for key in &keys {
        let mut tries = 0;
        let reply = loop {
            tries += 1;
            let reply = app.create(&token, key, &order_body("POOLER-1", 1)).await;
            if reply.status != 503 || tries == 50 {
                break reply;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(reply.status, 201, "{}", reply.json());
    }
    assert_eq!(app.count("orders").await, 6, "one order per key");
    assert_eq!(
        app.count("outbox_event").await,
        6,
        "and one event per order"
    );
}
