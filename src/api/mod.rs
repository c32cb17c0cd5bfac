//! The HTTP API: one file per resource, combined into one OpenAPI service.
//!
//! This layer parses, authenticates and authorises; it hands writes to the
//! idempotency guard and reads to the orders module, and never runs SQL of its own.

pub mod auth;
pub mod health;
pub mod middleware;
pub mod orders;
pub mod problems;
pub mod strict;

use poem_openapi::{OpenApiService, Tags};
use sqlx::PgPool;

use crate::idempotency::Guard;

/// What handlers share.
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

/// The API as an OpenAPI service; also the source of the committed spec.
pub type Api = (orders::OrdersApi, health::HealthApi);

/// Builds the service. `state` is only used by handlers, never by the spec, so the
/// document is the same for every deployment.
pub fn service(state: AppState) -> OpenApiService<Api, ()> {
    OpenApiService::new(
        (
            orders::OrdersApi {
                state: state.clone(),
            },
            health::HealthApi { state },
        ),
        "orderd",
        env!("CARGO_PKG_VERSION"),
    )
    .description(
        "Multi-tenant order service. Every write is idempotent per (tenant, endpoint, \
         Idempotency-Key) and every committed change is published to SNS through a \
         transactional outbox. Errors are RFC 9457 `application/problem+json`.",
    )
}
