//! The fuzz harnesses: one function per target, each taking the fuzzer's bytes. Beyond
//! "does not panic", each checks a property the input cannot be allowed to break: framing
//! that does not depend on where a read splits the bytes, codecs whose decode re-encodes
//! to the same bytes, JSON keys that agree with a second JSON parser.
//!
//! The same file is the regression suite: `tests/fuzz_corpus.rs` of the ankusa package
//! includes it and replays every file of `corpus/` and `regressions/` through it on the
//! full server build, in the ordinary `cargo test`.

use ankusa::config;
use ankusa::edge::http::{self, BodyFraming, ChunkedDecoder, Head, Limits};
use ankusa::edge::resolve::{self, JsonScratch};
use ankusa::store::codec::{DeliveryRow, HookRecord, RowLane};
use ankusa::store::keys::{self, Counter, IndexKey};
use ankusa::verify::HeaderLookup;

/// A harness: the fuzzer's bytes in, a panic on a broken property.
pub type Harness = fn(&[u8]);

/// The targets, by the name of their corpus directory.
pub const TARGETS: [(&str, Harness); 4] = [
    ("http", http),
    ("config", config),
    ("records", records),
    ("json_keys", json_keys),
];

/// Small limits so the fuzzer reaches every bound with short inputs.
const LIMITS: Limits = Limits {
    body_max_bytes: 4096,
    header_count_max: 16,
    header_bytes_max: 1024,
};

/// A request head, then its body framing. A head that parses has every range inside it,
/// and no shorter prefix of it parses; a chunked body decodes to the same bytes and the
/// same end however it is split; every refusal renders as a JSON error body.
pub fn http(data: &[u8]) {
    let mut head = Head::new();
    match http::parse_head(data, &LIMITS, &mut head) {
        Ok(false) => assert!(
            data.len() <= LIMITS.header_bytes_max,
            "an incomplete head past the limit"
        ),
        Ok(true) => {
            let end = head.head_len;
            assert!(end <= data.len() && end <= LIMITS.header_bytes_max);
            let ranges = [
                Some(head.path.clone()),
                head.query.clone(),
                head.content_type.clone(),
            ];
            let header_ranges = head
                .headers
                .iter()
                .flat_map(|(name, value)| [name.clone(), value.clone()]);
            for range in ranges.into_iter().flatten().chain(header_ranges) {
                assert!(
                    range.start <= range.end && range.end <= end,
                    "{range:?} outside the head"
                );
            }
            assert!(head.headers.len() <= LIMITS.header_count_max);
            for cut in [end - 1, end / 2] {
                let mut shorter = Head::new();
                assert_ne!(
                    http::parse_head(&data[..cut], &LIMITS, &mut shorter),
                    Ok(true),
                    "a prefix of {cut} bytes of a {end}-byte head parsed as a head"
                );
            }
            match head.framing {
                BodyFraming::Length(length) => assert!(length <= LIMITS.body_max_bytes),
                BodyFraming::Chunked => chunked_split_invariance(&data[end..]),
                BodyFraming::None => {}
            }
        }
        Err(error) => {
            assert!(
                matches!(error.status(), 400 | 411 | 413 | 431 | 501 | 505),
                "{error:?}"
            );
            error_body_is_json(error.code(), &error.to_string());
        }
    }
    error_body_is_json("bad_request", &String::from_utf8_lossy(data));
}

/// The body decoded in one call, and again fed in two parts split at a point the input
/// chooses: the same bytes out, the same bytes consumed, the same end or the same error.
fn chunked_split_invariance(body: &[u8]) {
    let whole = decode_chunked(&[body]);
    let split = usize::from(body.first().copied().unwrap_or(0)) % (body.len() + 1);
    let parts = decode_chunked(&[&body[..split], &body[split..]]);
    assert_eq!(whole, parts, "split at {split} of {}", body.len());
    let bytewise: Vec<&[u8]> = body.chunks(1).collect();
    assert_eq!(whole, decode_chunked(&bytewise), "fed a byte at a time");
}

/// (decoded bytes, bytes consumed, done) or the error, feeding `parts` in order until the
/// decoder finishes or fails.
fn decode_chunked(parts: &[&[u8]]) -> Result<(Vec<u8>, usize, bool), http::HttpError> {
    let mut decoder = ChunkedDecoder::new();
    let mut out = Vec::new();
    let mut consumed = 0;
    for part in parts {
        let (used, done) = decoder.decode(part, &mut out, LIMITS.body_max_bytes)?;
        assert!(used <= part.len());
        assert!(out.len() <= LIMITS.body_max_bytes, "decoded past body_max");
        consumed += used;
        if done {
            return Ok((out, consumed, true));
        }
        assert_eq!(used, part.len(), "an unfinished decoder left input unread");
    }
    Ok((out, consumed, false))
}

fn error_body_is_json(code: &str, message: &str) {
    let mut out = Vec::new();
    http::error_json(&mut out, code, message);
    let value: serde_json::Value = serde_json::from_slice(&out).expect("error_json writes JSON");
    assert_eq!(value["error"], code);
    assert_eq!(value["message"], message);
}

/// A config file (with an empty environment, so `${NAME}` is a problem, not a lookup):
/// it loads and summarises, or it fails with problems that each say where, as
/// `yaml.path: message`.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config::parse_with_env(text, &|_| None) {
        Ok(config) => {
            let _ = config::summary(&config);
        }
        Err(config::ConfigError::Invalid(problems)) => {
            assert!(!problems.is_empty(), "a refusal with no problem");
            for problem in &problems {
                assert!(
                    problem.contains(": "),
                    "a problem without its path: {problem:?}"
                );
            }
        }
        Err(other) => panic!("parsing text reported {other}"),
    }
}

/// Stored bytes read back: a hook record, a delivery row, an index key or one of the
/// fixed-width values. Whatever decodes re-encodes to exactly the input: the encodings
/// are canonical, so recovery can never read a record two ways.
pub fn records(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    let mut out = Vec::new();
    match kind % 4 {
        0 => {
            if let Ok(record) = HookRecord::decode(bytes) {
                record.encode(&mut out);
                let lower = record
                    .headers
                    .iter()
                    .all(|(name, _)| !name.bytes().any(|b| b.is_ascii_uppercase()));
                if lower {
                    // A version-1 record re-encodes as itself sealed (version 2); a sealed
                    // one as itself.
                    let sealed = HookRecord::upgrade(bytes)
                        .expect("a decoded hook upgrades")
                        .unwrap_or_else(|| bytes.to_vec());
                    assert_eq!(out, sealed, "hook record re-encodes differently");
                } else {
                    // Names are lower-cased on the way in; the rest survives.
                    let again = HookRecord::decode(&out).expect("a re-encoded hook decodes");
                    assert_eq!(again.body, record.body);
                    assert_eq!(again.headers.len(), record.headers.len());
                }
            }
        }
        1 => {
            if let Ok(row) = DeliveryRow::decode(bytes) {
                row.encode(&mut out);
                assert_eq!(out, bytes, "delivery row re-encodes differently");
            }
        }
        2 => {
            if let Ok(key) = keys::parse_index(bytes) {
                if let Some(rebuilt) = index_key(&key) {
                    assert_eq!(rebuilt, bytes, "{key:?} rebuilds differently");
                }
            }
        }
        _ => values(bytes),
    }
}

/// The key `key` was parsed from, built by the key family's own builder; `None` for a
/// counter field or a dedupe source no builder takes.
fn index_key(key: &IndexKey<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match *key {
        IndexKey::Active { ordinal } => keys::active(&mut out, ordinal),
        IndexKey::Counter { ordinal, field } => {
            keys::counter(&mut out, ordinal, Counter::from_field(field)?)
        }
        IndexKey::Due {
            ordinal,
            due_ms,
            seq,
            sink,
        } => keys::due(&mut out, ordinal, due_ms, seq, sink),
        IndexKey::Inflight { ordinal, seq, sink } => keys::inflight(&mut out, ordinal, seq, sink),
        IndexKey::Dead { ordinal, seq, sink } => keys::dead(&mut out, ordinal, seq, sink),
        IndexKey::Quarantine { ordinal, seq } => keys::quarantine(&mut out, ordinal, seq),
        IndexKey::Dedupe {
            ordinal,
            source_id,
            dedupe_key,
        } => keys::dedupe(
            &mut out,
            ordinal,
            std::str::from_utf8(source_id).ok()?,
            dedupe_key,
        ),
        IndexKey::LaneHead { ordinal, lane } => keys::lane_head(&mut out, ordinal, &lane),
        IndexKey::LaneMarker { ordinal, lane } => keys::lane_marker(&mut out, ordinal, &lane),
        IndexKey::LaneMember {
            ordinal,
            lane,
            seq,
            sink,
        } => keys::lane_member(&mut out, ordinal, &lane, seq, sink),
    }
    Some(out)
}

fn values(bytes: &[u8]) {
    if let Ok((ordinal, seq)) = keys::parse_hook(bytes) {
        let mut out = Vec::new();
        keys::hook(&mut out, ordinal, seq);
        assert_eq!(out, bytes);
    }
    if let Ok((ordinal, seq, sink)) = keys::parse_delivery(bytes) {
        let mut out = Vec::new();
        keys::delivery(&mut out, ordinal, seq, sink);
        assert_eq!(out, bytes);
    }
    if let Ok((ordinal, received_at_ms, seq)) = keys::parse_archive(bytes) {
        let mut out = Vec::new();
        keys::archive(&mut out, ordinal, received_at_ms, seq);
        assert_eq!(out, bytes);
    }
    if let Ok((seq, expires_ms)) = keys::parse_dedupe_value(bytes) {
        assert_eq!(keys::dedupe_value(seq, expires_ms), bytes);
    }
    if let Ok((size, kind)) = keys::parse_due_value(bytes) {
        assert_eq!(keys::due_value(size, kind), bytes);
    }
    if let Ok((seq, sink)) = keys::parse_lane_head_value(bytes) {
        assert_eq!(keys::lane_head_value(seq, sink), bytes);
    }
    if let Ok(size) = keys::parse_lane_member_value(bytes) {
        assert_eq!(keys::lane_member_value(size), bytes);
    }
    if let Ok((claimed_at_ms, size)) = keys::parse_inflight_value(bytes) {
        assert_eq!(keys::inflight_value(claimed_at_ms, size), bytes);
    }
    if let Ok(total) = keys::decode_counter(bytes) {
        assert_eq!(keys::encode_counter_delta(total), bytes);
    }
}

struct NoHeaders;

impl HeaderLookup for NoHeaders {
    fn header(&self, _: &str) -> Option<&[u8]> {
        None
    }
}

/// A dot path (the first line) and a body (the rest). The source dedupes on the path and
/// orders its one sink by it: whatever the body, the keys are bounded and the lane is the
/// one its key names; where a second parser (serde_json, see [`Json`]) also reads the body,
/// the keys are what it finds at the path: a string is both keys, a number or boolean
/// only the dedupe key, anything else (a repeated name included) neither.
pub fn json_keys(data: &[u8]) {
    let (path, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b"id"[..], data),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let Some(source) = source_keyed_by(path) else {
        return;
    };
    let source = &*source;
    let segments: Vec<&str> = path.split('.').collect();
    let resolved = match resolve::resolve(source, &NoHeaders, body, &mut JsonScratch::default()) {
        Ok(resolved) => resolved,
        Err(refusal) => {
            assert_eq!((refusal.status, refusal.code), (400, "body_not_json"));
            return;
        }
    };
    let dedupe = resolved.dedupe.as_deref();
    assert_eq!(dedupe.is_none(), resolved.dedupe_missing);
    if let Some(key) = dedupe {
        assert!(!key.is_empty());
        assert!(
            key.len() <= keys::DEDUPE_KEY_MAX || (key.starts_with(b"sha256:") && key.len() == 71)
        );
    }
    let [Some(lane)] = resolved.lanes.as_slice() else {
        panic!("one ordered sink, lanes {:?}", resolved.lanes);
    };
    assert!(lane.ordering_key.len() <= keys::ORDERING_KEY_MAX);
    let keyless = lane.ordering_key.is_empty();
    assert_eq!(keyless, resolved.lane_keys_missing == [0]);
    let expected_id = keys::lane_id(
        0,
        &source.id,
        (!keyless).then_some(lane.ordering_key.as_str()),
    );
    assert_eq!(lane.id, expected_id);

    let Ok(reference) = serde_json::from_slice::<Json>(body) else {
        return;
    };
    match reference.at(&segments) {
        Some(Json::String(text)) if !text.is_empty() => {
            let expected = RowLane::new(0, &source.id, Some(text.as_bytes()));
            assert_eq!(
                lane, &expected,
                "the lane key differs from the reference's {text:?}"
            );
            if text.len() <= keys::DEDUPE_KEY_MAX {
                assert_eq!(
                    dedupe,
                    Some(text.as_bytes()),
                    "the dedupe key differs from the reference's"
                );
            }
        }
        Some(Json::NumberOrBool) => {
            assert!(dedupe.is_some(), "a scalar at the path gave no dedupe key");
            assert!(keyless, "a non-string ordering key made a lane");
        }
        _ => {
            assert_eq!(dedupe, None);
            assert!(keyless);
        }
    }
}

/// The reference reading of a body: serde_json's parser, with every object member kept in
/// document order, repeated names included (serde_json's own `Value` keeps only the last).
enum Json {
    String(String),
    NumberOrBool,
    Object(Vec<(String, Json)>),
    /// Null or an array: never a key.
    Other,
}

impl Json {
    /// The value at `segments`, `None` when a segment is absent, crosses a non-object, or
    /// names a member its object repeats.
    fn at(&self, segments: &[&str]) -> Option<&Json> {
        segments.iter().try_fold(self, |at, segment| {
            let Json::Object(members) = at else {
                return None;
            };
            let mut named = members.iter().filter(|(name, _)| name == segment);
            let (_, member) = named.next()?;
            named.next().is_none().then_some(member)
        })
    }
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> serde::de::Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("JSON")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Json, E> {
        Ok(Json::NumberOrBool)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Json, E> {
        Ok(Json::NumberOrBool)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Json, E> {
        Ok(Json::NumberOrBool)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Json, E> {
        Ok(Json::NumberOrBool)
    }

    fn visit_str<E>(self, text: &str) -> Result<Json, E> {
        Ok(Json::String(text.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Other)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<Json, A::Error> {
        while items.next_element::<Json>()?.is_some() {}
        Ok(Json::Other)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut entries: A) -> Result<Json, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = entries.next_entry::<String, Json>()? {
            members.push(member);
        }
        Ok(Json::Object(members))
    }
}

/// A source that dedupes on `path` and whose one sink is ordered by it; `None` when the
/// config refuses the path. The last one is kept: loading a config costs far more than a
/// resolve, and the fuzzer mutates bodies more often than paths.
fn source_keyed_by(path: &str) -> Option<std::rc::Rc<config::Source>> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(String, Option<std::rc::Rc<config::Source>>)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| {
        if let Some((_, source)) = last.as_ref().filter(|(cached, _)| cached == path) {
            return source.clone();
        }
        let source = load_source_keyed_by(path).map(std::rc::Rc::new);
        *last = Some((path.to_owned(), source.clone()));
        source
    })
}

fn load_source_keyed_by(path: &str) -> Option<config::Source> {
    let quoted = serde_json::to_string(path).ok()?;
    let yaml = format!(
        "tenants: [{{id: acme}}]\nsources:\n  - id: s\n    tenant: acme\n    dedupe: {{json: {quoted}}}\n    sinks:\n      - {{kind: http, url: 'http://127.0.0.1:9/', ordered: true, ordering_key: {{json: {quoted}}}}}\n"
    );
    config::parse(&yaml).ok()?.sources.pop()
}
