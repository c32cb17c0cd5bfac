//! Tenants being erased: the `tenant_erasure` table, and what every process knows of it.
//!
//! `orderd tenant erase` marks the tenant here before it deletes anything, and unmarks
//! it only once no row of the tenant is left. While the mark stands:
//! - every `serve` process refuses the tenant's writes (REST and MCP, replays included)
//!   before any idempotency lookup, from [`Erasures`], a set it keeps from the table and
//!   reloads whenever a notification on [`CHANNEL`] says it changed (or the listening
//!   session was lost, when one may have been missed); a tenant found in the set is
//!   confirmed in the table before it is refused (by the application layer, `service`),
//!   so that the end of an erasure holds in a process that has not heard it yet;
//! - the database refuses them too: the idempotency claim and the fenced completion
//!   check the mark, so a process that has not heard yet still cannot begin or commit a
//!   write of the tenant (see `idempotency::store`).
//!
//! The mark is state in the database, not in the erasing process: a killed erase leaves
//! it, and the tenant stays refused until an erase (re-run) completes.

use std::{
    collections::HashSet,
    sync::{Arc, RwLock},
};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    db::{self, Db, ListenOn, Liveness, Sql},
    tenant::TenantId,
};

/// The channel an erase notifies when it starts or ends.
pub const CHANNEL: &str = "orderd_tenant_erasure";

/// Marks `tenant` as being erased by `actor` (kept when it already is: a re-run resumes)
/// and tells every listening process, when this statement's transaction commits.
const MARK: &str = "WITH marked AS (
         INSERT INTO tenant_erasure (tenant_id, actor) VALUES ($1, $2)
         ON CONFLICT (tenant_id) DO NOTHING
         RETURNING tenant_id)
     SELECT pg_notify('orderd_tenant_erasure', $1::text)";

/// Ends `tenant`'s erasure and tells every listening process.
const UNMARK: &str =
    "WITH unmarked AS (DELETE FROM tenant_erasure WHERE tenant_id = $1 RETURNING tenant_id)
     SELECT pg_notify('orderd_tenant_erasure', $1::text)";

/// Every tenant being erased.
const LIST: &str = "SELECT tenant_id FROM tenant_erasure";

/// Marks `tenant` as being erased (see [`MARK`]).
pub async fn mark(c: &mut Sql<'_>, tenant: TenantId, actor: &str) -> sqlx::Result<()> {
    c.query(MARK)
        .bind(tenant.0)
        .bind(actor)
        .execute(c.conn())
        .await?;
    Ok(())
}

/// Ends `tenant`'s erasure (see [`UNMARK`]).
pub async fn unmark(c: &mut Sql<'_>, tenant: TenantId) -> sqlx::Result<()> {
    c.query(UNMARK).bind(tenant.0).execute(c.conn()).await?;
    Ok(())
}

/// The tenants this process refuses writes of: those being erased.
#[derive(Debug, Default)]
pub struct Erasures {
    tenants: RwLock<HashSet<Uuid>>,
}

impl Erasures {
    /// Whether `tenant` is being erased, as this process last heard.
    pub fn contains(&self, tenant: TenantId) -> bool {
        self.tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&tenant.0)
    }

    /// Reads the set from the table; returns it.
    pub async fn reload(&self, db: &Db) -> sqlx::Result<HashSet<Uuid>> {
        let tenants: HashSet<Uuid> = db
            .run(async |c| c.query_scalar(LIST).fetch_all(c.conn()).await)
            .await?
            .into_iter()
            .collect();
        *self.tenants.write().unwrap_or_else(|e| e.into_inner()) = tenants.clone();
        Ok(tenants)
    }
}

/// Keeps `erasures` as the table says until `shutdown`: reloads it on every
/// notification, whenever one may have been missed (the session (re)established or
/// lost, or silent past its bound: `liveness` records its round trips), and every
/// quarter of the bound while the session is not trusted. `changed` runs
/// as soon as anything is heard, in the order the session heard it and before the
/// reload (the replay cache is emptied there: once a process has heard a mark, none of
/// the tenant's answers is replayed from memory; while the mark stands the tenant's
/// requests are refused before the cache, and the mark's end empties it again).
pub async fn follow(
    erasures: Arc<Erasures>,
    db: Db,
    listen_on: ListenOn,
    liveness: Arc<Liveness>,
    changed: impl Fn() + Send + 'static,
    shutdown: CancellationToken,
) {
    // While the session is not trusted, the table is read again every beat: a mark's
    // end that went unheard must not keep refusing the tenant until the session is back.
    let (beat, heard_from) = (liveness.bound() / 4, liveness.clone());
    let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
    let listening = db::listen(
        listen_on,
        CHANNEL,
        liveness,
        move |_| {
            // Whatever was heard (a change, or a session (re)established or lost): the
            // cache goes at once, in the order the session heard it, and one reload
            // covers any number of them before it.
            changed();
            let _ = wake.try_send(());
        },
        shutdown.clone(),
    );
    // Beside the listening session, in this job's own task: the two end together.
    let following = async move {
        loop {
            tokio::select! {
                heard = woken.recv() => {
                    if heard.is_none() {
                        break;
                    }
                    let mut pause = std::time::Duration::from_millis(100);
                    loop {
                        match erasures.reload(&db).await {
                            Ok(tenants) => {
                                tracing::info!(erasing = tenants.len(), "tenants being erased reloaded");
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot read the tenants being erased; retrying");
                                tokio::select! {
                                    _ = tokio::time::sleep(pause) => {}
                                    _ = shutdown.cancelled() => return,
                                }
                                pause = (pause * 2).min(std::time::Duration::from_secs(5));
                            }
                        }
                    }
                }
                _ = tokio::time::sleep(beat), if !heard_from.fresh(std::time::Instant::now()) => {
                    if let Err(e) = erasures.reload(&db).await {
                        tracing::debug!(error = %e, "cannot read the tenants being erased");
                    }
                }
                _ = shutdown.cancelled() => break,
            }
        }
    };
    tokio::join!(listening, following);
}
