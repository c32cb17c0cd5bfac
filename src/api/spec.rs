//! The OpenAPI document as served and committed: what poem-openapi derives from the
//! handlers, plus what its derive cannot say.
//!
//! - The create body refuses unknown fields (`additionalProperties: false`), as the
//!   handler does; generated clients and fuzzers then know it too.
//! - Each operation names the scope it needs (`x-required-scopes`): OpenAPI 3.0 has no
//!   scopes on a bearer scheme, and an extension is what 3.0 tools carry through.

use poem::{Endpoint, Response, endpoint::make_sync, get};
use serde_json::Value;

use super::service;
use crate::auth::{SCOPE_READ, SCOPE_WRITE};

/// The document, as a JSON value.
pub fn document() -> Value {
    let mut doc: Value =
        serde_json::from_str(&service().spec()).expect("poem-openapi renders valid JSON");
    if let Some(create) = doc.pointer_mut("/components/schemas/CreateOrderRequest") {
        create["additionalProperties"] = Value::Bool(false);
    }
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for operation in paths.values_mut().filter_map(Value::as_object_mut) {
            for op in operation.values_mut().filter_map(Value::as_object_mut) {
                let scope = match op.get("operationId").and_then(Value::as_str) {
                    Some("createOrder" | "cancelOrder") => SCOPE_WRITE,
                    Some("getOrder" | "listOrders") => SCOPE_READ,
                    _ => continue,
                };
                op.insert("x-required-scopes".into(), serde_json::json!([scope]));
            }
        }
    }
    doc
}

/// The document in JSON.
pub fn json() -> String {
    serde_json::to_string_pretty(&document()).expect("a JSON value serialises")
}

/// The document in YAML (the committed `openapi/openapi.yaml`).
pub fn yaml() -> String {
    serde_yaml::to_string(&document()).expect("a JSON value is valid YAML")
}

/// `GET /openapi.json`.
pub fn json_endpoint() -> impl Endpoint {
    let body = json();
    get(make_sync(move |_| {
        Response::builder()
            .content_type("application/json; charset=utf-8")
            .body(body.clone())
    }))
}

/// `GET /openapi.yaml`.
pub fn yaml_endpoint() -> impl Endpoint {
    let body = yaml();
    get(make_sync(move |_| {
        Response::builder()
            .content_type("application/x-yaml; charset=utf-8")
            .body(body.clone())
    }))
}
