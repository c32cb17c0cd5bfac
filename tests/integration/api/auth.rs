//! docs/contract.md §2: every refusal, both asymmetric algorithms, and tenant isolation.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{
    Reply, SECRET, TestApp, TestDb, new_key, order_body, process::ServeProcess, spawn_app,
    spawn_app_with,
};

const RSA_PRIVATE: &[u8] = include_bytes!("../../fixtures/rsa_private.pem");
const EC_PRIVATE: &[u8] = include_bytes!("../../fixtures/ec_private.pem");
const RSA_PUBLIC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rsa_public.pem");
const EC_PUBLIC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ec_public.pem");

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(tenant: Uuid) -> Value {
    json!({ "tenant_id": tenant, "sub": "tests", "exp": now() + 600, "scope": "orders:read orders:write" })
}

fn rs256(claims: &Value) -> String {
    sign(
        Algorithm::RS256,
        claims,
        &EncodingKey::from_rsa_pem(RSA_PRIVATE).unwrap(),
    )
}

fn es256(claims: &Value) -> String {
    sign(
        Algorithm::ES256,
        claims,
        &EncodingKey::from_ec_pem(EC_PRIVATE).unwrap(),
    )
}

fn sign(alg: Algorithm, claims: &Value, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).unwrap()
}

/// Lists orders with `Authorization: Bearer <token>`.
async fn list_as(app: &TestApp, token: &str) -> Reply {
    list_with(app, Some(&format!("Bearer {token}"))).await
}

fn hs256(claims: &Value, secret: &[u8]) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

async fn list_with(app: &TestApp, authorization: Option<&str>) -> Reply {
    let mut request = app.client.get(format!("{}/v1/orders", app.base));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    Reply::read(request.send().await.unwrap()).await
}

fn assert_refused(reply: &Reply) {
    reply.assert_problem(401, "unauthorized");
    assert_eq!(
        reply.header("www-authenticate").as_deref(),
        Some(r#"Bearer error="invalid_token""#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_token_is_a_401_with_a_bearer_challenge() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let mut expired = claims(tenant);
    expired["exp"] = json!(now() - 3600);
    let mut no_tenant = claims(tenant);
    no_tenant.as_object_mut().unwrap().remove("tenant_id");
    let mut bad_tenant = claims(tenant);
    bad_tenant["tenant_id"] = json!("not-a-uuid");
    let mut no_sub = claims(tenant);
    no_sub.as_object_mut().unwrap().remove("sub");
    let mut no_exp = claims(tenant);
    no_exp.as_object_mut().unwrap().remove("exp");
    let mut no_scope = claims(tenant);
    no_scope.as_object_mut().unwrap().remove("scope");
    let alg_none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims(tenant).to_string())
    );
    let rs256_without_public_key = rs256(&claims(tenant));

    let cases: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        ("not bearer", Some("Basic dXNlcjpwdw==".into())),
        ("garbage", Some("Bearer not.a.jwt".into())),
        (
            "expired",
            Some(format!("Bearer {}", hs256(&expired, SECRET.as_bytes()))),
        ),
        (
            "wrong secret",
            Some(format!(
                "Bearer {}",
                hs256(&claims(tenant), b"another-secret-0123456789")
            )),
        ),
        ("alg none", Some(format!("Bearer {alg_none}"))),
        (
            "no tenant_id",
            Some(format!("Bearer {}", hs256(&no_tenant, SECRET.as_bytes()))),
        ),
        (
            "tenant_id not a uuid",
            Some(format!("Bearer {}", hs256(&bad_tenant, SECRET.as_bytes()))),
        ),
        (
            "no sub",
            Some(format!("Bearer {}", hs256(&no_sub, SECRET.as_bytes()))),
        ),
        (
            "no exp",
            Some(format!("Bearer {}", hs256(&no_exp, SECRET.as_bytes()))),
        ),
        (
            "no scope",
            Some(format!("Bearer {}", hs256(&no_scope, SECRET.as_bytes()))),
        ),
        (
            "RS256 with only a secret configured",
            Some(format!("Bearer {rs256_without_public_key}")),
        ),
    ];
    for (name, header) in cases {
        let reply = list_with(&app, header.as_deref()).await;
        assert_eq!(reply.status, 401, "{name}");
        assert_refused(&reply);
    }
    // A write with a bad token is refused before its body or key is looked at.
    let reply = app
        .create_raw("bad.token.here", None, b"not json".to_vec())
        .await;
    assert_refused(&reply);
    assert_eq!(app.count("idempotency_record").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rs256_tokens_verify_with_a_public_key_and_hs256_confusion_is_refused() {
    let app = spawn_app_with(&[
        ("ORDERD_JWT_HS256_SECRET", ""),
        ("ORDERD_JWT_PUBLIC_KEY_FILE", RSA_PUBLIC_PATH),
    ])
    .await;
    let tenant = Uuid::new_v4();
    let token = rs256(&claims(tenant));
    assert_eq!(list_as(&app, &token).await.status, 200);

    // Algorithm confusion: HS256 "signed" with the public key as the shared secret.
    let public_pem = std::fs::read(RSA_PUBLIC_PATH).unwrap();
    let forged = hs256(&claims(tenant), &public_pem);
    assert_refused(&list_as(&app, &forged).await);
    // ES256 is not what an RSA key allows.
    let es = es256(&claims(tenant));
    assert_refused(&list_as(&app, &es).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn es256_tokens_verify_with_an_ec_public_key() {
    let app = spawn_app_with(&[
        ("ORDERD_JWT_HS256_SECRET", ""),
        ("ORDERD_JWT_PUBLIC_KEY_FILE", EC_PUBLIC_PATH),
    ])
    .await;
    let token = es256(&claims(Uuid::new_v4()));
    assert_eq!(list_as(&app, &token).await.status, 200);
    let hs = hs256(&claims(Uuid::new_v4()), SECRET.as_bytes());
    assert_refused(&list_as(&app, &hs).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issuer_and_audience_are_checked_when_configured() {
    let app = spawn_app_with(&[
        ("ORDERD_JWT_ISSUER", "https://issuer.test"),
        ("ORDERD_JWT_AUDIENCE", "orderd"),
    ])
    .await;
    let tenant = Uuid::new_v4();
    let mut good = claims(tenant);
    good["iss"] = json!("https://issuer.test");
    good["aud"] = json!("orderd");
    assert_eq!(
        list_with(
            &app,
            Some(&format!("Bearer {}", hs256(&good, SECRET.as_bytes())))
        )
        .await
        .status,
        200
    );
    for (claim, value) in [
        ("iss", json!("https://evil.test")),
        ("aud", json!("someone-else")),
    ] {
        let mut bad = good.clone();
        bad[claim] = value;
        assert_refused(
            &list_with(
                &app,
                Some(&format!("Bearer {}", hs256(&bad, SECRET.as_bytes()))),
            )
            .await,
        );
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove(claim);
        assert_refused(
            &list_with(
                &app,
                Some(&format!("Bearer {}", hs256(&missing, SECRET.as_bytes()))),
            )
            .await,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_the_needed_scope_is_a_403() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let reader = app.token_with_scope(tenant, "orders:read");
    let writer = app.token_with_scope(tenant, "orders:write");
    app.create(&reader, &new_key(), &order_body("SKU-1", 1))
        .await
        .assert_problem(403, "forbidden");
    app.cancel(&reader, &new_key(), &Uuid::new_v4().to_string())
        .await
        .assert_problem(403, "forbidden");
    app.get(&writer, "/v1/orders")
        .await
        .assert_problem(403, "forbidden");
    app.get(&writer, &format!("/v1/orders/{}", Uuid::new_v4()))
        .await
        .assert_problem(403, "forbidden");
    assert_eq!(app.count("idempotency_record").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_never_sees_replays_or_cancels_another_tenants_orders() {
    let app = spawn_app().await;
    let (alice, bob) = (app.token(Uuid::new_v4()), app.token(Uuid::new_v4()));
    let key = new_key();
    let created = app.create(&alice, &key, &order_body("SKU-A", 1)).await;
    let id = created.json()["id"].as_str().unwrap().to_string();

    app.get(&bob, &format!("/v1/orders/{id}"))
        .await
        .assert_problem(404, "not-found");
    assert_eq!(app.get(&bob, "/v1/orders").await.json()["items"], json!([]));
    app.cancel(&bob, &new_key(), &id)
        .await
        .assert_problem(404, "not-found");
    // Bob's use of Alice's key is Bob's own operation, not a replay of hers.
    let bobs = app.create(&bob, &key, &order_body("SKU-A", 1)).await;
    assert_eq!(bobs.status, 201);
    assert_eq!(bobs.header("idempotent-replayed"), None);
    assert_ne!(bobs.json()["id"], created.json()["id"]);

    let alices = app.get(&alice, &format!("/v1/orders/{id}")).await;
    assert_eq!(
        alices.json()["status"],
        "CREATED",
        "Bob's cancel did not touch it"
    );
    assert_eq!(
        app.get(&alice, "/v1/orders").await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_not_yet_valid_is_refused_beyond_the_leeway() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let mut early = claims(tenant);
    early["nbf"] = json!(now() + 300);
    assert_refused(&list_as(&app, &hs256(&early, SECRET.as_bytes())).await);
    let mut skewed = claims(tenant);
    skewed["nbf"] = json!(now() + 10);
    assert_eq!(
        list_as(&app, &hs256(&skewed, SECRET.as_bytes()))
            .await
            .status,
        200
    );
}

/// A token that verified is remembered, but never past its expiry: once `exp` and the
/// leeway have passed, the same token is a 401 like any expired one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_expires_after_it_verified_is_refused() {
    let app = spawn_app().await;
    let mut short = claims(Uuid::new_v4());
    // Accepted for two more seconds: until `exp` plus the 30 s leeway.
    let exp = now() - 28;
    short["exp"] = json!(exp);
    let token = hs256(&short, SECRET.as_bytes());
    for _ in 0..3 {
        assert_eq!(list_as(&app, &token).await.status, 200);
    }
    while now() <= exp + 30 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let refused = list_as(&app, &token).await;
    assert_refused(&refused);
    let body = refused.json();
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audience_may_be_a_string_or_an_array() {
    let app = spawn_app_with(&[("ORDERD_JWT_AUDIENCE", "orderd")]).await;
    let tenant = Uuid::new_v4();
    for (aud, accepted) in [
        (json!("orderd"), true),
        (json!(["billing", "orderd"]), true),
        (json!(["billing"]), false),
        (json!("billing"), false),
    ] {
        let mut c = claims(tenant);
        c["aud"] = aud.clone();
        let reply = list_as(&app, &hs256(&c, SECRET.as_bytes())).await;
        assert_eq!(reply.status == 200, accepted, "{aud}: {}", reply.status);
    }
}

/// `GET /v1/orders` on a running `orderd serve` with `token`: its status.
pub(super) async fn status_with(serve: &ServeProcess, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{}/v1/orders", serve.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A shared secret rotated as the operations guide says, against `orderd serve`
/// processes: the new secret first and the old one after a comma, then the new one
/// alone. No token is refused while both are listed, `orderd token` signs with the
/// first, and a value that no longer reads as secrets stops the process at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hs256_secret_rotates_without_a_refused_token() {
    const NEW: &str = "rotated-integration-secret-0123456789";
    let db = TestDb::new().await;
    let tenant = Uuid::new_v4();
    let old_token = hs256(&claims(tenant), SECRET.as_bytes());
    let new_token = hs256(&claims(tenant), NEW.as_bytes());

    let during = ServeProcess::start(
        &db,
        &[("ORDERD_JWT_HS256_SECRET", format!("{NEW},{SECRET}"))],
    );
    assert_eq!(status_with(&during, &old_token).await, 200);
    assert_eq!(status_with(&during, &new_token).await, 200);
    let minted = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .args(["token", "--tenant", &tenant.to_string()])
        .env("ORDERD_JWT_HS256_SECRET", format!("{NEW},{SECRET}"))
        .output()
        .unwrap();
    assert!(minted.status.success());
    let minted = String::from_utf8(minted.stdout).unwrap().trim().to_string();
    let only = |secret: &str| {
        let mut validation = jsonwebtoken::Validation::new(Algorithm::HS256);
        validation.validate_aud = false;
        jsonwebtoken::decode::<Value>(
            &minted,
            &jsonwebtoken::DecodingKey::from_secret(secret.as_bytes()).unwrap(),
            &validation,
        )
        .is_ok()
    };
    assert!(
        only(NEW) && !only(SECRET),
        "`orderd token` signs with the first secret"
    );
    drop(during);

    let after = ServeProcess::start(&db, &[("ORDERD_JWT_HS256_SECRET", NEW.to_string())]);
    assert_eq!(status_with(&after, &new_token).await, 200);
    assert_eq!(status_with(&after, &old_token).await, 401);
    drop(after);

    // A secret that contains a comma reads as two, one of them too short: refused at
    // start, with the part named.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_orderd"))
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("ORDERD_BIND", "127.0.0.1:0")
        .env("ORDERD_JWT_HS256_SECRET", format!("{NEW},tail-of-it"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("secret 2 of 2 in ORDERD_JWT_HS256_SECRET is too short"),
        "{stderr}"
    );
}
