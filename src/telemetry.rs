//! Logging and tracing set-up, and the per-request context that the request log line
//! reports.
//!
//! Logs go to stderr so that commands whose stdout is their product (`orderd token`,
//! `orderd openapi`) stay pipeable.
//!
//! Traces are OpenTelemetry's, exported over OTLP/HTTP when the SDK's standard variables
//! name an endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT`; the
//! sampler, service name and batch settings come from `OTEL_*` too). Spans are made
//! under the target [`SPANS`], which the log lines never show; without an endpoint no
//! layer wants that target, so `tracing` disables those spans at their call sites and
//! they cost nothing. The batch processor exports from a thread of its own with a
//! blocking HTTP client (no Tokio runtime needed there); [`flush`] shuts it down off
//! the async threads at the end of the process.

use std::{cell::RefCell, fmt::Write, sync::OnceLock};

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::field::{Field, Visit};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{
    EnvFilter, Layer,
    field::{MakeExt, MakeVisitor, VisitFmt, VisitOutput},
    filter::{LevelFilter, Targets},
    fmt::{self, format::Writer},
    layer::SubscriberExt,
    util::SubscriberInitExt,
};

use crate::config::{Kind, parse, settings};
use crate::{tenant::TenantId, trace_context::TraceContext};

settings! {
    /// How log lines are written.
    pub struct LogConfig {
        /// One JSON object per line, instead of text.
        json: bool = parse::last_choice [LOG_FORMAT, "ORDERD_LOG_FORMAT", Some("text"), Kind::Choice(&["text", "json"]), "`json` for one JSON object per log line"],
    }
}

/// The `tracing` target of every span meant for OpenTelemetry.
pub const SPANS: &str = "orderd::spans";

/// The provider, kept so that [`flush`] can shut it down (the tracing layer holds only
/// a tracer, and dropping that exports nothing).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Installs the global subscriber; `RUST_LOG` overrides the default filter.
pub fn init(json: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    // Colour only for a person at a terminal; files and pipes get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    // JSON escapes every string itself; text lines go through `TextFields`, so that no
    // value a client chose (a tool name, a subject, an error naming its input) can end
    // a line and start a forged one, or add a field to it.
    let lines = if json {
        lines.json().boxed()
    } else {
        lines.fmt_fields(TextFields.delimited(" ")).boxed()
    };
    // Static per-target filters (not closures), so that `tracing` decides once per call
    // site: without an exporter, a span of [`SPANS`] is disabled where it is written.
    let lines = lines.with_filter(
        Targets::new()
            .with_default(LevelFilter::TRACE)
            .with_target(SPANS, LevelFilter::OFF),
    );
    let traces = tracer_provider().map(|provider| {
        let tracer = provider.tracer("orderd");
        let _ = PROVIDER.set(provider);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(Targets::new().with_target(SPANS, LevelFilter::TRACE))
    });
    // A second init (tests spawning several apps) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(traces)
        .try_init();
}

/// The OTLP/HTTP exporter's provider, when the environment names an endpoint.
fn tracer_provider() -> Option<SdkTracerProvider> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    if disabled
        || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    {
        return None;
    }
    // The blocking HTTP client starts a runtime of its own, which cannot happen on a
    // Tokio worker: build it on a plain thread.
    let exporter = std::thread::spawn(|| {
        opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
    })
    .join()
    .ok()?;
    match exporter {
        Ok(exporter) => Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(opentelemetry_sdk::Resource::builder().build())
                .build(),
        ),
        Err(e) => {
            eprintln!("orderd: OpenTelemetry export is off: {e}");
            None
        }
    }
}

/// Exports the spans still buffered and stops the exporter, on a plain thread (its
/// shutdown blocks).
pub async fn flush() {
    if let Some(provider) = PROVIDER.get() {
        let provider = provider.clone();
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    }
}

/// Makes `span` continue the caller's trace, when the request carried a valid context.
pub fn continue_trace(span: &tracing::Span, trace: Option<&TraceContext>) {
    if let Some(context) = trace.and_then(TraceContext::span_context) {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(context));
    }
}

/// The OpenTelemetry context of `span`, when tracing is on and the span is recorded.
fn own_context(span: &tracing::Span) -> Option<opentelemetry::trace::SpanContext> {
    let context = span.context();
    let own = context.span().span_context().clone();
    own.is_valid().then_some(own)
}

/// The trace context a write keeps with its events: the caller's (as the request
/// middleware parsed it), when the request carried a valid one; else that of the
/// request's own span, when tracing is on.
pub fn request_trace(caller: Option<&TraceContext>) -> Option<TraceContext> {
    caller.cloned().or_else(|| {
        own_context(&tracing::Span::current()).map(|own| TraceContext {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                own.trace_id(),
                own.span_id(),
                own.trace_flags().to_u8()
            ),
            tracestate: Some(own.trace_state().header()).filter(|s| !s.is_empty()),
        })
    })
}

/// The trace and span ids of `span` for a log line: its OpenTelemetry ones when tracing
/// is on, else the caller's trace id (and no span id).
pub fn trace_ids(
    span: &tracing::Span,
    trace: Option<&TraceContext>,
) -> (Option<String>, Option<String>) {
    match own_context(span) {
        Some(own) => (
            Some(own.trace_id().to_string()),
            Some(own.span_id().to_string()),
        ),
        None => (trace.map(|t| t.trace_id().to_string()), None),
    }
}

/// How the fields of a text log line are written: `name=value`, each value one token
/// that a reader splitting the line on spaces and `=` reads back whole.
///
/// - A string (`field = value`) is quoted, with `"`, `\` and control characters
///   escaped, as `Debug` writes it.
/// - Anything else (a number, `field = %display`) is written as it is when it is a
///   single word: no space, no `=`, no quote, no backslash, no control character (a
///   number, a UUID, an address). Otherwise it is quoted as a string is. A tool name is
///   recorded with `%`, and a client can name a tool `x tenant=<uuid> status=200`:
///   written bare, that adds a tenant and a status to the line.
/// - The message is written alone, its control characters escaped.
///
/// A value recorded with `?` is quoted as `Debug` writes it, and quoted again when that
/// holds a space: record strings as strings.
struct TextFields;

impl<'w> MakeVisitor<Writer<'w>> for TextFields {
    type Visitor = TextFieldVisitor<'w>;

    fn make_visitor(&self, writer: Writer<'w>) -> Self::Visitor {
        TextFieldVisitor {
            writer,
            result: Ok(()),
        }
    }
}

/// Writes the fields of one line (see [`TextFields`]).
struct TextFieldVisitor<'w> {
    writer: Writer<'w>,
    result: std::fmt::Result,
}

impl TextFieldVisitor<'_> {
    /// Writes `text` to the line, unless an earlier write failed.
    fn write(&mut self, text: std::fmt::Arguments<'_>) {
        if self.result.is_ok() {
            self.result = self.writer.write_fmt(text);
        }
    }
}

impl Visit for TextFieldVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(format_args!("{}={value:?}", field.name()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let (name, text) = (field.name(), format!("{value:?}"));
        if name == "message" {
            self.write(format_args!("{}", escape_controls(&text)));
        } else if is_one_word(&text) {
            self.write(format_args!("{name}={text}"));
        } else {
            self.write(format_args!("{name}={text:?}"));
        }
    }
}

impl VisitOutput<std::fmt::Result> for TextFieldVisitor<'_> {
    fn finish(self) -> std::fmt::Result {
        self.result
    }
}

impl VisitFmt for TextFieldVisitor<'_> {
    fn writer(&mut self) -> &mut dyn std::fmt::Write {
        &mut self.writer
    }
}

/// Whether `text` reads back as one value when written bare on a text line.
fn is_one_word(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && !matches!(c, '"' | '=' | '\\'))
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
    // The guard decides inside the service's idempotency span.
    tracing::Span::current().record("idempotency.outcome", outcome);
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

    /// Where a test's subscriber writes its lines.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `event` writes as a text line.
    fn text_line(event: impl FnOnce()) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .fmt_fields(TextFields.delimited(" "))
            .finish();
        tracing::subscriber::with_default(subscriber, event);
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_value_holding_spaces_equals_signs_or_quotes_is_one_quoted_field() {
        let tool = "x tenant=5b9f2c1e-0000-4000-8000-000000000000 status=200 \"a\" \\";
        let tenant = uuid::Uuid::nil();
        let line = text_line(|| {
            tracing::info!(
                tool = %tool,
                sub = "app status=200",
                tenant = %tenant,
                status = 404u16,
                address = %"127.0.0.1:8080",
                "tool call"
            )
        });
        assert!(
            line.contains(
                r#" tool call tool="x tenant=5b9f2c1e-0000-4000-8000-000000000000 status=200 \"a\" \\" sub="app status=200" tenant=00000000-0000-0000-0000-000000000000 status=404 address=127.0.0.1:8080"#
            ),
            "{line}"
        );
        let forged = text_line(|| tracing::info!(tool = %"list_orders\nFORGED-LINE", "tool call"));
        assert!(
            forged.contains(r#"tool="list_orders\nFORGED-LINE""#),
            "{forged}"
        );
        assert_eq!(forged.lines().count(), 1, "{forged}");
    }
}
