//! The tools an AI agent calls for a tenant: `create_order`, `cancel_order`,
//! `get_order`, `list_orders`.
//!
//! Each tool calls the very operation of its REST twin (`api::orders`), with its
//! `requestId` as the `Idempotency-Key` of that endpoint, so a tool call and a REST call
//! with the same key and request are one operation: one order, one event, the second
//! one replays. Refusals are tool results with `isError: true` whose text is the same
//! problem object REST answers, so the model can read it and act on it.

use std::sync::Arc;

use poem_openapi::types::ToJSON;
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
        Tool,
    },
    service::RequestContext,
};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::Caller;
use crate::{
    api::{
        AppState,
        body::parse_fields,
        limits::TenantLimiter,
        orders::{self, OrderView},
        problem::{FieldError, Kind, Problem},
    },
    auth::{SCOPE_READ, SCOPE_WRITE},
    idempotency::{Answer, IdempotencyKey},
    metrics::Route,
};

/// The pattern of `requestId`: an Idempotency-Key without the quoted form.
const REQUEST_ID_PATTERN: &str = "^[A-Za-z0-9_-]{16,128}$";

/// The MCP server: one per request (stateless), sharing the process's state.
#[derive(Clone)]
pub struct OrderTools {
    pub state: AppState,
    pub limiter: Arc<TenantLimiter>,
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
        let tool = request.name.to_string();
        let outcome = self.call(&caller, &tool, args).await;
        let status = match &outcome {
            Ok(answer) => answer.status,
            Err(problem) => problem.kind.status().as_u16(),
        };
        tracing::info!(
            transport = "mcp",
            tool = %tool,
            tenant = %caller.principal.tenant,
            sub = %caller.principal.subject,
            status,
            "tool call"
        );
        Ok(match outcome {
            Ok(answer) => answer.result,
            Err(problem) => refusal(&problem),
        }
        .into())
    }
}

/// A tool's answer: the result and the status its REST twin would have answered.
struct ToolAnswer {
    result: CallToolResult,
    status: u16,
}

impl OrderTools {
    async fn call(
        &self,
        caller: &Caller,
        tool: &str,
        args: JsonObject,
    ) -> Result<ToolAnswer, Problem> {
        let (scope, route) = match tool {
            "create_order" => (SCOPE_WRITE, Route::Orders),
            "cancel_order" => (SCOPE_WRITE, Route::CancelOrder),
            "get_order" => (SCOPE_READ, Route::Order),
            "list_orders" => (SCOPE_READ, Route::Orders),
            other => {
                return Err(
                    Problem::new(Kind::NotFound).with_detail(format!("there is no tool `{other}`"))
                );
            }
        };
        // Only tool calls count against the tenant's limits (not initialize or the
        // listing of tools), and they count like the REST call they stand for.
        let _admission = self.limiter.admit(caller.principal.tenant, route).await?;
        caller.principal.require(scope)?;
        let tenant = caller.principal.tenant;
        match tool {
            "create_order" => {
                let (key, fields) = request_id(args)?;
                let new = parse_fields(&fields)?;
                stored(orders::create(&self.state, tenant, key, new).await?)
            }
            "cancel_order" => {
                let (key, mut fields) = request_id(args)?;
                let id = order_id(&mut fields)?;
                refuse_unknown(&fields)?;
                stored(orders::cancel(&self.state, tenant, key, id).await?)
            }
            "get_order" => {
                let mut fields = args;
                let id = order_id(&mut fields)?;
                refuse_unknown(&fields)?;
                let found = self
                    .state
                    .db
                    .run(async |c| crate::orders::store::get(c, tenant, id).await)
                    .await?;
                match found {
                    Some(order) => Ok(success(order_json(&order.into()), "The order.".into())),
                    None => Err(Problem::new(Kind::NotFound)
                        .with_detail(format!("order {id} does not exist"))),
                }
            }
            _ => {
                let mut fields = args;
                let limit = match fields.remove("limit") {
                    None | Some(Value::Null) => 20,
                    Some(Value::Number(n))
                        if n.as_i64().is_some_and(|l| (1..=100).contains(&l)) =>
                    {
                        n.as_i64().unwrap_or(20)
                    }
                    Some(_) => {
                        return Err(invalid("limit", "must be a whole number from 1 to 100"));
                    }
                };
                let after = match fields.remove("after") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(after)) => Some(after),
                    Some(_) => return Err(invalid("after", "must be a string (a `next` cursor)")),
                };
                refuse_unknown(&fields)?;
                let page = orders::list(&self.state, tenant, limit, after.as_deref()).await?;
                let count = page.items.len();
                let value = json!({
                    "items": page.items.iter().map(order_json).collect::<Vec<_>>(),
                    "next": page.next,
                });
                Ok(success(value, format!("{count} orders, newest first.")))
            }
        }
    }
}

/// The stored REST answer as a tool result: a 2xx is the order as structured content,
/// anything else (a stored 404) the problem it carries.
fn stored(answer: Answer) -> Result<ToolAnswer, Problem> {
    let response = &answer.response;
    let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    if !(200..300).contains(&response.status) {
        let mut result = CallToolResult::error(vec![ContentBlock::text(
            String::from_utf8_lossy(&response.body).to_string(),
        )]);
        result.is_error = Some(true);
        return Ok(ToolAnswer {
            result,
            status: response.status,
        });
    }
    let id = body["id"].as_str().unwrap_or_default().to_string();
    let status = body["status"].as_str().unwrap_or_default().to_string();
    let text = if answer.replayed {
        format!(
            "Replayed: this requestId was already used for this request, so nothing new \
             happened. Order {id} is {status}."
        )
    } else {
        format!("Done: order {id} is {status}.")
    };
    let mut result = success(body, text);
    result.status = response.status;
    Ok(result)
}

/// The order as the REST API renders it.
fn order_json(view: &OrderView) -> Value {
    view.to_json().unwrap_or_default()
}

fn success(structured: Value, text: String) -> ToolAnswer {
    let mut result = CallToolResult::structured(structured);
    result.content = vec![ContentBlock::text(text)];
    ToolAnswer {
        result,
        status: 200,
    }
}

/// A refusal the model can read: the problem object REST would answer, as JSON text;
/// a 409 also says, in `retry_after`, how many seconds to wait.
fn refusal(problem: &Problem) -> CallToolResult {
    let mut details = serde_json::to_value(problem.details()).unwrap_or_default();
    if let Some((_, value)) = problem
        .headers
        .iter()
        .find(|(name, _)| name == http::header::RETRY_AFTER)
        && let Some(secs) = value.to_str().ok().and_then(|v| v.parse::<u64>().ok())
    {
        details["retry_after"] = json!(secs);
    }
    CallToolResult::error(vec![ContentBlock::text(details.to_string())])
}

/// Takes `requestId` out of the arguments as the operation's Idempotency-Key.
fn request_id(mut args: JsonObject) -> Result<(IdempotencyKey, Map<String, Value>), Problem> {
    let key = match args.remove("requestId") {
        None | Some(Value::Null) => return Err(invalid("requestId", "is required")),
        Some(Value::String(id)) if !id.starts_with('"') => IdempotencyKey::parse(Some(&id))
            .map_err(|_| {
                invalid(
                    "requestId",
                    "must be 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'",
                )
            })?,
        Some(_) => {
            return Err(invalid(
                "requestId",
                "must be 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'",
            ));
        }
    };
    Ok((key, args))
}

fn order_id(fields: &mut Map<String, Value>) -> Result<Uuid, Problem> {
    match fields.remove("order_id") {
        None | Some(Value::Null) => Err(invalid("order_id", "is required")),
        Some(Value::String(id)) => {
            Uuid::try_parse(&id).map_err(|_| invalid("order_id", "must be a UUID"))
        }
        Some(_) => Err(invalid("order_id", "must be a UUID")),
    }
}

fn refuse_unknown(fields: &Map<String, Value>) -> Result<(), Problem> {
    match fields.keys().next() {
        Some(name) => Err(invalid(name, "is not a known field")),
        None => Ok(()),
    }
}

fn invalid(field: &str, message: &str) -> Problem {
    Problem::new(Kind::ValidationError)
        .with_detail(format!("`{field}` {message}"))
        .with_errors(vec![FieldError {
            field: field.into(),
            message: message.into(),
        }])
}

fn object(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
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
pub fn tools() -> Vec<Tool> {
    let create = Tool::new(
        "create_order",
        "Create an order for the tenant: one order per requestId, however often the call is \
         repeated. Answers the order; on a repeat, the same order again, marked as a replay.",
        object(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["requestId", "sku", "quantity"],
            "properties": {
                "requestId": request_id_schema(),
                "sku": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$",
                        "description": "Stock keeping unit: 1 to 64 of A-Z a-z 0-9 . _ -"},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 10000},
                "customer_ref": {"type": ["string", "null"], "maxLength": 128,
                                 "description": "The tenant's own reference for the order, optional."}
            }
        })),
    )
    .with_raw_output_schema(object(order_schema()));
    let cancel = Tool::new(
        "cancel_order",
        "Cancel an order of the tenant. Cancelling a cancelled order returns it unchanged. \
         One cancel per requestId, however often the call is repeated.",
        object(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["requestId", "order_id"],
            "properties": {
                "requestId": request_id_schema(),
                "order_id": {"type": "string", "format": "uuid", "description": "The order's id."}
            }
        })),
    )
    .with_raw_output_schema(object(order_schema()));
    let get = Tool::new(
        "get_order",
        "Read one order of the tenant by its id. Changes nothing.",
        object(json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string", "format": "uuid"}}
        })),
    )
    .with_raw_output_schema(object(order_schema()));
    let list = Tool::new(
        "list_orders",
        "List the tenant's orders, newest first, one page at a time. Pass `next` of a page \
         as `after` to get the following page. Changes nothing.",
        object(json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                "after": {"type": "string", "description": "The `next` cursor of the previous page."}
            }
        })),
    )
    .with_raw_output_schema(object(json!({
        "type": "object",
        "required": ["items", "next"],
        "properties": {
            "items": {"type": "array", "items": order_schema()},
            "next": {"type": ["string", "null"]}
        }
    })));
    vec![create, cancel, get, list]
}

#[cfg(test)]
fn names() -> Vec<String> {
    tools().into_iter().map(|t| t.name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutating_tools_require_a_request_id_with_the_key_pattern() {
        assert_eq!(
            names(),
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
    fn a_409_refusal_says_when_to_retry() {
        let problem = Problem::new(Kind::IdempotencyKeyInFlight)
            .with_header(http::header::RETRY_AFTER, http::HeaderValue::from(2));
        let result = refusal(&problem);
        assert_eq!(result.is_error, Some(true));
        let text = result.content[0].as_text().unwrap().text.clone();
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["type"], "/problems/idempotency-key-in-flight");
        assert_eq!(body["retry_after"], 2);
    }
}
