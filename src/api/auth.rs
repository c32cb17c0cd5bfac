//! The one way a request's bearer token becomes a [`Caller`], for REST and MCP alike
//! ([`authenticate`]), and the REST security scheme that also admits the request under
//! its tenant's limits.

use std::sync::Arc;

use poem::Request;
use poem_openapi::{SecurityScheme, auth::Bearer};

use super::{
    limits::{Admission, TenantLimiter},
    problem::Problem,
    routes::Route,
};
use crate::{
    auth::{AuthError, Verifier},
    service::Caller,
};

/// JWT bearer token with `tenant_id`, `sub`, `exp` and `scope` claims; `orders:write`
/// for creating and cancelling, `orders:read` for reading.
///
/// Declared first in every operation so that authentication, and the tenant's rate
/// limit, are decided before the body is parsed or any idempotency record is touched.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", bearer_format = "JWT", checker = "verify_bearer")]
pub struct BearerAuth(pub Admitted);

/// A verified caller, holding one of its tenant's in-flight permits until dropped.
pub struct Admitted {
    pub caller: Caller,
    _admission: Admission,
}

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

async fn verify_bearer(req: &Request, bearer: Bearer) -> poem::Result<Admitted> {
    let (Some(verifier), Some(limiter)) = (
        req.data::<Arc<Verifier>>(),
        req.data::<Arc<TenantLimiter>>(),
    ) else {
        return Err(Problem::internal(anyhow::anyhow!(
            "no token verifier or tenant limiter installed on the route"
        ))
        .into());
    };
    let caller = authenticate(verifier, &bearer.token)
        .await
        .map_err(Problem::from)?
        .with_trace(crate::telemetry::request_trace(req.extensions().get()));
    let route = Route::of_path(req.uri().path());
    let admission = limiter.admit(caller.tenant(), route).await?;
    Ok(Admitted {
        caller,
        _admission: admission,
    })
}
