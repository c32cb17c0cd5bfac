//! The tenants a relay knows to have pending events, where it cannot walk them in the
//! table: on a distributed database (Citus) the walk over the pending index
//! (`store::PENDING_TENANTS`, a recursive loose scan) is a query Citus does not run
//! across shards, and every statement that would find the tenants instead reads all
//! their due rows.
//!
//! So the relay learns them: from the writers' notifications, which name the tenants
//! whose events committed (`wake`), and from a look at the table
//! (`store::due_tenants`, worker by worker, in a task of the relay's own) when it
//! starts, whenever its listening session was (re)established, and at every poll,
//! which finds what no notification named (a backoff that ran out, a notification lost
//! to a crash). The workers a look could not read are remembered until one reads them
//! again, and rounds leave their tenants alone meanwhile. A round visits the known
//! tenants from where the previous round stopped, as the walk does, and forgets a
//! tenant that had nothing due, unless it was named again meanwhile (each naming moves
//! its generation on, and only the generation the round saw is forgotten).

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use uuid::Uuid;

/// Tenants with pending events, as this relay heard of them.
#[derive(Debug, Default)]
pub struct KnownTenants {
    inner: Mutex<Inner>,
    /// Signalled when the table should be looked at now (see
    /// [`KnownTenants::look_again`]).
    look: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// Each tenant with the generation of its latest naming.
    tenants: BTreeMap<Uuid, u64>,
    generation: u64,
    /// Where the next round starts: after this tenant.
    cursor: Uuid,
    /// When the table was last looked at; none: it must be (at start, after a lost
    /// session).
    looked: Option<Instant>,
    /// The workers the last look could not read (`host:port`): rounds leave their
    /// tenants alone until a look reads them again, instead of waiting on them.
    unreachable: Vec<String>,
}

/// The tenants one round visits, with the generations it saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Visit {
    pub tenants: Vec<(Uuid, u64)>,
}

impl KnownTenants {
    /// `tenants` have pending events.
    pub fn name(&self, tenants: impl IntoIterator<Item = Uuid>) {
        let mut inner = self.lock();
        for tenant in tenants {
            inner.generation += 1;
            let generation = inner.generation;
            inner.tenants.insert(tenant, generation);
        }
    }

    /// Notifications may have been missed: the table is looked at now.
    pub fn look_again(&self) {
        self.lock().looked = None;
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

    /// Whether the table should be looked at now (never looked yet, after a lost
    /// session, or `every` since the last look began), taking the look when it should.
    /// The caller names what the look found, or calls [`KnownTenants::look_again`] when
    /// it failed.
    pub fn take_look(&self, every: Duration) -> bool {
        let mut inner = self.lock();
        let due = inner.looked.is_none_or(|at| at.elapsed() >= every);
        if due {
            inner.looked = Some(Instant::now());
        }
        due
    }

    /// Up to `n` known tenants from the cursor on (wrapping round), moving the cursor
    /// past them.
    pub fn visit(&self, n: usize) -> Visit {
        let mut inner = self.lock();
        let cursor = inner.cursor;
        let tenants: Vec<(Uuid, u64)> = inner
            .tenants
            .range((
                std::ops::Bound::Excluded(cursor),
                std::ops::Bound::Unbounded,
            ))
            .chain(inner.tenants.range(..=cursor))
            .take(n)
            .map(|(t, g)| (*t, *g))
            .collect();
        if let Some((last, _)) = tenants.last() {
            inner.cursor = *last;
        }
        Visit { tenants }
    }

    /// `tenant` had nothing due when the round that saw `generation` claimed it:
    /// forgotten, unless named since.
    pub fn had_nothing(&self, tenant: Uuid, generation: u64) {
        let mut inner = self.lock();
        if inner.tenants.get(&tenant) == Some(&generation) {
            inner.tenants.remove(&tenant);
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

    #[test]
    fn rounds_take_turns_along_the_tenants_and_wrap() {
        let known = KnownTenants::default();
        known.name(ids(5));
        let first: Vec<Uuid> = known.visit(3).tenants.iter().map(|t| t.0).collect();
        assert_eq!(first, ids(3));
        let second: Vec<Uuid> = known.visit(3).tenants.iter().map(|t| t.0).collect();
        assert_eq!(
            second,
            vec![Uuid::from_u128(4), Uuid::from_u128(5), Uuid::from_u128(1)]
        );
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
        let left: Vec<Uuid> = known.visit(5).tenants.iter().map(|t| t.0).collect();
        assert_eq!(left, vec![Uuid::from_u128(1)]);
    }

    #[test]
    fn the_table_is_looked_at_first_after_a_loss_and_at_every_poll() {
        let known = KnownTenants::default();
        let poll = Duration::from_secs(3600);
        assert!(known.take_look(poll), "before the first look");
        assert!(
            !known.take_look(poll),
            "one round takes the look, the next does not"
        );
        known.look_again();
        assert!(known.take_look(poll), "after a loss");
        assert!(known.take_look(Duration::ZERO), "at every poll");
    }
}
