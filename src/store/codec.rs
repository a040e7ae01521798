//! Value encodings of the `hooks` and `deliveries` families. Every record starts with a
//! version byte so later fields are additive; decoding checks every length, because a
//! record read back at recovery may be the one thing on disk that is wrong.

use sha2::{Digest, Sha256};
use thiserror::Error;

use super::keys::{lane_id, LaneId, ORDERING_KEY_MAX};

/// Version 1 (store formats 1 and 2) has no digest; version 2 (format 3) ends with
/// [`HOOK_DIGEST_LEN`] bytes of SHA-256 over every byte before them, checked on every read.
pub const HOOK_VERSION: u8 = 2;
pub const HOOK_VERSION_UNDIGESTED: u8 = 1;
pub const HOOK_DIGEST_LEN: usize = 32;
/// Version 1: a row of an unordered sink. Version 2 adds the row's lane; a store that
/// never enables ordering holds version 1 rows only.
pub const DELIVERY_VERSION: u8 = 1;
pub const DELIVERY_VERSION_LANED: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    #[error("{record} record is truncated")]
    Truncated { record: &'static str },
    #[error("{record} record has unknown version {version}")]
    Version { record: &'static str, version: u8 },
    #[error("{record} record has {extra} trailing bytes")]
    Trailing { record: &'static str, extra: usize },
    #[error("{record} record holds invalid UTF-8 in {field}")]
    Utf8 {
        record: &'static str,
        field: &'static str,
    },
    /// The bytes are not the ones stored: the integrity digest does not match.
    #[error("{record} record fails its integrity digest (stored {stored}, computed {computed})")]
    Digest {
        record: &'static str,
        stored: String,
        computed: String,
    },
}

impl CodecError {
    /// True when the record was changed after it was written, as opposed to one this
    /// binary cannot read: the former must never be delivered.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, CodecError::Digest { .. })
    }
}

/// A stored hook: everything delivery, replay and inspection need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRecord {
    pub source_id: String,
    pub tenant_id: String,
    pub received_at_ms: u64,
    /// Empty when the source does not dedupe.
    pub dedupe_key: Vec<u8>,
    /// Stored provider headers after the store_headers policy, names lower-case.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl crate::verify::HeaderLookup for HookRecord {
    fn header(&self, lower_name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(lower_name))
            .map(|(_, value)| value.as_slice())
    }
}

/// Encodes a hook record straight from the edge's buffers: no owned `HookRecord` is
/// built on the ack path, and header names are lower-cased as they are copied.
pub struct HookEncoder<'a> {
    out: &'a mut Vec<u8>,
    /// Where this record starts in `out`: the digest covers `out[start..]`.
    start: usize,
    count_at: usize,
    count: u16,
}

impl<'a> HookEncoder<'a> {
    pub fn start(
        out: &'a mut Vec<u8>,
        source_id: &str,
        tenant_id: &str,
        received_at_ms: u64,
        dedupe_key: &[u8],
    ) -> HookEncoder<'a> {
        let start = out.len();
        out.push(HOOK_VERSION);
        put_str16(out, source_id);
        put_str16(out, tenant_id);
        out.extend_from_slice(&received_at_ms.to_be_bytes());
        put_bytes16(out, dedupe_key);
        let count_at = out.len();
        out.extend_from_slice(&[0, 0]);
        HookEncoder {
            out,
            start,
            count_at,
            count: 0,
        }
    }

    pub fn header(&mut self, name: &[u8], value: &[u8]) {
        if self.count == u16::MAX {
            return;
        }
        self.count += 1;
        let len = name.len().min(u16::MAX as usize);
        self.out.extend_from_slice(&(len as u16).to_be_bytes());
        self.out
            .extend(name[..len].iter().map(u8::to_ascii_lowercase));
        put_bytes32(self.out, value);
    }

    pub fn finish(self, body: &[u8]) {
        self.out[self.count_at..self.count_at + 2].copy_from_slice(&self.count.to_be_bytes());
        put_bytes32(self.out, body);
        let digest = Sha256::digest(&self.out[self.start..]);
        self.out.extend_from_slice(&digest);
    }
}

impl HookRecord {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut encoder = HookEncoder::start(
            out,
            &self.source_id,
            &self.tenant_id,
            self.received_at_ms,
            &self.dedupe_key,
        );
        for (name, value) in &self.headers {
            encoder.header(name.as_bytes(), value);
        }
        encoder.finish(&self.body);
    }

    /// Decodes a record of either version; a version-2 record is checked against its
    /// digest first, so no byte of a changed record is ever handed on.
    pub fn decode(bytes: &[u8]) -> Result<HookRecord, CodecError> {
        let fields = Self::check_digest(bytes)?;
        let mut reader = Reader {
            bytes: fields,
            record: HOOK_RECORD,
        };
        reader.u8()?;
        let source_id = reader.string16("source_id")?;
        let tenant_id = reader.string16("tenant_id")?;
        let received_at_ms = reader.u64()?;
        let dedupe_key = reader.bytes16()?.to_vec();
        let count = reader.u16()? as usize;
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let name = reader.string16("header name")?;
            let value = reader.bytes32()?.to_vec();
            headers.push((name, value));
        }
        let body = reader.bytes32()?.to_vec();
        reader.finish()?;
        Ok(HookRecord {
            source_id,
            tenant_id,
            received_at_ms,
            dedupe_key,
            headers,
            body,
        })
    }
}

const HOOK_RECORD: &str = "hook";

impl HookRecord {
    /// Checks a stored hook record's version and, for version 2, its digest; returns the
    /// bytes the fields are read from (the record without its digest).
    pub fn check_digest(bytes: &[u8]) -> Result<&[u8], CodecError> {
        let Some(&version) = bytes.first() else {
            return Err(CodecError::Truncated {
                record: HOOK_RECORD,
            });
        };
        match version {
            HOOK_VERSION_UNDIGESTED => Ok(bytes),
            HOOK_VERSION => {
                let Some(fields_len) = bytes.len().checked_sub(HOOK_DIGEST_LEN) else {
                    return Err(CodecError::Truncated {
                        record: HOOK_RECORD,
                    });
                };
                let (fields, stored) = bytes.split_at(fields_len);
                let computed = Sha256::digest(fields);
                if computed.as_slice() != stored {
                    return Err(CodecError::Digest {
                        record: HOOK_RECORD,
                        stored: hex::encode(stored),
                        computed: hex::encode(computed),
                    });
                }
                Ok(fields)
            }
            version => Err(CodecError::Version {
                record: HOOK_RECORD,
                version,
            }),
        }
    }

    /// A version-1 record rewritten as version 2 with its digest (the format 2 → 3
    /// migration); `None` when `bytes` is already version 2. The fields are copied as
    /// they are, so the digest seals what the store held.
    pub fn upgrade(bytes: &[u8]) -> Result<Option<Vec<u8>>, CodecError> {
        match bytes.first() {
            Some(&HOOK_VERSION_UNDIGESTED) => {
                // Decoding proves the fields are whole before they are sealed.
                Self::decode(bytes)?;
                let mut out = Vec::with_capacity(bytes.len() + HOOK_DIGEST_LEN);
                out.push(HOOK_VERSION);
                out.extend_from_slice(&bytes[1..]);
                let digest = Sha256::digest(&out);
                out.extend_from_slice(&digest);
                Ok(Some(out))
            }
            _ => {
                Self::check_digest(bytes)?;
                Ok(None)
            }
        }
    }
}

/// One sink's pending delivery of one hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    /// The sink's stable id within its source (`SinkEntry::id`).
    pub sink_id: String,
    pub attempts: u32,
    /// 0 until the first claim (the retry horizon starts there, not at ingest).
    pub first_attempt_at_ms: u64,
    pub last_error: String,
    /// Bytes this row counts against the tenant's `max_bytes`.
    pub size: u32,
    /// The lane the row was ingested into; `None` for an unordered sink. Fixed at ingest:
    /// delivery follows the row, not the current config.
    pub lane: Option<RowLane>,
}

/// A row's ordering lane.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowLane {
    pub id: LaneId,
    /// The ordering key (≤ 128 bytes, UTF-8); empty in the sink's keyless lane.
    pub ordering_key: String,
}

impl RowLane {
    /// The lane of a row of sink `sink` of `source_id` whose resolved ordering key is `key`
    /// (`None` or empty: no key, the keyless lane). A key over [`ORDERING_KEY_MAX`] bytes,
    /// or one that is not UTF-8, becomes `sha256:<hex>` of its bytes.
    pub fn new(sink: u16, source_id: &str, key: Option<&[u8]>) -> RowLane {
        let key = key
            .filter(|key| !key.is_empty())
            .map(|key| match std::str::from_utf8(key) {
                Ok(text) if key.len() <= ORDERING_KEY_MAX => text.to_owned(),
                _ => format!("sha256:{}", hex::encode(Sha256::digest(key))),
            });
        RowLane {
            id: lane_id(sink, source_id, key.as_deref()),
            ordering_key: key.unwrap_or_default(),
        }
    }
}

impl DeliveryRow {
    pub fn encode_new(out: &mut Vec<u8>, sink_id: &str, size: u32, lane: Option<&RowLane>) {
        Self::encode_fields(out, sink_id, 0, 0, "", size, lane);
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        Self::encode_fields(
            out,
            &self.sink_id,
            self.attempts,
            self.first_attempt_at_ms,
            &self.last_error,
            self.size,
            self.lane.as_ref(),
        );
    }

    fn encode_fields(
        out: &mut Vec<u8>,
        sink_id: &str,
        attempts: u32,
        first_attempt_at_ms: u64,
        last_error: &str,
        size: u32,
        lane: Option<&RowLane>,
    ) {
        out.push(match lane {
            None => DELIVERY_VERSION,
            Some(_) => DELIVERY_VERSION_LANED,
        });
        put_str16(out, sink_id);
        out.extend_from_slice(&attempts.to_be_bytes());
        out.extend_from_slice(&first_attempt_at_ms.to_be_bytes());
        put_str16(out, last_error);
        out.extend_from_slice(&size.to_be_bytes());
        if let Some(lane) = lane {
            out.extend_from_slice(&lane.id);
            put_str16(out, &lane.ordering_key);
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<DeliveryRow, CodecError> {
        const RECORD: &str = "delivery";
        let mut reader = Reader {
            bytes,
            record: RECORD,
        };
        let version = reader.u8()?;
        if version != DELIVERY_VERSION && version != DELIVERY_VERSION_LANED {
            return Err(CodecError::Version {
                record: RECORD,
                version,
            });
        }
        let sink_id = reader.string16("sink_id")?;
        let attempts = reader.u32()?;
        let first_attempt_at_ms = reader.u64()?;
        let last_error = reader.string16("last_error")?;
        let size = reader.u32()?;
        let lane = if version == DELIVERY_VERSION_LANED {
            let mut id = [0u8; 16];
            id.copy_from_slice(reader.take(16)?);
            let ordering_key = reader.string16("ordering_key")?;
            Some(RowLane { id, ordering_key })
        } else {
            None
        };
        reader.finish()?;
        Ok(DeliveryRow {
            sink_id,
            attempts,
            first_attempt_at_ms,
            last_error,
            size,
            lane,
        })
    }
}

/// A text field: one longer than a u16 length can say (a sink's error message, say) is cut
/// at the last whole character that fits, so it still decodes as UTF-8.
fn put_str16(out: &mut Vec<u8>, text: &str) {
    let mut len = text.len().min(u16::MAX as usize);
    while !text.is_char_boundary(len) {
        len -= 1;
    }
    put_bytes16(out, &text.as_bytes()[..len]);
}

fn put_bytes16(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = bytes.len().min(u16::MAX as usize);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&bytes[..len]);
}

fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) {
    // Bodies are capped far below 4 GiB by `edge.body_max_bytes`.
    assert!(bytes.len() <= u32::MAX as usize);
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
    record: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.bytes.len() < n {
            return Err(CodecError::Truncated {
                record: self.record,
            });
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        let mut array = [0u8; 8];
        array.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(array))
    }
    fn bytes16(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.u16()? as usize;
        self.take(len)
    }
    fn bytes32(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.u32()? as usize;
        self.take(len)
    }
    fn string16(&mut self, field: &'static str) -> Result<String, CodecError> {
        let bytes = self.bytes16()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| CodecError::Utf8 {
            record: self.record,
            field,
        })
    }
    fn finish(self) -> Result<(), CodecError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Trailing {
                record: self.record,
                extra: self.bytes.len(),
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lane_ids_follow_the_formula_and_keys_are_bounded() {
        let mut hash = Sha256::new();
        hash.update([0u8, 3]);
        hash.update(b"orders");
        hash.update([0u8, 0]);
        hash.update(b"cus_1");
        let expected: [u8; 16] = hash.finalize()[..16].try_into().unwrap();
        assert_eq!(lane_id(3, "orders", Some("cus_1")), expected);
        // The keyless lane differs from a key that is empty bytes, by its flag.
        assert_ne!(lane_id(3, "orders", None), lane_id(3, "orders", Some("")));
        assert_ne!(
            lane_id(3, "orders", Some("a")),
            lane_id(4, "orders", Some("a"))
        );
        assert_ne!(
            lane_id(3, "orders", Some("a")),
            lane_id(3, "order", Some("sa"))
        );

        let exact = "k".repeat(ORDERING_KEY_MAX);
        assert_eq!(
            RowLane::new(0, "s", Some(exact.as_bytes())).ordering_key,
            exact
        );
        let long = "k".repeat(ORDERING_KEY_MAX + 1);
        let hashed = format!("sha256:{}", hex::encode(Sha256::digest(long.as_bytes())));
        let long_lane = RowLane::new(0, "s", Some(long.as_bytes()));
        assert_eq!(long_lane.ordering_key, hashed);
        assert_eq!(long_lane.id, lane_id(0, "s", Some(&hashed)));
        let binary = RowLane::new(0, "s", Some(&[0xff, 0xfe]));
        assert!(binary.ordering_key.starts_with("sha256:"));
        for missing in [None, Some(&b""[..])] {
            let keyless = RowLane::new(0, "s", missing);
            assert_eq!(keyless.ordering_key, "");
            assert_eq!(keyless.id, lane_id(0, "s", None));
        }
    }

    fn header() -> impl Strategy<Value = (String, Vec<u8>)> {
        (
            "[a-z-]{1,20}",
            proptest::collection::vec(any::<u8>(), 0..40),
        )
    }

    proptest! {
        #[test]
        fn hook_round_trips(
            source in "[a-z]{1,10}", tenant in "[a-z]{1,10}", at in any::<u64>(),
            dedupe in proptest::collection::vec(any::<u8>(), 0..50),
            headers in proptest::collection::vec(header(), 0..8),
            body in proptest::collection::vec(any::<u8>(), 0..2000),
        ) {
            let record = HookRecord { source_id: source, tenant_id: tenant, received_at_ms: at, dedupe_key: dedupe, headers, body };
            let mut out = Vec::new();
            record.encode(&mut out);
            prop_assert_eq!(HookRecord::decode(&out).unwrap(), record);
            // Every strict prefix is refused, never misread.
            for cut in [0, 1, out.len() / 2, out.len() - 1] {
                prop_assert!(HookRecord::decode(&out[..cut]).is_err());
            }
        }

        /// Any one flipped bit anywhere in a stored record is caught: a flip in the fields
        /// or the digest by the digest, one in the version byte by the version (no single
        /// flip turns 2 into 1, the undigested version).
        #[test]
        fn a_flipped_bit_never_decodes(
            headers in proptest::collection::vec(header(), 0..4),
            body in proptest::collection::vec(any::<u8>(), 0..600),
            at in any::<proptest::sample::Index>(), bit in 0u8..8,
        ) {
            let record = HookRecord { source_id: "s".into(), tenant_id: "t".into(), received_at_ms: 7, dedupe_key: Vec::new(), headers, body };
            let mut out = Vec::new();
            record.encode(&mut out);
            let index = at.index(out.len());
            out[index] ^= 1 << bit;
            let error = HookRecord::decode(&out).unwrap_err();
            prop_assert!(index == 0 || error.is_corrupt(), "byte {}: {}", index, error);
        }

        /// A version-1 record (formats 1 and 2) still decodes, and its upgrade is the same
        /// record sealed with a digest.
        #[test]
        fn an_undigested_record_upgrades_to_the_same_record(
            headers in proptest::collection::vec(header(), 0..4),
            body in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let record = HookRecord { source_id: "s".into(), tenant_id: "t".into(), received_at_ms: 7, dedupe_key: b"k".to_vec(), headers, body };
            let mut sealed = Vec::new();
            record.encode(&mut sealed);
            let mut v1 = sealed[..sealed.len() - HOOK_DIGEST_LEN].to_vec();
            v1[0] = HOOK_VERSION_UNDIGESTED;
            prop_assert_eq!(&HookRecord::decode(&v1).unwrap(), &record);
            let upgraded = HookRecord::upgrade(&v1).unwrap().unwrap();
            prop_assert_eq!(&upgraded, &sealed);
            prop_assert_eq!(HookRecord::upgrade(&sealed).unwrap(), None);
        }

        #[test]
        fn delivery_round_trips(sink in "[a-z-]{1,20}", attempts in any::<u32>(), first in any::<u64>(), error in ".{0,40}", size in any::<u32>(), lane in proptest::option::of((any::<[u8; 16]>(), ".{0,40}"))) {
            let lane = lane.map(|(id, ordering_key)| RowLane { id, ordering_key });
            let row = DeliveryRow { sink_id: sink, attempts, first_attempt_at_ms: first, last_error: error, size, lane };
            let mut out = Vec::new();
            row.encode(&mut out);
            prop_assert_eq!(out[0], if row.lane.is_some() { DELIVERY_VERSION_LANED } else { DELIVERY_VERSION });
            prop_assert_eq!(DeliveryRow::decode(&out).unwrap(), row);
            for cut in [0, 1, out.len() / 2, out.len() - 1] {
                prop_assert!(DeliveryRow::decode(&out[..cut]).is_err());
            }
        }
    }

    /// A sink error longer than a u16 length is cut to fit, at a character boundary: the
    /// row still decodes (a cut inside a character would make the row unreadable).
    #[test]
    fn an_overlong_error_is_cut_at_a_character() {
        // Two-byte characters: 65,535 bytes would end inside one.
        let error = "é".repeat(40_000);
        let row = DeliveryRow {
            sink_id: "http".into(),
            attempts: 1,
            first_attempt_at_ms: 1,
            last_error: error.clone(),
            size: 1,
            lane: None,
        };
        let mut out = Vec::new();
        row.encode(&mut out);
        let decoded = DeliveryRow::decode(&out).unwrap();
        assert_eq!(decoded.last_error.len(), u16::MAX as usize - 1);
        assert!(error.starts_with(&decoded.last_error));
    }

    #[test]
    fn new_row_is_a_zeroed_row() {
        let mut out = Vec::new();
        DeliveryRow::encode_new(&mut out, "http", 42, None);
        let row = DeliveryRow::decode(&out).unwrap();
        assert_eq!(
            row,
            DeliveryRow {
                sink_id: "http".into(),
                attempts: 0,
                first_attempt_at_ms: 0,
                last_error: String::new(),
                size: 42,
                lane: None,
            }
        );
    }

    #[test]
    fn unknown_version_is_refused() {
        let mut out = Vec::new();
        DeliveryRow::encode_new(&mut out, "http", 1, None);
        out[0] = 9;
        assert_eq!(
            DeliveryRow::decode(&out),
            Err(CodecError::Version {
                record: "delivery",
                version: 9
            })
        );
    }
}
