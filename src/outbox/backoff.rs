//! Retry delays for failed publishes: exponential, capped, with jitter.

use std::time::Duration;

/// `ORDERD_OUTBOX_BACKOFF_INITIAL_MS` .. `ORDERD_OUTBOX_BACKOFF_MAX_MS`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before attempt `failed_attempts + 1`, given `jitter` in `[0, 1)`.
    ///
    /// The ceiling doubles per failure (`initial * 2^(n-1)`, capped at `max`) and the
    /// delay is drawn from its upper half ("equal jitter"), never below `initial`:
    /// retries of many rows that failed together (SNS down) spread out instead of
    /// hitting SNS in one wave when it comes back, yet each still waits roughly as long
    /// as the exponential schedule says.
    pub fn delay(&self, failed_attempts: u32, jitter: f64) -> Duration {
        let exponent = failed_attempts.saturating_sub(1).min(32);
        let ceiling = self
            .initial
            .saturating_mul(1u32 << exponent.min(31))
            .min(self.max);
        let jitter = jitter.clamp(0.0, 1.0);
        let delay = ceiling.mul_f64(0.5 + 0.5 * jitter);
        delay.clamp(self.initial.min(self.max), self.max)
    }

    /// [`Self::delay`] with a fresh random jitter.
    pub fn next(&self, failed_attempts: u32) -> Duration {
        self.delay(failed_attempts, rand::random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_millis(2000),
            max: Duration::from_millis(60_000),
        }
    }

    #[test]
    fn the_ceiling_doubles_per_failure_and_stops_at_max() {
        let b = backoff();
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(2000));
        assert_eq!(b.delay(1, 0.999_999), Duration::from_millis(2000));
        assert_eq!(b.delay(2, 0.999_999).as_millis(), 3999);
        assert_eq!(b.delay(3, 0.999_999).as_millis(), 7999);
        assert_eq!(b.delay(10, 0.999_999).as_millis(), 59999);
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_millis(60_000));
    }

    #[test]
    fn jitter_stays_in_the_upper_half_and_never_below_initial() {
        let b = backoff();
        for attempt in 1..20 {
            for jitter in [0.0, 0.25, 0.5, 0.99] {
                let d = b.delay(attempt, jitter);
                assert!(d >= b.initial && d <= b.max, "{attempt} {jitter} {d:?}");
            }
        }
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(4000));
    }
}
