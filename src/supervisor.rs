//! Runs every background job and task of a process (relay, gauges, purges, the ops
//! listener, a claim's release after a dropped request) under one cancellation token
//! and one task tracker, so that shutdown is one call: cancel, then wait for every job
//! to finish its current step. `tests/architecture.rs` fails on a task spawned any
//! other way (the HTTP server's per-connection tasks, and a pool's settling of a
//! connection dropped unfinished, aside).

use std::{future::Future, time::Duration};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::metrics;

/// The jobs of one process.
#[derive(Default)]
pub struct Supervisor {
    jobs: Jobs,
}

/// Where jobs are spawned: a handle on a [`Supervisor`], cheap to clone, for the parts
/// that start tasks of their own (the relay's listener, a claim's release).
#[derive(Clone, Default)]
pub struct Jobs {
    /// Cancelled once, on shutdown; every job watches it (or a clone).
    shutdown: CancellationToken,
    /// Every spawned job, so that shutdown can wait for all of them.
    tracker: TaskTracker,
}

impl Supervisor {
    pub fn new() -> Self {
        Self::default()
    }

    /// A supervisor of a part's own jobs, stopped when `shutdown` is cancelled or
    /// when [`Supervisor::shutdown`] is called, whichever comes first (the relay's
    /// listener and side jobs, which end with the relay).
    pub fn under(shutdown: &CancellationToken) -> Self {
        Self {
            jobs: Jobs {
                shutdown: shutdown.child_token(),
                tracker: TaskTracker::new(),
            },
        }
    }

    /// The token a job watches to know when to stop.
    pub fn token(&self) -> CancellationToken {
        self.jobs.token()
    }

    /// A handle to spawn more jobs here.
    pub fn jobs(&self) -> Jobs {
        self.jobs.clone()
    }

    /// Spawns `job`, built from the shutdown token it must watch.
    pub fn spawn<F, Fut>(&self, name: &'static str, job: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.jobs.spawn(name, job)
    }

    /// Cancels every job and waits until all have returned.
    pub async fn shutdown(self) {
        self.jobs.shutdown.cancel();
        self.jobs.tracker.close();
        self.jobs.tracker.wait().await;
    }
}

impl Jobs {
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

    /// Spawns a short task that finishes on its own (a claim given back): shutdown
    /// waits for it rather than cutting it off.
    pub fn spawn_task(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }
}

/// When a periodic job runs.
#[derive(Debug, Clone, Copy)]
pub struct Every {
    /// Between the end of one run and the start of the next, give or take a tenth
    /// (so that processes started together drift apart rather than run in step).
    pub interval: Duration,
    /// The wait before the first run: zero for a job whose first result is wanted at
    /// once (gauges, a key set), a few random seconds for one whose runs should not
    /// pile up when many processes start together.
    pub first: First,
    /// The wait after a failed run, when it should be sooner than the interval.
    pub after_failure: Option<Duration>,
}

/// The wait before a periodic job's first run.
#[derive(Debug, Clone, Copy)]
pub enum First {
    Now,
    AfterInterval,
    /// Between one and ten seconds in (at most the interval), at random.
    Spread,
}

/// How one run of a periodic job went.
#[derive(Debug)]
pub enum Run {
    Done,
    /// Another process holds the job's lock: nothing was done here.
    Skipped,
    Failed(String),
}

/// The turns of one periodic job: every maintenance job of orderd runs as
///
/// ```text
/// let mut schedule = Schedule::new("job", every, shutdown);
/// while schedule.next().await {
///     let Some(run) = schedule.unless_shutdown(async { ...; Run::Done }).await else { return };
///     schedule.ran(run);
/// }
/// ```
///
/// Each run is counted (`background_job_runs_total{job, outcome}`) and a failure is
/// logged; the job carries on at its next turn. (A loop the job writes around a
/// schedule, rather than a closure handed to a runner, keeps the job's future one
/// plain `Send` state machine.)
pub struct Schedule {
    job: &'static str,
    every: Every,
    shutdown: CancellationToken,
    wait: Duration,
}

impl Schedule {
    pub fn new(job: &'static str, every: Every, shutdown: CancellationToken) -> Self {
        let wait = match every.first {
            First::Now => Duration::ZERO,
            First::AfterInterval => every.interval,
            First::Spread => {
                Duration::from_millis(rand::random_range(1_000..10_000)).min(every.interval)
            }
        };
        Self {
            job,
            every,
            shutdown,
            wait,
        }
    }

    /// Waits for the next turn; `false` once shutdown came first.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(self.wait) => true,
            _ = self.shutdown.cancelled() => false,
        }
    }

    /// `work`, unless shutdown comes first (then `None`).
    pub async fn unless_shutdown<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            done = work => Some(done),
            _ = self.shutdown.cancelled() => None,
        }
    }

    /// Records how a turn went and sets the wait before the next.
    pub fn ran(&mut self, run: Run) {
        let job = self.job;
        self.wait = jittered(self.every.interval);
        let outcome = match run {
            Run::Done => "ok",
            Run::Skipped => "skipped",
            Run::Failed(why) => {
                tracing::warn!(job, error = %why, "background job failed; it runs again at its next turn");
                if let Some(sooner) = self.every.after_failure {
                    self.wait = sooner;
                }
                "failed"
            }
        };
        metrics::job_run(job, outcome);
    }
}

/// `interval` give or take a tenth.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(rand::random_range(0.9..=1.1))
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
