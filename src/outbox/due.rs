//! Where a relay's rounds find the tenants with due events, on either layout: the
//! tenants it knows of (`known`), named by the notifications it hears and found by a
//! look at the index by due time, in a job of its own. A round's cost is the tenants it
//! visits and the events it claims; tenants whose events wait (a backoff, a DEAD event
//! before them) cost nothing until the events fall due.
//!
//! The layouts differ in how a round's tenants are grouped into statements: on one
//! server one statement claims for all of them; on a distributed database one statement
//! claims for each shard's (Citus runs `FOR UPDATE` only in a statement that one shard
//! answers). With routes (decision 172) a round's shards are grouped by the node that
//! holds them and each node's statements run on that node, where Citus runs them
//! locally: the round's time is each node's own, read there. Without routes the shards
//! are looked up in the coordinator's metadata and every statement goes through it. The
//! strategy's side job also keeps the planner's statistics current (`statistics`): the
//! table's on one server, each shard's on its worker on a distributed database.

use std::{sync::Arc, time::Duration};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    known::{KnownTenants, LookFrom, Visit},
    statistics,
    store::{self, TENANTS_PER_ROUND},
    wake,
};
use crate::{
    db::{self, Db, Forms, Heard},
    supervisor::Supervisor,
};

/// The tenants this relay knows to have due events (see the module's documentation).
#[derive(Default)]
pub struct DueTenants {
    known: Arc<KnownTenants>,
}

/// How a round's tenants are grouped into claim statements.
#[derive(Clone, Copy)]
enum Grouping {
    /// All in one statement.
    All,
    /// One statement per shard.
    ByShard,
}

const GROUPINGS: Forms<Grouping> = Forms {
    one_server: Grouping::All,
    distributed: Grouping::ByShard,
};

/// One round's tenants, by where their statements go.
pub struct Start {
    /// Each node's part of the round: on one server, or on a distributed database
    /// without routes, one part on the relay's own database.
    pub parts: Vec<Part>,
    /// Known tenants this round does not visit: more may be due now.
    pub more: bool,
    visit: Visit,
}

/// The round's tenants whose statements go to one database (one server, the
/// coordinator, or the node that holds their shards), in the groups one statement
/// claims together.
pub struct Part {
    pub db: Db,
    pub groups: Vec<Vec<Uuid>>,
}

impl Part {
    /// How many tenants the part visits.
    pub fn tenants(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    /// Whether the part visits `tenant`.
    pub fn visits(&self, tenant: &Uuid) -> bool {
        self.groups.iter().any(|g| g.contains(tenant))
    }
}

impl Start {
    /// How many tenants the round visits.
    pub fn tenants(&self) -> usize {
        self.parts.iter().map(Part::tenants).sum()
    }
}

impl DueTenants {
    /// The tenants the next round visits, at most `n`, by where their statements go;
    /// none when this relay knows of no tenant with due events (the round asks nothing
    /// of the database).
    pub async fn start(&self, db: &Db, n: usize) -> sqlx::Result<Option<Start>> {
        let mut visit = self
            .known
            .visit(n.clamp(1, db.layout().pick(&TENANTS_PER_ROUND)));
        let unreachable = self.known.unreachable();
        if !unreachable.is_empty() && !visit.tenants.is_empty() {
            // Their claims would wait on a worker that does not answer.
            let tenants: Vec<Uuid> = visit.tenants.iter().map(|(t, _)| *t).collect();
            let reachable = db
                .run(async |c| {
                    db::on_nodes_answering(c, "outbox_event", &tenants, &unreachable).await
                })
                .await?;
            visit.tenants.retain(|(t, _)| reachable.contains(t));
        }
        if visit.tenants.is_empty() {
            return Ok(None);
        }
        // In the order of their ids: the claim probes each tenant's index range in the
        // order given, and ranges read in index order share the pages they pass.
        let mut tenants: Vec<Uuid> = visit.tenants.iter().map(|(t, _)| *t).collect();
        tenants.sort_unstable();
        let more = self.known.len() > tenants.len();
        let parts = match db.layout().pick(&GROUPINGS) {
            Grouping::All => vec![Part {
                db: db.clone(),
                groups: vec![tenants],
            }],
            Grouping::ByShard => by_node(db, &tenants).await?,
        };
        Ok(Some(Start { parts, more, visit }))
    }

    /// After a round's claim: the tenants that had nothing to claim or park are
    /// forgotten, unless named again since the round began; those that filled their
    /// share are named again.
    ///
    /// A claim skips the rows another lane's or relay's claim holds, and that claim may
    /// read more rows of a tenant than it takes: they stay due, with due times no later
    /// look by due time reads again. So a tenant whose rows were all skipped is
    /// forgotten only by the claim that skipped them, while the claim that held them
    /// and filled its share names the tenant again, whichever of the two ends first
    /// (the naming moves the tenant's generation on, so a later forgetting of the
    /// generation the skipping round saw leaves it). A claim that came back short read
    /// every due row it could lock: it took them, or parked those that must wait.
    pub fn claimed(&self, start: &Start, had_nothing: &[Uuid], full: Vec<Uuid>) {
        for (tenant, generation) in &start.visit.tenants {
            if had_nothing.contains(tenant) {
                self.known.had_nothing(*tenant, *generation);
            }
        }
        if !full.is_empty() {
            self.known.name(full);
        }
    }

    /// A mark brought the next events of `tenants`' orders back into the due range.
    pub fn woken(&self, tenants: Vec<Uuid>) {
        self.known.name(tenants);
    }

    /// What the relay's listening session heard: a notification names the tenants
    /// whose events committed; a session lost or regained means the table must be
    /// looked at in full (notifications in between may be lost), and so does a
    /// notification that names no tenant (a trigger of an earlier release).
    pub fn heard(&self, heard: &Heard<'_>) {
        match heard {
            Heard::Notified(payload) => {
                let tenants = wake::tenants_of(payload);
                if tenants.is_empty() {
                    self.known.look_again();
                } else {
                    self.known.name(tenants);
                }
            }
            Heard::Listening | Heard::Lost => self.known.look_again(),
        }
    }

    /// Starts the strategy's side jobs under `parts`: the look at the table every
    /// `poll`, and (with `analyze`) the statistics check, once first, before any round.
    pub async fn start_side_jobs(
        &self,
        parts: &Supervisor,
        db: &Db,
        analyze: bool,
        wake: &Arc<Notify>,
        poll: Duration,
    ) {
        if analyze {
            // Once before the first round (a backlog laid down while no relay ran
            // would otherwise meet stale plans first), then beside the lanes, not in
            // them: a lane that waited for it would start its next round in step with
            // the other lane's.
            statistics::check(db).await;
            let db = db.clone();
            parts.spawn("outbox statistics", move |token| {
                statistics::keep_current(db, token)
            });
        }
        let (db, known, wake) = (db.clone(), self.known.clone(), wake.clone());
        parts.spawn("outbox look", move |token| {
            look(db, known, wake, poll, token)
        });
    }
}

/// `tenants` grouped by shard, and the groups by the node that holds them (in the
/// order each first appears): with routes, found locally, each node's part going to
/// that node; without, the shards looked up in the coordinator's metadata and every
/// group going through it.
async fn by_node(db: &Db, tenants: &[Uuid]) -> sqlx::Result<Vec<Part>> {
    let Some(placed) = tenants
        .iter()
        .map(|t| db.placed(*t))
        .collect::<Option<Vec<_>>>()
    else {
        let shards = db.run(async |c| store::shards_of(c, tenants).await).await?;
        return Ok(vec![Part {
            db: db.clone(),
            groups: grouped(tenants, &shards),
        }]);
    };
    let nodes: Vec<&str> = placed.iter().map(|p| p.node.as_str()).collect();
    let mut parts = Vec::new();
    for members in grouped(&(0..tenants.len()).collect::<Vec<_>>(), &nodes) {
        let of_node: Vec<Uuid> = members.iter().map(|i| tenants[*i]).collect();
        let shards: Vec<usize> = members.iter().map(|i| placed[*i].shard).collect();
        parts.push(Part {
            db: placed[members[0]].db.clone(),
            groups: grouped(&of_node, &shards),
        });
    }
    Ok(parts)
}

/// `items` grouped by their `keys` (in the same order), in the order each key first
/// appears.
fn grouped<T: Copy, K: PartialEq>(items: &[T], keys: &[K]) -> Vec<Vec<T>> {
    let mut groups: Vec<(&K, Vec<T>)> = Vec::new();
    for (item, key) in items.iter().zip(keys) {
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => group.push(*item),
            None => groups.push((key, vec![*item])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Looks at the table for tenants whose events fell due (see `known`): first thing
/// and at every poll. A job of its own, beside the lanes: on a distributed database a
/// look waits up to [`db::NODE_CONNECT_TIMEOUT`] for a worker that does not answer, and
/// a lane that looked would hold every tenant's events back meanwhile. What it finds
/// wakes the lanes; the workers it could not read are left alone by the rounds until a
/// look reads them again.
async fn look(
    db: Db,
    known: Arc<KnownTenants>,
    wake: Arc<Notify>,
    poll: Duration,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        if let Some(from) = known.take_look(poll) {
            let after = match from {
                LookFrom::Everything => None,
                LookFrom::After(at) => Some(at),
            };
            match db.run(async |c| store::due_tenants(c, after).await).await {
                Ok(found) => {
                    let any = !found.tenants.is_empty();
                    known.found(found.tenants, found.at);
                    known.set_unreachable(found.unreachable);
                    if any {
                        wake.notify_one();
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_s_tenants_are_grouped_by_shard_in_the_order_they_come() {
        let t: Vec<Uuid> = (1..=5).map(Uuid::from_u128).collect();
        let groups = grouped(&t, &[7, 3, 7, 9, 3]);
        assert_eq!(groups, vec![vec![t[0], t[2]], vec![t[1], t[4]], vec![t[3]]]);
    }
}
