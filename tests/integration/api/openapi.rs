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
    // Forbid new connections to this database and terminate the existing ones.
    let mut admin = sqlx::PgConnection::connect(&crate::support::admin_url())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        r#"ALTER DATABASE "{0}" WITH ALLOW_CONNECTIONS false;
           SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{0}';"#,
        app.db.name
    )))
    .execute(&mut admin)
    .await
    .unwrap();
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
