//! The Kafka sink's settings, and which producer properties an operator may add: the
//! delivery guarantees and the claim lease depend on the ones orderd sets itself.

use crate::config::{ConfigError, Env, Kind, Secret, Setting, parse, settings};

settings! {
    /// Kafka as the relay's bus, as set; [`KafkaSettings::config`] tells whether it is.
    pub struct KafkaSettings {
        /// Bootstrap servers, as librdkafka takes them.
        brokers: Option<String> = parse::text [KAFKA_BROKERS, "ORDERD_KAFKA_BROKERS", None, Kind::Text, "bootstrap servers (`host:port,host:port`) of the Kafka cluster the relay publishes to instead of SNS; needs `ORDERD_KAFKA_TOPIC`"],
        topic: Option<String> = parse::text [KAFKA_TOPIC, "ORDERD_KAFKA_TOPIC", None, Kind::Text, "the Kafka topic the relay publishes to (it must exist; orderd does not create it); needs `ORDERD_KAFKA_BROKERS`"],
        /// The operator's further producer properties: names as given, values secret
        /// (they may hold passwords), none of them one that orderd sets itself.
        properties: Vec<(String, Secret)> = parse_properties [KAFKA_CONFIG, "ORDERD_KAFKA_CONFIG", None, Kind::Secret, "further producer properties as `name=value` pairs separated by commas (`security.protocol=SASL_SSL,sasl.mechanism=PLAIN,...`); values are never logged; only security (`ssl.*`, `sasl.*`), client identity, compression, batching, connection and diagnostic properties are accepted (docs/operations.md lists them), anything else stops the process at start"],
    }
    check = KafkaSettings::check;
}

impl KafkaSettings {
    /// Both of the first two or neither; properties only with them.
    fn check(&self) -> Result<(), ConfigError> {
        match (&self.brokers, &self.topic) {
            (Some(_), Some(_)) => Ok(()),
            (None, None) if self.properties.is_empty() => Ok(()),
            (None, None) => Err(ConfigError::new(format!(
                "{} is set without {} and {}",
                KAFKA_CONFIG.name, KAFKA_BROKERS.name, KAFKA_TOPIC.name
            ))),
            (Some(_), None) => Err(ConfigError::new(format!(
                "{} is required with {}",
                KAFKA_TOPIC.name, KAFKA_BROKERS.name
            ))),
            (None, Some(_)) => Err(ConfigError::new(format!(
                "{} is required with {}",
                KAFKA_BROKERS.name, KAFKA_TOPIC.name
            ))),
        }
    }

    /// The sink, when Kafka is set.
    pub fn config(&self) -> Option<KafkaConfig> {
        match (&self.brokers, &self.topic) {
            (Some(brokers), Some(topic)) => Some(KafkaConfig {
                brokers: brokers.clone(),
                topic: topic.clone(),
                properties: self.properties.clone(),
            }),
            _ => None,
        }
    }
}

/// The Kafka sink: where, and the operator's further producer properties.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// Bootstrap servers, as librdkafka takes them.
    pub brokers: String,
    pub topic: String,
    /// `ORDERD_KAFKA_CONFIG`, parsed: names as given, values secret (they may hold
    /// passwords), none of them one that orderd sets itself.
    pub properties: Vec<(String, Secret)>,
}

/// Producer properties the relay sets itself, because the delivery guarantees or the
/// claim lease depend on them, with why: named when `ORDERD_KAFKA_CONFIG` tries one,
/// so that the operator learns what to set instead.
pub const KAFKA_OWNED_PROPERTIES: &[(&str, &str)] = &[
    (
        "acks",
        "every record is acknowledged by all in-sync replicas (acks=all)",
    ),
    (
        "request.required.acks",
        "every record is acknowledged by all in-sync replicas (acks=all)",
    ),
    ("enable.idempotence", "the producer is idempotent"),
    (
        "transactional.id",
        "the relay does not use Kafka transactions",
    ),
    ("bootstrap.servers", "set ORDERD_KAFKA_BROKERS"),
    ("metadata.broker.list", "set ORDERD_KAFKA_BROKERS"),
    (
        "message.timeout.ms",
        "it follows ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS, which the claim lease is derived from",
    ),
    (
        "delivery.timeout.ms",
        "it follows ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS, which the claim lease is derived from",
    ),
    (
        "partitioner",
        "an order's events share a partition (murmur2 of the order id)",
    ),
    (
        "max.in.flight",
        "the idempotent producer keeps an order's records in order at 5 in flight",
    ),
    (
        "max.in.flight.requests.per.connection",
        "the idempotent producer keeps an order's records in order at 5 in flight",
    ),
    (
        "message.max.bytes",
        "a record over a lower limit fails in the client and counts against its event, so a \
         misconfiguration would turn the backlog DEAD; orderd keeps librdkafka's 1,000,000 \
         bytes, far above any event it writes",
    ),
];

/// Switches whose value may turn TLS verification off: `(name, refused values, why)`.
/// Other values of them are accepted (an operator may well set them to what they
/// already are).
pub const KAFKA_WEAKENING_VALUES: &[(&str, &[&str], &str)] = &[
    (
        "enable.ssl.certificate.verification",
        &["false", "0", "off", "no"],
        "it turns off the verification of the broker's certificate",
    ),
    (
        "ssl.endpoint.identification.algorithm",
        &["none", ""],
        "it turns off the check that the broker's certificate names the broker",
    ),
];

/// What `ORDERD_KAFKA_CONFIG` accepts: properties that cannot weaken delivery or move an
/// order's records, under every name librdkafka knows them by. An allow-list rather
/// than a list of what is refused, because librdkafka answers to aliases (a `topic.`
/// prefix reaches every topic property, `linger.ms` is also `queue.buffering.max.ms`)
/// and a list of refusals always misses one. Anything else is refused at start.
pub const KAFKA_ALLOWED_PROPERTIES: &[&str] = &[
    // Transport security (TLS and SASL have families of their own, below).
    "security.protocol",
    "enable.ssl.certificate.verification",
    "ssl_key",
    "ssl_certificate",
    "ssl_ca",
    // Who the client is, where it runs.
    "client.id",
    "client.rack",
    "client.dns.lookup",
    "broker.address.family",
    "broker.address.ttl",
    // Compression.
    "compression.codec",
    "compression.type",
    "compression.level",
    // Batching and buffering.
    "linger.ms",
    "queue.buffering.max.ms",
    "batch.num.messages",
    "batch.size",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    // Connections (no timeouts: the claim lease is derived from the publish timeout).
    "socket.keepalive.enable",
    "socket.nagle.disable",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "connections.max.idle.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "metadata.max.age.ms",
    // Diagnostics.
    "debug",
    "log_level",
    "log.connection.close",
];

/// Families of security properties accepted by prefix: TLS (`ssl.*`) and SASL
/// (`sasl.*`, Kerberos and OAUTHBEARER included). None of them touches delivery.
pub const KAFKA_ALLOWED_PREFIXES: &[&str] = &["ssl.", "sasl."];

/// Why `name` may not be set through `ORDERD_KAFKA_CONFIG`, or `None` when it may.
pub fn kafka_property_refusal(name: &str) -> Option<String> {
    if let Some((_, why)) = KAFKA_OWNED_PROPERTIES
        .iter()
        .find(|(owned, _)| *owned == name)
    {
        return Some(why.to_string());
    }
    if let Some(property) = name.strip_prefix("topic.") {
        return Some(format!(
            "a `topic.` property reaches the topic's own settings (`{property}`), which orderd sets"
        ));
    }
    let allowed = KAFKA_ALLOWED_PROPERTIES.contains(&name)
        || KAFKA_ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p));
    (!allowed).then(|| {
        "only security (ssl.*, sasl.*, security.protocol), client identity, compression, \
         batching, connection and diagnostic properties may be set (docs/operations.md lists them)"
            .to_string()
    })
}

/// Why `name=value` may not be set, for a switch whose value turns TLS verification
/// off ([`KAFKA_WEAKENING_VALUES`]); `None` otherwise.
pub fn kafka_value_refusal(name: &str, value: &str) -> Option<&'static str> {
    let value = value.trim().to_ascii_lowercase();
    KAFKA_WEAKENING_VALUES
        .iter()
        .find(|(switch, refused, _)| *switch == name && refused.contains(&value.as_str()))
        .map(|(_, _, why)| *why)
}

/// The largest `max.in.flight.requests.per.connection` an idempotent producer keeps
/// its order with.
pub const KAFKA_MAX_IN_FLIGHT: u32 = 5;

/// `name=value,name=value`: names are librdkafka's (lower case, digits, `.` and `_`),
/// each at most once, each one [`kafka_property_refusal`] accepts; values may be
/// anything but a comma.
fn parse_properties(env: &Env<'_>, s: &Setting) -> Result<Vec<(String, Secret)>, ConfigError> {
    let text = env.text(s).unwrap_or_default();
    let mut properties: Vec<(String, Secret)> = Vec::new();
    for (i, item) in text.split(',').map(str::trim).enumerate() {
        if item.is_empty() {
            continue;
        }
        let Some((name, value)) = item.split_once('=') else {
            return Err(ConfigError::new(format!(
                "{}: item {} is not `name=value`",
                s.name,
                i + 1
            )));
        };
        let name = name.trim();
        let value = value.trim();
        let well_formed = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_');
        if !well_formed {
            return Err(ConfigError::new(format!(
                "{}: item {} does not start with a property name (lower-case letters, digits, `.`, `_`)",
                s.name,
                i + 1
            )));
        }
        if let Some(why) = kafka_property_refusal(name) {
            return Err(ConfigError::new(format!(
                "{} may not set `{name}`: {why}",
                s.name
            )));
        }
        if let Some(why) = kafka_value_refusal(name, value) {
            return Err(ConfigError::new(format!(
                "{} may not set `{name}` to `{value}`: {why}",
                s.name
            )));
        }
        if properties.iter().any(|(seen, _)| seen == name) {
            return Err(ConfigError::new(format!(
                "{}: `{name}` is set twice",
                s.name
            )));
        }
        properties.push((name.to_string(), Secret::new(value)));
    }
    Ok(properties)
}
