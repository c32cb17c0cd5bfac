//! What the idempotency table holds for a key, as plain values: read by the store,
//! judged by the pure state machine (`decide`), replayed to clients. Neither of those
//! two modules owns these types, so neither imports the other.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A stored response, replayed byte for byte: what the first execution answered.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    pub status: u16,
    pub location: Option<String>,
    pub content_type: Option<String>,
    pub body: bytes::Bytes,
    /// The resource the answer names (an order's id), stored in clear beside a body
    /// that may be sealed, so that an audit can find it without opening the body.
    pub resource: Option<Uuid>,
}

/// A record as stored, with the database clock at the moment it was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The fingerprint of the request that claimed (or completed) the key.
    pub fingerprint: Vec<u8>,
    pub state: State,
    /// `clock_timestamp()` when the row was read: leases and expiry are judged on the
    /// database's clock, never on this process's.
    pub read_at: DateTime<Utc>,
}

impl Record {
    /// The one lease rule, by the database's clock as the row was read: until when a
    /// claim's lease runs while it has not passed (a request is executing under it),
    /// none once it passed or the key is completed. The guard takes over a claim only
    /// without one, and an operator forgets one only without one.
    pub fn live_lease(&self) -> Option<DateTime<Utc>> {
        match self.state {
            State::Processing { lease_until, .. } if lease_until > self.read_at => {
                Some(lease_until)
            }
            _ => None,
        }
    }

    /// A completed key past its retention: the next request with it is a new one.
    pub fn is_expired(&self) -> bool {
        matches!(&self.state, State::Completed { expires_at, .. } if *expires_at <= self.read_at)
    }

    /// The stored answer, once the key is completed.
    pub fn response(&self) -> Option<&StoredResponse> {
        match &self.state {
            State::Completed { response, .. } => Some(response),
            State::Processing { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Claimed and being executed by the request holding `owner`.
    Processing {
        owner: Uuid,
        lease_until: DateTime<Utc>,
    },
    /// Done; `response` is replayed to every retry until `expires_at`. Its body is as
    /// stored: sealed under the key `sealed_with`, when that is set (see `seal`).
    Completed {
        expires_at: DateTime<Utc>,
        response: StoredResponse,
        sealed_with: Option<String>,
        /// The layout of associated data it is sealed with (see `seal`).
        seal_version: Option<i16>,
    },
}
