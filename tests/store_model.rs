//! Property test of the store's transitions: random sequences of ingest (with dedupe hits,
//! from two sources, some rows in ordering lanes), claim, deliver, retry, dead-letter,
//! revive, DLQ purge, quarantine, release and delete, lane sweeps, a release racing the
//! writer, source delete and tenant purge, each committed the way its owner commits it,
//! keep `store verify` passing (the lane invariant included), every counter equal to its
//! key count, the in-memory gauges equal to the counters, and every lane's head the one the
//! model predicts: the lowest waiting member, promoted only when the lane is free.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use std::collections::BTreeSet;

use ankusa::store::codec::{DeliveryRow, HookRecord, RowLane};
use ankusa::store::deliveries::lanes::{self, LaneFloors};
use ankusa::store::deliveries::{self, Class, Ingest, RowId, Transitions};
use ankusa::store::keys::{self, Counter, DueKind, LaneId};
use ankusa::store::{verify, Store, WriteBatch};
use proptest::prelude::*;

const TENANTS: u32 = 3;
const SOURCES: [&str; 2] = ["src", "other"];

#[derive(Debug, Clone)]
enum Op {
    Ingest {
        tenant: u32,
        source: usize,
        sinks: u16,
        size: u32,
        key: Option<u8>,
        /// Sink 0 is ordered, with this ordering key (`Some(None)`: the keyless lane).
        lane: Option<Option<u8>>,
    },
    /// The pipeline's lane sweep of one tenant.
    Sweep(u32),
    /// A lane head is delivered, and between the release's read and its commit the
    /// writer commits a new member of the same lane.
    RacingDeliver(usize),
    Claim(usize),
    Deliver(usize),
    Retry(usize),
    DeadFromInflight(usize),
    DeadFromDue(usize),
    Revive(usize),
    PurgeDead(usize),
    Quarantine(u32),
    Release(usize),
    DeleteQuarantined(usize),
    /// The `other` source leaves the config: its due rows are dead-lettered.
    DeleteSource,
    PurgeTenant(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..=TENANTS, 1u16..=3, 1u32..500, proptest::option::of(0u8..6), proptest::option::of(proptest::option::of(0u8..3))).prop_map(
            |(tenant, sinks, size, key, lane)| Op::Ingest { tenant, source: (size % 2) as usize, sinks, size, key, lane }
        ),
        2 => (1..=TENANTS).prop_map(Op::Sweep),
        1 => any::<usize>().prop_map(Op::RacingDeliver),
        3 => any::<usize>().prop_map(Op::Claim),
        2 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Retry),
        1 => any::<usize>().prop_map(Op::DeadFromInflight),
        1 => any::<usize>().prop_map(Op::DeadFromDue),
        1 => any::<usize>().prop_map(Op::Revive),
        1 => any::<usize>().prop_map(Op::PurgeDead),
        1 => (1..=TENANTS).prop_map(Op::Quarantine),
        1 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::DeleteQuarantined),
        1 => Just(Op::DeleteSource),
        1 => (1..=TENANTS).prop_map(Op::PurgeTenant),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Due(u64, DueKind),
    Inflight(DueKind),
    Dead,
    /// Waiting in its lane.
    Member,
}

/// One lane as the model sees it.
#[derive(Debug, Default)]
struct Lane {
    head: Option<RowId>,
    /// Waiting rows, (seq, sink): the lowest goes first.
    members: BTreeSet<(u64, u16)>,
    marker: bool,
}

#[derive(Default)]
struct Model {
    next_seq: u64,
    rows: HashMap<RowId, (State, u32)>,
    /// The source of every hook with rows.
    sources: HashMap<(u32, u64), usize>,
    quarantined: Vec<(u32, u64)>,
    dedupe: HashSet<(u32, usize, u8)>,
    duplicates: HashMap<u32, i64>,
    /// Tenant `t{n}` → its ordinal now (a purge gives a declared tenant a new one).
    ordinals: HashMap<u32, u32>,
    now: u64,
    /// The lane of every laned row, and every lane.
    row_lanes: HashMap<RowId, RowLane>,
    lanes: HashMap<(u32, LaneId), Lane>,
}

impl Model {
    fn pick(&self, want: impl Fn(State) -> bool, index: usize) -> Option<(RowId, State, u32)> {
        let mut matching: Vec<_> = self
            .rows
            .iter()
            .filter(|(_, (state, _))| want(*state))
            .map(|(id, (state, size))| (*id, *state, *size))
            .collect();
        matching.sort_by_key(|(id, _, _)| *id);
        (!matching.is_empty()).then(|| matching[index % matching.len()])
    }

    fn lane_of(&mut self, id: RowId) -> Option<&mut Lane> {
        let lane = self.row_lanes.get(&id)?.id;
        self.lanes.get_mut(&(id.ordinal, lane))
    }

    /// The head `id` left `?D`/`?F`: the lowest member becomes the head, due now.
    fn release(&mut self, id: RowId) {
        let now = self.now;
        let Some(lane) = self.lane_of(id) else {
            return;
        };
        assert_eq!(lane.head, Some(id), "only a head is released");
        lane.head = None;
        if let Some(&(seq, sink)) = lane.members.iter().next() {
            lane.members.remove(&(seq, sink));
            let next = RowId {
                ordinal: id.ordinal,
                seq,
                sink,
            };
            lane.head = Some(next);
            lane.marker = false;
            let size = self.rows[&next].1;
            self.rows
                .insert(next, (State::Due(now, DueKind::LaneFirstAttempt), size));
        }
    }

    fn hook_has_rows(&self, ordinal: u32, seq: u64) -> bool {
        self.rows
            .keys()
            .any(|id| id.ordinal == ordinal && id.seq == seq)
    }
}

fn hook_value(tenant: u32, source: usize, key: &[u8], body_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    HookRecord {
        source_id: SOURCES[source].into(),
        tenant_id: format!("t{tenant}"),
        received_at_ms: 1_000,
        dedupe_key: key.to_vec(),
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: vec![b'x'; body_len],
    }
    .encode(&mut out);
    out
}

fn row(store: &Store, id: RowId) -> DeliveryRow {
    DeliveryRow::decode(&deliveries::read_row(store, id).unwrap().unwrap()).unwrap()
}

/// The ordering key a row's lane was made from (`None`: the keyless lane).
fn key_of(lane: &RowLane) -> Option<u8> {
    lane.ordering_key.as_bytes().first().copied()
}

fn hex_lane(lane: &LaneId) -> String {
    lane.iter().map(|b| format!("{b:02x}")).collect()
}

fn sink_ids(count: u16) -> Vec<String> {
    (0..count).map(|sink| format!("http-{sink}")).collect()
}

/// The writer's batch for one new hook, committed and mirrored as the committer does.
#[allow(clippy::too_many_arguments)]
fn ingest_hook(
    store: &Store,
    model: &mut Model,
    tenant: u32,
    source: usize,
    sinks: u16,
    size: u32,
    key: Option<u8>,
    lane: Option<Option<u8>>,
    releases: Option<u64>,
) {
    let mut ingest = Ingest::new();
    let mut batch = WriteBatch::default();
    if let Some(seq) = releases {
        ingest.unquarantine(store, &mut batch, tenant, seq);
    }
    let dedupe_key = key.map(|key| {
        let mut full = Vec::new();
        keys::dedupe(&mut full, tenant, SOURCES[source], &[key]);
        full
    });
    let seen = match &dedupe_key {
        Some(full) => Ingest::remembered(store, full, model.now).unwrap(),
        None => None,
    };
    assert_eq!(
        seen.is_some(),
        key.is_some_and(|key| model.dedupe.contains(&(tenant, source, key)))
    );
    if seen.is_some() {
        ingest.duplicate(tenant);
        *model.duplicates.entry(tenant).or_default() += 1;
    } else {
        model.next_seq += 1;
        let seq = model.next_seq;
        let value = hook_value(tenant, source, &[], size as usize);
        model.sources.insert((tenant, seq), source);
        let row_lanes: Vec<Option<RowLane>> = match lane {
            None => Vec::new(),
            Some(key) => (0..sinks)
                .map(|sink| {
                    (sink == 0).then(|| {
                        RowLane::new(0, SOURCES[source], key.as_ref().map(std::slice::from_ref))
                    })
                })
                .collect(),
        };
        ingest.add(
            store,
            &mut batch,
            tenant,
            seq,
            &value,
            &sink_ids(sinks),
            &row_lanes,
            size,
            model.now,
            Class::Live,
        );
        if let (Some(full), Some(key)) = (&dedupe_key, key) {
            ingest.remember(store, &mut batch, full, seq, u64::MAX);
            model.dedupe.insert((tenant, source, key));
        }
        for sink in 0..sinks {
            let id = RowId {
                ordinal: tenant,
                seq,
                sink,
            };
            match row_lanes.get(usize::from(sink)).cloned().flatten() {
                None => {
                    model
                        .rows
                        .insert(id, (State::Due(model.now, DueKind::FirstAttempt), size));
                }
                Some(row_lane) => {
                    let lane = model.lanes.entry((tenant, row_lane.id)).or_default();
                    lane.members.insert((seq, sink));
                    lane.marker = true;
                    model.row_lanes.insert(id, row_lane);
                    model.rows.insert(id, (State::Member, size));
                }
            }
        }
    }
    let gauges = ingest.seal(store, &mut batch, model.next_seq);
    store.write(batch, false).unwrap();
    store.gauges().apply(&gauges);
}

/// `floors` are the pipeline core's: every batch here seeks and sets lane floors as the
/// core's do, so a floor that skipped a revived member would promote out of order.
fn apply(store: &Store, floors: &LaneFloors, model: &mut Model, op: Op) {
    model.now += 1;
    let now = model.now;
    match op {
        Op::Ingest {
            tenant,
            source,
            sinks,
            size,
            key,
            lane,
        } => {
            let ordinal = model.ordinals[&tenant];
            ingest_hook(store, model, ordinal, source, sinks, size, key, lane, None)
        }
        Op::Sweep(tenant) => {
            let ordinal = model.ordinals[&tenant];
            let swept = lanes::sweep_at(store, Some(floors), ordinal, 1_000, now).unwrap();
            let mut promoted = 0;
            let marked: Vec<LaneId> = model
                .lanes
                .iter()
                .filter(|((o, _), lane)| *o == ordinal && lane.marker)
                .map(|((_, id), _)| *id)
                .collect();
            assert_eq!(swept.markers, marked.len(), "markers read");
            for lane_id in marked {
                let lane = model.lanes.get_mut(&(ordinal, lane_id)).unwrap();
                lane.marker = false;
                if lane.head.is_none() {
                    if let Some(&(seq, sink)) = lane.members.iter().next() {
                        lane.members.remove(&(seq, sink));
                        let next = RowId { ordinal, seq, sink };
                        lane.head = Some(next);
                        let size = model.rows[&next].1;
                        model
                            .rows
                            .insert(next, (State::Due(now, DueKind::LaneFirstAttempt), size));
                        promoted += 1;
                    }
                }
            }
            assert_eq!(swept.promoted, promoted, "lanes promoted");
        }
        Op::RacingDeliver(index) => {
            let Some((id, State::Inflight(_), _)) =
                model.pick(|s| matches!(s, State::Inflight(_)), index)
            else {
                return;
            };
            let Some(row_lane) = model.row_lanes.get(&id).cloned() else {
                return;
            };
            let source = model.sources[&(id.ordinal, id.seq)];
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            // The release reads the lane's members now...
            t.delivered(id, &row(store, id)).unwrap();
            model.rows.remove(&id);
            model.release(id);
            if !model.hook_has_rows(id.ordinal, id.seq) {
                let hook = deliveries::read_hook(store, id.ordinal, id.seq)
                    .unwrap()
                    .unwrap();
                t.archive_hook(id.ordinal, id.seq, now, &hook);
            }
            // ...the writer commits a member of the same lane...
            let key = key_of(&row_lane);
            ingest_hook(
                store,
                model,
                id.ordinal,
                source,
                1,
                7,
                None,
                Some(key),
                None,
            );
            // ...and the release commits after it. A release that promoted deletes the
            // marker the writer put (the new member has a head); one that left the lane
            // idle leaves it, and the sweep promotes the new member.
            t.commit(false).unwrap();
            let lane = model.lanes.get_mut(&(id.ordinal, row_lane.id)).unwrap();
            if lane.head.is_some() {
                lane.marker = false;
            }
        }
        Op::Claim(index) => {
            let Some((id, State::Due(due, kind), size)) =
                model.pick(|s| matches!(s, State::Due(..)), index)
            else {
                return;
            };
            let mut claimed = row(store, id);
            claimed.attempts += 1;
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.claim(id, due, kind, &claimed, now);
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Inflight(kind), size));
        }
        Op::Deliver(index) => {
            let Some((id, _, _)) = model.pick(|s| matches!(s, State::Inflight(_)), index) else {
                return;
            };
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.delivered(id, &row(store, id)).unwrap();
            model.rows.remove(&id);
            model.release(id);
            if !model.hook_has_rows(id.ordinal, id.seq) {
                let hook = deliveries::read_hook(store, id.ordinal, id.seq)
                    .unwrap()
                    .unwrap();
                t.archive_hook(id.ordinal, id.seq, now, &hook);
            }
            t.commit(false).unwrap();
        }
        Op::Retry(index) => {
            let Some((id, _, size)) = model.pick(|s| matches!(s, State::Inflight(_)), index) else {
                return;
            };
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.retry(id, &row(store, id), now + 10, Class::Live);
            t.commit(false).unwrap();
            let kind = if model.row_lanes.contains_key(&id) {
                DueKind::LaneRetry
            } else {
                DueKind::Retry
            };
            model.rows.insert(id, (State::Due(now + 10, kind), size));
        }
        Op::DeadFromInflight(index) => {
            let Some((id, _, size)) = model.pick(|s| matches!(s, State::Inflight(_)), index) else {
                return;
            };
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.dead_from_inflight(id, &row(store, id), "http 400")
                .unwrap();
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Dead, size));
            model.release(id);
        }
        Op::DeadFromDue(index) => {
            let Some((id, State::Due(due, kind), size)) =
                model.pick(|s| matches!(s, State::Due(..)), index)
            else {
                return;
            };
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.dead_from_due(
                id,
                due,
                size,
                Some(kind),
                Some(&row(store, id)),
                "sink_gone",
            )
            .unwrap();
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Dead, size));
            model.release(id);
        }
        Op::Revive(index) => {
            let Some((id, _, size)) = model.pick(|s| s == State::Dead, index) else {
                return;
            };
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.revive(id, &row(store, id), now, Class::Live);
            t.commit(false).unwrap();
            match model.lane_of(id) {
                // Back into its lane, behind the head if there is one.
                Some(lane) => {
                    lane.members.insert((id.seq, id.sink));
                    lane.marker = true;
                    model.rows.insert(id, (State::Member, size));
                }
                None => {
                    model
                        .rows
                        .insert(id, (State::Due(now, DueKind::FirstAttempt), size));
                }
            }
        }
        Op::PurgeDead(index) => {
            let Some((id, _, _)) = model.pick(|s| s == State::Dead, index) else {
                return;
            };
            model.rows.remove(&id);
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.purge_dead(id);
            if !model.hook_has_rows(id.ordinal, id.seq) {
                t.delete_hook(id.ordinal, id.seq);
            }
            t.commit(false).unwrap();
        }
        Op::Quarantine(tenant) => {
            let tenant = model.ordinals[&tenant];
            model.next_seq += 1;
            let seq = model.next_seq;
            let mut ingest = Ingest::new();
            let mut batch = WriteBatch::default();
            ingest.quarantine(
                store,
                &mut batch,
                tenant,
                seq,
                &hook_value(tenant, 0, &[], 10),
                "signature_invalid",
            );
            let gauges = ingest.seal(store, &mut batch, seq);
            store.write(batch, false).unwrap();
            store.gauges().apply(&gauges);
            model.quarantined.push((tenant, seq));
        }
        Op::Release(index) => {
            if model.quarantined.is_empty() {
                return;
            }
            let (tenant, seq) = model.quarantined.remove(index % model.quarantined.len());
            // A released hook is keyed like a new one: here by a key that may repeat.
            let key = Some((seq % 6) as u8);
            ingest_hook(store, model, tenant, 0, 1, 10, key, None, Some(seq));
        }
        Op::DeleteQuarantined(index) => {
            if model.quarantined.is_empty() {
                return;
            }
            let (tenant, seq) = model.quarantined.remove(index % model.quarantined.len());
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.delete_quarantined(tenant, seq);
            t.commit(false).unwrap();
        }
        Op::DeleteSource => {
            // What the pipeline's sweep after a reload does: every due row of the gone
            // source is dead-lettered; a lane head takes its lane's members along.
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            let mut gone = Vec::new();
            let mut due: Vec<(RowId, u64, DueKind, u32)> = model
                .rows
                .iter()
                .filter_map(|(id, (state, size))| match state {
                    State::Due(due, kind) => Some((*id, *due, *kind, *size)),
                    _ => None,
                })
                .filter(|(id, ..)| model.sources.get(&(id.ordinal, id.seq)) == Some(&1))
                .collect();
            due.sort_by_key(|(id, ..)| *id);
            for (id, due_ms, kind, size) in due {
                let stored = row(store, id);
                match model.row_lanes.get(&id).cloned() {
                    None => {
                        t.dead_from_due(id, due_ms, size, Some(kind), Some(&stored), "source_gone")
                            .unwrap();
                        gone.push((id, size));
                    }
                    Some(row_lane) => {
                        t.dead_gone_lane(
                            id,
                            due_ms,
                            kind,
                            &stored,
                            &row_lane.id,
                            "source_gone",
                            |_| Some("source_gone".into()),
                        )
                        .unwrap();
                        gone.push((id, size));
                        let lane = model.lanes.get_mut(&(id.ordinal, row_lane.id)).unwrap();
                        lane.head = None;
                        for (seq, sink) in std::mem::take(&mut lane.members) {
                            let member = RowId {
                                ordinal: id.ordinal,
                                seq,
                                sink,
                            };
                            gone.push((member, model.rows[&member].1));
                        }
                    }
                }
            }
            t.commit(false).unwrap();
            for (id, size) in gone {
                model.rows.insert(id, (State::Dead, size));
            }
        }
        Op::PurgeTenant(tenant) => {
            let ordinal = model.ordinals[&tenant];
            let id = format!("t{tenant}");
            let counters: Vec<(Counter, i64)> = Counter::ALL
                .iter()
                .map(|field| (*field, store.counter(ordinal, *field).unwrap()))
                .collect();
            let mut t = Transitions::at(store, now).with_lane_floors(floors);
            t.purge_tenant(ordinal, &id, &counters);
            t.commit(false).unwrap();
            let next = store.ensure_tenants([id.as_str()]).unwrap()[0].1;
            assert!(next > ordinal, "ordinals are never reused");
            model.ordinals.insert(tenant, next);
            model.rows.retain(|id, _| id.ordinal != ordinal);
            model.sources.retain(|(o, _), _| *o != ordinal);
            model.quarantined.retain(|(o, _)| *o != ordinal);
            model.dedupe.retain(|(o, _, _)| *o != ordinal);
            model.duplicates.remove(&ordinal);
            model.row_lanes.retain(|id, _| id.ordinal != ordinal);
            model.lanes.retain(|(o, _), _| *o != ordinal);
        }
    }
}

fn check(store: &Store, model: &Model) -> Result<(), TestCaseError> {
    let report = verify::verify(store).unwrap();
    prop_assert!(
        report.clean(),
        "{:?} {:?}",
        report.problems,
        report.repairable
    );
    let ordinals: Vec<u32> = std::iter::once(keys::NODE_ORDINAL)
        .chain(model.ordinals.values().copied())
        .collect();
    for ordinal in ordinals {
        let gauges = store.gauges();
        prop_assert_eq!(
            gauges.pending(ordinal),
            store.counter(ordinal, Counter::Pending).unwrap()
        );
        prop_assert_eq!(
            gauges.bytes(ordinal),
            store.counter(ordinal, Counter::Bytes).unwrap()
        );
        prop_assert_eq!(
            gauges.quarantined(ordinal),
            store.counter(ordinal, Counter::Quarantined).unwrap()
        );
        let dups = if ordinal == keys::NODE_ORDINAL {
            model.duplicates.values().sum()
        } else {
            model.duplicates.get(&ordinal).copied().unwrap_or(0)
        };
        prop_assert_eq!(store.counter(ordinal, Counter::DedupedTotal).unwrap(), dups);
    }
    for (&(ordinal, lane_id), lane) in &model.lanes {
        let head = lanes::head(store, ordinal, &lane_id).unwrap();
        prop_assert_eq!(
            head,
            lane.head.map(|id| (id.seq, id.sink)),
            "the head of lane {}",
            hex_lane(&lane_id)
        );
        let first = lanes::first_member(store, ordinal, &lane_id)
            .unwrap()
            .map(|(seq, sink, _)| (seq, sink));
        prop_assert_eq!(first, lane.members.iter().next().copied());
    }
    let members: i64 = model.lanes.values().map(|l| l.members.len() as i64).sum();
    let heads = model.lanes.values().filter(|l| l.head.is_some()).count() as i64;
    prop_assert_eq!(
        store
            .counter(keys::NODE_ORDINAL, Counter::LaneMembers)
            .unwrap(),
        members
    );
    prop_assert_eq!(
        store.counter(keys::NODE_ORDINAL, Counter::Lanes).unwrap(),
        heads
    );
    let pending = model
        .rows
        .values()
        .filter(|(s, _)| *s != State::Dead)
        .count() as i64;
    prop_assert_eq!(
        store.counter(keys::NODE_ORDINAL, Counter::Pending).unwrap(),
        pending
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn transitions_keep_counters_keys_and_gauges_equal(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let names: Vec<String> = (1..=TENANTS).map(|t| format!("t{t}")).collect();
        let assigned = store.ensure_tenants(names.iter().map(String::as_str)).unwrap();
        let mut model = Model::default();
        for (index, (_, ordinal)) in assigned.into_iter().enumerate() {
            model.ordinals.insert(index as u32 + 1, ordinal);
        }
        let floors = LaneFloors::new();
        for op in ops {
            apply(&store, &floors, &mut model, op);
            check(&store, &model)?;
        }
    }
}
