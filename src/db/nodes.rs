//! Reading a distributed table node by node, so that a worker that does not answer
//! costs only what its own shards hold.
//!
//! A statement over every shard of a distributed table (the outbox's gauges, the
//! relay's look for due tenants) fails as a whole on Citus when one worker is down, and
//! waits `citus.node_connection_timeout` (30 s by default) first when the worker is
//! silent: one dead worker would blind every tenant's gauges and stall every tenant's
//! publishing. Here the coordinator runs one command per worker instead
//! (`master_run_on_worker`, what Citus's `run_command_on_*` functions are built on),
//! each over that worker's shards, on connections of their own, in parallel, with a
//! short connection timeout; a worker that fails is reported, with the number of shards
//! it holds, and the others' answers stand.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{End, Forms, Sql};

/// How a read over every tenant's rows runs (a purge's candidates, the outbox's
/// gauges, the tenants with due events): one statement on one server; on distributed
/// tables, one command per worker ([`read_each_node`]), so that a worker that does not
/// answer costs only its own shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    OneStatement,
    EachNode,
}

/// The two forms of a read over every tenant's rows (see [`Scan`]).
pub const WHOLE_TABLE_READS: Forms<Scan> = Forms {
    one_server: Scan::OneStatement,
    distributed: Scan::EachNode,
};

/// How long the coordinator waits to connect to a worker for one of these reads.
pub const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a read of every node found.
#[derive(Debug, Clone, PartialEq)]
pub struct EachNode<T> {
    /// The rows of the nodes that answered.
    pub rows: Vec<T>,
    /// How many shards of the table live on the nodes that did not.
    pub unreadable_shards: u64,
    /// The nodes that did not answer, as `host:port`.
    pub unreachable: Vec<String>,
}

/// Each node holding shards of the tables `$1`, with the names of its shards of each.
const PLACEMENTS: &str = "SELECT n.nodename::text, n.nodeport, s.logicalrelid::text,
            array_agg(shard_name(s.logicalrelid, s.shardid)::text ORDER BY s.shardid)
     FROM pg_dist_shard s
     JOIN pg_dist_placement p USING (shardid)
     JOIN pg_dist_node n USING (groupid)
     WHERE s.logicalrelid = ANY ($1::regclass[]) AND n.noderole = 'primary'
     GROUP BY n.nodename, n.nodeport, s.logicalrelid
     ORDER BY n.nodename, n.nodeport";

/// One command per node, run in parallel on connections of their own.
const RUN_ON_NODES: &str =
    "SELECT success, result FROM master_run_on_worker($1::text[], $2::int[], $3::text[], true)";

/// A worker holding shards of the tables it was found for.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// `host:port`, as the coordinator's metadata names it.
    pub name: String,
    host: String,
    port: i32,
    /// Its shards of each table.
    shards: std::collections::BTreeMap<String, Vec<String>>,
}

impl Node {
    /// The `FROM` item standing for this node's part of `table`: its shards,
    /// `UNION ALL`, under the table's own name, so that the planner reaches each
    /// shard's indexes. Co-located tables have a tenant's shards on one node, so a
    /// join of two such parts on the tenant is the join of the tables there.
    pub fn part(&self, table: &str) -> String {
        part_of(
            table,
            self.shards.get(table).map(Vec::as_slice).unwrap_or(&[]),
        )
    }

    /// How many shards of `table` it holds.
    pub fn shards_of(&self, table: &str) -> usize {
        self.shards.get(table).map_or(0, Vec::len)
    }

    /// The names of its shards of `table`, as the worker knows them.
    pub fn shard_names(&self, table: &str) -> &[String] {
        self.shards.get(table).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// The nodes holding shards of `tables`, with their shards of each.
pub async fn nodes_of(sql: &mut Sql<'_>, tables: &[&str]) -> sqlx::Result<Vec<Node>> {
    let rows: Vec<(String, i32, String, Vec<String>)> = sql
        .query_as(PLACEMENTS)
        .bind(tables)
        .fetch_all(sql.conn())
        .await?;
    let mut nodes: Vec<Node> = Vec::new();
    for (host, port, table, shards) in rows {
        let name = format!("{host}:{port}");
        if nodes.last().is_none_or(|n| n.name != name) {
            nodes.push(Node {
                name,
                host,
                port,
                shards: Default::default(),
            });
        }
        if let Some(node) = nodes.last_mut() {
            node.shards.insert(table, shards);
        }
    }
    Ok(nodes)
}

/// Runs each command on its node, in parallel, each on a connection of its own with a
/// connection timeout of [`NODE_CONNECT_TIMEOUT`]: for each, the one value it returned
/// (as text), or why the node did not answer.
pub async fn run_on(
    sql: &mut Sql<'_>,
    commands: &[(&Node, String)],
) -> sqlx::Result<Vec<Result<String, String>>> {
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    sql.atomically(async |sql| {
        let timeout = format!(
            "SET LOCAL citus.node_connection_timeout = {}",
            NODE_CONNECT_TIMEOUT.as_millis()
        );
        sql.query(sqlx::AssertSqlSafe(timeout))
            .execute(sql.conn())
            .await?;
        let hosts: Vec<&str> = commands.iter().map(|(n, _)| n.host.as_str()).collect();
        let ports: Vec<i32> = commands.iter().map(|(n, _)| n.port).collect();
        let texts: Vec<&str> = commands.iter().map(|(_, c)| c.as_str()).collect();
        let results: Vec<(bool, Option<String>)> = sql
            .query_as(RUN_ON_NODES)
            .bind(&hosts)
            .bind(&ports)
            .bind(&texts)
            .fetch_all(sql.conn())
            .await?;
        let answers = commands
            .iter()
            .zip(results)
            .map(|((node, _), (success, result))| {
                let result = result.unwrap_or_default();
                if success {
                    Ok(result)
                } else {
                    tracing::warn!(
                        node = %node.name,
                        error = %result,
                        "a worker did not answer; its shards are left out of this read"
                    );
                    Err(result)
                }
            })
            .collect();
        Ok(End::Commit(answers))
    })
    .await
}

/// Runs `query` once on every node holding shards of `table` and gathers its rows.
///
/// `query` is given the `FROM` item standing for the node's part of the table (see
/// [`Node::part`]); each node's rows come back as one JSON array ([`as_json_rows`]),
/// read into `T` (a struct whose fields are the query's columns). Values it needs from
/// the coordinator (a time) go in as literals: the command runs on the worker, whose
/// clock is its own.
pub async fn read_each_node<T: serde::de::DeserializeOwned>(
    sql: &mut Sql<'_>,
    table: &str,
    query: impl Fn(&str) -> String,
) -> sqlx::Result<EachNode<T>> {
    let nodes = nodes_of(sql, &[table]).await?;
    let commands: Vec<(&Node, String)> = nodes
        .iter()
        .map(|node| (node, as_json_rows(&query(&node.part(table)), None)))
        .collect();
    let results = run_on(sql, &commands).await?;
    let mut read = EachNode {
        rows: Vec::new(),
        unreadable_shards: 0,
        unreachable: Vec::new(),
    };
    for (node, result) in nodes.iter().zip(results) {
        match result {
            Ok(answer) => read.rows.extend(json_rows::<T>(&answer)?),
            Err(_) => {
                read.unreadable_shards += node.shards_of(table) as u64;
                read.unreachable.push(node.name.clone());
            }
        }
    }
    Ok(read)
}

/// The rows of one node's answer to an [`as_json_rows`] command.
pub fn json_rows<T: serde::de::DeserializeOwned>(answer: &str) -> sqlx::Result<Vec<T>> {
    serde_json::from_str(answer).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// A text value as an SQL literal for a command run on a worker (standard conforming
/// strings: a quote is doubled).
pub fn text_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The coordinator's time `secs` seconds ago: the cut-off a read of every node judges
/// by, the same on every worker whatever its own clock says.
pub async fn seconds_ago(sql: &mut Sql<'_>, secs: i64) -> sqlx::Result<DateTime<Utc>> {
    sql.query_scalar("SELECT clock_timestamp() - $1 * interval '1 second'")
        .bind(secs)
        .fetch_one(sql.conn())
        .await
}

/// `query`'s rows as one value, a JSON array of objects (a command run on a node
/// returns one value), in the order of `order_by` (columns of the query) when given.
pub fn as_json_rows(query: &str, order_by: Option<&str>) -> String {
    let order = order_by.map_or(String::new(), |columns| format!(" ORDER BY {columns}"));
    format!("SELECT coalesce(json_agg(row_to_json(r){order}), '[]')::text FROM ({query}) r")
}

/// A time from the coordinator as a literal for a command run on a worker.
pub fn time_literal(at: DateTime<Utc>) -> String {
    format!(
        "'{}'::timestamptz",
        at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
}

/// Of the tenants `$2`, those whose shard of table `$1` is on none of the nodes `$3`
/// (`host:port`), in their order: the coordinator's metadata alone, no worker asked.
const ON_NODES_ANSWERING: &str =
    "SELECT v.tenant FROM unnest($2::uuid[]) WITH ORDINALITY AS v(tenant, i)
     WHERE NOT EXISTS (
         SELECT 1 FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
         WHERE p.shardid = get_shard_id_for_distribution_column($1::regclass, v.tenant)
           AND n.nodename || ':' || n.nodeport = ANY ($3))
     ORDER BY v.i";

/// Of `tenants`, those whose shard of `table` lives on none of the nodes `unreachable`
/// (as [`EachNode::unreachable`] names them).
pub async fn on_nodes_answering(
    sql: &mut Sql<'_>,
    table: &str,
    tenants: &[Uuid],
    unreachable: &[String],
) -> sqlx::Result<Vec<Uuid>> {
    sql.query_scalar(ON_NODES_ANSWERING)
        .bind(table)
        .bind(tenants)
        .bind(unreachable)
        .fetch_all(sql.conn())
        .await
}

/// The `FROM` item for a node's shards of `table`.
fn part_of(table: &str, shards: &[String]) -> String {
    let each: Vec<String> = shards
        .iter()
        .map(|shard| format!("SELECT * FROM {shard}"))
        .collect();
    format!("({}) AS {table}", each.join(" UNION ALL "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_part_is_its_shards_under_the_tables_name() {
        assert_eq!(
            part_of(
                "outbox_event",
                &["outbox_event_1".into(), "outbox_event_3".into()]
            ),
            "(SELECT * FROM outbox_event_1 UNION ALL SELECT * FROM outbox_event_3) AS outbox_event"
        );
    }
}
