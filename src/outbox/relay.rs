//! The relay: claims due outbox rows, publishes them, records the outcome.
//!
//! Any number of relays may run against one database (inside `orderd serve`, or alone
//! as `orderd relay`): claims use `SKIP LOCKED` and a lease, and an order's next event
//! becomes claimable only once the previous one is published, so per-order order holds
//! across relays. Delivery is at least once: a relay that dies after the bus acknowledged a
//! batch but before marking it lets the lease run out, and the batch is published again
//! with the same `event_id`s.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::settings::OutboxConfig;
use super::{
    backoff::Backoff,
    due::{DueTenants, Part, Start},
    event::TypeLabel,
    publisher::{FailureReason, Message, Outcome, PublishError, Publisher, Retry},
    store::{self, Failure, PendingEvent},
};
use crate::{
    db::{self, Db, Forms, ListenOn, Sql},
    metrics,
    supervisor::Supervisor,
    telemetry,
    trace_context::TraceContext,
};

pub use super::wake::CHANNEL;

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Round {
    pub claimed: usize,
    pub published: usize,
    /// Entries the bus refused (each cost its event an attempt).
    pub failed: usize,
    pub dead: usize,
    /// Events whose call failed as a whole: no attempt charged, put back in line.
    pub not_sent: usize,
    /// Why the call failed, when one did.
    pub call_failure: Option<PublishError>,
    /// How long the relay pauses before its next round, when calls failed as a whole.
    pub pause: Option<Duration>,
    /// Due events set aside until an earlier event of their order is published.
    pub parked: usize,
    /// The relay knows of tenants with due events that the round did not visit. A
    /// backlog spread thinly over many tenants (one event each, as a re-drive or a busy
    /// hour of many small tenants leaves it) fills only a fraction of each batch, and
    /// without this the lane would wait for the poll after every round of it.
    pub more_tenants: bool,
}

pub struct Relay {
    db: Db,
    /// A session of its own for `LISTEN` (not through a transaction pooler).
    listen_on: ListenOn,
    publisher: Arc<dyn Publisher>,
    config: OutboxConfig,
    backoff: Backoff,
    /// Signalled by the LISTEN task on every notification; permits coalesce, so a burst
    /// of commits wakes the loop once.
    wake: Arc<Notify>,
    /// Whether to LISTEN at all (off: poll only; the benchmark compares both).
    listen: bool,
    /// Consecutive rounds whose calls all failed as a whole: the relay's own backoff.
    failed_rounds: AtomicU32,
    /// The tenants with due events this relay knows of.
    tenants: DueTenants,
}

impl Relay {
    /// A relay on `db`, listening for commits on a session opened with `listen_on`.
    pub fn new(
        db: Db,
        listen_on: impl Into<ListenOn>,
        publisher: Arc<dyn Publisher>,
        config: OutboxConfig,
    ) -> Self {
        let backoff = Backoff {
            initial: config.backoff_initial,
            max: config.backoff_max,
        };
        Self {
            listen_on: listen_on.into(),
            publisher,
            config,
            backoff,
            wake: Arc::new(Notify::new()),
            listen: true,
            failed_rounds: AtomicU32::new(0),
            tenants: DueTenants::default(),
            db,
        }
    }

    /// Poll only, without LISTEN (for comparison in benchmarks).
    pub fn without_listen(mut self) -> Self {
        self.listen = false;
        self
    }

    /// Runs until `shutdown` is cancelled, then returns after finishing the round in
    /// progress (a round's rows are either marked or, if the process dies, re-published
    /// once their lease runs out).
    ///
    /// When calls to the bus fail as a whole, the relay backs off as a whole, exponentially
    /// per consecutive failed round, and the events wait without being charged.
    ///
    /// Its parts run as jobs of a supervisor of its own, which ends with it: the
    /// listening session, the publisher's watch, the look at the table for tenants
    /// whose events fell due, and on one server the statistics check.
    pub async fn run(self, shutdown: CancellationToken) {
        let relay = Arc::new(self);
        let parts = Supervisor::under(&shutdown);
        if relay.listen {
            let listening = relay.clone();
            let on = relay.listen_on.clone();
            parts.spawn("outbox listener", move |token| async move {
                listening.listen(on, token).await
            });
            // Writers routed to the node that holds their tenant's shard notify there.
            for (node, options) in relay.db.node_sessions() {
                tracing::debug!(node, "listening for the writers of a Citus node");
                let listening = relay.clone();
                let on = ListenOn {
                    options,
                    bound: relay.listen_on.bound,
                };
                parts.spawn("outbox node listener", move |token| async move {
                    listening.listen(on, token).await
                });
            }
        }
        if let Some(watch) = relay.publisher.clone().watch(parts.token()) {
            parts.spawn("publisher watch", |_| watch);
        }
        relay
            .tenants
            .start_side_jobs(
                &parts,
                &relay.db,
                relay.config.analyze,
                &relay.wake,
                relay.config.poll,
            )
            .await;
        tracing::info!(
            batch = relay.config.batch_size,
            parallel_rounds = relay.config.parallel_rounds,
            listen = relay.listen,
            layout = relay.db.layout().name(),
            "outbox relay started"
        );
        futures::future::join_all(
            (0..relay.config.parallel_rounds.max(1)).map(|_| relay.lane(&shutdown)),
        )
        .await;
        parts.shutdown().await;
        tracing::info!("outbox relay stopped");
    }

    /// Turns notifications on [`CHANNEL`] into wake-ups, and tells the tenant strategy
    /// what was heard; a session lost or regained wakes the relay too, since
    /// notifications in between may be lost.
    async fn listen(&self, on: ListenOn, shutdown: CancellationToken) {
        let liveness = on.liveness();
        crate::db::listen(
            on,
            CHANNEL,
            liveness,
            |heard| {
                self.tenants.heard(&heard);
                self.wake.notify_one();
            },
            shutdown,
        )
        .await
    }

    /// One sequence of rounds. Several run side by side (`parallel_rounds`), so that
    /// one lane's claim overlaps another's publish and marking: under a backlog the
    /// database and the bus both stay busy. They claim from the same table exactly as
    /// separate relays do (`SKIP LOCKED`, leases, one event in flight per order), so
    /// ordering is unaffected.
    async fn lane(&self, shutdown: &CancellationToken) {
        loop {
            if shutdown.is_cancelled() {
                break;
            }
            let pause = match self.round().await {
                Ok(Round {
                    pause: Some(pause),
                    call_failure: Some(failure),
                    not_sent,
                    ..
                }) => {
                    tracing::warn!(
                        reason = failure.reason.as_str(),
                        error = %failure.detail,
                        events = not_sent,
                        pause_ms = pause.as_millis() as u64,
                        "publishing fails as a whole; backing off without charging any event"
                    );
                    Some(pause)
                }
                // Half a batch or more means a backlog: more is due right now. (A
                // round beside another relay's may come out short of a full batch, its
                // rows taken by the other; waiting for the poll then would halve the
                // drain.)
                // Parked rows mean the claim read rows that had to wait instead of
                // due ones: more may be due behind them.
                // Tenants not visited yet may have due events too.
                Ok(round)
                    if 2 * round.claimed as u32 >= self.config.batch_size
                        || round.parked > 0
                        || (round.claimed > 0 && round.more_tenants) =>
                {
                    continue;
                }
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox round failed; retrying after the poll interval");
                    None
                }
            };
            match pause {
                // Backing off: commits do not wake the relay, only time or shutdown.
                Some(pause) => tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.cancelled() => {}
                },
                None => tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(self.config.poll) => {}
                    _ = shutdown.cancelled() => {}
                },
            }
        }
    }

    /// Claims one batch, publishes it and records every outcome, fenced on this
    /// round's claim: a row another relay claimed since (after this one's lease ran
    /// out) is left to that relay. On a distributed database with routes the round's
    /// tenants come in parts, one per node that holds their shards, and each part's
    /// claim and marks run on that node, side by side with the others' (decision 172).
    pub async fn round(&self) -> sqlx::Result<Round> {
        let lease_ms = claim_lease(self.config.publish_timeout).as_millis() as i64;
        let claim = Uuid::new_v4();
        let batch_size = i64::from(self.config.batch_size);
        let claiming = Instant::now();
        let Some(start) = self.tenants.start(&self.db, batch_size as usize).await? else {
            // No tenant known to have due events: nothing was asked of the database.
            return Ok(Round::default());
        };
        // Each part on its own database, side by side, with that database's time: a
        // node that fails leaves only its own tenants out of the round.
        let budgets = budgets(batch_size, &start);
        let claims = futures::future::join_all(start.parts.iter().zip(budgets).map(
            |(part, budget)| async move {
                part.db
                    .run(async |c| {
                        let now = store::round_time(c).await?;
                        let got =
                            claim_fairly(c, &part.groups, now, budget, lease_ms, claim).await?;
                        Ok::<_, sqlx::Error>((now, got))
                    })
                    .await
            },
        ))
        .await;
        let mut times = Vec::with_capacity(claims.len());
        let (mut batch, mut unreadable, mut parked) = (Vec::new(), Vec::new(), 0);
        let (mut had_nothing, mut full, mut failed) = (Vec::new(), Vec::new(), None);
        for claimed in claims {
            match claimed {
                Ok((now, got)) => {
                    times.push(Some(now));
                    batch.extend(got.claimed.events);
                    unreadable.extend(got.claimed.unreadable);
                    parked += got.claimed.parked;
                    had_nothing.extend(got.had_nothing);
                    full.extend(got.full);
                }
                Err(e) => {
                    times.push(None);
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            if times.iter().all(Option::is_none) {
                return Err(e);
            }
            tracing::warn!(error = %e, "cannot claim on one of the nodes; the round goes on with the others' tenants");
        }
        self.tenants.claimed(&start, &had_nothing, full);
        let more_tenants = start.more;
        let parts = Parts {
            parts: &start.parts,
            times,
        };
        metrics::claim_duration(claiming.elapsed().as_secs_f64());
        if !unreadable.is_empty() {
            self.set_aside(&unreadable, claim, &parts).await?;
        }
        let too_old = !may_still_publish(claiming.elapsed(), self.config.publish_timeout);
        if too_old && !batch.is_empty() {
            // Paused or stalled since the claim began (a stopped process, a claim that
            // waited): publishing now could outlast the lease, and an erasure waits only
            // that long for the relays. The rows fall due again for a fresh claim.
            tracing::warn!(
                events = batch.len(),
                claimed_ms = claiming.elapsed().as_millis() as u64,
                "the round's claim is too old to start publishing; leaving its events to a fresh claim"
            );
        }
        if batch.is_empty() || too_old {
            return Ok(Round {
                claimed: batch.len() + unreadable.len(),
                dead: unreadable.len(),
                parked,
                more_tenants,
                ..Round::default()
            });
        }
        let messages: Vec<Message> = batch.iter().map(to_message).collect();
        let (system, destination) = (self.publisher.system(), self.publisher.destination());
        let spans: Vec<tracing::Span> = batch
            .iter()
            .map(|event| publish_span(event, system, destination))
            .collect();
        let started = Instant::now();
        let outcomes = self.publisher.publish(&messages).await;
        tracing::debug!(
            claimed = batch.len(),
            publish_ms = started.elapsed().as_millis() as u64,
            "outbox round published"
        );

        let mut round = Round {
            claimed: batch.len() + unreadable.len(),
            parked,
            more_tenants,
            ..Round::default()
        };
        let mut published = Vec::new();
        let mut failures = Vec::new();
        let mut not_sent = Vec::new();
        for ((event, outcome), span) in batch.iter().zip(outcomes).zip(spans) {
            if !matches!(outcome, Outcome::Published) {
                span.record("otel.status_code", "ERROR");
            }
            drop(span); // ends with the publish it stands for
            match outcome {
                Outcome::Published => {
                    metrics::published(TypeLabel::of(&event.event_type), event.age_secs);
                    published.push((event.tenant_id, event.event_id));
                }
                Outcome::Rejected(error) => {
                    metrics::publish_failure(error.reason);
                    failures.push(self.failure(event, &error));
                }
                Outcome::NotSent(error) => {
                    metrics::publish_failure(error.reason);
                    not_sent.push((event.tenant_id, event.event_id));
                    round.call_failure = Some(error);
                }
            }
        }
        // Mark published rows first: the sooner they are marked, the sooner the next
        // event of each order may go. One statement for each part's events (one per
        // shard on a distributed database), the parts side by side, each on its own
        // database at its own time.
        let marks = futures::future::join_all(parts.claimed().map(|(part, now)| {
            let published: Vec<(Uuid, Uuid)> = published
                .iter()
                .filter(|(tenant, _)| part.visits(tenant))
                .copied()
                .collect();
            let failures: Vec<&Failure> = failures
                .iter()
                .filter(|f| part.visits(&f.tenant_id))
                .collect();
            async move {
                if published.is_empty() && failures.is_empty() {
                    return Ok(Vec::new());
                }
                part.db
                    .run(async |c| {
                        let mut woken = Vec::new();
                        for group in &part.groups {
                            let events: Vec<(Uuid, Uuid)> = published
                                .iter()
                                .filter(|(tenant, _)| group.contains(tenant))
                                .copied()
                                .collect();
                            woken
                                .extend(store::mark_published(c, &events, claim, now).await?.woken);
                        }
                        for (tenant, failures) in by_tenant(&failures, |f| f.tenant_id) {
                            let failures: Vec<&Failure> = failures.into_iter().copied().collect();
                            store::mark_failed(c, tenant, &failures, claim, now).await?;
                        }
                        Ok::<_, sqlx::Error>(woken)
                    })
                    .await
            }
        }))
        .await;
        let mut woken = Vec::new();
        for marked in marks {
            woken.extend(marked?);
        }
        // Their orders' next events are due now: visited in the next round.
        self.tenants.woken(woken);
        if not_sent.is_empty() || !published.is_empty() {
            // The bus answers: whatever failed before is over.
            self.failed_rounds.store(0, Ordering::Relaxed);
        }
        if !not_sent.is_empty() {
            // Back in line after the relay's pause, attempts untouched.
            let failed_rounds = self.failed_rounds.fetch_add(1, Ordering::Relaxed) + 1;
            let pause = self.backoff.next(failed_rounds);
            let pause_ms = pause.as_millis() as i64;
            for (tenant, events) in by_tenant(&not_sent, |e| e.0) {
                let ids: Vec<Uuid> = events.iter().map(|e| e.1).collect();
                parts
                    .db_of(tenant)
                    .unwrap_or(&self.db)
                    .run(async |c| store::put_back(c, tenant, &ids, claim, pause_ms).await)
                    .await?;
            }
            round.pause = published.is_empty().then_some(pause);
        }
        round.published = published.len();
        round.failed = failures.len();
        round.dead = failures.iter().filter(|f| f.dead).count() + unreadable.len();
        round.not_sent = not_sent.len();
        Ok(round)
    }

    /// Rows that cannot be read go DEAD alone, counted and logged, so that the rest of
    /// their batch is published.
    async fn set_aside(
        &self,
        rows: &[store::Unreadable],
        claim: Uuid,
        parts: &Parts<'_>,
    ) -> sqlx::Result<()> {
        for row in rows {
            metrics::publish_failure(FailureReason::Unreadable);
            tracing::error!(event_id = %row.event_id, tenant = %row.tenant_id, error = %row.reason, "outbox row cannot be read; set aside as DEAD");
        }
        for (tenant, rows) in by_tenant(rows, |r| r.tenant_id) {
            parts
                .db_of(tenant)
                .unwrap_or(&self.db)
                .run(async |c| store::set_aside(c, tenant, &rows, claim).await)
                .await?;
        }
        Ok(())
    }

    /// How a refused entry is recorded: one more attempt, DEAD when permanent or at
    /// the limit, else due again after the backoff.
    fn failure(&self, event: &PendingEvent, error: &PublishError) -> Failure {
        let attempts = event.attempts + 1;
        let dead = error.retry == Retry::Permanent || attempts as u32 >= self.config.max_attempts;
        if dead {
            tracing::error!(event_id = %event.event_id, attempts, reason = error.reason.as_str(), error = %error.detail, "outbox event is DEAD");
        } else {
            tracing::warn!(event_id = %event.event_id, attempts, reason = error.reason.as_str(), error = %error.detail, "the bus refused an event; will retry");
        }
        Failure {
            tenant_id: event.tenant_id,
            event_id: event.event_id,
            attempts,
            dead,
            retry_in_ms: self.backoff.next(attempts as u32).as_millis() as i64,
            error: format!("{}: {}", error.reason, error.detail),
        }
    }
}

/// Where a round records its outcomes: each part's database, at the time its claim
/// read there (none for a part whose claim failed: it claimed nothing).
struct Parts<'a> {
    parts: &'a [Part],
    times: Vec<Option<DateTime<Utc>>>,
}

impl Parts<'_> {
    /// The parts whose claim went through, each with its time.
    fn claimed(&self) -> impl Iterator<Item = (&Part, DateTime<Utc>)> {
        self.parts
            .iter()
            .zip(&self.times)
            .filter_map(|(part, time)| time.map(|t| (part, t)))
    }

    /// The database of the part that visited `tenant`.
    fn db_of(&self, tenant: Uuid) -> Option<&Db> {
        self.parts
            .iter()
            .find(|part| part.visits(&tenant))
            .map(|part| &part.db)
    }
}

/// A round's batch shared out among its parts by their tenants (the first ones one
/// more each), so that every tenant's share is the same whichever node it is on.
fn budgets(batch: i64, start: &Start) -> Vec<i64> {
    let total = start.tenants().max(1) as i64;
    let mut budgets: Vec<i64> = start
        .parts
        .iter()
        .map(|part| batch * part.tenants() as i64 / total)
        .collect();
    let left = batch - budgets.iter().sum::<i64>();
    for budget in budgets.iter_mut().take(left.max(0) as usize) {
        *budget += 1;
    }
    budgets
}

/// Claims up to `batch` due events of a part's tenants, one statement for each
/// group of them (all of them on one server, each shard's on a distributed database):
/// each tenant gets an equal share first (so one tenant's backlog cannot crowd out
/// another's few events), then what the shares left of the batch is shared out among
/// the tenants that filled theirs and may have more (so a lone backlog still drains in
/// full batches). Rows that must wait are parked for the tenants that came back short.
///
/// Also says which tenants had nothing to claim and nothing to park, and which filled
/// their share (they may have more).
async fn claim_fairly(
    sql: &mut Sql<'_>,
    groups: &[Vec<Uuid>],
    now: DateTime<Utc>,
    batch: i64,
    lease_ms: i64,
    claim: Uuid,
) -> sqlx::Result<Claim> {
    let mut claimed = store::Claimed::default();
    let mut had_nothing = Vec::new();
    let tenants: usize = groups.iter().map(Vec::len).sum();
    let share = (batch / tenants.max(1) as i64).max(1);
    let mut filled: Vec<Vec<Uuid>> = Vec::new();
    for group in groups {
        let shares: Vec<(Uuid, i64)> = group.iter().map(|t| (*t, share)).collect();
        let Some(got) = claim_group(sql, &shares, now, lease_ms, claim, true).await? else {
            continue;
        };
        filled.push(got.full);
        had_nothing.extend(got.empty);
        claimed.parked += got.parked.len();
        claimed.absorb(got.claimed);
    }
    let left = batch - (claimed.events.len() + claimed.unreadable.len()) as i64;
    let full: Vec<Uuid> = filled.iter().flatten().copied().collect();
    if left <= 0 || full.is_empty() {
        return Ok(Claim {
            claimed,
            had_nothing,
            full,
        });
    }
    // What is left, shared out evenly (the first ones one more each).
    let more = full.len() as i64;
    let (each, extra) = (left / more, left % more);
    let mut nth = 0i64;
    for group in filled {
        let shares: Vec<(Uuid, i64)> = group
            .into_iter()
            .map(|tenant| {
                nth += 1;
                (tenant, each + i64::from(nth <= extra))
            })
            .filter(|(_, share)| *share > 0)
            .collect();
        if shares.is_empty() {
            continue;
        }
        if let Some(got) = claim_group(sql, &shares, now, lease_ms, claim, false).await? {
            claimed.absorb(got.claimed);
        }
    }
    Ok(Claim {
        claimed,
        had_nothing,
        full,
    })
}

/// What a round's claim brought, and what it learnt of its tenants.
struct Claim {
    claimed: store::Claimed,
    /// Tenants with nothing to claim and nothing to park.
    had_nothing: Vec<Uuid>,
    /// Tenants that filled their share: more of their events may be due, read and let
    /// go by this claim.
    full: Vec<Uuid>,
}

/// How many rows of each tenant a claim brought (events and unreadable rows), counted
/// once per claim.
fn taken_by_tenant(claimed: &store::Claimed) -> HashMap<Uuid, i64> {
    let mut taken = HashMap::new();
    let tenants = claimed.events.iter().map(|e| e.tenant_id);
    for tenant in tenants.chain(claimed.unreadable.iter().map(|u| u.tenant_id)) {
        *taken.entry(tenant).or_insert(0) += 1;
    }
    taken
}

/// One group's part of a round's claim.
struct GroupClaimed {
    claimed: store::Claimed,
    /// Its tenants that filled their share (they may have more).
    full: Vec<Uuid>,
    /// The tenant of each row parked (with `park`).
    parked: Vec<Uuid>,
    /// Its tenants with nothing claimed and nothing parked (with `park`).
    empty: Vec<Uuid>,
}

/// How one group's part of a round's claim stands to the others'.
#[derive(Clone, Copy, Debug)]
enum GroupClaim {
    /// Statements of the round: a failure is the database's, and fails the round.
    InTheRound,
    /// A transaction (or savepoint) of its own: a failure is its worker's, and leaves
    /// only this group's tenants out of the round.
    OnItsOwn,
}

/// The two forms of a group's part of a claim.
const GROUP_CLAIMS: Forms<GroupClaim> = Forms {
    one_server: GroupClaim::InTheRound,
    distributed: GroupClaim::OnItsOwn,
};

/// One group's claim of its `shares` and, with `park`, the park of what must wait for
/// the tenants that came back short (rows that must wait may stand in front of due
/// ones): what it claimed, which tenants filled their share, the tenant of each row
/// parked, and the tenants that had nothing due at all (none claimed, none parked:
/// rows another lane or relay held were skipped, and that claim keeps their tenant
/// known, see `DueTenants::claimed`).
///
/// On a distributed database each group (one shard's tenants) is a transaction (or
/// savepoint) of its own, and one that fails is left out of the round (`None`): a
/// worker that stopped answering fails only its own shards' claims, and the round goes
/// on with the others'. On one server a failure is the database's, and fails the round.
async fn claim_group(
    sql: &mut Sql<'_>,
    shares: &[(Uuid, i64)],
    now: DateTime<Utc>,
    lease_ms: i64,
    claim: Uuid,
    park: bool,
) -> sqlx::Result<Option<GroupClaimed>> {
    let work = async |sql: &mut Sql<'_>| {
        let claimed = store::claim_tenants(sql, shares, now, lease_ms, claim).await?;
        let taken_by = taken_by_tenant(&claimed);
        let taken = |tenant: &Uuid| taken_by.get(tenant).copied().unwrap_or(0);
        let (mut full, mut short) = (Vec::new(), Vec::new());
        for (tenant, share) in shares {
            if taken(tenant) >= *share {
                full.push(*tenant);
            } else {
                short.push(*tenant);
            }
        }
        let mut got = GroupClaimed {
            claimed,
            full,
            parked: Vec::new(),
            empty: Vec::new(),
        };
        if park {
            got.parked = store::park_tenants(sql, &short, now, lease_ms).await?;
            got.empty = short
                .into_iter()
                .filter(|t| taken(t) == 0 && !got.parked.contains(t))
                .collect();
        }
        Ok::<_, sqlx::Error>(got)
    };
    match sql.layout().pick(&GROUP_CLAIMS) {
        GroupClaim::InTheRound => work(sql).await.map(Some),
        GroupClaim::OnItsOwn => match sql
            .atomically(async |sql| work(sql).await.map(db::End::Commit))
            .await
        {
            Ok(done) => Ok(Some(done)),
            Err(e) => {
                tracing::warn!(tenants = shares.len(), error = %e, "cannot claim a shard's tenants' events; the round goes on without them");
                Ok(None)
            }
        },
    }
}

/// `items` grouped by tenant, in the order tenants first appear: every statement that
/// records outcomes names one tenant.
fn by_tenant<T>(items: &[T], tenant_of: impl Fn(&T) -> Uuid) -> Vec<(Uuid, Vec<&T>)> {
    let mut groups: Vec<(Uuid, Vec<&T>)> = Vec::new();
    for item in items {
        let tenant = tenant_of(item);
        match groups.iter_mut().find(|(t, _)| *t == tenant) {
            Some((_, group)) => group.push(item),
            None => groups.push((tenant, vec![item])),
        }
    }
    groups
}

/// The producer span of one event's publish (messaging semantic conventions), a child
/// of the trace the event carries from the request that caused it.
fn publish_span(event: &PendingEvent, system: &'static str, destination: &str) -> tracing::Span {
    let span = tracing::info_span!(
        target: telemetry::SPANS,
        "publish",
        otel.name = "orders publish",
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = system,
        messaging.operation.type = "send",
        messaging.destination.name = destination,
        messaging.message.id = %event.event_id,
        event_type = %TypeLabel::of(&event.event_type).as_str(),
    );
    let stored =
        TraceContext::from_stored(event.trace_parent.as_deref(), event.trace_state.as_deref());
    telemetry::continue_trace(&span, stored.as_ref());
    span
}

fn to_message(event: &PendingEvent) -> Message {
    Message {
        event_id: event.event_id,
        event_type: event.event_type.clone(),
        tenant_id: event.tenant_id,
        aggregate_id: event.aggregate_id,
        body: event.payload.clone(),
        trace_parent: event.trace_parent.clone(),
        trace_state: event.trace_state.clone(),
        schema_version: event.schema_version.clone(),
        occurred_at: event.occurred_at,
    }
}

/// How long a claimed row stays invisible to other relays, for a relay whose publishes
/// time out after `publish_timeout`: that plus half again and a second, room to record
/// the outcome. A relay that dies holding rows delays them this long; one that outlives
/// it only causes a duplicate, which consumers drop by `event_id`. It is also how long
/// after a row's deletion a relay may still be publishing it (an erasure waits it out).
pub fn claim_lease(publish_timeout: Duration) -> Duration {
    publish_timeout * 3 / 2 + Duration::from_secs(1)
}

/// Whether a round whose claim began `since_claim` ago may still start publishing: only
/// if a publish of `publish_timeout` ends within the claim's lease. After the lease no
/// relay starts a publish of what it claimed: the rows may have been claimed again, or
/// deleted by an erasure that waited one lease for the relays (the one publish that
/// can still reach the bus after an erasure ends is one whose request left before the
/// relay stalled).
fn may_still_publish(since_claim: Duration, publish_timeout: Duration) -> bool {
    since_claim + publish_timeout < claim_lease(publish_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_starts_publishing_only_while_the_publish_ends_within_the_lease() {
        let timeout = Duration::from_secs(10);
        // The lease is 16 s: a publish started before 6 s ends within it.
        assert!(may_still_publish(Duration::from_millis(50), timeout));
        assert!(may_still_publish(Duration::from_millis(5_999), timeout));
        assert!(!may_still_publish(Duration::from_secs(6), timeout));
        // A relay stopped for a minute after its claim publishes nothing of it.
        assert!(!may_still_publish(Duration::from_secs(60), timeout));
    }
}
