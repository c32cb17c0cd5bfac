//! SQL of the `idempotency_record` table. Every time comparison uses the database
//! clock (`clock_timestamp()`), so leases and expiry mean the same on every replica.
//!
//! Claim, takeover, reclaim and release commit asynchronously: each statement sets
//! `synchronous_commit = off` for its own (implicit) transaction with
//! `set_config(..., true)`. Why that is safe: PostgreSQL flushes WAL in order, so the
//! durable commit of the business transaction also makes the earlier claim durable. If
//! the server dies before that, a claim may vanish, but then nothing was done under it
//! and a retry simply claims afresh (a lost release or takeover likewise only leaves a
//! lease to expire). Visibility is not delayed, only the flush, so concurrent requests
//! see the claim at once. Folding the setting into the statement (rather than a pool
//! with a connection option) keeps it per transaction, so it also holds behind a
//! transaction pooler, and needs no second pool. The fenced completion is the one
//! durable commit of a request.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor, Postgres, postgres::PgArguments, query::Query};
use uuid::Uuid;

use super::{
    decide::{Record, State},
    fingerprint::Fingerprint,
    key::IdempotencyKey,
};
use crate::{metrics::Endpoint, tenant::TenantId};

/// The primary key of a record.
#[derive(Debug, Clone)]
pub struct Scope {
    pub tenant: TenantId,
    pub endpoint: Endpoint,
    pub key: IdempotencyKey,
}

/// What a completion is fenced on: the record, the owner token its claim drew (the
/// completion matches only while that token still owns it), and how long the stored
/// response lives.
#[derive(Debug, Clone, Copy)]
pub struct Fence<'a> {
    pub scope: &'a Scope,
    pub owner: Uuid,
    pub ttl_secs: i64,
    /// The database's clock when this request came to own the key: the time of the
    /// change the operation makes.
    pub at: DateTime<Utc>,
}

/// A stored response, replayed byte for byte: what the first execution answered.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub location: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// Claim or read, in one statement: `INSERT ... ON CONFLICT DO NOTHING` (the one
/// atomic decision of who owns a new key), and when the key exists, its record as of
/// the statement's snapshot. So a new key costs one round trip and a replay the cache
/// does not hold costs one too. One row, `claimed` true, when this statement claimed
/// the key (`read_at` is then the claim's time); one row, `claimed` false, with the
/// existing record; no row when a concurrent request's claim committed after this
/// statement's snapshot was taken (the caller reads again).
pub const CLAIM_OR_READ: &str = "WITH claim AS (
         INSERT INTO idempotency_record
                (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until, created_at)
         SELECT $1, $2, $3, $4, 'PROCESSING', $5, clock_timestamp() + $6 * interval '1 millisecond', clock_timestamp()
         FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
         ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING
         RETURNING created_at
     )
     SELECT true AS claimed, NULL::text AS state, NULL::bytea AS fingerprint, NULL::uuid AS owner_token,
            NULL::timestamptz AS lease_until, NULL::timestamptz AS expires_at, NULL::smallint AS response_status,
            NULL::text AS response_location, NULL::text AS response_content_type, NULL::bytea AS response_body,
            created_at AS read_at
     FROM claim
     UNION ALL
     SELECT false, state, fingerprint, owner_token, lease_until, expires_at, response_status,
            response_location, response_content_type, response_body, clock_timestamp()
     FROM idempotency_record
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3 AND NOT EXISTS (SELECT 1 FROM claim)";

/// The record and the database clock, by primary key.
pub const READ: &str = "SELECT state, fingerprint, owner_token, lease_until, expires_at,
            response_status, response_location, response_content_type, response_body,
            clock_timestamp() AS read_at
     FROM idempotency_record
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3";

/// Compare-and-set takeover of an expired lease from the owner seen.
pub const TAKE_OVER: &str = "UPDATE idempotency_record
     SET owner_token = $4, lease_until = clock_timestamp() + $5 * interval '1 millisecond'
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'PROCESSING' AND owner_token = $6 AND lease_until <= clock_timestamp()
     RETURNING clock_timestamp()";

/// A completed key past its retention becomes a fresh claim.
pub const RECLAIM: &str = "UPDATE idempotency_record
     SET state = 'PROCESSING', fingerprint = $4, owner_token = $5,
         lease_until = clock_timestamp() + $6 * interval '1 millisecond',
         response_status = NULL, response_location = NULL, response_content_type = NULL,
         response_body = NULL, completed_at = NULL, expires_at = NULL, created_at = clock_timestamp()
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'COMPLETED' AND expires_at <= clock_timestamp()
     RETURNING clock_timestamp()";

/// The text of the fenced completion (parameters `$1` to `$9`, see [`bind_completion`]),
/// as a macro so that a one-statement operation can embed it with `concat!`.
macro_rules! fenced_completion {
    () => {
        "UPDATE idempotency_record
     SET state = 'COMPLETED', response_status = $5, response_location = $6,
         response_content_type = $7, response_body = $8, completed_at = clock_timestamp(),
         expires_at = clock_timestamp() + $9 * interval '1 second', lease_until = NULL
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'PROCESSING' AND owner_token = $4"
    };
}

pub(crate) use fenced_completion;

/// The fenced completion: matches only while the owner still owns the claim.
pub const COMPLETE: &str = fenced_completion!();

/// Gives a claim back: only the owner's own PROCESSING row.
pub const RELEASE: &str = "DELETE FROM idempotency_record
     USING (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'PROCESSING' AND owner_token = $4";

/// Up to `$1` completed keys past retention, oldest first.
pub const PURGE_EXPIRED: &str = "DELETE FROM idempotency_record
     WHERE (tenant_id, endpoint, idem_key) IN (
         SELECT tenant_id, endpoint, idem_key FROM idempotency_record
         WHERE state = 'COMPLETED' AND expires_at <= clock_timestamp()
         ORDER BY expires_at
         LIMIT $1
         FOR UPDATE SKIP LOCKED)";

/// Up to `$2` PROCESSING claims whose lease ran out more than `$1` seconds ago.
pub const PURGE_ABANDONED: &str = "DELETE FROM idempotency_record
     WHERE (tenant_id, endpoint, idem_key) IN (
         SELECT tenant_id, endpoint, idem_key FROM idempotency_record
         WHERE state = 'PROCESSING' AND lease_until <= clock_timestamp() - $1 * interval '1 second'
         ORDER BY lease_until
         LIMIT $2
         FOR UPDATE SKIP LOCKED)";

/// A row of [`CLAIM_OR_READ`]: the record's columns are NULL when `claimed`.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    claimed: bool,
    #[sqlx(flatten)]
    row: Row,
}

#[derive(sqlx::FromRow)]
struct Row {
    state: Option<String>,
    fingerprint: Option<Vec<u8>>,
    owner_token: Option<Uuid>,
    lease_until: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    response_status: Option<i16>,
    response_location: Option<String>,
    response_content_type: Option<String>,
    response_body: Option<Vec<u8>>,
    read_at: DateTime<Utc>,
}

impl Row {
    /// The row as the state machine sees it. The table's CHECK constraints make the
    /// other shapes impossible; should one appear anyway, it is an error, never a
    /// guessed value.
    fn into_record(self) -> Result<Record, sqlx::Error> {
        let state = match (self.state.as_deref(), self.owner_token, self.lease_until) {
            (Some("PROCESSING"), Some(owner), Some(lease_until)) => {
                State::Processing { owner, lease_until }
            }
            (Some("COMPLETED"), ..) => {
                match (self.expires_at, self.response_status, self.response_body) {
                    (Some(expires_at), Some(status), Some(body)) => State::Completed {
                        expires_at,
                        response: StoredResponse {
                            status: u16::try_from(status).map_err(|_| corrupt("status"))?,
                            location: self.response_location,
                            content_type: self.response_content_type,
                            body,
                        },
                    },
                    _ => return Err(corrupt("completed record without its response")),
                }
            }
            _ => return Err(corrupt("state")),
        };
        Ok(Record {
            fingerprint: self.fingerprint.ok_or_else(|| corrupt("fingerprint"))?,
            state,
            read_at: self.read_at,
        })
    }
}

fn corrupt(what: &str) -> sqlx::Error {
    sqlx::Error::Decode(format!("idempotency_record holds an impossible {what}").into())
}

/// What [`claim_or_read`] found.
#[derive(Debug)]
pub enum ClaimOrRead {
    /// This call created the PROCESSING row and owns it; `at` is the database's clock.
    Claimed { at: DateTime<Utc> },
    /// The key exists: its record.
    Existing(Record),
    /// The key's row committed after this statement's snapshot: read again.
    Unseen,
}

/// Claims an unknown key for `owner`, or reads the record that holds it.
pub async fn claim_or_read(
    db: impl PgExecutor<'_>,
    scope: &Scope,
    fingerprint: &Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<ClaimOrRead> {
    let row: Option<ClaimRow> = sqlx::query_as(CLAIM_OR_READ)
        .persistent(crate::db::named_statements())
        .bind(scope.tenant.0)
        .bind(scope.endpoint.as_str())
        .bind(scope.key.as_str())
        .bind(fingerprint.as_bytes())
        .bind(owner)
        .bind(lease_ms)
        .fetch_optional(db)
        .await?;
    Ok(match row {
        None => ClaimOrRead::Unseen,
        Some(ClaimRow { claimed: true, row }) => ClaimOrRead::Claimed { at: row.read_at },
        Some(ClaimRow { row, .. }) => ClaimOrRead::Existing(row.into_record()?),
    })
}

/// Reads the record, if any (the replay lookup: one primary-key read).
pub async fn read(db: impl PgExecutor<'_>, scope: &Scope) -> sqlx::Result<Option<Record>> {
    let row: Option<Row> = sqlx::query_as(READ)
        .persistent(crate::db::named_statements())
        .bind(scope.tenant.0)
        .bind(scope.endpoint.as_str())
        .bind(scope.key.as_str())
        .fetch_optional(db)
        .await?;
    row.map(Row::into_record).transpose()
}

/// Compare-and-set takeover of an expired PROCESSING lease: succeeds only if the row is
/// still owned by `seen_owner` and its lease has passed, so of several contenders
/// exactly one wins.
pub async fn take_over_expired_lease(
    db: impl PgExecutor<'_>,
    scope: &Scope,
    seen_owner: Uuid,
    new_owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar(TAKE_OVER)
        .persistent(crate::db::named_statements())
        .bind(scope.tenant.0)
        .bind(scope.endpoint.as_str())
        .bind(scope.key.as_str())
        .bind(new_owner)
        .bind(lease_ms)
        .bind(seen_owner)
        .fetch_optional(db)
        .await
}

/// Re-claims a COMPLETED key past its retention as a fresh PROCESSING claim (possibly
/// for a different request: an expired key is a new key).
pub async fn reclaim_expired(
    db: impl PgExecutor<'_>,
    scope: &Scope,
    fingerprint: &Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar(RECLAIM)
        .persistent(crate::db::named_statements())
        .bind(scope.tenant.0)
        .bind(scope.endpoint.as_str())
        .bind(scope.key.as_str())
        .bind(fingerprint.as_bytes())
        .bind(owner)
        .bind(lease_ms)
        .fetch_optional(db)
        .await
}

/// The fenced completion, run as the last statement of the business transaction.
/// False means ownership was lost and the caller must roll back.
pub async fn complete(
    tx: &mut PgConnection,
    fence: &Fence<'_>,
    response: &StoredResponse,
) -> sqlx::Result<bool> {
    let query = sqlx::query(COMPLETE).persistent(crate::db::named_statements());
    let done = bind_completion(query, fence, response)
        .execute(&mut *tx)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Binds `$1` to `$9` of [`fenced_completion!`]: the record, its owner, the response
/// and its lifetime. A statement that embeds the completion binds its own parameters
/// after these.
pub fn bind_completion<'q>(
    query: Query<'q, Postgres, PgArguments>,
    fence: &Fence<'q>,
    response: &'q StoredResponse,
) -> Query<'q, Postgres, PgArguments> {
    let scope = fence.scope;
    query
        .bind(scope.tenant.0)
        .bind(scope.endpoint.as_str())
        .bind(scope.key.as_str())
        .bind(fence.owner)
        .bind(response.status as i16)
        .bind(&response.location)
        .bind(&response.content_type)
        .bind(&response.body)
        .bind(fence.ttl_secs)
}

/// Gives up a claim after an unexpected failure so that a retry executes afresh.
pub async fn release(db: impl PgExecutor<'_>, scope: &Scope, owner: Uuid) -> sqlx::Result<()> {
    sqlx::query(RELEASE)
        .persistent(crate::db::named_statements())
        .bind(scope.tenant.0)
        .bind(scope.endpoint.as_str())
        .bind(scope.key.as_str())
        .bind(owner)
        .execute(db)
        .await?;
    Ok(())
}

/// Deletes up to `batch` completed keys past retention; returns how many.
pub async fn purge_expired(db: impl PgExecutor<'_>, batch: i64) -> sqlx::Result<u64> {
    let done = sqlx::query(PURGE_EXPIRED)
        .persistent(crate::db::named_statements())
        .bind(batch)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}

/// Deletes up to `batch` PROCESSING claims whose lease ran out more than `grace_secs`
/// ago and that no retry took over; returns how many.
pub async fn purge_abandoned(
    db: impl PgExecutor<'_>,
    grace_secs: i64,
    batch: i64,
) -> sqlx::Result<u64> {
    let done = sqlx::query(PURGE_ABANDONED)
        .persistent(crate::db::named_statements())
        .bind(grace_secs)
        .bind(batch)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}
