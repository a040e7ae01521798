//! `ankusa store verify`: every invariant of a store at rest, checked offline.
//!
//! - every key of every family decodes, and every hook, pending or archived, matches its
//!   integrity digest; a family whose bytes fail RocksDB's checksums is reported;
//! - every delivery row has exactly one index key (`?D`, `?F` or `?X`), and every such key
//!   names an existing row;
//! - every hook row has at least one delivery row (a hook whose last row went is archived)
//!   or is quarantined (and then has none), and every delivery row has its hook;
//! - every quarantine key names a hook, and every dedupe value decodes;
//! - every tenant with pending rows has its active marker — or, as a repairable state, not
//!   problem: the pipeline removes an idle tenant's marker, reads the due family again and
//!   puts the marker back if the writer added a row meanwhile, and a crash between the two
//!   commits leaves rows without a marker; the next start restores it from the counters
//!   (`dispatch::restore_active_markers`), so it is reported in [`Report::repairable`];
//! - every gauge counter (pending, bytes, inflight, dead, quarantined) equals the count of
//!   the keys it counts, per tenant, and the node aggregate equals the sum over tenants for
//!   every field;
//! - the lane invariant (the ordering lanes decision record): every lane member (`?O`) has
//!   its lane's head (`?H`) or marker (`?P`); every head names exactly one row, in `?D`
//!   or `?F`, of its lane; a laned row is a member, the head or dead; due kinds 2 and 3
//!   belong to lane heads only; and the counters lanes, lanes_blocked and lane_members
//!   equal the heads, the kind-3 due keys and the members.

use std::collections::{BTreeMap, BTreeSet};

use super::codec::{DeliveryRow, HookRecord, HOOK_VERSION_UNDIGESTED};
use super::keys::{self, Counter, DueKind, IndexKey, LaneId};
use super::{Store, StoreError, CF_ARCHIVE, CF_DELIVERIES, CF_HOOKS, CF_INDEX};

#[derive(Debug, Default)]
pub struct Report {
    pub hooks: u64,
    pub deliveries: u64,
    pub tenants: u64,
    pub problems: Vec<String>,
    /// States a crash may leave that the next start repairs; not problems.
    pub repairable: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// No problem and nothing to repair: what a store that never crashed must show.
    pub fn clean(&self) -> bool {
        self.ok() && self.repairable.is_empty()
    }
}

/// Problems past this many are counted, not listed.
const PROBLEMS_LISTED_MAX: usize = 100;

struct Problems<'a> {
    report: &'a mut Report,
    suppressed: u64,
}

impl Problems<'_> {
    fn push(&mut self, problem: String) {
        if self.report.problems.len() < PROBLEMS_LISTED_MAX {
            self.report.problems.push(problem);
        } else {
            self.suppressed += 1;
        }
    }
}

#[derive(Default)]
struct Expected {
    pending: i64,
    bytes: i64,
    inflight: i64,
    dead: i64,
    quarantined: i64,
    lanes: i64,
    lanes_blocked: i64,
    lane_members: i64,
}

/// A family whose stored bytes fail RocksDB's checksums is a problem of the store, not an
/// error of the check: it is reported, and the other families are still checked. What lies
/// past the damage in that family is not read.
fn report_unreadable(
    scanned: Result<(), StoreError>,
    family: &str,
    problems: &mut Vec<String>,
) -> Result<(), StoreError> {
    match scanned {
        Err(error) if error.is_corruption() => {
            problems.push(format!(
                "{family} family is damaged; entries past the damage were not checked: {error}"
            ));
            Ok(())
        }
        other => other,
    }
}

/// Where an index key puts a delivery row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Due(Option<DueKind>),
    Inflight,
    Dead,
    Member(LaneId),
}

/// One delivery row as the scan saw it.
#[derive(Default)]
struct Seen {
    size: u32,
    /// Index keys naming the row.
    named: u32,
    lane: Option<LaneId>,
    place: Option<Place>,
}

pub fn verify(store: &Store) -> Result<Report, StoreError> {
    let mut report = Report::default();
    let mut hooks: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut rows: BTreeMap<(u32, u64, u16), Seen> = BTreeMap::new();
    let mut decode_problems = Vec::new();

    // From format 3 every hook is sealed: the migration to it seals the older ones.
    let sealed_store = store.format()?.unwrap_or(0) >= 3;
    let check_hook = |what: String, value: &[u8], problems: &mut Vec<String>| {
        // Decoding checks the digest.
        if let Err(e) = HookRecord::decode(value) {
            problems.push(format!("{what}: {e}"));
        } else if sealed_store && value.first() == Some(&HOOK_VERSION_UNDIGESTED) {
            problems.push(format!("{what} has no integrity digest"));
        }
    };
    let scanned = store.scan(CF_HOOKS, &[], None, |key, value| {
        match keys::parse_hook(key) {
            Ok(id) => {
                check_hook(
                    format!("hook {}/{}", id.0, id.1),
                    value,
                    &mut decode_problems,
                );
                hooks.insert(id);
            }
            Err(e) => decode_problems.push(format!("hooks key {}: {e}", hex::encode(key))),
        }
        Ok(true)
    });
    report_unreadable(scanned, CF_HOOKS, &mut decode_problems)?;
    let scanned = store.scan(CF_ARCHIVE, &[], None, |key, value| {
        match keys::parse_archive(key) {
            Ok((ordinal, _, seq)) => check_hook(
                format!("archived hook {ordinal}/{seq}"),
                value,
                &mut decode_problems,
            ),
            Err(e) => decode_problems.push(format!("archive key {}: {e}", hex::encode(key))),
        }
        Ok(true)
    });
    report_unreadable(scanned, CF_ARCHIVE, &mut decode_problems)?;
    store.scan(CF_DELIVERIES, &[], None, |key, value| {
        match keys::parse_delivery(key) {
            Ok(id) => match DeliveryRow::decode(value) {
                Ok(row) => {
                    let seen = Seen {
                        size: row.size,
                        lane: row.lane.map(|lane| lane.id),
                        ..Seen::default()
                    };
                    rows.insert(id, seen);
                }
                Err(e) => {
                    decode_problems.push(format!("delivery {}/{}/{}: {e}", id.0, id.1, id.2));
                    rows.insert(id, Seen::default());
                }
            },
            Err(e) => decode_problems.push(format!("deliveries key {}: {e}", hex::encode(key))),
        }
        Ok(true)
    })?;

    let mut expected: BTreeMap<u32, Expected> = BTreeMap::new();
    let mut counters: BTreeMap<(u32, u8), i64> = BTreeMap::new();
    let mut active: BTreeSet<u32> = BTreeSet::new();
    let mut dangling = Vec::new();
    let mut quarantined: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut heads: BTreeMap<(u32, LaneId), (u64, u16)> = BTreeMap::new();
    let mut markers: BTreeSet<(u32, LaneId)> = BTreeSet::new();
    let mut members: BTreeSet<(u32, LaneId)> = BTreeSet::new();
    store.scan(CF_INDEX, &[], None, |key, value| {
        let parsed = match keys::parse_index(key) {
            Ok(parsed) => parsed,
            Err(e) => {
                decode_problems.push(format!("index key {}: {e}", hex::encode(key)));
                return Ok(true);
            }
        };
        let mut name_row =
            |ordinal: u32, seq: u64, sink: u16, family: &str, place: Place| match rows
                .get_mut(&(ordinal, seq, sink))
            {
                Some(entry) => {
                    entry.named += 1;
                    entry.place = Some(place);
                }
                None => dangling.push(format!(
                    "{family} key {ordinal}/{seq}/{sink} names no delivery row"
                )),
            };
        match parsed {
            IndexKey::Active { ordinal } => {
                active.insert(ordinal);
            }
            IndexKey::Counter { ordinal, field } => match keys::decode_counter(value) {
                Ok(v) => {
                    counters.insert((ordinal, field), v);
                }
                Err(e) => decode_problems.push(format!("counter {ordinal}/{field}: {e}")),
            },
            IndexKey::Due {
                ordinal, seq, sink, ..
            } => {
                let kind = match keys::parse_due_value(value) {
                    Ok((_, kind)) => Some(kind),
                    Err(e) => {
                        decode_problems.push(format!("due value {ordinal}/{seq}/{sink}: {e}"));
                        None
                    }
                };
                if kind == Some(DueKind::LaneRetry) {
                    expected.entry(ordinal).or_default().lanes_blocked += 1;
                }
                name_row(ordinal, seq, sink, "due", Place::Due(kind));
            }
            IndexKey::Inflight { ordinal, seq, sink } => {
                name_row(ordinal, seq, sink, "inflight", Place::Inflight);
                expected.entry(ordinal).or_default().inflight += 1;
            }
            IndexKey::Dead { ordinal, seq, sink } => {
                name_row(ordinal, seq, sink, "dead", Place::Dead);
                expected.entry(ordinal).or_default().dead += 1;
            }
            IndexKey::LaneMember {
                ordinal,
                lane,
                seq,
                sink,
            } => {
                if let Err(e) = keys::parse_lane_member_value(value) {
                    decode_problems.push(format!("lane member value {ordinal}/{seq}/{sink}: {e}"));
                }
                name_row(ordinal, seq, sink, "lane member", Place::Member(lane));
                members.insert((ordinal, lane));
                expected.entry(ordinal).or_default().lane_members += 1;
            }
            IndexKey::LaneHead { ordinal, lane } => match keys::parse_lane_head_value(value) {
                Ok(head) => {
                    heads.insert((ordinal, lane), head);
                    expected.entry(ordinal).or_default().lanes += 1;
                }
                Err(e) => {
                    decode_problems.push(format!("lane head {ordinal}/{}: {e}", hex::encode(lane)))
                }
            },
            IndexKey::LaneMarker { ordinal, lane } => {
                markers.insert((ordinal, lane));
            }
            IndexKey::Quarantine { ordinal, seq } => {
                quarantined.insert((ordinal, seq));
                expected.entry(ordinal).or_default().quarantined += 1;
            }
            IndexKey::Dedupe { ordinal, .. } => {
                if let Err(e) = keys::parse_dedupe_value(value) {
                    decode_problems.push(format!("dedupe value of tenant {ordinal}: {e}"));
                }
            }
        }
        Ok(true)
    })?;

    let mut repairable = Vec::new();
    let mut problems = Problems {
        report: &mut report,
        suppressed: 0,
    };
    for problem in decode_problems.into_iter().chain(dangling) {
        problems.push(problem);
    }
    lane_problems(&rows, &heads, &markers, &members, &mut problems);
    let mut hooks_with_rows: BTreeSet<(u32, u64)> = BTreeSet::new();
    for (&(ordinal, seq, sink), seen) in &rows {
        let (size, named) = (seen.size, seen.named);
        if named != 1 {
            problems.push(format!(
                "delivery row {ordinal}/{seq}/{sink} has {named} index keys, expected exactly 1"
            ));
        }
        if !hooks.contains(&(ordinal, seq)) {
            problems.push(format!(
                "delivery row {ordinal}/{seq}/{sink} has no hook row"
            ));
        }
        hooks_with_rows.insert((ordinal, seq));
        let tenant = expected.entry(ordinal).or_default();
        // A dead row is terminal: it leaves pending when it enters the DLQ.
        tenant.pending += 1;
        tenant.bytes += i64::from(size);
    }
    // Dead rows were counted as pending above; take them back out.
    for tenant in expected.values_mut() {
        tenant.pending -= tenant.dead;
    }
    for &(ordinal, seq) in hooks.difference(&hooks_with_rows) {
        if !quarantined.contains(&(ordinal, seq)) {
            problems.push(format!("hook {ordinal}/{seq} has no delivery rows"));
        }
    }
    for &(ordinal, seq) in &quarantined {
        if !hooks.contains(&(ordinal, seq)) {
            problems.push(format!("quarantine key {ordinal}/{seq} names no hook"));
        } else if hooks_with_rows.contains(&(ordinal, seq)) {
            problems.push(format!(
                "quarantined hook {ordinal}/{seq} has delivery rows"
            ));
        }
    }

    let tenant_ordinals: BTreeSet<u32> = expected
        .keys()
        .copied()
        .chain(counters.keys().map(|(ordinal, _)| *ordinal))
        .filter(|ordinal| *ordinal != keys::NODE_ORDINAL)
        .collect();
    for &ordinal in &tenant_ordinals {
        let want = expected.remove(&ordinal).unwrap_or_default();
        let gauges = [
            (Counter::Pending, want.pending),
            (
                Counter::Bytes,
                want.bytes - dead_bytes(store, ordinal, &rows)?,
            ),
            (Counter::Inflight, want.inflight),
            (Counter::Dead, want.dead),
            (Counter::Quarantined, want.quarantined),
            (Counter::Lanes, want.lanes),
            (Counter::LanesBlocked, want.lanes_blocked),
            (Counter::LaneMembers, want.lane_members),
        ];
        for (field, want_value) in gauges {
            let have = counters.get(&(ordinal, field as u8)).copied().unwrap_or(0);
            if have != want_value {
                problems.push(format!(
                    "tenant {ordinal}: counter {} is {have}, keys say {want_value}",
                    field.name()
                ));
            }
        }
        if want.pending > 0 && !active.contains(&ordinal) {
            repairable.push(format!(
                "tenant {ordinal} has pending rows and no active marker (the next start puts it back)"
            ));
        }
    }
    for field in Counter::ALL {
        let sum: i64 = tenant_ordinals
            .iter()
            .map(|ordinal| counters.get(&(*ordinal, field as u8)).copied().unwrap_or(0))
            .sum();
        let node = counters
            .get(&(keys::NODE_ORDINAL, field as u8))
            .copied()
            .unwrap_or(0);
        if node != sum {
            problems.push(format!(
                "node counter {} is {node}, the sum over tenants is {sum}",
                field.name()
            ));
        }
    }
    let suppressed = problems.suppressed;
    if suppressed > 0 {
        report
            .problems
            .push(format!("… and {suppressed} more problems"));
    }
    report.repairable = repairable;
    report.hooks = hooks.len() as u64;
    report.deliveries = rows.len() as u64;
    report.tenants = tenant_ordinals.len() as u64;
    Ok(report)
}

/// The lane invariant, over what the scan saw.
fn lane_problems(
    rows: &BTreeMap<(u32, u64, u16), Seen>,
    heads: &BTreeMap<(u32, LaneId), (u64, u16)>,
    markers: &BTreeSet<(u32, LaneId)>,
    members: &BTreeSet<(u32, LaneId)>,
    problems: &mut Problems<'_>,
) {
    for &(ordinal, lane) in members {
        if !heads.contains_key(&(ordinal, lane)) && !markers.contains(&(ordinal, lane)) {
            problems.push(format!(
                "lane {ordinal}/{} has members but neither a head nor a marker",
                hex::encode(lane)
            ));
        }
    }
    for (&(ordinal, lane), &(seq, sink)) in heads {
        let named = rows.get(&(ordinal, seq, sink));
        let in_lane = named.is_some_and(|seen| seen.lane == Some(lane));
        let active = named.is_some_and(|seen| {
            matches!(seen.place, Some(Place::Due(_) | Place::Inflight)) && seen.named == 1
        });
        if !in_lane || !active {
            problems.push(format!(
                "lane head {ordinal}/{} names row {ordinal}/{seq}/{sink}, which is not a due or \
                 claimed row of that lane",
                hex::encode(lane)
            ));
        }
    }
    for (&(ordinal, seq, sink), seen) in rows {
        let id = format!("{ordinal}/{seq}/{sink}");
        match (seen.lane, seen.place) {
            (None, Some(Place::Member(_))) => {
                problems.push(format!(
                    "delivery row {id} has no lane but is a lane member"
                ));
            }
            (None, Some(Place::Due(Some(kind)))) if kind.is_lane() => {
                problems.push(format!(
                    "delivery row {id} has no lane but its due key is of a lane head"
                ));
            }
            (Some(lane), Some(Place::Member(member_of))) if lane != member_of => {
                problems.push(format!("delivery row {id} is a member of another lane"));
            }
            (Some(lane), Some(place @ (Place::Due(_) | Place::Inflight))) => {
                if heads.get(&(ordinal, lane)) != Some(&(seq, sink)) {
                    problems.push(format!(
                        "delivery row {id} of lane {} is due or claimed but not the lane's head",
                        hex::encode(lane)
                    ));
                }
                if let Place::Due(Some(kind)) = place {
                    if !kind.is_lane() {
                        problems.push(format!(
                            "lane head {id} has a due key of an unordered row (kind {})",
                            kind as u8
                        ));
                    }
                }
            }
            _ => {}
        }
    }
}

/// Bytes of the tenant's dead rows: those left `bytes` when they were dead-lettered.
fn dead_bytes(
    store: &Store,
    ordinal: u32,
    rows: &BTreeMap<(u32, u64, u16), Seen>,
) -> Result<i64, StoreError> {
    let (start, end) = keys::family_range(keys::Tag::Dead, ordinal);
    let mut total = 0i64;
    store.scan(CF_INDEX, &start, Some(&end), |key, _| {
        if let Ok(IndexKey::Dead { ordinal, seq, sink }) = keys::parse_index(key) {
            total += rows
                .get(&(ordinal, seq, sink))
                .map(|seen| i64::from(seen.size))
                .unwrap_or(0);
        }
        Ok(true)
    })?;
    Ok(total)
}
