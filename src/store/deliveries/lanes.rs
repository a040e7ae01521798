//! Ordering lanes (the ordering lanes decision record): the `?O` member, `?H` head and
//! `?P` marker families and every move of them. Nothing else builds or moves these keys.
//!
//! A lane is (tenant, source, sink, ordering key). A row of a lane is in exactly one
//! place: a member (`?O`, waiting its turn in seq order), the head (`?H` plus its `?D` or
//! `?F`), or the DLQ. Only the head is ever due or claimed, so a lane has at most one
//! attempt in flight, and a waiting member holds no slot, no memory and no task.
//!
//! | move            | by                 | keys                                               | counters                        |
//! |-----------------|--------------------|----------------------------------------------------|---------------------------------|
//! | ingest / revive | writer / admin     | put `?O`, `?P` (blind)                             | lane_members +1                 |
//! | promote         | pipeline           | `?O` → `?H` + `?D` kind 2, delete `?P`             | lane_members −1, lanes +1       |
//! | retry / park    | pipeline           | head's `?D` kind 3                                 | lanes_blocked +1                |
//! | claim of kind 3 | pipeline           | —                                                  | lanes_blocked −1                |
//! | release         | pipeline           | promote the first member, else delete `?H`         | (promote's), else lanes −1      |
//!
//! Race closure: the writer and the admin put members blindly, each with its lane's `?P`.
//! A release reads the lane's first member and writes in the same step (one batch of the
//! one core that moves this tenant); a member committed after that read still has its
//! `?P`, and [`sweep`] promotes it. The invariant `store verify` checks: every `?O` has an
//! `?H` or a `?P`; every `?H` names exactly one row, in `?D` or `?F`.

use std::cell::RefCell;
use std::collections::HashMap;

use super::{RowId, Transitions};
use crate::store::codec::DeliveryRow;
use crate::store::keys::{self, Counter, DueKind, LaneId, Tag};
use crate::store::{Store, StoreError, WriteBatch, CF_INDEX};

/// Members a dead-lettered head takes along when its sink or source is gone, per batch:
/// the rest follow with the next head, so a long lane drains in bounded steps.
pub const GONE_MEMBERS_MAX: usize = 256;

/// A lane member as a seek finds it: (seq, sink, size).
pub type Member = (u64, u16, u32);

/// A lane's first member, or `None` when the lane has none. One seek.
pub fn first_member(
    store: &Store,
    ordinal: u32,
    lane: &LaneId,
) -> Result<Option<Member>, StoreError> {
    let (start, end) = keys::lane_members_of(ordinal, lane);
    member_at_or_after(store, &start, &end)
}

/// The first lane member in `[start, end)`.
fn member_at_or_after(
    store: &Store,
    start: &[u8],
    end: &[u8],
) -> Result<Option<Member>, StoreError> {
    let Some((key, value)) = store.first(CF_INDEX, start, end)? else {
        return Ok(None);
    };
    match (
        keys::parse_index(&key),
        keys::parse_lane_member_value(&value),
    ) {
        (Ok(keys::IndexKey::LaneMember { seq, sink, .. }), Ok(size)) => Ok(Some((seq, sink, size))),
        _ => Err(corrupt("lane member", &key)),
    }
}

/// Floors one core keeps at most; past that it starts over. A lane without a floor is
/// sought from its start: slower, never wrong.
const FLOORS_MAX: usize = 1 << 16;

/// Where each lane's next member is sought from, for the one pipeline core that moves the
/// lane: just past the member it promoted last.
///
/// A promoted member leaves a tombstone at the front of its lane's `?O` range until a
/// compaction drops it, so a busy lane's seek from its start steps over one tombstone per
/// hook it delivered lately; under load that was the largest cost of ordered delivery.
/// Members are promoted lowest first and the writer's new members have newer seqs, so
/// only a DLQ revive, which puts a row back with its old seq, can put a member below a
/// floor. A revive counts itself in the store's gauges before its batch commits and
/// after. A floor carries the count of ended revives read before the read that set it,
/// and a seek from it is trusted only when the count of begun revives read after the seek
/// still equals that: a revive whose member the setting read missed ended after that read,
/// and a revive whose member the seek could see began before the seek.
#[derive(Debug, Default)]
pub struct LaneFloors {
    floors: RefCell<HashMap<(u32, LaneId), Floor>>,
}

/// The member a lane promoted last, and the ended-revive count read before the read that
/// found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Floor {
    seq: u64,
    sink: u16,
    revives: u64,
}

impl LaneFloors {
    pub fn new() -> LaneFloors {
        LaneFloors::default()
    }

    /// Lanes with a floor.
    pub fn len(&self) -> usize {
        self.floors.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.floors.borrow().is_empty()
    }

    fn get(&self, ordinal: u32, lane: &LaneId) -> Option<Floor> {
        self.floors.borrow().get(&(ordinal, *lane)).copied()
    }

    /// Sets the floors of a batch that committed.
    pub(super) fn set(&self, moves: impl IntoIterator<Item = ((u32, LaneId), Floor)>) {
        let mut floors = self.floors.borrow_mut();
        for (lane, floor) in moves {
            if floors.len() >= FLOORS_MAX && !floors.contains_key(&lane) {
                floors.clear();
            }
            floors.insert(lane, floor);
        }
    }
}

/// A lane's first member, sought from the lane's floor when `floors` has a trusted one,
/// and the ended-revive count a floor set from this answer carries.
fn first_member_from(
    store: &Store,
    floors: Option<&LaneFloors>,
    ordinal: u32,
    lane: &LaneId,
) -> Result<(Option<Member>, u64), StoreError> {
    let gauges = store.gauges();
    let (start, end) = keys::lane_members_of(ordinal, lane);
    if let Some(floor) = floors.and_then(|floors| floors.get(ordinal, lane)) {
        let mut from = Vec::with_capacity(start.len() + 11);
        keys::lane_member(&mut from, ordinal, lane, floor.seq, floor.sink);
        // Just past the promoted member's own key.
        from.push(0);
        let member = member_at_or_after(store, &from, &end)?;
        if gauges.lane_revives_begun() == floor.revives {
            return Ok((member, floor.revives));
        }
    }
    let revives = gauges.lane_revives_ended();
    Ok((member_at_or_after(store, &start, &end)?, revives))
}

/// The head of a lane: its row's (seq, sink), or `None` when the lane is idle.
pub fn head(store: &Store, ordinal: u32, lane: &LaneId) -> Result<Option<(u64, u16)>, StoreError> {
    let mut key = Vec::with_capacity(21);
    keys::lane_head(&mut key, ordinal, lane);
    match store.get(CF_INDEX, &key)? {
        None => Ok(None),
        Some(value) => keys::parse_lane_head_value(&value)
            .map(Some)
            .map_err(|_| corrupt("lane head", &key)),
    }
}

/// A lane that has a head, as the admin lists it: the lane and its head row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadedLane {
    pub lane: LaneId,
    pub seq: u64,
    pub sink: u16,
}

/// `ordinal`'s lanes that have a head, in lane-id order from just after `after`, until
/// `visit` returns false (the caller bounds the page). Reads only, for the admin.
pub fn headed_lanes(
    store: &Store,
    ordinal: u32,
    after: Option<&LaneId>,
    mut visit: impl FnMut(HeadedLane) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let (mut start, end) = keys::family_range(Tag::LaneHead, ordinal);
    if let Some(lane) = after {
        start.clear();
        keys::lane_head(&mut start, ordinal, lane);
        // Just past the cursor's own key.
        start.push(0);
    }
    store.scan(CF_INDEX, &start, Some(&end), |key, value| {
        match (keys::parse_index(key), keys::parse_lane_head_value(value)) {
            (Ok(keys::IndexKey::LaneHead { lane, .. }), Ok((seq, sink))) => {
                visit(HeadedLane { lane, seq, sink })
            }
            _ => Err(corrupt("lane head", key)),
        }
    })
}

/// The members waiting behind a lane's head, counted up to `max`: a long lane is not
/// walked to its end on an operator's request.
pub fn members_waiting(
    store: &Store,
    ordinal: u32,
    lane: &LaneId,
    max: usize,
) -> Result<usize, StoreError> {
    let (start, end) = keys::lane_members_of(ordinal, lane);
    let mut count = 0;
    store.scan(CF_INDEX, &start, Some(&end), |_, _| {
        count += 1;
        Ok(count < max)
    })?;
    Ok(count)
}

/// Whether the tenant has any lane marker: promotion work may be waiting. One seek.
pub fn has_marker(store: &Store, ordinal: u32) -> Result<bool, StoreError> {
    let (start, end) = keys::family_range(Tag::LaneMarker, ordinal);
    Ok(store.first(CF_INDEX, &start, &end)?.is_some())
}

/// The lane whose head is row `id`, found by its head key when the row itself cannot say
/// (missing or undecodable): a scan of the tenant's heads, on that rare path only.
fn lane_headed_by(store: &Store, id: RowId) -> Result<Option<LaneId>, StoreError> {
    let (start, end) = keys::family_range(Tag::LaneHead, id.ordinal);
    let mut found = None;
    store.scan(CF_INDEX, &start, Some(&end), |key, value| {
        if let (Ok(keys::IndexKey::LaneHead { lane, .. }), Ok(head)) =
            (keys::parse_index(key), keys::parse_lane_head_value(value))
        {
            if head == (id.seq, id.sink) {
                found = Some(lane);
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    Ok(found)
}

fn corrupt(what: &str, key: &[u8]) -> StoreError {
    StoreError::Corrupt {
        what: format!("{what} {}", hex::encode(key)),
        reason: "does not decode".into(),
    }
}

/// What one [`sweep`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Markers read.
    pub markers: usize,
    /// Lanes given a head.
    pub promoted: usize,
}

/// Promotion work of one tenant: reads up to `limit` of its `?P` markers and, for each,
/// deletes it when the lane has a head (the head's release reads the members), promotes
/// the first member when it has none, or deletes a marker with nothing behind it — then
/// reads that lane's members once more and puts the marker back if one appeared (a
/// writer's put came either before the delete, and this read sees its member, or after
/// it, and its marker is back). Pipeline only, on the core that moves the tenant.
pub fn sweep(
    store: &Store,
    floors: &LaneFloors,
    ordinal: u32,
    limit: usize,
) -> Result<Swept, StoreError> {
    sweep_at(store, Some(floors), ordinal, limit, crate::clock::now_ms())
}

/// [`sweep`] at `now_ms`: the promoted heads are due then.
pub fn sweep_at(
    store: &Store,
    floors: Option<&LaneFloors>,
    ordinal: u32,
    limit: usize,
    now_ms: u64,
) -> Result<Swept, StoreError> {
    let (start, end) = keys::family_range(Tag::LaneMarker, ordinal);
    let mut lanes = Vec::new();
    store.scan(CF_INDEX, &start, Some(&end), |key, _| {
        if let Ok(keys::IndexKey::LaneMarker { lane, .. }) = keys::parse_index(key) {
            lanes.push(lane);
        }
        Ok(lanes.len() < limit)
    })?;
    sweep_marked(store, floors, ordinal, &lanes, &[], now_ms)
}

/// The sweep of the given lanes only (those the writer or a revive named since the last
/// sweep), read by key instead of scanning the tenant's markers and the tombstones of
/// every marker deleted before. A lane with a head has its marker deleted unread (the
/// head's release reads the members: under load, that is nearly every named lane); a
/// lane without one is swept when it has its marker, else skipped.
pub fn sweep_lanes_at(
    store: &Store,
    floors: Option<&LaneFloors>,
    ordinal: u32,
    lanes: &[LaneId],
    now_ms: u64,
) -> Result<Swept, StoreError> {
    let mut key = Vec::with_capacity(21);
    let mut headed = Vec::with_capacity(lanes.len());
    let mut marked = Vec::new();
    for lane in lanes {
        if head(store, ordinal, lane)?.is_some() {
            headed.push(*lane);
            continue;
        }
        key.clear();
        keys::lane_marker(&mut key, ordinal, lane);
        if store.get(CF_INDEX, &key)?.is_some() {
            marked.push(*lane);
        }
    }
    sweep_marked(store, floors, ordinal, &marked, &headed, now_ms)
}

/// The sweep's work on lanes known to have a marker (`lanes`), and the deletion of the
/// markers of lanes found with a head (`headed`).
fn sweep_marked(
    store: &Store,
    floors: Option<&LaneFloors>,
    ordinal: u32,
    lanes: &[LaneId],
    headed: &[LaneId],
    now_ms: u64,
) -> Result<Swept, StoreError> {
    let mut swept = Swept {
        markers: lanes.len(),
        promoted: 0,
    };
    if lanes.is_empty() && headed.is_empty() {
        return Ok(swept);
    }
    let mut transitions = Transitions::at(store, now_ms);
    transitions.floors = floors;
    for lane in headed {
        transitions.delete_marker(ordinal, lane);
    }
    let mut emptied = Vec::new();
    for lane in lanes {
        if head(store, ordinal, lane)?.is_some() {
            transitions.delete_marker(ordinal, lane);
            continue;
        }
        match first_member_from(store, floors, ordinal, lane)? {
            (Some(member), revives) => {
                transitions.note_lane_moved(ordinal, lane);
                transitions.promote(ordinal, lane, member, revives);
                swept.promoted += 1;
            }
            (None, _) => {
                transitions.delete_marker(ordinal, lane);
                emptied.push(*lane);
            }
        }
    }
    transitions.count += 1;
    transitions.commit(false)?;
    let mut restore = Transitions::at(store, now_ms);
    for lane in &emptied {
        if first_member_from(store, floors, ordinal, lane)?.0.is_some() {
            restore.put_marker(ordinal, lane);
            restore.count += 1;
        }
    }
    restore.commit(false)?;
    Ok(swept)
}

/// Puts row `id` into `lane` as a member, with the lane's marker: blind puts, the
/// writer's and a revive's way into a lane (the caller counts the member). `key` is a
/// scratch buffer.
pub(super) fn put_member(
    store: &Store,
    batch: &mut WriteBatch,
    key: &mut Vec<u8>,
    id: RowId,
    lane: &LaneId,
    size: u32,
) {
    key.clear();
    keys::lane_member(key, id.ordinal, lane, id.seq, id.sink);
    store.put_cf(batch, CF_INDEX, key, &keys::lane_member_value(size));
    key.clear();
    keys::lane_marker(key, id.ordinal, lane);
    store.put_cf(batch, CF_INDEX, key, &[]);
}

impl Transitions<'_> {
    /// Puts row `id` into `lane` as a member, with the lane's marker.
    pub(super) fn put_member(&mut self, id: RowId, lane: &LaneId, size: u32) {
        put_member(self.store, &mut self.batch, &mut self.key, id, lane, size);
        self.deltas.add(id.ordinal, Counter::LaneMembers, 1);
    }

    fn put_marker(&mut self, ordinal: u32, lane: &LaneId) {
        self.key.clear();
        keys::lane_marker(&mut self.key, ordinal, lane);
        self.store.put_cf(&mut self.batch, CF_INDEX, &self.key, &[]);
    }

    fn delete_marker(&mut self, ordinal: u32, lane: &LaneId) {
        self.key.clear();
        keys::lane_marker(&mut self.key, ordinal, lane);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
    }

    fn delete_member(&mut self, ordinal: u32, lane: &LaneId, seq: u64, sink: u16) {
        self.key.clear();
        keys::lane_member(&mut self.key, ordinal, lane, seq, sink);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
        self.deltas.add(ordinal, Counter::LaneMembers, -1);
    }

    /// The lane's first member becomes its head, due now as a first attempt (kind 2).
    /// `revives` is the ended-revive count read before the read that found the member:
    /// the lane's floor once the batch commits.
    fn promote(&mut self, ordinal: u32, lane: &LaneId, (seq, sink, size): Member, revives: u64) {
        self.floor_moves
            .push(((ordinal, *lane), Floor { seq, sink, revives }));
        self.delete_member(ordinal, lane, seq, sink);
        self.key.clear();
        keys::lane_head(&mut self.key, ordinal, lane);
        self.store.put_cf(
            &mut self.batch,
            CF_INDEX,
            &self.key,
            &keys::lane_head_value(seq, sink),
        );
        let id = RowId { ordinal, seq, sink };
        self.put_due(id, self.now_ms, size, DueKind::LaneFirstAttempt);
        self.put_active(ordinal);
        self.delete_marker(ordinal, lane);
        self.deltas.add(ordinal, Counter::Lanes, 1);
    }

    /// Ends the life of `lane`'s head (the caller has moved the head's row out of
    /// `?D`/`?F` in this batch): the first member, if any, becomes the head; else the lane
    /// goes idle. The read and the write are one step of the one core that moves the
    /// tenant; a member committed after the read has its marker, which the sweep sees.
    pub(super) fn release(&mut self, ordinal: u32, lane: &LaneId) -> Result<(), StoreError> {
        self.note_lane_moved(ordinal, lane);
        self.deltas.add(ordinal, Counter::Lanes, -1);
        match first_member_from(self.store, self.floors, ordinal, lane)? {
            (Some(member), revives) => self.promote(ordinal, lane, member, revives),
            (None, _) => self.delete_head(ordinal, lane),
        }
        Ok(())
    }

    /// Releases the lane row `id` headed, if it was a lane head (`kind` 2 or 3, or unknown,
    /// or a row with a lane).
    pub(super) fn release_head_of(
        &mut self,
        id: RowId,
        kind: Option<DueKind>,
        row: Option<&DeliveryRow>,
    ) -> Result<(), StoreError> {
        if let Some(row) = row {
            return match &row.lane {
                Some(lane) => self.release(id.ordinal, &lane.id),
                None => Ok(()),
            };
        }
        if kind.is_some_and(|kind| !kind.is_lane()) {
            return Ok(());
        }
        match lane_headed_by(self.store, id)? {
            Some(lane) => self.release(id.ordinal, &lane),
            None => Ok(()),
        }
    }

    /// Dead-letters the due lane head `id` (its sink or source is gone) and, in the same
    /// batch, up to [`GONE_MEMBERS_MAX`] of the members behind it that `gone` also refuses
    /// (`gone` returns the reason), then releases the lane to the first member left.
    #[allow(clippy::too_many_arguments)]
    pub fn dead_gone_lane(
        &mut self,
        id: RowId,
        due_ms: u64,
        kind: DueKind,
        row: &DeliveryRow,
        lane: &LaneId,
        reason: &str,
        mut gone: impl FnMut(&DeliveryRow) -> Option<String>,
    ) -> Result<(), StoreError> {
        self.delete_due(id, due_ms);
        self.put_dead(id, reason);
        self.put_row(id, row);
        self.dead_counters(id.ordinal, row.size);
        self.unblock_if_blocked(id.ordinal, Some(kind));
        self.count += 1;
        let ordinal = id.ordinal;
        self.note_lane_moved(ordinal, lane);
        self.deltas.add(ordinal, Counter::Lanes, -1);
        // From the lane's start: a rare path, not worth the floor's bookkeeping.
        let revives = self.store.gauges().lane_revives_ended();
        let (start, end) = keys::lane_members_of(ordinal, lane);
        let mut members = Vec::new();
        let mut undecodable = None;
        self.store
            .scan(CF_INDEX, &start, Some(&end), |key, value| {
                match (keys::parse_index(key), keys::parse_lane_member_value(value)) {
                    (Ok(keys::IndexKey::LaneMember { seq, sink, .. }), Ok(size)) => {
                        members.push((seq, sink, size));
                    }
                    _ => {
                        undecodable = Some(key.to_vec());
                        return Ok(false);
                    }
                }
                Ok(members.len() < GONE_MEMBERS_MAX)
            })?;
        if let Some(key) = undecodable {
            return Err(corrupt("lane member", &key));
        }
        let mut next = None;
        let mut taken = 0;
        for &(seq, sink, size) in &members {
            let member = RowId { ordinal, seq, sink };
            let refused = super::read_row(self.store, member)?
                .and_then(|bytes| DeliveryRow::decode(&bytes).ok())
                .and_then(|member_row| gone(&member_row).map(|reason| (member_row, reason)));
            // A member that still routes, or that cannot be read (its own visit as head
            // deals with that), becomes the head.
            let Some((member_row, reason)) = refused else {
                next = Some((seq, sink, size));
                break;
            };
            self.delete_member(ordinal, lane, seq, sink);
            self.put_dead(member, &reason);
            self.put_row(
                member,
                &DeliveryRow {
                    last_error: reason.clone(),
                    ..member_row
                },
            );
            self.dead_counters(ordinal, size);
            self.count += 1;
            taken += 1;
        }
        if next.is_none() && taken == GONE_MEMBERS_MAX {
            // More may wait past the ones this batch takes (still in the store until it
            // commits).
            if let Some(&(seq, sink, _)) = members.last() {
                let mut after = Vec::with_capacity(32);
                keys::lane_member(&mut after, ordinal, lane, seq, sink);
                after.push(0);
                if let Some((key, value)) = self.store.first(CF_INDEX, &after, &end)? {
                    match (
                        keys::parse_index(&key),
                        keys::parse_lane_member_value(&value),
                    ) {
                        (Ok(keys::IndexKey::LaneMember { seq, sink, .. }), Ok(size)) => {
                            next = Some((seq, sink, size));
                        }
                        _ => return Err(corrupt("lane member", &key)),
                    }
                }
            }
        }
        match next {
            Some(member) => self.promote(ordinal, lane, member, revives),
            None => self.delete_head(ordinal, lane),
        }
        Ok(())
    }

    fn delete_head(&mut self, ordinal: u32, lane: &LaneId) {
        self.key.clear();
        keys::lane_head(&mut self.key, ordinal, lane);
        self.store.delete_cf(&mut self.batch, CF_INDEX, &self.key);
    }

    fn note_lane_moved(&mut self, ordinal: u32, lane: &LaneId) {
        debug_assert!(
            !self.lanes_moved.contains(&(ordinal, *lane)),
            "one batch moves a lane at most once: its state is read from the store"
        );
        self.lanes_moved.push((ordinal, *lane));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::codec::{HookRecord, RowLane};
    use crate::store::deliveries::{due_rows, read_row, Class, Ingest};
    use crate::store::{verify, WriteBatch};

    const ORD: u32 = 1;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    fn lane(key: &str) -> RowLane {
        RowLane::new(0, "orders", Some(key.as_bytes()))
    }

    /// The writer's batch for hook `seq` with one ordered sink in `lane`; its size is
    /// `10 + seq`.
    fn ingest(store: &Store, seq: u64, lane: &RowLane) {
        let mut value = Vec::new();
        HookRecord {
            source_id: "orders".into(),
            tenant_id: "t".into(),
            received_at_ms: seq,
            dedupe_key: Vec::new(),
            headers: Vec::new(),
            body: b"{}".to_vec(),
        }
        .encode(&mut value);
        let mut batch = WriteBatch::default();
        let mut ingest = Ingest::new();
        ingest.add(
            store,
            &mut batch,
            ORD,
            seq,
            &value,
            &["http"],
            &[Some(lane.clone())],
            10 + seq as u32,
            seq,
            Class::Live,
        );
        let gauges = ingest.seal(store, &mut batch, seq);
        store.write(batch, false).unwrap();
        store.gauges().apply(&gauges);
    }

    fn id(seq: u64) -> RowId {
        RowId {
            ordinal: ORD,
            seq,
            sink: 0,
        }
    }

    fn row(store: &Store, seq: u64) -> DeliveryRow {
        DeliveryRow::decode(&read_row(store, id(seq)).unwrap().unwrap()).unwrap()
    }

    fn counters(store: &Store) -> [i64; 3] {
        [Counter::Lanes, Counter::LanesBlocked, Counter::LaneMembers]
            .map(|field| store.counter(ORD, field).unwrap())
    }

    fn due(store: &Store) -> Vec<(u64, u64, DueKind)> {
        let mut out = Vec::new();
        due_rows(store, ORD, 0, u64::MAX, |row| {
            let row = row.unwrap();
            out.push((row.id.seq, row.due_ms, row.kind));
            true
        })
        .unwrap();
        out
    }

    fn verified(store: &Store) {
        let report = verify::verify(store).unwrap();
        assert!(
            report.clean(),
            "{:?} {:?}",
            report.problems,
            report.repairable
        );
    }

    fn claim(store: &Store, seq: u64, due_ms: u64, kind: DueKind) {
        let mut claimed = row(store, seq);
        claimed.attempts += 1;
        let mut t = Transitions::at(store, due_ms);
        t.claim(id(seq), due_ms, kind, &claimed, due_ms);
        t.commit(false).unwrap();
    }

    /// Members wait without a due key; the sweep makes the lowest the head (kind 2);
    /// a retry blocks the lane (kind 3, lanes_blocked +1), its claim unblocks it, and the
    /// head's delivery hands the lane to the next member.
    #[test]
    fn a_lane_moves_one_head_at_a_time_with_its_counters() {
        let (_dir, store) = store();
        let a = lane("cus_a");
        for seq in [1, 2, 3] {
            ingest(&store, seq, &a);
        }
        assert!(due(&store).is_empty(), "members are not due");
        assert_eq!(counters(&store), [0, 0, 3]);
        assert!(has_marker(&store, ORD).unwrap());
        verified(&store);

        let swept = sweep_at(&store, None, ORD, 10, 100).unwrap();
        assert_eq!(
            swept,
            Swept {
                markers: 1,
                promoted: 1
            }
        );
        assert_eq!(due(&store), vec![(1, 100, DueKind::LaneFirstAttempt)]);
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((1, 0)));
        assert_eq!(counters(&store), [1, 0, 2]);
        assert!(!has_marker(&store, ORD).unwrap());
        verified(&store);

        claim(&store, 1, 100, DueKind::LaneFirstAttempt);
        let mut t = Transitions::at(&store, 110);
        t.retry(id(1), &row(&store, 1), 500, Class::Live);
        t.commit(false).unwrap();
        assert_eq!(due(&store), vec![(1, 500, DueKind::LaneRetry)]);
        assert_eq!(counters(&store), [1, 1, 2]);
        verified(&store);

        claim(&store, 1, 500, DueKind::LaneRetry);
        assert_eq!(counters(&store), [1, 0, 2]);
        let mut t = Transitions::at(&store, 600);
        t.delivered(id(1), &row(&store, 1)).unwrap();
        t.delete_hook(ORD, 1);
        t.commit(false).unwrap();
        assert_eq!(due(&store), vec![(2, 600, DueKind::LaneFirstAttempt)]);
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((2, 0)));
        assert_eq!(counters(&store), [1, 0, 1]);
        verified(&store);

        // A breaker park blocks the lane like a retry.
        let mut t = Transitions::at(&store, 700);
        t.park(id(2), 600, 900, 12, DueKind::LaneFirstAttempt);
        t.commit(false).unwrap();
        assert_eq!(due(&store), vec![(2, 900, DueKind::LaneRetry)]);
        assert_eq!(counters(&store), [1, 1, 1]);
        verified(&store);

        // Dead-lettering the blocked head unblocks and releases the lane to seq 3.
        let mut t = Transitions::at(&store, 950);
        t.dead_from_due(
            id(2),
            900,
            12,
            Some(DueKind::LaneRetry),
            Some(&row(&store, 2)),
            "permanent",
        )
        .unwrap();
        t.commit(false).unwrap();
        assert_eq!(due(&store), vec![(3, 950, DueKind::LaneFirstAttempt)]);
        assert_eq!(counters(&store), [1, 0, 0]);
        verified(&store);

        claim(&store, 3, 950, DueKind::LaneFirstAttempt);
        let mut t = Transitions::at(&store, 1_000);
        t.delivered(id(3), &row(&store, 3)).unwrap();
        t.delete_hook(ORD, 3);
        t.commit(false).unwrap();
        assert_eq!(head(&store, ORD, &a.id).unwrap(), None);
        assert_eq!(counters(&store), [0, 0, 0]);
        verified(&store);

        // Revived, the dead row re-enters as a member with its marker, not as due.
        let mut t = Transitions::at(&store, 1_100);
        t.revive(id(2), &row(&store, 2), 1_100, Class::Live);
        t.commit(false).unwrap();
        assert!(due(&store).is_empty());
        assert_eq!(counters(&store), [0, 0, 1]);
        assert!(has_marker(&store, ORD).unwrap());
        verified(&store);
        sweep_at(&store, None, ORD, 10, 1_200).unwrap();
        assert_eq!(due(&store), vec![(2, 1_200, DueKind::LaneFirstAttempt)]);
        assert_eq!(row(&store, 2).attempts, 0);
    }

    /// Delivers or dead-letters the claimed head `seq` in a batch of the core that keeps
    /// `floors`, committed at once.
    fn end_head(store: &Store, floors: &LaneFloors, seq: u64, at: u64, dead: bool) {
        let mut t = Transitions::at(store, at).with_lane_floors(floors);
        if dead {
            t.dead_from_inflight(id(seq), &row(store, seq), "permanent")
                .unwrap();
        } else {
            t.delivered(id(seq), &row(store, seq)).unwrap();
            t.delete_hook(ORD, seq);
        }
        t.commit(false).unwrap();
    }

    /// Lane `cus_a` with hooks 1 to 4 through a core's `floors`: 1 was the head and is
    /// dead-lettered at 20, so 2 is the head and the floor is past 2.
    fn lane_past_a_dead_head(store: &Store, floors: &LaneFloors) -> RowLane {
        let a = lane("cus_a");
        for seq in 1..=4 {
            ingest(store, seq, &a);
        }
        sweep_at(store, Some(floors), ORD, 10, 10).unwrap();
        assert_eq!(floors.len(), 1, "the sweep's promote sets the floor");
        claim(store, 1, 10, DueKind::LaneFirstAttempt);
        end_head(store, floors, 1, 20, true);
        assert_eq!(head(store, ORD, &a.id).unwrap(), Some((2, 0)));
        a
    }

    /// A release seeks from the lane's floor, past the members it promoted before; a DLQ
    /// revive puts a member back below the floor, and the next release still promotes it
    /// before every later member.
    #[test]
    fn a_member_revived_below_the_floor_runs_before_later_members() {
        let (_dir, store) = store();
        let floors = LaneFloors::new();
        let a = lane_past_a_dead_head(&store, &floors);

        let mut t = Transitions::at(&store, 30);
        t.revive(id(1), &row(&store, 1), 30, Class::Live);
        t.commit(false).unwrap();
        claim(&store, 2, 20, DueKind::LaneFirstAttempt);
        end_head(&store, &floors, 2, 40, false);
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((1, 0)));
        claim(&store, 1, 40, DueKind::LaneFirstAttempt);
        end_head(&store, &floors, 1, 50, false);
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((3, 0)));
        verified(&store);
    }

    /// A revive that commits between a release's read and its commit: the floor that
    /// release sets was read before the revive ended, so the next release does not trust
    /// it and finds the revived member below it.
    #[test]
    fn a_member_revived_during_a_release_is_not_skipped_by_its_floor() {
        let (_dir, store) = store();
        let floors = LaneFloors::new();
        let a = lane_past_a_dead_head(&store, &floors);
        claim(&store, 2, 20, DueKind::LaneFirstAttempt);

        let mut release = Transitions::at(&store, 30).with_lane_floors(&floors);
        release.delivered(id(2), &row(&store, 2)).unwrap();
        release.delete_hook(ORD, 2);
        let mut t = Transitions::at(&store, 30);
        t.revive(id(1), &row(&store, 1), 30, Class::Live);
        t.commit(false).unwrap();
        release.commit(false).unwrap();
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((3, 0)));

        claim(&store, 3, 30, DueKind::LaneFirstAttempt);
        end_head(&store, &floors, 3, 40, false);
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((1, 0)));
        verified(&store);
    }

    /// The race the markers close: a release reads "no member" and, before it commits,
    /// the writer commits a member (with its marker). The lane is left with a member and
    /// no head — but with the marker, so the invariant holds and the sweep promotes it.
    #[test]
    fn a_member_committed_during_a_release_is_promoted_by_the_sweep() {
        let (_dir, store) = store();
        let a = lane("cus_a");
        ingest(&store, 1, &a);
        sweep_at(&store, None, ORD, 10, 10).unwrap();
        claim(&store, 1, 10, DueKind::LaneFirstAttempt);

        let mut release = Transitions::at(&store, 20);
        release.delivered(id(1), &row(&store, 1)).unwrap();
        release.delete_hook(ORD, 1);
        ingest(&store, 2, &a);
        release.commit(false).unwrap();

        assert_eq!(head(&store, ORD, &a.id).unwrap(), None);
        assert_eq!(first_member(&store, ORD, &a.id).unwrap(), Some((2, 0, 12)));
        assert!(has_marker(&store, ORD).unwrap());
        verified(&store);
        let swept = sweep_at(&store, None, ORD, 10, 30).unwrap();
        assert_eq!(swept.promoted, 1);
        assert_eq!(due(&store), vec![(2, 30, DueKind::LaneFirstAttempt)]);
        verified(&store);
    }

    /// The sweep of named lanes reads each lane by key: a named lane with a head has its
    /// marker deleted (its members wait for the head's release), a marked one without a
    /// head is swept as a scan would, and a lane not named is left alone.
    #[test]
    fn a_named_lane_sweep_reads_only_the_named_markers() {
        let (_dir, store) = store();
        let (a, b) = (lane("cus_a"), lane("cus_b"));
        ingest(&store, 1, &a);
        ingest(&store, 2, &b);
        let swept = sweep_lanes_at(&store, None, ORD, &[a.id], 10).unwrap();
        assert_eq!(
            swept,
            Swept {
                markers: 1,
                promoted: 1
            }
        );
        assert_eq!(head(&store, ORD, &b.id).unwrap(), None, "b was not named");
        let swept = sweep_lanes_at(&store, None, ORD, &[a.id], 20).unwrap();
        assert_eq!(
            swept,
            Swept {
                markers: 0,
                promoted: 0
            }
        );
        // A member behind a's head: named, its marker goes and the head stays.
        ingest(&store, 3, &a);
        let mut marker = Vec::new();
        keys::lane_marker(&mut marker, ORD, &a.id);
        assert!(store.get(CF_INDEX, &marker).unwrap().is_some());
        let swept = sweep_lanes_at(&store, None, ORD, &[a.id], 25).unwrap();
        assert_eq!(swept.promoted, 0);
        assert_eq!(store.get(CF_INDEX, &marker).unwrap(), None);
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((1, 0)));
        verified(&store);
        let swept = sweep_lanes_at(&store, None, ORD, &[a.id, b.id], 30).unwrap();
        assert_eq!(
            swept,
            Swept {
                markers: 1,
                promoted: 1
            }
        );
        assert_eq!(head(&store, ORD, &b.id).unwrap(), Some((2, 0)));
        verified(&store);
    }

    /// A head whose sink is gone takes its gone members to the DLQ in the same batch and
    /// hands the lane to the first member that still routes (here: the rows over 12
    /// bytes); with none left, the lane goes idle.
    #[test]
    fn a_gone_head_takes_its_gone_members_along() {
        let (_dir, store) = store();
        let a = lane("cus_a");
        for seq in 1..=4 {
            ingest(&store, seq, &a);
        }
        sweep_at(&store, None, ORD, 10, 10).unwrap();
        let mut t = Transitions::at(&store, 20);
        let head_row = row(&store, 1);
        t.dead_gone_lane(
            id(1),
            10,
            DueKind::LaneFirstAttempt,
            &head_row,
            &a.id,
            "sink_gone",
            |member| (member.size <= 12).then(|| "sink_gone".to_owned()),
        )
        .unwrap();
        t.commit(false).unwrap();
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((3, 0)));
        assert_eq!(due(&store), vec![(3, 20, DueKind::LaneFirstAttempt)]);
        assert_eq!(store.counter(ORD, Counter::Dead).unwrap(), 2);
        assert_eq!(counters(&store), [1, 0, 1]);
        verified(&store);

        let mut t = Transitions::at(&store, 30);
        t.dead_gone_lane(
            id(3),
            20,
            DueKind::LaneFirstAttempt,
            &row(&store, 3),
            &a.id,
            "sink_gone",
            |_| Some("sink_gone".to_owned()),
        )
        .unwrap();
        t.commit(false).unwrap();
        assert_eq!(head(&store, ORD, &a.id).unwrap(), None);
        assert_eq!(store.counter(ORD, Counter::Dead).unwrap(), 4);
        assert_eq!(counters(&store), [0, 0, 0]);
        verified(&store);
    }

    /// A due head whose row is gone (an orphan) still releases its lane, found by its
    /// head key; a purge erases every lane family and counter of the tenant.
    #[test]
    fn an_orphaned_head_releases_its_lane_and_a_purge_erases_every_lane_key() {
        let (_dir, store) = store();
        let a = lane("cus_a");
        ingest(&store, 1, &a);
        ingest(&store, 2, &a);
        ingest(&store, 3, &lane("cus_b"));
        sweep_at(&store, None, ORD, 10, 10).unwrap();
        // The row of head 1 disappears (corruption).
        let mut batch = WriteBatch::default();
        let mut key = Vec::new();
        keys::delivery(&mut key, ORD, 1, 0);
        store.delete_cf(&mut batch, crate::store::CF_DELIVERIES, &key);
        store.write(batch, false).unwrap();
        let mut t = Transitions::at(&store, 20);
        t.drop_orphan_due(id(1), 10, 11, Some(DueKind::LaneFirstAttempt))
            .unwrap();
        t.commit(false).unwrap();
        assert_eq!(head(&store, ORD, &a.id).unwrap(), Some((2, 0)));

        let counters_before: Vec<(Counter, i64)> = Counter::ALL
            .iter()
            .map(|field| (*field, store.counter(ORD, *field).unwrap()))
            .collect();
        let mut t = Transitions::new(&store);
        t.purge_tenant(ORD, "t", &counters_before);
        t.commit(false).unwrap();
        for tag in [
            Tag::LaneHead,
            Tag::LaneMember,
            Tag::LaneMarker,
            Tag::Counter,
        ] {
            let (start, end) = keys::family_range(tag, ORD);
            assert!(
                store.first(CF_INDEX, &start, &end).unwrap().is_none(),
                "{tag:?}"
            );
        }
        for field in [Counter::Lanes, Counter::LanesBlocked, Counter::LaneMembers] {
            assert_eq!(store.counter(keys::NODE_ORDINAL, field).unwrap(), 0);
        }
        verified(&store);
    }
}
