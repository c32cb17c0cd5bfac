//! A tenant's erasure is final (`orderd tenant erase`, through the real binary): while
//! it runs the tenant's writes are refused in every process before any idempotency
//! lookup (REST and MCP, replays from memory included) and nothing of them is stored;
//! it exits 0 only when no row of the tenant is left in any table, and no event of the
//! tenant reaches the bus after it exits, even with a relay publishing the tenant's
//! backlog while it runs. The refusal is kept in the database: it survives a killed
//! erase, holds in a process started meanwhile, and ends when a re-run completes.

use std::{
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{
    KillOnDrop, TestApp, TestDb, new_key, order_body,
    sns::{Received, Topic, moto_endpoint},
    spawn_app_on, spawn_publishing_app_on,
};

const BIN: &str = env!("CARGO_BIN_EXE_orderd");

/// `orderd tenant erase` on `db` with `args`, its publish timeout at `publish_ms` (the
/// relays' lease it waits out follows from it).
fn erase(db: &TestDb, tenant: Uuid, args: &[&str], publish_ms: &str) -> Command {
    let mut command = Command::new(BIN);
    command
        .args([
            "tenant",
            "erase",
            "--tenant",
            &tenant.to_string(),
            "--actor",
            "test-operator",
        ])
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", publish_ms);
    command
}

/// Rows of `tenant` in `orders`, `idempotency_record` and `outbox_event`.
async fn rows_of(db: &TestDb, tenant: Uuid) -> [i64; 3] {
    let counts: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orders WHERE tenant_id = $1),
                (SELECT count(*) FROM idempotency_record WHERE tenant_id = $1),
                (SELECT count(*) FROM outbox_event WHERE tenant_id = $1)",
    )
    .bind(tenant)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    [counts.0, counts.1, counts.2]
}

/// A create over MCP (`create_order`), as one stateless JSON-RPC request: the tool
/// result.
async fn mcp_create(app: &TestApp, token: &str, request_id: &str) -> Value {
    let call = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "create_order",
                   "arguments": {"requestId": request_id, "sku": "MCP-1", "quantity": 1}},
    });
    let response = crate::support::post_mcp(&app.base, token, &call).await;
    assert_eq!(response.status(), 200);
    response.json::<Value>().await.unwrap()["result"].clone()
}

/// The problem object of a refused tool call.
fn tool_problem(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
}

fn millis_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_racing_a_writer_and_a_publishing_relay_leaves_nothing_and_nothing_reaches_the_bus_after()
 {
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    let (tenant, other) = (Uuid::new_v4(), Uuid::new_v4());
    // The relay publishes with a 1 s timeout: its claims last 2.5 s.
    let app = spawn_publishing_app_on(
        db.handle().await,
        &moto_endpoint(),
        &topic.arn,
        &[
            ("ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", "1000"),
            ("ORDERD_OUTBOX_BATCH_SIZE", "50"),
        ],
    )
    .await;
    let token = app.token(tenant);
    let other_token = app.token(other);
    for i in 0..3 {
        assert_eq!(
            app.create(&other_token, &new_key(), &order_body("OTHER", i + 1))
                .await
                .status,
            201
        );
    }
    // A backlog the relay is publishing while the erasure runs.
    db.backlog(tenant, 1500).await;

    // The tenant keeps writing, one create every 20 ms, until told to stop.
    let statuses = Arc::new(Mutex::new(Vec::<(u16, Value)>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (base, token, statuses, stop) = (
            app.base.clone(),
            token.clone(),
            statuses.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.is_cancelled() {
                n += 1;
                let response = crate::support::post_order(
                    &base,
                    &token,
                    &new_key(),
                    &order_body("RACE", n),
                    None,
                )
                .await;
                let status = response.status().as_u16();
                let retry_after = response.headers().get("retry-after").is_some();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status == 409 {
                    assert!(retry_after, "a refusal says when to retry");
                }
                statuses.lock().unwrap().push((status, body));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = erase(
        &db,
        tenant,
        &["--batch", "200", "--rows-per-sec", "20000"],
        "1000",
    )
    .output()
    .unwrap();
    let exited_at = millis_now();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("no row of the tenant is left"), "{stdout}");
    stop.cancel();
    writer.await.unwrap();
    let statuses = statuses.lock().unwrap().clone();
    let last_refusal = statuses
        .iter()
        .rposition(|(s, _)| *s == 409)
        .unwrap_or_else(|| {
            panic!(
                "no write met the erasure: {:?}",
                statuses.iter().map(|s| s.0).collect::<Vec<_>>()
            )
        });
    for (status, body) in &statuses {
        match status {
            201 => {}
            409 => assert_eq!(body["type"], "/problems/tenant-erasure-in-progress"),
            other => panic!("a write answered {other}: {body}"),
        }
    }
    // The writer writes one at a time: the creates answered after the last refusal
    // came after the erasure ended, and are the tenant's new data. Everything before
    // them is gone.
    let after: std::collections::BTreeSet<String> = statuses[last_refusal + 1..]
        .iter()
        .map(|(_, body)| body["id"].as_str().unwrap().to_string())
        .collect();
    let n = after.len() as i64;
    let survivors = async || -> std::collections::BTreeSet<String> {
        sqlx::query_scalar::<_, Uuid>("SELECT id FROM orders WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .into_iter()
            .map(|id| id.to_string())
            .collect()
    };
    assert_eq!(survivors().await, after);
    assert_eq!(rows_of(&db, tenant).await, [n, n, n]);
    // And again once every relay's claim on a deleted event has passed.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(survivors().await, after);
    assert_eq!(rows_of(&db, tenant).await, [n, n, n]);
    // The bus: no event of an erased order was published after the erase exited.
    let received = topic.drain().await;
    let late: Vec<&Received> = received
        .iter()
        .filter(|m| m.attribute("tenant_id") == Some(tenant.to_string().as_str()))
        .filter(|m| !after.contains(m.attribute("aggregate_id").unwrap()))
        .filter(|m| {
            m.system["SentTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<u128>().ok())
                .unwrap()
                > exited_at
        })
        .collect();
    assert!(
        late.is_empty(),
        "{} events of the erased orders published after the erase exited",
        late.len()
    );
    // The other tenant is untouched; the erased tenant's token works again.
    assert_eq!(rows_of(&db, other).await, [3, 3, 3]);
    assert_eq!(
        app.create(&token, &new_key(), &order_body("AFTER", 1))
            .await
            .status,
        201
    );
    let marks: i64 = sqlx::query_scalar("SELECT count(*) FROM tenant_erasure")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(marks, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refusal_survives_a_killed_erase_holds_in_every_process_and_ends_when_a_rerun_completes()
 {
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let app = spawn_app_on(db.handle().await, &[]).await;
    let token = app.token(tenant);
    // A key answered and replayed once, so that the process holds its answer in memory.
    let (key, body) = (new_key(), order_body("CACHED", 1));
    let first = app.create(&token, &key, &body).await;
    assert_eq!(first.status, 201);
    assert_eq!(app.create(&token, &key, &body).await.body, first.body);
    db.backlog(tenant, 2000).await;

    // Slow on purpose, then killed midway.
    let killed = KillOnDrop(
        erase(
            &db,
            tenant,
            &["--batch", "100", "--rows-per-sec", "500"],
            "1000",
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap(),
    );
    db.until_count("SELECT least(count(*), 1) FROM tenant_erasure", 1)
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    drop(killed);
    let [orders, ..] = rows_of(&db, tenant).await;
    assert!(orders > 0, "the kill came before the end");

    // The mark stands: every write is refused before any lookup, the cached replay
    // too, over REST and MCP, and nothing is stored.
    let until_refused = async {
        for _ in 0..100 {
            if app.create(&token, &key, &body).await.status == 409 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the process never heard of the erasure");
    };
    until_refused.await;
    let before = rows_of(&db, tenant).await;
    let replay = app.create(&token, &key, &body).await;
    replay.assert_problem(409, "tenant-erasure-in-progress");
    assert!(replay.header("retry-after").is_some());
    app.create(&token, &new_key(), &body)
        .await
        .assert_problem(409, "tenant-erasure-in-progress");
    let id = first.json()["id"].as_str().unwrap().to_string();
    app.cancel(&token, &new_key(), &id)
        .await
        .assert_problem(409, "tenant-erasure-in-progress");
    let refused =
        tool_problem(&mcp_create(&app, &token, &format!("mcp-{}", Uuid::new_v4().simple())).await);
    assert_eq!(refused["type"], "/problems/tenant-erasure-in-progress");
    // Reads find what is left.
    assert_eq!(app.get(&token, "/v1/orders?limit=1").await.status, 200);
    // A process started meanwhile refuses as well, from its first request.
    let late = spawn_app_on(db.handle().await, &[]).await;
    late.create(&token, &new_key(), &body)
        .await
        .assert_problem(409, "tenant-erasure-in-progress");
    assert_eq!(
        rows_of(&db, tenant).await,
        before,
        "nothing was stored for the refusals"
    );
    // Another tenant writes as ever.
    assert_eq!(
        app.create(&app.token(Uuid::new_v4()), &new_key(), &body)
            .await
            .status,
        201
    );

    // Run again: it resumes, finishes, and the refusal ends in every process.
    let out = erase(&db, tenant, &[], "1000").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rows_of(&db, tenant).await, [0, 0, 0]);
    for process in [&app, &late] {
        let mut status = 0;
        for _ in 0..100 {
            status = process.create(&token, &key, &body).await.status;
            if status == 201 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The key is new again: its old answer went with the erasure, memory included.
        assert_eq!(status, 201);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_asked_is_the_rate_done_whatever_the_batch() {
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    db.backlog(tenant, 200).await; // 600 rows
    let started = std::time::Instant::now();
    let out = erase(
        &db,
        tenant,
        &["--batch", "1000", "--rows-per-sec", "300"],
        "1000",
    )
    .output()
    .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // 600 rows at 300 a second cannot take less than two seconds.
    assert!(
        elapsed >= Duration::from_millis(1900),
        "{elapsed:?}: {stdout}"
    );
    let rate: f64 = stdout
        .split("deleting at ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(rate <= 300.0, "{rate} rows/s done for 300 asked: {stdout}");
    assert_eq!(rows_of(&db, tenant).await, [0, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_gives_up_on_a_transaction_left_open_and_a_rerun_completes_once_it_ends() {
    // On Citus the erasure waits for the cluster's distributed transactions, which a
    // plain session on the coordinator does not start; the bound is the same code.
    if crate::support::on_citus() {
        return;
    }
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    db.backlog(tenant, 10).await;
    // A console left in a transaction that has written something.
    let mut console = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    sqlx::Executor::execute(&mut console, "BEGIN")
        .await
        .unwrap();
    sqlx::Executor::execute(&mut console, "SELECT pg_current_xact_id()")
        .await
        .unwrap();
    let stopped = erase(&db, tenant, &["--wait-secs", "1"], "1000")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(!stopped.status.success(), "{stderr}");
    assert!(stderr.contains("still running"), "{stderr}");
    assert_eq!(rows_of(&db, tenant).await, [10, 10, 10], "nothing deleted");
    let marked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tenant_erasure WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(marked, 1, "the tenant stays refused");

    sqlx::Executor::execute(&mut console, "ROLLBACK")
        .await
        .unwrap();
    // The rerun waits as long as an operator's would by default: the transactions it
    // waits for are the whole server's, and the tests beside this one (a lock held
    // through a shutdown, a stalled owner) have theirs too.
    let done = erase(&db, tenant, &[], "1000").output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(rows_of(&db, tenant).await, [0, 0, 0]);
}
