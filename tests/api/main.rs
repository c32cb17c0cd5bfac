//! Integration tests: the real binary's code against a real PostgreSQL server, one
//! database per test, requests over real HTTP on loopback, moto as SNS.

mod support;

mod auth;
mod cli;
mod concurrency;
mod crash;
mod db_timeouts;
mod http_limits;
mod idempotency;
mod indexes;
mod jwks;
mod mcp;
mod observability;
mod openapi;
mod orders;
mod outbox;
mod pool;
mod purge;
mod reconcile;
mod replay_cache;
mod scale_out;
mod tenant_limits;
mod validation;
