//! A tenant's data as a whole, for the operator commands `orderd tenant export` and
//! `orderd tenant erase`: its orders written out as the API shows them, and
//! everything it left in the three tables deleted.
//!
//! Both walk the tables on the indexes the tenant leads, a bounded page or batch at a
//! time, each its own short statement: memory stays the same whatever the tenant's
//! size, no transaction stays open, and other tenants' requests only share the
//! database with one statement at a time. The erasure is paced as well, since deleting
//! is what loads the database (its WAL), where reading is not. The SQL belongs to each table's owner; this
//! module only puts it in order.

use std::{io::Write, num::NonZeroU32, time::Instant};

use governor::{Quota, RateLimiter};

use crate::{
    db::Db,
    idempotency,
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

/// Writes `tenant`'s orders to `out` as JSON lines, oldest first (`created_at`, then
/// id), each the API's `Order`; returns how many. Orders created while it runs are
/// written when they sort after the page being read.
pub async fn export(db: &Db, tenant: TenantId, out: &mut impl Write) -> anyhow::Result<u64> {
    let mut after: Option<PageAfter> = None;
    let mut written = 0u64;
    loop {
        let page = db
            .run(async |c| orders::store::export_page(c, tenant, after, EXPORT_PAGE).await)
            .await?;
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
    out.flush()?;
    Ok(written)
}

/// What an erasure deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Erased {
    pub events: u64,
    pub records: u64,
    pub orders: u64,
    pub seconds: f64,
}

impl Erased {
    pub fn rows(&self) -> u64 {
        self.events + self.records + self.orders
    }

    /// The count of the `n`th table in the order of erasure.
    fn of_table(&mut self, n: usize) -> &mut u64 {
        match n {
            0 => &mut self.events,
            1 => &mut self.records,
            _ => &mut self.orders,
        }
    }
}

/// Deletes everything of `tenant` in `batch`-row statements, at most `rows_per_sec`
/// rows a second (`None`: as fast as the database goes): its events first (so that
/// none still pending is published while the rest goes), then its idempotency records
/// (so that no stored answer outlives its order), then its orders. Publishes nothing.
/// Killed midway, it has deleted whole batches only; run it again to finish.
pub async fn erase(
    db: &Db,
    tenant: TenantId,
    batch: u32,
    rows_per_sec: Option<NonZeroU32>,
    mut progress: impl FnMut(&Erased),
) -> anyhow::Result<Erased> {
    let batch =
        NonZeroU32::new(batch).ok_or_else(|| anyhow::anyhow!("the batch must be at least 1"))?;
    // A batch's worth of permits before each statement: governor's token bucket, one
    // batch deep, paces the statements evenly instead of in bursts.
    let pace = rows_per_sec
        .map(|rate| RateLimiter::direct(Quota::per_second(rate.max(batch)).allow_burst(batch)));
    let pace = async || {
        if let Some(limiter) = &pace {
            let _ = limiter.until_n_ready(batch).await;
        }
    };
    let batch = i64::from(batch.get());
    let started = Instant::now();
    let mut erased = Erased::default();
    // Each table's owner says how to delete a batch of a tenant's rows.
    let tables = [
        outbox::store::ERASE_TENANT_BATCH,
        idempotency::store::ERASE_TENANT_BATCH,
        orders::store::ERASE_TENANT_BATCH,
    ];
    for (table, sql) in tables.into_iter().enumerate() {
        loop {
            pace().await;
            let n = db
                .run(async |c| {
                    let done = sqlx::query(sql)
                        .bind(tenant.0)
                        .bind(batch)
                        .execute(c)
                        .await?;
                    Ok(done.rows_affected())
                })
                .await?;
            *erased.of_table(table) += n;
            if n == 0 {
                break;
            }
            progress(&erased);
        }
    }
    erased.seconds = started.elapsed().as_secs_f64();
    Ok(erased)
}
