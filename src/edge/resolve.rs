//! Keys the edge resolves from one request: the dedupe key and the ordering lane of each
//! ordered sink. A body is decoded as JSON at most once per request, however many keys
//! read it, and only when some key needs it.
//!
//! Sans-IO like `ingest`: every rule here is unit-tested without a socket.

use sha2::{Digest, Sha256};
use simd_json::prelude::*;
use simd_json::BorrowedValue;

use crate::config::{Dedupe, OrderingKey, Source};
use crate::edge::http::Refusal;
use crate::store::codec::RowLane;
use crate::store::keys::DEDUPE_KEY_MAX;
use crate::verify::HeaderLookup;

/// Bodies larger than this are never decoded: a `{json: …}` key of such a body is missing.
pub const JSON_DECODE_MAX: usize = 1 << 20;

/// Reused per connection: simd-json parses in place, so the body is copied here first.
#[derive(Debug, Default)]
pub struct JsonScratch {
    bytes: Vec<u8>,
}

/// What the edge resolved from one request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The dedupe key as stored (a long one already hashed); `None` when the source does
    /// not dedupe or the hook carries no key.
    pub dedupe: Option<Vec<u8>>,
    /// The source dedupes but this hook had no key (absent header or JSON field, a body
    /// too large to decode): it is taken without dedupe, and counted.
    pub dedupe_missing: bool,
    /// Empty when no sink of the source is ordered; else one entry per sink, in config
    /// order: the lane of each ordered sink's row, `None` for an unordered sink.
    pub lanes: Vec<Option<RowLane>>,
    /// Indices of the ordered sinks whose configured key this hook lacks: the hook takes
    /// their keyless lane, and the edge counts it.
    pub lane_keys_missing: Vec<usize>,
}

/// Resolves every key the source asks for, from a live request or a stored hook (a
/// quarantine release resolves its keys the way a new hook does). A source that dedupes
/// on a JSON path refuses a body that is not JSON with 400 (`body_not_json`): its dedupe
/// key could never be found. An ordering key that cannot be found is no refusal: the hook
/// takes the sink's keyless lane.
pub fn resolve(
    source: &Source,
    headers: &impl HeaderLookup,
    body: &[u8],
    scratch: &mut JsonScratch,
) -> Result<Resolved, Refusal> {
    let mut resolved = Resolved::default();
    let ordered = source.ordered();
    if source.dedupe.is_none() && !ordered {
        return Ok(resolved);
    }
    let json = decode_if_needed(source, body, scratch);
    if let Some(dedupe) = &source.dedupe {
        let raw: Option<Vec<u8>> = match dedupe {
            Dedupe::Header(name) => headers
                .header(name)
                .filter(|value| !value.is_empty())
                .map(<[u8]>::to_vec),
            Dedupe::Body => Some(hashed(body)),
            Dedupe::Json(path) | Dedupe::JsonOrKeyless(path) => match &json {
                Decoded::Value(value) => scalar_at(value, path),
                // A source whose bodies are not all JSON (Slack's form-encoded
                // interactions) takes such a body without a key.
                Decoded::NotJson(_) if matches!(dedupe, Dedupe::JsonOrKeyless(_)) => None,
                Decoded::NotJson(error) => {
                    return Err(Refusal {
                        status: 400,
                        code: "body_not_json",
                        message: format!("this source reads its keys from a JSON body: {error}"),
                    })
                }
                Decoded::TooLarge | Decoded::NotNeeded => None,
            },
        };
        match raw {
            Some(key) => resolved.dedupe = Some(bounded(key)),
            None => resolved.dedupe_missing = true,
        }
    }
    if ordered {
        let (lanes, missing) = lanes_of(source, headers, &json);
        resolved.lanes = lanes;
        resolved.lane_keys_missing = missing;
    }
    Ok(resolved)
}

/// The lanes of a stored hook's rows under `source` (an archive replay): the same rules
/// as a new hook's, and never a refusal. Empty when no sink of the source is ordered.
pub fn stored_lanes(
    source: &Source,
    headers: &impl HeaderLookup,
    body: &[u8],
    scratch: &mut JsonScratch,
) -> Vec<Option<RowLane>> {
    if !source.ordered() {
        return Vec::new();
    }
    let json = decode_if_needed(source, body, scratch);
    lanes_of(source, headers, &json).0
}

/// The body's one JSON decode, or why there is none.
enum Decoded<'s> {
    NotNeeded,
    TooLarge,
    NotJson(simd_json::Error),
    Value(BorrowedValue<'s>),
}

fn decode_if_needed<'s>(source: &Source, body: &[u8], scratch: &'s mut JsonScratch) -> Decoded<'s> {
    let dedupe_reads_json = matches!(
        source.dedupe,
        Some(Dedupe::Json(_) | Dedupe::JsonOrKeyless(_))
    );
    let lanes_read_json = source.sinks.iter().any(|sink| {
        sink.ordering
            .as_ref()
            .is_some_and(|ordering| matches!(ordering.key, Some(OrderingKey::Json(_))))
    });
    if !dedupe_reads_json && !lanes_read_json {
        return Decoded::NotNeeded;
    }
    if body.len() > JSON_DECODE_MAX {
        return Decoded::TooLarge;
    }
    scratch.bytes.clear();
    scratch.bytes.extend_from_slice(body);
    match simd_json::to_borrowed_value(&mut scratch.bytes) {
        Ok(value) => Decoded::Value(value),
        Err(error) => Decoded::NotJson(error),
    }
}

/// Each sink's lane (see [`Resolved::lanes`]) and the ordered sinks whose key is missing.
fn lanes_of(
    source: &Source,
    headers: &impl HeaderLookup,
    json: &Decoded<'_>,
) -> (Vec<Option<RowLane>>, Vec<usize>) {
    let mut missing = Vec::new();
    let lanes = source
        .sinks
        .iter()
        .enumerate()
        .map(|(index, sink)| {
            if crate::faults::active(crate::faults::Fault::IgnoreLanes) {
                return None;
            }
            let ordering = sink.ordering.as_ref()?;
            let key: Option<&[u8]> = match &ordering.key {
                None => None,
                Some(OrderingKey::Header(name)) => {
                    headers.header(name).filter(|value| !value.is_empty())
                }
                Some(OrderingKey::Json(path)) => match json {
                    Decoded::Value(value) => string_at(value, path).map(str::as_bytes),
                    _ => None,
                },
            };
            if ordering.key.is_some() && key.is_none() {
                missing.push(index);
            }
            Some(RowLane::new(index as u16, &source.id, key))
        })
        .collect();
    (lanes, missing)
}

/// The value at `path`, or `None` when a segment is absent, crosses something other than an
/// object, or names a member that occurs more than once in its object. JSON parsers differ
/// on a repeated name (simd-json finds the first, most others keep the last), so a key read
/// from one would not be the key a consumer of the body sees: it is no key at all.
fn value_at<'v>(value: &'v BorrowedValue<'_>, path: &[String]) -> Option<&'v BorrowedValue<'v>> {
    let mut at = value;
    for segment in path {
        let mut named = at
            .as_object()?
            .iter()
            .filter(|(name, _)| name.as_ref() == segment.as_str())
            .map(|(_, member)| member);
        let member = named.next()?;
        if named.next().is_some() {
            return None;
        }
        at = member;
    }
    Some(at)
}

/// The scalar at `path` as key bytes: a string's contents, a number or boolean as written
/// in JSON. `None` when the path is absent or holds null, an object or an array.
fn scalar_at(value: &BorrowedValue<'_>, path: &[String]) -> Option<Vec<u8>> {
    let at = value_at(value, path)?;
    if let Some(text) = at.as_str() {
        return (!text.is_empty()).then(|| text.as_bytes().to_vec());
    }
    if at.is_number() || at.is_bool() {
        return Some(at.encode().into_bytes());
    }
    None
}

/// The non-empty string at `path`: an ordering key is a string or nothing (a number, a
/// boolean or an object is "no key").
fn string_at<'v>(value: &'v BorrowedValue<'_>, path: &[String]) -> Option<&'v str> {
    value_at(value, path)?
        .as_str()
        .filter(|text| !text.is_empty())
}

/// `sha256:<hex>` of `bytes`.
fn hashed(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(7 + 64);
    out.extend_from_slice(b"sha256:");
    out.extend_from_slice(hex::encode(Sha256::digest(bytes)).as_bytes());
    out
}

/// A key over [`DEDUPE_KEY_MAX`] bytes becomes `sha256:<hex>` of itself.
fn bounded(key: Vec<u8>) -> Vec<u8> {
    if key.len() > DEDUPE_KEY_MAX {
        hashed(&key)
    } else {
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::edge::http::{self, Head, Limits};
    use crate::edge::ingest::RequestHeaders;

    fn source(dedupe: &str) -> Source {
        let yaml = format!(
            "tenants: [{{id: acme}}]\nsources:\n  - id: s\n    tenant: acme\n    dedupe: {dedupe}\n    sinks: [{{kind: http, url: 'http://127.0.0.1:9/'}}]\n"
        );
        config::parse(&yaml).expect("config").sources.remove(0)
    }

    fn resolve_request(
        source: &Source,
        extra_headers: &str,
        body: &str,
    ) -> Result<Resolved, Refusal> {
        let request = format!(
            "POST /hooks/s HTTP/1.1\r\nhost: x\r\n{extra_headers}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let limits = Limits {
            body_max_bytes: 1 << 21,
            header_count_max: 64,
            header_bytes_max: 1 << 14,
        };
        let mut head = Head::new();
        assert!(http::parse_head(request.as_bytes(), &limits, &mut head).expect("head"));
        let headers = RequestHeaders {
            buf: request.as_bytes(),
            head: &head,
        };
        resolve(
            source,
            &headers,
            body.as_bytes(),
            &mut JsonScratch::default(),
        )
    }

    #[test]
    fn json_keys_read_strings_and_numbers_at_the_path() {
        let source = source("{json: data.object.id}");
        let key = |body: &str| resolve_request(&source, "", body).expect("resolves").dedupe;
        assert_eq!(
            key(r#"{"data":{"object":{"id":"evt_1"}}}"#),
            Some(b"evt_1".to_vec())
        );
        assert_eq!(
            key(r#"{"data":{"object":{"id":42}}}"#),
            Some(b"42".to_vec())
        );
        assert_eq!(
            key(r#"{"data":{"object":{"id":true}}}"#),
            Some(b"true".to_vec())
        );
        for missing in [
            r#"{"data":{"object":{}}}"#,
            r#"{"data":{"object":{"id":null}}}"#,
            r#"{"data":{"object":{"id":{"a":1}}}}"#,
            r#"{"data":{"object":{"id":""}}}"#,
            r#"{"data":7}"#,
            r#"[1,2]"#,
        ] {
            let resolved = resolve_request(&source, "", missing).expect("resolves");
            assert_eq!(resolved.dedupe, None, "{missing}");
            assert!(resolved.dedupe_missing, "{missing}");
        }
    }

    /// Found by the `json_keys` fuzz target: simd-json keeps both members of a repeated
    /// name and finds the first, where serde_json and JavaScript keep the last.
    #[test]
    fn a_name_repeated_on_the_path_is_no_key() {
        let source = source("{json: data.id}");
        for ambiguous in [
            r#"{"data":{"id":"first","id":"second"}}"#,
            r#"{"data":{"id":"a"},"data":{"id":"b"}}"#,
            r#"{"data":{"id":"a"},"data":{"other":1}}"#,
        ] {
            let resolved = resolve_request(&source, "", ambiguous).expect("resolves");
            assert_eq!(resolved.dedupe, None, "{ambiguous}");
            assert!(resolved.dedupe_missing, "{ambiguous}");
        }
        // A repeat elsewhere in the body is no concern of the path's.
        let resolved = resolve_request(
            &source,
            "",
            r#"{"x":1,"x":2,"data":{"id":"k","y":0,"y":1}}"#,
        )
        .expect("resolves");
        assert_eq!(resolved.dedupe, Some(b"k".to_vec()));
    }

    #[test]
    fn a_body_that_is_not_json_is_refused_with_400() {
        let refusal = resolve_request(&source("{json: id}"), "", "id=1&x=2").expect_err("not JSON");
        assert_eq!((refusal.status, refusal.code), (400, "body_not_json"));
    }

    #[test]
    fn non_json_keyless_takes_a_body_that_is_not_json_without_a_key() {
        let source = source("{json: event_id, non_json: keyless}");
        let resolved = resolve_request(&source, "", "payload=%7B%7D").expect("not refused");
        assert_eq!(resolved.dedupe, None);
        assert!(resolved.dedupe_missing);
        let resolved = resolve_request(&source, "", r#"{"event_id":"Ev1"}"#).expect("ok");
        assert_eq!(resolved.dedupe, Some(b"Ev1".to_vec()));
    }

    #[test]
    fn a_body_over_the_decode_limit_has_no_json_key() {
        let body = format!(r#"{{"id":"a","pad":"{}"}}"#, "x".repeat(JSON_DECODE_MAX));
        let resolved = resolve_request(&source("{json: id}"), "", &body).expect("resolves");
        assert_eq!(resolved.dedupe, None);
        assert!(resolved.dedupe_missing);
    }

    #[test]
    fn header_and_body_keys() {
        let by_header = source("{header: x-delivery}");
        let resolved = resolve_request(&by_header, "X-Delivery: d-1\r\n", "{}").expect("ok");
        assert_eq!(resolved.dedupe, Some(b"d-1".to_vec()));
        let resolved = resolve_request(&by_header, "", "{}").expect("ok");
        assert!(resolved.dedupe_missing);

        let by_body = resolve_request(&source("body"), "", "hello").expect("ok");
        let expected = format!("sha256:{}", hex::encode(Sha256::digest(b"hello")));
        assert_eq!(by_body.dedupe, Some(expected.into_bytes()));
    }

    #[test]
    fn keys_over_200_bytes_are_hashed_and_200_are_not() {
        let source = source("{header: x-id}");
        let long = "k".repeat(300);
        let resolved = resolve_request(&source, &format!("x-id: {long}\r\n"), "{}").expect("ok");
        let expected = format!("sha256:{}", hex::encode(Sha256::digest(long.as_bytes())));
        assert_eq!(resolved.dedupe, Some(expected.into_bytes()));
        let exact = "k".repeat(200);
        let resolved = resolve_request(&source, &format!("x-id: {exact}\r\n"), "{}").expect("ok");
        assert_eq!(resolved.dedupe, Some(exact.into_bytes()));
    }
}
