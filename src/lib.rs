//! orderd: a multi-tenant order service whose writes are idempotent and whose changes
//! reach the message bus (SNS or Kafka) through a transactional outbox.
//!
//! Modules from the top down (`docs/architecture.md`; a test keeps imports pointing
//! down): `cli` and `app` compose; `api` is the transports (REST and MCP); `service`
//! is the application layer both call; `idempotency`, `orders` and `outbox` are the
//! core; `auth`, `retention`, `reconcile`, `lifecycle`, `erasure`, `citus` and
//! `supervisor` serve them; `db`, `telemetry`, `tenant`, `trace_context`, `metrics` and
//! `config` are leaves or near-leaves.

/// The HTTP surface: REST API, spec, problem mapping, probes, `/metrics`.
pub mod api;
/// Composition of the long-running processes.
pub mod app;
/// JWT verification and dev-token minting.
pub mod auth;
/// Moving an existing database onto a Citus cluster in place, and back.
pub mod citus;
/// The command line and the one-shot commands.
pub mod cli;
/// The machinery of typed settings from the environment; each module declares its own.
pub mod config;
/// The database: pools, the one executor, where the tables live (the layout), `LISTEN`
/// sessions, advisory locks and the embedded migrations.
pub mod db;
/// Tenants being erased: the mark in the database and what every process knows of it.
pub mod erasure;
#[doc(hidden)]
pub mod fuzzing;
/// The idempotency core: claim, lease, takeover, fenced completion, replay; stored
/// responses sealed at rest.
pub mod idempotency;
/// A tenant's data as a whole: exported, erased.
pub mod lifecycle;
/// Prometheus metric names, typed labels and recording.
pub mod metrics;
/// Orders: domain types and SQL.
pub mod orders;
/// The transactional outbox: event format, writer, relay, SNS and Kafka publishers.
pub mod outbox;
/// Reconciliation: every recent order has its event, every stored success its order.
pub mod reconcile;
/// Retention purges of idempotency records and published events.
pub mod retention;
/// The application layer: create, cancel, get and list, once, under REST and MCP.
pub mod service;
/// Background jobs under one cancellation token.
pub mod supervisor;
/// Logging and the per-request log context.
pub mod telemetry;
/// The tenant id.
pub mod tenant;
/// W3C trace context: what a caller sends, kept with the events its write causes.
pub mod trace_context;

pub use db::MIGRATOR;
