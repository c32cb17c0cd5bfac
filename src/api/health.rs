//! Liveness and readiness probes.

use poem_openapi::{ApiResponse, OpenApi, payload::PlainText};

use super::{ApiTags, AppState};

pub struct HealthApi {
    pub state: AppState,
}

#[derive(ApiResponse)]
pub enum ReadyResponse {
    /// The database answers.
    #[oai(status = 200)]
    Ready(PlainText<&'static str>),
    /// The database does not answer; take this instance out of rotation.
    #[oai(status = 503)]
    NotReady(PlainText<&'static str>),
}

#[OpenApi(tag = "ApiTags::Health")]
impl HealthApi {
    /// The process is alive.
    #[oai(path = "/healthz", method = "get", operation_id = "healthz")]
    async fn healthz(&self) -> PlainText<&'static str> {
        PlainText("ok")
    }

    /// The process can serve: its database is reachable.
    #[oai(path = "/readyz", method = "get", operation_id = "readyz")]
    async fn readyz(&self) -> ReadyResponse {
        let probe = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            sqlx::query("SELECT 1").execute(&self.state.pool),
        )
        .await;
        match probe {
            Ok(Ok(_)) => ReadyResponse::Ready(PlainText("ready")),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "readiness probe failed");
                ReadyResponse::NotReady(PlainText("database unreachable"))
            }
            Err(_) => ReadyResponse::NotReady(PlainText("database timed out")),
        }
    }
}
