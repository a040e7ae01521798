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
//! Lock-free: slots live in chunks allocated on first use, found by ordinal.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

use super::keys::{Counter, NODE_ORDINAL};

const CHUNK: usize = 1024;
/// 64 Mi ordinals; a chunk of 1,024 slots is allocated when its first ordinal is used.
const CHUNKS: usize = 1 << 16;

#[derive(Debug, Default)]
struct Slot {
    pending: AtomicI64,
    bytes: AtomicI64,
    quarantined: AtomicI64,
    reserved_pending: AtomicI64,
    reserved_bytes: AtomicI64,
}

pub struct Gauges {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    /// The node's `lane_members`: the pipeline sweeps lanes only while it is above 0, and
    /// reads it every round, so it must not cost a store read.
    node_lane_members: AtomicI64,
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
            }
        }
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

    #[test]
    fn ordinals_far_apart_get_their_own_slots() {
        let gauges = Gauges::new();
        gauges.seed(5_000_000, [9, 90, 1]);
        assert_eq!(gauges.pending(5_000_000), 9);
        assert_eq!(gauges.bytes(5_000_000), 90);
        assert_eq!(gauges.pending(5_000_001), 0);
    }
}
