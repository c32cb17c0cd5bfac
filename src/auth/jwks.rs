//! Verification keys from a JSON Web Key Set, as identity providers (Auth0, Okta,
//! Keycloak, Cognito, Entra) publish them, so keys can rotate without a restart.
//!
//! - The set is fetched at start (a provider that is down does not stop the process:
//!   tokens are refused and the process reports not ready until a set arrives), then
//!   every [`REFRESH_EVERY`], and on a token naming an unknown `kid` at most once per
//!   [`UNKNOWN_KID_REFRESH`], so that garbage `kid`s cannot hammer the provider.
//! - A failed fetch keeps the last good set.
//! - RSA, EC P-256/P-384 and Ed25519 keys are used; a key's `alg` decides its
//!   algorithm, an RSA key without one means RS256, an EC key's curve decides ES256 or
//!   ES384, and an Ed25519 key means EdDSA. Keys for encryption are ignored.

use sha2::{Digest, Sha256};
use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use jsonwebtoken::{
    Algorithm, DecodingKey,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::AuthError;

/// How often the set is fetched again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(300);
/// The shortest interval between fetches caused by unknown `kid`s.
pub const UNKNOWN_KID_REFRESH: Duration = Duration::from_secs(30);
/// Bound on one fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest set accepted.
const MAX_SET_BYTES: usize = 1024 * 1024;

type Keys = HashMap<String, (Algorithm, DecodingKey)>;
type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The cached key set of one JWKS URL.
pub struct Jwks {
    url: String,
    client: HttpsClient,
    keys: RwLock<Option<Arc<Keys>>>,
    /// Counts the sets that changed what verifies, so that tokens verified under an
    /// older set are checked again (see [`super::verified`]); a refresh that brings the
    /// same keys leaves it, and the remembered tokens, alone.
    generation: AtomicU64,
    /// The digest of the usable keys of the current set ([`usable_keys`]).
    digest: std::sync::Mutex<Option<[u8; 32]>>,
    /// When an unknown `kid` last caused a fetch; serialises those fetches too.
    last_unknown_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl Jwks {
    pub fn new(url: String) -> Self {
        Self {
            url,
            client: https_client(),
            keys: RwLock::new(None),
            generation: AtomicU64::new(0),
            digest: std::sync::Mutex::new(None),
            last_unknown_fetch: tokio::sync::Mutex::new(None),
        }
    }

    /// Whether a set was ever fetched.
    pub fn has_keys(&self) -> bool {
        self.current().is_some()
    }

    /// Which fetched set is current; changes after each fetch, once the set is in place.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn current(&self) -> Option<Arc<Keys>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The key `kid` names and its algorithm, fetching the set again if the key is
    /// unknown and the last such fetch is long enough ago.
    pub async fn key(&self, kid: &str) -> Result<(Algorithm, DecodingKey), AuthError> {
        if let Some(found) = self.current().and_then(|keys| keys.get(kid).cloned()) {
            return Ok(found);
        }
        {
            let mut last = self.last_unknown_fetch.lock().await;
            let due = last.is_none_or(|at| at.elapsed() >= UNKNOWN_KID_REFRESH);
            // Another request may have fetched while this one waited for the lock.
            let known = self.current().is_some_and(|keys| keys.contains_key(kid));
            if due && !known {
                *last = Some(Instant::now());
                self.refresh().await;
            }
        }
        self.current()
            .and_then(|keys| keys.get(kid).cloned())
            .ok_or(AuthError::InvalidToken(
                "the token's key (`kid`) is not known",
            ))
    }

    /// Fetches the set; on failure, or when the set holds no usable key, keeps the last
    /// good one and says why in the log.
    pub async fn refresh(&self) -> bool {
        match self.fetch().await {
            Ok((keys, digest)) => {
                let mut current = self.digest.lock().unwrap_or_else(|e| e.into_inner());
                if *current == Some(digest) {
                    tracing::debug!("the JSON Web Key Set is unchanged");
                    return true;
                }
                tracing::info!(keys = keys.len(), "fetched the JSON Web Key Set");
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(keys));
                *current = Some(digest);
                self.generation.fetch_add(1, Ordering::AcqRel);
                true
            }
            Err(why) => {
                tracing::warn!(url = %self.url, error = %why, "cannot fetch the JSON Web Key Set; keeping the last one");
                false
            }
        }
    }

    async fn fetch(&self) -> Result<(Keys, [u8; 32]), String> {
        let uri: http::Uri = self.url.parse().map_err(|e| format!("bad URL: {e}"))?;
        let response = tokio::time::timeout(FETCH_TIMEOUT, self.client.get(uri))
            .await
            .map_err(|_| "no answer in time".to_string())?
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let body = tokio::time::timeout(
            FETCH_TIMEOUT,
            Limited::new(response.into_body(), MAX_SET_BYTES).collect(),
        )
        .await
        .map_err(|_| "the body did not arrive in time".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
        let set: JwkSet = serde_json::from_slice(&body).map_err(|e| format!("not a JWKS: {e}"))?;
        let (keys, digest) = usable_keys(&set);
        // A provider mid-deploy, or a proxy answering for it, can serve an empty or
        // foreign set: taking it would turn every token away until the next fetch.
        if keys.is_empty() {
            return Err(format!(
                "the set holds no usable signing key ({} keys in all)",
                set.keys.len()
            ));
        }
        Ok((keys, digest))
    }
}

/// Refreshes the set at start and every [`REFRESH_EVERY`] until `shutdown`; retries
/// sooner while no set was ever fetched.
pub async fn keep_fresh(jwks: Arc<Jwks>, shutdown: CancellationToken) {
    loop {
        let fetched = jwks.refresh().await;
        let wait = if fetched || jwks.has_keys() {
            REFRESH_EVERY
        } else {
            Duration::from_secs(5)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// The signing keys of `set` with a `kid` and an algorithm orderd accepts.
/// The signing keys of `set` by `kid`, and a digest of them (their JWKs, in a fixed
/// order) that tells whether a later set verifies exactly the same tokens.
fn usable_keys(set: &JwkSet) -> (Keys, [u8; 32]) {
    let mut described = Vec::new();
    let keys = set
        .keys
        .iter()
        .filter(|jwk| !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)))
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let alg = algorithm_of(jwk)?;
            let key = DecodingKey::from_jwk(jwk).ok()?;
            described.push(serde_json::to_string(jwk).unwrap_or_default());
            Some((kid, (alg, key)))
        })
        .collect();
    described.sort();
    let mut digest = Sha256::new();
    for jwk in &described {
        digest.update(jwk.as_bytes());
        digest.update([0]);
    }
    (keys, digest.finalize().into())
}

/// The algorithm a key is used with: its `alg`, else what its type implies.
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    let declared = jwk.common.key_algorithm.map(|alg| match alg {
        KeyAlgorithm::RS256 => Some(Algorithm::RS256),
        KeyAlgorithm::RS384 => Some(Algorithm::RS384),
        KeyAlgorithm::RS512 => Some(Algorithm::RS512),
        KeyAlgorithm::PS256 => Some(Algorithm::PS256),
        KeyAlgorithm::PS384 => Some(Algorithm::PS384),
        KeyAlgorithm::PS512 => Some(Algorithm::PS512),
        KeyAlgorithm::ES256 => Some(Algorithm::ES256),
        KeyAlgorithm::ES384 => Some(Algorithm::ES384),
        KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
        _ => None,
    });
    let implied = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            Some(Algorithm::EdDSA)
        }
        _ => None,
    };
    // A declared algorithm must fit the key's type (an RSA key cannot be ES256).
    let family = |alg: Algorithm| match alg {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => 'r',
        Algorithm::ES256 | Algorithm::ES384 => 'e',
        Algorithm::EdDSA => 'o',
        _ => '-',
    };
    match (declared, implied) {
        // An algorithm orderd does not accept (HS256 on a public key, RSA-OAEP, ...).
        (Some(None), _) => None,
        (Some(Some(declared)), Some(implied)) if family(declared) == family(implied) => {
            // For EC keys, the curve decides: ES384 on a P-256 key is refused.
            if family(implied) == 'e' && declared != implied {
                None
            } else {
                Some(declared)
            }
        }
        (None, implied) => implied,
        _ => None,
    }
}

fn https_client() -> HttpsClient {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the default provider supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwk(json: serde_json::Value) -> Jwk {
        serde_json::from_value(json).unwrap()
    }

    const N: &str = "u1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0_IzW7yWR7QkrmBL7jTKEn5u-qKhbwKfBstIs-bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW_VDL5AaWTg0nLVkjRo9z-40RQzuVaE8AkAFmxZzow3x-VJYKdjykkJ0iT9wCS0DRTXu269V264Vf_3jvredZiKRkgwlL9xNAwxXFg0x_XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC-9aGVd-Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw";

    #[test]
    fn the_algorithm_follows_the_key() {
        let rsa = |alg: Option<&str>| {
            let mut v = serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB", "kid": "r"});
            if let Some(alg) = alg {
                v["alg"] = alg.into();
            }
            algorithm_of(&jwk(v))
        };
        assert_eq!(rsa(None), Some(Algorithm::RS256));
        assert_eq!(rsa(Some("PS256")), Some(Algorithm::PS256));
        assert_eq!(rsa(Some("RS512")), Some(Algorithm::RS512));
        assert_eq!(rsa(Some("ES256")), None, "an RSA key cannot be ES256");
        assert_eq!(
            rsa(Some("HS256")),
            None,
            "a public key is never an HMAC secret"
        );
    }

    #[test]
    fn encryption_keys_and_keys_without_kid_are_ignored() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "n": N, "e": "AQAB", "kid": "sig"},
            {"kty": "RSA", "n": N, "e": "AQAB", "kid": "enc", "use": "enc"},
            {"kty": "RSA", "n": N, "e": "AQAB"}
        ]}))
        .unwrap();
        let (keys, digest) = usable_keys(&set);
        assert_eq!(keys.len(), 1);
        assert!(keys.contains_key("sig"));
        // Keys orderd ignores do not change what verifies.
        let only_sig: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "n": N, "e": "AQAB", "kid": "sig"}
        ]}))
        .unwrap();
        assert_eq!(usable_keys(&only_sig).1, digest);
    }

    #[test]
    fn the_digest_follows_the_keys_not_their_order() {
        let set = |keys: serde_json::Value| -> JwkSet {
            serde_json::from_value(serde_json::json!({ "keys": keys })).unwrap()
        };
        let a = serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB", "kid": "a"});
        let b = serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB", "kid": "b"});
        let ab = usable_keys(&set(serde_json::json!([a, b]))).1;
        assert_eq!(ab, usable_keys(&set(serde_json::json!([b, a]))).1);
        assert_ne!(ab, usable_keys(&set(serde_json::json!([a]))).1);
    }
}
