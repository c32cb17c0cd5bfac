//! What the relay needs from a message bus, and how failures are classified.
//!
//! The relay talks to this trait, not to a bus directly: the claim, mark and backoff
//! loop is one, and each sink ([`super::sns::SnsPublisher`],
//! [`super::kafka::KafkaPublisher`]) only sends and says what became of each message,
//! which includes telling a refused message from a failed call. A test or a benchmark
//! can observe what is published through the same trait.

use std::{future::Future, pin::Pin, sync::Arc};

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::metrics::label_enum;

label_enum! {
    /// Why a publish failed, as a low-cardinality class of the SNS (or KMS) or Kafka
    /// error (`outbox_publish_failures_total{reason}`).
    pub FailureReason {
        Throttling => "throttling",
        KmsThrottling => "kms_throttling",
        Server => "server",
        Timeout => "timeout",
        Network => "network",
        InvalidParameter => "invalid_parameter",
        NotFound => "not_found",
        Authorization => "authorization",
        Kms => "kms",
        OtherClient => "other_client",
        OtherServer => "other_server",
        /// A record larger than the producer or the broker takes.
        TooLarge => "too_large",
        /// The idempotent Kafka producer hit a fatal error and is built anew.
        ProducerFatal => "producer_fatal",
        /// Not a publish at all: the stored row cannot be read (`outbox::store::read`).
        Unreadable => "unreadable",
    }
}

/// One event to publish.
#[derive(Debug, Clone)]
pub struct Message {
    pub event_id: Uuid,
    /// As stored, known to this release or not.
    pub event_type: String,
    pub tenant_id: Uuid,
    /// The order id: the FIFO message group.
    pub aggregate_id: Uuid,
    /// The message body.
    pub body: String,
    /// W3C trace context of the write, sent as the attributes `traceparent` and
    /// `tracestate`.
    pub trace_parent: Option<String>,
    pub trace_state: Option<String>,
    /// The body's `schema_version`, as stored (a Kafka header).
    pub schema_version: Option<String>,
    /// When the change happened (the CloudEvents `time` of a Kafka record).
    pub occurred_at: DateTime<Utc>,
}

/// Whether retrying the same entry can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Throttling, server errors, timeouts, network: try again later.
    Transient,
    /// The entry itself is wrong (too large, invalid): retrying it cannot succeed.
    Permanent,
}

/// Why a publish failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    pub retry: Retry,
    /// A low-cardinality error class, the metric label.
    pub reason: FailureReason,
    /// Full detail for the row's `last_error` and the log.
    pub detail: String,
}

/// What happened to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The bus acknowledged it.
    Published,
    /// The bus refused this entry: it costs the event an attempt, and a permanent refusal
    /// (too large, invalid) makes it DEAD at once.
    Rejected(PublishError),
    /// The call carrying it failed as a whole (network, timeout, throttling, unknown
    /// topic, authorization, credentials, KMS): nothing is wrong with the event, so it
    /// costs no attempt; the relay backs off as a whole and the event flows once the
    /// cause is fixed. A misconfiguration never turns the backlog DEAD.
    NotSent(PublishError),
}

/// The outcome for each message, in the order given.
pub type Outcomes = Vec<Outcome>;

pub trait Publisher: Send + Sync {
    /// Publishes `messages`; the answer has exactly one outcome per message. Must not
    /// return before every message was acknowledged or failed (or timed out).
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>>;

    /// Where messages go, for the publish spans' `messaging.destination.name`.
    fn destination(&self) -> &str {
        "unknown"
    }

    /// The bus, as the publish spans' `messaging.system` names it.
    fn system(&self) -> &'static str {
        "unknown"
    }

    /// Why this sink cannot take events now (its broker has not answered lately), for
    /// a relay's readiness; `None`: ready, or nothing known against it.
    fn not_ready(&self) -> Option<&'static str> {
        None
    }

    /// A job that keeps [`Self::not_ready`] current, run by the relay beside its rounds
    /// until `shutdown`; `None` when the sink needs none.
    fn watch(self: Arc<Self>, shutdown: CancellationToken) -> Option<BoxFuture<'static, ()>> {
        let _ = shutdown;
        None
    }
}
