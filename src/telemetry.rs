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

/// What the request log line says beyond method, route and status: filled in by the
/// layers that learn it (authentication, the idempotency guard) while the request runs.
#[derive(Debug, Default)]
pub struct RequestContext {
    pub tenant: Option<uuid::Uuid>,
    pub subject: Option<String>,
    pub outcome: Option<&'static str>,
}

tokio::task_local! {
    /// The context of the request this task is serving (set by the HTTP middleware).
    pub static REQUEST: std::cell::RefCell<RequestContext>;
}

/// Notes the authenticated caller for the request log line.
pub fn note_caller(tenant: uuid::Uuid, subject: &str) {
    let _ = REQUEST.try_with(|c| {
        let mut c = c.borrow_mut();
        c.tenant = Some(tenant);
        c.subject = Some(subject.to_string());
    });
}

/// Records how the idempotency guard decided one request: the counter, and the
/// request's log line.
pub fn record_idempotency_outcome(endpoint: &'static str, outcome: Outcome) {
    crate::metrics::idempotency_outcome(endpoint, outcome);
    let _ = REQUEST.try_with(|c| c.borrow_mut().outcome = Some(outcome.as_str()));
}
