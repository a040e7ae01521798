//! Sinks: where delivered hooks go. The pipeline hands a sink one [`Message`] per attempt
//! and gets back one closed [`Outcome`]; only the outcome decides between delivered, retry
//! and the dead-letter queue.
//!
//! A sink never blocks the pipeline executor that calls it: blocking clients (the HTTP
//! sink's `ureq`) run on a bounded [`shards::BlockingPool`] and the returned future only
//! waits for their answer.
//!
//! - [`http`]: HTTP POST with the `x-ankusa-*` metadata headers and optional Standard
//!   Webhooks signing.

pub mod http;

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

/// Builds the sink a config entry describes. Blocking clients share `pool`.
pub fn build(entry: &SinkEntry, pool: &Arc<BlockingPool>) -> Arc<dyn Sink> {
    match &entry.kind {
        SinkKind::Http(config) => {
            Arc::new(http::HttpSink::new(&entry.id, config, Arc::clone(pool)))
        }
    }
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
