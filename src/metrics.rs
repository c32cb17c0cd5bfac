//! Every Prometheus metric of the service: names, help texts, buckets, the typed label
//! values, and the one place that records them.
//!
//! This module is a leaf: it imports nothing from the rest of the crate, and it holds
//! no domain types. The label values belong to the modules whose concepts they are
//! (`service::Operation`, `idempotency::Outcome`, `outbox::EventType`,
//! `outbox::FailureReason`, `api::routes::Route`), declared with [`label_enum!`];
//! recording takes them through [`Label`]. Labels carry only bounded values (endpoints,
//! route templates, outcomes, event types, status codes, error classes): never a key,
//! token, tenant or order id.

use std::sync::OnceLock;

use metrics::{
    Counter, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const IDEMPOTENCY_REQUESTS: &str = "idempotency_requests_total";
pub const OUTBOX_PENDING: &str = "outbox_pending_events";
pub const OUTBOX_OLDEST_AGE: &str = "outbox_oldest_pending_age_seconds";
pub const OUTBOX_DEAD: &str = "outbox_dead_events";
pub const OUTBOX_UNREADABLE_SHARDS: &str = "outbox_unreadable_shards";
pub const OUTBOX_PUBLISHED: &str = "outbox_published_total";
pub const OUTBOX_FAILURES: &str = "outbox_publish_failures_total";
pub const OUTBOX_LAG: &str = "outbox_publish_lag_seconds";
pub const OUTBOX_CLAIM_DURATION: &str = "outbox_claim_duration_seconds";
pub const HTTP_REQUESTS: &str = "http_requests_total";
pub const HTTP_DURATION: &str = "http_request_duration_seconds";
pub const RATE_LIMITED: &str = "rate_limited_requests_total";
pub const RECONCILE_ORDERS: &str = "reconcile_orders_without_event";
pub const RECONCILE_KEYS: &str = "reconcile_keys_without_order";
pub const RECONCILE_LAST_RUN: &str = "reconcile_last_run_timestamp_seconds";
pub const JOB_RUNS: &str = "background_job_runs_total";
pub const REPLAY_CACHE_DROPS: &str = "idempotency_replay_cache_drops_total";
pub const DB_ROUTES: &str = "db_tenant_routes_total";
pub const JWKS_KEY_SET_AGE: &str = "jwks_key_set_age_seconds";
/// Where a tenant's transaction went on a distributed database: to the node that
/// holds its shard, or through the coordinator (routing off, the node down, its
/// route not known), which forwards it.
pub const DB_ROUTE_KINDS: [&str; 2] = ["node", "coordinator"];

/// A bounded set of label values with one spelling each, owned by the module whose
/// concept it is (an endpoint, an outcome, an event type, a route). `ALL` lets the
/// composing layer export every series at zero from start-up.
pub trait Label: Copy + 'static {
    /// Every value, for zero-initialisation and exhaustive tests.
    const ALL: &'static [Self];

    /// The label value.
    fn as_str(self) -> &'static str;

    /// Every spelling, in declaration order.
    fn spellings() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.as_str()).collect()
    }
}

/// Declares an enum whose values have one fixed spelling (a label value, and where the
/// type is stored, the database spelling), with `ALL`, `as_str`, `parse` and
/// [`Label`]. The owning module declares it; this module only records it.
macro_rules! label_enum {
    ($(#[$meta:meta])* $vis:vis $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, for zero-initialisation and exhaustive tests.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The fixed spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value spelled `text`, if any.
            pub fn parse(text: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == text)
            }
        }

        impl $crate::metrics::Label for $name {
            const ALL: &'static [$name] = $name::ALL;

            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use label_enum;

/// The label values each labelled metric is exported with at zero from start-up,
/// gathered by the composing layer from the modules that own them.
#[derive(Debug, Default, Clone)]
pub struct KnownLabels {
    /// `idempotency_requests_total{endpoint}`.
    pub endpoints: Vec<&'static str>,
    /// `idempotency_requests_total{outcome}`.
    pub outcomes: Vec<&'static str>,
    /// `outbox_published_total{event_type}`.
    pub event_types: Vec<&'static str>,
    /// `outbox_publish_failures_total{reason}`.
    pub failure_reasons: Vec<&'static str>,
    /// `rate_limited_requests_total{route}`.
    pub routes: Vec<&'static str>,
}

/// HTTP latency buckets: a p99 in single-digit milliseconds needs resolution there.
const HTTP_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// Commit-to-acknowledgement buckets: milliseconds with NOTIFY, up to minutes in an outage.
const LAG_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Claim buckets: a claim round's target is tens of milliseconds; its statement timeout
/// is seconds.
const CLAIM_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The process-wide recorder's handle, once installed.
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often [`drain_histograms`] should run: the exporter's own default for the
/// upkeep task it spawns when it runs its own listener (orderd serves `/metrics` itself).
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds the observations recorded since the last call into the histograms' buckets.
///
/// The exporter keeps every raw observation of a histogram until then (eight bytes
/// each), and without a listener of its own it never does this by itself: a process
/// nobody scraped grew by about 20 MiB in a minute of 40,000 requests per second, and
/// without bound after that. So every long-running process calls this every
/// [`UPKEEP_INTERVAL`], scraped or not. Does nothing before the recorder is installed.
pub fn drain_histograms() {
    if let Some(handle) = HANDLE.get() {
        handle.run_upkeep();
    }
}

/// Installs the process-wide recorder once (later calls, e.g. several apps in one test
/// process, share it), describes every metric and sets every known series to zero so
/// that dashboards and alerts never meet a missing series.
pub fn install(known: &KnownLabels) -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(HTTP_DURATION.into()), &HTTP_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(OUTBOX_LAG.into()), &LAG_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(OUTBOX_CLAIM_DURATION.into()),
                        &CLAIM_BUCKETS,
                    )
                })
                .expect("bucket lists are non-empty")
                .install_recorder()
                .expect("no other metrics recorder is installed");
            describe();
            zero(known);
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
    describe_gauge!(
        OUTBOX_UNREADABLE_SHARDS,
        "Shards of a distributed outbox the other outbox gauges leave out, their worker not answering; 0 on one server"
    );
    describe_counter!(OUTBOX_PUBLISHED, "Events acknowledged by the bus");
    describe_counter!(OUTBOX_FAILURES, "Failed publishes, by error class");
    describe_histogram!(
        OUTBOX_LAG,
        Unit::Seconds,
        "Time from an event's commit to the bus's acknowledgement"
    );
    describe_histogram!(
        OUTBOX_CLAIM_DURATION,
        Unit::Seconds,
        "Database time of one relay round's claim: finding the tenants with due events, claiming each one's share and parking what must wait"
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
    describe_counter!(
        RATE_LIMITED,
        "Requests refused by a tenant's rate or in-flight limit, by route template"
    );
    describe_gauge!(
        RECONCILE_ORDERS,
        "Orders changed within the outbox retention whose current state has no event, at the last reconciliation"
    );
    describe_gauge!(
        RECONCILE_KEYS,
        "Completed idempotency keys whose stored success names a missing order, at the last reconciliation"
    );
    describe_counter!(
        JOB_RUNS,
        "Runs of the periodic background jobs, by job and outcome (ok, failed, or skipped while another process holds the job's lock)"
    );
    describe_counter!(
        REPLAY_CACHE_DROPS,
        "What this process dropped from its replay cache on hearing that stored answers were forgotten: one key (`key`), or everything (`all`: a tenant's erasure, or the listening session established or lost)"
    );
    describe_counter!(
        DB_ROUTES,
        "Tenant requests on a distributed database (one per request, its claim and its write together), by where their transactions were sent: `node` (the node that holds the tenant's shard) or `coordinator` (forwarded from there: routing off, the node down or its route not yet known); none on one server"
    );
    describe_gauge!(
        JWKS_KEY_SET_AGE,
        Unit::Seconds,
        "Time since the identity provider last confirmed the JSON Web Key Set that verifies tokens (since start while it never has); the cached keys keep verifying meanwhile, including keys the provider withdrew; 0 where tokens are not verified against a key set"
    );
    describe_gauge!(
        RECONCILE_LAST_RUN,
        Unit::Seconds,
        "Unix time the last reconciliation pass of this process finished; 0 before the first"
    );
}

fn zero(known: &KnownLabels) {
    let mut outcomes = Vec::new();
    for &endpoint in &known.endpoints {
        for &outcome in &known.outcomes {
            let counter =
                counter!(IDEMPOTENCY_REQUESTS, "endpoint" => endpoint, "outcome" => outcome);
            counter.absolute(0);
            outcomes.push((endpoint, outcome, counter));
        }
    }
    let _ = OUTCOME_COUNTERS.set(outcomes);
    for &event_type in &known.event_types {
        counter!(OUTBOX_PUBLISHED, "event_type" => event_type).absolute(0);
    }
    for &reason in &known.failure_reasons {
        counter!(OUTBOX_FAILURES, "reason" => reason).absolute(0);
    }
    for &route in &known.routes {
        counter!(RATE_LIMITED, "route" => route).absolute(0);
    }
    for what in REPLAY_CACHE_DROP_KINDS {
        counter!(REPLAY_CACHE_DROPS, "what" => what).absolute(0);
    }
    for route in DB_ROUTE_KINDS {
        counter!(DB_ROUTES, "route" => route).absolute(0);
    }
    gauge!(OUTBOX_PENDING).set(0.0);
    gauge!(OUTBOX_OLDEST_AGE).set(0.0);
    gauge!(OUTBOX_DEAD).set(0.0);
    gauge!(OUTBOX_UNREADABLE_SHARDS).set(0.0);
    gauge!(RECONCILE_ORDERS).set(0.0);
    gauge!(RECONCILE_KEYS).set(0.0);
    gauge!(RECONCILE_LAST_RUN).set(0.0);
    gauge!(JWKS_KEY_SET_AGE).set(0.0);
    // Registering the histograms makes them (empty) part of every scrape.
    let _ = histogram!(OUTBOX_LAG);
}

/// The handles of every known `idempotency_requests_total` series, kept from when they
/// were set to zero: every guarded request counts one, and finding its handle here costs
/// a few comparisons where registering it again built and looked up its labelled key
/// (about a twentieth of a cached replay's own work in its profile).
static OUTCOME_COUNTERS: OnceLock<Vec<(&'static str, &'static str, Counter)>> = OnceLock::new();

pub fn idempotency_outcome(endpoint: &'static str, outcome: impl Label) {
    let outcome = outcome.as_str();
    let known = OUTCOME_COUNTERS.get().and_then(|counters| {
        counters
            .iter()
            .find(|(e, o, _)| *e == endpoint && *o == outcome)
    });
    match known {
        Some((_, _, counter)) => counter.increment(1),
        None => counter!(IDEMPOTENCY_REQUESTS, "endpoint" => endpoint, "outcome" => outcome)
            .increment(1),
    }
}

pub fn published(event_type: impl Label, lag_secs: f64) {
    counter!(OUTBOX_PUBLISHED, "event_type" => event_type.as_str()).increment(1);
    histogram!(OUTBOX_LAG).record(lag_secs.max(0.0));
}

/// The database time of one relay round's claim, committed or not.
pub fn claim_duration(seconds: f64) {
    histogram!(OUTBOX_CLAIM_DURATION).record(seconds);
}

pub fn publish_failure(reason: impl Label) {
    counter!(OUTBOX_FAILURES, "reason" => reason.as_str()).increment(1);
}

/// The values of `idempotency_replay_cache_drops_total{what}`.
const REPLAY_CACHE_DROP_KINDS: [&str; 2] = ["key", "all"];

/// This process dropped one key (`all` false) or everything from its replay cache.
pub fn replay_cache_dropped(all: bool) {
    let what = REPLAY_CACHE_DROP_KINDS[usize::from(all)];
    counter!(REPLAY_CACHE_DROPS, "what" => what).increment(1);
}

/// One run of a periodic background job (`job` is its fixed name; `outcome` is `ok`,
/// `failed`, or `skipped` when another process holds the job's lock).
pub fn job_run(job: &'static str, outcome: &'static str) {
    counter!(JOB_RUNS, "job" => job, "outcome" => outcome).increment(1);
}

/// A tenant's transaction sent to `route` (one of [`DB_ROUTE_KINDS`]).
pub fn db_route(route: &'static str) {
    counter!(DB_ROUTES, "route" => route).increment(1);
}

pub fn rate_limited(route: impl Label) {
    counter!(RATE_LIMITED, "route" => route.as_str()).increment(1);
}

/// The outbox backlog gauges.
/// The outbox as the gauges read it; on a distributed database, without the
/// `unreadable_shards` whose worker did not answer.
pub fn outbox_backlog(
    pending: i64,
    oldest_pending_age_secs: f64,
    dead: i64,
    unreadable_shards: u64,
) {
    gauge!(OUTBOX_PENDING).set(pending as f64);
    gauge!(OUTBOX_OLDEST_AGE).set(oldest_pending_age_secs);
    gauge!(OUTBOX_DEAD).set(dead as f64);
    gauge!(OUTBOX_UNREADABLE_SHARDS).set(unreadable_shards as f64);
}

/// How long ago the identity provider last confirmed the key set tokens are verified
/// with.
pub fn jwks_key_set_age(seconds: f64) {
    gauge!(JWKS_KEY_SET_AGE).set(seconds);
}

/// The outcome of a reconciliation pass that finished at `now` (Unix seconds).
pub fn reconciled(orders_without_event: u64, keys_without_order: u64, now: f64) {
    gauge!(RECONCILE_ORDERS).set(orders_without_event as f64);
    gauge!(RECONCILE_KEYS).set(keys_without_order as f64);
    gauge!(RECONCILE_LAST_RUN).set(now);
}

pub fn http_request(method: &str, route: impl Label, status: u16, seconds: f64) {
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
    let route = route.as_str();
    counter!(HTTP_REQUESTS, "method" => method, "route" => route, "status" => status.to_string())
        .increment(1);
    histogram!(HTTP_DURATION, "method" => method, "route" => route).record(seconds);
}
