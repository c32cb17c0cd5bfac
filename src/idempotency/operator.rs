//! What an operator does with one idempotency record: look it up (`orderd idempotency
//! show`) and forget it (`orderd idempotency forget`), and how every process hears of
//! a forgetting so that no replay cache keeps the answer.
//!
//! Forgetting is for the moment after a bug was fixed: the client's retry should run
//! again instead of replaying the answer the bug produced. It deletes the record, so
//! the next request with the key claims it afresh. What it refuses:
//! - a live claim (PROCESSING, lease not yet passed): a request is executing under it,
//!   and deleting the row would let a retry run beside it;
//! - a stored success without `force`: the retry then makes a new order, which is what
//!   the operator must mean.
//!
//! A claim whose lease has passed may be forgotten: its request may still be running
//! late, but its fenced completion then matches no row and rolls back, as after a
//! takeover. The decision is taken on the row locked by the same transaction that
//! deletes it, so it cannot change between the two.
//!
//! The delete and a notification on [`CHANNEL`] commit together. Every `serve` process
//! listens ([`follow`]): on the notification it drops the key from its replay cache;
//! its cache answers only while the listening session was heard from within
//! `ORDERD_LISTEN_BOUND_MS` and starts empty when the session is back (see `cache` and
//! `db::listen`), and a forgetting returns only once that bound has passed since its
//! commit, so a notification a process missed, or has not heard yet because its
//! session went silent, cannot leave the forgotten answer in memory.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{
    IdempotencyKey, Scope,
    cache::ReplayCache,
    record::{Record, State},
    seal::{SealError, Sealer},
    store::{self, binding},
};
use crate::{
    db::{self, Db, Heard, ListenOn, Liveness, Sql},
    metrics,
    tenant::TenantId,
};

/// The channel a forgetting notifies, with the record's key as JSON ([`Forgotten`]).
pub const CHANNEL: &str = "orderd_idempotency_forgotten";

/// Tells every listening process that a record is gone, when the transaction commits.
const NOTIFY: &str = "SELECT pg_notify('orderd_idempotency_forgotten', $1)";

/// One record as an operator is shown it. The body is left out unless asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    pub tenant_id: Uuid,
    pub endpoint: String,
    pub key: String,
    /// `PROCESSING` or `COMPLETED`.
    pub state: String,
    /// When the record was claimed (for a completed one, by the request that completed it).
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// When the key is forgotten by itself (completed records).
    pub expires_at: Option<DateTime<Utc>>,
    /// Until when the claim is owned (PROCESSING records).
    pub lease_until: Option<DateTime<Utc>>,
    /// The database's clock when the record was read: what the times are judged by.
    pub read_at: DateTime<Utc>,
    /// The stored HTTP status (completed records).
    pub status: Option<u16>,
    /// The resource the stored answer names (an order's id).
    pub resource_id: Option<Uuid>,
    pub location: Option<String>,
    pub content_type: Option<String>,
    /// SHA-256 of the canonical request, in hex.
    pub fingerprint: String,
    /// The key the stored body is sealed under; none: stored in clear.
    pub sealed_with: Option<String>,
    pub seal_version: Option<i16>,
    /// Bytes of the stored body as stored (sealed or not).
    pub body_bytes: Option<usize>,
    /// The body, opened, only when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The record as the guard reads it: what the lease rule is judged on.
    #[serde(skip)]
    pub record: Record,
}

impl Shown {
    /// A stored success: forgetting it makes the retry create anew.
    fn is_success(&self) -> bool {
        self.record
            .response()
            .is_some_and(|r| (200..300).contains(&r.status))
    }
}

/// Why a record was not shown or not forgotten.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("no idempotency record for this tenant, endpoint and key")]
    Missing,
    #[error(
        "the record is a live claim: a request is executing under it until its lease passes at {lease_until} (database time); try again after that"
    )]
    LiveClaim { lease_until: DateTime<Utc> },
    #[error(
        "the record stores a success ({status}, resource {resource}): forgetting it makes the client's next retry create anew; pass --force if that is what you want"
    )]
    StoredSuccess { status: u16, resource: String },
    #[error("the stored body cannot be opened: {0}")]
    Sealed(#[from] SealError),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

/// Reads `scope`'s record on `sql` (locking it when `lock`), with the body opened by
/// `sealer` when one is given.
async fn read(
    sql: &mut Sql<'_>,
    scope: &Scope,
    lock: bool,
    sealer: Option<&Sealer>,
) -> Result<Shown, Refused> {
    let kept = store::show(sql, scope, lock)
        .await?
        .ok_or(Refused::Missing)?;
    let record = kept.record;
    let (state, lease_until) = match &record.state {
        State::Processing { lease_until, .. } => ("PROCESSING", Some(*lease_until)),
        State::Completed { .. } => ("COMPLETED", None),
    };
    let (expires_at, sealed_with, seal_version) = match &record.state {
        State::Completed {
            expires_at,
            sealed_with,
            seal_version,
            ..
        } => (Some(*expires_at), sealed_with.clone(), *seal_version),
        State::Processing { .. } => (None, None, None),
    };
    let response = record.response();
    let body = match (sealer, response) {
        (Some(sealer), Some(response)) => {
            let opened = sealer.open(
                binding(scope, response, expires_at),
                response.body.to_vec(),
                sealed_with.as_deref(),
                seal_version,
            )?;
            Some(String::from_utf8_lossy(&opened).into_owned())
        }
        _ => None,
    };
    Ok(Shown {
        tenant_id: scope.tenant.0,
        endpoint: scope.endpoint.to_string(),
        key: scope.key.as_str().to_string(),
        state: state.to_string(),
        created_at: kept.created_at,
        completed_at: kept.completed_at,
        expires_at,
        lease_until,
        read_at: record.read_at,
        status: response.map(|r| r.status),
        resource_id: response.and_then(|r| r.resource),
        location: response.and_then(|r| r.location.clone()),
        content_type: response.and_then(|r| r.content_type.clone()),
        fingerprint: hex::encode(&record.fingerprint),
        sealed_with,
        seal_version,
        body_bytes: response.map(|r| r.body.len()),
        body,
        record,
    })
}

/// `scope`'s record, its body opened by `sealer` when one is given.
pub async fn show(db: &Db, scope: &Scope, sealer: Option<&Sealer>) -> Result<Shown, Refused> {
    let mut conn = db.conn().await?;
    let shown = read(&mut conn.sql(), scope, false, sealer).await?;
    conn.done().await?;
    Ok(shown)
}

/// Whether `record` may be forgotten (see the module's doc).
pub fn may_forget(record: &Shown, force: bool) -> Result<(), Refused> {
    if let Some(lease_until) = record.record.live_lease() {
        return Err(Refused::LiveClaim { lease_until });
    }
    if record.is_success() && !record.record.is_expired() && !force {
        return Err(Refused::StoredSuccess {
            status: record.status.unwrap_or_default(),
            resource: record
                .resource_id
                .map_or_else(|| "none".to_string(), |id| id.to_string()),
        });
    }
    Ok(())
}

/// What a notification on [`CHANNEL`] carries: the forgotten record's key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forgotten {
    pub tenant_id: Uuid,
    pub endpoint: String,
    pub idem_key: String,
}

/// Deletes `scope`'s record when [`may_forget`] allows it, and tells every process;
/// returns the record as it was, once `heard_within` (`ORDERD_LISTEN_BOUND_MS`) has
/// passed since the commit: by then every process has heard the forgetting or stopped
/// trusting its replay cache, even one whose listening session went silent. `actor`
/// is logged with what was forgotten (never the body).
pub async fn forget(
    db: &Db,
    scope: &Scope,
    force: bool,
    actor: &str,
    heard_within: Duration,
) -> Result<Shown, Refused> {
    let mut tx = db.begin().await?;
    let mut sql = tx.sql();
    let record = read(&mut sql, scope, true, None).await?;
    may_forget(&record, force)?;
    sql.query(store::FORGET)
        .bind(scope.tenant.0)
        .bind(scope.endpoint)
        .bind(scope.key.as_str())
        .execute(sql.conn())
        .await?;
    let payload = serde_json::to_string(&Forgotten {
        tenant_id: scope.tenant.0,
        endpoint: scope.endpoint.to_string(),
        idem_key: scope.key.as_str().to_string(),
    })
    .expect("a key serialises");
    sql.query(NOTIFY).bind(payload).execute(sql.conn()).await?;
    tx.commit().await?;
    let committed = tokio::time::Instant::now();
    tracing::info!(
        actor,
        tenant = %scope.tenant.0,
        endpoint = scope.endpoint,
        key = scope.key.as_str(),
        state = %record.state,
        status = record.status.unwrap_or_default(),
        resource = %record.resource_id.map(|id| id.to_string()).unwrap_or_default(),
        forced = force,
        "idempotency record forgotten"
    );
    tokio::time::sleep_until(committed + heard_within).await;
    Ok(record)
}

/// Keeps `cache` true to the database's forgettings until `shutdown`: drops a key when
/// its record is forgotten, and empties the cache whenever the listening session is
/// (re)established or lost; `liveness` (which the cache depends on) records each round
/// trip of the session. `endpoints` are the operations' names, which a notification's
/// endpoint must be one of (anything else empties the cache: a notification that
/// cannot be read is not ignored).
pub async fn follow(
    cache: ReplayCache,
    endpoints: Vec<&'static str>,
    listen_on: ListenOn,
    liveness: Arc<Liveness>,
    shutdown: CancellationToken,
) {
    db::listen(
        listen_on,
        CHANNEL,
        liveness,
        |heard| match heard {
            Heard::Listening | Heard::Lost => {
                cache.clear();
                metrics::replay_cache_dropped(true);
            }
            Heard::Notified(payload) => match scope_of(payload, &endpoints) {
                Some(scope) => {
                    cache.forget(&scope);
                    metrics::replay_cache_dropped(false);
                }
                None => {
                    tracing::warn!(
                        "a forgetting's notification cannot be read; the replay cache is emptied"
                    );
                    cache.clear();
                    metrics::replay_cache_dropped(true);
                }
            },
        },
        shutdown,
    )
    .await;
}

/// The record a notification names, when it names one of `endpoints`.
fn scope_of(payload: &str, endpoints: &[&'static str]) -> Option<Scope> {
    let forgotten: Forgotten = serde_json::from_str(payload).ok()?;
    let endpoint = endpoints
        .iter()
        .copied()
        .find(|e| *e == forgotten.endpoint)?;
    Some(Scope {
        tenant: TenantId(forgotten.tenant_id),
        endpoint,
        key: IdempotencyKey::parse(Some(&forgotten.idem_key)).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::record::StoredResponse;

    const AT: DateTime<Utc> = DateTime::from_timestamp_nanos(1_800_000_000_000_000_000);

    fn record(state: &str, status: Option<u16>) -> Shown {
        let record = Record {
            fingerprint: Vec::new(),
            state: match status {
                None => State::Processing {
                    owner: Uuid::nil(),
                    lease_until: AT + chrono::TimeDelta::seconds(30),
                },
                Some(status) => State::Completed {
                    expires_at: AT + chrono::TimeDelta::hours(24),
                    response: StoredResponse {
                        status,
                        location: None,
                        content_type: None,
                        body: bytes::Bytes::new(),
                        resource: None,
                    },
                    sealed_with: None,
                    seal_version: None,
                },
            },
            read_at: AT,
        };
        Shown {
            tenant_id: Uuid::nil(),
            endpoint: "POST /v1/orders".into(),
            key: "key-0123456789abcdef".into(),
            state: state.into(),
            created_at: AT,
            completed_at: None,
            expires_at: status.map(|_| AT + chrono::TimeDelta::hours(24)),
            lease_until: status
                .is_none()
                .then_some(AT + chrono::TimeDelta::seconds(30)),
            read_at: AT,
            status,
            resource_id: None,
            location: None,
            content_type: None,
            fingerprint: String::new(),
            sealed_with: None,
            seal_version: None,
            body_bytes: None,
            body: None,
            record,
        }
    }

    #[test]
    fn a_live_claim_is_never_forgotten_one_past_its_lease_is() {
        let mut claim = record("PROCESSING", None);
        assert!(matches!(
            may_forget(&claim, true),
            Err(Refused::LiveClaim { .. })
        ));
        claim.record.read_at = AT + chrono::TimeDelta::seconds(30);
        assert!(may_forget(&claim, false).is_ok());
    }

    #[test]
    fn a_stored_success_needs_force_a_stored_refusal_does_not() {
        let success = record("COMPLETED", Some(201));
        assert!(matches!(
            may_forget(&success, false),
            Err(Refused::StoredSuccess { status: 201, .. })
        ));
        assert!(may_forget(&success, true).is_ok());
        assert!(may_forget(&record("COMPLETED", Some(404)), false).is_ok());
        // Past its retention the key is new anyway: nothing to protect.
        let mut expired = success;
        expired.record.read_at = AT + chrono::TimeDelta::hours(25);
        assert!(may_forget(&expired, false).is_ok());
    }

    #[test]
    fn a_notification_names_a_known_endpoint_or_nothing() {
        let endpoints = vec!["POST /v1/orders", "POST /v1/orders/{id}/cancel"];
        let tenant = Uuid::new_v4();
        let payload = |endpoint: &str, key: &str| {
            serde_json::to_string(&Forgotten {
                tenant_id: tenant,
                endpoint: endpoint.into(),
                idem_key: key.into(),
            })
            .unwrap()
        };
        let scope = scope_of(
            &payload("POST /v1/orders/{id}/cancel", "key-0123456789abcdef"),
            &endpoints,
        )
        .unwrap();
        assert_eq!(
            (scope.tenant.0, scope.endpoint, scope.key.as_str()),
            (
                tenant,
                "POST /v1/orders/{id}/cancel",
                "key-0123456789abcdef"
            )
        );
        assert!(scope_of(&payload("DELETE /v1/x", "key-0123456789abcdef"), &endpoints).is_none());
        assert!(scope_of(&payload("POST /v1/orders", "short"), &endpoints).is_none());
        assert!(scope_of("not json", &endpoints).is_none());
    }
}
