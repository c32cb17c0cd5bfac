//! `/mcp`: the Model Context Protocol over Streamable HTTP, so that an AI agent can act
//! for a tenant with the guarantees REST callers get (docs/contract.md §9).
//!
//! The protocol is the official Rust SDK's (`rmcp`'s `StreamableHttpService`: stateless,
//! JSON responses), mounted in poem by a small adapter. Before any MCP message is read,
//! the request head passes the same gate as REST (`api::auth::Gate`): a browser
//! `Origin` must be allowed ([`check_origin`], DNS-rebinding protection), and the
//! bearer token must verify, else 401 with a challenge naming the protected-resource
//! metadata (RFC 9728, [`challenge`]) so that MCP clients can find where tokens come
//! from. Every request then counts once against the tenant's limits, before the SDK
//! sees it; scopes apply per tool call. Only `POST` carries a message: any other method
//! is answered 405 with its body unread.
//! The tools themselves ([`tools`]) are thin: they parse their arguments and call the
//! application layer, as the REST handlers do.

mod tools;

use std::{convert::Infallible, sync::Arc};

use futures::TryStreamExt;
use http_body_util::{BodyExt, Full};
use poem::{
    Body, Endpoint, Request, Response,
    http::{HeaderValue, Method, StatusCode, header},
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
    problem::{AppKind, Kind, Problem},
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
        let tools = OrderTools { service };
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
        // Only a POST carries an MCP message; its body was read under the body limit
        // (`middleware::limit_body`). Any other method is counted, then answered 405,
        // its body never read.
        if req.method() != Method::POST {
            let _admission = self.limiter.admit(caller.tenant(), Route::Mcp).await?;
            return Err(Problem::new(Kind::MethodNotAllowed).with_header(
                header::ALLOW,
                HeaderValue::from_static(Route::Mcp.allowed_methods()),
            ));
        }
        let (parts, body) = req.into_parts();
        let bytes = body
            .into_bytes()
            .await
            .map_err(|e| Problem::app(AppKind::ValidationError).with_detail(e.to_string()))?;
        // Every MCP request counts against the caller's tenant limits once, here,
        // before the protocol layer looks at it (so a request it would refuse, for a
        // wrong `Accept` say, counts too). A tool call counts against its REST twin's
        // route; a refused `tools/call` is a tool result the model can read, anything
        // else refused is HTTP 429.
        let call = ToolCall::of(&bytes);
        let route = call.as_ref().map_or(Route::Mcp, |c| c.route);
        let admission = match self.limiter.admit(caller.tenant(), route).await {
            Ok(admission) => admission,
            Err(problem) => {
                return match call.and_then(|c| c.id) {
                    Some(id) => Ok(tools::refused_call(id, &problem)),
                    None => Err(problem),
                };
            }
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
        // The admission (one of the tenant's in-flight permits) is held until the
        // answer has been sent, however the SDK produces it.
        let stream = body
            .into_data_stream()
            .map_err(|never: Infallible| -> std::io::Error { match never {} })
            .map_ok(move |chunk| {
                let _held = &admission;
                chunk
            });
        let mut response = Response::from_parts(
            poem::ResponseParts {
                status: head.status,
                version: head.version,
                headers: head.headers,
                extensions: head.extensions,
            },
            Body::from_bytes_stream(stream),
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

/// A JSON-RPC `tools/call`, as far as the limits need to know it: the route of the
/// tool it names (its REST twin's, or `/mcp` for a name no tool has) and the request's
/// id, which a refusal answers.
struct ToolCall {
    route: Route,
    id: Option<serde_json::Value>,
}

impl ToolCall {
    /// The call in `body`, if the body is one (however malformed its parameters).
    fn of(body: &[u8]) -> Option<ToolCall> {
        #[derive(serde::Deserialize)]
        struct Message<'a> {
            #[serde(borrow)]
            method: Option<std::borrow::Cow<'a, str>>,
            id: Option<serde_json::Value>,
            params: Option<serde_json::Value>,
        }
        let message = serde_json::from_slice::<Message>(body).ok()?;
        if message.method.as_deref() != Some("tools/call") {
            return None;
        }
        let name = message
            .params
            .as_ref()
            .and_then(|p| p.get("name"))
            .and_then(serde_json::Value::as_str);
        Some(ToolCall {
            route: name.map_or(Route::Mcp, tools::route_of),
            // JSON-RPC ids are strings or numbers; anything else is no id to answer.
            id: message.id.filter(|id| id.is_string() || id.is_number()),
        })
    }
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
