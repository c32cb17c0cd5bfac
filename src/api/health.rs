//! Liveness and readiness probes. Both stay cheap under any load: liveness touches
//! nothing, and readiness answers from a check at most [`READY_CHECK_AGE`] old, so a
//! flood of probes costs one database round trip per interval, not one per call.
//!
//! An identity provider that stops answering does not make the API unready once a key
//! set is held (unless `ORDERD_JWT_STALE_READINESS_SECS` asks for it): readiness is
//! every instance's at once, so it would turn the provider's outage into orderd's.
//! The set's age is told by a metric instead ([`report_key_set_age`]), which an alert
//! watches.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use poem::web::Data;
use poem_openapi::{ApiResponse, OpenApi, payload::PlainText};
use tokio_util::sync::CancellationToken;

use super::ApiTags;
use crate::{
    auth::{Verifier, jwks::Jwks},
    db::{self, Db},
    metrics,
    outbox::publisher::Publisher,
    service::Service,
    supervisor::{Every, First, Run, Schedule},
};

/// How old the database check behind `/readyz` may be.
pub const READY_CHECK_AGE: Duration = Duration::from_secs(1);

/// How often `jwks_key_set_age_seconds` is set from the key set.
pub const KEY_SET_AGE_EVERY: Duration = Duration::from_secs(5);

/// The last database check, shared by every `/readyz` of the process, and whether the
/// process is stopping.
#[derive(Default)]
pub struct Readiness {
    /// When the last check ran and whether the database answered. The lock is held
    /// while a stale check is redone, so concurrent probes wait for that one check
    /// instead of each running its own.
    last: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// Set once shutdown began: `/readyz` answers 503 from then on, so that load
    /// balancers take the instance out of rotation before its listener closes.
    stopping: AtomicBool,
}

impl Readiness {
    /// From now on `/readyz` answers 503 whatever the database says.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Whether the database answered at the last check, redoing it when stale.
    async fn database_answers(&self, db: &Db) -> bool {
        let mut last = self.last.lock().await;
        if let Some((at, answered)) = *last
            && at.elapsed() < READY_CHECK_AGE
        {
            return answered;
        }
        let answered = match db::ping(db).await {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(error = %why, "readiness probe failed");
                false
            }
        };
        *last = Some((Instant::now(), answered));
        answered
    }
}

pub struct HealthApi;

#[derive(ApiResponse)]
pub enum ReadyResponse {
    /// The database answers.
    #[oai(status = 200)]
    Ready(PlainText<&'static str>),
    /// The process is shutting down, the database does not answer, or tokens cannot be
    /// verified (a JWKS never fetched, or, where `ORDERD_JWT_STALE_READINESS_SECS` is
    /// set, one its provider has not confirmed for that long); take this instance out of
    /// rotation.
    #[oai(status = 503)]
    NotReady(PlainText<&'static str>),
}

#[OpenApi(tag = "ApiTags::Health")]
impl HealthApi {
    /// Liveness
    ///
    /// The process is alive.
    #[oai(path = "/healthz", method = "get", operation_id = "healthz")]
    async fn healthz(&self) -> PlainText<&'static str> {
        PlainText("ok")
    }

    /// Readiness
    ///
    /// The process can serve: its database is reachable and it can verify tokens.
    #[oai(path = "/readyz", method = "get", operation_id = "readyz")]
    async fn readyz(
        &self,
        service: Data<&Service>,
        verifier: Data<&Arc<Verifier>>,
        readiness: Data<&Arc<Readiness>>,
    ) -> ReadyResponse {
        if readiness.stopping() {
            return ReadyResponse::NotReady(PlainText("shutting down"));
        }
        if let Some(why) = verifier.not_ready() {
            return ReadyResponse::NotReady(PlainText(why));
        }
        if readiness.database_answers(service.db()).await {
            ReadyResponse::Ready(PlainText("ready"))
        } else {
            ReadyResponse::NotReady(PlainText("database unreachable"))
        }
    }
}

/// `GET /readyz` of `orderd relay` (on its metrics address): ready while its database
/// answers and its sink does (a Kafka broker that answered its metadata lately). The
/// API's `/readyz` does not ask the sink: a bus that is down never stops writes, which
/// the outbox keeps until it returns.
pub fn relay_readyz(db: Db, sink: Arc<dyn Publisher>) -> impl poem::Endpoint {
    let readiness = Arc::new(Readiness::default());
    poem::get(poem::endpoint::make(move |_| {
        let (db, sink, readiness) = (db.clone(), sink.clone(), readiness.clone());
        async move {
            let why = match sink.not_ready() {
                Some(why) => Some(why),
                None if readiness.database_answers(&db).await => None,
                None => Some("database unreachable"),
            };
            let (status, text) = match why {
                None => (poem::http::StatusCode::OK, "ready"),
                Some(why) => (poem::http::StatusCode::SERVICE_UNAVAILABLE, why),
            };
            poem::Response::builder()
                .status(status)
                .content_type("text/plain; charset=utf-8")
                .body(text)
        }
    }))
}

/// Sets `jwks_key_set_age_seconds` from `jwks` every [`KEY_SET_AGE_EVERY`] until
/// `shutdown`, so that the gauge grows while the provider is away, between the
/// refreshes that would confirm the set.
pub async fn report_key_set_age(jwks: Arc<Jwks>, shutdown: CancellationToken) {
    let every = Every {
        interval: KEY_SET_AGE_EVERY,
        first: First::Now,
        after_failure: None,
    };
    let mut schedule = Schedule::new("jwks age", every, shutdown);
    while schedule.next().await {
        metrics::jwks_key_set_age(jwks.age().as_secs_f64());
        schedule.ran(Run::Done);
    }
}
