//! Keys the edge resolves from one request: the dedupe key (and, with ordering lanes, the
//! ordering keys). A body is decoded as JSON at most once per request, however many keys
//! read it, and only when some key needs it.
//!
//! Sans-IO like `ingest`: every rule here is unit-tested without a socket.

use sha2::{Digest, Sha256};
use simd_json::prelude::*;

use crate::config::{Dedupe, Source};
use crate::edge::ingest::Refusal;
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
}

/// Resolves every key the source asks for, from a live request or a stored hook (a
/// quarantine release resolves its keys the way a new hook does). A source that reads JSON
/// refuses a body that is not JSON with 400 (`body_not_json`): its keys could never be
/// found.
pub fn resolve(
    source: &Source,
    headers: &impl HeaderLookup,
    body: &[u8],
    scratch: &mut JsonScratch,
) -> Result<Resolved, Refusal> {
    let mut resolved = Resolved::default();
    let Some(dedupe) = &source.dedupe else {
        return Ok(resolved);
    };
    let raw: Option<Vec<u8>> = match dedupe {
        Dedupe::Header(name) => headers
            .header(name)
            .filter(|value| !value.is_empty())
            .map(<[u8]>::to_vec),
        Dedupe::Body => Some(hashed(body)),
        Dedupe::Json(path) => json_key(body, path, scratch)?,
    };
    match raw {
        Some(key) => resolved.dedupe = Some(bounded(key)),
        None => resolved.dedupe_missing = true,
    }
    Ok(resolved)
}

/// The scalar at `path` as key bytes: a string's contents, a number or boolean as written
/// in JSON. `None` when the body is too large, the path is absent, or it holds null, an
/// object or an array.
fn json_key(
    body: &[u8],
    path: &[String],
    scratch: &mut JsonScratch,
) -> Result<Option<Vec<u8>>, Refusal> {
    if body.len() > JSON_DECODE_MAX {
        return Ok(None);
    }
    scratch.bytes.clear();
    scratch.bytes.extend_from_slice(body);
    let value = simd_json::to_borrowed_value(&mut scratch.bytes).map_err(|error| Refusal {
        status: 400,
        code: "body_not_json",
        message: format!("this source reads its keys from a JSON body: {error}"),
    })?;
    let mut at = &value;
    for segment in path {
        match at.get(segment.as_str()) {
            Some(next) => at = next,
            None => return Ok(None),
        }
    }
    if let Some(text) = at.as_str() {
        return Ok((!text.is_empty()).then(|| text.as_bytes().to_vec()));
    }
    if at.is_number() || at.is_bool() {
        return Ok(Some(at.encode().into_bytes()));
    }
    Ok(None)
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

    #[test]
    fn a_body_that_is_not_json_is_refused_with_400() {
        let refusal = resolve_request(&source("{json: id}"), "", "id=1&x=2").expect_err("not JSON");
        assert_eq!((refusal.status, refusal.code), (400, "body_not_json"));
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
