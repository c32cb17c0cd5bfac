//! Every Prometheus metric of contract section 8: names, help texts, buckets, and the
//! one place that records them.
//!
//! Labels carry only bounded values (endpoint and route templates, outcomes, event
//! types, status codes, error classes): never a key, token, tenant or order id.

use std::sync::OnceLock;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::{idempotency::Outcome, outbox::store::Stats};

pub const IDEMPOTENCY_REQUESTS: &str = "idempotency_requests_total";
pub const OUTBOX_PENDING: &str = "outbox_pending_events";
pub const OUTBOX_OLDEST_AGE: &str = "outbox_oldest_pending_age_seconds";
pub const OUTBOX_DEAD: &str = "outbox_dead_events";
pub const OUTBOX_PUBLISHED: &str = "outbox_published_total";
pub const OUTBOX_FAILURES: &str = "outbox_publish_failures_total";
pub const OUTBOX_LAG: &str = "outbox_publish_lag_seconds";
pub const HTTP_REQUESTS: &str = "http_requests_total";
pub const HTTP_DURATION: &str = "http_request_duration_seconds";

/// The idempotent endpoints (the `endpoint` label).
pub const ENDPOINTS: [&str; 2] = ["POST /v1/orders", "POST /v1/orders/{id}/cancel"];
/// The event types (the `event_type` label).
pub const EVENT_TYPES: [&str; 2] = ["OrderCreated", "OrderCancelled"];
/// Error classes of [`crate::outbox::publisher::classify`] and the SNS publisher.
pub const FAILURE_REASONS: [&str; 11] = [
    "throttling",
    "kms_throttling",
    "server",
    "timeout",
    "network",
    "invalid_parameter",
    "not_found",
    "authorization",
    "kms",
    "other_client",
    "other_server",
];

/// HTTP latency buckets: a p99 in single-digit milliseconds needs resolution there.
const HTTP_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Commit-to-acknowledgement buckets: milliseconds with NOTIFY, up to minutes in an outage.
const LAG_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the process-wide recorder once (later calls, e.g. several apps in one test
/// process, share it), describes every metric and sets every known series to zero so
/// that dashboards and alerts never meet a missing series.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(HTTP_DURATION.into()), &HTTP_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(OUTBOX_LAG.into()), &LAG_BUCKETS)
                })
                .expect("bucket lists are non-empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            describe();
            zero();
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!(
        IDEMPOTENCY_REQUESTS,
        "Requests through the idempotency guard, by endpoint and how the guard decided"
    );
    describe_gauge!(
        OUTBOX_PENDING,
        "Outbox events not yet published (including those backing off)"
    );
    describe_gauge!(
        OUTBOX_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest pending outbox event; 0 when none is pending"
    );
    describe_gauge!(
        OUTBOX_DEAD,
        "Outbox events that failed for good and wait for an operator's re-drive"
    );
    describe_counter!(OUTBOX_PUBLISHED, "Events acknowledged by SNS");
    describe_counter!(OUTBOX_FAILURES, "Failed publishes, by error class");
    describe_histogram!(
        OUTBOX_LAG,
        Unit::Seconds,
        "Time from an event's commit to its SNS acknowledgement"
    );
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests by method, route template and status"
    );
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "HTTP request latency by method and route template"
    );
}

fn zero() {
    for endpoint in ENDPOINTS {
        for outcome in Outcome::ALL {
            counter!(IDEMPOTENCY_REQUESTS, "endpoint" => endpoint, "outcome" => outcome.as_str())
                .absolute(0);
        }
    }
    for event_type in EVENT_TYPES {
        counter!(OUTBOX_PUBLISHED, "event_type" => event_type).absolute(0);
    }
    for reason in FAILURE_REASONS {
        counter!(OUTBOX_FAILURES, "reason" => reason).absolute(0);
    }
    gauge!(OUTBOX_PENDING).set(0.0);
    gauge!(OUTBOX_OLDEST_AGE).set(0.0);
    gauge!(OUTBOX_DEAD).set(0.0);
    // Registering the histograms makes them (empty) part of every scrape.
    let _ = histogram!(OUTBOX_LAG);
}

pub fn idempotency_outcome(endpoint: &'static str, outcome: Outcome) {
    counter!(IDEMPOTENCY_REQUESTS, "endpoint" => endpoint, "outcome" => outcome.as_str())
        .increment(1);
}

pub fn published(event_type: &str, lag_secs: f64) {
    // Only the contract's event types become label values.
    let event_type = EVENT_TYPES
        .into_iter()
        .find(|t| *t == event_type)
        .unwrap_or("other");
    counter!(OUTBOX_PUBLISHED, "event_type" => event_type).increment(1);
    histogram!(OUTBOX_LAG).record(lag_secs.max(0.0));
}

pub fn publish_failure(reason: &'static str) {
    counter!(OUTBOX_FAILURES, "reason" => reason).increment(1);
}

pub fn outbox_stats(stats: Stats) {
    gauge!(OUTBOX_PENDING).set(stats.pending as f64);
    gauge!(OUTBOX_OLDEST_AGE).set(stats.oldest_pending_age_secs);
    gauge!(OUTBOX_DEAD).set(stats.dead as f64);
}

pub fn http_request(method: &str, route: &'static str, status: u16, seconds: f64) {
    let method = match method {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "OTHER",
    };
    counter!(HTTP_REQUESTS, "method" => method, "route" => route, "status" => status.to_string())
        .increment(1);
    histogram!(HTTP_DURATION, "method" => method, "route" => route).record(seconds);
}

/// The route template of a path: one label value per route, `unmatched` for the rest.
pub fn route_template(path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match segments.as_slice() {
        ["v1", "orders"] => "/v1/orders",
        ["v1", "orders", _] => "/v1/orders/{id}",
        ["v1", "orders", _, "cancel"] => "/v1/orders/{id}/cancel",
        ["healthz"] => "/healthz",
        ["readyz"] => "/readyz",
        ["metrics"] => "/metrics",
        ["openapi.json"] => "/openapi.json",
        ["openapi.yaml"] => "/openapi.yaml",
        ["docs", ..] => "/docs",
        _ => "unmatched",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_a_bounded_set_of_templates() {
        assert_eq!(route_template("/v1/orders"), "/v1/orders");
        assert_eq!(
            route_template("/v1/orders/0192f0e4-7c1a-7cc0-8f5e-1d2b3c4d5e6f"),
            "/v1/orders/{id}"
        );
        assert_eq!(
            route_template("/v1/orders/abc/cancel"),
            "/v1/orders/{id}/cancel"
        );
        assert_eq!(route_template("/docs/swagger-ui.css"), "/docs");
        assert_eq!(route_template("/v1/orders/abc/cancel/extra"), "unmatched");
        assert_eq!(route_template("/wp-admin/install.php"), "unmatched");
    }
}
