//! Verification keys from a JSON Web Key Set, as identity providers (Auth0, Okta,
//! Keycloak, Cognito, Entra) publish them, so keys can rotate without a restart.
//!
//! - The set is fetched at start (a provider that is down does not stop the process:
//!   tokens are refused and the process reports not ready until a set arrives), then
//!   every [`REFRESH_EVERY`], and on a token naming an unknown `kid` at most once per
//!   [`UNKNOWN_KID_REFRESH`], so that garbage `kid`s cannot hammer the provider.
//! - Concurrent unknown-`kid` lookups share one fetch, run as a task of its own: no lock
//!   is held while it runs, a token whose `kid` is known never waits for it, and a
//!   client that goes away does not cancel it for the others.
//! - A failed fetch, or a set without one usable key, keeps the last good set, and the
//!   set keeps verifying however long the provider stays away: an identity provider's
//!   outage must not become one of every process at once. Keys the provider withdrew
//!   meanwhile keep verifying until a fetch succeeds; the set's age ([`Jwks::age`]) is a
//!   metric with an alert, and a set becomes [`SetState::Stale`] (not ready) only where
//!   `ORDERD_JWT_STALE_READINESS_SECS` asks for it.
//! - Each key carries the digest of its JWK, so a token verified by a key that a later
//!   set still holds unchanged stays verified (see [`super::verified`]).
//! - RSA, EC P-256/P-384 and Ed25519 keys are used; a key's `alg` decides its
//!   algorithm, an RSA key without one means RS256, an EC key's curve decides ES256 or
//!   ES384, and an Ed25519 key means EdDSA. Keys for encryption are ignored.

use sha2::{Digest, Sha256};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use bytes::Bytes;
use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
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
use crate::supervisor::{Every, First, Run, Schedule};

/// How often the set is fetched again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(300);
/// The shortest interval between fetches caused by unknown `kid`s.
pub const UNKNOWN_KID_REFRESH: Duration = Duration::from_secs(30);
/// Bound on one fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest set accepted.
const MAX_SET_BYTES: usize = 1024 * 1024;

/// One signing key of the set.
#[derive(Clone)]
pub struct Key {
    pub alg: Algorithm,
    pub decoding: DecodingKey,
    /// The SHA-256 of the key's JWK: the same `kid` with other key material is another
    /// key.
    pub digest: [u8; 32],
}

type Keys = HashMap<String, Arc<Key>>;
type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;
/// A fetch for unknown `kid`s that every waiting lookup shares.
type SharedFetch = Shared<BoxFuture<'static, ()>>;

/// How usable the key set is, for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetState {
    /// No set was ever fetched: no token verifies.
    Missing,
    /// A set verifies tokens, but a staleness limit is set, the last fetch failed, and
    /// the provider last confirmed the set longer ago than the limit.
    Stale,
    /// A set verifies tokens: the provider confirmed it at its last fetch, or no limit
    /// is set, or the limit has not passed.
    Held,
}

/// What the fetches of a set have said.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fetched {
    /// When the provider last answered with a usable set.
    pub confirmed: Option<Instant>,
    /// Whether the last fetch failed (no answer, an error, or no usable key).
    pub failing: bool,
}

impl SetState {
    /// The state of a set as `fetched` says, seen at `now`, stale past `stale_after`
    /// (never, without one).
    ///
    /// Between two refreshes a healthy provider's set ages by up to the refresh
    /// interval: only a set whose last fetch failed can be stale, so a limit below that
    /// interval never takes a process out of rotation while the provider answers.
    pub fn of(fetched: Fetched, now: Instant, stale_after: Option<Duration>) -> Self {
        match (fetched.confirmed, stale_after) {
            (None, _) => Self::Missing,
            (Some(at), Some(limit))
                if fetched.failing && now.saturating_duration_since(at) > limit =>
            {
                Self::Stale
            }
            (Some(_), _) => Self::Held,
        }
    }
}

/// The cached key set of one JWKS URL.
pub struct Jwks {
    url: String,
    client: HttpsClient,
    keys: RwLock<Option<Arc<Keys>>>,
    fetched: Mutex<Fetched>,
    /// When this set was made: its age until the provider first confirms it.
    made: Instant,
    /// How long after its last confirmation a set whose fetches fail counts as stale;
    /// never, without one.
    stale_after: Option<Duration>,
    unknown_kid: Mutex<UnknownKidFetch>,
}

/// The state of fetches caused by unknown `kid`s.
#[derive(Default)]
struct UnknownKidFetch {
    /// When the last one started.
    last: Option<Instant>,
    /// The one running now, if any.
    running: Option<SharedFetch>,
}

impl Jwks {
    /// The set of `url`, never stale however old (see [`Jwks::stale_after`]).
    pub fn new(url: String) -> Self {
        Self {
            url,
            client: https_client(),
            keys: RwLock::new(None),
            fetched: Mutex::new(Fetched::default()),
            made: Instant::now(),
            stale_after: None,
            unknown_kid: Mutex::new(UnknownKidFetch::default()),
        }
    }

    /// The same set, [`SetState::Stale`] once its fetches fail and the provider last
    /// confirmed it longer than `limit` ago (`None`: never).
    pub fn stale_after(self, limit: Option<Duration>) -> Self {
        Self {
            stale_after: limit,
            ..self
        }
    }

    fn fetched(&self) -> Fetched {
        *self.fetched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a set was ever fetched, and whether it counts as stale.
    pub fn state(&self) -> SetState {
        SetState::of(self.fetched(), Instant::now(), self.stale_after)
    }

    /// How long ago the provider last confirmed the set; since this set was made while
    /// it never has.
    pub fn age(&self) -> Duration {
        self.fetched().confirmed.unwrap_or(self.made).elapsed()
    }

    fn current(&self) -> Option<Arc<Keys>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn lookup(&self, kid: &str) -> Option<Arc<Key>> {
        self.current().and_then(|keys| keys.get(kid).cloned())
    }

    /// Whether the current set still holds the key `kid` with this digest.
    pub fn holds(&self, kid: &str, digest: &[u8; 32]) -> bool {
        self.lookup(kid).is_some_and(|key| &key.digest == digest)
    }

    /// The key `kid` names, fetching the set again if the key is unknown and the last
    /// such fetch is long enough ago (or joining the one under way).
    pub async fn key(self: &Arc<Self>, kid: &str) -> Result<Arc<Key>, AuthError> {
        if let Some(found) = self.lookup(kid) {
            return Ok(found);
        }
        if let Some(fetch) = self.unknown_kid_fetch() {
            fetch.await;
        }
        self.lookup(kid).ok_or(AuthError::InvalidToken(
            "the token's key (`kid`) is not known",
        ))
    }

    /// The fetch to wait for on an unknown `kid`: the one running, a new one if due, or
    /// none.
    fn unknown_kid_fetch(self: &Arc<Self>) -> Option<SharedFetch> {
        let mut state = self.unknown_kid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = &state.running {
            return Some(running.clone());
        }
        let now = Instant::now();
        if state
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < UNKNOWN_KID_REFRESH)
        {
            return None;
        }
        state.last = Some(now);
        // Not a task of its own: the lookups that wait for it drive it, each through
        // its shared handle, so a fetch needs no job to outlive its requests (one whose
        // requests were all dropped is driven on by the next lookup that joins it).
        let jwks = self.clone();
        let fetch = async move {
            jwks.refresh().await;
            jwks.unknown_kid
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .running = None;
        }
        .boxed()
        .shared();
        state.running = Some(fetch.clone());
        Some(fetch)
    }

    /// Fetches the set; on failure, or when the set holds no usable key, keeps the last
    /// good one and says why in the log.
    pub async fn refresh(&self) -> bool {
        match self.fetch().await {
            Ok(keys) => {
                let changed = self.current().is_none_or(|old| !same_keys(&old, &keys));
                if changed {
                    tracing::info!(keys = keys.len(), "fetched the JSON Web Key Set");
                } else {
                    tracing::debug!("the JSON Web Key Set is unchanged");
                }
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(keys));
                *self.fetched.lock().unwrap_or_else(|e| e.into_inner()) = Fetched {
                    confirmed: Some(Instant::now()),
                    failing: false,
                };
                true
            }
            Err(why) => {
                self.fetched
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .failing = true;
                tracing::warn!(url = %self.url, error = %why, "cannot fetch the JSON Web Key Set; keeping the last one");
                false
            }
        }
    }

    async fn fetch(&self) -> Result<Keys, String> {
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
        let keys = usable_keys(&set);
        // A provider mid-deploy, or a proxy answering for it, can serve an empty or
        // foreign set: taking it would turn every token away until the next fetch.
        if keys.is_empty() {
            return Err(format!(
                "the set holds no usable signing key ({} keys in all)",
                set.keys.len()
            ));
        }
        Ok(keys)
    }
}

/// Whether two sets hold the same keys under the same `kid`s.
fn same_keys(a: &Keys, b: &Keys) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(kid, key)| b.get(kid).is_some_and(|other| other.digest == key.digest))
}

/// Refreshes the set at start and every [`REFRESH_EVERY`] until `shutdown`; retries
/// sooner while no set was ever fetched.
pub async fn keep_fresh(jwks: Arc<Jwks>, shutdown: CancellationToken) {
    let every = Every {
        interval: REFRESH_EVERY,
        first: First::Now,
        after_failure: Some(Duration::from_secs(5)),
    };
    let mut schedule = Schedule::new("jwks refresh", every, shutdown);
    while schedule.next().await {
        let turn = async {
            let fetched = jwks.refresh().await;
            // A failed refresh of a set already held is no failure: the set still serves
            // (and its age says how long the provider has been away).
            if fetched || jwks.state() != SetState::Missing {
                Run::Done
            } else {
                Run::Failed("no key set was ever fetched".into())
            }
        };
        let Some(run) = schedule.unless_shutdown(turn).await else {
            return;
        };
        schedule.ran(run);
    }
}

/// The signing keys of `set` with a `kid` and an algorithm orderd accepts, by `kid`.
fn usable_keys(set: &JwkSet) -> Keys {
    set.keys
        .iter()
        .filter(|jwk| !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)))
        .filter_map(|jwk| {
            let kid = jwk.common.key_id.clone()?;
            let alg = algorithm_of(jwk)?;
            let decoding = DecodingKey::from_jwk(jwk).ok()?;
            let digest = Sha256::digest(serde_json::to_vec(jwk).ok()?).into();
            Some((
                kid,
                Arc::new(Key {
                    alg,
                    decoding,
                    digest,
                }),
            ))
        })
        .collect()
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
        let keys = usable_keys(&set);
        assert_eq!(keys.len(), 1);
        assert!(keys.contains_key("sig"));
        // Keys orderd ignores do not change what verifies.
        let only_sig: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "n": N, "e": "AQAB", "kid": "sig"}
        ]}))
        .unwrap();
        assert!(same_keys(&usable_keys(&only_sig), &keys));
    }

    #[test]
    fn keys_are_the_same_by_kid_and_material_not_by_order() {
        let set = |keys: serde_json::Value| -> Keys {
            usable_keys(&serde_json::from_value(serde_json::json!({ "keys": keys })).unwrap())
        };
        let a = serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB", "kid": "a"});
        let b = serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB", "kid": "b"});
        let a_as_ps256 =
            serde_json::json!({"kty": "RSA", "n": N, "e": "AQAB", "kid": "a", "alg": "PS256"});
        let ab = set(serde_json::json!([a, b]));
        assert!(same_keys(&ab, &set(serde_json::json!([b, a]))));
        assert!(!same_keys(&ab, &set(serde_json::json!([a]))));
        assert!(!same_keys(&ab, &set(serde_json::json!([a_as_ps256, b]))));
        assert_ne!(ab["a"].digest, ab["b"].digest, "the kid is part of the key");
    }

    /// Three refreshes missed: what made a set stale, and every process unready, before
    /// the limit was a setting.
    const FIFTEEN_MINUTES: Duration = Duration::from_secs(900);

    #[test]
    fn a_set_the_provider_stopped_confirming_keeps_serving_unless_a_limit_is_set() {
        let now = Instant::now() + FIFTEEN_MINUTES * 4;
        let failing_since = |age: Duration| Fetched {
            confirmed: Some(now - age),
            failing: true,
        };
        let never = Fetched {
            confirmed: None,
            failing: true,
        };
        assert_eq!(SetState::of(never, now, None), SetState::Missing);
        assert_eq!(
            SetState::of(never, now, Some(FIFTEEN_MINUTES)),
            SetState::Missing
        );
        // The provider has been away for an hour: the set still serves.
        let an_hour = failing_since(FIFTEEN_MINUTES * 4);
        assert_eq!(SetState::of(an_hour, now, None), SetState::Held);
        // Past a limit that is set, it is stale; not a second before.
        let limit = Some(FIFTEEN_MINUTES);
        assert_eq!(
            SetState::of(failing_since(FIFTEEN_MINUTES), now, limit),
            SetState::Held
        );
        assert_eq!(
            SetState::of(
                failing_since(FIFTEEN_MINUTES + Duration::from_secs(1)),
                now,
                limit
            ),
            SetState::Stale
        );
        // A set the provider confirmed at its last fetch is never stale, whatever the
        // limit: between two refreshes a healthy provider's set ages too.
        let confirmed_long_ago = Fetched {
            failing: false,
            ..an_hour
        };
        assert_eq!(
            SetState::of(confirmed_long_ago, now, Some(Duration::from_secs(1))),
            SetState::Held
        );
    }
}
