//! orderd on Citus (docs/contract.md §11, docs/scaling.md): the same migrations
//! distribute the three tables of tenant data by `tenant_id`, co-located, on a Citus
//! coordinator, and change nothing on plain PostgreSQL. On Citus a tenant's order, event
//! and stored answer live in shards on one worker, and the write and replay statements
//! are routed to that worker alone.
//!
//! `.ci/test` runs the suite once on plain PostgreSQL and runs this file (with the
//! idempotency, outbox and lifecycle tests) once more against a local Citus cluster.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, atomic::AtomicBool, atomic::Ordering},
    time::{Duration, Instant},
};

use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::support::{
    TestDb, db::other_worker, new_key, on_citus, order_body, sns::Topic, spawn_app,
    spawn_publishing_app_on, token,
};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_hash_is_the_servers_and_falls_in_the_range_of_the_tenants_shard() {
    let db = TestDb::new().await;
    let tenants: Vec<Uuid> = (0..2_000)
        .map(|_| Uuid::new_v4())
        .chain([Uuid::nil(), Uuid::max(), Uuid::from_u128(1)])
        .collect();
    let server: Vec<(Uuid, i32)> =
        sqlx::query_as("SELECT t, uuid_hash(t) FROM unnest($1::uuid[]) AS t")
            .bind(&tenants)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(server.len(), tenants.len());
    for (tenant, hash) in &server {
        assert_eq!(orderd::db::tenant_hash(*tenant), *hash, "{tenant}");
    }
    if on_citus() {
        // Each shard holds a contiguous range of the hash: tenants ordered by it are
        // ordered by shard.
        let outside: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::uuid[], $2::int[]) AS t(tenant, hash)
             JOIN pg_dist_shard s
               ON s.shardid = get_shard_id_for_distribution_column('outbox_event', t.tenant)
             WHERE t.hash NOT BETWEEN s.shardminvalue::int AND s.shardmaxvalue::int",
        )
        .bind(&tenants)
        .bind(
            tenants
                .iter()
                .map(|t| orderd::db::tenant_hash(*t))
                .collect::<Vec<_>>(),
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(outside, 0);
    }
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
    let mut by_worker: BTreeMap<(String, i32), Vec<Uuid>> = Default::default();
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
    // Citus records each two-phase commit it makes until its recovery (every minute)
    // has seen it through.
    let two_phase = "SELECT count(*) FROM pg_dist_transaction";
    let committed_in_two_phases: i64 = sqlx::query_scalar(two_phase)
        .fetch_one(&mut conn)
        .await
        .unwrap();
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
    // No create or cancel above needed a two-phase commit: each committed on its
    // tenant's worker alone.
    let after: i64 = sqlx::query_scalar(two_phase)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(
        after <= committed_in_two_phases,
        "{} two-phase commits",
        after - committed_in_two_phases
    );
}

/// One client request as the load below saw it: when it started (from the load's
/// start), how long it took, and how it was answered.
#[derive(Debug, Clone, Copy)]
struct Seen {
    at: Duration,
    took: Duration,
    status: u16,
}

/// A create as a well-behaved client sends it: a 503 or a 409 (both carrying
/// `Retry-After`, the only failures the contract allows here) is retried after the time
/// the header asks for; any other answer is final. Every attempt is recorded.
async fn create_as_a_client(
    app: &crate::support::TestApp,
    token: &str,
    key: &str,
    body: &serde_json::Value,
    start: Instant,
    seen: &std::sync::Mutex<Vec<Seen>>,
) -> crate::support::Reply {
    loop {
        let sent = Instant::now();
        let reply = app.create(token, key, body).await;
        seen.lock().unwrap().push(Seen {
            at: sent - start,
            took: sent.elapsed(),
            status: reply.status,
        });
        if reply.status != 503 && reply.status != 409 {
            return reply;
        }
        let wait: u64 = reply
            .header("retry-after")
            .unwrap_or_else(|| panic!("{} without Retry-After", reply.status))
            .parse()
            .expect("Retry-After in seconds");
        tokio::time::sleep(Duration::from_secs(wait)).await;
    }
}

/// What `orderd citus <command>` printed (its report, then its warnings), once it
/// exited successfully.
fn orderd_citus(db: &TestDb, command: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(["citus", command])
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "orderd citus {command}: {printed}");
    printed
}

/// The tables orderd's database has distributed (or made reference tables); the
/// extension must be there.
async fn distributed_tables(db: &TestDb) -> BTreeSet<String> {
    sqlx::query_scalar("SELECT logicalrelid::regclass::text FROM pg_dist_partition")
        .fetch_all(&db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Waits until `events` (every event in the database) are marked published, and checks
/// that SNS (moto) received each of them.
async fn every_event_reaches_sns(db: &TestDb, topic: &Topic, events: &[Uuid]) {
    db.until_count(
        "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
        events.len() as i64,
    )
    .await;
    let published: BTreeSet<String> = topic
        .collect(events.len())
        .await
        .iter()
        .map(|m| m.event_id())
        .collect();
    for event in events {
        assert!(
            published.contains(&event.to_string()),
            "event {event} reached SNS"
        );
    }
}

/// An existing deployment moved onto the cluster in place, as the runbook does it: a
/// database migrated before Citus was there holds orders, stored answers and events
/// (some published, some not); the extension is created and the workers registered;
/// `orderd citus distribute` runs while a client keeps creating orders; the processes
/// are restarted. Nothing is lost or doubled, every replay is byte-exact, every event
/// reaches SNS, and the tenants' rows live on the workers. `orderd citus undistribute`
/// then brings it all back, with the single-server trigger, and replays stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orderd_citus_distribute_moves_a_populated_database_in_place_and_undistribute_brings_it_back()
 {
    if !on_citus() {
        return;
    }
    let topic = Topic::create(false).await;
    let handle = TestDb::before_citus().await;
    let before =
        spawn_publishing_app_on(handle.handle().await, &topic.endpoint, &topic.arn, &[]).await;

    // What the deployment held before: three tenants' orders, one cancelled each.
    let tenants: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    let mut answered: Vec<(Uuid, String, serde_json::Value, Vec<u8>)> = Vec::new();
    for tenant in &tenants {
        let token = before.token(*tenant);
        for n in 0..5 {
            let (key, body) = (new_key(), order_body(&format!("BEFORE-{n}"), 1));
            let created = before.create(&token, &key, &body).await;
            assert_eq!(created.status, 201);
            answered.push((*tenant, key, body, created.body));
        }
        let id = serde_json::from_slice::<serde_json::Value>(&answered.last().unwrap().3).unwrap()
            ["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(before.cancel(&token, &new_key(), &id).await.status, 200);
    }
    handle
        .until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            18,
        )
        .await;

    // The operator's preparation, then the command, while a client writes.
    handle.enable_citus().await;
    let (stop, seen) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let before = Arc::new(before);
    let writer = {
        let (app, stop, seen, tenant) = (before.clone(), stop.clone(), seen.clone(), tenants[0]);
        tokio::spawn(async move {
            let (token, start) = (app.token(tenant), Instant::now());
            let mut written = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let (key, body) = (new_key(), order_body("DURING-1", 1));
                let reply = create_as_a_client(&app, &token, &key, &body, start, &seen).await;
                assert_eq!(
                    reply.status,
                    201,
                    "{}",
                    String::from_utf8_lossy(&reply.body)
                );
                written.push((tenant, key, body, reply.body));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            written
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let printed = orderd_citus(&handle, "distribute");
    assert!(printed.contains("distributed in"), "{printed}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    answered.extend(writer.await.unwrap());
    let seen = seen.lock().unwrap().clone();
    let slowest = seen.iter().map(|s| s.took).max().unwrap_or_default();
    let last = seen.iter().map(|s| s.at).max().unwrap_or_default();
    assert!(
        seen.iter().all(|s| [201, 503, 409].contains(&s.status)),
        "only 201, or a 503 or 409 retried: {seen:?}"
    );
    eprintln!(
        "distribute: {} attempts over {last:.2?} while it ran, the slowest {slowest:.2?}",
        seen.len()
    );
    let mut expected: BTreeSet<String> = DISTRIBUTED.map(String::from).into();
    expected.insert("tenant_erasure".into());
    assert_eq!(distributed_tables(&handle).await, expected);
    assert!(
        orderd_citus(&handle, "distribute").contains("already"),
        "a second run finds it done"
    );

    // The restart the runbook asks for: a new process finds the distributed layout.
    drop(Arc::into_inner(before).expect("the writer let go of the app"));
    let after =
        spawn_publishing_app_on(handle.handle().await, &topic.endpoint, &topic.arn, &[]).await;
    for (tenant, key, body, first) in &answered {
        let again = after.create(&after.token(*tenant), key, body).await;
        assert_eq!((again.status, &again.body), (201, first), "replay of {key}");
    }
    let token = after.token(tenants[1]);
    let created = after
        .create(&token, &new_key(), &order_body("AFTER-1", 1))
        .await;
    assert_eq!(created.status, 201);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&handle.pool)
        .await
        .unwrap();
    assert_eq!(orders as usize, answered.len() + 1, "one order per key");
    let events: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox_event")
        .fetch_all(&handle.pool)
        .await
        .unwrap();
    assert_eq!(events.len(), answered.len() + 1 + tenants.len());
    every_event_reaches_sns(&handle, &topic, &events).await;
    let mut conn = PgConnection::connect(&handle.url).await.unwrap();
    let coordinator = sqlx::query_scalar::<_, i32>("SELECT inet_server_port()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    for tenant in &tenants {
        let (_, _, port) = placement(&mut conn, "orders", *tenant).await;
        assert_ne!(port, coordinator, "{tenant} lives on a worker");
    }

    // The rollback.
    drop(after);
    let printed = orderd_citus(&handle, "undistribute");
    assert!(printed.contains("back on the coordinator"), "{printed}");
    assert!(distributed_tables(&handle).await.is_empty());
    let trigger: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify')",
    )
    .fetch_one(&handle.pool)
    .await
    .unwrap();
    assert!(trigger, "the single-server wake-up trigger is back");
    let back = crate::support::spawn_app_on(handle.handle().await, &[]).await;
    for (tenant, key, body, first) in &answered {
        let again = back.create(&back.token(*tenant), key, body).await;
        assert_eq!((again.status, &again.body), (201, first), "replay of {key}");
    }
    assert_eq!(back.db.count("orders").await as usize, answered.len() + 1);
}

/// The `q` quantile (0 to 1) of `took`, or zero when there is none.
fn quantile(took: &mut [Duration], q: f64) -> Duration {
    if took.is_empty() {
        return Duration::ZERO;
    }
    took.sort();
    took[((took.len() - 1) as f64 * q).round() as usize]
}

/// A busy tenant moved to the other worker while it writes and replays, as the runbook in
/// docs/scaling.md does it: its rows of the three co-located tables are isolated into
/// shards of their own (`isolate_tenant_to_new_shard ... CASCADE`, writes held back for
/// the copy: the split's logical mode never finishes under writes on Citus 13.2), and
/// those shards are moved by logical replication (`citus_move_shard_placement`,
/// `force_logical`). Two
/// clients keep creating orders and replaying earlier keys of the tenant throughout, at
/// a steady pace, each a well-behaved client (a 503 or 409 is retried after its
/// `Retry-After`). Afterwards: every attempt was answered 201, or 503/409 and retried;
/// one order and one event per key; every replay, during and after, byte-exact; every
/// event published and received by SNS; the tenant's rows on the other worker. It prints
/// how long each step took and how the requests during the move were answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_tenant_is_moved_to_the_other_worker_under_load_and_nothing_is_lost_doubled_or_changed()
 {
    if !on_citus() {
        return;
    }
    let topic = Topic::create(false).await;
    let db = TestDb::new().await;
    let mut admin = PgConnection::connect(&db.url).await.unwrap();
    // A move names its replication slots after an operation id drawn from a sequence of
    // the database, while slots belong to the whole server: test databases side by side
    // on one cluster would draw the same ids. Start this database's sequence apart.
    sqlx::query("SELECT setval('pg_catalog.pg_dist_operationid_seq', $1)")
        .bind(1 + (rand::random::<u32>() as i64) * 1_000)
        .execute(&mut admin)
        .await
        .unwrap();
    let app = Arc::new(
        spawn_publishing_app_on(db.handle().await, &topic.endpoint, &topic.arn, &[]).await,
    );
    let busy = Uuid::new_v4();

    // The tenant's history before the move.
    let mut answered: Vec<(String, serde_json::Value, Vec<u8>)> = Vec::new();
    for n in 0..20 {
        let (key, body) = (new_key(), order_body(&format!("BEFORE-{n}"), 1));
        let created = app
            .create(&token(busy, "orders:read orders:write"), &key, &body)
            .await;
        assert_eq!(created.status, 201);
        answered.push((key, body, created.body));
    }
    let history = Arc::new(Mutex::new(answered));

    // Two clients at a steady pace: two requests in three create an order under a new
    // key, the third replays one of the tenant's earlier keys and must get its bytes.
    let (stop, seen) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(Mutex::new(Vec::new())),
    );
    let start = Instant::now();
    let clients: Vec<_> = (0..2)
        .map(|client| {
            let (app, stop, seen, history) =
                (app.clone(), stop.clone(), seen.clone(), history.clone());
            tokio::spawn(async move {
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    // A fresh token for each request, as a client refreshes it.
                    let bearer = token(busy, "orders:read orders:write");
                    let earlier = n.is_multiple_of(3).then(|| {
                        let history = history.lock().unwrap();
                        history[(n * 7 + client) % history.len()].clone()
                    });
                    let (key, body) = match &earlier {
                        Some((key, body, _)) => (key.clone(), body.clone()),
                        None => (new_key(), order_body(&format!("DURING-{client}"), 1)),
                    };
                    let reply = create_as_a_client(&app, &bearer, &key, &body, start, &seen).await;
                    assert_eq!(
                        reply.status,
                        201,
                        "{}",
                        String::from_utf8_lossy(&reply.body)
                    );
                    match earlier {
                        Some((key, _, first)) => {
                            assert_eq!(reply.body, first, "replay of {key} during the move")
                        }
                        None => history.lock().unwrap().push((key, body, reply.body)),
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The move, as the runbook does it.
    let began = start.elapsed();
    let (from_shard, from_host, from_port) = placement(&mut admin, "orders", busy).await;
    let shard: i64 = sqlx::query_scalar(
        "SELECT isolate_tenant_to_new_shard('orders', $1, 'CASCADE',
                                            shard_transfer_mode => 'block_writes')",
    )
    .bind(busy)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    let isolated = start.elapsed() - began;
    let (now_shard, host, port) = placement(&mut admin, "orders", busy).await;
    assert_eq!((now_shard, &host, port), (shard, &from_host, from_port));
    assert_ne!(shard, from_shard, "the tenant has a shard of its own");
    let (to_host, to_port) = other_worker(&mut admin, &host, port).await;
    sqlx::query(
        "SELECT citus_move_shard_placement($1, $2, $3, $4, $5,
                                           shard_transfer_mode => 'force_logical')",
    )
    .bind(shard)
    .bind(&host)
    .bind(port)
    .bind(&to_host)
    .bind(to_port)
    .execute(&mut admin)
    .await
    .unwrap();
    let ended = start.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|s| [201, 503, 409].contains(&s.status)),
        "only 201, or a 503 or 409 retried: {seen:?}"
    );
    let during: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.at + s.took >= began && s.at <= ended)
        .collect();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for s in &during {
        *by_status.entry(s.status).or_default() += 1;
    }
    let mut took: Vec<Duration> = during.iter().map(|s| s.took).collect();
    let (p50, p99) = (quantile(&mut took, 0.5), quantile(&mut took, 0.99));
    let mut outside: Vec<Duration> = seen
        .iter()
        .filter(|s| !(s.at + s.took >= began && s.at <= ended))
        .map(|s| s.took)
        .collect();
    eprintln!(
        "shard move under load: isolate {isolated:.2?}, move {:.2?}, {} attempts during it \
         by status {by_status:?}, p50 {p50:.2?}, p99 {p99:.2?}, slowest {:.2?}; \
         before and after it p99 {:.2?}",
        ended - began - isolated,
        during.len(),
        took.last().copied().unwrap_or_default(),
        quantile(&mut outside, 0.99),
    );

    // Where the tenant lives now: all three tables, on the other worker.
    for table in DISTRIBUTED {
        let (_, host, port) = placement(&mut admin, table, busy).await;
        assert_eq!((host, port), (to_host.clone(), to_port), "{table} moved");
    }
    // One order and one event per key; every replay byte-exact; every event on SNS.
    let history = history.lock().unwrap().clone();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE tenant_id = $1")
        .bind(busy)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(orders as usize, history.len(), "one order per key");
    for (key, body, first) in &history {
        let again = app
            .create(&token(busy, "orders:read orders:write"), key, body)
            .await;
        assert_eq!((again.status, &again.body), (201, first), "replay of {key}");
    }
    let events: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox_event WHERE tenant_id = $1")
            .bind(busy)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(events.len(), history.len(), "one event per order");
    every_event_reaches_sns(&db, &topic, &events).await;
}

/// `orderd citus distribute` cancelled to break a deadlock with a writer runs its
/// transaction again and completes. The writer is this test's own transaction: it
/// updates an order (so the distribution, once it made the erasure marks a reference
/// table, waits for `orders`), then writes an erasure mark (so it waits for the
/// distribution): a cycle. The distribution, waiting longer, is the one PostgreSQL
/// cancels; the writer's statement then goes through, its transaction ends, and the
/// second run of the steps finds nothing in its way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderd_citus_distribute_cancelled_to_break_a_deadlock_runs_again_and_completes() {
    if !on_citus() {
        return;
    }
    let handle = TestDb::before_citus().await;
    let (tenant, order) = (Uuid::new_v4(), Uuid::new_v4());
    sqlx::query(
        "INSERT INTO orders (tenant_id, id, sku, quantity, status, created_at, updated_at)
         VALUES ($1, $2, 'DEADLOCK-1', 1, 'CREATED', now(), now())",
    )
    .bind(tenant)
    .bind(order)
    .execute(&handle.pool)
    .await
    .unwrap();
    handle.enable_citus().await;

    let mut writer = handle.pool.begin().await.unwrap();
    sqlx::query("UPDATE orders SET version = version WHERE tenant_id = $1 AND id = $2")
        .bind(tenant)
        .bind(order)
        .execute(&mut *writer)
        .await
        .unwrap();
    let distributing = {
        let db = handle.handle().await;
        tokio::task::spawn_blocking(move || orderd_citus(&db, "distribute"))
    };
    handle
        .until_count(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE 'SELECT create_distributed_table(''orders''%'",
            1,
        )
        .await;
    sqlx::query("INSERT INTO tenant_erasure (tenant_id, actor) VALUES ($1, 'test')")
        .bind(Uuid::new_v4())
        .execute(&mut *writer)
        .await
        .expect("the writer goes through once the distribution is cancelled");
    writer.rollback().await.unwrap();

    let printed = distributing.await.unwrap();
    assert!(printed.contains("running the steps again"), "{printed}");
    assert!(printed.contains("distributed in"), "{printed}");
    let mut expected: BTreeSet<String> = DISTRIBUTED.map(String::from).into();
    expected.insert("tenant_erasure".into());
    assert_eq!(distributed_tables(&handle).await, expected);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&handle.pool)
        .await
        .unwrap();
    assert_eq!(orders, 1, "the order is still there, once");
}
