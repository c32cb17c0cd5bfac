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
    db::{self, Db, Scan, SessionLock},
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
    /// On a distributed database, the shards left unchecked because their worker did
    /// not answer: a pass that leaves any is incomplete, never clean.
    pub unreadable_shards: u64,
}

impl Report {
    /// Whether everything was checked and nothing is wrong.
    pub fn clean(&self) -> bool {
        self.orders_without_event == 0 && self.keys_without_order == 0 && self.complete()
    }

    /// Whether every shard was read.
    pub fn complete(&self) -> bool {
        self.unreadable_shards == 0
    }

    fn order_without_event(&mut self, tenant_id: Uuid, order_id: Uuid, status: &str) {
        self.orders_without_event += 1;
        if self.orders.len() < KEPT_FINDINGS {
            self.orders.push(OrderWithoutEvent {
                tenant_id,
                order_id,
                status: status.to_string(),
            });
        }
    }

    fn key_without_order(&mut self, tenant_id: Uuid, endpoint: &str, idem_key: &str) {
        self.keys_without_order += 1;
        if self.keys.len() < KEPT_FINDINGS {
            self.keys.push(KeyWithoutOrder {
                tenant_id,
                endpoint: endpoint.to_string(),
                idem_key: idem_key.to_string(),
            });
        }
    }
}

/// One full pass: every order changed within `window`, every completed key. On a
/// distributed database, worker by worker (see [`check_each_node`]).
pub async fn reconcile_once(db: &Db, window: Duration, batch: i64) -> sqlx::Result<Report> {
    let mut report = Report::default();
    match db.layout().pick(&db::WHOLE_TABLE_READS) {
        Scan::EachNode => check_each_node(db, window, batch, &mut report).await?,
        Scan::OneStatement => {
            check_orders(db, window, batch, &mut report).await?;
            check_keys(db, batch, &mut report).await?;
        }
    }
    Ok(report)
}

/// An order of a worker's page, with whether its event was found there.
#[derive(serde::Deserialize)]
struct NodeOrder {
    tenant_id: Uuid,
    id: Uuid,
    status: String,
    updated_at: DateTime<Utc>,
    has_event: bool,
}

/// A completed key of a worker's page, with whether the order its success names was
/// found there.
#[derive(serde::Deserialize)]
struct NodeKey {
    tenant_id: Uuid,
    endpoint: String,
    idem_key: String,
    expires_at: DateTime<Utc>,
    success: bool,
    order_id: Option<String>,
    order_exists: bool,
}

/// One page of a worker's orders changed since `since`, after the keyset cursor
/// `after`, each with whether its current state's event is in the worker's outbox
/// shards (co-located: a tenant's orders and events are on one worker).
fn node_orders_page(
    node: &db::Node,
    since: DateTime<Utc>,
    after: &OrderCursor,
    batch: i64,
) -> String {
    let expected: String = STATUS_EVENTS
        .iter()
        .map(|(status, event)| format!(" WHEN '{status}' THEN '{event}'"))
        .collect();
    format!(
        "SELECT orders.tenant_id, orders.id, orders.status, orders.updated_at,
                EXISTS (SELECT 1 FROM {outbox}
                        WHERE outbox_event.tenant_id = orders.tenant_id
                          AND outbox_event.aggregate_id = orders.id
                          AND outbox_event.aggregate_seq = orders.version
                          AND outbox_event.event_type = CASE orders.status{expected} END) AS has_event
         FROM {orders}
         WHERE orders.updated_at > {since}
           AND (orders.updated_at, orders.tenant_id, orders.id) > ({at}, '{tenant}'::uuid, '{id}'::uuid)
         ORDER BY orders.updated_at, orders.tenant_id, orders.id
         LIMIT {batch}",
        outbox = node.part("outbox_event"),
        orders = node.part("orders"),
        since = db::time_literal(since),
        at = db::time_literal(after.0),
        tenant = after.1,
        id = after.2,
    )
}

/// One page of a worker's completed keys after the keyset cursor `after` (see
/// [`KEYS_PAGE_SQL`]), each with whether the order its success names is in the
/// worker's order shards.
fn node_keys_page(node: &db::Node, after: &KeyCursor, batch: i64) -> String {
    format!(
        "SELECT k.tenant_id, k.endpoint, k.idem_key, k.expires_at, k.success, k.order_id,
                EXISTS (SELECT 1 FROM {orders}
                        WHERE orders.tenant_id = k.tenant_id AND orders.id = u.order_uuid) AS order_exists
         FROM (SELECT idempotency_record.tenant_id, endpoint, idem_key, expires_at,
                      response_status BETWEEN 200 AND 299 AS success,
                      CASE WHEN response_status NOT BETWEEN 200 AND 299 THEN NULL
                           WHEN resource_id IS NOT NULL THEN resource_id::text
                           WHEN response_key_id IS NULL
                           THEN convert_from(response_body, 'UTF8')::jsonb ->> 'id' END AS order_id
               FROM {records}
               WHERE state = 'COMPLETED'
                 AND (expires_at, idempotency_record.tenant_id, endpoint, idem_key)
                     > ({at}, '{tenant}'::uuid, {endpoint}, {key})
               ORDER BY expires_at, idempotency_record.tenant_id, endpoint, idem_key
               LIMIT {batch}) k
         CROSS JOIN LATERAL (
             SELECT CASE WHEN k.order_id ~* '^[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}$'
                         THEN k.order_id::uuid END AS order_uuid) u",
        orders = node.part("orders"),
        records = node.part("idempotency_record"),
        at = db::time_literal(after.0),
        tenant = after.1,
        endpoint = db::text_literal(&after.2),
        key = db::text_literal(&after.3),
    )
}

/// Where a worker's walk over its orders stands: the last order's change, tenant, id.
type OrderCursor = (DateTime<Utc>, Uuid, Uuid);
/// Where a worker's walk over its keys stands: the last key's expiry, tenant,
/// endpoint, key.
type KeyCursor = (DateTime<Utc>, Uuid, String, String);

/// Both walks on a distributed database, each worker on its own: one command per
/// worker and page, over the worker's shards (orders with their events, keys with
/// their orders), in parallel, each worker with its own keyset cursor. A worker that
/// does not answer is left out, its shards counted in [`Report::unreadable_shards`],
/// and the others are checked to the end.
async fn check_each_node(
    db: &Db,
    window: Duration,
    batch: i64,
    report: &mut Report,
) -> sqlx::Result<()> {
    let tables = ["orders", "outbox_event", "idempotency_record"];
    let (nodes, since) = db
        .run(async |sql| {
            let nodes = db::nodes_of(sql, &tables).await?;
            let since = db::seconds_ago(sql, window.as_secs() as i64).await?;
            Ok::<_, sqlx::Error>((nodes, since))
        })
        .await?;
    let mut unreadable = std::collections::BTreeSet::new();
    let start: OrderCursor = (DateTime::<Utc>::UNIX_EPOCH, Uuid::nil(), Uuid::nil());
    let orders = Walk {
        nodes: &nodes,
        batch,
        order: "r.updated_at, r.tenant_id, r.id",
    };
    orders
        .run(
            db,
            start,
            |node, after| node_orders_page(node, since, after, batch),
            |row: &NodeOrder| (row.updated_at, row.tenant_id, row.id),
            &mut unreadable,
            |row: &NodeOrder| {
                report.orders_checked += 1;
                if !row.has_event {
                    report.order_without_event(row.tenant_id, row.id, &row.status);
                }
            },
        )
        .await?;
    let start: KeyCursor = (
        DateTime::<Utc>::UNIX_EPOCH,
        Uuid::nil(),
        String::new(),
        String::new(),
    );
    let keys = Walk {
        nodes: &nodes,
        batch,
        order: "r.expires_at, r.tenant_id, r.endpoint, r.idem_key",
    };
    keys.run(
        db,
        start,
        |node, after| node_keys_page(node, after, batch),
        |row: &NodeKey| {
            (
                row.expires_at,
                row.tenant_id,
                row.endpoint.clone(),
                row.idem_key.clone(),
            )
        },
        &mut unreadable,
        |row: &NodeKey| {
            report.keys_checked += 1;
            if row.success && (named_order(&row.order_id).is_none() || !row.order_exists) {
                report.key_without_order(row.tenant_id, &row.endpoint, &row.idem_key);
            }
        },
    )
    .await?;
    report.unreadable_shards = unreadable
        .iter()
        .map(|i| nodes[*i].shards_of("orders") as u64)
        .sum();
    Ok(())
}

/// A keyset walk over every worker at once, a cursor each.
struct Walk<'n> {
    nodes: &'n [db::Node],
    batch: i64,
    /// The columns of a page that order it (its keyset).
    order: &'static str,
}

impl Walk<'_> {
    /// Pages through every worker not yet in `unreadable`, from `start`: `page` builds
    /// a worker's next page after its cursor, `cursor_of` reads a row's place, `each`
    /// sees every row. A worker that does not answer joins `unreadable`.
    async fn run<C: Clone, R: serde::de::DeserializeOwned>(
        &self,
        db: &Db,
        start: C,
        page: impl Fn(&db::Node, &C) -> String,
        cursor_of: impl Fn(&R) -> C,
        unreadable: &mut std::collections::BTreeSet<usize>,
        mut each: impl FnMut(&R),
    ) -> sqlx::Result<()> {
        let mut walking: Vec<(usize, C)> = (0..self.nodes.len())
            .filter(|i| !unreadable.contains(i))
            .map(|i| (i, start.clone()))
            .collect();
        while !walking.is_empty() {
            let commands: Vec<(&db::Node, String)> = walking
                .iter()
                .map(|(i, after)| {
                    let node = &self.nodes[*i];
                    (node, db::as_json_rows(&page(node, after), Some(self.order)))
                })
                .collect();
            let results = db.run(async |sql| db::run_on(sql, &commands).await).await?;
            let mut next = Vec::new();
            for ((i, _), result) in walking.iter().zip(results) {
                let Ok(answer) = result else {
                    unreadable.insert(*i);
                    continue;
                };
                let rows: Vec<R> = db::json_rows(&answer)?;
                rows.iter().for_each(&mut each);
                if let Some(last) = rows.last().filter(|_| rows.len() as i64 == self.batch) {
                    next.push((*i, cursor_of(last)));
                }
            }
            walking = next;
        }
        Ok(())
    }
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
                let statement = EVENTS_OF_PAGE;
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
            report.order_without_event(*tenant_id, *order_id, status);
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
                let statement = ORDERS_OF_PAGE;
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
                report.key_without_order(*tenant_id, endpoint, idem_key);
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

/// Logs the kept findings (ids, never bodies) and sets the gauges. A pass that could
/// not read every shard logs what it found but sets nothing: the gauges keep the last
/// complete pass's figures and its time, so an unread shard is never reported clean
/// (and a worker dead for long raises `OrderdReconcileNotRunning`).
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
    if !report.complete() {
        tracing::error!(
            unreadable_shards = report.unreadable_shards,
            orders_without_event = report.orders_without_event,
            keys_without_order = report.keys_without_order,
            "reconciliation incomplete: a worker did not answer; the gauges keep the last complete pass"
        );
        return;
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
    let Some(lock) = SessionLock::try_take(lock_on, LOCK_KEY).await? else {
        return Ok(None);
    };
    let started = std::time::Instant::now();
    let report = reconcile_once(db, window, batch).await;
    lock.release().await;
    let report = report?;
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
                Ok(Some(report)) if !report.complete() => Run::Failed(format!(
                    "reconciliation pass left {} shards unread",
                    report.unreadable_shards
                )),
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
