//! Tokens verified against a JSON Web Key Set served by the test over loopback: RSA
//! (RS256, PS256), EC P-256 and P-384, Ed25519, picked by `kid`; a rotation picked up
//! without a restart; unknown `kid`s that cannot hammer the provider; a provider down at
//! start; the last good set kept when a fetch fails, the process kept ready and the set's
//! age told by a metric, unless a setting asks for readiness to follow it
//! (docs/contract.md §2).

use std::{sync::Arc, time::Duration};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use orderd::auth::jwks::{Jwks, SetState};
use serde_json::json;
use uuid::Uuid;

use crate::support::{
    ServeProcess, TestApp, TestDb, jwks_server::JwksServer, sample, spawn_app_on,
};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
}

/// A token for `tenant` signed with the fixture key `key` under `kid`.
fn token(alg: Algorithm, kid: &str, key: &str, tenant: Uuid) -> String {
    let pem = fixture(&format!("{key}.pem"));
    let key = match alg {
        Algorithm::RS256 | Algorithm::PS256 => EncodingKey::from_rsa_pem(pem.as_bytes()),
        Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(pem.as_bytes()),
        _ => EncodingKey::from_ed_pem(pem.as_bytes()),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_string());
    let exp = chrono::Utc::now().timestamp() + 600;
    let claims = json!({
        "tenant_id": tenant, "sub": "jwks-test", "exp": exp, "scope": "orders:read orders:write",
        "iss": ISSUER, "aud": AUDIENCE,
    });
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// What a key set needs beside its URL: this service's tokens name it as their audience.
const ISSUER: &str = "https://idp.test/";
const AUDIENCE: &str = "orderd";

async fn status(app: &TestApp, token: &str) -> u16 {
    app.get(token, "/v1/orders").await.status
}

async fn app_with(url: &str) -> TestApp {
    spawn_app_on(
        TestDb::new().await,
        &[
            ("ORDERD_JWT_HS256_SECRET", ""),
            ("ORDERD_JWT_JWKS_URL", url),
            ("ORDERD_JWT_ISSUER", ISSUER),
            ("ORDERD_JWT_AUDIENCE", AUDIENCE),
        ],
    )
    .await
}

/// A provider serving the set before rotation, and an app that has fetched it.
async fn provider_and_ready_app() -> (JwksServer, TestApp) {
    let provider = JwksServer::start(&fixture("jwks_before_rotation.json")).await;
    let app = app_with(&provider.url).await;
    until_ready(&app.base).await;
    (provider, app)
}

/// The status and body of `/readyz` at `base`.
async fn readyz(base: &str) -> (u16, String) {
    let reply = reqwest::get(format!("{base}/readyz")).await.unwrap();
    (reply.status().as_u16(), reply.text().await.unwrap())
}

/// Waits until `/readyz` at `base` answers 200.
async fn until_ready(base: &str) {
    for _ in 0..200 {
        if readyz(base).await.0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_type_of_the_set_verifies_its_own_tokens_and_nothing_else() {
    // The provider must outlive the app's requests.
    let (_provider, app) = provider_and_ready_app().await;
    let tenant = Uuid::new_v4();
    for (alg, kid, key) in [
        (Algorithm::RS256, "jwks_rsa_a", "jwks_rsa_a"),
        (Algorithm::PS256, "jwks_rsa_a_ps256", "jwks_rsa_a"),
        (Algorithm::ES256, "jwks_ec_p256", "jwks_ec_p256"),
        (Algorithm::ES384, "jwks_ec_p384", "jwks_ec_p384"),
        (Algorithm::EdDSA, "jwks_ed25519", "jwks_ed25519"),
    ] {
        assert_eq!(
            status(&app, &token(alg, kid, key, tenant)).await,
            200,
            "{kid}"
        );
    }
    // The key's algorithm, not the token's, decides: PS256 under an RS256 kid is refused.
    let confused = token(Algorithm::PS256, "jwks_rsa_a", "jwks_rsa_a", tenant);
    app.get(&confused, "/v1/orders")
        .await
        .assert_problem(401, "unauthorized");
    // A token signed by another key under a known kid is refused.
    let forged = token(Algorithm::RS256, "jwks_rsa_a", "jwks_rsa_b", tenant);
    assert_eq!(status(&app, &forged).await, 401);
    // The HS256 test secret means nothing here.
    assert_eq!(status(&app, &app.token(tenant)).await, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_is_picked_up_without_a_restart_and_unknown_kids_cannot_hammer_the_provider()
{
    let (provider, app) = provider_and_ready_app().await;
    let tenant = Uuid::new_v4();
    let rotated = token(Algorithm::RS256, "jwks_rsa_b", "jwks_rsa_b", tenant);
    let fetched_at_start = provider.fetches();
    // An unknown kid causes one fetch; a burst of garbage kids causes none more.
    assert_eq!(status(&app, &rotated).await, 401);
    for i in 0..20 {
        let garbage = token(Algorithm::RS256, &format!("nope-{i}"), "jwks_rsa_a", tenant);
        assert_eq!(status(&app, &garbage).await, 401);
    }
    assert_eq!(provider.fetches(), fetched_at_start + 1);

    // The provider rotates; once the 30 s throttle has passed, the new kid is fetched.
    provider.set(200, &fixture("jwks_after_rotation.json"));
    assert_eq!(status(&app, &rotated).await, 401, "still throttled");
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(status(&app, &rotated).await, 200);
    assert_eq!(provider.fetches(), fetched_at_start + 2);
    // The old key still works.
    let old = token(Algorithm::RS256, "jwks_rsa_a", "jwks_rsa_a", tenant);
    assert_eq!(status(&app, &old).await, 200);
}

/// A token verified (and remembered) under a key the provider then withdraws stops
/// verifying as soon as the set is fetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_key_stops_verifying_tokens_already_seen() {
    let (provider, app) = provider_and_ready_app().await;
    let tenant = Uuid::new_v4();
    let seen = token(Algorithm::ES256, "jwks_ec_p256", "jwks_ec_p256", tenant);
    assert_eq!(status(&app, &seen).await, 200);
    assert_eq!(status(&app, &seen).await, 200);

    let mut set: serde_json::Value =
        serde_json::from_str(&fixture("jwks_before_rotation.json")).unwrap();
    set["keys"]
        .as_array_mut()
        .unwrap()
        .retain(|key| key["kid"] != "jwks_ec_p256");
    provider.set(200, &set.to_string());
    // An unknown kid makes orderd fetch the set again.
    let fetches = provider.fetches();
    let unknown = token(Algorithm::RS256, "jwks_rsa_b", "jwks_rsa_b", tenant);
    assert_eq!(status(&app, &unknown).await, 401);
    assert_eq!(provider.fetches(), fetches + 1);
    assert_eq!(status(&app, &seen).await, 401, "the key was withdrawn");
    let other = token(Algorithm::RS256, "jwks_rsa_a", "jwks_rsa_a", tenant);
    assert_eq!(
        status(&app, &other).await,
        200,
        "the keys kept still verify"
    );
}

/// A key a new set keeps unchanged stays in place, so the tokens it verified stay
/// remembered; a key whose `kid` now names other material, or that is gone, does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_keeps_the_keys_it_still_holds_in_place() {
    let provider = JwksServer::start(&fixture("jwks_before_rotation.json")).await;
    let jwks = Arc::new(Jwks::new(provider.url.clone()));
    assert!(jwks.refresh().await);
    let a = jwks.key("jwks_rsa_a").await.unwrap();
    let p256 = jwks.key("jwks_ec_p256").await.unwrap();
    // The rotation adds a key: the old ones stay in place.
    provider.set(200, &fixture("jwks_after_rotation.json"));
    assert!(jwks.refresh().await);
    assert!(jwks.holds("jwks_rsa_a", &a.digest));
    assert!(jwks.holds("jwks_ec_p256", &p256.digest));
    // The provider reuses a kid for other key material, and withdraws another.
    let mut set: serde_json::Value =
        serde_json::from_str(&fixture("jwks_after_rotation.json")).unwrap();
    let keys = set["keys"].as_array_mut().unwrap();
    keys.retain(|key| key["kid"] != "jwks_rsa_a" && key["kid"] != "jwks_ec_p256");
    let mut reused = keys
        .iter()
        .find(|key| key["kid"] == "jwks_rsa_b")
        .unwrap()
        .clone();
    reused["kid"] = "jwks_rsa_a".into();
    keys.push(reused);
    provider.set(200, &set.to_string());
    assert!(jwks.refresh().await);
    assert!(
        !jwks.holds("jwks_rsa_a", &a.digest),
        "the kid names another key"
    );
    assert!(!jwks.holds("jwks_ec_p256", &p256.digest), "withdrawn");
    assert_eq!(jwks.state(), SetState::Held);
}

/// Many tokens with unknown `kid`s at once wait for one fetch, which no lock guards: a
/// token whose `kid` is known is answered while that fetch is still under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kids_share_one_fetch_and_known_kids_do_not_wait_for_it() {
    let provider = JwksServer::start(&fixture("jwks_before_rotation.json")).await;
    let jwks = Arc::new(Jwks::new(provider.url.clone()));
    assert!(jwks.refresh().await);
    provider.set(200, &fixture("jwks_after_rotation.json"));
    provider.delay(Duration::from_secs(2));
    let lookups: Vec<_> = (0..50)
        .map(|_| {
            let jwks = jwks.clone();
            tokio::spawn(async move { jwks.key("jwks_rsa_b").await.is_ok() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The fetch is held back by the provider; a known kid is answered meanwhile.
    let known = tokio::time::Instant::now();
    assert!(jwks.key("jwks_rsa_a").await.is_ok());
    let known = known.elapsed();
    assert!(lookups.iter().all(|lookup| !lookup.is_finished()));
    for lookup in lookups {
        assert!(
            lookup.await.unwrap(),
            "the shared fetch brought the new key"
        );
    }
    assert_eq!(
        provider.fetches(),
        2,
        "one at start, one shared by 50 lookups"
    );
    println!("a known kid answered in {known:?} while the fetch took 2 s");
}

/// A set that holds no usable key (empty, or only keys orderd cannot use) never
/// replaces the last good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_unusable_key_set_keeps_the_last_good_one() {
    let (provider, app) = provider_and_ready_app().await;
    let tenant = Uuid::new_v4();
    let good = token(Algorithm::ES256, "jwks_ec_p256", "jwks_ec_p256", tenant);
    assert_eq!(status(&app, &good).await, 200);
    let unusable = r#"{"keys": [{"kty": "oct", "kid": "shared", "k": "c2VjcmV0"}]}"#;
    for set in [r#"{"keys": []}"#, unusable] {
        provider.set(200, set);
        // An unknown kid makes orderd fetch the set again (once the throttle allows).
        let fetches = provider.fetches();
        let unknown = token(Algorithm::RS256, "jwks_rsa_b", "jwks_rsa_b", tenant);
        for _ in 0..40 {
            assert_eq!(status(&app, &unknown).await, 401);
            if provider.fetches() > fetches {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(provider.fetches() > fetches, "the set was fetched again");
        assert_eq!(
            status(&app, &good).await,
            200,
            "the last good set still verifies"
        );
    }
    assert_eq!(readyz(&app.base).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_down_at_start_means_401_and_not_ready_until_it_answers() {
    // A port with nobody listening yet.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{address}/.well-known/jwks.json");
    let app = app_with(&url).await;
    let tenant = Uuid::new_v4();
    let good = token(Algorithm::ES256, "jwks_ec_p256", "jwks_ec_p256", tenant);
    assert_eq!(readyz(&app.base).await.0, 503);
    assert_eq!(status(&app, &good).await, 401);

    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let provider = JwksServer::serve(listener, &fixture("jwks_before_rotation.json"));
    until_ready(&app.base).await;
    assert_eq!(status(&app, &good).await, 200);

    // The provider fails: the last good set is kept.
    provider.set(500, "oops");
    let unknown = token(Algorithm::RS256, "jwks_rsa_b", "jwks_rsa_b", tenant);
    assert_eq!(status(&app, &unknown).await, 401, "a failed fetch");
    assert_eq!(
        status(&app, &good).await,
        200,
        "the last good set still verifies"
    );
}

/// The gauge of the set's age.
const AGE: &str = "jwks_key_set_age_seconds";

/// `orderd serve` as a process of its own (its own metrics), verifying tokens against
/// `provider`'s set, with `env` beside.
fn serve_against(db: &TestDb, provider: &JwksServer, env: &[(&str, &str)]) -> ServeProcess {
    let mut all = vec![
        ("ORDERD_JWT_HS256_SECRET", String::new()),
        ("ORDERD_JWT_JWKS_URL", provider.url.clone()),
        ("ORDERD_JWT_ISSUER", ISSUER.to_string()),
        ("ORDERD_JWT_AUDIENCE", AUDIENCE.to_string()),
    ];
    all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    ServeProcess::start(db, &all)
}

/// The provider stops answering after `serve` fetched its set: an unknown `kid` makes
/// `serve` ask it once more, and that fetch fails. Returns a token of a known key.
async fn provider_gone(provider: &JwksServer, serve: &ServeProcess) -> String {
    let tenant = Uuid::new_v4();
    let known = token(Algorithm::ES256, "jwks_ec_p256", "jwks_ec_p256", tenant);
    assert_eq!(super::auth::status_with(serve, &known).await, 200);
    provider.set(503, "the identity provider is down");
    let fetches = provider.fetches();
    let unknown = token(Algorithm::RS256, "jwks_rsa_b", "jwks_rsa_b", tenant);
    assert_eq!(super::auth::status_with(serve, &unknown).await, 401);
    assert_eq!(
        provider.fetches(),
        fetches + 1,
        "the provider was asked, and failed"
    );
    known
}

/// A provider that stops answering once orderd holds its set does not make orderd
/// unready: the cached keys keep verifying, and the set's age is the gauge that grows.
/// (That a set older than the fifteen minutes that used to make every process unready
/// keeps it ready is `auth::jwks`'s unit test, on instants of its own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_stops_answering_leaves_the_process_ready_while_the_set_ages() {
    let db = TestDb::new().await;
    let provider = JwksServer::start(&fixture("jwks_before_rotation.json")).await;
    let serve = serve_against(&db, &provider, &[]);
    until_ready(&serve.base).await;
    let fresh = sample(&serve.metrics().await, AGE);
    assert!(fresh.is_some_and(|age| age < 5.0), "{fresh:?}");
    let known = provider_gone(&provider, &serve).await;
    let aged = |least: f64| move |m: &str| sample(m, AGE).is_some_and(|age| age >= least);
    let first = sample(&serve.metrics_until(aged(3.0)).await, AGE).unwrap();
    assert!(first >= 3.0, "{first}");
    assert_eq!(readyz(&serve.base).await, (200, "ready".to_string()));
    // A token checked afresh (another tenant: not remembered) verifies with the cached
    // keys.
    let afresh = token(
        Algorithm::ES256,
        "jwks_ec_p256",
        "jwks_ec_p256",
        Uuid::new_v4(),
    );
    assert_eq!(super::auth::status_with(&serve, &afresh).await, 200);
    assert_eq!(super::auth::status_with(&serve, &known).await, 200);
    let later = sample(&serve.metrics_until(aged(first + 4.0)).await, AGE).unwrap();
    assert!(later >= first + 4.0, "the age grows: {first} then {later}");
    assert_eq!(readyz(&serve.base).await.0, 200);
}

/// `ORDERD_JWT_STALE_READINESS_SECS` makes a set the provider no longer confirms fail
/// readiness once it is older than the limit; a set the provider confirmed at its last
/// fetch does not, however old, and tokens keep verifying either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_staleness_limit_a_set_the_provider_no_longer_confirms_makes_the_process_unready() {
    let db = TestDb::new().await;
    let provider = JwksServer::start(&fixture("jwks_before_rotation.json")).await;
    let serve = serve_against(&db, &provider, &[("ORDERD_JWT_STALE_READINESS_SECS", "2")]);
    until_ready(&serve.base).await;
    // Older than the limit, but confirmed by the provider at its last fetch.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(readyz(&serve.base).await.0, 200);
    let known = provider_gone(&provider, &serve).await;
    assert_eq!(
        readyz(&serve.base).await,
        (503, "the token verification keys are stale".to_string())
    );
    assert_eq!(
        super::auth::status_with(&serve, &known).await,
        200,
        "tokens still verify"
    );
    let age = sample(
        &serve
            .metrics_until(|m| sample(m, AGE).is_some_and(|a| a >= 2.0))
            .await,
        AGE,
    );
    assert!(age.is_some_and(|age| age >= 2.0), "{age:?}");
}
