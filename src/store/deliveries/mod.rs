//! Delivery rows and every transition of them (DESIGN section 3). Each transition is a
//! method of [`Transitions`], which adds its puts, deletes and counter deltas to one
//! `WriteBatch`; nothing else in the crate moves a row between `?D`, `?F` and `?X`, so
//! the invariant `store verify` checks — a delivery row has exactly one index key, and
//! every counter equals the keys it counts — holds by construction.
//!
//! | transition   | from → to        | counters                                                  |
//! |--------------|------------------|-----------------------------------------------------------|
//! | `Ingest::add`| new → `?D`       | pending +1, bytes +size, ingested_total +1 (per hook)     |
//! | `claim`      | `?D` → `?F`      | inflight +1                                               |
//! | `park`       | `?D` → `?D'`     | —                                                         |
//! | `delivered`  | `?F` → gone      | pending −1, bytes −size, inflight −1, delivered_total +1  |
//! | `retry`      | `?F` → `?D`      | inflight −1                                               |
//! | `dead_*`     | `?F`/`?D` → `?X` | pending −1, bytes −size, (inflight −1), dead +1, dead_lettered_total +1 |
//! | `recover`    | `?F` → `?D`      | inflight −1                                               |
//! | `drop_orphan_due` | `?D` → gone (no row) | pending −1, bytes −size                          |
//! | `revive`     | `?X` → `?D`      | dead −1, pending +1, bytes +size                          |
//! | `purge_dead` | `?X` → gone      | dead −1                                                   |
//! | `Ingest::quarantine` | new → `?Q` (hook, no rows) | quarantined +1                      |
//! | `Ingest::unquarantine` | `?Q` → gone (release) | quarantined −1                         |
//! | `delete_quarantined` | `?Q` → gone (operator delete) | quarantined −1                 |
//! | `purge_tenant` | every key of the ordinal → gone | the tenant's counter keys erased; node −each |
//!
//! A row of an ordered sink lives in a lane ([`lanes`]): it is ingested as a member
//! (`?O`, no `?D`), promoted to the lane's head (`?H` plus `?D` of kind 2) when its turn
//! comes, and every terminal transition of a head releases its lane in the same batch.
//! The table's transitions do that themselves for a row with a lane; see [`lanes`] for the
//! lane counters they move.
//!
//! The readers here are bounded: every scan has an upper bound and a limit.

pub mod lanes;

use std::collections::HashMap;

use super::codec::{DeliveryRow, RowLane};
use super::gauges::GaugeDeltas;
use super::keys::{self, Counter, DueKind, Tag};
use super::{Store, StoreError, WriteBatch, CF_ARCHIVE, CF_DELIVERIES, CF_HOOKS, CF_INDEX};

/// One delivery row: which tenant, hook and sink of the hook's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowId {
    pub ordinal: u32,
    pub seq: u64,
    pub sink: u16,
}

/// Which class a row waits in. Rows an archive replay or a DLQ revive-all put back wait in
/// the replay class (due kinds 4 and 5, first attempt and retry): the pipeline runs at most
/// the tenant's `replay_concurrency` of them at once per sink, beside live rows, so a
/// replay never takes the slots live hooks need. A lane's rows have no class (their lane
/// orders them), nor has a row put back after a crash (`recover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Live,
    Replay,
}

impl Class {
    /// The due kind of a first attempt in this class.
    pub fn first_attempt(self) -> DueKind {
        match self {
            Class::Live => DueKind::FirstAttempt,
            Class::Replay => DueKind::ReplayFirstAttempt,
        }
    }

    /// The due kind of a retry in this class.
    pub fn retry(self) -> DueKind {
        match self {
            Class::Live => DueKind::Retry,
            Class::Replay => DueKind::ReplayRetry,
        }
    }

    /// The class of a row due with `kind`.
    pub fn of(kind: DueKind) -> Class {
        if kind.is_replay() {
            Class::Replay
        } else {
            Class::Live
        }
    }
}

/// Counter deltas of one batch, per tenant; written as merges, with the node aggregate
/// (ordinal 0) moved by the same sums.
#[derive(Debug, Default)]
pub struct CounterDeltas {
    per_tenant: HashMap<u32, [i64; Counter::ALL.len()]>,
    /// Deltas of the node aggregate alone (a purge: the tenant's own keys are erased).
    node_only: [i64; Counter::ALL.len()],
}

impl CounterDeltas {
    pub fn add(&mut self, ordinal: u32, field: Counter, delta: i64) {
        let slot = self
            .per_tenant
            .entry(ordinal)
            .or_insert([0; Counter::ALL.len()]);
        slot[field as usize - 1] += delta;
    }

    pub fn is_empty(&self) -> bool {
        self.per_tenant.is_empty() && self.node_only.iter().all(|delta| *delta == 0)
    }

    /// Moves the node aggregate only.
    pub fn add_node_only(&mut self, field: Counter, delta: i64) {
        self.node_only[field as usize - 1] += delta;
    }

    /// The tenants with a delta, each once.
    pub fn tenants(&self) -> impl Iterator<Item = u32> + '_ {
        self.per_tenant.keys().copied()
    }

    /// The tenants whose `field` grows, each once.
    pub fn tenants_growing(&self, field: Counter) -> impl Iterator<Item = u32> + '_ {
        self.per_tenant
            .iter()
            .filter(move |(_, deltas)| deltas[field as usize - 1] > 0)
            .map(|(ordinal, _)| *ordinal)
    }

    /// Adds the merges to `batch` and clears the deltas. `key` is a scratch buffer. The
    /// returned pending and bytes deltas go to [`Store::gauges`] once the batch commits.
    #[must_use = "apply the gauge deltas after the batch commits"]
    pub fn drain_into(
        &mut self,
        store: &Store,
        batch: &mut WriteBatch,
        key: &mut Vec<u8>,
    ) -> GaugeDeltas {
        let mut gauges = GaugeDeltas::default();
        let mut node = std::mem::take(&mut self.node_only);
        for (ordinal, deltas) in self.per_tenant.drain() {
            for (index, delta) in deltas.iter().enumerate() {
                if *delta != 0 {
                    key.clear();
                    keys::counter(key, ordinal, Counter::ALL[index]);
                    store.merge_cf(batch, CF_INDEX, key, &keys::encode_counter_delta(*delta));
                    gauges.push(ordinal, Counter::ALL[index], *delta);
                    node[index] += delta;
                }
            }
        }
        for (index, delta) in node.iter().enumerate() {
            if *delta != 0 {
                key.clear();
                keys::counter(key, keys::NODE_ORDINAL, Counter::ALL[index]);
                store.merge_cf(batch, CF_INDEX, key, &keys::encode_counter_delta(*delta));
                gauges.push(keys::NODE_ORDINAL, Counter::ALL[index], *delta);
            }
        }
        gauges
    }
}

/// The ingest transition, the writer's: a hook, and per sink of its source a new delivery
/// row and a first-attempt due key, counted. [`Ingest::seal`] adds once per batch what
/// belongs there: the tenants' active markers, the counter merges and the seq mark. Blind
/// puts and merges only: the writer never reads a row to write it.
#[derive(Debug, Default)]
pub struct Ingest {
    /// Reused for every key and value of every batch.
    key: Vec<u8>,
    value: Vec<u8>,
    deltas: CounterDeltas,
}

impl Ingest {
    pub fn new() -> Ingest {
        Ingest {
            key: Vec::with_capacity(64),
            value: Vec::with_capacity(64),
            deltas: CounterDeltas::default(),
        }
    }

    /// `lanes` is empty when no sink of the source is ordered, else aligned with
    /// `sink_ids`: the lane of each ordered sink's row. A laned row joins its lane as a
    /// member (`?O` and the lane's `?P` marker, no `?D`): blind puts, no read of lane state.
    /// An unlaned row's first attempt waits in `class`.
    #[allow(clippy::too_many_arguments)]
    pub fn add<S: AsRef<str>>(
        &mut self,
        store: &Store,
        batch: &mut WriteBatch,
        ordinal: u32,
        seq: u64,
        hook_value: &[u8],
        sink_ids: &[S],
        lanes: &[Option<RowLane>],
        size: u32,
        due_ms: u64,
        class: Class,
    ) {
        self.key.clear();
        keys::hook(&mut self.key, ordinal, seq);
        store.put_cf(batch, CF_HOOKS, &self.key, hook_value);
        let due_value = keys::due_value(size, class.first_attempt());
        for (sink, sink_id) in sink_ids.iter().enumerate() {
            let lane = lanes.get(sink).and_then(Option::as_ref);
            let sink = sink as u16;
            self.key.clear();
            keys::delivery(&mut self.key, ordinal, seq, sink);
            self.value.clear();
            DeliveryRow::encode_new(&mut self.value, sink_id.as_ref(), size, lane);
            store.put_cf(batch, CF_DELIVERIES, &self.key, &self.value);
            self.key.clear();
            match lane {
                None => {
                    keys::due(&mut self.key, ordinal, due_ms, seq, sink);
                    store.put_cf(batch, CF_INDEX, &self.key, &due_value);
                }
                Some(lane) => {
                    let id = RowId { ordinal, seq, sink };
                    lanes::put_member(store, batch, &mut self.key, id, &lane.id, size);
                    self.deltas.add(ordinal, Counter::LaneMembers, 1);
                }
            }
        }
        let rows = sink_ids.len() as i64;
        self.deltas.add(ordinal, Counter::Pending, rows);
        self.deltas
            .add(ordinal, Counter::Bytes, rows * i64::from(size));
        self.deltas.add(ordinal, Counter::IngestedTotal, 1);
    }

    /// The dedupe entry `key` (a full `?K` key) names a hook that is still inside its
    /// window: that hook's seq. An expired entry the compaction has not removed yet counts
    /// as absent. The one read of the ingest path: `?K` has one appender, the writer.
    pub fn remembered(
        store: &Store,
        dedupe_key: &[u8],
        now_ms: u64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(value) = store.get(CF_INDEX, dedupe_key)? else {
            return Ok(None);
        };
        match keys::parse_dedupe_value(&value) {
            Ok((seq, expires_ms)) if expires_ms > now_ms => Ok(Some(seq)),
            Ok(_) => Ok(None),
            Err(error) => Err(StoreError::Corrupt {
                what: "dedupe entry".into(),
                reason: error.to_string(),
            }),
        }
    }

    /// Puts the dedupe entry of a hook added to this batch.
    pub fn remember(
        &mut self,
        store: &Store,
        batch: &mut WriteBatch,
        dedupe_key: &[u8],
        seq: u64,
        expires_ms: u64,
    ) {
        store.put_cf(
            batch,
            CF_INDEX,
            dedupe_key,
            &keys::dedupe_value(seq, expires_ms),
        );
    }

    /// Keeps a hook that failed verification or could not be decoded: the hook row and its
    /// `?Q` key with the reason, no delivery rows.
    pub fn quarantine(
        &mut self,
        store: &Store,
        batch: &mut WriteBatch,
        ordinal: u32,
        seq: u64,
        hook_value: &[u8],
        reason: &str,
    ) {
        self.key.clear();
        keys::hook(&mut self.key, ordinal, seq);
        store.put_cf(batch, CF_HOOKS, &self.key, hook_value);
        self.key.clear();
        keys::quarantine(&mut self.key, ordinal, seq);
        store.put_cf(batch, CF_INDEX, &self.key, reason.as_bytes());
        self.deltas.add(ordinal, Counter::Quarantined, 1);
    }

    /// Takes a quarantined hook out: its hook row and `?Q` key go. Blind deletes: the
    /// caller (a release, through the writer) has read that the key exists, and nothing
    /// else removes quarantine keys while the admin's one worker is releasing.
    pub fn unquarantine(&mut self, store: &Store, batch: &mut WriteBatch, ordinal: u32, seq: u64) {
        self.key.clear();
        keys::hook(&mut self.key, ordinal, seq);
        store.delete_cf(batch, CF_HOOKS, &self.key);
        self.key.clear();
        keys::quarantine(&mut self.key, ordinal, seq);
        store.delete_cf(batch, CF_INDEX, &self.key);
        self.deltas.add(ordinal, Counter::Quarantined, -1);
    }

    /// Counts a repeat that added nothing.
    pub fn duplicate(&mut self, ordinal: u32) {
        self.deltas.add(ordinal, Counter::DedupedTotal, 1);
    }

    /// The tenants given rows since the last seal, each once (a batch of repeats only
    /// gives none).
    pub fn tenants(&self) -> impl Iterator<Item = u32> + '_ {
        self.deltas.tenants_growing(Counter::Pending)
    }

    /// Ends a batch whose highest seq is `last_seq`. The gauge deltas go to
    /// [`Store::gauges`] once the batch commits.
    #[must_use = "apply the gauge deltas after the batch commits"]
    pub fn seal(&mut self, store: &Store, batch: &mut WriteBatch, last_seq: u64) -> GaugeDeltas {
        for ordinal in self.deltas.tenants_growing(Counter::Pending) {
            self.key.clear();
            keys::active(&mut self.key, ordinal);
            store.put_cf(batch, CF_INDEX, &self.key, &[]);
        }
        let gauges = self.deltas.drain_into(store, batch, &mut self.key);
        store.put_cf(
            batch,
            super::CF_META,
            keys::META_SEQ,
            &last_seq.to_be_bytes(),
        );
        gauges
    }
}

/// A batch of transitions, committed atomically by [`Transitions::commit`].
pub struct Transitions<'s> {
    store: &'s Store,
    batch: WriteBatch,
    deltas: CounterDeltas,
    key: Vec<u8>,
    value: Vec<u8>,
    count: usize,
    /// Tenants erased by this batch: their gauges are zeroed once it commits.
    purged: Vec<u32>,
    /// When the batch happens: a lane head promoted by it is due then.
    now_ms: u64,
    /// Lanes this batch moved: a lane's state is read from the store, so a second move of
    /// one lane in the same batch would read what the first one is about to change.
    lanes_moved: Vec<(u32, keys::LaneId)>,
    /// The pipeline core's lane floors: releases seek from them, and the lanes this
    /// batch promotes set theirs once it commits.
    floors: Option<&'s lanes::LaneFloors>,
    floor_moves: Vec<((u32, keys::LaneId), lanes::Floor)>,
    /// Whether this batch puts a lane member back with an old seq (a revive).
    revives_lane: bool,
}

impl<'s> Transitions<'s> {
    pub fn new(store: &'s Store) -> Transitions<'s> {
        Transitions::at(store, crate::clock::now_ms())
    }

    /// A batch happening at `now_ms` (fixtures and tests fix the time).
    pub fn at(store: &'s Store, now_ms: u64) -> Transitions<'s> {
        Transitions {
            store,
            batch: WriteBatch::default(),
            deltas: CounterDeltas::default(),
            key: Vec::with_capacity(64),
            value: Vec::with_capacity(128),
            count: 0,
            purged: Vec::new(),
            now_ms,
            lanes_moved: Vec::new(),
            floors: None,
            floor_moves: Vec::new(),
            revives_lane: false,
        }
    }

    /// A batch of the pipeline core that keeps `floors` (see [`lanes::LaneFloors`]).
    pub fn with_lane_floors(mut self, floors: &'s lanes::LaneFloors) -> Transitions<'s> {
        self.floors = Some(floors);
        self
    }

    /// Transitions added so far.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn put_row(&mut self, id: RowId, row: &DeliveryRow) {
        self.key.clear();
        keys::delivery(&mut self.key, id.ordinal, id.seq, id.sink);
        self.value.clear();
        row.encode(&mut self.value);
        self.store
            .put_cf(&mut self.batch, CF_DELIVERIES, &self.key, &self.value);
    }

    fn delete_due(&mut self, id: RowId, due_ms: u64) {
        self.key.clear();
        keys::due(&mut self.key, id.ordinal, due_ms, id.seq, id.sink);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
    }

    fn put_due(&mut self, id: RowId, due_ms: u64, size: u32, kind: DueKind) {
        self.key.clear();
        keys::due(&mut self.key, id.ordinal, due_ms, id.seq, id.sink);
        self.store.put_cf(
            &mut self.batch,
            CF_INDEX,
            &self.key,
            &keys::due_value(size, kind),
        );
    }

    fn delete_inflight(&mut self, id: RowId) {
        self.key.clear();
        keys::inflight(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
    }

    fn put_dead(&mut self, id: RowId, reason: &str) {
        self.key.clear();
        keys::dead(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store
            .put_cf(&mut self.batch, CF_INDEX, &self.key, reason.as_bytes());
    }

    fn put_active(&mut self, ordinal: u32) {
        self.key.clear();
        keys::active(&mut self.key, ordinal);
        self.store.put_cf(&mut self.batch, CF_INDEX, &self.key, &[]);
    }

    /// `?D` → `?F`. `row` is the row as it is after the claim (attempts counted, the
    /// first claim's time set by the caller); `kind` is the due key's. A blocked lane head
    /// (kind 3) being claimed unblocks its lane.
    pub fn claim(&mut self, id: RowId, due_ms: u64, kind: DueKind, row: &DeliveryRow, now_ms: u64) {
        self.delete_due(id, due_ms);
        if kind == DueKind::LaneRetry {
            self.deltas.add(id.ordinal, Counter::LanesBlocked, -1);
        }
        self.key.clear();
        keys::inflight(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store.put_cf(
            &mut self.batch,
            CF_INDEX,
            &self.key,
            &keys::inflight_value(now_ms, row.size),
        );
        self.put_row(id, row);
        self.deltas.add(id.ordinal, Counter::Inflight, 1);
        self.count += 1;
    }

    /// Moves a due key to a later time without attempting it (breaker park). A parked
    /// lane head blocks its lane (kind 3), as a retry does.
    pub fn park(&mut self, id: RowId, due_ms: u64, until_ms: u64, size: u32, kind: DueKind) {
        self.delete_due(id, due_ms);
        let parked = match kind {
            DueKind::LaneFirstAttempt => {
                self.deltas.add(id.ordinal, Counter::LanesBlocked, 1);
                DueKind::LaneRetry
            }
            other => other,
        };
        self.put_due(id, until_ms, size, parked);
        self.count += 1;
    }

    /// `?F` → gone: the sink took it. A lane head releases its lane.
    pub fn delivered(&mut self, id: RowId, row: &DeliveryRow) -> Result<(), StoreError> {
        self.delivered_row(id, row.size);
        match &row.lane {
            Some(lane) => self.release(id.ordinal, &lane.id),
            None => Ok(()),
        }
    }

    fn delivered_row(&mut self, id: RowId, size: u32) {
        self.delete_inflight(id);
        self.key.clear();
        keys::delivery(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store
            .delete_cf(&mut self.batch, CF_DELIVERIES, &self.key);
        let ordinal = id.ordinal;
        self.deltas.add(ordinal, Counter::Pending, -1);
        self.deltas.add(ordinal, Counter::Bytes, -i64::from(size));
        self.deltas.add(ordinal, Counter::Inflight, -1);
        self.deltas.add(ordinal, Counter::DeliveredTotal, 1);
        self.count += 1;
    }

    /// `?F` → `?D` due at `due_ms` in the row's `class`; `row` carries the attempt's error.
    /// A lane head stays the head and blocks its lane (kind 3): the members behind it
    /// wait, holding nothing.
    pub fn retry(&mut self, id: RowId, row: &DeliveryRow, due_ms: u64, class: Class) {
        self.delete_inflight(id);
        let kind = if row.lane.is_some() {
            self.deltas.add(id.ordinal, Counter::LanesBlocked, 1);
            DueKind::LaneRetry
        } else {
            class.retry()
        };
        self.put_due(id, due_ms, row.size, kind);
        self.put_row(id, row);
        self.deltas.add(id.ordinal, Counter::Inflight, -1);
        self.count += 1;
    }

    fn dead_counters(&mut self, ordinal: u32, size: u32) {
        self.deltas.add(ordinal, Counter::Pending, -1);
        self.deltas.add(ordinal, Counter::Bytes, -i64::from(size));
        self.deltas.add(ordinal, Counter::Dead, 1);
        self.deltas.add(ordinal, Counter::DeadLetteredTotal, 1);
    }

    /// `?F` → `?X` with `reason` (also kept as the row's last error). A lane head
    /// releases its lane: a poison hook must not hold its key forever.
    pub fn dead_from_inflight(
        &mut self,
        id: RowId,
        row: &DeliveryRow,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.delete_inflight(id);
        self.put_dead(id, reason);
        self.put_row(id, row);
        self.deltas.add(id.ordinal, Counter::Inflight, -1);
        self.dead_counters(id.ordinal, row.size);
        self.count += 1;
        match &row.lane {
            Some(lane) => self.release(id.ordinal, &lane.id),
            None => Ok(()),
        }
    }

    /// `?D` → `?X` before any attempt (sink or source gone, undecodable). `row` is `None`
    /// when the stored row cannot be decoded; it is then left as it is, for inspection.
    /// `kind` is the due key's (`None`: its value did not decode). A lane head releases
    /// its lane; when the row cannot say which lane, the lane is found by its head key.
    pub fn dead_from_due(
        &mut self,
        id: RowId,
        due_ms: u64,
        size: u32,
        kind: Option<DueKind>,
        row: Option<&DeliveryRow>,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.delete_due(id, due_ms);
        self.put_dead(id, reason);
        if let Some(row) = row {
            self.put_row(id, row);
        }
        self.dead_counters(id.ordinal, size);
        self.unblock_if_blocked(id.ordinal, kind);
        self.count += 1;
        self.release_head_of(id, kind, row)
    }

    /// Drops a due key whose delivery row is missing: there is nothing to deliver or to
    /// dead-letter, only the key and the counters it stood for. A lane head releases its
    /// lane, found by its head key.
    pub fn drop_orphan_due(
        &mut self,
        id: RowId,
        due_ms: u64,
        size: u32,
        kind: Option<DueKind>,
    ) -> Result<(), StoreError> {
        self.delete_due(id, due_ms);
        self.deltas.add(id.ordinal, Counter::Pending, -1);
        self.deltas
            .add(id.ordinal, Counter::Bytes, -i64::from(size));
        self.unblock_if_blocked(id.ordinal, kind);
        self.count += 1;
        self.release_head_of(id, kind, None)
    }

    /// A due key of kind 3 leaving `?D` without a claim no longer blocks its lane.
    fn unblock_if_blocked(&mut self, ordinal: u32, kind: Option<DueKind>) {
        if kind == Some(DueKind::LaneRetry) {
            self.deltas.add(ordinal, Counter::LanesBlocked, -1);
        }
    }

    /// `?F` → `?D` due now as a first attempt: a claim that did not finish before a stop
    /// or crash. A lane head stays the head (kind 2); its redelivery comes before any
    /// later hook of the lane.
    pub fn recover(&mut self, id: RowId, size: u32, laned: bool, now_ms: u64) {
        self.delete_inflight(id);
        let kind = if laned {
            DueKind::LaneFirstAttempt
        } else {
            DueKind::FirstAttempt
        };
        self.put_due(id, now_ms, size, kind);
        self.put_active(id.ordinal);
        self.deltas.add(id.ordinal, Counter::Inflight, -1);
        self.count += 1;
    }

    /// `?X` → `?D` due now, as a new first attempt in `class`: attempts and the retry
    /// horizon start over. A row with a lane re-enters its lane as a member (with the
    /// lane's marker): it runs when it is the lowest waiting member, never beside the
    /// head. Blind puts, as the writer's: the sweep promotes it.
    pub fn revive(&mut self, id: RowId, row: &DeliveryRow, now_ms: u64, class: Class) {
        self.key.clear();
        keys::dead(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
        let revived = DeliveryRow {
            attempts: 0,
            first_attempt_at_ms: 0,
            ..row.clone()
        };
        self.put_row(id, &revived);
        match &row.lane {
            None => self.put_due(id, now_ms, row.size, class.first_attempt()),
            Some(lane) => {
                self.put_member(id, &lane.id, row.size);
                self.revives_lane = true;
            }
        }
        self.put_active(id.ordinal);
        let ordinal = id.ordinal;
        self.deltas.add(ordinal, Counter::Dead, -1);
        self.deltas.add(ordinal, Counter::Pending, 1);
        self.deltas
            .add(ordinal, Counter::Bytes, i64::from(row.size));
        self.count += 1;
    }

    /// `?X` → gone, with its delivery row.
    pub fn purge_dead(&mut self, id: RowId) {
        self.key.clear();
        keys::dead(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
        self.key.clear();
        keys::delivery(&mut self.key, id.ordinal, id.seq, id.sink);
        self.store
            .delete_cf(&mut self.batch, CF_DELIVERIES, &self.key);
        self.deltas.add(id.ordinal, Counter::Dead, -1);
        self.count += 1;
    }

    /// Moves a hook whose last delivery row ended from `hooks` to `archive`.
    pub fn archive_hook(&mut self, ordinal: u32, seq: u64, received_at_ms: u64, hook: &[u8]) {
        self.key.clear();
        keys::archive(&mut self.key, ordinal, received_at_ms, seq);
        self.store
            .put_cf(&mut self.batch, CF_ARCHIVE, &self.key, hook);
        self.key.clear();
        keys::hook(&mut self.key, ordinal, seq);
        self.store.delete_cf(&mut self.batch, CF_HOOKS, &self.key);
        self.count += 1;
    }

    /// Deletes a quarantined hook: its hook row and `?Q` key (an operator's delete).
    pub fn delete_quarantined(&mut self, ordinal: u32, seq: u64) {
        self.key.clear();
        keys::hook(&mut self.key, ordinal, seq);
        self.store.delete_cf(&mut self.batch, CF_HOOKS, &self.key);
        self.key.clear();
        keys::quarantine(&mut self.key, ordinal, seq);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
        self.deltas.add(ordinal, Counter::Quarantined, -1);
        self.count += 1;
    }

    /// Erases tenant `ordinal` (id `tenant_id`): one range delete per family of its ordinal
    /// in every column family, its `meta/tenant` entry, and the node aggregate moved by
    /// minus each of its `counters` (read by the caller once nothing else moves the
    /// tenant). The ordinal is never assigned again (`meta/next_ordinal` only grows).
    pub fn purge_tenant(&mut self, ordinal: u32, tenant_id: &str, counters: &[(Counter, i64)]) {
        let (start, end) = keys::tenant_range(ordinal);
        for cf in [CF_HOOKS, CF_DELIVERIES, CF_ARCHIVE] {
            self.store
                .delete_range_cf(&mut self.batch, cf, &start, &end);
        }
        for tag in keys::ALL_TAGS {
            let (start, end) = keys::family_range(tag, ordinal);
            self.store
                .delete_range_cf(&mut self.batch, CF_INDEX, &start, &end);
        }
        self.store.delete_cf(
            &mut self.batch,
            super::CF_META,
            &keys::meta_tenant(tenant_id),
        );
        for &(field, value) in counters {
            self.deltas.add_node_only(field, -value);
        }
        self.purged.push(ordinal);
        self.count += 1;
    }

    /// Deletes a hook with no delivery rows left that is not archived (purge).
    pub fn delete_hook(&mut self, ordinal: u32, seq: u64) {
        self.key.clear();
        keys::hook(&mut self.key, ordinal, seq);
        self.store.delete_cf(&mut self.batch, CF_HOOKS, &self.key);
        self.count += 1;
    }

    /// Removes a tenant's active marker (it has nothing due or in flight).
    pub fn clear_active(&mut self, ordinal: u32) {
        self.key.clear();
        keys::active(&mut self.key, ordinal);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
        self.count += 1;
    }

    /// Restores an active marker that [`Transitions::clear_active`] removed too early.
    pub fn set_active(&mut self, ordinal: u32) {
        self.put_active(ordinal);
        self.count += 1;
    }

    /// Deletes a tenant's archive entries received before `before_ms` (retention).
    pub fn expire_archive(&mut self, ordinal: u32, before_ms: u64) {
        let (start, end) = keys::archive_before(ordinal, before_ms);
        self.store
            .delete_range_cf(&mut self.batch, CF_ARCHIVE, &start, &end);
        self.count += 1;
    }

    /// Commits everything added, atomically. `sync` is false for the pipeline's own
    /// transitions: losing one to a power cut only rolls a row back to where it was,
    /// which delivers it again (at least once), and the writer's next synced batch makes
    /// every earlier one durable.
    pub fn commit(mut self, sync: bool) -> Result<(), StoreError> {
        if self.count == 0 {
            return Ok(());
        }
        let gauges = self
            .deltas
            .drain_into(self.store, &mut self.batch, &mut self.key);
        if self.revives_lane {
            self.store.gauges().begin_lane_revive();
        }
        let written = self.store.write(self.batch, sync);
        if self.revives_lane {
            self.store.gauges().end_lane_revive();
        }
        written?;
        if let Some(floors) = self.floors {
            floors.set(self.floor_moves);
        }
        self.store.gauges().apply(&gauges);
        for ordinal in self.purged {
            self.store.gauges().seed(ordinal, [0; 3]);
        }
        Ok(())
    }
}

/// One due key as the pipeline reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueRow {
    pub id: RowId,
    pub due_ms: u64,
    pub size: u32,
    pub kind: DueKind,
}

/// Visits `ordinal`'s rows due in `[from_ms, now_ms]`, oldest first, until `visit` returns
/// false. A due key that does not decode is reported as `Err` to `visit` with its id.
///
/// `from_ms` lets the pipeline start past the rows it already consumed: a queue in an LSM
/// tree leaves a tombstone per consumed key at the front of the range, and a seek from the
/// family's start would step over all of them.
pub fn due_rows(
    store: &Store,
    ordinal: u32,
    from_ms: u64,
    now_ms: u64,
    mut visit: impl FnMut(Result<DueRow, (RowId, u64)>) -> bool,
) -> Result<(), StoreError> {
    let (start, end) = keys::due_between(ordinal, from_ms, now_ms);
    store.scan(CF_INDEX, &start, Some(&end), |key, value| {
        let Ok(keys::IndexKey::Due {
            ordinal,
            due_ms,
            seq,
            sink,
        }) = keys::parse_index(key)
        else {
            // The range holds only due keys of this length; anything else is corrupt and
            // cannot be named as a row.
            return Ok(true);
        };
        let id = RowId { ordinal, seq, sink };
        Ok(match keys::parse_due_value(value) {
            Ok((size, kind)) => visit(Ok(DueRow {
                id,
                due_ms,
                size,
                kind,
            })),
            Err(_) => visit(Err((id, due_ms))),
        })
    })
}

/// The due time of `ordinal`'s earliest due key at or after `from_ms`, if any: one seek.
pub fn earliest_due_ms(
    store: &Store,
    ordinal: u32,
    from_ms: u64,
) -> Result<Option<u64>, StoreError> {
    let (mut start, end) = keys::family_range(Tag::Due, ordinal);
    start.clear();
    keys::due(&mut start, ordinal, from_ms, 0, 0);
    Ok(match store.first(CF_INDEX, &start, &end)? {
        Some((key, _)) => match keys::parse_index(&key) {
            Ok(keys::IndexKey::Due { due_ms, .. }) => Some(due_ms),
            _ => None,
        },
        None => None,
    })
}

/// Whether `ordinal` has any due row: one seek.
pub fn has_due(store: &Store, ordinal: u32) -> Result<bool, StoreError> {
    let (start, end) = keys::family_range(Tag::Due, ordinal);
    Ok(store.first(CF_INDEX, &start, &end)?.is_some())
}

/// Every tenant with an active marker.
pub fn active_tenants(store: &Store) -> Result<Vec<u32>, StoreError> {
    let (start, end) = keys::family_range_all(Tag::Active);
    let mut out = Vec::new();
    store.scan(CF_INDEX, &start, Some(&end), |key, _| {
        if let Ok(keys::IndexKey::Active { ordinal }) = keys::parse_index(key) {
            out.push(ordinal);
        }
        Ok(true)
    })?;
    Ok(out)
}

/// Tenants whose `pending` counter is above 0 and that have no active marker: what a
/// crash between [`Transitions::clear_active`] and its re-check can leave (the store's
/// verify reports it as repairable). The counters are exact (a transition moves them in its
/// own batch), so they name every tenant with work.
pub fn tenants_missing_active(store: &Store) -> Result<Vec<u32>, StoreError> {
    let mut pending = Vec::new();
    let (start, end) = keys::family_range_all(Tag::Counter);
    store.scan(CF_INDEX, &start, Some(&end), |key, value| {
        if let Ok(keys::IndexKey::Counter { ordinal, field }) = keys::parse_index(key) {
            if ordinal != keys::NODE_ORDINAL
                && Counter::from_field(field) == Some(Counter::Pending)
                && keys::decode_counter(value).unwrap_or(0) > 0
            {
                pending.push(ordinal);
            }
        }
        Ok(true)
    })?;
    let active: std::collections::HashSet<u32> = active_tenants(store)?.into_iter().collect();
    pending.retain(|ordinal| !active.contains(ordinal));
    Ok(pending)
}

/// The sinks of one hook that still have a delivery row.
pub fn rows_of_hook(store: &Store, ordinal: u32, seq: u64) -> Result<Vec<u16>, StoreError> {
    Ok(rows_of_hooks(store, ordinal, &[seq])?
        .into_iter()
        .map(|(_, sink)| sink)
        .collect())
}

/// Hooks further apart than this are read by separate iterators: one iterator crosses
/// whatever lies between two of its hooks, the deleted rows of every hook delivered since
/// the last compaction included.
const HOOK_RUN_GAP: u64 = 64;

/// The delivery rows left of each of one tenant's hooks `seqs` (ascending, no repeats), as
/// (seq, sink) in key order, with one iterator per run of nearby hooks instead of one per
/// hook.
pub fn rows_of_hooks(
    store: &Store,
    ordinal: u32,
    seqs: &[u64],
) -> Result<Vec<(u64, u16)>, StoreError> {
    let mut rows = Vec::new();
    let mut run_start = 0;
    while run_start < seqs.len() {
        let mut run_end = run_start + 1;
        while run_end < seqs.len() && seqs[run_end] - seqs[run_end - 1] <= HOOK_RUN_GAP {
            run_end += 1;
        }
        let ranges: Vec<(Vec<u8>, Vec<u8>)> = seqs[run_start..run_end]
            .iter()
            .map(|&seq| keys::deliveries_of_hook(ordinal, seq))
            .collect();
        store.scan_ranges(CF_DELIVERIES, &ranges, |key, _| {
            if let Ok((_, seq, sink)) = keys::parse_delivery(key) {
                rows.push((seq, sink));
            }
        })?;
        run_start = run_end;
    }
    Ok(rows)
}

pub fn read_row(store: &Store, id: RowId) -> Result<Option<Vec<u8>>, StoreError> {
    store.get(CF_DELIVERIES, &row_key(id))
}

pub fn read_hook(store: &Store, ordinal: u32, seq: u64) -> Result<Option<Vec<u8>>, StoreError> {
    store.get(CF_HOOKS, &hook_key(ordinal, seq))
}

/// The delivery rows of `ids` in one batched lookup, each result in the place of its id.
pub fn read_rows(store: &Store, ids: &[RowId]) -> Vec<Result<Option<Vec<u8>>, StoreError>> {
    let row_keys: Vec<Vec<u8>> = ids.iter().map(|&id| row_key(id)).collect();
    store.get_many(CF_DELIVERIES, &row_keys)
}

/// The stored hooks `seqs` of one tenant in one batched lookup, each result in the place
/// of its seq.
pub fn read_hooks(
    store: &Store,
    ordinal: u32,
    seqs: &[u64],
) -> Vec<Result<Option<Vec<u8>>, StoreError>> {
    let hook_keys: Vec<Vec<u8>> = seqs.iter().map(|&seq| hook_key(ordinal, seq)).collect();
    store.get_many(CF_HOOKS, &hook_keys)
}

fn row_key(id: RowId) -> Vec<u8> {
    let mut key = Vec::with_capacity(keys::DELIVERY_LEN);
    keys::delivery(&mut key, id.ordinal, id.seq, id.sink);
    key
}

fn hook_key(ordinal: u32, seq: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(keys::HOOK_LEN);
    keys::hook(&mut key, ordinal, seq);
    key
}

/// Every claimed row of the store, in batches of up to `limit`: (id, size).
pub fn inflight_rows(store: &Store, limit: usize) -> Result<Vec<(RowId, u32)>, StoreError> {
    let (start, end) = keys::family_range_all(Tag::Inflight);
    let mut out = Vec::new();
    store.scan(CF_INDEX, &start, Some(&end), |key, value| {
        if let Ok(keys::IndexKey::Inflight { ordinal, seq, sink }) = keys::parse_index(key) {
            let size = keys::parse_inflight_value(value)
                .map(|(_, size)| size)
                .unwrap_or(0);
            out.push((RowId { ordinal, seq, sink }, size));
        }
        Ok(out.len() < limit)
    })?;
    Ok(out)
}

/// One dead-lettered row as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRow {
    pub id: RowId,
    pub reason: String,
}

/// `ordinal`'s DLQ in (seq, sink) order, starting after `after` (a page cursor), until
/// `visit` returns false.
pub fn dead_rows(
    store: &Store,
    ordinal: u32,
    after: Option<(u64, u16)>,
    mut visit: impl FnMut(DeadRow) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let (mut start, end) = keys::family_range(Tag::Dead, ordinal);
    if let Some((seq, sink)) = after {
        start.clear();
        keys::dead(&mut start, ordinal, seq, sink);
        // Just past the cursor key itself.
        start.push(0);
    }
    store.scan(
        CF_INDEX,
        &start,
        Some(&end),
        |key, value| match keys::parse_index(key) {
            Ok(keys::IndexKey::Dead { ordinal, seq, sink }) => visit(DeadRow {
                id: RowId { ordinal, seq, sink },
                reason: String::from_utf8_lossy(value).into_owned(),
            }),
            _ => Ok(true),
        },
    )
}

/// The reason `id` is dead-lettered, or `None` when it is not in the DLQ: one point read.
pub fn dead_reason(store: &Store, id: RowId) -> Result<Option<String>, StoreError> {
    // Tag, ordinal, seq, sink.
    let mut key = Vec::with_capacity(15);
    keys::dead(&mut key, id.ordinal, id.seq, id.sink);
    Ok(store
        .get(CF_INDEX, &key)?
        .map(|reason| String::from_utf8_lossy(&reason).into_owned()))
}

/// Whether `id` is claimed (`?F`): one point read.
pub fn is_inflight(store: &Store, id: RowId) -> Result<bool, StoreError> {
    let mut key = Vec::with_capacity(15);
    keys::inflight(&mut key, id.ordinal, id.seq, id.sink);
    Ok(store.get(CF_INDEX, &key)?.is_some())
}

/// Up to `limit` of `ordinal`'s quarantined hooks after seq `after`, in seq order, with
/// their reasons.
pub fn quarantined(
    store: &Store,
    ordinal: u32,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<(u64, String)>, StoreError> {
    let (family_start, end) = keys::family_range(Tag::Quarantine, ordinal);
    let start = match after {
        Some(seq) if seq < u64::MAX => {
            let mut key = Vec::with_capacity(13);
            keys::quarantine(&mut key, ordinal, seq + 1);
            key
        }
        Some(_) => return Ok(Vec::new()),
        None => family_start,
    };
    let mut out = Vec::new();
    store.scan(CF_INDEX, &start, Some(&end), |key, value| {
        if let Ok(keys::IndexKey::Quarantine { seq, .. }) = keys::parse_index(key) {
            out.push((seq, String::from_utf8_lossy(value).into_owned()));
        }
        Ok(out.len() < limit)
    })?;
    Ok(out)
}

/// The reason hook `seq` of `ordinal` is quarantined, or `None` when it is not.
pub fn quarantine_reason(
    store: &Store,
    ordinal: u32,
    seq: u64,
) -> Result<Option<String>, StoreError> {
    let mut key = Vec::with_capacity(13);
    keys::quarantine(&mut key, ordinal, seq);
    Ok(store
        .get(CF_INDEX, &key)?
        .map(|reason| String::from_utf8_lossy(&reason).into_owned()))
}

/// One archive entry as read: when the hook was received, its seq and its stored record.
#[derive(Debug)]
pub struct ArchivedHook<'a> {
    pub received_at_ms: u64,
    pub seq: u64,
    pub hook: &'a [u8],
}

/// `ordinal`'s archive entries received in `[from_ms, to_ms)`, in (received_at, seq)
/// order, starting after `after` (a page cursor: the last entry's received_at and seq),
/// until `visit` returns false. A key that does not parse is skipped: the range holds only
/// archive keys of this tenant.
pub fn archived_hooks(
    store: &Store,
    ordinal: u32,
    from_ms: u64,
    to_ms: u64,
    after: Option<(u64, u64)>,
    mut visit: impl FnMut(ArchivedHook<'_>) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let (mut start, end) = keys::archive_between(ordinal, from_ms, to_ms);
    if let Some((received_at_ms, seq)) = after {
        start.clear();
        keys::archive(&mut start, ordinal, received_at_ms.max(from_ms), seq);
        // Just past the cursor key itself.
        start.push(0);
    }
    store.scan(
        CF_ARCHIVE,
        &start,
        Some(&end),
        |key, value| match keys::parse_archive(key) {
            Ok((_, received_at_ms, seq)) => visit(ArchivedHook {
                received_at_ms,
                seq,
                hook: value,
            }),
            Err(_) => Ok(true),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::verify;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    /// Puts a hook with `sinks` rows due at `due_ms`, the way the writer does.
    fn ingest(store: &Store, ordinal: u32, seq: u64, sinks: u16, size: u32, due_ms: u64) {
        let mut batch = WriteBatch::default();
        let mut key = Vec::new();
        let mut value = Vec::new();
        keys::hook(&mut key, ordinal, seq);
        crate::store::codec::HookRecord {
            source_id: "s".into(),
            tenant_id: "t".into(),
            received_at_ms: 1_000 + seq,
            dedupe_key: vec![],
            headers: vec![],
            body: b"{}".to_vec(),
        }
        .encode(&mut value);
        store.put_cf(&mut batch, CF_HOOKS, &key, &value);
        let mut deltas = CounterDeltas::default();
        for sink in 0..sinks {
            key.clear();
            keys::delivery(&mut key, ordinal, seq, sink);
            value.clear();
            DeliveryRow::encode_new(&mut value, &format!("http-{sink}"), size, None);
            store.put_cf(&mut batch, CF_DELIVERIES, &key, &value);
            key.clear();
            keys::due(&mut key, ordinal, due_ms, seq, sink);
            store.put_cf(
                &mut batch,
                CF_INDEX,
                &key,
                &keys::due_value(size, DueKind::FirstAttempt),
            );
            deltas.add(ordinal, Counter::Pending, 1);
            deltas.add(ordinal, Counter::Bytes, i64::from(size));
        }
        key.clear();
        keys::active(&mut key, ordinal);
        store.put_cf(&mut batch, CF_INDEX, &key, &[]);
        let gauges = deltas.drain_into(store, &mut batch, &mut key);
        store.write(batch, false).unwrap();
        store.gauges().apply(&gauges);
    }

    /// A crash between an idle tenant's marker removal and its re-check leaves rows with no
    /// marker: verify calls it repairable, not a problem, and the startup repair puts back
    /// exactly the markers of tenants with pending rows.
    #[test]
    fn a_lost_active_marker_is_repairable_and_restored_at_startup() {
        let (_dir, store) = store();
        ingest(&store, 1, 1, 2, 100, 0);
        ingest(&store, 2, 2, 1, 100, 0);
        let mut transitions = Transitions::new(&store);
        transitions.clear_active(1);
        // Tenant 3 has a stale marker and nothing pending: left alone.
        transitions.set_active(3);
        transitions.commit(false).unwrap();

        let report = verify::verify(&store).unwrap();
        assert!(report.ok(), "{:?}", report.problems);
        assert_eq!(
            report.repairable,
            ["tenant 1 has pending rows and no active marker (the next start puts it back)"]
        );
        assert!(!report.clean());
        assert_eq!(tenants_missing_active(&store).unwrap(), [1]);

        assert_eq!(crate::dispatch::restore_active_markers(&store).unwrap(), 1);
        assert_eq!(active_tenants(&store).unwrap(), [1, 2, 3]);
        assert_verified(&store);
        assert_eq!(crate::dispatch::restore_active_markers(&store).unwrap(), 0);
    }

    fn row(store: &Store, id: RowId) -> DeliveryRow {
        DeliveryRow::decode(&read_row(store, id).unwrap().unwrap()).unwrap()
    }

    fn assert_verified(store: &Store) {
        let report = verify::verify(store).unwrap();
        assert!(
            report.clean(),
            "{:?} {:?}",
            report.problems,
            report.repairable
        );
    }

    /// Every transition keeps the store's invariants, and the counters say what the keys
    /// say; a hook whose last row is delivered moves to the archive.
    #[test]
    fn transitions_keep_the_store_verified() {
        let (_dir, store) = store();
        ingest(&store, 1, 1, 2, 100, 10);
        ingest(&store, 1, 2, 1, 50, 20);
        assert_verified(&store);

        let mut due = Vec::new();
        due_rows(&store, 1, 0, 15, |r| {
            due.push(r.unwrap());
            true
        })
        .unwrap();
        assert_eq!(due.len(), 2, "only seq 1's rows are due by 15");

        let mut t = Transitions::new(&store);
        for d in &due {
            let mut r = row(&store, d.id);
            r.attempts += 1;
            r.first_attempt_at_ms = 15;
            t.claim(d.id, d.due_ms, d.kind, &r, 15);
        }
        t.commit(false).unwrap();
        assert_verified(&store);
        assert_eq!(store.counter(1, Counter::Inflight).unwrap(), 2);

        // Sink 0 delivered, sink 1 retries, then dead-letters.
        let mut t = Transitions::new(&store);
        t.delivered(due[0].id, &row(&store, due[0].id)).unwrap();
        let mut r1 = row(&store, due[1].id);
        r1.last_error = "http 503".into();
        t.retry(due[1].id, &r1, 99, Class::Live);
        t.commit(false).unwrap();
        assert_verified(&store);
        assert_eq!(rows_of_hook(&store, 1, 1).unwrap(), vec![1]);

        let mut t = Transitions::new(&store);
        let mut r1 = row(&store, due[1].id);
        r1.attempts += 1;
        t.claim(due[1].id, 99, DueKind::Retry, &r1, 100);
        t.commit(false).unwrap();
        let mut t = Transitions::new(&store);
        t.dead_from_inflight(due[1].id, &r1, "http 400: no")
            .unwrap();
        t.commit(false).unwrap();
        assert_verified(&store);
        assert_eq!(store.counter(1, Counter::Dead).unwrap(), 1);
        assert_eq!(store.counter(0, Counter::Dead).unwrap(), 1);
        assert_eq!(store.counter(1, Counter::Pending).unwrap(), 1);
        assert_eq!(store.counter(1, Counter::Bytes).unwrap(), 50);

        let mut listed = Vec::new();
        dead_rows(&store, 1, None, |d| {
            listed.push(d);
            Ok(true)
        })
        .unwrap();
        assert_eq!(
            listed,
            vec![DeadRow {
                id: due[1].id,
                reason: "http 400: no".into()
            }]
        );
        assert_eq!(
            dead_reason(&store, due[1].id).unwrap().as_deref(),
            Some("http 400: no")
        );
        assert_eq!(dead_reason(&store, due[0].id).unwrap(), None);

        // Revive, deliver, and the hook goes to the archive.
        let mut t = Transitions::new(&store);
        t.revive(due[1].id, &r1, 200, Class::Live);
        t.commit(false).unwrap();
        assert_verified(&store);
        assert_eq!(row(&store, due[1].id).attempts, 0);
        let mut t = Transitions::new(&store);
        t.claim(
            due[1].id,
            200,
            DueKind::FirstAttempt,
            &row(&store, due[1].id),
            201,
        );
        t.commit(false).unwrap();
        let mut t = Transitions::new(&store);
        t.delivered(due[1].id, &row(&store, due[1].id)).unwrap();
        let hook = read_hook(&store, 1, 1).unwrap().unwrap();
        t.archive_hook(1, 1, 1_001, &hook);
        t.commit(false).unwrap();
        assert_verified(&store);
        assert!(read_hook(&store, 1, 1).unwrap().is_none());
        let (start, end) = keys::archive_between(1, 1_001, 1_002);
        assert!(store.first(CF_ARCHIVE, &start, &end).unwrap().is_some());
        assert_eq!(store.counter(0, Counter::DeliveredTotal).unwrap(), 2);
        let mut archived = Vec::new();
        archived_hooks(&store, 1, 1_001, 1_002, None, |entry| {
            archived.push((entry.received_at_ms, entry.seq, entry.hook.to_vec()));
            Ok(true)
        })
        .unwrap();
        assert_eq!(archived, vec![(1_001, 1, hook.clone())]);
        let mut after_cursor = 0;
        archived_hooks(&store, 1, 0, u64::MAX, Some((1_001, 1)), |_| {
            after_cursor += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(
            after_cursor, 0,
            "the cursor entry itself is not visited again"
        );
        let mut outside = 0;
        archived_hooks(&store, 1, 1_002, 5_000, None, |_| {
            outside += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(outside, 0);

        // Retention removes it without touching live data.
        let mut t = Transitions::new(&store);
        t.expire_archive(1, 5_000);
        t.commit(false).unwrap();
        assert!(store.first(CF_ARCHIVE, &start, &end).unwrap().is_none());
        assert!(read_hook(&store, 1, 2).unwrap().is_some());
        assert_verified(&store);
    }

    #[test]
    fn recover_puts_every_claim_back_as_a_first_attempt() {
        let (_dir, store) = store();
        ingest(&store, 3, 7, 2, 10, 5);
        let mut t = Transitions::new(&store);
        due_rows(&store, 3, 0, 5, |r| {
            let r = r.unwrap();
            let mut d = row(&store, r.id);
            d.attempts = 1;
            t.claim(r.id, r.due_ms, r.kind, &d, 6);
            true
        })
        .unwrap();
        t.commit(false).unwrap();
        let claimed = inflight_rows(&store, 100).unwrap();
        assert_eq!(claimed.len(), 2);
        let mut t = Transitions::new(&store);
        for (id, size) in claimed {
            assert_eq!(size, 10);
            t.recover(id, size, false, 50);
        }
        t.commit(false).unwrap();
        assert!(inflight_rows(&store, 100).unwrap().is_empty());
        assert_eq!(earliest_due_ms(&store, 3, 0).unwrap(), Some(50));
        assert_eq!(store.counter(3, Counter::Inflight).unwrap(), 0);
        assert_verified(&store);
    }

    #[test]
    fn park_moves_the_due_time_and_dead_from_due_counts() {
        let (_dir, store) = store();
        ingest(&store, 2, 1, 1, 10, 5);
        let id = RowId {
            ordinal: 2,
            seq: 1,
            sink: 0,
        };
        let mut t = Transitions::new(&store);
        t.park(id, 5, 500, 10, DueKind::FirstAttempt);
        t.commit(false).unwrap();
        assert_eq!(earliest_due_ms(&store, 2, 0).unwrap(), Some(500));
        assert_eq!(earliest_due_ms(&store, 2, 501).unwrap(), None);
        assert_verified(&store);
        let mut t = Transitions::new(&store);
        t.dead_from_due(
            id,
            500,
            10,
            Some(DueKind::FirstAttempt),
            Some(&row(&store, id)),
            "sink_gone",
        )
        .unwrap();
        t.commit(false).unwrap();
        assert!(!has_due(&store, 2).unwrap());
        assert_eq!(store.counter(2, Counter::Pending).unwrap(), 0);
        assert_verified(&store);
        let mut t = Transitions::new(&store);
        t.purge_dead(id);
        t.delete_hook(2, 1);
        t.commit(false).unwrap();
        assert_eq!(store.counter(2, Counter::Dead).unwrap(), 0);
        assert_verified(&store);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// The batched read of many hooks' rows answers what one read per hook answers,
        /// whatever lies between the hooks asked for: other hooks' rows, deleted rows (in
        /// the memtable or in a table file), another tenant's rows, gaps wider than a run.
        #[test]
        fn rows_of_hooks_answers_what_one_read_per_hook_does(
            hooks in proptest::collection::vec((1u32..3, 0u64..300, 0u16..3), 0..120),
            deleted in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 0..60),
            flushed_at in proptest::prelude::any::<proptest::sample::Index>(),
            asked in proptest::collection::btree_set(0u64..300, 0..40),
        ) {
            let (_dir, store) = store();
            let mut key = Vec::new();
            let flushed_at = flushed_at.index(deleted.len() + 1);
            let mut batch = WriteBatch::default();
            for &(ordinal, seq, sinks) in &hooks {
                for sink in 0..sinks {
                    key.clear();
                    keys::delivery(&mut key, ordinal, seq, sink);
                    store.put_cf(&mut batch, CF_DELIVERIES, &key, b"row");
                }
            }
            store.write(batch, false).unwrap();
            for (at, index) in deleted.iter().enumerate() {
                if at == flushed_at {
                    store.flush().unwrap();
                }
                if hooks.is_empty() {
                    break;
                }
                let (ordinal, seq, _) = hooks[index.index(hooks.len())];
                let mut batch = WriteBatch::default();
                key.clear();
                keys::delivery(&mut key, ordinal, seq, 0);
                store.delete_cf(&mut batch, CF_DELIVERIES, &key);
                store.write(batch, false).unwrap();
            }
            let seqs: Vec<u64> = asked.into_iter().collect();
            // The oracle: one bounded scan per hook, the plainest read there is.
            let mut one_by_one: Vec<(u64, u16)> = Vec::new();
            for &seq in &seqs {
                let (start, end) = keys::deliveries_of_hook(1, seq);
                store
                    .scan(CF_DELIVERIES, &start, Some(&end), |key, _| {
                        let (_, seq, sink) = keys::parse_delivery(key).unwrap();
                        one_by_one.push((seq, sink));
                        Ok(true)
                    })
                    .unwrap();
            }
            proptest::prop_assert_eq!(rows_of_hooks(&store, 1, &seqs).unwrap(), one_by_one);
        }
    }
}
