//! Tokens already verified, so that a client sending the same token with every request
//! (as clients do, until it nears its expiry) pays for its signature and claims once.
//!
//! What a cached answer must not change:
//!
//! - **Expiry.** An entry lives until the token's `exp` plus the leeway, as the full
//!   check would count it, and never longer than [`MAX_LIFETIME`], so that a wall clock
//!   stepped forward is noticed within that bound. Its deadline is on the monotonic
//!   clock, taken before the token was checked.
//! - **The keys.** An entry records the generation of the keys that verified it; when a
//!   JWKS fetched again holds other keys the generation changes and the token is checked
//!   afresh, so a key the provider withdrew stops verifying within one refresh. A fetch
//!   that brings the same keys keeps the generation, and the entries.
//! - **Refusals are not cached.** Only a token that verified is remembered: a bad token
//!   costs the same full check every time, and cannot push good ones out in bulk.
//! - **Memory.** At most [`MAX_ENTRIES`] tokens; the least used go first.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use moka::{Expiry, sync::Cache};

use super::Principal;

/// The longest an entry is trusted without checking the token again.
pub const MAX_LIFETIME: Duration = Duration::from_secs(60);
/// How many tokens are remembered; each costs its own length plus a few hundred bytes.
pub const MAX_ENTRIES: u64 = 10_000;

#[derive(Debug)]
struct Entry {
    principal: Arc<Principal>,
    generation: u64,
    valid_until: Instant,
}

/// Tells moka when an entry expires, so that expired tokens leave memory by themselves.
struct UntilTokenExpires;

impl Expiry<Box<str>, Arc<Entry>> for UntilTokenExpires {
    fn expire_after_create(
        &self,
        _: &Box<str>,
        entry: &Arc<Entry>,
        now: Instant,
    ) -> Option<Duration> {
        Some(entry.valid_until.saturating_duration_since(now))
    }
}

/// Verified tokens by their text.
pub struct VerifiedTokens {
    entries: Cache<Box<str>, Arc<Entry>>,
}

impl Default for VerifiedTokens {
    fn default() -> Self {
        Self {
            entries: Cache::builder()
                .max_capacity(MAX_ENTRIES)
                .expire_after(UntilTokenExpires)
                .build(),
        }
    }
}

impl VerifiedTokens {
    /// The caller `token` verified as, if it did under the keys of `generation` and is
    /// still valid at `now`.
    pub fn get(&self, token: &str, generation: u64, now: Instant) -> Option<Arc<Principal>> {
        let entry = self.entries.get(token)?;
        (entry.generation == generation && now < entry.valid_until).then(|| entry.principal.clone())
    }

    /// Remembers that `token` verified as `principal` under the keys of `generation`;
    /// `checked` is the monotonic instant taken before the check, `remaining` how long
    /// the check would still have accepted the token then.
    pub fn remember(
        &self,
        token: &str,
        principal: Arc<Principal>,
        generation: u64,
        checked: Instant,
        remaining: Duration,
    ) {
        let lifetime = remaining.min(MAX_LIFETIME);
        if lifetime.is_zero() {
            return;
        }
        let entry = Entry {
            principal,
            generation,
            valid_until: checked + lifetime,
        };
        self.entries.insert(token.into(), Arc::new(entry));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use uuid::Uuid;

    use super::*;
    use crate::tenant::TenantId;

    fn principal() -> Arc<Principal> {
        Arc::new(Principal {
            tenant: TenantId(Uuid::new_v4()),
            subject: "app".into(),
            scopes: HashSet::from(["orders:write".to_string()]),
        })
    }

    #[test]
    fn an_entry_answers_only_its_own_token_under_its_own_keys_until_it_expires() {
        let cache = VerifiedTokens::default();
        let at = Instant::now();
        let p = principal();
        cache.remember("a.b.c", p.clone(), 3, at, Duration::from_secs(10));
        let hit = cache.get("a.b.c", 3, at).unwrap();
        assert_eq!(hit.tenant, p.tenant);
        assert!(cache.get("a.b.d", 3, at).is_none(), "another token");
        assert!(cache.get("a.b.c", 4, at).is_none(), "keys fetched again");
        assert!(
            cache
                .get("a.b.c", 3, at + Duration::from_secs(10))
                .is_none()
        );
    }

    #[test]
    fn no_entry_outlives_the_bound_and_an_expired_token_is_not_kept() {
        let cache = VerifiedTokens::default();
        let at = Instant::now();
        cache.remember("long", principal(), 0, at, Duration::from_secs(3600));
        assert!(cache.get("long", 0, at + MAX_LIFETIME).is_none());
        assert!(cache.get("long", 0, at + MAX_LIFETIME / 2).is_some());
        cache.remember("gone", principal(), 0, at, Duration::ZERO);
        assert!(cache.get("gone", 0, at).is_none());
    }
}
