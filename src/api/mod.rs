//! The HTTP surface: the REST API (one file per resource, combined into one OpenAPI
//! service), the spec and Swagger UI, the probes and `/metrics`.
//!
//! This layer parses, authenticates and authorises, maps typed errors to problem+json
//! ([`problem`]) and turns stored responses back into HTTP ([`idempotent`]). Writes go
//! to the idempotency core, reads to the orders module; SQL lives below this layer.

pub mod auth;
pub mod health;
pub mod idempotent;
pub mod middleware;
pub mod orders;
pub mod problem;
pub mod responses;
pub mod strict;

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use poem::{Endpoint, EndpointExt, Route, middleware::CatchPanic};
use poem_openapi::{OpenApiService, Tags};
use sqlx::PgPool;

use crate::{auth::Verifier, idempotency::Guard};

/// What handlers share, handed to them as request data.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub guard: Guard,
}

#[derive(Tags)]
pub enum ApiTags {
    /// Create, cancel and read orders.
    Orders,
    /// Probes for orchestrators.
    Health,
}

/// The API as an OpenAPI service; also the source of the committed spec. It holds no
/// state (handlers take [`AppState`] from the request), so the document is the same
/// for every deployment and needs no database to print.
pub fn service() -> OpenApiService<(orders::OrdersApi, health::HealthApi), ()> {
    OpenApiService::new(
        (orders::OrdersApi, health::HealthApi),
        "orderd",
        env!("CARGO_PKG_VERSION"),
    )
    .description(
        "Multi-tenant order service. Every write is idempotent per (tenant, endpoint, \
         Idempotency-Key) and every committed change is published to SNS through a \
         transactional outbox. Errors are RFC 9457 `application/problem+json`.",
    )
}

/// The whole HTTP surface of `orderd serve`, with its middleware.
pub fn routes(state: AppState, verifier: Arc<Verifier>) -> impl Endpoint {
    let api = service();
    Route::new()
        .at("/metrics", metrics_endpoint())
        .at("/openapi.json", api.spec_endpoint())
        .at("/openapi.yaml", api.spec_endpoint_yaml())
        .nest("/docs", api.swagger_ui())
        .nest("/", api)
        .data(state)
        .data(verifier)
        .with(CatchPanic::new().with_handler(middleware::panic_response))
        .around(middleware::errors_as_problems)
        .around(middleware::limit_body)
        .around(middleware::access_log)
}

/// What `orderd relay` serves: metrics and liveness.
pub fn ops_routes() -> impl Endpoint {
    Route::new()
        .at("/metrics", metrics_endpoint())
        .at("/healthz", poem::get(poem::endpoint::make_sync(|_| "ok")))
}

/// `GET /metrics`: the Prometheus text format.
fn metrics_endpoint() -> impl Endpoint {
    poem::get(metrics_text).data(crate::metrics::install())
}

#[poem::handler]
fn metrics_text(handle: poem::web::Data<&PrometheusHandle>) -> poem::Response {
    poem::Response::builder()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render())
}
