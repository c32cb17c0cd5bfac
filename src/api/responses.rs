//! OpenAPI descriptions of the problem responses operations share. These wrappers only
//! document: they pass the wrapped response through unchanged.

use poem::{IntoResponse, Response};
use poem_openapi::{
    ApiResponse,
    registry::{MetaMediaType, MetaResponse, MetaResponses, Registry},
    types::Type,
};

use super::problem::{PROBLEM_JSON, ProblemDetails};

/// Problem responses for the given `(status, description)` pairs.
pub fn problems(entries: &[(u16, &'static str)]) -> Vec<MetaResponse> {
    entries
        .iter()
        .map(|&(status, description)| MetaResponse {
            description,
            status: Some(status),
            status_range: None,
            content: vec![MetaMediaType {
                content_type: PROBLEM_JSON,
                schema: ProblemDetails::schema_ref(),
            }],
            headers: Vec::new(),
        })
        .collect()
}

pub fn register(registry: &mut Registry) {
    ProblemDetails::register(registry);
}

/// Documents the problems every authenticated operation may answer (bad input,
/// authentication, scope, server failures).
pub struct Documented<T>(pub T);

impl<T: IntoResponse> IntoResponse for Documented<T> {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

impl<T: ApiResponse> ApiResponse for Documented<T> {
    fn meta() -> MetaResponses {
        let mut meta = T::meta();
        meta.responses.extend(problems(&[
            (400, "The request is invalid: body, parameter, or a missing or malformed `Idempotency-Key`"),
            (
                401,
                "Missing, malformed, expired or wrongly signed token; carries `WWW-Authenticate`",
            ),
            (403, "The token lacks the required scope"),
            (
                500,
                "Unexpected failure; details are in the server log only",
            ),
            (503, "The database is unreachable"),
        ]));
        meta
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
        register(registry);
    }
}

/// Documents the problems of an operation that takes a JSON body: too large, or not
/// JSON at all.
pub struct WithBody<T>(pub T);

impl<T: IntoResponse> IntoResponse for WithBody<T> {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

impl<T: ApiResponse> ApiResponse for WithBody<T> {
    fn meta() -> MetaResponses {
        let mut meta = T::meta();
        meta.responses.extend(problems(&[
            (413, "Body larger than 64 KiB"),
            (415, "Content type is not `application/json`"),
        ]));
        meta
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}
