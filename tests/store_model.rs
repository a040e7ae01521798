//! Property test of the store's transitions: random sequences of ingest (with dedupe hits,
//! from two sources), claim, deliver, retry, dead-letter, revive, DLQ purge, quarantine,
//! release and delete, source delete and tenant purge, each committed the way its owner
//! commits it, keep `store verify` passing, every counter equal to its key count, and the
//! in-memory gauges equal to the counters.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};

use ankusa::store::codec::{DeliveryRow, HookRecord};
use ankusa::store::deliveries::{self, Ingest, RowId, Transitions};
use ankusa::store::keys::{self, Counter};
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
    },
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
        3 => (1..=TENANTS, 1u16..=3, 1u32..500, proptest::option::of(0u8..6)).prop_map(
            |(tenant, sinks, size, key)| Op::Ingest { tenant, source: (size % 2) as usize, sinks, size, key }
        ),
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
    Due(u64),
    Inflight,
    Dead,
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
        ingest.add(
            store,
            &mut batch,
            tenant,
            seq,
            &value,
            &sink_ids(sinks),
            size,
            model.now,
        );
        if let (Some(full), Some(key)) = (&dedupe_key, key) {
            ingest.remember(store, &mut batch, full, seq, u64::MAX);
            model.dedupe.insert((tenant, source, key));
        }
        for sink in 0..sinks {
            model.rows.insert(
                RowId {
                    ordinal: tenant,
                    seq,
                    sink,
                },
                (State::Due(model.now), size),
            );
        }
    }
    let gauges = ingest.seal(store, &mut batch, model.next_seq);
    store.write(batch, false).unwrap();
    store.gauges().apply(&gauges);
}

fn apply(store: &Store, model: &mut Model, op: Op) {
    model.now += 1;
    let now = model.now;
    match op {
        Op::Ingest {
            tenant,
            source,
            sinks,
            size,
            key,
        } => {
            let ordinal = model.ordinals[&tenant];
            ingest_hook(store, model, ordinal, source, sinks, size, key, None)
        }
        Op::Claim(index) => {
            let Some((id, State::Due(due), size)) =
                model.pick(|s| matches!(s, State::Due(_)), index)
            else {
                return;
            };
            let mut claimed = row(store, id);
            claimed.attempts += 1;
            let mut t = Transitions::new(store);
            t.claim(id, due, &claimed, now);
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Inflight, size));
        }
        Op::Deliver(index) => {
            let Some((id, _, size)) = model.pick(|s| s == State::Inflight, index) else {
                return;
            };
            model.rows.remove(&id);
            let mut t = Transitions::new(store);
            t.delivered(id, size);
            if !model.hook_has_rows(id.ordinal, id.seq) {
                let hook = deliveries::read_hook(store, id.ordinal, id.seq)
                    .unwrap()
                    .unwrap();
                t.archive_hook(id.ordinal, id.seq, now, &hook);
            }
            t.commit(false).unwrap();
        }
        Op::Retry(index) => {
            let Some((id, _, size)) = model.pick(|s| s == State::Inflight, index) else {
                return;
            };
            let mut t = Transitions::new(store);
            t.retry(id, &row(store, id), now + 10);
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Due(now + 10), size));
        }
        Op::DeadFromInflight(index) => {
            let Some((id, _, size)) = model.pick(|s| s == State::Inflight, index) else {
                return;
            };
            let mut t = Transitions::new(store);
            t.dead_from_inflight(id, &row(store, id), "http 400");
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Dead, size));
        }
        Op::DeadFromDue(index) => {
            let Some((id, State::Due(due), size)) =
                model.pick(|s| matches!(s, State::Due(_)), index)
            else {
                return;
            };
            let mut t = Transitions::new(store);
            t.dead_from_due(id, due, size, Some(&row(store, id)), "sink_gone");
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Dead, size));
        }
        Op::Revive(index) => {
            let Some((id, _, size)) = model.pick(|s| s == State::Dead, index) else {
                return;
            };
            let mut t = Transitions::new(store);
            t.revive(id, &row(store, id), now);
            t.commit(false).unwrap();
            model.rows.insert(id, (State::Due(now), size));
        }
        Op::PurgeDead(index) => {
            let Some((id, _, _)) = model.pick(|s| s == State::Dead, index) else {
                return;
            };
            model.rows.remove(&id);
            let mut t = Transitions::new(store);
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
            ingest_hook(store, model, tenant, 0, 1, 10, key, Some(seq));
        }
        Op::DeleteQuarantined(index) => {
            if model.quarantined.is_empty() {
                return;
            }
            let (tenant, seq) = model.quarantined.remove(index % model.quarantined.len());
            let mut t = Transitions::new(store);
            t.delete_quarantined(tenant, seq);
            t.commit(false).unwrap();
        }
        Op::DeleteSource => {
            let mut t = Transitions::new(store);
            let mut gone = Vec::new();
            for (id, (state, size)) in &model.rows {
                if let State::Due(due) = state {
                    if model.sources.get(&(id.ordinal, id.seq)) == Some(&1) {
                        t.dead_from_due(*id, *due, *size, Some(&row(store, *id)), "source_gone");
                        gone.push((*id, *size));
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
            let mut t = Transitions::new(store);
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
        }
    }
}

fn check(store: &Store, model: &Model) -> Result<(), TestCaseError> {
    let report = verify::verify(store).unwrap();
    prop_assert!(report.ok(), "{:?}", report.problems);
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
        for op in ops {
            apply(&store, &mut model, op);
            check(&store, &model)?;
        }
    }
}
