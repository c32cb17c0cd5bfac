//! problem+json over HTTP: every kind of problem with its `type` slug, title and status
//! (one table, [`Kind::describe`]), the application layer's problems as they go out
//! (their kind mapped, `Retry-After` and the bearer challenge as headers), the
//! transport's own kinds (a method not allowed, a body too large, a late request, ...),
//! and the payload type that documents the shape in the OpenAPI spec.

use http::{HeaderName, HeaderValue, header};
use poem::{IntoResponse, Response, http::StatusCode};
use poem_openapi::{
    payload::Payload,
    registry::{MetaSchemaRef, Registry},
    types::Type,
};

pub use crate::service::problem::{
    FieldError, Kind as AppKind, Problem as AppProblem, ProblemDetails,
};

/// The problem types: the application layer's, and the transport's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    App(AppKind),
    MethodNotAllowed,
    PayloadTooLarge,
    UnsupportedMediaType,
    RateLimited,
    RequestTimeout,
    UriTooLong,
    HeadersTooLarge,
}

/// Media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The HTTP status of each of the application layer's kinds of problem: the one table
/// of them (a refusal stored for replay, such as a cancel's 404, carries it: see
/// [`super::FRAMING`]).
pub fn app_status(kind: AppKind) -> u16 {
    match kind {
        AppKind::IdempotencyKeyMissing | AppKind::IdempotencyKeyInvalid => 400,
        AppKind::IdempotencyKeyReused => 422,
        AppKind::IdempotencyKeyInFlight => 409,
        AppKind::ValidationError => 400,
        AppKind::Unauthorized => 401,
        AppKind::Forbidden => 403,
        AppKind::NotFound => 404,
        AppKind::TenantErasureInProgress => 409,
        AppKind::ServiceUnavailable => 503,
        AppKind::InternalError => 500,
    }
}

impl Kind {
    /// The slug, the title and the status of each kind: the application layer's slugs
    /// and titles with [`app_status`], this table for the transport's own kinds.
    pub fn describe(self) -> (&'static str, &'static str, StatusCode) {
        use StatusCode as S;
        let (slug, title, status) = match self {
            Kind::App(kind) => {
                let (slug, title) = kind.describe();
                (slug, title, app_status(kind))
            }
            Kind::MethodNotAllowed => ("method-not-allowed", "Method not allowed", 405),
            Kind::PayloadTooLarge => ("payload-too-large", "Payload too large", 413),
            Kind::UnsupportedMediaType => ("unsupported-media-type", "Unsupported media type", 415),
            Kind::RateLimited => ("rate-limited", "Too many requests", 429),
            Kind::RequestTimeout => ("request-timeout", "The request did not arrive in time", 408),
            Kind::UriTooLong => ("uri-too-long", "URI too long", 414),
            Kind::HeadersTooLarge => ("headers-too-large", "Request header fields too large", 431),
        };
        (
            slug,
            title,
            S::from_u16(status).expect("a status from the tables"),
        )
    }

    pub fn slug(self) -> &'static str {
        self.describe().0
    }

    pub fn title(self) -> &'static str {
        self.describe().1
    }

    pub fn status(self) -> StatusCode {
        self.describe().2
    }
}

/// A problem as HTTP answers it: a kind, its details and the headers it carries.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {}", kind.slug(), detail.as_deref().unwrap_or(kind.title()))]
pub struct Problem {
    pub kind: Kind,
    pub detail: Option<String>,
    pub errors: Option<Vec<FieldError>>,
    /// Extra response headers (`Retry-After`, `WWW-Authenticate`, `Allow`, ...).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl From<AppProblem> for Problem {
    /// The application's problem on the wire: `Retry-After` when it says when to come
    /// back, and the RFC 6750 challenge on a 401.
    fn from(problem: AppProblem) -> Self {
        let mut out = Problem {
            kind: Kind::App(problem.kind),
            detail: problem.detail,
            errors: problem.errors,
            headers: Vec::new(),
        };
        if let Some(seconds) = problem.retry_after {
            out = out.with_header(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if out.kind == Kind::App(AppKind::Unauthorized) {
            out = out.with_header(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer error="invalid_token""#),
            );
        }
        out
    }
}

/// The application layer's own conversions, for errors the transport meets itself.
macro_rules! through_the_application {
    ($($from:ty),* $(,)?) => {
        $(
            impl From<$from> for Problem {
                fn from(err: $from) -> Self {
                    AppProblem::from(err).into()
                }
            }
        )*
    };
}

through_the_application!(
    crate::auth::AuthError,
    crate::idempotency::KeyError,
    Vec<crate::orders::Invalid>,
    anyhow::Error,
);

impl Problem {
    /// An unexpected failure (logged by the application layer's constructor).
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        AppProblem::internal(cause).into()
    }

    /// A `validation-error` with one field at fault.
    pub fn invalid_field(field: &str, message: &str) -> Self {
        AppProblem::invalid_field(field, message).into()
    }

    /// A 401 with the bearer challenge.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        AppProblem::unauthorized(detail).into()
    }

    /// A problem of one of the application layer's kinds, raised by the transport.
    pub fn app(kind: AppKind) -> Self {
        Self::new(Kind::App(kind))
    }

    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            detail: None,
            errors: None,
            headers: Vec::new(),
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// How many seconds the problem says to wait before retrying, if it says so.
    pub fn retry_after(&self) -> Option<u64> {
        self.headers
            .iter()
            .find(|(name, _)| name == header::RETRY_AFTER)
            .and_then(|(_, value)| value.to_str().ok()?.parse().ok())
    }

    pub fn details(&self) -> ProblemDetails {
        let (slug, title, status) = self.kind.describe();
        ProblemDetails {
            kind: format!("/problems/{slug}"),
            title: title.to_string(),
            status: status.as_u16(),
            detail: self.detail.clone(),
            instance: None,
            errors: self.errors.clone(),
        }
    }

    /// Serialises the body; `instance` is the request path when known.
    pub fn to_response(&self, instance: Option<&str>) -> Response {
        let mut details = self.details();
        details.instance = instance.map(str::to_string);
        let mut response = ProblemBody(details).into_response();
        for (name, value) in &self.headers {
            response.headers_mut().insert(name.clone(), value.clone());
        }
        response
    }
}

/// A problem as a response payload, rendered by the same serde code as every other
/// problem body, so all of them share one shape and key order.
pub struct ProblemBody(pub ProblemDetails);

impl Payload for ProblemBody {
    const CONTENT_TYPE: &'static str = PROBLEM_JSON;

    fn schema_ref() -> MetaSchemaRef {
        ProblemDetails::schema_ref()
    }

    fn register(registry: &mut Registry) {
        ProblemDetails::register(registry);
    }
}

impl IntoResponse for ProblemBody {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.0).expect("problem details always serialise");
        Response::builder()
            .status(StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::BAD_REQUEST))
            .content_type(PROBLEM_JSON)
            .body(body)
    }
}

/// The application layer's problem, answered by a REST handler as it goes out.
impl poem::error::ResponseError for AppProblem {
    fn status(&self) -> StatusCode {
        Kind::App(self.kind).status()
    }

    fn as_response(&self) -> Response {
        Problem::from(self.clone()).to_response(None)
    }
}

impl poem::error::ResponseError for Problem {
    fn status(&self) -> StatusCode {
        self.kind.status()
    }

    fn as_response(&self) -> Response {
        self.to_response(None)
    }
}
