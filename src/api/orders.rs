//! `/v1/orders`: create, cancel, get and list over REST.
//!
//! Each handler only parses its HTTP framing (the bearer token, the `Idempotency-Key`
//! header, the path, the query, the body), calls the operation of the application layer
//! ([`crate::service`]) and renders its reply. The typed responses below describe those
//! replies in the OpenAPI spec; the bytes come from the service, which renders them for
//! REST and MCP alike.

use poem::web::Data;
use poem_openapi::{
    ApiResponse, OpenApi,
    param::{Header, Path, Query},
    payload::Json,
};
use uuid::Uuid;

use super::{
    ApiTags,
    auth::BearerAuth,
    body::CreateOrderBody,
    params::KeyHeader,
    problem::ProblemBody,
    reply::{Idempotent, Rendered},
    responses::{Documented, WithBody},
};
use crate::service::{
    LIMIT_DEFAULT, Service,
    view::{OrderPage, OrderView},
};

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
        service: Data<&Service>,
        /// 16-128 of `[A-Za-z0-9_-]`, bare or as an RFC 8941 quoted string; one per
        /// operation, reused verbatim on every retry of it.
        #[oai(name = "Idempotency-Key")]
        idempotency_key: Header<KeyHeader>,
        body: CreateOrderBody,
    ) -> poem::Result<Documented<WithBody<Idempotent<CreateOrderResponse>>>> {
        let key = idempotency_key.0.parse()?;
        let reply = service.create(&auth.0.caller, key, body.0).await?;
        Ok(Documented(WithBody(reply.into())))
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
        service: Data<&Service>,
        /// The order id.
        id: Path<Uuid>,
        /// 16-128 of `[A-Za-z0-9_-]`, bare or as an RFC 8941 quoted string; one per
        /// operation, reused verbatim on every retry of it.
        #[oai(name = "Idempotency-Key")]
        idempotency_key: Header<KeyHeader>,
    ) -> poem::Result<Documented<Idempotent<CancelOrderResponse>>> {
        let key = idempotency_key.0.parse()?;
        let reply = service.cancel(&auth.0.caller, key, id.0).await?;
        Ok(Documented(reply.into()))
    }

    /// Get an order
    ///
    /// Needs the `orders:read` scope. Only the caller's tenant's orders exist for it.
    #[oai(path = "/v1/orders/:id", method = "get", operation_id = "getOrder")]
    async fn get_order(
        &self,
        auth: BearerAuth,
        service: Data<&Service>,
        id: Path<Uuid>,
    ) -> poem::Result<Documented<Rendered<GetOrderResponse>>> {
        let reply = service.get(&auth.0.caller, id.0).await?;
        Ok(Documented(reply.into()))
    }

    /// List orders
    ///
    /// Needs the `orders:read` scope. The caller's tenant's orders, newest first; pass
    /// `next` of a page as `after` for the next one.
    #[oai(path = "/v1/orders", method = "get", operation_id = "listOrders")]
    async fn list_orders(
        &self,
        auth: BearerAuth,
        service: Data<&Service>,
        /// Page size, 1 to 100.
        #[oai(
            default = "default_limit",
            validator(minimum(value = "1"), maximum(value = "100"))
        )]
        limit: Query<i64>,
        /// The `next` cursor of the previous page.
        after: Query<Option<String>>,
    ) -> poem::Result<Documented<Rendered<ListOrdersResponse>>> {
        let reply = service
            .list(&auth.0.caller, limit.0, after.0.as_deref())
            .await?;
        Ok(Documented(reply.into()))
    }
}

fn default_limit() -> i64 {
    LIMIT_DEFAULT
}
