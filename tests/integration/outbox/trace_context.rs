//! W3C trace context through the outbox (docs/contract.md §6): a write's `traceparent`
//! (and `tracestate`) is kept with the events it causes and published as the message
//! attributes of the same names, read back here from moto's SQS; an invalid one is
//! ignored; a replay creates no event, so the event keeps the first request's context.

use serde_json::Value;
use uuid::Uuid;

use crate::support::{
    TestApp, new_key, order_body,
    sns::{Topic, moto_endpoint},
    spawn_publishing_app,
};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

async fn send(
    app: &TestApp,
    path: &str,
    token: &str,
    key: &str,
    body: Option<&Value>,
    trace: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = app
        .client
        .post(format!("{}{path}", app.base))
        .bearer_auth(token)
        .header("Idempotency-Key", key);
    if let Some(body) = body {
        request = request.json(body);
    }
    for (name, value) in trace {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writes_trace_context_reaches_the_message_attributes_of_its_events() {
    let topic = Topic::create(false).await;
    let app = spawn_publishing_app(&moto_endpoint(), &topic.arn, &[]).await;
    let token = app.token(Uuid::new_v4());
    let key = new_key();
    let traced = [("traceparent", PARENT), ("tracestate", STATE)];
    let created = send(
        &app,
        "/v1/orders",
        &token,
        &key,
        Some(&order_body("TRACE-1", 1)),
        &traced,
    )
    .await;
    assert_eq!(created.status(), 201);
    let first: Value = created.json().await.unwrap();
    let id = first["id"].as_str().unwrap().to_string();

    // A replay under another trace answers the stored response and writes no event.
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let replay = send(
        &app,
        "/v1/orders",
        &token,
        &key,
        Some(&order_body("TRACE-1", 1)),
        &[("traceparent", other)],
    )
    .await;
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.json::<Value>().await.unwrap(), first);

    // A cancel carries its own request's context; an invalid one is ignored.
    let cancel_parent = "00-11111111111111111111111111111111-2222222222222222-00";
    let cancelled = send(
        &app,
        &format!("/v1/orders/{id}/cancel"),
        &token,
        &new_key(),
        None,
        &[("traceparent", cancel_parent)],
    )
    .await;
    assert_eq!(cancelled.status(), 200);
    let untraced = send(
        &app,
        "/v1/orders",
        &token,
        &new_key(),
        Some(&order_body("TRACE-2", 1)),
        &[("traceparent", "00-not-a-trace-01"), ("tracestate", STATE)],
    )
    .await;
    assert_eq!(untraced.status(), 201);

    let messages = topic.collect(3).await;
    assert_eq!(messages.len(), 3, "the replay wrote no event");
    let of = |sku: &str, event_type: &str| {
        messages
            .iter()
            .find(|m| m.body["order"]["sku"] == sku && m.body["event_type"] == event_type)
            .unwrap_or_else(|| panic!("no {event_type} of {sku}"))
    };
    let created_event = of("TRACE-1", "OrderCreated");
    assert_eq!(
        created_event.attribute("traceparent"),
        Some(PARENT),
        "the first request's"
    );
    assert_eq!(created_event.attribute("tracestate"), Some(STATE));
    let cancel_event = of("TRACE-1", "OrderCancelled");
    assert_eq!(cancel_event.attribute("traceparent"), Some(cancel_parent));
    assert_eq!(cancel_event.attribute("tracestate"), None);
    let untraced_event = of("TRACE-2", "OrderCreated");
    assert_eq!(untraced_event.attribute("traceparent"), None);
    assert_eq!(
        untraced_event.attribute("tracestate"),
        None,
        "dropped with its parent"
    );
    // The body is the contract's event, untouched by the context.
    assert!(created_event.body.get("traceparent").is_none());
}
