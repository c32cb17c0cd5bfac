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

use std::{
    sync::LazyLock,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

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

/// One page of orders changed within the window, after the keyset cursor, each with
/// whether the event of its current state is missing. The event is looked up per
/// order through a `LATERAL ... LIMIT 1`, which the planner cannot turn into a hash of
/// the whole outbox (it did, for `NOT EXISTS`, on a small table).
pub static ORDERS_BATCH_SQL: LazyLock<String> = LazyLock::new(|| {
    let expected: String = STATUS_EVENTS
        .iter()
        .map(|(status, event)| format!(" WHEN '{status}' THEN '{event}'"))
        .collect();
    format!(
        "
    SELECT o.tenant_id, o.id, o.status, o.updated_at, e.found IS NULL AS missing
      FROM (SELECT tenant_id, id, status, version, updated_at
              FROM orders
             WHERE updated_at > now() - make_interval(secs => $1)
               AND (updated_at, tenant_id, id) > ($2, $3, $4)
             ORDER BY updated_at, tenant_id, id
             LIMIT $5) o
      LEFT JOIN LATERAL (
          SELECT true AS found FROM outbox_event e
           WHERE e.tenant_id = o.tenant_id AND e.aggregate_id = o.id
             AND e.aggregate_seq = o.version
             AND e.event_type = CASE o.status{expected} END
           LIMIT 1
      ) e ON true
     ORDER BY o.updated_at, o.tenant_id, o.id"
    )
});

/// One page of completed keys after the keyset cursor, each with whether its stored
/// 2xx response names an order that does not exist: by `resource_id`, kept in clear
/// beside a body that may be sealed, or, for a record written before that column,
/// by the body's `id` (such a body was stored in clear). A sealed body is never read
/// here. Walks the index the expiry purge uses; non-2xx answers name no order and are
/// never findings.
pub const KEYS_BATCH_SQL: &str = "
    SELECT r.tenant_id, r.endpoint, r.idem_key, r.expires_at,
           r.response_status BETWEEN 200 AND 299 AND o.found IS NULL AS missing
      FROM (SELECT tenant_id, endpoint, idem_key, expires_at, response_status,
                   CASE WHEN response_status NOT BETWEEN 200 AND 299 THEN NULL
                        WHEN resource_id IS NOT NULL THEN resource_id::text
                        WHEN response_key_id IS NULL
                        THEN convert_from(response_body, 'UTF8')::jsonb ->> 'id' END AS order_id
              FROM idempotency_record
             WHERE state = 'COMPLETED'
               AND (expires_at, tenant_id, endpoint, idem_key) > ($1, $2, $3, $4)
             ORDER BY expires_at, tenant_id, endpoint, idem_key
             LIMIT $5) r
      LEFT JOIN LATERAL (
          SELECT true AS found FROM orders o
           WHERE o.tenant_id = r.tenant_id
             AND o.id = CASE WHEN r.order_id ~ '^[0-9a-fA-F-]{36}$' THEN r.order_id::uuid END
           LIMIT 1
      ) o ON true
     ORDER BY r.expires_at, r.tenant_id, r.endpoint, r.idem_key";

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
        STATUS_EVENTS
            .iter()
            .find(|(status, _)| *status == self.status)
            .map_or("(an unknown status)", |(_, event)| event)
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
        let rows = db
            .run(async |sql| {
                sql.query_as::<(Uuid, Uuid, String, DateTime<Utc>, bool)>(ORDERS_BATCH_SQL.as_str())
                    .bind(window_secs)
                    .bind(after.0)
                    .bind(after.1)
                    .bind(after.2)
                    .bind(batch)
                    .fetch_all(sql.conn())
                    .await
            })
            .await?;
        for (tenant_id, order_id, status, _, missing) in &rows {
            report.orders_checked += 1;
            if *missing {
                report.orders_without_event += 1;
                if report.orders.len() < KEPT_FINDINGS {
                    report.orders.push(OrderWithoutEvent {
                        tenant_id: *tenant_id,
                        order_id: *order_id,
                        status: status.clone(),
                    });
                }
            }
        }
        match rows.last() {
            Some((tenant, id, _, updated_at, _)) if rows.len() as i64 == batch => {
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
        let rows = db
            .run(async |sql| {
                sql.query_as::<(Uuid, String, String, DateTime<Utc>, bool)>(KEYS_BATCH_SQL)
                    .bind(after.0)
                    .bind(after.1)
                    .bind(&after.2)
                    .bind(&after.3)
                    .bind(batch)
                    .fetch_all(sql.conn())
                    .await
            })
            .await?;
        for (tenant_id, endpoint, idem_key, _, missing) in &rows {
            report.keys_checked += 1;
            if *missing {
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
            Some((tenant, endpoint, key, expires_at, _)) if rows.len() as i64 == batch => {
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
