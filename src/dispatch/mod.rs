//! Delivery: the pipeline cores that move pending rows to their sinks (DESIGN section 3).
//!
//! Tenants are partitioned over the pipeline cores by a hash of their ordinal, so one
//! tenant's rows are moved by one core and nothing needs a lock. Each core visits its
//! active tenants round-robin; a visit claims up to `dispatch.batch` due rows (`?D` →
//! `?F`, one batch), starts their attempts — at most `dispatch.sink_concurrency` per
//! (tenant, sink) — and later flushes the buffered outcomes in one batch: delivered,
//! retry, or dead-letter. A row waiting for its turn is only its keys: it holds no slot
//! and no memory, so a tenant with a dead sink costs the others nothing.
//!
//! - [`pipeline`]: one core's loop.
//! - [`retry`]: the backoff schedule and the horizon.
//! - [`breaker`]: the per-sink circuit breaker; [`BreakerBoard`] publishes the ones that
//!   are not closed for the admin.
//! - [`recover_inflight`]: claims left by a stop or crash go back to due, before any core
//!   starts.

pub mod breaker;
pub mod pipeline;
pub mod retry;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use atomic_waker::AtomicWaker;
use crossbeam_channel::{Receiver, Sender};

use crate::clock;
use crate::live::Live;
use crate::published::Published;
use crate::store::codec::DeliveryRow;
use crate::store::deliveries::{self, Transitions};
use crate::store::keys::LaneId;
use crate::store::{Store, StoreError};

/// What every pipeline core shares.
pub struct DispatchShared {
    pub store: Store,
    /// The running config and its built sinks, replaced by a reload; each core reads it
    /// through its own local copy, once per round.
    pub live: Arc<Published<Live>>,
    /// Names this store in idempotency keys, so two nodes never share one.
    pub instance_id: String,
    /// One wake-up per pipeline core, raised by the writer after each commit.
    pub wakeups: Vec<Arc<Wakeup>>,
    /// Per core: the due time of the oldest row due in its last round (0: none).
    pub oldest_due_ms: Vec<AtomicU64>,
    /// Per core: the earliest due time of rows put by others (the writer, a revive) since
    /// the core last looked; its scan cursors move back to it.
    pub inserted_due_ms: Vec<AtomicU64>,
    /// Per core: tenants that got rows since the core last looked. Bounded; when one is
    /// full, or a caller cannot name its tenants, `rescan` makes the core read the active
    /// markers instead.
    pub inboxes: Vec<Channel<u32>>,
    pub rescan: Vec<AtomicBool>,
    /// Per core: lanes that got members since the core last looked, checked by the lane
    /// sweep instead of a scan of every marker of their tenant (a scan steps over the
    /// tombstone of every marker the sweep deleted). When one is full, or a caller cannot
    /// name its lanes (a revive), `lane_rescan` makes the core scan the markers instead.
    pub lane_inboxes: Vec<Channel<(u32, LaneId)>>,
    pub lane_rescan: Vec<AtomicBool>,
    /// Per core: hooks (ordinal, seq) whose rows another path removed; the core deletes
    /// each one that has no row left (see `pipeline::check_hooks`).
    pub hook_checks: Vec<Channel<(u32, u64)>>,
    /// Per core: tenants to stop moving for good (a purge), each with the channel the core
    /// answers on once it holds nothing of the tenant that it could still write.
    pub retirements: Vec<Channel<(u32, Sender<()>)>>,
    /// Per core: its breakers that are not closed, for the admin's stats.
    pub breakers: Arc<BreakerBoard>,
}

impl std::fmt::Debug for DispatchShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchShared")
            .field("cores", &self.wakeups.len())
            .finish()
    }
}

impl DispatchShared {
    pub fn new(
        store: Store,
        live: Arc<Published<Live>>,
        instance_id: String,
        core_count: usize,
    ) -> DispatchShared {
        DispatchShared {
            store,
            live,
            instance_id,
            wakeups: (0..core_count)
                .map(|_| Arc::new(Wakeup::default()))
                .collect(),
            oldest_due_ms: (0..core_count).map(|_| AtomicU64::new(0)).collect(),
            inserted_due_ms: (0..core_count).map(|_| AtomicU64::new(u64::MAX)).collect(),
            inboxes: (0..core_count)
                .map(|_| crossbeam_channel::bounded(INBOX_CAPACITY))
                .collect(),
            rescan: (0..core_count).map(|_| AtomicBool::new(true)).collect(),
            lane_inboxes: (0..core_count)
                .map(|_| crossbeam_channel::bounded(LANE_INBOX_CAPACITY))
                .collect(),
            // A start scans every marker once: the store may hold some from before.
            lane_rescan: (0..core_count).map(|_| AtomicBool::new(true)).collect(),
            hook_checks: (0..core_count)
                .map(|_| crossbeam_channel::bounded(INBOX_CAPACITY))
                .collect(),
            retirements: (0..core_count)
                .map(|_| crossbeam_channel::bounded(64))
                .collect(),
            breakers: Arc::new(BreakerBoard::new(core_count)),
        }
    }

    /// Makes the owner of `ordinal` stop moving the tenant's rows and drop its buffered
    /// outcomes and those of attempts still running; true once the core confirmed, false if
    /// it did not within `timeout` (a stopped pipeline). Called from a blocking thread.
    pub fn retire(&self, ordinal: u32, timeout: std::time::Duration) -> bool {
        let owner = self.owner(ordinal);
        let (done, confirmed) = crossbeam_channel::bounded(1);
        if self.retirements[owner]
            .0
            .send_timeout((ordinal, done), timeout)
            .is_err()
        {
            return false;
        }
        self.wakeups[owner].notify();
        confirmed.recv_timeout(timeout).is_ok()
    }

    /// The pipeline core that owns `ordinal`.
    pub fn owner(&self, ordinal: u32) -> usize {
        owner_of(ordinal, self.wakeups.len())
    }

    /// Asks the owner of `ordinal` to delete each of these hooks that has no delivery row
    /// left. Called from a blocking thread (the admin's); waits for room rather than drop
    /// a check, up to a bound so a stopped pipeline cannot hang it.
    pub fn check_hooks(&self, ordinal: u32, seqs: &[u64]) {
        let owner = self.owner(ordinal);
        for &seq in seqs {
            let sent = self.hook_checks[owner]
                .0
                .send_timeout((ordinal, seq), std::time::Duration::from_secs(5));
            if sent.is_err() {
                tracing::warn!(
                    tenant = ordinal,
                    seq,
                    "pipeline did not take a hook check; `store verify` will name the hook if it was left without rows"
                );
            }
        }
        self.wakeups[owner].notify();
    }

    /// Tells the pipeline cores that rows of `tenants`, due from `min_due_ms` on, were
    /// put, and wakes them. Every path that puts a due key other than the pipeline's own
    /// calls this; an empty `tenants` makes every core rescan its active markers.
    pub fn notify_inserted(&self, min_due_ms: u64, tenants: &[u32]) {
        if tenants.is_empty() {
            for flag in self.rescan.iter().chain(&self.lane_rescan) {
                flag.store(true, Ordering::Release);
            }
        }
        for &ordinal in tenants {
            let owner = self.owner(ordinal);
            if self.inboxes[owner].0.try_send(ordinal).is_err() {
                self.rescan[owner].store(true, Ordering::Release);
            }
        }
        for (slot, wakeup) in self.inserted_due_ms.iter().zip(&self.wakeups) {
            slot.fetch_min(min_due_ms, Ordering::AcqRel);
            wakeup.notify();
        }
    }
}

impl DispatchShared {
    /// Tells the owners of these lanes that they got members (after the commit), so their
    /// next sweep checks them.
    pub fn notify_lanes(&self, lanes: &[(u32, LaneId)]) {
        for &(ordinal, lane) in lanes {
            let owner = self.owner(ordinal);
            if self.lane_inboxes[owner]
                .0
                .try_send((ordinal, lane))
                .is_err()
            {
                self.lane_rescan[owner].store(true, Ordering::Release);
            }
        }
    }
}

/// A breaker that is not closed, as its pipeline core published it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenBreaker {
    /// The pipeline core that keeps it: each core has its own breaker per sink.
    pub core: usize,
    pub source: String,
    pub sink: String,
    /// The sink's kind (`http`, `redis`, …).
    pub kind: &'static str,
    pub view: breaker::View,
}

/// The breakers that are not closed, one slot per pipeline core, for the admin to read.
///
/// A core replaces its slot whole when one of its breakers changes state (opened,
/// half-opened, reopened, closed) and empties it when a reload makes its breakers start
/// over: never per attempt, and nothing on the ingest path touches it. The lock is held
/// only to swap or clone a short list.
#[derive(Debug)]
pub struct BreakerBoard {
    slots: Vec<Mutex<Vec<OpenBreaker>>>,
}

impl BreakerBoard {
    pub fn new(core_count: usize) -> BreakerBoard {
        BreakerBoard {
            slots: (0..core_count).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// Replaces what `core` shows: every breaker of it that is not closed.
    pub fn publish(&self, core: usize, open: Vec<OpenBreaker>) {
        if let Some(slot) = self.slots.get(core) {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = open;
        }
    }

    /// Every core's breakers that are not closed, by core.
    pub fn snapshot(&self) -> Vec<OpenBreaker> {
        self.slots
            .iter()
            .flat_map(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .collect()
    }

    /// The pipeline core that moves the rows of tenant `ordinal` (see [`owner_of`]).
    pub fn owner(&self, ordinal: u32) -> usize {
        owner_of(ordinal, self.slots.len())
    }
}

/// Lane notices a core's inbox holds before the writer falls back to a marker scan.
const LANE_INBOX_CAPACITY: usize = 65_536;

/// Both ends of a bounded channel to one pipeline core.
pub type Channel<T> = (Sender<T>, Receiver<T>);

/// Tenant notices a core's inbox holds before the writer falls back to a rescan.
const INBOX_CAPACITY: usize = 16_384;

/// Tenants spread over `cores` by a multiplicative hash of the ordinal: consecutive
/// ordinals land on different cores.
pub fn owner_of(ordinal: u32, cores: usize) -> usize {
    let hash = u64::from(ordinal).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (hash % cores.max(1) as u64) as usize
}

/// A flag and a waker: set from any thread, awaited by one pipeline core.
#[derive(Debug, Default)]
pub struct Wakeup {
    raised: AtomicBool,
    waker: AtomicWaker,
}

impl Wakeup {
    pub fn notify(&self) {
        self.raised.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Resolves once `notify` was called since the last wait.
    pub fn wait(&self) -> WakeupWait<'_> {
        WakeupWait { wakeup: self }
    }
}

pub struct WakeupWait<'a> {
    wakeup: &'a Wakeup,
}

impl std::future::Future for WakeupWait<'_> {
    type Output = ();
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.wakeup.raised.swap(false, Ordering::AcqRel) {
            return std::task::Poll::Ready(());
        }
        self.wakeup.waker.register(cx.waker());
        if self.wakeup.raised.swap(false, Ordering::AcqRel) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    }
}

/// Puts back the active marker of every tenant with pending rows that lacks one (a crash
/// between an idle tenant's marker removal and its re-check leaves that), so a restart
/// visits every tenant with work even if no new hook comes for it. Runs at startup before
/// any pipeline core; returns how many markers it restored.
pub fn restore_active_markers(store: &Store) -> Result<u64, StoreError> {
    let missing = deliveries::tenants_missing_active(store)?;
    if missing.is_empty() {
        return Ok(0);
    }
    let mut transitions = Transitions::new(store);
    for ordinal in &missing {
        transitions.set_active(*ordinal);
    }
    transitions.commit(true)?;
    Ok(missing.len() as u64)
}

/// Rows per recovery batch: bounded, so a huge backlog of claims recovers in steps.
const RECOVER_BATCH: usize = 1024;

/// Puts every claimed row (`?F`) back to due as a first attempt. Runs at startup before
/// any pipeline core, so every claim it sees belongs to a process that is gone. Returns
/// how many rows it recovered.
pub fn recover_inflight(store: &Store) -> Result<u64, StoreError> {
    let mut recovered = 0u64;
    loop {
        let claimed = deliveries::inflight_rows(store, RECOVER_BATCH)?;
        if claimed.is_empty() {
            return Ok(recovered);
        }
        let now_ms = clock::now_ms();
        let mut transitions = Transitions::new(store);
        for (id, size) in &claimed {
            // A lane head stays the head: its row says so. A row that cannot be read goes
            // back as an unordered first attempt, and its visit dead-letters it.
            let laned = deliveries::read_row(store, *id)?
                .and_then(|bytes| DeliveryRow::decode(&bytes).ok())
                .is_some_and(|row| row.lane.is_some());
            transitions.recover(*id, *size, laned, now_ms);
        }
        transitions.commit(true)?;
        recovered += claimed.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_spreads_tenants_over_every_core() {
        for cores in 1..=8 {
            let mut counts = vec![0usize; cores];
            for ordinal in 1..=8_000u32 {
                let owner = owner_of(ordinal, cores);
                assert!(owner < cores);
                counts[owner] += 1;
            }
            let fair = 8_000 / cores;
            for count in counts {
                assert!(
                    count > fair * 8 / 10 && count < fair * 12 / 10,
                    "{cores} cores: {count} vs {fair}"
                );
            }
        }
    }
}
