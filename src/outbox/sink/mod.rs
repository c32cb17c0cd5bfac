//! The buses the relay publishes to, side by side behind the one
//! [`Publisher`](super::publisher::Publisher) trait: each sink has its own settings,
//! judges its own failures and keeps its own connection healthy; the relay owns
//! retries and stall detection for both.

pub mod kafka;
pub mod sns;
