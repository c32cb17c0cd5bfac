//! The outbox backlog gauges, kept current by one cheap query (partial indexes only)
//! every [`INTERVAL`] in every process that runs the API or a relay.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::store;
use crate::{
    db::Db,
    metrics,
    supervisor::{Every, First, Run, Schedule},
};

/// How often the gauges are refreshed.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// Refreshes the gauges from start-up until `shutdown`.
pub async fn run(db: Db, shutdown: CancellationToken) {
    let every = Every {
        interval: INTERVAL,
        first: First::Now,
        after_failure: None,
    };
    let mut schedule = Schedule::new("outbox gauges", every, shutdown);
    while schedule.next().await {
        let turn = async {
            match db.run(async |c| store::stats(c).await).await {
                Ok(stats) => {
                    metrics::outbox_backlog(
                        stats.pending,
                        stats.oldest_pending_age_secs,
                        stats.dead,
                        stats.unreadable_shards,
                    );
                    Run::Done
                }
                Err(e) => Run::Failed(format!("cannot refresh the outbox gauges: {e}")),
            }
        };
        let Some(run) = schedule.unless_shutdown(turn).await else {
            return;
        };
        schedule.ran(run);
    }
}
