//! Every store key is built and parsed here; nothing else concatenates key bytes.
//!
//! Integers are big-endian so byte order is numeric order. Every key of a tenant-scoped
//! family starts with the tenant ordinal (after the family tag in `index`), so one tenant is
//! one contiguous range per family. Encoders append into a caller's buffer so the writer
//! reuses one allocation for every key of a batch.
//!
//! | cf           | key                                          | value                     |
//! |--------------|----------------------------------------------|---------------------------|
//! | `meta`       | `format`, `instance_id`, `next_ordinal`, `seq`, `tenant/<id>`, `header_hash_key` | u32 / u64 / bytes |
//! | `hooks`      | `ord:u32 seq:u64`                            | [`codec::HookRecord`]     |
//! | `deliveries` | `ord:u32 seq:u64 sink:u16`                   | [`codec::DeliveryRow`]    |
//! | `archive`    | `ord:u32 received_at_ms:u64 seq:u64`         | delivered hook record     |
//! | `index`      | `tag:u8 ord:u32 …` (families below)           |                           |
//!
//! | tag | family     | key after `tag ord`                | value                    |
//! |-----|------------|------------------------------------|--------------------------|
//! | `A` | active     | —                                  | —                        |
//! | `C` | counter    | `field:u8`                         | i64 BE, merge: add       |
//! | `D` | due        | `due_ms:u64 seq:u64 sink:u16`      | `size:u32 kind:u8`       |
//! | `F` | in flight  | `seq:u64 sink:u16`                 | `claimed_at_ms:u64 size:u32` |
//! | `H` | lane head  | `lane:u128`                        | `seq:u64 sink:u16`       |
//! | `K` | dedupe     | `source 0x00 dedupe_key`           | `seq:u64 expires_ms:u64` |
//! | `O` | lane member | `lane:u128 seq:u64 sink:u16`      | `size:u32`               |
//! | `P` | lane marker | `lane:u128`                       | —                        |
//! | `Q` | quarantine | `seq:u64`                          | reason                   |
//! | `X` | dead       | `seq:u64 sink:u16`                 | reason (UTF-8)           |
//!
//! The lane families (`H`, `O`, `P`) are built here and moved only by
//! `deliveries::lanes` (the ordering lanes decision record, section 3).
//!
//! [`codec::HookRecord`]: super::codec::HookRecord
//! [`codec::DeliveryRow`]: super::codec::DeliveryRow

use thiserror::Error;

pub const META_FORMAT: &[u8] = b"format";
pub const META_INSTANCE_ID: &[u8] = b"instance_id";
pub const META_NEXT_ORDINAL: &[u8] = b"next_ordinal";
/// Highest seq ever committed; written blindly in every writer batch, so it is never
/// behind a committed hook.
pub const META_SEQ: &[u8] = b"seq";
const META_TENANT_PREFIX: &[u8] = b"tenant/";
/// The instance's key for hashed headers (store_headers `hash`).
pub const META_HEADER_HASH_KEY: &[u8] = b"header_hash_key";

/// Ordinal 0 is never a tenant: it holds the node aggregate of every counter.
pub const NODE_ORDINAL: u32 = 0;

/// Index family tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Tag {
    Active = b'A',
    Counter = b'C',
    Due = b'D',
    Inflight = b'F',
    LaneHead = b'H',
    Dedupe = b'K',
    LaneMember = b'O',
    LaneMarker = b'P',
    Quarantine = b'Q',
    Dead = b'X',
}

pub const ALL_TAGS: [Tag; 10] = [
    Tag::Active,
    Tag::Counter,
    Tag::Due,
    Tag::Inflight,
    Tag::LaneHead,
    Tag::Dedupe,
    Tag::LaneMember,
    Tag::LaneMarker,
    Tag::Quarantine,
    Tag::Dead,
];

// Two families sharing a tag would silently read each other's keys.
const _: () = {
    let mut i = 0;
    while i < ALL_TAGS.len() {
        let mut j = i + 1;
        while j < ALL_TAGS.len() {
            assert!(ALL_TAGS[i] as u8 != ALL_TAGS[j] as u8, "index tags collide");
            j += 1;
        }
        i += 1;
    }
};

impl TryFrom<u8> for Tag {
    type Error = KeyError;
    fn try_from(byte: u8) -> Result<Self, KeyError> {
        ALL_TAGS
            .iter()
            .copied()
            .find(|tag| *tag as u8 == byte)
            .ok_or(KeyError::UnknownTag(byte))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("unknown index tag 0x{0:02x}")]
    UnknownTag(u8),
    #[error("{family} key has {found} bytes, expected {expected}")]
    Length {
        family: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{0} key is malformed")]
    Malformed(&'static str),
}

/// Counter fields (DESIGN section 2). Values are i64 deltas merged by addition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Counter {
    Pending = 1,
    Bytes = 2,
    Inflight = 3,
    Dead = 4,
    Quarantined = 5,
    DeliveredTotal = 6,
    DeadLetteredTotal = 7,
    IngestedTotal = 8,
    DedupedTotal = 9,
    /// Busy lanes: lanes with a head.
    Lanes = 10,
    /// Heads waiting out a retry or a breaker park (due kind 3).
    LanesBlocked = 11,
    /// Rows waiting in a lane behind its head (`?O`).
    LaneMembers = 12,
}

impl Counter {
    pub const ALL: [Counter; 12] = [
        Counter::Pending,
        Counter::Bytes,
        Counter::Inflight,
        Counter::Dead,
        Counter::Quarantined,
        Counter::DeliveredTotal,
        Counter::DeadLetteredTotal,
        Counter::IngestedTotal,
        Counter::DedupedTotal,
        Counter::Lanes,
        Counter::LanesBlocked,
        Counter::LaneMembers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Counter::Pending => "pending",
            Counter::Bytes => "bytes",
            Counter::Inflight => "inflight",
            Counter::Dead => "dead",
            Counter::Quarantined => "quarantined",
            Counter::DeliveredTotal => "delivered_total",
            Counter::DeadLetteredTotal => "dead_lettered_total",
            Counter::IngestedTotal => "ingested_total",
            Counter::DedupedTotal => "deduped_total",
            Counter::Lanes => "lanes",
            Counter::LanesBlocked => "lanes_blocked",
            Counter::LaneMembers => "lane_members",
        }
    }

    pub fn from_field(field: u8) -> Option<Counter> {
        Counter::ALL.iter().copied().find(|c| *c as u8 == field)
    }
}

pub fn meta_tenant(tenant_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(META_TENANT_PREFIX.len() + tenant_id.len());
    key.extend_from_slice(META_TENANT_PREFIX);
    key.extend_from_slice(tenant_id.as_bytes());
    key
}

/// Returns the tenant id of a `tenant/<id>` meta key.
pub fn parse_meta_tenant(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(META_TENANT_PREFIX)
}

pub fn meta_tenant_prefix() -> &'static [u8] {
    META_TENANT_PREFIX
}

pub fn hook(out: &mut Vec<u8>, ordinal: u32, seq: u64) {
    out.extend_from_slice(&ordinal.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
}

pub const HOOK_LEN: usize = 12;

pub fn parse_hook(key: &[u8]) -> Result<(u32, u64), KeyError> {
    let key = exact(key, HOOK_LEN, "hook")?;
    Ok((be_u32(&key[0..4]), be_u64(&key[4..12])))
}

pub fn delivery(out: &mut Vec<u8>, ordinal: u32, seq: u64, sink: u16) {
    out.extend_from_slice(&ordinal.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&sink.to_be_bytes());
}

pub const DELIVERY_LEN: usize = 14;

pub fn parse_delivery(key: &[u8]) -> Result<(u32, u64, u16), KeyError> {
    let key = exact(key, DELIVERY_LEN, "delivery")?;
    Ok((
        be_u32(&key[0..4]),
        be_u64(&key[4..12]),
        be_u16(&key[12..14]),
    ))
}

pub fn archive(out: &mut Vec<u8>, ordinal: u32, received_at_ms: u64, seq: u64) {
    out.extend_from_slice(&ordinal.to_be_bytes());
    out.extend_from_slice(&received_at_ms.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
}

pub fn parse_archive(key: &[u8]) -> Result<(u32, u64, u64), KeyError> {
    let key = exact(key, 20, "archive")?;
    Ok((
        be_u32(&key[0..4]),
        be_u64(&key[4..12]),
        be_u64(&key[12..20]),
    ))
}

fn index_head(out: &mut Vec<u8>, tag: Tag, ordinal: u32) {
    out.push(tag as u8);
    out.extend_from_slice(&ordinal.to_be_bytes());
}

pub fn active(out: &mut Vec<u8>, ordinal: u32) {
    index_head(out, Tag::Active, ordinal);
}

pub fn counter(out: &mut Vec<u8>, ordinal: u32, field: Counter) {
    index_head(out, Tag::Counter, ordinal);
    out.push(field as u8);
}

pub fn due(out: &mut Vec<u8>, ordinal: u32, due_ms: u64, seq: u64, sink: u16) {
    index_head(out, Tag::Due, ordinal);
    out.extend_from_slice(&due_ms.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&sink.to_be_bytes());
}

pub fn inflight(out: &mut Vec<u8>, ordinal: u32, seq: u64, sink: u16) {
    index_head(out, Tag::Inflight, ordinal);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&sink.to_be_bytes());
}

pub fn dead(out: &mut Vec<u8>, ordinal: u32, seq: u64, sink: u16) {
    index_head(out, Tag::Dead, ordinal);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&sink.to_be_bytes());
}

pub fn quarantine(out: &mut Vec<u8>, ordinal: u32, seq: u64) {
    index_head(out, Tag::Quarantine, ordinal);
    out.extend_from_slice(&seq.to_be_bytes());
}

pub fn dedupe(out: &mut Vec<u8>, ordinal: u32, source_id: &str, dedupe_key: &[u8]) {
    index_head(out, Tag::Dedupe, ordinal);
    out.extend_from_slice(source_id.as_bytes());
    out.push(0);
    out.extend_from_slice(dedupe_key);
}

/// A lane id: the first 16 bytes of a SHA-256 (see [`lane_id`]).
pub type LaneId = [u8; 16];

/// An ordering key longer than this (the SQS group id limit) is kept as `sha256:<hex>` of
/// itself.
pub const ORDERING_KEY_MAX: usize = 128;

/// The lane id of `key` (`None`: the sink's keyless lane) on sink index `sink` of source
/// `source_id`: the first 16 bytes of sha256(sink:u16, source_id, 0, flag:u8, key), flag 1
/// for the keyless lane. Hashed so the index key has a fixed width and no delimiter can
/// be forged; the tenant is not in it (its ordinal leads every lane key).
pub fn lane_id(sink: u16, source_id: &str, key: Option<&str>) -> LaneId {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(sink.to_be_bytes());
    hash.update(source_id.as_bytes());
    hash.update([0u8, u8::from(key.is_none())]);
    hash.update(key.unwrap_or_default().as_bytes());
    let digest = hash.finalize();
    let mut lane = [0u8; 16];
    lane.copy_from_slice(&digest[..16]);
    lane
}

pub fn lane_head(out: &mut Vec<u8>, ordinal: u32, lane: &LaneId) {
    index_head(out, Tag::LaneHead, ordinal);
    out.extend_from_slice(lane);
}

pub fn lane_marker(out: &mut Vec<u8>, ordinal: u32, lane: &LaneId) {
    index_head(out, Tag::LaneMarker, ordinal);
    out.extend_from_slice(lane);
}

pub fn lane_member(out: &mut Vec<u8>, ordinal: u32, lane: &LaneId, seq: u64, sink: u16) {
    index_head(out, Tag::LaneMember, ordinal);
    out.extend_from_slice(lane);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&sink.to_be_bytes());
}

/// Every member of one lane, lowest seq first: `[start, end)`.
pub fn lane_members_of(ordinal: u32, lane: &LaneId) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(31);
    index_head(&mut start, Tag::LaneMember, ordinal);
    start.extend_from_slice(lane);
    // The lane id plus one, as a 128-bit number; the last lane of a tenant ends where the
    // tenant's family does.
    let end = match u128::from_be_bytes(*lane).checked_add(1) {
        Some(next) => {
            let mut end = Vec::with_capacity(21);
            index_head(&mut end, Tag::LaneMember, ordinal);
            end.extend_from_slice(&next.to_be_bytes());
            end
        }
        None => family_range(Tag::LaneMember, ordinal).1,
    };
    (start, end)
}

/// Value of a `?H` key: the head's row.
pub fn lane_head_value(seq: u64, sink: u16) -> [u8; 10] {
    let mut value = [0u8; 10];
    value[..8].copy_from_slice(&seq.to_be_bytes());
    value[8..].copy_from_slice(&sink.to_be_bytes());
    value
}

pub fn parse_lane_head_value(value: &[u8]) -> Result<(u64, u16), KeyError> {
    let value = exact(value, 10, "lane head value")?;
    Ok((be_u64(&value[..8]), be_u16(&value[8..])))
}

/// Value of a `?O` key: the member's size.
pub fn lane_member_value(size: u32) -> [u8; 4] {
    size.to_be_bytes()
}

pub fn parse_lane_member_value(value: &[u8]) -> Result<u32, KeyError> {
    let value = exact(value, 4, "lane member value")?;
    Ok(be_u32(value))
}

/// Every `?D` key of `ordinal` due in `[from_ms, now_ms]`: `[start, end)`.
pub fn due_between(ordinal: u32, from_ms: u64, now_ms: u64) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(23);
    due(&mut start, ordinal, from_ms, 0, 0);
    let mut end = Vec::with_capacity(23);
    match now_ms.checked_add(1) {
        Some(after) => due(&mut end, ordinal, after, 0, 0),
        None => return (start, family_range(Tag::Due, ordinal).1),
    }
    (start, end)
}

/// The delivery rows of one hook: `[start, end)` in `deliveries`.
pub fn deliveries_of_hook(ordinal: u32, seq: u64) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(HOOK_LEN);
    hook(&mut start, ordinal, seq);
    let mut end = Vec::with_capacity(HOOK_LEN);
    match seq.checked_add(1) {
        Some(next) => hook(&mut end, ordinal, next),
        None => hook(&mut end, ordinal.saturating_add(1), 0),
    }
    (start, end)
}

/// The archive entries of `ordinal` received before `before_ms`: `[start, end)`.
pub fn archive_before(ordinal: u32, before_ms: u64) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(20);
    archive(&mut start, ordinal, 0, 0);
    let mut end = Vec::with_capacity(20);
    archive(&mut end, ordinal, before_ms, 0);
    (start, end)
}

/// The archive entries of `ordinal` received in `[from_ms, to_ms)`.
pub fn archive_between(ordinal: u32, from_ms: u64, to_ms: u64) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(20);
    archive(&mut start, ordinal, from_ms, 0);
    let mut end = Vec::with_capacity(20);
    archive(&mut end, ordinal, to_ms, 0);
    (start, end)
}

/// Value of an `?F` key: when the row was claimed and its size (so recovery can put the
/// due key back without reading the row).
pub fn inflight_value(claimed_at_ms: u64, size: u32) -> [u8; 12] {
    let mut value = [0u8; 12];
    value[..8].copy_from_slice(&claimed_at_ms.to_be_bytes());
    value[8..].copy_from_slice(&size.to_be_bytes());
    value
}

pub fn parse_inflight_value(value: &[u8]) -> Result<(u64, u32), KeyError> {
    let value = exact(value, 12, "inflight value")?;
    Ok((be_u64(&value[..8]), be_u32(&value[8..])))
}

/// The half-open range `[start, end)` holding every key of one family and tenant, so a
/// scan never walks into the next family or tenant.
pub fn family_range(tag: Tag, ordinal: u32) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(5);
    index_head(&mut start, tag, ordinal);
    let end = match ordinal.checked_add(1) {
        Some(next) => {
            let mut end = Vec::with_capacity(5);
            index_head(&mut end, tag, next);
            end
        }
        None => vec![tag as u8 + 1],
    };
    (start, end)
}

/// The range of every key of one tenant in `hooks`, `deliveries` and `archive`, whose keys
/// start with the ordinal. `end` is empty for the last ordinal: no upper bound.
pub fn tenant_range(ordinal: u32) -> (Vec<u8>, Vec<u8>) {
    let start = ordinal.to_be_bytes().to_vec();
    let end = match ordinal.checked_add(1) {
        Some(next) => next.to_be_bytes().to_vec(),
        None => vec![0xff; 5],
    };
    (start, end)
}

/// The range of every key of one family, all tenants.
pub fn family_range_all(tag: Tag) -> (Vec<u8>, Vec<u8>) {
    (vec![tag as u8], vec![tag as u8 + 1])
}

/// A parsed `index` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexKey<'a> {
    Active {
        ordinal: u32,
    },
    Counter {
        ordinal: u32,
        field: u8,
    },
    Due {
        ordinal: u32,
        due_ms: u64,
        seq: u64,
        sink: u16,
    },
    Inflight {
        ordinal: u32,
        seq: u64,
        sink: u16,
    },
    Dead {
        ordinal: u32,
        seq: u64,
        sink: u16,
    },
    Quarantine {
        ordinal: u32,
        seq: u64,
    },
    Dedupe {
        ordinal: u32,
        source_id: &'a [u8],
        dedupe_key: &'a [u8],
    },
    LaneHead {
        ordinal: u32,
        lane: LaneId,
    },
    LaneMember {
        ordinal: u32,
        lane: LaneId,
        seq: u64,
        sink: u16,
    },
    LaneMarker {
        ordinal: u32,
        lane: LaneId,
    },
}

pub fn parse_index(key: &[u8]) -> Result<IndexKey<'_>, KeyError> {
    let (&tag_byte, _) = key.split_first().ok_or(KeyError::Malformed("index"))?;
    let tag = Tag::try_from(tag_byte)?;
    if key.len() < 5 {
        return Err(KeyError::Malformed("index"));
    }
    let ordinal = be_u32(&key[1..5]);
    let rest = &key[5..];
    Ok(match tag {
        Tag::Active => {
            exact(rest, 0, "active")?;
            IndexKey::Active { ordinal }
        }
        Tag::Counter => {
            let rest = exact(rest, 1, "counter")?;
            IndexKey::Counter {
                ordinal,
                field: rest[0],
            }
        }
        Tag::Due => {
            let rest = exact(rest, 18, "due")?;
            IndexKey::Due {
                ordinal,
                due_ms: be_u64(&rest[0..8]),
                seq: be_u64(&rest[8..16]),
                sink: be_u16(&rest[16..18]),
            }
        }
        Tag::Inflight => {
            let rest = exact(rest, 10, "inflight")?;
            IndexKey::Inflight {
                ordinal,
                seq: be_u64(&rest[0..8]),
                sink: be_u16(&rest[8..10]),
            }
        }
        Tag::Dead => {
            let rest = exact(rest, 10, "dead")?;
            IndexKey::Dead {
                ordinal,
                seq: be_u64(&rest[0..8]),
                sink: be_u16(&rest[8..10]),
            }
        }
        Tag::Quarantine => {
            let rest = exact(rest, 8, "quarantine")?;
            IndexKey::Quarantine {
                ordinal,
                seq: be_u64(rest),
            }
        }
        Tag::LaneHead => IndexKey::LaneHead {
            ordinal,
            lane: lane_of(exact(rest, 16, "lane head")?),
        },
        Tag::LaneMarker => IndexKey::LaneMarker {
            ordinal,
            lane: lane_of(exact(rest, 16, "lane marker")?),
        },
        Tag::LaneMember => {
            let rest = exact(rest, 26, "lane member")?;
            IndexKey::LaneMember {
                ordinal,
                lane: lane_of(&rest[..16]),
                seq: be_u64(&rest[16..24]),
                sink: be_u16(&rest[24..26]),
            }
        }
        Tag::Dedupe => {
            let split = rest
                .iter()
                .position(|b| *b == 0)
                .ok_or(KeyError::Malformed("dedupe"))?;
            IndexKey::Dedupe {
                ordinal,
                source_id: &rest[..split],
                dedupe_key: &rest[split + 1..],
            }
        }
    })
}

/// Value of a `?K` key: the first hook's seq and when the entry expires.
pub fn dedupe_value(seq: u64, expires_ms: u64) -> [u8; 16] {
    let mut value = [0u8; 16];
    value[..8].copy_from_slice(&seq.to_be_bytes());
    value[8..].copy_from_slice(&expires_ms.to_be_bytes());
    value
}

pub fn parse_dedupe_value(value: &[u8]) -> Result<(u64, u64), KeyError> {
    let value = exact(value, 16, "dedupe value")?;
    Ok((be_u64(&value[..8]), be_u64(&value[8..])))
}

/// A dedupe key longer than this is stored as `sha256:<hex>` of itself.
pub const DEDUPE_KEY_MAX: usize = 200;

/// Value of a `?D` key: the row's size and why it is due.
pub fn due_value(size: u32, kind: DueKind) -> [u8; 5] {
    let mut value = [0u8; 5];
    value[..4].copy_from_slice(&size.to_be_bytes());
    value[4] = kind as u8;
    value
}

pub fn parse_due_value(value: &[u8]) -> Result<(u32, DueKind), KeyError> {
    let value = exact(value, 5, "due value")?;
    let kind = DueKind::from_byte(value[4]).ok_or(KeyError::Malformed("due kind"))?;
    Ok((be_u32(&value[..4]), kind))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DueKind {
    FirstAttempt = 0,
    Retry = 1,
    /// A first attempt of a lane's head.
    LaneFirstAttempt = 2,
    /// A lane's head waiting out a retry or a breaker park: the lane is blocked.
    LaneRetry = 3,
    /// A first attempt of a row an archive replay or a DLQ revive-all put back: claimed
    /// only while fewer than the tenant's `replay_concurrency` such attempts run on its
    /// sink, so live rows always find a free slot (format 4).
    ReplayFirstAttempt = 4,
    /// A replay-class row waiting out a retry: it keeps its class (format 4).
    ReplayRetry = 5,
}

impl DueKind {
    pub fn from_byte(byte: u8) -> Option<DueKind> {
        match byte {
            0 => Some(DueKind::FirstAttempt),
            1 => Some(DueKind::Retry),
            2 => Some(DueKind::LaneFirstAttempt),
            3 => Some(DueKind::LaneRetry),
            4 => Some(DueKind::ReplayFirstAttempt),
            5 => Some(DueKind::ReplayRetry),
            _ => None,
        }
    }

    /// Whether the row is a lane's head.
    pub fn is_lane(self) -> bool {
        matches!(self, DueKind::LaneFirstAttempt | DueKind::LaneRetry)
    }

    /// Whether the row waits in the replay class (see [`DueKind::ReplayFirstAttempt`]).
    pub fn is_replay(self) -> bool {
        matches!(self, DueKind::ReplayFirstAttempt | DueKind::ReplayRetry)
    }
}

pub fn encode_counter_delta(delta: i64) -> [u8; 8] {
    delta.to_be_bytes()
}

pub fn decode_counter(value: &[u8]) -> Result<i64, KeyError> {
    let value = exact(value, 8, "counter value")?;
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(value);
    Ok(i64::from_be_bytes(bytes))
}

fn exact<'a>(bytes: &'a [u8], expected: usize, family: &'static str) -> Result<&'a [u8], KeyError> {
    if bytes.len() == expected {
        Ok(bytes)
    } else {
        Err(KeyError::Length {
            family,
            expected,
            found: bytes.len(),
        })
    }
}

fn lane_of(bytes: &[u8]) -> LaneId {
    let mut lane = [0u8; 16];
    lane.copy_from_slice(&bytes[..16]);
    lane
}

fn be_u16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn be_u64(bytes: &[u8]) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(array)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn built(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    proptest! {
        #[test]
        fn due_round_trips_and_orders(a in any::<(u32, u64, u64, u16)>(), b in any::<(u32, u64, u64, u16)>()) {
            let ka = built(|o| due(o, a.0, a.1, a.2, a.3));
            let kb = built(|o| due(o, b.0, b.1, b.2, b.3));
            prop_assert_eq!(parse_index(&ka).unwrap(), IndexKey::Due { ordinal: a.0, due_ms: a.1, seq: a.2, sink: a.3 });
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }

        #[test]
        fn delivery_round_trips_and_orders(a in any::<(u32, u64, u16)>(), b in any::<(u32, u64, u16)>()) {
            let ka = built(|o| delivery(o, a.0, a.1, a.2));
            let kb = built(|o| delivery(o, b.0, b.1, b.2));
            prop_assert_eq!(parse_delivery(&ka).unwrap(), a);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }

        #[test]
        fn hook_round_trips_and_orders(a in any::<(u32, u64)>(), b in any::<(u32, u64)>()) {
            let ka = built(|o| hook(o, a.0, a.1));
            let kb = built(|o| hook(o, b.0, b.1));
            prop_assert_eq!(parse_hook(&ka).unwrap(), a);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }

        #[test]
        fn family_range_holds_exactly_its_tenant(ord in 0u32..u32::MAX, other in any::<u32>(), seq in any::<u64>(), sink in any::<u16>()) {
            let (start, end) = family_range(Tag::Inflight, ord);
            let own = built(|o| inflight(o, ord, seq, sink));
            prop_assert!(own >= start && own < end);
            let foreign = built(|o| inflight(o, other, seq, sink));
            prop_assert_eq!(foreign >= start && foreign < end, other == ord);
            let dead_key = built(|o| dead(o, ord, seq, sink));
            prop_assert!(!(dead_key >= start && dead_key < end));
        }

        #[test]
        fn tenant_range_holds_exactly_its_tenant(ord in 0u32..u32::MAX, other in any::<u32>(), seq in any::<u64>(), sink in any::<u16>(), at in any::<u64>()) {
            let (start, end) = tenant_range(ord);
            for key in [
                built(|o| hook(o, other, seq)),
                built(|o| delivery(o, other, seq, sink)),
                built(|o| archive(o, other, at, seq)),
            ] {
                let inside = start.as_slice() <= key.as_slice() && key.as_slice() < end.as_slice();
                prop_assert_eq!(inside, other == ord);
            }
        }

        #[test]
        fn lane_keys_round_trip_and_members_order_by_seq(ord in any::<u32>(), lane in any::<[u8; 16]>(), other in any::<[u8; 16]>(), a in any::<(u64, u16)>(), b in any::<(u64, u16)>()) {
            let ka = built(|o| lane_member(o, ord, &lane, a.0, a.1));
            let kb = built(|o| lane_member(o, ord, &lane, b.0, b.1));
            prop_assert_eq!(parse_index(&ka).unwrap(), IndexKey::LaneMember { ordinal: ord, lane, seq: a.0, sink: a.1 });
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            let (start, end) = lane_members_of(ord, &lane);
            prop_assert!(ka >= start && ka < end);
            let foreign = built(|o| lane_member(o, ord, &other, a.0, a.1));
            prop_assert_eq!(foreign >= start && foreign < end, other == lane);
            let (family_start, family_end) = family_range(Tag::LaneMember, ord);
            prop_assert!(start >= family_start && end <= family_end);
            let head = built(|o| lane_head(o, ord, &lane));
            prop_assert_eq!(parse_index(&head).unwrap(), IndexKey::LaneHead { ordinal: ord, lane });
            let marker = built(|o| lane_marker(o, ord, &lane));
            prop_assert_eq!(parse_index(&marker).unwrap(), IndexKey::LaneMarker { ordinal: ord, lane });
            prop_assert_eq!(parse_lane_head_value(&lane_head_value(a.0, a.1)).unwrap(), a);
        }

        #[test]
        fn dedupe_round_trips(ord in any::<u32>(), key in proptest::collection::vec(any::<u8>(), 0..64)) {
            let k = built(|o| dedupe(o, ord, "stripe", &key));
            prop_assert_eq!(parse_index(&k).unwrap(), IndexKey::Dedupe { ordinal: ord, source_id: b"stripe", dedupe_key: &key });
        }
    }

    proptest! {
        #[test]
        fn due_between_holds_exactly_the_rows_due_then(ord in 1u32..u32::MAX, from in any::<u64>(), now in 0u64..u64::MAX, due_ms in any::<u64>(), seq in any::<u64>(), sink in any::<u16>()) {
            let (start, end) = due_between(ord, from, now);
            let key = built(|o| due(o, ord, due_ms, seq, sink));
            prop_assert_eq!(key >= start && key < end, due_ms >= from && due_ms <= now);
            let other = built(|o| due(o, ord - 1, due_ms, seq, sink));
            prop_assert!(!(other >= start && other < end));
        }

        #[test]
        fn deliveries_of_hook_hold_exactly_its_rows(ord in any::<u32>(), seq in 0u64..u64::MAX, other_seq in any::<u64>(), sink in any::<u16>()) {
            let (start, end) = deliveries_of_hook(ord, seq);
            let own = built(|o| delivery(o, ord, seq, sink));
            prop_assert!(own >= start && own < end);
            let other = built(|o| delivery(o, ord, other_seq, sink));
            prop_assert_eq!(other >= start && other < end, other_seq == seq);
        }

        #[test]
        fn inflight_value_round_trips(at in any::<u64>(), size in any::<u32>()) {
            prop_assert_eq!(parse_inflight_value(&inflight_value(at, size)).unwrap(), (at, size));
        }
    }

    #[test]
    fn unknown_tag_is_a_typed_error() {
        assert_eq!(
            parse_index(&[b'Z', 0, 0, 0, 1]),
            Err(KeyError::UnknownTag(b'Z'))
        );
        assert!(matches!(
            parse_index(&[b'D', 0, 0, 0, 1, 9]),
            Err(KeyError::Length { .. })
        ));
    }

    #[test]
    fn counter_keys_parse() {
        let k = built(|o| counter(o, 7, Counter::Bytes));
        assert_eq!(
            parse_index(&k).unwrap(),
            IndexKey::Counter {
                ordinal: 7,
                field: 2
            }
        );
        assert_eq!(decode_counter(&encode_counter_delta(-5)).unwrap(), -5);
    }
}
