//! Liveness and readiness probes.

use std::sync::Arc;

use poem::web::Data;
use poem_openapi::{ApiResponse, OpenApi, payload::PlainText};

use super::ApiTags;
use crate::{auth::Verifier, db, service::Service};

pub struct HealthApi;

#[derive(ApiResponse)]
pub enum ReadyResponse {
    /// The database answers.
    #[oai(status = 200)]
    Ready(PlainText<&'static str>),
    /// The database does not answer, or no token can be verified yet (a JWKS not
    /// fetched); take this instance out of rotation.
    #[oai(status = 503)]
    NotReady(PlainText<&'static str>),
}

#[OpenApi(tag = "ApiTags::Health")]
impl HealthApi {
    /// Liveness
    ///
    /// The process is alive.
    #[oai(path = "/healthz", method = "get", operation_id = "healthz")]
    async fn healthz(&self) -> PlainText<&'static str> {
        PlainText("ok")
    }

    /// Readiness
    ///
    /// The process can serve: its database is reachable and it can verify tokens.
    #[oai(path = "/readyz", method = "get", operation_id = "readyz")]
    async fn readyz(
        &self,
        service: Data<&Service>,
        verifier: Data<&Arc<Verifier>>,
    ) -> ReadyResponse {
        if !verifier.is_ready() {
            return ReadyResponse::NotReady(PlainText("no token verification keys yet"));
        }
        match db::ping(service.db()).await {
            Ok(()) => ReadyResponse::Ready(PlainText("ready")),
            Err(why) => {
                tracing::warn!(error = %why, "readiness probe failed");
                ReadyResponse::NotReady(PlainText("database unreachable"))
            }
        }
    }
}
