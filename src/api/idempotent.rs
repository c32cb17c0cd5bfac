//! The adapter between the idempotency core and HTTP: renders an operation's typed
//! response into the bytes the core stores, and turns a stored response (fresh or
//! replayed) back into an HTTP response with the same status, `Location` and body.

use std::marker::PhantomData;

use poem::{
    IntoResponse, Response,
    http::{HeaderValue, StatusCode, header},
};
use poem_openapi::{
    ApiResponse,
    registry::{MetaHeader, MetaResponses, Registry},
    types::Type,
};

use super::{problem::Problem, responses};
use crate::idempotency::{Answer, StoredResponse};

/// Header added to every replayed response.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// Renders a typed response to the bytes that will be stored and sent.
pub async fn render<T: IntoResponse>(typed: T) -> Result<StoredResponse, Problem> {
    let response = typed.into_response();
    let header_text = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(String::from)
    };
    let location = header_text(header::LOCATION);
    let content_type = header_text(header::CONTENT_TYPE);
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .into_vec()
        .await
        .map_err(|e| Problem::internal(anyhow::anyhow!(e)))?;
    Ok(StoredResponse {
        status,
        location,
        content_type,
        body,
    })
}

/// A response that went through the guard: always the stored bytes. Its OpenAPI
/// description is that of `T` (what the operation answers) plus the guard's problems.
pub struct Idempotent<T> {
    response: Response,
    _typed: PhantomData<fn() -> T>,
}

impl<T> From<Answer> for Idempotent<T> {
    fn from(answer: Answer) -> Self {
        let stored = answer.response;
        let mut builder = Response::builder().status(
            StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        );
        if let Some(content_type) = stored.content_type {
            builder = builder.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(location) = stored.location {
            builder = builder.header(header::LOCATION, location);
        }
        if answer.replayed {
            builder = builder.header(REPLAYED_HEADER, "true");
        }
        Self {
            response: builder.body(stored.body),
            _typed: PhantomData,
        }
    }
}

impl<T: Send> IntoResponse for Idempotent<T> {
    fn into_response(self) -> Response {
        self.response
    }
}

impl<T: ApiResponse> ApiResponse for Idempotent<T> {
    fn meta() -> MetaResponses {
        let mut meta = T::meta();
        for response in &mut meta.responses {
            response.headers.push(MetaHeader {
                name: REPLAYED_HEADER.to_string(),
                description: Some("`true` when this is the stored response of an earlier request with the same key".into()),
                required: false,
                deprecated: false,
                schema: bool::schema_ref(),
            });
        }
        let mut problems = responses::problems(&[
            (
                409,
                "A request with this key is still in flight, or this request lost its lease; retry after `Retry-After` seconds",
            ),
            (422, "The key was already used with a different request"),
        ]);
        problems[0].headers.push(MetaHeader {
            name: "Retry-After".to_string(),
            description: Some("Whole seconds to wait before retrying (1 or 2)".into()),
            required: true,
            deprecated: false,
            schema: u32::schema_ref(),
        });
        meta.responses.extend(problems);
        meta
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
        responses::register(registry);
    }
}
