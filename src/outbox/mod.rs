//! The transactional outbox: events are appended inside the business transaction
//! ([`writer`]) and published afterwards by the [`relay`] to a bus: SNS
//! ([`sink::sns`]) or Kafka ([`sink::kafka`]).
//!
//! This module owns the event's wire format ([`event`]). The relay knows nothing about
//! HTTP or orders: it moves rows of `outbox_event` to a [`publisher::Publisher`] and
//! records what happened.

pub mod backoff;
pub mod due;
pub mod event;
pub mod gauges;
pub mod known;
pub mod publisher;
pub mod relay;
pub mod settings;
pub mod sink;
pub mod statistics;
pub mod store;
pub mod wake;
pub mod writer;

pub use self::{event::EventType, publisher::FailureReason, settings::OutboxConfig};
