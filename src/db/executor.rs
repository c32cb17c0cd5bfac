//! The one way orderd's SQL runs: [`Sql`], a connection and how its statements are
//! sent.

use sqlx::{
    Connection, PgConnection, Postgres, SqlSafeStr,
    postgres::{PgArguments, PgRow},
    query::{Query, QueryAs, QueryScalar},
};

use uuid::Uuid;

use super::Layout;

/// How statements reach PostgreSQL: prepared by name and kept (directly), or unnamed
/// and parsed each time (behind a transaction pooler, where a name prepared on one
/// server connection would be looked for on another). Part of [`Db`]'s value and of
/// every [`Sql`] it hands out, so no statement can be sent the other way.
///
/// It also carries the database's [`Layout`]: a statement written otherwise on
/// distributed tables picks its form from [`Sql::layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Statements {
    named: bool,
    layout: Layout,
}

impl Statements {
    /// A direct connection: statements are prepared once per connection.
    pub const NAMED: Statements = Statements {
        named: true,
        layout: Layout::ASSUMED,
    };
    /// Behind a transaction pooler.
    pub const UNNAMED: Statements = Statements {
        named: false,
        layout: Layout::ASSUMED,
    };

    /// The same, on a database of `layout`.
    pub const fn in_layout(self, layout: Layout) -> Self {
        Self { layout, ..self }
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
    pub(super) fn unnamed(self) -> Self {
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

    /// The same connection, its statements sent unnamed: each execution is planned for
    /// its own values and for the tables as they are then. For statements whose best
    /// plan changes as a table grows from empty: a plan PostgreSQL keeps for a prepared
    /// statement is made once and kept until the table's statistics change, and one
    /// made while the outbox was nearly empty (a sequential scan to find the events a
    /// mark names) kept every mark reading the whole table as it grew, until
    /// autovacuum's first `ANALYZE`. Planning costs a few hundred microseconds a
    /// statement. On a distributed database the coordinator then routes each execution
    /// by its own values too.
    pub fn replanned(&mut self) -> Sql<'_> {
        Sql {
            conn: self.conn,
            statements: Statements {
                named: false,
                ..self.statements
            },
        }
    }

    /// Where orderd's tables live: a statement Citus runs otherwise than PostgreSQL
    /// (or not at all) picks its form from it ([`Layout::pick`]).
    pub fn layout(&self) -> Layout {
        self.statements.layout
    }

    /// Where the statements built here run.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn
    }

    /// Runs `statement`, whose `$1` is a tenant and `$2` a number of rows (a batch of
    /// an erasure); how many rows it changed.
    pub async fn tenant_batch(
        &mut self,
        statement: &'static str,
        tenant: Uuid,
        batch: i64,
    ) -> sqlx::Result<u64> {
        let done = self
            .query(statement)
            .bind(tenant)
            .bind(batch)
            .execute(&mut *self.conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// The count `statement` answers for the tenant `$1`.
    pub async fn tenant_count(
        &mut self,
        statement: &'static str,
        tenant: Uuid,
    ) -> sqlx::Result<i64> {
        self.query_scalar(statement)
            .bind(tenant)
            .fetch_one(&mut *self.conn)
            .await
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

/// Numbers the parameters of a statement composed of parts (a create: the fenced
/// completion, the order, its event), in the order the parts bind them: each part
/// takes the next number for each parameter as it writes its SQL, in the order its
/// own `bind` binds them, so no part counts or offsets another's parameters.
#[derive(Debug, Default)]
pub struct Placeholders {
    taken: usize,
}

impl Placeholders {
    /// Numbering from `$1`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next parameter, `$n`.
    pub fn param(&mut self) -> String {
        self.taken += 1;
        format!("${}", self.taken)
    }

    /// How many parameters were taken.
    pub fn taken(&self) -> usize {
        self.taken
    }
}
