//! orderd in process, on a free loopback port, with its own database; and the HTTP
//! helpers the tests speak through.

use std::{collections::HashMap, time::Duration};

use orderd::app::{Application, Config};
use reqwest::{Response, header::HeaderMap};
use serde_json::Value;
use tokio::{sync::oneshot, task::JoinHandle};
use uuid::Uuid;

use super::db::TestDb;

pub const SECRET: &str = "integration-test-secret-0123456789";

/// The fingerprint orderd computes for a create body.
pub fn create_fingerprint(body: &Value) -> Vec<u8> {
    let new = orderd::orders::NewOrder::parse(body.as_object().expect("a create body"))
        .expect("a valid create body");
    orderd::service::create_fingerprint(&new)
        .as_bytes()
        .to_vec()
}

/// A token for `tenant` with `scope`, signed with the test secret, valid ten minutes.
pub fn token(tenant: Uuid, scope: &str) -> String {
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

/// A running orderd bound to its own database.
pub struct TestApp {
    pub base: String,
    /// The API's socket address, for tests that speak raw TCP.
    pub address: std::net::SocketAddr,
    /// Where `/metrics` is served apart from the API (`ORDERD_METRICS_BIND`), if set.
    pub metrics_base: Option<String>,
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
    Config::from_lookup(&|name| vars.get(name).cloned()).expect("test configuration is valid")
}

/// The sealer a process configured with `ORDERD_RESPONSE_KEYS=keys` has (clear records
/// served, older layouts opened).
pub fn sealer(keys: &str) -> orderd::idempotency::seal::Sealer {
    let config = Config::from_lookup(&|name| match name {
        "DATABASE_URL" => Some("postgres://unused".into()),
        "ORDERD_RESPONSE_KEYS" => Some(keys.into()),
        _ => None,
    })
    .expect("valid keys");
    orderd::idempotency::seal::Sealer::new(
        &config.idempotency.response_keys,
        orderd::idempotency::seal::ClearRecords::Serve,
    )
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
    spawn_publishing_app_on(TestDb::new().await, endpoint, topic_arn, overrides).await
}

/// The same on a database the test prepared.
pub async fn spawn_publishing_app_on(
    db: TestDb,
    endpoint: &str,
    topic_arn: &str,
    overrides: &[(&str, &str)],
) -> TestApp {
    let mut all = vec![("ORDERD_RELAY", "on"), ("ORDERD_SNS_TOPIC_ARN", topic_arn)];
    all.extend_from_slice(overrides);
    let config = settings(&db, &all);
    let publisher = super::sns::publisher(endpoint, topic_arn, &config).await;
    start(db, &all, Some(publisher)).await
}

/// Starts orderd with its in-process relay publishing through `publisher` (Kafka, or a
/// publisher a test wraps).
pub async fn spawn_app_publishing_through(
    db: TestDb,
    publisher: std::sync::Arc<dyn orderd::outbox::publisher::Publisher>,
    overrides: &[(&str, &str)],
) -> TestApp {
    let mut all = vec![("ORDERD_RELAY", "on")];
    all.extend_from_slice(overrides);
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
    let database = orderd::db::connect_db(&config.db)
        .await
        .expect("app database");
    let app = Application::build_with_publisher(config, database, publisher)
        .await
        .expect("app builds");
    let address = app.address();
    let metrics_base = app.metrics_address().map(|a| format!("http://{a}"));
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async move {
        let _ = stopped.await;
    }));
    TestApp {
        base: format!("http://{address}"),
        address,
        metrics_base,
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
        token(tenant, scope)
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

    /// The types of every event in the outbox, in each order's sequence.
    pub async fn event_types(&self) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT event_type FROM outbox_event ORDER BY aggregate_id, aggregate_seq",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
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

/// One stateless JSON-RPC request to `/mcp` at `base`, as an MCP client sends it.
pub async fn post_mcp(base: &str, token: &str, message: &Value) -> Response {
    reqwest::Client::new()
        .post(format!("{base}/mcp"))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(message)
        .send()
        .await
        .unwrap()
}
