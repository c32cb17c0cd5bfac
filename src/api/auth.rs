//! The bearer security scheme: turns `Authorization: Bearer <JWT>` into a [`Caller`],
//! admitted by the tenant's limits.

use std::{ops::Deref, sync::Arc};

use poem::Request;
use poem_openapi::{SecurityScheme, auth::Bearer};

use super::{
    limits::{Admission, TenantLimiter},
    problem::Problem,
};
use crate::{
    auth::{Principal, Verifier},
    metrics::Route,
};

/// JWT bearer token with `tenant_id`, `sub`, `exp` and `scope` claims; `orders:write`
/// for creating and cancelling, `orders:read` for reading.
///
/// Declared first in every operation so that authentication, and the tenant's rate
/// limit, are decided before the body is parsed or any idempotency record is touched.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", bearer_format = "JWT", checker = "verify_bearer")]
pub struct BearerAuth(pub Caller);

/// A verified caller, holding one of its tenant's in-flight permits until dropped.
pub struct Caller {
    pub principal: Arc<Principal>,
    _admission: Admission,
}

impl Deref for Caller {
    type Target = Principal;

    fn deref(&self) -> &Principal {
        &self.principal
    }
}

/// Verifies the token and admits the request under its tenant's limits.
pub async fn admit(
    verifier: &Verifier,
    limiter: &Arc<TenantLimiter>,
    token: &str,
    route: Route,
) -> Result<Caller, Problem> {
    let principal = verifier.verify(token).await?;
    crate::telemetry::note_caller(principal.tenant, &principal.subject);
    let admission = limiter.admit(principal.tenant, route).await?;
    Ok(Caller {
        principal,
        _admission: admission,
    })
}

async fn verify_bearer(req: &Request, bearer: Bearer) -> poem::Result<Caller> {
    let (Some(verifier), Some(limiter)) = (
        req.data::<Arc<Verifier>>(),
        req.data::<Arc<TenantLimiter>>(),
    ) else {
        return Err(Problem::internal(anyhow::anyhow!(
            "no token verifier or tenant limiter installed on the route"
        ))
        .into());
    };
    let route = Route::of_path(req.uri().path());
    Ok(admit(verifier, limiter, &bearer.token, route).await?)
}
