//! Composition: the long-running processes (`orderd serve`, `orderd relay`) built from
//! configuration: pools, routes, listeners and the supervised background jobs.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use poem::{
    Server,
    listener::{Acceptor, Listener, TcpAcceptor, TcpListener},
};
use sqlx::PgPool;

use crate::{
    api::{self, AppState},
    auth::Verifier,
    config::{self, Config, bind_address},
    db,
    idempotency::Guard,
    outbox::{self, publisher::Publisher, relay::Relay, sns::SnsPublisher},
    retention::{self, Purges},
    supervisor::{Supervisor, shutdown_signal},
};

/// How long shutdown waits for in-flight requests before closing connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long the relay's metrics listener waits for a scrape in progress.
const OPS_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// `orderd serve`: migrations (unless off), then the API and the background jobs until
/// SIGINT or SIGTERM.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let pool = db::pool(&config).await?;
    if config.migrate_on_start {
        db::MIGRATOR.run(&pool).await.context("migrations failed")?;
    }
    Application::build(config, pool)
        .await?
        .run_until(shutdown_signal())
        .await
}

/// `orderd relay`: the relay, the outbox purge and the outbox gauges alone, with
/// `/metrics` on `ORDERD_METRICS_BIND`, until SIGINT or SIGTERM.
pub async fn relay(config: Config) -> anyhow::Result<()> {
    let publisher = sns_publisher(&config).await?;
    let pool = db::pool(&config).await?;
    run_relay(config, pool, publisher, shutdown_signal()).await
}

/// The SNS publisher for `ORDERD_SNS_TOPIC_ARN`, through the AWS SDK's own chain.
pub async fn sns_publisher(config: &Config) -> anyhow::Result<Arc<dyn Publisher>> {
    let topic = config.relay_topic()?.to_string();
    Ok(Arc::new(
        SnsPublisher::from_env(topic, config.outbox.publish_timeout).await,
    ))
}

/// A bound, not yet running `orderd serve`.
pub struct Application {
    acceptor: TcpAcceptor,
    address: SocketAddr,
    pool: PgPool,
    config: Config,
    verifier: Arc<Verifier>,
    /// Where the in-process relay publishes; `None` when `ORDERD_RELAY=off`.
    publisher: Option<Arc<dyn Publisher>>,
}

impl Application {
    /// Binds the listener (so the address is known before serving), checks the keys and,
    /// unless the relay is off, builds the SNS publisher.
    pub async fn build(config: Config, pool: PgPool) -> anyhow::Result<Self> {
        let publisher = match config.relay_in_serve {
            true => Some(sns_publisher(&config).await?),
            false => None,
        };
        Self::build_with_publisher(config, pool, publisher).await
    }

    /// As [`Self::build`], with the relay's publisher given (tests point it at their
    /// own SNS endpoint).
    pub async fn build_with_publisher(
        config: Config,
        pool: PgPool,
        publisher: Option<Arc<dyn Publisher>>,
    ) -> anyhow::Result<Self> {
        let verifier = Arc::new(Verifier::new(&config.jwt)?);
        let (acceptor, address) = bind(&config.bind, config::BIND.name).await?;
        Ok(Self {
            acceptor,
            address,
            pool,
            config,
            verifier,
            publisher,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight requests
    /// finish (up to a grace period) and stops the background jobs.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let state = AppState {
            pool: self.pool.clone(),
            guard: Guard::new(self.pool.clone(), self.config.idempotency.clone()),
        };
        let supervisor = Supervisor::new();
        let relay_runs = self.publisher.is_some();
        if let Some(publisher) = self.publisher {
            let relay = Relay::new(self.pool.clone(), publisher, self.config.outbox.clone());
            supervisor.spawn("relay", |token| relay.run(token));
        }
        spawn_common_jobs(
            &supervisor,
            &self.pool,
            &self.config,
            Purges {
                idempotency: true,
                outbox_retention: relay_runs.then_some(self.config.outbox.retention),
            },
        );
        tracing::info!(address = %self.address, "orderd listening");
        let served = Server::new_with_acceptor(self.acceptor)
            .run_with_graceful_shutdown(
                api::routes(state, self.verifier),
                shutdown,
                Some(SHUTDOWN_GRACE),
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
    pool: PgPool,
    publisher: Arc<dyn Publisher>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let (acceptor, address) = bind(&config.metrics_bind, config::METRICS_BIND.name).await?;
    tracing::info!(address = %address, "relay metrics listening");
    let supervisor = Supervisor::new();
    supervisor.spawn("ops listener", |token| async move {
        let served = Server::new_with_acceptor(acceptor)
            .run_with_graceful_shutdown(
                api::ops_routes(),
                token.cancelled_owned(),
                Some(OPS_SHUTDOWN_GRACE),
            )
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "relay metrics listener failed");
        }
    });
    let relay = Relay::new(pool.clone(), publisher, config.outbox.clone());
    supervisor.spawn("relay", |token| relay.run(token));
    spawn_common_jobs(
        &supervisor,
        &pool,
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

/// The jobs every long-running process runs: the outbox gauges and its purges.
fn spawn_common_jobs(supervisor: &Supervisor, pool: &PgPool, config: &Config, purges: Purges) {
    let gauges_pool = pool.clone();
    supervisor.spawn("outbox gauges", |token| {
        outbox::gauges::run(gauges_pool, token)
    });
    let purge_pool = pool.clone();
    let interval = config.purge_interval;
    supervisor.spawn("retention purges", move |token| {
        retention::run(purge_pool, interval, purges, token)
    });
}

/// Binds `bind` (named by the setting `variable` in errors); returns the acceptor and
/// the address it got (`:0` picks a port).
async fn bind(bind: &str, variable: &str) -> anyhow::Result<(TcpAcceptor, SocketAddr)> {
    let bind = bind_address(bind);
    let acceptor = TcpListener::bind(bind.clone())
        .into_acceptor()
        .await
        .with_context(|| format!("cannot listen on {bind} ({variable})"))?;
    let address = acceptor
        .local_addr()
        .first()
        .and_then(|a| a.as_socket_addr().copied())
        .context("listener has no socket address")?;
    Ok((acceptor, address))
}
