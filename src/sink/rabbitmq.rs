//! The RabbitMQ sink: a publish on a confirm-mode channel that counts as delivered once the
//! broker confirms it (`basic.ack`); persistent messages (delivery mode 2) by default, so
//! a confirm means the broker has it on disk for durable queues. The metadata travels as
//! AMQP headers, the idempotency key also as `message_id`.
//!
//! One connection and one channel per sink, opened by the first attempt; concurrent
//! attempts share the channel (confirms are matched per publish). A channel the broker
//! closed (an unknown exchange closes it) or a dropped connection is reopened by the next
//! attempt.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::io::SinkIo;
use super::{content_type, metadata, Message, Outcome, OutcomeFuture, Sink};
use crate::config::RabbitmqSink as Config;

/// Delivery mode 2: the broker writes the message to disk (durable queues).
const PERSISTENT: u8 = 2;

pub struct RabbitmqSink {
    target: Arc<Target>,
    io: Arc<SinkIo>,
    timeout: Duration,
}

impl std::fmt::Debug for RabbitmqSink {
    // By hand: the URL holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitmqSink")
            .field("exchange", &self.target.config.exchange)
            .field("routing_key", &self.target.config.routing_key)
            .finish_non_exhaustive()
    }
}

struct Target {
    config: Config,
    /// `None` until the first attempt connects, and again after the connection dropped.
    open: Mutex<Option<Open>>,
}

struct Open {
    /// Held so the connection lives as long as its channel.
    connection: Connection,
    channel: Channel,
}

impl RabbitmqSink {
    pub fn new(config: &Config, io: &Arc<SinkIo>) -> RabbitmqSink {
        RabbitmqSink {
            target: Arc::new(Target {
                config: config.clone(),
                open: Mutex::new(None),
            }),
            io: Arc::clone(io),
            timeout: Duration::from_millis(config.confirm_timeout_ms),
        }
    }
}

impl Sink for RabbitmqSink {
    fn kind(&self) -> &'static str {
        "rabbitmq"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let target = Arc::clone(&self.target);
        self.io
            .attempt(self.timeout, async move { target.send(&message).await })
    }
}

impl Target {
    async fn send(&self, message: &Message) -> Outcome {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(error) => return retry(format!("cannot open a RabbitMQ channel: {error}")),
        };
        let published = channel
            .basic_publish(
                ShortString::from(self.config.exchange.as_str()),
                ShortString::from(self.config.routing_key.as_str()),
                BasicPublishOptions {
                    mandatory: self.config.mandatory,
                    ..BasicPublishOptions::default()
                },
                &message.hook.body,
                properties(&self.config, message),
            )
            .await;
        let confirmed = match published {
            Ok(confirm) => confirm.await,
            Err(error) => Err(error),
        };
        match confirmed {
            Ok(Confirmation::Ack(None)) => Outcome::Delivered,
            Ok(Confirmation::Ack(Some(returned))) => Outcome::Permanent {
                reason: format!(
                    "unroutable: no queue is bound for routing key {:?} on exchange {:?} \
                     ({} {})",
                    self.config.routing_key,
                    self.config.exchange,
                    returned.reply_code,
                    returned.reply_text
                ),
            },
            Ok(Confirmation::Nack(_)) => {
                retry("the broker refused to take the message (nack)".into())
            }
            // Confirm mode is selected on every channel this sink opens.
            Ok(Confirmation::NotRequested) => retry("the channel is not in confirm mode".into()),
            Err(error) => error_outcome(&self.config, &error),
        }
    }

    /// The open channel, or a new one (on a new connection when the old one dropped).
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut open = self.open.lock().await;
        if let Some(current) = open.as_ref() {
            if current.channel.status().connected() {
                return Ok(current.channel.clone());
            }
        }
        let connection = match open.take() {
            Some(current) if current.connection.status().connected() => current.connection,
            _ => Connection::connect(&self.config.url, ConnectionProperties::default()).await?,
        };
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        *open = Some(Open {
            connection,
            channel: channel.clone(),
        });
        Ok(channel)
    }
}

/// Persistence, the idempotency key as `message_id`, the content type when stored, the
/// received time, and the metadata as headers.
fn properties(config: &Config, message: &Message) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in metadata(&message.context) {
        headers.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    }
    let mut properties = BasicProperties::default()
        .with_headers(headers)
        .with_message_id(ShortString::from(message.context.idempotency_key.as_str()))
        .with_timestamp(message.context.received_at_ms / 1_000);
    if config.persistent {
        properties = properties.with_delivery_mode(PERSISTENT);
    }
    if let Some(value) = content_type(&message.hook).and_then(|v| std::str::from_utf8(v).ok()) {
        properties = properties.with_content_type(ShortString::from(value));
    }
    properties
}

/// The broker's definitive refusals (no such exchange, access refused, a message over its
/// size limit) would refuse every later attempt; a dropped connection or channel, a
/// missed heartbeat or a broker shutting down may pass later.
fn error_outcome(config: &Config, error: &lapin::Error) -> Outcome {
    if let lapin::ErrorKind::ProtocolError(amqp) = error.kind() {
        let permanent = match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => Some(format!(
                "no_exchange: the broker has no exchange {:?} ({amqp})",
                config.exchange
            )),
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => {
                Some(format!("access refused by the broker ({amqp})"))
            }
            AMQPErrorKind::Soft(AMQPSoftError::CONTENTTOOLARGE) => {
                Some(format!("too_large: {amqp}"))
            }
            // RabbitMQ closes the channel with PRECONDITION_FAILED for a message over its
            // `max_message_size`.
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
                if amqp.get_message().as_str().contains("max size") =>
            {
                Some(format!("too_large: {amqp}"))
            }
            _ => None,
        };
        if let Some(reason) = permanent {
            return Outcome::Permanent { reason };
        }
    }
    retry(format!("RabbitMQ: {error}"))
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
    use lapin::protocol::{AMQPError, AMQPHardError};

    fn config() -> Config {
        Config {
            url: "amqp://127.0.0.1".into(),
            exchange: "events".into(),
            routing_key: "hooks".into(),
            persistent: true,
            mandatory: true,
            confirm_timeout_ms: 1_000,
        }
    }

    fn broker(kind: AMQPErrorKind, text: &str) -> Outcome {
        let error = lapin::Error::from(lapin::ErrorKind::ProtocolError(AMQPError::new(
            kind,
            ShortString::from(text),
        )));
        error_outcome(&config(), &error)
    }

    fn reason(outcome: Outcome) -> String {
        match outcome {
            Outcome::Permanent { reason } => reason,
            other => panic!("not permanent: {other:?}"),
        }
    }

    #[test]
    fn the_brokers_refusals_are_permanent_the_rest_retry() {
        let missing = broker(
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
            "NOT_FOUND - no exchange 'events' in vhost '/'",
        );
        assert!(reason(missing).starts_with("no_exchange: "));
        let denied = broker(
            AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
            "ACCESS_REFUSED",
        );
        assert!(reason(denied).starts_with("access refused"));
        let large = broker(
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            "PRECONDITION_FAILED - message size 20000000 is larger than configured max size 16777216",
        );
        assert!(reason(large).starts_with("too_large: "));
        // Another precondition (say, a queue argument mismatch) may be fixed by an operator.
        let other = broker(
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED),
            "PRECONDITION_FAILED - inequivalent arg",
        );
        assert_eq!(other.label(), "retry");
        let closing = broker(
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
            "CONNECTION_FORCED - broker forced connection closure",
        );
        assert_eq!(closing.label(), "retry");
        let io = lapin::Error::from(lapin::ErrorKind::IOError(std::sync::Arc::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        )));
        assert_eq!(error_outcome(&config(), &io).label(), "retry");
    }
}
