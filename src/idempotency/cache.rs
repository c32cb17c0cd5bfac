//! The replay fast path: completed responses kept in memory, so that a retry is
//! answered without a database round trip.
//!
//! An entry is made by the first replay that reads the record from the database, not
//! by the request that completed it: most requests are never sent again, so that
//! would cost every create for the few that are, and behind a load balancer the retry
//! may reach another process anyway.
//!
//! Safe because a COMPLETED record never changes until it expires: the stored
//! response, its fingerprint and its expiry are fixed at completion. The cache keeps
//! exactly that and nothing that can still change (no PROCESSING record is ever
//! cached). What it must honour:
//!
//! - **Expiry on the database's clock.** An entry lives for the remaining lifetime the
//!   database gave the record (`expires_at - clock_timestamp()` as of the statement
//!   that read or completed it), counted down on this process's monotonic clock from
//!   *before* that statement was sent. The entry therefore always dies no later than
//!   the row does; after that the request goes to the database, which treats an
//!   expired key as new.
//! - **The fingerprint.** A hit with another fingerprint is the same 422 the database
//!   path answers.
//! - **Tenant isolation.** The key is the record's primary key: tenant, endpoint and
//!   Idempotency-Key.
//! - **Memory.** Bounded in bytes (`ORDERD_REPLAY_CACHE_BYTES`), weighing each entry
//!   by what it holds; least recently used entries go first.
//! - **An operator's forgetting.** A record deleted by `orderd idempotency forget` (or
//!   by a tenant's erasure) must not be replayed from memory afterwards. Whoever
//!   deletes notifies every process; each drops the key ([`ReplayCache::forget`]) or
//!   everything ([`ReplayCache::clear`]). The cache answers and keeps entries only
//!   while every listening session it depends on ([`ReplayCache::depend_on`]) was heard
//!   from within its bound (`db::Liveness`): a session that went down, or silent
//!   without a word, stops the cache within the bound, which is also how long a
//!   forgetting waits after its commit before it reports success. A session that comes
//!   back empties the cache first. A read that was already under way when a key was
//!   forgotten would put the old answer back after the forgetting: every forgetting
//!   moves an epoch on, and an entry made from a read that began in an earlier epoch is
//!   not kept.

use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use moka::{Expiry, sync::Cache};
use uuid::Uuid;

use super::{Fingerprint, record::StoredResponse, store::Scope};
use crate::db::Liveness;

/// What an entry costs beyond its variable parts: the key and value structs, the
/// `Arc`, the allocator's headers and its fragmentation, and moka's own bookkeeping
/// (its access-order and expiry structures). Measured: filling the cache with created
/// orders' responses grew the process by about 1,550 bytes of resident memory per
/// entry for about 350 bytes of key and response, so that the setting bounds what the
/// process really holds.
const ENTRY_OVERHEAD: usize = 1200;

/// The primary key of an idempotency record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    tenant: Uuid,
    endpoint: &'static str,
    idem_key: Box<str>,
}

impl Key {
    fn of(scope: &Scope) -> Self {
        Self {
            tenant: scope.tenant.0,
            endpoint: scope.endpoint,
            idem_key: scope.key.as_str().into(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    fingerprint: Fingerprint,
    response: StoredResponse,
    /// When the database forgets the key (told to the client with every replay).
    expires_at: DateTime<Utc>,
    /// On the monotonic clock: when the database's row expires, or a little before.
    valid_until: Instant,
}

/// What the cache says about a request.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// Nothing known (or known and expired): ask the database.
    Miss,
    /// The same request completed before: its response.
    Replay(StoredResponse, DateTime<Utc>),
    /// The key completed with another request: 422.
    Conflict,
}

/// Tells moka when an entry expires, so that expired entries leave memory by
/// themselves instead of waiting to be pushed out.
struct UntilRowExpires;

impl Expiry<Key, Arc<Entry>> for UntilRowExpires {
    fn expire_after_create(&self, _: &Key, entry: &Arc<Entry>, now: Instant) -> Option<Duration> {
        Some(entry.valid_until.saturating_duration_since(now))
    }
}

/// Completed responses by record key; cheap to clone (one shared cache).
#[derive(Clone)]
pub struct ReplayCache {
    entries: Option<Cache<Key, Arc<Entry>>>,
    freshness: Arc<Freshness>,
}

/// Whether what the cache holds can still be trusted (see the module's doc).
#[derive(Debug)]
struct Freshness {
    /// Moved on by every forgetting: an entry is kept only when no forgetting happened
    /// since the read it was made from began.
    epoch: AtomicU64,
    /// The listening sessions whose news the cache must have heard, given once: it
    /// answers and keeps entries only while each was heard from within its bound.
    /// Unset: the cache depends on nothing it could miss (a process without
    /// listeners, tests).
    sources: OnceLock<Vec<Arc<Liveness>>>,
}

impl Freshness {
    fn trusted(&self, now: Instant) -> bool {
        self.sources
            .get()
            .is_none_or(|sources| sources.iter().all(|source| source.fresh(now)))
    }
}

/// When a read for the cache began: its monotonic instant and the cache's epoch.
#[derive(Debug, Clone, Copy)]
pub struct ReadStart {
    sent: Instant,
    epoch: u64,
}

impl ReplayCache {
    /// A cache of at most `max_bytes`; `0` turns it off (every lookup misses).
    pub fn new(max_bytes: u64) -> Self {
        let entries = (max_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|key: &Key, entry: &Arc<Entry>| {
                    let bytes = ENTRY_OVERHEAD
                        + key.idem_key.len()
                        + entry.response.body.len()
                        + entry.response.location.as_ref().map_or(0, String::len)
                        + entry.response.content_type.as_ref().map_or(0, String::len);
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .expire_after(UntilRowExpires)
                .build()
        });
        Self {
            entries,
            freshness: Arc::new(Freshness {
                epoch: AtomicU64::new(0),
                sources: OnceLock::new(),
            }),
        }
    }

    /// Call just before a statement whose answer may be remembered is sent.
    pub fn read_starts(&self) -> ReadStart {
        ReadStart {
            sent: Instant::now(),
            epoch: self.freshness.epoch.load(SeqCst),
        }
    }

    /// What is known about `scope` for a request with `fingerprint`, at `now`.
    pub fn lookup(&self, scope: &Scope, fingerprint: &Fingerprint, now: Instant) -> Lookup {
        let Some(entries) = &self.entries else {
            return Lookup::Miss;
        };
        if !self.freshness.trusted(now) {
            return Lookup::Miss;
        }
        let key = Key::of(scope);
        let Some(entry) = entries.get(&key) else {
            return Lookup::Miss;
        };
        if entry.valid_until <= now {
            entries.invalidate(&key);
            return Lookup::Miss;
        }
        if entry.fingerprint == *fingerprint {
            Lookup::Replay(entry.response.clone(), entry.expires_at)
        } else {
            Lookup::Conflict
        }
    }

    /// Remembers a completed record that expires at `expires_at`: `remaining` is its
    /// lifetime as the database saw it, `read` when the statement that saw it was sent.
    /// Nothing is kept when a key was forgotten since (or a session it depends on is
    /// not trusted).
    pub fn remember(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
        read: ReadStart,
        remaining: Duration,
    ) {
        let Some(entries) = &self.entries else {
            return;
        };
        if remaining.is_zero() || !self.current(read) {
            return;
        }
        let key = Key::of(scope);
        entries.insert(
            key.clone(),
            Arc::new(Entry {
                fingerprint,
                response: response.clone(),
                expires_at,
                valid_until: read.sent + remaining,
            }),
        );
        // A forgetting between the check above and the insert: it moved the epoch on
        // before it invalidated, so either it saw this entry or this sees its epoch.
        if !self.current(read) {
            entries.invalidate(&key);
        }
    }

    /// Whether no forgetting happened since `read` began, and every session the cache
    /// depends on is trusted.
    fn current(&self, read: ReadStart) -> bool {
        self.freshness.trusted(Instant::now()) && self.freshness.epoch.load(SeqCst) == read.epoch
    }

    /// Drops what is known of `scope`: its record was deleted.
    pub fn forget(&self, scope: &Scope) {
        self.freshness.epoch.fetch_add(1, SeqCst);
        if let Some(entries) = &self.entries {
            entries.invalidate(&Key::of(scope));
        }
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.freshness.epoch.fetch_add(1, SeqCst);
        if let Some(entries) = &self.entries {
            entries.invalidate_all();
        }
    }

    /// From now on, answers and keeps entries only while every one of `sources` was
    /// heard from within its bound; starts empty. Given once, before the cache is used.
    pub fn depend_on(&self, sources: impl IntoIterator<Item = Arc<Liveness>>) {
        let given = self.freshness.sources.set(sources.into_iter().collect());
        assert!(given.is_ok(), "a replay cache's sources are given once");
        self.clear();
    }

    /// Waits until every session the cache depends on is trusted, or `within` passed;
    /// says which.
    pub async fn live_within(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        for source in self.freshness.sources.get().into_iter().flatten() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !source.fresh_within(left).await {
                return false;
            }
        }
        true
    }

    /// Bytes held now, by the weigher's account (pending maintenance run first).
    pub fn weighted_size(&self) -> u64 {
        self.entries.as_ref().map_or(0, |entries| {
            entries.run_pending_tasks();
            entries.weighted_size()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{idempotency::IdempotencyKey, tenant::TenantId};

    fn scope(tenant: u128, key: &str) -> Scope {
        Scope {
            tenant: TenantId(Uuid::from_u128(tenant)),
            endpoint: "POST /v1/orders",
            key: IdempotencyKey::parse(Some(key)).unwrap(),
        }
    }

    fn response(body: &str) -> StoredResponse {
        StoredResponse {
            status: 201,
            location: Some("/v1/orders/x".into()),
            content_type: Some("application/json".into()),
            body: body.as_bytes().to_vec().into(),
            resource: None,
        }
    }

    /// A read sent at `sent`, in the cache's current epoch.
    fn read(cache: &ReplayCache, sent: Instant) -> ReadStart {
        ReadStart {
            sent,
            ..cache.read_starts()
        }
    }

    /// Tenant 1's request `A` under `KEY` completed with `body`, alive `secs` from `sent`.
    fn remember(cache: &ReplayCache, body: &str, sent: Instant, secs: u64) {
        cache.remember(
            &scope(1, KEY),
            A,
            &response(body),
            EXPIRES,
            read(cache, sent),
            Duration::from_secs(secs),
        );
    }

    /// When the remembered records expire, as the database said.
    const EXPIRES: DateTime<Utc> = DateTime::from_timestamp_nanos(1_800_000_000_000_000_000);

    const A: Fingerprint = Fingerprint([1; 32]);
    const B: Fingerprint = Fingerprint([2; 32]);
    const KEY: &str = "key-0123456789abcdef";

    #[test]
    fn a_remembered_response_replays_byte_for_byte_and_another_request_conflicts() {
        let cache = ReplayCache::new(1 << 20);
        let t0 = Instant::now();
        remember(&cache, "{\"id\":1}", t0, 60);
        assert_eq!(
            cache.lookup(&scope(1, KEY), &A, t0),
            Lookup::Replay(response("{\"id\":1}"), EXPIRES)
        );
        assert_eq!(cache.lookup(&scope(1, KEY), &B, t0), Lookup::Conflict);
    }

    #[test]
    fn another_tenant_or_endpoint_never_sees_the_entry() {
        let cache = ReplayCache::new(1 << 20);
        let t0 = Instant::now();
        remember(&cache, "{}", t0, 60);
        assert_eq!(cache.lookup(&scope(2, KEY), &A, t0), Lookup::Miss);
        let mut cancel = scope(1, KEY);
        cancel.endpoint = "POST /v1/orders/{id}/cancel";
        assert_eq!(cache.lookup(&cancel, &A, t0), Lookup::Miss);
    }

    #[test]
    fn an_entry_dies_when_its_remaining_lifetime_has_run_out() {
        let cache = ReplayCache::new(1 << 20);
        let t0 = Instant::now();
        remember(&cache, "{}", t0, 5);
        let almost = t0 + Duration::from_millis(4_999);
        assert!(matches!(
            cache.lookup(&scope(1, KEY), &A, almost),
            Lookup::Replay(..)
        ));
        assert_eq!(
            cache.lookup(&scope(1, KEY), &A, t0 + Duration::from_secs(5)),
            Lookup::Miss
        );
        // Once expired it stays gone, even for an earlier instant.
        assert_eq!(cache.lookup(&scope(1, KEY), &A, t0), Lookup::Miss);
        // Nothing is kept for a record that has no lifetime left.
        cache.remember(
            &scope(1, "key-zero-lifetime-0001"),
            A,
            &response("{}"),
            EXPIRES,
            read(&cache, t0),
            Duration::ZERO,
        );
        assert_eq!(
            cache.lookup(&scope(1, "key-zero-lifetime-0001"), &A, t0),
            Lookup::Miss
        );
    }

    #[test]
    fn the_byte_bound_holds_and_zero_turns_the_cache_off() {
        let cache = ReplayCache::new(64 * 1024);
        let t0 = Instant::now();
        let body = "x".repeat(1000);
        for i in 0..1000 {
            let key = format!("key-{i:016}");
            cache.remember(
                &scope(1, &key),
                A,
                &response(&body),
                EXPIRES,
                read(&cache, t0),
                Duration::from_secs(60),
            );
        }
        let held = cache.weighted_size();
        assert!(held <= 64 * 1024, "{held} bytes held");
        assert!(
            held >= 32 * 1024,
            "the cache is used, not emptied: {held} bytes"
        );

        let off = ReplayCache::new(0);
        off.remember(
            &scope(1, KEY),
            A,
            &response("{}"),
            EXPIRES,
            read(&off, t0),
            Duration::from_secs(60),
        );
        assert_eq!(off.lookup(&scope(1, KEY), &A, t0), Lookup::Miss);
    }

    /// `KEY`'s entry from a read that began at `read`.
    fn remember_read(cache: &ReplayCache, read: ReadStart) {
        let lifetime = Duration::from_secs(60);
        cache.remember(&scope(1, KEY), A, &response("{}"), EXPIRES, read, lifetime);
    }

    /// Whether `KEY` replays from the cache.
    fn replays(cache: &ReplayCache) -> bool {
        let now = Instant::now();
        matches!(cache.lookup(&scope(1, KEY), &A, now), Lookup::Replay(..))
    }

    #[test]
    fn a_forgotten_key_is_dropped_and_a_read_begun_before_is_not_kept() {
        let cache = ReplayCache::new(1 << 20);
        let t0 = Instant::now();
        remember(&cache, "{}", t0, 60);
        let other = scope(1, "key-other-0123456789");
        let lifetime = Duration::from_secs(60);
        cache.remember(
            &other,
            A,
            &response("{}"),
            EXPIRES,
            read(&cache, t0),
            lifetime,
        );
        cache.forget(&scope(1, KEY));
        assert!(!replays(&cache));
        // Only that key: the other one still replays.
        assert!(matches!(cache.lookup(&other, &A, t0), Lookup::Replay(..)));

        // A read that began before a forgetting puts nothing back afterwards.
        let before = read(&cache, t0);
        cache.forget(&scope(1, KEY));
        remember_read(&cache, before);
        assert!(!replays(&cache));
        // One that begins after is kept.
        remember_read(&cache, read(&cache, t0));
        assert!(replays(&cache));
    }

    #[test]
    fn a_cache_answers_only_while_its_listener_was_heard_within_the_bound() {
        let cache = ReplayCache::new(1 << 20);
        let t0 = Instant::now();
        remember(&cache, "{}", t0, 60);
        let begun = read(&cache, t0);
        let listener = Liveness::new(Duration::from_secs(3));
        cache.depend_on([listener.clone()]);
        assert!(!replays(&cache), "starts empty, and nothing heard yet");
        remember_read(&cache, read(&cache, t0));
        assert!(!replays(&cache), "nothing kept while not heard");

        listener.heard(Instant::now());
        // A read from before the dependency is not kept.
        remember_read(&cache, begun);
        assert!(!replays(&cache));
        remember_read(&cache, read(&cache, t0));
        assert!(replays(&cache));
        // Silent past the bound: no answer, though the entry is still there.
        let later = Instant::now() + Duration::from_secs(3);
        assert_eq!(
            cache.lookup(&scope(1, KEY), &A, later),
            Lookup::Miss,
            "untrusted once the bound has passed"
        );
        listener.lost();
        assert!(!replays(&cache));
    }
}
