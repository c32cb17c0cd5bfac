//! Orders: the domain types and their SQL.
//!
//! This module owns the `orders` table and decides which outbox event a change emits;
//! it knows nothing about HTTP. Writes commit the order, its event and the stored
//! response together: a cancel in the caller's transaction, a create in one statement
//! that embeds the idempotency record's fenced completion. How an order looks on the
//! wire is decided by its readers: the API (`api::orders`) and the event format
//! (`outbox::event`).

pub mod rules;
pub mod store;

pub use self::rules::{Invalid, NewOrder};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::outbox::event::OrderState;

/// Lifecycle of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    Created,
    Cancelled,
}

impl OrderStatus {
    /// The spelling clients, consumers and the `orders.status` column share.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Created => "CREATED",
            OrderStatus::Cancelled => "CANCELLED",
        }
    }
}

/// An order as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct Order {
    pub id: Uuid,
    pub sku: String,
    pub quantity: i32,
    pub customer_ref: Option<String>,
    pub status: OrderStatus,
    /// Database clock.
    pub created_at: DateTime<Utc>,
    /// Database clock.
    pub updated_at: DateTime<Utc>,
    /// Per-order change counter: orders one order's events; not shown to clients.
    pub version: i32,
}

impl Order {
    /// A new order, created at `at` (the database's clock when the request came to own
    /// its key). Built before anything is written, so that the response is known
    /// before the statement that stores the order and the response together.
    pub fn created(new: &NewOrder, at: DateTime<Utc>) -> Self {
        Self {
            id: Uuid::now_v7(),
            sku: new.sku().to_string(),
            quantity: new.quantity(),
            customer_ref: new.customer_ref().map(str::to_string),
            status: OrderStatus::Created,
            created_at: at,
            updated_at: at,
            version: 1,
        }
    }

    /// The order as an event carries it.
    pub fn to_event_state(&self) -> OrderState {
        OrderState {
            id: self.id,
            sku: self.sku.clone(),
            quantity: self.quantity,
            customer_ref: self.customer_ref.clone(),
            status: self.status.as_str(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// What a cancel did.
#[derive(Debug)]
pub enum CancelOutcome {
    /// The order moved to CANCELLED by this call.
    Cancelled(Order),
    /// It was cancelled already: returned unchanged, no event.
    AlreadyCancelled(Order),
    /// No such order for this tenant.
    NotFound,
}
