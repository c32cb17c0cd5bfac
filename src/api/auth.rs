//! The bearer security scheme: turns `Authorization: Bearer <JWT>` into a [`Principal`].

use std::sync::Arc;

use poem::Request;
use poem_openapi::{SecurityScheme, auth::Bearer};

use super::problem::Problem;
use crate::auth::{Principal, Verifier};

/// JWT (HS256, RS256 or ES256) with `tenant_id`, `sub`, `exp` and `scope` claims.
///
/// A verified caller. Declared first in every operation so that authentication is
/// decided before the body is parsed.
#[derive(SecurityScheme)]
#[oai(ty = "bearer", bearer_format = "JWT", checker = "verify_bearer")]
pub struct BearerAuth(pub Principal);

async fn verify_bearer(req: &Request, bearer: Bearer) -> poem::Result<Principal> {
    let verifier = req.data::<Arc<Verifier>>().ok_or_else(|| {
        Problem::internal(anyhow::anyhow!("no token verifier installed on the route"))
    })?;
    let principal = verifier.verify(&bearer.token).map_err(Problem::from)?;
    crate::telemetry::note_caller(principal.tenant, &principal.subject);
    Ok(principal)
}
