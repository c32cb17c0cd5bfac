//! Each tenant's statements on the node that holds its shard.
//!
//! Citus keeps its metadata on every node, and any node plans and runs a tenant's
//! statements; on the node that holds the shard they run there, with no second
//! connection and no two-phase commit, where through the coordinator each is planned
//! twice and its answer relayed. orderd knows the tenant of every transaction before it
//! begins (from the token, or the event it publishes), so it sends each to that node: a
//! pool per node, chosen by the tenant's hash (see [`tenant_hash`]) among the shards'
//! hash ranges.
//!
//! The table of routes is read from the coordinator's metadata at start and again
//! whenever a cheap checksum of the placements changes (polled every
//! [`FOLLOW_EVERY`]); a route made stale by a shard move in between still works, since
//! Citus forwards the statement to the shard's new node. A node orderd cannot connect
//! to is marked down for [`DOWN_FOR`] and its tenants go through the coordinator
//! meanwhile. Where a node is reached (its address as orderd sees it, credentials,
//! TLS, a pooler in front) is said by `ORDERD_CITUS_NODE_URLS`, by default
//! `DATABASE_URL` with the host and port Citus knows the node by.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use super::{Sql, tenant_hash};

/// How often the placements' checksum is read: a moved shard's route follows within
/// about this long.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// How long a node orderd could not connect to is gone around through the coordinator
/// before it is tried again.
pub const DOWN_FOR: Duration = Duration::from_secs(5);

/// Each shard of `orders` (whose co-location group holds the other tables' shards of
/// the same tenants on the same nodes): the start of its hash range, its id and the
/// node that holds it, in the order of the ranges.
const PLACEMENTS: &str = "SELECT s.shardminvalue::int, s.shardid, n.nodename::text, n.nodeport
     FROM pg_dist_shard s
     JOIN pg_dist_placement p USING (shardid)
     JOIN pg_dist_node n USING (groupid)
     WHERE s.logicalrelid = 'orders'::regclass AND n.noderole = 'primary'
     ORDER BY s.shardminvalue::int";

/// A checksum of what [`PLACEMENTS`] reads: changed by a shard move, a split, a node
/// renamed or added.
const CHECKSUM: &str = "SELECT md5(coalesce(string_agg(
            s.shardid || ':' || s.shardminvalue || ':' || n.nodename || ':' || n.nodeport, ','
            ORDER BY s.shardid), ''))
     FROM pg_dist_shard s
     JOIN pg_dist_placement p USING (shardid)
     JOIN pg_dist_node n USING (groupid)
     WHERE s.logicalrelid = 'orders'::regclass AND n.noderole = 'primary'";

/// One shard's place.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    /// The first tenant hash of its range.
    start: i32,
    shard: i64,
    /// `host:port`, as Citus knows the node.
    node: String,
}

/// The routes as last read.
struct Table {
    checksum: String,
    placements: Vec<Placement>,
}

/// Whether a node answers: a pool that could not connect to it marks it down, and its
/// tenants go through the coordinator until [`DOWN_FOR`] has passed.
#[derive(Debug)]
pub struct NodeHealth {
    name: String,
    down_until: Mutex<Option<Instant>>,
}

impl NodeHealth {
    /// Marks the node down for [`DOWN_FOR`].
    pub fn mark_down(&self) {
        let mut down = self.down_until.lock().expect("a node's health");
        if down.is_none_or(|until| until <= Instant::now()) {
            tracing::warn!(
                node = %self.name,
                "a Citus node did not answer; its tenants go through the coordinator for a while"
            );
        }
        *down = Some(Instant::now() + DOWN_FOR);
    }

    fn is_down(&self) -> bool {
        self.down_until
            .lock()
            .expect("a node's health")
            .is_some_and(|until| Instant::now() < until)
    }
}

/// Makes the pool of a node: its connection options and its health, which the pool
/// marks when it cannot connect.
pub type MakePool<P> = Arc<dyn Fn(PgConnectOptions, Arc<NodeHealth>) -> P + Send + Sync>;

/// How orderd reaches the node Citus names `host:port`.
pub struct NodeConnect<P> {
    /// `DATABASE_URL`'s options, with every connection's settings.
    pub base: PgConnectOptions,
    /// Given addresses of nodes, by the name Citus knows them by.
    pub given: HashMap<String, PgConnectOptions>,
    pub make: MakePool<P>,
}

impl<P> NodeConnect<P> {
    fn options(&self, node: &str) -> PgConnectOptions {
        if let Some(given) = self.given.get(node) {
            return given.clone();
        }
        let (host, port) = node.rsplit_once(':').unwrap_or((node, "5432"));
        self.base
            .clone()
            .host(host)
            .port(port.parse().unwrap_or(5432))
    }
}

/// A node's pool, its health and the options it connects with.
struct NodePool<P> {
    pool: P,
    health: Arc<NodeHealth>,
    options: PgConnectOptions,
}

/// The routes of a distributed database: which node holds each tenant's shard, and a
/// pool `P` for each node (generic so that the pool's own module can hold its routes).
pub struct Routes<P> {
    table: RwLock<Arc<Table>>,
    nodes: RwLock<HashMap<String, NodePool<P>>>,
    connect: NodeConnect<P>,
}

impl<P: Clone> Routes<P> {
    /// The routes of the database `sql` is on (its coordinator).
    pub async fn read(sql: &mut Sql<'_>, connect: NodeConnect<P>) -> sqlx::Result<Self> {
        let routes = Self {
            table: RwLock::new(Arc::new(Table {
                checksum: String::new(),
                placements: Vec::new(),
            })),
            nodes: RwLock::new(HashMap::new()),
            connect,
        };
        routes.follow(sql).await?;
        Ok(routes)
    }

    /// Reads the placements again when their checksum changed; whether it did.
    pub async fn follow(&self, sql: &mut Sql<'_>) -> sqlx::Result<bool> {
        let checksum: String = sql.query_scalar(CHECKSUM).fetch_one(sql.conn()).await?;
        if checksum == self.table().checksum {
            return Ok(false);
        }
        let rows: Vec<(i32, i64, String, i32)> =
            sql.query_as(PLACEMENTS).fetch_all(sql.conn()).await?;
        let placements: Vec<Placement> = rows
            .into_iter()
            .map(|(start, shard, host, port)| Placement {
                start,
                shard,
                node: format!("{host}:{port}"),
            })
            .collect();
        {
            let mut nodes = self.nodes.write().expect("the node pools' lock");
            for p in &placements {
                nodes.entry(p.node.clone()).or_insert_with(|| {
                    let health = Arc::new(NodeHealth {
                        name: p.node.clone(),
                        down_until: Mutex::new(None),
                    });
                    let options = self.connect.options(&p.node);
                    let pool = (self.connect.make)(options.clone(), health.clone());
                    NodePool {
                        pool,
                        health,
                        options,
                    }
                });
            }
            nodes.retain(|name, _| placements.iter().any(|p| &p.node == name));
        }
        tracing::info!(
            shards = placements.len(),
            "read which node holds each tenant's shard"
        );
        *self.table.write().expect("the routes' lock") = Arc::new(Table {
            checksum,
            placements,
        });
        Ok(true)
    }

    fn table(&self) -> Arc<Table> {
        self.table.read().expect("the routes' lock").clone()
    }

    /// The pool of the node that holds `tenant`'s shard, unless it is down or not
    /// known.
    pub fn for_tenant(&self, tenant: Uuid) -> Option<P> {
        let (table, at) = self.placement(tenant)?;
        self.node_db(&table.placements[at].node)
    }

    /// Where `tenant`'s shard is: the shard's index among the ranges (tenants with the
    /// same index share a shard), the node that holds it (`host:port` as Citus knows
    /// it), and that node's pool unless it is down.
    pub fn place(&self, tenant: Uuid) -> Option<(usize, String, Option<P>)> {
        let (table, at) = self.placement(tenant)?;
        let node = &table.placements[at].node;
        Some((at, node.clone(), self.node_db(node)))
    }

    /// The routes as last read, and the index of `tenant`'s placement in them.
    fn placement(&self, tenant: Uuid) -> Option<(Arc<Table>, usize)> {
        let table = self.table();
        let at = shard_index(&table.placements, tenant_hash(tenant))?;
        Some((table, at))
    }

    /// Every node holding shards, by name (`host:port` as Citus knows it), with the
    /// options its pool connects with.
    pub fn nodes(&self) -> Vec<(String, PgConnectOptions)> {
        self.nodes
            .read()
            .expect("the node pools' lock")
            .iter()
            .map(|(name, node)| (name.clone(), node.options.clone()))
            .collect()
    }

    fn node_db(&self, name: &str) -> Option<P> {
        let nodes = self.nodes.read().expect("the node pools' lock");
        let node = nodes.get(name)?;
        (!node.health.is_down()).then(|| node.pool.clone())
    }
}

/// The index of the placement whose range holds `hash`: the last one starting at or
/// below it.
fn shard_index(placements: &[Placement], hash: i32) -> Option<usize> {
    placements
        .partition_point(|p| p.start <= hash)
        .checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: i32, shard: i64) -> Placement {
        Placement {
            start,
            shard,
            node: format!("n{shard}"),
        }
    }

    #[test]
    fn a_hash_falls_in_the_range_that_starts_at_or_below_it() {
        let placements = [at(i32::MIN, 1), at(-10, 2), at(0, 3), at(1000, 4)];
        assert_eq!(shard_index(&placements, i32::MIN), Some(0));
        assert_eq!(shard_index(&placements, -11), Some(0));
        assert_eq!(shard_index(&placements, -10), Some(1));
        assert_eq!(shard_index(&placements, -1), Some(1));
        assert_eq!(shard_index(&placements, 0), Some(2));
        assert_eq!(shard_index(&placements, i32::MAX), Some(3));
        assert_eq!(shard_index(&[], 5), None);
    }
}
