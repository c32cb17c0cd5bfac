//! SQL of the `outbox_event` table as the relay and operators use it.
//!
//! A row is PENDING until the bus acknowledged it (then PUBLISHED) or it failed for good
//! (then DEAD). Claiming does not hold a transaction open: it pushes the row's
//! `next_attempt_at` forward by a claim lease, so a relay that dies mid-publish simply
//! lets the row fall due again (at-least-once), and no connection sits idle in a
//! transaction while the bus answers.

use sqlx::{FromRow, Row, postgres::PgRow};
use uuid::Uuid;

use crate::db::Sql;

/// A claimed event, ready to publish: one row of [`CLAIM_DUE`], read as it is.
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
}

/// Longest `event_type` forwarded; also what SNS and Kafka take as an attribute or a
/// header without complaint.
pub const MAX_EVENT_TYPE_LEN: usize = 128;

/// Up to `$1` due events, each the oldest unpublished event of its order, shared
/// fairly among the tenants that have events due, leased for `$2` milliseconds to the
/// relay round `$3` (its claim, which fences what it records afterwards).
///
/// Fairness: the relay does not simply take the oldest due events of all tenants,
/// behind which one tenant's backlog (a bulk import, a re-drive of many DEAD rows) would
/// make everyone else wait. It walks up to `$5` tenants that have pending events, from
/// the random tenant id `$4` on and around (a loose index scan: one probe of
/// `outbox_event_pending_by_tenant` per tenant), and gives each an equal share of the
/// batch, its oldest due events first. Whatever the shares leave of the batch is filled
/// with the oldest due events of all, so a lone backlog still drains at full batches.
/// A tenant with one new event is thus in the next round, whatever another has pending.
///
/// Per-order ordering lives in the `NOT EXISTS`: an event waits while any earlier
/// event of its order is not yet PUBLISHED (pending, in flight at another relay, or
/// DEAD), so each order has at most one event in flight across all relays and
/// consumers see an order's events in commit order. Other orders are unaffected.
/// Each tenant's share is read in `(tenant_id, next_attempt_at)` order, the order of
/// `outbox_event_pending_by_tenant`, and its tenant is bounded as a range (`>=` and
/// `<=`), which keeps `tenant_id` in that order: given `=`, the planner dropped it,
/// ordered by the time alone and walked the whole pending index by time looking for a
/// quiet tenant's one row behind another's million (3 s a claim, measured).
///
/// `SKIP LOCKED` lets several relays claim side by side without waiting on each other;
/// both the shares and the oldest rows are locked as they are read, so that relays
/// working one backlog side by side take consecutive slices of it, not the same one.
/// The candidates are carried by their row addresses and locked and updated through
/// them (TID scans): joined back on the key, the planner chose an index on the tenant
/// alone, which for a tenant with a million pending rows meant scanning all of them
/// once per candidate.
///
/// The claim commits asynchronously (no wait for the WAL flush): it is only a lease.
/// If the database crashes before flushing it, the rows are simply claimable again and
/// published once more, the duplicate a relay crash causes anyway.
pub const CLAIM_DUE: &str = "WITH RECURSIVE tenants(tenant_id, n) AS (
         SELECT coalesce(
                    (SELECT p.tenant_id FROM outbox_event p
                     WHERE p.status = 'PENDING' AND p.tenant_id >= $4 ORDER BY p.tenant_id LIMIT 1),
                    (SELECT p.tenant_id FROM outbox_event p
                     WHERE p.status = 'PENDING' ORDER BY p.tenant_id LIMIT 1)),
                1
         UNION ALL
         SELECT coalesce(
                    (SELECT p.tenant_id FROM outbox_event p
                     WHERE p.status = 'PENDING' AND p.tenant_id > t.tenant_id ORDER BY p.tenant_id LIMIT 1),
                    (SELECT p.tenant_id FROM outbox_event p
                     WHERE p.status = 'PENDING' ORDER BY p.tenant_id LIMIT 1)),
                t.n + 1
         FROM tenants t
         WHERE t.tenant_id IS NOT NULL AND t.n < $5),
     visited AS (SELECT DISTINCT tenant_id FROM tenants WHERE tenant_id IS NOT NULL),
     share AS (SELECT greatest(1, $1 / greatest(count(*), 1)) AS per_tenant FROM visited),
     fair AS (
         SELECT c.row, 0 AS rank, c.next_attempt_at
         FROM visited v CROSS JOIN share
         CROSS JOIN LATERAL (
             SELECT e.ctid AS row, e.next_attempt_at
             FROM outbox_event e
             WHERE e.tenant_id >= v.tenant_id AND e.tenant_id <= v.tenant_id AND e.status = 'PENDING'
               AND e.next_attempt_at <= clock_timestamp()
               AND NOT EXISTS (
                   SELECT 1 FROM outbox_event earlier
                   WHERE earlier.tenant_id = e.tenant_id AND earlier.aggregate_id = e.aggregate_id
                     AND earlier.aggregate_seq < e.aggregate_seq AND earlier.status <> 'PUBLISHED')
             ORDER BY e.tenant_id, e.next_attempt_at
             LIMIT share.per_tenant
             FOR UPDATE OF e SKIP LOCKED) c),
     oldest AS (
         SELECT e.ctid AS row, NULL::int AS rank, e.next_attempt_at
         FROM outbox_event e
         WHERE e.status = 'PENDING' AND e.next_attempt_at <= clock_timestamp()
           AND NOT EXISTS (
               SELECT 1 FROM outbox_event earlier
               WHERE earlier.tenant_id = e.tenant_id AND earlier.aggregate_id = e.aggregate_id
                 AND earlier.aggregate_seq < e.aggregate_seq AND earlier.status <> 'PUBLISHED')
         ORDER BY e.next_attempt_at
         LIMIT $1
         FOR UPDATE OF e SKIP LOCKED),
     candidates AS (
         SELECT row
         FROM (SELECT * FROM fair UNION ALL SELECT * FROM oldest) c
         GROUP BY row
         ORDER BY min(rank) NULLS LAST, min(next_attempt_at)
         LIMIT $1),
     due AS (
         SELECT e.ctid AS row
         FROM outbox_event e
         WHERE e.ctid = ANY (ARRAY(SELECT row FROM candidates))
           AND e.status = 'PENDING' AND e.next_attempt_at <= clock_timestamp()
         FOR UPDATE OF e SKIP LOCKED)
     UPDATE outbox_event o
     SET next_attempt_at = clock_timestamp() + $2 * interval '1 millisecond', claimed_by = $3
     FROM due, (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE o.ctid = due.row
     RETURNING o.tenant_id, o.event_id, o.aggregate_id, o.event_type, o.payload::text AS payload, o.attempts,
               o.trace_parent, o.trace_state, o.payload->>'schema_version' AS schema_version,
               extract(epoch FROM clock_timestamp() - o.occurred_at)::float8 AS age_secs";

/// How many tenants with pending events one claim visits at most: each costs one probe
/// of an index of pending rows and one short range scan, and each gets an equal share
/// of the batch.
pub const FAIR_TENANTS_PER_CLAIM: i32 = 32;

/// Marks a round's acknowledged events, asynchronously committed like the claim: a
/// mark lost to a database crash only means those events are published once more
/// (consumers drop duplicates by `event_id`), and per-order order still holds, since
/// an order's next event waits for the lost mark's event to be published again.
pub const MARK_PUBLISHED: &str = "UPDATE outbox_event o
     SET status = 'PUBLISHED', published_at = clock_timestamp(), last_error = NULL
     FROM unnest($1::uuid[], $2::uuid[]) AS p(tenant_id, event_id),
          (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE o.tenant_id = p.tenant_id AND o.event_id = p.event_id AND o.status = 'PENDING'
       AND o.claimed_by = $3";

pub const MARK_FAILED: &str = "UPDATE outbox_event o
     SET attempts = f.attempts,
         status = CASE WHEN f.dead THEN 'DEAD' ELSE 'PENDING' END,
         next_attempt_at = clock_timestamp() + f.retry_ms * interval '1 millisecond',
         last_error = f.error
     FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::bool[], $5::bigint[], $6::text[])
          AS f(tenant_id, event_id, attempts, dead, retry_ms, error)
     WHERE o.tenant_id = f.tenant_id AND o.event_id = f.event_id AND o.status = 'PENDING'
       AND o.claimed_by = $7";

/// Rows the relay cannot read are set aside: DEAD at once, with the reason, where the
/// claim `$4` still holds them.
pub const SET_ASIDE: &str = "UPDATE outbox_event o
     SET status = 'DEAD', last_error = u.reason
     FROM unnest($1::uuid[], $2::uuid[], $3::text[]) AS u(tenant_id, event_id, reason)
     WHERE o.tenant_id = u.tenant_id AND o.event_id = u.event_id AND o.status = 'PENDING'
       AND o.claimed_by = $4";

/// Events whose call failed as a whole go back in line after `$4` ms, attempts
/// untouched.
pub const PUT_BACK: &str = "UPDATE outbox_event o
     SET next_attempt_at = clock_timestamp() + $4 * interval '1 millisecond'
     FROM unnest($1::uuid[], $2::uuid[]) AS p(tenant_id, event_id)
     WHERE o.tenant_id = p.tenant_id AND o.event_id = p.event_id AND o.status = 'PENDING'
       AND o.claimed_by = $3";

/// Pending count, oldest pending age, dead count: from the partial indexes only, so it
/// stays cheap however many published rows the table holds.
pub const STATS: &str = "SELECT (SELECT count(*) FROM outbox_event WHERE status = 'PENDING'),
            (SELECT extract(epoch FROM clock_timestamp() - min(occurred_at))::float8
               FROM outbox_event WHERE status = 'PENDING'),
            (SELECT count(*) FROM outbox_event WHERE status = 'DEAD')";

pub const REDRIVE_ONE: &str = "UPDATE outbox_event
     SET status = 'PENDING', attempts = 0, next_attempt_at = clock_timestamp()
     WHERE status = 'DEAD' AND event_id = $1";

pub const REDRIVE_ALL: &str = "UPDATE outbox_event
     SET status = 'PENDING', attempts = 0, next_attempt_at = clock_timestamp()
     WHERE status = 'DEAD'";

/// Up to `$2` events published more than `$1` seconds ago, oldest first.
pub const PURGE_PUBLISHED: &str = "DELETE FROM outbox_event
     WHERE (tenant_id, event_id) IN (
         SELECT tenant_id, event_id FROM outbox_event
         WHERE status = 'PUBLISHED' AND published_at <= clock_timestamp() - $1 * interval '1 second'
         ORDER BY published_at
         LIMIT $2
         FOR UPDATE SKIP LOCKED)";

/// Claims up to `batch` due events, shared fairly among tenants (see [`CLAIM_DUE`]),
/// and leases them for `lease_ms`.
/// Each row is read on its own: one that cannot be read is returned as
/// [`Unreadable`] and never fails its batch-mates.
pub async fn claim_due(
    sql: &mut Sql<'_>,
    batch: i64,
    lease_ms: i64,
    claim: Uuid,
) -> sqlx::Result<Claimed> {
    // Where this round starts walking the tenants: anywhere, so that over the rounds
    // every tenant is visited alike.
    let start = Uuid::new_v4();
    let rows: Vec<PgRow> = sql
        .query(CLAIM_DUE)
        .bind(batch)
        .bind(lease_ms)
        .bind(claim)
        .bind(start)
        .bind(FAIR_TENANTS_PER_CLAIM)
        .fetch_all(sql.conn())
        .await?;
    let mut claimed = Claimed::default();
    for row in &rows {
        match read(row) {
            Ok(event) => claimed.events.push(event),
            Err(unreadable) => claimed.unreadable.push(unreadable),
        }
    }
    Ok(claimed)
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

/// Marks events acknowledged by the bus, where `claim` still holds them.
pub async fn mark_published(
    sql: &mut Sql<'_>,
    events: &[(Uuid, Uuid)],
    claim: Uuid,
) -> sqlx::Result<u64> {
    if events.is_empty() {
        return Ok(0);
    }
    let (tenants, ids): (Vec<Uuid>, Vec<Uuid>) = events.iter().copied().unzip();
    let done = sql
        .query(MARK_PUBLISHED)
        .bind(tenants)
        .bind(ids)
        .bind(claim)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// Puts events whose call failed back in line after `retry_ms`, where `claim` still
/// holds them.
pub async fn put_back(
    sql: &mut Sql<'_>,
    events: &[(Uuid, Uuid)],
    claim: Uuid,
    retry_ms: i64,
) -> sqlx::Result<u64> {
    let (tenants, ids): (Vec<Uuid>, Vec<Uuid>) = events.iter().copied().unzip();
    let done = sql
        .query(PUT_BACK)
        .bind(tenants)
        .bind(ids)
        .bind(claim)
        .bind(retry_ms)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// Sets unreadable rows aside (see [`SET_ASIDE`]).
pub async fn set_aside(sql: &mut Sql<'_>, rows: &[Unreadable], claim: Uuid) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let tenants: Vec<Uuid> = rows.iter().map(|r| r.tenant_id).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.event_id).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.reason.clone()).collect();
    let done = sql
        .query(SET_ASIDE)
        .bind(tenants)
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

/// Records refused publishes: attempts, last error, next attempt time or DEAD, where
/// `claim` still holds them.
pub async fn mark_failed(
    sql: &mut Sql<'_>,
    failures: &[Failure],
    claim: Uuid,
) -> sqlx::Result<u64> {
    if failures.is_empty() {
        return Ok(0);
    }
    let tenants: Vec<Uuid> = failures.iter().map(|f| f.tenant_id).collect();
    let ids: Vec<Uuid> = failures.iter().map(|f| f.event_id).collect();
    let attempts: Vec<i32> = failures.iter().map(|f| f.attempts).collect();
    let dead: Vec<bool> = failures.iter().map(|f| f.dead).collect();
    let retry: Vec<i64> = failures.iter().map(|f| f.retry_in_ms).collect();
    let errors: Vec<String> = failures
        .iter()
        .map(|f| f.error.chars().take(2000).collect())
        .collect();
    let done = sql
        .query(MARK_FAILED)
        .bind(tenants)
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
}

pub async fn stats(sql: &mut Sql<'_>) -> sqlx::Result<Stats> {
    let (pending, oldest, dead): (i64, Option<f64>, i64) =
        sql.query_as(STATS).fetch_one(sql.conn()).await?;
    Ok(Stats {
        pending,
        oldest_pending_age_secs: oldest.unwrap_or(0.0).max(0.0),
        dead,
    })
}

/// Puts one DEAD event back in line; returns how many (0 or 1).
pub async fn redrive_one(sql: &mut Sql<'_>, event_id: Uuid) -> sqlx::Result<u64> {
    let done = sql
        .query(REDRIVE_ONE)
        .bind(event_id)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// Puts every DEAD event back in line; returns how many.
pub async fn redrive_all_dead(sql: &mut Sql<'_>) -> sqlx::Result<u64> {
    let done = sql.query(REDRIVE_ALL).execute(sql.conn()).await?;
    Ok(done.rows_affected())
}

/// Deletes up to `batch` events published more than `retention_secs` ago.
pub async fn purge_published(
    sql: &mut Sql<'_>,
    retention_secs: i64,
    batch: i64,
) -> sqlx::Result<u64> {
    let done = sql
        .query(PURGE_PUBLISHED)
        .bind(retention_secs)
        .bind(batch)
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
                  clock_timestamp() + $3 * interval '1 millisecond') AS published_until
     FROM gone";

/// How many events of tenant `$1` are left.
pub const COUNT_TENANT: &str = "SELECT count(*) FROM outbox_event WHERE tenant_id = $1";
