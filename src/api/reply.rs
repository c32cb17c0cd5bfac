//! The adapter between the application layer and HTTP: an operation's [`Reply`] (fresh,
//! or the stored bytes of a replay) becomes an HTTP response with its status,
//! `Location` and body, while the OpenAPI spec describes it as the typed response `T`
//! that the bytes are an instance of.

use std::marker::PhantomData;

use poem::{
    IntoResponse, Response,
    http::{StatusCode, header},
};
use poem_openapi::{
    ApiResponse,
    registry::{MetaHeader, MetaResponses, Registry},
    types::Type,
};

use super::responses;
use crate::service::Reply;

/// Header added to every replayed response.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// Header on every answer stored for replay (a first answer and each replay of it):
/// when the key is forgotten, as an HTTP date (decision 144).
pub const KEY_EXPIRES_HEADER: &str = "Idempotency-Key-Expires";

/// A reply as HTTP, described in the spec as `T`.
pub struct Rendered<T> {
    response: Response,
    _typed: PhantomData<fn() -> T>,
}

impl<T> From<Reply> for Rendered<T> {
    fn from(
        Reply {
            response,
            replayed,
            expires_at,
        }: Reply,
    ) -> Self {
        let mut builder = Response::builder().status(
            StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        );
        if let Some(content_type) = response.content_type {
            builder = builder.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(location) = response.location {
            builder = builder.header(header::LOCATION, location);
        }
        if replayed {
            builder = builder.header(REPLAYED_HEADER, "true");
        }
        if let Some(at) = expires_at {
            builder = builder.header(KEY_EXPIRES_HEADER, httpdate::fmt_http_date(at.into()));
        }
        Self {
            response: builder.body(response.body),
            _typed: PhantomData,
        }
    }
}

impl<T: Send> IntoResponse for Rendered<T> {
    fn into_response(self) -> Response {
        self.response
    }
}

impl<T: ApiResponse> ApiResponse for Rendered<T> {
    fn meta() -> MetaResponses {
        T::meta()
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
    }
}

/// A reply that went through the idempotency guard: always the stored bytes. Its
/// OpenAPI description is that of `T` (what the operation answers) plus the replay
/// header and the guard's problems.
pub struct Idempotent<T>(Rendered<T>);

impl<T> From<Reply> for Idempotent<T> {
    fn from(reply: Reply) -> Self {
        Self(reply.into())
    }
}

impl<T: Send> IntoResponse for Idempotent<T> {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

impl<T: ApiResponse> ApiResponse for Idempotent<T> {
    fn meta() -> MetaResponses {
        let mut meta = T::meta();
        for response in &mut meta.responses {
            response.headers.extend([
                header(
                    REPLAYED_HEADER,
                    "`true` when this is the stored response of an earlier request with the same key",
                    false,
                    bool::schema_ref(),
                ),
                header(
                    KEY_EXPIRES_HEADER,
                    "When the key is forgotten (an HTTP date): this answer is replayed to every retry with the same key and request until then; from then on the same key is a new request",
                    true,
                    String::schema_ref(),
                ),
            ]);
        }
        let mut problems = responses::problems(&[
            (
                409,
                "A request with this key is still in flight, or this request lost its lease (`idempotency-key-in-flight`), or the tenant's data is being erased (`tenant-erasure-in-progress`); retry after `Retry-After` seconds",
            ),
            (422, "The key was already used with a different request"),
        ]);
        problems[0].headers.push(MetaHeader {
            name: "Retry-After".to_string(),
            description: Some(
                "Whole seconds to wait before retrying (1 or 2; 5 during an erasure)".into(),
            ),
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

/// A response header as the OpenAPI document describes it.
fn header(
    name: &str,
    description: &str,
    required: bool,
    schema: poem_openapi::registry::MetaSchemaRef,
) -> MetaHeader {
    MetaHeader {
        name: name.to_string(),
        description: Some(description.to_string()),
        required,
        deprecated: false,
        schema,
    }
}
