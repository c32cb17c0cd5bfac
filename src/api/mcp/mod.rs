//! `/mcp`: the Model Context Protocol over Streamable HTTP, so that an AI agent can act
//! for a tenant with the guarantees REST callers get (docs/contract.md §9).
//!
//! The protocol is the official Rust SDK's (`rmcp`'s `StreamableHttpService`: stateless,
//! JSON responses), mounted in poem by a small adapter. Before any MCP message is read,
//! the request head passes the same gate as REST (`api::auth::Gate`): a browser
//! `Origin` must be allowed ([`check_origin`], DNS-rebinding protection), and the
//! bearer token must verify, else 401 with a challenge naming the protected-resource
//! metadata (RFC 9728, [`challenge`]) so that MCP clients can find where tokens come
//! from. Scopes and the tenant's limits apply per tool call.
//! The tools themselves ([`tools`]) are thin: they parse their arguments and call the
//! application layer, as the REST handlers do.

mod tools;

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::{BodyExt, Full};
use poem::{
    Body, Endpoint, Request, Response,
    http::{HeaderValue, StatusCode, header},
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
};
use serde_json::json;
use tower_service::Service;

pub use self::tools::{KEY_EXPIRES_META, OrderTools};
use super::{
    Shared,
    limits::TenantLimiter,
    problem::{AppKind, Problem},
    routes::Route,
};
use crate::{
    auth::{AuthError, SCOPE_READ, SCOPE_WRITE},
    service::{self, Caller},
};

/// Where the protected-resource metadata is served.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The `/mcp` endpoint.
pub struct Mcp {
    service: StreamableHttpService<OrderTools, NeverSessionManager>,
    limiter: Arc<TenantLimiter>,
}

impl Mcp {
    pub fn new(service: service::Service, shared: &Shared) -> Self {
        let tools = OrderTools {
            service,
            limiter: shared.limiter.clone(),
        };
        // Stateless, JSON answers; the Host header is not checked here because orderd
        // serves public names behind a balancer: browsers are kept out by `Origin`.
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .disable_allowed_hosts();
        Self {
            service: StreamableHttpService::new(
                move || Ok(tools.clone()),
                Arc::new(NeverSessionManager::default()),
                config,
            ),
            limiter: shared.limiter.clone(),
        }
    }

    async fn handle(&self, req: Request) -> Result<Response, Problem> {
        // The gate verified the token (and the origin) from the head.
        let caller = req.extensions().get::<Caller>().cloned().ok_or_else(|| {
            Problem::internal(anyhow::anyhow!(
                "/mcp was reached without the gate's caller"
            ))
        })?;
        let (parts, body) = req.into_parts();
        let bytes = body
            .into_bytes()
            .await
            .map_err(|e| Problem::app(AppKind::ValidationError).with_detail(e.to_string()))?;
        // Every MCP request counts against the caller's tenant limits. A tool call
        // that reaches the tools (a name and arguments that are an object) is admitted
        // there, and its refusal is a tool result the model can read, whatever the
        // name; everything else (initialize, listings, pings, notifications, a call
        // whose parameters the SDK refuses before any tool sees them) is admitted here
        // and refused as HTTP 429.
        let _admission = if reaches_the_tools(&bytes) {
            None
        } else {
            Some(self.limiter.admit(caller.tenant(), Route::Mcp).await?)
        };
        let mut http_req = http::Request::builder()
            .method(parts.method)
            .uri(parts.uri)
            .version(parts.version)
            .body(Full::new(bytes))
            .map_err(|e| Problem::internal(anyhow::anyhow!(e)))?;
        *http_req.headers_mut() = parts.headers;
        http_req.extensions_mut().insert(caller);
        let mut service = self.service.clone();
        let Ok(answer) = service.call(http_req).await;
        let (head, body) = answer.into_parts();
        let stream = body
            .into_data_stream()
            .map_err(|never: Infallible| -> std::io::Error { match never {} });
        let mut response = Response::from_parts(
            poem::ResponseParts {
                status: head.status,
                version: head.version,
                headers: head.headers,
                extensions: head.extensions,
            },
            Body::from_bytes_stream(stream.map_ok(Bytes::from)),
        );
        if response.status() == StatusCode::METHOD_NOT_ALLOWED
            && !response.headers().contains_key(header::ALLOW)
        {
            response.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static(Route::Mcp.allowed_methods()),
            );
        }
        Ok(response)
    }
}

/// Refuses a browser `Origin` that is not allowed (DNS-rebinding protection): 403.
pub fn check_origin(headers: &http::HeaderMap, allowed: &[String]) -> Result<(), Problem> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        if !allowed.iter().any(|allowed| allowed == origin) {
            return Err(Problem::app(AppKind::Forbidden).with_detail(format!(
                "requests from the browser origin `{origin}` are not allowed here"
            )));
        }
    }
    Ok(())
}

/// Whether a request body is a JSON-RPC `tools/call` whose parameters the SDK hands to
/// the tools: a name, and arguments that are an object or absent.
fn reaches_the_tools(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
        params: Option<Params<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(borrow)]
        #[allow(dead_code)]
        name: std::borrow::Cow<'a, str>,
        #[allow(dead_code)]
        arguments: Option<serde_json::Map<String, serde_json::Value>>,
    }
    serde_json::from_slice::<Call>(body)
        .is_ok_and(|c| c.method.as_deref() == Some("tools/call") && c.params.is_some())
}

/// A 401 whose challenge names the protected-resource metadata, at the configured
/// public URL (never one built from the request's `Host`, which a client chooses).
pub fn challenge(public_url: &str, err: AuthError) -> Problem {
    let metadata = format!("{public_url}{METADATA_PATH}");
    let mut problem = Problem::from(err);
    let value = format!(r#"Bearer error="invalid_token", resource_metadata="{metadata}""#);
    if let Ok(value) = HeaderValue::from_str(&value) {
        problem
            .headers
            .retain(|(name, _)| name != header::WWW_AUTHENTICATE);
        problem = problem.with_header(header::WWW_AUTHENTICATE, value);
    }
    problem
}

impl Endpoint for Mcp {
    type Output = Response;

    async fn call(&self, req: Request) -> poem::Result<Response> {
        let path = req.uri().path().to_string();
        Ok(match self.handle(req).await {
            Ok(response) => response,
            Err(problem) => problem.to_response(Some(&path)),
        })
    }
}

/// `GET /.well-known/oauth-protected-resource`: RFC 9728 metadata of the `/mcp`
/// resource: where tokens come from (the configured issuer) and which scopes exist.
pub fn metadata_endpoint(issuer: Option<String>, public_url: &str) -> impl Endpoint + use<> {
    let resource = format!("{public_url}/mcp");
    poem::get(poem::endpoint::make_sync(move |_: Request| {
        let mut metadata = json!({
            "resource": resource,
            "scopes_supported": [SCOPE_READ, SCOPE_WRITE],
            "bearer_methods_supported": ["header"],
            "resource_name": "orderd",
        });
        if let Some(issuer) = &issuer {
            metadata["authorization_servers"] = json!([issuer]);
        }
        Response::builder()
            .content_type("application/json")
            .body(metadata.to_string())
    }))
}
