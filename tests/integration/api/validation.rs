//! Bad input gets a clear problem+json answer and writes nothing.

use serde_json::json;
use uuid::Uuid;

use crate::support::{Reply, TestApp, new_key, spawn_app};

async fn assert_nothing_written(app: &TestApp) {
    assert_eq!(
        (
            app.count("orders").await,
            app.count("outbox_event").await,
            app.count("idempotency_record").await
        ),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_schema_violating_bodies_are_validation_errors() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not json", b"{not json".to_vec()),
        ("empty", b"".to_vec()),
        ("array", b"[]".to_vec()),
        (
            "quantity as string",
            json!({"sku": "A", "quantity": "2"})
                .to_string()
                .into_bytes(),
        ),
        (
            "quantity fractional",
            br#"{"sku":"A","quantity":2.5}"#.to_vec(),
        ),
        (
            "sku missing",
            json!({"quantity": 2}).to_string().into_bytes(),
        ),
        (
            "unknown field",
            json!({"sku": "A", "quantity": 2, "price": 10})
                .to_string()
                .into_bytes(),
        ),
        (
            "quantity zero",
            json!({"sku": "A", "quantity": 0}).to_string().into_bytes(),
        ),
        (
            "quantity too big",
            json!({"sku": "A", "quantity": 10001})
                .to_string()
                .into_bytes(),
        ),
        (
            "sku empty",
            json!({"sku": "", "quantity": 1}).to_string().into_bytes(),
        ),
        (
            "sku too long",
            json!({"sku": "A".repeat(65), "quantity": 1})
                .to_string()
                .into_bytes(),
        ),
        (
            "sku bad chars",
            json!({"sku": "A B/C", "quantity": 1})
                .to_string()
                .into_bytes(),
        ),
        (
            "customer_ref too long",
            json!({"sku": "A", "quantity": 1, "customer_ref": "x".repeat(129)})
                .to_string()
                .into_bytes(),
        ),
        (
            "customer_ref wrong type",
            json!({"sku": "A", "quantity": 1, "customer_ref": 5})
                .to_string()
                .into_bytes(),
        ),
    ];
    for (name, body) in cases {
        let reply = app.create_raw(&token, Some(&new_key()), body).await;
        assert_eq!(
            reply.status,
            400,
            "{name}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.assert_problem(400, "validation-error");
        assert_eq!(reply.json()["instance"], "/v1/orders", "{name}");
    }
    assert_nothing_written(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_errors_name_the_field() {
    let app = spawn_app().await;
    let reply = app
        .create_raw(
            &app.token(Uuid::new_v4()),
            Some(&new_key()),
            br#"{"sku":"A","quantity":0}"#.to_vec(),
        )
        .await;
    reply.assert_problem(400, "validation-error");
    assert_eq!(
        reply.json()["errors"][0]["field"],
        "quantity",
        "{}",
        reply.json()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_boundaries_are_accepted() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let body = json!({"sku": "a".repeat(64), "quantity": 10000, "customer_ref": "é".repeat(128)});
    let reply = app.create(&token, &new_key(), &body).await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        app.create(&token, &new_key(), &json!({"sku": "Z._-9", "quantity": 1}))
            .await
            .status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_64_kib_is_413_declared_or_streamed() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let big = json!({"sku": "A", "quantity": 1, "customer_ref": "x".repeat(70 * 1024)})
        .to_string()
        .into_bytes();
    app.create_raw(&token, Some(&new_key()), big.clone())
        .await
        .assert_problem(413, "payload-too-large");

    // Chunked, with no Content-Length to trust.
    let stream = futures::stream::iter(
        big.chunks(8 * 1024)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let response = app
        .client
        .post(format!("{}/v1/orders", app.base))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .header("Idempotency-Key", new_key())
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    Reply::read(response)
        .await
        .assert_problem(413, "payload-too-large");
    assert_nothing_written(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_content_type_is_415() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let mut request = app
            .client
            .post(format!("{}/v1/orders", app.base))
            .bearer_auth(&token)
            .header("Idempotency-Key", new_key())
            .body(r#"{"sku":"A","quantity":1}"#);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        Reply::read(request.send().await.unwrap())
            .await
            .assert_problem(415, "unsupported-media-type");
    }
    assert_nothing_written(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_wrong_methods_are_problems_too() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    app.get(&token, "/v2/nothing")
        .await
        .assert_problem(404, "not-found");
    let reply = Reply::read(
        app.client
            .delete(format!("{}/v1/orders", app.base))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    reply.assert_problem(405, "method-not-allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_path_and_query_parameters_are_validation_errors() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    for path in [
        "/v1/orders/not-a-uuid",
        "/v1/orders?limit=0",
        "/v1/orders?limit=101",
        "/v1/orders?limit=ten",
        "/v1/orders?after=%21%21",
    ] {
        app.get(&token, path)
            .await
            .assert_problem(400, "validation-error");
    }
    app.cancel(&token, &new_key(), "not-a-uuid")
        .await
        .assert_problem(400, "validation-error");
    assert_nothing_written(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_the_database_cannot_hold_or_should_not_is_a_400_naming_the_field() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    for bad in [
        "nul \u{0}",
        "bell \u{7}",
        "c1 \u{9f}",
        "non \u{ffff}",
        "non \u{fdd0}",
        "astral \u{1fffe}",
    ] {
        let reply = app
            .create(
                &token,
                &new_key(),
                &json!({"sku": "TXT-1", "quantity": 1, "customer_ref": bad}),
            )
            .await;
        reply.assert_problem(400, "validation-error");
        let errors = reply.json()["errors"].clone();
        assert_eq!(
            errors.as_array().map(Vec::len),
            Some(1),
            "{bad:?}: {errors}"
        );
        assert_eq!(errors[0]["field"], "customer_ref", "{bad:?}");
    }
    // Ordinary Unicode, tabs excepted, is fine.
    let fine = app
        .create(
            &token,
            &new_key(),
            &json!({"sku": "TXT-1", "quantity": 1, "customer_ref": "café ☕ 😀"}),
        )
        .await;
    assert_eq!(fine.status, 201);
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_cursor_that_is_not_a_position_is_a_400_never_a_500() {
    use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let id = Uuid::nil().simple();
    for forged in [
        format!("{}.{id}", i64::MAX),
        format!("{}.{id}", i64::MIN),
        format!("{}.{id}", 253_402_300_800_000_000i64), // year 10000
        format!("-62200000000000000.{id}"),             // before year 1
        "1.2.3".to_string(),
        format!("1.{}", "g".repeat(32)),
    ] {
        let cursor = URL_SAFE_NO_PAD.encode(&forged);
        let reply = app.get(&token, &format!("/v1/orders?after={cursor}")).await;
        assert_eq!(
            reply.status,
            400,
            "{forged}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.json()["errors"][0]["field"], "after");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_framework_wording_reaches_a_client() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let replies = [
        app.get(&token, "/v1/orders/not-a-uuid").await,
        app.get(&token, "/v1/orders?limit=ten").await,
        app.create(&token, &new_key(), &json!({"quantiy": 1})).await,
        app.cancel(&token, &new_key(), "nope").await,
    ];
    for reply in replies {
        let text = String::from_utf8_lossy(&reply.body).to_string();
        for internal in [
            "integer_int",
            "string_uuid",
            "param0",
            "parse request payload",
            "CreateOrderRequest",
        ] {
            assert!(!text.contains(internal), "{internal} in {text}");
        }
        let body = reply.json();
        assert!(
            body["errors"].as_array().is_some_and(|e| !e.is_empty()),
            "{text}"
        );
    }
}
