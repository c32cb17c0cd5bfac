//! Assembles the HTTP application: route, middleware, listener, background workers and
//! graceful shutdown.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
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
    maintenance,
};

/// How long shutdown waits for in-flight requests before closing connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The whole HTTP surface: API, spec, Swagger UI, probes.
pub fn route(state: AppState, verifier: Arc<Verifier>) -> impl Endpoint {
    let api = api::service(state);
    Route::new()
        .at("/openapi.json", api.spec_endpoint())
        .at("/openapi.yaml", api.spec_endpoint_yaml())
        .nest("/docs", api.swagger_ui())
        .nest("/", api)
        .data(verifier)
        .with(CatchPanic::new().with_handler(api::middleware::panic_response))
        .with(ProblemLayer)
}

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

/// A bound, not yet running server.
pub struct Application {
    acceptor: TcpAcceptor,
    address: SocketAddr,
    pool: PgPool,
    config: Config,
    verifier: Arc<Verifier>,
}

impl Application {
    /// Binds the listener (so the address is known before serving) and checks the keys.
    pub async fn build(config: Config, pool: PgPool) -> anyhow::Result<Self> {
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
        let purge = tokio::spawn(maintenance::run_periodic(
            self.pool.clone(),
            self.config.purge_interval,
            workers_stopped,
        ));
        tracing::info!(address = %self.address, "orderd listening");
        let served = Server::new_with_acceptor(self.acceptor)
            .run_with_graceful_shutdown(route(state, self.verifier), shutdown, Some(SHUTDOWN_GRACE))
            .await;
        let _ = stop_workers.send(true);
        let _ = purge.await;
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
