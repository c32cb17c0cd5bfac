//! The database handle hands every connection back to its pool, so a caller waiting
//! inside the pool is served by the next one handed back, and the configured size is
//! the number of connections.

use std::time::Duration;

use orderd::db::{Db, connect_db};
use sqlx::PgConnection;

use crate::support::{TestDb, settings};

async fn db_of(test_db: &TestDb, size: &str) -> Db {
    connect_db(&settings(test_db, &[("ORDERD_DB_POOL_SIZE", size)]).db)
        .await
        .expect("database")
}

async fn backend(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .expect("a backend")
}

/// Lets anything the pool does after a connection comes back (its ping, in a task of
/// its own) finish before the pool is looked at.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// The pool's idle connections once they reach `want` (a connection handed back is
/// returned by a task of the pool's own, which a loaded machine runs late), or after a
/// generous while, for the caller to assert on.
async fn idle_once(db: &Db, want: usize) -> usize {
    for _ in 0..500 {
        if db.idle() == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    db.idle()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_handed_back_goes_to_the_pool_and_serves_the_next_caller() {
    let test_db = TestDb::new().await;
    let db = db_of(&test_db, "1").await;
    let mut first = db.conn().await.unwrap();
    let pid = backend(&mut first).await;
    first.done().await.unwrap();
    assert_eq!(idle_once(&db, 1).await, 1, "back in the pool");
    let mut next = db.conn().await.unwrap();
    assert_eq!(backend(&mut next).await, pid, "the one connection again");
    // Dropped without `done` (what an error or a cancelled request does): back too.
    drop(next);
    assert_eq!(idle_once(&db, 1).await, 1, "returned through the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_waiting_inside_the_pool_gets_the_next_connection_handed_back() {
    let test_db = TestDb::new().await;
    let db = db_of(&test_db, "2").await;
    let first = db.conn().await.unwrap();
    let second = db.conn().await.unwrap();
    // Every connection is out; this one waits inside the pool.
    let waiting = tokio::spawn({
        let db = db.clone();
        async move { db.begin().await }
    });
    settle().await;
    assert!(!waiting.is_finished(), "nothing was free");

    first.done().await.unwrap();
    // Served now, not after the pool's acquire timeout (which would be an error).
    let tx = waiting
        .await
        .unwrap()
        .expect("the waiter got the connection handed back");
    tx.commit().await.unwrap();
    second.done().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_on_a_small_pool_are_all_served() {
    let test_db = TestDb::new().await;
    let db = db_of(&test_db, "2").await;
    // Sixteen callers on two connections, mixing `run` and `conn` with `begin`: a
    // connection lost to a waiter would show up as the pool's acquire timeout.
    let callers = (0..16).map(|i| {
        let db = db.clone();
        tokio::spawn(async move {
            for round in 0..25 {
                if (i + round) % 3 == 0 {
                    let mut tx = db.begin().await?;
                    sqlx::query("SELECT 1").execute(&mut *tx).await?;
                    tx.commit().await?;
                } else {
                    db.run(async |c| c.query("SELECT 1").execute(c.conn()).await)
                        .await?;
                }
            }
            Ok::<_, sqlx::Error>(())
        })
    });
    for caller in futures::future::join_all(callers).await {
        caller.unwrap().expect("served");
    }
}

/// Work run `atomically` that is dropped half-way (a client hung up while its claim was
/// being written) leaves nothing written and no transaction open on the connection: the
/// next work on it runs in a transaction of its own and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_work_dropped_half_way_is_rolled_back_and_the_connection_stays_usable() {
    use orderd::db::{End, Sql};
    use sqlx::Connection;

    let db = TestDb::new().await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let insert = |tenant: uuid::Uuid| {
        format!(
            "INSERT INTO tenant_erasure (tenant_id, started_at, actor) VALUES ('{tenant}', now(), 'test')"
        )
    };
    let (dropped, kept) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let half_way = tokio::time::timeout(
        Duration::from_millis(300),
        Sql::direct(&mut conn).atomically(async |c| {
            c.query(sqlx::AssertSqlSafe(insert(dropped)))
                .execute(c.conn())
                .await?;
            // Never ends: the timeout drops this work here, its insert done.
            std::future::pending::<()>().await;
            Ok(End::Commit(()))
        }),
    )
    .await;
    assert!(half_way.is_err(), "the work was dropped half-way");
    Sql::direct(&mut conn)
        .atomically(async |c| {
            c.query(sqlx::AssertSqlSafe(insert(kept)))
                .execute(c.conn())
                .await?;
            Ok(End::Commit(()))
        })
        .await
        .unwrap();
    // Seen from another session: only the second work's row, committed.
    let rows: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT tenant_id FROM tenant_erasure")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, vec![kept]);
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(open, 0, "no transaction left open");
}
