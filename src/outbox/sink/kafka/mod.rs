//! The Kafka [`Publisher`]: rdkafka's `FutureProducer` over the bundled librdkafka.
//!
//! A record's key is the order id, so an order's events share a partition and keep
//! their order there; its value is the event JSON exactly as stored; its headers carry
//! the event's identity and trace context. The producer is idempotent with `acks=all`:
//! an event counts as published only once every in-sync replica has it, and the
//! producer's own retries can neither duplicate nor reorder it. A record's delivery is
//! bounded by `ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS` (librdkafka's `message.timeout.ms`),
//! which the relay's claim lease is derived from.
//!
//! Failures are sorted as the relay needs them: a broker that is down, unreachable,
//! refusing the topic or the credentials fails the call as a whole (no attempt
//! charged); only a record the producer or the broker refuses for itself (too large,
//! invalid) is the event's fault. An idempotent producer that meets a fatal error, or
//! stalls against a broker that forgot its producer id, is built anew; the events it
//! failed are simply put back in line, and since an order has at most one event in
//! flight, nothing is reordered by that.

use std::{
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use futures::future::BoxFuture;
use rdkafka::{
    ClientConfig,
    config::RDKafkaLogLevel,
    error::{KafkaError, RDKafkaErrorCode, RDKafkaErrorCode as Code},
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord, Producer},
};
use tokio_util::sync::CancellationToken;

pub mod settings;

use self::settings::{KAFKA_CONFIG, KAFKA_MAX_IN_FLIGHT, KAFKA_TOPIC};
pub use self::settings::{KafkaConfig, KafkaSettings};
use crate::{
    outbox::publisher::{
        FailureReason, Message, Outcome, Outcomes, PublishError, Publisher, Retry,
    },
    supervisor::{Every, First, Run, Schedule},
};

/// How often the watch asks the broker for the topic's metadata.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(5);
/// A relay whose broker has not answered (a metadata round trip or a delivery) for
/// this long is not ready.
pub const ANSWER_MAX_AGE: Duration = Duration::from_secs(30);
/// The longest one metadata round trip may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// Rounds in a row without one delivery, while the broker answers metadata and knows
/// the topic, after which the producer is taken to be stuck and built anew.
pub const STALLED_ROUNDS: u32 = 3;

pub struct KafkaPublisher {
    topic: String,
    /// Kept to build the producer anew after a fatal error.
    client_config: ClientConfig,
    /// The producer and its generation: a lane that saw a fatal error replaces the one
    /// it used, not one another lane already replaced.
    producer: RwLock<(u64, FutureProducer)>,
    /// `message.timeout.ms`: the longest a record's delivery report may take.
    timeout: Duration,
    health: Health,
    /// Rounds in a row that delivered nothing and failed as a whole.
    failed_rounds: AtomicU32,
    /// When the first of them ended, as [`Health::now`]; 0: none.
    stalled_since: AtomicU64,
}

/// When the broker last answered, whether the last metadata request got an answer,
/// and whether the topic was known then.
struct Health {
    started: Instant,
    /// Milliseconds after `started` of the last answer, plus one; 0: never.
    answered_at: AtomicU64,
    last_lookup_failed: AtomicBool,
    topic_missing: AtomicBool,
}

impl Health {
    /// Milliseconds since `started`, plus one, so that 0 can mean never.
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    fn answered(&self) {
        self.answered_at.store(self.now(), Ordering::Relaxed);
    }

    fn not_ready(&self) -> Option<&'static str> {
        if self.last_lookup_failed.load(Ordering::Relaxed) {
            return Some("the Kafka broker did not answer the last metadata request");
        }
        if self.topic_missing.load(Ordering::Relaxed) {
            return Some("the Kafka topic does not exist");
        }
        match self.answered_at.load(Ordering::Relaxed) {
            0 => Some("the Kafka broker has not answered yet"),
            at => {
                let since = self.now() - at;
                (since > ANSWER_MAX_AGE.as_millis() as u64)
                    .then_some("the Kafka broker has not answered for 30 s")
            }
        }
    }
}

impl KafkaPublisher {
    /// Builds the producer and asks the broker for the topic once. A broker that
    /// answers without the topic is a start-up error (orderd does not create topics:
    /// their partition count and replication are the operator's); a broker that does
    /// not answer is not: events wait, uncharged, and the relay is not ready until it
    /// does.
    pub async fn connect(kafka: &KafkaConfig, timeout: Duration) -> anyhow::Result<Arc<Self>> {
        let publisher = Arc::new(Self::new(kafka, timeout)?);
        match publisher.clone().look_up_topic().await {
            Ok(true) => {}
            Ok(false) => anyhow::bail!(
                "{}: the topic `{}` does not exist on the brokers; create it with the partitions \
                 it needs (orderd does not create topics)",
                KAFKA_TOPIC.name,
                kafka.topic
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "the Kafka brokers do not answer; events wait until they do"
            ),
        }
        Ok(publisher)
    }

    /// The publisher without asking the broker anything.
    pub fn new(kafka: &KafkaConfig, timeout: Duration) -> anyhow::Result<Self> {
        let client_config = client_config(kafka, timeout);
        let producer = build(&client_config)?;
        Ok(Self {
            topic: kafka.topic.clone(),
            client_config,
            producer: RwLock::new((0, producer)),
            timeout,
            health: Health {
                started: Instant::now(),
                answered_at: AtomicU64::new(0),
                last_lookup_failed: AtomicBool::new(false),
                topic_missing: AtomicBool::new(false),
            },
            failed_rounds: AtomicU32::new(0),
            stalled_since: AtomicU64::new(0),
        })
    }

    fn current(&self) -> (u64, FutureProducer) {
        let guard = self.producer.read().unwrap_or_else(|e| e.into_inner());
        (guard.0, guard.1.clone())
    }

    /// One metadata round trip for the topic (blocking in librdkafka, so on a blocking
    /// thread): whether the broker knows it. Records the answer for readiness.
    async fn look_up_topic(self: Arc<Self>) -> anyhow::Result<bool> {
        let (_, producer) = self.current();
        let topic = self.topic.clone();
        let metadata = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&topic), METADATA_TIMEOUT)
        })
        .await
        .context("the metadata lookup panicked")?;
        self.health
            .last_lookup_failed
            .store(metadata.is_err(), Ordering::Relaxed);
        let metadata = metadata.context("no metadata from the Kafka brokers")?;
        self.health.answered();
        let found = metadata.topics().iter().any(|t| {
            t.name() == self.topic
                && t.error().is_none_or(|e| {
                    !matches!(
                        RDKafkaErrorCode::from(e),
                        Code::UnknownTopicOrPartition | Code::UnknownTopic
                    )
                })
                && !t.partitions().is_empty()
        });
        self.health.topic_missing.store(!found, Ordering::Relaxed);
        Ok(found)
    }

    /// Why the producer of this generation is beyond use, if it is: librdkafka's fatal
    /// error, or a stall. A broker that restarted without its state (tansu's memory
    /// storage; a cluster rebuilt under the same address) answers every produce with
    /// an unknown producer id, which librdkafka meets by bumping its epoch locally
    /// forever instead of asking for a new id; nothing is delivered and nothing is
    /// reported fatal. So [`STALLED_ROUNDS`] rounds without a delivery, while the
    /// broker answers metadata and knows the topic, also mean a new producer.
    fn beyond_use(&self, producer: &FutureProducer) -> Option<String> {
        if let Some((code, reason)) = producer.client().fatal_error() {
            return Some(format!("fatal error {code:?}: {reason}"));
        }
        // An answer since the stall began: during an outage the lookups fail too, and
        // a new producer would not help.
        let stalled_since = self.stalled_since.load(Ordering::Relaxed);
        let broker_answers = !self.health.last_lookup_failed.load(Ordering::Relaxed)
            && !self.health.topic_missing.load(Ordering::Relaxed)
            && self.health.answered_at.load(Ordering::Relaxed) > stalled_since;
        let stalled =
            stalled_since > 0 && self.failed_rounds.load(Ordering::Relaxed) >= STALLED_ROUNDS;
        (broker_answers && stalled).then(|| {
            format!("{STALLED_ROUNDS} rounds delivered nothing while the broker answers metadata")
        })
    }

    /// Replaces the producer of `generation` when it is beyond use: nothing it still
    /// holds is lost, since the relay puts every event it did not see acknowledged back
    /// in line, and an order has at most one event in flight, so none is reordered.
    fn renew_if_beyond_use(&self, generation: u64, producer: &FutureProducer) {
        let Some(why) = self.beyond_use(producer) else {
            return;
        };
        let mut guard = self.producer.write().unwrap_or_else(|e| e.into_inner());
        if guard.0 != generation {
            return; // another lane renewed it already
        }
        match build(&self.client_config) {
            Ok(fresh) => {
                tracing::warn!(reason = %why, "the Kafka producer is beyond use; built a new one");
                self.failed_rounds.store(0, Ordering::Relaxed);
                self.stalled_since.store(0, Ordering::Relaxed);
                let old = std::mem::replace(&mut *guard, (generation + 1, fresh));
                // Dropping a producer purges and joins its thread: not on a runtime thread.
                tokio::task::spawn_blocking(move || drop(old));
            }
            Err(e) => {
                tracing::error!(error = %e, reason = %why, "the Kafka producer is beyond use and cannot be built anew")
            }
        }
    }

    /// Sends one message and waits for its own delivery report.
    async fn send(&self, producer: &FutureProducer, message: &Message) -> Outcome {
        let key = message.aggregate_id.to_string();
        let record = FutureRecord::to(&self.topic)
            .key(&key)
            .payload(&message.body)
            .headers(headers(message));
        let delivery = match producer.send_result(record) {
            Ok(delivery) => delivery,
            Err((error, _)) => return outcome(&error),
        };
        // librdkafka reports every record within `message.timeout.ms`; this bound
        // only guards against a report that never comes.
        match tokio::time::timeout(self.timeout + self.timeout / 4, delivery).await {
            Ok(Ok(Ok(_))) => Outcome::Published,
            Ok(Ok(Err((error, _)))) => outcome(&error),
            Ok(Err(_)) => Outcome::NotSent(PublishError {
                retry: Retry::Transient,
                reason: FailureReason::ProducerFatal,
                detail: "the producer was dropped before it reported the delivery".into(),
            }),
            Err(_) => Outcome::NotSent(PublishError {
                retry: Retry::Transient,
                reason: FailureReason::Timeout,
                detail: format!("no delivery report within {:?}", self.timeout),
            }),
        }
    }
}

impl Publisher for KafkaPublisher {
    fn publish<'a>(
        &'a self,
        messages: &'a [Message],
    ) -> std::pin::Pin<Box<dyn Future<Output = Outcomes> + Send + 'a>> {
        Box::pin(async move {
            let (generation, producer) = self.current();
            // Every record of the batch is in the producer's queue at once; each order
            // has at most one of them, so their order against each other is free.
            let outcomes: Outcomes = futures::future::join_all(
                messages.iter().map(|message| self.send(&producer, message)),
            )
            .await;
            if outcomes.iter().any(|o| matches!(o, Outcome::Published)) {
                self.health.answered();
                self.failed_rounds.store(0, Ordering::Relaxed);
                self.stalled_since.store(0, Ordering::Relaxed);
            } else if outcomes.iter().any(|o| matches!(o, Outcome::NotSent(_)))
                && self.failed_rounds.fetch_add(1, Ordering::Relaxed) == 0
            {
                self.stalled_since
                    .store(self.health.now(), Ordering::Relaxed);
            }
            self.renew_if_beyond_use(generation, &producer);
            outcomes
        })
    }

    fn destination(&self) -> &str {
        &self.topic
    }

    fn system(&self) -> &'static str {
        "kafka"
    }

    fn not_ready(&self) -> Option<&'static str> {
        self.health.not_ready()
    }

    /// Asks the broker for the topic every [`WATCH_INTERVAL`], so that readiness says
    /// whether it answers, and renews a producer that went beyond use while idle.
    fn watch(self: Arc<Self>, shutdown: CancellationToken) -> Option<BoxFuture<'static, ()>> {
        let every = Every {
            interval: WATCH_INTERVAL,
            first: First::Now,
            after_failure: None,
        };
        Some(Box::pin(async move {
            let mut was_missing = false;
            let mut schedule = Schedule::new("kafka watch", every, shutdown);
            while schedule.next().await {
                let turn = async {
                    let run = match self.clone().look_up_topic().await {
                        Ok(found) => {
                            if !found && !was_missing {
                                tracing::error!(topic = %self.topic, "the Kafka topic does not exist; events wait until it does");
                            }
                            was_missing = !found;
                            Run::Done
                        }
                        Err(e) => Run::Failed(format!("the Kafka brokers do not answer: {e:#}")),
                    };
                    let (generation, producer) = self.current();
                    self.renew_if_beyond_use(generation, &producer);
                    run
                };
                let Some(run) = schedule.unless_shutdown(turn).await else {
                    return;
                };
                schedule.ran(run);
            }
        }))
    }
}

/// The producer's properties: the operator's (`ORDERD_KAFKA_CONFIG`, which accepts only
/// properties that cannot weaken delivery), then the ones the delivery guarantees and
/// an order's placement rest on.
fn client_config(kafka: &KafkaConfig, timeout: Duration) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (name, value) in &kafka.properties {
        config.set(name, value.expose());
    }
    let set_by_operator = |name: &str| kafka.properties.iter().any(|(n, _)| n == name);
    if !set_by_operator("client.id") {
        config.set("client.id", "orderd");
    }
    // The relay hands over a whole claimed batch at once, so librdkafka's own wait for
    // more records (5 ms by default) would only add latency: measured, p99 at
    // 100 writes/s fell from 38 to 3 ms without it, and the drain rate stayed.
    if !set_by_operator("linger.ms") && !set_by_operator("queue.buffering.max.ms") {
        config.set("linger.ms", "0");
    }
    config
        // Java's partitioner, so that a key lands where a Java producer would put it.
        .set("partitioner", "murmur2_random")
        .set(
            "max.in.flight.requests.per.connection",
            KAFKA_MAX_IN_FLIGHT.to_string(),
        )
        .set("bootstrap.servers", &kafka.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", timeout.as_millis().to_string())
        .set_log_level(RDKafkaLogLevel::Warning);
    config
}

/// A producer from `config`. Its errors name the property, never its value (which may
/// be a password).
fn build(config: &ClientConfig) -> anyhow::Result<FutureProducer> {
    config.create().map_err(|e| match e {
        KafkaError::ClientConfig(result, _, name, _) => anyhow::anyhow!(
            "{}: librdkafka refuses the property `{name}` ({result:?}; its value is not shown)",
            KAFKA_CONFIG.name
        ),
        other => anyhow::anyhow!("cannot create the Kafka producer: {other}"),
    })
}

/// The CloudEvents specification version the records follow.
pub const CLOUDEVENTS_SPEC_VERSION: &str = "1.0";

/// The record headers: the event's identity, its schema version and, when the write
/// carried one, its W3C trace context, under orderd's own names; then the same event as
/// a CloudEvent in the Kafka protocol binding's binary content mode (decision 143):
/// `ce_specversion`, `ce_id` (the event id), `ce_source` (`/orderd/tenants/{tenant}`),
/// `ce_type` (the stored event type, known to this release or not), `ce_time` (when
/// the change happened, RFC 3339), `ce_subject` (the order id) and `content-type`. The
/// record's value is the event JSON and its key the order id, as before, so consumers
/// of either naming read the same record.
fn headers(message: &Message) -> OwnedHeaders {
    let event_id = message.event_id.to_string();
    let tenant_id = message.tenant_id.to_string();
    let source = format!("/orderd/tenants/{tenant_id}");
    let time = message
        .occurred_at
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let subject = message.aggregate_id.to_string();
    let fields = [
        ("event_id", Some(event_id.as_str())),
        ("event_type", Some(message.event_type.as_str())),
        ("tenant_id", Some(tenant_id.as_str())),
        ("schema_version", message.schema_version.as_deref()),
        ("traceparent", message.trace_parent.as_deref()),
        ("tracestate", message.trace_state.as_deref()),
        ("ce_specversion", Some(CLOUDEVENTS_SPEC_VERSION)),
        ("ce_id", Some(event_id.as_str())),
        ("ce_source", Some(source.as_str())),
        ("ce_type", Some(message.event_type.as_str())),
        ("ce_time", Some(time.as_str())),
        ("ce_subject", Some(subject.as_str())),
        ("content-type", Some("application/json")),
    ];
    fields
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .fold(
            OwnedHeaders::new_with_capacity(13),
            |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: Some(value),
                })
            },
        )
}

/// What a failed send or delivery means for the event.
fn outcome(error: &KafkaError) -> Outcome {
    let detail = error.to_string();
    match error.rdkafka_error_code() {
        Some(code) => match classify(code) {
            Blame::Record(retry, reason) => Outcome::Rejected(PublishError {
                retry,
                reason,
                detail,
            }),
            Blame::Call(reason) => Outcome::NotSent(PublishError {
                retry: Retry::Transient,
                reason,
                detail,
            }),
        },
        None => Outcome::NotSent(PublishError {
            retry: Retry::Transient,
            reason: FailureReason::OtherClient,
            detail,
        }),
    }
}

/// Whose fault a Kafka error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The record itself: it costs the event an attempt.
    Record(Retry, FailureReason),
    /// The broker, the network, the topic, the credentials or the producer: no attempt
    /// is charged, the relay backs off as a whole.
    Call(FailureReason),
}

/// Sorts a librdkafka error code. Only what is wrong with the one record is the
/// event's fault; a code this release does not know is treated as the call's, so that
/// a broker's new complaint can never turn a backlog DEAD.
pub fn classify(code: RDKafkaErrorCode) -> Blame {
    use FailureReason as R;
    match code {
        Code::MessageSizeTooLarge | Code::InvalidMessageSize | Code::MessageBatchTooLarge => {
            Blame::Record(Retry::Permanent, R::TooLarge)
        }
        Code::InvalidRecord
        | Code::InvalidMessage
        | Code::BadMessage
        | Code::InvalidTimestamp
        | Code::UnsupportedForMessageFormat
        | Code::PolicyViolation => Blame::Record(Retry::Permanent, R::InvalidParameter),
        Code::MessageTimedOut
        | Code::RequestTimedOut
        | Code::OperationTimedOut
        | Code::TimedOutQueue => Blame::Call(R::Timeout),
        Code::QueueFull | Code::ThrottlingQuotaExceeded => Blame::Call(R::Throttling),
        Code::UnknownTopicOrPartition
        | Code::UnknownTopic
        | Code::UnknownPartition
        | Code::InvalidTopic => Blame::Call(R::NotFound),
        Code::TopicAuthorizationFailed
        | Code::ClusterAuthorizationFailed
        | Code::SaslAuthenticationFailed
        | Code::Authentication
        | Code::UnsupportedSASLMechanism
        | Code::IllegalSASLState => Blame::Call(R::Authorization),
        Code::Fatal
        | Code::OutOfOrderSequenceNumber
        | Code::UnknownProducerId
        | Code::InvalidProducerEpoch
        | Code::InvalidProducerIdMapping
        | Code::ProducerFenced
        | Code::DuplicateSequenceNumber => Blame::Call(R::ProducerFatal),
        Code::BrokerTransportFailure
        | Code::AllBrokersDown
        | Code::Resolve
        | Code::NetworkException
        | Code::LeaderNotAvailable
        | Code::NotLeaderForPartition
        | Code::BrokerNotAvailable
        | Code::ReplicaNotAvailable
        | Code::NotEnoughReplicas
        | Code::NotEnoughReplicasAfterAppend
        | Code::KafkaStorageError
        | Code::SSL
        | Code::PurgeQueue
        | Code::PurgeInflight => Blame::Call(R::Network),
        _ => Blame::Call(R::OtherServer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    #[test]
    fn only_what_is_wrong_with_the_record_costs_an_attempt() {
        assert_eq!(
            classify(Code::MessageSizeTooLarge),
            Blame::Record(Retry::Permanent, FailureReason::TooLarge)
        );
        assert_eq!(
            classify(Code::InvalidRecord),
            Blame::Record(Retry::Permanent, FailureReason::InvalidParameter)
        );
        for (code, reason) in [
            (Code::MessageTimedOut, FailureReason::Timeout),
            (Code::AllBrokersDown, FailureReason::Network),
            (Code::UnknownTopicOrPartition, FailureReason::NotFound),
            (Code::TopicAuthorizationFailed, FailureReason::Authorization),
            (Code::UnknownProducerId, FailureReason::ProducerFatal),
            (Code::QueueFull, FailureReason::Throttling),
            // Anything this release does not know: never the record's fault.
            (Code::FeatureUpdateFailed, FailureReason::OtherServer),
        ] {
            assert_eq!(classify(code), Blame::Call(reason), "{code:?}");
        }
    }

    #[test]
    fn the_guarantees_are_set_after_the_operators_properties() {
        let kafka = KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            topic: "orders".into(),
            properties: vec![("linger.ms".into(), Secret::new("20"))],
        };
        let config = client_config(&kafka, Duration::from_millis(7000));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("message.timeout.ms"), Some("7000"));
        assert_eq!(
            config.get("max.in.flight.requests.per.connection"),
            Some("5")
        );
        assert_eq!(config.get("partitioner"), Some("murmur2_random"));
        assert_eq!(
            config.get("linger.ms"),
            Some("20"),
            "the operator's value stands"
        );
        assert_eq!(config.get("bootstrap.servers"), Some("127.0.0.1:9092"));
    }

    #[test]
    fn a_refused_property_is_named_without_its_value() {
        let kafka = KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            topic: "orders".into(),
            properties: vec![(
                "sasl.password.nonexistent".into(),
                Secret::new("hunter2-secret"),
            )],
        };
        let err = build(&client_config(&kafka, Duration::from_secs(1)))
            .err()
            .expect("an unknown property is refused")
            .to_string();
        assert!(err.contains("sasl.password.nonexistent"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn headers_carry_identity_version_and_trace_only_when_present() {
        let message = Message {
            event_id: uuid::Uuid::from_u128(1),
            event_type: "OrderCreated".into(),
            tenant_id: uuid::Uuid::from_u128(2),
            aggregate_id: uuid::Uuid::from_u128(3),
            body: "{}".into(),
            trace_parent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            trace_state: None,
            schema_version: Some("1".into()),
            occurred_at: "2026-12-03T18:00:00.123456Z".parse().unwrap(),
        };
        use rdkafka::message::Headers;
        let headers = headers(&message);
        let names: Vec<&str> = headers.iter().map(|h| h.key).collect();
        assert_eq!(
            names,
            [
                "event_id",
                "event_type",
                "tenant_id",
                "schema_version",
                "traceparent",
                "ce_specversion",
                "ce_id",
                "ce_source",
                "ce_type",
                "ce_time",
                "ce_subject",
                "content-type"
            ]
        );
        let value = |name: &str| {
            headers
                .iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8(v.to_vec()).unwrap())
        };
        assert_eq!(
            value("ce_source").as_deref(),
            Some("/orderd/tenants/00000000-0000-0000-0000-000000000002")
        );
        assert_eq!(
            value("ce_time").as_deref(),
            Some("2026-12-03T18:00:00.123456Z")
        );
        assert_eq!(
            value("ce_subject").as_deref(),
            Some("00000000-0000-0000-0000-000000000003")
        );
        assert_eq!(
            headers.get(0).value,
            Some("00000000-0000-0000-0000-000000000001".as_bytes())
        );
    }
}
