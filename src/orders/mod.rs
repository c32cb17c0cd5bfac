//! Orders: the domain types and their SQL.
//!
//! This module owns the `orders` table and decides which outbox event a change emits;
//! it knows nothing about HTTP or idempotency. Writes take the caller's transaction so
//! that the order, its event and the stored response commit together.

pub mod store;

use chrono::{DateTime, Utc};
use poem_openapi::{Enum, Object};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Lifecycle of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Enum, sqlx::Type)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[oai(rename_all = "SCREAMING_SNAKE_CASE")]
#[sqlx(type_name = "text", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    Created,
    Cancelled,
}

/// An order as clients and event consumers see it (the contract's `Order`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Object, sqlx::FromRow)]
pub struct Order {
    pub id: Uuid,
    pub sku: String,
    pub quantity: i32,
    pub customer_ref: Option<String>,
    pub status: OrderStatus,
    /// RFC 3339, database clock.
    pub created_at: DateTime<Utc>,
    /// RFC 3339, database clock.
    pub updated_at: DateTime<Utc>,
    /// Per-order change counter: orders one order's events; not part of the API.
    #[serde(skip)]
    #[oai(skip)]
    pub version: i32,
}

/// A validated create request (validation happens at the API edge).
#[derive(Debug, Clone, Serialize)]
pub struct NewOrder {
    pub sku: String,
    pub quantity: i32,
    pub customer_ref: Option<String>,
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
