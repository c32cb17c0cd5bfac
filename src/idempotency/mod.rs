//! The idempotency core: claim, lease, takeover, fenced completion and replay
//! (docs/contract.md, "Idempotency").
//!
//! A caller hands [`Guard::run`] the scope `(tenant, endpoint, key)`, a fingerprint of
//! the parsed request and the operation as a closure over a transaction that returns
//! the response to store, or, with [`Guard::run_in_one_statement`], as one statement
//! that also completes the record under the guard's fence (a create: two round trips
//! in all). The guard owns the whole state machine and answers with the
//! stored response (fresh or replayed) or a typed [`GuardError`]. It knows nothing of
//! orders and nothing of HTTP: the REST handlers and the MCP tools call it alike, so a
//! tool call and a REST call with the same key are one operation.

pub mod cache;
pub mod decide;
pub mod fingerprint;
pub mod key;
pub mod operator;
pub mod record;
pub mod rewrap;
pub mod seal;
pub mod settings;
pub mod store;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use self::settings::IdempotencyConfig;
use self::{
    cache::{Lookup, ReplayCache},
    decide::{Step, decide, retry_after},
    seal::{ClearRecords, OldLayouts, SealError, Sealer},
    store::ClaimOrRead,
};
pub use self::{
    fingerprint::Fingerprint,
    key::{IdempotencyKey, KeyError},
    record::StoredResponse,
    store::{Completion, Fence, Scope},
};
use crate::{
    db::{Conn, Db, Sql},
    metrics::{self, label_enum},
    supervisor::Jobs,
    telemetry,
};

label_enum! {
    /// How the guard decided one request (`idempotency_requests_total{outcome}`).
    pub Outcome {
        /// This request executed the operation and its response was stored.
        Created => "created",
        /// A stored response was replayed (also after waiting for an in-flight twin).
        Replayed => "replayed",
        /// The key was used before with a different request.
        PayloadConflict => "payload_conflict",
        /// Another request owns the key, or this one lost its lease: answered 409.
        InFlight => "in_flight",
        /// This request took over an expired lease and executed the operation.
        LeaseTakeover => "lease_takeover",
    }
}

/// The future an operation returns: it borrows the transaction it was handed.
pub type TxFuture<'c, E> = Pin<Box<dyn Future<Output = Result<StoredResponse, E>> + Send + 'c>>;

/// The future a one-statement operation returns (see [`Guard::run_in_one_statement`]):
/// the response it stored, or `None` when its fence no longer held and it wrote nothing.
pub type StatementFuture<'c, E> =
    Pin<Box<dyn Future<Output = Result<Option<StoredResponse>, E>> + Send + 'c>>;

/// Why the guard did not answer with a stored response. `E` is the operation's own
/// error type, passed through untouched.
#[derive(Debug, thiserror::Error)]
pub enum GuardError<E> {
    /// The key was used before with a different request.
    #[error("this Idempotency-Key was already used with a different request")]
    KeyReused,
    /// Another request owns the key; try again after `retry_after`.
    #[error("a request with this Idempotency-Key is still being processed")]
    InFlight { retry_after: Duration },
    /// This request's lease ran out and another request took the key over before this
    /// one could complete: everything it wrote was rolled back.
    #[error("the lease on this Idempotency-Key was lost; the request was rolled back")]
    LeaseLost { retry_after: Duration },
    /// The operation failed; its claim was released so that a retry executes afresh.
    #[error("the operation failed")]
    Operation(E),
    /// The database failed; any claim was released.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// The stored response cannot be opened (its key is not configured, or it does not
    /// belong to this record): never answered with anything but an error.
    #[error("{0}")]
    Sealed(SealError),
    /// The scope's tenant is being erased: nothing is claimed or completed for it.
    #[error("the tenant is being erased")]
    TenantErasing,
}

/// A response that went through the guard.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The stored bytes: the same for the first caller and every replay.
    pub response: StoredResponse,
    /// Whether this is the stored response of an earlier request.
    pub replayed: bool,
    /// When the key is forgotten (from then on the same key is a new request); none
    /// for an answer that is not stored (a read).
    pub expires_at: Option<DateTime<Utc>>,
}

impl Answer {
    /// Whether the stored status is a success (a stored refusal, such as a cancel's
    /// 404, is not).
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.response.status)
    }
}

/// Runs operations exactly once per `(tenant, endpoint, key)`.
#[derive(Clone)]
pub struct Guard {
    db: Db,
    config: IdempotencyConfig,
    cache: ReplayCache,
    /// Seals what is stored and opens what is replayed (`ORDERD_RESPONSE_KEYS`).
    sealer: Arc<Sealer>,
    /// Where a claim is given back after its request was dropped, so that shutdown
    /// waits for the release instead of cutting it off.
    jobs: Jobs,
}

/// What the claim step decided.
enum Claim {
    /// This request owns the key since `at` (the database's clock), with the outcome to
    /// count when it completes.
    Owned {
        owner: Uuid,
        outcome: Outcome,
        at: DateTime<Utc>,
        /// The connection the claim committed on, when the caller asked to keep it.
        conn: Option<Conn>,
    },
    /// Answer with a stored response, kept until the instant given.
    Replay(StoredResponse, DateTime<Utc>),
}

impl Guard {
    pub fn new(db: Db, config: IdempotencyConfig, jobs: Jobs) -> Self {
        let cache = ReplayCache::new(config.replay_cache_bytes);
        let clear = if config.refuse_clear_records {
            ClearRecords::Refuse
        } else {
            ClearRecords::Serve
        };
        let old_layouts = if config.refuse_old_layouts {
            OldLayouts::Refuse
        } else {
            OldLayouts::Serve
        };
        let sealer =
            Arc::new(Sealer::new(&config.response_keys, clear).with_old_layouts(old_layouts));
        Self {
            db,
            config,
            cache,
            sealer,
            jobs,
        }
    }

    /// Drops every response the replay cache holds, so that the next retry of any key
    /// reads the database: after a tenant's erasure began (or may have been missed),
    /// none of its answers may be replayed from memory.
    pub fn forget_cached_replays(&self) {
        self.cache.clear();
        metrics::replay_cache_dropped(true);
    }

    /// The replay cache, for what follows forgettings (see [`operator::follow`]).
    pub fn replay_cache(&self) -> &ReplayCache {
        &self.cache
    }

    /// The database for `scope`'s statements: on a distributed database, the node
    /// that holds its tenant's shard (see `db::Db::for_tenant`).
    fn db(&self, scope: &Scope) -> Db {
        self.db.for_tenant(scope.tenant.0)
    }

    /// Executes `operation` at most once for `scope` and answers every caller with the
    /// same stored response. `fingerprint` identifies the request's effect. The
    /// operation gets the transaction and the database's clock at the moment this
    /// request came to own the key (the time of the change it makes).
    pub async fn run<E, F>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        operation: F,
    ) -> Result<Answer, GuardError<E>>
    where
        F: for<'c> FnOnce(Sql<'c>, DateTime<Utc>) -> TxFuture<'c, E> + Send,
    {
        let result = self
            .run_inner(scope, &fingerprint, async |db, fence, conn| {
                self.execute(db, fence, conn, operation).await
            })
            .await;
        observe(scope, result)
    }

    /// Like [`Guard::run`], for an operation that writes everything in one statement
    /// which also completes the record: it embeds [`Completion`] (its text and its
    /// parameters) and writes only if the completion matched.
    /// The whole write is then one round trip with no `BEGIN` or `COMMIT`, instead of
    /// four. Only an operation that knows its response before it writes can do this
    /// (a create: its answer is the order it is about to insert).
    pub async fn run_in_one_statement<E, F>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        operation: F,
    ) -> Result<Answer, GuardError<E>>
    where
        F: for<'c> FnOnce(Sql<'c>, Fence<'c>) -> StatementFuture<'c, E> + Send,
    {
        let result = self
            .run_inner(scope, &fingerprint, async |db, fence, conn| {
                self.execute_one_statement(db, fence, conn, operation).await
            })
            .await;
        observe(scope, result)
    }

    /// The state machine around one execution: `execute` runs once this request owns
    /// the key, and must complete the record under the fence it is handed, on the
    /// connection the claim committed on when there is one (see [`Conn::autocommits`]).
    /// A new response is not put in the replay cache; the first replay that reads it
    /// from the database does (see [`cache`] for why).
    async fn run_inner<E>(
        &self,
        scope: &Scope,
        fingerprint: &Fingerprint,
        execute: impl AsyncFnOnce(&Db, Fence<'_>, Option<Conn>) -> Result<StoredResponse, GuardError<E>>,
    ) -> Result<(Answer, Outcome), GuardError<E>> {
        // A completed record never changes until it expires: a retry the cache knows
        // is answered (or refused) without touching the database.
        let replayed = |response, expires_at| {
            let answer = Answer {
                response,
                replayed: true,
                expires_at: Some(expires_at),
            };
            Ok((answer, Outcome::Replayed))
        };
        match self.cache.lookup(scope, fingerprint, Instant::now()) {
            Lookup::Replay(response, expires_at) => return replayed(response, expires_at),
            Lookup::Conflict => return Err(GuardError::KeyReused),
            Lookup::Miss => {}
        }
        // Where this request's statements go, looked up once.
        let db = self.db(scope);
        let (owner, outcome, at, conn) = match self.claim(&db, scope, fingerprint).await? {
            Claim::Replay(response, expires_at) => return replayed(response, expires_at),
            Claim::Owned {
                owner,
                outcome,
                at,
                conn,
            } => (owner, outcome, at, conn),
        };
        // From here until the completion commits, any exit (error, panic, cancelled
        // future) must give the key back so that a retry executes afresh.
        let mut release = ReleaseOnDrop {
            db: db.clone(),
            jobs: self.jobs.clone(),
            scope: Some(scope.clone()),
            owner,
        };
        let fence = Fence {
            scope,
            owner,
            ttl_secs: self.config.ttl.as_secs() as i64,
            at,
            sealer: &self.sealer,
        };
        let expires_at = fence.expires_at();
        let response = execute(&db, fence, conn).await?;
        release.disarm();
        let answer = Answer {
            response,
            replayed: false,
            expires_at: Some(expires_at),
        };
        Ok((answer, outcome))
    }

    /// Claim-or-read loop: ends owning the key, with a stored response, or an error.
    /// A fresh claim keeps the connection it committed on when that connection
    /// autocommits (see [`Conn::autocommits`]); a takeover or reclaim, rare, does not.
    async fn claim<E>(
        &self,
        db: &Db,
        scope: &Scope,
        fingerprint: &Fingerprint,
    ) -> Result<Claim, GuardError<E>> {
        let lease_ms = self.config.lease.as_millis() as i64;
        let wait_until = tokio::time::Instant::now() + self.config.inflight_wait;
        let mut pause = Duration::from_millis(5);
        // Once a row is known to exist only a read can tell more; an INSERT would
        // just conflict again.
        let mut row_exists = false;
        loop {
            let owner = Uuid::new_v4();
            let read = self.cache.read_starts();
            let found = if row_exists {
                db.run(async |c| store::read(c, scope).await).await?
            } else {
                let mut conn = db.conn().await?;
                let found = db
                    .within(store::claim_or_read(
                        &mut conn.sql(),
                        scope,
                        fingerprint,
                        owner,
                        lease_ms,
                    ))
                    .await?;
                let conn = if conn.autocommits() {
                    Some(conn)
                } else {
                    conn.done().await?;
                    None
                };
                match found {
                    ClaimOrRead::Claimed { at } => {
                        return Ok(Claim::Owned {
                            owner,
                            outcome: Outcome::Created,
                            at,
                            conn,
                        });
                    }
                    ClaimOrRead::Existing(record) => Some(record),
                    ClaimOrRead::TenantErasing => return Err(GuardError::TenantErasing),
                    // Claimed by a request that committed after our snapshot: there
                    // is a row now, so read it.
                    ClaimOrRead::Unseen => {
                        row_exists = true;
                        continue;
                    }
                }
            };
            let Some(record) = found else {
                // Released or purged since we looked: claim it afresh.
                row_exists = false;
                continue;
            };
            row_exists = true;
            match decide(&record, fingerprint) {
                Step::Replay => {
                    let record::State::Completed {
                        mut response,
                        expires_at,
                        sealed_with,
                        seal_version,
                    } = record.state
                    else {
                        unreachable!("decide replays completed records only")
                    };
                    response.body = self
                        .open(
                            scope,
                            &response,
                            expires_at,
                            sealed_with.as_deref(),
                            seal_version,
                        )?
                        .into();
                    let remaining = (expires_at - record.read_at).to_std().unwrap_or_default();
                    self.cache.remember(
                        scope,
                        *fingerprint,
                        &response,
                        expires_at,
                        read,
                        remaining,
                    );
                    return Ok(Claim::Replay(response, expires_at));
                }
                Step::Reject => return Err(GuardError::KeyReused),
                Step::Reclaim => {
                    let reclaimed = db
                        .run(async |c| {
                            store::reclaim_expired(c, scope, fingerprint, owner, lease_ms).await
                        })
                        .await?;
                    if let Some(at) = reclaimed {
                        return Ok(Claim::Owned {
                            owner,
                            outcome: Outcome::Created,
                            at,
                            conn: None,
                        });
                    }
                    // The row changed since it was read (another request got there
                    // first, or, on Citus, the worker's clock that read the lease as run
                    // out is ahead of the coordinator's, which judges the
                    // compare-and-set): look again after a pause, not at once, for as
                    // long as the clocks disagree.
                    wait_a_little(&mut pause, wait_until, Duration::ZERO).await?;
                }
                Step::TakeOver { seen_owner } => {
                    let taken = db
                        .run(async |c| {
                            store::take_over_expired_lease(c, scope, seen_owner, owner, lease_ms)
                                .await
                        })
                        .await?;
                    if let Some(at) = taken {
                        tracing::info!(
                            endpoint = %scope.endpoint,
                            "took over an expired idempotency lease"
                        );
                        return Ok(Claim::Owned {
                            owner,
                            outcome: Outcome::LeaseTakeover,
                            at,
                            conn: None,
                        });
                    }
                    // Lost the compare-and-set, as a reclaim may (above).
                    wait_a_little(&mut pause, wait_until, Duration::ZERO).await?;
                }
                Step::Wait { lease_remaining } => {
                    // Wait a little for the owner to finish, then look again.
                    wait_a_little(&mut pause, wait_until, lease_remaining).await?;
                }
            }
        }
    }

    /// Runs the operation and the fenced completion in one transaction, on the claim's
    /// connection when there is one.
    async fn execute<E, F>(
        &self,
        db: &Db,
        fence: Fence<'_>,
        conn: Option<Conn>,
        operation: F,
    ) -> Result<StoredResponse, GuardError<E>>
    where
        F: for<'c> FnOnce(Sql<'c>, DateTime<Utc>) -> TxFuture<'c, E> + Send,
    {
        // The claim's connection carries on into the transaction; without one, a
        // transaction on a connection from the pool.
        let mut tx = match conn {
            Some(mut conn) => {
                db.begin_in(&mut conn).await?;
                conn
            }
            None => db.begin().await?,
        };
        db.within(async {
            let response = operation(tx.sql(), fence.at)
                .await
                .map_err(GuardError::Operation)?;
            if !store::complete(&mut tx.sql(), &fence, &response).await? {
                // Dropping `tx` rolls back everything this request wrote.
                drop(tx);
                return Err(self.lease_lost(db, fence.scope).await);
            }
            tx.commit().await?;
            Ok(response)
        })
        .await
    }

    /// Runs a one-statement operation (see [`Guard::run_in_one_statement`]), on the
    /// claim's connection when there is one.
    async fn execute_one_statement<E, F>(
        &self,
        db: &Db,
        fence: Fence<'_>,
        conn: Option<Conn>,
        operation: F,
    ) -> Result<StoredResponse, GuardError<E>>
    where
        F: for<'c> FnOnce(Sql<'c>, Fence<'c>) -> StatementFuture<'c, E> + Send,
    {
        let mut conn = match conn {
            Some(conn) => conn,
            None => db.conn().await?,
        };
        db.within(async {
            let written = operation(conn.sql(), fence)
                .await
                .map_err(GuardError::Operation)?;
            let Some(response) = written else {
                // The statement wrote nothing (behind a pooler, dropping `conn` also
                // rolls its transaction back).
                drop(conn);
                return Err(self.lease_lost(db, fence.scope).await);
            };
            conn.done().await?;
            Ok(response)
        })
        .await
    }

    /// The stored body of `scope`'s record, opened. A body that does not open is never
    /// answered: the caller gets an error (503), and the log says which key it needs.
    fn open<E>(
        &self,
        scope: &Scope,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
        sealed_with: Option<&str>,
        seal_version: Option<i16>,
    ) -> Result<Vec<u8>, GuardError<E>> {
        self.sealer
            .open(
                store::binding(scope, response, Some(expires_at)),
                response.body.to_vec(),
                sealed_with,
                seal_version,
            )
            .map_err(|e| {
                tracing::error!(
                    endpoint = %scope.endpoint,
                    key_id = sealed_with.unwrap_or_default(),
                    error = %e,
                    "a stored response cannot be opened; answered 503"
                );
                GuardError::Sealed(e)
            })
    }

    /// The completion matched no row: our lease expired and another request took the
    /// key over (it alone may commit), or the tenant's erasure deleted the claim, which
    /// the client is told as such rather than as a key in flight.
    async fn lease_lost<E>(&self, db: &Db, scope: &Scope) -> GuardError<E> {
        let erasing = db
            .run(async |c| store::tenant_erasing(c, scope.tenant).await)
            .await;
        if let Ok(true) = erasing {
            return GuardError::TenantErasing;
        }
        tracing::warn!(
            endpoint = %scope.endpoint,
            "lost the idempotency lease before completing; rolled back"
        );
        GuardError::LeaseLost {
            retry_after: retry_after(self.config.lease),
        }
    }
}

/// A short pause before the next look (5 ms, doubling to 50 ms), within the in-flight
/// wait; past it, 409 with a `Retry-After` from `lease_remaining`.
async fn wait_a_little<E>(
    pause: &mut Duration,
    wait_until: tokio::time::Instant,
    lease_remaining: Duration,
) -> Result<(), GuardError<E>> {
    let now = tokio::time::Instant::now();
    if now >= wait_until {
        return Err(GuardError::InFlight {
            retry_after: retry_after(lease_remaining),
        });
    }
    tokio::time::sleep((*pause).min(wait_until - now)).await;
    *pause = (*pause * 2).min(Duration::from_millis(50));
    Ok(())
}

/// Counts a guarded request's outcome.
fn observe<E>(
    scope: &Scope,
    result: Result<(Answer, Outcome), GuardError<E>>,
) -> Result<Answer, GuardError<E>> {
    let outcome = match &result {
        Ok((_, outcome)) => Some(*outcome),
        Err(GuardError::KeyReused) => Some(Outcome::PayloadConflict),
        Err(GuardError::InFlight { .. } | GuardError::LeaseLost { .. }) => Some(Outcome::InFlight),
        Err(
            GuardError::Operation(_)
            | GuardError::Db(_)
            | GuardError::Sealed(_)
            | GuardError::TenantErasing,
        ) => None,
    };
    if let Some(outcome) = outcome {
        metrics::idempotency_outcome(scope.endpoint, outcome);
        telemetry::note_outcome(outcome.as_str());
    }
    result.map(|(answer, _)| answer)
}

/// Deletes the claim if dropped while armed: covers errors, panics and cancellation.
struct ReleaseOnDrop {
    db: Db,
    jobs: Jobs,
    scope: Option<Scope>,
    owner: Uuid,
}

impl ReleaseOnDrop {
    fn disarm(&mut self) {
        self.scope = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let Some(scope) = self.scope.take() else {
            return;
        };
        let (db, owner) = (self.db.clone(), self.owner);
        self.jobs.spawn_task(async move {
            if let Err(e) = db
                .run(async |c| store::release(c, &scope, owner).await)
                .await
            {
                // The lease still expires, after which a retry takes the key over.
                tracing::warn!(error = %e, "could not release an idempotency claim");
            }
        });
    }
}
