//! problem+json over HTTP: the application layer's [`Problem`] rendered as an RFC 9457
//! response (status, the problem's headers, `instance` the request path), and the
//! payload type that documents it in the OpenAPI spec.

use poem::{IntoResponse, Response, http::StatusCode};
use poem_openapi::{
    payload::Payload,
    registry::{MetaSchemaRef, Registry},
    types::Type,
};

pub use crate::service::problem::{FieldError, Kind, PROBLEM_JSON, Problem, ProblemDetails};

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

impl Problem {
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

impl poem::error::ResponseError for Problem {
    fn status(&self) -> StatusCode {
        self.kind.status()
    }

    fn as_response(&self) -> Response {
        self.to_response(None)
    }
}
