//! The tools an AI agent calls for a tenant: `create_order`, `cancel_order`,
//! `get_order`, `list_orders`.
//!
//! One table ([`Tool`]) names each tool with its scope-carrying route and its schemas;
//! a call parses the tool's arguments and calls the same application operation as the
//! tool's REST twin, with `requestId` as the `Idempotency-Key` of that endpoint, so a
//! tool call and a REST call with the same key and request are one operation: one
//! order, one event, the second one replays. Refusals are tool results with
//! `isError: true` whose text is the same problem object REST answers, so the model can
//! read it and act on it.

use std::sync::Arc;

use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    },
    service::RequestContext,
};
use serde_json::{Map, Value, json};
use tracing::Instrument;
use uuid::Uuid;

use crate::{
    api::{
        body::create_order_schema,
        problem::{AppKind, Problem},
        routes::Route,
    },
    idempotency::IdempotencyKey,
    orders::NewOrder,
    service::{Caller, LIMIT_DEFAULT, LIMIT_MAX, Reply, Service},
    telemetry,
};

/// The `_meta` key of a create's or a cancel's result that says when its `requestId`
/// is forgotten (RFC 3339): the same instant as REST's `Idempotency-Key-Expires`.
pub const KEY_EXPIRES_META: &str = "orderd/idempotencyKeyExpires";

/// The pattern of `requestId`: an Idempotency-Key without the quoted form.
const REQUEST_ID_PATTERN: &str = "^[A-Za-z0-9_-]{16,128}$";

/// The tools, each with the route of its REST twin (what it counts against in the
/// tenant's limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    CreateOrder,
    CancelOrder,
    GetOrder,
    ListOrders,
}

impl Tool {
    pub const ALL: [Tool; 4] = [
        Tool::CreateOrder,
        Tool::CancelOrder,
        Tool::GetOrder,
        Tool::ListOrders,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tool::CreateOrder => "create_order",
            Tool::CancelOrder => "cancel_order",
            Tool::GetOrder => "get_order",
            Tool::ListOrders => "list_orders",
        }
    }

    fn named(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The route a call of this tool counts against in the tenant's limits.
    fn route(self) -> Route {
        match self {
            Tool::CreateOrder | Tool::ListOrders => Route::Orders,
            Tool::CancelOrder => Route::CancelOrder,
            Tool::GetOrder => Route::Order,
        }
    }
}

/// The route a call of the tool named `name` counts against: its REST twin's, or
/// `/mcp` for a name no tool has.
pub(super) fn route_of(name: &str) -> Route {
    Tool::named(name).map_or(Route::Mcp, Tool::route)
}

/// The answer to a `tools/call` the tenant's limits refused before the SDK saw it: a
/// JSON-RPC response carrying the refusal as a tool result, as a refusal by the tool
/// itself would look.
pub(super) fn refused_call(id: Value, problem: &Problem) -> poem::Response {
    let message = json!({"jsonrpc": "2.0", "id": id, "result": refusal(problem)});
    poem::Response::builder()
        .content_type("application/json")
        .body(message.to_string())
}

/// The MCP server: one per request (stateless), sharing the process's state. The
/// tenant's limits were applied to the request before it reached the SDK (`super::Mcp`).
#[derive(Clone)]
pub struct OrderTools {
    pub service: Service,
}

impl ServerHandler for OrderTools {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("orderd", env!("CARGO_PKG_VERSION"))
                    .with_title("orderd: orders, exactly once"),
            )
            .with_instructions(
                "Create, cancel, read and list the orders of the tenant your token belongs to. \
                 Every change takes a requestId: make a new one for each new intent, and send \
                 the same one again, unchanged, when you retry that intent (after a timeout, an \
                 error or a doubt). The same requestId never creates a second order.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>().cloned())
            .ok_or_else(|| ErrorData::internal_error("the request carries no caller", None))?;
        let args = request.arguments.unwrap_or_default();
        let name = request.name.to_string();
        // A span per tool call, named by the tool (a name no tool has is never an
        // attribute), in the request's trace even when the SDK runs it on a task of
        // its own.
        let span = tracing::info_span!(
            target: telemetry::SPANS,
            "tool",
            otel.name = %format_args!("tools/call {}", Tool::named(&name).map_or("unknown", Tool::name)),
            mcp.tool.name = Tool::named(&name).map_or("unknown", Tool::name),
        );
        telemetry::continue_trace(&span, caller.trace());
        let outcome = self.call(&caller, &name, args).instrument(span).await;
        let status = match &outcome {
            Ok(reply) => reply.response.status,
            Err(problem) => problem.kind.status().as_u16(),
        };
        tracing::info!(
            transport = "mcp",
            tool = %name,
            tenant = %caller.tenant(),
            sub = %caller.subject(),
            status,
            "tool call"
        );
        Ok(match outcome {
            Ok(reply) => rendered(Tool::named(&name), &reply),
            Err(problem) => refusal(&problem),
        }
        .into())
    }
}

impl OrderTools {
    /// Parses the tool's arguments and calls its operation.
    async fn call(&self, caller: &Caller, name: &str, args: JsonObject) -> Result<Reply, Problem> {
        let tool = Tool::named(name).ok_or_else(|| {
            Problem::app(AppKind::NotFound).with_detail(format!("there is no tool `{name}`"))
        })?;
        let mut fields = args;
        match tool {
            Tool::CreateOrder => {
                let key = request_id(&mut fields)?;
                let new = NewOrder::parse(&fields)?;
                self.service
                    .create(caller, key, new)
                    .await
                    .map_err(Problem::from)
            }
            Tool::CancelOrder => {
                let key = request_id(&mut fields)?;
                let id = order_id(&mut fields)?;
                refuse_unknown(&fields)?;
                self.service
                    .cancel(caller, key, id)
                    .await
                    .map_err(Problem::from)
            }
            Tool::GetOrder => {
                let id = order_id(&mut fields)?;
                refuse_unknown(&fields)?;
                self.service.get(caller, id).await.map_err(Problem::from)
            }
            Tool::ListOrders => {
                let limit = match fields.remove("limit") {
                    None | Some(Value::Null) => LIMIT_DEFAULT,
                    Some(Value::Number(n)) if n.as_i64().is_some() => {
                        n.as_i64().unwrap_or(LIMIT_DEFAULT)
                    }
                    Some(_) => {
                        return Err(Problem::invalid_field(
                            "limit",
                            &format!("must be a whole number from 1 to {LIMIT_MAX}"),
                        ));
                    }
                };
                let after = match fields.remove("after") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(after)) => Some(after),
                    Some(_) => {
                        return Err(Problem::invalid_field(
                            "after",
                            "must be a string (a `next` cursor)",
                        ));
                    }
                };
                refuse_unknown(&fields)?;
                self.service
                    .list(caller, limit, after.as_deref())
                    .await
                    .map_err(Problem::from)
            }
        }
    }
}

/// A reply as a tool result: a 2xx is its JSON as structured content with a line of
/// text saying what happened; a stored refusal (a cancel's 404) is an error result
/// carrying the problem the body holds. A stored answer says in `_meta`, under
/// [`KEY_EXPIRES_META`], when its `requestId` is forgotten.
fn rendered(tool: Option<Tool>, reply: &Reply) -> CallToolResult {
    let mut result = answered(tool, reply);
    if let Some(at) = reply.expires_at {
        let mut meta = JsonObject::new();
        meta.insert(
            KEY_EXPIRES_META.to_string(),
            json!(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        );
        result.meta = Some(rmcp::model::MetaObject(meta));
    }
    result
}

/// The result's content, by the stored status.
fn answered(tool: Option<Tool>, reply: &Reply) -> CallToolResult {
    if !reply.is_success() {
        let mut result = CallToolResult::error(vec![ContentBlock::text(
            String::from_utf8_lossy(&reply.response.body).to_string(),
        )]);
        result.is_error = Some(true);
        return result;
    }
    let body: Value = serde_json::from_slice(&reply.response.body).unwrap_or(Value::Null);
    let id = body["id"].as_str().unwrap_or_default();
    let status = body["status"].as_str().unwrap_or_default();
    let text = match tool {
        Some(Tool::ListOrders) => format!(
            "{} orders, newest first.",
            body["items"].as_array().map_or(0, Vec::len)
        ),
        Some(Tool::GetOrder) | None => "The order.".to_string(),
        Some(Tool::CreateOrder | Tool::CancelOrder) if reply.replayed => format!(
            "Replayed: this requestId was already used for this request, so nothing new \
             happened. Order {id} is {status}."
        ),
        Some(Tool::CreateOrder | Tool::CancelOrder) => format!("Done: order {id} is {status}."),
    };
    let mut result = CallToolResult::structured(body);
    result.content = vec![ContentBlock::text(text)];
    result
}

/// A refusal the model can read: the problem object REST would answer, as JSON text;
/// a 409 also says, in `retry_after`, how many seconds to wait.
fn refusal(problem: &Problem) -> CallToolResult {
    let mut details = serde_json::to_value(problem.details()).unwrap_or_default();
    if let Some(secs) = problem.retry_after() {
        details["retry_after"] = json!(secs);
    }
    CallToolResult::error(vec![ContentBlock::text(details.to_string())])
}

/// Takes `requestId` out of the arguments as the operation's Idempotency-Key.
fn request_id(args: &mut JsonObject) -> Result<IdempotencyKey, Problem> {
    let invalid = || {
        Problem::invalid_field(
            "requestId",
            "must be 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'",
        )
    };
    match args.remove("requestId") {
        None | Some(Value::Null) => Err(Problem::invalid_field("requestId", "is required")),
        Some(Value::String(id)) if !id.starts_with('"') => {
            IdempotencyKey::parse(Some(&id)).map_err(|_| invalid())
        }
        Some(_) => Err(invalid()),
    }
}

fn order_id(fields: &mut Map<String, Value>) -> Result<Uuid, Problem> {
    match fields.remove("order_id") {
        None | Some(Value::Null) => Err(Problem::invalid_field("order_id", "is required")),
        Some(Value::String(id)) => {
            Uuid::try_parse(&id).map_err(|_| Problem::invalid_field("order_id", "must be a UUID"))
        }
        Some(_) => Err(Problem::invalid_field("order_id", "must be a UUID")),
    }
}

fn refuse_unknown(fields: &Map<String, Value>) -> Result<(), Problem> {
    match fields.keys().next() {
        Some(name) => Err(Problem::invalid_field(name, "is not a known field")),
        None => Ok(()),
    }
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// An OpenAPI 3.0 schema as the JSON Schema MCP speaks: `nullable` becomes a `null`
/// among the types, and the spec's own `title` goes.
fn json_schema(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        if object.remove("nullable") == Some(Value::Bool(true))
            && let Some(ty) = object.get("type").cloned()
        {
            object.insert("type".into(), json!([ty, "null"]));
        }
        if let Some(Value::Object(properties)) = object.get_mut("properties") {
            for property in properties.values_mut() {
                *property = json_schema(property.take());
            }
        }
    }
    schema
}

/// The create tool's input: the REST body's schema (from the create rules), closed to
/// other members, plus `requestId`.
pub fn create_input_schema() -> Value {
    let mut schema = json_schema(
        serde_json::to_value(create_order_schema()).expect("a schema always serialises"),
    );
    schema["additionalProperties"] = Value::Bool(false);
    schema["properties"]["requestId"] = request_id_schema();
    if let Some(required) = schema["required"].as_array_mut() {
        required.insert(0, json!("requestId"));
    }
    schema
}

/// The order's JSON Schema, as tools answer it.
fn order_schema() -> Value {
    json!({
        "type": "object",
        "required": ["id", "sku", "quantity", "customer_ref", "status", "created_at", "updated_at"],
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "sku": {"type": "string"},
            "quantity": {"type": "integer"},
            "customer_ref": {"type": ["string", "null"]},
            "status": {"type": "string", "enum": ["CREATED", "CANCELLED"]},
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"}
        }
    })
}

fn request_id_schema() -> Value {
    json!({
        "type": "string",
        "pattern": REQUEST_ID_PATTERN,
        "description": "Identifies this one intent. Make a new one (a UUID is fine) for each new \
            intent; on a retry of the same intent send exactly the same value again, so it \
            takes effect once. A requestId reused with different arguments is refused."
    })
}

/// The four tools with their input and output schemas.
pub fn tools() -> Vec<rmcp::model::Tool> {
    let describe = |tool: Tool, description: &'static str, input: Value, output: Value| {
        rmcp::model::Tool::new(tool.name(), description, object(input))
            .with_raw_output_schema(object(output))
    };
    Tool::ALL
        .into_iter()
        .map(|tool| match tool {
            Tool::CreateOrder => describe(
                tool,
                "Create an order for the tenant: one order per requestId, however often the \
                 call is repeated. Answers the order; on a repeat, the same order again, marked \
                 as a replay.",
                create_input_schema(),
                order_schema(),
            ),
            Tool::CancelOrder => describe(
                tool,
                "Cancel an order of the tenant. Cancelling a cancelled order returns it \
                 unchanged. One cancel per requestId, however often the call is repeated.",
                json!({
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["requestId", "order_id"],
                    "properties": {
                        "requestId": request_id_schema(),
                        "order_id": {"type": "string", "format": "uuid", "description": "The order's id."}
                    }
                }),
                order_schema(),
            ),
            Tool::GetOrder => describe(
                tool,
                "Read one order of the tenant by its id. Changes nothing.",
                json!({
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["order_id"],
                    "properties": {"order_id": {"type": "string", "format": "uuid"}}
                }),
                order_schema(),
            ),
            Tool::ListOrders => describe(
                tool,
                "List the tenant's orders, newest first, one page at a time. Pass `next` of a \
                 page as `after` to get the following page. Changes nothing.",
                json!({
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {
                        "limit": {"type": "integer", "minimum": 1, "maximum": LIMIT_MAX, "default": LIMIT_DEFAULT},
                        "after": {"type": "string", "description": "The `next` cursor of the previous page."}
                    }
                }),
                json!({
                    "type": "object",
                    "required": ["items", "next"],
                    "properties": {
                        "items": {"type": "array", "items": order_schema()},
                        "next": {"type": ["string", "null"]}
                    }
                }),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orders::rules::{CUSTOMER_REF_MAX, QUANTITY_MAX, SKU_MAX};

    #[test]
    fn mutating_tools_require_a_request_id_with_the_key_pattern() {
        let names: Vec<String> = tools().into_iter().map(|t| t.name.to_string()).collect();
        assert_eq!(
            names,
            ["create_order", "cancel_order", "get_order", "list_orders"]
        );
        for tool in tools().iter().take(2) {
            let schema = Value::Object((*tool.input_schema).clone());
            assert_eq!(
                schema["properties"]["requestId"]["pattern"],
                REQUEST_ID_PATTERN
            );
            assert!(
                schema["required"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("requestId"))
            );
            assert_eq!(schema["additionalProperties"], false);
            assert!(tool.output_schema.is_some());
        }
    }

    #[test]
    fn the_create_tool_states_the_create_rules_bounds() {
        let schema = create_input_schema();
        let properties = &schema["properties"];
        assert_eq!(properties["sku"]["maxLength"], SKU_MAX);
        assert_eq!(properties["quantity"]["maximum"], QUANTITY_MAX as f64);
        assert_eq!(properties["customer_ref"]["maxLength"], CUSTOMER_REF_MAX);
        assert_eq!(
            properties["customer_ref"]["type"],
            json!(["string", "null"])
        );
        assert_eq!(schema["required"], json!(["requestId", "sku", "quantity"]));
    }

    #[test]
    fn a_409_refusal_says_when_to_retry() {
        let problem = Problem::app(AppKind::IdempotencyKeyInFlight)
            .with_header(http::header::RETRY_AFTER, http::HeaderValue::from(2));
        let result = refusal(&problem);
        assert_eq!(result.is_error, Some(true));
        let text = result.content[0].as_text().unwrap().text.clone();
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["type"], "/problems/idempotency-key-in-flight");
        assert_eq!(body["retry_after"], 2);
    }
}
