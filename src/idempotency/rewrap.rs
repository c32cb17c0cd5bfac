//! `orderd keys rewrap`: every completed record not sealed under the first of
//! `ORDERD_RESPONSE_KEYS` in this release's layout ([`SEAL_VERSION`]) is opened and
//! sealed anew, in bounded batches; then it counts what is left, and says so. That is
//! records in clear, under an older key, or sealed in an earlier layout: one that binds
//! less of the answer (1, 2), or that sealed under the configured key itself with a
//! random nonce (1 to 3), where the current one derives a key per record. A record is
//! told by its key id and its stored layout alone, so a release with a new layout moves
//! every older one without a change here.
//!
//! It walks the tenants in order, and each batch is one short transaction that locks
//! rows of one tenant (`FOR UPDATE SKIP LOCKED`), opens each body under the key it
//! names, seals the plaintext under the first key (a fresh salt, so a key of its own)
//! and writes it back where the row still names the key and layout it was read under.
//! So:
//! - live traffic goes on: replays read without locks; a completion only ever touches a
//!   PROCESSING row, which a rewrap never reads, and seals under the first key itself;
//! - two rewraps side by side take different rows, and since every new body is sealed
//!   from the plaintext, nothing is ever sealed twice over;
//! - a rewrap killed at any point has committed whole batches only: run it again and it
//!   continues with what is left.
//!
//! A row some other transaction holds is passed over by `SKIP LOCKED`; so a walk is
//! followed by a count of what is still not sealed, and while that count holds rows
//! other than the ones that cannot be sealed (a key not configured, a body that does
//! not open), the walk is run again, for at most the `wait` asked. The report is that
//! final count, never a count of what was done: "done" means no such record is left.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use uuid::Uuid;

use super::{
    seal::{SEAL_VERSION, SealError, Sealer},
    store::{self, RecordKey, Resealed},
};
use crate::db::Db;

/// How many of the records left are named in the report.
pub const NAMED_LEFT: i64 = 1000;
/// The pause between walks while held rows are waited for.
const PAUSE: Duration = Duration::from_millis(200);

/// Why a record was left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Sealed under a key that is not configured.
    UnknownKey(String),
    /// Its body does not open under the key it names (altered, copied from another
    /// record, or a part of its answer changed).
    Unreadable,
    /// Another transaction held it through the whole wait.
    Held,
}

/// A record left as it is, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    pub record: RecordKey,
    pub why: Why,
}

/// What one rewrap did, and what it left.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Records now sealed under the first key in this release's layout.
    pub resealed: u64,
    /// Of those, records that were stored in clear before.
    pub were_clear: u64,
    /// Completed records still not sealed under the first key at the end, in all.
    pub left: u64,
    /// The first [`NAMED_LEFT`] of them, with why.
    pub named: Vec<Left>,
    pub seconds: f64,
}

impl Report {
    /// Whether every completed record is now sealed under the first key.
    pub fn complete(&self) -> bool {
        self.left == 0
    }

    /// The named records left under keys that are not configured, counted by key id.
    pub fn unknown_keys(&self) -> BTreeMap<&str, u64> {
        let mut by_key = BTreeMap::new();
        for left in &self.named {
            if let Why::UnknownKey(id) = &left.why {
                *by_key.entry(id.as_str()).or_default() += 1;
            }
        }
        by_key
    }

    /// How many of the named records left are of `why`'s kind (unreadable or held).
    pub fn count(&self, why: &Why) -> usize {
        self.named.iter().filter(|l| &l.why == why).count()
    }
}

/// Reseals every completed record not under `sealer`'s first key, `batch` at a time,
/// calling `progress` after each batch; walks again while rows held by other
/// transactions are left, for at most `wait`. Fails when there is no key to seal under.
pub async fn rewrap(
    db: &Db,
    sealer: &Sealer,
    batch: i64,
    wait: Duration,
    mut progress: impl FnMut(&Report),
) -> anyhow::Result<Report> {
    let key_id = sealer
        .sealing_key()
        .ok_or_else(|| {
            anyhow::anyhow!("ORDERD_RESPONSE_KEYS is not set: there is no key to seal under")
        })?
        .to_string();
    let target = (key_id.as_str(), SEAL_VERSION);
    let started = Instant::now();
    let mut report = Report::default();
    loop {
        let cannot = walk(db, sealer, target, batch, &mut report, &mut progress).await?;
        let left = db
            .run(async |c| store::still_not_sealed(c, target, NAMED_LEFT).await)
            .await?;
        report.left = left.first().map_or(0, |l| l.total as u64);
        report.named = left
            .into_iter()
            .map(|l| {
                let record = (l.tenant_id, l.endpoint, l.idem_key);
                let why = cannot.get(&record).cloned().unwrap_or(Why::Held);
                Left { record, why }
            })
            .collect();
        let held = report.left.saturating_sub(cannot.len() as u64);
        if held == 0 || started.elapsed() + PAUSE > wait {
            break;
        }
        tokio::time::sleep(PAUSE).await;
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// One walk over the records not sealed under `target`, in primary-key order; returns
/// the records it met and could not seal, with why.
async fn walk(
    db: &Db,
    sealer: &Sealer,
    target: (&str, i16),
    batch: i64,
    report: &mut Report,
    progress: &mut impl FnMut(&Report),
) -> anyhow::Result<BTreeMap<RecordKey, Why>> {
    let mut cannot = BTreeMap::new();
    let walk = Walk {
        db,
        sealer,
        target,
        batch,
    };
    let mut from = Uuid::nil();
    // One tenant at a time, so that no statement locks rows of two tenants.
    while let Some(tenant) = db
        .run(async |c| store::next_tenant_not_sealed(c, target, from).await)
        .await?
    {
        let cursor = (tenant, String::new(), String::new());
        reseal_tenant(&walk, cursor, report, progress, &mut cannot).await?;
        match tenant.as_u128().checked_add(1) {
            Some(next) => from = Uuid::from_u128(next),
            None => break,
        }
    }
    Ok(cannot)
}

/// What a walk reseals with: the database, the keys, the key and layout to seal under,
/// and the batch size.
struct Walk<'a> {
    db: &'a Db,
    sealer: &'a Sealer,
    target: (&'a str, i16),
    batch: i64,
}

/// Reseals one tenant's records from `cursor` on, a batch per transaction, until a
/// batch comes back short; what it met and could not seal goes into `cannot`.
async fn reseal_tenant(
    walk: &Walk<'_>,
    mut cursor: RecordKey,
    report: &mut Report,
    progress: &mut impl FnMut(&Report),
    cannot: &mut BTreeMap<RecordKey, Why>,
) -> anyhow::Result<()> {
    let Walk {
        db,
        sealer,
        target,
        batch,
    } = *walk;
    loop {
        let mut tx = db.begin().await?;
        let rows = store::not_sealed_under(&mut tx.sql(), target, &cursor, batch).await?;
        let short = (rows.len() as i64) < batch;
        let Some(last) = rows.last() else {
            tx.commit().await?;
            return Ok(());
        };
        cursor = last.key();
        let mut resealed = Vec::with_capacity(rows.len());
        let mut were_clear = 0;
        for row in rows {
            let was = row.response_key_id.as_deref();
            let opened = sealer.open(
                row.binding(),
                row.response_body.clone(),
                was,
                row.response_seal_version,
            );
            match opened {
                Ok(plain) => {
                    let sealed = sealer.seal(row.binding(), &plain)?;
                    were_clear += u64::from(was.is_none());
                    resealed.push(Resealed {
                        record: row.key(),
                        body: sealed.bytes,
                        was: row.response_key_id.clone(),
                        was_version: row.response_seal_version,
                    });
                }
                Err(SealError::UnknownKey(id)) => {
                    cannot.insert(row.key(), Why::UnknownKey(id));
                }
                Err(error) => {
                    tracing::error!(tenant = %row.tenant_id, endpoint = %row.endpoint, error = %error, "a stored response does not open; left as it is");
                    cannot.insert(row.key(), Why::Unreadable);
                }
            }
        }
        let asked = resealed.len() as u64;
        let written = store::reseal(&mut tx.sql(), target, resealed).await?;
        tx.commit().await?;
        // Every row was locked by this transaction, so each one was written.
        debug_assert_eq!(asked, written);
        report.resealed += written;
        report.were_clear += were_clear;
        progress(report);
        if short {
            return Ok(());
        }
    }
}
