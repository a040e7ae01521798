//! The replay budget: how fast an archive replay or a DLQ revive may put rows in front of
//! a tenant's live hooks, and how many of them may wait there at once.
//!
//! The pipeline claims a tenant's due rows in due-time order and runs at most
//! `dispatch.sink_concurrency` attempts per (tenant, sink), so every row a replay injects
//! is one more row ahead of the live hooks that arrive after it. Two limits keep that queue
//! short, both per tenant (`replay_rate_per_s`, `replay_max_pending`, hot-reloadable):
//!
//! - a token bucket: at most `replay_rate_per_s` items per second, with a burst of a tenth
//!   of a second's worth (so batches stay a few dozen rows, never thousands);
//! - a pending list: the items the job injected and has not yet seen through their first
//!   attempt. Before it injects more than `replay_max_pending`, the job reads its oldest
//!   items back from the store and drops the ones that are done, so "pending" is measured,
//!   not guessed: a slow or failing sink slows the replay down to what it takes.
//!
//! [`Budget`] is the bookkeeping alone (no clock, no store), so it is tested with made-up
//! times; `Operations` does the reading and the sleeping, on the admin's jobs thread.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::TenantBounds;

/// The burst of the bucket, in seconds of refill: small batches, evenly spread.
const BURST_S: f64 = 0.1;
/// The longest single wait for a full pending list: items finish in milliseconds when the
/// sink is healthy, and the list is read again after each wait.
const PENDING_WAIT: Duration = Duration::from_millis(10);

/// A tenant's budget as the config has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub rate_per_s: u64,
    pub max_pending: u64,
}

impl From<TenantBounds> for Limits {
    fn from(bounds: TenantBounds) -> Limits {
        Limits {
            rate_per_s: bounds.replay_rate_per_s.max(1),
            max_pending: bounds.replay_max_pending.max(1),
        }
    }
}

/// Which limit made a job wait: a label of `ankusa_replay_throttled_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Rate,
    Pending,
}

impl Limit {
    pub const ALL: [Limit; 2] = [Limit::Rate, Limit::Pending];

    pub fn name(self) -> &'static str {
        match self {
            Limit::Rate => "rate",
            Limit::Pending => "pending",
        }
    }
}

/// What a job may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Inject this many items (at least one), then [`Budget::spend`] what it did inject.
    Take(usize),
    /// Wait this long, held back by `limit`, and ask again.
    Wait { wait: Duration, limit: Limit },
}

/// One job's budget for one tenant; `T` names an injected item (a hook's seq, a row id).
#[derive(Debug)]
pub struct Budget<T> {
    tokens: f64,
    refilled_at: Instant,
    /// Injected items not yet seen through their first attempt, oldest first.
    pending: VecDeque<T>,
}

impl<T> Budget<T> {
    /// A budget with a full bucket: a small job (under the burst) runs at once.
    pub fn new(limits: Limits, now: Instant) -> Budget<T> {
        Budget {
            tokens: burst(limits),
            refilled_at: now,
            pending: VecDeque::new(),
        }
    }

    /// Whether a full batch of `want` items would not fit under `max_pending`, so the job
    /// should read its pending items back ([`Budget::settle`]) before it asks for more.
    /// Below that it does not read at all: an unbudgeted job costs no reads.
    pub fn should_settle(&self, limits: Limits, want: usize) -> bool {
        let batch = (want as u64).min(burst(limits) as u64).max(1);
        self.pending.len() as u64 + batch > limits.max_pending
    }

    /// How many of at most `want` items may be injected now. `limits` is read anew each
    /// time, so a reload applies to a job already running.
    pub fn grant(&mut self, limits: Limits, want: usize, now: Instant) -> Grant {
        let burst = burst(limits);
        let elapsed_s = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed_s * limits.rate_per_s as f64).min(burst);
        self.refilled_at = now;
        let room = limits.max_pending.saturating_sub(self.pending.len() as u64);
        if room == 0 {
            return Grant::Wait {
                wait: PENDING_WAIT,
                limit: Limit::Pending,
            };
        }
        // Whole batches of the burst's size rather than one item per token: each batch is
        // one writer commit (and sync) the job waits for.
        let target = (want as u64).min(room).min(burst as u64).max(1);
        if self.tokens >= target as f64 {
            return Grant::Take(target as usize);
        }
        let missing = target as f64 - self.tokens;
        Grant::Wait {
            wait: Duration::from_secs_f64(missing / limits.rate_per_s as f64),
            limit: Limit::Rate,
        }
    }

    /// Records what the job injected after a [`Grant::Take`]: `items` of them went in,
    /// each to be tracked until it is done.
    pub fn spend(&mut self, items: impl IntoIterator<Item = T>) {
        for item in items {
            self.tokens -= 1.0;
            self.pending.push_back(item);
        }
    }

    /// Drops every tracked item that `waits` says is done (delivered, dead, or past its
    /// first attempt).
    pub fn settle<E>(&mut self, mut waits: impl FnMut(&T) -> Result<bool, E>) -> Result<(), E> {
        let mut kept = VecDeque::with_capacity(self.pending.len());
        for item in self.pending.drain(..) {
            if waits(&item)? {
                kept.push_back(item);
            }
        }
        self.pending = kept;
        Ok(())
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// The bucket's size: a tenth of a second of refill, at least one item.
fn burst(limits: Limits) -> f64 {
    (limits.rate_per_s as f64 * BURST_S).max(1.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        rate_per_s: 500,
        max_pending: 64,
    };

    /// Takes every grant over `seconds` of made-up time, at 1 ms steps, with nothing ever
    /// pending: what the rate alone lets through.
    fn injected_over(limits: Limits, seconds: u64) -> usize {
        let start = Instant::now();
        let mut budget: Budget<u64> = Budget::new(limits, start);
        let mut injected = 0;
        for ms in 0..seconds * 1000 {
            let now = start + Duration::from_millis(ms);
            if let Grant::Take(count) = budget.grant(limits, 256, now) {
                budget.spend(0..count as u64);
                budget.settle(|_| Ok::<_, ()>(false)).unwrap();
                injected += count;
            }
        }
        injected
    }

    #[test]
    fn the_rate_holds_over_a_run_with_one_burst_on_top() {
        let unbounded = Limits {
            max_pending: 1_000_000,
            ..LIMITS
        };
        let injected = injected_over(unbounded, 10);
        // 10 s at 500/s plus the first burst of 50, minus what is still refilling.
        assert!((4_950..=5_050).contains(&injected), "{injected}");
        let fast = Limits {
            rate_per_s: 100_000,
            max_pending: 1_000_000,
        };
        let injected = injected_over(fast, 1);
        assert!((99_000..=110_000).contains(&injected), "{injected}");
    }

    #[test]
    fn batches_are_the_burst_and_a_short_job_starts_at_once() {
        let start = Instant::now();
        let mut budget: Budget<u64> = Budget::new(LIMITS, start);
        assert_eq!(budget.grant(LIMITS, 256, start), Grant::Take(50));
        assert_eq!(budget.grant(LIMITS, 7, start), Grant::Take(7));
        budget.spend(0..50);
        budget.settle(|_| Ok::<_, ()>(false)).unwrap();
        // The bucket is empty: the next batch of 50 is 100 ms of refill away.
        match budget.grant(LIMITS, 256, start) {
            Grant::Wait {
                wait,
                limit: Limit::Rate,
            } => assert!(wait.abs_diff(Duration::from_millis(100)) < Duration::from_micros(1)),
            other => panic!("{other:?}"),
        }
        let later = start + Duration::from_millis(100);
        assert_eq!(budget.grant(LIMITS, 256, later), Grant::Take(50));
        budget.spend(0..50);
        assert_eq!(
            budget.grant(LIMITS, 256, later + Duration::from_millis(100)),
            Grant::Take(14),
            "the room left under max_pending (64 - 50) bounds the batch"
        );
    }

    #[test]
    fn a_full_pending_list_waits_until_items_are_done() {
        let limits = Limits {
            rate_per_s: 1_000_000,
            max_pending: 3,
        };
        let start = Instant::now();
        let mut budget: Budget<u64> = Budget::new(limits, start);
        assert_eq!(budget.grant(limits, 256, start), Grant::Take(3));
        budget.spend([10, 11, 12]);
        assert!(budget.should_settle(limits, 256));
        let later = start + Duration::from_secs(1);
        assert_eq!(
            budget.grant(limits, 256, later),
            Grant::Wait {
                wait: PENDING_WAIT,
                limit: Limit::Pending
            }
        );
        // Items finish out of order: only the ones still waiting stay.
        budget.settle(|seq| Ok::<_, ()>(*seq == 11)).unwrap();
        assert_eq!(budget.pending(), 1);
        assert_eq!(budget.grant(limits, 256, later), Grant::Take(2));
        // A reload that lowers the limit applies to the next grant.
        let lowered = Limits {
            max_pending: 1,
            ..limits
        };
        assert!(budget.should_settle(lowered, 256));
        assert!(matches!(
            budget.grant(lowered, 256, later),
            Grant::Wait {
                limit: Limit::Pending,
                ..
            }
        ));
    }
}
