//! Tokens already verified, so that a client sending the same token with every request
//! (as clients do, until it nears its expiry) pays for its signature and claims once.
//!
//! What a cached answer must not change:
//!
//! - **Expiry.** An entry lives until the token's `exp` plus the leeway, as the full
//!   check would count it, and never longer than [`MAX_LIFETIME`], so that a wall clock
//!   stepped forward is noticed within that bound. Its deadline is on the monotonic
//!   clock, taken before the token was checked.
//! - **The key.** An entry records which key verified it (for a JWKS, its `kid` and the
//!   digest of its JWK) and is used only while that key is still in place: a key the
//!   provider withdrew or replaced stops verifying within one refresh, while tokens of
//!   keys a new set keeps unchanged stay remembered, however often the set is fetched.
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

/// The key a token verified with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifiedBy {
    /// The configured secret or public key, which cannot change while the process runs.
    ConfiguredKey,
    /// A key of the JWKS: its `kid` and the digest of its JWK.
    Jwk { kid: Box<str>, digest: [u8; 32] },
}

#[derive(Debug)]
struct Entry {
    principal: Arc<Principal>,
    by: VerifiedBy,
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
    /// The caller `token` verified as, if it is still valid at `now` and `in_place` says
    /// the key that verified it still is.
    pub fn get(
        &self,
        token: &str,
        now: Instant,
        in_place: impl FnOnce(&VerifiedBy) -> bool,
    ) -> Option<Arc<Principal>> {
        let entry = self.entries.get(token)?;
        (now < entry.valid_until && in_place(&entry.by)).then(|| entry.principal.clone())
    }

    /// Remembers that `token` verified as `principal` with the key `by`;
    /// `checked` is the monotonic instant taken before the check, `remaining` how long
    /// the check would still have accepted the token then.
    pub fn remember(
        &self,
        token: &str,
        principal: Arc<Principal>,
        by: VerifiedBy,
        checked: Instant,
        remaining: Duration,
    ) {
        let lifetime = remaining.min(MAX_LIFETIME);
        if lifetime.is_zero() {
            return;
        }
        let entry = Entry {
            principal,
            by,
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

    fn jwk(kid: &str, byte: u8) -> VerifiedBy {
        VerifiedBy::Jwk {
            kid: kid.into(),
            digest: [byte; 32],
        }
    }

    #[test]
    fn an_entry_answers_only_its_own_token_while_its_key_is_in_place_until_it_expires() {
        let cache = VerifiedTokens::default();
        let at = Instant::now();
        let p = principal();
        cache.remember(
            "a.b.c",
            p.clone(),
            jwk("k1", 1),
            at,
            Duration::from_secs(10),
        );
        let hit = cache.get("a.b.c", at, |by| *by == jwk("k1", 1)).unwrap();
        assert_eq!(hit.tenant, p.tenant);
        assert!(cache.get("a.b.d", at, |_| true).is_none(), "another token");
        assert!(
            cache.get("a.b.c", at, |by| *by == jwk("k1", 2)).is_none(),
            "the kid now names other key material"
        );
        assert!(
            cache
                .get("a.b.c", at + Duration::from_secs(10), |_| true)
                .is_none()
        );
    }

    #[test]
    fn no_entry_outlives_the_bound_and_an_expired_token_is_not_kept() {
        let cache = VerifiedTokens::default();
        let at = Instant::now();
        let by = VerifiedBy::ConfiguredKey;
        cache.remember(
            "long",
            principal(),
            by.clone(),
            at,
            Duration::from_secs(3600),
        );
        assert!(cache.get("long", at + MAX_LIFETIME, |_| true).is_none());
        assert!(cache.get("long", at + MAX_LIFETIME / 2, |_| true).is_some());
        cache.remember("gone", principal(), by, at, Duration::ZERO);
        assert!(cache.get("gone", at, |_| true).is_none());
    }
}
