//! The one way a request's bearer token becomes a [`Caller`], for REST and MCP alike,
//! decided from the request head alone ([`Gate`]), before a byte of the body is read.
//!
//! Why the head: a body is memory. Were it read first, anybody without a token could
//! pin up to the body limit per connection for the whole read timeout (measured: 1,500
//! such connections grew the process by 202 MiB). So a request to a route that needs a
//! token is verified from its `Authorization` header, and on REST admitted under its
//! tenant's rate limit too (which needs no body either); a request that fails is
//! answered at once with `Connection: close`, its body never read by orderd. hyper,
//! which writes the answer, then does what is wanted with the unread body: one read of
//! what has already arrived (so that a client that sent it at once reads the answer
//! rather than a reset), never a `100 Continue`, then it closes. Reading the rest
//! here instead was measured: every refused connection's read buffer grew to 64 KiB,
//! +97 MiB at 1,500 connections, against +23 to +27 MiB (what the connections cost
//! with no body at all: +21 MiB) when left to hyper. Only an admitted request has its
//! body read, by `middleware::limit_body`.

use std::sync::{Arc, Mutex};

use poem::{
    Endpoint, IntoResponse, Request, Response,
    http::{HeaderValue, header},
};
use poem_openapi::{SecurityScheme, auth::Bearer};

use super::{
    limits::{Admission, TenantLimiter},
    mcp,
    problem::Problem,
    routes::Route,
    server::Conn,
};
use crate::{
    auth::{AuthError, Verifier},
    service::Caller,
};

/// JWT bearer token with `tenant_id`, `sub`, `exp` and `scope` claims; `orders:write`
/// for creating and cancelling, `orders:read` for reading.
///
/// The token is verified, and the tenant's rate limit applied, from the request head,
/// before any of the body is read: a request without a valid token is answered 401 at
/// once, with `Connection: close`.
// (The gate, `Gate`, does that work; this scheme's checker hands the operation what the
// gate found, and the scheme documents itself in the OpenAPI document.)
#[derive(SecurityScheme)]
#[oai(ty = "bearer", bearer_format = "JWT", checker = "admitted_by_gate")]
pub struct BearerAuth(pub Admitted);

/// A verified caller, holding one of its tenant's in-flight permits until dropped.
pub struct Admitted {
    pub caller: Caller,
    _admission: Admission,
}

/// What the gate admitted, kept in the request's extensions until the operation takes
/// it (extensions must be `Clone`; the admission inside is taken exactly once).
#[derive(Clone)]
struct AdmittedByGate(Arc<Mutex<Option<Admitted>>>);

/// The token of an `Authorization: Bearer` header value, if it is one.
pub fn bearer_token(header: Option<&str>) -> Result<&str, AuthError> {
    header
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or(AuthError::InvalidToken("a bearer token is required"))
}

/// Verifies the token: the caller it names, noted for the request's log line.
pub async fn authenticate(verifier: &Verifier, token: &str) -> Result<Caller, AuthError> {
    let principal = verifier.verify(token).await?;
    crate::telemetry::note_caller(principal.tenant, &principal.subject);
    Ok(Caller::new(principal))
}

/// Decides from the head whether a request may go on to have its body read.
pub struct Gate {
    pub verifier: Arc<Verifier>,
    pub limiter: Arc<TenantLimiter>,
    /// Browser origins allowed on `/mcp`.
    pub mcp_origins: Arc<Vec<String>>,
    /// Where clients reach the service, as the `/mcp` challenge names the metadata.
    pub public_url: Arc<str>,
}

impl Gate {
    /// Around the routes: a request the head does not admit is answered here, its body
    /// unread.
    pub async fn around<E: Endpoint>(
        self: Arc<Self>,
        inner: Arc<E>,
        mut req: Request,
    ) -> poem::Result<Response> {
        let route = Route::of_path(req.uri().path());
        match self.admit(route, &mut req).await {
            Ok(()) => inner.call(req).await.map(IntoResponse::into_response),
            Err(problem) => {
                let path = req.uri().path().to_string();
                // Nothing more is read of this request: its read deadline is over.
                if let Some(conn) = req.extensions().get::<Arc<Conn>>() {
                    conn.body_received();
                }
                let mut response = problem.to_response(Some(&path));
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                Ok(response)
            }
        }
    }

    /// Verifies the head's token where the route needs one, and leaves what it found in
    /// the request: the caller on `/mcp` (whose tool calls are admitted per call), the
    /// caller and its admission under the tenant's limits on the REST routes.
    async fn admit(&self, route: Route, req: &mut Request) -> Result<(), Problem> {
        if !route.needs_token() {
            return Ok(());
        }
        if route == Route::Mcp {
            mcp::check_origin(req.headers(), &self.mcp_origins)?;
        }
        let caller = match self.caller(req).await {
            Ok(caller) => caller,
            Err(e) if route == Route::Mcp => return Err(mcp::challenge(&self.public_url, e)),
            Err(e) => return Err(e.into()),
        };
        if route == Route::Mcp {
            req.extensions_mut().insert(caller);
            return Ok(());
        }
        let admission = self.limiter.admit(caller.tenant(), route).await?;
        req.extensions_mut()
            .insert(AdmittedByGate(Arc::new(Mutex::new(Some(Admitted {
                caller,
                _admission: admission,
            })))));
        Ok(())
    }

    async fn caller(&self, req: &Request) -> Result<Caller, AuthError> {
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let caller = authenticate(&self.verifier, bearer_token(header)?).await?;
        Ok(caller.with_trace(crate::telemetry::request_trace(req.extensions().get())))
    }
}

/// The security scheme's checker: the admission the gate left in the request.
async fn admitted_by_gate(req: &Request, _bearer: Bearer) -> poem::Result<Admitted> {
    req.extensions()
        .get::<AdmittedByGate>()
        .and_then(|found| found.0.lock().ok()?.take())
        .ok_or_else(|| {
            Problem::internal(anyhow::anyhow!(
                "a REST operation ran without the gate's admission"
            ))
            .into()
        })
}
