//! What one tenant, and all of them together, may use of this process.
//!
//! - A token bucket per tenant (GCRA, `governor`): a request over it is a 429
//!   `rate-limited` with `Retry-After` and the `RateLimit-Policy` / `RateLimit` fields
//!   of draft-ietf-httpapi-ratelimit-headers, decided right after authentication, so it
//!   never touches an idempotency record.
//! - A cap on each tenant's requests doing database work at once. A bucket alone lets
//!   a burst of concurrent requests fill the shared pool; with the cap, one tenant's
//!   flood queues on its own permits (briefly, then 429) while other tenants' requests
//!   still find connections.
//! - A cap on all requests in flight, shedding load with 503 before any authentication
//!   work (see `middleware::shed_load`).
//!
//! Memory stays bounded with many tenants: buckets indistinguishable from a full one
//! are forgotten every minute, and a tenant's permits are dropped when it has nothing
//! in flight.

use std::{
    collections::HashMap,
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::Duration,
};

use governor::{
    Quota, RateLimiter,
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::keyed::DefaultKeyedStateStore,
};
use poem::http::{HeaderName, HeaderValue, header};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::settings::TenantLimits;
use super::{
    problem::{Kind, Problem},
    routes::Route,
};
use crate::{
    metrics,
    supervisor::{Every, First, Run, Schedule},
    tenant::TenantId,
};

type Buckets = RateLimiter<
    TenantId,
    DefaultKeyedStateStore<TenantId>,
    DefaultClock,
    StateInformationMiddleware,
>;

/// How long a request waits for one of its tenant's database permits before a 429.
const PERMIT_WAIT: Duration = Duration::from_secs(2);

/// The per-tenant limits of this process.
pub struct TenantLimiter {
    buckets: Option<Buckets>,
    /// `q` and `w` of the `RateLimit-Policy` field: the bucket size and the seconds it
    /// takes to refill.
    policy: Option<(u32, u64)>,
    max_in_flight: u32,
    in_flight: Mutex<HashMap<TenantId, Arc<Semaphore>>>,
}

/// A tenant's admission: holds one of its database permits until dropped.
pub struct Admission {
    permit: Option<OwnedSemaphorePermit>,
    limiter: Arc<TenantLimiter>,
    tenant: TenantId,
}

impl Drop for Admission {
    fn drop(&mut self) {
        // The permit goes back first, so the tenant may be seen idle.
        drop(self.permit.take());
        self.limiter.forget_if_idle(self.tenant);
    }
}

impl TenantLimiter {
    pub fn new(limits: &TenantLimits) -> Self {
        let buckets = limits.rate_per_sec.and_then(|rate| {
            let quota = Quota::per_second(NonZeroU32::new(rate)?)
                .allow_burst(NonZeroU32::new(limits.burst.max(1))?);
            Some(RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>())
        });
        let policy = limits.rate_per_sec.map(|rate| {
            let burst = limits.burst.max(1);
            (burst, u64::from(burst).div_ceil(u64::from(rate.max(1))))
        });
        Self {
            buckets,
            policy,
            max_in_flight: limits.max_in_flight.max(1),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Admits one request of `tenant` on `route`, or answers why not (429).
    pub async fn admit(
        self: &Arc<Self>,
        tenant: TenantId,
        route: Route,
    ) -> Result<Admission, Problem> {
        if let Some(buckets) = &self.buckets
            && let Err(not_until) = buckets.check_key(&tenant)
        {
            let wait = not_until.wait_time_from(buckets.clock().now());
            metrics::rate_limited(route);
            return Err(self.limited(
                wait,
                "this tenant sends requests faster than its rate limit",
            ));
        }
        let permits = self.permits_of(tenant);
        match tokio::time::timeout(PERMIT_WAIT, permits.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Admission {
                permit: Some(permit),
                limiter: self.clone(),
                tenant,
            }),
            _ => {
                metrics::rate_limited(route);
                Err(self.limited(
                    Duration::from_secs(1),
                    "this tenant has too many requests in progress",
                ))
            }
        }
    }

    fn permits_of(&self, tenant: TenantId) -> Arc<Semaphore> {
        let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(tenant)
            .or_insert_with(|| Arc::new(Semaphore::new(self.max_in_flight as usize)))
            .clone()
    }

    /// Drops the tenant's permits once nothing of it is in flight or waiting.
    fn forget_if_idle(&self, tenant: TenantId) {
        let mut map = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(permits) = map.get(&tenant)
            && Arc::strong_count(permits) == 1
            && permits.available_permits() == self.max_in_flight as usize
        {
            map.remove(&tenant);
        }
    }

    /// Forgets buckets that are full again (indistinguishable from new ones).
    pub fn forget_full_buckets(&self) {
        if let Some(buckets) = &self.buckets {
            buckets.retain_recent();
            buckets.shrink_to_fit();
        }
    }

    /// Tenants with a bucket or permits in memory (for tests of the bound).
    pub fn tenants_in_memory(&self) -> (usize, usize) {
        let buckets = self.buckets.as_ref().map_or(0, |b| b.len());
        let permits = self.in_flight.lock().map_or(0, |m| m.len());
        (buckets, permits)
    }

    /// 429 with `Retry-After` and the rate-limit fields.
    fn limited(&self, wait: Duration, detail: &str) -> Problem {
        let retry_after = wait.as_secs_f64().ceil().max(1.0) as u64;
        let mut problem = Problem::new(Kind::RateLimited)
            .with_detail(detail)
            .with_header(header::RETRY_AFTER, HeaderValue::from(retry_after));
        if let Some((quota, window)) = self.policy {
            let policy = format!("\"tenant\";q={quota};w={window}");
            let state = format!("\"tenant\";r=0;t={retry_after}");
            for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    problem = problem.with_header(HeaderName::from_static(name), value);
                }
            }
        }
        problem
    }
}

/// Forgets full buckets every minute until `shutdown`.
pub async fn tidy(limiter: Arc<TenantLimiter>, shutdown: tokio_util::sync::CancellationToken) {
    let every = Every {
        interval: Duration::from_secs(60),
        first: First::AfterInterval,
        after_failure: None,
    };
    let mut schedule = Schedule::new("tenant limits", every, shutdown);
    while schedule.next().await {
        let turn = async {
            limiter.forget_full_buckets();
            Run::Done
        };
        let Some(run) = schedule.unless_shutdown(turn).await else {
            return;
        };
        schedule.ran(run);
    }
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn limiter(rate: u32, burst: u32, in_flight: u32) -> Arc<TenantLimiter> {
        Arc::new(TenantLimiter::new(&TenantLimits {
            rate_per_sec: Some(rate),
            burst,
            max_in_flight: in_flight,
        }))
    }

    #[tokio::test]
    async fn a_burst_passes_and_the_next_request_is_limited_with_the_fields() {
        let limiter = limiter(1, 3, 10);
        let tenant = TenantId(Uuid::new_v4());
        for _ in 0..3 {
            limiter.admit(tenant, Route::Orders).await.unwrap();
        }
        let problem = limiter.admit(tenant, Route::Orders).await.err().unwrap();
        assert_eq!(problem.kind, Kind::RateLimited);
        let header = |name: &str| {
            problem
                .headers
                .iter()
                .find(|(n, _)| n.as_str() == name)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        assert_eq!(header("retry-after").as_deref(), Some("1"));
        assert_eq!(
            header("ratelimit-policy").as_deref(),
            Some("\"tenant\";q=3;w=3")
        );
        assert_eq!(header("ratelimit").as_deref(), Some("\"tenant\";r=0;t=1"));
        // Another tenant has its own bucket.
        assert!(
            limiter
                .admit(TenantId(Uuid::new_v4()), Route::Orders)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn permits_are_per_tenant_and_forgotten_when_idle() {
        let limiter = limiter(1000, 1000, 1);
        let (a, b) = (TenantId(Uuid::new_v4()), TenantId(Uuid::new_v4()));
        let held = limiter.admit(a, Route::Orders).await.unwrap();
        assert!(limiter.admit(b, Route::Orders).await.is_ok());
        assert_eq!(
            limiter.tenants_in_memory().1,
            1,
            "b's permits went with b's request"
        );
        drop(held);
        assert_eq!(limiter.tenants_in_memory().1, 0);
    }
}
