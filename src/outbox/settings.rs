//! The relay's settings (the sinks' own are in [`super::sink`]).

use std::time::Duration;

use crate::config::{ConfigError, Kind, parse, range, settings};

settings! {
    /// Settings of the outbox relay.
    pub struct OutboxConfig {
        /// Events claimed per round.
        batch_size: u32 = parse::number [OUTBOX_BATCH_SIZE, "ORDERD_OUTBOX_BATCH_SIZE", Some("100"), range(1, 1000), "events claimed per relay round"],
        /// Rounds in flight at once in one relay.
        parallel_rounds: u32 = parse::number [OUTBOX_PARALLEL_ROUNDS, "ORDERD_OUTBOX_PARALLEL_ROUNDS", Some("2"), range(1, 32), "rounds (claim, publish, mark) one relay runs at once, so that a backlog keeps the database and the bus busy together; in `serve` each has a database connection of its own, apart from the API's pool"],
        poll: Duration = parse::millis [OUTBOX_POLL_MS, "ORDERD_OUTBOX_POLL_MS", Some("1000"), range(1, 60_000), "fallback poll interval (commits wake the relay through LISTEN/NOTIFY)"],
        max_attempts: u32 = parse::number [OUTBOX_MAX_ATTEMPTS, "ORDERD_OUTBOX_MAX_ATTEMPTS", Some("10"), range(1, 1000), "rejections of the event itself (by SNS, or by Kafka for the one record) before it is DEAD (a permanent one: at once)"],
        backoff_initial: Duration = parse::millis [OUTBOX_BACKOFF_INITIAL_MS, "ORDERD_OUTBOX_BACKOFF_INITIAL_MS", Some("2000"), range(1, 3_600_000), "first retry delay; doubles per failure, with jitter"],
        backoff_max: Duration = parse::millis [OUTBOX_BACKOFF_MAX_MS, "ORDERD_OUTBOX_BACKOFF_MAX_MS", Some("60000"), range(1, 86_400_000), "longest retry delay (not below the initial one)"],
        /// Bound on one publish call (SNS) or one record's delivery (Kafka).
        publish_timeout: Duration = parse::millis [OUTBOX_PUBLISH_TIMEOUT_MS, "ORDERD_OUTBOX_PUBLISH_TIMEOUT_MS", Some("10000"), range(100, 120_000), "bound on one SNS call, or on a Kafka record's delivery (its `message.timeout.ms`)"],
        /// Whether the relay analyses `outbox_event` when a backlog outgrew the
        /// planner's statistics (see [`super::statistics`]).
        analyze: bool = parse::switch [OUTBOX_ANALYZE, "ORDERD_OUTBOX_ANALYZE", Some("on"), Kind::Switch, "the relay runs `ANALYZE outbox_event` when more than half of the table changed, or it more than doubled, since its last one (a bulk import, a re-drive), so that its statements keep their plans (on Citus, of each shard that did, on its worker); needs the table's or the database's owner"],
        /// How long published rows are kept before the purge deletes them.
        retention: Duration = parse::secs [OUTBOX_RETENTION_SECS, "ORDERD_OUTBOX_RETENTION_SECS", Some("86400"), range(1, 31_536_000), "how long published events are kept before the purge deletes them"],
    }
    check = OutboxConfig::check;
}

impl OutboxConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if self.backoff_max < self.backoff_initial {
            return Err(ConfigError::new(format!(
                "{} must not be below {}",
                OUTBOX_BACKOFF_MAX_MS.name, OUTBOX_BACKOFF_INITIAL_MS.name
            )));
        }
        Ok(())
    }
}
