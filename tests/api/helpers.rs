//! Test harness: every test gets its own database on the real PostgreSQL server and
//! its own orderd on a free loopback port.

use std::{collections::HashMap, str::FromStr, time::Duration};

use orderd::{app::Application, config::Config};
use reqwest::{Response, header::HeaderMap};
use serde_json::Value;
use sqlx::{
    Connection, Executor, PgConnection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use tokio::{sync::oneshot, task::JoinHandle};
use uuid::Uuid;

pub const SECRET: &str = "integration-test-secret-0123456789";

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
             VALUES ($1, 'POST /v1/orders', $2, $3, 'PROCESSING', $4, clock_timestamp() + $5::interval, clock_timestamp())",
        )
        .bind(tenant)
        .bind(key)
        .bind(fingerprint)
        .bind(owner)
        .bind(lease)
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// The fingerprint orderd computes for a create body.
pub fn create_fingerprint(body: &Value) -> Vec<u8> {
    let new = orderd::orders::NewOrder {
        sku: body["sku"].as_str().unwrap().to_string(),
        quantity: body["quantity"].as_i64().unwrap() as i32,
        customer_ref: body
            .get("customer_ref")
            .and_then(|v| v.as_str())
            .map(String::from),
    };
    orderd::api::orders::create_fingerprint(&new)
        .as_bytes()
        .to_vec()
}

/// `POST /v1/orders` on any orderd at `base`, from a client of its own (so it can run
/// in a spawned task), with an optional `X-Request-Id`.
pub async fn post_order(
    base: &str,
    token: &str,
    key: &str,
    body: &Value,
    request_id: Option<&str>,
) -> Response {
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(body);
    if let Some(id) = request_id {
        request = request.header("X-Request-Id", id);
    }
    request.send().await.unwrap()
}

impl Drop for TestDb {
    fn drop(&mut self) {
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

/// A running orderd bound to its own database.
pub struct TestApp {
    pub base: String,
    pub db: TestDb,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Settings a test may change; everything else takes the production default.
pub fn settings(db: &TestDb, overrides: &[(&str, &str)]) -> Config {
    let mut vars: HashMap<String, String> = HashMap::from([
        ("DATABASE_URL".into(), db.url.clone()),
        ("ORDERD_BIND".into(), "127.0.0.1:0".into()),
        ("ORDERD_JWT_HS256_SECRET".into(), SECRET.into()),
        // Tests that publish turn the relay on with their own topic.
        ("ORDERD_RELAY".into(), "off".into()),
        ("ORDERD_OUTBOX_POLL_MS".into(), "200".into()),
    ]);
    for (k, v) in overrides {
        vars.insert(k.to_string(), v.to_string());
    }
    Config::from_lookup(|name| vars.get(name).cloned()).expect("test configuration is valid")
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(&[]).await
}

pub async fn spawn_app_with(overrides: &[(&str, &str)]) -> TestApp {
    spawn_app_on(TestDb::new().await, overrides).await
}

/// Starts orderd on a database the test prepared.
pub async fn spawn_app_on(db: TestDb, overrides: &[(&str, &str)]) -> TestApp {
    start(db, overrides, None).await
}

/// Starts orderd with its in-process relay publishing to `topic_arn` through the SNS
/// endpoint at `endpoint` (moto, or a proxy in front of it).
pub async fn spawn_publishing_app(
    endpoint: &str,
    topic_arn: &str,
    overrides: &[(&str, &str)],
) -> TestApp {
    let mut all = vec![("ORDERD_RELAY", "on"), ("ORDERD_SNS_TOPIC_ARN", topic_arn)];
    all.extend_from_slice(overrides);
    let db = TestDb::new().await;
    let config = settings(&db, &all);
    let publisher = crate::sns::publisher(endpoint, topic_arn, &config).await;
    start(db, &all, Some(publisher)).await
}

async fn start(
    db: TestDb,
    overrides: &[(&str, &str)],
    publisher: Option<std::sync::Arc<dyn orderd::outbox::publisher::Publisher>>,
) -> TestApp {
    if std::env::var_os("TEST_LOG").is_some() {
        orderd::telemetry::init(false);
    }
    let config = settings(&db, overrides);
    let pool = orderd::db::connect(db.url.as_str(), config.db_pool_size)
        .await
        .expect("app pool");
    let app = Application::build_with_publisher(config, pool, publisher)
        .await
        .expect("app builds");
    let address = app.address();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async move {
        let _ = stopped.await;
    }));
    TestApp {
        base: format!("http://{address}"),
        db,
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap(),
        stop: Some(stop),
        server: Some(server),
    }
}

/// The parts of a response a test looks at, read once.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub async fn read(response: Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("body reads").to_vec();
        Self {
            status,
            headers,
            body,
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    }

    /// Asserts a problem+json body with the given status and slug.
    pub fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(
            self.status,
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/problem+json")
        );
        let body = self.json();
        assert_eq!(body["type"], format!("/problems/{slug}"), "{body}");
        assert_eq!(body["status"], status, "{body}");
        assert!(
            body["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{body}"
        );
    }
}

impl TestApp {
    pub fn token(&self, tenant: Uuid) -> String {
        self.token_with_scope(tenant, "orders:read orders:write")
    }

    pub fn token_with_scope(&self, tenant: Uuid, scope: &str) -> String {
        let secret = orderd::config::Secret::new(SECRET);
        orderd::auth::mint_hs256(
            &secret,
            tenant,
            "tests",
            scope,
            Duration::from_secs(600),
            None,
            None,
        )
        .unwrap()
    }

    pub async fn create(&self, token: &str, key: &str, body: &Value) -> Reply {
        self.create_raw(token, Some(key), serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn create_raw(&self, token: &str, key: Option<&str>, body: Vec<u8>) -> Reply {
        let mut request = self
            .client
            .post(format!("{}/v1/orders", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        Reply::read(request.send().await.expect("request sent")).await
    }

    pub async fn cancel(&self, token: &str, key: &str, id: &str) -> Reply {
        let response = self
            .client
            .post(format!("{}/v1/orders/{id}/cancel", self.base))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .send()
            .await
            .expect("request sent");
        Reply::read(response).await
    }

    pub async fn get(&self, token: &str, path: &str) -> Reply {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .expect("request sent");
        Reply::read(response).await
    }

    pub async fn count(&self, table: &str) -> i64 {
        self.db.count(table).await
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// A valid create body.
pub fn order_body(sku: &str, quantity: i32) -> Value {
    serde_json::json!({ "sku": sku, "quantity": quantity })
}

/// A fresh valid idempotency key.
pub fn new_key() -> String {
    format!("key-{}", Uuid::new_v4().simple())
}

/// `orderd serve` as a child process of its own (its own metrics recorder, its own
/// logs), killed on drop. `base` is its HTTP address; `logs` collects its stderr.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub base: String,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl ServeProcess {
    pub fn start(db: &TestDb, env: &[(&str, String)]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
            .arg("serve")
            .env("DATABASE_URL", &db.url)
            .env("ORDERD_BIND", "127.0.0.1:0")
            .env("ORDERD_JWT_HS256_SECRET", SECRET)
            .env("ORDERD_RELAY", "off")
            .env("RUST_LOG", "info")
            .env("ORDERD_LOG_FORMAT", "json")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line)
                    && entry["fields"]["message"] == "orderd listening"
                {
                    let _ = tx.send(
                        entry["fields"]["address"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    );
                }
                sink.lock().unwrap().push(line);
            }
        });
        let address = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("serve logs its address");
        Self {
            child,
            base: format!("http://{address}"),
            logs,
        }
    }

    pub fn token(&self, tenant: Uuid) -> String {
        let secret = orderd::config::Secret::new(SECRET);
        orderd::auth::mint_hs256(
            &secret,
            tenant,
            "tests",
            "orders:read orders:write",
            Duration::from_secs(600),
            None,
            None,
        )
        .unwrap()
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Polls `/metrics` until `done` holds (or a generous deadline passes); returns the
    /// last text read, for the caller to assert on.
    pub async fn metrics_until(&self, done: impl Fn(&str) -> bool) -> String {
        let mut text = String::new();
        for _ in 0..300 {
            text = self.metrics().await;
            if done(&text) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        text
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one sample line `name{labels} value` of a Prometheus text page.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line[series.len()..].trim().parse().ok())
}

/// A child process that never outlives its test.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
