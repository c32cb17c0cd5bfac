//! Reconciliation (docs/contract.md §10): a healthy database is clean; each kind of
//! damage is found by id, in batches, through the library, the `orderd reconcile`
//! command and the periodic job of `serve`.

use std::{process::Command, time::Duration};

use orderd::reconcile::{KeyWithoutOrder, OrderWithoutEvent, Report, reconcile_once};
use uuid::Uuid;

use crate::support::{ServeProcess, TestApp, TestDb, new_key, order_body, sample, spawn_app_on};

const DAY: Duration = Duration::from_secs(86_400);

/// `n` orders created through the API, every other one cancelled; returns their ids.
async fn orders_through_the_api(app: &TestApp, tenant: Uuid, n: usize) -> Vec<String> {
    let token = app.token(tenant);
    let mut ids = Vec::new();
    for i in 0..n {
        let created = app
            .create(&token, &new_key(), &order_body("REC-1", i as i32 + 1))
            .await;
        assert_eq!(created.status, 201);
        let id = created.json()["id"].as_str().unwrap().to_string();
        if i % 2 == 1 {
            assert_eq!(app.cancel(&token, &new_key(), &id).await.status, 200);
        }
        ids.push(id);
    }
    ids
}

async fn exec(db: &TestDb, sql: &str, id: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .bind(Uuid::parse_str(id).unwrap())
        .execute(&db.pool)
        .await
        .unwrap();
}

/// The damage each test inflicts: the created order 0 loses its event, the cancelled
/// order 1 loses its cancel event, order 2 vanishes (so its key names nothing), and
/// order 4's event is older than the window with the order itself (not a finding).
async fn damage(db: &TestDb, ids: &[String]) {
    exec(
        db,
        "DELETE FROM outbox_event WHERE aggregate_id = $1",
        &ids[0],
    )
    .await;
    exec(
        db,
        "DELETE FROM outbox_event WHERE aggregate_id = $1 AND event_type = 'OrderCancelled'",
        &ids[1],
    )
    .await;
    exec(
        db,
        "DELETE FROM outbox_event WHERE aggregate_id = $1",
        &ids[2],
    )
    .await;
    exec(db, "DELETE FROM orders WHERE id = $1", &ids[2]).await;
    exec(
        db,
        "UPDATE orders SET updated_at = now() - interval '2 days' WHERE id = $1",
        &ids[4],
    )
    .await;
    exec(
        db,
        "DELETE FROM outbox_event WHERE aggregate_id = $1",
        &ids[4],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_database_is_clean_and_each_kind_of_damage_is_found_by_id() {
    let app = spawn_app_on(TestDb::new().await, &[]).await;
    let tenant = Uuid::new_v4();
    let ids = orders_through_the_api(&app, tenant, 10).await;
    // A refused request leaves a completed non-2xx key, which names no order.
    let nowhere = Uuid::now_v7().to_string();
    let refused = app.cancel(&app.token(tenant), &new_key(), &nowhere).await;
    assert_eq!(refused.status, 404);

    // Batches of 3 walk 10 orders and 16 keys in several pages.
    let clean = reconcile_once(&app.db.direct(), DAY, 3).await.unwrap();
    assert_eq!(
        clean,
        Report {
            orders_checked: 10,
            keys_checked: 16,
            ..Report::default()
        }
    );

    damage(&app.db, &ids).await;
    let report = reconcile_once(&app.db.direct(), DAY, 3).await.unwrap();
    let order = |i: usize, status: &str| OrderWithoutEvent {
        tenant_id: tenant,
        order_id: Uuid::parse_str(&ids[i]).unwrap(),
        status: status.into(),
    };
    let mut orders = report.orders.clone();
    orders.sort_by_key(|o| o.order_id);
    assert_eq!(orders, [order(0, "CREATED"), order(1, "CANCELLED")]);
    assert_eq!(report.orders_without_event, 2);
    assert_eq!(
        report.orders_checked, 8,
        "the deleted one and the old one are not walked"
    );
    let create_key: String = sqlx::query_scalar(
        "SELECT idem_key FROM idempotency_record
          WHERE endpoint = 'POST /v1/orders' AND convert_from(response_body, 'UTF8')::jsonb ->> 'id' = $1",
    )
    .bind(&ids[2])
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(
        report.keys,
        [KeyWithoutOrder {
            tenant_id: tenant,
            endpoint: "POST /v1/orders".into(),
            idem_key: create_key,
        }]
    );
    assert_eq!((report.keys_without_order, report.keys_checked), (1, 16));
    assert!(!report.clean());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderd_reconcile_exits_0_when_clean_and_1_with_the_ids_when_not() {
    let app = spawn_app_on(TestDb::new().await, &[]).await;
    let ids = orders_through_the_api(&app, Uuid::new_v4(), 6).await;
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_orderd"))
            .arg("reconcile")
            .env("DATABASE_URL", &app.db.url)
            .output()
            .unwrap()
    };
    let clean = run();
    let stdout = String::from_utf8_lossy(&clean.stdout).to_string();
    assert!(clean.status.success(), "{stdout}");
    assert!(stdout.contains("checked 6 orders"), "{stdout}");
    assert!(
        stdout.contains("orders without event: 0\nkeys without order: 0"),
        "{stdout}"
    );

    damage(&app.db, &ids).await;
    let broken = run();
    let stdout = String::from_utf8_lossy(&broken.stdout).to_string();
    let stderr = String::from_utf8_lossy(&broken.stderr).to_string();
    assert_eq!(broken.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("orders without event: 2"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "order {} is CREATED but has no OrderCreated",
            ids[0]
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "order {} is CANCELLED but has no OrderCancelled",
            ids[1]
        )),
        "{stdout}"
    );
    assert!(stdout.contains("keys without order: 1"), "{stdout}");
    assert!(
        stderr.contains("reconciliation found 2 orders without event and 1 keys without order"),
        "{stderr}"
    );
    // Ids only: no order body (its SKU) is printed.
    assert!(!stdout.contains("REC-1"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reconciles_periodically_into_its_gauges_and_logs() {
    let app = spawn_app_on(
        TestDb::new().await,
        &[("ORDERD_RECONCILE_INTERVAL_SECS", "0")],
    )
    .await;
    let ids = orders_through_the_api(&app, Uuid::new_v4(), 6).await;
    damage(&app.db, &ids).await;
    let serve = ServeProcess::start(&app.db, &[("ORDERD_RECONCILE_INTERVAL_SECS", "1".into())]);
    let metrics = serve
        .metrics_until(|text| {
            sample(text, "reconcile_last_run_timestamp_seconds").unwrap_or(0.0) > 0.0
        })
        .await;
    assert_eq!(
        sample(&metrics, "reconcile_orders_without_event"),
        Some(2.0)
    );
    assert_eq!(sample(&metrics, "reconcile_keys_without_order"), Some(1.0));
    let last_run = sample(&metrics, "reconcile_last_run_timestamp_seconds").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        last_run <= now && last_run > now - 600.0,
        "{last_run} vs {now}"
    );
    let logs = serve.logs.lock().unwrap().join("\n");
    assert!(logs.contains(&ids[0]) && logs.contains(&ids[1]), "{logs}");
    assert!(logs.contains("reconciliation: a stored success names an order that does not exist"));

    // With the damaged rows gone (deleted here), the next pass brings the gauges to zero.
    sqlx::query("DELETE FROM orders WHERE id = ANY($1::uuid[])")
        .bind(
            ids[..2]
                .iter()
                .map(|id| Uuid::parse_str(id).unwrap())
                .collect::<Vec<_>>(),
        )
        .execute(&app.db.pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM idempotency_record")
        .execute(&app.db.pool)
        .await
        .unwrap();
    let metrics = serve
        .metrics_until(|text| {
            sample(text, "reconcile_orders_without_event") == Some(0.0)
                && sample(text, "reconcile_keys_without_order") == Some(0.0)
        })
        .await;
    assert_eq!(
        sample(&metrics, "reconcile_orders_without_event"),
        Some(0.0)
    );
    assert_eq!(sample(&metrics, "reconcile_keys_without_order"), Some(0.0));
}

/// Any number of processes may run `serve` with reconciliation on: a pass runs only in
/// the process that holds the job's advisory lock, on a direct session, and the others
/// skip their turn; the lock goes with its session, even when a pass is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_at_a_time_reconciles() {
    use orderd::{
        db::SessionLock,
        reconcile::{LOCK_KEY, pass_if_alone},
    };
    let db = TestDb::new().await;
    let direct: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let held = SessionLock::try_take(&direct, LOCK_KEY)
        .await
        .unwrap()
        .expect("nobody holds the lock yet");
    assert!(
        SessionLock::try_take(&direct, LOCK_KEY)
            .await
            .unwrap()
            .is_none(),
        "a second session cannot take it"
    );
    let passes = (0..4).map(|_| {
        let (orderd_db, direct) = (db.direct(), direct.clone());
        tokio::spawn(async move { pass_if_alone(&orderd_db, &direct, DAY, 100).await })
    });
    for pass in futures::future::join_all(passes).await {
        assert_eq!(
            pass.unwrap().unwrap(),
            None,
            "skipped while another holds the lock"
        );
    }
    held.release().await;
    let report = pass_if_alone(&db.direct(), &direct, DAY, 100)
        .await
        .unwrap()
        .expect("the lock is free once released");
    // And a pass releases it as it ends: the next one finds it free at once.
    assert!(
        pass_if_alone(&db.direct(), &direct, DAY, 100)
            .await
            .unwrap()
            .is_some(),
        "a pass that ended gave the lock back"
    );
    assert_eq!(report, Report::default());
    // A pass that is cancelled halfway gives the lock back with its session.
    let cancelled = tokio::time::timeout(
        Duration::from_micros(1),
        pass_if_alone(&db.direct(), &direct, DAY, 100),
    )
    .await;
    assert!(cancelled.is_err() || cancelled.unwrap().unwrap().is_some());
    // The server ends a session whose client went away a moment later.
    let mut again = None;
    for _ in 0..500 {
        again = SessionLock::try_take(&direct, LOCK_KEY).await.unwrap();
        if again.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(again.is_some(), "a cancelled pass left no lock behind");
}
