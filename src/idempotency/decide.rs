//! The state machine of one idempotency record as a pure function: given what the
//! database holds for a key (read together with the database's clock) and the
//! fingerprint of the request at hand, what happens next. No I/O, so every row of the
//! idempotency table is unit-tested here without PostgreSQL.

use std::time::Duration;

use uuid::Uuid;

use super::{
    Fingerprint,
    record::{Record, State},
};

/// What to do about an existing record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Completed, same request: answer with the stored response.
    Replay,
    /// The key belongs to a different request: 422.
    Reject,
    /// Another request owns the key and its lease runs for `lease_remaining`: wait for
    /// it (bounded), then 409.
    Wait { lease_remaining: Duration },
    /// The owner's lease has run out: take the key over with a compare-and-set on the
    /// owner token seen here.
    TakeOver { seen_owner: Uuid },
    /// Completed but past its retention: the key is unknown again, for any request.
    Reclaim,
}

/// Decides the next step for a request with `fingerprint` that found `record`.
pub fn decide(record: &Record, fingerprint: &Fingerprint) -> Step {
    let now = record.read_at;
    let same_request = record.fingerprint == fingerprint.as_bytes();
    match &record.state {
        State::Completed { expires_at, .. } if *expires_at <= now => Step::Reclaim,
        State::Completed { .. } if same_request => Step::Replay,
        State::Completed { .. } => Step::Reject,
        State::Processing { .. } if !same_request => Step::Reject,
        State::Processing { owner, .. } if record.live_lease().is_none() => {
            Step::TakeOver { seen_owner: *owner }
        }
        State::Processing { lease_until, .. } => Step::Wait {
            lease_remaining: (*lease_until - now).to_std().unwrap_or_default(),
        },
    }
}

/// The `Retry-After` of a 409: at least 1 s, at most 2 s, and not beyond the lease when
/// the lease ends sooner. Long enough for a typical request to finish, short enough
/// that a client never waits past a lease that is about to be taken over.
pub fn retry_after(lease_remaining: Duration) -> Duration {
    let secs = lease_remaining.as_millis().div_ceil(1000).clamp(1, 2) as u64;
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use chrono::{DateTime, Utc};

    use super::*;
    use crate::idempotency::record::StoredResponse;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    fn processing(fingerprint: u8, lease_secs: i64) -> Record {
        Record {
            fingerprint: fp(fingerprint).as_bytes().to_vec(),
            state: State::Processing {
                owner: Uuid::from_u128(7),
                lease_until: at() + TimeDelta::seconds(lease_secs),
            },
            read_at: at(),
        }
    }

    fn completed(fingerprint: u8, expires_in_secs: i64) -> Record {
        Record {
            fingerprint: fp(fingerprint).as_bytes().to_vec(),
            state: State::Completed {
                expires_at: at() + TimeDelta::seconds(expires_in_secs),
                response: StoredResponse {
                    status: 201,
                    location: None,
                    content_type: None,
                    body: bytes::Bytes::from_static(b"{}"),
                    resource: None,
                },
                sealed_with: None,
                seal_version: None,
            },
            read_at: at(),
        }
    }

    #[test]
    fn completed_with_the_same_request_replays() {
        assert_eq!(decide(&completed(1, 60), &fp(1)), Step::Replay);
    }

    #[test]
    fn completed_with_another_request_is_rejected() {
        assert_eq!(decide(&completed(1, 60), &fp(2)), Step::Reject);
    }

    #[test]
    fn completed_past_retention_is_free_again_for_any_request() {
        assert_eq!(decide(&completed(1, 0), &fp(1)), Step::Reclaim);
        assert_eq!(decide(&completed(1, -5), &fp(2)), Step::Reclaim);
    }

    #[test]
    fn processing_with_another_request_is_rejected_whatever_the_lease() {
        assert_eq!(decide(&processing(1, 30), &fp(2)), Step::Reject);
        assert_eq!(decide(&processing(1, -30), &fp(2)), Step::Reject);
    }

    #[test]
    fn processing_with_a_valid_lease_waits_for_the_rest_of_it() {
        assert_eq!(
            decide(&processing(1, 30), &fp(1)),
            Step::Wait {
                lease_remaining: Duration::from_secs(30)
            }
        );
    }

    #[test]
    fn processing_with_an_expired_lease_is_taken_over_from_the_owner_seen() {
        for lease in [0, -1, -3600] {
            assert_eq!(
                decide(&processing(1, lease), &fp(1)),
                Step::TakeOver {
                    seen_owner: Uuid::from_u128(7)
                }
            );
        }
    }

    #[test]
    fn retry_after_is_one_or_two_seconds() {
        assert_eq!(retry_after(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            retry_after(Duration::from_millis(1001)),
            Duration::from_secs(2)
        );
        assert_eq!(retry_after(Duration::from_secs(30)), Duration::from_secs(2));
    }
}
