//! `orderd keys rewrap`: every completed record not sealed under the first of
//! `ORDERD_RESPONSE_KEYS` is opened and sealed anew under it, in bounded batches.
//!
//! Each batch is one short transaction that locks its rows (`FOR UPDATE SKIP LOCKED`),
//! opens each body under the key it names, seals the plaintext under the first key and
//! writes it back where the row still names the key it was read under. So:
//! - live traffic goes on: replays read without locks; a completion only ever touches a
//!   PROCESSING row, which a rewrap never reads, and seals under the first key itself;
//! - two rewraps side by side take different rows, and since every new body is sealed
//!   from the plaintext, nothing is ever sealed twice over;
//! - a rewrap killed at any point has committed whole batches only: run it again and it
//!   continues with what is left.
//!
//! A record whose key is not configured, or whose body does not open, is left as it
//! is and counted: the old key must stay until it is dealt with.

use std::{collections::BTreeMap, time::Instant};

use uuid::Uuid;

use super::{
    seal::{Binding, SealError, Sealer},
    store::{self, RecordKey, Resealed},
};
use crate::db::Db;

/// What one rewrap did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    /// Records now sealed under the first key.
    pub resealed: u64,
    /// Of those, records that were stored in clear before.
    pub were_clear: u64,
    /// Records left as they are because their key is not configured, by key id.
    pub unknown_keys: BTreeMap<String, u64>,
    /// Records whose body does not open under the key they name (altered, or copied
    /// from another record).
    pub unreadable: u64,
    pub seconds: f64,
}

impl Report {
    /// Whether every record it met is now sealed under the first key.
    pub fn complete(&self) -> bool {
        self.unknown_keys.is_empty() && self.unreadable == 0
    }
}

/// Reseals every completed record not under `sealer`'s first key, `batch` at a time,
/// calling `progress` after each batch. Fails when there is no key to seal under.
pub async fn rewrap(
    db: &Db,
    sealer: &Sealer,
    batch: i64,
    mut progress: impl FnMut(&Report),
) -> anyhow::Result<Report> {
    let key_id = sealer
        .sealing_key()
        .ok_or_else(|| {
            anyhow::anyhow!("ORDERD_RESPONSE_KEYS is not set: there is no key to seal under")
        })?
        .to_string();
    let started = Instant::now();
    let mut report = Report::default();
    let mut cursor: RecordKey = (Uuid::nil(), String::new(), String::new());
    loop {
        let mut tx = db.begin().await?;
        let rows = store::not_sealed_under(&mut tx, &key_id, &cursor, batch).await?;
        let Some(last) = rows.last() else {
            tx.commit().await?;
            break;
        };
        cursor = (last.tenant_id, last.endpoint.clone(), last.idem_key.clone());
        let mut resealed = Vec::with_capacity(rows.len());
        let mut were_clear = 0;
        for row in rows {
            let binding = Binding {
                tenant: row.tenant_id,
                endpoint: &row.endpoint,
                key: &row.idem_key,
            };
            let was = row.response_key_id.as_deref();
            match sealer.open(binding, row.response_body.clone(), was) {
                Ok(plain) => {
                    let sealed = sealer.seal(binding, &plain)?;
                    were_clear += u64::from(was.is_none());
                    resealed.push(Resealed {
                        record: (row.tenant_id, row.endpoint.clone(), row.idem_key.clone()),
                        body: sealed.bytes,
                        was: row.response_key_id.clone(),
                    });
                }
                Err(SealError::UnknownKey(id)) => *report.unknown_keys.entry(id).or_default() += 1,
                Err(error) => {
                    tracing::error!(tenant = %row.tenant_id, endpoint = %row.endpoint, error = %error, "a stored response does not open; left as it is");
                    report.unreadable += 1;
                }
            }
        }
        let asked = resealed.len() as u64;
        let written = store::reseal(&mut tx, &key_id, resealed).await?;
        tx.commit().await?;
        // Every row was locked by this transaction, so each one was written.
        debug_assert_eq!(asked, written);
        report.resealed += written;
        report.were_clear += were_clear;
        report.seconds = started.elapsed().as_secs_f64();
        progress(&report);
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}
