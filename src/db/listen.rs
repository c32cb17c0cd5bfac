//! `LISTEN`, with a bound on how long what it heard is trusted.
//!
//! A listening session tells a process about changes it must not miss: a forgotten
//! idempotency key, a tenant being erased, events to publish. A session whose packets
//! are dropped silently (a firewall or NAT that forgot the flow: no reset, no error)
//! looks exactly like a quiet one, and sqlx exposes no TCP keepalive for its socket.
//! So each session proves itself with a round trip of its own: every quarter of the
//! bound it sends a notification on a channel only it listens to and waits to hear it
//! back. PostgreSQL delivers notifications from one queue in commit order, so hearing
//! that notification means every notification committed before it was sent has been
//! heard too. [`Liveness`] keeps when the last such round trip was sent; what the
//! session said is trusted while that is less than the bound ago, and a session that
//! has not come back within the bound is dropped and opened anew.
//!
//! The writer's side of the bargain: a change that others must act on (an operator's
//! forgetting, an erasure) waits the same bound after its commit before it reports
//! success, so that by then every process has either heard it or stopped trusting what
//! it heard (see `idempotency::operator` and `lifecycle`).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The default of `ORDERD_LISTEN_BOUND_MS`.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(3);

/// Where a process listens, and for how long what it hears is trusted without a
/// fresh round trip.
#[derive(Clone, Debug)]
pub struct ListenOn {
    pub options: PgConnectOptions,
    pub bound: Duration,
}

impl ListenOn {
    /// A record of a session at this place, trusted for this bound.
    pub fn liveness(&self) -> Arc<Liveness> {
        Liveness::new(self.bound)
    }
}

impl From<PgConnectOptions> for ListenOn {
    /// A session at `options` with the default bound (tests and tools).
    fn from(options: PgConnectOptions) -> Self {
        Self {
            options,
            bound: DEFAULT_BOUND,
        }
    }
}

/// What a `LISTEN` heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard<'a> {
    /// A notification on the channel, with its payload.
    Notified(&'a str),
    /// The session was (re)established: notifications sent while it was not may have
    /// been missed, so whatever they would have said must be looked up.
    Listening,
    /// The session was lost, or stayed silent past the bound: until
    /// [`Heard::Listening`], nothing sent is heard.
    Lost,
}

/// Whether a listening session has been heard from recently enough to be trusted:
/// the instant its last answered round trip was sent, on this process's monotonic
/// clock. Shared by the listening task (which records) and whoever relies on what it
/// hears (which asks [`Liveness::fresh`]).
#[derive(Debug)]
pub struct Liveness {
    bound: Duration,
    origin: Instant,
    /// Nanoseconds after `origin` at which the last answered round trip was sent,
    /// plus one; zero while nothing is trusted.
    heard: AtomicU64,
    /// Woken whenever the session is heard from.
    heard_from: tokio::sync::Notify,
}

impl Liveness {
    /// A session not heard from yet, trusted for `bound` after each round trip.
    pub fn new(bound: Duration) -> Arc<Self> {
        Arc::new(Self {
            bound,
            origin: Instant::now(),
            heard: AtomicU64::new(0),
            heard_from: tokio::sync::Notify::new(),
        })
    }

    /// How long what the session said is trusted after a round trip was sent.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// A round trip sent at `sent` came back: everything committed before `sent` has
    /// been heard.
    pub fn heard(&self, sent: Instant) {
        let at = sent.saturating_duration_since(self.origin).as_nanos() as u64 + 1;
        self.heard.fetch_max(at, SeqCst);
        self.heard_from.notify_waiters();
    }

    /// The session is gone: nothing it said is trusted until it is heard from again.
    pub fn lost(&self) {
        self.heard.store(0, SeqCst);
    }

    /// When the last answered round trip was sent, if one is trusted at all.
    fn last_sent(&self) -> Option<Instant> {
        match self.heard.load(SeqCst) {
            0 => None,
            at => Some(self.origin + Duration::from_nanos(at - 1)),
        }
    }

    /// Whether, at `now`, the session was heard from within the bound.
    pub fn fresh(&self, now: Instant) -> bool {
        self.last_sent()
            .is_some_and(|sent| now.saturating_duration_since(sent) < self.bound)
    }

    /// Waits until the session is fresh, or `within` passed; says which.
    pub async fn fresh_within(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let heard = self.heard_from.notified();
            tokio::pin!(heard);
            heard.as_mut().enable();
            if self.fresh(Instant::now()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, heard).await.is_err() {
                return self.fresh(Instant::now());
            }
        }
    }
}

/// Keeps a `LISTEN` on `channel` (a session of its own, at `listen_on`) and calls
/// `heard` for every notification, with [`Heard::Listening`] whenever the session is
/// (re)established and with [`Heard::Lost`] when it is lost or silent past the bound;
/// records every round trip in `liveness`; reconnects with a backoff until
/// `shutdown`. A lost session is replaced here rather than by sqlx's own silent
/// reconnect, so that the caller always knows whether it is listening.
pub async fn listen(
    listen_on: ListenOn,
    channel: &str,
    liveness: Arc<Liveness>,
    mut heard: impl FnMut(Heard<'_>),
    shutdown: CancellationToken,
) {
    // Heard only by this session: other processes never see its round trips.
    let own = format!("orderd_alive_{}", Uuid::new_v4().simple());
    let beat = liveness.bound() / 4;
    let mut pause = Duration::from_millis(100);
    loop {
        let opened = Instant::now();
        let connected = tokio::time::timeout(liveness.bound(), async {
            // A one-connection pool of its own, on the direct (session) connection.
            let session = PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(listen_on.options.clone());
            let mut listener = PgListener::connect_with(&session).await?;
            listener.listen_all([channel, own.as_str()]).await?;
            Ok::<_, sqlx::Error>(listener)
        });
        match connected.await {
            Ok(Ok(mut listener)) => {
                pause = Duration::from_millis(100);
                // Whatever was committed before LISTEN began is looked up by the caller.
                liveness.heard(opened);
                heard(Heard::Listening);
                let why = keep_listening(
                    &mut listener,
                    channel,
                    &own,
                    beat,
                    &liveness,
                    &mut heard,
                    &shutdown,
                )
                .await;
                liveness.lost();
                match why {
                    Ended::Shutdown => return,
                    Ended::Closed => {
                        tracing::warn!(channel, "listener connection lost; reconnecting")
                    }
                    Ended::Failed(e) => {
                        tracing::warn!(channel, error = %e, "listener failed; reconnecting")
                    }
                    Ended::Silent => tracing::warn!(
                        channel,
                        bound_ms = liveness.bound().as_millis() as u64,
                        "listener connection silent past its bound; reconnecting"
                    ),
                }
                heard(Heard::Lost);
                // The session may hang on a dead socket: closing it must not wait.
                drop(listener);
            }
            Ok(Err(e)) => tracing::warn!(channel, error = %e, "cannot LISTEN; retrying"),
            Err(_) => tracing::warn!(channel, "no answer to LISTEN within its bound; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return,
        }
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// Why a listening session ended.
enum Ended {
    Shutdown,
    Closed,
    Failed(sqlx::Error),
    /// No round trip came back within the bound.
    Silent,
}

/// Receives on an open session until it ends, sending a round trip of its own every
/// `beat` and recording each one that comes back.
async fn keep_listening(
    listener: &mut PgListener,
    channel: &str,
    own: &str,
    beat: Duration,
    liveness: &Liveness,
    heard: &mut impl FnMut(Heard<'_>),
    shutdown: &CancellationToken,
) -> Ended {
    // Round trips sent and not yet heard back, by their payload.
    let mut sent: Vec<(u64, Instant)> = Vec::new();
    let mut next_beat = tokio::time::Instant::now() + beat;
    let mut seq = 0u64;
    loop {
        // Silent once the last answered round trip is as old as the bound.
        let trust_ends = liveness
            .last_sent()
            .map_or_else(Instant::now, |at| at + liveness.bound());
        tokio::select! {
            received = listener.try_recv() => match received {
                Ok(Some(notification)) if notification.channel() == own => {
                    let Ok(answered) = notification.payload().parse::<u64>() else { continue };
                    if let Some(at) = sent.iter().position(|(s, _)| *s == answered) {
                        liveness.heard(sent[at].1);
                        sent.drain(..=at);
                    }
                }
                Ok(Some(notification)) if notification.channel() == channel => {
                    heard(Heard::Notified(notification.payload()));
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ended::Closed,
                Err(e) => return Ended::Failed(e),
            },
            _ = tokio::time::sleep_until(next_beat) => {
                seq += 1;
                let at = Instant::now();
                let send = sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(own)
                    .bind(seq.to_string())
                    .persistent(false)
                    .execute(&mut *listener);
                match tokio::time::timeout_at(trust_ends.into(), send).await {
                    Ok(Ok(_)) => sent.push((seq, at)),
                    Ok(Err(e)) => return Ended::Failed(e),
                    Err(_) => return Ended::Silent,
                }
                next_beat += beat;
            }
            _ = tokio::time::sleep_until(trust_ends.into()) => return Ended::Silent,
            _ = shutdown.cancelled() => return Ended::Shutdown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_trusted_for_the_bound_after_the_round_trip_was_sent() {
        let liveness = Liveness::new(Duration::from_secs(3));
        let now = Instant::now();
        assert!(!liveness.fresh(now), "nothing heard yet");
        liveness.heard(now);
        assert!(liveness.fresh(now + Duration::from_millis(2999)));
        assert!(!liveness.fresh(now + Duration::from_secs(3)));
        // An older round trip answered late does not move trust back.
        liveness.heard(now - Duration::from_secs(1));
        assert!(liveness.fresh(now + Duration::from_millis(2999)));
        liveness.lost();
        assert!(!liveness.fresh(now));
    }
}
