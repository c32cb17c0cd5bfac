//! SQL of the `idempotency_record` table. Every time comparison uses the database
//! clock, so leases and expiry mean the same on every replica: `statement_timestamp()`
//! in the statements that write (one statement's own start, the same as its
//! transaction's here, and a value Citus can compute once: it refuses a volatile
//! function such as `clock_timestamp()` in an `UPDATE` or a `RETURNING`), and
//! `clock_timestamp()` in reads.
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

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::{
    Postgres,
    postgres::PgArguments,
    query::{Query, QueryAs},
};
use uuid::Uuid;

use super::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    record::{Record, State, StoredResponse},
    seal::{Binding, Sealed, Sealer},
};
use crate::db::{self, Forms, Placeholders, Scan, Sql};
use crate::tenant::TenantId;

/// The primary key of a record.
#[derive(Debug, Clone)]
pub struct Scope {
    pub tenant: TenantId,
    /// The operation's name, stored in `idempotency_record.endpoint`: the caller's
    /// choice (method and route template), opaque to the guard.
    pub endpoint: &'static str,
    pub key: IdempotencyKey,
}

/// A stored body is sealed to its record's scope and to the rest of its answer.
pub fn binding<'a>(
    scope: &'a Scope,
    response: &'a StoredResponse,
    expires_at: Option<DateTime<Utc>>,
) -> Binding<'a> {
    Binding {
        tenant: scope.tenant.0,
        endpoint: scope.endpoint,
        key: scope.key.as_str(),
        status: response.status,
        location: response.location.as_deref(),
        content_type: response.content_type.as_deref(),
        resource: response.resource,
        expires_at,
    }
}

/// What a completion is fenced on: the record, the owner token its claim drew (the
/// completion matches only while that token still owns it), how long the stored
/// response lives, and the keys its body is sealed with.
#[derive(Clone, Copy)]
pub struct Fence<'a> {
    pub scope: &'a Scope,
    pub owner: Uuid,
    pub ttl_secs: i64,
    /// The database's clock when this request came to own the key: the time of the
    /// change the operation makes.
    pub at: DateTime<Utc>,
    pub sealer: &'a Sealer,
}

impl Fence<'_> {
    /// When the completed record is forgotten: its TTL after the claim, on the
    /// database's clock. Stored by the completion and told to the client with the
    /// answer, so both are the same instant.
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.at + chrono::TimeDelta::seconds(self.ttl_secs)
    }
}

impl std::fmt::Debug for Fence<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("scope", self.scope)
            .field("owner", &self.owner)
            .field("ttl_secs", &self.ttl_secs)
            .field("at", &self.at)
            .field("sealed_with", &self.sealer.sealing_key())
            .finish()
    }
}

/// Whether tenant `$1` is being erased.
pub const TENANT_ERASING: &str =
    "SELECT EXISTS (SELECT 1 FROM tenant_erasure WHERE tenant_id = $1)";

/// Whether `tenant` is being erased (see [`TENANT_ERASING`]).
pub async fn tenant_erasing(sql: &mut Sql<'_>, tenant: TenantId) -> sqlx::Result<bool> {
    sql.query_scalar(TENANT_ERASING)
        .bind(tenant.0)
        .fetch_one(sql.conn())
        .await
}

/// Claim or read, in one statement: `INSERT ... ON CONFLICT DO NOTHING` (the one
/// atomic decision of who owns a new key), and when the key exists, its record as of
/// the statement's snapshot; neither while the tenant is being erased (one row,
/// `erasing` true, instead: see the `erasure` module). So a new key costs one round trip and a replay the cache
/// does not hold costs one too. One row, `claimed` true, when this statement claimed
/// the key (`read_at` is then the claim's time); one row, `claimed` false, with the
/// existing record; no row when a concurrent request's claim committed after this
/// statement's snapshot was taken (the caller reads again).
pub const CLAIM_OR_READ: &str = "WITH erasing AS (
         SELECT EXISTS (SELECT 1 FROM tenant_erasure WHERE tenant_id = $1) AS yes
     ),
     claim AS (
         INSERT INTO idempotency_record
                (tenant_id, endpoint, idem_key, fingerprint, state, owner_token, lease_until, created_at)
         SELECT $1, $2, $3, $4, 'PROCESSING', $5, statement_timestamp() + $6 * interval '1 millisecond', statement_timestamp()
         FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit, erasing
         WHERE NOT erasing.yes
         ON CONFLICT (tenant_id, endpoint, idem_key) DO NOTHING
         RETURNING created_at
     )
     SELECT true AS claimed, false AS erasing, NULL::text AS state, NULL::bytea AS fingerprint,
            NULL::uuid AS owner_token, NULL::timestamptz AS lease_until, NULL::timestamptz AS expires_at,
            NULL::smallint AS response_status, NULL::text AS response_location,
            NULL::text AS response_content_type, NULL::bytea AS response_body,
            NULL::text AS response_key_id, NULL::smallint AS response_seal_version,
            NULL::uuid AS resource_id, created_at AS read_at
     FROM claim
     UNION ALL
     SELECT false, false, state, fingerprint, owner_token, lease_until, expires_at, response_status,
            response_location, response_content_type, response_body, response_key_id,
            response_seal_version, resource_id, clock_timestamp()
     FROM idempotency_record
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3 AND NOT EXISTS (SELECT 1 FROM claim)
       AND NOT (SELECT yes FROM erasing)
     UNION ALL
     SELECT false, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            clock_timestamp()
     FROM erasing WHERE yes";

/// How a request claims its key (or reads the record holding it).
#[derive(Clone, Copy, Debug)]
enum ClaimWrite {
    /// [`CLAIM_OR_READ`]: one statement.
    OneStatement,
    /// [`CLAIM_CALL`]: one call of a function that runs on the tenant's node.
    Call,
}

/// The claim's two forms. Both write the lease by the statement's time
/// (`statement_timestamp()`), as every write of this table does.
const CLAIM_WRITE: Forms<ClaimWrite> = Forms {
    one_server: ClaimWrite::OneStatement,
    distributed: ClaimWrite::Call,
};

/// [`CLAIM_OR_READ`] on a distributed database: the function `orderd_claim` (made by
/// the migrations) claims the key, reads the erasure mark and, for a key already
/// there, its record, on the node that holds the tenant's shard, in one call (decision
/// 173). [`CLAIM_OR_READ`] itself is correct there but runs as four steps, with a
/// two-phase commit on every worker; the same three as statements of one transaction
/// cost four round trips and as many plannings by Citus. The claim goes first: from it
/// on this is a distributed transaction that an erasure beginning meanwhile waits for
/// (`lifecycle`), so the mark read after it is either seen (the call raises
/// [`ERASING`] and the claim is rolled back) or set after the call ended (and the
/// erasure then deletes what it wrote). A mark read first could have been set just
/// after that read, by an erasure that would not wait for this claim.
pub const CLAIM_CALL: &str = "SELECT * FROM orderd_claim($1, $2, $3, $4, $5, $6)";

/// The SQLSTATE `orderd_claim` raises when the tenant is being erased.
const ERASING: &str = "OD001";

/// The record and the database clock, by primary key.
pub const READ: &str = "SELECT state, fingerprint, owner_token, lease_until, expires_at,
            response_status, response_location, response_content_type, response_body,
            response_key_id, response_seal_version, resource_id, clock_timestamp() AS read_at
     FROM idempotency_record
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3";

/// Everything an operator is shown of a record, by primary key, with the database
/// clock: the columns [`READ`] reads, and when the key was claimed and completed;
/// [`SHOW_FOR_UPDATE`] also locks it until the transaction ends.
pub const SHOW: &str =
    "SELECT state, fingerprint, owner_token, created_at, completed_at, lease_until, expires_at,
            response_status, response_location, response_content_type, response_body,
            response_key_id, response_seal_version, resource_id, clock_timestamp() AS read_at
     FROM idempotency_record
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3";

/// [`SHOW`], locking the row: what a forgetting decides on stays so until it deletes.
pub static SHOW_FOR_UPDATE: LazyLock<String> = LazyLock::new(|| format!("{SHOW}\n     FOR UPDATE"));

/// Deletes one record by primary key (an operator's forgetting, decided on the row
/// [`SHOW_FOR_UPDATE`] locked).
pub const FORGET: &str =
    "DELETE FROM idempotency_record WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3";

/// Compare-and-set takeover of an expired lease from the owner seen; returns the new
/// lease's end.
pub const TAKE_OVER: &str = "UPDATE idempotency_record
     SET owner_token = $4, lease_until = statement_timestamp() + $5 * interval '1 millisecond'
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'PROCESSING' AND owner_token = $6 AND lease_until <= statement_timestamp()
     RETURNING lease_until";

/// A completed key past its retention becomes a fresh claim.
pub const RECLAIM: &str = "UPDATE idempotency_record
     SET state = 'PROCESSING', fingerprint = $4, owner_token = $5,
         lease_until = statement_timestamp() + $6 * interval '1 millisecond',
         response_status = NULL, response_location = NULL, response_content_type = NULL,
         response_body = NULL, response_key_id = NULL, response_seal_version = NULL, resource_id = NULL,
         completed_at = NULL, expires_at = NULL, created_at = statement_timestamp()
     FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'COMPLETED' AND expires_at <= statement_timestamp()
     RETURNING created_at";

/// The fenced completion as a part of a statement: the record moves to COMPLETED with
/// its response only while `fence`'s owner still owns it. It numbers its own
/// parameters as the composing statement hands them out ([`Completion::sql`]) and
/// binds them itself ([`Completion::bind`]), so a statement that embeds it (a create:
/// the order, its event and the completion in one round trip) never spells its
/// parameters. The body is sealed here, under the fence's keys, so that no caller can
/// store one in clear by mistake.
#[derive(Debug, Clone)]
pub struct Completion<'a> {
    fence: &'a Fence<'a>,
    response: &'a StoredResponse,
    body: Sealed,
}

impl<'a> Completion<'a> {
    /// The completion of `fence`'s record with `response`, its body sealed.
    pub fn new(fence: &'a Fence<'a>, response: &'a StoredResponse) -> sqlx::Result<Self> {
        let body = fence
            .sealer
            .seal(
                binding(fence.scope, response, Some(fence.expires_at())),
                &response.body,
            )
            .map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        Ok(Self {
            fence,
            response,
            body,
        })
    }

    /// The `UPDATE`, its parameters taken from `p` in the order [`Completion::bind`]
    /// binds them.
    pub fn sql(p: &mut Placeholders) -> String {
        let (tenant, endpoint, key, owner) = (p.param(), p.param(), p.param(), p.param());
        let (status, location, content_type, body) = (p.param(), p.param(), p.param(), p.param());
        let (expires, key_id, resource, version) = (p.param(), p.param(), p.param(), p.param());
        format!(
            "UPDATE idempotency_record
     SET state = 'COMPLETED', response_status = {status}, response_location = {location},
         response_content_type = {content_type}, response_body = {body}, response_key_id = {key_id},
         response_seal_version = {version}, resource_id = {resource}, completed_at = statement_timestamp(),
         expires_at = {expires}, lease_until = NULL
     WHERE tenant_id = {tenant} AND endpoint = {endpoint} AND idem_key = {key}
       AND state = 'PROCESSING' AND owner_token = {owner}
       AND NOT EXISTS (SELECT 1 FROM tenant_erasure WHERE tenant_id = {tenant})"
        )
    }

    /// Binds the parameters of [`Completion::sql`], in its order, after those bound
    /// before.
    pub fn bind(self, query: Query<'a, Postgres, PgArguments>) -> Query<'a, Postgres, PgArguments> {
        let scope = self.fence.scope;
        query
            .bind(scope.tenant.0)
            .bind(scope.endpoint)
            .bind(scope.key.as_str())
            .bind(self.fence.owner)
            .bind(self.response.status as i16)
            .bind(&self.response.location)
            .bind(&self.response.content_type)
            .bind(self.body.bytes)
            .bind(self.fence.expires_at())
            .bind(self.body.key_id)
            .bind(self.response.resource)
            .bind(self.body.version)
    }
}

/// The fenced completion alone: the last statement of a business transaction.
pub static COMPLETE: LazyLock<String> = LazyLock::new(|| Completion::sql(&mut Placeholders::new()));

/// Gives a claim back: only the owner's own PROCESSING row.
pub const RELEASE: &str = "DELETE FROM idempotency_record
     USING (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE tenant_id = $1 AND endpoint = $2 AND idem_key = $3
       AND state = 'PROCESSING' AND owner_token = $4";

/// The oldest `$1` completed keys past retention, grouped by tenant, with the database's
/// time they were judged by. A plain read that locks nothing; each tenant's keys are
/// then deleted by [`PURGE_EXPIRED`].
pub static PURGEABLE_EXPIRED: LazyLock<String> =
    LazyLock::new(|| purgeable(&PAST_RETENTION, "clock_timestamp()", "$1"));

/// Deletes tenant `$1`'s keys `($2, $3)` that are still completed and expired by `$4`,
/// by primary key; a row another transaction holds is left for the next pass.
pub static PURGE_EXPIRED: LazyLock<String> = LazyLock::new(|| purge_by_key(&PAST_RETENTION));

/// The oldest `$2` PROCESSING claims whose lease ran out more than `$1` seconds ago,
/// grouped by tenant, with that cut-off; locks nothing (see [`PURGE_ABANDONED`]).
pub static PURGEABLE_ABANDONED: LazyLock<String> = LazyLock::new(|| {
    purgeable(
        &ABANDONED,
        "clock_timestamp() - $1 * interval '1 second'",
        "$2",
    )
});

/// Deletes tenant `$1`'s claims `($2, $3)` that are still PROCESSING with a lease that
/// ran out before `$4` (a retry that took one over since moved its lease on, and keeps
/// it), by primary key.
pub static PURGE_ABANDONED: LazyLock<String> = LazyLock::new(|| purge_by_key(&ABANDONED));

/// Which records a purge takes: a state, and the time column that must be past the
/// cut-off (each has a partial index on that column for that state).
struct PurgeOf {
    state: &'static str,
    column: &'static str,
}

const PAST_RETENTION: PurgeOf = PurgeOf {
    state: "COMPLETED",
    column: "expires_at",
};
const ABANDONED: PurgeOf = PurgeOf {
    state: "PROCESSING",
    column: "lease_until",
};

/// The read half of a purge: the oldest `limit` records of `of` at or before `cut`
/// (an SQL time read once), grouped by tenant.
fn purgeable(of: &PurgeOf, cut: &str, limit: &str) -> String {
    let PurgeOf { state, column } = of;
    format!(
        "WITH cut AS MATERIALIZED (SELECT {cut} AS at),
         oldest AS (
             SELECT tenant_id, endpoint, idem_key FROM idempotency_record
             WHERE state = '{state}' AND {column} <= (SELECT at FROM cut)
             ORDER BY {column}
             LIMIT {limit})
         SELECT tenant_id, array_agg(endpoint) AS endpoints, array_agg(idem_key) AS keys,
                (SELECT at FROM cut) AS cutoff
         FROM oldest GROUP BY tenant_id"
    )
}

/// The delete half: one tenant's records of the read half, by primary key, where they
/// still are what the read found.
fn purge_by_key(of: &PurgeOf) -> String {
    let PurgeOf { state, column } = of;
    format!(
        "DELETE FROM idempotency_record
         WHERE tenant_id = $1 AND (endpoint, idem_key) IN (
             SELECT r.endpoint, r.idem_key
             FROM idempotency_record r
             JOIN unnest($2::text[], $3::text[]) AS k(endpoint, idem_key)
               ON r.endpoint = k.endpoint AND r.idem_key = k.idem_key
             WHERE r.tenant_id = $1 AND r.state = '{state}' AND r.{column} <= $4
             FOR UPDATE OF r SKIP LOCKED)"
    )
}

/// The first tenant at or after `$3` with a completed record not sealed under `$1` with
/// the layout `$2`: where a rewrap goes next. A plain read in primary-key order that
/// locks nothing.
pub const NEXT_TENANT_NOT_SEALED: &str = "SELECT tenant_id FROM idempotency_record
     WHERE tenant_id >= $3 AND state = 'COMPLETED'
       AND (response_key_id IS DISTINCT FROM $1 OR response_seal_version IS DISTINCT FROM $2)
     ORDER BY tenant_id
     LIMIT 1";

/// Up to `$5` completed records of tenant `$2` not sealed under `$1` with the layout
/// `$6`, after the keyset cursor `($3, $4)` in primary-key order, locked until the
/// rewrap's transaction ends. `SKIP LOCKED`: a row another transaction holds (another
/// rewrap, live traffic) is passed over here and retried by the rewrap's next pass.
pub const NOT_SEALED_UNDER: &str =
    "SELECT tenant_id, endpoint, idem_key, response_key_id, response_seal_version,
            response_body, response_status, response_location, response_content_type, resource_id,
            expires_at
     FROM idempotency_record
     WHERE tenant_id = $2 AND state = 'COMPLETED'
       AND (response_key_id IS DISTINCT FROM $1 OR response_seal_version IS DISTINCT FROM $6)
       AND (endpoint, idem_key) > ($3, $4)
     ORDER BY endpoint, idem_key
     LIMIT $5
     FOR UPDATE SKIP LOCKED";

/// Up to `$3` completed records still not sealed under `$1` with the layout `$2`, and
/// how many there are in all: what a rewrap reports as left when it ends.
pub const STILL_NOT_SEALED: &str = "SELECT tenant_id, endpoint, idem_key, response_key_id,
            count(*) OVER () AS total
     FROM idempotency_record
     WHERE state = 'COMPLETED'
       AND (response_key_id IS DISTINCT FROM $1 OR response_seal_version IS DISTINCT FROM $2)
     ORDER BY tenant_id, endpoint, idem_key
     LIMIT $3";

/// Stores each of tenant `$2`'s records' body sealed anew under `$1` with the layout
/// `$7`, where it is still the completed record under the key and layout it was read
/// with.
pub const RESEAL: &str = "UPDATE idempotency_record r
     SET response_body = n.body, response_key_id = $1, response_seal_version = $7
     FROM unnest($3::text[], $4::text[], $5::bytea[], $6::text[], $8::smallint[])
          AS n(endpoint, idem_key, body, was, was_version)
     WHERE r.tenant_id = $2 AND r.endpoint = n.endpoint AND r.idem_key = n.idem_key
       AND r.state = 'COMPLETED' AND r.response_key_id IS NOT DISTINCT FROM n.was
       AND r.response_seal_version IS NOT DISTINCT FROM n.was_version";

/// Up to `$2` records of tenant `$1`, by primary key (an index scan of the key the
/// tenant leads, both to find and to delete).
pub const ERASE_TENANT_BATCH: &str = "DELETE FROM idempotency_record r
     USING (SELECT endpoint, idem_key FROM idempotency_record WHERE tenant_id = $1 LIMIT $2) AS batch
     WHERE r.tenant_id = $1 AND r.endpoint = batch.endpoint AND r.idem_key = batch.idem_key";

/// How many records of tenant `$1` are left.
pub const COUNT_TENANT: &str = "SELECT count(*) FROM idempotency_record WHERE tenant_id = $1";

/// Deletes up to `batch` of `tenant`'s rows (see [`ERASE_TENANT_BATCH`]); how many went.
pub async fn erase_tenant_batch(sql: &mut Sql<'_>, tenant: Uuid, batch: i64) -> sqlx::Result<u64> {
    sql.tenant_batch(ERASE_TENANT_BATCH, tenant, batch).await
}

/// How many rows of `tenant` are left (see [`COUNT_TENANT`]).
pub async fn count_tenant(sql: &mut Sql<'_>, tenant: Uuid) -> sqlx::Result<i64> {
    sql.tenant_count(COUNT_TENANT, tenant).await
}

/// A completed record as a rewrap reads it: the whole stored answer, which its body is
/// sealed to.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SealedRecord {
    pub tenant_id: Uuid,
    pub endpoint: String,
    pub idem_key: String,
    /// The key its body is sealed under; `None`: stored in clear.
    pub response_key_id: Option<String>,
    /// The layout of associated data it was sealed with (`None`: the first, or clear).
    pub response_seal_version: Option<i16>,
    pub response_body: Vec<u8>,
    pub response_status: i16,
    pub response_location: Option<String>,
    pub response_content_type: Option<String>,
    pub resource_id: Option<Uuid>,
    pub expires_at: Option<DateTime<Utc>>,
}

impl SealedRecord {
    /// What the body is sealed to.
    pub fn binding(&self) -> Binding<'_> {
        Binding {
            tenant: self.tenant_id,
            endpoint: &self.endpoint,
            key: &self.idem_key,
            status: u16::try_from(self.response_status).unwrap_or_default(),
            location: self.response_location.as_deref(),
            content_type: self.response_content_type.as_deref(),
            resource: self.resource_id,
            expires_at: self.expires_at,
        }
    }

    pub fn key(&self) -> RecordKey {
        (self.tenant_id, self.endpoint.clone(), self.idem_key.clone())
    }
}

/// The primary key a rewrap walks in order.
pub type RecordKey = (Uuid, String, String);

/// Reads and locks up to `batch` completed records not sealed under `key_id` with the
/// layout `version`, after `cursor` (see [`NOT_SEALED_UNDER`]).
/// The first tenant at or after `from` with a completed record not sealed under the
/// key and layout given (see [`NEXT_TENANT_NOT_SEALED`]).
pub async fn next_tenant_not_sealed(
    sql: &mut Sql<'_>,
    (key_id, version): (&str, i16),
    from: Uuid,
) -> sqlx::Result<Option<Uuid>> {
    sql.query_scalar(NEXT_TENANT_NOT_SEALED)
        .bind(key_id)
        .bind(version)
        .bind(from)
        .fetch_optional(sql.conn())
        .await
}

/// Up to `batch` of tenant `cursor.0`'s completed records not sealed under the key and
/// layout given, after `cursor` (see [`NOT_SEALED_UNDER`]).
pub async fn not_sealed_under(
    sql: &mut Sql<'_>,
    (key_id, version): (&str, i16),
    cursor: &RecordKey,
    batch: i64,
) -> sqlx::Result<Vec<SealedRecord>> {
    sql.query_as(NOT_SEALED_UNDER)
        .bind(key_id)
        .bind(cursor.0)
        .bind(&cursor.1)
        .bind(&cursor.2)
        .bind(batch)
        .bind(version)
        .fetch_all(sql.conn())
        .await
}

/// A completed record a rewrap left as it was: its key, and the key id it is under.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NotSealed {
    pub tenant_id: Uuid,
    pub endpoint: String,
    pub idem_key: String,
    pub response_key_id: Option<String>,
    /// How many such records there are in all.
    pub total: i64,
}

/// Up to `limit` of the completed records still not sealed under `key_id` with the
/// layout `version`, each with the total (see [`STILL_NOT_SEALED`]).
pub async fn still_not_sealed(
    sql: &mut Sql<'_>,
    (key_id, version): (&str, i16),
    limit: i64,
) -> sqlx::Result<Vec<NotSealed>> {
    sql.query_as(STILL_NOT_SEALED)
        .bind(key_id)
        .bind(version)
        .bind(limit)
        .fetch_all(sql.conn())
        .await
}

/// One record sealed anew: its key, its new body, and the key and layout it was read
/// under.
#[derive(Debug, Clone)]
pub struct Resealed {
    pub record: RecordKey,
    pub body: Vec<u8>,
    pub was: Option<String>,
    pub was_version: Option<i16>,
}

/// Stores the new bodies under `key_id` with the layout `version` (see [`RESEAL`]);
/// returns how many.
pub async fn reseal(
    sql: &mut Sql<'_>,
    (key_id, version): (&str, i16),
    rows: Vec<Resealed>,
) -> sqlx::Result<u64> {
    let Some(tenant) = rows.first().map(|row| row.record.0) else {
        return Ok(0);
    };
    if rows.iter().any(|row| row.record.0 != tenant) {
        return Err(sqlx::Error::Protocol(
            "a reseal batch holds records of more than one tenant".into(),
        ));
    }
    let mut endpoints = Vec::with_capacity(rows.len());
    let mut keys = Vec::with_capacity(rows.len());
    let mut bodies = Vec::with_capacity(rows.len());
    let mut was = Vec::with_capacity(rows.len());
    let mut was_versions = Vec::with_capacity(rows.len());
    for row in rows {
        let (_, endpoint, key) = row.record;
        endpoints.push(endpoint);
        keys.push(key);
        bodies.push(row.body);
        was.push(row.was);
        was_versions.push(row.was_version);
    }
    let done = sql
        .query(RESEAL)
        .bind(key_id)
        .bind(tenant)
        .bind(endpoints)
        .bind(keys)
        .bind(bodies)
        .bind(was)
        .bind(version)
        .bind(was_versions)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}

/// A row of [`CLAIM_OR_READ`]: the record's columns are NULL when `claimed` or
/// `erasing`.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    claimed: bool,
    erasing: bool,
    #[sqlx(flatten)]
    row: Row,
}

/// A row of [`CLAIM_CALL`]: the record's columns are NULL when `claimed`.
#[derive(sqlx::FromRow)]
struct CalledRow {
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
    response_key_id: Option<String>,
    response_seal_version: Option<i16>,
    resource_id: Option<Uuid>,
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
                            body: body.into(),
                            resource: self.resource_id,
                        },
                        sealed_with: self.response_key_id,
                        seal_version: self.response_seal_version,
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
    /// The tenant is being erased: nothing was claimed or read.
    TenantErasing,
}

/// Claims an unknown key for `owner`, or reads the record that holds it.
pub async fn claim_or_read(
    sql: &mut Sql<'_>,
    scope: &Scope,
    fingerprint: &Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<ClaimOrRead> {
    if let ClaimWrite::Call = sql.layout().pick(&CLAIM_WRITE) {
        let called: sqlx::Result<Option<CalledRow>> = bind_claim(
            sql.query_as(CLAIM_CALL),
            scope,
            fingerprint,
            owner,
            lease_ms,
        )
        .fetch_optional(sql.conn())
        .await;
        return Ok(match called {
            Err(e) if db::is_sqlstate(&e, ERASING) => ClaimOrRead::TenantErasing,
            Err(e) => return Err(e),
            Ok(None) => ClaimOrRead::Unseen,
            Ok(Some(CalledRow { claimed: true, row })) => ClaimOrRead::Claimed { at: row.read_at },
            Ok(Some(CalledRow { row, .. })) => ClaimOrRead::Existing(row.into_record()?),
        });
    }
    let row: Option<ClaimRow> = bind_claim(
        sql.query_as(CLAIM_OR_READ),
        scope,
        fingerprint,
        owner,
        lease_ms,
    )
    .fetch_optional(sql.conn())
    .await?;
    Ok(match row {
        None => ClaimOrRead::Unseen,
        Some(ClaimRow { erasing: true, .. }) => ClaimOrRead::TenantErasing,
        Some(ClaimRow {
            claimed: true, row, ..
        }) => ClaimOrRead::Claimed { at: row.read_at },
        Some(ClaimRow { row, .. }) => ClaimOrRead::Existing(row.into_record()?),
    })
}

/// The parameters of [`CLAIM_OR_READ`], [`CLAIM_CALL`] and [`RECLAIM`], in their order.
fn bind_claim<'q, O>(
    query: QueryAs<'q, Postgres, O, PgArguments>,
    scope: &'q Scope,
    fingerprint: &'q Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> QueryAs<'q, Postgres, O, PgArguments> {
    query
        .bind(scope.tenant.0)
        .bind(scope.endpoint)
        .bind(scope.key.as_str())
        .bind(fingerprint.as_bytes())
        .bind(owner)
        .bind(lease_ms)
}

/// A record as an operator is shown it: the record, read as the guard reads it, and
/// when its key was claimed and completed.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub record: Record,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct KeptRow {
    created_at: DateTime<Utc>,
    completed_at: Option<DateTime<Utc>>,
    #[sqlx(flatten)]
    row: Row,
}

/// Reads the record for an operator (see [`SHOW`]), locking it when `lock`.
pub async fn show(sql: &mut Sql<'_>, scope: &Scope, lock: bool) -> sqlx::Result<Option<Kept>> {
    let statement = if lock { SHOW_FOR_UPDATE.as_str() } else { SHOW };
    let row: Option<KeptRow> = by_key(sql, statement, scope).await?;
    row.map(|k| {
        Ok(Kept {
            record: k.row.into_record()?,
            created_at: k.created_at,
            completed_at: k.completed_at,
        })
    })
    .transpose()
}

/// Reads the record, if any (the replay lookup: one primary-key read).
pub async fn read(sql: &mut Sql<'_>, scope: &Scope) -> sqlx::Result<Option<Record>> {
    let row: Option<Row> = by_key(sql, READ, scope).await?;
    row.map(Row::into_record).transpose()
}

/// The row `statement` reads by `scope`'s primary key (`$1` to `$3`), if any.
async fn by_key<O>(
    sql: &mut Sql<'_>,
    statement: &'static str,
    scope: &Scope,
) -> sqlx::Result<Option<O>>
where
    O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sql.query_as(statement)
        .bind(scope.tenant.0)
        .bind(scope.endpoint)
        .bind(scope.key.as_str())
        .fetch_optional(sql.conn())
        .await
}

/// Compare-and-set takeover of an expired PROCESSING lease: succeeds only if the row is
/// still owned by `seen_owner` and its lease has passed, so of several contenders
/// exactly one wins.
pub async fn take_over_expired_lease(
    sql: &mut Sql<'_>,
    scope: &Scope,
    seen_owner: Uuid,
    new_owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    // The statement returns the new lease's end (Citus takes only immutable
    // expressions in a `RETURNING`): the takeover's own time is that less the lease.
    let lease_until: Option<DateTime<Utc>> = sql
        .query_scalar(TAKE_OVER)
        .bind(scope.tenant.0)
        .bind(scope.endpoint)
        .bind(scope.key.as_str())
        .bind(new_owner)
        .bind(lease_ms)
        .bind(seen_owner)
        .fetch_optional(sql.conn())
        .await?;
    Ok(lease_until.map(|until| until - chrono::TimeDelta::milliseconds(lease_ms)))
}

/// Re-claims a COMPLETED key past its retention as a fresh PROCESSING claim (possibly
/// for a different request: an expired key is a new key).
pub async fn reclaim_expired(
    sql: &mut Sql<'_>,
    scope: &Scope,
    fingerprint: &Fingerprint,
    owner: Uuid,
    lease_ms: i64,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    let reclaimed: Option<(DateTime<Utc>,)> =
        bind_claim(sql.query_as(RECLAIM), scope, fingerprint, owner, lease_ms)
            .fetch_optional(sql.conn())
            .await?;
    Ok(reclaimed.map(|(at,)| at))
}

/// The fenced completion, run as the last statement of the business transaction.
/// False means ownership was lost and the caller must roll back.
pub async fn complete(
    sql: &mut Sql<'_>,
    fence: &Fence<'_>,
    response: &StoredResponse,
) -> sqlx::Result<bool> {
    let query = sql.query(COMPLETE.as_str());
    let done = Completion::new(fence, response)?
        .bind(query)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives up a claim after an unexpected failure so that a retry executes afresh.
pub async fn release(sql: &mut Sql<'_>, scope: &Scope, owner: Uuid) -> sqlx::Result<()> {
    sql.query(RELEASE)
        .bind(scope.tenant.0)
        .bind(scope.endpoint)
        .bind(scope.key.as_str())
        .bind(owner)
        .execute(sql.conn())
        .await?;
    Ok(())
}

/// Up to `batch` of the oldest completed keys past retention, grouped by tenant (a
/// read that locks nothing; [`delete_expired`] then deletes each group).
pub async fn expired_keys(sql: &mut Sql<'_>, batch: i64) -> sqlx::Result<Vec<PurgeGroup>> {
    match sql.layout().pick(&db::WHOLE_TABLE_READS) {
        Scan::OneStatement => {
            sql.query_as(PURGEABLE_EXPIRED.as_str())
                .bind(batch)
                .fetch_all(sql.conn())
                .await
        }
        Scan::EachNode => purgeable_each_node(sql, &PAST_RETENTION, 0, batch).await,
    }
}

/// Up to `batch` of the oldest PROCESSING claims whose lease ran out more than
/// `grace_secs` ago and that no retry took over, grouped by tenant (see
/// [`expired_keys`]; [`delete_abandoned`] deletes each group).
pub async fn abandoned_claims(
    sql: &mut Sql<'_>,
    grace_secs: i64,
    batch: i64,
) -> sqlx::Result<Vec<PurgeGroup>> {
    match sql.layout().pick(&db::WHOLE_TABLE_READS) {
        Scan::OneStatement => {
            sql.query_as(PURGEABLE_ABANDONED.as_str())
                .bind(grace_secs)
                .bind(batch)
                .fetch_all(sql.conn())
                .await
        }
        Scan::EachNode => purgeable_each_node(sql, &ABANDONED, grace_secs, batch).await,
    }
}

/// Deletes one tenant's group of [`expired_keys`] still expired; how many went.
pub async fn delete_expired(sql: &mut Sql<'_>, group: PurgeGroup) -> sqlx::Result<u64> {
    delete_group(sql, PURGE_EXPIRED.as_str(), group).await
}

/// Deletes one tenant's group of [`abandoned_claims`] still abandoned; how many went.
pub async fn delete_abandoned(sql: &mut Sql<'_>, group: PurgeGroup) -> sqlx::Result<u64> {
    delete_group(sql, PURGE_ABANDONED.as_str(), group).await
}

/// One tenant's records a worker found for a purge.
#[derive(serde::Deserialize)]
struct NodePurgeable {
    tenant_id: Uuid,
    endpoints: Vec<String>,
    keys: Vec<String>,
}

/// The read half of a purge on a distributed database, worker by worker, by the
/// coordinator's cut-off (`seconds_ago` before its time): a worker that does not answer
/// keeps its records until a later pass, and the others' are purged.
async fn purgeable_each_node(
    sql: &mut Sql<'_>,
    of: &PurgeOf,
    seconds_ago: i64,
    batch: i64,
) -> sqlx::Result<Vec<PurgeGroup>> {
    let cut = db::seconds_ago(sql, seconds_ago).await?;
    let PurgeOf { state, column } = of;
    let read = db::read_each_node(sql, "idempotency_record", |records| {
        format!(
            "SELECT tenant_id, array_agg(endpoint) AS endpoints, array_agg(idem_key) AS keys
             FROM (SELECT tenant_id, endpoint, idem_key FROM {records}
                   WHERE state = '{state}' AND {column} <= {}
                   ORDER BY {column}
                   LIMIT {batch}) oldest
             GROUP BY tenant_id",
            db::time_literal(cut)
        )
    })
    .await?;
    Ok(read
        .rows
        .into_iter()
        .map(|r: NodePurgeable| (r.tenant_id, r.endpoints, r.keys, cut))
        .collect())
}

/// One tenant's keys a purge found past retention: tenant, endpoints, keys (in step)
/// and the cut-off they were found by.
pub type PurgeGroup = (Uuid, Vec<String>, Vec<String>, DateTime<Utc>);

/// Runs `delete` (tenant, endpoints, keys, cut-off) on one tenant's group of keys.
async fn delete_group(
    sql: &mut Sql<'_>,
    delete: &'static str,
    (tenant, endpoints, keys, cutoff): PurgeGroup,
) -> sqlx::Result<u64> {
    let done = sql
        .query(delete)
        .bind(tenant)
        .bind(endpoints)
        .bind(keys)
        .bind(cutoff)
        .execute(sql.conn())
        .await?;
    Ok(done.rows_affected())
}
