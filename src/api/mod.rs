//! The HTTP surface: the REST API (one file per resource, combined into one OpenAPI
//! service), the MCP endpoint, the spec and Swagger UI, the probes and `/metrics`.
//!
//! This layer parses HTTP framing, authenticates ([`auth`]), admits under the tenant's
//! limits, calls the application layer ([`crate::service`]) and renders its replies
//! ([`reply`], and problems as problem+json, [`problem`]). It runs no SQL and holds no
//! business rule.

pub mod auth;
pub mod body;
pub mod health;
pub mod limits;
pub mod mcp;
pub mod middleware;
pub mod orders;
pub mod params;
pub mod problem;
pub mod reply;
pub mod responses;
pub mod routes;
pub mod server;
pub mod settings;
pub mod spec;

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use poem::{Endpoint, EndpointExt, Route, middleware::CatchPanic};
use poem_openapi::{OpenApiService, Tags};

use self::limits::TenantLimiter;
pub use self::settings::{HttpConfig, TenantLimits};

/// The media type of every success body.
pub const JSON: &str = "application/json; charset=utf-8";

/// How HTTP frames what the application layer answers: 201 for a create, 200 for any
/// other success, a refusal's status from [`problem::app_status`], JSON and
/// problem+json bodies. The service stores its answers framed so, and every transport
/// (MCP too) replays them as stored.
pub static FRAMING: service::Framing = service::Framing {
    created: 201,
    ok: 200,
    refused: problem::app_status,
    json: JSON,
    problem: problem::PROBLEM_JSON,
};

use crate::{
    auth::Verifier,
    idempotency,
    metrics::{KnownLabels, Label},
    outbox,
    service::{self, Service},
};

#[derive(Tags)]
pub enum ApiTags {
    /// Create, cancel and read orders.
    Orders,
    /// Probes for orchestrators.
    Health,
}

/// The API as an OpenAPI service; also the source of the committed spec. It holds no
/// state (handlers take the [`Service`] from the request), so the document is the same
/// for every deployment and needs no database to print.
pub fn service() -> OpenApiService<(orders::OrdersApi, health::HealthApi), ()> {
    OpenApiService::new(
        (orders::OrdersApi, health::HealthApi),
        "orderd",
        env!("CARGO_PKG_VERSION"),
    )
    .description(
        "Multi-tenant order service. Every write is idempotent per (tenant, endpoint, \
         Idempotency-Key) and every committed change is published to the message bus \
         (SNS or Kafka) through a transactional outbox. Errors are RFC 9457 `application/problem+json`.",
    )
}

/// What the routes share besides the handlers' state.
pub struct Shared {
    pub verifier: Arc<Verifier>,
    pub limiter: Arc<TenantLimiter>,
    /// Behind `/readyz`; told when shutdown begins.
    pub readiness: Arc<health::Readiness>,
}

impl Shared {
    pub fn new(verifier: Arc<Verifier>, limits: &TenantLimits) -> Self {
        Self {
            verifier,
            limiter: Arc::new(TenantLimiter::new(limits)),
            readiness: Arc::new(health::Readiness::default()),
        }
    }
}

/// The whole HTTP surface of `orderd serve`, with its middleware; `/metrics` only when
/// `with_metrics` (else it is served on a listener of its own). `public_url` is where
/// clients reach the service (`ORDERD_PUBLIC_URL`, else the bound address).
pub fn routes(
    app: Service,
    shared: &Shared,
    http: &HttpConfig,
    issuer: Option<String>,
    public_url: &str,
    with_metrics: bool,
) -> impl Endpoint + use<> {
    let api = service();
    // The Swagger UI as one page (its scripts, styles and the spec inline), built once.
    let docs = bytes::Bytes::from(api.swagger_ui_html());
    let mut route = Route::new();
    if with_metrics {
        route = route.at("/metrics", metrics_endpoint());
    }
    let mcp = mcp::Mcp::new(app.clone(), shared);
    let gate = Arc::new(auth::Gate {
        verifier: shared.verifier.clone(),
        limiter: shared.limiter.clone(),
        mcp_origins: Arc::new(http.mcp_allowed_origins.clone()),
        public_url: public_url.into(),
    });
    route
        .at("/mcp", mcp)
        .at(
            mcp::METADATA_PATH,
            mcp::metadata_endpoint(issuer, public_url),
        )
        .at("/openapi.json", spec::json_endpoint())
        .at("/openapi.yaml", spec::yaml_endpoint())
        .at("/docs", docs_page(docs.clone()))
        .at("/docs/", docs_page(docs))
        .nest("/", api)
        .data(app)
        .data(shared.readiness.clone())
        // `/readyz` tells whether the token verifier has keys.
        .data(shared.verifier.clone())
        .with(CatchPanic::new().with_handler(middleware::panic_response))
        .around(middleware::errors_as_problems)
        .around(middleware::limit_body)
        .around(move |inner, req| gate.clone().around(inner, req))
        .around(middleware::limit_uri)
        .around(middleware::access_log)
}

/// `GET /docs`: a page built once; every request shares its bytes instead of copying
/// them, so the docs cost no more than serving a fixed page.
fn docs_page(page: bytes::Bytes) -> impl Endpoint {
    poem::get(poem::endpoint::make_sync(move |_| {
        poem::Response::builder()
            .content_type("text/html; charset=utf-8")
            .body(page.clone())
    }))
}

/// The probes a metrics listener answers beside `/metrics`.
pub enum Probes {
    /// `/healthz` only (`serve`, whose `/readyz` is on the API address).
    Live,
    /// `/healthz` and `/readyz` of `orderd relay`: its database and its sink.
    Relay {
        db: crate::db::Db,
        sink: Arc<dyn outbox::publisher::Publisher>,
    },
}

/// What a metrics listener serves: metrics and the probes.
pub fn ops_routes(probes: Probes) -> impl Endpoint {
    let route = Route::new()
        .at("/metrics", metrics_endpoint())
        .at("/healthz", poem::get(poem::endpoint::make_sync(|_| "ok")));
    match probes {
        Probes::Live => route,
        Probes::Relay { db, sink } => route.at("/readyz", health::relay_readyz(db, sink)),
    }
}

/// `GET /metrics`: the Prometheus text format.
fn metrics_endpoint() -> impl Endpoint {
    poem::get(metrics_text).data(crate::metrics::install(&known_labels()))
}

/// Every label value of the labelled metrics, from the modules that own them.
pub fn known_labels() -> KnownLabels {
    KnownLabels {
        endpoints: service::Endpoint::spellings(),
        outcomes: idempotency::Outcome::spellings(),
        event_types: outbox::event::TypeLabel::spellings(),
        failure_reasons: outbox::FailureReason::spellings(),
        routes: routes::Route::spellings(),
    }
}

#[poem::handler]
fn metrics_text(handle: poem::web::Data<&PrometheusHandle>) -> poem::Response {
    poem::Response::builder()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render())
}
