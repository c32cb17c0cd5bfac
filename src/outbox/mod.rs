//! The transactional outbox: events are appended inside the business transaction
//! ([`writer`]) and published to SNS afterwards by the relay.

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
