//! Composition: the long-running processes (`orderd serve`, `orderd relay`) built from
//! configuration: pools, routes, listeners and the supervised background jobs.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod config;

pub use self::config::{
    Config, ProcessConfig, SETTINGS, Sink, settings_table, worker_threads_from_env,
    worker_threads_from_lookup,
};
use crate::{
    api::{self, server::Limits},
    auth::{self, Verifier},
    config::bind_address,
    db::{self, Db},
    erasure::{self, Erasures},
    idempotency::{self, Guard},
    metrics,
    outbox::{
        self,
        publisher::Publisher,
        relay::Relay,
        sink::{kafka::KafkaPublisher, sns::SnsPublisher},
    },
    reconcile,
    retention::{self, Purges},
    service::{self, Service},
    supervisor::{Every, First, Run, Schedule, Supervisor, shutdown_signal},
};

/// How long the relay's metrics listener waits for a scrape in progress.
const OPS_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// `orderd serve`: migrations (unless off), then the API and the background jobs until
/// SIGINT or SIGTERM.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    if config.db.migrate {
        db::migrate(&config.db).await?;
    }
    let db = db::connect_db(&config.db).await?;
    db::check_autovacuum(&db).await?;
    Application::build(config, db)
        .await?
        .run_until(shutdown_signal())
        .await
}

/// `orderd relay`: the relay, the outbox purge and the outbox gauges alone, with
/// `/metrics` and `/readyz` on `ORDERD_METRICS_BIND`, until SIGINT or SIGTERM.
pub async fn relay(config: Config) -> anyhow::Result<()> {
    let publisher = publisher(&config).await?;
    let db = db::connect_db(&config.db).await?;
    db::check_autovacuum(&db).await?;
    run_relay(config, db, publisher, shutdown_signal()).await
}

/// The publisher of the one configured sink: SNS through the AWS SDK's own chain, or
/// Kafka.
pub async fn publisher(config: &Config) -> anyhow::Result<Arc<dyn Publisher>> {
    let timeout = config.outbox.publish_timeout;
    Ok(match config.relay_sink()? {
        Sink::Sns(topic) => Arc::new(SnsPublisher::from_env(topic.to_string(), timeout).await),
        Sink::Kafka(kafka) => KafkaPublisher::connect(kafka, timeout).await?,
    })
}

/// A bound, not yet running `orderd serve`.
pub struct Application {
    listener: TcpListener,
    address: SocketAddr,
    /// `/metrics` apart from the API, when `ORDERD_METRICS_BIND` is set.
    metrics_listener: Option<(TcpListener, SocketAddr)>,
    db: Db,
    config: Config,
    verifier: Arc<Verifier>,
    /// The in-process relay, unless `ORDERD_RELAY=off`.
    relay: Option<RelayParts>,
}

/// Where the in-process relay publishes, and the connections of its own it works on
/// ([`db::connect_relay_db`]).
struct RelayParts {
    publisher: Arc<dyn Publisher>,
    db: Db,
}

impl Application {
    /// Binds the listener (so the address is known before serving), checks the keys and,
    /// unless the relay is off, builds the publisher.
    pub async fn build(config: Config, db: Db) -> anyhow::Result<Self> {
        let publisher = match config.process.relay_in_serve {
            true => Some(publisher(&config).await?),
            false => None,
        };
        Self::build_with_publisher(config, db, publisher).await
    }

    /// As [`Self::build`], with the relay's publisher given (tests point it at their
    /// own SNS endpoint).
    pub async fn build_with_publisher(
        config: Config,
        db: Db,
        publisher: Option<Arc<dyn Publisher>>,
    ) -> anyhow::Result<Self> {
        let verifier = Arc::new(Verifier::new(&config.jwt)?);
        let relay = match publisher {
            Some(publisher) => Some(RelayParts {
                publisher,
                db: db::connect_relay_db(&config.db, config.outbox.parallel_rounds).await?,
            }),
            None => None,
        };
        let (listener, address) = bind(&config.http.bind, api::settings::BIND.name).await?;
        let metrics_listener = match &config.http.metrics_bind {
            Some(metrics_bind) => Some(bind(metrics_bind, api::settings::METRICS_BIND.name).await?),
            None => None,
        };
        Ok(Self {
            listener,
            address,
            metrics_listener,
            db,
            config,
            verifier,
            relay,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where `/metrics` is served apart from the API, if anywhere.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(_, address)| *address)
    }

    /// Serves until `shutdown` resolves; then `/readyz` answers 503 at once, the listener
    /// closes after `ORDERD_SHUTDOWN_DELAY_MS`, the requests it accepted are answered
    /// within `ORDERD_SHUTDOWN_DRAIN_MS`, and the background jobs stop.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        // Before any job records a metric: what is recorded before the recorder is
        // installed is lost.
        metrics::install(&api::known_labels());
        // The tenants being erased, known before the first request; kept up to date by
        // a job below.
        let erasures = Arc::new(Erasures::default());
        erasures.reload(&self.db).await?;
        let supervisor = Supervisor::new();
        let guard = Guard::new(
            self.db.clone(),
            self.config.idempotency.clone(),
            supervisor.jobs(),
        );
        let guard_cache = guard.replay_cache().clone();
        let service = Service::new(
            self.db.clone(),
            guard.clone(),
            self.config.http.max_in_flight,
            erasures.clone(),
            &api::FRAMING,
        );
        // No answer is replayed from memory unless both sessions that could say it must
        // not be (a forgetting, an erasure) were heard from within the bound.
        let listen_on = db::listen_on(&self.config.db)?;
        let (forgettings, erasings) = (listen_on.liveness(), listen_on.liveness());
        guard_cache.depend_on([forgettings.clone(), erasings.clone()]);
        {
            let cache = guard_cache.clone();
            let endpoints = service::Endpoint::ALL.iter().map(|e| e.as_str()).collect();
            let listen_on = listen_on.clone();
            supervisor.spawn("forgotten idempotency keys", move |token| {
                idempotency::operator::follow(cache, endpoints, listen_on, forgettings, token)
            });
        }
        {
            let db = self.db.clone();
            supervisor.spawn("tenant erasures", move |token| {
                erasure::follow(
                    erasures,
                    db,
                    listen_on,
                    erasings,
                    move || guard.forget_cached_replays(),
                    token,
                )
            });
        }
        let relay_runs = self.relay.is_some();
        if let Some(RelayParts {
            publisher,
            db: relay_db,
        }) = self.relay
        {
            spawn_route_follower(&supervisor, &relay_db);
            let relay = Relay::new(
                relay_db,
                db::listen_on(&self.config.db)?,
                publisher,
                self.config.outbox.clone(),
            );
            supervisor.spawn("relay", |token| relay.run(token));
        }
        spawn_common_jobs(
            &supervisor,
            &self.db,
            &self.config,
            Purges {
                idempotency: true,
                outbox_retention: relay_runs.then_some(self.config.outbox.retention),
            },
        );
        if let Some(interval) = self.config.reconcile.interval {
            let (db, window) = (self.db.clone(), self.config.outbox.retention);
            let lock_on = db::direct_options(&self.config.db)?;
            supervisor.spawn("reconciliation", move |token| {
                reconcile::run(db, lock_on, interval, window, token)
            });
        }
        let metrics_apart = self.metrics_listener.is_some();
        if let Some((listener, address)) = self.metrics_listener {
            tracing::info!(address = %address, "metrics listening");
            spawn_ops_listener(
                &supervisor,
                listener,
                limits(&self.config),
                api::Probes::Live,
            );
        }
        // Serving starts once forgettings and erasures are heard (the replay cache
        // answers from then on), or after a few seconds without: the cache then stays
        // off until the sessions are heard from.
        if !guard_cache.live_within(db::ACQUIRE_TIMEOUT).await {
            tracing::warn!(
                "cannot hear forgotten idempotency keys yet; replays come from the database until then"
            );
        }
        tracing::info!(address = %self.address, "orderd listening");
        let shared = api::Shared::new(self.verifier, &self.config.tenant_limits);
        spawn_auth_jobs(&supervisor, &shared);
        let public_url = match &self.config.http.public_url {
            Some(url) => url.clone(),
            None => format!("http://{}", self.address),
        };
        let routes = api::routes(
            service,
            &shared,
            &self.config.http,
            self.config.jwt.issuer.clone(),
            &public_url,
            !metrics_apart,
        );
        let (readiness, delay) = (shared.readiness.clone(), self.config.http.shutdown_delay);
        let closing = async move {
            shutdown.await;
            readiness.stop();
            if !delay.is_zero() {
                tracing::info!(
                    delay_ms = delay.as_millis() as u64,
                    "/readyz answers 503; still accepting until the delay has passed"
                );
                tokio::time::sleep(delay).await;
            }
        };
        let served = api::server::serve(
            self.listener,
            routes,
            limits(&self.config),
            closing,
            self.config.http.shutdown_drain,
        )
        .await;
        supervisor.shutdown().await;
        tracing::info!("orderd stopped");
        served.context("HTTP server failed")
    }
}

/// The relay process's jobs with `publisher`, until `shutdown` resolves.
pub async fn run_relay(
    config: Config,
    db: Db,
    publisher: Arc<dyn Publisher>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let supervisor = Supervisor::new();
    match &config.http.metrics_bind {
        Some(metrics_bind) => {
            let (listener, address) = bind(metrics_bind, api::settings::METRICS_BIND.name).await?;
            tracing::info!(address = %address, "relay metrics listening");
            let probes = api::Probes::Relay {
                db: db.clone(),
                sink: publisher.clone(),
            };
            spawn_ops_listener(&supervisor, listener, limits(&config), probes);
        }
        None => tracing::info!("ORDERD_METRICS_BIND is not set: the relay serves no metrics"),
    }
    let relay = Relay::new(
        db.clone(),
        db::listen_on(&config.db)?,
        publisher,
        config.outbox.clone(),
    );
    supervisor.spawn("relay", |token| relay.run(token));
    spawn_common_jobs(
        &supervisor,
        &db,
        &config,
        Purges {
            idempotency: false,
            outbox_retention: Some(config.outbox.retention),
        },
    );
    shutdown.await;
    supervisor.shutdown().await;
    tracing::info!("relay stopped");
    Ok(())
}

/// Keeps a JWKS fresh and its age reported (when tokens are verified against one) and
/// forgets idle tenants.
fn spawn_auth_jobs(supervisor: &Supervisor, shared: &api::Shared) {
    if let Some(jwks) = shared.verifier.jwks() {
        let aged = jwks.clone();
        supervisor.spawn("jwks age", |token| {
            api::health::report_key_set_age(aged, token)
        });
        supervisor.spawn("jwks refresh", |token| auth::jwks::keep_fresh(jwks, token));
    }
    let limiter = shared.limiter.clone();
    supervisor.spawn("tenant limits", |token| api::limits::tidy(limiter, token));
}

/// `/metrics` and the probes on a listener of their own, until shutdown, served and
/// stopped as the API listener is.
fn spawn_ops_listener(
    supervisor: &Supervisor,
    listener: TcpListener,
    limits: Limits,
    probes: api::Probes,
) {
    supervisor.spawn("ops listener", |token| async move {
        let served = api::server::serve(
            listener,
            api::ops_routes(probes),
            limits,
            token.cancelled_owned(),
            OPS_SHUTDOWN_GRACE,
        )
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "metrics listener failed");
        }
    });
}

/// The server's connection limits from configuration.
fn limits(config: &Config) -> Limits {
    Limits {
        read_timeout: config.http.read_timeout,
        idle_timeout: config.http.idle_timeout,
        write_timeout: config.http.write_timeout,
        max_connections: config.http.max_connections,
    }
}

/// The jobs every long-running process runs: the metrics' upkeep, the outbox gauges and
/// its purges.
fn spawn_common_jobs(supervisor: &Supervisor, db: &Db, config: &Config, purges: Purges) {
    supervisor.spawn("metrics upkeep", drain_histograms);
    spawn_route_follower(supervisor, db);
    let gauges_db = db.clone();
    supervisor.spawn("outbox gauges", |token| {
        outbox::gauges::run(gauges_db, token)
    });
    let purge_db = db.clone();
    let interval = config.retention.interval;
    supervisor.spawn("retention purges", move |token| {
        retention::run(purge_db, interval, purges, token)
    });
}

/// Keeps `db`'s routes to the Citus nodes current, when it has any: the placements'
/// checksum is read every [`db::FOLLOW_EVERY`], and the routes again when it changed
/// (a shard moved), so that a moved tenant's statements follow it within about that
/// long (until then the old node forwards them).
fn spawn_route_follower(supervisor: &Supervisor, db: &Db) {
    if db.routes().is_none() {
        return;
    }
    let db = db.clone();
    supervisor.spawn("citus routes", move |token| async move {
        let every = Every {
            interval: db::FOLLOW_EVERY,
            first: First::AfterInterval,
            after_failure: None,
        };
        let mut schedule = Schedule::new("citus routes", every, token);
        while schedule.next().await {
            let Some(followed) = schedule.unless_shutdown(db.follow_routes()).await else {
                return;
            };
            schedule.ran(match followed {
                Ok(_) => Run::Done,
                Err(e) => Run::Failed(e.to_string()),
            });
        }
    });
}

/// Keeps the metrics recorder's memory bounded until `shutdown`
/// (`metrics::drain_histograms` says why it must be called).
async fn drain_histograms(shutdown: CancellationToken) {
    let every = Every {
        interval: metrics::UPKEEP_INTERVAL,
        first: First::AfterInterval,
        after_failure: None,
    };
    let mut schedule = Schedule::new("metrics upkeep", every, shutdown);
    while schedule.next().await {
        metrics::drain_histograms();
        schedule.ran(Run::Done);
    }
}

/// Binds `bind` (named by the setting `variable` in errors); returns the acceptor and
/// the address it got (`:0` picks a port).
async fn bind(bind: &str, variable: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let bind = bind_address(bind);
    let listener = TcpListener::bind(&bind)
        .await
        .with_context(|| format!("cannot listen on {bind} ({variable})"))?;
    let address = listener.local_addr()?;
    Ok((listener, address))
}
