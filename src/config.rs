//! Typed settings read from the environment (contract section 1).
//!
//! Every setting is parsed once at start-up; a missing or malformed value stops the
//! process with one line naming the variable. Secrets are wrapped in [`Secret`] so that
//! no `Debug` or log line can print them.

use std::{fmt, net::SocketAddr, path::PathBuf, str::FromStr, time::Duration};

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

/// How tokens are verified and minted.
#[derive(Clone, Debug, Default)]
pub struct JwtConfig {
    pub hs256_secret: Option<Secret>,
    pub public_key_file: Option<PathBuf>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
}

impl JwtConfig {
    /// The JWT settings alone: `orderd token` needs them without a database.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(&lookup);
        let jwt = JwtConfig {
            hs256_secret: env.string("ORDERD_JWT_HS256_SECRET").map(Secret::new),
            public_key_file: env.string("ORDERD_JWT_PUBLIC_KEY_FILE").map(PathBuf::from),
            issuer: env.string("ORDERD_JWT_ISSUER"),
            audience: env.string("ORDERD_JWT_AUDIENCE"),
        };
        if let Some(secret) = &jwt.hs256_secret
            && secret.expose().len() < 16
        {
            return Err(ConfigError(
                "ORDERD_JWT_HS256_SECRET is too short: use at least 16 characters".into(),
            ));
        }
        Ok(jwt)
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
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(86_400),
            lease: Duration::from_secs(30),
            inflight_wait: Duration::from_millis(200),
        }
    }
}

/// Settings of the outbox relay (used by the relay; parsed here so a typo fails at start).
#[derive(Clone, Debug)]
pub struct OutboxConfig {
    pub relay_enabled: bool,
    pub sns_topic_arn: Option<String>,
    pub batch_size: u32,
    pub poll: Duration,
    pub max_attempts: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Bound on one SNS call (`ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS`).
    pub publish_timeout: Duration,
    /// How long published rows are kept before the purge deletes them
    /// (`ORDERD_OUTBOX_RETENTION_SECS`).
    pub retention: Duration,
}

impl OutboxConfig {
    /// The topic, which a running relay cannot do without.
    pub fn topic_arn(&self) -> Result<&str, ConfigError> {
        self.sns_topic_arn.as_deref().ok_or_else(|| {
            ConfigError::new(
                "ORDERD_SNS_TOPIC_ARN is required to run the relay (or set ORDERD_RELAY=off)",
            )
        })
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            relay_enabled: true,
            sns_topic_arn: None,
            batch_size: 100,
            poll: Duration::from_millis(1000),
            max_attempts: 10,
            backoff_initial: Duration::from_millis(2000),
            backoff_max: Duration::from_millis(60_000),
            publish_timeout: Duration::from_millis(10_000),
            retention: Duration::from_secs(86_400),
        }
    }
}

/// Everything `orderd` reads from its environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: Secret,
    pub bind: String,
    pub migrate_on_start: bool,
    pub jwt: JwtConfig,
    pub idempotency: IdempotencyConfig,
    pub outbox: OutboxConfig,
    /// `json` or `text` log lines.
    pub log_json: bool,
    /// Connections in the pool (`ORDERD_DB_POOL_SIZE`, default 16).
    pub db_pool_size: u32,
    /// How often `serve` runs the retention purge (`ORDERD_PURGE_INTERVAL_SECS`, default 60).
    pub purge_interval: Duration,
    /// Where `orderd relay` serves `/metrics` (`ORDERD_METRICS_BIND`, default 127.0.0.1:9091).
    pub metrics_bind: String,
}

impl Config {
    /// Reads the process environment (after `.env`, if any, was loaded by `main`).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup`, so tests can build a configuration without
    /// touching the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Env(&lookup);
        let database_url = env.string("DATABASE_URL").ok_or_else(|| {
            ConfigError("DATABASE_URL is required (a PostgreSQL connection string)".into())
        })?;
        let bind = env
            .string("ORDERD_BIND")
            .unwrap_or_else(|| "127.0.0.1:8080".into());
        validate_bind("ORDERD_BIND", &bind)?;
        let defaults_idem = IdempotencyConfig::default();
        let defaults_outbox = OutboxConfig::default();
        let jwt = JwtConfig::from_lookup(&lookup)?;
        let config = Config {
            database_url: Secret::new(database_url),
            bind,
            migrate_on_start: env.switch("ORDERD_MIGRATE", true)?,
            jwt,
            idempotency: IdempotencyConfig {
                ttl: Duration::from_secs(env.number(
                    "ORDERD_IDEMPOTENCY_TTL_SECS",
                    defaults_idem.ttl.as_secs(),
                    1,
                )?),
                lease: Duration::from_secs(env.number(
                    "ORDERD_LEASE_SECS",
                    defaults_idem.lease.as_secs(),
                    1,
                )?),
                inflight_wait: Duration::from_millis(env.number(
                    "ORDERD_INFLIGHT_WAIT_MS",
                    defaults_idem.inflight_wait.as_millis() as u64,
                    0,
                )?),
            },
            outbox: OutboxConfig {
                relay_enabled: env.switch("ORDERD_RELAY", true)?,
                sns_topic_arn: env.string("ORDERD_SNS_TOPIC_ARN"),
                batch_size: env.number(
                    "ORDERD_OUTBOX_BATCH_SIZE",
                    defaults_outbox.batch_size,
                    1,
                )?,
                poll: Duration::from_millis(env.number("ORDERD_OUTBOX_POLL_MS", 1000, 1)?),
                max_attempts: env.number(
                    "ORDERD_OUTBOX_MAX_ATTEMPTS",
                    defaults_outbox.max_attempts,
                    1,
                )?,
                backoff_initial: Duration::from_millis(env.number(
                    "ORDERD_OUTBOX_BACKOFF_INITIAL_MS",
                    2000,
                    1,
                )?),
                backoff_max: Duration::from_millis(env.number(
                    "ORDERD_OUTBOX_BACKOFF_MAX_MS",
                    60_000,
                    1,
                )?),
                publish_timeout: Duration::from_millis(env.number(
                    "ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS",
                    10_000,
                    100,
                )?),
                retention: Duration::from_secs(env.number(
                    "ORDERD_OUTBOX_RETENTION_SECS",
                    86_400,
                    1,
                )?),
            },
            log_json: match env.string("ORDERD_LOG_FORMAT").as_deref() {
                None | Some("text") => false,
                Some("json") => true,
                Some(other) => {
                    return Err(ConfigError(format!(
                        "ORDERD_LOG_FORMAT must be `text` or `json`, not `{other}`"
                    )));
                }
            },
            db_pool_size: env.number("ORDERD_DB_POOL_SIZE", 16, 1)?,
            purge_interval: Duration::from_secs(env.number("ORDERD_PURGE_INTERVAL_SECS", 60, 1)?),
            metrics_bind: env
                .string("ORDERD_METRICS_BIND")
                .unwrap_or_else(|| "127.0.0.1:9091".into()),
        };
        validate_bind("ORDERD_METRICS_BIND", &config.metrics_bind)?;
        if config.outbox.backoff_max < config.outbox.backoff_initial {
            return Err(ConfigError(
                "ORDERD_OUTBOX_BACKOFF_MAX_MS must not be below ORDERD_OUTBOX_BACKOFF_INITIAL_MS"
                    .into(),
            ));
        }
        Ok(config)
    }
}

/// Checks a listen address from the variable `name`.
fn validate_bind(name: &str, bind: &str) -> Result<(), ConfigError> {
    SocketAddr::from_str(&bind_address(bind))
        .map(|_| ())
        .map_err(|_| ConfigError(format!("{name} must be host:port, not `{bind}`")))
}

/// The listen address with the `:PORT` shorthand ("any free port on loopback" for
/// `:0`) expanded.
pub fn bind_address(bind: &str) -> String {
    if bind.starts_with(':') {
        format!("127.0.0.1{bind}")
    } else {
        bind.to_string()
    }
}

struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    /// A set, non-empty value.
    fn string(&self, name: &str) -> Option<String> {
        (self.0)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn number<T>(&self, name: &str, default: T, min: T) -> Result<T, ConfigError>
    where
        T: FromStr + PartialOrd + fmt::Display + Copy,
    {
        match self.string(name) {
            None => Ok(default),
            Some(raw) => match raw.parse::<T>() {
                Ok(v) if v >= min => Ok(v),
                _ => Err(ConfigError(format!(
                    "{name} must be a whole number of at least {min}, not `{raw}`"
                ))),
            },
        }
    }

    fn switch(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.string(name).map(|v| v.to_ascii_lowercase()) {
            None => Ok(default),
            Some(v) => match v.as_str() {
                "on" | "true" | "1" | "yes" => Ok(true),
                "off" | "false" | "0" | "no" => Ok(false),
                _ => Err(ConfigError(format!(
                    "{name} must be `on` or `off`, not `{v}`"
                ))),
            },
        }
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
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_follow_the_contract() {
        let c = config(&[("DATABASE_URL", "postgres://x")]).unwrap();
        assert_eq!(c.bind, "127.0.0.1:8080");
        assert_eq!(c.idempotency.ttl, Duration::from_secs(86_400));
        assert_eq!(c.idempotency.lease, Duration::from_secs(30));
        assert_eq!(c.idempotency.inflight_wait, Duration::from_millis(200));
        assert_eq!(c.outbox.batch_size, 100);
        assert_eq!(c.outbox.max_attempts, 10);
        assert!(c.outbox.relay_enabled && c.migrate_on_start);
    }

    #[test]
    fn a_missing_database_url_names_the_variable() {
        let err = config(&[]).unwrap_err().to_string();
        assert!(err.starts_with("DATABASE_URL"), "{err}");
    }

    #[test]
    fn a_malformed_number_names_the_variable() {
        let err = config(&[("DATABASE_URL", "x"), ("ORDERD_LEASE_SECS", "soon")])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("ORDERD_LEASE_SECS"), "{err}");
    }

    #[test]
    fn a_malformed_switch_or_bind_names_the_variable() {
        let err = config(&[("DATABASE_URL", "x"), ("ORDERD_RELAY", "maybe")])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("ORDERD_RELAY"), "{err}");
        let err = config(&[("DATABASE_URL", "x"), ("ORDERD_BIND", "nowhere")])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("ORDERD_BIND"), "{err}");
        assert!(config(&[("DATABASE_URL", "x"), ("ORDERD_BIND", ":0")]).is_ok());
    }

    #[test]
    fn secrets_never_print() {
        let c = config(&[
            ("DATABASE_URL", "postgres://u:pw@h/db"),
            ("ORDERD_JWT_HS256_SECRET", "very-secret-value-123"),
        ])
        .unwrap();
        let printed = format!("{c:?}");
        assert!(
            !printed.contains("very-secret-value-123") && !printed.contains("pw@h"),
            "{printed}"
        );
    }
}
