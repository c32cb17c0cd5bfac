//! `/mcp` through the official Rust MCP client (rmcp) over real HTTP: the tools, their
//! schemas, and the same exactly-once guarantees as REST (docs/contract.md §9).

use std::sync::Arc;

use futures::future::join_all;
use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, CallToolResult, JsonObject},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{
    ServeProcess, TestApp, TestDb, new_key, order_body, sample, spawn_app, spawn_app_with,
};

type Client = RunningService<rmcp::RoleClient, ()>;

/// An MCP session with orderd as the holder of `token`.
async fn connect(app: &TestApp, token: &str) -> Client {
    connect_at(&app.base, token).await
}

async fn connect_at(base: &str, token: &str) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp"))
        .auth_header(token.to_string());
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("the MCP handshake succeeds")
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args as JsonObject))
        .await
        .expect("a tool result, never a transport error")
}

fn text(result: &CallToolResult) -> String {
    result.content[0]
        .as_text()
        .expect("text content")
        .text
        .clone()
}

/// The problem object of a refusal.
fn problem(result: &CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(true), "{}", text(result));
    serde_json::from_str(&text(result)).expect("the refusal text is a problem object")
}

fn structured(result: &CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(false), "{}", text(result));
    result
        .structured_content
        .clone()
        .expect("structured content")
}

fn request_id() -> String {
    format!("mcp-{}", Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_are_listed_with_input_and_output_schemas() {
    let app = spawn_app().await;
    let client = connect(&app, &app.token(Uuid::new_v4())).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        ["create_order", "cancel_order", "get_order", "list_orders"]
    );
    for tool in &tools {
        assert!(tool.output_schema.is_some(), "{}", tool.name);
        assert!(
            tool.description.as_ref().is_some_and(|d| d.len() > 40),
            "{}",
            tool.name
        );
        let input = Value::Object((*tool.input_schema).clone());
        assert_eq!(input["additionalProperties"], false, "{}", tool.name);
        if tool.name.ends_with("_order") && tool.name != "get_order" {
            assert_eq!(
                input["properties"]["requestId"]["pattern"],
                "^[A-Za-z0-9_-]{16,128}$"
            );
            assert!(
                input["required"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("requestId"))
            );
        }
    }
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_invocations_with_one_request_id_make_exactly_one_order() {
    let app = spawn_app().await;
    let client = connect(&app, &app.token(Uuid::new_v4())).await;
    let args = json!({"requestId": request_id(), "sku": "MCP-1", "quantity": 2});
    let first = call(&client, "create_order", args.clone()).await;
    let second = call(&client, "create_order", args).await;
    assert_eq!(structured(&first), structured(&second));
    assert!(text(&first).starts_with("Done"), "{}", text(&first));
    assert!(text(&second).starts_with("Replayed"), "{}", text(&second));
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_call_and_a_tool_call_with_one_key_are_one_operation() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let rest = app.create(&token, &key, &order_body("BOTH-1", 3)).await;
    assert_eq!(rest.status, 201);
    let client = connect(&app, &token).await;
    let tool = call(
        &client,
        "create_order",
        json!({"requestId": key, "sku": "BOTH-1", "quantity": 3}),
    )
    .await;
    assert_eq!(
        structured(&tool),
        rest.json(),
        "the tool replays the REST answer"
    );
    assert!(text(&tool).starts_with("Replayed"));
    // The same key with another request is the same 422 as over REST.
    let other = call(
        &client,
        "create_order",
        json!({"requestId": key, "sku": "BOTH-1", "quantity": 4}),
    )
    .await;
    assert_eq!(problem(&other)["type"], "/problems/idempotency-key-reused");
    assert_eq!(problem(&other)["status"], 422);
    assert_eq!(app.count("orders").await, 1);
}

/// The stored records of one tenant, as `(endpoint, status, body)`.
async fn stored_records(app: &TestApp, tenant: Uuid) -> Vec<(String, i16, Vec<u8>)> {
    sqlx::query_as(
        "SELECT endpoint, response_status, response_body FROM idempotency_record
         WHERE tenant_id = $1 ORDER BY created_at",
    )
    .bind(tenant)
    .fetch_all(&app.db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_answers_the_same_over_rest_and_over_mcp() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let token = app.token(tenant);
    let client = connect(&app, &token).await;

    // Create: REST first, then the tool with the same key, the same request.
    let create_key = new_key();
    let rest_created = app
        .create(&token, &create_key, &order_body("SAME-1", 2))
        .await;
    assert_eq!(rest_created.status, 201);
    let tool_created = call(
        &client,
        "create_order",
        json!({"requestId": create_key, "sku": "SAME-1", "quantity": 2}),
    )
    .await;
    assert_eq!(structured(&tool_created), rest_created.json());
    let id = rest_created.json()["id"].as_str().unwrap().to_string();

    // Cancel: the tool first this time, then REST replays it.
    let cancel_key = new_key();
    let tool_cancelled = call(
        &client,
        "cancel_order",
        json!({"requestId": cancel_key, "order_id": id}),
    )
    .await;
    let rest_cancelled = app.cancel(&token, &cancel_key, &id).await;
    assert_eq!(rest_cancelled.status, 200);
    assert_eq!(
        rest_cancelled.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(structured(&tool_cancelled), rest_cancelled.json());
    assert_eq!(rest_cancelled.json()["status"], "CANCELLED");

    // Get and list: the same bytes' JSON through either transport.
    let rest_got = app.get(&token, &format!("/v1/orders/{id}")).await;
    let tool_got = call(&client, "get_order", json!({"order_id": id})).await;
    assert_eq!(structured(&tool_got), rest_got.json());
    assert_eq!(rest_got.json(), rest_cancelled.json());
    let rest_listed = app.get(&token, "/v1/orders?limit=5").await;
    let tool_listed = call(&client, "list_orders", json!({"limit": 5})).await;
    assert_eq!(structured(&tool_listed), rest_listed.json());
    assert_eq!(rest_listed.json()["items"][0], rest_got.json());

    // One order, one stored record per operation (holding the bytes REST answered),
    // one event per change.
    assert_eq!(app.count("orders").await, 1);
    let records = stored_records(&app, tenant).await;
    assert_eq!(
        records,
        [
            (
                "POST /v1/orders".to_string(),
                201,
                rest_created.body.clone()
            ),
            (
                "POST /v1/orders/{id}/cancel".to_string(),
                200,
                rest_cancelled.body.clone()
            ),
        ]
    );
    assert_eq!(app.event_types().await, ["OrderCreated", "OrderCancelled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_create_tool_schema_is_the_rest_body_schema_plus_request_id() {
    let app = spawn_app().await;
    let client = connect(&app, &app.token(Uuid::new_v4())).await;
    let tools = client.list_all_tools().await.unwrap();
    let create = tools.iter().find(|t| t.name == "create_order").unwrap();
    let tool_schema = Value::Object((*create.input_schema).clone());
    let spec: Value = app
        .client
        .get(format!("{}/openapi.json", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rest_schema = &spec["components"]["schemas"]["CreateOrderRequest"];
    let rest_properties = rest_schema["properties"].as_object().unwrap();
    let tool_properties = tool_schema["properties"].as_object().unwrap();
    let mut tool_names: Vec<&String> = tool_properties.keys().collect();
    tool_names.retain(|name| *name != "requestId");
    assert_eq!(tool_names, rest_properties.keys().collect::<Vec<_>>());
    for (name, rest) in rest_properties {
        let tool = &tool_properties[name];
        for rule in [
            "minLength",
            "maxLength",
            "pattern",
            "minimum",
            "maximum",
            "description",
        ] {
            assert_eq!(tool.get(rule), rest.get(rule), "`{name}`: {rule}");
        }
        let nullable = rest.get("nullable") == Some(&json!(true));
        let ty = if nullable {
            json!([rest["type"], "null"])
        } else {
            rest["type"].clone()
        };
        assert_eq!(tool["type"], ty, "`{name}`: type");
    }
    assert_eq!(
        rest_schema["properties"]["quantity"]["maximum"],
        json!(orderd::orders::rules::QUANTITY_MAX as f64)
    );
    let mut required = rest_schema["required"].as_array().unwrap().clone();
    required.insert(0, json!("requestId"));
    assert_eq!(tool_schema["required"], json!(required));
    assert_eq!(
        tool_schema["additionalProperties"],
        rest_schema["additionalProperties"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_are_refused_as_tool_results_and_write_nothing() {
    let app = spawn_app().await;
    let client = connect(&app, &app.token(Uuid::new_v4())).await;
    for (args, field) in [
        (
            json!({"requestId": "short", "sku": "A", "quantity": 1}),
            "requestId",
        ),
        (
            json!({"requestId": "\"quoted-but-not-here-0001\"", "sku": "A", "quantity": 1}),
            "requestId",
        ),
        (json!({"sku": "A", "quantity": 1}), "requestId"),
        (
            json!({"requestId": request_id(), "sku": "A", "quantity": 0}),
            "quantity",
        ),
        (
            json!({"requestId": request_id(), "sku": "A", "quantity": 1, "price": 3}),
            "price",
        ),
        (
            json!({"requestId": request_id(), "sku": "A", "quantity": 1, "customer_ref": "a\u{0}b"}),
            "customer_ref",
        ),
    ] {
        let result = call(&client, "create_order", args.clone()).await;
        let problem = problem(&result);
        assert_eq!(problem["status"], 400, "{args}");
        assert_eq!(problem["errors"][0]["field"], field, "{args}");
    }
    assert_eq!(
        (
            app.count("orders").await,
            app.count("idempotency_record").await
        ),
        (0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_get_and_list_work_and_another_tenants_order_is_not_found() {
    let app = spawn_app().await;
    let client = connect(&app, &app.token(Uuid::new_v4())).await;
    let created = structured(
        &call(
            &client,
            "create_order",
            json!({"requestId": request_id(), "sku": "T-1", "quantity": 1}),
        )
        .await,
    );
    let id = created["id"].as_str().unwrap();
    let cancelled = structured(
        &call(
            &client,
            "cancel_order",
            json!({"requestId": request_id(), "order_id": id}),
        )
        .await,
    );
    assert_eq!(cancelled["status"], "CANCELLED");
    let got = structured(&call(&client, "get_order", json!({"order_id": id})).await);
    assert_eq!(got, cancelled);
    let page = structured(&call(&client, "list_orders", json!({"limit": 10})).await);
    assert_eq!(page["items"], json!([cancelled]));
    assert_eq!(page["next"], Value::Null);

    let stranger = connect(&app, &app.token(Uuid::new_v4())).await;
    for (tool, args) in [
        ("get_order", json!({"order_id": id})),
        (
            "cancel_order",
            json!({"requestId": request_id(), "order_id": id}),
        ),
    ] {
        assert_eq!(
            problem(&call(&stranger, tool, args).await)["type"],
            "/problems/not-found",
            "{tool}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_can_read_but_not_create() {
    let app = spawn_app().await;
    let tenant = Uuid::new_v4();
    let reader = connect(&app, &app.token_with_scope(tenant, "orders:read")).await;
    let refused = call(
        &reader,
        "create_order",
        json!({"requestId": request_id(), "sku": "RO", "quantity": 1}),
    )
    .await;
    assert_eq!(problem(&refused)["type"], "/problems/forbidden");
    assert!(call(&reader, "list_orders", json!({})).await.is_error == Some(false));
    assert_eq!(app.count("idempotency_record").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_http_request_is_401_naming_the_resource_metadata() {
    let app = spawn_app_with(&[("ORDERD_JWT_ISSUER", "https://issuer.example")]).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let refused = app
        .client
        .post(format!("{}/mcp", app.base))
        .header("accept", "application/json, text/event-stream")
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let challenge = refused.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        challenge.starts_with(r#"Bearer error="invalid_token""#),
        "{challenge}"
    );
    let metadata_url = challenge
        .split("resource_metadata=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the challenge names the metadata");
    let metadata: Value = reqwest::get(metadata_url)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(metadata["resource"], format!("{}/mcp", app.base));
    assert_eq!(
        metadata["authorization_servers"],
        json!(["https://issuer.example"])
    );
    assert_eq!(
        metadata["scopes_supported"],
        json!(["orders:read", "orders:write"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_origin_not_allowed_is_refused_403() {
    let app = spawn_app_with(&[("ORDERD_MCP_ALLOWED_ORIGINS", "https://agents.example")]).await;
    let token = app.token(Uuid::new_v4());
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let post = |origin: &'static str| {
        app.client
            .post(format!("{}/mcp", app.base))
            .bearer_auth(&token)
            .header("accept", "application/json, text/event-stream")
            .header("origin", origin)
            .json(&initialize)
            .send()
    };
    assert_eq!(post("https://evil.example").await.unwrap().status(), 403);
    let allowed = post("https://agents.example").await.unwrap();
    assert_eq!(allowed.status(), 200);
    let body: Value = allowed.json().await.unwrap();
    assert_eq!(body["result"]["protocolVersion"], "2025-06-18");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_tool_calls_with_one_request_id_make_one_order() {
    let app = spawn_app().await;
    let client = Arc::new(connect(&app, &app.token(Uuid::new_v4())).await);
    let args = json!({"requestId": request_id(), "sku": "RACE-MCP", "quantity": 1});
    let results = join_all((0..50).map(|_| {
        let (client, args) = (client.clone(), args.clone());
        async move { call(&client, "create_order", args).await }
    }))
    .await;
    let mut ids = std::collections::BTreeSet::new();
    for result in &results {
        if result.is_error == Some(true) {
            let problem = problem(result);
            assert_eq!(problem["status"], 409, "{problem}");
            assert!(
                problem["retry_after"].as_u64().is_some_and(|s| s >= 1),
                "{problem}"
            );
        } else {
            ids.insert(structured(result)["id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(ids.len(), 1, "every success names the same order");
    assert_eq!(
        (app.count("orders").await, app.count("outbox_event").await),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_count_like_rest_and_are_refused_as_tool_results() {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "1"),
        ("ORDERD_TENANT_BURST", "4"),
    ])
    .await;
    let created = |text: &str| {
        sample(
            text,
            r#"idempotency_requests_total{endpoint="POST /v1/orders",outcome="created"}"#,
        )
        .unwrap_or(0.0)
    };
    let before = created(&orderd::metrics::install(&orderd::api::known_labels()).render());
    let token = app.token(Uuid::new_v4());
    // The handshake is two requests (initialize, then the initialized notification).
    let client = connect(&app, &token).await;
    for _ in 0..2 {
        let ok = call(
            &client,
            "create_order",
            json!({"requestId": request_id(), "sku": "RL", "quantity": 1}),
        )
        .await;
        assert_eq!(ok.is_error, Some(false), "{}", text(&ok));
    }
    let limited = call(
        &client,
        "create_order",
        json!({"requestId": request_id(), "sku": "RL", "quantity": 1}),
    )
    .await;
    let problem = problem(&limited);
    assert_eq!(problem["type"], "/problems/rate-limited");
    assert!(problem["retry_after"].as_u64().is_some_and(|s| s >= 1));
    assert_eq!(app.count("idempotency_record").await, 2);
    assert!(
        created(&orderd::metrics::install(&orderd::api::known_labels()).render()) >= before + 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_and_listings_count_against_the_tenant_limit_too() {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "1"),
        ("ORDERD_TENANT_BURST", "3"),
    ])
    .await;
    let token = app.token(Uuid::new_v4());
    // Initialize and the initialized notification, then one listing: the burst of 3.
    let client = connect(&app, &token).await;
    client.list_all_tools().await.unwrap();
    assert!(
        client.list_all_tools().await.is_err(),
        "a fourth request in the same second is refused"
    );
    // Over plain HTTP the refusal is the usual 429 with its fields; another tenant is
    // not touched by it.
    let ping = |token: String| {
        app.client
            .post(format!("{}/mcp", app.base))
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#)
            .send()
    };
    let refused = crate::support::Reply::read(ping(token).await.unwrap()).await;
    refused.assert_problem(429, "rate-limited");
    assert!(refused.header("retry-after").is_some());
    let other = ping(app.token(Uuid::new_v4())).await.unwrap();
    assert_ne!(other.status(), 429);
    let metrics = orderd::metrics::install(&orderd::api::known_labels()).render();
    assert!(
        sample(&metrics, r#"rate_limited_requests_total{route="/mcp"}"#).unwrap_or(0.0) >= 2.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_unknown_tools_and_with_unparseable_arguments_count_against_the_limit_too() {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "1"),
        ("ORDERD_TENANT_BURST", "2"),
    ])
    .await;
    let token = app.token(Uuid::new_v4());
    let tools_call = |params: Value| {
        app.client
            .post(format!("{}/mcp", app.base))
            .bearer_auth(&token)
            .header("Accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
            .send()
    };
    // The burst: a tool that does not exist, and arguments that are not an object.
    let unknown = tools_call(json!({"name": "drop_tables", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(unknown.status(), 200);
    let unknown: Value = unknown.json().await.unwrap();
    assert_eq!(unknown["result"]["isError"], true, "{unknown}");
    let unparseable = tools_call(json!({"name": "create_order", "arguments": "free text"}))
        .await
        .unwrap();
    assert_ne!(unparseable.status(), 429);
    // Both counted: the next calls, in the same second, are refused as tool results,
    // whether the tool exists or its arguments parse.
    let limited: Value = tools_call(json!({"name": "drop_tables", "arguments": {}}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let refusal: Value =
        serde_json::from_str(limited["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(refusal["type"], "/problems/rate-limited", "{limited}");
    let limited: Value = tools_call(json!({"name": "create_order", "arguments": "free text"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(limited["result"]["isError"], true, "{limited}");
    let refusal: Value =
        serde_json::from_str(limited["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(refusal["type"], "/problems/rate-limited", "{limited}");
    assert_eq!(app.count("idempotency_record").await, 0);
}

/// A burst of `tools/call` requests the protocol layer refuses (a wrong `Accept`) is
/// metered all the same: past the tenant's burst they are refused as rate-limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_protocol_layer_refuses_are_metered_before_it_sees_them() {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "5"),
        ("ORDERD_TENANT_BURST", "5"),
    ])
    .await;
    let token = app.token(Uuid::new_v4());
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "create_order",
                   "arguments": {"requestId": request_id(), "sku": "ACCEPT", "quantity": 1}}});
    let burst = (0..40).map(|_| {
        app.client
            .post(format!("{}/mcp", app.base))
            .bearer_auth(&token)
            .header("Accept", "text/plain")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&call)
            .send()
    });
    let mut refused_by_protocol = 0;
    let mut rate_limited = 0;
    for answer in futures::future::join_all(burst).await {
        let answer = crate::support::Reply::read(answer.unwrap()).await;
        if answer.status == 406 {
            refused_by_protocol += 1;
            continue;
        }
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let result = answer.json();
        assert_eq!(result["id"], 9, "{result}");
        assert_eq!(result["result"]["isError"], true, "{result}");
        let problem: Value =
            serde_json::from_str(result["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(problem["type"], "/problems/rate-limited", "{problem}");
        rate_limited += 1;
    }
    // The burst of five (and what the bucket refilled meanwhile) reached the protocol
    // layer; everything else was refused by the limits.
    assert_eq!(refused_by_protocol + rate_limited, 40);
    assert!(
        (5..=10).contains(&refused_by_protocol),
        "{refused_by_protocol} reached the protocol layer, {rate_limited} were rate-limited"
    );
    assert_eq!(app.count("idempotency_record").await, 0);
}

/// A method the transport does not serve is answered 405 with `Allow`, and counts
/// against the tenant's limits like any other request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_on_mcp_are_counted_then_answered_405_with_allow() {
    let app = spawn_app_with(&[
        ("ORDERD_TENANT_RATE_PER_SEC", "1"),
        ("ORDERD_TENANT_BURST", "2"),
    ])
    .await;
    let token = app.token(Uuid::new_v4());
    let request = |method: reqwest::Method| {
        app.client
            .request(method, format!("{}/mcp", app.base))
            .bearer_auth(&token)
            .header("Accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
            .send()
    };
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let answer = crate::support::Reply::read(request(method.clone()).await.unwrap()).await;
        answer.assert_problem(405, "method-not-allowed");
        assert_eq!(answer.header("allow").as_deref(), Some("POST"), "{method}");
    }
    // Both were counted: the third request in the same second is refused.
    let answer = crate::support::Reply::read(request(reqwest::Method::PUT).await.unwrap()).await;
    answer.assert_problem(429, "rate-limited");
    // None of them reached a tool: nothing was claimed or written.
    assert_eq!(app.count("idempotency_record").await, 0);
    assert_eq!(app.count("orders").await, 0);
    assert_eq!(app.count("outbox_event").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advertised_resource_comes_from_configuration_never_from_the_host_header() {
    for (settings, want) in [
        (vec![], None),
        (
            vec![("ORDERD_PUBLIC_URL", "https://orders.example.com/")],
            Some("https://orders.example.com"),
        ),
    ] {
        let app = spawn_app_with(&settings).await;
        let base = want.map_or_else(|| app.base.clone(), str::to_string);
        let refused = app
            .client
            .post(format!("{}/mcp", app.base))
            .header("host", "evil.example")
            .header("x-forwarded-proto", "https")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401);
        let challenge = refused.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            challenge.contains(&format!(
                r#"resource_metadata="{base}/.well-known/oauth-protected-resource""#
            )),
            "{challenge}"
        );
        let metadata: Value = app
            .client
            .get(format!("{}/.well-known/oauth-protected-resource", app.base))
            .header("host", "evil.example")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(metadata["resource"], format!("{base}/mcp"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_with_a_newline_cannot_start_a_log_line() {
    let db = TestDb::new().await;
    let serve = ServeProcess::start(&db, &[("ORDERD_LOG_FORMAT", "text".to_string())]);
    let client = connect_at(&serve.base, &serve.token(Uuid::new_v4())).await;
    let forged = "list_orders\nFORGED-LINE level=ERROR the database is gone";
    let result = call(&client, forged, json!({})).await;
    assert_eq!(problem(&result)["status"], 404, "no such tool");
    let marker = call(&client, "get_order", json!({"order_id": Uuid::nil()})).await;
    assert_eq!(problem(&marker)["status"], 404);
    // The second call's log line follows the first's: once it is there, so is the first.
    for _ in 0..100 {
        if serve
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("tool=get_order"))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let logs = serve.logs.lock().unwrap().clone();
    let line = logs
        .iter()
        .find(|l| l.contains("tool call") && l.contains("FORGED-LINE"))
        .expect("the refused call is logged");
    assert!(
        line.contains(r#"tool="list_orders\nFORGED-LINE level=ERROR the database is gone""#),
        "{line}"
    );
    assert!(
        logs.iter().all(|l| !l.starts_with("FORGED-LINE")),
        "no line starts with the client's text: {logs:#?}"
    );
}

/// The `_meta` instant of `result` under orderd's key-expiry key, if any.
fn key_expires(result: &CallToolResult) -> Option<chrono::DateTime<chrono::Utc>> {
    let meta = result.meta.as_ref()?;
    let value = meta.0.get(orderd::api::mcp::KEY_EXPIRES_META)?;
    Some(value.as_str()?.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_tool_result_tells_when_its_request_id_is_forgotten_as_rest_does() {
    let app = spawn_app().await;
    let token = app.token(Uuid::new_v4());
    let client = connect(&app, &token).await;
    let key = request_id();
    let first = call(
        &client,
        "create_order",
        json!({"requestId": key, "sku": "META-1", "quantity": 1}),
    )
    .await;
    let at = key_expires(&first).expect("the first result says when its requestId expires");
    let stored: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM idempotency_record WHERE idem_key = $1")
            .bind(&key)
            .fetch_one(&app.db.pool)
            .await
            .unwrap();
    assert_eq!(at, stored);
    // The tool's replay, and REST's, say the same instant.
    let again = call(
        &client,
        "create_order",
        json!({"requestId": key, "sku": "META-1", "quantity": 1}),
    )
    .await;
    assert_eq!(key_expires(&again), Some(at));
    let rest = app.create(&token, &key, &order_body("META-1", 1)).await;
    assert_eq!(
        rest.header("idempotency-key-expires"),
        Some(at.format("%a, %d %b %Y %H:%M:%S GMT").to_string())
    );
    // A read is not stored: no expiry.
    let id = structured(&first)["id"].as_str().unwrap().to_string();
    let read = call(&client, "get_order", json!({"id": id})).await;
    assert_eq!(key_expires(&read), None);
}
