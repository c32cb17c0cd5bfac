//! The application layer: create, cancel, get and list, once, under both transports.
//!
//! REST (`api::orders`) and the MCP tools (`api::mcp`) only parse their own framing,
//! authenticate through the one verifier into a [`Caller`], call an operation here and
//! render the neutral [`Reply`] it returns. Writes go through the idempotency guard,
//! which stores the reply's bytes; so a tool call and a REST call with the same key
//! and request are one operation: one order, one event, and the second one replays.
//! Nothing here knows HTTP framing or MCP messages.

pub mod problem;
pub mod view;

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use chrono::{DateTime, Datelike, Utc};
use serde::Serialize;
use uuid::Uuid;

use self::{
    problem::{Kind, Problem},
    view::{OrderPage, OrderView},
};
use crate::{
    auth::{Principal, SCOPE_READ, SCOPE_WRITE},
    db::Db,
    erasure::Erasures,
    idempotency::{self, Answer, Fingerprint, Guard, IdempotencyKey, Scope, StoredResponse},
    metrics::label_enum,
    orders::{self, CancelOutcome, NewOrder, store::PageAfter},
    telemetry,
    tenant::TenantId,
    trace_context::TraceContext,
};
use tracing::Instrument;

label_enum! {
    /// The idempotent operations, by method and route template: the `endpoint` of an
    /// idempotency record's key (stored in `idempotency_record.endpoint`) and of the
    /// `idempotency_requests_total` metric. A REST call and a tool call of one
    /// operation share it.
    pub Endpoint {
        CreateOrder => "POST /v1/orders",
        CancelOrder => "POST /v1/orders/{id}/cancel",
    }
}

/// Page sizes of a list: 1 to [`LIMIT_MAX`], [`LIMIT_DEFAULT`] when not given.
pub const LIMIT_MAX: i64 = 100;
pub const LIMIT_DEFAULT: i64 = 20;

/// Who calls: a verified token's principal (tenant, subject, scopes). Both transports
/// make one the same way, through `auth::Verifier`; only a verified token makes one.
#[derive(Debug, Clone)]
pub struct Caller {
    principal: Arc<Principal>,
    /// The trace context the request came with, kept with the events it causes.
    trace: Option<TraceContext>,
}

impl Caller {
    pub fn new(principal: Arc<Principal>) -> Self {
        Self {
            principal,
            trace: None,
        }
    }

    /// The caller, continuing the trace of the request's `traceparent` (if valid).
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    pub fn trace(&self) -> Option<&TraceContext> {
        self.trace.as_ref()
    }

    pub fn tenant(&self) -> TenantId {
        self.principal.tenant
    }

    pub fn subject(&self) -> &str {
        &self.principal.subject
    }

    fn require(&self, scope: &'static str) -> Result<(), Problem> {
        Ok(self.principal.require(scope)?)
    }
}

/// What an operation answers, as both transports render it: the guard's [`Answer`]
/// (status, body bytes, `Location`, and whether it is the stored reply of an earlier
/// request), for reads as for writes.
pub type Reply = Answer;

/// The span of an idempotency decision; the guard records its outcome.
fn decision_span() -> tracing::Span {
    tracing::info_span!(
        target: telemetry::SPANS,
        "idempotency",
        idempotency.outcome = tracing::field::Empty,
    )
}

/// The span of an operation's database work (database semantic conventions; never a
/// parameter value).
fn db_span(operation: &'static str) -> tracing::Span {
    tracing::info_span!(
        target: telemetry::SPANS,
        "db",
        otel.name = operation,
        otel.kind = "client",
        db.system.name = "postgresql",
        db.operation.name = operation,
    )
}

/// A reply made just now (not a replay).
fn fresh(response: StoredResponse) -> Reply {
    Answer {
        response,
        replayed: false,
        expires_at: None,
    }
}

/// How a transport frames the answers the service makes: the status of each kind of
/// answer and the media types of its bodies. Given by the transport (`api::FRAMING`)
/// and applied here, before an answer is stored: a stored answer is replayed byte for
/// byte whichever transport asks (REST and MCP share one key space), so its status is
/// part of what is stored. The service itself names no status and no media type.
#[derive(Debug)]
pub struct Framing {
    /// A write that made a new resource.
    pub created: u16,
    /// Any other success.
    pub ok: u16,
    /// A refusal of `kind`.
    pub refused: fn(problem::Kind) -> u16,
    /// The media type of a success body.
    pub json: &'static str,
    /// The media type of a refusal's body.
    pub problem: &'static str,
}

impl Framing {
    /// A JSON answer: `status` (one of this framing's) and the rendering of `value`.
    fn json(&self, status: u16, value: &impl Serialize) -> StoredResponse {
        StoredResponse {
            status,
            location: None,
            content_type: Some(self.json.to_string()),
            body: view::render(value).into(),
            resource: None,
        }
    }

    /// An answer that is `order`, naming it as the resource (stored in clear beside a
    /// sealed body, so that reconciliation finds the order without opening the body).
    fn order(&self, status: u16, order: orders::Order) -> StoredResponse {
        StoredResponse {
            resource: Some(order.id),
            ..self.json(status, &OrderView::from(order))
        }
    }

    /// A refusal stored like an answer (a cancel of an unknown order): the problem's
    /// status and its problem body, `instance` the operation's path.
    fn refusal(&self, problem: &Problem, instance: String) -> StoredResponse {
        let status = (self.refused)(problem.kind);
        let mut details = problem.details(status);
        details.instance = Some(instance);
        StoredResponse {
            status,
            location: None,
            content_type: Some(self.problem.to_string()),
            body: serde_json::to_vec(&details)
                .expect("problem details always serialise")
                .into(),
            resource: None,
        }
    }
}

/// The operations, over the process's database and idempotency guard.
#[derive(Clone)]
pub struct Service {
    db: Db,
    guard: Guard,
    /// Operations doing work at once (`ORDERD_HTTP_MAX_IN_FLIGHT`). Taken here, when an
    /// operation starts, so that only requests whose token verified, that passed their
    /// tenant's limits and whose body has arrived hold a place: a client that has not
    /// authenticated, or sends slowly, can never take capacity from one that has.
    capacity: Arc<Semaphore>,
    /// Tenants being erased: their writes are refused before anything else is looked
    /// up (see `crate::erasure`).
    erasures: Arc<Erasures>,
    /// The transport's statuses and media types for what is answered.
    framing: &'static Framing,
}

impl Service {
    pub fn new(
        db: Db,
        guard: Guard,
        max_in_flight: usize,
        erasures: Arc<Erasures>,
        framing: &'static Framing,
    ) -> Self {
        Self {
            db,
            guard,
            capacity: Arc::new(Semaphore::new(max_in_flight)),
            erasures,
            framing,
        }
    }

    /// Refuses a write of a tenant being erased (409, nothing looked up or stored): one
    /// this process holds as being erased and the table still marks.
    ///
    /// The set alone lags behind the table: `orderd tenant erase` ends the mark and
    /// returns at once, and a process hears that a notification's delivery later, or, its
    /// listening session silent, only at its next read of the table (a quarter of the
    /// bound). A refusal then would turn away the tenant's first writes after the erase
    /// returned, which the contract says work again. So the set only says where to look:
    /// a tenant outside it costs nothing (the database refuses the claim of a tenant
    /// marked since), and one inside it costs one read of the table's primary key, on
    /// the node that holds the tenant's shard. A write is refused only when that read
    /// finds the mark; a read that fails is the database's failure, as the claim's would be.
    async fn writable(&self, caller: &Caller) -> Result<(), Problem> {
        let tenant = caller.tenant();
        if self.erasures.contains(tenant)
            && self
                .db
                .for_tenant(tenant.0)
                .run(async |c| idempotency::store::tenant_erasing(c, tenant).await)
                .await?
        {
            return Err(Problem::erasing());
        }
        Ok(())
    }

    /// The guard, for the process's upkeep (its replay cache).
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// A place among the operations in flight, or 503 at once: a full process sheds
    /// rather than queues, so a client's retry finds a process that has room.
    fn admit(&self) -> Result<OwnedSemaphorePermit, Problem> {
        self.capacity.clone().try_acquire_owned().map_err(|_| {
            Problem::new(Kind::ServiceUnavailable)
                .with_detail("the server is at capacity; retry shortly")
                .with_retry_after(1)
        })
    }

    /// The database, for the readiness probe.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates an order once per key: `POST /v1/orders`, the `create_order` tool.
    pub async fn create(
        &self,
        caller: &Caller,
        key: IdempotencyKey,
        new: NewOrder,
    ) -> Result<Reply, Problem> {
        caller.require(SCOPE_WRITE)?;
        self.writable(caller).await?;
        let _place = self.admit()?;
        let scope = Scope {
            tenant: caller.tenant(),
            endpoint: Endpoint::CreateOrder.as_str(),
            key,
        };
        let (trace, framing) = (caller.trace().cloned(), self.framing);
        let answer = self
            .guard
            .run_in_one_statement(&scope, create_fingerprint(&new), move |mut sql, fence| {
                Box::pin(
                    async move {
                        let order = orders::Order::created(&new, fence.at);
                        let response = StoredResponse {
                            location: Some(format!("/v1/orders/{}", order.id)),
                            ..framing.order(framing.created, order.clone())
                        };
                        let written = orders::store::create(
                            &mut sql,
                            &fence,
                            &response,
                            &order,
                            trace.as_ref(),
                        )
                        .await?;
                        Ok::<_, Problem>(written.then_some(response))
                    }
                    .instrument(db_span("create order")),
                )
            })
            .instrument(decision_span())
            .await?;
        Ok(answer)
    }

    /// Cancels an order once per key: `POST /v1/orders/{id}/cancel`, the `cancel_order`
    /// tool. An unknown order is a 404 that is stored and replayed like a success.
    pub async fn cancel(
        &self,
        caller: &Caller,
        key: IdempotencyKey,
        id: Uuid,
    ) -> Result<Reply, Problem> {
        caller.require(SCOPE_WRITE)?;
        self.writable(caller).await?;
        let _place = self.admit()?;
        let tenant = caller.tenant();
        let scope = Scope {
            tenant,
            endpoint: Endpoint::CancelOrder.as_str(),
            key,
        };
        let (trace, framing) = (caller.trace().cloned(), self.framing);
        let answer = self
            .guard
            .run(&scope, cancel_fingerprint(id), move |mut sql, _| {
                Box::pin(
                    async move {
                        Ok::<_, Problem>(
                            match orders::store::cancel(&mut sql, tenant, id, trace.as_ref())
                                .await?
                            {
                                CancelOutcome::Cancelled(order)
                                | CancelOutcome::AlreadyCancelled(order) => {
                                    framing.order(framing.ok, order)
                                }
                                CancelOutcome::NotFound => {
                                    framing.refusal(&not_found(id), format!("/v1/orders/{id}"))
                                }
                            },
                        )
                    }
                    .instrument(db_span("cancel order")),
                )
            })
            .instrument(decision_span())
            .await?;
        Ok(answer)
    }

    /// One order of the caller's tenant: `GET /v1/orders/{id}`, the `get_order` tool.
    /// Another tenant's order does not exist for the caller (404, never 403).
    pub async fn get(&self, caller: &Caller, id: Uuid) -> Result<Reply, Problem> {
        caller.require(SCOPE_READ)?;
        let _place = self.admit()?;
        let tenant = caller.tenant();
        let found = self
            .db
            .for_tenant(tenant.0)
            .run(async |c| orders::store::get(c, tenant, id).await)
            .instrument(db_span("get order"))
            .await?;
        match found {
            Some(order) => Ok(fresh(
                self.framing.json(self.framing.ok, &OrderView::from(order)),
            )),
            None => Err(not_found(id)),
        }
    }

    /// One page of the caller's tenant's orders, newest first, after the position the
    /// cursor `after` names: `GET /v1/orders`, the `list_orders` tool.
    pub async fn list(
        &self,
        caller: &Caller,
        limit: i64,
        after: Option<&str>,
    ) -> Result<Reply, Problem> {
        caller.require(SCOPE_READ)?;
        if !(1..=LIMIT_MAX).contains(&limit) {
            return Err(Problem::invalid_field(
                "limit",
                &format!("must be a whole number from 1 to {LIMIT_MAX}"),
            ));
        }
        let _place = self.admit()?;
        // An empty `after` is no position at all: the first page.
        let after = after
            .filter(|a| !a.is_empty())
            .map(decode_cursor)
            .transpose()?;
        let tenant = caller.tenant();
        // One extra row tells whether a next page exists without a count query.
        let mut items = self
            .db
            .for_tenant(tenant.0)
            .run(async |c| orders::store::list(c, tenant, limit + 1, after).await)
            .instrument(db_span("list orders"))
            .await?;
        let next = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|o| encode_cursor(o.created_at, o.id))
        } else {
            None
        };
        Ok(fresh(self.framing.json(
            self.framing.ok,
            &OrderPage {
                items: items.into_iter().map(OrderView::from).collect(),
                next,
            },
        )))
    }
}

fn not_found(id: Uuid) -> Problem {
    Problem::new(Kind::NotFound).with_detail(format!("order {id} does not exist"))
}

/// The fingerprint of a create: the parsed body with defaults applied.
pub fn create_fingerprint(new: &NewOrder) -> Fingerprint {
    Fingerprint::of(&RequestShape {
        path: None,
        body: Some(new),
    })
}

/// The fingerprint of a cancel: the order id from the path.
pub fn cancel_fingerprint(id: Uuid) -> Fingerprint {
    Fingerprint::of(&RequestShape::<()> {
        path: Some(PathParams { id }),
        body: None,
    })
}

/// What the fingerprint covers: path parameters and the parsed body with defaults.
#[derive(Serialize)]
struct RequestShape<'a, B: Serialize> {
    path: Option<PathParams>,
    body: Option<&'a B>,
}

#[derive(Serialize)]
struct PathParams {
    id: Uuid,
}

/// Opaque cursor: the `(created_at, id)` of the last order of a page.
pub fn encode_cursor(created_at: DateTime<Utc>, id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", created_at.timestamp_micros(), id.simple()))
}

/// The position a cursor names; a malformed, forged or out-of-range one is a
/// `validation-error` on `after`.
pub fn decode_cursor(cursor: &str) -> Result<PageAfter, Problem> {
    let bad = || {
        Problem::new(Kind::ValidationError)
            .with_detail("`after` is not a cursor returned by this API")
            .with_errors(vec![problem::FieldError {
                field: "after".into(),
                message: "not a valid cursor".into(),
            }])
    };
    let text = URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(bad)?;
    let (micros, id) = text.split_once('.').ok_or_else(bad)?;
    // A position the database can compare with: years 1 to 9999 (a forged cursor
    // outside PostgreSQL's range would otherwise fail there).
    let created_at = micros
        .parse::<i64>()
        .ok()
        .and_then(DateTime::from_timestamp_micros)
        .filter(|at| (1..=9999).contains(&at.year()))
        .ok_or_else(bad)?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    Ok(PageAfter { created_at, id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_a_validation_error() {
        let at = DateTime::from_timestamp_micros(1_790_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        assert_eq!(
            decode_cursor(&encode_cursor(at, id)).unwrap(),
            PageAfter { created_at: at, id }
        );
        let far = format!("{}.{}", i64::MAX / 2, Uuid::nil().simple());
        let before_year_one = format!("{}.{}", -62_200_000_000_000_000i64, Uuid::nil().simple());
        for bad in [
            "",
            "!!!",
            "bm9wZQ",
            &URL_SAFE_NO_PAD.encode("12.not-a-uuid"),
            &URL_SAFE_NO_PAD.encode(far),
            &URL_SAFE_NO_PAD.encode(before_year_one),
        ] {
            assert_eq!(
                decode_cursor(bad).unwrap_err().kind,
                Kind::ValidationError,
                "{bad}"
            );
        }
    }

    #[test]
    fn endpoints_round_trip_through_their_spelling() {
        for e in Endpoint::ALL {
            assert_eq!(Endpoint::parse(e.as_str()), Some(*e));
        }
        assert_eq!(Endpoint::parse("GET /v1/orders"), None);
    }
}
