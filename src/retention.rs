//! Retention purges, off the request path: expired idempotency keys, abandoned claims,
//! and (where a relay runs) long-published outbox rows.
//!
//! Deletes in bounded batches: a batch reads the oldest rows past retention without
//! locking anything, then deletes them by primary key with one statement per tenant
//! (`SKIP LOCKED`, the condition checked again), so the purge never holds many locks
//! nor locks rows of two tenants at once, never bloats one transaction's WAL, and
//! several replicas can run it at once.

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    config::{parse, range, settings},
    supervisor::{Every, First, Run, Schedule},
};
use crate::{
    db::{Db, Sql},
    idempotency::store,
    outbox,
};

settings! {
    /// When the retention purges run.
    pub struct RetentionConfig {
        interval: Duration = parse::secs [PURGE_INTERVAL_SECS, "ORDERD_PURGE_INTERVAL_SECS", Some("60"), range(1, 86_400), "how often the retention purges run"],
    }
}

/// Rows deleted per statement.
pub const PURGE_BATCH: i64 = 1000;
/// A PROCESSING claim whose lease ran out this long ago, and that no retry took over,
/// is deleted: its client has evidently given up, and a later retry simply claims anew.
pub const ABANDONED_GRACE_SECS: i64 = 3600;

/// What one pass over the idempotency records deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyPurge {
    pub expired_keys: u64,
    pub abandoned_claims: u64,
}

/// One full pass over the idempotency records: batches until nothing more is due.
pub async fn purge_idempotency_once(db: &Db, batch: i64) -> sqlx::Result<IdempotencyPurge> {
    Ok(IdempotencyPurge {
        expired_keys: in_batches(batch, || {
            db.run(async |c| {
                let found = store::expired_keys(c, batch).await?;
                by_group(c, found, |g| g.2.len(), store::delete_expired).await
            })
        })
        .await?,
        abandoned_claims: in_batches(batch, || {
            db.run(async |c| {
                let found = store::abandoned_claims(c, ABANDONED_GRACE_SECS, batch).await?;
                by_group(c, found, |g| g.2.len(), store::delete_abandoned).await
            })
        })
        .await?,
    })
}

/// Deletes outbox rows published more than `retention` ago, in batches; never touches
/// pending or DEAD rows. Returns how many went.
pub async fn purge_outbox_once(db: &Db, retention: Duration, batch: i64) -> sqlx::Result<u64> {
    let retention_secs = retention.as_secs() as i64;
    in_batches(batch, || {
        db.run(async |c| {
            let found = outbox::store::purgeable_published(c, retention_secs, batch).await?;
            by_group(c, found, |g| g.1.len(), outbox::store::delete_published).await
        })
    })
    .await
}

/// Deletes what one batch of a purge `found`, one tenant's group per statement (each
/// of `size` rows): a row another transaction holds, or that changed since it was
/// found, is left for the next pass.
async fn by_group<G>(
    sql: &mut Sql<'_>,
    found: Vec<G>,
    size: impl Fn(&G) -> usize,
    delete: impl AsyncFn(&mut Sql<'_>, G) -> sqlx::Result<u64>,
) -> sqlx::Result<Purged> {
    let mut purged = Purged::default();
    for group in found {
        purged.found += size(&group) as u64;
        purged.deleted += delete(sql, group).await?;
    }
    Ok(purged)
}

/// Repeats one bounded purge until it finds fewer than `batch` rows past retention, or
/// deletes none of what it found (all held by other transactions: the next pass takes
/// them); returns how many went.
async fn in_batches<F, Fut>(batch: i64, mut purge: F) -> sqlx::Result<u64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = sqlx::Result<Purged>>,
{
    let mut total = 0;
    loop {
        let Purged { found, deleted } = purge().await?;
        total += deleted;
        if (found as i64) < batch || deleted == 0 {
            return Ok(total);
        }
    }
}

/// Which purges a process runs.
#[derive(Debug, Clone, Copy)]
pub struct Purges {
    /// Idempotency keys and abandoned claims (`serve`).
    pub idempotency: bool,
    /// Published outbox rows older than this (wherever a relay runs).
    pub outbox_retention: Option<Duration>,
}

/// Runs `purges` every `interval` until `shutdown`.
pub async fn run(db: Db, interval: Duration, purges: Purges, shutdown: CancellationToken) {
    let every = Every {
        interval,
        first: First::AfterInterval,
        after_failure: None,
    };
    let mut schedule = Schedule::new("retention purges", every, shutdown);
    while schedule.next().await {
        let turn = async {
            let mut failed = Vec::new();
            if let Some(retention) = purges.outbox_retention {
                match purge_outbox_once(&db, retention, PURGE_BATCH).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(deleted = n, "purged published outbox events"),
                    Err(e) => failed.push(format!("outbox purge: {e}")),
                }
            }
            if purges.idempotency {
                match purge_idempotency_once(&db, PURGE_BATCH).await {
                    Ok(report) if report != IdempotencyPurge::default() => {
                        tracing::info!(
                            expired_keys = report.expired_keys,
                            abandoned_claims = report.abandoned_claims,
                            "purged idempotency records"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => failed.push(format!("idempotency purge: {e}")),
                }
            }
            match failed.is_empty() {
                true => Run::Done,
                false => Run::Failed(failed.join("; ")),
            }
        };
        let Some(run) = schedule.unless_shutdown(turn).await else {
            return;
        };
        schedule.ran(run);
    }
}

/// What one batch of a purge found past retention, and how many of those it deleted:
/// a purge reads its candidates without locks, then deletes them one tenant per
/// statement, and a row another transaction held, or that changed meanwhile, is found
/// but not deleted (the next pass takes it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub found: u64,
    pub deleted: u64,
}
