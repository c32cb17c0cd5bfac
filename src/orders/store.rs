//! SQL of the `orders` table. Writes append their outbox event in the same transaction,
//! so the change and its event commit or vanish together: a cancel inside the caller's
//! transaction, a create as one statement that also completes its idempotency record.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::{CancelOutcome, Order};
use crate::{
    idempotency::store::{Fence, StoredResponse, bind_completion, fenced_completion},
    metrics::EventType,
    outbox::{self, event::NewEvent},
    tenant::TenantId,
};

/// The columns of [`Order`], as a macro so that every query stays a `&'static str`
/// (sqlx refuses runtime-built SQL).
macro_rules! columns {
    () => {
        "id, sku, quantity, customer_ref, status, created_at, updated_at, version"
    };
}

/// A create in one statement (one round trip, no `BEGIN`/`COMMIT`): the fenced
/// completion of the idempotency record with the response, then the order only if the
/// completion matched, then its `OrderCreated` event only if the order was inserted.
/// One implicit transaction, so all three commit or none does. The event's columns are
/// those of [`outbox::writer::APPEND`]; its body is built from the order, which is
/// known in full before the statement runs, as is the response.
pub const CREATE: &str = concat!(
    "WITH completed AS (",
    fenced_completion!(),
    " RETURNING 1
     ),
     created AS (
         INSERT INTO orders (tenant_id, id, sku, quantity, customer_ref, status, created_at, updated_at)
         SELECT $10, $11, $12, $13, $14, 'CREATED', $15, $15 FROM completed
         RETURNING tenant_id, id, version, updated_at
     )
     INSERT INTO outbox_event
            (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
     SELECT tenant_id, $16, id, version, $17, $18, updated_at, clock_timestamp() FROM created"
);

/// Inserts `order` (built by [`Order::created`]) and its `OrderCreated` event, and
/// completes the record `fence` names with `response`, all or nothing. False when the
/// fence no longer held (another request took the key over): nothing was written.
pub async fn create(
    conn: &mut PgConnection,
    fence: &Fence<'_>,
    response: &StoredResponse,
    order: &Order,
) -> sqlx::Result<bool> {
    let tenant = fence.scope.tenant;
    let event = event(tenant, EventType::OrderCreated, order);
    let event_id = Uuid::now_v7();
    let query = sqlx::query(CREATE).persistent(crate::db::named_statements());
    let done = bind_completion(query, fence, response)
        .bind(tenant.0)
        .bind(order.id)
        .bind(&order.sku)
        .bind(order.quantity)
        .bind(&order.customer_ref)
        .bind(order.created_at)
        .bind(event_id)
        .bind(event.event_type.as_str())
        .bind(event.body(event_id))
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Cancels the order; a second cancel returns it unchanged and emits nothing.
pub async fn cancel(
    tx: &mut PgConnection,
    tenant: TenantId,
    id: Uuid,
) -> sqlx::Result<CancelOutcome> {
    // The row lock taken here serialises concurrent changes of one order, which is
    // what makes `version` (and so event order) follow commit order.
    let cancelled: Option<Order> = sqlx::query_as(concat!(
        "UPDATE orders SET status = 'CANCELLED', version = version + 1, updated_at = clock_timestamp()
         WHERE tenant_id = $1 AND id = $2 AND status = 'CREATED'
         RETURNING ", columns!(), ""
    ))
        .persistent(crate::db::named_statements())
    .bind(tenant.0)
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(order) = cancelled {
        outbox::writer::append(tx, &event(tenant, EventType::OrderCancelled, &order)).await?;
        return Ok(CancelOutcome::Cancelled(order));
    }
    Ok(match get(&mut *tx, tenant, id).await? {
        Some(order) => CancelOutcome::AlreadyCancelled(order),
        None => CancelOutcome::NotFound,
    })
}

/// The event a change emits: the order as it is after the change, ordered among the
/// order's events by its version.
fn event(tenant: TenantId, event_type: EventType, order: &Order) -> NewEvent {
    NewEvent {
        tenant,
        event_type,
        aggregate_id: order.id,
        aggregate_seq: order.version,
        occurred_at: order.updated_at,
        order: order.to_event_state(),
    }
}

/// One order of this tenant.
pub async fn get(
    db: impl PgExecutor<'_>,
    tenant: TenantId,
    id: Uuid,
) -> sqlx::Result<Option<Order>> {
    sqlx::query_as(concat!(
        "SELECT ",
        columns!(),
        " FROM orders WHERE tenant_id = $1 AND id = $2"
    ))
    .persistent(crate::db::named_statements())
    .bind(tenant.0)
    .bind(id)
    .fetch_optional(db)
    .await
}

/// Position after which a page starts: the last order of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageAfter {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

/// The first page of a tenant's orders, newest first.
pub const LIST_FIRST: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM orders WHERE tenant_id = $1
     ORDER BY created_at DESC, id DESC LIMIT $2"
);

/// A later page: the orders after the position `($2, $3)`.
pub const LIST_AFTER: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM orders WHERE tenant_id = $1 AND (created_at, id) < ($2, $3)
     ORDER BY created_at DESC, id DESC LIMIT $4"
);

/// Newest first, keyset-paginated on `(created_at, id)`; returns up to `limit` orders.
pub async fn list(
    db: impl PgExecutor<'_>,
    tenant: TenantId,
    limit: i64,
    after: Option<PageAfter>,
) -> sqlx::Result<Vec<Order>> {
    match after {
        None => {
            sqlx::query_as(LIST_FIRST)
                .persistent(crate::db::named_statements())
                .bind(tenant.0)
                .bind(limit)
                .fetch_all(db)
                .await
        }
        Some(after) => {
            sqlx::query_as(LIST_AFTER)
                .persistent(crate::db::named_statements())
                .bind(tenant.0)
                .bind(after.created_at)
                .bind(after.id)
                .bind(limit)
                .fetch_all(db)
                .await
        }
    }
}
