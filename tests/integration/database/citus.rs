//! orderd on Citus (docs/contract.md §11, docs/scaling.md): the same migrations
//! distribute the three tables of tenant data by `tenant_id`, co-located, on a Citus
//! coordinator, and change nothing on plain PostgreSQL. On Citus a tenant's order, event
//! and stored answer live in shards on one worker, and the write and replay statements
//! are routed to that worker alone.
//!
//! `.ci/test` runs the suite once on plain PostgreSQL and runs this file (with the
//! idempotency, outbox and lifecycle tests) once more against a local Citus cluster.

use std::collections::BTreeSet;

use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::support::{new_key, on_citus, order_body, spawn_app};

/// The tables orderd distributes, and the one it makes a reference table.
const DISTRIBUTED: [&str; 3] = ["orders", "idempotency_record", "outbox_event"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrations_distribute_on_citus_and_change_nothing_on_plain_postgres() {
    let app = spawn_app().await;
    let citus: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(citus, on_citus());
    let trigger: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify')",
    )
    .fetch_one(&app.db.pool)
    .await
    .unwrap();
    if !citus {
        // Plain PostgreSQL: the relays are still woken by the insert trigger.
        assert!(trigger, "the wake-up trigger stays on plain PostgreSQL");
        return;
    }
    assert!(!trigger, "a distributed table carries no trigger");
    let tables: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT logicalrelid::regclass::text, partmethod::text, colocationid
         FROM pg_dist_partition ORDER BY 1",
    )
    .fetch_all(&app.db.pool)
    .await
    .unwrap();
    let colocation: BTreeSet<i32> = tables
        .iter()
        .filter(|(t, _, _)| DISTRIBUTED.contains(&t.as_str()))
        .map(|(_, method, colocation)| {
            assert_eq!(method, "h", "hash-distributed: {tables:?}");
            *colocation
        })
        .collect();
    assert_eq!(colocation.len(), 1, "co-located: {tables:?}");
    assert!(
        tables
            .iter()
            .any(|(t, method, _)| t == "tenant_erasure" && method == "n"),
        "the erasure marks are a reference table: {tables:?}"
    );
}

/// The worker (host, port) holding the shard of `table` that `tenant` hashes to.
async fn placement(conn: &mut PgConnection, table: &str, tenant: Uuid) -> (i64, String, i32) {
    sqlx::query_as(
        "SELECT s.shardid, p.nodename::text, p.nodeport
         FROM pg_dist_shard s JOIN pg_dist_shard_placement p USING (shardid)
         WHERE s.shardid = get_shard_id_for_distribution_column($1, $2)",
    )
    .bind(table)
    .bind(tenant)
    .fetch_one(conn)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_order_event_and_answer_live_on_one_worker_and_its_statements_route_there() {
    if !on_citus() {
        // Nothing is distributed on plain PostgreSQL (the test above checks that).
        return;
    }
    let app = spawn_app().await;
    let mut conn = PgConnection::connect(&app.db.url).await.unwrap();
    // Three tenants on each worker, chosen by where they hash.
    let mut by_worker: std::collections::BTreeMap<(String, i32), Vec<Uuid>> = Default::default();
    for _ in 0..10_000 {
        if by_worker.len() == 2 && by_worker.values().all(|t| t.len() == 3) {
            break;
        }
        let tenant = Uuid::new_v4();
        let (_, host, port) = placement(&mut conn, "orders", tenant).await;
        let on = by_worker.entry((host, port)).or_default();
        if on.len() < 3 {
            on.push(tenant);
        }
        assert!(by_worker.len() <= 2, "two workers: {by_worker:?}");
    }
    let tenants: Vec<Uuid> = by_worker.values().flatten().copied().collect();
    for tenant in &tenants {
        let token = app.token(*tenant);
        let created = app
            .create(&token, &new_key(), &order_body("CITUS-1", 1))
            .await;
        assert_eq!(created.status, 201);
        let id = created.json()["id"].as_str().unwrap().to_string();
        assert_eq!(app.cancel(&token, &new_key(), &id).await.status, 200);
    }
    let mut workers = BTreeSet::new();
    for tenant in &tenants {
        let mut nodes = BTreeSet::new();
        for table in DISTRIBUTED {
            let (shard, host, port) = placement(&mut conn, table, *tenant).await;
            nodes.insert((host.clone(), port));
            // The rows are in that shard, on that worker.
            let worker_url = format!("postgres://postgres@{host}:{port}/{}", app.db.name);
            let mut worker = PgConnection::connect(&worker_url).await.unwrap();
            let on_worker: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table}_{shard} WHERE tenant_id = $1"
            )))
            .bind(tenant)
            .fetch_one(&mut worker)
            .await
            .unwrap();
            let expected = match table {
                "orders" => 1,
                _ => 2,
            };
            assert_eq!(on_worker, expected, "{table} of {tenant} in shard {shard}");
        }
        assert_eq!(
            nodes.len(),
            1,
            "one worker holds all of {tenant}: {nodes:?}"
        );
        workers.extend(nodes);
    }
    assert_eq!(workers.len(), 2, "the tenants live on both workers");

    // A single-tenant statement is one task on one worker.
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN SELECT state FROM idempotency_record
         WHERE tenant_id = '{}' AND endpoint = 'POST /v1/orders' AND idem_key = 'k'",
        tenants[0]
    )))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(
        plan.iter().any(|line| line.contains("Task Count: 1")),
        "{plan:#?}"
    );
}
