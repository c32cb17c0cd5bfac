//! On Citus each tenant's statements run on the node that holds its shard (decision
//! 171): orderd reads the placements, keeps a pool per node and sends a tenant's
//! transactions there, where through the coordinator each statement would be planned
//! twice and its answer relayed.
//!
//! The relay's rounds do the same with the tenant's events (decision 172): each node's
//! part of a round (the claim, the park, the mark) runs on that node.
//!
//! After a shard moves, the routes follow it: polled, the writes in between forwarded.
//!
//! The proof is read on the node itself: a statement trigger of the test's own on the
//! tenant's shard of a table notes the `application_name` of each session that writes
//! it. A statement the coordinator forwards arrives on a session Citus names
//! `citus_internal …`; a routed one on orderd's own connection.

use std::str::FromStr;

use sqlx::{Connection, PgConnection, postgres::PgConnectOptions};
use uuid::Uuid;

use crate::support::{
    TestDb, citus_workers,
    db::other_worker,
    new_key, on_citus, order_body,
    sns::{Topic, moto_endpoint},
    spawn_app_on, spawn_publishing_app_on,
};

/// The name of `tenant`'s shard of `table` and the port of its node.
async fn shard_of(db: &TestDb, table: &str, tenant: Uuid) -> (String, i32) {
    sqlx::query_as(
        "SELECT shard_name($1::regclass, p.shardid)::text, n.nodeport
         FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
         WHERE p.shardid = get_shard_id_for_distribution_column($1::regclass, $2)",
    )
    .bind(table)
    .bind(tenant)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// A session on the test's database on the worker at `port`.
async fn on_worker(db: &TestDb, port: i32) -> PgConnection {
    let admin = citus_workers()
        .into_iter()
        .find(|w| PgConnectOptions::from_str(w).unwrap().get_port() == u16::try_from(port).unwrap())
        .expect("the node is one of the workers");
    let options = PgConnectOptions::from_str(&admin)
        .unwrap()
        .database(&db.name);
    PgConnection::connect_with(&options).await.unwrap()
}

/// Notes who writes `shard`, on its node: local objects of the node, which Citus must
/// not send on.
async fn note_writers(node: &mut PgConnection, shard: &str) {
    let statements = [
        "SET citus.enable_ddl_propagation TO off".to_string(),
        "CREATE TABLE written_by (app text NOT NULL)".to_string(),
        "CREATE FUNCTION note_writer() RETURNS trigger LANGUAGE plpgsql AS $f$
         BEGIN INSERT INTO written_by VALUES (current_setting('application_name')); RETURN NULL; END $f$"
            .to_string(),
        format!(
            "CREATE TRIGGER note_writer AFTER INSERT OR UPDATE ON {shard}
             FOR EACH STATEMENT EXECUTE FUNCTION note_writer()"
        ),
    ];
    for statement in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *node)
            .await
            .unwrap();
    }
}

/// A new database, a tenant, and a session on the node that holds the tenant's shard of
/// `table`, noting who writes it; none on one server (nothing to route to).
async fn watched(table: &str) -> Option<(TestDb, Uuid, PgConnection)> {
    if !on_citus() {
        eprintln!("Citus only: one server has no nodes to route to");
        return None;
    }
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let (shard, port) = shard_of(&db, table, tenant).await;
    let mut node = on_worker(&db, port).await;
    note_writers(&mut node, &shard).await;
    Some((db, tenant, node))
}

/// The sessions that wrote the shard since the last look, and forgets them.
async fn writers(node: &mut PgConnection) -> Vec<String> {
    sqlx::query_scalar("DELETE FROM written_by RETURNING app")
        .fetch_all(&mut *node)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_writes_run_on_the_node_that_holds_its_shard_unless_routing_is_off() {
    let Some((db, tenant, mut node)) = watched("orders").await else {
        return;
    };

    let app = spawn_app_on(db.handle().await, &[]).await;
    let token = app.token(tenant);
    for _ in 0..5 {
        let created = app
            .create(&token, &new_key(), &order_body("SKU-ROUTED", 1))
            .await;
        assert_eq!(created.status, 201, "{created:?}");
        let id = created.json()["id"].as_str().unwrap().to_string();
        let cancelled = app.cancel(&token, &new_key(), &id).await;
        assert_eq!(cancelled.status, 200, "{cancelled:?}");
        let read = app.get(&token, &format!("/v1/orders/{id}")).await;
        assert_eq!(read.status, 200, "{read:?}");
    }
    let routed = writers(&mut node).await;
    assert_eq!(
        routed.len(),
        10,
        "five creates and five cancels: {routed:?}"
    );
    assert!(
        routed.iter().all(|app| !app.starts_with("citus_internal")),
        "every write ran on orderd's own session on the node: {routed:?}"
    );
    drop(app);

    // The same with routing off: every write reaches the node through the coordinator,
    // so the note above tells the two apart.
    let app = spawn_app_on(db.handle().await, &[("ORDERD_CITUS_ROUTING", "off")]).await;
    let token = app.token(tenant);
    let created = app
        .create(&token, &new_key(), &order_body("SKU-FORWARDED", 1))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let forwarded = writers(&mut node).await;
    assert!(
        !forwarded.is_empty()
            && forwarded
                .iter()
                .all(|app| app.starts_with("citus_internal")),
        "through the coordinator: {forwarded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_claims_and_marks_a_tenant_s_events_on_the_node_that_holds_its_shard() {
    let Some((db, tenant, mut node)) = watched("outbox_event").await else {
        return;
    };

    let topic = Topic::create(false).await;
    let app = spawn_publishing_app_on(db.handle().await, &moto_endpoint(), &topic.arn, &[]).await;
    let token = app.token(tenant);
    for _ in 0..3 {
        let created = app
            .create(&token, &new_key(), &order_body("SKU-RELAYED", 1))
            .await;
        assert_eq!(created.status, 201, "{created:?}");
    }
    assert_eq!(topic.collect(3).await.len(), 3);
    db.until_count(
        "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
        3,
    )
    .await;
    let writers = writers(&mut node).await;
    // The writers' inserts, then at least one claim and one mark.
    assert!(
        writers.len() >= 5,
        "three inserts, a claim and a mark at least: {writers:?}"
    );
    assert!(
        writers.iter().all(|app| !app.starts_with("citus_internal")),
        "the relay's statements ran on its own sessions on the node: {writers:?}"
    );
}

/// A tenant's shard moved to the other worker while orderd serves it: the writes that
/// reach the old node before orderd reads the new placement are forwarded by Citus
/// (`citus_internal` on the new node) and succeed; then orderd's routes follow (it polls
/// a checksum of the placements every second) and the tenant's writes arrive on the new
/// node on orderd's own sessions. Every create answers 201, one order per create. It
/// prints how long after the move's end the routes followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_tenant_s_shard_moves_its_writes_follow_it_to_the_new_node() {
    if !on_citus() {
        eprintln!("Citus only: one server has no nodes to route to");
        return;
    }
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let app = spawn_app_on(db.handle().await, &[]).await;
    let token = app.token(tenant);
    let mut created = 0;
    let mut create = async || {
        let reply = app
            .create(&token, &new_key(), &order_body("SKU-MOVED", 1))
            .await;
        assert_eq!(reply.status, 201, "{reply:?}");
        created += 1;
    };
    create().await;

    // The tenant's rows in shards of their own (writes held back for the copy), moved
    // to the other worker.
    let shard: i64 = sqlx::query_scalar(
        "SELECT isolate_tenant_to_new_shard('orders', $1, 'CASCADE',
                                            shard_transfer_mode => 'block_writes')",
    )
    .bind(tenant)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let (from_host, from_port): (String, i32) = sqlx::query_as(
        "SELECT nodename::text, nodeport FROM pg_dist_shard_placement WHERE shardid = $1",
    )
    .bind(shard)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let (to_host, to_port) = other_worker(&db.pool, &from_host, from_port).await;
    create().await;
    sqlx::query(
        "SELECT citus_move_shard_placement($1, $2, $3, $4, $5,
                                           shard_transfer_mode => 'block_writes')",
    )
    .bind(shard)
    .bind(&from_host)
    .bind(from_port)
    .bind(&to_host)
    .bind(to_port)
    .execute(&db.pool)
    .await
    .unwrap();
    let moved = std::time::Instant::now();
    let (name, port) = shard_of(&db, "orders", tenant).await;
    assert_eq!(port, to_port, "the shard is on the other worker");
    let mut node = on_worker(&db, port).await;
    note_writers(&mut node, &name).await;

    // Writes until one arrives on orderd's own session; each of them succeeds.
    let mut forwarded = 0;
    let followed = loop {
        create().await;
        let seen = writers(&mut node).await;
        if seen.iter().any(|app| !app.starts_with("citus_internal")) {
            break moved.elapsed();
        }
        forwarded += seen.len();
        assert!(
            forwarded < 1_000,
            "the tenant's writes never came to the new node on orderd's sessions"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    println!(
        "routes followed the move {} ms after it ended ({forwarded} writes forwarded before)",
        followed.as_millis()
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(orders, created, "one order per create");
}
