//! The SQS sink: SendMessage to a standard or FIFO queue, delivered once SQS answers with a
//! MessageId (SQS has stored the message redundantly before it answers).
//!
//! **Body.** The hook's bytes as they are when they are XML 1.0 characters in valid UTF-8
//! (#x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF), the only bodies SQS takes. Any
//! other body (binary, not UTF-8, a control character) is sent base64-encoded (standard
//! alphabet, padded) with the attribute `ankusa_body_encoding = base64`, so the consumer can
//! get the exact bytes back. SQS takes no empty body: an empty hook is refused (`empty_body`).
//!
//! **Attributes** (SQS takes at most 10): `content_type` when the provider sent one, the
//! metadata of [`metadata`] (7, or 8 with `ankusa_ordering_key`) and `ankusa_body_encoding`
//! for a base64 body, so 10 at most. Each is a `String`, except a value SQS would not take
//! as one (an ordering key holding a control character, a content type that is not UTF-8):
//! that value goes as `Binary` with its bytes rather than have every attempt refused.
//!
//! **FIFO queues** (a URL ending `.fifo`): MessageGroupId is the ordering key in ordered
//! mode, else `<tenant>/<source>`; MessageDeduplicationId is the idempotency key, so a send
//! repeated after a lost answer within SQS's 5-minute window is stored once. SQS takes ids
//! of 1 to 128 printable ASCII characters other than space; any other value, and any value
//! that already starts with `sha256:`, is sent as `sha256:` and the 64 hex digits of its
//! SHA-256 (71 characters). So the mapping stays one-to-one (short of a SHA-256 collision):
//! distinct keys keep distinct groups and dedupe ids. A standard queue gets neither id.
//!
//! **Size.** The body as sent plus every attribute's name, data type and value (what SQS
//! counts) must fit `max_message_bytes`, the queue's MaximumMessageSize; a bigger message is
//! refused (`too_large`) without sending it.
//!
//! **Batches.** Attempts go out through SendMessageBatch, up to `batch_size` messages whose
//! sizes together stay within `max_message_bytes` (SQS's bound on a batch), with at most
//! `max_in_flight` requests open ([`super::batch`]). SQS answers each entry: a stored
//! entry is delivered, a failed one classified by its code alone. A batch SQS finds too
//! long as a whole (a queue whose limit is below `max_message_bytes`) is sent again one
//! message per request, so each message meets its own verdict.
//!
//! One client per sink, made by the first batch so a start never waits on AWS: HTTPS
//! through rustls with ring, the config's region and endpoint, credentials from the AWS
//! default chain (environment, profile, web identity, ECS, IMDS).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::Region;
use aws_sdk_sqs::error::{BuildError, DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use super::batch::{self, Batcher, Item};
use super::io::{SinkIo, CLIENT_TIMEOUT_SLACK};
use super::{content_type, metadata, Message, Outcome, OutcomeFuture, Sink, SinkContext};
use crate::config::SqsSink as Config;

/// Attribute names besides the metadata of [`metadata`].
pub const CONTENT_TYPE_ATTRIBUTE: &str = "content_type";
pub const BODY_ENCODING_ATTRIBUTE: &str = "ankusa_body_encoding";
/// The value of [`BODY_ENCODING_ATTRIBUTE`]: the body is base64 of the hook's bytes.
pub const BASE64_ENCODING: &str = "base64";

/// SQS's limit of message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;
/// SQS's limit for MessageGroupId and MessageDeduplicationId.
const MAX_ID_LEN: usize = 128;
/// What a group or dedupe id SQS would not take becomes: this and its SHA-256 in hex.
const HASHED_ID_PREFIX: &str = "sha256:";
/// SQS's code for a batch over its size bound as a whole.
const BATCH_TOO_LONG: &[&str] = &[
    "AWS.SimpleQueueService.BatchRequestTooLong",
    "BatchRequestTooLong",
];

pub struct SqsSink {
    config: Arc<Config>,
    batcher: Arc<Batcher<Outbound>>,
    io: Arc<SinkIo>,
    timeout: Duration,
}

impl std::fmt::Debug for SqsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsSink")
            .field("queue_url", &self.config.queue_url)
            .field("region", &self.config.region)
            .finish_non_exhaustive()
    }
}

struct Target {
    config: Arc<Config>,
    client: OnceCell<aws_sdk_sqs::Client>,
}

impl SqsSink {
    pub fn new(config: &Config, io: &Arc<SinkIo>) -> SqsSink {
        let config = Arc::new(config.clone());
        let target = Arc::new(Target {
            config: Arc::clone(&config),
            client: OnceCell::new(),
        });
        let timeout = Duration::from_millis(config.timeout_ms) + CLIENT_TIMEOUT_SLACK;
        let limits = batch::Limits {
            max_messages: config.batch_size,
            max_bytes: usize::try_from(config.max_message_bytes).unwrap_or(usize::MAX),
            max_in_flight: config.max_in_flight,
            timeout,
        };
        let batcher = Batcher::start(
            io,
            "sqs",
            limits,
            Arc::new(move |messages: Vec<Outbound>| {
                let target = Arc::clone(&target);
                Box::pin(async move { target.send(&messages).await })
            }),
        );
        SqsSink {
            config,
            batcher: Arc::new(batcher),
            io: Arc::clone(io),
            timeout,
        }
    }
}

impl Sink for SqsSink {
    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let config = Arc::clone(&self.config);
        let batcher = Arc::clone(&self.batcher);
        self.io.attempt(self.timeout, async move {
            // A hook SQS could never take is refused here, without a request.
            match outbound(&config, &message) {
                Ok(outbound) => {
                    let bytes = usize::try_from(outbound.size).unwrap_or(usize::MAX);
                    batcher
                        .submit(Item {
                            message: outbound,
                            bytes,
                            group: None,
                        })
                        .await
                }
                Err(refused) => refused,
            }
        })
    }
}

impl Target {
    /// One SendMessageBatch of `messages` (one outcome each, in order); a batch SQS finds
    /// too long as a whole goes again one message per request.
    async fn send(&self, messages: &[Outbound]) -> Vec<Outcome> {
        let client = self.client.get_or_init(|| client(&self.config)).await;
        match self.send_batch(client, messages).await {
            Ok(outcomes) => outcomes,
            Err(Refused::Whole(outcome)) => vec![outcome; messages.len()],
            Err(Refused::TooLong(outcome)) if messages.len() == 1 => vec![outcome],
            Err(Refused::TooLong(_)) => {
                let mut outcomes = Vec::with_capacity(messages.len());
                for message in messages {
                    outcomes.push(
                        match self.send_batch(client, std::slice::from_ref(message)).await {
                            Ok(mut one) => one.remove(0),
                            Err(Refused::Whole(outcome) | Refused::TooLong(outcome)) => outcome,
                        },
                    );
                }
                outcomes
            }
        }
    }

    /// Each entry's outcome, or the one outcome of a request SQS refused as a whole.
    async fn send_batch(
        &self,
        client: &aws_sdk_sqs::Client,
        messages: &[Outbound],
    ) -> Result<Vec<Outcome>, Refused> {
        let mut entries = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            entries.push(entry(index, message).map_err(|error| {
                Refused::Whole(retry(format!("cannot build the SQS message: {error}")))
            })?);
        }
        let answer = client
            .send_message_batch()
            .queue_url(&self.config.queue_url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|error| {
                let too_long = error
                    .as_service_error()
                    .and_then(ProvideErrorMetadata::code)
                    .is_some_and(|code| BATCH_TOO_LONG.contains(&code));
                let outcome = send_outcome(&self.config.queue_url, &error);
                if too_long {
                    Refused::TooLong(outcome)
                } else {
                    Refused::Whole(outcome)
                }
            })?;
        let mut outcomes =
            vec![retry("SQS answered SendMessageBatch without this entry".into()); messages.len()];
        for stored in answer.successful() {
            if let Some(outcome) = entry_index(stored.id()).and_then(|i| outcomes.get_mut(i)) {
                *outcome = Outcome::Delivered;
            }
        }
        for failed in answer.failed() {
            if let Some(outcome) = entry_index(failed.id()).and_then(|i| outcomes.get_mut(i)) {
                // SQS's sender_fault marks its refusals; anything else is its trouble.
                let status = if failed.sender_fault() { 400 } else { 500 };
                *outcome = service_outcome(
                    &self.config.queue_url,
                    Some(failed.code()),
                    failed.message(),
                    status,
                );
            }
        }
        Ok(outcomes)
    }
}

/// The batch entry of `message`, its Id the position in the batch.
fn entry(index: usize, message: &Outbound) -> Result<SendMessageBatchRequestEntry, BuildError> {
    SendMessageBatchRequestEntry::builder()
        .id(index.to_string())
        .message_body(message.body.clone())
        .set_message_attributes(Some(sdk_attributes(&message.attributes)?))
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.deduplication_id.clone())
        .build()
}

fn entry_index(id: &str) -> Option<usize> {
    id.parse().ok()
}

/// A SendMessageBatch SQS answered with an error for the whole request.
enum Refused {
    /// The same outcome for every message.
    Whole(Outcome),
    /// Too long as a batch: each message may still pass alone.
    TooLong(Outcome),
}

/// The SDK client. Building it reads the environment and profile files but calls nothing:
/// credentials are fetched (and cached, and refreshed) by the first request.
async fn client(config: &Config) -> aws_sdk_sqs::Client {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .http_client(http)
        // The pipeline's own backoff retries a failed attempt; the SDK's second try, soon
        // after the first, only bridges a pooled connection that closed under it.
        .retry_config(
            RetryConfig::standard()
                .with_max_attempts(2)
                .with_initial_backoff(Duration::from_millis(50)),
        )
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(Duration::from_millis(config.timeout_ms))
                .build(),
        );
    if let Some(endpoint) = &config.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    aws_sdk_sqs::Client::new(&loader.load().await)
}

/// One message as SQS will take it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outbound {
    body: String,
    attributes: Vec<Attribute>,
    /// What SQS counts against the size bound: the body and the attributes.
    size: u64,
    /// Both `Some` for a FIFO queue, both `None` for a standard one.
    group_id: Option<String>,
    deduplication_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Attribute {
    name: &'static str,
    value: AttributeValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AttributeValue {
    String(String),
    Binary(Vec<u8>),
}

impl AttributeValue {
    /// A `String` when SQS takes the bytes as one, else `Binary`.
    fn of(bytes: &[u8]) -> AttributeValue {
        match std::str::from_utf8(bytes) {
            Ok(text) if is_xml_text(text) => AttributeValue::String(text.to_owned()),
            _ => AttributeValue::Binary(bytes.to_vec()),
        }
    }

    fn data_type(&self) -> &'static str {
        match self {
            AttributeValue::String(_) => "String",
            AttributeValue::Binary(_) => "Binary",
        }
    }

    fn len(&self) -> usize {
        match self {
            AttributeValue::String(text) => text.len(),
            AttributeValue::Binary(bytes) => bytes.len(),
        }
    }
}

/// The message for `config`'s queue, or the refusal of a hook SQS could never take.
fn outbound(config: &Config, message: &Message) -> Result<Outbound, Outcome> {
    let raw = &message.hook.body;
    if raw.is_empty() {
        return Err(Outcome::Permanent {
            reason: "empty_body: an SQS message body holds at least one character".into(),
        });
    }
    let (body, base64) = body(raw);
    let attributes = attributes(message, base64);
    let size = size(&body, &attributes);
    if size > config.max_message_bytes {
        return Err(Outcome::Permanent {
            reason: format!(
                "too_large: the message is {size} bytes with its attributes, over the \
                 queue's max_message_bytes {}",
                config.max_message_bytes
            ),
        });
    }
    let (group_id, deduplication_id) = if config.fifo() {
        (
            Some(group_id(&message.context)),
            Some(sqs_id(&message.context.idempotency_key).into_owned()),
        )
    } else {
        (None, None)
    };
    Ok(Outbound {
        body,
        attributes,
        size,
        group_id,
        deduplication_id,
    })
}

/// The body as sent, and whether it is base64 of the hook's bytes.
fn body(bytes: &[u8]) -> (String, bool) {
    match std::str::from_utf8(bytes) {
        Ok(text) if is_xml_text(text) => (text.to_owned(), false),
        _ => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            true,
        ),
    }
}

/// XML 1.0's `Char`, what SQS takes in a body or a String attribute. A `char` is never a
/// surrogate, so only the C0 controls but tab, LF and CR, and U+FFFE and U+FFFF, are out.
fn is_xml_text(text: &str) -> bool {
    text.chars().all(|c| {
        matches!(c,
            '\u{9}' | '\u{A}' | '\u{D}'
            | '\u{20}'..='\u{D7FF}'
            | '\u{E000}'..='\u{FFFD}'
            | '\u{10000}'..='\u{10FFFF}')
    })
}

/// `content_type` when the provider sent one (SQS takes no empty value), the metadata, and
/// `ankusa_body_encoding` for a base64 body.
fn attributes(message: &Message, base64_body: bool) -> Vec<Attribute> {
    let mut attributes = Vec::with_capacity(MAX_ATTRIBUTES);
    if let Some(value) = content_type(&message.hook).filter(|value| !value.is_empty()) {
        attributes.push(Attribute {
            name: CONTENT_TYPE_ATTRIBUTE,
            value: AttributeValue::of(value),
        });
    }
    for (name, value) in metadata(&message.context) {
        attributes.push(Attribute {
            name,
            value: AttributeValue::of(value.as_bytes()),
        });
    }
    if base64_body {
        attributes.push(Attribute {
            name: BODY_ENCODING_ATTRIBUTE,
            value: AttributeValue::String(BASE64_ENCODING.into()),
        });
    }
    // 1 + 8 + 1: SQS refuses an 11th attribute, and nothing else adds one.
    debug_assert!(attributes.len() <= MAX_ATTRIBUTES, "{attributes:?}");
    attributes
}

/// The size SQS counts against MaximumMessageSize: the body and each attribute's name,
/// data type and value.
fn size(body: &str, attributes: &[Attribute]) -> u64 {
    let attributes: usize = attributes
        .iter()
        .map(|attribute| {
            attribute.name.len() + attribute.value.data_type().len() + attribute.value.len()
        })
        .sum();
    (body.len() + attributes) as u64
}

/// The ordering key in ordered mode, else one group per source.
fn group_id(context: &SinkContext) -> String {
    match &context.ordering_key {
        Some(key) => sqs_id(key).into_owned(),
        None => sqs_id(&format!("{}/{}", context.tenant_id, context.source_id)).into_owned(),
    }
}

/// `value` when SQS takes it as a group or dedupe id, else `sha256:<64 hex>` (module docs).
fn sqs_id(value: &str) -> Cow<'_, str> {
    let taken = (1..=MAX_ID_LEN).contains(&value.len())
        && value.bytes().all(|byte| byte.is_ascii_graphic())
        // Hashed too, so no raw key can pass for the hash of another.
        && !value.starts_with(HASHED_ID_PREFIX);
    if taken {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(format!(
            "{HASHED_ID_PREFIX}{}",
            hex::encode(Sha256::digest(value.as_bytes()))
        ))
    }
}

fn sdk_attributes(
    attributes: &[Attribute],
) -> Result<HashMap<String, MessageAttributeValue>, BuildError> {
    attributes
        .iter()
        .map(|attribute| {
            let value = MessageAttributeValue::builder().data_type(attribute.value.data_type());
            let value = match &attribute.value {
                AttributeValue::String(text) => value.string_value(text),
                AttributeValue::Binary(bytes) => value.binary_value(Blob::new(bytes.clone())),
            };
            Ok((attribute.name.to_owned(), value.build()?))
        })
        .collect()
}

/// A request that never got SQS's answer (no connection, no answer in time, credentials
/// not found yet) may pass later; SQS's own answers are sorted by [`service_outcome`].
fn send_outcome<E>(queue_url: &str, error: &SdkError<E, HttpResponse>) -> Outcome
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match error {
        SdkError::ServiceError(context) => service_outcome(
            queue_url,
            context.err().code(),
            context.err().message(),
            context.raw().status().as_u16(),
        ),
        SdkError::ResponseError(context) => {
            let status = context.raw().status().as_u16();
            if (400..500).contains(&status) {
                Outcome::Permanent {
                    reason: format!(
                        "SQS refused the message with {status}: {}",
                        DisplayErrorContext(error)
                    ),
                }
            } else {
                retry(format!("SQS: {}", DisplayErrorContext(error)))
            }
        }
        SdkError::TimeoutError(_) => retry(format!(
            "no answer from SQS in time: {}",
            DisplayErrorContext(error)
        )),
        SdkError::DispatchFailure(_) => {
            retry(format!("cannot reach SQS: {}", DisplayErrorContext(error)))
        }
        _ => retry(format!("SQS: {}", DisplayErrorContext(error))),
    }
}

/// SQS's refusal of a SendMessage. "Not now" codes and 5xx retry; a missing queue, a message
/// SQS will not take and credentials it rejects would be refused the same way on every
/// attempt, as would any other 4xx.
fn service_outcome(
    queue_url: &str,
    code: Option<&str>,
    message: Option<&str>,
    status: u16,
) -> Outcome {
    const TRANSIENT: &[&str] = &[
        "ThrottlingException",
        "Throttling",
        "RequestThrottled",
        "KMS.ThrottlingException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestTimeout",
        // Temporary credentials the SDK refreshes, a clock it corrects: the next try passes.
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
    ];
    const NO_QUEUE: &[&str] = &[
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
    ];
    const REFUSED: &[&str] = &[
        "InvalidMessageContents",
        "InvalidParameterValue",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
    ];
    let said = match (code, message) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        (None, Some(message)) => format!("{status}: {message}"),
        (None, None) => format!("{status} without an error code"),
    };
    let code = code.unwrap_or_default();
    if TRANSIENT.contains(&code) {
        return retry(format!("SQS: {said}"));
    }
    if NO_QUEUE.contains(&code) {
        return Outcome::Permanent {
            reason: format!("no_queue: SQS has no queue {queue_url} ({said})"),
        };
    }
    // The queue's MaximumMessageSize is below max_message_bytes.
    if code == "InvalidParameterValue" && message.is_some_and(|m| m.contains("shorter than")) {
        return Outcome::Permanent {
            reason: format!("too_large: {said}"),
        };
    }
    if REFUSED.contains(&code) || (400..500).contains(&status) {
        return Outcome::Permanent {
            reason: format!("SQS refused the message: {said}"),
        };
    }
    retry(format!("SQS: {said}"))
}

fn retry(reason: String) -> Outcome {
    Outcome::Retry {
        reason,
        retry_after: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::codec::HookRecord;
    use aws_sdk_sqs::error::ConnectorError;
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError;

    fn config(queue_url: &str) -> Config {
        Config {
            queue_url: queue_url.into(),
            region: "us-east-1".into(),
            endpoint: None,
            max_message_bytes: 262_144,
            batch_size: 10,
            max_in_flight: 4,
            timeout_ms: 1_000,
        }
    }

    const STANDARD: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/hooks";
    const FIFO: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/hooks.fifo";

    fn message(body: &[u8], content_type: Option<&[u8]>, ordering_key: Option<&str>) -> Message {
        Message {
            hook: Arc::new(HookRecord {
                source_id: "stripe".into(),
                tenant_id: "acme".into(),
                received_at_ms: 1_700_000_000_123,
                dedupe_key: Vec::new(),
                headers: content_type
                    .map(|value| vec![("content-type".into(), value.to_vec())])
                    .unwrap_or_default(),
                body: body.to_vec(),
            }),
            context: SinkContext {
                tenant_id: "acme".into(),
                source_id: "stripe".into(),
                sink_id: "sqs".into(),
                seq: 42,
                attempt: 2,
                idempotency_key: "node:42:sqs".into(),
                received_at_ms: 1_700_000_000_123,
                ordering_key: ordering_key.map(str::to_owned),
                lane: None,
            },
        }
    }

    fn sent(config: &Config, message: &Message) -> Outbound {
        outbound(config, message).expect("sent")
    }

    fn names(outbound: &Outbound) -> Vec<&'static str> {
        outbound.attributes.iter().map(|a| a.name).collect()
    }

    fn string(outbound: &Outbound, name: &str) -> String {
        match outbound.attributes.iter().find(|a| a.name == name) {
            Some(Attribute {
                value: AttributeValue::String(text),
                ..
            }) => text.clone(),
            other => panic!("{name}: {other:?}"),
        }
    }

    fn refused(outcome: Result<Outbound, Outcome>) -> String {
        match outcome {
            Err(Outcome::Permanent { reason }) => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn attributes_are_the_content_type_and_the_metadata_and_never_more_than_ten() {
        let json = message(b"{\"id\":1}", Some(b"application/json".as_slice()), None);
        let outbound = sent(&config(STANDARD), &json);
        assert_eq!(
            names(&outbound),
            [
                "content_type",
                "ankusa_message_version",
                "ankusa_idempotency_key",
                "ankusa_tenant",
                "ankusa_source",
                "ankusa_seq",
                "ankusa_received_at",
                "ankusa_attempt",
            ]
        );
        assert_eq!(string(&outbound, "content_type"), "application/json");
        assert_eq!(string(&outbound, "ankusa_idempotency_key"), "node:42:sqs");
        assert_eq!(string(&outbound, "ankusa_seq"), "42");
        assert_eq!(string(&outbound, "ankusa_attempt"), "2");
        assert_eq!(outbound.body, "{\"id\":1}");

        // Without a content type: no attribute for it (SQS takes no empty value).
        for content_type in [None, Some(&b""[..])] {
            let outbound = sent(&config(STANDARD), &message(b"x", content_type, None));
            assert_eq!(outbound.attributes.len(), 7);
            assert!(!names(&outbound).contains(&"content_type"));
        }

        // The most there can be: content type, 8 metadata, the body encoding.
        let most = message(
            &[0xff, 0x00],
            Some(b"application/octet-stream".as_slice()),
            Some("cus_1"),
        );
        let outbound = sent(&config(FIFO), &most);
        assert_eq!(outbound.attributes.len(), MAX_ATTRIBUTES);
        assert_eq!(string(&outbound, "ankusa_ordering_key"), "cus_1");
        assert_eq!(string(&outbound, BODY_ENCODING_ATTRIBUTE), "base64");
        let sdk = sdk_attributes(&outbound.attributes).expect("built");
        assert_eq!(sdk.len(), MAX_ATTRIBUTES);
        assert_eq!(sdk["ankusa_ordering_key"].data_type(), "String");
        assert_eq!(sdk["ankusa_ordering_key"].string_value(), Some("cus_1"));
    }

    #[test]
    fn a_value_that_is_not_xml_text_goes_as_binary() {
        let outbound = sent(
            &config(STANDARD),
            &message(
                b"{}",
                Some(b"text/plain; x=\xe9".as_slice()),
                Some("cus\u{1}1"),
            ),
        );
        let value = |name: &str| {
            outbound
                .attributes
                .iter()
                .find(|a| a.name == name)
                .map(|a| a.value.clone())
        };
        assert_eq!(
            value("content_type"),
            Some(AttributeValue::Binary(b"text/plain; x=\xe9".to_vec()))
        );
        assert_eq!(
            value("ankusa_ordering_key"),
            Some(AttributeValue::Binary(b"cus\x011".to_vec()))
        );
        let sdk = sdk_attributes(&outbound.attributes).expect("built");
        assert_eq!(sdk["content_type"].data_type(), "Binary");
        assert_eq!(
            sdk["content_type"].binary_value().map(|b| b.as_ref()),
            Some(&b"text/plain; x=\xe9"[..])
        );
    }

    #[test]
    fn a_body_sqs_cannot_take_as_text_goes_as_base64_with_its_encoding_attribute() {
        let as_is: [&[u8]; 5] = [
            b"{\"customer\":\"c0\"}",
            "ü – 日本 🦀".as_bytes(),
            b"tab\tnewline\ncr\r",
            "\u{D7FF}\u{E000}\u{FFFD}\u{10000}\u{10FFFF}".as_bytes(),
            b" ",
        ];
        for bytes in as_is {
            let outbound = sent(&config(STANDARD), &message(bytes, None, None));
            assert_eq!(outbound.body.as_bytes(), bytes);
            assert!(!names(&outbound).contains(&BODY_ENCODING_ATTRIBUTE));
        }
        let encoded: [&[u8]; 6] = [
            &[0xff, 0xfe, 0x00, 0x01],
            b"\xc3\x28",
            b"nul\0",
            b"escape\x1b[0m",
            "\u{FFFE}".as_bytes(),
            "\u{FFFF}".as_bytes(),
        ];
        for bytes in encoded {
            let outbound = sent(&config(STANDARD), &message(bytes, None, None));
            assert_eq!(string(&outbound, BODY_ENCODING_ATTRIBUTE), "base64");
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&outbound.body)
                .expect("base64");
            assert_eq!(decoded, bytes);
        }
        let empty = outbound(&config(STANDARD), &message(b"", None, None));
        assert!(refused(empty).starts_with("empty_body: "));
    }

    #[test]
    fn fifo_ids_are_the_ordering_key_or_the_source_and_the_idempotency_key() {
        let fifo = config(FIFO);
        let ordered = sent(&fifo, &message(b"x", None, Some("cus_1")));
        assert_eq!(ordered.group_id.as_deref(), Some("cus_1"));
        assert_eq!(ordered.deduplication_id.as_deref(), Some("node:42:sqs"));
        let unordered = sent(&fifo, &message(b"x", None, None));
        assert_eq!(unordered.group_id.as_deref(), Some("acme/stripe"));
        assert_eq!(unordered.deduplication_id.as_deref(), Some("node:42:sqs"));

        let standard = sent(&config(STANDARD), &message(b"x", None, Some("cus_1")));
        assert_eq!((standard.group_id, standard.deduplication_id), (None, None));
    }

    #[test]
    fn an_id_sqs_would_refuse_is_hashed_one_to_one() {
        let punctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
        let longest = "k".repeat(128);
        for taken in [
            "cus_1",
            "acme/orders",
            "node:7:sqs",
            punctuation,
            longest.as_str(),
        ] {
            assert_eq!(sqs_id(taken), taken);
        }
        let too_long = "k".repeat(129);
        let refused = [
            "",
            "with space",
            "ü",
            "tab\t",
            too_long.as_str(),
            "sha256:0000",
        ];
        let mut hashed: Vec<String> = refused.iter().map(|v| sqs_id(v).into_owned()).collect();
        for (value, id) in refused.iter().zip(&hashed) {
            let digest = hex::encode(Sha256::digest(value.as_bytes()));
            assert_eq!(id, &format!("sha256:{digest}"), "{value:?}");
            assert_eq!(id.len(), 71);
            assert!(id.bytes().all(|b| b.is_ascii_graphic()));
            assert_eq!(sqs_id(value), id.as_str(), "deterministic");
        }
        // A key that already looks hashed is hashed again: no raw key can pass for another
        // key's hash, so distinct keys keep distinct ids.
        let lookalike = sqs_id("with space").into_owned();
        let rehashed = sqs_id(&lookalike).into_owned();
        assert_ne!(rehashed, lookalike);
        hashed.push(rehashed);
        hashed.push(sqs_id(&"k".repeat(130)).into_owned());
        let count = hashed.len();
        hashed.sort();
        hashed.dedup();
        assert_eq!(hashed.len(), count, "distinct keys, distinct ids");

        let group = group_id(&message(b"x", None, Some(&"c".repeat(200))).context);
        assert!(group.starts_with("sha256:"));
    }

    #[test]
    fn the_body_and_every_attribute_count_against_max_message_bytes() {
        let hook = message(b"0123456789", Some(b"text/plain".as_slice()), None);
        let outbound = sent(&config(STANDARD), &hook);
        // name + "String" + value of each attribute, and the body.
        let expected = 10
            + ["content_type", "text/plain"].concat().len()
            + metadata(&hook.context)
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
            + 6 * outbound.attributes.len();
        assert_eq!(size(&outbound.body, &outbound.attributes), expected as u64);

        let mut exact = config(STANDARD);
        exact.max_message_bytes = expected as u64;
        assert!(outbound_fits(&exact, &hook));
        exact.max_message_bytes -= 1;
        let reason = refused(super::outbound(&exact, &hook));
        assert!(reason.starts_with("too_large: "), "{reason}");
        assert!(reason.contains(&expected.to_string()), "{reason}");

        // A base64 body counts as sent, 4 bytes for every 3, with its encoding attribute.
        let binary = message(&[0xff; 300], None, None);
        let outbound = sent(&config(STANDARD), &binary);
        assert_eq!(outbound.body.len(), 400);
        assert!(size(&outbound.body, &outbound.attributes) > 400 + 20 + 6 + 6);
    }

    fn outbound_fits(config: &Config, message: &Message) -> bool {
        outbound(config, message).is_ok()
    }

    fn service(code: &str, message: &str, status: u16) -> Outcome {
        service_outcome(STANDARD, Some(code), Some(message), status)
    }

    fn permanent(outcome: Outcome) -> String {
        match outcome {
            Outcome::Permanent { reason } => reason,
            other => panic!("not permanent: {other:?}"),
        }
    }

    #[test]
    fn sqs_refusals_are_permanent_and_not_now_retries() {
        for code in [
            "AWS.SimpleQueueService.NonExistentQueue",
            "QueueDoesNotExist",
        ] {
            let reason = permanent(service(code, "The specified queue does not exist.", 400));
            assert!(reason.starts_with("no_queue: "), "{reason}");
            assert!(reason.contains(STANDARD), "{reason}");
        }
        for code in [
            "InvalidMessageContents",
            "InvalidParameterValue",
            "AccessDenied",
            "InvalidClientTokenId",
            "SignatureDoesNotMatch",
            "KMS.AccessDeniedException",
            "SomethingNew",
        ] {
            let reason = permanent(service(code, "the service's words", 400));
            assert_eq!(
                reason,
                format!("SQS refused the message: {code}: the service's words")
            );
        }
        let large = service(
            "InvalidParameterValue",
            "One or more parameters are invalid. Reason: Message must be shorter than 262144 bytes.",
            400,
        );
        assert!(permanent(large).starts_with("too_large: "));
        for (code, status) in [
            ("ThrottlingException", 400),
            ("RequestThrottled", 403),
            ("KMS.ThrottlingException", 400),
            ("ServiceUnavailable", 503),
            ("InternalError", 500),
            ("ExpiredToken", 403),
            ("SomethingNew", 502),
        ] {
            assert_eq!(service(code, "wait", status).label(), "retry", "{code}");
        }
        let bare = service_outcome(STANDARD, None, None, 404);
        assert!(permanent(bare).contains("404"));
        assert_eq!(service_outcome(STANDARD, None, None, 500).label(), "retry");
    }

    #[test]
    fn no_answer_from_sqs_is_a_retry() {
        type Error = SdkError<SendMessageBatchError, HttpResponse>;
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        for error in [
            Error::timeout_error("operation timed out"),
            Error::dispatch_failure(ConnectorError::io(Box::new(refused))),
            Error::construction_failure("no credentials"),
        ] {
            let outcome = send_outcome(STANDARD, &error);
            assert_eq!(outcome.label(), "retry", "{outcome:?}");
        }
    }
}
