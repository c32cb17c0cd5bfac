//! Where orderd's tables live, as a value: found once, when the process's first pool
//! opens, and carried by every [`Db`](super::Db) and [`Sql`] from then on.
//!
//! A concern whose statements differ between the layouts (the claim of a tenant's
//! events, a create's write, a purge's read) declares its two forms side by side, as
//! one [`Forms`] in the module that owns the statement, and asks the layout which one
//! applies ([`Layout::pick`]). That is the one place the layout is looked at:
//! `tests/architecture.rs` fails on any other test of it, so the forms cannot drift
//! apart into branches scattered over the code. A further way of reaching the same
//! tables (each tenant's statements sent to the node that holds its shard) adds to what
//! the value carries, not a third form: the statements are the distributed ones.

use sqlx::{Connection, PgConnection};

use super::Sql;

/// Where orderd's tables live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    tables: Tables,
}

/// The two shapes of orderd's schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tables {
    /// Plain tables on one PostgreSQL server (or its replicas).
    OneServer,
    /// `orders`, `idempotency_record` and `outbox_event` hash-distributed by tenant over
    /// a Citus cluster, co-located (a tenant's rows of all three on one worker).
    Distributed,
}

impl Layout {
    /// Plain tables on one server.
    pub const ONE_SERVER: Layout = Layout {
        tables: Tables::OneServer,
    };
    /// Tables distributed by tenant over a Citus cluster.
    pub const DISTRIBUTED: Layout = Layout {
        tables: Tables::Distributed,
    };

    /// What a connection is taken to be on until its database's layout is found (a
    /// direct session of a tool, the read that finds the layout): one server. No
    /// statement that differs between the layouts runs on such a connection.
    pub const ASSUMED: Layout = Self::ONE_SERVER;

    /// The layout a database found distributed (or not) has.
    pub const fn of(distributed: bool) -> Layout {
        if distributed {
            Self::DISTRIBUTED
        } else {
            Self::ONE_SERVER
        }
    }

    /// The form of a concern this layout takes.
    pub const fn pick<T: Copy>(self, forms: &Forms<T>) -> T {
        match self.tables {
            Tables::OneServer => forms.one_server,
            Tables::Distributed => forms.distributed,
        }
    }

    /// A name for logs and the `orderd` commands' output.
    pub const fn name(self) -> &'static str {
        self.pick(&Forms {
            one_server: "one server",
            distributed: "distributed (Citus)",
        })
    }
}

/// One concern's two forms: on one server, and on distributed tables. Written side by
/// side where the statement lives, so that a change to one is seen beside the other.
#[derive(Clone, Copy, Debug)]
pub struct Forms<T> {
    pub one_server: T,
    pub distributed: T,
}

/// The layout of the database `conn` is on: distributed when `outbox_event` is a
/// distributed table (the `citus` extension is installed in this database and the
/// migrations distributed orderd's tables; they do so together). Asked in a
/// transaction of its own, so that it also works through a transaction pooler that
/// resets a server connection after every transaction (the unnamed statement sqlx
/// parses in one round trip and runs in the next would otherwise be gone in between).
pub async fn layout_of(conn: &mut PgConnection) -> sqlx::Result<Layout> {
    let mut tx = Connection::begin(conn).await?;
    let distributed = distributed_in(&mut Sql::direct(&mut tx).unnamed()).await?;
    tx.commit().await?;
    Ok(Layout::of(distributed))
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
