//! The database: every pool the process opens is built here, from configuration, so
//! the configured size is the number of connections; and the two ways statements reach
//! PostgreSQL.
//!
//! Directly (the default), every connection starts with the statement timeouts and keeps
//! its prepared statements. Behind a transaction pooler such as PgBouncer in transaction
//! mode (`ORDERD_DB_POOLER=transaction`), a server connection belongs to a client only
//! for one transaction, so: no startup parameters (the pooler refuses them), no named
//! prepared statements (they would live on whichever server prepared them), and every
//! statement inside an explicit transaction, because sqlx parses and executes in two
//! round trips and the pooler would hand the second to another server between them
//! (docs/scaling.md has the measurement). `LISTEN` and migrations need a session: they use
//! `ORDERD_DATABASE_DIRECT_URL`. The mode is part of [`Db`]'s value ([`Statements`]),
//! never a process-wide switch, so a direct and a pooled database can live in one
//! process; so is where the tables live ([`Layout`]).
//!
//! The parts: `pool` (the pool and its connections), `executor` (how a statement is
//! sent), `layout` (one server or distributed), `listen` (`LISTEN` sessions and what
//! they heard), `lock` (advisory locks), `nodes` (reads of a distributed table worker
//! by worker), `errors` (a failed connection in one line); here, the settings and
//! migrations.

use std::time::Duration;

use sqlx::{Connection, PgConnection, migrate::Migrator, postgres::PgConnectOptions};

use crate::config::{ConfigError, Env, Kind, Secret, parse, range, settings};

mod errors;
mod executor;
mod layout;
mod listen;
mod lock;
mod nodes;
mod pool;
mod routes;
mod tenant_hash;

pub use self::errors::is_sqlstate;
pub use self::executor::{End, Placeholders, Sql, Statements};
pub use self::layout::{Forms, Layout, layout_of};
pub use self::listen::{Heard, ListenOn, Liveness, listen};
pub use self::lock::SessionLock;
pub use self::nodes::{
    EachNode, NODE_CONNECT_TIMEOUT, Node, Scan, WHOLE_TABLE_READS, as_json_rows, json_rows,
    nodes_of, on_nodes_answering, read_each_node, run_on, seconds_ago, text_literal, time_literal,
};
#[doc(hidden)]
pub use self::pool::citus_node_urls;
pub use self::pool::{
    ACQUIRE_TIMEOUT, Conn, DEADLINE_MARGIN, Db, PING_IF_IDLE_FOR, PING_TIMEOUT, Placed,
    SERVER_KEEPALIVES, Session, begin_statement, connect_db, connect_relay_db, db_of_size,
};
pub use self::routes::{FOLLOW_EVERY, NodeHealth, Routes};
pub use self::tenant_hash::tenant_hash;

settings! {
    /// How the process reaches PostgreSQL.
    pub struct DbConfig {
        url: Secret = parse::required_secret [DATABASE_URL, "DATABASE_URL", None, Kind::Secret, "PostgreSQL 14+ connection string (required); may point at a transaction pooler (see `ORDERD_DB_POOLER`)"],
        /// A session-capable connection (`LISTEN`, migrations); `url` by default.
        direct_url: Secret = direct_url [DATABASE_DIRECT_URL, "ORDERD_DATABASE_DIRECT_URL", None, Kind::Secret, "a connection that is not behind a transaction pooler, for `LISTEN` and migrations; default `DATABASE_URL`"],
        /// Whether `url` goes through a transaction pooler.
        pooler_transaction: bool = parse::last_choice [DB_POOLER, "ORDERD_DB_POOLER", Some("none"), Kind::Choice(&["none", "transaction"]), "`transaction`: `DATABASE_URL` goes through a transaction pooler (PgBouncer in transaction mode): no startup parameters, no named prepared statements, every statement in a transaction"],
        /// Whether `serve` applies pending migrations at start.
        migrate: bool = parse::switch [MIGRATE, "ORDERD_MIGRATE", Some("on"), Kind::Switch, "`serve` applies pending migrations at start"],
        /// Connections of the process's main pool.
        pool_size: u32 = parse::number [DB_POOL_SIZE, "ORDERD_DB_POOL_SIZE", Some("16"), range(1, 1000), "database connections of the API's pool (`serve`) or of the relay process's jobs (`relay`); `serve`'s in-process relay has `ORDERD_OUTBOX_PARALLEL_ROUNDS` more of its own plus one for its statistics check, and LISTEN and migrations one each"],
        /// The longest a statement may run (and a transaction stay idle).
        statement_timeout: Duration = parse::millis [DB_STATEMENT_TIMEOUT_MS, "ORDERD_DB_STATEMENT_TIMEOUT_MS", Some("5000"), range(100, 600_000), "a statement running longer is cancelled (503, the claim released); also the limit for a transaction left idle"],
        /// Whether each tenant's transactions go to the node that holds its shard.
        citus_routing: bool = parse::switch [CITUS_ROUTING, "ORDERD_CITUS_ROUTING", Some("on"), Kind::Switch, "on a Citus cluster, each tenant's transactions go straight to the node that holds its shard (orderd must reach every node: see `ORDERD_CITUS_NODE_URLS`); `off` sends every statement through the coordinator"],
        /// Where the nodes are reached, when not where Citus says.
        citus_node_urls: Option<Secret> = parse::secret [CITUS_NODE_URLS, "ORDERD_CITUS_NODE_URLS", None, Kind::Secret, "how orderd reaches Citus nodes whose address for it differs from the one the cluster knows, or that need other credentials, TLS or a pooler: `host:port=postgres://…` pairs, comma-separated, `host:port` as `pg_dist_node` names the node; a node not named is reached at `DATABASE_URL` with its host and port"],
        /// How long what a listening session said is trusted without a fresh round trip.
        listen_bound: Duration = parse::millis [LISTEN_BOUND_MS, "ORDERD_LISTEN_BOUND_MS", Some("3000"), range(500, 60_000), "how long a process trusts what its listening sessions told it (forgotten keys, erasures) without hearing from them; each proves itself every quarter of this; `idempotency forget` and `tenant erase` wait this long after they commit, so give them the servers' value"],
    }
}

/// `ORDERD_DATABASE_DIRECT_URL`, else `DATABASE_URL`.
fn direct_url(env: &Env<'_>, s: &crate::config::Setting) -> Result<Secret, ConfigError> {
    match env.text(s) {
        Some(url) => Ok(Secret::new(url)),
        None => parse::required_secret(env, &DATABASE_URL),
    }
}

/// Every migration in `migrations/`, compiled into the binary so that `orderd serve`
/// and `orderd migrate` need no files at run time.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// A session of its own on `ORDERD_DATABASE_DIRECT_URL` (what `LISTEN` and session
/// locks need), with the server's side of a vanished client bounded (see
/// [`SERVER_KEEPALIVES`]).
pub fn direct_options(config: &DbConfig) -> anyhow::Result<PgConnectOptions> {
    Ok(connect_options(&config.direct_url)?.options(SERVER_KEEPALIVES))
}

/// Where this process listens, and how long it trusts what it hears
/// (`ORDERD_LISTEN_BOUND_MS`).
pub fn listen_on(config: &DbConfig) -> anyhow::Result<ListenOn> {
    Ok(ListenOn {
        options: direct_options(config)?,
        bound: config.listen_bound,
    })
}

/// A session on the direct URL, without a statement timeout: for an operator's command
/// whose statements rightly take long (a table copied into shards).
pub async fn direct_session(config: &DbConfig) -> anyhow::Result<PgConnection> {
    let variable = if config.direct_url.expose() == config.url.expose() {
        "DATABASE_URL"
    } else {
        "ORDERD_DATABASE_DIRECT_URL"
    };
    errors::open(&connect_options(&config.direct_url)?, variable).await
}

/// Applies pending migrations on a direct connection of their own (sqlx's migrator
/// holds a session lock), without the statement timeout (a migration may rightly take
/// long).
pub async fn migrate(config: &DbConfig) -> anyhow::Result<()> {
    let mut conn = direct_session(config).await?;
    MIGRATOR
        .run(&mut conn)
        .await
        .map_err(|e| anyhow::anyhow!("migrations failed: {e}"))?;
    let _ = conn.close().await;
    Ok(())
}

pub(crate) fn connect_options(url: &Secret) -> anyhow::Result<PgConnectOptions> {
    let url = url.expose();
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

/// Whether the server vacuums by itself; warns when it does not. The purges delete
/// expired keys and published events as fast as they are written, but only a vacuum
/// makes that space reusable: without autovacuum the two tables and their indexes grow
/// with every write, and every scan of them slows (measured in docs/performance.md,
/// steady state). orderd does not vacuum on its own: that is the server's job, and the
/// operator's to turn back on.
pub async fn check_autovacuum(db: &Db) -> sqlx::Result<bool> {
    let setting: String = db
        .run(async |sql| {
            sql.query_scalar("SELECT current_setting('autovacuum')")
                .fetch_one(sql.conn())
                .await
        })
        .await?;
    let on = setting == "on";
    if !on {
        tracing::warn!(
            "autovacuum is off on this PostgreSQL server: the space the purges free is never \
             reused, and idempotency_record and outbox_event will grow without bound; \
             set autovacuum = on"
        );
    }
    Ok(on)
}

/// Whether the database answers a trivial query within two seconds (the readiness
/// probe).
pub async fn ping(db: &Db) -> anyhow::Result<()> {
    let probe = db.run(async |sql| sql.query("SELECT 1").execute(sql.conn()).await);
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .map_err(|_| anyhow::anyhow!("the database did not answer within 2 s"))??;
    Ok(())
}
