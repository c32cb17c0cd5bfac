//! Integration tests: the real binary's code against a real PostgreSQL server, one
//! database per test, requests over real HTTP on loopback, moto as SNS. One folder per
//! part of the service; `support/` is the harness they share.

mod support;

/// The transports: REST and MCP, authentication, validation, the spec, the edge.
mod api;
/// The database underneath: pools, query plans, timeouts, crashes, several processes,
/// purges.
mod database;
/// Faults that fail quietly: silent networks.
mod faults;
/// The idempotency guarantees: keys, races, the replay cache.
mod idempotency;
/// Operators' tools: the command line, reconciliation, metrics and traces.
mod operations;
/// The relay and what reaches SNS.
mod outbox;
