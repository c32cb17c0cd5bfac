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
//! `orderd citus undistribute` is the rollback: the tables back on the coordinator
//! (`undistribute_table`, which copies their rows back while holding writes back), with
//! the wake-up trigger and the index of the single-server layout, in one transaction.

use std::time::{Duration, Instant};

use sqlx::PgConnection;

use crate::db::Sql;

/// One step of a move, as the command reports it.
#[derive(Debug, Clone)]
pub struct Step {
    /// What it does, in a few words.
    pub what: &'static str,
    /// How long it took; `None` when it had been done before.
    pub took: Option<Duration>,
}

/// A step: a statement that tells whether it was done, and the statement doing it.
struct Plan {
    what: &'static str,
    done: &'static str,
    run: &'static str,
}

/// The distribution, in the order it runs, in one transaction. The trigger that woke
/// the relays goes first (a distributed table takes none; the writers and the relays'
/// poll wake them instead), with the index no statement reads on Citus; then the
/// erasure marks (a small table copied to every node, which the statements of the
/// distributed tables read there); then `orders`, which gives the co-location group,
/// and the two tables co-located with it.
const DISTRIBUTE: [Plan; 6] = [
    Plan {
        what: "outbox_event: the wake-up trigger dropped",
        done: "SELECT NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify')",
        run: "DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event",
    },
    Plan {
        what: "outbox_event: the index by due time dropped",
        done: "SELECT to_regclass('outbox_event_pending') IS NULL",
        run: "DROP INDEX IF EXISTS outbox_event_pending",
    },
    Plan {
        what: "tenant_erasure: a reference table",
        done: "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'tenant_erasure'::regclass)",
        run: "SELECT create_reference_table('tenant_erasure')",
    },
    Plan {
        what: "orders: distributed by tenant_id",
        done: "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass)",
        run: "SELECT create_distributed_table('orders', 'tenant_id')",
    },
    Plan {
        what: "idempotency_record: distributed, co-located with orders",
        done: "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_record'::regclass)",
        run: "SELECT create_distributed_table('idempotency_record', 'tenant_id', colocate_with => 'orders')",
    },
    Plan {
        what: "outbox_event: distributed, co-located with orders",
        done: "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'outbox_event'::regclass)",
        run: "SELECT create_distributed_table('outbox_event', 'tenant_id', colocate_with => 'orders')",
    },
];

/// After the distribution commits, the rows the coordinator kept for each table, which
/// nothing reads any longer, are truncated (a short lock on each table's local part).
const LEFTOVERS: [Plan; 4] = [
    leftover(
        "tenant_erasure: the coordinator's old rows truncated",
        "SELECT truncate_local_data_after_distributing_table('tenant_erasure')",
    ),
    leftover(
        "orders: the coordinator's old rows truncated",
        "SELECT truncate_local_data_after_distributing_table('orders')",
    ),
    leftover(
        "idempotency_record: the coordinator's old rows truncated",
        "SELECT truncate_local_data_after_distributing_table('idempotency_record')",
    ),
    leftover(
        "outbox_event: the coordinator's old rows truncated",
        "SELECT truncate_local_data_after_distributing_table('outbox_event')",
    ),
];

/// A step run every time its part runs (nothing to look at first).
const fn leftover(what: &'static str, run: &'static str) -> Plan {
    Plan {
        what,
        done: "SELECT false",
        run,
    }
}

/// The rollback, in the order it runs, in one transaction: each table back on the
/// coordinator, then the index and the trigger of the single-server layout.
const UNDISTRIBUTE: [Plan; 6] = [
    Plan {
        what: "outbox_event: back on the coordinator",
        done: "SELECT NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'outbox_event'::regclass)",
        run: "SELECT undistribute_table('outbox_event')",
    },
    Plan {
        what: "idempotency_record: back on the coordinator",
        done: "SELECT NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'idempotency_record'::regclass)",
        run: "SELECT undistribute_table('idempotency_record')",
    },
    Plan {
        what: "orders: back on the coordinator",
        done: "SELECT NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'orders'::regclass)",
        run: "SELECT undistribute_table('orders')",
    },
    Plan {
        what: "tenant_erasure: back on the coordinator",
        done: "SELECT NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'tenant_erasure'::regclass)",
        run: "SELECT undistribute_table('tenant_erasure')",
    },
    Plan {
        what: "outbox_event: the index by due time built",
        done: "SELECT to_regclass('outbox_event_pending') IS NOT NULL",
        run: "CREATE INDEX IF NOT EXISTS outbox_event_pending ON outbox_event (next_attempt_at) WHERE status = 'PENDING'",
    },
    Plan {
        what: "outbox_event: the wake-up trigger back",
        done: "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'outbox_event_notify')",
        run: "CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify()",
    },
];

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
    let held = in_one_transaction(conn, &DISTRIBUTE, &mut each).await?;
    if held.is_some() {
        for plan in &LEFTOVERS {
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
    in_one_transaction(conn, &UNDISTRIBUTE, &mut each).await
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
        let done: bool = sql.query_scalar(plan.done).fetch_one(sql.conn()).await?;
        if done {
            each(&Step {
                what: plan.what,
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
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("40P01"))
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
    sql.query(plan.run).execute(sql.conn()).await?;
    Ok(Step {
        what: plan.what,
        took: Some(started.elapsed()),
    })
}
