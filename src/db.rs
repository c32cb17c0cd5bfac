//! The connection pool and the embedded migrations: every pool the process opens is
//! built here, from configuration, so the configured size is the number of connections.

use std::time::Duration;

use sqlx::{
    Connection, PgConnection, PgPool, Postgres, Transaction,
    migrate::Migrator,
    postgres::{PgConnectOptions, PgPoolOptions},
};

use crate::config::Config;

/// Every migration in `migrations/`, compiled into the binary so that `orderd serve`
/// and `orderd migrate` need no files at run time.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// How long a request waits for a free connection before it answers 503 instead of
/// hanging.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// The process's pool, `ORDERD_DB_POOL_SIZE` connections.
pub async fn pool(config: &Config) -> anyhow::Result<PgPool> {
    pool_of_size(config, config.db_pool_size).await
}

/// A pool of `size` connections: the one-shot commands need only a couple.
///
/// Every connection starts with `statement_timeout` and
/// `idle_in_transaction_session_timeout` set to `ORDERD_DB_STATEMENT_TIMEOUT_MS`: a
/// stalled statement (a lock, a stuck replica) is cancelled instead of holding its
/// connection, its claim and its client until the lease runs out. Transactions also set
/// both with `SET LOCAL` ([`begin`]), which is what a transaction pooler lets through.
pub async fn pool_of_size(config: &Config, size: u32) -> anyhow::Result<PgPool> {
    let timeout = config.db_statement_timeout.as_millis().to_string();
    let options = connect_options(config)?.options([
        ("statement_timeout", timeout.as_str()),
        ("idle_in_transaction_session_timeout", timeout.as_str()),
    ]);
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to the database (DATABASE_URL): {e}"))
}

/// Applies pending migrations on a connection of their own, without the statement
/// timeout (a migration may rightly take long).
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect_with(&connect_options(config)?)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to the database (DATABASE_URL): {e}"))?;
    MIGRATOR
        .run(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!("migrations failed: {e}"))?;
    let _ = conn.close().await;
    Ok(())
}

fn connect_options(config: &Config) -> anyhow::Result<PgConnectOptions> {
    config
        .database_url
        .expose()
        .parse::<PgConnectOptions>()
        .map_err(|e| anyhow::anyhow!("DATABASE_URL is not a valid PostgreSQL URL: {e}"))
}

/// Opens a pool on `url`, with no timeouts (tests and tools).
pub async fn connect(url: &str, max_connections: u32) -> sqlx::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect(url)
        .await
}

/// The `BEGIN` of every transaction orderd opens: the timeouts as `SET LOCAL`, sent in
/// the same round trip (one simple query).
pub fn begin_statement(statement_timeout: Duration) -> String {
    let ms = statement_timeout.as_millis();
    format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}"
    )
}

/// Begins a transaction with `statement` (see [`begin_statement`]).
pub async fn begin(pool: &PgPool, statement: &str) -> sqlx::Result<Transaction<'static, Postgres>> {
    pool.begin_with(sqlx::AssertSqlSafe(statement.to_string()))
        .await
}

/// Whether the database answers a trivial query within two seconds (the readiness
/// probe).
pub async fn ping(pool: &PgPool) -> anyhow::Result<()> {
    tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query("SELECT 1").execute(pool),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the database did not answer within 2 s"))??;
    Ok(())
}
