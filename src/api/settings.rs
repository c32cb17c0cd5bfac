//! The HTTP surface's settings: where it listens, how it treats connections, and what
//! one tenant may use of one process.

use std::time::Duration;

use crate::config::{ConfigError, Env, Kind, Setting, parse, range, settings};

settings! {
    /// How the HTTP server treats connections.
    pub struct HttpConfig {
        /// Where the API listens.
        bind: String = parse::bind [BIND, "ORDERD_BIND", Some("127.0.0.1:8080"), Kind::Bind, "HTTP listen address; `:0` picks a free loopback port (the bound address is logged)"],
        /// Where `/metrics` is served instead of the API address; `None`: on the API
        /// address (`serve`), or nowhere (`relay`).
        metrics_bind: Option<String> = parse::optional_bind [METRICS_BIND, "ORDERD_METRICS_BIND", None, Kind::Bind, "when set, `/metrics` is served there and not on the API address (the container image sets `0.0.0.0:9090`); `orderd relay` serves `/metrics` and `/healthz` only there"],
        /// A whole request (head and body) must arrive within this.
        read_timeout: Duration = parse::millis [HTTP_READ_TIMEOUT_MS, "ORDERD_HTTP_READ_TIMEOUT_MS", Some("10000"), range(100, 600_000), "a connection that has not delivered a whole request (head and body) this long after it opened, or after the request began, is closed (408)"],
        /// A keep-alive connection idle this long is closed (sooner only to make room
        /// for a new connection when every slot is taken).
        idle_timeout: Duration = parse::millis [HTTP_IDLE_TIMEOUT_MS, "ORDERD_HTTP_IDLE_TIMEOUT_MS", Some("60000"), range(100, 3_600_000), "a keep-alive connection idle between requests this long is closed, and not before, except when all of `ORDERD_HTTP_MAX_CONNECTIONS` are open: then the connection idle longest is closed to admit a new one"],
        /// A response not taken in full this long after its first byte is abandoned.
        write_timeout: Duration = parse::millis [HTTP_WRITE_TIMEOUT_MS, "ORDERD_HTTP_WRITE_TIMEOUT_MS", Some("10000"), range(100, 600_000), "a response the client has not taken in full this long after its first byte was ready is abandoned and the connection closed"],
        /// How long, after SIGTERM or SIGINT, `/readyz` answers 503 while the listener
        /// still accepts: the time a load balancer needs to see it and stop sending.
        shutdown_delay: Duration = parse::millis [SHUTDOWN_DELAY_MS, "ORDERD_SHUTDOWN_DELAY_MS", Some("0"), range(0, 300_000), "after SIGTERM or SIGINT, `/readyz` answers 503 at once and the listener keeps accepting this long before it closes, so that load balancers following `/readyz` (and Kubernetes' endpoints) stop sending first"],
        /// How long requests accepted before the listener closed may take to be answered;
        /// what is still open then is dropped and the process exits.
        shutdown_drain: Duration = parse::millis [SHUTDOWN_DRAIN_MS, "ORDERD_SHUTDOWN_DRAIN_MS", Some("25000"), range(0, 3_600_000), "once the listener closed, how long requests already accepted may take to be answered before the process exits anyway; the delay plus this plus 5 s fits Kubernetes' `terminationGracePeriodSeconds` (30 s by default)"],
        /// Open connections at most; a new one past it takes the slot of the one idle
        /// longest, so that idle connections (anonymous ones too) never keep a tenant out.
        max_connections: usize = parse::number [HTTP_MAX_CONNECTIONS, "ORDERD_HTTP_MAX_CONNECTIONS", Some("10000"), range(1, 1_000_000), "open client connections at most (also kept below the file-descriptor limit); at the limit a new client is admitted by closing the connection idle longest between requests, or waits for one to be idle or closed when none is"],
        /// Requests being handled at once at most.
        max_in_flight: usize = parse::number [HTTP_MAX_IN_FLIGHT, "ORDERD_HTTP_MAX_IN_FLIGHT", Some("1024"), range(1, 1_000_000), "operations doing work at once, counted only once a request's token verified, its tenant's limits admitted it and its body arrived; beyond it, 503 with `Retry-After`"],
        /// Where clients reach the service, without a trailing `/`; `None`: the bound
        /// address over `http`.
        public_url: Option<String> = public_url [PUBLIC_URL, "ORDERD_PUBLIC_URL", None, Kind::Text, "the URL clients reach this service at (`https://orders.example.com`), as the MCP authorization metadata advertises it; default `http://` and the bound address; a request's `Host` is never used for it"],
        /// Browser origins allowed to call `/mcp`.
        mcp_allowed_origins: Vec<String> = origins [MCP_ALLOWED_ORIGINS, "ORDERD_MCP_ALLOWED_ORIGINS", None, Kind::Text, "comma-separated browser origins (`https://app.example.com`) allowed to call `/mcp`; a request with any other `Origin` is refused 403"],
    }
}

settings! {
    /// What one tenant may use of one process.
    pub struct TenantLimits {
        /// Token bucket refill per second; `None`: no rate limit.
        rate_per_sec: Option<u32> = rate [TENANT_RATE_PER_SEC, "ORDERD_TENANT_RATE_PER_SEC", Some("500"), range(0, 1_000_000), "per-tenant token bucket refill rate on the API and MCP paths, per process; `0` turns the limit off"],
        /// Token bucket size.
        burst: u32 = parse::number [TENANT_BURST, "ORDERD_TENANT_BURST", Some("1000"), range(1, 10_000_000), "per-tenant token bucket size"],
        /// Requests of one tenant doing database work at once.
        max_in_flight: u32 = parse::number [TENANT_MAX_IN_FLIGHT, "ORDERD_TENANT_MAX_IN_FLIGHT", Some("8"), range(1, 10_000), "requests of one tenant doing database work at once, per process; more wait their turn (up to 2 s, then 429)"],
    }
}

fn public_url(env: &Env<'_>, s: &Setting) -> Result<Option<String>, ConfigError> {
    match env.text(s) {
        Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
            Ok(Some(url.trim_end_matches('/').to_string()))
        }
        Some(url) => Err(ConfigError::new(format!(
            "{} must be an http:// or https:// URL, not `{url}`",
            s.name
        ))),
        None => Ok(None),
    }
}

/// Origins as browsers send them: without a trailing `/`.
fn origins(env: &Env<'_>, s: &Setting) -> Result<Vec<String>, ConfigError> {
    Ok(parse::list(env, s)?
        .into_iter()
        .map(|o| o.trim_end_matches('/').to_string())
        .filter(|o| !o.is_empty())
        .collect())
}

fn rate(env: &Env<'_>, s: &Setting) -> Result<Option<u32>, ConfigError> {
    Ok(Some(parse::number::<u32>(env, s)?).filter(|&r| r > 0))
}
