//! Logging set-up and the one place where request outcomes are recorded.
//!
//! Logs go to stderr so that commands whose stdout is their product (`orderd token`,
//! `orderd openapi`) stay pipeable.

use tracing_subscriber::{EnvFilter, fmt};

use crate::idempotency::Outcome;

/// Installs the global subscriber; `RUST_LOG` overrides the default filter.
pub fn init(json: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colour only for a person at a terminal; files and pipes get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // A second init (tests spawning several apps) keeps the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Records how the idempotency guard decided one request. The seam for the
/// `idempotency_requests_total` counter; for now the decision is logged.
pub fn record_idempotency_outcome(endpoint: &'static str, outcome: Outcome) {
    tracing::debug!(endpoint, outcome = outcome.as_str(), "idempotency outcome");
}

/// An event SNS acknowledged, `lag_secs` after its change committed.
pub fn record_published(event_type: &str, lag_secs: f64) {
    tracing::debug!(event_type, lag_secs, "event published");
}

/// A failed publish, by error class.
pub fn record_publish_failure(reason: &'static str) {
    tracing::debug!(reason, "publish failed");
}
