//! The pool every process opens, and the connections it hands out: [`Db`] and
//! [`Conn`].

use std::{
    collections::HashMap,
    ops::{Deref, DerefMut},
    sync::Arc,
    time::Duration,
};

use deadpool::managed::{
    self, Metrics, PoolError, RecycleError, RecycleResult, TimeoutType, Timeouts,
};
use sqlx::{
    Connection, PgConnection, SqlSafeStr,
    postgres::{PgConnectOptions, PgTransactionManager},
};
use sqlx_core::transaction::TransactionManager;

use uuid::Uuid;

use crate::config::Secret;

use super::{
    DbConfig, Forms, Layout, Sql, Statements, connect_options,
    errors::open,
    layout_of,
    routes::{MakePool, NodeConnect, NodeHealth, Routes},
};
use crate::metrics;

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
    /// Where the tables live, as found when the pool was made.
    layout: Layout,
    /// `BEGIN` with the statement timeouts as `SET LOCAL`, one round trip.
    begin: Arc<str>,
    /// How long a call may wait for the database's answer (see [`Db::within`]).
    deadline: Duration,
    /// On a distributed database with routing on: the node that holds each tenant's
    /// shard, and a pool for each node (see [`Db::for_tenant`]).
    routes: Option<Arc<Routes<Db>>>,
    /// When this is a node's pool: the node's health, marked down when it cannot be
    /// reached.
    health: Option<Arc<NodeHealth>>,
}

/// Where a tenant's statements go (see [`Db::placed`]).
pub struct Placed {
    /// The index of its shard's hash range: tenants with the same one share a shard.
    pub shard: usize,
    /// The node that holds the shard, as Citus names it.
    pub node: String,
    /// The node's pool, or the coordinator's while the node is down.
    pub db: Db,
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
            layout: Layout::ASSUMED,
            begin: begin_statement(statement_timeout).into(),
            deadline: statement_timeout + DEADLINE_MARGIN,
            routes: None,
            health: None,
        }
    }

    /// The database for `tenant`'s transactions: on a distributed database with
    /// routing on, the pool of the node that holds its shard (its statements run there,
    /// planned once and with no further hop); else, or while that node is down or its
    /// route not yet read, this one (the coordinator forwards them).
    pub fn for_tenant(&self, tenant: Uuid) -> Db {
        let Some(routes) = &self.routes else {
            return self.clone();
        };
        match routes.for_tenant(tenant) {
            Some(node) => {
                metrics::db_route("node");
                node
            }
            None => {
                metrics::db_route("coordinator");
                self.clone()
            }
        }
    }

    /// Where `tenant`'s statements go, uncounted (for the relay, whose rounds are not
    /// requests): the shard's index and the node that holds it, with that node's pool,
    /// or this one while the node is down; none without routes or before they are read.
    pub fn placed(&self, tenant: Uuid) -> Option<Placed> {
        let (shard, node, pool) = self.routes.as_ref()?.place(tenant)?;
        Some(Placed {
            shard,
            node,
            db: pool.unwrap_or_else(|| self.clone()),
        })
    }

    /// The routes, when this database has them.
    pub fn routes(&self) -> Option<&Arc<Routes<Db>>> {
        self.routes.as_ref()
    }

    /// Where to listen for what is sent on each node that holds shards (a routed
    /// writer's notification is delivered on its node): the nodes' own sessions,
    /// none behind a transaction pooler (which cannot carry `LISTEN`; the relays then
    /// find those events at their poll) or without routes.
    pub fn node_sessions(&self) -> Vec<(String, PgConnectOptions)> {
        match (&self.routes, self.pooled) {
            (Some(routes), false) => routes.nodes(),
            _ => Vec::new(),
        }
    }

    /// Reads the routes again if the placements changed since they were read (a shard
    /// moved, a node was added); whether they had. Nothing to do without routes.
    pub async fn follow_routes(&self) -> sqlx::Result<bool> {
        let Some(routes) = self.routes.clone() else {
            return Ok(false);
        };
        self.run(async |sql| routes.follow(sql).await).await
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

    /// Where orderd's tables live (see [`Sql::layout`]).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The same database, its tables known to be laid out as `layout`: what
    /// [`db_of_size`] finds, for tests and tools that build a `Db` themselves.
    pub fn in_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
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
        .in_layout(self.layout)
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
        if let (Err(e), Some(health)) = (&got, &self.health)
            && matches!(
                e,
                PoolError::Backend(_) | PoolError::Timeout(TimeoutType::Create)
            )
        {
            // The node could not be reached: its tenants go through the coordinator.
            health.mark_down();
        }
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

/// A database of `size` connections: the one-shot commands need only a couple. Its
/// connections start as [`pool_options`] says. On a distributed database, with
/// `ORDERD_CITUS_ROUTING` on, it also reads where each tenant's shard lives and keeps a
/// pool of `size` for each node (see `routes`).
pub async fn db_of_size(config: &DbConfig, size: u32) -> anyhow::Result<Db> {
    let pooled = config.pooler_transaction;
    let options = pool_options(config, &connect_options(&config.url)?);
    // One plain connection first: its error says what is wrong, where the pool's
    // would only say that it timed out.
    let mut first = open(&options, "DATABASE_URL").await?;
    let layout = layout_of(&mut first)
        .await
        .map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot read the schema's layout: {e}"))?;
    tracing::debug!(layout = layout.name(), "found where orderd's tables live");
    let mut db = Db::new(options.clone(), size, pooled, config.statement_timeout).in_layout(layout);
    if layout.pick(&ROUTED) && config.citus_routing {
        let timeout = config.statement_timeout;
        let make: MakePool<Db> = Arc::new(move |options, health| {
            let mut db = Db::new(routed(options, pooled), size, pooled, timeout).in_layout(layout);
            db.health = Some(health);
            db
        });
        let connect = NodeConnect {
            base: options,
            given: given_nodes(config)?,
            make,
        };
        let mut tx = Connection::begin(&mut first).await?;
        let routes = Routes::read(&mut Sql::direct(&mut tx).unnamed(), connect)
            .await
            .map_err(|e| anyhow::anyhow!("DATABASE_URL: cannot read where the shards live: {e}"))?;
        tx.commit().await?;
        db.routes = Some(Arc::new(routes));
    }
    let _ = first.close().await;
    Ok(db)
}

/// Whether a layout's tenants can be routed to the node that holds their shard.
const ROUTED: Forms<bool> = Forms {
    one_server: false,
    distributed: true,
};

/// `url`'s options with what every connection of a pool starts with.
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
fn pool_options(config: &DbConfig, url: &PgConnectOptions) -> PgConnectOptions {
    let timeout = config.statement_timeout.as_millis().to_string();
    if config.pooler_transaction {
        url.clone().statement_cache_capacity(0)
    } else {
        url.clone()
            .options([
                ("statement_timeout", timeout.as_str()),
                ("idle_in_transaction_session_timeout", timeout.as_str()),
                ("jit", "off"),
            ])
            .options(SERVER_KEEPALIVES)
    }
}

/// A node's connection options: on a direct connection, every statement planned for
/// its parameters (`plan_cache_mode`). Citus 13.2.2, on the node that holds a shard,
/// misses its local plan cache for a prepared statement's generic plan at every
/// execution and adds a plan each time, so a backend's memory grows without bound
/// (decision 171); a custom plan is never cached. Behind a pooler statements are
/// unnamed, planned for their parameters anyway.
fn routed(options: PgConnectOptions, pooled: bool) -> PgConnectOptions {
    if pooled {
        options
    } else {
        options.options([("plan_cache_mode", "force_custom_plan")])
    }
}

/// `ORDERD_CITUS_NODE_URLS` read exactly as a distributed database's pools read it, but
/// without a database: the fuzzing targets feed it text no operator would write.
#[doc(hidden)]
pub fn citus_node_urls(config: &DbConfig) -> anyhow::Result<HashMap<String, PgConnectOptions>> {
    given_nodes(config)
}

/// `ORDERD_CITUS_NODE_URLS`: the nodes reached otherwise than at `DATABASE_URL` with
/// their host and port, by the name Citus knows them by.
fn given_nodes(config: &DbConfig) -> anyhow::Result<HashMap<String, PgConnectOptions>> {
    let Some(given) = &config.citus_node_urls else {
        return Ok(HashMap::new());
    };
    let mut nodes = HashMap::new();
    for pair in given
        .expose()
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let Some((name, url)) = pair.split_once('=') else {
            anyhow::bail!(
                "ORDERD_CITUS_NODE_URLS: each entry is host:port=postgres://…, one of them is not"
            );
        };
        let url = connect_options(&Secret::new(url.trim())).map_err(|_| {
            anyhow::anyhow!(
                "ORDERD_CITUS_NODE_URLS: the URL for {} is not a PostgreSQL URL",
                name.trim()
            )
        })?;
        nodes.insert(name.trim().to_string(), pool_options(config, &url));
    }
    Ok(nodes)
}

/// The `BEGIN` of every transaction orderd opens: the timeouts as `SET LOCAL`, sent in
/// the same round trip (one simple query).
pub fn begin_statement(statement_timeout: Duration) -> String {
    let ms = statement_timeout.as_millis();
    format!(
        "BEGIN; SET LOCAL statement_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {ms}; SET LOCAL jit = off"
    )
}
