//! Integration tests: the real binary's code against a real PostgreSQL server, one
//! database per test, requests over real HTTP on loopback.

mod helpers;

mod auth;
mod cli;
mod concurrency;
mod crash;
mod idempotency;
mod indexes;
mod observability;
mod openapi;
mod orders;
mod outbox;
mod proxy;
mod purge;
mod sns;
mod validation;
