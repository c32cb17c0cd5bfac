//! The transactional outbox: events are appended inside the business transaction
//! ([`writer`]) and published to SNS afterwards by the [`relay`].
//!
//! The relay knows nothing about HTTP or orders: it moves rows of `outbox_event` to a
//! [`publisher::Publisher`] and records what happened.

pub mod backoff;
pub mod publisher;
pub mod relay;
pub mod sns;
pub mod store;
pub mod writer;

use serde::Serialize;

/// The event types of contract section 6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventType {
    OrderCreated,
    OrderCancelled,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::OrderCreated => "OrderCreated",
            EventType::OrderCancelled => "OrderCancelled",
        }
    }
}
