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
//!
//! On a distributed database the planner that matters is each worker's: it plans the
//! statement the coordinator routes to a shard by that shard's own statistics, and a
//! shard no `ANALYZE` has seen yet looks empty to it (one row everywhere). Then the
//! claim's check for an earlier unpublished event of each order read every row of the
//! tenant once per candidate, two seconds a claim beside a backlog of 60,000. So the
//! check runs there too, on each worker for its shards (one command per worker, as the
//! relay's look does), with the same rule applied to each shard and its absolute parts
//! divided among the table's shards, and `ANALYZE` runs on the worker for the shards
//! that need it. A worker that does not answer is checked again a second later.

use std::{
    sync::LazyLock,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use crate::{
    db::{self, Db, Forms, Node},
    supervisor::{Every, First, Run, Schedule},
};

/// The table whose statistics are kept.
const TABLE: &str = "outbox_event";

/// Rows changed beyond half of what the last `ANALYZE` counted that make the table's
/// statistics stale.
const ROWS_CHANGED: i64 = 10_000;

/// Pages grown beyond twice what the last `ANALYZE` counted that make them stale (10 MB
/// of 8 kB pages).
const PAGES_GROWN: i64 = 1_280;

/// Where the statistics the relay's statements are planned by live.
#[derive(Clone, Copy)]
enum Kept {
    /// In the table's own entry: one check, one `ANALYZE`.
    Table,
    /// In each shard's entry on its worker: each worker checks and analyses its shards.
    EachShard,
}

const KEPT: Forms<Kept> = Forms {
    one_server: Kept::Table,
    distributed: Kept::EachShard,
};

/// Whether the relation `c` (a row of `pg_class`) changed by more than half of its
/// rows (as the last `ANALYZE` counted them) plus `rows` since it was last analysed, or
/// grew to more than twice the pages it had then plus `pages` (the size is current at
/// once, where a session publishes its change counters only when it goes idle, up to
/// ten seconds later), whether this session may analyse it (it owns the table or the
/// database; otherwise PostgreSQL would only warn), and whether no one else holds the
/// lock `ANALYZE` takes (autovacuum's long vacuum of a table that just drained holds it
/// for seconds, and `SKIP_LOCKED` would then only warn, every second).
fn stale_rule(rows: i64, pages: i64) -> String {
    format!(
        "(pg_stat_get_mod_since_analyze(c.oid) > 0.5 * greatest(c.reltuples, 0) + {rows}
             OR pg_relation_size(c.oid) / current_setting('block_size')::bigint > 2 * c.relpages + {pages})
            AND (pg_has_role(c.relowner, 'USAGE')
                 OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE'))
            AND NOT EXISTS (SELECT 1 FROM pg_locks l
                            WHERE l.relation = c.oid AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted)"
    )
}

/// Whether `outbox_event`'s statistics are stale, on one server (see [`stale_rule`]).
pub static STALE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM pg_class c WHERE c.oid = '{TABLE}'::regclass",
        stale_rule(ROWS_CHANGED, PAGES_GROWN)
    )
});

/// The table's statistics, sampled again (30,000 rows at the default statistics
/// target); a minute at most, whatever the statement timeout.
pub const ANALYZE: &str = "ANALYZE (SKIP_LOCKED) outbox_event";

/// How long one `ANALYZE` may take.
const ANALYZE_TIMEOUT: &str = "60s";

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

/// Analyses `outbox_event` (on a distributed database, its shards that need it) when it
/// changed a lot since its last `ANALYZE` (see the module's documentation); whether it
/// did.
pub async fn analyze_if_stale(db: &Db) -> sqlx::Result<bool> {
    match db.layout().pick(&KEPT) {
        Kept::Table => analyze_table_if_stale(db).await,
        Kept::EachShard => analyze_shards_if_stale(db).await,
    }
}

async fn analyze_table_if_stale(db: &Db) -> sqlx::Result<bool> {
    let stale: Option<bool> = db
        .run(async |sql| {
            sql.query_scalar(STALE.as_str())
                .fetch_optional(sql.conn())
                .await
        })
        .await?;
    if stale != Some(true) {
        return Ok(false);
    }
    let started = Instant::now();
    within_analyze_timeout(db, async |sql| {
        sql.query(ANALYZE).execute(sql.conn()).await?;
        Ok(())
    })
    .await?;
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        "analysed outbox_event: more of it changed since its last ANALYZE than the planner's statistics can stand"
    );
    Ok(true)
}

/// Runs `work` in a transaction of its own whose statements may take
/// [`ANALYZE_TIMEOUT`], whatever the pool's statement timeout.
async fn within_analyze_timeout<T>(
    db: &Db,
    work: impl AsyncFnOnce(&mut db::Sql<'_>) -> sqlx::Result<T>,
) -> sqlx::Result<T> {
    let mut tx = db.begin().await?;
    let mut sql = tx.sql();
    sql.query("SELECT set_config('statement_timeout', $1, true)")
        .bind(ANALYZE_TIMEOUT)
        .execute(sql.conn())
        .await?;
    let out = work(&mut sql).await?;
    tx.commit().await?;
    Ok(out)
}

/// A shard a worker found stale.
#[derive(serde::Deserialize)]
struct StaleShard {
    shard: String,
}

/// The absolute parts of the staleness rule for one of `shards` shards: the table's,
/// divided among them (at least one row and one page).
fn per_shard(shards: usize) -> (i64, i64) {
    let shards = shards.max(1) as i64;
    (
        (ROWS_CHANGED + shards - 1) / shards,
        (PAGES_GROWN + shards - 1) / shards,
    )
}

/// Which of `shards` (one worker's) are stale, as a query that worker runs.
fn stale_shards(shards: &[String], (rows, pages): (i64, i64)) -> String {
    let names: Vec<String> = shards.iter().map(|s| db::text_literal(s)).collect();
    format!(
        "SELECT c.oid::regclass::text AS shard FROM pg_class c
         WHERE c.oid = ANY (ARRAY[{}]::regclass[]) AND {}",
        names.join(", "),
        stale_rule(rows, pages)
    )
}

async fn analyze_shards_if_stale(db: &Db) -> sqlx::Result<bool> {
    let stale: Vec<(Node, Vec<String>)> = db
        .run(async |sql| {
            let nodes = db::nodes_of(sql, &[TABLE]).await?;
            let limits = per_shard(nodes.iter().map(|n| n.shards_of(TABLE)).sum());
            let commands: Vec<(&Node, String)> = nodes
                .iter()
                .filter(|n| n.shards_of(TABLE) > 0)
                .map(|n| {
                    let query = stale_shards(n.shard_names(TABLE), limits);
                    (n, db::as_json_rows(&query, None))
                })
                .collect();
            let answers = db::run_on(sql, &commands).await?;
            let mut stale = Vec::new();
            // A worker that did not answer is checked again at the next check.
            for ((node, _), answer) in commands.iter().zip(answers) {
                let Ok(answer) = answer else { continue };
                let shards: Vec<StaleShard> = db::json_rows(&answer)?;
                if !shards.is_empty() {
                    stale.push((
                        (*node).clone(),
                        shards.into_iter().map(|s| s.shard).collect(),
                    ));
                }
            }
            Ok::<_, sqlx::Error>(stale)
        })
        .await?;
    if stale.is_empty() {
        return Ok(false);
    }
    let started = Instant::now();
    let commands: Vec<(&Node, String)> = stale
        .iter()
        .map(|(node, shards)| {
            let command = format!(
                "SET statement_timeout = '{ANALYZE_TIMEOUT}'; ANALYZE (SKIP_LOCKED) {}",
                shards.join(", ")
            );
            (node, command)
        })
        .collect();
    let answers = within_analyze_timeout(db, async |sql| db::run_on(sql, &commands).await).await?;
    let analysed: usize = stale
        .iter()
        .zip(&answers)
        .filter(|(_, answer)| answer.is_ok())
        .map(|((_, shards), _)| shards.len())
        .sum();
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        shards = analysed,
        "analysed shards of outbox_event: more of each changed since its last ANALYZE than the planner's statistics can stand"
    );
    Ok(analysed > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_s_share_of_the_rule_is_the_table_s_divided_among_its_shards() {
        assert_eq!(per_shard(1), (ROWS_CHANGED, PAGES_GROWN));
        assert_eq!(per_shard(4), (2_500, 320));
        assert_eq!(per_shard(32), (313, 40));
        // No shard at all (a table being distributed): the table's own rule.
        assert_eq!(per_shard(0), (ROWS_CHANGED, PAGES_GROWN));
    }
}
