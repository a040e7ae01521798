//! The Google Pub/Sub sink: REST `topics.publish` with the body as the message's data, the
//! metadata (and `content_type`) as attributes, and an orderingKey in ordered mode or with
//! the legacy fixed `ordering_key`. A hook is delivered once Pub/Sub answers 200 with its
//! message id: the message is then stored by the service.
//!
//! Attempts go out in batches ([`super::batch`]): up to `batch_size` messages of one
//! orderingKey (Pub/Sub takes one key, or none, per publish) in a request of at most
//! 10 MiB, with at most `max_in_flight` requests open. A publish succeeds or fails whole,
//! so its outcome is every message's.
//!
//! `ureq` is blocking, so every request runs on the [`shards::BlockingPool`] as the HTTP sink's
//! do, over one `ureq::Agent` per sink that keeps idle connections. Auth is none (the
//! emulator), a configured bearer token, or a service account key file ([`auth`]) whose
//! tokens are cached and shared by every request.
//!
//! Pub/Sub's limits are checked before sending ([`prepare`]); the service's answer is
//! classified by [`publish_outcome`].

mod auth;

use std::io::Read as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::batch::{self, Batcher, Item};
use super::io::{SinkIo, CLIENT_TIMEOUT_SLACK};

pub use auth::check_credentials_file;

use super::http::{error_outcome, one_line, parse_retry_after, status_reason};
use super::{content_type, metadata, Message, Outcome, OutcomeFuture, Sink, SinkRuntimes};
use crate::clock;
use crate::config::{PubsubAuth, PubsubSink as Config};

/// The attribute that carries the provider's content type.
pub const CONTENT_TYPE_ATTRIBUTE: &str = "content_type";

/// The REST frontend refuses a request body over 10 MiB ("Request payload size exceeds the
/// limit: 10485760 bytes", apache/beam#19772), counted on the JSON as sent, so with the
/// data base64-encoded: about 7.5 MiB of body. Pub/Sub's own 10 MB per message counts
/// the decoded data plus attributes and ordering key, which is always less than the JSON
/// carrying them (base64 is 4/3 of the data, and at most 100 × (256 + 1024) bytes of
/// attributes cannot make up the difference), so the request limit is the one that binds
/// and the only size checked.
pub const REQUEST_MAX_BYTES: usize = 10 * 1024 * 1024;
pub const ATTRIBUTES_MAX: usize = 100;
pub const ATTRIBUTE_KEY_MAX_BYTES: usize = 256;
pub const ATTRIBUTE_VALUE_MAX_BYTES: usize = 1024;
pub const ORDERING_KEY_MAX_BYTES: usize = 1024;
/// `{"messages":[` and `]}` around the messages, which a comma separates.
const REQUEST_ENVELOPE_BYTES: usize = br#"{"messages":[]}"#.len();

/// At most this much of an answer is read: a publish answer is a few ids, an error a
/// short JSON, and a small body read to the end lets the connection be reused.
const RESPONSE_BODY_MAX_BYTES: u64 = 64 * 1024;
/// At most this much of Google's message (or a non-Google body) goes into a reason.
const REASON_TEXT_MAX_BYTES: usize = 200;

pub struct PubsubSink {
    target: Arc<Target>,
    batcher: Arc<Batcher<Prepared>>,
    io: Arc<SinkIo>,
    pool_name: String,
}

impl std::fmt::Debug for PubsubSink {
    // By hand: the config may hold an access token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubsubSink")
            .field("publish_url", &self.target.publish_url)
            .field("pool", &self.pool_name)
            .finish_non_exhaustive()
    }
}

/// One topic: its client, its publish URL, its credentials and its config.
struct Target {
    agent: ureq::Agent,
    publish_url: String,
    /// An `https:` endpoint: an I/O error of kind InvalidData is then TLS trouble.
    https: bool,
    auth: Auth,
    config: Config,
    /// The budget of one request, a token fetch included.
    timeout: Duration,
}

/// One message, serialized as it goes into a publish request.
#[derive(Debug)]
struct Prepared {
    json: Vec<u8>,
}

enum Auth {
    /// The emulator: no `Authorization` header.
    None,
    /// A configured token, sent as `Bearer <token>`; whoever sets it refreshes it.
    Static(Arc<str>),
    ServiceAccount(auth::TokenSource),
}

impl PubsubSink {
    pub fn new(config: &Config, runtimes: &SinkRuntimes) -> PubsubSink {
        let pool = Arc::clone(&runtimes.pool);
        let timeout = Duration::from_millis(config.timeout_ms);
        // Each worker holds at most one connection at a time, as in the HTTP sink.
        let idle_per_host = pool.thread_count();
        let agent = ureq::Agent::config_builder()
            // Statuses are outcomes here, not errors: Google's error JSON goes in the reason.
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .max_idle_connections_per_host(idle_per_host)
            .max_idle_connections(idle_per_host.max(10))
            .build()
            .new_agent();
        let auth = match &config.auth {
            PubsubAuth::None => Auth::None,
            PubsubAuth::AccessToken(token) => Auth::Static(format!("Bearer {token}").into()),
            PubsubAuth::ServiceAccount(path) => Auth::ServiceAccount(auth::TokenSource::new(path)),
        };
        let publish_url = publish_url(config);
        let target = Arc::new(Target {
            agent,
            https: publish_url.starts_with("https:"),
            publish_url,
            auth,
            config: config.clone(),
            timeout,
        });
        let limits = batch::Limits {
            max_messages: config.batch_size,
            max_bytes: REQUEST_MAX_BYTES - REQUEST_ENVELOPE_BYTES,
            max_in_flight: config.max_in_flight,
            timeout: timeout + CLIENT_TIMEOUT_SLACK,
        };
        let batcher = Batcher::start(&runtimes.io, "pubsub", limits, {
            let target = Arc::clone(&target);
            Arc::new(move |messages: Vec<Prepared>| {
                let count = messages.len();
                let target = Arc::clone(&target);
                let request = pool.run(move || target.publish(&messages));
                Box::pin(async move {
                    match request.await {
                        Ok(outcome) => vec![outcome; count],
                        // The pool is closing (shutdown) or the request panicked: nothing
                        // reached a verdict, so the rows stay for a later attempt.
                        Err(error) => vec![retry(error.to_string()); count],
                    }
                })
            })
        });
        PubsubSink {
            target,
            batcher: Arc::new(batcher),
            io: Arc::clone(&runtimes.io),
            pool_name: runtimes.pool.name().to_owned(),
        }
    }
}

impl Sink for PubsubSink {
    fn kind(&self) -> &'static str {
        "pubsub"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let target = Arc::clone(&self.target);
        let batcher = Arc::clone(&self.batcher);
        self.io
            .attempt(self.target.timeout + CLIENT_TIMEOUT_SLACK, async move {
                let ordering_key = ordering_key(&target.config, &message).map(str::to_owned);
                match prepare(&target.config, &message) {
                    // The separating comma counts too.
                    Ok(prepared) => {
                        let bytes = prepared.json.len() + 1;
                        batcher
                            .submit(Item {
                                message: prepared,
                                bytes,
                                group: ordering_key,
                            })
                            .await
                    }
                    Err(reason) => Outcome::Permanent { reason },
                }
            })
    }
}

impl Target {
    /// One blocking publish of `messages` (after a token fetch when one is due), on a
    /// pool thread: one outcome for all of them.
    fn publish(&self, messages: &[Prepared]) -> Outcome {
        let deadline = Instant::now() + self.timeout;
        let request = request_body(messages);
        let authorization = match &self.auth {
            Auth::None => None,
            Auth::Static(value) => Some(Arc::clone(value)),
            Auth::ServiceAccount(tokens) => match tokens.authorization(&self.agent, deadline) {
                Ok(value) => Some(value),
                Err(reason) => return retry(reason),
            },
        };
        // A token fetch may have used the whole budget.
        let Some(remaining) = remaining(deadline) else {
            return retry("timeout".into());
        };
        let mut builder = self
            .agent
            .post(self.publish_url.as_str())
            .header("content-type", "application/json");
        if let Some(value) = &authorization {
            builder = builder.header("authorization", &**value);
        }
        let sent = builder
            .config()
            .timeout_global(Some(remaining))
            .build()
            .send(&request[..]);
        match sent {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|value| parse_retry_after(value.as_bytes(), clock::now_ms()));
                let body = read_limited(&mut response, RESPONSE_BODY_MAX_BYTES);
                if status == 401 {
                    if let (Auth::ServiceAccount(tokens), Some(used)) = (&self.auth, &authorization)
                    {
                        tokens.invalidate(used);
                    }
                }
                publish_outcome(status, retry_after, &body, messages.len())
            }
            Err(error) => error_outcome(&error, self.https),
        }
    }
}

/// `{endpoint}/v1/projects/{project}/topics/{topic}:publish`, the names percent-encoded
/// (a legacy project id holds `:`, a topic may hold `%` or `+`).
fn publish_url(config: &Config) -> String {
    format!(
        "{}/v1/projects/{}/topics/{}:publish",
        config.endpoint.trim_end_matches('/'),
        path_segment(&config.project),
        path_segment(&config.topic)
    )
}

fn path_segment(name: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The orderingKey of `message`: the lane's key in ordered mode, else the fixed one.
fn ordering_key<'m>(config: &'m Config, message: &'m Message) -> Option<&'m str> {
    message
        .context
        .ordering_key
        .as_deref()
        .or(config.fixed_ordering_key.as_deref())
}

/// The message as it goes into a publish (`{"data", "attributes", "orderingKey"}`), or a
/// `too_large` reason when it breaks one of Pub/Sub's limits, which every later attempt
/// would break too.
fn prepare(config: &Config, message: &Message) -> Result<Prepared, String> {
    let mut attributes: Vec<(&str, String)> = Vec::with_capacity(9);
    // A content type that is not UTF-8 cannot be a JSON string: left out, as NATS does.
    if let Some(value) = content_type(&message.hook).and_then(|v| std::str::from_utf8(v).ok()) {
        attributes.push((CONTENT_TYPE_ATTRIBUTE, value.to_owned()));
    }
    attributes.extend(metadata(&message.context));
    check_attributes(&attributes)?;
    let ordering_key = ordering_key(config, message);
    if let Some(key) = ordering_key {
        if key.len() > ORDERING_KEY_MAX_BYTES {
            return Err(format!(
                "too_large: the ordering key is {} bytes, over Pub/Sub's {ORDERING_KEY_MAX_BYTES}",
                key.len()
            ));
        }
    }
    let mut pubsub_message = serde_json::Map::new();
    pubsub_message.insert("data".into(), STANDARD.encode(&message.hook.body).into());
    pubsub_message.insert(
        "attributes".into(),
        attributes
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.into()))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    );
    if let Some(key) = ordering_key {
        pubsub_message.insert("orderingKey".into(), key.into());
    }
    // Serializing a `Value` of strings cannot fail.
    let json = serde_json::to_vec(&pubsub_message).map_err(|error| format!("request: {error}"))?;
    let alone = json.len() + REQUEST_ENVELOPE_BYTES;
    if alone > REQUEST_MAX_BYTES {
        return Err(format!(
            "too_large: the publish request is {alone} bytes with the {}-byte body \
             base64-encoded, over Pub/Sub's {REQUEST_MAX_BYTES}",
            message.hook.body.len()
        ));
    }
    Ok(Prepared { json })
}

/// `{"messages":[…]}` of the prepared messages.
fn request_body(messages: &[Prepared]) -> Vec<u8> {
    let bytes: usize = messages.iter().map(|message| message.json.len() + 1).sum();
    let mut body = Vec::with_capacity(REQUEST_ENVELOPE_BYTES + bytes);
    body.extend_from_slice(br#"{"messages":["#);
    for (index, message) in messages.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&message.json);
    }
    body.extend_from_slice(b"]}");
    body
}

/// Pub/Sub's limits on a message's attributes.
fn check_attributes(attributes: &[(&str, String)]) -> Result<(), String> {
    if attributes.len() > ATTRIBUTES_MAX {
        return Err(format!(
            "too_large: {} attributes, over Pub/Sub's {ATTRIBUTES_MAX}",
            attributes.len()
        ));
    }
    for (name, value) in attributes {
        if name.len() > ATTRIBUTE_KEY_MAX_BYTES {
            return Err(format!(
                "too_large: an attribute name is {} bytes, over Pub/Sub's {ATTRIBUTE_KEY_MAX_BYTES}",
                name.len()
            ));
        }
        if value.len() > ATTRIBUTE_VALUE_MAX_BYTES {
            return Err(format!(
                "too_large: the attribute {name} is {} bytes, over Pub/Sub's {ATTRIBUTE_VALUE_MAX_BYTES}",
                value.len()
            ));
        }
    }
    Ok(())
}

/// What Pub/Sub's answer to a publish of `count` messages means for their rows.
fn publish_outcome(
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
    count: usize,
) -> Outcome {
    let permanent = |label: &str| Outcome::Permanent {
        reason: format!("{label}: {}", error_text(status, body)),
    };
    match status {
        200 => {
            let ids = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|json| Some(json.get("messageIds")?.as_array()?.len()));
            if ids == Some(count) {
                Outcome::Delivered
            } else {
                // Not Pub/Sub's answer (a proxy's page?): whether they were stored is
                // unknown, and at-least-once allows publishing them again.
                retry(format!(
                    "pubsub answered 200 without one message id for each of its {count} messages: {}",
                    status_reason(status, body)
                ))
            }
        }
        // A message over the limits that slipped past the checks (or a proxy's limit).
        413 => permanent("too_large"),
        400 if error_text(status, body).contains("payload size exceeds the limit") => {
            permanent("too_large")
        }
        // The expired or revoked token was dropped; the next attempt fetches a new one,
        // or a reload brings a new static token. A 401 once must not dead-letter a backlog.
        401 => retry(format!("unauthenticated: {}", error_text(status, body))),
        // The account lacks pubsub.topics.publish: Google's definitive refusal.
        403 => permanent("permission_denied"),
        404 => permanent("no_topic"),
        // Timeout, ABORTED, rate limit (RESOURCE_EXHAUSTED), CANCELLED, server trouble:
        // the codes Google's client libraries retry, and 5xx from anything in between.
        408 | 409 | 429 | 499 | 500..=599 => Outcome::Retry {
            reason: error_text(status, body),
            retry_after,
        },
        // INVALID_ARGUMENT, FAILED_PRECONDITION, other 4xx, a redirect (not followed):
        // the same request would be refused again.
        _ => Outcome::Permanent {
            reason: error_text(status, body),
        },
    }
}

/// `http <status> <STATUS>: <message>` from Google's error JSON
/// (`{"error": {"code", "message", "status"}}`), else `http <status>: <start of the body>`.
fn error_text(status: u16, body: &[u8]) -> String {
    let json = serde_json::from_slice::<serde_json::Value>(body).ok();
    let google = json.as_ref().and_then(|json| {
        let error = json.get("error")?;
        let message = error.get("message").and_then(serde_json::Value::as_str);
        let code = error.get("status").and_then(serde_json::Value::as_str);
        (message.is_some() || code.is_some()).then(|| (code, message.unwrap_or("")))
    });
    match google {
        Some((code, message)) => {
            let message = one_line(truncate(message, REASON_TEXT_MAX_BYTES));
            let code = code.map(|code| format!(" {}", one_line(truncate(code, 40))));
            let code = code.unwrap_or_default();
            if message.is_empty() {
                format!("http {status}{code}")
            } else {
                format!("http {status}{code}: {message}")
            }
        }
        None => status_reason(status, body),
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads at most `max` bytes of the answer. The status is the verdict; a body that fails
/// halfway only shortens the reason (and the connection is then not reused).
fn read_limited(response: &mut ureq::http::Response<ureq::Body>, max: u64) -> Vec<u8> {
    let mut body = Vec::new();
    let _ = response
        .body_mut()
        .as_reader()
        .take(max)
        .read_to_end(&mut body);
    body
}

/// The time left before `deadline`; `None` once it passed.
fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
}

fn retry(reason: String) -> Outcome {
    Outcome::Retry {
        reason,
        retry_after: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
