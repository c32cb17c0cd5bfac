//! Waking the relays where no trigger does: on a distributed database (Citus) a trigger
//! on `outbox_event` would fire on the worker that holds the tenant's shard, where no
//! relay listens, and a table with a trigger cannot be distributed at all; so there the
//! writers tell the relays themselves, once their write has committed.
//!
//! A write hands its tenant to a [`Waker`] and goes on: nothing is added to the
//! request's path but a set insertion. One task per process sends what gathered
//! meanwhile as one `NOTIFY` on the relays' channel, the tenants' ids as its payload,
//! so a relay learns *which* tenants have new events (it cannot walk them cheaply on a
//! distributed table; see `relay`). Tenants coming in while a notification is being
//! sent go out with the next one. A notification lost to a crash between the commit
//! and the send only delays the event until a relay's next look at the table (its
//! poll, `ORDERD_OUTBOX_POLL_MS`).
//!
//! On a single server the insert trigger notifies within the writing transaction,
//! naming the same way the tenants whose events the statement inserted, and the waker
//! does nothing. A re-drive, which inserts nothing, names its tenants with [`notify`].

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    db::{Db, Forms, Layout, Sql},
    tenant::TenantId,
};

/// The channel the relays listen on: the `outbox_event` insert trigger (on one server)
/// and the writers (here) signal it with their tenants as the payload.
pub const CHANNEL: &str = "outbox_event";

/// Tells the relays of a tenant's committed events (see the module's doc); cheap to
/// clone.
#[derive(Clone, Default)]
pub struct Waker {
    shared: Option<Arc<Shared>>,
}

#[derive(Default)]
struct Shared {
    tenants: Mutex<BTreeSet<Uuid>>,
    gathered: Notify,
}

/// The tenant ids that fit in one notification's payload (PostgreSQL takes up to 8000
/// bytes: 36 for an id and a comma each).
const TENANTS_PER_NOTIFICATION: usize = 200;

/// Sends one notification: channel `$1`, payload `$2`.
const NOTIFY: &str = "SELECT pg_notify($1, $2)";

/// The waker of each layout: the writers wake the relays only where no trigger does.
const WAKERS: Forms<fn() -> Waker> = Forms {
    one_server: Waker::off,
    distributed: Waker::on,
};

impl Waker {
    /// The waker for tables laid out as `layout`.
    pub fn for_layout(layout: Layout) -> Self {
        (layout.pick(&WAKERS))()
    }

    /// A waker that does nothing: the database's trigger wakes the relays.
    pub fn off() -> Self {
        Self::default()
    }

    /// A waker that notifies; [`Waker::send`] sends what it gathers.
    pub fn on() -> Self {
        Self {
            shared: Some(Arc::new(Shared::default())),
        }
    }

    /// Sends what gathers, as it gathers, through `db` until `shutdown` (then once
    /// more, for what came in last). Does nothing for a waker that is off.
    pub async fn send(self, db: Db, shutdown: CancellationToken) {
        if let Some(shared) = self.shared {
            send(shared, db, shutdown).await;
        }
    }

    /// Whether this waker notifies at all.
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// `tenant` committed events the relays should know of.
    pub fn committed(&self, tenant: TenantId) {
        if let Some(shared) = &self.shared {
            shared
                .tenants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(tenant.0);
            shared.gathered.notify_one();
        }
    }
}

/// Tells the relays of `tenants` now, through `sql` (a re-drive, whose rows no
/// insert announced): one notification per [`TENANTS_PER_NOTIFICATION`].
pub async fn notify(sql: &mut Sql<'_>, tenants: &[Uuid]) -> sqlx::Result<()> {
    for chunk in tenants.chunks(TENANTS_PER_NOTIFICATION) {
        sql.query(NOTIFY)
            .bind(CHANNEL)
            .bind(payload(chunk))
            .execute(sql.conn())
            .await?;
    }
    Ok(())
}

/// Sends what gathered, as it gathers, until `shutdown` (then once more, for what came
/// in last).
async fn send(shared: Arc<Shared>, db: Db, shutdown: CancellationToken) {
    loop {
        let stopping = tokio::select! {
            _ = shared.gathered.notified() => false,
            _ = shutdown.cancelled() => true,
        };
        let tenants: Vec<Uuid> =
            std::mem::take(&mut *shared.tenants.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .collect();
        for chunk in tenants.chunks(TENANTS_PER_NOTIFICATION) {
            let payload = payload(chunk);
            let sent = db
                .run(async |c| {
                    c.query(NOTIFY)
                        .bind(CHANNEL)
                        .bind(&payload)
                        .execute(c.conn())
                        .await
                })
                .await;
            if let Err(e) = sent {
                // The relays' poll finds these events anyway, only later.
                tracing::warn!(error = %e, tenants = chunk.len(), "cannot wake the relays; they will find the events at their next poll");
            }
        }
        if stopping {
            return;
        }
    }
}

/// The payload naming `tenants`: their ids, comma-separated.
pub fn payload(tenants: &[Uuid]) -> String {
    tenants
        .iter()
        .map(Uuid::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The tenants a notification names: none for an empty payload (an earlier release's
/// trigger, which only said that something committed), and none for one that cannot be
/// read.
pub fn tenants_of(payload: &str) -> Vec<Uuid> {
    payload
        .split(',')
        .filter_map(|id| Uuid::parse_str(id.trim()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_its_tenants_and_fits_a_notification() {
        let tenants: Vec<Uuid> = (0..TENANTS_PER_NOTIFICATION)
            .map(|_| Uuid::new_v4())
            .collect();
        let text = payload(&tenants);
        assert!(text.len() < 8000, "{} bytes", text.len());
        assert_eq!(tenants_of(&text), tenants);
        assert!(
            tenants_of("").is_empty(),
            "the trigger's payload names none"
        );
        assert!(tenants_of("not-a-uuid").is_empty());
    }
}
