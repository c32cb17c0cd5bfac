//! The committed spec is the served spec; probes and docs answer.

use sqlx::Connection;

use crate::support::{Reply, spawn_app};

const COMMITTED: &str = include_str!("../../../openapi/openapi.yaml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_openapi_file_equals_the_served_document() {
    let app = spawn_app().await;
    let yaml = Reply::read(
        app.client
            .get(format!("{}/openapi.yaml", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(yaml.status, 200);
    assert!(
        String::from_utf8(yaml.body.clone()).unwrap() == COMMITTED,
        "openapi/openapi.yaml is stale: regenerate it with `cargo run -- openapi --yaml > openapi/openapi.yaml`"
    );
    let json = Reply::read(
        app.client
            .get(format!("{}/openapi.json", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let committed: serde_json::Value = serde_yaml::from_str(COMMITTED).unwrap();
    assert_eq!(
        json.json(),
        committed,
        "JSON and YAML serve the same document"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_and_probes_answer() {
    let app = spawn_app().await;
    let docs = Reply::read(
        app.client
            .get(format!("{}/docs", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(docs.status, 200);
    assert!(
        String::from_utf8_lossy(&docs.body)
            .to_lowercase()
            .contains("swagger")
    );
    for probe in ["/healthz", "/readyz"] {
        let reply = Reply::read(
            app.client
                .get(format!("{}{probe}", app.base))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(reply.status, 200, "{probe}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_when_the_database_is_gone() {
    let app = spawn_app().await;
    // Served once the app finished starting (it reads the database at start).
    let up = app
        .client
        .get(format!("{}/healthz", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(up.status(), 200);
    let _gone = cut_off(&app.db.name).await;
    let reply = Reply::read(
        app.client
            .get(format!("{}/readyz", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, 503);
    let healthz = Reply::read(
        app.client
            .get(format!("{}/healthz", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        healthz.status, 200,
        "liveness does not depend on the database"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_readiness_probes_costs_one_database_check_per_interval() {
    let db = crate::support::TestDb::new().await;
    let serve = crate::support::ServeProcess::start(&db, &[]);
    let gone = cut_off(&db.name).await;
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    for _ in 0..20 {
        let status = client
            .get(format!("{}/readyz", serve.base))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 503);
    }
    let elapsed = started.elapsed();
    // Every check that fails logs one line; a check per probe would log twenty. The
    // lines reach the test through a reader thread: give the first a moment.
    let failed_checks = || {
        serve
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains("readiness probe failed"))
            .count() as u64
    };
    for _ in 0..100 {
        if failed_checks() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let checks = failed_checks();
    assert!(
        (1..=1 + elapsed.as_secs()).contains(&checks),
        "{checks} database checks for 20 probes in {elapsed:?}"
    );
    gone.restore().await;
}

/// The database `name` made unreachable: new connections forbidden, the open ones
/// terminated, until [`CutOff::restore`].
async fn cut_off(name: &str) -> CutOff {
    let mut admin = sqlx::PgConnection::connect(&crate::support::admin_url())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false;
           SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}';"#
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    // `pg_terminate_backend` only signals: wait until the backends are gone, so that
    // no statement slips through on one that has not exited yet. A connection that was
    // still logging in when the first signal went out is terminated on a later turn.
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1",
        )
        .bind(name)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    CutOff {
        admin,
        name: name.to_string(),
    }
}

struct CutOff {
    admin: sqlx::PgConnection,
    name: String,
}

impl CutOff {
    async fn restore(mut self) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            r#"ALTER DATABASE "{}" WITH ALLOW_CONNECTIONS true"#,
            self.name
        )))
        .execute(&mut self.admin)
        .await
        .unwrap();
    }
}
