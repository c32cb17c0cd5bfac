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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::{LIMIT_DEFAULT, LIMIT_MAX};

    /// poem-openapi takes a parameter's bounds as literals; the service checks the page
    /// size with its constants, and the MCP schema is built from them. This ties the
    /// published document to the same constants, so the three cannot drift.
    #[test]
    fn the_published_page_size_bounds_are_the_services() {
        let doc = document();
        let parameters = doc["paths"]["/v1/orders"]["get"]["parameters"]
            .as_array()
            .expect("the list has parameters");
        let limit = parameters
            .iter()
            .find(|p| p["name"] == "limit")
            .expect("a limit parameter");
        assert_eq!(limit["schema"]["maximum"].as_f64(), Some(LIMIT_MAX as f64));
        assert_eq!(limit["schema"]["minimum"].as_f64(), Some(1.0));
        assert_eq!(limit["schema"]["default"].as_i64(), Some(LIMIT_DEFAULT));
    }
}
