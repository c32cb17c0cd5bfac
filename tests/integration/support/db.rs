//! Per-test databases on the real PostgreSQL server: created fresh and migrated,
//! dropped with the value. With `ORDERD_TEST_CITUS_WORKERS` set (`.ci/test` does, for
//! its run against a Citus cluster), the server is a Citus coordinator and each test
//! database is made on the coordinator and every worker, with the extension and the
//! workers registered, before orderd's migrations distribute its tables.

use std::{str::FromStr, time::Duration};

use orderd::service::Endpoint;
use sqlx::{
    Connection, Executor, PgConnection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use uuid::Uuid;

/// The server that hosts the per-test databases (exported by `.ci/test`).
pub fn admin_url() -> String {
    std::env::var("ORDERD_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .expect("set ORDERD_TEST_DATABASE_URL or DATABASE_URL (run the suite with .ci/test)")
}

/// The workers of the Citus cluster whose coordinator is [`admin_url`], as admin URLs
/// (comma-separated in `ORDERD_TEST_CITUS_WORKERS`); empty on plain PostgreSQL.
pub fn citus_workers() -> Vec<String> {
    std::env::var("ORDERD_TEST_CITUS_WORKERS")
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the suite runs against a Citus cluster.
pub fn on_citus() -> bool {
    !citus_workers().is_empty()
}

/// The `host:port` of the server a PostgreSQL URL names: how `pg_dist_node` names a
/// node, and where a proxy of a test's own forwards to.
pub fn node_address(url: &str) -> String {
    let options = PgConnectOptions::from_str(url).expect("a node URL parses");
    format!("{}:{}", options.get_host(), options.get_port())
}

/// The primary worker other than the one at `host:port`: where a shard moves to.
pub async fn other_worker<'e>(
    conn: impl sqlx::PgExecutor<'e>,
    host: &str,
    port: i32,
) -> (String, i32) {
    sqlx::query_as(
        "SELECT nodename::text, nodeport FROM pg_dist_node
         WHERE noderole = 'primary' AND shouldhaveshards AND groupid <> 0
           AND (nodename, nodeport) <> ($1, $2)",
    )
    .bind(host)
    .bind(port)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Marks a test of one PostgreSQL server's own machinery (a server of the test's own,
/// its planner's choices, a pooler in front of it), with `why` it means nothing on a
/// Citus cluster: true there (the test then returns at once, and says so), false on one
/// server. The first line of such a test, so that the mark is read with it.
pub fn one_server_only(why: &str) -> bool {
    if on_citus() {
        eprintln!("one server only, not run on Citus: {why}");
    }
    on_citus()
}

/// Shards per distributed table in a test database: few, so that a test's tenants
/// still land on both workers while the per-shard work stays small.
const CITUS_SHARDS: u32 = 4;

/// Runs `sql` on the server behind `admin` (a statement that cannot run in a pool's
/// transaction, such as `CREATE DATABASE`).
async fn on_server(admin: &str, sql: String) {
    let mut conn = PgConnection::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("connect to {admin}: {e}"));
    conn.execute(sqlx::AssertSqlSafe(sql.clone()))
        .await
        .unwrap_or_else(|e| panic!("`{sql}` on {admin}: {e}"));
    conn.close().await.ok();
}

/// `name` on every node of the Citus cluster, ready for orderd's migrations: the
/// extension everywhere, the coordinator knowing itself and its workers.
async fn prepare_citus(coordinator: &str, name: &str, reach: &dyn Fn(usize, &str) -> String) {
    create_on_every_node(coordinator, name).await;
    enable_citus_reaching(coordinator, name, reach).await;
}

/// An empty database `name` on the coordinator and on every worker.
async fn create_on_every_node(coordinator: &str, name: &str) {
    let nodes: Vec<String> = std::iter::once(coordinator.to_string())
        .chain(citus_workers())
        .collect();
    futures::future::join_all(
        nodes
            .iter()
            .map(|admin| on_server(admin, format!(r#"CREATE DATABASE "{name}""#))),
    )
    .await;
}

/// The extension in `name` on every node, the coordinator knowing itself and its
/// workers there, and a small shard count for what it distributes next.
async fn enable_citus(coordinator: &str, name: &str) {
    enable_citus_reaching(coordinator, name, &|_, address| address.to_string()).await
}

/// [`enable_citus`], the coordinator reaching worker `i` (from 0) at `reach(i, its
/// host:port)`: a proxy of a test's own in front of it, say.
async fn enable_citus_reaching(
    coordinator: &str,
    name: &str,
    reach: &dyn Fn(usize, &str) -> String,
) {
    let nodes: Vec<String> = std::iter::once(coordinator.to_string())
        .chain(citus_workers())
        .collect();
    let databases: Vec<String> = nodes
        .iter()
        .map(|admin| url_with_database(admin, name))
        .collect();
    futures::future::join_all(
        databases
            .iter()
            .map(|url| on_server(url, "CREATE EXTENSION citus".into())),
    )
    .await;
    on_server(
        coordinator,
        format!(r#"ALTER DATABASE "{name}" SET citus.shard_count = {CITUS_SHARDS}"#),
    )
    .await;
    let coordinator_address = node_address(coordinator);
    let (host, port) = coordinator_address.rsplit_once(':').expect("host:port");
    let mut register = vec![format!(
        "SELECT citus_set_coordinator_host('{host}', {port})"
    )];
    for (i, worker) in citus_workers().iter().enumerate() {
        let reached = reach(i, &node_address(worker));
        let (host, port) = reached.rsplit_once(':').expect("host:port");
        register.push(format!("SELECT citus_add_node('{host}', {port})"));
    }
    // Registering a node copies the roles to it, and two registrations at once collide
    // on the worker's catalog ("tuple concurrently updated"): one at a time.
    static REGISTERING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = REGISTERING.lock().await;
    on_server(&url_with_database(coordinator, name), register.join("; ")).await;
}

/// A fresh, migrated database, dropped again when the value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    admin: String,
    /// Whether dropping this value drops the database (false for a second handle).
    owns: bool,
    /// The Citus workers' admin URLs, where the database was made on them too.
    workers: Vec<String>,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::on(&admin_url()).await
    }

    /// On a Citus cluster, a database migrated before the extension was created in it:
    /// the single-server layout of a deployment that predates Citus, on every node.
    /// [`TestDb::enable_citus`] then makes it ready to be distributed in place.
    pub async fn before_citus() -> Self {
        let admin = admin_url();
        let workers = citus_workers();
        assert!(
            !workers.is_empty(),
            "a database before Citus needs the cluster"
        );
        let name = format!("orderd_test_{}", Uuid::new_v4().simple());
        create_on_every_node(&admin, &name).await;
        Self::migrated(admin, name, workers).await
    }

    /// The extension created in this database on every node and the workers registered
    /// (what an operator does before `orderd citus distribute`).
    pub async fn enable_citus(&self) {
        enable_citus(&self.admin, &self.name).await;
    }

    /// A database on the server behind `admin` (a connection URL with rights to create databases).
    pub async fn on(admin: &str) -> Self {
        let admin = admin.to_string();
        let name = format!("orderd_test_{}", Uuid::new_v4().simple());
        let workers = if admin == admin_url() {
            citus_workers()
        } else {
            Vec::new()
        };
        if workers.is_empty() {
            on_server(&admin, format!(r#"CREATE DATABASE "{name}""#)).await;
        } else {
            prepare_citus(&admin, &name, &|_, address| address.to_string()).await;
        }
        Self::migrated(admin, name, workers).await
    }

    /// On the Citus cluster, a database whose coordinator reaches worker `i` (from 0) at
    /// `reach(i, its host:port)` (a proxy the test switches, to stop or silence one
    /// worker for this database alone).
    pub async fn on_citus_reaching(reach: impl Fn(usize, &str) -> String) -> Self {
        let admin = admin_url();
        let workers = citus_workers();
        assert!(!workers.is_empty(), "needs the Citus cluster");
        let name = format!("orderd_test_{}", Uuid::new_v4().simple());
        prepare_citus(&admin, &name, &reach).await;
        Self::migrated(admin, name, workers).await
    }

    /// The database `name`, made on the server behind `admin`, migrated and owned.
    async fn migrated(admin: String, name: String, workers: Vec<String>) -> Self {
        let options = PgConnectOptions::from_str(&admin)
            .expect("admin URL parses")
            .database(&name);
        let url = url_with_database(&admin, &name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("connect to test database");
        orderd::MIGRATOR.run(&pool).await.expect("migrations apply");
        Self {
            name,
            url,
            pool,
            admin,
            owns: true,
            workers,
        }
    }

    /// A second handle on the same database, with a pool of its own, for a second
    /// process of the test (an app beside a command); dropping it leaves the database.
    pub async fn handle(&self) -> Self {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(self.session_options())
            .await
            .expect("connect to test database");
        Self {
            name: self.name.clone(),
            url: self.url.clone(),
            pool,
            admin: self.admin.clone(),
            owns: false,
            workers: self.workers.clone(),
        }
    }
}

fn url_with_database(admin: &str, name: &str) -> String {
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (admin, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

impl TestDb {
    /// The database as orderd's code takes it: directly, no pooler.
    pub fn direct(&self) -> orderd::db::Db {
        self.direct_sized(8)
    }

    /// The same with `size` connections, knowing (as `orderd` finds at start) whether
    /// its tables are distributed.
    pub fn direct_sized(&self, size: u32) -> orderd::db::Db {
        orderd::db::Db::direct(self.url.parse().unwrap(), size, Duration::from_secs(30))
            .in_layout(orderd::db::Layout::of(!self.workers.is_empty()))
    }

    /// A session of its own on this database (what the relay's LISTEN needs).
    pub fn session_options(&self) -> PgConnectOptions {
        PgConnectOptions::from_str(&self.url).expect("test URL parses")
    }

    /// `n` orders of `tenant` laid down by SQL, each with its stored answer and a
    /// PENDING event, as a busy tenant leaves them.
    pub async fn backlog(&self, tenant: Uuid, n: i64) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO orders (tenant_id, id, sku, quantity, status, created_at, updated_at)
             SELECT '{tenant}', gen_random_uuid(), 'BULK-' || g, 1, 'CREATED', now(), now()
             FROM generate_series(1, {n}) g;
             INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state,
                    response_status, response_body, resource_id, created_at, completed_at, expires_at)
             SELECT tenant_id, 'POST /v1/orders', 'bulk-key-' || id, sha256(id::text::bytea), 'COMPLETED',
                    201, convert_to(json_build_object('id', id)::text, 'UTF8'), id, now(), now(),
                    now() + interval '1 day'
             FROM orders WHERE tenant_id = '{tenant}' AND sku LIKE 'BULK-%';
             INSERT INTO outbox_event (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload,
                    occurred_at, status, next_attempt_at)
             SELECT tenant_id, gen_random_uuid(), id, 1, 'OrderCreated',
                    json_build_object('event_type', 'OrderCreated', 'tenant_id', tenant_id,
                                      'order', json_build_object('id', id)),
                    now(), 'PENDING', now()
             FROM orders WHERE tenant_id = '{tenant}' AND sku LIKE 'BULK-%';"
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Waits until `sql` (a count) returns `want`; panics after a generous deadline
    /// (moto publishes only about 100 messages a second).
    pub async fn until_count(&self, sql: &str, want: i64) {
        let mut last = -1;
        for _ in 0..2400 {
            last = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
                .fetch_one(&self.pool)
                .await
                .unwrap();
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("`{sql}` stayed at {last}, wanted {want}");
    }

    /// `table` locked (`ACCESS EXCLUSIVE`) in a transaction of its own on every server of
    /// the database, the coordinator and each Citus worker (a tenant's statements run on
    /// its node, against the table there), held until [`Locks::release`]. Each lock is
    /// taken where it is asked for alone: Citus would pass a `LOCK` on to other nodes
    /// itself (`citus.enable_ddl_propagation`), and the next node's own would wait
    /// for it.
    pub async fn lock_everywhere(&self, table: &str) -> Locks {
        let mut held = Vec::new();
        let nodes = std::iter::once(self.url.clone()).chain(
            self.workers
                .iter()
                .map(|worker| url_with_database(worker, &self.name)),
        );
        for url in nodes {
            let mut conn = PgConnection::connect(&url)
                .await
                .expect("connect to a node");
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "BEGIN; SET LOCAL citus.enable_ddl_propagation = off;
                 LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"
            )))
            .execute(&mut conn)
            .await
            .expect("lock the table");
            held.push(conn);
        }
        Locks(held)
    }

    /// A count of the sessions of this database waiting on a lock: on Citus in its
    /// view of every node's sessions, since a statement routed to a worker waits there.
    pub fn lock_waiters(&self) -> String {
        let view = if on_citus() {
            "citus_stat_activity"
        } else {
            "pg_stat_activity"
        };
        format!(
            "SELECT count(*) FROM {view} WHERE datname = '{}' AND wait_event_type = 'Lock'",
            self.name
        )
    }

    /// How many events are PENDING, how many were charged an attempt, how many are DEAD.
    pub async fn pending_charged_dead(&self) -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'PENDING'), count(*) FILTER (WHERE attempts > 0),
                    count(*) FILTER (WHERE status = 'DEAD')
             FROM outbox_event",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Waits until `published` events are PUBLISHED and `dead` went DEAD at their first
    /// attempt (a permanent refusal).
    pub async fn until_published_and_dead(&self, published: i64, dead: i64) {
        self.until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'",
            published,
        )
        .await;
        self.until_count(
            "SELECT count(*) FROM outbox_event WHERE status = 'DEAD' AND attempts = 1",
            dead,
        )
        .await;
    }

    /// Leaves a PROCESSING claim on `POST /v1/orders` as a worker owning it as `owner`
    /// would, with the lease ending `lease` (an interval) from now.
    pub async fn insert_processing(
        &self,
        tenant: Uuid,
        key: &str,
        fingerprint: &[u8],
        lease: &str,
        owner: Uuid,
    ) {
        sqlx::query(
            "INSERT INTO idempotency_record (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until, created_at)
             VALUES ($1, $6, $2, $3, 'PROCESSING', $4, clock_timestamp() + $5::interval, clock_timestamp())",
        )
        .bind(tenant)
        .bind(key)
        .bind(fingerprint)
        .bind(owner)
        .bind(lease)
        .bind(Endpoint::CreateOrder.as_str())
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !self.owns {
            return;
        }
        let name = self.name.clone();
        let pool = self.pool.clone();
        let nodes: Vec<String> = std::iter::once(self.admin.clone())
            .chain(self.workers.iter().cloned())
            .collect();
        // Drop runs outside any async context we can rely on: use a private runtime.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                pool.close().await;
                for admin in nodes {
                    if let Ok(mut conn) = PgConnection::connect(&admin).await {
                        drop_replication(&mut conn, &admin, &name).await;
                        let _ = conn
                            .execute(sqlx::AssertSqlSafe(format!(
                                r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#
                            )))
                            .await;
                    }
                }
            });
        })
        .join()
        .ok();
    }
}

/// What a shard move that failed half-way may leave of database `name` on the node
/// that `conn` (a session on its `admin` URL) reaches: subscriptions (a database cannot
/// be dropped with one) and the server's replication slots of that database (they would
/// hold WAL back forever). Both catalogs are the server's, so looking costs a few
/// statements on the session the drop uses anyway; only a subscription to drop needs a
/// session in the database itself.
async fn drop_replication(conn: &mut PgConnection, admin: &str, name: &str) {
    let subscriptions: Vec<String> = sqlx::query_scalar(
        "SELECT subname::text FROM pg_subscription
         WHERE subdbid = (SELECT oid FROM pg_database WHERE datname = $1)",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    if !subscriptions.is_empty()
        && let Ok(mut inside) = PgConnection::connect(&url_with_database(admin, name)).await
    {
        for sub in subscriptions {
            for sql in [
                format!(r#"ALTER SUBSCRIPTION "{sub}" DISABLE"#),
                format!(r#"ALTER SUBSCRIPTION "{sub}" SET (slot_name = NONE)"#),
                format!(r#"DROP SUBSCRIPTION "{sub}""#),
            ] {
                let _ = inside.execute(sqlx::AssertSqlSafe(sql)).await;
            }
        }
        inside.close().await.ok();
    }
    for sql in [
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
         WHERE database = $1 AND active_pid IS NOT NULL",
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
         WHERE database = $1 AND NOT active",
    ] {
        let _ = sqlx::query(sql).bind(name).execute(&mut *conn).await;
    }
}

/// Creates an order the way a create request does (claim a fresh key, then the one
/// statement that completes it and writes the order and its event), inside `tx`, so a
/// test can hold the write uncommitted or roll it back.
pub async fn create_order_in(
    tx: &mut PgConnection,
    tenant: orderd::tenant::TenantId,
    new: &orderd::orders::NewOrder,
) -> orderd::orders::Order {
    use orderd::idempotency::{
        Fingerprint, IdempotencyKey, StoredResponse,
        store::{self, ClaimOrRead, Fence, Scope},
    };
    let scope = Scope {
        tenant,
        endpoint: Endpoint::CreateOrder.as_str(),
        key: IdempotencyKey::parse(Some(&Uuid::new_v4().to_string())).unwrap(),
    };
    let owner = Uuid::new_v4();
    let claimed = store::claim_or_read(
        &mut orderd::db::Sql::direct(&mut *tx),
        &scope,
        &Fingerprint::of(new),
        owner,
        60_000,
    )
    .await
    .unwrap();
    let ClaimOrRead::Claimed { at } = claimed else {
        panic!("a fresh key is claimed");
    };
    let fence = Fence {
        scope: &scope,
        owner,
        ttl_secs: 3600,
        at,
        sealer: &orderd::idempotency::seal::Sealer::PLAIN,
    };
    let order = orderd::orders::Order::created(new, at);
    let response = StoredResponse {
        status: 201,
        location: None,
        content_type: Some("application/json".into()),
        body: b"{}".to_vec().into(),
        resource: Some(order.id),
    };
    let written = orderd::orders::store::create(
        &mut orderd::db::Sql::direct(&mut *tx),
        &fence,
        &response,
        &order,
        None,
    )
    .await
    .unwrap();
    assert!(written, "the fence of a fresh claim holds");
    order
}

/// Tables locked on every node by [`TestDb::lock_everywhere`].
pub struct Locks(Vec<PgConnection>);

impl Locks {
    /// Rolls every lock's transaction back.
    pub async fn release(self) {
        for mut conn in self.0 {
            sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
        }
    }
}
