//! Keeps the planner's statistics of `outbox_event` in step with a backlog that just
//! landed.
//!
//! The relay's statements name one tenant and read index ranges, but PostgreSQL still
//! chooses between the indexes that can serve them by its statistics, and statistics
//! taken while the table held other rows say the wrong thing about a backlog: taken
//! while every event was published, they say no event is pending and that a tenant
//! they never saw has one row. Then a claim reads all the pending rows by another
//! index and sorts them, and the mark reads every row of the tenant, a second each at a
//! million rows (decision 141). No statement shape avoids that: the index that serves a
//! tenant's rows also serves "all of the tenant's rows", and PostgreSQL takes it when
//! it believes that is one row. Autovacuum analyses the table only after its naptime
//! (a minute), and not at all where it is off.
//!
//! So the relay, before its first round and then once a second beside its rounds,
//! asks the database how many rows changed since the last `ANALYZE` and how large the
//! table is, and analyses the table itself when more than half of what the last one
//! counted changed, plus 10,000, or the table more than doubled: a bulk import, a
//! re-drive or a refusing sink, not the churn of a steady flow (which autovacuum's
//! tenth catches in its own time). `SKIP_LOCKED`:
//! when another relay or autovacuum is already analysing, this one does not wait.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::{
    db::Db,
    supervisor::{Every, First, Run, Schedule},
};

/// Whether `outbox_event` changed by more than half of its rows (as the last `ANALYZE`
/// counted them) plus 10,000 since it was last analysed, or grew to more than twice
/// the pages it had then plus 10 MB (the size is current at once, where a session
/// publishes its change counters only when it goes idle, up to ten seconds later),
/// whether this session may
/// analyse it (it owns the table or the database; otherwise PostgreSQL would only warn),
/// and whether no one else holds the lock `ANALYZE` takes (autovacuum's long vacuum of
/// a table that just drained holds it for seconds, and `SKIP_LOCKED` would then only
/// warn, every second).
pub const STALE: &str = "SELECT (pg_stat_get_mod_since_analyze(c.oid) > 0.5 * greatest(c.reltuples, 0) + 10000
             OR pg_relation_size(c.oid) / current_setting('block_size')::bigint > 2 * c.relpages + 1280)
            AND (pg_has_role(c.relowner, 'USAGE')
                 OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE'))
            AND NOT EXISTS (SELECT 1 FROM pg_locks l
                            WHERE l.relation = c.oid AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted)
     FROM pg_class c WHERE c.oid = 'outbox_event'::regclass";

/// The table's statistics, sampled again (30,000 rows at the default statistics
/// target); a minute at most, whatever the statement timeout.
pub const ANALYZE: &str = "ANALYZE (SKIP_LOCKED) outbox_event";

/// How often a relay looks at the counters.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The relay's statistics job, after the check the relay made before its first round:
/// every [`CHECK_EVERY`] until `shutdown`, on the supervisor's schedule (each check
/// counted in `background_job_runs_total{job="outbox statistics"}`). It runs beside the
/// lanes rather than in them: a lane that waited for it would start its next round in
/// step with the other lane's, and their batches then went out together.
pub async fn keep_current(db: Db, shutdown: CancellationToken) {
    let every = Every {
        interval: CHECK_EVERY,
        first: First::AfterInterval,
        after_failure: None,
    };
    let mut schedule = Schedule::new("outbox statistics", every, shutdown);
    while schedule.next().await {
        let checked = schedule.unless_shutdown(analyze_if_stale(&db)).await;
        let Some(checked) = checked else { return };
        // Stale statistics make rounds slow, never wrong: a failure is counted and
        // logged, and the relay goes on.
        schedule.ran(match checked {
            Ok(_) => Run::Done,
            Err(e) => Run::Failed(format!(
                "could not bring the outbox's planner statistics up to date: {e}"
            )),
        });
    }
}

/// [`analyze_if_stale`], a failure logged: stale statistics make rounds slow, never
/// wrong, so the relay goes on.
pub async fn check(db: &Db) {
    if let Err(e) = analyze_if_stale(db).await {
        tracing::warn!(error = %e, "could not bring the outbox's planner statistics up to date");
    }
}

/// Analyses `outbox_event` when it changed a lot since its last `ANALYZE` (see the
/// module's documentation); whether it did.
pub async fn analyze_if_stale(db: &Db) -> sqlx::Result<bool> {
    let stale: Option<bool> = db
        .run(async |sql| sql.query_scalar(STALE).fetch_optional(sql.conn()).await)
        .await?;
    if stale != Some(true) {
        return Ok(false);
    }
    let started = Instant::now();
    let mut tx = db.begin().await?;
    let mut sql = tx.sql();
    sql.query("SELECT set_config('statement_timeout', '60s', true)")
        .execute(sql.conn())
        .await?;
    sql.query(ANALYZE).execute(sql.conn()).await?;
    tx.commit().await?;
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        "analysed outbox_event: more of it changed since its last ANALYZE than the planner's statistics can stand"
    );
    Ok(true)
}
