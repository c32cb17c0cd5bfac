//! The tenant: the one identity every read and write is scoped to.
//!
//! A leaf of its own because every layer carries it (the token yields it, the
//! idempotency scope, the orders and the outbox rows are keyed by it), while only a
//! verified token may produce one (see `auth`).

use serde::Serialize;
use uuid::Uuid;

/// The tenant every read and write is scoped to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct TenantId(pub Uuid);

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
