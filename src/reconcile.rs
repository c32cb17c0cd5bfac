//! Reconciliation: an audit, outside the request path, of the promise that every
//! committed change has its event and every stored success names a real order.
//!
//! Each order and its event commit in one transaction, so a finding means something
//! went around the code (a manual `DELETE`, a restore of one table but not the other,
//! a bug). The check reads only, in bounded keyset batches on indexes, each batch one
//! short statement, so it never holds locks or a long snapshot.
//!
//! Orders are checked only while their last change is younger than the outbox
//! retention: older events may rightly have been purged. The check looks for the event
//! of the order's current state (`aggregate_seq = version`, the type its status
//! implies) in any outbox status: PENDING and DEAD events exist, and have their own
//! alerts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use sqlx::postgres::PgConnectOptions;

use crate::{
    config::{parse, range, settings},
    db::{Db, SessionLock},
    metrics,
    supervisor::{Every, First, Run, Schedule},
};

settings! {
    /// Whether and how often this process reconciles.
    pub struct ReconcileConfig {
        /// `None` when off.
        interval: Option<Duration> = parse::secs_or_off [RECONCILE_INTERVAL_SECS, "ORDERD_RECONCILE_INTERVAL_SECS", Some("300"), range(0, 86_400), "how often `serve` reconciles orders, events and stored responses; `0` turns it off in this process (run it in one or a few)"],
    }
}

/// Rows read per statement.
pub const RECONCILE_BATCH: i64 = 1000;
/// Findings of each kind kept (and logged) per pass; the counts are always complete.
pub const KEPT_FINDINGS: usize = 100;

/// The event each order status calls for: the one place reconciliation spells it (the
/// query below is built from it, and [`OrderWithoutEvent::missing_event`] reads it).
pub const STATUS_EVENTS: &[(&str, &str)] =
    &[("CREATED", "OrderCreated"), ("CANCELLED", "OrderCancelled")];

/// One page of orders changed within the window, after the keyset cursor, on the index
/// of `updated_at`. The events of the page are then looked up by their key
/// ([`EVENTS_OF_PAGE`]), not joined here: on a distributed database a join of a
/// cross-shard page with another table is not something Citus runs, and on one server
/// the lookup by key is what a per-order join did anyway.
pub const ORDERS_PAGE_SQL: &str = "
    SELECT tenant_id, id, status, version, updated_at
      FROM orders
     WHERE updated_at > now() - make_interval(secs => $1)
       AND (updated_at, tenant_id, id) > ($2, $3, $4)
     ORDER BY updated_at, tenant_id, id
     LIMIT $5";

/// Of the orders `($1, $2)` (tenant, order), the event each one's state `($3, $4)`
/// (version, type) calls for, where it exists: one probe of the event key per order,
/// through a `LATERAL ... LIMIT 1` the planner cannot turn into a hash of the whole
/// outbox (it did, for a join or `NOT EXISTS`, where it believed the table small).
pub const EVENTS_OF_PAGE: &str = "
    SELECT e.tenant_id, e.aggregate_id, e.aggregate_seq, e.event_type
      FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[]) AS w(tenant_id, id, version, event_type)
     CROSS JOIN LATERAL (
          SELECT e.tenant_id, e.aggregate_id, e.aggregate_seq, e.event_type FROM outbox_event e
           WHERE e.tenant_id = w.tenant_id AND e.aggregate_id = w.id
             AND e.aggregate_seq = w.version AND e.event_type = w.event_type
           LIMIT 1) e";

/// [`EVENTS_OF_PAGE`] on a distributed database, where Citus joins a list of keys with
/// a distributed table only as an `IN` on the distribution column: every event of the
/// page's orders (each shard probes the key for its own tenants).
pub const EVENTS_OF_PAGE_DISTRIBUTED: &str = "
    SELECT e.tenant_id, e.aggregate_id, e.aggregate_seq, e.event_type
      FROM outbox_event e
     WHERE (e.tenant_id, e.aggregate_id) IN (
           SELECT w.tenant_id, w.id
             FROM unnest($1::uuid[], $2::uuid[], $3::int[], $4::text[]) AS w(tenant_id, id, version, event_type))";

/// One page of completed keys after the keyset cursor, with the order each stored 2xx
/// response names: by `resource_id`, kept in clear beside a body that may be sealed,
/// or, for a record written before that column, by the body's `id` (such a body was
/// stored in clear). A sealed body is never read here. Walks the index the expiry
/// purge uses; non-2xx answers name no order and are never findings. Whether the
/// orders exist is then looked up by key ([`ORDERS_OF_PAGE`]).
pub const KEYS_PAGE_SQL: &str = "
    SELECT tenant_id, endpoint, idem_key, expires_at,
           response_status BETWEEN 200 AND 299 AS success,
           CASE WHEN response_status NOT BETWEEN 200 AND 299 THEN NULL
                WHEN resource_id IS NOT NULL THEN resource_id::text
                WHEN response_key_id IS NULL
                THEN convert_from(response_body, 'UTF8')::jsonb ->> 'id' END AS order_id
      FROM idempotency_record
     WHERE state = 'COMPLETED'
       AND (expires_at, tenant_id, endpoint, idem_key) > ($1, $2, $3, $4)
     ORDER BY expires_at, tenant_id, endpoint, idem_key
     LIMIT $5";

/// Which of the orders `($1, $2)` (tenant, id) exist: one probe of the primary key each
/// (see [`EVENTS_OF_PAGE`] for the shape).
pub const ORDERS_OF_PAGE: &str = "
    SELECT o.tenant_id, o.id
      FROM unnest($1::uuid[], $2::uuid[]) AS w(tenant_id, id)
     CROSS JOIN LATERAL (
          SELECT o.tenant_id, o.id FROM orders o
           WHERE o.tenant_id = w.tenant_id AND o.id = w.id LIMIT 1) o";

/// [`ORDERS_OF_PAGE`] on a distributed database (see [`EVENTS_OF_PAGE_DISTRIBUTED`]).
pub const ORDERS_OF_PAGE_DISTRIBUTED: &str = "
    SELECT o.tenant_id, o.id
      FROM orders o
     WHERE (o.tenant_id, o.id) IN (SELECT * FROM unnest($1::uuid[], $2::uuid[]))";

/// An order of a page: tenant, id, status, version, last change.
type PageOrder = (Uuid, Uuid, String, i32, DateTime<Utc>);

/// A key of a page: tenant, endpoint, key, expiry, whether it stores a success, the
/// order that success names.
type PageKey = (Uuid, String, String, DateTime<Utc>, bool, Option<String>);

/// The orders of `page` whose current state has no event, in page order.
fn without_event<'p>(
    page: &'p [PageOrder],
    events: &[(Uuid, Uuid, i32, String)],
) -> Vec<&'p PageOrder> {
    let found: std::collections::HashSet<(Uuid, Uuid, i32, &str)> = events
        .iter()
        .map(|(t, a, seq, ty)| (*t, *a, *seq, ty.as_str()))
        .collect();
    page.iter()
        .filter(|(tenant, id, status, version, _)| {
            !found.contains(&(*tenant, *id, *version, expected_event(status)))
        })
        .collect()
}

/// The event type an order's status calls for (an unknown status calls for one no
/// event has, so that it is a finding).
fn expected_event(status: &str) -> &'static str {
    STATUS_EVENTS
        .iter()
        .find(|(s, _)| *s == status)
        .map_or("(an unknown status)", |(_, event)| event)
}

/// The order a stored success names, when it names one at all.
fn named_order(order_id: &Option<String>) -> Option<Uuid> {
    order_id.as_deref().and_then(|id| Uuid::parse_str(id).ok())
}

/// An order whose current state has no event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderWithoutEvent {
    pub tenant_id: Uuid,
    pub order_id: Uuid,
    pub status: String,
}

impl OrderWithoutEvent {
    /// The event type the order's status calls for.
    pub fn missing_event(&self) -> &'static str {
        expected_event(&self.status)
    }
}

/// A completed key whose stored success names no existing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWithoutOrder {
    pub tenant_id: Uuid,
    pub endpoint: String,
    pub idem_key: String,
}

/// What one pass found: complete counts, and the first [`KEPT_FINDINGS`] of each kind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub orders_checked: u64,
    pub keys_checked: u64,
    pub orders_without_event: u64,
    pub keys_without_order: u64,
    pub orders: Vec<OrderWithoutEvent>,
    pub keys: Vec<KeyWithoutOrder>,
}

impl Report {
    /// Whether anything is wrong.
    pub fn clean(&self) -> bool {
        self.orders_without_event == 0 && self.keys_without_order == 0
    }
}

/// One full pass: every order changed within `window`, every completed key.
pub async fn reconcile_once(db: &Db, window: Duration, batch: i64) -> sqlx::Result<Report> {
    let mut report = Report::default();
    check_orders(db, window, batch, &mut report).await?;
    check_keys(db, batch, &mut report).await?;
    Ok(report)
}

/// The keyset walk over orders. The cursor starts at the epoch: no order is older.
async fn check_orders(
    db: &Db,
    window: Duration,
    batch: i64,
    report: &mut Report,
) -> sqlx::Result<()> {
    let window_secs = window.as_secs_f64();
    let mut cursor = (DateTime::<Utc>::UNIX_EPOCH, Uuid::nil(), Uuid::nil());
    loop {
        let after = cursor;
        let (rows, events) = db
            .run(async |sql| {
                let page: Vec<PageOrder> = sql
                    .query_as(ORDERS_PAGE_SQL)
                    .bind(window_secs)
                    .bind(after.0)
                    .bind(after.1)
                    .bind(after.2)
                    .bind(batch)
                    .fetch_all(sql.conn())
                    .await?;
                let tenants: Vec<Uuid> = page.iter().map(|o| o.0).collect();
                let ids: Vec<Uuid> = page.iter().map(|o| o.1).collect();
                let versions: Vec<i32> = page.iter().map(|o| o.3).collect();
                let expected: Vec<&str> = page.iter().map(|o| expected_event(&o.2)).collect();
                let statement = if sql.distributed() {
                    EVENTS_OF_PAGE_DISTRIBUTED
                } else {
                    EVENTS_OF_PAGE
                };
                let events: Vec<(Uuid, Uuid, i32, String)> = sql
                    .query_as(statement)
                    .bind(tenants)
                    .bind(ids)
                    .bind(versions)
                    .bind(expected)
                    .fetch_all(sql.conn())
                    .await?;
                Ok((page, events))
            })
            .await?;
        report.orders_checked += rows.len() as u64;
        for (tenant_id, order_id, status, ..) in without_event(&rows, &events) {
            report.orders_without_event += 1;
            if report.orders.len() < KEPT_FINDINGS {
                report.orders.push(OrderWithoutEvent {
                    tenant_id: *tenant_id,
                    order_id: *order_id,
                    status: status.clone(),
                });
            }
        }
        match rows.last() {
            Some((tenant, id, _, _, updated_at)) if rows.len() as i64 == batch => {
                cursor = (*updated_at, *tenant, *id);
            }
            _ => return Ok(()),
        }
    }
}

/// The keyset walk over completed keys.
async fn check_keys(db: &Db, batch: i64, report: &mut Report) -> sqlx::Result<()> {
    let mut cursor = (
        DateTime::<Utc>::UNIX_EPOCH,
        Uuid::nil(),
        String::new(),
        String::new(),
    );
    loop {
        let after = cursor.clone();
        let (rows, existing) = db
            .run(async |sql| {
                let page: Vec<PageKey> = sql
                    .query_as(KEYS_PAGE_SQL)
                    .bind(after.0)
                    .bind(after.1)
                    .bind(&after.2)
                    .bind(&after.3)
                    .bind(batch)
                    .fetch_all(sql.conn())
                    .await?;
                let (tenants, ids): (Vec<Uuid>, Vec<Uuid>) = page
                    .iter()
                    .filter_map(|k| named_order(&k.5).map(|id| (k.0, id)))
                    .unzip();
                let statement = if sql.distributed() {
                    ORDERS_OF_PAGE_DISTRIBUTED
                } else {
                    ORDERS_OF_PAGE
                };
                let existing: Vec<(Uuid, Uuid)> = sql
                    .query_as(statement)
                    .bind(tenants)
                    .bind(ids)
                    .fetch_all(sql.conn())
                    .await?;
                Ok((page, existing))
            })
            .await?;
        let existing: std::collections::HashSet<(Uuid, Uuid)> = existing.into_iter().collect();
        for (tenant_id, endpoint, idem_key, _, success, order_id) in &rows {
            report.keys_checked += 1;
            // A success whose order cannot be found: not named, not an id, or gone.
            let missing = *success
                && named_order(order_id).is_none_or(|id| !existing.contains(&(*tenant_id, id)));
            if missing {
                report.keys_without_order += 1;
                if report.keys.len() < KEPT_FINDINGS {
                    report.keys.push(KeyWithoutOrder {
                        tenant_id: *tenant_id,
                        endpoint: endpoint.clone(),
                        idem_key: idem_key.clone(),
                    });
                }
            }
        }
        match rows.last() {
            Some((tenant, endpoint, key, expires_at, ..)) if rows.len() as i64 == batch => {
                cursor = (*expires_at, *tenant, endpoint.clone(), key.clone());
            }
            _ => return Ok(()),
        }
    }
}

/// Logs the kept findings (ids, never bodies) and sets the gauges.
fn publish(report: &Report) {
    for order in &report.orders {
        tracing::error!(
            tenant = %order.tenant_id,
            order_id = %order.order_id,
            status = %order.status,
            missing_event = order.missing_event(),
            "reconciliation: an order has no event for its current state"
        );
    }
    for key in &report.keys {
        tracing::error!(
            tenant = %key.tenant_id,
            endpoint = %key.endpoint,
            idempotency_key = %key.idem_key,
            "reconciliation: a stored success names an order that does not exist"
        );
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    metrics::reconciled(report.orders_without_event, report.keys_without_order, now);
}

/// The advisory lock key of reconciliation: "orderd" in ASCII, then 1.
pub const LOCK_KEY: i64 = 0x6f72_6465_7264_0001;

/// One pass, unless another process holds [`LOCK_KEY`] (taken on `lock_on`, a direct
/// session): any number of processes may run `serve` with reconciliation on, and one
/// of them reconciles at a time.
pub async fn pass_if_alone(
    db: &Db,
    lock_on: &PgConnectOptions,
    window: Duration,
    batch: i64,
) -> sqlx::Result<Option<Report>> {
    let Some(_lock) = SessionLock::try_take(lock_on, LOCK_KEY).await? else {
        return Ok(None);
    };
    let started = std::time::Instant::now();
    let report = reconcile_once(db, window, batch).await?;
    publish(&report);
    tracing::info!(
        orders_checked = report.orders_checked,
        keys_checked = report.keys_checked,
        orders_without_event = report.orders_without_event,
        keys_without_order = report.keys_without_order,
        seconds = started.elapsed().as_secs_f64(),
        "reconciliation pass"
    );
    Ok(Some(report))
}

/// Reconciles every `interval` until `shutdown`, the first pass soon after start (a few
/// seconds in, so that several processes started together do not all try at once).
pub async fn run(
    db: Db,
    lock_on: PgConnectOptions,
    interval: Duration,
    window: Duration,
    shutdown: CancellationToken,
) {
    let every = Every {
        interval,
        first: First::Spread,
        after_failure: None,
    };
    let mut schedule = Schedule::new("reconciliation", every, shutdown);
    while schedule.next().await {
        let turn = async {
            match pass_if_alone(&db, &lock_on, window, RECONCILE_BATCH).await {
                Ok(Some(_)) => Run::Done,
                Ok(None) => Run::Skipped,
                Err(e) => Run::Failed(format!("reconciliation pass: {e}")),
            }
        };
        let Some(run) = schedule.unless_shutdown(turn).await else {
            return;
        };
        schedule.ran(run);
    }
}
