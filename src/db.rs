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
//! process.

use std::{
    ops::{Deref, DerefMut},
    sync::Arc,
    time::Duration,
};

use deadpool::managed::{self, Metrics, PoolError, RecycleError, RecycleResult, Timeouts};
use sqlx::{
    Connection, PgConnection, Postgres, SqlSafeStr,
    migrate::Migrator,
    postgres::{PgArguments, PgConnectOptions, PgRow, PgTransactionManager},
    query::{Query, QueryAs, QueryScalar},
};

use sqlx_core::transaction::TransactionManager;

use crate::config::{ConfigError, Env, Kind, Secret, parse, range, settings};

mod listen;
mod nodes;

pub use self::listen::{Heard, ListenOn, Liveness, listen};
pub use self::nodes::{
    EachNode, NODE_CONNECT_TIMEOUT, Node, as_json_rows, json_rows, nodes_of, on_nodes_answering,
    read_each_node, run_on, seconds_ago, text_literal, time_literal,
};

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

/// How long a request waits for a free connection before it answers 503 instead of
/// hanging.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// What orderd allows a database call beyond the statement timeout before it gives up
/// on the answer itself: the server cancels a slow statement at the timeout and says
/// so, but a connection whose packets are dropped silently says nothing, and the
/// operating system would wait minutes for TCP to give up. The margin covers the
/// cancellation's own round trip.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// A pooled connection idle long enough to be checked is given this long to answer its
/// ping; one that does not is dropped and another taken (a connection that went
/// silent would otherwise hold the request for the pool's whole wait).
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// The server's side of a client that vanished without a word (its host died, or a
/// firewall dropped the flow): TCP keepalives and a user timeout on the backend's
/// socket, so that PostgreSQL ends such a session within about twenty seconds instead
/// of the kernel's two hours, and a statement still running notices a closed client.
/// Its locks are already bounded by the statement and idle-in-transaction timeouts;
/// what this frees is the connection slot and, for a listening session, the
/// notification queue it would otherwise hold back. Ignored on Unix-domain sockets.
pub const SERVER_KEEPALIVES: [(&str, &str); 5] = [
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "3"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "20000"),
    ("client_connection_check_interval", "5000"),
];

/// A pooled connection idle at least this long is pinged before use. Under load
/// connections are idle for microseconds and go out unchecked; after a database
/// restart they have been idle longer than this, so the dead ones are found and
/// replaced before a request uses them. One that broke within the last second fails
/// its statement (5xx, the claim given back), and the client's retry gets a fresh
/// connection.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// How statements reach PostgreSQL: prepared by name and kept (directly), or unnamed
/// and parsed each time (behind a transaction pooler, where a name prepared on one
/// server connection would be looked for on another). Part of [`Db`]'s value and of
/// every [`Sql`] it hands out, so no statement can be sent the other way.
///
/// It also says whether orderd's tables are distributed (Citus): the few statements
/// that must be written otherwise there ask [`Sql::distributed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Statements {
    named: bool,
    distributed: bool,
}

impl Statements {
    /// A direct connection: statements are prepared once per connection.
    pub const NAMED: Statements = Statements {
        named: true,
        distributed: false,
    };
    /// Behind a transaction pooler.
    pub const UNNAMED: Statements = Statements {
        named: false,
        distributed: false,
    };

    /// The same, on a database whose tables are distributed (or not).
    pub const fn on_distributed(self, distributed: bool) -> Self {
        Self {
            distributed,
            ..self
        }
    }
}

/// The one way orderd's SQL runs: a connection (or a transaction on one) together with
/// how its statements are sent. A store function takes a `&mut Sql` and builds its
/// statements with [`Sql::query`], [`Sql::query_as`] or [`Sql::query_scalar`], which
/// carry the statement mode, and runs them on [`Sql::conn`]; `tests/architecture.rs`
/// fails when SQL is sent any other way from `src/`.
pub struct Sql<'c> {
    conn: &'c mut PgConnection,
    statements: Statements,
}

impl<'c> Sql<'c> {
    /// Statements on `conn`, sent as `statements` says.
    pub fn new(conn: &'c mut PgConnection, statements: Statements) -> Self {
        Self { conn, statements }
    }

    /// Statements on a direct connection (tests and tools).
    pub fn direct(conn: &'c mut PgConnection) -> Self {
        Self::new(conn, Statements::NAMED)
    }

    /// The same statements, unnamed (what may go through a pooler).
    fn unnamed(self) -> Self {
        Self {
            statements: Statements {
                named: false,
                ..self.statements
            },
            ..self
        }
    }

    /// A statement returning rows or nothing.
    pub fn query<'a>(&self, sql: impl SqlSafeStr) -> Query<'a, Postgres, PgArguments> {
        sqlx::query(sql).persistent(self.statements.named)
    }

    /// A statement whose rows become `O`.
    pub fn query_as<'a, O>(&self, sql: impl SqlSafeStr) -> QueryAs<'a, Postgres, O, PgArguments>
    where
        O: for<'r> sqlx::FromRow<'r, PgRow>,
    {
        sqlx::query_as(sql).persistent(self.statements.named)
    }

    /// A statement whose rows are one value each.
    pub fn query_scalar<'a, O>(
        &self,
        sql: impl SqlSafeStr,
    ) -> QueryScalar<'a, Postgres, O, PgArguments>
    where
        (O,): for<'r> sqlx::FromRow<'r, PgRow>,
    {
        sqlx::query_scalar(sql).persistent(self.statements.named)
    }

    /// Whether orderd's tables are distributed over a Citus cluster: a statement Citus
    /// runs otherwise than PostgreSQL (or not at all) has its other form there.
    pub fn distributed(&self) -> bool {
        self.statements.distributed
    }

    /// Where the statements built here run.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn
    }

    /// Runs `work` as one transaction on this connection: `BEGIN` and `COMMIT` of its
    /// own on a connection that autocommits, a savepoint inside a transaction already
    /// open (behind a pooler, or a caller's). `work` says at its end whether what it did
    /// stays ([`End::Commit`]) or goes ([`End::RollBack`]). An error, or the request
    /// being dropped half-way (a client that hung up), rolls it back: sqlx's
    /// transaction queues the rollback ahead of the connection's next statement, so a
    /// connection never goes back to the pool with this transaction, or its locks,
    /// still open. What needs several statements on Citus, where one statement over
    /// several tables is not routed to one worker, runs this way.
    pub async fn atomically<T>(
        &mut self,
        work: impl AsyncFnOnce(&mut Sql<'_>) -> sqlx::Result<End<T>>,
    ) -> sqlx::Result<T> {
        let statements = self.statements;
        let mut tx = Connection::begin(&mut *self.conn).await?;
        let ended = work(&mut Sql::new(&mut tx, statements)).await?;
        match ended {
            End::Commit(out) => {
                tx.commit().await?;
                Ok(out)
            }
            End::RollBack(out) => {
                tx.rollback().await?;
                Ok(out)
            }
        }
    }
}

/// How work run [`Sql::atomically`] ends: what it did is kept, or undone; either way
/// with its answer.
pub enum End<T> {
    Commit(T),
    RollBack(T),
}

/// One pooled connection, and whether its last user finished with it cleanly.
pub struct Session {
    conn: PgConnection,
    /// Set when a [`Conn`] was dropped before [`Conn::done`]: a cancelled request may
    /// have left a statement running or a reply unread. The settling task clears it;
    /// should the connection reach the pool unsettled, the next user pings it first
    /// (which waits for whatever is pending).
    unsettled: bool,
}

/// Opens the pool's connections and checks the ones taken out again. A connection
/// handed back goes straight back in line: no round trip, unlike sqlx's own pool,
/// whose ping on every release cost the create about a tenth of its throughput at 8
/// connections (docs/adr). A connection dropped unfinished (a transaction left open, a
/// reply unread) is settled by a task of its own before it goes back in line.
struct Connector {
    options: PgConnectOptions,
}

impl managed::Manager for Connector {
    type Type = Session;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<Session, sqlx::Error> {
        Ok(Session {
            conn: PgConnection::connect_with(&self.options).await?,
            unsettled: false,
        })
    }

    async fn recycle(
        &self,
        session: &mut Session,
        metrics: &Metrics,
    ) -> RecycleResult<sqlx::Error> {
        if session.unsettled || metrics.last_used() >= PING_IF_IDLE_FOR {
            // An error drops this one; the pool then hands out another or opens one.
            match tokio::time::timeout(PING_TIMEOUT, session.conn.ping()).await {
                Ok(pinged) => pinged.map_err(RecycleError::Backend)?,
                Err(_) => return Err(RecycleError::message("no answer to a ping")),
            }
            session.unsettled = false;
        }
        Ok(())
    }
}

type Pool = managed::Pool<Connector>;

/// The process's database: the pool and how statements reach it. Every connection a
/// request uses comes from here.
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    /// Behind a transaction pooler: every statement in an explicit transaction, none
    /// of them named.
    pooled: bool,
    /// The tables are distributed (Citus), as found when the pool was made.
    distributed: bool,
    /// `BEGIN` with the statement timeouts as `SET LOCAL`, one round trip.
    begin: Arc<str>,
    /// How long a call may wait for the database's answer (see [`Db::within`]).
    deadline: Duration,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("status", &self.pool.status())
            .field("pooled", &self.pooled)
            .finish()
    }
}

impl Db {
    fn new(
        options: PgConnectOptions,
        size: u32,
        pooled: bool,
        statement_timeout: Duration,
    ) -> Self {
        let timeouts = Timeouts {
            wait: Some(ACQUIRE_TIMEOUT),
            create: Some(ACQUIRE_TIMEOUT),
            recycle: Some(ACQUIRE_TIMEOUT),
        };
        let pool = Pool::builder(Connector { options })
            .max_size(size as usize)
            .timeouts(timeouts)
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .expect("a pool with a runtime and a size");
        Self {
            pool,
            pooled,
            distributed: false,
            begin: begin_statement(statement_timeout).into(),
            deadline: statement_timeout + DEADLINE_MARGIN,
        }
    }

    /// Runs `work` (database calls on a connection already taken) within the statement
    /// timeout plus [`DEADLINE_MARGIN`]: past that, orderd stops waiting whatever the
    /// network says, and the caller gets an I/O error (answered 503 like any lost
    /// connection). The connection `work` held is then in an unknown state: dropped
    /// unfinished, it is pinged before its next use, and dropped if it stays silent.
    pub async fn within<T, E: From<sqlx::Error>>(
        &self,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        match tokio::time::timeout(self.deadline, work).await {
            Ok(done) => done,
            Err(_) => Err(E::from(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer from the database within {} ms",
                    self.deadline.as_millis()
                ),
            )))),
        }
    }

    /// Whether orderd's tables are distributed (see [`Sql::distributed`]).
    pub fn distributed(&self) -> bool {
        self.distributed
    }

    /// The same database, its tables known to be distributed (or not): what
    /// [`db_of_size`] finds, for tests and tools that build a `Db` themselves.
    pub fn on_distributed(mut self, distributed: bool) -> Self {
        self.distributed = distributed;
        self
    }

    /// A database of `size` connections reached directly at `options`, opened as they
    /// are needed (tests and tools).
    pub fn direct(options: PgConnectOptions, size: u32, statement_timeout: Duration) -> Self {
        Self::new(options, size, false, statement_timeout)
    }

    /// How this database's statements are sent.
    fn statements(&self) -> Statements {
        if self.pooled {
            Statements::UNNAMED
        } else {
            Statements::NAMED
        }
        .on_distributed(self.distributed)
    }

    /// Statements on `conn` (a connection or a transaction from this database), sent
    /// this database's way.
    pub fn sql<'c>(&self, conn: &'c mut PgConnection) -> Sql<'c> {
        Sql::new(conn, self.statements())
    }

    /// Connections open and idle in the pool (tests, diagnostics).
    pub fn idle(&self) -> usize {
        self.pool.status().available
    }

    /// A connection within [`ACQUIRE_TIMEOUT`] in all: the pool's wait for a free one,
    /// the pings of idle ones and the opening of a new one together (each has a
    /// timeout of its own, and a silent network could otherwise chain them).
    async fn session(&self) -> sqlx::Result<managed::Object<Connector>> {
        let got = tokio::time::timeout(ACQUIRE_TIMEOUT, self.pool.get())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?;
        got.map_err(|e| match e {
            PoolError::Timeout(_) => sqlx::Error::PoolTimedOut,
            PoolError::Backend(e) => e,
            PoolError::Closed => sqlx::Error::PoolClosed,
            other => sqlx::Error::Protocol(other.to_string()),
        })
    }

    /// A connection for one or a few statements: a plain pooled connection directly,
    /// a short transaction behind a pooler. Call [`Conn::done`] when finished.
    pub async fn conn(&self) -> sqlx::Result<Conn> {
        if self.pooled {
            self.begin().await
        } else {
            Ok(Conn {
                session: Some(self.session().await?),
                in_transaction: false,
                done: false,
                statements: self.statements(),
                settle_within: self.deadline,
            })
        }
    }

    /// Runs `work` (a statement or a few) on a connection from [`Db::conn`].
    pub async fn run<T>(
        &self,
        work: impl AsyncFnOnce(&mut Sql<'_>) -> sqlx::Result<T>,
    ) -> sqlx::Result<T> {
        let mut conn = self.conn().await?;
        self.within(async {
            let out = work(&mut conn.sql()).await?;
            conn.done().await?;
            Ok(out)
        })
        .await
    }

    /// A transaction with the statement timeouts set for it, on a connection of its
    /// own; [`Conn::commit`] commits it, dropping it rolls it back.
    pub async fn begin(&self) -> sqlx::Result<Conn> {
        let mut conn = Conn {
            session: Some(self.session().await?),
            in_transaction: false,
            done: false,
            statements: self.statements(),
            settle_within: self.deadline,
        };
        self.begin_in(&mut conn).await?;
        Ok(conn)
    }

    /// The same transaction as [`Db::begin`], on a connection the caller already holds
    /// (one from [`Db::conn`] that autocommits); [`Conn::commit`] then commits it and
    /// hands the connection back.
    pub async fn begin_in(&self, conn: &mut Conn) -> sqlx::Result<()> {
        let statement = sqlx::AssertSqlSafe(self.begin.to_string()).into_sql_str();
        self.within(PgTransactionManager::begin(
            conn.session_mut(),
            Some(statement),
        ))
        .await?;
        conn.in_transaction = true;
        Ok(())
    }
}

/// A connection from [`Db::conn`] or a transaction from [`Db::begin`].
pub struct Conn {
    /// Always there until the `Conn` is dropped (which may hand it to [`settle`]).
    session: Option<managed::Object<Connector>>,
    in_transaction: bool,
    done: bool,
    statements: Statements,
    /// How long settling a connection dropped unfinished may take: the database
    /// calls' deadline (what a statement still running on it may take to end).
    settle_within: Duration,
}

impl Conn {
    fn session(&self) -> &PgConnection {
        &self
            .session
            .as_ref()
            .expect("a Conn holds its session until dropped")
            .conn
    }

    fn session_mut(&mut self) -> &mut PgConnection {
        &mut self
            .session
            .as_mut()
            .expect("a Conn holds its session until dropped")
            .conn
    }

    /// Ends the connection's use after its last statement completed: commits the
    /// transaction, if there is one, and hands the connection back to the pool.
    /// Dropping a `Conn` instead rolls that transaction back.
    pub async fn done(mut self) -> sqlx::Result<()> {
        if self.in_transaction {
            PgTransactionManager::commit(self.session_mut()).await?;
            self.in_transaction = false;
        }
        self.done = true;
        Ok(())
    }

    /// Commits the transaction from [`Db::begin`] (the same as [`Conn::done`]).
    pub async fn commit(self) -> sqlx::Result<()> {
        self.done().await
    }

    /// Statements on this connection.
    pub fn sql(&mut self) -> Sql<'_> {
        let statements = self.statements;
        Sql::new(self.session_mut(), statements)
    }

    /// Whether each statement on this connection has committed by the time it answers
    /// (a direct connection; behind a pooler nothing commits before [`Conn::done`]). Such
    /// a connection can carry on to the next step of a request instead of being handed
    /// back: a write that holds a claim then never waits for a connection.
    pub fn autocommits(&self) -> bool {
        !self.in_transaction
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        if self.in_transaction {
            // Queued: sent by the settling below, or ahead of the next user's first
            // statement.
            PgTransactionManager::start_rollback(&mut session.conn);
        }
        if self.done {
            return;
        }
        session.unsettled = true;
        // Settled now, not when the pool next hands the connection out: until its
        // ROLLBACK reaches the server, a transaction dropped half-way (a client that hung
        // up, a deadline that passed) keeps its locks, a claim's row among them, and a
        // quiet pool may not hand this connection out for a long time.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(settle(session, self.settle_within));
        }
    }
}

/// Waits for whatever a connection dropped unfinished still has pending, sends its
/// queued rollback, and hands it back to the pool settled; one that does not answer
/// within `within` is closed instead (the server ends its transaction when it notices
/// the client gone, which its `client_connection_check_interval` bounds).
async fn settle(mut session: managed::Object<Connector>, within: Duration) {
    match tokio::time::timeout(within, session.conn.ping()).await {
        Ok(Ok(())) => session.unsettled = false,
        _ => drop(managed::Object::take(session)),
    }
}

impl Deref for Conn {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.session()
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.session_mut()
    }
}

/// The process's main pool, `ORDERD_DB_POOL_SIZE` connections (`serve`'s in-process
/// relay works on a pool of its own: [`connect_relay_db`]).
pub async fn connect_db(config: &DbConfig) -> anyhow::Result<Db> {
    db_of_size(config, config.pool_size).await
}

/// The in-process relay's own connections, one per round it runs at once
/// (`ORDERD_OUTBOX_PARALLEL_ROUNDS`) and one for its statistics check (an `ANALYZE`
/// holds it for a few hundred milliseconds, which no round should wait for), apart
/// from the API's pool: when requests hold every API connection (a burst, writes
/// stalled on a lock), their queue for the pool would otherwise hold back the
/// publishing of what other writers committed, and the API's load would show up as
/// publish latency.
pub async fn connect_relay_db(config: &DbConfig, parallel_rounds: u32) -> anyhow::Result<Db> {
    db_of_size(config, parallel_rounds + 1).await
}

/// A database of `size` connections: the one-shot commands need only a couple.
///
/// Directly, every connection starts with `statement_timeout` and
/// `idle_in_transaction_session_timeout` set to `ORDERD_DB_STATEMENT_TIMEOUT_MS`: a
/// stalled statement (a lock, a stuck replica) is cancelled instead of holding its
/// connection, its claim and its client until the lease runs out. Behind a pooler the
/// same limits come from `SET LOCAL` in every transaction (and, for a client other than
/// orderd, from the role: see docs/scaling.md).
///
/// JIT compilation is off for every statement: each of orderd's runs for a millisecond
/// or two, and when a large table or a recursive query raises the planner's cost
/// estimate past `jit_above_cost`, compiling took 40 to 80 ms each time (the fair claim
/// measured 85 ms with it, 16 without; decision 125).
pub async fn db_of_size(config: &DbConfig, size: u32) -> anyhow::Result<Db> {
    let pooled = config.pooler_transaction;
    let timeout = config.statement_timeout.as_millis().to_string();
    let mut options = connect_options(&config.url)?;
    if pooled {
        options = options.statement_cache_capacity(0);
    } else {
        options = options.options([
            ("statement_timeout", timeout.as_str()),
            ("idle_in_transaction_session_timeout", timeout.as_str()),
            ("jit", "off"),
        ]);
        options = options.options(SERVER_KEEPALIVES);
    }
    // One plain connection first: its error says what is wrong, where the pool's
    // would only say that it timed out.
    let mut first = open(&options, "DATABASE_URL").await?;
    let distributed = is_distributed(&mut first)
        .await
        .map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot read the schema's layout: {e}"))?;
    if distributed {
        tracing::info!("orderd's tables are distributed (Citus)");
    }
    let db = Db::new(options, size, pooled, config.statement_timeout).on_distributed(distributed);
    let _ = first.close().await;
    Ok(db)
}

/// Whether `outbox_event` is a distributed table: the `citus` extension is installed
/// in this database and the migrations distributed orderd's tables (they do so
/// together). Asked in a transaction of its own, so that it also works through a
/// transaction pooler that resets a server connection after every transaction (the
/// unnamed statement sqlx parses in one round trip and runs in the next would
/// otherwise be gone in between).
pub async fn is_distributed(conn: &mut PgConnection) -> sqlx::Result<bool> {
    let mut tx = Connection::begin(conn).await?;
    let distributed = distributed_in(&mut Sql::direct(&mut tx).unnamed()).await?;
    tx.commit().await?;
    Ok(distributed)
}

async fn distributed_in(sql: &mut Sql<'_>) -> sqlx::Result<bool> {
    let citus: bool = sql
        .query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
                    AND to_regclass('outbox_event') IS NOT NULL",
        )
        .fetch_one(sql.conn())
        .await?;
    if !citus {
        return Ok(false);
    }
    sql.query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'outbox_event'::regclass)",
    )
    .fetch_one(sql.conn())
    .await
}

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

/// One connection, or a one-line error naming `variable` and what to check.
async fn open(options: &PgConnectOptions, variable: &str) -> anyhow::Result<PgConnection> {
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

/// A session on the direct URL, without a statement timeout: for an operator's command
/// whose statements rightly take long (a table copied into shards).
pub async fn direct_session(config: &DbConfig) -> anyhow::Result<PgConnection> {
    let variable = if config.direct_url.expose() == config.url.expose() {
        "DATABASE_URL"
    } else {
        "ORDERD_DATABASE_DIRECT_URL"
    };
    open(&connect_options(&config.direct_url)?, variable).await
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

fn connect_options(url: &Secret) -> anyhow::Result<PgConnectOptions> {
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

/// The `BEGIN` of every transaction orderd opens: the timeouts as `SET LOCAL`, sent in
/// the same round trip (one simple query).
pub fn begin_statement(statement_timeout: Duration) -> String {
    let ms = statement_timeout.as_millis();
    format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}; SET LOCAL jit = off"
    )
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

/// What one batch of a purge found past retention, and how many of those it deleted:
/// a purge reads its candidates without locks, then deletes them one tenant per
/// statement, and a row another transaction held, or that changed meanwhile, is found
/// but not deleted (the next pass takes it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    pub found: u64,
    pub deleted: u64,
}
