//! Typed settings read from the environment.
//!
//! One table, [`SETTINGS`], names every variable with its default, its bounds and its
//! meaning. Parsing reads defaults and bounds from that table, and the README's
//! configuration table is generated from it (a test compares them), so each default is
//! written exactly once. A missing, malformed or out-of-range value stops the process
//! at start with one line naming the variable; secrets are wrapped in [`Secret`] so no
//! `Debug` output or log line can print them.
//!
//! This module is a leaf: it imports nothing from the rest of the crate.

use std::{fmt, net::SocketAddr, path::PathBuf, str::FromStr, time::Duration};

/// What values a setting takes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Free text.
    Text,
    /// Free text that must never be printed.
    Secret,
    /// `on`/`off` (also `true`/`false`, `1`/`0`, `yes`/`no`).
    Switch,
    /// `host:port`, or `:port` for loopback.
    Bind,
    /// A whole number within the bounds (inclusive).
    Number { min: u64, max: u64 },
    /// One of a fixed list of words.
    Choice(&'static [&'static str]),
}

/// One environment variable.
#[derive(Debug)]
pub struct Setting {
    pub name: &'static str,
    /// The value used when the variable is unset or empty; `None`: no value.
    pub default: Option<&'static str>,
    pub kind: Kind,
    pub meaning: &'static str,
}

macro_rules! setting {
    ($id:ident, $name:literal, $default:expr, $kind:expr, $meaning:literal) => {
        pub const $id: Setting = Setting {
            name: $name,
            default: $default,
            kind: $kind,
            meaning: $meaning,
        };
    };
}

const fn range(min: u64, max: u64) -> Kind {
    Kind::Number { min, max }
}

pub use table::*;

/// The settings, one line each (kept unformatted so that each reads as a table row).
#[rustfmt::skip]
mod table {
    use super::{Kind, Setting, range};

    setting!(DATABASE_URL, "DATABASE_URL", None, Kind::Secret, "PostgreSQL 14+ connection string (required); may point at a transaction pooler (see `ORDERD_DB_POOLER`)");
    setting!(DATABASE_DIRECT_URL, "ORDERD_DATABASE_DIRECT_URL", None, Kind::Secret, "a connection that is not behind a transaction pooler, for `LISTEN` and migrations; default `DATABASE_URL`");
    setting!(DB_POOLER, "ORDERD_DB_POOLER", Some("none"), Kind::Choice(&["none", "transaction"]), "`transaction`: `DATABASE_URL` goes through a transaction pooler (PgBouncer in transaction mode): no startup parameters, no named prepared statements, every statement in a transaction");
    setting!(BIND, "ORDERD_BIND", Some("127.0.0.1:8080"), Kind::Bind, "HTTP listen address; `:0` picks a free loopback port (the bound address is logged)");
    setting!(METRICS_BIND, "ORDERD_METRICS_BIND", None, Kind::Bind, "when set, `/metrics` is served there and not on the API address; `orderd relay` serves `/metrics` and `/healthz` only there");
    setting!(MIGRATE, "ORDERD_MIGRATE", Some("on"), Kind::Switch, "`serve` applies pending migrations at start");
    setting!(JWT_HS256_SECRET, "ORDERD_JWT_HS256_SECRET", None, Kind::Secret, "HS256 shared secret, at least 32 bytes (exactly one of the three verifiers)");
    setting!(JWT_PUBLIC_KEY_FILE, "ORDERD_JWT_PUBLIC_KEY_FILE", None, Kind::Text, "PEM public key file: an RSA key allows RS256, an EC key ES256");
    setting!(JWT_JWKS_URL, "ORDERD_JWT_JWKS_URL", None, Kind::Text, "JSON Web Key Set URL: `https`, or `http` only to a loopback host; the token's `kid` picks the key; refreshed every 5 minutes; needs `ORDERD_JWT_ISSUER` and `ORDERD_JWT_AUDIENCE`");
    setting!(JWT_ISSUER, "ORDERD_JWT_ISSUER", None, Kind::Text, "when set, a token's `iss` must match; required with a JWKS URL");
    setting!(JWT_AUDIENCE, "ORDERD_JWT_AUDIENCE", None, Kind::Text, "when set, a token's `aud` (a string or an array) must contain it; required with a JWKS URL");
    setting!(IDEMPOTENCY_TTL_SECS, "ORDERD_IDEMPOTENCY_TTL_SECS", Some("86400"), range(1, 31_536_000), "how long a completed key is remembered after completion");
    setting!(LEASE_SECS, "ORDERD_LEASE_SECS", Some("30"), range(1, 3600), "how long a PROCESSING claim is owned before another request may take it over");
    setting!(RESPONSE_KEYS, "ORDERD_RESPONSE_KEYS", None, Kind::Secret, "keys that seal stored responses at rest with AES-256-GCM, as comma-separated `id:base64` (32 bytes each, ids of 1 to 64 of `A-Za-z0-9._-`): the first seals new records, every one opens; unset: stored as they are. Rotate by putting a new key first, running `orderd keys rewrap`, then dropping the old one");
    setting!(RESPONSE_CLEAR, "ORDERD_RESPONSE_CLEAR", Some("serve"), Kind::Choice(&["serve", "refuse"]), "what a replay does with a stored response kept in clear while `ORDERD_RESPONSE_KEYS` is set: `serve` it (records stored before keys were turned on), or `refuse` it with 503 once `orderd keys rewrap` has sealed every record, so that a clear body written into the table is never served");
    setting!(REPLAY_CACHE_BYTES, "ORDERD_REPLAY_CACHE_BYTES", Some("6291456"), range(0, 4_294_967_295), "memory for completed responses that replays are answered from without a database round trip, about 1.5 KiB each (least recently used go first); `0` turns the cache off");
    setting!(INFLIGHT_WAIT_MS, "ORDERD_INFLIGHT_WAIT_MS", Some("200"), range(0, 10_000), "how long a duplicate of an in-flight request waits for it before answering 409");
    setting!(HTTP_READ_TIMEOUT_MS, "ORDERD_HTTP_READ_TIMEOUT_MS", Some("10000"), range(100, 600_000), "a connection that has not delivered a whole request (head and body) this long after it opened, or after the request began, is closed (408)");
    setting!(HTTP_IDLE_TIMEOUT_MS, "ORDERD_HTTP_IDLE_TIMEOUT_MS", Some("60000"), range(100, 3_600_000), "a keep-alive connection idle between requests this long is closed, and not before");
    setting!(HTTP_WRITE_TIMEOUT_MS, "ORDERD_HTTP_WRITE_TIMEOUT_MS", Some("10000"), range(100, 600_000), "a response the client has not taken in full this long after its first byte was ready is abandoned and the connection closed");
    setting!(HTTP_MAX_CONNECTIONS, "ORDERD_HTTP_MAX_CONNECTIONS", Some("10000"), range(1, 1_000_000), "open client connections at most; further ones wait in the kernel's accept queue (also kept below the file-descriptor limit)");
    setting!(HTTP_MAX_IN_FLIGHT, "ORDERD_HTTP_MAX_IN_FLIGHT", Some("1024"), range(1, 1_000_000), "operations doing work at once, counted only once a request's token verified, its tenant's limits admitted it and its body arrived; beyond it, 503 with `Retry-After`");
    setting!(TENANT_RATE_PER_SEC, "ORDERD_TENANT_RATE_PER_SEC", Some("500"), range(0, 1_000_000), "per-tenant token bucket refill rate on the API and MCP paths, per process; `0` turns the limit off");
    setting!(TENANT_BURST, "ORDERD_TENANT_BURST", Some("1000"), range(1, 10_000_000), "per-tenant token bucket size");
    setting!(TENANT_MAX_IN_FLIGHT, "ORDERD_TENANT_MAX_IN_FLIGHT", Some("8"), range(1, 10_000), "requests of one tenant doing database work at once, per process; more wait their turn (up to 2 s, then 429)");
    setting!(PUBLIC_URL, "ORDERD_PUBLIC_URL", None, Kind::Text, "the URL clients reach this service at (`https://orders.example.com`), as the MCP authorization metadata advertises it; default `http://` and the bound address; a request's `Host` is never used for it");
    setting!(MCP_ALLOWED_ORIGINS, "ORDERD_MCP_ALLOWED_ORIGINS", None, Kind::Text, "comma-separated browser origins (`https://app.example.com`) allowed to call `/mcp`; a request with any other `Origin` is refused 403");
    setting!(DB_POOL_SIZE, "ORDERD_DB_POOL_SIZE", Some("16"), range(1, 1000), "database connections of the API's pool (`serve`) or of the relay process's jobs (`relay`); `serve`'s in-process relay has `ORDERD_OUTBOX_PARALLEL_ROUNDS` more of its own, and LISTEN and migrations one each");
    setting!(DB_STATEMENT_TIMEOUT_MS, "ORDERD_DB_STATEMENT_TIMEOUT_MS", Some("5000"), range(100, 600_000), "a statement running longer is cancelled (503, the claim released); also the limit for a transaction left idle");
    setting!(PURGE_INTERVAL_SECS, "ORDERD_PURGE_INTERVAL_SECS", Some("60"), range(1, 86_400), "how often the retention purges run");
    setting!(RECONCILE_INTERVAL_SECS, "ORDERD_RECONCILE_INTERVAL_SECS", Some("300"), range(0, 86_400), "how often `serve` reconciles orders, events and stored responses; `0` turns it off in this process (run it in one or a few)");
    setting!(WORKER_THREADS, "ORDERD_WORKER_THREADS", Some("0"), range(0, 1024), "threads that run requests, the relay and the jobs; `0`: one per CPU core. On a small machine shared with PostgreSQL, `1` spends less CPU per request (fewer wake-ups between threads)");
    setting!(LOG_FORMAT, "ORDERD_LOG_FORMAT", Some("text"), Kind::Choice(&["text", "json"]), "`json` for one JSON object per log line");
    setting!(RELAY, "ORDERD_RELAY", Some("on"), Kind::Switch, "`off`: `serve` runs no relay (run `orderd relay` elsewhere)");
    setting!(SNS_TOPIC_ARN, "ORDERD_SNS_TOPIC_ARN", None, Kind::Text, "the SNS topic the relay publishes to; a relay needs exactly one sink, this or Kafka; a `.fifo` ARN adds message group and deduplication ids");
    setting!(KAFKA_BROKERS, "ORDERD_KAFKA_BROKERS", None, Kind::Text, "bootstrap servers (`host:port,host:port`) of the Kafka cluster the relay publishes to instead of SNS; needs `ORDERD_KAFKA_TOPIC`");
    setting!(KAFKA_TOPIC, "ORDERD_KAFKA_TOPIC", None, Kind::Text, "the Kafka topic the relay publishes to (it must exist; orderd does not create it); needs `ORDERD_KAFKA_BROKERS`");
    setting!(KAFKA_CONFIG, "ORDERD_KAFKA_CONFIG", None, Kind::Secret, "further producer properties as `name=value` pairs separated by commas (`security.protocol=SASL_SSL,sasl.mechanism=PLAIN,...`); values are never logged; only security (`ssl.*`, `sasl.*`), client identity, compression, batching, connection and diagnostic properties are accepted (docs/operations.md lists them), anything else stops the process at start");
    setting!(OUTBOX_BATCH_SIZE, "ORDERD_OUTBOX_BATCH_SIZE", Some("100"), range(1, 1000), "events claimed per relay round");
    setting!(OUTBOX_PARALLEL_ROUNDS, "ORDERD_OUTBOX_PARALLEL_ROUNDS", Some("2"), range(1, 32), "rounds (claim, publish, mark) one relay runs at once, so that a backlog keeps the database and SNS busy together; in `serve` each has a database connection of its own, apart from the API's pool");
    setting!(OUTBOX_POLL_MS, "ORDERD_OUTBOX_POLL_MS", Some("1000"), range(1, 60_000), "fallback poll interval (commits wake the relay through LISTEN/NOTIFY)");
    setting!(OUTBOX_MAX_ATTEMPTS, "ORDERD_OUTBOX_MAX_ATTEMPTS", Some("10"), range(1, 1000), "rejections of the event itself (by SNS, or by Kafka for the one record) before it is DEAD (a permanent one: at once)");
    setting!(OUTBOX_BACKOFF_INITIAL_MS, "ORDERD_OUTBOX_BACKOFF_INITIAL_MS", Some("2000"), range(1, 3_600_000), "first retry delay; doubles per failure, with jitter");
    setting!(OUTBOX_BACKOFF_MAX_MS, "ORDERD_OUTBOX_BACKOFF_MAX_MS", Some("60000"), range(1, 86_400_000), "longest retry delay (not below the initial one)");
    setting!(OUTBOX_PUBLISH_TIMEOUT_MS, "ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", Some("10000"), range(100, 120_000), "bound on one SNS call, or on a Kafka record's delivery (its `message.timeout.ms`)");
    setting!(OUTBOX_RETENTION_SECS, "ORDERD_OUTBOX_RETENTION_SECS", Some("86400"), range(1, 31_536_000), "how long published events are kept before the purge deletes them");

    /// Every setting, in the order the README lists them.
    pub const SETTINGS: &[&Setting] = &[
        &DATABASE_URL, &DATABASE_DIRECT_URL, &DB_POOLER, &BIND, &METRICS_BIND, &MIGRATE,
        &JWT_HS256_SECRET, &JWT_PUBLIC_KEY_FILE, &JWT_JWKS_URL, &JWT_ISSUER, &JWT_AUDIENCE,
        &IDEMPOTENCY_TTL_SECS, &LEASE_SECS, &INFLIGHT_WAIT_MS, &REPLAY_CACHE_BYTES, &RESPONSE_KEYS, &RESPONSE_CLEAR,
        &HTTP_READ_TIMEOUT_MS, &HTTP_IDLE_TIMEOUT_MS, &HTTP_WRITE_TIMEOUT_MS, &HTTP_MAX_CONNECTIONS, &HTTP_MAX_IN_FLIGHT,
        &TENANT_RATE_PER_SEC, &TENANT_BURST, &TENANT_MAX_IN_FLIGHT, &PUBLIC_URL, &MCP_ALLOWED_ORIGINS,
        &DB_POOL_SIZE, &DB_STATEMENT_TIMEOUT_MS, &PURGE_INTERVAL_SECS, &RECONCILE_INTERVAL_SECS,
        &WORKER_THREADS, &LOG_FORMAT,
        &RELAY, &SNS_TOPIC_ARN, &KAFKA_BROKERS, &KAFKA_TOPIC, &KAFKA_CONFIG, &OUTBOX_BATCH_SIZE, &OUTBOX_PARALLEL_ROUNDS, &OUTBOX_POLL_MS, &OUTBOX_MAX_ATTEMPTS,
        &OUTBOX_BACKOFF_INITIAL_MS, &OUTBOX_BACKOFF_MAX_MS, &OUTBOX_PUBLISH_TIMEOUT_MS,
        &OUTBOX_RETENTION_SECS,
    ];
}

/// The README's configuration table, generated from [`SETTINGS`].
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | default | range | meaning |\n|---|---|---|---|\n");
    for s in SETTINGS {
        let default = match s.default {
            Some(d) => format!("`{d}`"),
            None => "none".into(),
        };
        let range = match s.kind {
            Kind::Number { min, max } => format!("{min} to {max}"),
            Kind::Switch => "`on`, `off`".into(),
            Kind::Choice(words) => words
                .iter()
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(", "),
            Kind::Bind => "`host:port`".into(),
            Kind::Text | Kind::Secret => String::new(),
        };
        out.push_str(&format!(
            "| `{}` | {default} | {range} | {} |\n",
            s.name, s.meaning
        ));
    }
    out
}

/// A value that must never reach a log line.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The only way to read the value: callers that do so are easy to grep for.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A start-up configuration error; its message names the variable.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// How many worker threads the runtime gets (`None`: one per core). Read on its own
/// because the runtime is built before anything else runs.
pub fn worker_threads_from_env() -> Result<Option<usize>, ConfigError> {
    worker_threads_from_lookup(&|name| std::env::var(name).ok())
}

pub fn worker_threads_from_lookup(
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<usize>, ConfigError> {
    let threads = Env(lookup).number(&WORKER_THREADS)?;
    Ok((threads > 0).then_some(threads as usize))
}

/// How tokens are verified and minted.
#[derive(Clone, Debug, Default)]
pub struct JwtConfig {
    pub hs256_secret: Option<Secret>,
    pub public_key_file: Option<PathBuf>,
    pub jwks_url: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
}

impl JwtConfig {
    /// The JWT settings alone: `orderd token` needs them without a database.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(lookup);
        let jwt = JwtConfig {
            hs256_secret: env.text(&JWT_HS256_SECRET).map(Secret::new),
            public_key_file: env.text(&JWT_PUBLIC_KEY_FILE).map(PathBuf::from),
            jwks_url: env.text(&JWT_JWKS_URL),
            issuer: env.text(&JWT_ISSUER),
            audience: env.text(&JWT_AUDIENCE),
        };
        // RFC 7518 asks for a key at least as long as the hash: 32 bytes for HS256.
        if let Some(secret) = &jwt.hs256_secret
            && secret.expose().len() < 32
        {
            return Err(ConfigError::new(format!(
                "{} is too short: use at least 32 bytes",
                JWT_HS256_SECRET.name
            )));
        }
        let configured = [
            jwt.hs256_secret.is_some(),
            jwt.public_key_file.is_some(),
            jwt.jwks_url.is_some(),
        ];
        if configured.iter().filter(|&&set| set).count() > 1 {
            return Err(ConfigError::new(format!(
                "set exactly one of {}, {} and {}",
                JWT_HS256_SECRET.name, JWT_PUBLIC_KEY_FILE.name, JWT_JWKS_URL.name
            )));
        }
        if let Some(url) = &jwt.jwks_url {
            if !jwks_url_is_safe(url) {
                return Err(ConfigError::new(format!(
                    "{} must be an https:// URL (or http:// to a loopback host), not `{url}`: \
                     whoever can change the key set can mint tokens for every tenant",
                    JWT_JWKS_URL.name
                )));
            }
            // A shared identity provider signs tokens for other services too: only the
            // audience and the issuer tell this service's tokens from theirs.
            for (setting, value) in [(&JWT_AUDIENCE, &jwt.audience), (&JWT_ISSUER, &jwt.issuer)] {
                if value.is_none() {
                    return Err(ConfigError::new(format!(
                        "{} is required with {}: without it a token the same provider minted \
                         for another service would be accepted",
                        setting.name, JWT_JWKS_URL.name
                    )));
                }
            }
        }
        Ok(jwt)
    }
}

/// Whether a key set may be fetched from `url`: over TLS, or in the clear only from this
/// host (a provider or a sidecar on loopback).
fn jwks_url_is_safe(url: &str) -> bool {
    // `http::Uri` parses the authority (user info, brackets, port) as the HTTP client
    // will, so `http://127.0.0.1@idp.example.com` is judged by `idp.example.com`.
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    match (uri.scheme_str(), uri.host()) {
        (Some("https"), Some(_)) => true,
        (Some("http"), Some(host)) => {
            host.eq_ignore_ascii_case("localhost")
                || host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => false,
    }
}

/// Settings of the idempotency guard.
#[derive(Clone, Debug)]
pub struct IdempotencyConfig {
    /// How long a completed key is remembered after completion.
    pub ttl: Duration,
    /// How long a PROCESSING claim is owned before another request may take it over.
    pub lease: Duration,
    /// How long a duplicate of an in-flight request waits for it before answering 409.
    pub inflight_wait: Duration,
    /// Bytes of completed responses kept in memory for replays; 0: none.
    pub replay_cache_bytes: u64,
    /// The keys stored responses are sealed with (`ORDERD_RESPONSE_KEYS`): the first
    /// seals, every one opens; none: stored as they are.
    pub response_keys: Vec<ResponseKey>,
    /// Whether a body stored in clear is refused (503) while keys are configured
    /// (`ORDERD_RESPONSE_CLEAR=refuse`).
    pub refuse_clear_records: bool,
}

/// One key of `ORDERD_RESPONSE_KEYS`: its id, stored beside what it sealed, and its 32
/// bytes, which no `Debug` output shows.
#[derive(Clone)]
pub struct ResponseKey {
    pub id: String,
    material: [u8; 32],
}

impl ResponseKey {
    /// A key from its parts (tests and tools; the configuration parses its own).
    pub fn new(id: &str, material: [u8; 32]) -> Self {
        Self {
            id: id.to_string(),
            material,
        }
    }

    /// The key's bytes: the only way to read them, easy to grep for.
    pub fn material(&self) -> &[u8; 32] {
        &self.material
    }
}

impl fmt::Debug for ResponseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ResponseKey({}: ***)", self.id)
    }
}

/// The longest key id: it is stored with every sealed record.
pub const RESPONSE_KEY_ID_MAX: usize = 64;

/// `ORDERD_RESPONSE_KEYS`: `id:base64` items separated by commas. Standard base64 of
/// exactly 32 bytes, with or without padding; distinct ids. No message shows a key.
fn parse_response_keys(text: &str) -> Result<Vec<ResponseKey>, ConfigError> {
    use base64::{
        Engine,
        alphabet::STANDARD,
        engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
    };
    let lenient = GeneralPurpose::new(
        &STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let name = RESPONSE_KEYS.name;
    let mut keys: Vec<ResponseKey> = Vec::new();
    for (i, item) in text.split(',').map(str::trim).enumerate() {
        if item.is_empty() {
            continue;
        }
        let n = i + 1;
        let Some((id, encoded)) = item.split_once(':') else {
            return Err(ConfigError::new(format!(
                "{name}: item {n} is not `id:base64-of-32-bytes`"
            )));
        };
        let id = id.trim();
        let id_ok = (1..=RESPONSE_KEY_ID_MAX).contains(&id.len())
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !id_ok {
            return Err(ConfigError::new(format!(
                "{name}: item {n} needs an id of 1 to {RESPONSE_KEY_ID_MAX} of A-Z, a-z, 0-9, '.', '_' and '-' before its `:`"
            )));
        }
        let material: [u8; 32] = lenient
            .decode(encoded.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                ConfigError::new(format!(
                    "{name}: key `{id}` is not the base64 of exactly 32 bytes"
                ))
            })?;
        if keys.iter().any(|k| k.id == id) {
            return Err(ConfigError::new(format!(
                "{name}: the id `{id}` is given twice"
            )));
        }
        keys.push(ResponseKey {
            id: id.to_string(),
            material,
        });
    }
    Ok(keys)
}

/// Settings of the outbox relay (parsed here so that a typo fails at start).
#[derive(Clone, Debug)]
pub struct OutboxConfig {
    /// The SNS topic, if one is set; where a relay runs exactly one sink is
    /// ([`Config::relay_sink`]).
    pub sns_topic_arn: Option<String>,
    /// Kafka, if it is set.
    pub kafka: Option<KafkaConfig>,
    pub batch_size: u32,
    /// Rounds in flight at once in one relay.
    pub parallel_rounds: u32,
    pub poll: Duration,
    pub max_attempts: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Bound on one SNS call.
    pub publish_timeout: Duration,
    /// How long published rows are kept before the purge deletes them.
    pub retention: Duration,
}

/// Where a relay publishes.
#[derive(Debug, Clone, Copy)]
pub enum Sink<'a> {
    /// An SNS topic, by ARN.
    Sns(&'a str),
    Kafka(&'a KafkaConfig),
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
    "message.max.bytes",
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

/// The largest `max.in.flight.requests.per.connection` an idempotent producer keeps
/// its order with.
pub const KAFKA_MAX_IN_FLIGHT: u32 = 5;

impl KafkaConfig {
    /// Kafka's three settings: both of the first two or neither, and the properties
    /// parsed. No message names a property's value.
    fn from_env(env: &Env<'_>) -> Result<Option<Self>, ConfigError> {
        let brokers = env.text(&KAFKA_BROKERS);
        let topic = env.text(&KAFKA_TOPIC);
        let properties = parse_kafka_properties(env.text(&KAFKA_CONFIG).as_deref().unwrap_or(""))?;
        match (brokers, topic) {
            (Some(brokers), Some(topic)) => Ok(Some(Self {
                brokers,
                topic,
                properties,
            })),
            (None, None) if properties.is_empty() => Ok(None),
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
}

/// `name=value,name=value`: names are librdkafka's (lower case, digits, `.` and `_`),
/// each at most once, each one [`kafka_property_refusal`] accepts; values may be
/// anything but a comma.
fn parse_kafka_properties(text: &str) -> Result<Vec<(String, Secret)>, ConfigError> {
    let mut properties: Vec<(String, Secret)> = Vec::new();
    for (i, item) in text.split(',').map(str::trim).enumerate() {
        if item.is_empty() {
            continue;
        }
        let Some((name, value)) = item.split_once('=') else {
            return Err(ConfigError::new(format!(
                "{}: item {} is not `name=value`",
                KAFKA_CONFIG.name,
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
                KAFKA_CONFIG.name,
                i + 1
            )));
        }
        if let Some(why) = kafka_property_refusal(name) {
            return Err(ConfigError::new(format!(
                "{} may not set `{name}`: {why}",
                KAFKA_CONFIG.name
            )));
        }
        if properties.iter().any(|(seen, _)| seen == name) {
            return Err(ConfigError::new(format!(
                "{}: `{name}` is set twice",
                KAFKA_CONFIG.name
            )));
        }
        properties.push((name.to_string(), Secret::new(value)));
    }
    Ok(properties)
}

/// How the HTTP server treats connections.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// A whole request (head and body) must arrive within this.
    pub read_timeout: Duration,
    /// A keep-alive connection idle this long is closed.
    pub idle_timeout: Duration,
    /// A response not taken in full this long after its first byte is abandoned.
    pub write_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Requests being handled at once at most.
    pub max_in_flight: usize,
    /// Where `/metrics` is served instead of the API address; `None`: on the API address
    /// (`serve`), or nowhere (`relay`).
    pub metrics_bind: Option<String>,
    /// Browser origins allowed to call `/mcp`.
    pub mcp_allowed_origins: Vec<String>,
    /// Where clients reach the service, without a trailing `/`; `None`: the bound
    /// address over `http`.
    pub public_url: Option<String>,
}

/// What one tenant may use of one process.
#[derive(Clone, Debug)]
pub struct TenantLimits {
    /// Token bucket refill per second; `None`: no rate limit.
    pub rate_per_sec: Option<u32>,
    /// Token bucket size.
    pub burst: u32,
    /// Requests of one tenant doing database work at once.
    pub max_in_flight: u32,
}

/// Everything `orderd` reads from its environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: Secret,
    /// A session-capable connection (`LISTEN`, migrations); `database_url` by default.
    pub database_direct_url: Secret,
    /// Whether `database_url` goes through a transaction pooler.
    pub db_pooler_transaction: bool,
    pub bind: String,
    pub migrate_on_start: bool,
    pub jwt: JwtConfig,
    pub idempotency: IdempotencyConfig,
    /// Whether `serve` runs a relay in process.
    pub relay_in_serve: bool,
    pub outbox: OutboxConfig,
    /// `json` or `text` log lines.
    pub log_json: bool,
    pub http: HttpConfig,
    pub tenant_limits: TenantLimits,
    /// Connections of the process's one pool.
    pub db_pool_size: u32,
    /// The longest a statement may run (and a transaction stay idle).
    pub db_statement_timeout: Duration,
    /// How often the retention purges run.
    pub purge_interval: Duration,
    /// How often `serve` reconciles; `None` when off.
    pub reconcile_interval: Option<Duration>,
}

impl Config {
    /// Reads the process environment (after `.env`, if any, was loaded by `main`).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup`, so tests can build a configuration without
    /// touching the process environment.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(lookup);
        let database_url = env.text(&DATABASE_URL).ok_or_else(|| {
            ConfigError::new("DATABASE_URL is required (a PostgreSQL connection string)")
        })?;
        let database_direct_url = env
            .text(&DATABASE_DIRECT_URL)
            .unwrap_or(database_url.clone());
        // Used before the runtime and the configuration exist (see
        // `worker_threads_from_env`); checked here too, so that every setting is.
        worker_threads_from_lookup(lookup)?;
        let config = Config {
            database_url: Secret::new(database_url),
            database_direct_url: Secret::new(database_direct_url),
            db_pooler_transaction: env.choice(&DB_POOLER)? == "transaction",
            bind: env.bind(&BIND)?,
            migrate_on_start: env.switch(&MIGRATE)?,
            jwt: JwtConfig::from_lookup(lookup)?,
            idempotency: IdempotencyConfig {
                ttl: env.secs(&IDEMPOTENCY_TTL_SECS)?,
                lease: env.secs(&LEASE_SECS)?,
                inflight_wait: env.millis(&INFLIGHT_WAIT_MS)?,
                replay_cache_bytes: env.number(&REPLAY_CACHE_BYTES)?,
                response_keys: parse_response_keys(
                    env.text(&RESPONSE_KEYS).as_deref().unwrap_or(""),
                )?,
                refuse_clear_records: env.choice(&RESPONSE_CLEAR)? == "refuse",
            },
            relay_in_serve: env.switch(&RELAY)?,
            outbox: OutboxConfig {
                sns_topic_arn: env.text(&SNS_TOPIC_ARN),
                kafka: KafkaConfig::from_env(&env)?,
                batch_size: env.number(&OUTBOX_BATCH_SIZE)? as u32,
                parallel_rounds: env.number(&OUTBOX_PARALLEL_ROUNDS)? as u32,
                poll: env.millis(&OUTBOX_POLL_MS)?,
                max_attempts: env.number(&OUTBOX_MAX_ATTEMPTS)? as u32,
                backoff_initial: env.millis(&OUTBOX_BACKOFF_INITIAL_MS)?,
                backoff_max: env.millis(&OUTBOX_BACKOFF_MAX_MS)?,
                publish_timeout: env.millis(&OUTBOX_PUBLISH_TIMEOUT_MS)?,
                retention: env.secs(&OUTBOX_RETENTION_SECS)?,
            },
            log_json: env.choice(&LOG_FORMAT)? == "json",
            http: HttpConfig {
                read_timeout: env.millis(&HTTP_READ_TIMEOUT_MS)?,
                idle_timeout: env.millis(&HTTP_IDLE_TIMEOUT_MS)?,
                write_timeout: env.millis(&HTTP_WRITE_TIMEOUT_MS)?,
                max_connections: env.number(&HTTP_MAX_CONNECTIONS)? as usize,
                max_in_flight: env.number(&HTTP_MAX_IN_FLIGHT)? as usize,
                metrics_bind: match env.text(&METRICS_BIND) {
                    Some(_) => Some(env.bind(&METRICS_BIND)?),
                    None => None,
                },
                mcp_allowed_origins: env
                    .text(&MCP_ALLOWED_ORIGINS)
                    .unwrap_or_default()
                    .split(',')
                    .map(|o| o.trim().trim_end_matches('/').to_string())
                    .filter(|o| !o.is_empty())
                    .collect(),
                public_url: match env.text(&PUBLIC_URL) {
                    Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
                        Some(url.trim_end_matches('/').to_string())
                    }
                    Some(url) => {
                        return Err(ConfigError::new(format!(
                            "{} must be an http:// or https:// URL, not `{url}`",
                            PUBLIC_URL.name
                        )));
                    }
                    None => None,
                },
            },
            tenant_limits: TenantLimits {
                rate_per_sec: Some(env.number(&TENANT_RATE_PER_SEC)? as u32).filter(|&r| r > 0),
                burst: env.number(&TENANT_BURST)? as u32,
                max_in_flight: env.number(&TENANT_MAX_IN_FLIGHT)? as u32,
            },
            db_pool_size: env.number(&DB_POOL_SIZE)? as u32,
            db_statement_timeout: env.millis(&DB_STATEMENT_TIMEOUT_MS)?,
            purge_interval: env.secs(&PURGE_INTERVAL_SECS)?,
            reconcile_interval: Some(env.secs(&RECONCILE_INTERVAL_SECS)?)
                .filter(|interval| !interval.is_zero()),
        };
        if config.idempotency.inflight_wait >= config.idempotency.lease {
            return Err(ConfigError::new(format!(
                "{} must be shorter than {}",
                INFLIGHT_WAIT_MS.name, LEASE_SECS.name
            )));
        }
        if config.outbox.backoff_max < config.outbox.backoff_initial {
            return Err(ConfigError::new(format!(
                "{} must not be below {}",
                OUTBOX_BACKOFF_MAX_MS.name, OUTBOX_BACKOFF_INITIAL_MS.name
            )));
        }
        Ok(config)
    }

    /// Where a relay publishes: exactly one sink, SNS or Kafka, wherever a relay runs.
    pub fn relay_sink(&self) -> Result<Sink<'_>, ConfigError> {
        match (&self.outbox.sns_topic_arn, &self.outbox.kafka) {
            (Some(arn), None) => Ok(Sink::Sns(arn)),
            (None, Some(kafka)) => Ok(Sink::Kafka(kafka)),
            (Some(_), Some(_)) => Err(ConfigError::new(format!(
                "{} and {} are both set: a relay publishes to exactly one sink, SNS or Kafka",
                SNS_TOPIC_ARN.name, KAFKA_BROKERS.name
            ))),
            (None, None) => Err(ConfigError::new(format!(
                "{} (SNS) or {} with {} (Kafka) is required to run the relay (or set {}=off)",
                SNS_TOPIC_ARN.name, KAFKA_BROKERS.name, KAFKA_TOPIC.name, RELAY.name
            ))),
        }
    }
}

/// The listen address with the `:PORT` shorthand ("that port on loopback") expanded.
pub fn bind_address(bind: &str) -> String {
    if bind.starts_with(':') {
        format!("127.0.0.1{bind}")
    } else {
        bind.to_string()
    }
}

/// Reads settings through a lookup function, applying each setting's default and kind.
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    /// The set, non-empty value, else the default.
    fn text(&self, s: &Setting) -> Option<String> {
        (self.0)(s.name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .or_else(|| s.default.map(String::from))
    }

    fn number(&self, s: &Setting) -> Result<u64, ConfigError> {
        let Kind::Number { min, max } = s.kind else {
            unreachable!("{} is not a number setting", s.name)
        };
        let raw = self.text(s).unwrap_or_default();
        match raw.parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(v),
            _ => Err(ConfigError::new(format!(
                "{} must be a whole number from {min} to {max}, not `{raw}`",
                s.name
            ))),
        }
    }

    fn millis(&self, s: &Setting) -> Result<Duration, ConfigError> {
        self.number(s).map(Duration::from_millis)
    }

    fn secs(&self, s: &Setting) -> Result<Duration, ConfigError> {
        self.number(s).map(Duration::from_secs)
    }

    fn switch(&self, s: &Setting) -> Result<bool, ConfigError> {
        let value = self.text(s).unwrap_or_default().to_ascii_lowercase();
        match value.as_str() {
            "on" | "true" | "1" | "yes" => Ok(true),
            "off" | "false" | "0" | "no" => Ok(false),
            _ => Err(ConfigError::new(format!(
                "{} must be `on` or `off`, not `{value}`",
                s.name
            ))),
        }
    }

    fn choice(&self, s: &Setting) -> Result<String, ConfigError> {
        let Kind::Choice(words) = s.kind else {
            unreachable!("{} is not a choice setting", s.name)
        };
        let value = self.text(s).unwrap_or_default();
        if words.contains(&value.as_str()) {
            Ok(value)
        } else {
            Err(ConfigError::new(format!(
                "{} must be one of {}, not `{value}`",
                s.name,
                words.join(", ")
            )))
        }
    }

    fn bind(&self, s: &Setting) -> Result<String, ConfigError> {
        let value = self.text(s).unwrap_or_default();
        SocketAddr::from_str(&bind_address(&value))
            .map(|_| value.clone())
            .map_err(|_| ConfigError::new(format!("{} must be host:port, not `{value}`", s.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(&|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_come_from_the_table() {
        let c = config(&[("DATABASE_URL", "postgres://x")]).unwrap();
        assert_eq!(c.bind, "127.0.0.1:8080");
        assert_eq!(c.idempotency.ttl, Duration::from_secs(86_400));
        assert_eq!(c.idempotency.lease, Duration::from_secs(30));
        assert_eq!(c.idempotency.inflight_wait, Duration::from_millis(200));
        assert_eq!(c.outbox.batch_size, 100);
        assert_eq!(c.outbox.max_attempts, 10);
        assert_eq!(c.db_pool_size, 16);
        assert!(c.relay_in_serve && c.migrate_on_start && !c.log_json);
    }

    #[test]
    fn every_default_is_valid_for_its_own_kind() {
        // Parsing with only the required variable set exercises every default above;
        // this checks the ones that parse lazily (none today) cannot drift either.
        for s in SETTINGS {
            if let (Some(default), Kind::Number { min, max }) = (s.default, s.kind) {
                let v: u64 = default.parse().unwrap();
                assert!((min..=max).contains(&v), "{}", s.name);
            }
        }
    }

    #[test]
    fn a_missing_database_url_names_the_variable() {
        let err = config(&[]).unwrap_err().to_string();
        assert!(err.starts_with("DATABASE_URL"), "{err}");
    }

    #[test]
    fn malformed_and_out_of_range_numbers_name_the_variable() {
        for bad in ["soon", "0", "3601", "-1", "18446744073709551616"] {
            let err = config(&[("DATABASE_URL", "x"), ("ORDERD_LEASE_SECS", bad)])
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("ORDERD_LEASE_SECS"), "{err}");
        }
    }

    #[test]
    fn worker_threads_default_to_one_per_core_and_are_bounded() {
        let workers = |value: Option<&str>| {
            worker_threads_from_lookup(&|name| {
                (name == "ORDERD_WORKER_THREADS")
                    .then(|| value.map(String::from))
                    .flatten()
            })
        };
        assert_eq!(workers(None).unwrap(), None);
        assert_eq!(workers(Some("0")).unwrap(), None);
        assert_eq!(workers(Some("1")).unwrap(), Some(1));
        for bad in ["-1", "1025", "two"] {
            let err = workers(Some(bad)).unwrap_err().to_string();
            assert!(err.starts_with("ORDERD_WORKER_THREADS"), "{err}");
        }
    }

    #[test]
    fn a_malformed_switch_choice_or_bind_names_the_variable() {
        for (name, bad) in [
            ("ORDERD_RELAY", "maybe"),
            ("ORDERD_BIND", "nowhere"),
            ("ORDERD_LOG_FORMAT", "xml"),
        ] {
            let err = config(&[("DATABASE_URL", "x"), (name, bad)])
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(name), "{err}");
        }
        assert!(config(&[("DATABASE_URL", "x"), ("ORDERD_BIND", ":0")]).is_ok());
    }

    #[test]
    fn secrets_never_print() {
        let c = config(&[
            ("DATABASE_URL", "postgres://u:pw@h/db"),
            (
                "ORDERD_JWT_HS256_SECRET",
                "very-secret-value-0123456789abcdef",
            ),
        ])
        .unwrap();
        let printed = format!("{c:?}");
        assert!(
            !printed.contains("very-secret-value") && !printed.contains("pw@h"),
            "{printed}"
        );
    }

    #[test]
    fn every_number_has_an_upper_bound_that_fits_its_use() {
        let huge = u64::MAX.to_string();
        for s in SETTINGS {
            if let Kind::Number { max, .. } = s.kind {
                assert!(max <= u32::MAX as u64, "{} may overflow a u32", s.name);
                let err = config(&[("DATABASE_URL", "x"), (s.name, &huge)])
                    .unwrap_err()
                    .to_string();
                assert!(err.starts_with(s.name), "{err}");
            }
        }
    }

    #[test]
    fn tokens_need_exactly_one_verifier_and_a_long_enough_secret() {
        let err = config(&[
            ("DATABASE_URL", "x"),
            (
                "ORDERD_JWT_HS256_SECRET",
                "0123456789abcdef0123456789abcdef",
            ),
            ("ORDERD_JWT_JWKS_URL", "http://127.0.0.1/jwks"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("exactly one"), "{err}");
        let err = config(&[
            ("DATABASE_URL", "x"),
            ("ORDERD_JWT_HS256_SECRET", "0123456789abcdef0123456789abcde"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("ORDERD_JWT_HS256_SECRET"), "{err}");
        let err = config(&[
            ("DATABASE_URL", "x"),
            ("ORDERD_JWT_JWKS_URL", "file:///etc/passwd"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("ORDERD_JWT_JWKS_URL"), "{err}");
    }

    #[test]
    fn a_key_set_comes_over_tls_or_from_loopback_and_names_its_audience_and_issuer() {
        let with = |url: &str, extra: &[(&str, &str)]| {
            let mut settings = vec![("DATABASE_URL", "x"), ("ORDERD_JWT_JWKS_URL", url)];
            settings.extend_from_slice(extra);
            config(&settings).map(|_| ()).map_err(|e| e.to_string())
        };
        let both = [
            ("ORDERD_JWT_AUDIENCE", "orderd"),
            ("ORDERD_JWT_ISSUER", "https://idp.example.com/"),
        ];
        for url in [
            "https://idp.example.com/jwks",
            "http://127.0.0.1:8080/jwks",
            "http://127.8.9.10/jwks",
            "http://localhost/jwks",
            "http://[::1]:9000/jwks",
        ] {
            assert_eq!(with(url, &both), Ok(()), "{url}");
        }
        for url in [
            "http://idp.example.com/jwks",
            "http://10.0.0.1/jwks",
            "http://127.0.0.1@idp.example.com/jwks",
            "http://localhost.example.com/jwks",
        ] {
            let err = with(url, &both).unwrap_err();
            assert!(err.starts_with("ORDERD_JWT_JWKS_URL"), "{url}: {err}");
        }
        let err = with("https://idp.example.com/jwks", &both[1..]).unwrap_err();
        assert!(err.starts_with("ORDERD_JWT_AUDIENCE is required"), "{err}");
        let err = with("https://idp.example.com/jwks", &both[..1]).unwrap_err();
        assert!(err.starts_with("ORDERD_JWT_ISSUER is required"), "{err}");
    }

    #[test]
    fn the_in_flight_wait_must_end_before_the_lease() {
        let err = config(&[
            ("DATABASE_URL", "x"),
            ("ORDERD_LEASE_SECS", "1"),
            ("ORDERD_INFLIGHT_WAIT_MS", "1000"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("ORDERD_INFLIGHT_WAIT_MS"), "{err}");
    }

    #[test]
    fn a_relay_has_exactly_one_sink() {
        let kafka = [
            ("ORDERD_KAFKA_BROKERS", "127.0.0.1:9092"),
            ("ORDERD_KAFKA_TOPIC", "orders"),
        ];
        let sns = ("ORDERD_SNS_TOPIC_ARN", "arn:aws:sns:us-east-1:1:orders");
        let sink = |vars: &[(&str, &str)]| {
            let mut all = vec![("DATABASE_URL", "x")];
            all.extend_from_slice(vars);
            let c = config(&all).unwrap();
            c.relay_sink()
                .map(|s| format!("{s:?}"))
                .map_err(|e| e.to_string())
        };
        assert!(sink(&[sns]).unwrap().starts_with("Sns"));
        assert!(sink(&kafka).unwrap().starts_with("Kafka"));
        let both = sink(&[sns, kafka[0], kafka[1]]).unwrap_err();
        assert!(
            both.contains("ORDERD_SNS_TOPIC_ARN") && both.contains("ORDERD_KAFKA_BROKERS"),
            "{both}"
        );
        let neither = sink(&[]).unwrap_err();
        assert!(
            neither.contains("ORDERD_SNS_TOPIC_ARN") && neither.contains("ORDERD_KAFKA_TOPIC"),
            "{neither}"
        );
        for (half, missing) in [
            (kafka[0], "ORDERD_KAFKA_TOPIC"),
            (kafka[1], "ORDERD_KAFKA_BROKERS"),
        ] {
            let err = config(&[("DATABASE_URL", "x"), half])
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(missing), "{err}");
        }
    }

    #[test]
    fn kafka_properties_parse_and_never_weaken_delivery_or_print_a_value() {
        let with = |properties: &str| {
            config(&[
                ("DATABASE_URL", "x"),
                ("ORDERD_KAFKA_BROKERS", "127.0.0.1:9092"),
                ("ORDERD_KAFKA_TOPIC", "orders"),
                ("ORDERD_KAFKA_CONFIG", properties),
            ])
        };
        let c = with(" security.protocol=SASL_SSL, sasl.password=pa=ss ,linger.ms=5,").unwrap();
        let kafka = c.outbox.kafka.as_ref().unwrap();
        let names: Vec<&str> = kafka.properties.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["security.protocol", "sasl.password", "linger.ms"]);
        assert_eq!(kafka.properties[1].1.expose(), "pa=ss");
        assert!(!format!("{c:?}").contains("pa=ss"));
        for (bad, named) in [
            ("acks=1", "`acks`"),
            ("enable.idempotence=false", "`enable.idempotence`"),
            ("request.required.acks=0", "`request.required.acks`"),
            ("message.timeout.ms=900000", "`message.timeout.ms`"),
            ("bootstrap.servers=elsewhere:9092", "`bootstrap.servers`"),
            (
                "max.in.flight.requests.per.connection=6",
                "`max.in.flight.requests.per.connection`",
            ),
            ("max.in.flight=1", "`max.in.flight`"),
            // librdkafka's aliases and topic-level side doors.
            (
                "topic.message.timeout.ms=600000",
                "`topic.message.timeout.ms`",
            ),
            ("topic.acks=1", "`topic.acks`"),
            (
                "topic.request.required.acks=1",
                "`topic.request.required.acks`",
            ),
            ("partitioner=random", "`partitioner`"),
            ("topic.partitioner=random", "`topic.partitioner`"),
            ("retries=0", "`retries`"),
            ("message.send.max.retries=0", "`message.send.max.retries`"),
            ("request.timeout.ms=1", "`request.timeout.ms`"),
            ("socket.timeout.ms=1", "`socket.timeout.ms`"),
            (
                "queue.buffering.backpressure.threshold=1",
                "`queue.buffering.backpressure.threshold`",
            ),
            (
                "enable.gapless.guarantee=false",
                "`enable.gapless.guarantee`",
            ),
            ("linger.ms=1,linger.ms=2", "`linger.ms` is set twice"),
            ("sasl.password", "item 1"),
            ("Sasl.Password=secret-value", "item 1"),
        ] {
            let err = with(bad).unwrap_err().to_string();
            assert!(err.starts_with("ORDERD_KAFKA_CONFIG"), "{err}");
            assert!(err.contains(named), "{bad}: {err}");
            assert!(!err.contains("secret-value"), "{err}");
        }
        for fine in [
            "ssl.ca.location=/etc/ssl/ca.pem,ssl.endpoint.identification.algorithm=https",
            "sasl.mechanism=SCRAM-SHA-512,sasl.username=u,sasl.password=p",
            "compression.type=zstd,batch.size=100000,queue.buffering.max.ms=2",
            "client.id=orders-eu,client.rack=eu-1a,debug=broker",
        ] {
            assert!(with(fine).is_ok(), "{fine}");
        }
    }

    #[test]
    fn response_keys_parse_in_order_and_bad_ones_are_named_without_their_bytes() {
        const K1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        const K2: &str = "//////////////////////////////////////////8";
        let keys = |value: &str| {
            config(&[("DATABASE_URL", "x"), ("ORDERD_RESPONSE_KEYS", value)])
                .map(|c| c.idempotency.response_keys)
                .map_err(|e| e.to_string())
        };
        let parsed = keys(&format!(" k2:{K2} , k1:{K1}")).unwrap();
        assert_eq!(
            parsed.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
            ["k2", "k1"]
        );
        assert_eq!(parsed[1].material()[31], 31);
        assert_eq!(parsed[0].material(), &[0xff; 32]);
        assert!(!format!("{parsed:?}").contains(K1) && format!("{parsed:?}").contains("k1"));
        assert!(keys("").unwrap().is_empty());
        let short = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHg==";
        for (bad, says) in [
            (
                format!("k1:{short}"),
                "`k1` is not the base64 of exactly 32 bytes",
            ),
            ("k1:not*base64".to_string(), "`k1` is not the base64"),
            (format!("k1:{K1},k1:{K2}"), "`k1` is given twice"),
            (K1.to_string(), "item 1 is not `id:base64"),
            (format!(":{K1}"), "item 1 needs an id"),
            (format!("k 1:{K1}"), "item 1 needs an id"),
        ] {
            let err = keys(&bad).unwrap_err();
            assert!(err.starts_with("ORDERD_RESPONSE_KEYS"), "{err}");
            assert!(err.contains(says), "{bad}: {err}");
            assert!(!err.contains(K1) && !err.contains(short), "{err}");
        }
    }

    #[test]
    fn the_markdown_table_lists_every_setting_once() {
        let table = markdown_table();
        for s in SETTINGS {
            assert_eq!(table.matches(&format!("| `{}` |", s.name)).count(), 1);
        }
    }
}
