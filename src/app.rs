//! Assembles the HTTP application: route, middleware, listener, background workers and
//! graceful shutdown.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use poem::{
    Endpoint, EndpointExt, Route, Server,
    listener::{Acceptor, Listener, TcpAcceptor, TcpListener},
    middleware::CatchPanic,
};
use sqlx::PgPool;
use tokio::sync::watch;

use crate::{
    api::{self, AppState, middleware::ProblemLayer},
    auth::Verifier,
    config::{Config, bind_address},
    idempotency::Guard,
    maintenance::{self, Jobs},
    outbox::{publisher::Publisher, relay::Relay, sns::SnsPublisher},
};

/// How long shutdown waits for in-flight requests before closing connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The whole HTTP surface: API, spec, Swagger UI, probes.
pub fn route(state: AppState, verifier: Arc<Verifier>) -> impl Endpoint {
    let api = api::service(state);
    Route::new()
        .at(
            "/metrics",
            poem::get(metrics_text).data(crate::metrics::install()),
        )
        .at("/openapi.json", api.spec_endpoint())
        .at("/openapi.yaml", api.spec_endpoint_yaml())
        .nest("/docs", api.swagger_ui())
        .nest("/", api)
        .data(verifier)
        .with(CatchPanic::new().with_handler(api::middleware::panic_response))
        .with(ProblemLayer)
}

/// `GET /metrics`: the Prometheus text format.
#[poem::handler]
fn metrics_text(handle: poem::web::Data<&PrometheusHandle>) -> poem::Response {
    poem::Response::builder()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render())
}

/// What `orderd relay` serves: metrics and liveness.
fn ops_route() -> impl Endpoint {
    Route::new()
        .at(
            "/metrics",
            poem::get(metrics_text).data(crate::metrics::install()),
        )
        .at("/healthz", poem::get(poem::endpoint::make_sync(|_| "ok")))
}

/// Keeps the outbox gauges current with one cheap query (partial indexes only) every
/// `interval`, from start-up until `shutdown`.
async fn refresh_outbox_gauges(
    pool: PgPool,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        match crate::outbox::store::stats(&pool).await {
            Ok(stats) => crate::metrics::outbox_stats(stats),
            Err(e) => tracing::warn!(error = %e, "cannot refresh the outbox gauges"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// How often the outbox gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(2);

/// The OpenAPI document as served, in YAML (`orderd openapi --yaml`, the committed file).
pub fn openapi_yaml() -> String {
    api::service(spec_only_state()).spec_yaml()
}

/// The OpenAPI document as served, in JSON.
pub fn openapi_json() -> String {
    api::service(spec_only_state()).spec()
}

/// Handlers are never called when only the spec is rendered; a lazy pool that never
/// connects stands in so that no database is needed to print the document.
fn spec_only_state() -> AppState {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://localhost/unused")
        .expect("a static URL parses");
    AppState {
        pool: pool.clone(),
        guard: Guard::new(pool, Default::default()),
    }
}

/// The SNS publisher configured by `ORDERD_SNS_TOPIC_ARN` and the AWS SDK's chain.
pub async fn sns_publisher(config: &Config) -> anyhow::Result<Arc<dyn Publisher>> {
    let topic = config.outbox.topic_arn()?.to_string();
    Ok(Arc::new(
        SnsPublisher::from_env(topic, config.outbox.publish_timeout).await,
    ))
}

/// A bound, not yet running server.
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
        let publisher = match config.outbox.relay_enabled {
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
        let bind = bind_address(&config.bind);
        let acceptor = TcpListener::bind(bind.clone())
            .into_acceptor()
            .await
            .with_context(|| format!("cannot listen on {bind} (ORDERD_BIND)"))?;
        let address = acceptor
            .local_addr()
            .first()
            .and_then(|a| a.as_socket_addr().copied())
            .context("listener has no socket address")?;
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
    /// finish (up to a grace period) and stops the background workers.
    pub async fn run_until(self, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
        let state = AppState {
            pool: self.pool.clone(),
            guard: Guard::new(self.pool.clone(), self.config.idempotency.clone()),
        };
        let (stop_workers, workers_stopped) = watch::channel(false);
        let relay = self.publisher.clone().map(|publisher| {
            let relay = Relay::new(self.pool.clone(), publisher, self.config.outbox.clone());
            tokio::spawn(relay.run(workers_stopped.clone()))
        });
        let jobs = Jobs {
            idempotency: true,
            outbox_retention: relay.is_some().then_some(self.config.outbox.retention),
        };
        let gauges = tokio::spawn(refresh_outbox_gauges(
            self.pool.clone(),
            GAUGE_INTERVAL,
            workers_stopped.clone(),
        ));
        let purge = tokio::spawn(maintenance::run_periodic(
            self.pool.clone(),
            self.config.purge_interval,
            jobs,
            workers_stopped,
        ));
        tracing::info!(address = %self.address, "orderd listening");
        let served = Server::new_with_acceptor(self.acceptor)
            .run_with_graceful_shutdown(route(state, self.verifier), shutdown, Some(SHUTDOWN_GRACE))
            .await;
        let _ = stop_workers.send(true);
        let _ = purge.await;
        let _ = gauges.await;
        if let Some(relay) = relay {
            let _ = relay.await;
        }
        tracing::info!("orderd stopped");
        served.context("HTTP server failed")
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
    tracing::info!("shutdown requested; finishing in-flight requests");
}

/// `orderd relay`: the outbox relay, the outbox purge and the outbox gauges alone, with
/// `/metrics` on `ORDERD_METRICS_BIND`, until `shutdown`.
pub async fn run_relay(
    config: Config,
    pool: PgPool,
    publisher: Arc<dyn Publisher>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let bind = bind_address(&config.metrics_bind);
    let acceptor = TcpListener::bind(bind.clone())
        .into_acceptor()
        .await
        .with_context(|| format!("cannot listen on {bind} (ORDERD_METRICS_BIND)"))?;
    if let Some(address) = acceptor
        .local_addr()
        .first()
        .and_then(|a| a.as_socket_addr().copied())
    {
        tracing::info!(address = %address, "relay metrics listening");
    }
    let (stop, stopped) = watch::channel(false);
    let ops = {
        let mut stopped = stopped.clone();
        tokio::spawn(
            Server::new_with_acceptor(acceptor).run_with_graceful_shutdown(
                ops_route(),
                async move {
                    let _ = stopped.changed().await;
                },
                Some(Duration::from_secs(5)),
            ),
        )
    };
    let gauges = tokio::spawn(refresh_outbox_gauges(
        pool.clone(),
        GAUGE_INTERVAL,
        stopped.clone(),
    ));
    let relay = tokio::spawn(
        Relay::new(pool.clone(), publisher, config.outbox.clone()).run(stopped.clone()),
    );
    let jobs = Jobs {
        idempotency: false,
        outbox_retention: Some(config.outbox.retention),
    };
    let purge = tokio::spawn(maintenance::run_periodic(
        pool,
        config.purge_interval,
        jobs,
        stopped,
    ));
    shutdown.await;
    let _ = stop.send(true);
    let _ = purge.await;
    let _ = gauges.await;
    let _ = ops.await;
    relay.await.context("relay task failed")?;
    Ok(())
}
