//! `/v1/orders`: create, cancel, get and list, tenant-scoped.
//!
//! Handlers parse and authorise, then call the operations below, which hand writes to
//! the idempotency guard with a closure that calls the orders module: a cancel inside
//! the guard's transaction, a create as the one statement that also completes the key.
//! The operations are shared with the MCP tools, so that a tool call and a REST call
//! are the same operation with the same stored response.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use chrono::{DateTime, Datelike, Utc};
use poem::web::Data;
use poem_openapi::{
    ApiResponse, Enum, Object, OpenApi,
    param::{Header, Path, Query},
    payload::Json,
};
use serde::Serialize;
use uuid::Uuid;

use super::{
    ApiTags, AppState,
    auth::BearerAuth,
    body::CreateOrderBody,
    idempotent::{Idempotent, render},
    params::KeyHeader,
    problem::{FieldError, Kind, Problem, ProblemBody},
    responses::{Documented, WithBody},
};
use crate::{
    auth::{SCOPE_READ, SCOPE_WRITE},
    idempotency::{Answer, Fingerprint, IdempotencyKey, Scope},
    metrics::Endpoint,
    orders::{self, CancelOutcome, NewOrder, OrderStatus, store::PageAfter},
    tenant::TenantId,
};

/// Lifecycle of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
#[oai(rename = "OrderStatus", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StatusView {
    Created,
    Cancelled,
}

/// An order as clients see it.
#[derive(Debug, Clone, PartialEq, Object)]
#[oai(rename = "Order")]
pub struct OrderView {
    pub id: Uuid,
    pub sku: String,
    pub quantity: i32,
    #[oai(nullable)]
    pub customer_ref: Option<String>,
    pub status: StatusView,
    /// RFC 3339, database clock.
    pub created_at: DateTime<Utc>,
    /// RFC 3339, database clock.
    pub updated_at: DateTime<Utc>,
}

impl From<orders::Order> for OrderView {
    fn from(order: orders::Order) -> Self {
        Self {
            id: order.id,
            sku: order.sku,
            quantity: order.quantity,
            customer_ref: order.customer_ref,
            status: match order.status {
                OrderStatus::Created => StatusView::Created,
                OrderStatus::Cancelled => StatusView::Cancelled,
            },
            created_at: order.created_at,
            updated_at: order.updated_at,
        }
    }
}

/// A page of orders, newest first.
#[derive(Debug, Object)]
pub struct OrderPage {
    pub items: Vec<OrderView>,
    /// Pass as `after` to get the next page; `null` on the last page.
    #[oai(nullable)]
    pub next: Option<String>,
}

#[derive(ApiResponse)]
pub enum CreateOrderResponse {
    /// The order was created (or, with `Idempotent-Replayed: true`, had been).
    #[oai(status = 201)]
    Created(
        Json<OrderView>,
        /// `/v1/orders/{id}`
        #[oai(header = "Location")]
        String,
    ),
}

#[derive(ApiResponse)]
pub enum CancelOrderResponse {
    /// The order, now (or already) `CANCELLED`.
    #[oai(status = 200)]
    Cancelled(Json<OrderView>),
    /// No such order for this tenant (stored and replayed like a success).
    #[oai(status = 404, content_type = "application/problem+json")]
    NotFound(ProblemBody),
}

#[derive(ApiResponse)]
pub enum GetOrderResponse {
    #[oai(status = 200)]
    Found(Json<OrderView>),
    /// No such order for this tenant.
    #[oai(status = 404, content_type = "application/problem+json")]
    NotFound(ProblemBody),
}

#[derive(ApiResponse)]
pub enum ListOrdersResponse {
    #[oai(status = 200)]
    Page(Json<OrderPage>),
}

pub struct OrdersApi;

#[OpenApi(tag = "ApiTags::Orders")]
impl OrdersApi {
    /// Create an order
    ///
    /// Needs the `orders:write` scope. Idempotent per `Idempotency-Key`: a retry with
    /// the same key and body replays the first answer (status, body and `Location`,
    /// with `Idempotent-Replayed: true`); the same key with another body is a 422.
    #[oai(path = "/v1/orders", method = "post", operation_id = "createOrder")]
    async fn create_order(
        &self,
        auth: BearerAuth,
        state: Data<&AppState>,
        /// 16-128 of `[A-Za-z0-9_-]`, bare or as an RFC 8941 quoted string; one per
        /// operation, reused verbatim on every retry of it.
        #[oai(name = "Idempotency-Key")]
        idempotency_key: Header<KeyHeader>,
        body: CreateOrderBody,
    ) -> poem::Result<Documented<WithBody<Idempotent<CreateOrderResponse>>>> {
        auth.0.require(SCOPE_WRITE).map_err(Problem::from)?;
        let key = idempotency_key.0.parse()?;
        let answer = create(&state, auth.0.tenant, key, body.0).await?;
        Ok(Documented(WithBody(answer.into())))
    }

    /// Cancel an order
    ///
    /// Needs the `orders:write` scope. Idempotent per `Idempotency-Key`; cancelling a
    /// cancelled order returns it unchanged and publishes nothing. An order of another
    /// tenant, or none, is a 404 (stored and replayed like a success).
    #[oai(
        path = "/v1/orders/:id/cancel",
        method = "post",
        operation_id = "cancelOrder"
    )]
    async fn cancel_order(
        &self,
        auth: BearerAuth,
        state: Data<&AppState>,
        /// The order id.
        id: Path<Uuid>,
        /// 16-128 of `[A-Za-z0-9_-]`, bare or as an RFC 8941 quoted string; one per
        /// operation, reused verbatim on every retry of it.
        #[oai(name = "Idempotency-Key")]
        idempotency_key: Header<KeyHeader>,
    ) -> poem::Result<Documented<Idempotent<CancelOrderResponse>>> {
        auth.0.require(SCOPE_WRITE).map_err(Problem::from)?;
        let key = idempotency_key.0.parse()?;
        let answer = cancel(&state, auth.0.tenant, key, id.0).await?;
        Ok(Documented(answer.into()))
    }

    /// Get an order
    ///
    /// Needs the `orders:read` scope. Only the caller's tenant's orders exist for it.
    #[oai(path = "/v1/orders/:id", method = "get", operation_id = "getOrder")]
    async fn get_order(
        &self,
        auth: BearerAuth,
        state: Data<&AppState>,
        id: Path<Uuid>,
    ) -> poem::Result<Documented<GetOrderResponse>> {
        auth.0.require(SCOPE_READ).map_err(Problem::from)?;
        let tenant = auth.0.tenant;
        let found = state
            .db
            .run(async |c| orders::store::get(c, tenant, id.0).await)
            .await
            .map_err(Problem::from)?;
        Ok(Documented(match found {
            Some(order) => GetOrderResponse::Found(Json(order.into())),
            None => GetOrderResponse::NotFound(not_found(id.0)),
        }))
    }

    /// List orders
    ///
    /// Needs the `orders:read` scope. The caller's tenant's orders, newest first; pass
    /// `next` of a page as `after` for the next one.
    #[oai(path = "/v1/orders", method = "get", operation_id = "listOrders")]
    async fn list_orders(
        &self,
        auth: BearerAuth,
        state: Data<&AppState>,
        /// Page size, 1 to 100.
        #[oai(
            default = "default_limit",
            validator(minimum(value = "1"), maximum(value = "100"))
        )]
        limit: Query<i64>,
        /// The `next` cursor of the previous page.
        after: Query<Option<String>>,
    ) -> poem::Result<Documented<ListOrdersResponse>> {
        auth.0.require(SCOPE_READ).map_err(Problem::from)?;
        let page = list(&state, auth.0.tenant, limit.0, after.0.as_deref()).await?;
        Ok(Documented(ListOrdersResponse::Page(Json(page))))
    }
}

fn default_limit() -> i64 {
    20
}

/// Creates an order once per key: the operation behind `POST /v1/orders`.
pub async fn create(
    state: &AppState,
    tenant: TenantId,
    key: IdempotencyKey,
    new: NewOrder,
) -> Result<Answer, Problem> {
    let scope = Scope {
        tenant,
        endpoint: Endpoint::CreateOrder,
        key,
    };
    let answer = state
        .guard
        .run_in_one_statement(&scope, create_fingerprint(&new), move |conn, fence| {
            Box::pin(async move {
                let order = orders::Order::created(&new, fence.at);
                let location = format!("/v1/orders/{}", order.id);
                let response = render(CreateOrderResponse::Created(
                    Json(order.clone().into()),
                    location,
                ))
                .await?;
                let written = orders::store::create(conn, &fence, &response, &order).await?;
                Ok(written.then_some(response))
            })
        })
        .await?;
    Ok(answer)
}

/// Cancels an order once per key: the operation behind `POST /v1/orders/{id}/cancel`.
pub async fn cancel(
    state: &AppState,
    tenant: TenantId,
    key: IdempotencyKey,
    id: Uuid,
) -> Result<Answer, Problem> {
    let scope = Scope {
        tenant,
        endpoint: Endpoint::CancelOrder,
        key,
    };
    let answer = state
        .guard
        .run(&scope, cancel_fingerprint(id), move |tx, _| {
            Box::pin(async move {
                let response = match orders::store::cancel(tx, tenant, id).await? {
                    CancelOutcome::Cancelled(order) | CancelOutcome::AlreadyCancelled(order) => {
                        CancelOrderResponse::Cancelled(Json(order.into()))
                    }
                    CancelOutcome::NotFound => CancelOrderResponse::NotFound(not_found(id)),
                };
                render(response).await
            })
        })
        .await?;
    Ok(answer)
}

/// One page of the tenant's orders after the position `after` names.
pub async fn list(
    state: &AppState,
    tenant: TenantId,
    limit: i64,
    after: Option<&str>,
) -> Result<OrderPage, Problem> {
    // An empty `after` is no position at all: the first page.
    let after = after
        .filter(|a| !a.is_empty())
        .map(decode_cursor)
        .transpose()?;
    // One extra row tells whether a next page exists without a count query.
    let mut items = state
        .db
        .run(async |c| orders::store::list(c, tenant, limit + 1, after).await)
        .await
        .map_err(Problem::from)?;
    let next = if items.len() as i64 > limit {
        items.truncate(limit as usize);
        items.last().map(|o| encode_cursor(o.created_at, o.id))
    } else {
        None
    };
    Ok(OrderPage {
        items: items.into_iter().map(OrderView::from).collect(),
        next,
    })
}

/// The fingerprint of a create: the parsed body with defaults applied.
pub fn create_fingerprint(new: &NewOrder) -> Fingerprint {
    Fingerprint::of(&RequestShape {
        path: None,
        body: Some(new),
    })
}

/// The fingerprint of a cancel: the order id from the path.
pub fn cancel_fingerprint(id: Uuid) -> Fingerprint {
    Fingerprint::of(&RequestShape::<()> {
        path: Some(PathParams { id }),
        body: None,
    })
}

/// What the fingerprint covers: path parameters and the parsed body with defaults.
#[derive(Serialize)]
struct RequestShape<'a, B: Serialize> {
    path: Option<PathParams>,
    body: Option<&'a B>,
}

#[derive(Serialize)]
struct PathParams {
    id: Uuid,
}

fn not_found(id: Uuid) -> ProblemBody {
    let mut details = Problem::new(Kind::NotFound)
        .with_detail(format!("order {id} does not exist"))
        .details();
    details.instance = Some(format!("/v1/orders/{id}"));
    ProblemBody(details)
}

/// Opaque cursor: the `(created_at, id)` of the last order of a page.
pub fn encode_cursor(created_at: DateTime<Utc>, id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", created_at.timestamp_micros(), id.simple()))
}

pub fn decode_cursor(cursor: &str) -> Result<PageAfter, Problem> {
    let bad = || {
        Problem::new(Kind::ValidationError)
            .with_detail("`after` is not a cursor returned by this API")
            .with_errors(vec![FieldError {
                field: "after".into(),
                message: "not a valid cursor".into(),
            }])
    };
    let text = URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let (micros, id) = text.split_once('.').ok_or_else(bad)?;
    // A position the database can compare with: years 1 to 9999 (a forged cursor
    // outside PostgreSQL's range would otherwise fail there).
    let created_at = micros
        .parse::<i64>()
        .ok()
        .and_then(DateTime::from_timestamp_micros)
        .filter(|at| (1..=9999).contains(&at.year()))
        .ok_or_else(bad)?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    Ok(PageAfter { created_at, id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_a_validation_error() {
        let at = DateTime::from_timestamp_micros(1_790_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(
            decode_cursor(&encode_cursor(at, id)).unwrap(),
            PageAfter { created_at: at, id }
        );
        let far = format!("{}.{}", i64::MAX / 2, Uuid::nil().simple());
        let before_year_one = format!("{}.{}", -62_200_000_000_000_000i64, Uuid::nil().simple());
        for bad in [
            "",
            "!!!",
            "bm9wZQ",
            &URL_SAFE_NO_PAD.encode("12.not-a-uuid"),
            &URL_SAFE_NO_PAD.encode(far),
            &URL_SAFE_NO_PAD.encode(before_year_one),
        ] {
            assert_eq!(
                decode_cursor(bad).unwrap_err().kind,
                Kind::ValidationError,
                "{bad}"
            );
        }
    }
}
