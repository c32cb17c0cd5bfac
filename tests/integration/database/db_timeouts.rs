//! A stalled statement (here: a lock another session holds) is cancelled after
//! `ORDERD_DB_STATEMENT_TIMEOUT_MS`: the request answers 503, its claim is released, and
//! a retry executes afresh once the stall is over. Migrations are never cut short.

use sqlx::{Connection, Executor, PgConnection};
use uuid::Uuid;

use crate::support::{TestDb, new_key, order_body, spawn_app_on};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_write_answers_503_releases_its_claim_and_a_retry_executes_afresh() {
    let app = spawn_app_on(
        TestDb::new().await,
        &[("ORDERD_DB_STATEMENT_TIMEOUT_MS", "300")],
    )
    .await;
    let token = app.token(Uuid::new_v4());
    let mut locker = PgConnection::connect(&app.db.url).await.unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute("LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();

    let key = new_key();
    let stalled = app.create(&token, &key, &order_body("STALL-1", 1)).await;
    stalled.assert_problem(503, "service-unavailable");
    assert!(stalled.header("retry-after").is_some());
    assert!(
        !String::from_utf8_lossy(&stalled.body).contains("statement"),
        "no internal detail in a 5xx body"
    );
    // Reads stall the same way.
    app.get(&token, "/v1/orders")
        .await
        .assert_problem(503, "service-unavailable");
    // The claim was given back (asynchronously, right after the answer).
    app.db
        .until_count("SELECT count(*) FROM idempotency_record", 0)
        .await;

    locker.execute("ROLLBACK").await.unwrap();
    let retried = app.create(&token, &key, &order_body("STALL-1", 1)).await;
    assert_eq!(retried.status, 201);
    assert_eq!(
        retried.header("idempotent-replayed"),
        None,
        "executed afresh"
    );
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_wait_out_a_lock_longer_than_the_statement_timeout() {
    let db = TestDb::new().await;
    let mut locker = PgConnection::connect(&db.url).await.unwrap();
    locker.execute("BEGIN").await.unwrap();
    locker
        .execute("LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let url = db.url.clone();
    let migrate = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
            .arg("migrate")
            .env("DATABASE_URL", url)
            .env("ORDERD_DB_STATEMENT_TIMEOUT_MS", "100")
            .output()
            .unwrap()
    });
    // Hold the lock for ten statement timeouts.
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    locker.execute("ROLLBACK").await.unwrap();
    let out = migrate.await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pool pings only connections idle for a while (`db::PING_IF_IDLE_FOR`), not on
/// every acquire. Connections the server closed behind orderd's back (a restart, an
/// administrator, a pooler's idle timeout) have been idle that long by the next
/// request, so they are found and replaced before any request uses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closed_are_replaced_before_a_request_uses_them() {
    let app = spawn_app_on(TestDb::new().await, &[]).await;
    let token = app.token(Uuid::new_v4());
    // Every connection of the pool in use at once, so that all of them exist.
    let warm: Vec<_> = (0..8)
        .map(|i| {
            let (app, token) = (&app, &token);
            async move {
                app.create(token, &new_key(), &order_body(&format!("WARM-{i}"), 1))
                    .await
                    .status
            }
        })
        .collect();
    for status in futures::future::join_all(warm).await {
        assert_eq!(status, 201);
    }
    let mut admin = PgConnection::connect(&app.db.url).await.unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(killed >= 1, "orderd's connections were there to close");
    tokio::time::sleep(orderd::db::PING_IF_IDLE_FOR + std::time::Duration::from_millis(200)).await;

    for i in 0..8 {
        let reply = app
            .create(&token, &new_key(), &order_body(&format!("AFTER-{i}"), 1))
            .await;
        assert_eq!(
            reply.status,
            201,
            "request {i} after the server closed every connection: {}",
            String::from_utf8_lossy(&reply.body)
        );
    }
    assert_eq!(app.count("orders").await, 16);
}
