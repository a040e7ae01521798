//! Faults injected on purpose, so the harnesses can prove that they catch the failures they
//! exist to catch: a crash harness (`bench-gate crash --fault NAME`) that reports "lost 0"
//! against a server that loses hooks would prove nothing, and neither would a performance
//! gate (`bench-gate compare`) that passes a slower build.
//!
//! A fault is chosen once, at startup, by the environment variable [`ENV`]; without it
//! (every real deployment) nothing is injected and each check below is one relaxed load of
//! a static. The startup report names an active fault as an error.

use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that names the fault.
pub const ENV: &str = "ANKUSA_TEST_FAULT";

/// A deliberate defect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// The writer completes a batch's acks before it writes the batch, and waits
    /// [`ACK_BEFORE_SYNC_DELAY`] first, so a SIGKILL under load always finds acked hooks
    /// that were never stored.
    AckBeforeSync = 1,
    /// The edge gives an ordered sink's rows no lane, so several hooks of one key are in
    /// flight at once and may arrive out of order.
    IgnoreLanes = 2,
    /// The writer waits [`SLOW_COMMIT_DELAY`] before each batch's write: every ack is
    /// later and, with a bounded number of connections, fewer hooks go through per second.
    SlowCommit = 3,
    /// Each batch of a store migration waits [`SLOW_MIGRATION_DELAY`] before its write, so
    /// a test can watch a small store's migration report its progress.
    SlowMigration = 4,
}

/// How long a batch whose acks went out waits before its write under
/// [`Fault::AckBeforeSync`].
pub const ACK_BEFORE_SYNC_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// How long the writer waits before each batch under [`Fault::SlowCommit`]: a few times a
/// batch's sync, so the slowdown stands far outside a noisy machine's spread.
pub const SLOW_COMMIT_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// How long each migration batch waits under [`Fault::SlowMigration`].
pub const SLOW_MIGRATION_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

impl Fault {
    pub const ALL: [Fault; 4] = [
        Fault::AckBeforeSync,
        Fault::IgnoreLanes,
        Fault::SlowCommit,
        Fault::SlowMigration,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::AckBeforeSync => "ack_before_sync",
            Fault::IgnoreLanes => "ignore_lanes",
            Fault::SlowCommit => "slow_commit",
            Fault::SlowMigration => "slow_migration",
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|fault| fault.name() == name)
    }
}

static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Reads [`ENV`] and makes its fault active. An unknown name is an error: a harness that
/// asked for a fault the server does not know would otherwise pass for the wrong reason.
pub fn init_from_env() -> Result<Option<Fault>, String> {
    let Some(value) = std::env::var_os(ENV) else {
        return Ok(None);
    };
    let value = value.to_string_lossy();
    let fault = Fault::parse(&value).ok_or_else(|| {
        let known: Vec<&str> = Fault::ALL.iter().map(|fault| fault.name()).collect();
        format!(
            "{ENV}={value:?} names no fault (known: {})",
            known.join(", ")
        )
    })?;
    ACTIVE.store(fault as u8, Ordering::Relaxed);
    Ok(Some(fault))
}

/// Whether `fault` is the active one.
#[inline]
pub fn active(fault: Fault) -> bool {
    ACTIVE.load(Ordering::Relaxed) == fault as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for fault in Fault::ALL {
            assert_eq!(Fault::parse(fault.name()), Some(fault));
        }
        assert_eq!(Fault::parse("ack-before-sync"), None);
        assert_eq!(Fault::parse(""), None);
    }
}
