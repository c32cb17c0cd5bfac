//! Faults that fail quietly: a connection whose packets are dropped without a word (no
//! reset, no error), on the way to PostgreSQL or on a listening session. Each test puts
//! the switchable proxy of `support::proxy` between orderd and the server, lets the
//! fault happen at the worst moment, and checks what clients see and what the database
//! holds afterwards.

/// A database that goes silent, a commit whose answer is lost, a pooler killed: every
/// request answers, none hangs, nothing doubles.
mod database;
/// A listening session that goes silent: nothing forgotten or erased is replayed.
mod listener;
/// A relay stopped between its claim and its publish: it publishes nothing stale.
mod relay;
/// A Citus worker that dies: only its own tenants notice.
mod worker;
