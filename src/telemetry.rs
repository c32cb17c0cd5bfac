//! Logging set-up and the per-request context that the request log line reports.
//!
//! Logs go to stderr so that commands whose stdout is their product (`orderd token`,
//! `orderd openapi`) stay pipeable.

use std::{cell::RefCell, fmt::Write};

use tracing_subscriber::{
    EnvFilter,
    field::MakeExt,
    fmt::{self, format::debug_fn},
};

use crate::tenant::TenantId;

/// Installs the global subscriber; `RUST_LOG` overrides the default filter.
pub fn init(json: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colour only for a person at a terminal; files and pipes get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // A second init (tests spawning several apps) keeps the first subscriber. JSON
    // escapes every string itself; text lines go through `escaped_field`, so that no
    // value a client chose (a tool name, a subject, an error naming its input) can end
    // a line and start a forged one.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder
            .fmt_fields(debug_fn(escaped_field).delimited(" "))
            .try_init()
    };
}

/// One field of a text log line, `name=value` (the message alone), with every control
/// character of the value escaped.
fn escaped_field(
    writer: &mut fmt::format::Writer<'_>,
    field: &tracing::field::Field,
    value: &dyn std::fmt::Debug,
) -> std::fmt::Result {
    if field.name() != "message" {
        write!(writer, "{}=", field.name())?;
    }
    write!(writer, "{}", escape_controls(&format!("{value:?}")))
}

/// `text` with its control characters (C0, DEL and C1) written as escapes, so that it
/// stays on one line and cannot steer a terminal.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_a_text_line_as_they_are() {
        assert_eq!(
            escape_controls("list_orders\nFORGED-LINE level=ERROR\r\u{1b}[31m\u{85}"),
            "list_orders\\nFORGED-LINE level=ERROR\\r\\u{1b}[31m\\u{85}"
        );
        assert_eq!(escape_controls("café 😀 ok"), "café 😀 ok");
    }
}
