//! Realistic hook requests for the load generator: Stripe- and GitHub-shaped JSON bodies of
//! an exact size, each carrying a unique event id, with the provider's signature header when
//! the cell's source verifies it (the formats the server checks in its `src/verify.rs`).
//!
//! A [`RequestFactory`] owns one body template per connection and rewrites only its id slot,
//! its ordering-key slot when the load has keys (and the signature) per request, so the
//! generator spends its CPU on sending, not on building JSON: on a 2-core box every cycle it
//! burns is taken from the server it measures.

use std::io::Write;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use thiserror::Error;

/// The Stripe endpoint secret of every verifying bench source (never a real one).
pub const STRIPE_SECRET: &str = "whsec_bench_gate_not_a_real_secret";
/// The GitHub webhook secret of every verifying bench source.
pub const GITHUB_SECRET: &str = "bench-gate-github-secret";

/// Hex digits of the unique id written into every body.
const ID_DIGITS: usize = 16;
/// The placeholder of the id slot in the templates below.
const ID_SLOT: &str = "XXXXXXXXXXXXXXXX";
/// The placeholder of the padding that brings a body to its exact size.
const PAD_SLOT: &str = "PAD";
/// Smallest and largest body a cell may ask for; the server's default limit is 1 MiB.
pub const BODY_BYTES_MAX: usize = 1024 * 1024;
/// The JSON path of a Stripe body's ordering key (`ordering_key: {json: …}` of an ordered
/// sink): the customer, as a Stripe integration orders a customer's events.
pub const ORDERING_KEY_PATH: &str = "data.object.customer";
/// The customer of [`STRIPE_TEMPLATE`] with its quotes: the slot an ordering key is written
/// into. Keys are shorter than it; the rest of the slot is blanked (whitespace after a JSON
/// value is insignificant), so every body keeps its exact size.
const CUSTOMER_SLOT: &str = r#""cus_QbGate00000001""#;
/// Most distinct ordering keys a load may draw from: `"cus_999999"` fits the slot.
pub const ORDERING_KEYS_MAX: usize = 1_000_000;

/// A Stripe `payment_intent.succeeded` event as Stripe sends it, trimmed to the common
/// fields. `description` carries the padding.
const STRIPE_TEMPLATE: &str = concat!(
    r#"{"id":"evt_XXXXXXXXXXXXXXXX","object":"event","api_version":"2024-06-20","#,
    r#""created":1718000000,"data":{"object":{"id":"pi_3PbGate0000000001","#,
    r#""object":"payment_intent","amount":2000,"amount_received":2000,"currency":"usd","#,
    r#""customer":"cus_QbGate00000001","description":"PAD","livemode":false,"#,
    r#""metadata":{"order_id":"6735"},"payment_method":"pm_1PbGate000000001","#,
    r#""status":"succeeded"}},"livemode":false,"pending_webhooks":1,"#,
    r#""request":{"id":"req_bGate00000001","idempotency_key":"#,
    r#""b6c1f8e2-7d3a-4c1e-9f4b-2a6d8e0c1b3f"},"type":"payment_intent.succeeded"}"#
);

/// A GitHub `push` event, trimmed to the common fields. The commit message carries the
/// padding; `after` starts with the unique id.
const GITHUB_TEMPLATE: &str = concat!(
    r#"{"ref":"refs/heads/main","before":"9049f1265b7d61be4a8904a9a27120d2064dab3b","#,
    r#""after":"XXXXXXXXXXXXXXXX6b1c0e7a2f8d4c3b9a5e1f0d","repository":{"id":186853002,"#,
    r#""name":"widgets","full_name":"acme/widgets","private":false,"#,
    r#""owner":{"login":"acme","id":21031067}},"pusher":{"name":"octocat","#,
    r#""email":"octocat@example.com"},"sender":{"login":"octocat","id":583231,"#,
    r#""type":"User"},"created":false,"deleted":false,"forced":false,"commits":[{"#,
    r#""id":"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c","message":"PAD","#,
    r#""timestamp":"2024-06-20T12:00:00Z","author":{"name":"octocat","#,
    r#""email":"octocat@example.com"}}]}"#
);

/// Filler for the padding field: plain ASCII prose, so the body stays valid JSON.
const FILLER: &[u8] = b"lorem ipsum dolor sit amet consectetur adipiscing elit ";

/// Which provider a body looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    #[default]
    Stripe,
    Github,
}

impl Shape {
    fn template(self) -> &'static str {
        match self {
            Shape::Stripe => STRIPE_TEMPLATE,
            Shape::Github => GITHUB_TEMPLATE,
        }
    }

    /// The smallest body of this shape: the template with an empty padding field.
    pub fn body_bytes_min(self) -> usize {
        self.template().len() - PAD_SLOT.len()
    }

    pub fn name(self) -> &'static str {
        match self {
            Shape::Stripe => "stripe",
            Shape::Github => "github",
        }
    }
}

/// How requests are signed; the bench source verifies with the same scheme and secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Signing {
    #[default]
    None,
    /// `Stripe-Signature: t=…,v1=…` keyed with [`STRIPE_SECRET`].
    Stripe,
    /// `X-Hub-Signature-256: sha256=…` keyed with [`GITHUB_SECRET`].
    Github,
}

/// Why a request factory cannot be built.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum HookError {
    #[error("body_bytes {requested} is smaller than the smallest {shape} body ({minimum} bytes)")]
    TooSmall {
        shape: &'static str,
        requested: usize,
        minimum: usize,
    },
    #[error("body_bytes {requested} is over the limit of {BODY_BYTES_MAX} bytes")]
    TooLarge { requested: usize },
    #[error("no request paths to post to")]
    NoPaths,
    #[error("a {shape} body has no {ORDERING_KEY_PATH} to carry an ordering key")]
    NoKeySlot { shape: &'static str },
    #[error("ordering_keys must be between 1 and {ORDERING_KEYS_MAX}, found {requested}")]
    BadKeyCount { requested: usize },
}

/// What every request of one load looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookSpec {
    pub shape: Shape,
    pub body_bytes: usize,
    pub signing: Signing,
    /// Request targets, used in turn (one per tenant on a `tenant_from: path` source).
    pub paths: Vec<String>,
    /// Stripe bodies only: `data.object.customer` of request `id` is `cus_{id % n}`, so the
    /// load spreads evenly over `n` ordering keys. `None`: the template's one customer.
    pub ordering_keys: Option<usize>,
}

/// Builds requests of one [`HookSpec`]; one per connection, so nothing is shared.
#[derive(Debug, Clone)]
pub struct RequestFactory {
    spec_shape: Shape,
    signing: Signing,
    paths: Vec<String>,
    next_path: usize,
    /// The body template of exact size; only its id slot (and customer slot, with keys)
    /// changes between requests.
    body: Vec<u8>,
    id_offset: usize,
    /// The number of ordering keys and the offset of the customer slot.
    keys: Option<(u64, usize)>,
}

/// Builds the body of `shape` with exactly `body_bytes` bytes and returns it with the
/// offset of its id slot.
pub fn body(shape: Shape, body_bytes: usize) -> Result<(Vec<u8>, usize), HookError> {
    let minimum = shape.body_bytes_min();
    if body_bytes < minimum {
        return Err(HookError::TooSmall {
            shape: shape.name(),
            requested: body_bytes,
            minimum,
        });
    }
    if body_bytes > BODY_BYTES_MAX {
        return Err(HookError::TooLarge {
            requested: body_bytes,
        });
    }
    let template = shape.template();
    let (before, after) = template.split_once(PAD_SLOT).unwrap_or((template, "")); // Both templates hold the slot; see the tests.
    let mut body = Vec::with_capacity(body_bytes);
    body.extend_from_slice(before.as_bytes());
    let pad_bytes = body_bytes - minimum;
    body.extend(FILLER.iter().cycle().take(pad_bytes));
    body.extend_from_slice(after.as_bytes());
    let id_offset = find(&body, ID_SLOT.as_bytes()).unwrap_or(0);
    Ok((body, id_offset))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

impl RequestFactory {
    pub fn new(spec: &HookSpec) -> Result<RequestFactory, HookError> {
        if spec.paths.is_empty() {
            return Err(HookError::NoPaths);
        }
        let (body, id_offset) = body(spec.shape, spec.body_bytes)?;
        let keys = match spec.ordering_keys {
            None => None,
            Some(count) if count == 0 || count > ORDERING_KEYS_MAX => {
                return Err(HookError::BadKeyCount { requested: count })
            }
            Some(count) => {
                let slot = match spec.shape {
                    // The padding comes after the customer, so the first match is the slot.
                    Shape::Stripe => find(&body, CUSTOMER_SLOT.as_bytes()),
                    Shape::Github => None,
                };
                let Some(slot) = slot else {
                    return Err(HookError::NoKeySlot {
                        shape: spec.shape.name(),
                    });
                };
                Some((count as u64, slot))
            }
        };
        Ok(RequestFactory {
            spec_shape: spec.shape,
            signing: spec.signing,
            paths: spec.paths.clone(),
            next_path: 0,
            body,
            id_offset,
            keys,
        })
    }

    /// Writes the whole request of hook `id` (unique per run) into `out`, replacing what it
    /// held. `now_unix_s` is the Stripe signature's timestamp.
    pub fn write_request(&mut self, id: u64, now_unix_s: u64, out: &mut Vec<u8>) {
        let id_hex = id_hex(id);
        self.body[self.id_offset..self.id_offset + ID_DIGITS].copy_from_slice(&id_hex);
        if let Some((count, offset)) = self.keys {
            write_customer(
                &mut self.body[offset..offset + CUSTOMER_SLOT.len()],
                id % count,
            );
        }
        let path = &self.paths[self.next_path];
        self.next_path = (self.next_path + 1) % self.paths.len();
        out.clear();
        // Writes into a Vec cannot fail; the results are ignored for that reason.
        let _ = write!(
            out,
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n",
            self.body.len()
        );
        match self.spec_shape {
            Shape::Stripe => {
                out.extend_from_slice(
                    b"user-agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\n",
                );
            }
            Shape::Github => {
                out.extend_from_slice(
                    b"user-agent: GitHub-Hookshot/bench\r\nx-github-event: push\r\nx-github-delivery: ",
                );
                out.extend_from_slice(&id_hex);
                out.extend_from_slice(b"\r\n");
            }
        }
        match self.signing {
            Signing::None => {}
            Signing::Stripe => {
                let timestamp = now_unix_s.to_string();
                let tag = mac(
                    STRIPE_SECRET.as_bytes(),
                    &[timestamp.as_bytes(), b".", &self.body],
                );
                let _ = write!(
                    out,
                    "stripe-signature: t={timestamp},v1={}\r\n",
                    hex::encode(tag)
                );
            }
            Signing::Github => {
                let tag = mac(GITHUB_SECRET.as_bytes(), &[&self.body]);
                let _ = write!(out, "x-hub-signature-256: sha256={}\r\n", hex::encode(tag));
            }
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.body);
    }
}

/// Writes `"cus_{index}"` at the start of `slot` and blanks the rest of it.
fn write_customer(slot: &mut [u8], index: u64) {
    slot.fill(b' ');
    // The slot holds any index under ORDERING_KEYS_MAX (checked when the factory is built),
    // so the write cannot run out of room.
    let _ = write!(std::io::Cursor::new(slot), "\"cus_{index}\"");
}

/// `id` as 16 lower-case hex digits.
fn id_hex(id: u64) -> [u8; ID_DIGITS] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; ID_DIGITS];
    for (index, slot) in text.iter_mut().enumerate() {
        let shift = 4 * (ID_DIGITS - 1 - index);
        *slot = DIGITS[((id >> shift) & 0xf) as usize];
    }
    text
}

/// HMAC-SHA256 of the concatenation of `parts`.
fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length (longer keys are hashed), so this cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// The Stripe signature header value of `body` at `timestamp`, for tests.
pub fn stripe_signature(secret: &str, timestamp: u64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let tag = mac(secret.as_bytes(), &[timestamp.as_bytes(), b".", body]);
    format!("t={timestamp},v1={}", hex::encode(tag))
}

/// The GitHub signature header value of `body`, for tests.
pub fn github_signature(secret: &str, body: &[u8]) -> String {
    format!("sha256={}", hex::encode(mac(secret.as_bytes(), &[body])))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    // Known answers from the server's `src/verify.rs` tests, computed there with openssl:
    //   printf '%s' '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac 'whsec_test'
    //   printf '%s' '{"id":"evt_1"}' | openssl dgst -sha256 -hmac 'gh-secret'
    const BODY: &[u8] = br#"{"id":"evt_1"}"#;
    const STRIPE_KNOWN: &str = "c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925";
    const GITHUB_KNOWN: &str = "70fa97b4ff5d0b62c87f69dfd074adcafcc27290174fbfbaafa849a37518a268";

    #[test]
    fn signatures_match_the_servers_known_answers() {
        assert_eq!(
            stripe_signature("whsec_test", 1_700_000_000, BODY),
            format!("t=1700000000,v1={STRIPE_KNOWN}")
        );
        assert_eq!(
            github_signature("gh-secret", BODY),
            format!("sha256={GITHUB_KNOWN}")
        );
    }

    #[test]
    fn bodies_have_the_exact_size_and_are_json() {
        for shape in [Shape::Stripe, Shape::Github] {
            for size in [shape.body_bytes_min(), 1024, 4096, 65_536] {
                let (body, id_offset) = body(shape, size).unwrap();
                assert_eq!(body.len(), size, "{shape:?} {size}");
                assert_eq!(&body[id_offset..id_offset + ID_DIGITS], ID_SLOT.as_bytes());
                let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert!(value.is_object());
            }
        }
    }

    #[test]
    fn too_small_and_too_large_are_refused() {
        let minimum = Shape::Stripe.body_bytes_min();
        assert_eq!(
            body(Shape::Stripe, minimum - 1).unwrap_err(),
            HookError::TooSmall {
                shape: "stripe",
                requested: minimum - 1,
                minimum
            }
        );
        assert_eq!(
            body(Shape::Github, BODY_BYTES_MAX + 1).unwrap_err(),
            HookError::TooLarge {
                requested: BODY_BYTES_MAX + 1
            }
        );
    }

    fn split(request: &[u8]) -> (String, Vec<u8>) {
        let at = find(request, b"\r\n\r\n").unwrap();
        (
            String::from_utf8(request[..at].to_vec()).unwrap(),
            request[at + 4..].to_vec(),
        )
    }

    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.lines()
            .filter_map(|line| line.split_once(": "))
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value)
    }

    #[test]
    fn requests_carry_unique_ids_valid_signatures_and_rotate_paths() {
        let spec = HookSpec {
            shape: Shape::Stripe,
            body_bytes: 1024,
            signing: Signing::Stripe,
            paths: vec!["/hooks/s/t0".into(), "/hooks/s/t1".into()],
            ordering_keys: None,
        };
        let mut factory = RequestFactory::new(&spec).unwrap();
        let mut out = Vec::new();
        factory.write_request(0xabc, 1_700_000_000, &mut out);
        let (head, body) = split(&out);
        assert!(head.starts_with("POST /hooks/s/t0 HTTP/1.1\r\n"), "{head}");
        assert_eq!(header(&head, "content-length"), Some("1024"));
        assert_eq!(body.len(), 1024);
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["id"], "evt_0000000000000abc");
        assert_eq!(
            header(&head, "stripe-signature").unwrap(),
            stripe_signature(STRIPE_SECRET, 1_700_000_000, &body)
        );
        factory.write_request(0xabd, 1_700_000_000, &mut out);
        let (head, body) = split(&out);
        assert!(head.starts_with("POST /hooks/s/t1 "), "{head}");
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["id"], "evt_0000000000000abd");

        let spec = HookSpec {
            shape: Shape::Github,
            body_bytes: 2048,
            signing: Signing::Github,
            paths: vec!["/hooks/gh".into()],
            ordering_keys: None,
        };
        let mut factory = RequestFactory::new(&spec).unwrap();
        factory.write_request(7, 0, &mut out);
        let (head, body) = split(&out);
        assert_eq!(body.len(), 2048);
        assert_eq!(header(&head, "x-github-event"), Some("push"));
        assert_eq!(header(&head, "x-github-delivery"), Some("0000000000000007"));
        assert_eq!(
            header(&head, "x-hub-signature-256").unwrap(),
            github_signature(GITHUB_SECRET, &body)
        );
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(value["after"]
            .as_str()
            .unwrap()
            .starts_with("0000000000000007"));
    }

    #[test]
    fn unsigned_requests_have_no_signature_header() {
        let spec = HookSpec {
            shape: Shape::Stripe,
            body_bytes: 1024,
            signing: Signing::None,
            paths: vec!["/hooks/s".into()],
            ordering_keys: None,
        };
        let mut factory = RequestFactory::new(&spec).unwrap();
        let mut out = Vec::new();
        factory.write_request(1, 0, &mut out);
        let (head, _) = split(&out);
        assert_eq!(header(&head, "stripe-signature"), None);
        assert_eq!(
            RequestFactory::new(&HookSpec {
                paths: Vec::new(),
                ..spec
            })
            .unwrap_err(),
            HookError::NoPaths
        );
    }

    #[test]
    fn keyed_bodies_carry_the_customer_key_and_keep_their_size() {
        assert_eq!(STRIPE_TEMPLATE.matches(CUSTOMER_SLOT).count(), 1);
        for (body_bytes, keys) in [(Shape::Stripe.body_bytes_min(), 3), (1024, 1000)] {
            let spec = HookSpec {
                shape: Shape::Stripe,
                body_bytes,
                signing: Signing::Stripe,
                paths: vec!["/hooks/s".into()],
                ordering_keys: Some(keys),
            };
            let mut factory = RequestFactory::new(&spec).unwrap();
            let mut out = Vec::new();
            let mut seen = std::collections::BTreeSet::new();
            for id in 0..2 * keys as u64 + 1 {
                factory.write_request(id, 1_700_000_000, &mut out);
                let (head, body) = split(&out);
                assert_eq!(body.len(), body_bytes, "{id}");
                let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let customer = value["data"]["object"]["customer"].as_str().unwrap();
                assert_eq!(customer, format!("cus_{}", id % keys as u64));
                seen.insert(customer.to_string());
                // The signature covers the body as sent, key included.
                assert_eq!(
                    header(&head, "stripe-signature").unwrap(),
                    stripe_signature(STRIPE_SECRET, 1_700_000_000, &body)
                );
            }
            assert_eq!(seen.len(), keys);
        }
        // The largest key fills its slot but still fits it.
        let mut slot = *b"XXXXXXXXXXXXXXXXXXXX";
        assert_eq!(slot.len(), CUSTOMER_SLOT.len());
        write_customer(&mut slot, ORDERING_KEYS_MAX as u64 - 1);
        assert_eq!(
            String::from_utf8_lossy(&slot),
            format!("{:<20}", "\"cus_999999\"")
        );
        // Without keys, the template's customer stays.
        let (plain, _) = body(Shape::Stripe, 1024).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&plain).unwrap();
        assert_eq!(value["data"]["object"]["customer"], "cus_QbGate00000001");
    }

    #[test]
    fn keys_need_a_stripe_body_and_a_count_in_range() {
        let spec = HookSpec {
            shape: Shape::Github,
            body_bytes: 1024,
            signing: Signing::None,
            paths: vec!["/hooks/gh".into()],
            ordering_keys: Some(4),
        };
        assert_eq!(
            RequestFactory::new(&spec).unwrap_err(),
            HookError::NoKeySlot { shape: "github" }
        );
        for requested in [0, ORDERING_KEYS_MAX + 1] {
            let spec = HookSpec {
                shape: Shape::Stripe,
                ordering_keys: Some(requested),
                ..spec.clone()
            };
            assert_eq!(
                RequestFactory::new(&spec).unwrap_err(),
                HookError::BadKeyCount { requested }
            );
        }
    }
}
