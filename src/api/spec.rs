//! The OpenAPI document as served and committed: what poem-openapi derives from the
//! handlers, plus what its derive cannot say.
//!
//! - The create body refuses unknown fields (`additionalProperties: false`), as the
//!   handler does; generated clients and fuzzers then know it too.

use poem::{Endpoint, Response, endpoint::make_sync, get};
use serde_json::Value;

use super::service;

/// The document, as a JSON value.
pub fn document() -> Value {
    let mut doc: Value =
        serde_json::from_str(&service().spec()).expect("poem-openapi renders valid JSON");
    if let Some(create) = doc.pointer_mut("/components/schemas/CreateOrderRequest") {
        create["additionalProperties"] = Value::Bool(false);
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
