//! SQL of the `idempotency_record` table. Every time comparison uses the database
//! clock (`clock_timestamp()`), so leases and expiry mean the same on every replica.

use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::{fingerprint::Fingerprint, key::IdempotencyKey};
use crate::auth::TenantId;

/// The primary key of a record.
#[derive(Debug, Clone)]
pub struct Scope {
    pub tenant: TenantId,
    /// Method and route template, e.g. `POST /v1/orders`.
    pub endpoint: &'static str,
    pub key: IdempotencyKey,
}

/// A stored response, replayed byte for byte.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub location: Option<String>,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// A record as the state machine sees it, with clock comparisons done by the database.
#[derive(Debug)]
pub enum Record {
    Processing {
        fingerprint: Vec<u8>,
        owner_token: Uuid,
        /// Remaining lease in milliseconds; zero or less means expired.
        lease_remaining_ms: i64,
    },
    Completed {
        fingerprint: Vec<u8>,
        /// Past its retention: the key is treated as unknown.
        expired: bool,
        response: StoredResponse,
    },
}

#[derive(sqlx::FromRow)]
struct Row {
    state: String,
    fingerprint: Vec<u8>,
    owner_token: Option<Uuid>,
    lease_remaining_ms: Option<i64>,
    expired: Option<bool>,
    response_status: Option<i16>,
    response_location: Option<String>,
    response_content_type: Option<String>,
    response_body: Option<Vec<u8>>,
}

/// Claims an unknown key: `INSERT ... ON CONFLICT DO NOTHING`. True when this call
/// created the PROCESSING row (and so owns it with `owner`).
pub async fn try_insert(
    db: impl PgExecutor<'_>,
    scope: &Scope,
    fingerprint: &Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "INSERT INTO idempotency_record
           (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until, created_at)
         VALUES ($1, $2, $3, $4, 'PROCESSING', $5, clock_timestamp() + $6 * interval '1 millisecond', clock_timestamp())
         ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING",
    )
    .bind(scope.tenant.0)
    .bind(scope.endpoint)
    .bind(scope.key.as_str())
    .bind(fingerprint.as_bytes())
    .bind(owner)
    .bind(lease_ms)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Reads the record, if any (the replay lookup: one primary-key read).
pub async fn read(db: impl PgExecutor<'_>, scope: &Scope) -> sqlx::Result<Option<Record>> {
    let row: Option<Row> = sqlx::query_as(
        "SELECT state, fingerprint, owner_token,
                (extract(epoch FROM lease_until - clock_timestamp()) * 1000)::bigint AS lease_remaining_ms,
                expires_at <= clock_timestamp() AS expired,
                response_status, response_location, response_content_type, response_body
         FROM idempotency_record
         WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3",
    )
    .bind(scope.tenant.0)
    .bind(scope.endpoint)
    .bind(scope.key.as_str())
    .fetch_optional(db)
    .await?;
    Ok(row.map(|row| match row.state.as_str() {
        "PROCESSING" => Record::Processing {
            fingerprint: row.fingerprint,
            owner_token: row.owner_token.unwrap_or_default(),
            lease_remaining_ms: row.lease_remaining_ms.unwrap_or(0),
        },
        _ => Record::Completed {
            fingerprint: row.fingerprint,
            expired: row.expired.unwrap_or(true),
            response: StoredResponse {
                status: row.response_status.unwrap_or(500) as u16,
                location: row.response_location,
                content_type: row.response_content_type,
                body: row.response_body.unwrap_or_default(),
            },
        },
    }))
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
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE idempotency_record
         SET owner_token = $4, lease_until = clock_timestamp() + $5 * interval '1 millisecond'
         WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
           AND state = 'PROCESSING' AND owner_token = $6 AND lease_until <= clock_timestamp()",
    )
    .bind(scope.tenant.0)
    .bind(scope.endpoint)
    .bind(scope.key.as_str())
    .bind(new_owner)
    .bind(lease_ms)
    .bind(seen_owner)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Re-claims a COMPLETED key past its retention as a fresh PROCESSING claim (possibly
/// for a different request: an expired key is a new key).
pub async fn reclaim_expired(
    db: impl PgExecutor<'_>,
    scope: &Scope,
    fingerprint: &Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE idempotency_record
         SET state = 'PROCESSING', fingerprint = $4, owner_token = $5,
             lease_until = clock_timestamp() + $6 * interval '1 millisecond',
             response_status = NULL, response_location = NULL, response_content_type = NULL,
             response_body = NULL, completed_at = NULL, expires_at = NULL, created_at = clock_timestamp()
         WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
           AND state = 'COMPLETED' AND expires_at <= clock_timestamp()",
    )
    .bind(scope.tenant.0)
    .bind(scope.endpoint)
    .bind(scope.key.as_str())
    .bind(fingerprint.as_bytes())
    .bind(owner)
    .bind(lease_ms)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The fenced completion, run as the last statement of the business transaction:
/// matches only while `owner` still owns the claim. False means ownership was lost and
/// the caller must roll back.
pub async fn complete(
    tx: &mut PgConnection,
    scope: &Scope,
    owner: Uuid,
    response: &StoredResponse,
    ttl_secs: i64,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE idempotency_record
         SET state = 'COMPLETED', response_status = $5, response_location = $6,
             response_content_type = $7, response_body = $8, completed_at = clock_timestamp(),
             expires_at = clock_timestamp() + $9 * interval '1 second', lease_until = NULL
         WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
           AND state = 'PROCESSING' AND owner_token = $4",
    )
    .bind(scope.tenant.0)
    .bind(scope.endpoint)
    .bind(scope.key.as_str())
    .bind(owner)
    .bind(response.status as i16)
    .bind(&response.location)
    .bind(&response.content_type)
    .bind(&response.body)
    .bind(ttl_secs)
    .execute(&mut *tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives up a claim after an unexpected failure so that a retry executes afresh.
/// Only the owner's own PROCESSING row is removed.
pub async fn release(db: impl PgExecutor<'_>, scope: &Scope, owner: Uuid) -> sqlx::Result<()> {
    sqlx::query(
        "DELETE FROM idempotency_record
         WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
           AND state = 'PROCESSING' AND owner_token = $4",
    )
    .bind(scope.tenant.0)
    .bind(scope.endpoint)
    .bind(scope.key.as_str())
    .bind(owner)
    .execute(db)
    .await?;
    Ok(())
}

/// Deletes up to `batch` completed keys past retention; returns how many.
pub async fn purge_expired(db: impl PgExecutor<'_>, batch: i64) -> sqlx::Result<u64> {
    let done = sqlx::query(
        "DELETE FROM idempotency_record
         WHERE (tenant_id, endpoint, idem_key) IN (
             SELECT tenant_id, endpoint, idem_key FROM idempotency_record
             WHERE state = 'COMPLETED' AND expires_at <= clock_timestamp()
             ORDER BY expires_at
             LIMIT $1
             FOR UPDATE SKIP LOCKED)",
    )
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
    let done = sqlx::query(
        "DELETE FROM idempotency_record
         WHERE (tenant_id, endpoint, idem_key) IN (
             SELECT tenant_id, endpoint, idem_key FROM idempotency_record
             WHERE state = 'PROCESSING' AND lease_until <= clock_timestamp() - $1 * interval '1 second'
             ORDER BY lease_until
             LIMIT $2
             FOR UPDATE SKIP LOCKED)",
    )
    .bind(grace_secs)
    .bind(batch)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}
