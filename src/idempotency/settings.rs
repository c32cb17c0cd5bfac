//! The idempotency guard's settings.

use std::time::Duration;

use super::seal::{ResponseKey, parse_response_keys};
use crate::config::{ConfigError, Env, Kind, Setting, parse, range, settings};

settings! {
    /// Settings of the idempotency guard.
    pub struct IdempotencyConfig {
        /// How long a completed key is remembered after completion.
        ttl: Duration = parse::secs [IDEMPOTENCY_TTL_SECS, "ORDERD_IDEMPOTENCY_TTL_SECS", Some("86400"), range(1, 31_536_000), "how long a completed key is remembered after its request claimed it (each stored answer says until when: `Idempotency-Key-Expires`)"],
        /// How long a PROCESSING claim is owned before another request may take it over.
        lease: Duration = parse::secs [LEASE_SECS, "ORDERD_LEASE_SECS", Some("30"), range(1, 3600), "how long a PROCESSING claim is owned before another request may take it over"],
        /// How long a duplicate of an in-flight request waits for it before answering 409.
        inflight_wait: Duration = parse::millis [INFLIGHT_WAIT_MS, "ORDERD_INFLIGHT_WAIT_MS", Some("200"), range(0, 10_000), "how long a duplicate of an in-flight request waits for it before answering 409"],
        /// Bytes of completed responses kept in memory for replays; 0: none.
        replay_cache_bytes: u64 = parse::number [REPLAY_CACHE_BYTES, "ORDERD_REPLAY_CACHE_BYTES", Some("6291456"), range(0, 4_294_967_295), "memory for completed responses that replays are answered from without a database round trip, about 1.5 KiB each (least recently used go first); `0` turns the cache off"],
        /// The keys stored responses are sealed with: the first seals, every one opens;
        /// none: stored as they are.
        response_keys: Vec<ResponseKey> = keys [RESPONSE_KEYS, "ORDERD_RESPONSE_KEYS", None, Kind::Secret, "keys that seal stored responses at rest with AES-256-GCM, each record under its own key derived from the first one with HKDF-SHA256 and a random salt, as comma-separated `id:base64` (32 bytes each, ids of 1 to 64 of `A-Za-z0-9._-`): the first seals new records, every one opens; unset: stored as they are. Rotate by putting a new key first, running `orderd keys rewrap`, then dropping the old one"],
        /// Whether a body stored in clear is refused (503) while keys are configured.
        refuse_clear_records: bool = parse::last_choice [RESPONSE_CLEAR, "ORDERD_RESPONSE_CLEAR", Some("serve"), Kind::Choice(&["serve", "refuse"]), "what a replay does with a stored response kept in clear while `ORDERD_RESPONSE_KEYS` is set: `serve` it (records stored before keys were turned on), or `refuse` it with 503 once `orderd keys rewrap` has sealed every record, so that a clear body written into the table is never served"],
        /// Whether a body sealed in a layout before the current one (every layout
        /// before 4: bound to less of the answer, or sealed under the configured key
        /// with a random nonce) is refused (503).
        refuse_old_layouts: bool = parse::last_choice [RESPONSE_OLD_LAYOUTS, "ORDERD_RESPONSE_OLD_LAYOUTS", Some("serve"), Kind::Choice(&["serve", "refuse"]), "what a replay does with a stored response sealed in a layout before the current one (4: a key derived per record): layouts 1 and 2 bind less of the answer (not its expiry), and 1 to 3 seal under the configured key itself with random nonces, 2^32 of which one key allows; `serve` it, or `refuse` it with 503 once `orderd keys rewrap` has moved every record to the current layout"],
    }
    check = IdempotencyConfig::check;
}

fn keys(env: &Env<'_>, s: &Setting) -> Result<Vec<ResponseKey>, ConfigError> {
    parse_response_keys(s.name, env.text(s).as_deref().unwrap_or(""))
}

impl IdempotencyConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if self.inflight_wait >= self.lease {
            return Err(ConfigError::new(format!(
                "{} must be shorter than {}",
                INFLIGHT_WAIT_MS.name, LEASE_SECS.name
            )));
        }
        Ok(())
    }
}
