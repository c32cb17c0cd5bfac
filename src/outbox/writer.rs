//! Appends an event to `outbox_event` through the caller's transaction.
//!
//! Must only ever be called with the transaction that made the change: that is the
//! whole guarantee (the change and its event commit together, or neither does).

use poem_openapi::types::ToJSON;
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::EventType;
use crate::{auth::TenantId, orders::Order};

/// Writes one event for `order` as it is after the change; returns its `event_id`.
///
/// The payload is the SNS message body (contract section 6). The order, and
/// `occurred_at` (its `updated_at`), are rendered by the same code as the API's
/// responses, so a consumer sees one format everywhere.
pub async fn append(
    tx: &mut PgConnection,
    tenant: TenantId,
    event_type: EventType,
    order: &Order,
) -> sqlx::Result<Uuid> {
    let event_id = Uuid::now_v7();
    let order_json = order.to_json().unwrap_or_default();
    let payload = json!({
        "event_id": event_id,
        "event_type": event_type.as_str(),
        "occurred_at": order_json["updated_at"],
        "tenant_id": tenant.0,
        "order": order_json,
    });
    sqlx::query(
        "INSERT INTO outbox_event
           (tenant_id, event_id, aggregate_id, aggregate_seq, event_type, payload, occurred_at, next_attempt_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())",
    )
    .bind(tenant.0)
    .bind(event_id)
    .bind(order.id)
    .bind(order.version)
    .bind(event_type.as_str())
    .bind(payload)
    .bind(order.updated_at)
    .execute(&mut *tx)
    .await?;
    Ok(event_id)
}
