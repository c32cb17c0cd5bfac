//! Runs every background job of a process (relay, gauges, purges, the ops listener)
//! under one cancellation token and one task tracker, so that shutdown is one call:
//! cancel, then wait for every job to finish its current step.

use std::future::Future;

use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// The jobs of one process.
#[derive(Default)]
pub struct Supervisor {
    /// Cancelled once, on shutdown; every job watches it (or a clone).
    shutdown: CancellationToken,
    /// Every spawned job, so that shutdown can wait for all of them.
    tracker: TaskTracker,
}

impl Supervisor {
    pub fn new() -> Self {
        Self::default()
    }

    /// The token a job watches to know when to stop.
    pub fn token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Spawns `job`, built from the shutdown token it must watch.
    pub fn spawn<F, Fut>(&self, name: &'static str, job: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let job = job(self.token());
        self.tracker.spawn(async move {
            job.await;
            tracing::debug!(job = name, "background job stopped");
        });
    }

    /// Cancels every job and waits until all have returned.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutdown requested; finishing in-flight work");
}
