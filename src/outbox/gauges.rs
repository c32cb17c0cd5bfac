//! The outbox backlog gauges, kept current by one cheap query (partial indexes only)
//! every [`INTERVAL`] in every process that runs the API or a relay.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::store;
use crate::{db::Db, metrics};

/// How often the gauges are refreshed.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// Refreshes the gauges from start-up until `shutdown`.
pub async fn run(db: Db, shutdown: CancellationToken) {
    loop {
        match db.run(async |c| store::stats(c).await).await {
            Ok(stats) => {
                metrics::outbox_backlog(stats.pending, stats.oldest_pending_age_secs, stats.dead)
            }
            Err(e) => tracing::warn!(error = %e, "cannot refresh the outbox gauges"),
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
