//! Per-test databases on the real PostgreSQL server: created fresh and migrated,
//! dropped with the value.

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

/// A fresh, migrated database, dropped again when the value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    admin: String,
    /// Whether dropping this value drops the database (false for a second handle).
    owns: bool,
}

impl TestDb {
    pub async fn new() -> Self {
        Self::on(&admin_url()).await
    }

    /// A database on the server behind `admin` (a connection URL with rights to create databases).
    pub async fn on(admin: &str) -> Self {
        let admin = admin.to_string();
        let name = format!("orderd_test_{}", Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&admin)
            .await
            .expect("connect to the admin database");
        conn.execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
            .await
            .expect("create test database");
        conn.close().await.ok();
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
        orderd::db::Db::direct(self.url.parse().unwrap(), 8, Duration::from_secs(30))
    }

    /// A session of its own on this database (what the relay's LISTEN needs).
    pub fn session_options(&self) -> PgConnectOptions {
        PgConnectOptions::from_str(&self.url).expect("test URL parses")
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
        let admin = self.admin.clone();
        // Drop runs outside any async context we can rely on: use a private runtime.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                pool.close().await;
                if let Ok(mut conn) = PgConnection::connect(&admin).await {
                    let _ = conn
                        .execute(sqlx::AssertSqlSafe(format!(
                            r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#
                        )))
                        .await;
                }
            });
        })
        .join()
        .ok();
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
