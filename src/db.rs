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
    // One plain connection first: its error says what is wrong, where the pool's
    // would only say that it timed out.
    let first = open(&options).await?;
    let _ = first.close().await;
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.clone())
        .await
        .map_err(|e| explain(e, &options))
}

/// One connection, or a one-line error naming `DATABASE_URL` and what to check.
async fn open(options: &PgConnectOptions) -> anyhow::Result<PgConnection> {
    match tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(explain(e, options)),
        Err(_) => Err(anyhow::anyhow!(
            "DATABASE_URL: no answer from {}:{} within {} s (the wrong host, or a firewall?)",
            options.get_host(),
            options.get_port(),
            ACQUIRE_TIMEOUT.as_secs()
        )),
    }
}

/// Turns a connection error into one line that names `DATABASE_URL` and what to check.
fn explain(err: sqlx::Error, options: &PgConnectOptions) -> anyhow::Error {
    let (host, port) = (options.get_host(), options.get_port());
    let user = options.get_username();
    let database = options.get_database().unwrap_or(user);
    let why = match &err {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => format!(
            "nothing accepts connections at {host}:{port} (is PostgreSQL running and listening there?)"
        ),
        sqlx::Error::Io(io) if io.to_string().contains("lookup address") => {
            format!("the host `{host}` is unknown (check the host name)")
        }
        sqlx::Error::Io(io) => format!("cannot reach {host}:{port}: {io}"),
        sqlx::Error::Tls(tls) => format!("TLS with {host}:{port} failed: {tls}"),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("3D000") => format!(
                "the database `{database}` does not exist on {host}:{port} (create it, or name another)"
            ),
            Some("28P01" | "28000") => format!(
                "PostgreSQL at {host}:{port} refused user `{user}` (check the user name and password)"
            ),
            Some("53300") => format!("PostgreSQL at {host}:{port} has no connection slots left"),
            _ => format!("PostgreSQL at {host}:{port} refused: {}", db.message()),
        },
        other => other.to_string(),
    };
    anyhow::anyhow!("DATABASE_URL: {why}")
}

/// Applies pending migrations on a connection of their own, without the statement
/// timeout (a migration may rightly take long).
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    let mut conn = open(&connect_options(config)?).await?;
    MIGRATOR
        .run(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!("migrations failed: {e}"))?;
    let _ = conn.close().await;
    Ok(())
}

fn connect_options(config: &Config) -> anyhow::Result<PgConnectOptions> {
    let url = config.database_url.expose();
    let malformed = || {
        anyhow::anyhow!(
            "DATABASE_URL is not a PostgreSQL URL like postgres://user:password@host:5432/database"
        )
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(malformed());
    }
    url.parse::<PgConnectOptions>().map_err(|_| malformed())
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
