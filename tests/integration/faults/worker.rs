//! One Citus worker dies (stopped: every connection to it refused; or silent: its
//! packets dropped, nothing closed) while the other runs. Only the tenants whose shards
//! it holds notice: they get 503 with `Retry-After`, never 500; every other tenant's
//! creates answer and their events are published; the outbox gauges go on reporting
//! the shards they can read and count the others in `outbox_unreadable_shards`. Once
//! the worker is back, the retries succeed and every order's event is published once.
//!
//! The test's database reaches the second worker through a proxy of its own, so the
//! worker dies for this database alone while the suite's other tests use the cluster.
//! It prints the live tenants' create latencies and publish lags before and during each
//! fault (the figures in docs/operations.md come from it).

use std::{
    net::SocketAddr,
    str::FromStr,
    time::{Duration, Instant},
};

use serde_json::Value;
use uuid::Uuid;

use crate::support::{
    ServeProcess, TestDb,
    db::node_address,
    new_key, on_citus, order_body, post_order,
    proxy::{Mode, Proxy},
    sample,
    sns::{Topic, aws_env, moto_endpoint},
};

/// Creates per tenant group and phase.
const CREATES: usize = 24;

/// The port of the node holding `tenant`'s shard, as the coordinator knows it.
async fn node_port_of(db: &TestDb, tenant: Uuid) -> i32 {
    sqlx::query_scalar(
        "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
         WHERE p.shardid = get_shard_id_for_distribution_column('orders', $1)",
    )
    .bind(tenant)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Three tenants whose shards are on the node at `port`, and four on another node.
async fn tenants(db: &TestDb, port: u16) -> (Vec<Uuid>, Vec<Uuid>) {
    let (mut on_it, mut elsewhere) = (Vec::new(), Vec::new());
    while on_it.len() < 3 || elsewhere.len() < 4 {
        let tenant = Uuid::new_v4();
        if node_port_of(db, tenant).await == i32::from(port) {
            if on_it.len() < 3 {
                on_it.push(tenant);
            }
        } else if elsewhere.len() < 4 {
            elsewhere.push(tenant);
        }
    }
    (on_it, elsewhere)
}

/// The status of the event of `order` (routed to the tenant's worker alone).
async fn event_status(db: &TestDb, tenant: Uuid, order: Uuid) -> Option<String> {
    sqlx::query_scalar(
        "SELECT status FROM outbox_event WHERE tenant_id = $1 AND aggregate_id = $2 AND aggregate_seq = 1",
    )
    .bind(tenant)
    .bind(order)
    .fetch_optional(&db.pool)
    .await
    .unwrap()
}

/// Creates for `tenants`, one after another: each answer's status, and for each order
/// created, how long the create took and how long after its answer its event was
/// published.
struct Phase {
    statuses: Vec<u16>,
    took: Vec<Duration>,
    lag: Vec<Duration>,
    orders: Vec<(Uuid, Uuid)>,
}

async fn creates(db: &TestDb, serve: &ServeProcess, tenants: &[Uuid], sku: &str) -> Phase {
    let mut phase = Phase {
        statuses: Vec::new(),
        took: Vec::new(),
        lag: Vec::new(),
        orders: Vec::new(),
    };
    for i in 0..CREATES {
        let tenant = tenants[i % tenants.len()];
        let started = Instant::now();
        let response = post_order(
            &serve.base,
            &serve.token(tenant),
            &new_key(),
            &order_body(sku, 1),
            None,
        )
        .await;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        phase.statuses.push(status);
        if status != 201 {
            continue;
        }
        let answered = Instant::now();
        phase.took.push(answered - started);
        let order = Uuid::parse_str(body["id"].as_str().unwrap()).unwrap();
        phase.orders.push((tenant, order));
        while event_status(db, tenant, order).await.as_deref() != Some("PUBLISHED") {
            assert!(
                answered.elapsed() < Duration::from_secs(120),
                "never published"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        phase.lag.push(answered.elapsed());
    }
    phase
}

/// `orderd <args>` against `db`, run to its end.
fn orderd_command(db: &TestDb, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_DB_STATEMENT_TIMEOUT_MS", "2000")
        .output()
        .unwrap()
}

fn quantile(mut values: Vec<Duration>, q: f64) -> f64 {
    values.sort();
    if values.is_empty() {
        return f64::NAN;
    }
    values[((values.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
}

fn report(what: &str, phase: &Phase) {
    println!(
        "{what}: {} creates, 201 {}, create p50 {:.1} ms p99 {:.1} ms, publish lag p50 {:.1} ms max {:.1} ms",
        phase.statuses.len(),
        phase.statuses.iter().filter(|s| **s == 201).count(),
        quantile(phase.took.clone(), 0.5),
        quantile(phase.took.clone(), 0.99),
        quantile(phase.lag.clone(), 0.5),
        quantile(phase.lag.clone(), 1.0),
    );
}

/// A create of a tenant on the dead worker: 503 `service-unavailable` with
/// `Retry-After`, never 500. Returns the key, for the retry once the worker is back.
async fn refused_while_dead(serve: &ServeProcess, tenant: Uuid) -> String {
    let key = new_key();
    let response = post_order(
        &serve.base,
        &serve.token(tenant),
        &key,
        &order_body("DEAD-1", 1),
        None,
    )
    .await;
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").cloned();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("/service-unavailable")),
        "{body}"
    );
    assert!(retry_after.is_some(), "503 says when to retry");
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_stops_only_its_own_tenants_and_nothing_is_lost_when_it_returns() {
    if !on_citus() {
        return;
    }
    let second = crate::support::db::citus_workers()[1].clone();
    let upstream = SocketAddr::from_str(&node_address(&second)).unwrap();
    let proxy = Proxy::start(upstream).await;
    let through = proxy.address.to_string();
    let db = TestDb::on_citus_reaching(|i, address| {
        if i == 1 {
            through.clone()
        } else {
            address.to_string()
        }
    })
    .await;
    let dead_shards: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)
         JOIN pg_dist_node n USING (groupid)
         WHERE s.logicalrelid = 'outbox_event'::regclass AND n.nodeport = $1",
    )
    .bind(i32::from(proxy.address.port()))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(dead_shards > 0, "the second worker holds shards");
    let (doomed, mut live) = tenants(&db, proxy.address.port()).await;
    // A fourth tenant on the live worker, whose keys expire, for the purge.
    let aged = live.pop().unwrap();

    let topic = Topic::create(false).await;
    let mut env = aws_env(&moto_endpoint());
    env.extend([
        ("ORDERD_RELAY", "on".to_string()),
        ("ORDERD_SNS_TOPIC_ARN", topic.arn.clone()),
        ("ORDERD_DB_STATEMENT_TIMEOUT_MS", "2000".into()),
    ]);
    let serve = ServeProcess::start(&db, &env);

    let before = creates(&db, &serve, &live, "LIVE-BEFORE").await;
    report("before the fault", &before);
    let doomed_before = creates(&db, &serve, &doomed, "DOOMED-BEFORE").await;
    assert!(doomed_before.statuses.iter().all(|s| *s == 201));
    let mut orders: Vec<(Uuid, Uuid)> = before.orders.clone();
    orders.extend(&doomed_before.orders);
    let mut retries = Vec::new();
    let aged_before = creates(&db, &serve, &[aged], "AGED").await;
    assert!(aged_before.statuses.iter().all(|s| *s == 201));
    sqlx::query(
        "UPDATE idempotency_record SET expires_at = '2000-01-01T00:00:00Z' WHERE tenant_id = $1",
    )
    .bind(aged)
    .execute(&db.pool)
    .await
    .unwrap();

    for (fault, mode) in [("stopped", Mode::Refuse), ("silent", Mode::Silent)] {
        proxy.set(mode);
        for &tenant in &doomed {
            retries.push((tenant, refused_while_dead(&serve, tenant).await));
        }
        let during = creates(&db, &serve, &live, &format!("LIVE-{fault}")).await;
        report(&format!("worker {fault}"), &during);
        assert!(
            during.statuses.iter().all(|s| *s == 201),
            "every create of a tenant on the live worker succeeds: {:?}",
            during.statuses
        );
        orders.extend(&during.orders);
        // A refresh that began after the last create was published.
        let metrics = serve
            .metrics_until(|m| {
                sample(m, "outbox_unreadable_shards") == Some(dead_shards as f64)
                    && sample(m, "outbox_pending_events") == Some(0.0)
            })
            .await;
        assert_eq!(
            sample(&metrics, "outbox_unreadable_shards"),
            Some(dead_shards as f64),
            "the gauges count the shards they cannot read"
        );
        assert_eq!(
            sample(&metrics, "outbox_pending_events"),
            Some(0.0),
            "and report the rest: nothing of the live worker's is pending"
        );
        // Reconciliation checks the rest and says it could not check everything; the
        // purge goes on for the rest.
        let reconcile = orderd_command(&db, &["reconcile"]);
        let said = String::from_utf8_lossy(&reconcile.stdout).to_string();
        assert_eq!(reconcile.status.code(), Some(1), "{said}");
        assert!(
            said.contains(&format!("unreadable shards: {dead_shards}")),
            "{said}"
        );
        let purge = orderd_command(&db, &["purge"]);
        assert!(purge.status.success(), "{purge:?}");
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency_record WHERE tenant_id = $1")
                .bind(aged)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(left, 0, "the live worker's expired keys are purged");
        proxy.set(Mode::Forward);
        serve
            .metrics_until(|m| sample(m, "outbox_unreadable_shards") == Some(0.0))
            .await;
    }

    // Back: each refused create, retried with its key, makes its order.
    for (tenant, key) in &retries {
        let response = post_order(
            &serve.base,
            &serve.token(*tenant),
            key,
            &order_body("DEAD-1", 1),
            None,
        )
        .await;
        assert!(
            matches!(response.status().as_u16(), 200 | 201),
            "{}",
            response.status()
        );
        let body: Value = response.json().await.unwrap();
        orders.push((
            *tenant,
            Uuid::parse_str(body["id"].as_str().unwrap()).unwrap(),
        ));
    }
    for (tenant, order) in &orders {
        let started = Instant::now();
        while event_status(&db, *tenant, *order).await.as_deref() != Some("PUBLISHED") {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "never published"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The aged tenant's orders, whose keys were purged, published their events too.
    let events = orders.len() + aged_before.orders.len();
    let received = topic.collect(events).await;
    let mut ids: Vec<String> = received.iter().map(|r| r.event_id()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), events, "every order's event reached the bus");
    let keys: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_record WHERE tenant_id = ANY ($1)")
            .bind(doomed.iter().chain(&live).copied().collect::<Vec<_>>())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let made: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE tenant_id = ANY ($1)")
        .bind(doomed.iter().chain(&live).copied().collect::<Vec<_>>())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let records: Vec<(Uuid, String, String, Option<i32>)> = sqlx::query_as(
        "SELECT tenant_id, idem_key, state, response_status::int FROM idempotency_record
         WHERE tenant_id = ANY ($1) AND (state <> 'COMPLETED' OR response_status <> 201)",
    )
    .bind(doomed.iter().chain(&live).copied().collect::<Vec<_>>())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        records.is_empty(),
        "every key completed with its 201, no claim left behind: {records:?}"
    );
    assert_eq!(
        made as usize,
        orders.len(),
        "one order per key, none doubled"
    );
    assert_eq!(keys, made, "every key made exactly one order");
}
