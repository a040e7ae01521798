//! A circuit breaker per sink: after `failures` consecutive failed attempts it opens, and
//! the sink's due rows are parked until the open period has passed; then one probe attempt goes
//! through (half-open). Its success closes the breaker, its failure opens it again.
//!
//! Pure state: the caller passes the time and acts on the answers, so every transition is
//! unit-tested without a clock.

/// What the pipeline may do with a due row of this sink now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Attempt it.
    Attempt,
    /// Attempt it as the half-open probe: the only one until its outcome is known.
    Probe,
    /// Do not attempt it; move its due time to `until_ms`.
    Park { until_ms: u64 },
}

/// A change worth logging and counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// From closed: the sink starts being parked.
    Opened,
    HalfOpened,
    /// The probe failed: open again.
    Reopened,
    Closed,
}

/// What an operator is shown of a breaker that is not closed ([`Breaker::view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// False while open (the sink's due rows are parked), true while half-open (one probe
    /// is let through, or the next due row will be).
    pub half_open: bool,
    /// When it opened from closed; a failed probe does not move it.
    pub opened_at_ms: u64,
    /// While open: when the open period ends and the next due row goes as the probe.
    /// `None` while half-open.
    pub next_probe_ms: Option<u64>,
    /// Failed attempts in a row: those that opened it, and each failed probe since.
    pub consecutive_failures: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { consecutive_failures: u32 },
    Open { until_ms: u64 },
    HalfOpen { probe_running: bool },
}

#[derive(Debug, Clone)]
pub struct Breaker {
    state: State,
    failures: u32,
    /// The first open period; each failed probe doubles the next, up to `open_max_ms`,
    /// so a long outage is probed (and its backlog re-parked) less and less often.
    open_ms: u64,
    open_max_ms: u64,
    /// The open period in force: `open_ms` after a close, doubled by each failed probe.
    open_current_ms: u64,
    /// For [`Breaker::view`]: when it last opened from closed, and the failures in a row
    /// since (counted while not closed).
    opened_at_ms: u64,
    failures_in_a_row: u32,
}

/// How long rows wait while a probe is out: short, so they follow soon after it closes.
const PROBE_WAIT_MS: u64 = 1_000;

impl Breaker {
    pub fn new(failures: u32, open_ms: u64, open_max_ms: u64) -> Breaker {
        Breaker {
            state: State::Closed {
                consecutive_failures: 0,
            },
            failures: failures.max(1),
            open_ms,
            open_max_ms: open_max_ms.max(open_ms),
            open_current_ms: open_ms,
            opened_at_ms: 0,
            failures_in_a_row: 0,
        }
    }

    /// What an operator sees of it; `None` while closed.
    pub fn view(&self) -> Option<View> {
        let (half_open, next_probe_ms) = match self.state {
            State::Closed { .. } => return None,
            State::Open { until_ms } => (false, Some(until_ms)),
            State::HalfOpen { .. } => (true, None),
        };
        Some(View {
            half_open,
            opened_at_ms: self.opened_at_ms,
            next_probe_ms,
            consecutive_failures: self.failures_in_a_row,
        })
    }

    pub fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }

    /// Decides about one due row at `now_ms`.
    pub fn admit(&mut self, now_ms: u64) -> (Admit, Option<Change>) {
        match self.state {
            State::Closed { .. } => (Admit::Attempt, None),
            State::Open { until_ms } if now_ms < until_ms => (Admit::Park { until_ms }, None),
            State::Open { .. } => {
                self.state = State::HalfOpen {
                    probe_running: true,
                };
                (Admit::Probe, Some(Change::HalfOpened))
            }
            State::HalfOpen {
                probe_running: true,
            } => (
                Admit::Park {
                    until_ms: now_ms + PROBE_WAIT_MS.min(self.open_current_ms),
                },
                None,
            ),
            State::HalfOpen {
                probe_running: false,
            } => {
                self.state = State::HalfOpen {
                    probe_running: true,
                };
                (Admit::Probe, None)
            }
        }
    }

    /// A probe admitted by [`Breaker::admit`] that was never sent (its claim failed to
    /// commit): the next due row may probe instead.
    pub fn probe_abandoned(&mut self) {
        if let State::HalfOpen {
            probe_running: true,
        } = self.state
        {
            self.state = State::HalfOpen {
                probe_running: false,
            };
        }
    }

    /// Records an attempt's result. `probe` says whether it was the half-open probe.
    pub fn record(&mut self, success: bool, probe: bool, now_ms: u64) -> Option<Change> {
        match (self.state, success) {
            (State::Closed { .. }, true) => {
                self.state = State::Closed {
                    consecutive_failures: 0,
                };
                None
            }
            (
                State::Closed {
                    consecutive_failures,
                },
                false,
            ) => {
                let consecutive_failures = consecutive_failures + 1;
                if consecutive_failures >= self.failures {
                    self.open_current_ms = self.open_ms;
                    self.opened_at_ms = now_ms;
                    self.failures_in_a_row = consecutive_failures;
                    self.state = State::Open {
                        until_ms: now_ms + self.open_current_ms,
                    };
                    Some(Change::Opened)
                } else {
                    self.state = State::Closed {
                        consecutive_failures,
                    };
                    None
                }
            }
            (State::HalfOpen { .. }, true) if probe => {
                self.state = State::Closed {
                    consecutive_failures: 0,
                };
                self.failures_in_a_row = 0;
                Some(Change::Closed)
            }
            (State::HalfOpen { .. }, false) if probe => {
                self.open_current_ms = self.open_current_ms.saturating_mul(2).min(self.open_max_ms);
                self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
                self.state = State::Open {
                    until_ms: now_ms + self.open_current_ms,
                };
                Some(Change::Reopened)
            }
            // Late results of attempts started before the breaker opened change nothing:
            // only the probe decides.
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failed_probe_doubles_the_open_period_up_to_the_cap() {
        let mut breaker = Breaker::new(1, 100, 350);
        breaker.record(false, false, 0);
        let mut now = 0;
        let mut periods = Vec::new();
        for _ in 0..4 {
            let (Admit::Park { until_ms }, _) = breaker.admit(now) else {
                panic!("open breaker must park");
            };
            periods.push(until_ms - now);
            now = until_ms;
            assert_eq!(breaker.admit(now).0, Admit::Probe);
            breaker.record(false, true, now);
        }
        assert_eq!(periods, vec![100, 200, 350, 350]);
        // A success starts over from the first period.
        let (Admit::Park { until_ms }, _) = breaker.admit(now) else {
            panic!("open breaker must park");
        };
        assert_eq!(breaker.admit(until_ms).0, Admit::Probe);
        assert_eq!(breaker.record(true, true, until_ms), Some(Change::Closed));
        breaker.record(false, false, until_ms);
        assert_eq!(
            breaker.admit(until_ms).0,
            Admit::Park {
                until_ms: until_ms + 100
            }
        );
    }

    #[test]
    fn opens_after_consecutive_failures_and_parks_until_reopen() {
        let mut breaker = Breaker::new(3, 10_000, 10_000);
        assert_eq!(breaker.record(false, false, 0), None);
        assert_eq!(
            breaker.record(true, false, 0),
            None,
            "a success resets the count"
        );
        assert_eq!(breaker.record(false, false, 1), None);
        assert_eq!(breaker.record(false, false, 2), None);
        assert_eq!(breaker.record(false, false, 3), Some(Change::Opened));
        assert!(breaker.is_open());
        assert_eq!(
            breaker.admit(5_000),
            (Admit::Park { until_ms: 10_003 }, None)
        );
        // A late failure of an attempt started before the opening changes nothing.
        assert_eq!(breaker.record(false, false, 6_000), None);
        assert_eq!(
            breaker.admit(9_999),
            (Admit::Park { until_ms: 10_003 }, None)
        );
    }

    #[test]
    fn the_view_shows_when_it_opened_the_next_probe_and_the_failures_in_a_row() {
        let mut breaker = Breaker::new(2, 100, 1_000);
        assert_eq!(breaker.view(), None);
        breaker.record(false, false, 10);
        assert_eq!(breaker.view(), None, "one failure of two: still closed");
        breaker.record(false, false, 20);
        let opened = View {
            half_open: false,
            opened_at_ms: 20,
            next_probe_ms: Some(120),
            consecutive_failures: 2,
        };
        assert_eq!(breaker.view(), Some(opened));
        // A row parked by it changes nothing.
        breaker.admit(50);
        assert_eq!(breaker.view(), Some(opened));
        assert_eq!(breaker.admit(120).0, Admit::Probe);
        assert_eq!(
            breaker.view(),
            Some(View {
                half_open: true,
                next_probe_ms: None,
                ..opened
            })
        );
        // The failed probe: open again for twice as long, since the same opening.
        breaker.record(false, true, 130);
        assert_eq!(
            breaker.view(),
            Some(View {
                half_open: false,
                opened_at_ms: 20,
                next_probe_ms: Some(330),
                consecutive_failures: 3,
            })
        );
        assert_eq!(breaker.admit(330).0, Admit::Probe);
        breaker.record(true, true, 340);
        assert_eq!(breaker.view(), None);
        // Opened again later: counted from that opening.
        breaker.record(false, false, 400);
        breaker.record(false, false, 410);
        assert_eq!(
            breaker.view(),
            Some(View {
                half_open: false,
                opened_at_ms: 410,
                next_probe_ms: Some(510),
                consecutive_failures: 2,
            })
        );
    }

    #[test]
    fn one_probe_when_half_open_and_its_result_decides() {
        let mut breaker = Breaker::new(1, 100, 100);
        breaker.record(false, false, 0);
        assert_eq!(breaker.admit(100), (Admit::Probe, Some(Change::HalfOpened)));
        assert_eq!(breaker.admit(101), (Admit::Park { until_ms: 201 }, None));
        assert_eq!(breaker.record(false, true, 150), Some(Change::Reopened));
        assert_eq!(breaker.admit(200), (Admit::Park { until_ms: 250 }, None));
        assert_eq!(breaker.admit(250), (Admit::Probe, Some(Change::HalfOpened)));
        assert_eq!(breaker.admit(255), (Admit::Park { until_ms: 355 }, None));
        breaker.probe_abandoned();
        assert_eq!(breaker.admit(256), (Admit::Probe, None));
        assert_eq!(breaker.record(true, true, 260), Some(Change::Closed));
        assert!(!breaker.is_open());
        assert_eq!(breaker.admit(261), (Admit::Attempt, None));
    }
}
