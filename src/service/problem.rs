//! The one error type of the application layer: a kind of problem and its details,
//! which both transports answer (REST as RFC 9457 `application/problem+json`, MCP as a
//! tool result whose text is the same object; `api::problem` gives each kind its slug,
//! title and status).
//!
//! Expected outcomes that a client must be able to tell apart (404, 409, 422, ...) are
//! problems with a slug. The typed errors of the layers below (authentication, the
//! idempotency guard, key parsing, the create rules, the database) are mapped here, in
//! one place. Unexpected failures become [`Problem::internal`], whose body says nothing
//! about the cause: the cause goes to the log, where an operator can read it, and never
//! to the client.

use crate::{
    auth::AuthError,
    idempotency::{GuardError, KeyError},
    orders::Invalid,
};

/// The `Retry-After` of a write refused during its tenant's erasure, in seconds: an
/// erasure takes seconds to minutes, paced.
pub const ERASURE_RETRY_AFTER_SECS: u64 = 5;

/// The wire format of a problem (also the OpenAPI schema of every error response):
/// `type`, `title` and `status` always, in that order; the others only when they say
/// something (never `null`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, poem_openapi::Object, PartialEq)]
#[oai(rename = "Problem", skip_serializing_if_is_none)]
pub struct ProblemDetails {
    /// A URI reference naming the kind of problem: `/problems/<slug>`.
    #[serde(rename = "type")]
    #[oai(rename = "type")]
    pub kind: String,
    /// Short, human-readable summary of the kind of problem.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// Explanation specific to this occurrence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The request path this occurrence concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Every field (or parameter, or header) at fault, for `validation-error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldError>>,
}

/// One invalid input.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, poem_openapi::Object, PartialEq)]
pub struct FieldError {
    /// The body field, query or path parameter, or header at fault, by name (`body` for
    /// the body as a whole).
    pub field: String,
    /// What is wrong with it, in plain words: missing, unknown, or the rule it breaks.
    pub message: String,
}

/// What went wrong, as the application layer knows it. The transports add kinds of
/// their own (a method not allowed, a body too large, ...: `api::problem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    IdempotencyKeyMissing,
    IdempotencyKeyInvalid,
    IdempotencyKeyReused,
    IdempotencyKeyInFlight,
    ValidationError,
    Unauthorized,
    Forbidden,
    NotFound,
    TenantErasureInProgress,
    ServiceUnavailable,
    InternalError,
}

impl Kind {
    /// The `type` slug and the title of each kind: the one table of them. Each
    /// transport gives a kind its status (`api::problem`), and the service stores a
    /// refusal with the status the transport's framing says (`Framing`).
    pub fn describe(self) -> (&'static str, &'static str) {
        match self {
            Kind::IdempotencyKeyMissing => (
                "idempotency-key-missing",
                "Idempotency-Key header is required",
            ),
            Kind::IdempotencyKeyInvalid => (
                "idempotency-key-invalid",
                "Idempotency-Key header is malformed",
            ),
            Kind::IdempotencyKeyReused => (
                "idempotency-key-reused",
                "Idempotency-Key was already used with another request",
            ),
            Kind::IdempotencyKeyInFlight => (
                "idempotency-key-in-flight",
                "A request with this Idempotency-Key is in progress",
            ),
            Kind::ValidationError => ("validation-error", "The request is invalid"),
            Kind::Unauthorized => ("unauthorized", "Authentication is required"),
            Kind::Forbidden => ("forbidden", "The token lacks the required scope"),
            Kind::NotFound => ("not-found", "Not found"),
            Kind::TenantErasureInProgress => (
                "tenant-erasure-in-progress",
                "The tenant's data is being erased",
            ),
            Kind::ServiceUnavailable => ("service-unavailable", "Service unavailable"),
            Kind::InternalError => ("internal-error", "Internal error"),
        }
    }
}

/// An expected refusal or an unexpected failure of an operation, for every transport.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {}", detail.as_deref().unwrap_or("no detail"))]
pub struct Problem {
    pub kind: Kind,
    pub detail: Option<String>,
    pub errors: Option<Vec<FieldError>>,
    /// Seconds a client should wait before it tries again, when that helps.
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            detail: None,
            errors: None,
            retry_after: None,
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn with_errors(mut self, errors: Vec<FieldError>) -> Self {
        self.errors = Some(errors);
        self
    }

    /// An unexpected failure. The cause is logged here, once, with its whole chain;
    /// the client sees only a generic body.
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        let cause = cause.into();
        tracing::error!(error = format!("{cause:#}"), "request failed");
        Self::new(Kind::InternalError)
    }

    pub fn unavailable(cause: impl Into<anyhow::Error>) -> Self {
        let cause = cause.into();
        tracing::warn!(error = format!("{cause:#}"), "dependency unavailable");
        Self::new(Kind::ServiceUnavailable)
    }

    /// 409: the tenant's data is being erased, so its writes are refused until that ends.
    pub fn erasing() -> Self {
        Self::new(Kind::TenantErasureInProgress)
            .with_detail(
                "this tenant's data is being erased; writes are refused until the erasure ends",
            )
            .with_retry_after(ERASURE_RETRY_AFTER_SECS)
    }

    /// The token is missing or does not verify.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(Kind::Unauthorized).with_detail(detail)
    }

    /// A `validation-error` naming every field at fault, in order.
    pub fn invalid(errors: Vec<FieldError>) -> Self {
        let detail = errors
            .iter()
            .map(|e| format!("`{}` {}", e.field, e.message))
            .collect::<Vec<_>>()
            .join("; ");
        Self::new(Kind::ValidationError)
            .with_detail(detail)
            .with_errors(errors)
    }

    /// The problem+json body with `status`, the transport's for this kind (REST's
    /// error body, MCP's refusal text, and the body of a refusal stored for replay).
    pub fn details(&self, status: u16) -> ProblemDetails {
        let (slug, title) = self.kind.describe();
        ProblemDetails {
            kind: format!("/problems/{slug}"),
            title: title.to_string(),
            status,
            detail: self.detail.clone(),
            instance: None,
            errors: self.errors.clone(),
        }
    }

    /// One field at fault.
    pub fn invalid_field(field: &str, message: &str) -> Self {
        Self::invalid(vec![FieldError {
            field: field.into(),
            message: message.into(),
        }])
    }
}

impl From<sqlx::Error> for Problem {
    fn from(err: sqlx::Error) -> Self {
        // SQLSTATEs that say "not now" rather than "never": a cancelled statement
        // (statement timeout), a transaction left idle too long, a lock not granted,
        // too many connections, a server shutting down, and the two that ask for the
        // transaction to be run again (a serialization failure, which Citus raises when
        // a split moved the tenant's rows after the statement was planned, and a
        // deadlock).
        const UNAVAILABLE: [&str; 8] = [
            "57014", "25P03", "55P03", "53300", "57P01", "57P03", "40001", "40P01",
        ];
        // Citus's answer, without a SQLSTATE of its own, when a statement names a shard
        // that a split or move has just replaced: it did nothing, and run again it is
        // planned for the shard that holds the rows now.
        const SHARD_REPLACED: &str = "could not find valid entry for shard";
        // Citus's answer, again without a SQLSTATE, when the worker holding the shard
        // failed during the `COMMIT`: whether it committed is unknown, an ambiguous
        // commit. The claim's completion is fenced into that same commit, so the retry
        // replays the answer if it did and runs once if it did not (found by the chaos
        // run: a worker stopped under load).
        const COMMIT_UNKNOWN: &str = "could not commit transaction for shard";
        // Class 08, a connection exception: on Citus, the coordinator could not reach
        // the worker holding the tenant's shard (stopped, restarting, cut off). Only
        // the tenants on that worker meet it, and their retries succeed once it is back.
        const CONNECTION_EXCEPTION: &str = "08";
        let transient = match &err {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                UNAVAILABLE.contains(&c.as_ref())
                    || c.starts_with(CONNECTION_EXCEPTION)
                    || (c == "XX000"
                        && (db.message().starts_with(SHARD_REPLACED)
                            || db.message().starts_with(COMMIT_UNKNOWN)))
            }),
            _ => false,
        };
        if transient {
            Problem::unavailable(err).with_retry_after(1)
        } else {
            Problem::internal(err)
        }
    }
}

impl From<KeyError> for Problem {
    fn from(err: KeyError) -> Self {
        let (kind, message) = match err {
            KeyError::Missing => (Kind::IdempotencyKeyMissing, "is required on every POST"),
            KeyError::Invalid => (
                Kind::IdempotencyKeyInvalid,
                "must be 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-', bare or in double quotes",
            ),
        };
        Problem::new(kind)
            .with_detail(err.to_string())
            .with_errors(vec![FieldError {
                field: "Idempotency-Key".into(),
                message: message.into(),
            }])
    }
}

impl From<AuthError> for Problem {
    fn from(err: AuthError) -> Self {
        match err {
            AuthError::InvalidToken(why) => Problem::unauthorized(why),
            AuthError::MissingScope(_) => {
                Problem::new(Kind::Forbidden).with_detail(err.to_string())
            }
        }
    }
}

impl From<GuardError<Problem>> for Problem {
    fn from(err: GuardError<Problem>) -> Self {
        match err {
            GuardError::KeyReused => Problem::new(Kind::IdempotencyKeyReused).with_detail(
                "this Idempotency-Key was already used with a different request; use a new key",
            ),
            GuardError::InFlight { retry_after } | GuardError::LeaseLost { retry_after } => {
                Problem::new(Kind::IdempotencyKeyInFlight)
                    .with_detail(
                        "a request with this Idempotency-Key is still being processed; retry shortly",
                    )
                    .with_retry_after(retry_after.as_secs().max(1))
            }
            GuardError::Operation(problem) => problem,
            GuardError::Db(e) => e.into(),
            // Logged with the key it needs where it was found; the client learns only
            // that the answer is unavailable, never a wrong or empty one.
            GuardError::Sealed(_) => Problem::new(Kind::ServiceUnavailable)
                .with_detail("the stored answer for this Idempotency-Key cannot be read now"),
            GuardError::TenantErasing => Problem::erasing(),
        }
    }
}

impl From<anyhow::Error> for Problem {
    fn from(err: anyhow::Error) -> Self {
        Problem::internal(err)
    }
}

impl From<Vec<Invalid>> for Problem {
    /// A create that breaks its rules: every field at fault, and a detail naming them.
    fn from(errors: Vec<Invalid>) -> Self {
        Problem::invalid(
            errors
                .into_iter()
                .map(|e| FieldError {
                    field: e.field,
                    message: e.message,
                })
                .collect(),
        )
    }
}
