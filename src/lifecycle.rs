//! A tenant's data as a whole, for the operator commands `orderd tenant export` and
//! `orderd tenant erase`: its orders written out as the API shows them, and
//! everything it left in the three tables deleted, for good (see [`erase`]).
//!
//! Both walk the tables on the indexes the tenant leads, a bounded page or batch at a
//! time: memory stays the same whatever the tenant's size, and other tenants' requests
//! only share the database with one statement at a time. The export reads its pages in
//! one read-only snapshot; the erasure's statements are each their own transaction. The erasure is paced as well, since deleting
//! is what loads the database (its WAL), where reading is not. The SQL belongs to each table's owner; this
//! module only puts it in order.

use std::{
    io::Write,
    num::NonZeroU32,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection};

use crate::{
    db::{Db, Forms, Sql},
    erasure, idempotency,
    orders::{self, store::PageAfter},
    outbox,
    service::view::{self, OrderView},
    tenant::TenantId,
};

/// Orders read per page of an export.
pub const EXPORT_PAGE: i64 = 1000;
/// Rows deleted per statement of an erasure.
pub const ERASE_BATCH: u32 = 1000;
/// Rows an erasure deletes per second at most, unless told otherwise: at full speed
/// (about 450,000 rows/s here) its WAL and I/O raised another tenant's create p99 from
/// 7 to 182 ms; paced, the erasure of a large tenant takes minutes instead of seconds,
/// which an offboarding can afford and live traffic cannot (docs/performance.md).
pub const ERASE_ROWS_PER_SEC: u32 = 20_000;
/// How long an erasure waits, unless told otherwise, for the transactions that were
/// running when it marked the tenant: orderd's own end within the statement timeout,
/// so one still running after this is another client's (a report, a console left in
/// a transaction), and the operator is better told than kept waiting.
pub const ERASE_WAIT_SECS: u64 = 120;

/// Writes `tenant`'s orders to `out` as JSON lines, oldest first (`created_at`, then
/// id), each the API's `Order`; returns how many. The pages are read in one read-only
/// snapshot on `session` (a direct session without the statement timeout, since
/// writing a page out may wait on whoever reads the output), so the export is the
/// tenant's orders as they were when it began, whatever is written or deleted
/// meanwhile. An export that meets an erasure of the tenant fails instead of
/// reporting part of the data as the whole: the tenant marked when it begins, or
/// still marked when it ends (looked up on `db`, outside the snapshot).
pub async fn export(
    db: &Db,
    session: &mut PgConnection,
    tenant: TenantId,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let mut tx = Connection::begin(session).await?;
    let mut sql = Sql::direct(&mut tx);
    sql.query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(sql.conn())
        .await?;
    anyhow::ensure!(
        !idempotency::store::tenant_erasing(&mut sql, tenant).await?,
        "tenant {tenant} is being erased: nothing exported"
    );
    let mut after: Option<PageAfter> = None;
    let mut written = 0u64;
    loop {
        let page = orders::store::export_page(&mut sql, tenant, after, EXPORT_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(PageAfter {
            created_at: last.created_at,
            id: last.id,
        });
        let full = page.len() as i64 == EXPORT_PAGE;
        for order in page {
            out.write_all(&view::render(&OrderView::from(order)))?;
            out.write_all(b"\n")?;
            written += 1;
        }
        if !full {
            break;
        }
    }
    tx.commit().await?;
    out.flush()?;
    anyhow::ensure!(
        !db.run(async |c| idempotency::store::tenant_erasing(c, tenant).await)
            .await?,
        "tenant {tenant} began to be erased while it was exported: the output is not to be kept"
    );
    Ok(written)
}

/// What an erasure deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Erased {
    pub events: u64,
    pub records: u64,
    pub orders: u64,
    /// Walks over the three tables it took to find none left (more than one when rows
    /// were written or held while it ran).
    pub passes: u32,
    /// From the first deleting statement to the last: what the pace applies to.
    pub deleting_seconds: f64,
    pub seconds: f64,
}

impl Erased {
    pub fn rows(&self) -> u64 {
        self.events + self.records + self.orders
    }

    fn of(&mut self, table: Table) -> &mut u64 {
        match table {
            Table::Records => &mut self.records,
            Table::Orders => &mut self.orders,
        }
    }
}

/// The tables erased after the events, in that order (no stored answer outlives its
/// order); each table's owner says how to delete a batch of a tenant's rows.
#[derive(Clone, Copy)]
enum Table {
    Records,
    Orders,
}

impl Table {
    /// Deletes up to `batch` of `tenant`'s rows of this table, by its owner.
    async fn erase_batch(
        self,
        sql: &mut Sql<'_>,
        tenant: TenantId,
        batch: i64,
    ) -> sqlx::Result<u64> {
        match self {
            Table::Records => idempotency::store::erase_tenant_batch(sql, tenant.0, batch).await,
            Table::Orders => orders::store::erase_tenant_batch(sql, tenant.0, batch).await,
        }
    }
}

/// How an erasure goes.
#[derive(Debug, Clone)]
pub struct ErasePlan {
    /// Rows per statement.
    pub batch: u32,
    /// Rows deleted per second at most (`None`: as fast as the database goes).
    pub rows_per_sec: Option<NonZeroU32>,
    /// Who asked, kept with the mark.
    pub actor: String,
    /// The longest claim a relay holds on an event (`outbox::relay::claim_lease`): how
    /// long after an event is deleted a relay may still publish it.
    pub relay_lease: Duration,
    /// How long a process trusts what it heard without hearing from its listening
    /// session again (`ORDERD_LISTEN_BOUND_MS`): the erasure returns no sooner than
    /// this after its mark committed, so that no process still replays the tenant's
    /// answers from memory, deaf or not.
    pub heard_within: Duration,
    /// How long to wait for the transactions running when the mark committed.
    pub wait_for_running: Duration,
}

/// Walks over the tables that find rows still left before an erasure gives up: rows
/// keep appearing only if something ignores the mark, which is a bug to report, not to
/// wait out forever.
const MAX_PASSES: u32 = 20;

/// Erases everything of `tenant`, so that it is final:
///
/// 1. marks the tenant as being erased (`crate::erasure`): from then on every process
///    refuses its writes, and the database refuses to claim or complete one;
/// 2. waits for the transactions that were running when the mark committed, so that no
///    write that began before it can commit after the deletion passed it;
/// 3. deletes its events, idempotency records and orders in `plan.batch`-row statements,
///    at `plan.rows_per_sec` at most, and walks the three tables again until a count
///    finds no row of the tenant in any of them;
/// 4. waits until no relay can still be publishing an event it deleted (their claims'
///    leases, on the database's clock);
/// 5. ends the mark, and returns once `plan.heard_within` has passed since the mark
///    committed: every process has then either heard the mark (and emptied its replay
///    cache) or stopped trusting its cache.
///
/// Killed at any point, it has deleted whole batches only and the mark stands (the
/// tenant stays refused): run it again and it resumes. Publishes nothing.
pub async fn erase(
    db: &Db,
    tenant: TenantId,
    plan: &ErasePlan,
    mut progress: impl FnMut(&Erased),
) -> anyhow::Result<Erased> {
    let started = Instant::now();
    db.run(async |c| erasure::mark(c, tenant, &plan.actor).await)
        .await?;
    let marked = tokio::time::Instant::now();
    wait_for_running_transactions(db, plan.wait_for_running).await?;
    let deleting = Instant::now();
    let rate = plan.rows_per_sec.map(|r| f64::from(r.get()));
    // A batch larger than a second's worth would make the first second run ahead of
    // the rate asked.
    let batch = match plan.rows_per_sec {
        Some(rate) => plan.batch.min(rate.get()),
        None => plan.batch,
    };
    let batch = i64::from(batch.max(1));
    let lease_ms = plan.relay_lease.as_millis() as i64;
    let mut erased = Erased::default();
    let mut published_until: Option<DateTime<Utc>> = None;
    // The pace: after each statement, with n rows deleted so far, wait until n / rate
    // seconds have passed since the first, so the rows per second done are never more
    // than asked, whatever the batch.
    let pace = async |deleted: u64| {
        if let Some(rate) = rate {
            let due = deleting + Duration::from_secs_f64(deleted as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
    };
    loop {
        erased.passes += 1;
        loop {
            let (n, until): (i64, Option<DateTime<Utc>>) = db
                .run(async |c| {
                    outbox::store::erase_tenant_batch(c, tenant.0, batch, lease_ms).await
                })
                .await?;
            erased.events += n as u64;
            published_until = published_until.max(until);
            pace(erased.rows()).await;
            progress(&erased);
            if n < batch {
                break;
            }
        }
        for table in [Table::Records, Table::Orders] {
            loop {
                let n = db
                    .run(async |c| table.erase_batch(c, tenant, batch).await)
                    .await?;
                *erased.of(table) += n;
                pace(erased.rows()).await;
                if n < batch as u64 {
                    break;
                }
            }
        }
        progress(&erased);
        let left = rows_left(db, tenant).await?;
        if left == 0 {
            break;
        }
        anyhow::ensure!(
            erased.passes < MAX_PASSES,
            "{left} rows of tenant {tenant} are still there after {MAX_PASSES} passes; the tenant stays refused"
        );
        tracing::info!(tenant = %tenant, left, "rows written or held during the pass; another pass");
    }
    erased.deleting_seconds = deleting.elapsed().as_secs_f64();
    if let Some(until) = published_until {
        let wait: f64 = db
            .run(async |c| {
                c.query_scalar(
                    "SELECT greatest(0, extract(epoch FROM $1 - clock_timestamp()))::float8",
                )
                .bind(until)
                .fetch_one(c.conn())
                .await
            })
            .await?;
        if wait > 0.0 {
            tracing::info!(
                seconds = wait,
                "waiting out the relays' claims on deleted events"
            );
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
    anyhow::ensure!(
        rows_left(db, tenant).await? == 0,
        "rows of tenant {tenant} appeared after the erasure; the tenant stays refused"
    );
    db.run(async |c| erasure::unmark(c, tenant).await).await?;
    tokio::time::sleep_until(marked + plan.heard_within).await;
    erased.seconds = started.elapsed().as_secs_f64();
    Ok(erased)
}

/// Rows of `tenant` in the three tables, each counted by its owner on the keys the
/// tenant leads.
async fn rows_left(db: &Db, tenant: TenantId) -> sqlx::Result<i64> {
    db.run(async |c| {
        Ok(outbox::store::count_tenant(c, tenant.0).await?
            + idempotency::store::count_tenant(c, tenant.0).await?
            + orders::store::count_tenant(c, tenant.0).await?)
    })
    .await
}

/// The transactions running now, as the server records them.
const RUNNING_NOW: &str = "SELECT pg_current_snapshot()::text";

/// How many of the transactions in snapshot `$1` are still running.
const STILL_RUNNING: &str = "SELECT count(*) FROM pg_snapshot_xip($1::pg_snapshot) x
     WHERE pg_xact_status(x) = 'in progress'";

/// On a distributed database, the coordinator's time: the transactions that began
/// before it are the ones to wait for.
const CLUSTER_NOW: &str = "SELECT clock_timestamp()::text";

/// How many distributed transactions that began before `$1` are still running on any
/// node (Citus's own record of them; a worker's transaction is not in the
/// coordinator's snapshot), this session's aside.
const CLUSTER_STILL_RUNNING: &str = "SELECT count(*) FROM get_global_active_transactions()
     WHERE transaction_number <> 0 AND transaction_stamp < $1::timestamptz
       AND global_pid <> citus_backend_gpid()";

/// Where the transactions to wait for are recorded: the server's snapshot on one
/// server; Citus's distributed transactions on a cluster. Each form is the statement
/// that marks the moment and the one that counts what still runs from before it.
const RUNNING_TRANSACTIONS: Forms<(&str, &str)> = Forms {
    one_server: (RUNNING_NOW, STILL_RUNNING),
    distributed: (CLUSTER_NOW, CLUSTER_STILL_RUNNING),
};

/// Waits until every transaction that was running now has ended (the database's own
/// record of them: `pg_current_snapshot()`, or Citus's distributed transactions),
/// saying so every few seconds; gives up after `at_most`, the tenant still marked.
async fn wait_for_running_transactions(db: &Db, at_most: Duration) -> anyhow::Result<()> {
    let (now, still_running) = db.layout().pick(&RUNNING_TRANSACTIONS);
    let snapshot: String = db
        .run(async |c| c.query_scalar(now).fetch_one(c.conn()).await)
        .await?;
    let started = Instant::now();
    let mut said = Instant::now();
    loop {
        let running: i64 = db
            .run(async |c| {
                c.query_scalar(still_running)
                    .bind(&snapshot)
                    .fetch_one(c.conn())
                    .await
            })
            .await?;
        if running == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < at_most,
            "{running} transactions that were running when the tenant was marked are still \
             running after {} s (see pg_stat_activity); nothing was deleted, the tenant stays \
             refused: end them, or wait longer with --wait-secs, and run the erase again",
            at_most.as_secs()
        );
        if said.elapsed() >= Duration::from_secs(5) {
            said = Instant::now();
            tracing::info!(
                running,
                waited_secs = started.elapsed().as_secs(),
                "waiting for transactions that began before the erasure to end"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
