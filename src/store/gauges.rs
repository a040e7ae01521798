//! An in-memory mirror of the `pending` and `bytes` counters of every tenant and of the
//! node, for admission: the edge must compare a tenant's load with its bounds on every
//! request without reading the store.
//!
//! The mirror is seeded from the counters when the store opens and then moved by exactly
//! the deltas each committed batch carried, after the commit ([`GaugeDeltas`], produced
//! where the counter merges are built). Besides the committed load, each slot holds what
//! the edge has reserved for envelopes on their way to the writer, so a burst cannot
//! overshoot a bound by the writer's queue: a reservation is taken before the hand-off
//! and returned when the ack resolves, by which time a committed hook is in the mirror.
//!
//! Each slot also measures how fast its backlog drains (rows and bytes leaving `pending`
//! per second, sampled once a second and smoothed), so a refusal can tell the client when
//! the backlog will be back under its bound instead of naming a constant.
//!
//! Lock-free: slots live in chunks allocated on first use, found by ordinal.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::keys::{Counter, NODE_ORDINAL};

const CHUNK: usize = 1024;
/// 64 Mi ordinals; a chunk of 1,024 slots is allocated when its first ordinal is used.
const CHUNKS: usize = 1 << 16;

/// A refused client is told to come back when its backlog is projected under this share
/// of its bound: coming back just as it dips under would meet the bound again at once.
pub const RESUME_BELOW: f64 = 0.9;

/// Weight of the newest one-second sample in the smoothed drain rate: a sink that slows
/// down shows in a few seconds, one slow second does not swing the answer.
const DRAIN_SMOOTHING: f64 = 0.3;

#[derive(Debug, Default)]
struct Slot {
    pending: AtomicI64,
    bytes: AtomicI64,
    quarantined: AtomicI64,
    reserved_pending: AtomicI64,
    reserved_bytes: AtomicI64,
    drain: Drain,
}

/// Rows and bytes that left `pending` (delivered, dead-lettered), and their smoothed rate.
#[derive(Debug, Default)]
struct Drain {
    rows: AtomicI64,
    bytes: AtomicI64,
    /// `rows` and `bytes` at the last sample.
    sampled_rows: AtomicI64,
    sampled_bytes: AtomicI64,
    /// Per second, as `f64` bits; meaningful once `measured`.
    rows_per_s: AtomicU64,
    bytes_per_s: AtomicU64,
    measured: AtomicBool,
}

impl Drain {
    fn sample(&self, elapsed_s: f64) {
        let rate = |total: &AtomicI64, sampled: &AtomicI64, rate: &AtomicU64| {
            let now = total.load(Ordering::Acquire);
            let moved = now - sampled.swap(now, Ordering::AcqRel);
            let newest = moved.max(0) as f64 / elapsed_s;
            let smoothed = if self.measured.load(Ordering::Acquire) {
                let previous = f64::from_bits(rate.load(Ordering::Acquire));
                DRAIN_SMOOTHING * newest + (1.0 - DRAIN_SMOOTHING) * previous
            } else {
                newest
            };
            rate.store(smoothed.to_bits(), Ordering::Release);
        };
        rate(&self.rows, &self.sampled_rows, &self.rows_per_s);
        rate(&self.bytes, &self.sampled_bytes, &self.bytes_per_s);
        self.measured.store(true, Ordering::Release);
    }
}

/// Seconds for `excess` to drain at `rate` per second: 0 with nothing in excess, infinite
/// when nothing drains.
fn seconds_to_drain(excess: f64, rate: f64) -> f64 {
    if excess <= 0.0 {
        0.0
    } else if rate > 0.0 {
        excess / rate
    } else {
        f64::INFINITY
    }
}

pub struct Gauges {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// The node's `lane_members`: the pipeline sweeps lanes only while it is above 0, and
    /// reads it every round, so it must not cost a store read.
    node_lane_members: AtomicI64,
    /// Batches that put a lane member back below its lane's newest seqs (a DLQ revive),
    /// counted when each begins to commit and when it has: the pipeline's lane floors
    /// (`deliveries::lanes::LaneFloors`) are trusted only while no such batch intervened.
    lane_revives_begun: AtomicU64,
    lane_revives_ended: AtomicU64,
}

impl std::fmt::Debug for Gauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gauges")
            .field("node_pending", &self.pending(NODE_ORDINAL))
            .finish()
    }
}

/// The pending, bytes and quarantined deltas of one committed batch, per ordinal, node
/// included.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GaugeDeltas {
    deltas: Vec<(u32, [i64; 3])>,
    node_lane_members: i64,
}

impl GaugeDeltas {
    pub(crate) fn push(&mut self, ordinal: u32, field: Counter, delta: i64) {
        let index = match field {
            Counter::Pending => 0,
            Counter::Bytes => 1,
            Counter::Quarantined => 2,
            Counter::LaneMembers if ordinal == NODE_ORDINAL => {
                self.node_lane_members += delta;
                return;
            }
            _ => return,
        };
        match self.deltas.iter_mut().find(|(o, _)| *o == ordinal) {
            Some((_, slot)) => slot[index] += delta,
            None => {
                let mut slot = [0; 3];
                slot[index] = delta;
                self.deltas.push((ordinal, slot));
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.deltas.is_empty() && self.node_lane_members == 0
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// The tenant's own bound: 429.
    Tenant,
    /// The node's bound: 503.
    Node,
}

/// Bounds to check a reservation against.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_pending: u64,
    pub max_bytes: u64,
}

impl Default for Gauges {
    fn default() -> Self {
        Gauges::new()
    }
}

impl Gauges {
    pub fn new() -> Gauges {
        Gauges {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            node_lane_members: AtomicI64::new(0),
            lane_revives_begun: AtomicU64::new(0),
            lane_revives_ended: AtomicU64::new(0),
        }
    }

    fn slot(&self, ordinal: u32) -> Option<&Slot> {
        let chunk = ordinal as usize / CHUNK;
        let cell = self.chunks.get(chunk)?;
        let slots = cell.get_or_init(|| (0..CHUNK).map(|_| Slot::default()).collect());
        Some(&slots[ordinal as usize % CHUNK])
    }

    /// Sets the committed values of `ordinal`: pending, bytes, quarantined (seeding at
    /// open, and zeroing a purged tenant).
    pub(crate) fn seed(&self, ordinal: u32, values: [i64; 3]) {
        if let Some(slot) = self.slot(ordinal) {
            slot.pending.store(values[0], Ordering::Relaxed);
            slot.bytes.store(values[1], Ordering::Relaxed);
            slot.quarantined.store(values[2], Ordering::Relaxed);
        }
    }

    /// Sets the node's committed `lane_members` (seeding at open).
    pub(crate) fn seed_lane_members(&self, value: i64) {
        self.node_lane_members.store(value, Ordering::Relaxed);
    }

    /// Rows waiting in a lane on the whole node.
    pub fn lane_members(&self) -> i64 {
        self.node_lane_members.load(Ordering::Acquire)
    }

    /// Counts a lane revive about to commit: called before the write.
    pub(crate) fn begin_lane_revive(&self) {
        self.lane_revives_begun.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a lane revive whose write returned, committed or not.
    pub(crate) fn end_lane_revive(&self) {
        self.lane_revives_ended.fetch_add(1, Ordering::SeqCst);
    }

    /// Lane revives begun so far.
    pub(crate) fn lane_revives_begun(&self) -> u64 {
        self.lane_revives_begun.load(Ordering::SeqCst)
    }

    /// Lane revives ended so far.
    pub(crate) fn lane_revives_ended(&self) -> u64 {
        self.lane_revives_ended.load(Ordering::SeqCst)
    }

    /// Moves the committed values by a batch that has just committed.
    pub fn apply(&self, deltas: &GaugeDeltas) {
        if deltas.node_lane_members != 0 {
            self.node_lane_members
                .fetch_add(deltas.node_lane_members, Ordering::AcqRel);
        }
        for &(ordinal, [pending, bytes, quarantined]) in &deltas.deltas {
            if let Some(slot) = self.slot(ordinal) {
                slot.pending.fetch_add(pending, Ordering::AcqRel);
                slot.bytes.fetch_add(bytes, Ordering::AcqRel);
                slot.quarantined.fetch_add(quarantined, Ordering::AcqRel);
                // A batch that lowers pending is the pipeline's (delivered, dead): that
                // is the drain. Ingest and revives only add.
                if pending < 0 {
                    slot.drain.rows.fetch_add(-pending, Ordering::AcqRel);
                }
                if bytes < 0 {
                    slot.drain.bytes.fetch_add(-bytes, Ordering::AcqRel);
                }
            }
        }
    }

    /// Takes one sample of every slot's drain, `elapsed_s` after the previous one. Called
    /// about once a second by one thread.
    pub fn sample_drain(&self, elapsed_s: f64) {
        if elapsed_s.is_nan() || elapsed_s <= 0.0 {
            return;
        }
        for slots in self.chunks.iter().filter_map(OnceLock::get) {
            for slot in slots.iter() {
                slot.drain.sample(elapsed_s);
            }
        }
    }

    /// Rows of `ordinal` that leave pending per second, lately (`None` before the first
    /// sample).
    pub fn drain_per_s(&self, ordinal: u32) -> Option<f64> {
        let slot = self.slot(ordinal)?;
        slot.drain
            .measured
            .load(Ordering::Acquire)
            .then(|| f64::from_bits(slot.drain.rows_per_s.load(Ordering::Acquire)))
    }

    /// The Retry-After for a refusal at `bounds`: whole seconds until `ordinal`'s backlog,
    /// draining at its recent rate, is under [`RESUME_BELOW`] of both bounds; at least 1,
    /// and `max_s` when it does not drain at all. `None` before the drain was first
    /// measured (the first second after a start).
    pub fn retry_after_s(&self, ordinal: u32, bounds: Bounds, max_s: u32) -> Option<u32> {
        let slot = self.slot(ordinal)?;
        if !slot.drain.measured.load(Ordering::Acquire) {
            return None;
        }
        let load = |committed: &AtomicI64, reserved: &AtomicI64| {
            (committed.load(Ordering::Acquire) + reserved.load(Ordering::Acquire)) as f64
        };
        let rate = |bits: &AtomicU64| f64::from_bits(bits.load(Ordering::Acquire));
        let rows = seconds_to_drain(
            load(&slot.pending, &slot.reserved_pending) - RESUME_BELOW * bounds.max_pending as f64,
            rate(&slot.drain.rows_per_s),
        );
        let bytes = seconds_to_drain(
            load(&slot.bytes, &slot.reserved_bytes) - RESUME_BELOW * bounds.max_bytes as f64,
            rate(&slot.drain.bytes_per_s),
        );
        let wait = rows.max(bytes);
        let max_s = max_s.max(1);
        Some(if wait.is_finite() && wait < f64::from(max_s) {
            (wait.ceil() as u32).clamp(1, max_s)
        } else {
            max_s
        })
    }

    /// Hooks of `ordinal` in quarantine.
    pub fn quarantined(&self, ordinal: u32) -> i64 {
        self.slot(ordinal)
            .map_or(0, |slot| slot.quarantined.load(Ordering::Acquire))
    }

    /// Committed pending rows of `ordinal` (0: the node).
    pub fn pending(&self, ordinal: u32) -> i64 {
        self.slot(ordinal)
            .map_or(0, |slot| slot.pending.load(Ordering::Acquire))
    }

    pub fn bytes(&self, ordinal: u32) -> i64 {
        self.slot(ordinal)
            .map_or(0, |slot| slot.bytes.load(Ordering::Acquire))
    }

    /// Reserves `rows` pending rows of `size` bytes each for `ordinal`, unless that would
    /// take the tenant past `tenant` or the node past `node`. The reservation is returned
    /// by [`Reservation`]'s drop.
    pub fn reserve(
        &self,
        ordinal: u32,
        rows: u32,
        size: u32,
        tenant: Bounds,
        node: Bounds,
    ) -> Result<Reservation<'_>, Over> {
        let rows = i64::from(rows);
        let bytes = rows * i64::from(size);
        let (Some(tenant_slot), Some(node_slot)) = (self.slot(ordinal), self.slot(NODE_ORDINAL))
        else {
            // An ordinal past the table (64 Mi): nothing to check against.
            return Ok(Reservation {
                slots: None,
                rows,
                bytes,
            });
        };
        take(tenant_slot, rows, bytes, tenant).map_err(|()| Over::Tenant)?;
        if take(node_slot, rows, bytes, node).is_err() {
            give(tenant_slot, rows, bytes);
            return Err(Over::Node);
        }
        Ok(Reservation {
            slots: Some((tenant_slot, node_slot)),
            rows,
            bytes,
        })
    }
}

/// Adds to the reservation first and checks after, so two cores racing for the last room
/// cannot both get it (one may be refused spuriously, which is the safe side).
fn take(slot: &Slot, rows: i64, bytes: i64, bounds: Bounds) -> Result<(), ()> {
    let reserved_pending = slot.reserved_pending.fetch_add(rows, Ordering::AcqRel) + rows;
    let reserved_bytes = slot.reserved_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
    let pending = slot.pending.load(Ordering::Acquire) + reserved_pending;
    let total_bytes = slot.bytes.load(Ordering::Acquire) + reserved_bytes;
    if pending > bounds.max_pending as i64 || total_bytes > bounds.max_bytes as i64 {
        give(slot, rows, bytes);
        return Err(());
    }
    Ok(())
}

fn give(slot: &Slot, rows: i64, bytes: i64) {
    slot.reserved_pending.fetch_sub(rows, Ordering::AcqRel);
    slot.reserved_bytes.fetch_sub(bytes, Ordering::AcqRel);
}

/// Room taken for one envelope; given back on drop.
#[derive(Debug)]
pub struct Reservation<'g> {
    slots: Option<(&'g Slot, &'g Slot)>,
    rows: i64,
    bytes: i64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some((tenant, node)) = self.slots {
            give(tenant, self.rows, self.bytes);
            give(node, self.rows, self.bytes);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const WIDE: Bounds = Bounds {
        max_pending: u64::MAX >> 2,
        max_bytes: u64::MAX >> 2,
    };

    #[test]
    fn a_tenant_at_its_bound_is_refused_and_others_are_not() {
        let gauges = Gauges::new();
        let tenant = Bounds {
            max_pending: 3,
            max_bytes: 1 << 20,
        };
        let first = gauges.reserve(7, 2, 10, tenant, WIDE).expect("room for 2");
        assert_eq!(
            gauges
                .reserve(7, 2, 10, tenant, WIDE)
                .expect_err("over the bound"),
            Over::Tenant
        );
        let _other = gauges.reserve(8, 2, 10, tenant, WIDE).expect("own bound");
        // The first hook commits: the mirror takes it, then its reservation goes.
        let mut deltas = GaugeDeltas::default();
        deltas.push(7, Counter::Pending, 2);
        deltas.push(7, Counter::Bytes, 20);
        gauges.apply(&deltas);
        drop(first);
        assert_eq!(gauges.pending(7), 2);
        assert!(gauges.reserve(7, 1, 10, tenant, WIDE).is_ok());
        assert_eq!(
            gauges
                .reserve(7, 2, 10, tenant, WIDE)
                .expect_err("over the bound"),
            Over::Tenant
        );
    }

    #[test]
    fn bytes_and_the_node_bound_refuse_too() {
        let gauges = Gauges::new();
        let tenant = Bounds {
            max_pending: 100,
            max_bytes: 100,
        };
        assert_eq!(
            gauges
                .reserve(1, 2, 51, tenant, WIDE)
                .expect_err("over the bound"),
            Over::Tenant
        );
        let node = Bounds {
            max_pending: 4,
            max_bytes: u64::MAX >> 2,
        };
        let _a = gauges.reserve(1, 3, 1, tenant, node).expect("room");
        assert_eq!(
            gauges
                .reserve(2, 2, 1, tenant, node)
                .expect_err("over the bound"),
            Over::Node
        );
        // A node refusal gives the tenant's share back.
        drop(_a);
        assert!(gauges.reserve(2, 4, 1, tenant, node).is_ok());
    }

    fn drained(gauges: &Gauges, ordinal: u32, rows: i64, bytes: i64) {
        let mut deltas = GaugeDeltas::default();
        deltas.push(ordinal, Counter::Pending, -rows);
        deltas.push(ordinal, Counter::Bytes, -bytes);
        gauges.apply(&deltas);
    }

    #[test]
    fn retry_after_is_the_time_to_drain_under_the_resume_mark() {
        let gauges = Gauges::new();
        let bounds = Bounds {
            max_pending: 1_000,
            max_bytes: 1 << 30,
        };
        gauges.seed(3, [1_010, 1_010, 0]);
        assert_eq!(
            gauges.retry_after_s(3, bounds, 300),
            None,
            "not measured yet"
        );
        // 10 rows (10 bytes) leave in one second: 10 s to get from 1,000 to 900.
        drained(&gauges, 3, 10, 10);
        gauges.sample_drain(1.0);
        assert_eq!(gauges.drain_per_s(3), Some(10.0));
        assert_eq!(gauges.pending(3), 1_000);
        assert_eq!(gauges.retry_after_s(3, bounds, 300), Some(10));
        // Faster, smoothed: 0.3 × 200 + 0.7 × 10 = 67 rows/s; 800 pending is under the
        // mark already, so the minimum.
        drained(&gauges, 3, 200, 200);
        gauges.sample_drain(1.0);
        let rate = gauges.drain_per_s(3).unwrap();
        assert!((rate - 67.0).abs() < 1e-9, "{rate}");
        assert_eq!(gauges.pending(3), 800);
        assert_eq!(
            gauges.retry_after_s(3, bounds, 300),
            Some(1),
            "under the mark: the minimum"
        );
        // Nothing drains any more: the maximum, once the rate has decayed to nothing.
        gauges.seed(3, [1_000, 1_000, 0]);
        let mut stalled = 0.0;
        for _ in 0..200 {
            gauges.sample_drain(1.0);
            stalled = gauges.drain_per_s(3).unwrap();
        }
        assert!(stalled < 1e-20, "{stalled}");
        assert_eq!(gauges.retry_after_s(3, bounds, 300), Some(300));
    }

    #[test]
    fn bytes_can_set_the_retry_after_and_reservations_count() {
        let gauges = Gauges::new();
        let bounds = Bounds {
            max_pending: 1_000_000,
            max_bytes: 10_000,
        };
        gauges.seed(4, [10, 10_000, 0]);
        drained(&gauges, 4, 1, 500);
        gauges.sample_drain(2.0);
        // 9,500 bytes committed, 1,000 over the 9,000 mark... plus 2,000 reserved: 2,500
        // over at 250 bytes/s = 10 s. The rows are far under theirs.
        let _held = gauges
            .reserve(4, 2, 1_000, WIDE, WIDE)
            .expect("wide bounds");
        assert_eq!(gauges.retry_after_s(4, bounds, 300), Some(10));
        assert_eq!(
            gauges.retry_after_s(4, bounds, 7),
            Some(7),
            "clamped to the maximum"
        );
    }

    #[test]
    fn ingest_and_revives_are_no_drain() {
        let gauges = Gauges::new();
        let mut deltas = GaugeDeltas::default();
        deltas.push(6, Counter::Pending, 50);
        deltas.push(6, Counter::Bytes, 5_000);
        gauges.apply(&deltas);
        gauges.sample_drain(1.0);
        assert_eq!(gauges.drain_per_s(6), Some(0.0));
    }

    #[test]
    fn ordinals_far_apart_get_their_own_slots() {
        let gauges = Gauges::new();
        gauges.seed(5_000_000, [9, 90, 1]);
        assert_eq!(gauges.pending(5_000_000), 9);
        assert_eq!(gauges.bytes(5_000_000), 90);
        assert_eq!(gauges.pending(5_000_001), 0);
    }
}
