//! JWT verification and dev-token minting (docs/contract.md §2).
//!
//! Transport-neutral: verification answers a [`Principal`] or an [`AuthError`]; the
//! REST API and the MCP endpoint turn the error into their 401/403.
//!
//! Exactly one verifier is configured: an HS256 secret, a PEM public key, or a JWKS URL.
//! The accepted algorithm always follows from the key, never from the token: HS256 only
//! with the secret, RS256 with an RSA public key, ES256 with an EC one, and for a JWKS
//! the key's own `alg` (or its type). That refuses `alg: none` (not even parseable) and
//! algorithm confusion (an HS256 token "signed" with a public key as its secret).
//!
//! A token that verified is remembered for a while ([`verified`]), so a client that
//! sends the same token with every request pays for the check once.

pub mod jwks;
pub mod settings;
pub mod verified;

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use self::settings::JwtConfig;
use self::{
    jwks::{Jwks, SetState},
    verified::{VerifiedBy, VerifiedTokens},
};
use crate::{
    config::{ConfigError, Secret},
    tenant::TenantId,
};

/// Scope needed by every write.
pub const SCOPE_WRITE: &str = "orders:write";
/// Scope needed by every read.
pub const SCOPE_READ: &str = "orders:read";
/// Clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY_SECS: u64 = 30;

/// Why a request was not authenticated (401) or not authorised (403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// 401: the message says what is wrong with the token, never what was expected.
    #[error("{0}")]
    InvalidToken(&'static str),
    /// 403: a valid token without the scope the operation needs.
    #[error("this operation needs the `{0}` scope")]
    MissingScope(&'static str),
}

/// Who is calling: the verified claims that the rest of the service relies on.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: TenantId,
    /// The calling application or user: logged, never a metric label.
    pub subject: String,
    pub scopes: HashSet<String>,
}

impl Principal {
    /// [`AuthError::MissingScope`] unless the token carries `scope`.
    pub fn require(&self, scope: &'static str) -> Result<(), AuthError> {
        if self.scopes.contains(scope) {
            Ok(())
        } else {
            Err(AuthError::MissingScope(scope))
        }
    }
}

/// The claims orderd reads. Unknown claims are ignored; `iss`, `aud`, `exp` and `nbf`
/// are checked by the validation itself (`aud` may be a string or an array).
#[derive(Debug, Deserialize)]
struct Claims {
    tenant_id: Uuid,
    sub: String,
    scope: String,
    /// Already checked by the validation; read again to know how long the token lasts.
    exp: u64,
}

/// What `orderd token` signs.
#[derive(Debug, Serialize)]
struct MintedClaims<'a> {
    tenant_id: Uuid,
    sub: &'a str,
    exp: u64,
    iat: u64,
    scope: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<String>,
}

/// Where verification keys come from.
enum Keys {
    /// The shared secrets, the signing one first; a token verifies with any of them.
    Hs256(Vec<DecodingKey>),
    /// A public key and the one algorithm its type allows.
    Public(Algorithm, DecodingKey),
    Jwks(Arc<Jwks>),
}

/// Verifies bearer tokens against the configured key.
pub struct Verifier {
    keys: Keys,
    issuer: Option<String>,
    audience: Option<String>,
    verified: VerifiedTokens,
}

impl Verifier {
    /// Builds the verifier; fails at start-up when no key is configured or the key file
    /// cannot be read, naming the variable. A JWKS is fetched later (see
    /// [`Verifier::jwks`]), so a provider that is down does not stop the process.
    pub fn new(config: &JwtConfig) -> Result<Self, ConfigError> {
        let secrets = config.hs256_secrets();
        let keys = if !secrets.is_empty() {
            if secrets.len() > 1 {
                tracing::info!(
                    secrets = secrets.len(),
                    "tokens verify with any of the HS256 secrets; `orderd token` signs with the first"
                );
            }
            let keys = secrets
                .iter()
                .map(|secret| DecodingKey::from_secret(secret.expose().as_bytes()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    ConfigError::new(format!("ORDERD_JWT_HS256_SECRET is unusable: {e}"))
                })?;
            Keys::Hs256(keys)
        } else if let Some(path) = &config.public_key_file {
            let pem = std::fs::read(path).map_err(|e| {
                ConfigError::new(format!(
                    "ORDERD_JWT_PUBLIC_KEY_FILE {} cannot be read: {e}",
                    path.display()
                ))
            })?;
            if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                Keys::Public(Algorithm::RS256, key)
            } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                Keys::Public(Algorithm::ES256, key)
            } else {
                return Err(ConfigError::new(format!(
                    "ORDERD_JWT_PUBLIC_KEY_FILE {} is not an RSA or EC public key in PEM form",
                    path.display()
                )));
            }
        } else if let Some(url) = &config.jwks_url {
            Keys::Jwks(Arc::new(
                Jwks::new(url.clone()).stale_after(config.stale_readiness),
            ))
        } else {
            return Err(ConfigError::new(
                "set one of ORDERD_JWT_HS256_SECRET, ORDERD_JWT_PUBLIC_KEY_FILE and ORDERD_JWT_JWKS_URL to verify tokens",
            ));
        };
        Ok(Self {
            keys,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            verified: VerifiedTokens::default(),
        })
    }

    /// The key set, when tokens are verified against a JWKS (its refresh job needs it).
    pub fn jwks(&self) -> Option<Arc<Jwks>> {
        match &self.keys {
            Keys::Jwks(jwks) => Some(jwks.clone()),
            _ => None,
        }
    }

    /// Why this instance should not take traffic, as far as tokens go: a JWKS never
    /// fetched (no token verifies), or, where `ORDERD_JWT_STALE_READINESS_SECS` asks
    /// for it, one the provider has not confirmed for longer than that (withdrawn keys
    /// might still verify). Without that setting, a set once fetched keeps the instance
    /// ready however long the provider stays away: every instance would otherwise go
    /// at once, an identity provider's outage becoming orderd's.
    pub fn not_ready(&self) -> Option<&'static str> {
        match &self.keys {
            Keys::Jwks(jwks) => match jwks.state() {
                SetState::Missing => Some("no token verification keys yet"),
                SetState::Stale => Some("the token verification keys are stale"),
                SetState::Held => None,
            },
            _ => None,
        }
    }

    /// Verifies `token` and returns the caller, or why not; a token that verified
    /// recently with a key still in place is answered from memory.
    pub async fn verify(&self, token: &str) -> Result<Arc<Principal>, AuthError> {
        let checked = Instant::now();
        let in_place = |by: &VerifiedBy| match (by, &self.keys) {
            (VerifiedBy::Jwk { kid, digest }, Keys::Jwks(jwks)) => jwks.holds(kid, digest),
            (VerifiedBy::ConfiguredKey, Keys::Hs256(_) | Keys::Public(..)) => true,
            _ => false,
        };
        if let Some(principal) = self.verified.get(token, checked, in_place) {
            return Ok(principal);
        }
        let (principal, exp, by) = self.check(token).await?;
        let principal = Arc::new(principal);
        // The check accepts the token until `exp` plus the leeway, in whole seconds.
        let accepted_until = Duration::from_secs(exp.saturating_add(LEEWAY_SECS));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.verified.remember(
            token,
            principal.clone(),
            by,
            checked,
            accepted_until.saturating_sub(now),
        );
        Ok(principal)
    }

    /// The full check of a token's signature and claims: the caller, its `exp`, and the
    /// key that verified it.
    async fn check(&self, token: &str) -> Result<(Principal, u64, VerifiedBy), AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| {
            AuthError::InvalidToken("the token is malformed or uses an unsupported algorithm")
        })?;
        let not_accepted = AuthError::InvalidToken("the token's algorithm is not accepted");
        let configured = |(principal, exp)| (principal, exp, VerifiedBy::ConfiguredKey);
        match &self.keys {
            Keys::Hs256(keys) if header.alg == Algorithm::HS256 => {
                // The first secret whose signature matches decides; a token signed with
                // none of them is refused as a bad signature.
                let mut outcome = Err(AuthError::InvalidToken(BAD_SIGNATURE));
                for key in keys {
                    outcome = self.validate(token, header.alg, key);
                    if !matches!(outcome, Err(AuthError::InvalidToken(BAD_SIGNATURE))) {
                        break;
                    }
                }
                outcome.map(configured)
            }
            Keys::Public(alg, key) if header.alg == *alg => {
                self.validate(token, *alg, key).map(configured)
            }
            Keys::Jwks(jwks) => {
                let kid = header
                    .kid
                    .as_deref()
                    .ok_or(AuthError::InvalidToken("the token names no key (`kid`)"))?;
                let key = jwks.key(kid).await?;
                if header.alg != key.alg {
                    return Err(not_accepted);
                }
                let (principal, exp) = self.validate(token, key.alg, &key.decoding)?;
                let by = VerifiedBy::Jwk {
                    kid: kid.into(),
                    digest: key.digest,
                };
                Ok((principal, exp, by))
            }
            _ => Err(not_accepted),
        }
    }

    fn validate(
        &self,
        token: &str,
        alg: Algorithm,
        key: &DecodingKey,
    ) -> Result<(Principal, u64), AuthError> {
        let mut validation = Validation::new(alg);
        validation.required_spec_claims = ["exp", "sub"].into_iter().map(String::from).collect();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECS;
        match &self.issuer {
            Some(iss) => {
                validation.set_issuer(&[iss]);
                validation.required_spec_claims.insert("iss".into());
            }
            None => validation.iss = None,
        }
        match &self.audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                validation.required_spec_claims.insert("aud".into());
            }
            None => validation.validate_aud = false,
        }
        let data = jsonwebtoken::decode::<Claims>(token, key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            AuthError::InvalidToken(match e.kind() {
                ErrorKind::ExpiredSignature => "the token has expired",
                ErrorKind::ImmatureSignature => "the token is not valid yet (`nbf`)",
                ErrorKind::InvalidSignature => BAD_SIGNATURE,
                ErrorKind::InvalidIssuer => "the token's issuer is not accepted",
                ErrorKind::InvalidAudience => "the token's audience is not accepted",
                ErrorKind::MissingRequiredClaim(_) | ErrorKind::Json(_) => {
                    "the token lacks a required claim (tenant_id, sub, exp, scope) or one is malformed"
                }
                _ => "the token is invalid",
            })
        })?;
        let claims = data.claims;
        let principal = Principal {
            tenant: TenantId(claims.tenant_id),
            subject: claims.sub,
            scopes: claims
                .scope
                .split_ascii_whitespace()
                .map(String::from)
                .collect(),
        };
        Ok((principal, claims.exp))
    }
}

/// Why a token whose signature no configured key matches is refused.
const BAD_SIGNATURE: &str = "the token's signature is invalid";

/// Mints an HS256 token for development (`orderd token`).
pub fn mint_hs256(
    secret: &Secret,
    tenant: Uuid,
    subject: &str,
    scope: &str,
    ttl: Duration,
    issuer: Option<String>,
    audience: Option<String>,
) -> anyhow::Result<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = MintedClaims {
        tenant_id: tenant,
        sub: subject,
        exp: now.saturating_add(ttl.as_secs()),
        iat: now,
        scope,
        iss: issuer,
        aud: audience,
    };
    let key = EncodingKey::from_secret(secret.expose().as_bytes())?;
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &key,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> (Verifier, Secret) {
        let secret = Secret::new("unit-test-secret-0123456789abcdefghijkl");
        let v = Verifier::new(&JwtConfig {
            hs256_secret: Some(secret.clone()),
            ..Default::default()
        })
        .unwrap();
        (v, secret)
    }

    #[tokio::test]
    async fn a_minted_token_verifies_with_its_tenant_and_scopes() {
        let (v, secret) = verifier();
        let tenant = Uuid::new_v4();
        let token = mint_hs256(
            &secret,
            tenant,
            "app",
            "orders:read orders:write",
            Duration::from_secs(60),
            None,
            None,
        )
        .unwrap();
        let p = v.verify(&token).await.unwrap();
        assert_eq!(p.tenant, TenantId(tenant));
        assert!(p.require(SCOPE_WRITE).is_ok() && p.require(SCOPE_READ).is_ok());
        assert_eq!(
            p.require("admin").unwrap_err(),
            AuthError::MissingScope("admin")
        );
    }

    /// A token signed with `secret` for a fresh tenant.
    fn signed_with(secret: &str) -> String {
        mint_hs256(
            &Secret::new(secret),
            Uuid::new_v4(),
            "app",
            "orders:read",
            Duration::from_secs(60),
            None,
            None,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn during_a_rotation_every_secret_verifies_and_none_other() {
        let new = "rotation-new-secret-0123456789abcdefgh";
        let old = "rotation-old-secret-0123456789abcdefgh";
        let config = JwtConfig {
            hs256_secret: Some(Secret::new(format!("{new},{old}"))),
            ..Default::default()
        };
        assert_eq!(config.signing_secret().unwrap().expose(), new);
        let v = Verifier::new(&config).unwrap();
        v.verify(&signed_with(new)).await.unwrap();
        v.verify(&signed_with(old)).await.unwrap();
        assert_eq!(
            v.verify(&signed_with("another-secret-0123456789abcdefghijk"))
                .await
                .unwrap_err(),
            AuthError::InvalidToken(BAD_SIGNATURE)
        );
    }

    #[test]
    fn no_key_configured_is_a_startup_error() {
        assert!(Verifier::new(&JwtConfig::default()).is_err());
    }
}
