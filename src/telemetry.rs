//! Logging set-up and the per-request context that the request log line reports.
//!
//! Logs go to stderr so that commands whose stdout is their product (`orderd token`,
//! `orderd openapi`) stay pipeable.

use std::cell::RefCell;

use tracing_subscriber::{EnvFilter, fmt};

use crate::tenant::TenantId;

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
/// code that learns it (authentication, the idempotency guard) while the request runs.
#[derive(Debug, Default)]
pub struct RequestContext {
    pub tenant: Option<TenantId>,
    pub subject: Option<String>,
    pub outcome: Option<&'static str>,
}

tokio::task_local! {
    /// The context of the request this task is serving (set by the HTTP middleware).
    static REQUEST: RefCell<RequestContext>;
}

/// Runs `request` with a fresh context and returns its output with what was noted.
pub async fn with_request_context<F: Future>(request: F) -> (F::Output, RequestContext) {
    REQUEST
        .scope(RefCell::new(RequestContext::default()), async {
            let output = request.await;
            (
                output,
                REQUEST.with(|c| std::mem::take(&mut *c.borrow_mut())),
            )
        })
        .await
}

/// Notes the authenticated caller for the request log line.
pub fn note_caller(tenant: TenantId, subject: &str) {
    let _ = REQUEST.try_with(|c| {
        let mut c = c.borrow_mut();
        c.tenant = Some(tenant);
        c.subject = Some(subject.to_string());
    });
}

/// Notes how the idempotency guard decided the request.
pub fn note_outcome(outcome: &'static str) {
    let _ = REQUEST.try_with(|c| c.borrow_mut().outcome = Some(outcome));
}
