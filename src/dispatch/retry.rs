//! The retry schedule: exponential backoff with full jitter, capped, with the
//! destination's Retry-After winning when it asks for longer, and the horizon past which
//! a row stops retrying.

use crate::config::Retry;

/// The delay before attempt `attempts + 1`, after `attempts` failed ones (≥ 1).
///
/// Uniform in `[initial_ms, min(max_ms, initial_ms · 2^(attempts−1))]`: the ceiling grows
/// exponentially, and the full jitter below it spreads the retries of many rows that
/// failed together (a sink outage) instead of bringing them back at one instant.
/// `random` is any uniformly distributed u64.
pub fn backoff_ms(policy: &Retry, attempts: u32, random: u64) -> u64 {
    let exponent = attempts.saturating_sub(1).min(63);
    let ceiling = policy
        .initial_ms
        .saturating_mul(1u64 << exponent)
        .min(policy.max_ms)
        .max(policy.initial_ms);
    let span = ceiling - policy.initial_ms;
    policy.initial_ms + if span == 0 { 0 } else { random % (span + 1) }
}

/// When the next attempt is due: the backoff, or the destination's Retry-After when that
/// is longer (capped at the horizon, so a hint of a year cannot park a row past it).
pub fn next_due_ms(
    policy: &Retry,
    now_ms: u64,
    attempts: u32,
    retry_after_ms: Option<u64>,
    random: u64,
) -> u64 {
    let backoff = backoff_ms(policy, attempts, random);
    let hinted = retry_after_ms
        .unwrap_or(0)
        .min(policy.max_elapsed_ms.max(1));
    now_ms.saturating_add(backoff.max(hinted))
}

/// Whether a row first claimed at `first_attempt_at_ms` has used up its retry horizon.
pub fn past_horizon(policy: &Retry, first_attempt_at_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(first_attempt_at_ms) >= policy.max_elapsed_ms
}

/// xorshift64*: jitter needs spread, not secrecy, and a per-core generator needs no lock.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Jitter {
        Jitter(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(initial_ms: u64, max_ms: u64) -> Retry {
        Retry {
            initial_ms,
            max_ms,
            max_elapsed_ms: 86_400_000,
        }
    }

    proptest! {
        #[test]
        fn backoff_stays_within_its_bounds(initial in 1u64..10_000, extra in 0u64..1_000_000, attempts in 1u32..200, random in any::<u64>()) {
            let p = policy(initial, initial + extra);
            let delay = backoff_ms(&p, attempts, random);
            let ceiling = initial.saturating_mul(1u64 << (attempts - 1).min(63)).min(initial + extra);
            prop_assert!(delay >= initial, "{delay} < {initial}");
            prop_assert!(delay <= ceiling, "{delay} > {ceiling}");
        }

        #[test]
        fn retry_after_wins_only_when_longer(now in 0u64..1 << 50, hint in 0u64..10_000_000, random in any::<u64>()) {
            let p = policy(500, 600_000);
            let due = next_due_ms(&p, now, 3, Some(hint), random);
            prop_assert!(due >= now + hint.min(p.max_elapsed_ms));
            prop_assert!(due >= now + 500);
            prop_assert!(due <= now + hint.max(2_000));
        }
    }

    #[test]
    fn the_ceiling_doubles_then_caps() {
        let p = policy(500, 3_000);
        // random = u64::MAX - a large value picks near the top of the span.
        let top = |attempts| backoff_ms(&p, attempts, u64::MAX);
        assert_eq!(
            backoff_ms(&p, 1, 12345),
            500,
            "first retry waits initial_ms"
        );
        assert!(top(2) <= 1_000);
        assert!(top(3) <= 2_000);
        assert!(top(10) <= 3_000);
        let mut jitter = Jitter::new(7);
        let spread: std::collections::BTreeSet<u64> = (0..100)
            .map(|_| backoff_ms(&p, 10, jitter.next_u64()))
            .collect();
        assert!(spread.len() > 50, "full jitter spreads retries: {spread:?}");
    }

    #[test]
    fn the_horizon_counts_from_the_first_claim() {
        let p = Retry {
            initial_ms: 1,
            max_ms: 1,
            max_elapsed_ms: 1_000,
        };
        assert!(!past_horizon(&p, 10_000, 10_999));
        assert!(past_horizon(&p, 10_000, 11_000));
    }
}
