//! The tenants a relay knows to have due events: a round visits them, and never walks
//! the tenants of the table, so that its cost follows the events that are due and not
//! the tenants that have some pending (thousands may be waiting out a backoff, or
//! behind a DEAD event, and cost nothing until their events fall due).
//!
//! The relay learns them two ways:
//!
//! - **Named.** Every insert names its tenants in the notification that wakes the
//!   relays (the insert trigger on one server, the writers on a distributed database:
//!   `wake`); a mark that brings an order's next event back names its tenant to its own
//!   relay; a re-drive names its tenants.
//! - **Found.** A look at the table finds the tenants whose events fell due since the
//!   previous look (a backoff that ran out, a parked row, a lease a dead relay left), a
//!   range of the index by due time (`store::due_tenants`), in a job of the relay's
//!   own: at every poll, from a little before where the previous look stopped. A look
//!   at everything due runs first, whenever the listening session was lost or
//!   regained (notifications in between may be lost), and every [`FULL_LOOK_EVERY`].
//!
//! Each round visits up to `n` of them from where the previous round stopped (in the
//! order of the hash a distributed database divides into shards, so that a round's
//! tenants share few shards), named
//! tenants first (a quiet tenant's new event goes out in the next round however many
//! tenants the looks found) but with a quarter of the round kept for found ones, so
//! neither kind waits on the other. A tenant that had nothing to claim or park is
//! forgotten, unless it was named again meanwhile (each naming moves its generation
//! on, and only the generation the round saw is forgotten); a tenant that filled its
//! share is named again (`DueTenants::claimed` says why). The workers a look could
//! not read are remembered until one reads them again, and rounds leave their tenants
//! alone meanwhile.

use std::{
    collections::BTreeMap,
    ops::Bound,
    sync::Mutex,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::db;

/// How far before the previous look's time a look begins: a row given a due time by a
/// transaction that committed after that time had passed (a claim's lease written by a
/// stalled statement) is still found, if it committed within this.
pub const LOOK_BACK: Duration = Duration::from_secs(5);

/// How often a look reads everything due rather than what fell due since the last:
/// the bound on how long a row can wait that no notification named and whose due time
/// passed before it committed, longer than [`LOOK_BACK`].
pub const FULL_LOOK_EVERY: Duration = Duration::from_secs(60);

/// Tenants with due events, as this relay heard of them.
#[derive(Debug, Default)]
pub struct KnownTenants {
    inner: Mutex<Inner>,
    /// Signalled when the table should be looked at now (see
    /// [`KnownTenants::look_again`]).
    look: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// Named tenants, each with the generation of its latest naming.
    named: Lane,
    /// Found tenants (not named since).
    found: Lane,
    generation: u64,
    /// When the table was last looked at; none: it must be (at start, after a lost
    /// session).
    looked: Option<Instant>,
    /// The database's time the last look judged by; none: never looked.
    looked_up_to: Option<DateTime<Utc>>,
    /// The next look reads everything due (notifications may have been missed).
    in_full: bool,
    /// When the last look at everything due began.
    looked_in_full: Option<Instant>,
    /// The workers the last look could not read (`host:port`): rounds leave their
    /// tenants alone until a look reads them again, instead of waiting on them.
    unreachable: Vec<String>,
}

/// Where a tenant stands in a lane: by the hash a distributed database divides into
/// shard ranges (`db::tenant_hash`), so that the tenants one round visits share few
/// shards and it sends few statements; on one server the order only has to go round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    hash: i32,
    tenant: Uuid,
}

impl Default for Place {
    /// The first place: a lane's cursor starts before every tenant.
    fn default() -> Self {
        Self {
            hash: i32::MIN,
            tenant: Uuid::nil(),
        }
    }
}

impl Place {
    fn of(tenant: Uuid) -> Self {
        Self {
            hash: db::tenant_hash(tenant),
            tenant,
        }
    }
}

/// Tenants visited in turn, from after a cursor.
#[derive(Debug, Default)]
struct Lane {
    tenants: BTreeMap<Place, u64>,
    cursor: Place,
}

impl Lane {
    /// Up to `n` tenants from the cursor on (wrapping round), moving the cursor past
    /// them, and leaving out those in `taken`.
    fn visit(&mut self, n: usize, taken: &[(Uuid, u64)]) -> Vec<(Uuid, u64)> {
        let cursor = self.cursor;
        let mut last = None;
        let visit: Vec<(Uuid, u64)> = self
            .tenants
            .range((Bound::Excluded(cursor), Bound::Unbounded))
            .chain(self.tenants.range(..=cursor))
            .filter(|(p, _)| !taken.iter().any(|(other, _)| *other == p.tenant))
            .take(n)
            .map(|(p, g)| {
                last = Some(*p);
                (p.tenant, *g)
            })
            .collect();
        if let Some(last) = last {
            self.cursor = last;
        }
        visit
    }

    fn get_mut(&mut self, tenant: Uuid) -> Option<&mut u64> {
        self.tenants.get_mut(&Place::of(tenant))
    }

    fn insert(&mut self, tenant: Uuid, generation: u64) {
        self.tenants.insert(Place::of(tenant), generation);
    }

    fn remove(&mut self, tenant: Uuid) {
        self.tenants.remove(&Place::of(tenant));
    }
}

/// The tenants one round visits, with the generations it saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Visit {
    pub tenants: Vec<(Uuid, u64)>,
}

/// Which look is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookFrom {
    /// At everything due.
    Everything,
    /// At what fell due after this database time.
    After(DateTime<Utc>),
}

impl KnownTenants {
    /// `tenants` have new due events.
    pub fn name(&self, tenants: impl IntoIterator<Item = Uuid>) {
        let mut inner = self.lock();
        for tenant in tenants {
            inner.generation += 1;
            let generation = inner.generation;
            inner.found.remove(tenant);
            inner.named.insert(tenant, generation);
        }
    }

    /// A look found `tenants` with due events, judging by the database's time `at`.
    pub fn found(&self, tenants: impl IntoIterator<Item = Uuid>, at: DateTime<Utc>) {
        let mut inner = self.lock();
        for tenant in tenants {
            inner.generation += 1;
            let generation = inner.generation;
            if let Some(named) = inner.named.get_mut(tenant) {
                *named = generation;
            } else {
                inner.found.insert(tenant, generation);
            }
        }
        inner.looked_up_to = Some(at);
    }

    /// Notifications may have been missed: the table is looked at in full now.
    pub fn look_again(&self) {
        {
            let mut inner = self.lock();
            inner.looked = None;
            inner.in_full = true;
        }
        self.look.notify_one();
    }

    /// Waits until [`KnownTenants::look_again`] asks for a look.
    pub async fn look_asked(&self) {
        self.look.notified().await
    }

    /// The workers the latest look could not read.
    pub fn set_unreachable(&self, nodes: Vec<String>) {
        self.lock().unreachable = nodes;
    }

    /// The workers the latest look could not read (empty when it read them all).
    pub fn unreachable(&self) -> Vec<String> {
        self.lock().unreachable.clone()
    }

    /// Which look is due now, if one is (never looked yet, after a lost session, or
    /// `every` since the last look began), taking it. The caller reports what the look
    /// found ([`KnownTenants::found`]), or calls [`KnownTenants::look_again`] when it
    /// failed.
    pub fn take_look(&self, every: Duration) -> Option<LookFrom> {
        let mut inner = self.lock();
        let due = inner.looked.is_none_or(|at| at.elapsed() >= every);
        if !due {
            return None;
        }
        let now = Instant::now();
        inner.looked = Some(now);
        let in_full = std::mem::take(&mut inner.in_full)
            || inner
                .looked_in_full
                .is_none_or(|at| at.elapsed() >= FULL_LOOK_EVERY);
        match inner.looked_up_to {
            Some(up_to) if !in_full => Some(LookFrom::After(
                up_to - chrono::TimeDelta::from_std(LOOK_BACK).unwrap_or_default(),
            )),
            _ => {
                inner.looked_in_full = Some(now);
                Some(LookFrom::Everything)
            }
        }
    }

    /// Up to `n` known tenants for a round: named ones first, from where the previous
    /// round stopped, with a quarter of the round (at least one) kept for found ones;
    /// what either kind leaves goes to the other.
    pub fn visit(&self, n: usize) -> Visit {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let kept = if inner.found.tenants.is_empty() {
            0
        } else {
            (n / 4).max(1)
        };
        let mut tenants = inner.found.visit(kept.min(n), &[]);
        let named = inner.named.visit(n - tenants.len(), &tenants);
        tenants.extend(named);
        let more = inner.found.visit(n - tenants.len(), &tenants);
        tenants.extend(more);
        Visit { tenants }
    }

    /// How many tenants this relay knows to have due events.
    pub fn len(&self) -> usize {
        let inner = self.lock();
        inner.named.tenants.len() + inner.found.tenants.len()
    }

    /// Whether it knows none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `tenant` had nothing due when the round that saw `generation` claimed it:
    /// forgotten, unless named or found since.
    pub fn had_nothing(&self, tenant: Uuid, generation: u64) {
        let mut inner = self.lock();
        let inner = &mut *inner;
        for lane in [&mut inner.named, &mut inner.found] {
            if lane.get_mut(tenant).is_some_and(|g| *g == generation) {
                lane.remove(tenant);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u128) -> Vec<Uuid> {
        (1..=n).map(Uuid::from_u128).collect()
    }

    fn visited(known: &KnownTenants, n: usize) -> Vec<Uuid> {
        known.visit(n).tenants.iter().map(|t| t.0).collect()
    }

    #[test]
    fn rounds_take_turns_along_the_tenants_and_wrap() {
        let known = KnownTenants::default();
        known.name(ids(5));
        // In the order of the tenants' hashes.
        let mut order = ids(5);
        order.sort_by_key(|t| (db::tenant_hash(*t), *t));
        assert_eq!(visited(&known, 3), order[..3]);
        assert_eq!(visited(&known, 3), vec![order[3], order[4], order[0]]);
    }

    #[test]
    fn a_tenant_named_while_its_round_ran_is_not_forgotten() {
        let known = KnownTenants::default();
        known.name(ids(2));
        let visit = known.visit(2);
        // Tenant 1 commits again while the round claims it and finds nothing.
        known.name([Uuid::from_u128(1)]);
        for (tenant, generation) in &visit.tenants {
            known.had_nothing(*tenant, *generation);
        }
        assert_eq!(visited(&known, 5), vec![Uuid::from_u128(1)]);
    }

    #[test]
    fn a_tenant_whose_rows_one_round_skipped_stays_known_when_the_round_that_held_them_filled_its_share()
     {
        let tenant = Uuid::from_u128(1);
        // Round `held` locks the tenant's rows and fills its share; round `skipped`
        // finds them locked and has nothing. Either may end first.
        for skipped_ends_first in [true, false] {
            let known = KnownTenants::default();
            known.name([tenant]);
            let held = known.visit(1);
            let skipped = known.visit(1);
            let forget = || {
                for (t, generation) in &skipped.tenants {
                    known.had_nothing(*t, *generation);
                }
            };
            if skipped_ends_first {
                forget();
                known.name(held.tenants.iter().map(|(t, _)| *t));
            } else {
                known.name(held.tenants.iter().map(|(t, _)| *t));
                forget();
            }
            assert_eq!(visited(&known, 5), vec![tenant], "{skipped_ends_first}");
        }
    }

    #[test]
    fn a_named_tenant_goes_in_the_next_round_beside_thousands_found() {
        let known = KnownTenants::default();
        let found: Vec<Uuid> = (1000..21_000).map(Uuid::from_u128).collect();
        known.found(found, Utc::now());
        let quiet = Uuid::from_u128(7);
        known.name([quiet]);
        let round = visited(&known, 100);
        assert_eq!(round.len(), 100);
        assert!(round.contains(&quiet));
        // A quarter is kept for found tenants, however many are named.
        known.name((100_000..100_500).map(Uuid::from_u128));
        let round = visited(&known, 100);
        let found_in_round = round.iter().filter(|t| t.as_u128() < 21_000).count();
        assert_eq!(found_in_round, 25);
    }

    #[test]
    fn a_tenant_is_visited_once_per_round_even_when_few_are_known() {
        let known = KnownTenants::default();
        known.name(ids(2));
        known.found([Uuid::from_u128(9)], Utc::now());
        let mut round = visited(&known, 10);
        round.sort();
        assert_eq!(
            round,
            vec![Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(9)]
        );
    }

    #[test]
    fn a_look_reads_everything_first_and_after_a_loss_then_what_fell_due_since() {
        let known = KnownTenants::default();
        let poll = Duration::ZERO;
        assert_eq!(known.take_look(poll), Some(LookFrom::Everything));
        let at = Utc::now();
        known.found([], at);
        let back = chrono::TimeDelta::from_std(LOOK_BACK).unwrap();
        assert_eq!(known.take_look(poll), Some(LookFrom::After(at - back)));
        known.look_again();
        assert_eq!(known.take_look(poll), Some(LookFrom::Everything));
        let hour = Duration::from_secs(3600);
        known.found([], at);
        assert_eq!(known.take_look(hour), None, "not before the poll");
    }
}
