//! Appends an event to `outbox_event` through the caller's transaction.
//!
//! Must only ever be called with the transaction that made the change: that is the
//! whole guarantee (the change and its event commit together, or neither does).

use sqlx::PgConnection;
use uuid::Uuid;

use super::event::NewEvent;

/// One event, in the caller's transaction. `orders::store::CREATE` folds the same
/// columns into a create's one statement; keep the two alike.
pub const APPEND: &str = "INSERT INTO outbox_event
       (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())";

/// Writes one event; returns its `event_id`.
pub async fn append(tx: &mut PgConnection, event: &NewEvent) -> sqlx::Result<Uuid> {
    let event_id = Uuid::now_v7();
    sqlx::query(APPEND)
        .persistent(crate::db::named_statements())
        .bind(event.tenant.0)
        .bind(event_id)
        .bind(event.aggregate_id)
        .bind(event.aggregate_seq)
        .bind(event.event_type.as_str())
        .bind(event.body(event_id))
        .bind(event.occurred_at)
        .execute(&mut *tx)
        .await?;
    Ok(event_id)
}
