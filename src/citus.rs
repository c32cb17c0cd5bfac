//! Moving an existing single-server database onto a Citus cluster in place, and back.
//!
//! A new database is distributed by the migrations (the extension is there before they
//! run). A database that already holds orders was migrated before Citus was there, so
//! its tables are plain; `orderd citus distribute` distributes them then.
//!
//! All in one transaction, on purpose: the create's one statement writes the fenced
//! completion, the order and its event together, and Citus runs it only when the
//! tables it names are all distributed (and co-located) or all local; a table
//! distributed before the others makes every create fail until the last one is. So
//! the three tables and the erasure marks switch at once, at the commit, and writes to
//! them wait meanwhile (`create_distributed_table` copies the rows while it holds
//! them back). `create_distributed_table_concurrently`, which keeps a table writable
//! while it copies, does one table per transaction, which is the window this avoids.
//! After the commit the coordinator's own copy of the rows, no longer read, is
//! truncated. Each part looks first whether it was done, so running the command again
//! finishes a run that stopped.
//!
//! The functions the writes call on a cluster ([`FUNCTIONS`]) are made on every node
//! first, in a transaction of their own (Citus distributes no function in a transaction
//! that distributed a table), so that no process that starts on the distributed layout
//! calls one a node lacks.
//!
//! `orderd citus undistribute` is the rollback: the tables back on the coordinator
//! (`undistribute_table`, which copies their rows back while holding writes back), with
//! the wake-up trigger and the index of the single-server layout, in one transaction.
//! The functions stay on every node: one server does not call them.

use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, PgConnection};

use crate::db::Sql;

/// One step of a move, as the command reports it.
#[derive(Debug, Clone)]
pub struct Step {
    /// What it does, in a few words.
    pub what: String,
    /// How long it took; `None` when it had been done before.
    pub took: Option<Duration>,
}

/// A step: a statement that tells whether it was done, and the statement doing it.
struct Plan {
    what: String,
    done: String,
    run: String,
}

/// How a table of orderd's lives on a cluster.
#[derive(Clone, Copy)]
enum Placement {
    /// A copy on every node: the erasure marks, which the statements of the distributed
    /// tables read on the tenant's worker.
    Reference,
    /// Hash-distributed by `tenant_id`: the table that gives the co-location group.
    ByTenant,
    /// Hash-distributed by `tenant_id`, co-located with `orders`, so that a tenant's
    /// rows of every table live in shards on one worker and commit there together.
    CoLocatedWithOrders,
}

/// The distributed layout, declared once, in the order a move makes it (the migration
/// that distributes a new database makes the same): the distribution and its rollback
/// are both derived from it.
const TABLES: [(&str, Placement); 4] = [
    ("tenant_erasure", Placement::Reference),
    ("orders", Placement::ByTenant),
    ("idempotency_record", Placement::CoLocatedWithOrders),
    ("outbox_event", Placement::CoLocatedWithOrders),
];

/// The functions a distributed database's writes call (the claim and the create, made
/// by the migrations), by their signatures. Not co-located with the tables (see their
/// migration).
const FUNCTIONS: [&str; 2] = [
    "orderd_claim(uuid,text,text,bytea,uuid,bigint)",
    "orderd_create(uuid,text,text,uuid,smallint,text,text,bytea,timestamptz,text,uuid,smallint,\
     uuid,uuid,text,integer,text,timestamptz,uuid,uuid,uuid,integer,text,jsonb,timestamptz,text,text)",
];

/// What the single-server layout has and a distributed one cannot: the trigger that
/// wakes the relays (a distributed table takes none; the writers wake them instead)
/// and the index no statement reads on Citus. Dropped first by a move, made again last
/// by the rollback.
struct OneServerOnly {
    name: &'static str,
    /// Whether it exists.
    exists: &'static str,
    drop: &'static str,
    create: &'static str,
}

const ONE_SERVER_ONLY: [OneServerOnly; 2] = [
    OneServerOnly {
        name: "outbox_event: the wake-up trigger",
        exists: "EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify')",
        drop: "DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event",
        create: "CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event FOR EACH ROW EXECUTE FUNCTION outbox_event_notify()",
    },
    OneServerOnly {
        name: "outbox_event: the index by due time",
        exists: "to_regclass('outbox_event_pending') IS NOT NULL",
        drop: "DROP INDEX IF EXISTS outbox_event_pending",
        create: "CREATE INDEX IF NOT EXISTS outbox_event_pending ON outbox_event (next_attempt_at) WHERE status = 'PENDING'",
    },
];

/// Whether `table` is distributed (or a reference table), as SQL.
fn distributed(table: &str) -> String {
    format!("EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = '{table}'::regclass)")
}

/// The distribution, in the order it runs, in one transaction: what one server alone
/// has goes first, then each table as [`TABLES`] places it.
fn distribute_plans() -> Vec<Plan> {
    let drops = ONE_SERVER_ONLY.iter().map(|o| Plan {
        what: format!("{} dropped", o.name),
        done: format!("SELECT NOT {}", o.exists),
        run: o.drop.to_string(),
    });
    let tables = TABLES.iter().map(|(table, placement)| {
        let (what, run) = match placement {
            Placement::Reference => (
                format!("{table}: a reference table"),
                format!("SELECT create_reference_table('{table}')"),
            ),
            Placement::ByTenant => (
                format!("{table}: distributed by tenant_id"),
                format!("SELECT create_distributed_table('{table}', 'tenant_id')"),
            ),
            Placement::CoLocatedWithOrders => (
                format!("{table}: distributed, co-located with orders"),
                format!(
                    "SELECT create_distributed_table('{table}', 'tenant_id', colocate_with => 'orders')"
                ),
            ),
        };
        Plan {
            what,
            done: format!("SELECT {}", distributed(table)),
            run,
        }
    });
    drops.chain(tables).collect()
}

/// The functions made on every node (Citus's own propagation, as `CREATE FUNCTION` on
/// a cluster gets), in one transaction, before the tables are distributed.
fn function_plans() -> Vec<Plan> {
    FUNCTIONS
        .iter()
        .map(|function| Plan {
            what: format!("{function}: on every node"),
            done: format!(
                "SELECT EXISTS (SELECT 1 FROM pg_dist_object WHERE objid = '{function}'::regprocedure)"
            ),
            run: format!("SELECT create_distributed_function('{function}')"),
        })
        .collect()
}

/// After the distribution commits, the rows the coordinator kept for each table, which
/// nothing reads any longer, are truncated (a short lock on each table's local part).
/// Run every time their part runs (nothing to look at first).
fn leftover_plans() -> Vec<Plan> {
    TABLES
        .iter()
        .map(|(table, _)| Plan {
            what: format!("{table}: the coordinator's old rows truncated"),
            done: "SELECT false".to_string(),
            run: format!("SELECT truncate_local_data_after_distributing_table('{table}')"),
        })
        .collect()
}

/// The rollback, in the order it runs, in one transaction: each table back on the
/// coordinator, in the reverse of [`TABLES`], then what one server alone has, made
/// again in the reverse of the order it was dropped.
fn undistribute_plans() -> Vec<Plan> {
    let tables = TABLES.iter().rev().map(|(table, _)| Plan {
        what: format!("{table}: back on the coordinator"),
        done: format!("SELECT NOT {}", distributed(table)),
        run: format!("SELECT undistribute_table('{table}')"),
    });
    let creates = ONE_SERVER_ONLY.iter().rev().map(|o| Plan {
        what: format!("{} back", o.name),
        done: format!("SELECT {}", o.exists),
        run: o.create.to_string(),
    });
    tables.chain(creates).collect()
}

/// Why a move cannot start, said so that the operator knows what to do.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error(
        "the citus extension is not in this database: CREATE EXTENSION citus in it on the coordinator and on every worker"
    )]
    NoExtension,
    #[error(
        "the coordinator knows no worker to hold shards: register them first (SELECT citus_add_node('host', port))"
    )]
    NoWorkers,
    #[error("this database lacks orderd's tables: run orderd migrate first")]
    NotMigrated,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Checks what distributing needs: the extension, a worker, orderd's tables.
pub async fn ready(conn: &mut PgConnection) -> Result<(), NotReady> {
    let mut sql = Sql::direct(conn);
    let extension: bool = sql
        .query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
        .fetch_one(sql.conn())
        .await?;
    if !extension {
        return Err(NotReady::NoExtension);
    }
    let migrated: bool = sql
        .query_scalar(
            "SELECT to_regclass('orders') IS NOT NULL AND to_regclass('idempotency_record') IS NOT NULL
                    AND to_regclass('outbox_event') IS NOT NULL AND to_regclass('tenant_erasure') IS NOT NULL",
        )
        .fetch_one(sql.conn())
        .await?;
    if !migrated {
        return Err(NotReady::NotMigrated);
    }
    let workers: i64 = sql
        .query_scalar(
            "SELECT count(*) FROM pg_dist_node
             WHERE noderole = 'primary' AND isactive AND shouldhaveshards AND groupid <> 0",
        )
        .fetch_one(sql.conn())
        .await?;
    if workers == 0 {
        return Err(NotReady::NoWorkers);
    }
    Ok(())
}

/// Distributes orderd's tables in place (see the module's comment); `each` hears of
/// every step as it ends. A step done before is skipped. Returns how long writes were
/// held back, `None` when everything had been done before.
pub async fn distribute(
    conn: &mut PgConnection,
    mut each: impl FnMut(&Step),
) -> Result<Option<Duration>, NotReady> {
    ready(conn).await?;
    in_one_transaction(conn, &function_plans(), &mut each).await?;
    let held = in_one_transaction(conn, &distribute_plans(), &mut each).await?;
    if held.is_some() {
        for plan in &leftover_plans() {
            each(&timed(conn, plan).await?);
        }
    }
    Ok(held)
}

/// Brings orderd's tables back onto the coordinator (see the module's comment); returns
/// as [`distribute`] does.
pub async fn undistribute(
    conn: &mut PgConnection,
    mut each: impl FnMut(&Step),
) -> sqlx::Result<Option<Duration>> {
    in_one_transaction(conn, &undistribute_plans(), &mut each).await
}

/// The steps not done yet, in one transaction, each timed; how long it took, `None`
/// when there was nothing to do.
async fn in_one_transaction(
    conn: &mut PgConnection,
    plans: &[Plan],
    each: &mut impl FnMut(&Step),
) -> sqlx::Result<Option<Duration>> {
    let mut to_do = Vec::new();
    for plan in plans {
        let mut sql = Sql::direct(conn);
        let done: bool = sql
            .query_scalar(AssertSqlSafe(plan.done.as_str()))
            .fetch_one(sql.conn())
            .await?;
        if done {
            each(&Step {
                what: plan.what.clone(),
                took: None,
            });
        } else {
            to_do.push(plan);
        }
    }
    if to_do.is_empty() {
        return Ok(None);
    }
    let began = Instant::now();
    let mut attempt = 1;
    loop {
        match steps_in_one_transaction(conn, &to_do, each).await {
            // Writers lock these tables in more than one order (a create: the record,
            // then the order and its event; a cancel: the order and its event, then the
            // record), so no order of taking them here avoids every cycle. The steps
            // are one transaction: when PostgreSQL or Citus picks it as the one to
            // cancel, nothing of it stayed, and it simply runs again.
            Err(e) if is_deadlock(&e) && attempt < DEADLOCK_ATTEMPTS => {
                tracing::warn!(
                    attempt,
                    "cancelled to break a deadlock with a writer; running the steps again"
                );
                attempt += 1;
            }
            Err(e) => return Err(e),
            Ok(()) => return Ok(Some(began.elapsed())),
        }
    }
}

/// How many times the transaction runs when each run is cancelled to break a deadlock.
const DEADLOCK_ATTEMPTS: u32 = 5;

fn is_deadlock(e: &sqlx::Error) -> bool {
    crate::db::is_sqlstate(e, "40P01")
}

async fn steps_in_one_transaction(
    conn: &mut PgConnection,
    plans: &[&Plan],
    each: &mut impl FnMut(&Step),
) -> sqlx::Result<()> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    for plan in plans {
        each(&timed(&mut tx, plan).await?);
    }
    tx.commit().await
}

/// Runs `plan`'s statement, timed.
async fn timed(conn: &mut PgConnection, plan: &Plan) -> sqlx::Result<Step> {
    let started = Instant::now();
    let mut sql = Sql::direct(conn);
    sql.query(AssertSqlSafe(plan.run.as_str()))
        .execute(sql.conn())
        .await?;
    Ok(Step {
        what: plan.what.clone(),
        took: Some(started.elapsed()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rollback undoes the move step by step, in the reverse order, from the one
    /// declaration: every table the move places goes back, and everything the move drops
    /// is made again.
    #[test]
    fn the_rollback_is_the_move_reversed() {
        let moved: Vec<String> = distribute_plans().into_iter().map(|p| p.run).collect();
        let back: Vec<String> = undistribute_plans().into_iter().map(|p| p.run).collect();
        assert_eq!(moved.len(), back.len());
        for (table, _) in TABLES {
            let placed = moved
                .iter()
                .position(|r| r.contains(&format!("('{table}'")));
            let returned = back
                .iter()
                .position(|r| *r == format!("SELECT undistribute_table('{table}')"));
            assert!(placed.is_some() && returned.is_some(), "{table}");
            assert_eq!(
                placed.unwrap(),
                moved.len() - 1 - returned.unwrap(),
                "{table}"
            );
        }
        for one in &ONE_SERVER_ONLY {
            let dropped = moved.iter().position(|r| r == one.drop).unwrap();
            let made = back.iter().position(|r| r == one.create).unwrap();
            assert_eq!(dropped, moved.len() - 1 - made, "{}", one.name);
        }
    }
}
