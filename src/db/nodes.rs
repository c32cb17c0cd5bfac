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

use uuid::Uuid;

use super::{End, Sql};

/// How long the coordinator waits to connect to a worker for one of these reads.
pub const NODE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a read of every node found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EachNode {
    /// One answer per node that answered.
    pub answers: Vec<String>,
    /// How many shards of the table live on the nodes that did not.
    pub unreadable_shards: u64,
    /// The nodes that did not answer, as `host:port`.
    pub unreachable: Vec<String>,
}

/// Each node holding shards of the table `$1`, with the names of its shards.
const PLACEMENTS: &str = "SELECT n.nodename::text, n.nodeport,
            array_agg(shard_name(s.logicalrelid, s.shardid)::text ORDER BY s.shardid)
     FROM pg_dist_shard s
     JOIN pg_dist_placement p USING (shardid)
     JOIN pg_dist_node n USING (groupid)
     WHERE s.logicalrelid = $1::regclass AND n.noderole = 'primary'
     GROUP BY n.nodename, n.nodeport
     ORDER BY n.nodename, n.nodeport";

/// One command per node, run in parallel on connections of their own.
const RUN_ON_NODES: &str =
    "SELECT success, result FROM master_run_on_worker($1::text[], $2::int[], $3::text[], true)";

/// Runs `query` once on every node holding shards of `table` and gathers the answers.
///
/// `query` is given the `FROM` item standing for the node's part of the table (its
/// shards, `UNION ALL`, under the table's own name, so that the planner reaches each
/// shard's indexes) and must be a statement returning one row of one value, which comes
/// back as text. Values it needs from the coordinator (a time) go in as literals: the
/// command runs on the worker, whose clock is its own.
pub async fn read_each_node(
    sql: &mut Sql<'_>,
    table: &str,
    query: impl Fn(&str) -> String,
) -> sqlx::Result<EachNode> {
    sql.atomically(async |sql| {
        let timeout = format!(
            "SET LOCAL citus.node_connection_timeout = {}",
            NODE_CONNECT_TIMEOUT.as_millis()
        );
        sql.query(sqlx::AssertSqlSafe(timeout))
            .execute(sql.conn())
            .await?;
        let nodes: Vec<(String, i32, Vec<String>)> = sql
            .query_as(PLACEMENTS)
            .bind(table)
            .fetch_all(sql.conn())
            .await?;
        let commands: Vec<String> = nodes
            .iter()
            .map(|(_, _, shards)| query(&part_of(table, shards)))
            .collect();
        let hosts: Vec<&str> = nodes.iter().map(|(host, _, _)| host.as_str()).collect();
        let ports: Vec<i32> = nodes.iter().map(|(_, port, _)| *port).collect();
        let results: Vec<(bool, Option<String>)> = sql
            .query_as(RUN_ON_NODES)
            .bind(&hosts)
            .bind(&ports)
            .bind(&commands)
            .fetch_all(sql.conn())
            .await?;
        let mut read = EachNode::default();
        for ((host, port, shards), (success, result)) in nodes.iter().zip(results) {
            if success {
                read.answers.push(result.unwrap_or_default());
            } else {
                tracing::warn!(
                    node = %format!("{host}:{port}"),
                    shards = shards.len(),
                    error = result.as_deref().unwrap_or(""),
                    "a worker did not answer; its shards are left out of this read"
                );
                read.unreadable_shards += shards.len() as u64;
                read.unreachable.push(format!("{host}:{port}"));
            }
        }
        Ok(End::Commit(read))
    })
    .await
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
