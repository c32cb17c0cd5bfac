//! How orders look to clients, for both transports: the REST response bodies and the
//! MCP tools' structured content are the same bytes, rendered here once.
//!
//! Each type derives its OpenAPI schema (poem-openapi's `Object`, the spec's `Order`,
//! `OrderPage` and `OrderStatus`) and its serialisation (serde) side by side. Rendering
//! goes through a `serde_json::Value`, whose members are sorted, and times are RFC 3339
//! with an explicit offset, so the bytes are those the service has always stored and
//! replayed.

use chrono::{DateTime, Utc};
use poem_openapi::{Enum, Object};
use serde::{Serialize, Serializer};
use uuid::Uuid;

use crate::orders::{Order, OrderStatus};

/// Lifecycle of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum, Serialize)]
#[oai(rename = "OrderStatus", rename_all = "SCREAMING_SNAKE_CASE")]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StatusView {
    Created,
    Cancelled,
}

/// An order as clients see it.
#[derive(Debug, Clone, PartialEq, Object, Serialize)]
#[oai(rename = "Order")]
pub struct OrderView {
    pub id: Uuid,
    pub sku: String,
    pub quantity: i32,
    #[oai(nullable)]
    pub customer_ref: Option<String>,
    pub status: StatusView,
    /// RFC 3339, database clock.
    #[serde(serialize_with = "rfc3339")]
    pub created_at: DateTime<Utc>,
    /// RFC 3339, database clock.
    #[serde(serialize_with = "rfc3339")]
    pub updated_at: DateTime<Utc>,
}

impl From<Order> for OrderView {
    fn from(order: Order) -> Self {
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
#[derive(Debug, Object, Serialize)]
pub struct OrderPage {
    pub items: Vec<OrderView>,
    /// Pass as `after` to get the next page; `null` on the last page.
    #[oai(nullable)]
    pub next: Option<String>,
}

/// The bytes of a body: members sorted, as every stored response has them.
pub fn render(value: &impl Serialize) -> Vec<u8> {
    let value = serde_json::to_value(value).expect("views always serialise");
    serde_json::to_vec(&value).expect("a JSON value always serialises")
}

fn rfc3339<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339())
}

#[cfg(test)]
mod tests {
    use poem_openapi::types::ToJSON;

    use super::*;

    #[test]
    fn the_rendered_bytes_are_those_of_the_openapi_rendering() {
        let at = DateTime::from_timestamp_micros(1_790_000_000_123_456).unwrap();
        for customer_ref in [None, Some("ref \"1\" é".to_string())] {
            let view = OrderView {
                id: Uuid::now_v7(),
                sku: "A-1".into(),
                quantity: 3,
                customer_ref,
                status: StatusView::Cancelled,
                created_at: at,
                updated_at: at,
            };
            let framework = serde_json::to_vec(&view.to_json().unwrap()).unwrap();
            assert_eq!(render(&view), framework);
        }
    }
}
