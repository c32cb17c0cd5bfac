//! The idempotency guard: claim, lease, takeover, fenced completion and replay
//! (contract section 4).
//!
//! A POST handler opts in by handing [`Guard::run`] its scope, a fingerprint of the
//! parsed request and the operation as a closure over a transaction. The guard owns
//! the whole state machine and knows nothing about orders; the operation knows
//! nothing about keys. The operation's typed response is rendered to bytes inside the
//! transaction, stored by the fenced completion, and those same bytes are what every
//! caller (first or replayed) receives.

pub mod fingerprint;
pub mod key;
pub mod store;

use std::{future::Future, marker::PhantomData, pin::Pin, time::Duration};

use poem::{
    IntoResponse, Response,
    http::{HeaderValue, StatusCode, header},
};
use poem_openapi::{
    ApiResponse,
    registry::{MetaHeader, MetaResponses, Registry},
    types::Type,
};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

pub use self::{
    fingerprint::Fingerprint,
    key::IdempotencyKey,
    store::{Scope, StoredResponse},
};
use crate::{
    config::IdempotencyConfig,
    problem::{Kind, Problem},
};

/// Header added to every replayed response.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// How a request through the guard ended, as counted by `idempotency_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This request executed the operation and its response was stored.
    Created,
    /// A stored response was replayed (also after waiting for an in-flight twin).
    Replayed,
    /// The key was used before with a different request.
    PayloadConflict,
    /// Another request owns the key; answered 409.
    InFlight,
    /// This request took over an expired lease and executed the operation.
    LeaseTakeover,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Replayed => "replayed",
            Outcome::PayloadConflict => "payload_conflict",
            Outcome::InFlight => "in_flight",
            Outcome::LeaseTakeover => "lease_takeover",
        }
    }

    pub const ALL: [Outcome; 5] = [
        Outcome::Created,
        Outcome::Replayed,
        Outcome::PayloadConflict,
        Outcome::InFlight,
        Outcome::LeaseTakeover,
    ];
}

/// The future an operation returns: it borrows the transaction it was handed.
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = Result<T, Problem>> + Send + 'c>>;

/// Runs operations exactly once per `(tenant, endpoint, key)`.
#[derive(Clone)]
pub struct Guard {
    /// Durable commits: the business transaction and its fenced completion.
    pool: PgPool,
    /// Claim, takeover and release, committed with `synchronous_commit = off`.
    ///
    /// Why that is safe: PostgreSQL flushes WAL in order, so the durable commit of the
    /// business transaction also makes the earlier claim durable. If the server dies
    /// before that, a claim may vanish, but then nothing was done under it and a retry
    /// simply claims afresh (a lost release or takeover likewise only leaves a lease to
    /// expire). Visibility is not delayed, only the flush, so concurrent requests see
    /// the claim at once. This halves the fsyncs per create (see docs/performance.md and
    /// the crash test in tests/api/crash.rs).
    claims: PgPool,
    config: IdempotencyConfig,
}

/// What the claim step decided.
enum Claim {
    /// This request owns the key (with the outcome to count if it completes).
    Owned { owner: Uuid, outcome: Outcome },
    /// Answer with a stored response.
    Replay(StoredResponse),
}

impl Guard {
    /// Builds the guard over `pool`; the claims pool shares its connection settings
    /// and connects lazily.
    pub fn new(pool: PgPool, config: IdempotencyConfig) -> Self {
        let options = (*pool.connect_options())
            .clone()
            .options([("synchronous_commit", "off")]);
        let size = (pool.options().get_max_connections() / 2).max(4);
        let claims = sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(pool.options().get_acquire_timeout())
            .connect_lazy_with(options);
        Self {
            pool,
            claims,
            config,
        }
    }

    /// Executes `operation` at most once for `scope` and answers every caller with the
    /// same stored bytes. `fingerprint` identifies the request's effect.
    pub async fn run<T, F>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        operation: F,
    ) -> Result<Idempotent<T>, Problem>
    where
        T: ApiResponse + IntoResponse,
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, T> + Send,
    {
        let result = self.run_inner(&scope, fingerprint, operation).await;
        let outcome = match &result {
            Ok((_, outcome)) => Some(*outcome),
            Err(p) if p.kind == Kind::IdempotencyKeyReused => Some(Outcome::PayloadConflict),
            Err(p) if p.kind == Kind::IdempotencyKeyInFlight => Some(Outcome::InFlight),
            Err(_) => None,
        };
        if let Some(outcome) = outcome {
            crate::telemetry::record_idempotency_outcome(scope.endpoint, outcome);
        }
        result.map(|(response, _)| response)
    }

    async fn run_inner<T, F>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        operation: F,
    ) -> Result<(Idempotent<T>, Outcome), Problem>
    where
        T: ApiResponse + IntoResponse,
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, T> + Send,
    {
        let (owner, outcome) = match self.claim(scope, &fingerprint).await? {
            Claim::Replay(stored) => return Ok((Idempotent::replayed(stored), Outcome::Replayed)),
            Claim::Owned { owner, outcome } => (owner, outcome),
        };
        // From here until the completion commits, any exit (error, panic, cancelled
        // future) must give the key back so that a retry executes afresh.
        let mut release = ReleaseOnDrop {
            pool: self.claims.clone(),
            scope: Some(scope.clone()),
            owner,
        };
        let stored = self.execute(scope, owner, operation).await?;
        release.disarm();
        Ok((Idempotent::fresh(stored), outcome))
    }

    /// Claim-or-read loop: ends owning the key, with a stored response, or a problem.
    async fn claim(&self, scope: &Scope, fingerprint: &Fingerprint) -> Result<Claim, Problem> {
        let lease_ms = self.config.lease.as_millis() as i64;
        let wait_until = tokio::time::Instant::now() + self.config.inflight_wait;
        let mut pause = Duration::from_millis(5);
        // Whether the last look found a row: then only a read can tell us more, and an
        // INSERT would just conflict again.
        let mut row_exists = false;
        loop {
            let owner = Uuid::new_v4();
            if !row_exists
                && store::try_insert(&self.claims, scope, fingerprint, owner, lease_ms).await?
            {
                return Ok(Claim::Owned {
                    owner,
                    outcome: Outcome::Created,
                });
            }
            let Some(record) = store::read(&self.claims, scope).await? else {
                // Released or purged since we looked: claim it afresh.
                row_exists = false;
                continue;
            };
            row_exists = true;
            match record {
                store::Record::Completed { expired: true, .. } => {
                    if store::reclaim_expired(&self.claims, scope, fingerprint, owner, lease_ms)
                        .await?
                    {
                        return Ok(Claim::Owned {
                            owner,
                            outcome: Outcome::Created,
                        });
                    }
                    continue;
                }
                store::Record::Completed {
                    fingerprint: stored,
                    response,
                    ..
                } => {
                    ensure_same_request(&stored, fingerprint)?;
                    return Ok(Claim::Replay(response));
                }
                store::Record::Processing {
                    fingerprint: stored,
                    owner_token,
                    lease_remaining_ms,
                } => {
                    ensure_same_request(&stored, fingerprint)?;
                    if lease_remaining_ms <= 0 {
                        if store::take_over_expired_lease(
                            &self.claims,
                            scope,
                            owner_token,
                            owner,
                            lease_ms,
                        )
                        .await?
                        {
                            tracing::info!(
                                endpoint = scope.endpoint,
                                "took over an expired idempotency lease"
                            );
                            return Ok(Claim::Owned {
                                owner,
                                outcome: Outcome::LeaseTakeover,
                            });
                        }
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    if now >= wait_until {
                        return Err(in_flight(lease_remaining_ms));
                    }
                    // Wait a little for the owner to finish, then look again.
                    tokio::time::sleep(pause.min(wait_until - now)).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// Runs the operation and the fenced completion in one transaction.
    async fn execute<T, F>(
        &self,
        scope: &Scope,
        owner: Uuid,
        operation: F,
    ) -> Result<StoredResponse, Problem>
    where
        T: ApiResponse + IntoResponse,
        F: for<'c> FnOnce(&'c mut PgConnection) -> TxFuture<'c, T> + Send,
    {
        let mut tx = self.pool.begin().await?;
        let typed = operation(&mut tx).await?;
        let stored = render(typed).await?;
        let ttl_secs = self.config.ttl.as_secs() as i64;
        if !store::complete(&mut tx, scope, owner, &stored, ttl_secs).await? {
            // Our lease expired and another request took the key over: it alone may
            // commit. Dropping `tx` rolls back everything this request wrote.
            drop(tx);
            tracing::warn!(
                endpoint = scope.endpoint,
                "lost the idempotency lease before completing; rolled back"
            );
            return Err(in_flight(self.config.lease.as_millis() as i64));
        }
        tx.commit().await?;
        Ok(stored)
    }
}

fn ensure_same_request(stored: &[u8], fingerprint: &Fingerprint) -> Result<(), Problem> {
    if stored == fingerprint.as_bytes() {
        Ok(())
    } else {
        Err(Problem::new(Kind::IdempotencyKeyReused).with_detail(
            "this Idempotency-Key was already used with a different request; use a new key",
        ))
    }
}

/// 409 with a short `Retry-After`: at least 1 s, at most 2 s, and not beyond the lease
/// when the lease ends sooner.
fn in_flight(lease_remaining_ms: i64) -> Problem {
    let secs = ((lease_remaining_ms + 999) / 1000).clamp(1, 2);
    Problem::new(Kind::IdempotencyKeyInFlight)
        .with_detail("a request with this Idempotency-Key is still being processed; retry shortly")
        .with_header(header::RETRY_AFTER, HeaderValue::from(secs))
}

/// Renders the typed response to the bytes that will be stored and sent.
async fn render<T: IntoResponse>(typed: T) -> Result<StoredResponse, Problem> {
    let response = typed.into_response();
    let header_text = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(String::from)
    };
    let location = header_text(header::LOCATION);
    let content_type = header_text(header::CONTENT_TYPE);
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .into_vec()
        .await
        .map_err(|e| Problem::internal(anyhow::anyhow!(e)))?;
    Ok(StoredResponse {
        status,
        location,
        content_type,
        body,
    })
}

/// Deletes the claim if dropped while armed: covers errors, panics and cancellation.
struct ReleaseOnDrop {
    pool: PgPool,
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
        let (pool, owner) = (self.pool.clone(), self.owner);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = store::release(&pool, &scope, owner).await {
                    // The lease still expires, after which a retry takes the key over.
                    tracing::warn!(error = %e, "could not release an idempotency claim");
                }
            });
        }
    }
}

/// A response that went through the guard: fresh or replayed, always the stored bytes.
/// Its OpenAPI description is the operation's own plus the guard's problems.
pub struct Idempotent<T> {
    response: Response,
    _typed: PhantomData<fn() -> T>,
}

impl<T> Idempotent<T> {
    fn build(stored: StoredResponse, replayed: bool) -> Self {
        let mut builder = Response::builder().status(
            StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        );
        if let Some(content_type) = stored.content_type {
            builder = builder.header(header::CONTENT_TYPE, content_type);
        }
        if let Some(location) = stored.location {
            builder = builder.header(header::LOCATION, location);
        }
        if replayed {
            builder = builder.header(REPLAYED_HEADER, "true");
        }
        Self {
            response: builder.body(stored.body),
            _typed: PhantomData,
        }
    }

    fn fresh(stored: StoredResponse) -> Self {
        Self::build(stored, false)
    }

    fn replayed(stored: StoredResponse) -> Self {
        Self::build(stored, true)
    }
}

impl<T: Send> IntoResponse for Idempotent<T> {
    fn into_response(self) -> Response {
        self.response
    }
}

impl<T: ApiResponse> ApiResponse for Idempotent<T> {
    fn meta() -> MetaResponses {
        let mut meta = T::meta();
        for response in &mut meta.responses {
            response.headers.push(MetaHeader {
                name: REPLAYED_HEADER.to_string(),
                description: Some("`true` when this is the stored response of an earlier request with the same key".into()),
                required: false,
                deprecated: false,
                schema: bool::schema_ref(),
            });
        }
        // 400, 401, 403, 5xx come from `Documented`; these are the guard's own.
        let mut problems = crate::api::problems::meta(&[
            (
                409,
                "A request with this key is still in flight, or this request lost its lease; retry after `Retry-After` seconds",
            ),
            (413, "Body larger than 64 KiB"),
            (415, "Content type is not `application/json`"),
            (422, "The key was already used with a different request"),
        ]);
        problems[0].headers.push(MetaHeader {
            name: "Retry-After".to_string(),
            description: Some("Whole seconds to wait before retrying (1 or 2)".into()),
            required: true,
            deprecated: false,
            schema: u32::schema_ref(),
        });
        meta.responses.extend(problems);
        meta
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
        crate::api::problems::register(registry);
    }
}
