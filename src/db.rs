//! The connection pool and the embedded migrations: every pool the process opens is
//! built here, from configuration, so the configured size is the number of connections.

use std::time::Duration;

use sqlx::{PgPool, migrate::Migrator, postgres::PgPoolOptions};

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
pub async fn pool_of_size(config: &Config, size: u32) -> anyhow::Result<PgPool> {
    connect(config.database_url.expose(), size)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to the database (DATABASE_URL): {e}"))
}

/// Opens a pool on `url`.
pub async fn connect(url: &str, max_connections: u32) -> sqlx::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect(url)
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
