//! A tenant's data as a whole (docs/contract.md §12), through the real binary:
//! `orderd tenant export` writes its orders as the API shows them, oldest first;
//! `orderd tenant erase` leaves nothing of it in the three tables, touches no other
//! tenant, publishes nothing, and the tenant's token then finds nothing.

use std::process::Command;

use serde_json::Value;
use uuid::Uuid;

use crate::support::{TestApp, TestDb, new_key, order_body, spawn_app_with};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");

fn run(db: &TestDb, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Rows of `tenant` in each of the three tables.
async fn rows_of(db: &TestDb, tenant: Uuid) -> [i64; 3] {
    let mut counts = [0; 3];
    for (i, table) in ["orders", "idempotency_record", "outbox_event"]
        .iter()
        .enumerate()
    {
        counts[i] = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE tenant_id = $1"
        )))
        .bind(tenant)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    }
    counts
}

/// Creates `n` orders for `token` and cancels every other one.
async fn orders(app: &TestApp, token: &str, n: usize) -> Vec<Value> {
    let mut made = Vec::new();
    for i in 0..n {
        let created = app
            .create(
                token,
                &new_key(),
                &order_body(&format!("EXP-{i}"), 1 + i as i32),
            )
            .await;
        assert_eq!(created.status, 201);
        let mut order = created.json();
        if i % 2 == 1 {
            let cancelled = app
                .cancel(token, &new_key(), order["id"].as_str().unwrap())
                .await;
            order = cancelled.json();
        }
        made.push(order);
    }
    made
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_writes_exactly_the_tenants_orders_oldest_first_as_the_api_shows_them() {
    let app = spawn_app_with(&[]).await;
    let (tenant, other) = (Uuid::new_v4(), Uuid::new_v4());
    let token = app.token(tenant);
    let made = orders(&app, &token, 3).await;
    orders(&app, &app.token(other), 2).await;

    let (ok, stdout, stderr) = run(
        &app.db,
        &["tenant", "export", "--tenant", &tenant.to_string()],
    );
    assert!(ok, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    // Each line is the order exactly as GET answers it, in creation order.
    for (line, order) in lines.iter().zip(&made) {
        let read = app
            .get(
                &token,
                &format!("/v1/orders/{}", order["id"].as_str().unwrap()),
            )
            .await;
        assert_eq!(line.as_bytes(), read.body.as_slice());
    }
    assert!(stderr.contains("exported 3 orders"), "{stderr}");
    let (ok, stdout, _) = run(
        &app.db,
        &["tenant", "export", "--tenant", &Uuid::new_v4().to_string()],
    );
    assert!(ok && stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_meets_an_erasure_fails_and_writes_nothing_as_if_whole() {
    let app = spawn_app_with(&[]).await;
    let tenant = Uuid::new_v4();
    orders(&app, &app.token(tenant), 3).await;
    // An erasure under way (or killed half-way): the tenant is marked.
    sqlx::query("INSERT INTO tenant_erasure (tenant_id, actor) VALUES ($1, 'someone')")
        .bind(tenant)
        .execute(&app.db.pool)
        .await
        .unwrap();
    let (ok, stdout, stderr) = run(
        &app.db,
        &["tenant", "export", "--tenant", &tenant.to_string()],
    );
    assert!(!ok, "an export beside an erasure exited 0: {stdout}");
    assert!(stderr.contains("being erased"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_leaves_nothing_of_the_tenant_touches_no_other_and_publishes_nothing() {
    let app = spawn_app_with(&[]).await;
    let (tenant, other) = (Uuid::new_v4(), Uuid::new_v4());
    let token = app.token(tenant);
    orders(&app, &token, 7).await;
    orders(&app, &app.token(other), 4).await;
    // Some of the tenant's events were published already; the rest still wait.
    sqlx::query(
        "UPDATE outbox_event SET status = 'PUBLISHED', published_at = now()
         WHERE tenant_id = $1 AND aggregate_seq = 1",
    )
    .bind(tenant)
    .execute(&app.db.pool)
    .await
    .unwrap();
    assert_eq!(rows_of(&app.db, tenant).await, [7, 10, 10]);
    let others_before = rows_of(&app.db, other).await;
    let other_list = app.get(&app.token(other), "/v1/orders?limit=100").await;

    let (ok, stdout, stderr) = run(
        &app.db,
        &[
            "tenant",
            "erase",
            "--tenant",
            &tenant.to_string(),
            "--batch",
            "3",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "erased tenant {tenant}: 7 orders, 10 idempotency records, 10 events"
        )),
        "{stdout}"
    );
    assert_eq!(rows_of(&app.db, tenant).await, [0, 0, 0]);
    assert_eq!(rows_of(&app.db, other).await, others_before);
    assert_eq!(
        app.get(&app.token(other), "/v1/orders?limit=100")
            .await
            .body,
        other_list.body
    );
    // The tenant's token still works and finds nothing.
    let page = app.get(&token, "/v1/orders").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.json(), serde_json::json!({"items": [], "next": null}));
    // Run again (as after a kill): nothing left to do.
    let (ok, stdout, _) = run(
        &app.db,
        &["tenant", "erase", "--tenant", &tenant.to_string()],
    );
    assert!(ok);
    assert!(
        stdout.starts_with(&format!(
            "erased tenant {tenant}: 0 orders, 0 idempotency records, 0 events"
        )),
        "{stdout}"
    );
}
