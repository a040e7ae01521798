//! Provider signature verification: one function, [`verify`], that checks a request's
//! headers and body against a source's [`Verify`] scheme, plus the signing helpers that
//! tests and the bench load generator use to produce valid requests.
//!
//! Every comparison of a secret-derived value is constant-time (`subtle`), and a header
//! carrying several signatures is checked against all of them without an early exit, so
//! the time taken says nothing about how much of a guess was right. Timestamps are
//! checked before the MAC is computed: a replayed request costs no HMAC.
//!
//! Sans-IO and allocation-free on the success path: MACs are fed the signed payload in
//! pieces instead of a concatenated copy, and provided signatures are decoded into
//! stack arrays. Twilio's form-encoded scheme is the one exception: its parameters must be
//! decoded and sorted before they are signed.

use base64::Engine;
use std::borrow::Cow;

use hmac::{Hmac, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};
use thiserror::Error;

use crate::config::Verify;

type HmacSha256 = Hmac<Sha256>;
type HmacSha1 = Hmac<Sha1>;

/// Bytes of an HMAC-SHA256 tag.
const MAC_LEN: usize = 32;
/// Bytes of an HMAC-SHA1 tag (Twilio).
const SHA1_MAC_LEN: usize = 20;

/// Read access to a request's headers, so verification works over any header store.
pub trait HeaderLookup {
    /// The first value of the header named `lower_name`; implementations compare names
    /// case-insensitively.
    fn header(&self, lower_name: &str) -> Option<&[u8]>;

    /// The request target as received: the path and, after `?`, the query. Only a scheme
    /// that signs the URL (Twilio) reads it; `None` where there is no request line, and
    /// such a scheme then matches nothing.
    fn request_target(&self) -> Option<&[u8]> {
        None
    }
}

/// Why a request failed verification. The edge answers each with 401 and a code of its
/// own (`signature_missing`, `timestamp_stale`, `signature_invalid`).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(String),
    /// The header is present but cannot be parsed (no `sha256=`, not hex, no `t=`).
    #[error("malformed {0} header")]
    Malformed(String),
    #[error("signature does not match")]
    BadSignature,
    #[error("timestamp outside the {tolerance_s} s tolerance")]
    StaleTimestamp { tolerance_s: u64 },
}

/// Checks `body` and `headers` against `scheme` at `now_unix_s`.
pub fn verify(
    scheme: &Verify,
    headers: &dyn HeaderLookup,
    body: &[u8],
    now_unix_s: u64,
) -> Result<(), VerifyError> {
    match scheme {
        Verify::None => Ok(()),
        Verify::Token { header, token } => verify_token(headers, header, token),
        Verify::Hmac { header, secret } => {
            verify_body_mac(headers, header, secret.as_bytes(), body, |value| {
                decode_hex_mac(value.strip_prefix(b"sha256=").unwrap_or(value))
            })
        }
        Verify::Github { secret } => verify_body_mac(
            headers,
            "x-hub-signature-256",
            secret.as_bytes(),
            body,
            |value| value.strip_prefix(b"sha256=").and_then(decode_hex_mac),
        ),
        Verify::Stripe {
            secret,
            tolerance_s,
        } => verify_stripe(headers, secret.as_bytes(), *tolerance_s, body, now_unix_s),
        Verify::StandardWebhooks {
            secret,
            tolerance_s,
        } => verify_standard_webhooks(headers, secret, *tolerance_s, body, now_unix_s),
        Verify::Shopify { secret } => verify_body_mac(
            headers,
            "x-shopify-hmac-sha256",
            secret.as_bytes(),
            body,
            decode_base64_mac,
        ),
        Verify::Slack {
            secret,
            tolerance_s,
        } => verify_slack(headers, secret.as_bytes(), *tolerance_s, body, now_unix_s),
        Verify::Twilio { secret, public_url } => {
            verify_twilio(headers, secret.as_bytes(), public_url, body)
        }
    }
}

/// A header carrying one HMAC-SHA256 of the body (`hmac`, GitHub, Shopify): `decode`
/// turns its value into the tag, or `None` when the header is malformed; the tag is
/// compared with the body's in constant time.
fn verify_body_mac(
    headers: &dyn HeaderLookup,
    header: &str,
    secret: &[u8],
    body: &[u8],
    decode: impl FnOnce(&[u8]) -> Option<[u8; MAC_LEN]>,
) -> Result<(), VerifyError> {
    let value = required(headers, header)?;
    let provided = decode(value).ok_or_else(|| malformed(header))?;
    matches(mac(secret, &[body]).ct_eq(&provided))
}

/// The header carries the token verbatim, or as `Bearer <token>` in `authorization`.
fn verify_token(headers: &dyn HeaderLookup, header: &str, token: &str) -> Result<(), VerifyError> {
    let value = required(headers, header)?;
    // Comparing digests keeps the comparison constant-time in the token's length too.
    let expected = Sha256::digest(token.as_bytes());
    let mut matched = Sha256::digest(value).as_slice().ct_eq(expected.as_slice());
    if header.eq_ignore_ascii_case("authorization") {
        if let Some(credentials) = strip_bearer(value) {
            matched |= Sha256::digest(credentials)
                .as_slice()
                .ct_eq(expected.as_slice());
        }
    }
    matches(matched)
}

/// `Bearer <credentials>`, the scheme name case-insensitive (RFC 9110 §11.1).
fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let start = rest
        .iter()
        .position(|byte| *byte != b' ')
        .unwrap_or(rest.len());
    Some(&rest[start..])
}

/// `Stripe-Signature: t=<unix s>,v1=<hex>[,v1=<hex>][,v0=<hex>]` over `"{t}.{body}"`,
/// keyed with the endpoint secret as given (`whsec_…` included).
fn verify_stripe(
    headers: &dyn HeaderLookup,
    secret: &[u8],
    tolerance_s: u64,
    body: &[u8],
    now_unix_s: u64,
) -> Result<(), VerifyError> {
    const HEADER: &str = "stripe-signature";
    let value = required(headers, HEADER)?;
    let items = || value.split(|byte| *byte == b',').map(trim);
    let mut timestamp: Option<&[u8]> = None;
    for item in items() {
        let (key, text) = split_pair(item, b'=').ok_or_else(|| malformed(HEADER))?;
        if key == b"t" && timestamp.is_none() {
            timestamp = Some(text);
        }
    }
    let timestamp_text = timestamp.ok_or_else(|| malformed(HEADER))?;
    let timestamp = parse_unix_seconds(timestamp_text).ok_or_else(|| malformed(HEADER))?;
    check_fresh(timestamp, now_unix_s, tolerance_s)?;
    // The signed payload is the timestamp exactly as sent, not as we would format it.
    let expected = mac(secret, &[timestamp_text, b".", body]);
    let mut matched = Choice::from(0);
    for item in items() {
        if let Some((b"v1", text)) = split_pair(item, b'=') {
            // A v1 that is not 64 hex digits matches nothing; it is not a parse failure,
            // so one bad entry cannot hide a good one.
            if let Some(provided) = decode_hex_mac(text) {
                matched |= expected.ct_eq(&provided);
            }
        }
    }
    matches(matched)
}

/// Standard Webhooks: `webhook-id`, `webhook-timestamp` and `webhook-signature` (a
/// space-separated list of `v1,<base64>`), signed over `"{id}.{timestamp}.{body}"`.
fn verify_standard_webhooks(
    headers: &dyn HeaderLookup,
    secret: &[u8],
    tolerance_s: u64,
    body: &[u8],
    now_unix_s: u64,
) -> Result<(), VerifyError> {
    const ID: &str = "webhook-id";
    const TIMESTAMP: &str = "webhook-timestamp";
    const SIGNATURE: &str = "webhook-signature";
    let id = required(headers, ID)?;
    let timestamp_text = required(headers, TIMESTAMP)?;
    let signatures = required(headers, SIGNATURE)?;
    let timestamp = parse_unix_seconds(timestamp_text).ok_or_else(|| malformed(TIMESTAMP))?;
    check_fresh(timestamp, now_unix_s, tolerance_s)?;
    let expected = mac(secret, &[id, b".", timestamp_text, b".", body]);
    let mut matched = Choice::from(0);
    for entry in signatures
        .split(|byte| *byte == b' ')
        .filter(|entry| !entry.is_empty())
    {
        // Other versions (`v1a`, asymmetric) are skipped, as the specification asks.
        if let Some((b"v1", encoded)) = split_pair(entry, b',') {
            let mut decoded = [0u8; 48];
            let engine = &base64::engine::general_purpose::STANDARD;
            if let Ok(MAC_LEN) = engine.decode_slice(encoded, &mut decoded) {
                matched |= expected.ct_eq(&decoded[..MAC_LEN]);
            }
        }
    }
    matches(matched)
}

/// Slack: `X-Slack-Signature: v0=<hex>` over `"v0:{X-Slack-Request-Timestamp}:{body}"`.
fn verify_slack(
    headers: &dyn HeaderLookup,
    secret: &[u8],
    tolerance_s: u64,
    body: &[u8],
    now_unix_s: u64,
) -> Result<(), VerifyError> {
    const SIGNATURE: &str = "x-slack-signature";
    const TIMESTAMP: &str = "x-slack-request-timestamp";
    let signature = required(headers, SIGNATURE)?;
    let timestamp_text = required(headers, TIMESTAMP)?;
    let timestamp = parse_unix_seconds(timestamp_text).ok_or_else(|| malformed(TIMESTAMP))?;
    let provided = signature
        .strip_prefix(b"v0=")
        .and_then(decode_hex_mac)
        .ok_or_else(|| malformed(SIGNATURE))?;
    check_fresh(timestamp, now_unix_s, tolerance_s)?;
    matches(mac(secret, &[b"v0:", timestamp_text, b":", body]).ct_eq(&provided))
}

/// Twilio: `X-Twilio-Signature` is the base64 HMAC-SHA1, keyed with the auth token, of the
/// URL Twilio called (`public_url` and the request target) followed by every form
/// parameter of the body as name and value, sorted. A JSON body is not in the signed
/// string: Twilio adds `bodySHA256=<hex SHA-256 of the body>` to the URL's query instead,
/// which must match the body. Twilio signs no timestamp, so there is no tolerance.
fn verify_twilio(
    headers: &dyn HeaderLookup,
    secret: &[u8],
    public_url: &str,
    body: &[u8],
) -> Result<(), VerifyError> {
    const HEADER: &str = "x-twilio-signature";
    let value = required(headers, HEADER)?;
    let mut decoded = [0u8; 48];
    let engine = &base64::engine::general_purpose::STANDARD;
    let provided = match engine.decode_slice(value, &mut decoded) {
        Ok(SHA1_MAC_LEN) => &decoded[..SHA1_MAC_LEN],
        _ => return Err(malformed(HEADER)),
    };
    let Some(target) = headers.request_target() else {
        return Err(VerifyError::BadSignature);
    };
    // HMAC takes a key of any length, so this cannot fail.
    let mut tag = HmacSha1::new_from_slice(secret).expect("HMAC accepts any key length");
    tag.update(public_url.as_bytes());
    tag.update(target);
    let query = split_pair(target, b'?').map(|(_, query)| query);
    let body_hash = query.and_then(|query| {
        query
            .split(|byte| *byte == b'&')
            .filter_map(|pair| split_pair(pair, b'='))
            .find(|(name, _)| *name == b"bodySHA256")
            .map(|(_, value)| value)
    });
    let body_matches = match body_hash {
        Some(hex_digest) => {
            let mut expected = [0u8; 32];
            match hex::decode_to_slice(hex_digest, &mut expected) {
                Ok(()) => Sha256::digest(body).as_slice().ct_eq(&expected),
                Err(_) => Choice::from(0),
            }
        }
        None => {
            for (name, value) in form_parameters(body) {
                tag.update(&name);
                tag.update(&value);
            }
            Choice::from(1)
        }
    };
    matches(tag.finalize().into_bytes().as_slice().ct_eq(provided) & body_matches)
}

/// A decoded form parameter: (name, value).
type FormParameter<'b> = (Cow<'b, [u8]>, Cow<'b, [u8]>);

/// The parameters of an `application/x-www-form-urlencoded` body, decoded, sorted by name
/// then value, each distinct pair once: the order Twilio's own validators sign them in.
fn form_parameters(body: &[u8]) -> Vec<FormParameter<'_>> {
    let mut parameters: Vec<_> = body
        .split(|byte| *byte == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match split_pair(pair, b'=') {
            Some((name, value)) => (form_decode(name), form_decode(value)),
            None => (form_decode(pair), Cow::Borrowed(&b""[..])),
        })
        .collect();
    parameters.sort();
    parameters.dedup();
    parameters
}

/// `+` is a space and `%XX` a byte; a `%` not followed by two hex digits stays as it is.
fn form_decode(text: &[u8]) -> Cow<'_, [u8]> {
    if !text.iter().any(|byte| matches!(byte, b'+' | b'%')) {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        match text[at] {
            b'+' => out.push(b' '),
            b'%' => {
                let digits = text.get(at + 1..at + 3);
                let mut byte = [0u8; 1];
                match digits.map(|digits| hex::decode_to_slice(digits, &mut byte)) {
                    Some(Ok(())) => {
                        out.push(byte[0]);
                        at += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        at += 1;
    }
    Cow::Owned(out)
}

fn required<'h>(headers: &'h dyn HeaderLookup, name: &str) -> Result<&'h [u8], VerifyError> {
    headers
        .header(name)
        .ok_or_else(|| VerifyError::MissingHeader(name.to_owned()))
}

fn malformed(name: &str) -> VerifyError {
    VerifyError::Malformed(name.to_owned())
}

fn matches(matched: Choice) -> Result<(), VerifyError> {
    if bool::from(matched) {
        Ok(())
    } else {
        Err(VerifyError::BadSignature)
    }
}

/// A timestamp further than `tolerance_s` from now, in either direction, is refused:
/// the past bounds replays, the future bounds a sender's clock running ahead.
fn check_fresh(timestamp: u64, now_unix_s: u64, tolerance_s: u64) -> Result<(), VerifyError> {
    if timestamp.abs_diff(now_unix_s) > tolerance_s {
        return Err(VerifyError::StaleTimestamp { tolerance_s });
    }
    Ok(())
}

/// Strict decimal seconds: `str::parse` would also take a leading `+`.
fn parse_unix_seconds(text: &[u8]) -> Option<u64> {
    if text.is_empty() {
        return None;
    }
    text.iter().try_fold(0u64, |total, byte| {
        let digit = (*byte as char).to_digit(10)?;
        total.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Standard base64 of a 32-byte MAC (Shopify), into a stack array.
fn decode_base64_mac(text: &[u8]) -> Option<[u8; MAC_LEN]> {
    let mut decoded = [0u8; 48];
    let engine = &base64::engine::general_purpose::STANDARD;
    match engine.decode_slice(text, &mut decoded) {
        Ok(MAC_LEN) => decoded[..MAC_LEN].try_into().ok(),
        _ => None,
    }
}

fn decode_hex_mac(text: &[u8]) -> Option<[u8; MAC_LEN]> {
    let mut decoded = [0u8; MAC_LEN];
    hex::decode_to_slice(text, &mut decoded).ok()?;
    Some(decoded)
}

fn split_pair(item: &[u8], separator: u8) -> Option<(&[u8], &[u8])> {
    let at = item.iter().position(|byte| *byte == separator)?;
    Some((&item[..at], &item[at + 1..]))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|byte| *byte != b' ')
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|byte| *byte != b' ')
        .map_or(start, |at| at + 1);
    &bytes[start..end]
}

/// HMAC-SHA256 of the concatenation of `parts`, without building it.
fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    // HMAC takes a key of any length (longer keys are hashed), so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Lower-case hex HMAC-SHA256 of `body`: the `hmac` scheme's header value.
pub fn hmac_hex(secret: &[u8], body: &[u8]) -> String {
    hex::encode(mac(secret, &[body]))
}

/// A `Stripe-Signature` header value for `body` sent at `t`.
pub fn stripe_signature_header(secret: &str, t: u64, body: &[u8]) -> String {
    let timestamp = t.to_string();
    let tag = mac(secret.as_bytes(), &[timestamp.as_bytes(), b".", body]);
    format!("t={timestamp},v1={}", hex::encode(tag))
}

/// An `X-Hub-Signature-256` header value for `body`.
pub fn github_signature_header(secret: &str, body: &[u8]) -> String {
    format!("sha256={}", hmac_hex(secret.as_bytes(), body))
}

/// A `webhook-signature` entry, `v1,<base64>`, for message `id` sent at `t`.
pub fn standard_webhooks_signature(secret: &[u8], id: &str, t: u64, body: &[u8]) -> String {
    let timestamp = t.to_string();
    let tag = mac(
        secret,
        &[id.as_bytes(), b".", timestamp.as_bytes(), b".", body],
    );
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// An `X-Shopify-Hmac-Sha256` header value for `body`.
pub fn shopify_signature_header(secret: &str, body: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(mac(secret.as_bytes(), &[body]))
}

/// An `X-Slack-Signature` header value for `body` sent at `t`.
pub fn slack_signature_header(secret: &str, t: u64, body: &[u8]) -> String {
    let timestamp = t.to_string();
    let tag = mac(
        secret.as_bytes(),
        &[b"v0:", timestamp.as_bytes(), b":", body],
    );
    format!("v0={}", hex::encode(tag))
}

/// An `X-Twilio-Signature` header value for a request to `url` (query included) with
/// form `parameters`, or none for a JSON body (then `url` carries `bodySHA256`).
pub fn twilio_signature_header(auth_token: &str, url: &str, parameters: &[(&str, &str)]) -> String {
    let mut sorted = parameters.to_vec();
    sorted.sort();
    sorted.dedup();
    let mut tag =
        HmacSha1::new_from_slice(auth_token.as_bytes()).expect("HMAC accepts any key length");
    tag.update(url.as_bytes());
    for (name, value) in sorted {
        tag.update(name.as_bytes());
        tag.update(value.as_bytes());
    }
    base64::engine::general_purpose::STANDARD.encode(tag.finalize().into_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Headers as (name, value) pairs, looked up case-insensitively like the edge does.
    struct Headers<'a>(&'a [(&'a str, &'a str)]);

    impl HeaderLookup for Headers<'_> {
        fn header(&self, lower_name: &str) -> Option<&[u8]> {
            self.0
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(lower_name))
                .map(|(_, value)| value.as_bytes())
        }
    }

    const BODY: &[u8] = br#"{"id":"evt_1"}"#;
    const NOW: u64 = 1_700_000_000;

    fn check(
        scheme: &Verify,
        headers: &[(&str, &str)],
        body: &[u8],
        now: u64,
        expected: Result<(), VerifyError>,
    ) {
        assert_eq!(
            verify(scheme, &Headers(headers), body, now),
            expected,
            "{scheme:?} {headers:?}"
        );
    }

    fn missing(name: &str) -> Result<(), VerifyError> {
        Err(VerifyError::MissingHeader(name.into()))
    }

    fn malformed(name: &str) -> Result<(), VerifyError> {
        Err(VerifyError::Malformed(name.into()))
    }

    const BAD: Result<(), VerifyError> = Err(VerifyError::BadSignature);

    // Known answers, computed once outside this code:
    //   printf '%s' '{"id":"evt_1"}' | openssl dgst -sha256 -hmac 'hmac-secret'
    //   printf '%s' '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac 'whsec_test'
    //   printf '%s' '{"id":"evt_1"}' | openssl dgst -sha256 -hmac 'gh-secret'
    const HMAC_KNOWN: &str = "b259f06ba4e51709af51a7e8e930802aff5c7f435101b9459c5ccbc2c9aa7a8a";
    const STRIPE_KNOWN: &str = "c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925";
    const GITHUB_KNOWN: &str = "70fa97b4ff5d0b62c87f69dfd074adcafcc27290174fbfbaafa849a37518a268";

    #[test]
    fn known_answers() {
        assert_eq!(hmac_hex(b"hmac-secret", BODY), HMAC_KNOWN);
        assert_eq!(
            stripe_signature_header("whsec_test", NOW, BODY),
            format!("t=1700000000,v1={STRIPE_KNOWN}")
        );
        assert_eq!(
            github_signature_header("gh-secret", BODY),
            format!("sha256={GITHUB_KNOWN}")
        );
        // The Standard Webhooks specification's published example (svix), also checked
        // with `openssl dgst -sha256 -mac HMAC -macopt hexkey:… -binary | base64`.
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        assert_eq!(
            standard_webhooks_signature(
                &secret,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn known_answers_verify() {
        let hmac = Verify::Hmac {
            header: "x-signature".into(),
            secret: "hmac-secret".into(),
        };
        check(&hmac, &[("x-signature", HMAC_KNOWN)], BODY, NOW, Ok(()));
        let stripe = Verify::Stripe {
            secret: "whsec_test".into(),
            tolerance_s: 300,
        };
        let header = format!("t=1700000000,v1={STRIPE_KNOWN}");
        check(&stripe, &[("stripe-signature", &header)], BODY, NOW, Ok(()));
        let github = Verify::Github {
            secret: "gh-secret".into(),
        };
        let header = format!("sha256={GITHUB_KNOWN}");
        check(
            &github,
            &[("x-hub-signature-256", &header)],
            BODY,
            NOW,
            Ok(()),
        );
        let secret = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .unwrap();
        let standard = Verify::StandardWebhooks {
            secret,
            tolerance_s: 300,
        };
        let headers = [
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            (
                "webhook-signature",
                "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
            ),
        ];
        check(
            &standard,
            &headers,
            br#"{"test": 2432232314}"#,
            1_614_265_330,
            Ok(()),
        );
    }

    #[test]
    fn none_accepts_anything() {
        check(&Verify::None, &[], BODY, NOW, Ok(()));
    }

    #[test]
    fn token() {
        let auth = Verify::Token {
            header: "authorization".into(),
            token: "tok-123".into(),
        };
        check(
            &auth,
            &[("Authorization", "Bearer tok-123")],
            BODY,
            NOW,
            Ok(()),
        );
        check(
            &auth,
            &[("authorization", "bearer  tok-123")],
            BODY,
            NOW,
            Ok(()),
        );
        check(&auth, &[("authorization", "tok-123")], BODY, NOW, Ok(()));
        check(
            &auth,
            &[("authorization", "Bearer tok-124")],
            BODY,
            NOW,
            BAD,
        );
        check(
            &auth,
            &[("authorization", "Bearer tok-1234")],
            BODY,
            NOW,
            BAD,
        );
        check(&auth, &[("authorization", "Bearer tok-12")], BODY, NOW, BAD);
        check(&auth, &[("authorization", "Basic tok-123")], BODY, NOW, BAD);
        check(&auth, &[("authorization", "")], BODY, NOW, BAD);
        check(
            &auth,
            &[("x-token", "tok-123")],
            BODY,
            NOW,
            missing("authorization"),
        );
        // Outside `authorization` the value is the token verbatim.
        let custom = Verify::Token {
            header: "x-token".into(),
            token: "tok-123".into(),
        };
        check(&custom, &[("x-token", "tok-123")], BODY, NOW, Ok(()));
        check(&custom, &[("x-token", "Bearer tok-123")], BODY, NOW, BAD);
        check(&custom, &[], BODY, NOW, missing("x-token"));
    }

    #[test]
    fn hmac() {
        let scheme = Verify::Hmac {
            header: "x-signature".into(),
            secret: "hmac-secret".into(),
        };
        let good = hmac_hex(b"hmac-secret", BODY);
        check(&scheme, &[("x-signature", &good)], BODY, NOW, Ok(()));
        check(
            &scheme,
            &[("x-signature", &format!("sha256={good}"))],
            BODY,
            NOW,
            Ok(()),
        );
        check(
            &scheme,
            &[("x-signature", &good.to_uppercase())],
            BODY,
            NOW,
            Ok(()),
        );
        check(
            &scheme,
            &[("x-signature", &hmac_hex(b"other", BODY))],
            BODY,
            NOW,
            BAD,
        );
        check(
            &scheme,
            &[("x-signature", &good)],
            b"{\"id\":\"evt_2\"}",
            NOW,
            BAD,
        );
        check(
            &scheme,
            &[("x-signature", &good[..62])],
            BODY,
            NOW,
            malformed("x-signature"),
        );
        check(
            &scheme,
            &[("x-signature", "zz")],
            BODY,
            NOW,
            malformed("x-signature"),
        );
        check(
            &scheme,
            &[("x-signature", &format!("sha1={good}"))],
            BODY,
            NOW,
            malformed("x-signature"),
        );
        check(&scheme, &[], BODY, NOW, missing("x-signature"));
    }

    #[test]
    fn github() {
        let scheme = Verify::Github {
            secret: "gh-secret".into(),
        };
        let good = github_signature_header("gh-secret", BODY);
        check(
            &scheme,
            &[("X-Hub-Signature-256", &good)],
            BODY,
            NOW,
            Ok(()),
        );
        let wrong = github_signature_header("nope", BODY);
        check(&scheme, &[("x-hub-signature-256", &wrong)], BODY, NOW, BAD);
        check(
            &scheme,
            &[("x-hub-signature-256", &good)],
            b"tampered",
            NOW,
            BAD,
        );
        let bare = &good["sha256=".len()..];
        check(
            &scheme,
            &[("x-hub-signature-256", bare)],
            BODY,
            NOW,
            malformed("x-hub-signature-256"),
        );
        // The SHA-1 header alone does not count.
        check(
            &scheme,
            &[("x-hub-signature", &good)],
            BODY,
            NOW,
            missing("x-hub-signature-256"),
        );
    }

    #[test]
    fn stripe() {
        let scheme = Verify::Stripe {
            secret: "whsec_stripe".into(),
            tolerance_s: 300,
        };
        let good = stripe_signature_header("whsec_stripe", NOW, BODY);
        let wrong = stripe_signature_header("whsec_other", NOW, BODY);
        let wrong_v1 = &wrong[wrong.find("v1=").unwrap()..];
        let good_v1 = &good[good.find("v1=").unwrap()..];
        let run = |value: &str, now: u64, expected: Result<(), VerifyError>| {
            check(&scheme, &[("stripe-signature", value)], BODY, now, expected);
        };
        run(&good, NOW, Ok(()));
        run(&good, NOW + 300, Ok(()));
        run(&good, NOW - 300, Ok(()));
        // Any v1 may match: a rotated secret sends two.
        run(&format!("t={NOW},{wrong_v1},{good_v1},v0=00"), NOW, Ok(()));
        run(&format!("t={NOW}, {good_v1}, v1=nothex"), NOW, Ok(()));
        run(&wrong, NOW, BAD);
        run(&format!("t={NOW},v0={}", &good_v1[3..]), NOW, BAD);
        // The signed payload includes the timestamp: a moved `t` breaks the signature.
        run(&format!("t={},{good_v1}", NOW + 1), NOW, BAD);
        let stale = Err(VerifyError::StaleTimestamp { tolerance_s: 300 });
        run(
            &stripe_signature_header("whsec_stripe", NOW - 301, BODY),
            NOW,
            stale.clone(),
        );
        run(
            &stripe_signature_header("whsec_stripe", NOW + 301, BODY),
            NOW,
            stale,
        );
        run(good_v1, NOW, malformed("stripe-signature"));
        run(
            &format!("t=+{NOW},{good_v1}"),
            NOW,
            malformed("stripe-signature"),
        );
        run(
            &format!("t={NOW},junk,{good_v1}"),
            NOW,
            malformed("stripe-signature"),
        );
        check(&scheme, &[], BODY, NOW, missing("stripe-signature"));
    }

    #[test]
    fn standard_webhooks() {
        let key = b"standard-secret-key-12345".to_vec();
        let scheme = Verify::StandardWebhooks {
            secret: key.clone(),
            tolerance_s: 300,
        };
        let now_text = NOW.to_string();
        let good = standard_webhooks_signature(&key, "msg_1", NOW, BODY);
        let wrong = standard_webhooks_signature(b"another-key", "msg_1", NOW, BODY);
        let run = |id: &str, timestamp: &str, signature: &str, expected| {
            let headers = [
                ("webhook-id", id),
                ("webhook-timestamp", timestamp),
                ("webhook-signature", signature),
            ];
            check(&scheme, &headers, BODY, NOW, expected);
        };
        run("msg_1", &now_text, &good, Ok(()));
        run(
            "msg_1",
            &now_text,
            &format!("v1a,abc {wrong}  {good}"),
            Ok(()),
        );
        run("msg_1", &now_text, &format!("v1,!!! {good}"), Ok(()));
        run("msg_1", &now_text, &wrong, BAD);
        run("msg_2", &now_text, &good, BAD);
        run("msg_1", &now_text, &good.replace("v1,", "v2,"), BAD);
        run("msg_1", &now_text, "", BAD);
        let stale = Err(VerifyError::StaleTimestamp { tolerance_s: 300 });
        let past = (NOW - 400).to_string();
        let past_signature = standard_webhooks_signature(&key, "msg_1", NOW - 400, BODY);
        run("msg_1", &past, &past_signature, stale.clone());
        let future = (NOW + 301).to_string();
        let future_signature = standard_webhooks_signature(&key, "msg_1", NOW + 301, BODY);
        run("msg_1", &future, &future_signature, stale);
        run("msg_1", "soon", &good, malformed("webhook-timestamp"));
        let partial = [
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", now_text.as_str()),
        ];
        check(&scheme, &partial, BODY, NOW, missing("webhook-signature"));
        check(&scheme, &partial[1..], BODY, NOW, missing("webhook-id"));
        check(
            &scheme,
            &[("webhook-id", "msg_1")],
            BODY,
            NOW,
            missing("webhook-timestamp"),
        );
    }

    /// A request with a request line: what Twilio's URL-signing scheme needs.
    struct Request<'a> {
        headers: Headers<'a>,
        target: &'a str,
    }

    impl HeaderLookup for Request<'_> {
        fn header(&self, lower_name: &str) -> Option<&[u8]> {
            self.headers.header(lower_name)
        }

        fn request_target(&self) -> Option<&[u8]> {
            Some(self.target.as_bytes())
        }
    }

    // Slack's published example ("Verifying requests from Slack"): a slash command signed
    // with the signing secret 8f742231b10e8888abcd99yyyzzz85a5 at 1531420618; also checked
    // with `printf 'v0:1531420618:<body>' | openssl dgst -sha256 -hmac <secret>`.
    const SLACK_DOC_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const SLACK_DOC_TIMESTAMP: u64 = 1_531_420_618;
    const SLACK_DOC_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const SLACK_DOC_SIGNATURE: &str =
        "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
    // Twilio's published example ("Validating requests"): auth token 12345, the URL
    // https://mycompany.com/myapp.php?foo=1&bar=2 and five call parameters; also checked
    // with `printf '<url>CallSidCA1234567890ABCDECaller+12349013030…' | openssl dgst -sha1
    // -hmac 12345 -binary | base64`.
    const TWILIO_DOC_SIGNATURE: &str = "0/KCTR6DLpKmkAf8muzZqo1nDgQ=";
    const TWILIO_DOC_BODY: &[u8] = b"CallSid=CA1234567890ABCDE&Caller=%2B12349013030&Digits=1234&From=%2B12349013030&To=%2B18005551212";
    // printf '%s' '{"id":820982911946154508,"email":"jon@example.com"}' |
    //   openssl dgst -sha256 -hmac shopify-secret -binary | base64
    const SHOPIFY_KNOWN: &str = "idSMsYHcTIfqStNmryJ9KCy8bgY0Czx3Mfnr/diquzc=";
    const SHOPIFY_BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;

    #[test]
    fn provider_published_examples() {
        assert_eq!(
            slack_signature_header(SLACK_DOC_SECRET, SLACK_DOC_TIMESTAMP, SLACK_DOC_BODY),
            SLACK_DOC_SIGNATURE
        );
        let slack = Verify::Slack {
            secret: SLACK_DOC_SECRET.into(),
            tolerance_s: 300,
        };
        let timestamp = SLACK_DOC_TIMESTAMP.to_string();
        let headers = [
            ("X-Slack-Request-Timestamp", timestamp.as_str()),
            ("X-Slack-Signature", SLACK_DOC_SIGNATURE),
        ];
        check(
            &slack,
            &headers,
            SLACK_DOC_BODY,
            SLACK_DOC_TIMESTAMP,
            Ok(()),
        );

        let parameters = [
            ("CallSid", "CA1234567890ABCDE"),
            ("Caller", "+12349013030"),
            ("Digits", "1234"),
            ("From", "+12349013030"),
            ("To", "+18005551212"),
        ];
        assert_eq!(
            twilio_signature_header(
                "12345",
                "https://mycompany.com/myapp.php?foo=1&bar=2",
                &parameters
            ),
            TWILIO_DOC_SIGNATURE
        );
        let twilio = Verify::Twilio {
            secret: "12345".into(),
            public_url: "https://mycompany.com".into(),
        };
        // Bound first: a temporary in a constructor call would not outlive this line.
        let header_list = [("X-Twilio-Signature", TWILIO_DOC_SIGNATURE)];
        let request = Request {
            headers: Headers(&header_list),
            target: "/myapp.php?foo=1&bar=2",
        };
        assert_eq!(verify(&twilio, &request, TWILIO_DOC_BODY, NOW), Ok(()));

        assert_eq!(
            shopify_signature_header("shopify-secret", SHOPIFY_BODY),
            SHOPIFY_KNOWN
        );
        let shopify = Verify::Shopify {
            secret: "shopify-secret".into(),
        };
        let headers = [("X-Shopify-Hmac-Sha256", SHOPIFY_KNOWN)];
        check(&shopify, &headers, SHOPIFY_BODY, NOW, Ok(()));
    }

    #[test]
    fn shopify() {
        let scheme = Verify::Shopify {
            secret: "shopify-secret".into(),
        };
        let good = shopify_signature_header("shopify-secret", BODY);
        let run = |value: &str, body: &[u8], expected| {
            check(
                &scheme,
                &[("x-shopify-hmac-sha256", value)],
                body,
                NOW,
                expected,
            );
        };
        run(&good, BODY, Ok(()));
        run(&shopify_signature_header("other", BODY), BODY, BAD);
        run(&good, b"{\"id\":\"evt_2\"}", BAD);
        // Hex is what the generic hmac scheme takes, not Shopify's header.
        run(
            &hmac_hex(b"shopify-secret", BODY),
            BODY,
            malformed("x-shopify-hmac-sha256"),
        );
        run(&good[..20], BODY, malformed("x-shopify-hmac-sha256"));
        check(&scheme, &[], BODY, NOW, missing("x-shopify-hmac-sha256"));
    }

    #[test]
    fn slack() {
        let scheme = Verify::Slack {
            secret: "slack-secret".into(),
            tolerance_s: 300,
        };
        let run = |timestamp: u64, signature: &str, body: &[u8], expected| {
            let timestamp = timestamp.to_string();
            let headers = [
                ("x-slack-request-timestamp", timestamp.as_str()),
                ("x-slack-signature", signature),
            ];
            check(&scheme, &headers, body, NOW, expected);
        };
        let good = slack_signature_header("slack-secret", NOW, BODY);
        run(NOW, &good, BODY, Ok(()));
        run(NOW, &slack_signature_header("other", NOW, BODY), BODY, BAD);
        run(NOW, &good, b"tampered", BAD);
        // The timestamp is signed: moving it breaks the signature.
        run(NOW + 1, &good, BODY, BAD);
        let stale = Err(VerifyError::StaleTimestamp { tolerance_s: 300 });
        let old = slack_signature_header("slack-secret", NOW - 301, BODY);
        run(NOW - 301, &old, BODY, stale);
        run(
            NOW,
            &good.replace("v0=", "v1="),
            BODY,
            malformed("x-slack-signature"),
        );
        run(NOW, &good[..40], BODY, malformed("x-slack-signature"));
        let headers = [
            ("x-slack-signature", good.as_str()),
            ("x-slack-request-timestamp", "soon"),
        ];
        check(
            &scheme,
            &headers,
            BODY,
            NOW,
            malformed("x-slack-request-timestamp"),
        );
        check(
            &scheme,
            &headers[..1],
            BODY,
            NOW,
            missing("x-slack-request-timestamp"),
        );
        check(
            &scheme,
            &headers[1..],
            BODY,
            NOW,
            missing("x-slack-signature"),
        );
    }

    fn twilio(public_url: &str) -> Verify {
        Verify::Twilio {
            secret: "twilio-token".into(),
            public_url: public_url.into(),
        }
    }

    #[test]
    fn twilio_form_posts() {
        let scheme = twilio("https://gw.example.com");
        let body = b"To=%2B15005550006&From=%2B15005550001&Body=hi+there&Body=again";
        let parameters = [
            ("To", "+15005550006"),
            ("From", "+15005550001"),
            ("Body", "hi there"),
            ("Body", "again"),
        ];
        let url = "https://gw.example.com/hooks/sms?x=1";
        let good = twilio_signature_header("twilio-token", url, &parameters);
        let run = |target: &str, signature: &str, body: &[u8], expected| {
            let header_list = [("x-twilio-signature", signature)];
            let request = Request {
                headers: Headers(&header_list),
                target,
            };
            assert_eq!(verify(&scheme, &request, body, NOW), expected, "{target}");
        };
        run("/hooks/sms?x=1", &good, body, Ok(()));
        // The parameters' order in the body does not matter; their values do.
        run(
            "/hooks/sms?x=1",
            &good,
            b"Body=again&From=%2B15005550001&Body=hi%20there&To=%2B15005550006",
            Ok(()),
        );
        run(
            "/hooks/sms?x=1",
            &good,
            b"To=%2B15005550006&From=%2B15005550001&Body=hi+there&Body=agai",
            BAD,
        );
        // The URL is signed: another path, query or public URL breaks it.
        run("/hooks/sms?x=2", &good, body, BAD);
        run("/hooks/other?x=1", &good, body, BAD);
        let other_host = twilio("https://other.example.com");
        let header_list = [("x-twilio-signature", good.as_str())];
        let request = Request {
            headers: Headers(&header_list),
            target: "/hooks/sms?x=1",
        };
        assert_eq!(verify(&other_host, &request, body, NOW), BAD);
        run(
            "/hooks/sms?x=1",
            &twilio_signature_header("nope", url, &parameters),
            body,
            BAD,
        );
        run(
            "/hooks/sms?x=1",
            "not base64!",
            body,
            malformed("x-twilio-signature"),
        );
        // A SHA-256-sized tag is not Twilio's.
        run(
            "/hooks/sms?x=1",
            &shopify_signature_header("x", body),
            body,
            malformed("x-twilio-signature"),
        );
        // Without a request line (a stored hook) nothing matches.
        check(&scheme, &[("x-twilio-signature", &good)], body, NOW, BAD);
        check(&scheme, &[], body, NOW, missing("x-twilio-signature"));
    }

    #[test]
    fn twilio_json_bodies_are_covered_by_body_sha256() {
        let scheme = twilio("https://gw.example.com");
        let hash = hex::encode(Sha256::digest(BODY));
        let target = format!("/hooks/studio?bodySHA256={hash}");
        let url = format!("https://gw.example.com{target}");
        let good = twilio_signature_header("twilio-token", &url, &[]);
        let run = |target: &str, body: &[u8], expected| {
            let header_list = [("x-twilio-signature", good.as_str())];
            let request = Request {
                headers: Headers(&header_list),
                target,
            };
            assert_eq!(verify(&scheme, &request, body, NOW), expected, "{target}");
        };
        run(&target, BODY, Ok(()));
        // The body is not signed itself, only its hash in the URL: a changed body fails.
        run(&target, b"{\"id\":\"evt_2\"}", BAD);
        run("/hooks/studio?bodySHA256=zz", BODY, BAD);
    }

    #[test]
    fn form_decoding() {
        assert_eq!(&*form_decode(b"a+b%2Bc%zz%4"), b"a b+c%zz%4");
        assert_eq!(
            form_parameters(b"b=2&a=&&a=1&b=2"),
            [
                (Cow::Borrowed(&b"a"[..]), Cow::Borrowed(&b""[..])),
                (Cow::Borrowed(&b"a"[..]), Cow::Borrowed(&b"1"[..])),
                (Cow::Borrowed(&b"b"[..]), Cow::Borrowed(&b"2"[..])),
            ]
        );
    }

    #[test]
    fn errors_read_well() {
        assert_eq!(
            VerifyError::MissingHeader("x-a".into()).to_string(),
            "missing header x-a"
        );
        assert_eq!(
            VerifyError::Malformed("x-a".into()).to_string(),
            "malformed x-a header"
        );
        assert_eq!(
            VerifyError::StaleTimestamp { tolerance_s: 300 }.to_string(),
            "timestamp outside the 300 s tolerance"
        );
    }
}
