//! Sinks: where delivered hooks go. The pipeline hands a sink one [`Message`] per attempt
//! and gets back one closed [`Outcome`]; only the outcome decides between delivered, retry
//! and the dead-letter queue.
//!
//! A sink never blocks the pipeline executor that calls it: blocking clients (the HTTP
//! sink's `ureq`) run on a bounded [`shards::BlockingPool`], clients bound to tokio on the
//! [`io::SinkIo`] runtime, and the returned future only waits for their answer.
//!
//! - [`http`]: HTTP POST with the `x-ankusa-*` metadata headers and optional Standard
//!   Webhooks signing.
//! - [`redis`]: XADD to a stream (metadata as fields) or LPUSH of the body to a list.
//! - [`nats`]: JetStream publish acknowledged by the stream, `Nats-Msg-Id` for dedupe.
//! - [`rabbitmq`]: persistent publish with publisher confirms, metadata as AMQP headers.
//! - [`kafka`]: idempotent produce, `acks=all`, the delivery report decides; metadata as
//!   record headers, the ordering key as the record key.
//! - [`sqs`]: SendMessage to a standard or FIFO queue (group = ordering key, dedupe id =
//!   idempotency key), metadata as message attributes.
//! - [`pubsub`]: Google Pub/Sub REST publish, metadata as attributes, orderingKey.

pub mod batch;
pub mod http;
pub mod io;
pub mod kafka;
pub mod nats;
pub mod pubsub;
pub mod rabbitmq;
pub mod redis;
pub mod sqs;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use shards::BlockingPool;

use crate::config::{SinkEntry, SinkKind};
use crate::store::codec::HookRecord;

/// `ankusa_message_version` of the outbound contract (DESIGN section 3).
pub const MESSAGE_VERSION: &str = "1";

/// Everything a sink needs to send one attempt of one hook.
#[derive(Debug, Clone)]
pub struct Message {
    /// The stored hook: body and the provider headers the store_headers policy kept.
    pub hook: Arc<HookRecord>,
    pub context: SinkContext,
}

/// Metadata of one attempt, sent along as headers or message attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkContext {
    pub tenant_id: String,
    pub source_id: String,
    pub sink_id: String,
    pub seq: u64,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Stable per hook and sink across attempts and restarts: the consumer's dedupe key.
    pub idempotency_key: String,
    pub received_at_ms: u64,
    /// The lane's key in ordered mode (ordering lanes); `None` when unordered.
    pub ordering_key: Option<String>,
    /// Hex of the lane id, for logs; `None` when unordered.
    pub lane: Option<String>,
}

/// The one result of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The destination took the hook.
    Delivered,
    /// Worth trying again later; `retry_after` is the destination's own hint.
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// The destination refused the hook for good: dead-letter it.
    Permanent { reason: String },
}

impl Outcome {
    /// The label of `ankusa_dispatch_attempts_total{outcome}`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Retry { .. } => "retry",
            Outcome::Permanent { .. } => "permanent",
        }
    }
}

/// Where sinks run their I/O: shared by every sink built from one config.
#[derive(Debug, Clone)]
pub struct SinkRuntimes {
    /// Blocking clients (ureq).
    pub pool: Arc<BlockingPool>,
    /// Clients bound to tokio (redis, async-nats, lapin, rdkafka, aws-sdk-sqs).
    pub io: Arc<io::SinkIo>,
}

/// Builds the sink a config entry describes. Connections open on the first attempt, so a
/// destination that is down at startup costs retries, not the start.
pub fn build(entry: &SinkEntry, runtimes: &SinkRuntimes) -> Arc<dyn Sink> {
    match &entry.kind {
        SinkKind::Http(config) => Arc::new(http::HttpSink::new(
            &entry.id,
            config,
            Arc::clone(&runtimes.pool),
        )),
        SinkKind::Redis(config) => Arc::new(redis::RedisSink::new(config, &runtimes.io)),
        SinkKind::Nats(config) => Arc::new(nats::NatsSink::new(config, &runtimes.io)),
        SinkKind::Rabbitmq(config) => Arc::new(rabbitmq::RabbitmqSink::new(config, &runtimes.io)),
        SinkKind::Kafka(config) => Arc::new(kafka::KafkaSink::new(config, &runtimes.io)),
        SinkKind::Sqs(config) => Arc::new(sqs::SqsSink::new(config, &runtimes.io)),
        SinkKind::Pubsub(config) => Arc::new(pubsub::PubsubSink::new(config, runtimes)),
    }
}

/// The outbound contract's metadata for a medium with named attributes, headers or fields
/// (every sink but HTTP, which spells them `x-ankusa-*`), in this fixed order.
/// `ankusa_ordering_key` comes last and only in ordered mode.
pub fn metadata(context: &SinkContext) -> Vec<(&'static str, String)> {
    let mut fields = Vec::with_capacity(8);
    fields.push(("ankusa_message_version", MESSAGE_VERSION.to_owned()));
    fields.push(("ankusa_idempotency_key", context.idempotency_key.clone()));
    fields.push(("ankusa_tenant", context.tenant_id.clone()));
    fields.push(("ankusa_source", context.source_id.clone()));
    fields.push(("ankusa_seq", context.seq.to_string()));
    fields.push(("ankusa_received_at", context.received_at_ms.to_string()));
    fields.push(("ankusa_attempt", context.attempt.to_string()));
    if let Some(key) = &context.ordering_key {
        fields.push(("ankusa_ordering_key", key.clone()));
    }
    fields
}

/// The provider's `content-type` when the source's store_headers kept it.
pub fn content_type(hook: &HookRecord) -> Option<&[u8]> {
    hook.headers
        .iter()
        .find(|(name, _)| name == "content-type")
        .map(|(_, value)| value.as_slice())
}

pub type OutcomeFuture = Pin<Box<dyn Future<Output = Outcome>>>;

/// A destination. Built once at startup from its config entry and shared by every
/// pipeline core, so it must be `Send + Sync`; the future it returns runs on the calling
/// core and need not be `Send`.
pub trait Sink: Send + Sync {
    /// The sink kind, a bounded metric label: `http`, `kafka`, …
    fn kind(&self) -> &'static str;

    /// Sends one attempt. Must not block the calling thread.
    fn deliver(&self, message: Message) -> OutcomeFuture;
}
