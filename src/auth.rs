//! JWT verification and dev-token minting (docs/contract.md, "Authentication").
//!
//! Transport-neutral: verification answers a [`Principal`] or an [`AuthError`]; the
//! REST API and the MCP endpoint turn the error into their 401/403.
//!
//! The accepted algorithm is decided by which key is configured, never by the token:
//! HS256 only with a shared secret, RS256 only with an RSA public key, ES256 only with
//! an EC public key. That refuses `alg: none` (not even parseable) and algorithm
//! confusion (an HS256 token "signed" with the public key as secret).

use std::{collections::HashSet, time::Duration};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{
    config::{ConfigError, JwtConfig, Secret},
    tenant::TenantId,
};

/// Scope needed by every write.
pub const SCOPE_WRITE: &str = "orders:write";
/// Scope needed by every read.
pub const SCOPE_READ: &str = "orders:read";

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

/// The claims orderd reads. Unknown claims are ignored.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub tenant_id: Uuid,
    pub sub: String,
    pub exp: u64,
    pub scope: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
}

/// Verifies bearer tokens against the configured keys.
pub struct Verifier {
    hs256: Option<DecodingKey>,
    /// The public key and the one algorithm its type allows.
    public: Option<(Algorithm, DecodingKey)>,
    issuer: Option<String>,
    audience: Option<String>,
}

impl Verifier {
    /// Builds the verifier; fails at start-up when no key is configured or the key file
    /// cannot be read, naming the variable.
    pub fn new(config: &JwtConfig) -> Result<Self, ConfigError> {
        let hs256 = match &config.hs256_secret {
            Some(secret) => Some(
                DecodingKey::from_secret(secret.expose().as_bytes()).map_err(|e| {
                    ConfigError::new(format!("ORDERD_JWT_HS256_SECRET is unusable: {e}"))
                })?,
            ),
            None => None,
        };
        let public = match &config.public_key_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    ConfigError::new(format!(
                        "ORDERD_JWT_PUBLIC_KEY_FILE {} cannot be read: {e}",
                        path.display()
                    ))
                })?;
                if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                    Some((Algorithm::RS256, key))
                } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                    Some((Algorithm::ES256, key))
                } else {
                    return Err(ConfigError::new(format!(
                        "ORDERD_JWT_PUBLIC_KEY_FILE {} is not an RSA or EC public key in PEM form",
                        path.display()
                    )));
                }
            }
            None => None,
        };
        if hs256.is_none() && public.is_none() {
            return Err(ConfigError::new(
                "ORDERD_JWT_HS256_SECRET or ORDERD_JWT_PUBLIC_KEY_FILE must be set to verify tokens",
            ));
        }
        Ok(Self {
            hs256,
            public,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
        })
    }

    /// Verifies `token` and returns the caller, or why not.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| {
            AuthError::InvalidToken("the token is malformed or uses an unsupported algorithm")
        })?;
        let key = match (header.alg, &self.hs256, &self.public) {
            (Algorithm::HS256, Some(key), _) => key,
            (alg, _, Some((allowed, key))) if alg == *allowed => key,
            _ => {
                return Err(AuthError::InvalidToken(
                    "the token's algorithm is not accepted",
                ));
            }
        };
        let mut validation = Validation::new(header.alg);
        validation.required_spec_claims = ["exp", "sub"].into_iter().map(String::from).collect();
        validation.validate_exp = true;
        validation.leeway = 30;
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
            let why = match e.kind() {
                ErrorKind::ExpiredSignature => "the token has expired",
                ErrorKind::InvalidSignature => "the token's signature is invalid",
                ErrorKind::InvalidIssuer => "the token's issuer is not accepted",
                ErrorKind::InvalidAudience => "the token's audience is not accepted",
                ErrorKind::MissingRequiredClaim(_) | ErrorKind::Json(_) => {
                    "the token lacks a required claim (tenant_id, sub, exp, scope) or one is malformed"
                }
                _ => "the token is invalid",
            };
            AuthError::InvalidToken(why)
        })?;
        let claims = data.claims;
        Ok(Principal {
            tenant: TenantId(claims.tenant_id),
            subject: claims.sub,
            scopes: claims
                .scope
                .split_ascii_whitespace()
                .map(String::from)
                .collect(),
        })
    }
}

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
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + ttl.as_secs();
    let claims = Claims {
        tenant_id: tenant,
        sub: subject.to_string(),
        exp,
        scope: scope.to_string(),
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
        let secret = Secret::new("unit-test-secret-0123456789");
        let v = Verifier::new(&JwtConfig {
            hs256_secret: Some(secret.clone()),
            ..Default::default()
        })
        .unwrap();
        (v, secret)
    }

    #[test]
    fn a_minted_token_verifies_with_its_tenant_and_scopes() {
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
        let p = v.verify(&token).unwrap();
        assert_eq!(p.tenant, TenantId(tenant));
        assert!(p.require(SCOPE_WRITE).is_ok() && p.require(SCOPE_READ).is_ok());
        assert_eq!(
            p.require("admin").unwrap_err(),
            AuthError::MissingScope("admin")
        );
    }

    #[test]
    fn no_key_configured_is_a_startup_error() {
        assert!(Verifier::new(&JwtConfig::default()).is_err());
    }
}
