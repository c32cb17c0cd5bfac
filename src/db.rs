//! The connection pool and the embedded migrations.

use std::time::Duration;

use sqlx::{PgPool, migrate::Migrator, postgres::PgPoolOptions};

/// Every migration in `migrations/`, compiled into the binary so that `orderd serve`
/// and `orderd migrate` need no files at run time.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// Opens a pool. The acquire timeout bounds how long a request waits for a connection
/// before it answers 503 instead of hanging.
pub async fn connect(url: &str, max_connections: u32) -> sqlx::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
}
