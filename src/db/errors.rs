//! A connection that failed, explained in one line that names the setting to check.

use sqlx::{Connection, PgConnection, postgres::PgConnectOptions};

use super::ACQUIRE_TIMEOUT;

/// Whether `err` is the server's error with SQLSTATE `code`: how a caller tells the one
/// refusal it handles (a deadlock, a function's own `RAISE`) from every other error.
pub fn is_sqlstate(err: &sqlx::Error, code: &str) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(code))
}

/// One connection, or a one-line error naming `variable` and what to check.
pub(super) async fn open(
    options: &PgConnectOptions,
    variable: &str,
) -> anyhow::Result<PgConnection> {
    match tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(explain(e, options, variable)),
        Err(_) => Err(anyhow::anyhow!(
            "{variable}: no answer from {}:{} within {} s (the wrong host, or a firewall?)",
            options.get_host(),
            options.get_port(),
            ACQUIRE_TIMEOUT.as_secs()
        )),
    }
}

/// Turns a connection error into one line that names `variable` and what to check.
fn explain(err: sqlx::Error, options: &PgConnectOptions, variable: &str) -> anyhow::Error {
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
    anyhow::anyhow!("{variable}: {why}")
}
