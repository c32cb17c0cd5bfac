//! Where a relay's rounds find the tenants with due events: one strategy per layout,
//! chosen once when the relay is built.
//!
//! - **One server: the walk.** Each round reads up to
//!   [`store::FAIR_TENANTS_PER_CLAIM`] tenants with pending events from the pending
//!   index, going on from where the previous round stopped ([`store::PENDING_TENANTS`]).
//!   Its side job keeps the planner's statistics current (`statistics`).
//! - **Distributed: the known tenants.** The walk is a query Citus does not run across
//!   shards, so the relay learns the tenants instead (`known`): from the writers'
//!   notifications and from a look at the table, worker by worker, at every poll. Its
//!   side job is that look; each worker's autovacuum keeps its shards' statistics.

use std::{sync::Arc, time::Duration};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    known::{KnownTenants, Visit},
    statistics,
    store::{self, RoundStart},
    wake,
};
use crate::{
    db::{self, Db, Forms, Heard, Layout, Sql},
    supervisor::Supervisor,
};

/// Where the tenants a round visits come from (see the module's documentation).
pub enum DueTenants {
    /// The walk over the pending index, from after the last tenant the previous round
    /// visited. Held while a round reads its tenants, so that the relay's lanes take
    /// turns along the tenants instead of each walking the same.
    Walk { cursor: tokio::sync::Mutex<Uuid> },
    /// The tenants this relay heard of.
    Known(Arc<KnownTenants>),
}

/// The two strategies.
const STRATEGIES: Forms<fn() -> DueTenants> = Forms {
    one_server: DueTenants::walk,
    distributed: DueTenants::known,
};

/// The tenants one round visits, the database's time it judges by, and what the
/// strategy needs back once the round claimed.
pub struct Start {
    pub round: RoundStart,
    visit: Option<Visit>,
}

impl DueTenants {
    /// The strategy for tables laid out as `layout`.
    pub fn for_layout(layout: Layout) -> Self {
        (layout.pick(&STRATEGIES))()
    }

    fn walk() -> Self {
        Self::Walk {
            cursor: tokio::sync::Mutex::new(Uuid::nil()),
        }
    }

    fn known() -> Self {
        Self::Known(Arc::new(KnownTenants::default()))
    }

    /// Which tenants the next round visits, and the database's time.
    pub async fn start(&self, c: &mut Sql<'_>) -> sqlx::Result<Start> {
        let per_round = store::FAIR_TENANTS_PER_CLAIM;
        match self {
            Self::Walk { cursor } => {
                let mut cursor = cursor.lock().await;
                let round = store::pending_tenants(c, *cursor, per_round).await?;
                if let Some(last) = round.tenants.last() {
                    *cursor = *last;
                }
                Ok(Start { round, visit: None })
            }
            Self::Known(known) => {
                let mut visit = known.visit(per_round as usize);
                let unreachable = known.unreachable();
                if !unreachable.is_empty() && !visit.tenants.is_empty() {
                    // Their claims would wait on a worker that does not answer.
                    let tenants: Vec<Uuid> = visit.tenants.iter().map(|(t, _)| *t).collect();
                    let reachable =
                        db::on_nodes_answering(c, "outbox_event", &tenants, &unreachable).await?;
                    visit.tenants.retain(|(t, _)| reachable.contains(t));
                }
                let now = store::round_time(c).await?;
                let tenants = visit.tenants.iter().map(|(t, _)| *t).collect();
                Ok(Start {
                    round: RoundStart { now, tenants },
                    visit: Some(visit),
                })
            }
        }
    }

    /// After a round's claim: the tenants that had nothing to claim or park are
    /// forgotten, unless named again since the round began.
    pub fn claimed(&self, start: &Start, had_nothing: &[Uuid]) {
        if let (Self::Known(known), Some(visit)) = (self, &start.visit) {
            for (tenant, generation) in &visit.tenants {
                if had_nothing.contains(tenant) {
                    known.had_nothing(*tenant, *generation);
                }
            }
        }
    }

    /// What the relay's listening session heard: on distributed tables the writers'
    /// notifications name their tenants, and a session lost or regained means the table
    /// must be looked at (notifications in between may be lost).
    pub fn heard(&self, heard: &Heard<'_>) {
        if let Self::Known(known) = self {
            match heard {
                Heard::Notified(payload) => known.name(wake::tenants_of(payload)),
                Heard::Listening | Heard::Lost => known.look_again(),
            }
        }
    }

    /// Starts the strategy's side job under `parts`: the statistics check (when
    /// `analyze`; once first, before any round) or the look at the table every `poll`.
    pub async fn start_side_job(
        &self,
        parts: &Supervisor,
        db: &Db,
        analyze: bool,
        wake: &Arc<Notify>,
        poll: Duration,
    ) {
        match self {
            Self::Walk { .. } if analyze => {
                // Once before the first round (a backlog laid down while no relay ran
                // would otherwise meet stale plans first), then beside the lanes, not
                // in them: a lane that waited for it would start its next round in step
                // with the other lane's.
                statistics::check(db).await;
                let db = db.clone();
                parts.spawn("outbox statistics", move |token| {
                    statistics::keep_current(db, token)
                });
            }
            Self::Walk { .. } => {}
            Self::Known(known) => {
                let (db, known, wake) = (db.clone(), known.clone(), wake.clone());
                parts.spawn("outbox look", move |token| {
                    look(db, known, wake, poll, token)
                });
            }
        }
    }
}

/// On a distributed database, looks at the table for tenants with due events (see
/// `known`): first thing, at every poll, and whenever the listening session was lost
/// or regained. A job of its own, beside the lanes: a look reads every due row and
/// waits up to [`db::NODE_CONNECT_TIMEOUT`] for a worker that does not answer, and a
/// lane that looked would hold every tenant's events back meanwhile. What it finds
/// wakes the lanes; the workers it could not read are left alone by the rounds until
/// a look reads them again.
async fn look(
    db: Db,
    known: Arc<KnownTenants>,
    wake: Arc<Notify>,
    poll: Duration,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        if known.take_look(poll) {
            match db.run(async |c| store::due_tenants(c).await).await {
                Ok(found) => {
                    known.name(found.start.tenants);
                    known.set_unreachable(found.unreachable);
                    wake.notify_one();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look for tenants with due events; looking again after the poll interval");
                    known.look_again();
                    // Not at once: the database is failing.
                    tokio::select! {
                        _ = tokio::time::sleep(poll) => {}
                        _ = shutdown.cancelled() => {}
                    }
                    continue;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = known.look_asked() => {}
            _ = shutdown.cancelled() => {}
        }
    }
}
