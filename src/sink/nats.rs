//! The NATS sink: a JetStream publish that counts as delivered once the stream's ack
//! arrives, with the metadata as message headers and the idempotency key as `Nats-Msg-Id`,
//! so a redelivery inside the stream's duplicate window is stored once. With
//! `jetstream: false` it publishes on core NATS and counts the server's receipt (a flush)
//! as delivery: nothing persists it, which docs/delivery.md spells out.
//!
//! One client per sink, connected by the first attempt and reconnecting by itself after.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, ServerAddr};
use bytes::Bytes;
use tokio::sync::OnceCell;

use super::io::SinkIo;
use super::{content_type, metadata, Message, Outcome, OutcomeFuture, Sink};
use crate::config::NatsSink as Config;
use crate::store::codec::HookRecord;

/// The header JetStream dedupes on.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
pub const CONTENT_TYPE_HEADER: &str = "Content-Type";

pub struct NatsSink {
    target: Arc<Target>,
    io: Arc<SinkIo>,
    timeout: Duration,
}

impl std::fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSink")
            .field("subject", &self.target.config.subject)
            .field("jetstream", &self.target.config.jetstream)
            .finish_non_exhaustive()
    }
}

struct Target {
    config: Config,
    timeout: Duration,
    connection: OnceCell<Connection>,
}

struct Connection {
    client: async_nats::Client,
    jetstream: async_nats::jetstream::Context,
}

impl NatsSink {
    pub fn new(config: &Config, io: &Arc<SinkIo>) -> NatsSink {
        let timeout = Duration::from_millis(config.timeout_ms);
        NatsSink {
            target: Arc::new(Target {
                config: config.clone(),
                timeout,
                connection: OnceCell::new(),
            }),
            io: Arc::clone(io),
            timeout,
        }
    }
}

impl Sink for NatsSink {
    fn kind(&self) -> &'static str {
        "nats"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let target = Arc::clone(&self.target);
        self.io
            .attempt(self.timeout, async move { target.send(&message).await })
    }
}

/// The stored body as a `Bytes` without a copy.
struct Body(Arc<HookRecord>);

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        &self.0.body
    }
}

impl Target {
    async fn send(&self, message: &Message) -> Outcome {
        let connection = match self.connection.get_or_try_init(|| self.connect()).await {
            Ok(connection) => connection,
            Err(reason) => {
                return Outcome::Retry {
                    reason,
                    retry_after: None,
                }
            }
        };
        let headers = headers(message);
        let payload = Bytes::from_owner(Body(Arc::clone(&message.hook)));
        let subject = self.config.subject.clone();
        if !self.config.jetstream {
            let published = connection
                .client
                .publish_with_headers(subject, headers, payload)
                .await;
            return match published {
                Ok(()) => match connection.client.flush().await {
                    Ok(()) => Outcome::Delivered,
                    Err(error) => retry(format!("NATS flush: {error}")),
                },
                Err(error) => match error.kind() {
                    async_nats::client::PublishErrorKind::MaxPayloadExceeded => too_large(&error),
                    _ => retry(format!("NATS publish: {error}")),
                },
            };
        }
        let publish = PublishMessage::build().payload(payload).headers(headers);
        let acked = match connection.jetstream.send_publish(subject, publish).await {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match acked {
            Ok(_) => Outcome::Delivered,
            Err(error) => publish_outcome(&error),
        }
    }

    async fn connect(&self) -> Result<Connection, String> {
        let mut options = async_nats::ConnectOptions::new()
            .name("ankusa")
            .connection_timeout(self.timeout)
            .request_timeout(Some(self.timeout));
        if let Some(path) = &self.config.credentials_file {
            options = options.credentials_file(path).await.map_err(|error| {
                format!("cannot read NATS credentials {}: {error}", path.display())
            })?;
        }
        let servers = self
            .config
            .url
            .split(',')
            .map(|server| server.trim().parse::<ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| format!("NATS server address: {error}"))?;
        let client = options
            .connect(servers)
            .await
            .map_err(|error| format!("cannot connect to NATS: {error}"))?;
        let mut jetstream = async_nats::jetstream::new(client.clone());
        jetstream.set_timeout(self.timeout);
        Ok(Connection { client, jetstream })
    }
}

/// `Nats-Msg-Id`, the content type when stored, then the metadata.
fn headers(message: &Message) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(MSG_ID_HEADER, message.context.idempotency_key.as_str());
    if let Some(value) = content_type(&message.hook).and_then(|v| std::str::from_utf8(v).ok()) {
        headers.insert(CONTENT_TYPE_HEADER, value);
    }
    for (name, value) in metadata(&message.context) {
        headers.insert(name, value.as_str());
    }
    headers
}

/// No stream takes the subject, or the message exceeds the server's `max_payload`: every
/// later attempt would be refused the same way. The rest (no ack in time, a dropped
/// connection, a stream at its limits) may pass later.
fn publish_outcome(error: &PublishError) -> Outcome {
    match error.kind() {
        PublishErrorKind::StreamNotFound => Outcome::Permanent {
            reason: format!("no_stream: no JetStream stream takes this subject ({error})"),
        },
        PublishErrorKind::MaxPayloadExceeded => too_large(error),
        _ => retry(format!("JetStream publish: {error}")),
    }
}

fn too_large(error: &dyn std::fmt::Display) -> Outcome {
    Outcome::Permanent {
        reason: format!("too_large: {error}"),
    }
}

fn retry(reason: String) -> Outcome {
    Outcome::Retry {
        reason,
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_stream_and_an_oversized_message_are_permanent_the_rest_retry() {
        let outcome = publish_outcome(&PublishError::new(PublishErrorKind::StreamNotFound));
        let Outcome::Permanent { reason } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(reason.starts_with("no_stream: "), "{reason}");
        let outcome = publish_outcome(&PublishError::new(PublishErrorKind::MaxPayloadExceeded));
        let Outcome::Permanent { reason } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(reason.starts_with("too_large: "), "{reason}");
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::MaxAckPending,
            PublishErrorKind::Other,
        ] {
            assert_eq!(
                publish_outcome(&PublishError::new(kind)).label(),
                "retry",
                "{kind:?}"
            );
        }
    }
}
