//! The whole configuration of a process: each owner's settings put together, and the
//! few that belong to the process itself.

use crate::{
    api::{HttpConfig, TenantLimits},
    auth::JwtConfig,
    config::{ConfigError, Env, Kind, Setting, markdown_table, parse, range, settings},
    db::DbConfig,
    idempotency::{IdempotencyConfig, settings::RESPONSE_KEYS},
    outbox::{
        OutboxConfig,
        sink::{
            kafka::{self, KafkaConfig, KafkaSettings},
            sns::{self, SnsConfig},
        },
    },
    reconcile::ReconcileConfig,
    retention::RetentionConfig,
    telemetry::LogConfig,
};

settings! {
    /// What the process runs, and what it will not run without.
    pub struct ProcessConfig {
        /// Whether the process stops at start while no key seals stored responses.
        response_keys_required: bool = parse::switch [RESPONSE_KEYS_REQUIRED, "ORDERD_RESPONSE_KEYS_REQUIRED", Some("off"), Kind::Switch, "`on`: every command that reads the whole configuration (all but `token` and `openapi`) stops at start while `ORDERD_RESPONSE_KEYS` is unset, instead of storing responses, which hold personal data, in clear; the Kubernetes manifests turn it on"],
        /// Worker threads of the runtime; `None`: one per core.
        worker_threads: Option<usize> = threads [WORKER_THREADS, "ORDERD_WORKER_THREADS", Some("0"), range(0, 1024), "threads that run requests, the relay and the jobs; `0`: one per CPU core. On a small machine shared with PostgreSQL, `1` spends less CPU per request (fewer wake-ups between threads)"],
        /// Whether `serve` runs a relay in process.
        relay_in_serve: bool = parse::switch [RELAY, "ORDERD_RELAY", Some("on"), Kind::Switch, "`off`: `serve` runs no relay (run `orderd relay` elsewhere)"],
    }
}

fn threads(env: &Env<'_>, s: &Setting) -> Result<Option<usize>, ConfigError> {
    Ok(Some(parse::number::<usize>(env, s)?).filter(|&n| n > 0))
}

/// Every setting, grouped by owner, in the order docs/configuration.md lists them.
pub const SETTINGS: &[&[&Setting]] = &[
    DbConfig::SETTINGS,
    HttpConfig::SETTINGS,
    TenantLimits::SETTINGS,
    JwtConfig::SETTINGS,
    IdempotencyConfig::SETTINGS,
    ProcessConfig::SETTINGS,
    SnsConfig::SETTINGS,
    KafkaSettings::SETTINGS,
    OutboxConfig::SETTINGS,
    RetentionConfig::SETTINGS,
    ReconcileConfig::SETTINGS,
    LogConfig::SETTINGS,
];

/// The configuration table of docs/configuration.md.
pub fn settings_table() -> String {
    markdown_table(&SETTINGS.concat())
}

/// Everything `orderd` reads from its environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub db: DbConfig,
    pub http: HttpConfig,
    pub tenant_limits: TenantLimits,
    pub jwt: JwtConfig,
    pub idempotency: IdempotencyConfig,
    pub process: ProcessConfig,
    pub sns: SnsConfig,
    /// Kafka, when it is set.
    pub kafka: Option<KafkaConfig>,
    pub outbox: OutboxConfig,
    pub retention: RetentionConfig,
    pub reconcile: ReconcileConfig,
    pub log: LogConfig,
}

/// Where a relay publishes.
#[derive(Debug, Clone, Copy)]
pub enum Sink<'a> {
    /// An SNS topic, by ARN.
    Sns(&'a str),
    Kafka(&'a KafkaConfig),
}

impl Config {
    /// Reads the process environment (after `.env`, if any, was loaded by `main`).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup`, so tests can build a configuration without
    /// touching the process environment.
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env::new(lookup);
        let config = Config {
            db: DbConfig::read(&env)?,
            http: HttpConfig::read(&env)?,
            tenant_limits: TenantLimits::read(&env)?,
            jwt: JwtConfig::read(&env)?,
            idempotency: IdempotencyConfig::read(&env)?,
            process: ProcessConfig::read(&env)?,
            sns: SnsConfig::read(&env)?,
            kafka: KafkaSettings::read(&env)?.config(),
            outbox: OutboxConfig::read(&env)?,
            retention: RetentionConfig::read(&env)?,
            reconcile: ReconcileConfig::read(&env)?,
            log: LogConfig::read(&env)?,
        };
        config.check()?;
        Ok(config)
    }

    /// Rules across owners' settings.
    fn check(&self) -> Result<(), ConfigError> {
        // A Secret recreated from a store that lacks the keys, or a key line deleted
        // instead of filled in, would otherwise go unnoticed: records would be stored in
        // clear from then on, and only a look at the table would tell.
        if self.process.response_keys_required && self.idempotency.response_keys.is_empty() {
            return Err(ConfigError::new(format!(
                "{} is required: {} is on, and without a key stored responses, which hold \
                 personal data, would be kept in clear (docs/operations.md, \"Making secrets\")",
                RESPONSE_KEYS.name, RESPONSE_KEYS_REQUIRED.name
            )));
        }
        Ok(())
    }

    /// Where a relay publishes: exactly one sink, SNS or Kafka, wherever a relay runs.
    pub fn relay_sink(&self) -> Result<Sink<'_>, ConfigError> {
        match (&self.sns.topic_arn, &self.kafka) {
            (Some(arn), None) => Ok(Sink::Sns(arn)),
            (None, Some(kafka)) => Ok(Sink::Kafka(kafka)),
            (Some(_), Some(_)) => Err(ConfigError::new(format!(
                "{} and {} are both set: a relay publishes to exactly one sink, SNS or Kafka",
                sns::SNS_TOPIC_ARN.name,
                kafka::settings::KAFKA_BROKERS.name
            ))),
            (None, None) => Err(ConfigError::new(format!(
                "{} (SNS) or {} with {} (Kafka) is required to run the relay (or set {}=off)",
                sns::SNS_TOPIC_ARN.name,
                kafka::settings::KAFKA_BROKERS.name,
                kafka::settings::KAFKA_TOPIC.name,
                RELAY.name
            ))),
        }
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
    threads(&Env::new(lookup), &WORKER_THREADS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Kind, examples, published};
    use std::{collections::HashMap, time::Duration};

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
        assert_eq!(c.http.bind, "127.0.0.1:8080");
        assert_eq!(c.idempotency.ttl, Duration::from_secs(86_400));
        assert_eq!(c.idempotency.lease, Duration::from_secs(30));
        assert_eq!(c.idempotency.inflight_wait, Duration::from_millis(200));
        assert_eq!(c.outbox.batch_size, 100);
        assert_eq!(c.outbox.max_attempts, 10);
        assert_eq!(c.db.pool_size, 16);
        assert!(c.process.relay_in_serve && c.db.migrate && !c.log.json);
    }

    #[test]
    fn every_default_is_valid_for_its_own_kind() {
        // Parsing with only the required variable set exercises every default above;
        // this checks the ones that parse lazily (none today) cannot drift either.
        for s in SETTINGS.concat() {
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
        for s in SETTINGS.concat() {
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
        let kafka = c.kafka.as_ref().unwrap();
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
    fn the_secrets_the_manifests_publish_do_not_start() {
        let before = [
            (
                "ORDERD_JWT_HS256_SECRET",
                "change-me-to-a-secret-of-at-least-32-bytes",
            ),
            (
                "DATABASE_URL",
                "postgres://orderd:change-me@postgres.example.internal:5432/orderd",
            ),
            (
                "ORDERD_JWT_HS256_SECRET",
                "a-secret-of-our-own-0123456789abcdef,change-me-to-a-secret-of-at-least-32-bytes",
            ),
        ];
        // The example Secret's values before decision 179.
        for (name, value) in before {
            let err = config(&[("DATABASE_URL", "x"), (name, value)])
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(name), "{err}");
            assert!(err.contains("published"), "{err}");
            assert!(!err.contains("change-me"), "{err}");
        }
        // `orderd token` reads the JWT settings alone: it mints nothing with it either.
        let jwt = crate::auth::JwtConfig::read(&Env::new(&|name| {
            (name == "ORDERD_JWT_HS256_SECRET")
                .then(|| "change-me-to-a-secret-of-at-least-32-bytes".to_string())
        }))
        .unwrap_err()
        .to_string();
        assert!(
            jwt.starts_with("ORDERD_JWT_HS256_SECRET holds a value published"),
            "{jwt}"
        );
    }

    /// Every secret-like value in the manifests, the README, the docs, the k6 scripts
    /// and `examples/` (what counts: `config::examples`) is refused at start, naming
    /// its setting; a new one fails here with the digest to list until it is.
    #[test]
    fn every_secret_the_examples_publish_is_refused_at_start() {
        let secret_settings: Vec<&str> = SETTINGS
            .concat()
            .iter()
            .filter(|s| matches!(s.kind, Kind::Secret))
            .map(|s| s.name)
            .collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let found = examples::gather(root, &secret_settings);
        // The gathering has teeth: the example Secret gives the HS256 secret a value.
        assert!(
            found
                .iter()
                .any(|f| f.file == "deploy/kubernetes/secret.yaml"
                    && f.name == "ORDERD_JWT_HS256_SECRET"),
            "nothing gathered from deploy/kubernetes/secret.yaml: {found:?}"
        );
        let mut started = Vec::new();
        for f in &found {
            for secret in &f.secrets {
                if !published::is_published(secret) {
                    started.push(format!(
                        "{}:{}: a value of {} is not refused: list \"{}\" in src/config/published.rs",
                        f.file,
                        f.line,
                        f.name,
                        published::digest(secret)
                    ));
                }
            }
            if secret_settings.contains(&f.name.as_str()) {
                match config(&[("DATABASE_URL", "x"), (&f.name, &f.value)]) {
                    Err(e) if e.to_string().starts_with(&f.name) => {}
                    other => started.push(format!(
                        "{}:{}: {} as written there is not refused naming it: {:?}",
                        f.file,
                        f.line,
                        f.name,
                        other.map(|_| "it starts").map_err(|e| e.to_string())
                    )),
                }
            }
        }
        assert!(started.is_empty(), "{}", started.join("\n"));
    }

    #[test]
    fn a_deployment_that_requires_keys_does_not_start_without_them() {
        const KEY: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        let with = |vars: &[(&str, &str)]| {
            let mut all = vec![("DATABASE_URL", "x")];
            all.extend_from_slice(vars);
            config(&all).map(|_| ()).map_err(|e| e.to_string())
        };
        for unset in [&[][..], &[("ORDERD_RESPONSE_KEYS", " ")]] {
            let mut vars = vec![("ORDERD_RESPONSE_KEYS_REQUIRED", "on")];
            vars.extend_from_slice(unset);
            let err = with(&vars).unwrap_err();
            assert!(err.starts_with("ORDERD_RESPONSE_KEYS is required"), "{err}");
            assert!(err.contains("ORDERD_RESPONSE_KEYS_REQUIRED is on"), "{err}");
        }
        assert_eq!(
            with(&[
                ("ORDERD_RESPONSE_KEYS_REQUIRED", "on"),
                ("ORDERD_RESPONSE_KEYS", KEY)
            ]),
            Ok(())
        );
        // Off by default: a developer's process stores in clear, as the contract says.
        assert_eq!(with(&[]), Ok(()));
    }

    #[test]
    fn the_markdown_table_lists_every_setting_once() {
        let table = settings_table();
        for s in SETTINGS.concat() {
            assert_eq!(table.matches(&format!("| `{}` |", s.name)).count(), 1);
        }
    }
}
