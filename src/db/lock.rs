//! A session-level advisory lock: a job that must run in one process at a time.

use sqlx::{Connection, PgConnection, postgres::PgConnectOptions};

use super::Sql;

/// A PostgreSQL session-level advisory lock, held on a direct session of its own while
/// this value lives: a job that must not run twice at once across every process takes
/// one. Behind a transaction pooler a session lock would be taken on whichever server
/// connection the pooler picked and outlive the client's use of it, so the lock always
/// goes through `ORDERD_DATABASE_DIRECT_URL`. Dropping the value closes the session,
/// which releases the lock even when the job was cancelled halfway, once the server has
/// noticed; [`SessionLock::release`] releases it at once.
pub struct SessionLock {
    session: PgConnection,
    key: i64,
}

impl SessionLock {
    /// The lock `key`, if no other session holds it; `None` otherwise (another process
    /// is doing the job).
    pub async fn try_take(options: &PgConnectOptions, key: i64) -> sqlx::Result<Option<Self>> {
        let mut session = PgConnection::connect_with(options).await?;
        let mut sql = Sql::direct(&mut session);
        let taken: bool = sql
            .query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(sql.conn())
            .await?;
        if taken {
            Ok(Some(Self { session, key }))
        } else {
            let _ = session.close().await;
            Ok(None)
        }
    }

    /// Unlocks, then closes the session: the next process to try finds the lock free,
    /// rather than held a moment longer by a session whose end the server has not yet
    /// seen. A failure leaves the closing to the drop.
    pub async fn release(mut self) {
        let mut sql = Sql::direct(&mut self.session);
        let unlocked = sql
            .query("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .execute(sql.conn())
            .await;
        if unlocked.is_ok() {
            let _ = self.session.close().await;
        }
    }
}
