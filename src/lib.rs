//! orderd: a multi-tenant order service whose writes are idempotent and whose changes
//! reach SNS through a transactional outbox.

/// The HTTP API (poem-openapi): parsing, authentication, problem mapping.
pub mod api;
/// Assembling and running the HTTP application with graceful shutdown.
pub mod app;
/// JWT verification and dev-token minting.
pub mod auth;
/// The command line.
pub mod cli;
/// Typed settings from the environment.
pub mod config;
/// Connection pool and embedded migrations.
pub mod db;
/// The idempotency guard: claim, lease, takeover, fenced completion, replay.
pub mod idempotency;
/// Retention purge of idempotency records.
pub mod maintenance;
/// Prometheus metric names, help texts and recording.
pub mod metrics;
/// Orders: domain types and SQL.
pub mod orders;
/// The transactional outbox.
pub mod outbox;
/// The one error type, rendered as problem+json.
pub mod problem;
/// Logging and outcome recording.
pub mod telemetry;

pub use db::MIGRATOR;
