//! SQL of the `outbox_event` table as the relay and operators use it.
//!
//! A row is PENDING until the bus acknowledged it (then PUBLISHED) or it failed for good
//! (then DEAD). Claiming does not hold a transaction open: it pushes the row's
//! `next_attempt_at` forward by a claim lease, so a relay that dies mid-publish simply
//! lets the row fall due again (at-least-once), and no connection sits idle in a
//! transaction while the bus answers.

use chrono::{DateTime, Utc};
use sqlx::{FromRow, Row, postgres::PgRow};
use uuid::Uuid;

use super::wake;
use crate::db::{self, Forms, Scan, Sql};

/// A claimed event, ready to publish: one row of [`CLAIM_TENANTS`], read as it is.
#[derive(Debug, Clone, FromRow)]
pub struct PendingEvent {
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    pub aggregate_id: Uuid,
    /// As the writer stored it: a type this release may not know (a newer release's,
    /// during a rolling deploy) is forwarded all the same.
    pub event_type: String,
    /// The message body, as the bus carries it.
    pub payload: String,
    /// Failed attempts so far.
    pub attempts: i32,
    /// Seconds since the change committed (for the publish-lag histogram).
    pub age_secs: f64,
    /// When the change happened (the CloudEvents `time` of a Kafka record).
    pub occurred_at: DateTime<Utc>,
    /// The W3C trace context stored with the event, forwarded as message attributes.
    pub trace_parent: Option<String>,
    pub trace_state: Option<String>,
    /// The body's `schema_version` as text, when it has one.
    pub schema_version: Option<String>,
}

/// A claimed row the relay cannot read: set aside alone (DEAD) with `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    pub reason: String,
}

/// What one claim brought: the events to publish, and the rows to set aside.
#[derive(Debug, Default)]
pub struct Claimed {
    pub events: Vec<PendingEvent>,
    pub unreadable: Vec<Unreadable>,
    /// Due rows that had to wait for an earlier event of their order, parked.
    pub parked: usize,
}

impl Claimed {
    /// Adds another claim's rows to these.
    pub fn absorb(&mut self, other: Claimed) {
        self.events.extend(other.events);
        self.unreadable.extend(other.unreadable);
        self.parked += other.parked;
    }
}

/// Longest `event_type` forwarded; also what SNS and Kafka take as an attribute or a
/// header without complaint.
pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// What restricts the reference `$alias` of the table to the statement's tenants `$1`
/// in the layout `$layout`: nothing on one server; `tenant_id = ANY ($1)` on a
/// distributed one, which Citus runs as one shard's statement when all of `$1` hash
/// into that shard.
macro_rules! route {
    (one_server, $alias:literal) => {
        ""
    };
    (distributed, $alias:literal) => {
        concat!(" AND ", $alias, ".tenant_id = ANY ($1)")
    };
}

/// The join that lets a statement of the relay commit without waiting for its WAL to
/// reach the disk, in the layout `$layout`: on one server only. On a distributed
/// database Citus evaluates the volatile call on the coordinator, where it does
/// nothing for the workers' commits, and plans the statement's subquery apart from it
/// (a distributed subplan whose rows go to the coordinator and back to the worker as
/// an intermediate result): there the statement commits as any other.
macro_rules! async_commit {
    (one_server) => {
        ", (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
    };
    (distributed) => {
        ""
    };
}

/// The claim's text in the layout `$layout` (see [`route`]).
macro_rules! claim_tenants {
    ($layout:ident) => {
        concat!("WITH candidates AS (
         SELECT t.tenant_id, c.event_id
         FROM unnest($1::uuid[], $3::bigint[]) AS t(tenant_id, share)
         CROSS JOIN LATERAL (
             SELECT w.event_id
             FROM (SELECT e.event_id, e.aggregate_id, e.aggregate_seq
                   FROM outbox_event e
                   WHERE e.tenant_id >= t.tenant_id AND e.tenant_id <= t.tenant_id", route!($layout, "e"), "
                     AND e.status = 'PENDING' AND e.next_attempt_at <= $2
                   ORDER BY e.tenant_id, e.next_attempt_at
                   LIMIT t.share + $6
                   FOR UPDATE OF e SKIP LOCKED) w
             WHERE NOT EXISTS (
                 SELECT 1 FROM outbox_event earlier
                 WHERE earlier.tenant_id = t.tenant_id", route!($layout, "earlier"), "
                   AND earlier.aggregate_id = w.aggregate_id
                   AND earlier.aggregate_seq < w.aggregate_seq AND earlier.status <> 'PUBLISHED')
             LIMIT t.share) c)
     UPDATE outbox_event o
     SET next_attempt_at = $2 + $4 * interval '1 millisecond', claimed_by = $5
     FROM candidates c", async_commit!($layout), "
     WHERE o.tenant_id = c.tenant_id", route!($layout, "o"), " AND o.event_id = c.event_id
     RETURNING o.tenant_id, o.event_id, o.aggregate_id, o.event_type, o.payload::text AS payload,
               o.attempts, o.trace_parent, o.trace_state, o.payload->>'schema_version' AS schema_version,
               extract(epoch FROM $2 - o.occurred_at)::float8 AS age_secs, o.occurred_at")
    };
}

/// The park's text in the layout `$layout` (see [`route`]).
macro_rules! park_tenants {
    ($layout:ident) => {
        concat!("WITH scan AS (
         SELECT t.tenant_id, s.event_id, s.waits_until
         FROM unnest($1::uuid[]) AS t(tenant_id)
         CROSS JOIN LATERAL (
             SELECT e.event_id,
                    (SELECT CASE WHEN bool_or(earlier.status = 'DEAD') THEN '-infinity'::timestamptz
                                 ELSE max(earlier.next_attempt_at) END
                     FROM outbox_event earlier
                     WHERE earlier.tenant_id = t.tenant_id", route!($layout, "earlier"), "
                       AND earlier.aggregate_id = e.aggregate_id
                       AND earlier.aggregate_seq < e.aggregate_seq AND earlier.status <> 'PUBLISHED') AS waits_until
             FROM outbox_event e
             WHERE e.tenant_id >= t.tenant_id AND e.tenant_id <= t.tenant_id", route!($layout, "e"), "
               AND e.status = 'PENDING' AND e.next_attempt_at <= $2
             ORDER BY e.tenant_id, e.next_attempt_at
             LIMIT $4
             FOR UPDATE OF e SKIP LOCKED) s)
     UPDATE outbox_event o
     SET next_attempt_at = greatest(s.waits_until, $2 + $3 * interval '1 millisecond')
     FROM scan s", async_commit!($layout), "
     WHERE o.tenant_id = s.tenant_id", route!($layout, "o"), " AND o.event_id = s.event_id AND s.waits_until IS NOT NULL
     RETURNING o.tenant_id")
    };
}

/// The mark's text in the layout `$layout` (see [`route`]; here `$1` holds each marked
/// event's tenant).
macro_rules! mark_published {
    ($layout:ident) => {
        concat!(
            "WITH marked AS (
         UPDATE outbox_event o
         SET status = 'PUBLISHED', published_at = $4, last_error = NULL
         FROM unnest($1::uuid[], $2::uuid[]) AS p(tenant_id, event_id)",
            async_commit!($layout),
            "
         WHERE o.tenant_id = p.tenant_id",
            route!($layout, "o"),
            " AND o.event_id = p.event_id
           AND (o.status = 'PENDING') IS TRUE AND o.claimed_by = $3
         RETURNING o.tenant_id, o.aggregate_id),
     next AS (
         SELECT m.tenant_id, n.event_id, n.status, n.next_attempt_at
         FROM (SELECT DISTINCT tenant_id, aggregate_id FROM marked) m
         CROSS JOIN LATERAL (
             SELECT e.event_id, e.status, e.next_attempt_at
             FROM outbox_event e
             WHERE e.tenant_id = m.tenant_id",
            route!($layout, "e"),
            " AND e.aggregate_id = m.aggregate_id
               AND e.status <> 'PUBLISHED' AND e.event_id <> ALL ($2)
             ORDER BY e.aggregate_seq
             LIMIT 1) n),
     woken AS (
         UPDATE outbox_event o SET next_attempt_at = $4
         FROM next
         WHERE o.tenant_id = next.tenant_id",
            route!($layout, "o"),
            " AND o.event_id = next.event_id
           AND next.status = 'PENDING' AND next.next_attempt_at <> $4
         RETURNING o.tenant_id)
     SELECT (SELECT count(*) FROM marked),
            array(SELECT DISTINCT tenant_id FROM woken) AS woken"
        )
    };
}

/// Up to `$3[i]` due events of each tenant `$1[i]` (a share each), each the oldest
/// unpublished event of its order, leased until `$2` plus `$4` milliseconds to the
/// relay round `$5` (its claim, which fences what it records afterwards). `$2` is the
/// database's time as the round read it. One statement for the round's tenants, however
/// many: a round's cost is its events and its tenants' index probes, not one statement
/// (and one round trip) per tenant.
///
/// Each tenant's due rows are an index range: the tenant and `next_attempt_at <= $2` on
/// `outbox_event_pending_by_tenant`, read in that index's order (the tenant written as a
/// range, `>=` and `<=`: given `=`, the planner may drop the tenant from the order and
/// walk the pending rows of every tenant by time, which it did where it believed few
/// rows were pending), with `$2` a value, not `clock_timestamp()` (a volatile call is a
/// filter the planner cannot bound, and a backlog in retry backoff was then read on
/// every claim). Rows are locked and updated by their primary key. The claim, the park
/// and the mark are planned at every execution (`Sql::replanned`): a plan kept from
/// when the outbox was nearly empty reads the whole table once it is not.
///
/// Per-order ordering: an event is leased only when no earlier event of its order is
/// unpublished (pending, in flight at another relay, or DEAD), so each order has at
/// most one event in flight across all relays and consumers see an order's events in
/// commit order. Each tenant's due rows are read lazily, locked as they are read (so
/// that lanes and relays working one backlog take consecutive slices of it), until its
/// share can go or its share plus `$6` were read. An event that has to wait is *parked*
/// out of the due range by [`PARK`] instead of being read again by every claim, and
/// marking an event published brings its order's next event back at once ([`MARK`]);
/// should that miss a row parked at the same moment, the row comes back by itself when
/// the event before it would have been due again, so a park can delay an event by at
/// most a lease, never lose it.
///
/// `SKIP LOCKED` lets several relays claim side by side without waiting on each other.
/// On one server the claim commits asynchronously (no wait for the WAL flush, see
/// `async_commit!`): it is only a lease. If the database crashes before flushing it,
/// the rows are simply claimable again and published once more, the duplicate a relay
/// crash causes anyway.
pub const CLAIM_TENANTS: &str = claim_tenants!(one_server);

/// [`CLAIM_TENANTS`] on a distributed database, for tenants `$1` whose shard is one:
/// every reference of the table also names them as `tenant_id = ANY ($1)`, which is
/// what lets Citus run the statement on that shard alone (it runs `FOR UPDATE` only
/// there, and does not see a lateral join's tenant as a shard). So a round's claim is
/// one statement per shard it visits.
pub const CLAIM_TENANTS_DISTRIBUTED: &str = claim_tenants!(distributed);

/// Parks up to `$4` due events of each tenant `$1` that have to wait for an earlier
/// event of their order (see [`CLAIM_TENANTS`]): until the latest `next_attempt_at` of
/// the events before them, at least `$2` plus `$3` milliseconds (a lease); behind a
/// DEAD event, for a lease. Run only for the tenants whose claim came back short of
/// their share, which is when rows that must wait can stand in front of due ones.
/// Returns the tenant of each row it parked.
///
/// Never for good, even behind a DEAD event: a park reads the events before its row in
/// its statement's snapshot, so one that began before a re-drive committed sees the
/// event still DEAD, and the mark that publishes the re-driven event (whose wake-up
/// looks at the row before the park commits) cannot bring back a row parked after it.
/// Parked for a lease, such a row is looked at again a lease later at most; rows behind
/// a DEAD event cost a share of a claim and a park per lease until the re-drive.
pub const PARK_TENANTS: &str = park_tenants!(one_server);

/// [`PARK_TENANTS`] on a distributed database, one shard's tenants at a time (see
/// [`CLAIM_TENANTS_DISTRIBUTED`]).
pub const PARK_TENANTS_DISTRIBUTED: &str = park_tenants!(distributed);

/// The claim's two forms.
const CLAIM: Forms<&str> = Forms {
    one_server: CLAIM_TENANTS,
    distributed: CLAIM_TENANTS_DISTRIBUTED,
};

/// The park's two forms.
const PARK: Forms<&str> = Forms {
    one_server: PARK_TENANTS,
    distributed: PARK_TENANTS_DISTRIBUTED,
};

/// The tenants with events that fell due after `$1` and by `$2` (the round's time):
/// what a relay learns from the table, beside what the writers' notifications name
/// (see `known`). A range of `outbox_event_pending`, the index by due time: its cost
/// is the rows that fell due in the range, not the tenants or the rows waiting out a
/// backoff. `$1` is null for a look at everything due.
pub const DUE_TENANTS: &str = "SELECT DISTINCT tenant_id FROM outbox_event
     WHERE status = 'PENDING' AND next_attempt_at > coalesce($1, '-infinity') AND next_attempt_at <= $2";

/// On a distributed database, [`DUE_TENANTS`] on one worker's shards `outbox`, with the
/// coordinator's times as literals (the command runs on a worker). Grouped on the
/// distribution column, so each shard answers for itself. A distributed outbox has no
/// index by due time (see the distribution), so each look reads the shards' pending
/// rows; it runs at a relay's poll, in a job of its own, never in a round.
fn node_due_tenants(outbox: &str, after: Option<DateTime<Utc>>, at: DateTime<Utc>) -> String {
    let after = after.map_or_else(|| "'-infinity'::timestamptz".to_string(), db::time_literal);
    format!(
        "SELECT tenant_id FROM {outbox}
         WHERE status = 'PENDING' AND next_attempt_at > {after} AND next_attempt_at <= {}
         GROUP BY tenant_id",
        db::time_literal(at)
    )
}

/// A tenant a worker found with due events.
#[derive(serde::Deserialize)]
struct DueTenant {
    tenant_id: Uuid,
}

/// The database's time, as a round reads it.
pub const ROUND_TIME: &str = "SELECT clock_timestamp()";

/// The shard of each tenant `$1` (a lookup in the coordinator's metadata, no worker
/// asked): a distributed round without routes claims one shard's tenants per statement.
pub const SHARDS_OF: &str = "SELECT array(
            SELECT get_shard_id_for_distribution_column('outbox_event', t)
            FROM unnest($1::uuid[]) WITH ORDINALITY AS u(t, i) ORDER BY i)";

/// How many tenants one round visits at most in each layout; each gets an equal share
/// of the batch.
///
/// Fewer on a distributed database: there a shard's statement names its tenants on
/// every reference of the table (`tenant_id = ANY ($1)`, see [`CLAIM_TENANTS_DISTRIBUTED`]),
/// and the worker's planner prices each probe of an order's earlier events as one index
/// descent per tenant named. At 100 tenants of one shard it read the shard
/// sequentially for each candidate instead (a claim and park for 100 tenants behind
/// DEAD events took 50 to 150 ms); at 32 the probes stay on the index, rounds beside
/// 20,000 tenants behind DEAD events all end within 50 ms, and a drain of 10,000
/// tenants goes faster for it (decision 168).
pub const TENANTS_PER_ROUND: Forms<usize> = Forms {
    one_server: 100,
    distributed: 32,
};

/// How many due rows one claim reads beyond a tenant's share at most, and one park
/// parks of each tenant.
pub const PARK_WINDOW: i64 = 250;

/// Marks a round's acknowledged events `$2` (of tenants `$1`), on one server
/// asynchronously committed like the claim: a mark lost to a database crash only means those events are
/// published once more (consumers drop duplicates by `event_id`), and per-order order
/// still holds, since an order's next event waits for the lost mark's event to be
/// published again. Each order's next pending event is due at `$4` (the round's
/// database time): brought back if it was parked while it waited, and moved up to `$4`
/// if it was due earlier, so that no round that began before this one can claim it (a
/// round reads its time first and claims after; one that read it just before this mark
/// committed would otherwise take the next event and mark it with an earlier
/// `published_at` than this one). Returns how many were marked and the tenants whose
/// next events it brought back (the relay visits them again).
///
/// `published_at` is that time too: the start of the round that published the event,
/// read once (no volatile `clock_timestamp()` in the `UPDATE`, which a distributed
/// PostgreSQL refuses), so published events sort by the round that claimed them,
/// whichever lane marked first, and each order's events by their sequence. The next
/// event is found per order, one probe of `outbox_event_unpublished_by_order` each:
/// asked for all of them at once, the planner read every pending row of the tenant (0.6
/// s a mark beside a backlog of a million), and the marked rows are joined on the key
/// from `unnest` for the same reason: given `event_id = ANY ($2)` under statistics that
/// still said the table was empty, the planner chose the tenant's pending rows over the
/// primary key, and does still unless the status test is one it cannot match to a
/// partial index (`IS TRUE`).
pub const MARK_PUBLISHED: &str = mark_published!(one_server);

/// [`MARK_PUBLISHED`] on a distributed database, one shard's events at a time (see
/// [`CLAIM_TENANTS_DISTRIBUTED`]).
pub const MARK_PUBLISHED_DISTRIBUTED: &str = mark_published!(distributed);

/// The mark's two forms.
const MARK: Forms<&str> = Forms {
    one_server: MARK_PUBLISHED,
    distributed: MARK_PUBLISHED_DISTRIBUTED,
};

/// Records refused publishes of tenant `$1`, each due again at its own `retry_at`
/// (the round's database time plus the event's backoff: a time computed from a row
/// would be a `STABLE` call with a column, which Citus refuses in an `UPDATE`).
pub const MARK_FAILED: &str = "UPDATE outbox_event o
     SET attempts = f.attempts,
         status = CASE WHEN f.dead THEN 'DEAD' ELSE 'PENDING' END,
         next_attempt_at = f.retry_at,
         last_error = f.error
     FROM unnest($2::uuid[], $3::int[], $4::bool[], $5::timestamptz[], $6::text[])
          AS f(event_id, attempts, dead, retry_at, error)
     WHERE o.tenant_id = $1 AND o.event_id = f.event_id AND (o.status = 'PENDING') IS TRUE
       AND o.claimed_by = $7";

/// Rows of tenant `$1` the relay cannot read are set aside: DEAD at once, with the
/// reason, where the claim `$4` still holds them.
pub const SET_ASIDE: &str = "UPDATE outbox_event o
     SET status = 'DEAD', last_error = u.reason
     FROM unnest($2::uuid[], $3::text[]) AS u(event_id, reason)
     WHERE o.tenant_id = $1 AND o.event_id = u.event_id AND (o.status = 'PENDING') IS TRUE
       AND o.claimed_by = $4";

/// Events of tenant `$1` whose call failed as a whole go back in line after `$4` ms,
/// attempts untouched.
pub const PUT_BACK: &str = "UPDATE outbox_event o
     SET next_attempt_at = statement_timestamp() + $4 * interval '1 millisecond'
     FROM unnest($2::uuid[]) AS p(event_id)
     WHERE o.tenant_id = $1 AND o.event_id = p.event_id AND (o.status = 'PENDING') IS TRUE
       AND o.claimed_by = $3";

/// Pending count, oldest pending age, dead count: from the partial indexes only, so it
/// stays cheap however many published rows the table holds.
pub const STATS: &str = "SELECT (SELECT count(*) FROM outbox_event WHERE status = 'PENDING'),
            (SELECT extract(epoch FROM clock_timestamp() - min(occurred_at))::float8
               FROM outbox_event WHERE status = 'PENDING'),
            (SELECT count(*) FROM outbox_event WHERE status = 'DEAD')";

pub const REDRIVE_ONE: &str = "UPDATE outbox_event
     SET status = 'PENDING', attempts = 0, next_attempt_at = statement_timestamp()
     WHERE status = 'DEAD' AND event_id = $1
     RETURNING tenant_id";

/// The tenants with DEAD events (a plain read; [`REDRIVE_TENANT`] puts each back).
pub const DEAD_TENANTS: &str = "SELECT DISTINCT tenant_id FROM outbox_event WHERE status = 'DEAD'";

/// Puts every DEAD event of tenant `$1` back in line.
pub const REDRIVE_TENANT: &str = "UPDATE outbox_event
     SET status = 'PENDING', attempts = 0, next_attempt_at = statement_timestamp()
     WHERE tenant_id = $1 AND status = 'DEAD'";

/// The oldest `$2` events published more than `$1` seconds ago, grouped by tenant,
/// with the cut-off as the database's clock put it. A plain read: it locks nothing, so
/// it may span tenants; each tenant's rows are then deleted by [`PURGE_PUBLISHED`].
pub const PURGEABLE_PUBLISHED: &str = "WITH cut AS MATERIALIZED (
         SELECT clock_timestamp() - $1 * interval '1 second' AS at),
     oldest AS (
         SELECT tenant_id, event_id FROM outbox_event
         WHERE status = 'PUBLISHED' AND published_at <= (SELECT at FROM cut)
         ORDER BY published_at
         LIMIT $2)
     SELECT tenant_id, array_agg(event_id) AS events, (SELECT at FROM cut) AS cutoff
     FROM oldest GROUP BY tenant_id";

/// Deletes tenant `$1`'s events `$2` that are still published before `$3`, by primary
/// key; a row another transaction holds is left for the next pass.
pub const PURGE_PUBLISHED: &str = "DELETE FROM outbox_event
     WHERE tenant_id = $1 AND event_id IN (
         SELECT event_id FROM outbox_event
         WHERE tenant_id = $1 AND event_id = ANY ($2)
           AND status = 'PUBLISHED' AND published_at <= $3
         FOR UPDATE SKIP LOCKED)";

/// Where a round starts: the database's time, by which what is due is due.
pub type RoundTime = DateTime<Utc>;

/// What a relay's look at the table found.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The database's time the look judged by: the next look goes on from here.
    pub at: DateTime<Utc>,
    /// Tenants with events that fell due in the range looked at.
    pub tenants: Vec<Uuid>,
    /// The workers that did not answer (`host:port`; distributed only): their tenants'
    /// events wait.
    pub unreachable: Vec<String>,
}

/// How a layout's look reads the table.
#[derive(Clone, Copy)]
enum Look {
    /// One statement, a range of the index by due time.
    Range,
    /// Worker by worker (see [`node_due_tenants`]).
    EachNode,
}

const LOOKS: Forms<Look> = Forms {
    one_server: Look::Range,
    distributed: Look::EachNode,
};

/// The tenants with events that fell due after `after` (everything due, when none)
/// and by the database's time now (see [`DUE_TENANTS`]). On a distributed database a
/// worker that does not answer leaves its tenants out, and is named.
pub async fn due_tenants(sql: &mut Sql<'_>, after: Option<DateTime<Utc>>) -> sqlx::Result<Found> {
    let at = round_time(sql).await?;
    match sql.layout().pick(&LOOKS) {
        Look::Range => {
            let tenants: Vec<Uuid> = sql
                .query_scalar(DUE_TENANTS)
                .bind(after)
                .bind(at)
                .fetch_all(sql.conn())
                .await?;
            Ok(Found {
                at,
                tenants,
                unreachable: Vec::new(),
            })
        }
        Look::EachNode => {
            let read = db::read_each_node(sql, "outbox_event", |outbox| {
                node_due_tenants(outbox, after, at)
            })
            .await?;
            Ok(Found {
                at,
                tenants: read
                    .rows
                    .into_iter()
                    .map(|t: DueTenant| t.tenant_id)
                    .collect(),
                unreachable: read.unreachable,
            })
        }
    }
}

/// The database's time (see [`ROUND_TIME`]).
pub async fn round_time(sql: &mut Sql<'_>) -> sqlx::Result<DateTime<Utc>> {
    sql.query_scalar(ROUND_TIME).fetch_one(sql.conn()).await
}

/// The shard of each of `tenants`, in their order (see [`SHARDS_OF`]; distributed
/// databases only).
pub async fn shards_of(sql: &mut Sql<'_>, tenants: &[Uuid]) -> sqlx::Result<Vec<i64>> {
    sql.query_scalar(SHARDS_OF)
        .bind(tenants)
        .fetch_one(sql.conn())
        .await
}

/// Claims up to `share` due events of each tenant of `shares` in one statement (see
/// [`CLAIM_TENANTS`]; on a distributed database the tenants must share a shard), leased
/// for `lease_ms` from `now`. Each row is read on its own: one that cannot be read is
/// returned as [`Unreadable`] and never fails its batch-mates.
pub async fn claim_tenants(
    sql: &mut Sql<'_>,
    shares: &[(Uuid, i64)],
    now: DateTime<Utc>,
    lease_ms: i64,
    claim: Uuid,
) -> sqlx::Result<Claimed> {
    let mut claimed = Claimed::default();
    if shares.is_empty() {
        return Ok(claimed);
    }
    let (tenants, sizes): (Vec<Uuid>, Vec<i64>) = shares.iter().copied().unzip();
    let statement = sql.layout().pick(&CLAIM);
    let mut sql = sql.replanned();
    let rows: Vec<PgRow> = sql
        .query(statement)
        .bind(&tenants)
        .bind(now)
        .bind(&sizes)
        .bind(lease_ms)
        .bind(claim)
        .bind(PARK_WINDOW)
        .fetch_all(sql.conn())
        .await?;
    for row in &rows {
        match read(row) {
            Ok(event) => claimed.events.push(event),
            Err(unreadable) => claimed.unreadable.push(unreadable),
        }
    }
    Ok(claimed)
}

/// Claims up to `batch` due events of `tenant` (see [`claim_tenants`]).
pub async fn claim_tenant(
    sql: &mut Sql<'_>,
    tenant: Uuid,
    now: DateTime<Utc>,
    batch: i64,
    lease_ms: i64,
    claim: Uuid,
) -> sqlx::Result<Claimed> {
    claim_tenants(sql, &[(tenant, batch)], now, lease_ms, claim).await
}

/// Parks the due rows of `tenants` that must wait (see [`PARK_TENANTS`]; on a
/// distributed database the tenants must share a shard): the tenant of each row parked.
pub async fn park_tenants(
    sql: &mut Sql<'_>,
    tenants: &[Uuid],
    now: DateTime<Utc>,
    lease_ms: i64,
) -> sqlx::Result<Vec<Uuid>> {
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    let statement = sql.layout().pick(&PARK);
    let mut sql = sql.replanned();
    sql.query_scalar(statement)
        .bind(tenants)
        .bind(now)
        .bind(lease_ms)
        .bind(PARK_WINDOW)
        .fetch_all(sql.conn())
        .await
}

/// One claimed row as an event, or why it cannot be forwarded. Only the envelope is
/// checked (a JSON object as the body, a type that fits an attribute), never the type's
/// meaning: whatever a release of orderd writes passes.
fn read(row: &PgRow) -> Result<PendingEvent, Unreadable> {
    let unreadable = |reason: String| -> Unreadable {
        Unreadable {
            tenant_id: row.try_get("tenant_id").unwrap_or_default(),
            event_id: row.try_get("event_id").unwrap_or_default(),
            reason: format!("unreadable: {reason}"),
        }
    };
    let event = PendingEvent::from_row(row).map_err(|e| unreadable(e.to_string()))?;
    let event_type_fits = !event.event_type.is_empty()
        && event.event_type.len() <= MAX_EVENT_TYPE_LEN
        && event.event_type.bytes().all(|b| b.is_ascii_graphic());
    if !event_type_fits {
        return Err(unreadable(format!(
            "event_type must be 1 to {MAX_EVENT_TYPE_LEN} printable ASCII characters"
        )));
    }
    // jsonb renders an object with a leading brace and nothing else that way.
    if !event.payload.starts_with('{') {
        return Err(unreadable("the payload is not a JSON object".into()));
    }
    Ok(event)
}

/// What a mark did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Marked {
    /// Events marked published.
    pub published: i64,
    /// Tenants whose orders' next events it brought back into the due range.
    pub woken: Vec<Uuid>,
}

/// Marks `events` (tenant, event) acknowledged by the bus, where `claim` still holds
/// them, and brings each order's next event back into the due range at `now` (see
/// [`MARK_PUBLISHED`]; on a distributed database the events' tenants must share a
/// shard).
pub async fn mark_published(
    sql: &mut Sql<'_>,
    events: &[(Uuid, Uuid)],
    claim: Uuid,
    now: DateTime<Utc>,
) -> sqlx::Result<Marked> {
    if events.is_empty() {
        return Ok(Marked::default());
    }
    let (tenants, ids): (Vec<Uuid>, Vec<Uuid>) = events.iter().copied().unzip();
    let mut sql = sql.replanned();
    let (published, woken): (i64, Vec<Uuid>) = sql
        .query_as(sql.layout().pick(&MARK))
        .bind(&tenants)
        .bind(&ids)
        .bind(claim)
        .bind(now)
        .fetch_one(sql.conn())
        .await?;
    Ok(Marked { published, woken })
}

/// Puts `tenant`'s events whose call failed back in line after `retry_ms`, where
/// `claim` still holds them.
pub async fn put_back(
    sql: &mut Sql<'_>,
    tenant: Uuid,
    events: &[Uuid],
    claim: Uuid,
    retry_ms: i64,
) -> sqlx::Result<u64> {
    let done = sql
        .query(PUT_BACK)
        .bind(tenant)
        .bind(events)
        .bind(claim)
        .bind(retry_ms)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// Sets `tenant`'s unreadable rows aside (see [`SET_ASIDE`]).
pub async fn set_aside(
    sql: &mut Sql<'_>,
    tenant: Uuid,
    rows: &[&Unreadable],
    claim: Uuid,
) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.event_id).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.reason.clone()).collect();
    let done = sql
        .query(SET_ASIDE)
        .bind(tenant)
        .bind(ids)
        .bind(reasons)
        .bind(claim)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// One failed publish to record.
#[derive(Debug, Clone)]
pub struct Failure {
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    /// Failed attempts including this one.
    pub attempts: i32,
    /// DEAD now (permanent error, or the attempt limit reached).
    pub dead: bool,
    /// Delay before the next attempt (ignored when dead).
    pub retry_in_ms: i64,
    pub error: String,
}

/// Records `tenant`'s refused publishes: attempts, last error, next attempt time (`now`,
/// the round's database time, plus the backoff) or
/// DEAD, where `claim` still holds them.
pub async fn mark_failed(
    sql: &mut Sql<'_>,
    tenant: Uuid,
    failures: &[&Failure],
    claim: Uuid,
    now: DateTime<Utc>,
) -> sqlx::Result<u64> {
    if failures.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = failures.iter().map(|f| f.event_id).collect();
    let attempts: Vec<i32> = failures.iter().map(|f| f.attempts).collect();
    let dead: Vec<bool> = failures.iter().map(|f| f.dead).collect();
    let retry: Vec<DateTime<Utc>> = failures
        .iter()
        .map(|f| now + chrono::TimeDelta::milliseconds(f.retry_in_ms))
        .collect();
    let errors: Vec<String> = failures
        .iter()
        .map(|f| f.error.chars().take(2000).collect())
        .collect();
    let done = sql
        .query(MARK_FAILED)
        .bind(tenant)
        .bind(ids)
        .bind(attempts)
        .bind(dead)
        .bind(retry)
        .bind(errors)
        .bind(claim)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// What an operator (and the gauges) want to know about the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    pub pending: i64,
    /// Seconds since the oldest pending event committed; 0 when none is pending.
    pub oldest_pending_age_secs: f64,
    pub dead: i64,
    /// Shards the figures leave out, their worker not answering (distributed only).
    pub unreadable_shards: u64,
}

/// [`STATS`] on one worker of a distributed database (see [`db::read_each_node`]), with
/// the oldest pending commit time instead of its age (the age is the coordinator's to
/// judge).
fn node_stats(outbox: &str) -> String {
    format!(
        "SELECT (SELECT count(*) FROM {outbox} WHERE status = 'PENDING') AS pending,
                (SELECT min(occurred_at) FROM {outbox} WHERE status = 'PENDING') AS oldest,
                (SELECT count(*) FROM {outbox} WHERE status = 'DEAD') AS dead"
    )
}

/// One worker's outbox figures.
#[derive(serde::Deserialize)]
struct NodeStats {
    pending: i64,
    oldest: Option<DateTime<Utc>>,
    dead: i64,
}

pub async fn stats(sql: &mut Sql<'_>) -> sqlx::Result<Stats> {
    if let Scan::EachNode = sql.layout().pick(&db::WHOLE_TABLE_READS) {
        return stats_each_node(sql).await;
    }
    let (pending, oldest, dead): (i64, Option<f64>, i64) =
        sql.query_as(STATS).fetch_one(sql.conn()).await?;
    Ok(Stats {
        pending,
        oldest_pending_age_secs: oldest.unwrap_or(0.0).max(0.0),
        dead,
        unreadable_shards: 0,
    })
}

/// The figures of a distributed outbox, worker by worker: the workers that answer are
/// counted, the shards of those that do not are reported as unreadable.
async fn stats_each_node(sql: &mut Sql<'_>) -> sqlx::Result<Stats> {
    let read = db::read_each_node(sql, "outbox_event", node_stats).await?;
    let now = round_time(sql).await?;
    let oldest = read.rows.iter().filter_map(|n: &NodeStats| n.oldest).min();
    Ok(Stats {
        pending: read.rows.iter().map(|n| n.pending).sum(),
        oldest_pending_age_secs: oldest.map_or(0.0, |at| (now - at).as_seconds_f64().max(0.0)),
        dead: read.rows.iter().map(|n| n.dead).sum(),
        unreadable_shards: read.unreadable_shards,
    })
}

/// Puts one DEAD event back in line; returns how many (0 or 1). The relays hear of
/// its tenant at once (see `wake`): nothing else would name it before their next look.
pub async fn redrive_one(sql: &mut Sql<'_>, event_id: Uuid) -> sqlx::Result<u64> {
    let tenants: Vec<Uuid> = sql
        .query_scalar(REDRIVE_ONE)
        .bind(event_id)
        .fetch_all(sql.conn())
        .await?;
    wake::notify(sql, &tenants).await?;
    Ok(tenants.len() as u64)
}

/// Puts every DEAD event back in line; returns how many. The relays hear of the
/// tenants, as for [`redrive_one`].
pub async fn redrive_all_dead(sql: &mut Sql<'_>) -> sqlx::Result<u64> {
    let tenants: Vec<Uuid> = sql.query_scalar(DEAD_TENANTS).fetch_all(sql.conn()).await?;
    let mut redriven = 0;
    for tenant in &tenants {
        let done = sql
            .query(REDRIVE_TENANT)
            .bind(tenant)
            .execute(sql.conn())
            .await?;
        redriven += done.rows_affected();
    }
    wake::notify(sql, &tenants).await?;
    Ok(redriven)
}

/// [`PURGEABLE_PUBLISHED`] on one worker's shards `outbox`, by the coordinator's
/// cut-off `cut` (see [`db::read_each_node`]).
fn node_purgeable_published(outbox: &str, cut: DateTime<Utc>, batch: i64) -> String {
    format!(
        "SELECT tenant_id, array_agg(event_id) AS events
         FROM (SELECT tenant_id, event_id FROM {outbox}
               WHERE status = 'PUBLISHED' AND published_at <= {}
               ORDER BY published_at
               LIMIT {batch}) oldest
         GROUP BY tenant_id",
        db::time_literal(cut)
    )
}

/// One tenant's events a worker found past retention.
#[derive(serde::Deserialize)]
struct NodePurgeable {
    tenant_id: Uuid,
    events: Vec<Uuid>,
}

/// One tenant's published events a purge found, and the cut-off they were found by.
pub type PublishedGroup = (Uuid, Vec<Uuid>, DateTime<Utc>);

/// Up to `batch` of the oldest events published more than `retention_secs` ago,
/// grouped by tenant (a read that locks nothing; [`delete_published`] then deletes each
/// group). On a distributed database they are read worker by worker: a worker that
/// does not answer keeps its rows until a later pass, and the others are purged.
pub async fn purgeable_published(
    sql: &mut Sql<'_>,
    retention_secs: i64,
    batch: i64,
) -> sqlx::Result<Vec<PublishedGroup>> {
    match sql.layout().pick(&db::WHOLE_TABLE_READS) {
        Scan::OneStatement => {
            sql.query_as(PURGEABLE_PUBLISHED)
                .bind(retention_secs)
                .bind(batch)
                .fetch_all(sql.conn())
                .await
        }
        Scan::EachNode => {
            let cut = db::seconds_ago(sql, retention_secs).await?;
            let read = db::read_each_node(sql, "outbox_event", |outbox| {
                node_purgeable_published(outbox, cut, batch)
            })
            .await?;
            Ok(read
                .rows
                .into_iter()
                .map(|r: NodePurgeable| (r.tenant_id, r.events, cut))
                .collect())
        }
    }
}

/// Deletes one tenant's group of [`purgeable_published`] still published before its
/// cut-off; how many went.
pub async fn delete_published(
    sql: &mut Sql<'_>,
    (tenant, events, cutoff): PublishedGroup,
) -> sqlx::Result<u64> {
    let done = sql
        .query(PURGE_PUBLISHED)
        .bind(tenant)
        .bind(events)
        .bind(cutoff)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// Up to `$2` events of tenant `$1`, whatever their state, by primary key: how many,
/// and until when a relay may still be publishing one of them (a PENDING row's
/// `next_attempt_at` is its claim's lease when a relay claimed it; never later than
/// `$3` ms from now, the longest lease a relay takes).
pub const ERASE_TENANT_BATCH: &str = "WITH gone AS (
         DELETE FROM outbox_event
         WHERE tenant_id = $1
           AND event_id = ANY (ARRAY(SELECT event_id FROM outbox_event WHERE tenant_id = $1 LIMIT $2))
         RETURNING status, claimed_by, next_attempt_at)
     SELECT count(*) AS deleted,
            least(max(next_attempt_at) FILTER (WHERE status = 'PENDING' AND claimed_by IS NOT NULL),
                  statement_timestamp() + $3 * interval '1 millisecond') AS published_until
     FROM gone";

/// How many events of tenant `$1` are left.
pub const COUNT_TENANT: &str = "SELECT count(*) FROM outbox_event WHERE tenant_id = $1";

/// Deletes up to `batch` of `tenant`'s events (see [`ERASE_TENANT_BATCH`]): how many
/// went, and until when a relay may still be publishing one of them.
pub async fn erase_tenant_batch(
    sql: &mut Sql<'_>,
    tenant: Uuid,
    batch: i64,
    lease_ms: i64,
) -> sqlx::Result<(i64, Option<DateTime<Utc>>)> {
    sql.query_as(ERASE_TENANT_BATCH)
        .bind(tenant)
        .bind(batch)
        .bind(lease_ms)
        .fetch_one(sql.conn())
        .await
}

/// How many events of `tenant` are left (see [`COUNT_TENANT`]).
pub async fn count_tenant(sql: &mut Sql<'_>, tenant: Uuid) -> sqlx::Result<i64> {
    sql.tenant_count(COUNT_TENANT, tenant).await
}
