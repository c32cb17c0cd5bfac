//! Cross-cutting HTTP behaviour, one concern per function, composed around the routes
//! in `api::routes` (outermost first):
//!
//! - [`access_log`]: the request id, the HTTP metrics and the one log line per request;
//! - [`limit_uri`]: the length of the request target;
//! - `auth::Gate`: the token (and the tenant's rate limit) from the head alone; a
//!   request it refuses is answered without its body being read;
//! - [`limit_body`]: the URI and body limits and the body's deadline, before any
//!   handler reads the body, for the routes that take one;
//! - [`errors_as_problems`]: every error (ours, poem's, poem-openapi's) as problem+json;
//! - [`panic_response`]: a panicking handler answers a plain 500 problem.

use std::{sync::Arc, time::Instant};

use futures::FutureExt;
use poem::{
    Body, Endpoint, IntoResponse, Request, Response,
    http::{HeaderValue, StatusCode, header},
};
use tokio::io::{AsyncRead, AsyncReadExt};

use poem_openapi::error::{ParseParamError, ParsePathError};

use super::{
    problem::{AppKind, AppProblem, Kind, Problem},
    routes::Route,
    server::Conn,
};
use crate::{metrics, service::LIMIT_MAX, telemetry, trace_context::TraceContext};
use tracing::Instrument;

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest accepted request target (path and query).
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Request id, metrics, the request's server span and its log line, around everything
/// else.
pub async fn access_log<E: Endpoint>(inner: Arc<E>, mut req: Request) -> poem::Result<Response> {
    let started = Instant::now();
    let method = req.method().clone();
    let route = Route::of_path(req.uri().path());
    let request_id = request_id(&req);
    let trace = TraceContext::from_headers(req.headers());
    // HTTP semantic conventions: the route template, never the path with its ids.
    let span = tracing::info_span!(
        target: telemetry::SPANS,
        "request",
        otel.name = %format_args!("{method} {}", route.as_str()),
        otel.kind = "server",
        http.request.method = %method,
        http.route = route.as_str(),
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    telemetry::continue_trace(&span, trace.as_ref());
    // Parsed once here; the transports read it from the request when they build the
    // caller.
    if let Some(trace) = &trace {
        req.extensions_mut().insert(trace.clone());
    }
    let (response, context) = telemetry::with_request_context(
        async { inner.call(req).await.map(IntoResponse::into_response) }.instrument(span.clone()),
    )
    .await;
    // The layers inside turn every error into a response; this is only a backstop.
    let mut response = response.unwrap_or_else(|err| err.into_response());
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status().as_u16();
    let elapsed = started.elapsed().as_secs_f64();
    metrics::http_request(method.as_str(), route, status, elapsed);
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
    let (trace_id, span_id) = telemetry::trace_ids(&span, trace.as_ref());
    tracing::info!(
        method = %method,
        route = route.as_str(),
        transport = route.transport(),
        status,
        latency_ms = elapsed * 1000.0,
        tenant = context.tenant.map(|t| t.to_string()),
        sub = context.subject,
        request_id = %request_id,
        idempotency = context.outcome,
        trace_id,
        span_id,
        "request"
    );
    Ok(response)
}

/// Answers every error of the routes inside as problem+json, `instance` being the path;
/// a 405 also says which methods the route has (`Allow`, as RFC 9110 asks).
pub async fn errors_as_problems<E: Endpoint>(
    inner: Arc<E>,
    req: Request,
) -> poem::Result<Response> {
    let path = req.uri().path().to_string();
    Ok(match inner.call(req).await {
        Ok(output) => output.into_response(),
        Err(err) => {
            let mut problem = to_problem(err);
            if problem.kind == Kind::MethodNotAllowed {
                let allowed = Route::of_path(&path).allowed_methods();
                problem = problem.with_header(header::ALLOW, HeaderValue::from_static(allowed));
            }
            problem.to_response(Some(&path))
        }
    })
}

/// Refuses request targets over [`MAX_URI_BYTES`] (414), before anything else looks at
/// the request.
pub async fn limit_uri<E: Endpoint>(inner: Arc<E>, req: Request) -> poem::Result<Response> {
    if req.uri().to_string().len() > MAX_URI_BYTES {
        let problem = Problem::new(Kind::UriTooLong).with_detail(format!(
            "request targets are limited to {MAX_URI_BYTES} bytes"
        ));
        return Ok(closing(problem.to_response(Some(req.uri().path()))));
    }
    inner.call(req).await.map(IntoResponse::into_response)
}

/// Refuses bodies over [`MAX_BODY_BYTES`], declared or streamed (413), and answers 408
/// when the body has not arrived by the request's read deadline; all before any handler
/// runs. Only the routes and methods that take a body have it read (after the gate
/// admitted them); any other body is left unread, never held.
pub async fn limit_body<E: Endpoint>(inner: Arc<E>, mut req: Request) -> poem::Result<Response> {
    let path = req.uri().path().to_string();
    let conn = req.extensions().get::<Arc<Conn>>().cloned();
    let buffered = match &conn {
        _ if !Route::of_path(&path).takes_body(req.method()) => Ok(()),
        Some(conn) => {
            // A body that came with its head (most do) is read without arming the
            // deadline's timer, which costs a replay more than reading the body does.
            let mut buffering = std::pin::pin!(buffer_body(&mut req));
            match buffering.as_mut().now_or_never() {
                Some(buffered) => buffered,
                None => tokio::time::timeout_at(conn.request_deadline(), buffering)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Problem::new(Kind::RequestTimeout)
                            .with_detail("the request body did not arrive in time"))
                    }),
            }
        }
        None => buffer_body(&mut req).await,
    };
    if let Some(conn) = &conn {
        conn.body_received();
    }
    match buffered {
        Ok(()) => inner.call(req).await.map(IntoResponse::into_response),
        Err(problem) if problem.kind == Kind::RequestTimeout => {
            Ok(closing(problem.to_response(Some(&path))))
        }
        Err(problem) => Ok(problem.to_response(Some(&path))),
    }
}

/// Asks the server to close the connection after this response.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The header that carries a request's id in and out.
pub const REQUEST_ID: &str = "x-request-id";

/// The caller's `X-Request-Id` when it is a sane token (printable ASCII, at most 128
/// characters, so it cannot forge log lines), otherwise a fresh UUID.
fn request_id(req: &Request) -> String {
    req.headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(String::from)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// How much of an oversized body is read and thrown away before answering 413, so the
/// client (which is still sending) receives the answer instead of a connection reset.
const DRAIN_CAP: u64 = 1024 * 1024;
/// How long that draining may take; a slow sender is simply cut off.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads the body into memory, refusing it past [`MAX_BODY_BYTES`].
async fn buffer_body(req: &mut Request) -> Result<(), Problem> {
    let too_large = || {
        Problem::new(Kind::PayloadTooLarge).with_detail(format!(
            "request bodies are limited to {MAX_BODY_BYTES} bytes"
        ))
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        drain(req.take_body().into_async_read()).await;
        return Err(too_large());
    }
    let mut reader = req.take_body().into_async_read();
    let mut body = Vec::new();
    let read = (&mut reader)
        .take(MAX_BODY_BYTES as u64 + 1)
        .read_to_end(&mut body)
        .await;
    match read {
        Err(e) => Err(Problem::app(AppKind::ValidationError)
            .with_detail(format!("the body could not be read: {e}"))),
        Ok(_) if body.len() > MAX_BODY_BYTES => {
            drain(reader).await;
            Err(too_large())
        }
        Ok(_) => {
            req.set_body(Body::from_vec(body));
            Ok(())
        }
    }
}

async fn drain(reader: impl AsyncRead + Unpin) {
    let mut capped = reader.take(DRAIN_CAP);
    let _ = tokio::time::timeout(
        DRAIN_TIMEOUT,
        tokio::io::copy(&mut capped, &mut tokio::io::sink()),
    )
    .await;
}

/// Maps any error to the service's problem types; ours pass through unchanged. What the
/// framework refuses is said in the service's words: no framework type or parameter
/// names reach a client.
pub fn to_problem(err: poem::Error) -> Problem {
    if let Some(problem) = err.downcast_ref::<Problem>() {
        return problem.clone();
    }
    if let Some(problem) = err.downcast_ref::<AppProblem>() {
        return problem.clone().into();
    }
    if err.is::<ParsePathError>() {
        // The only path parameter of the API is an order id.
        return invalid("id", "must be a UUID");
    }
    if let Some(param) = err.downcast_ref::<ParseParamError>() {
        let message = match param.name {
            "limit" => format!("must be a whole number from 1 to {LIMIT_MAX}"),
            _ => "is not valid here".to_string(),
        };
        return invalid(param.name, &message);
    }
    match err.status() {
        StatusCode::UNAUTHORIZED => Problem::unauthorized("a bearer token is required"),
        StatusCode::NOT_FOUND => Problem::app(AppKind::NotFound).with_detail("no such resource"),
        StatusCode::METHOD_NOT_ALLOWED => Problem::new(Kind::MethodNotAllowed),
        StatusCode::PAYLOAD_TOO_LARGE => Problem::new(Kind::PayloadTooLarge),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Problem::new(Kind::UnsupportedMediaType)
            .with_detail("send the body as `application/json`"),
        s if s.is_server_error() => Problem::internal(anyhow::anyhow!("{err}")),
        // Anything else a client can cause is a malformed request; the framework's
        // wording stays in the log.
        _ => {
            tracing::debug!(error = %err, "request refused by the HTTP layer");
            Problem::app(AppKind::ValidationError).with_detail("the request is not valid")
        }
    }
}

fn invalid(field: &str, message: &str) -> Problem {
    Problem::invalid_field(field, message)
}

/// The answer to a panic: a plain 500 problem, the panic itself goes to the log.
pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    Problem::internal(anyhow::anyhow!("handler panicked: {what}")).to_response(None)
}
