//! The Kafka sink: one record per hook through librdkafka's producer, the body as the
//! value, the metadata as record headers and, in ordered mode, the ordering key as the
//! record key, so the partitioner puts one key's records on one partition in order.
//!
//! The delivery report decides the outcome: a record counts as delivered only once the
//! broker acknowledged it (`acks: all` by default, with the idempotent producer, so the
//! producer's own retries never write a record twice). librdkafka batches the records of
//! concurrent attempts by itself (with `linger.ms` 0 unless the config sets it: see
//! `client_config`), and the pipeline never has two hooks of one lane in flight, so
//! batching cannot reorder a key.
//!
//! The producer is made by the first attempt and shared by every later one; a fatal
//! producer error (the idempotent producer's sequence broken) discards it, so the next
//! attempt starts a fresh one.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;

use super::io::{SinkIo, CLIENT_TIMEOUT_SLACK};
use super::{content_type, metadata, Message, Outcome, OutcomeFuture, Sink};
use crate::config::{KafkaAcks, KafkaSink as Config};

/// The record header that carries the provider's content type.
pub const CONTENT_TYPE_HEADER: &str = "content_type";

pub struct KafkaSink {
    target: Arc<Target>,
    io: Arc<SinkIo>,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaSink {
    // By hand: the client settings may hold SASL passwords.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.target.config.brokers)
            .field("topic", &self.target.config.topic)
            .finish_non_exhaustive()
    }
}

struct Target {
    config: Config,
    producer: Mutex<Option<FutureProducer>>,
}

impl KafkaSink {
    pub fn new(config: &Config, io: &Arc<SinkIo>) -> KafkaSink {
        KafkaSink {
            target: Arc::new(Target {
                config: config.clone(),
                producer: Mutex::new(None),
            }),
            io: Arc::clone(io),
            timeout: Duration::from_millis(config.timeout_ms) + CLIENT_TIMEOUT_SLACK,
        }
    }
}

impl Sink for KafkaSink {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn deliver(&self, message: Message) -> OutcomeFuture {
        let target = Arc::clone(&self.target);
        self.io
            .attempt(self.timeout, async move { target.send(&message).await })
    }
}

impl Target {
    async fn send(&self, message: &Message) -> Outcome {
        let producer = match self.producer() {
            Ok(producer) => producer,
            Err(error) => {
                return Outcome::Retry {
                    reason: format!("kafka producer: {error}"),
                    retry_after: None,
                }
            }
        };
        let headers = headers(message);
        let mut record = FutureRecord::<str, [u8]>::to(&self.config.topic)
            .payload(&message.hook.body)
            .headers(headers);
        if let Some(key) = &message.context.ordering_key {
            record = record.key(key.as_str());
        }
        // Enqueueing copies the record into librdkafka; a full local queue is a retry.
        let report = match producer.send_result(record) {
            Ok(report) => report,
            Err((error, _)) => return self.failed(&producer, &error, message),
        };
        match report.await {
            Ok(Ok(_delivery)) => Outcome::Delivered,
            Ok(Err((error, _))) => self.failed(&producer, &error, message),
            // The producer went away with the record (a reload or a fatal error).
            Err(_canceled) => Outcome::Retry {
                reason: "kafka producer closed before the delivery report".into(),
                retry_after: None,
            },
        }
    }

    /// The shared producer, made on first use. Creating one does not wait on the network,
    /// so holding the lock for it never stalls an attempt on a broker.
    fn producer(&self) -> Result<FutureProducer, KafkaError> {
        let mut slot = self.producer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(producer) = slot.as_ref() {
            return Ok(producer.clone());
        }
        let producer: FutureProducer = client_config(&self.config).create()?;
        *slot = Some(producer.clone());
        Ok(producer)
    }

    fn failed(&self, producer: &FutureProducer, error: &KafkaError, message: &Message) -> Outcome {
        if let Some((code, reason)) = producer.client().fatal_error() {
            // Only a new producer (a new producer id) can send again.
            let mut slot = self.producer.lock().unwrap_or_else(PoisonError::into_inner);
            *slot = None;
            return Outcome::Retry {
                reason: format!(
                    "kafka producer failed fatally ({code:?}: {reason}); restarting it"
                ),
                retry_after: None,
            };
        }
        classify(error, message.hook.body.len(), &self.config.topic)
    }
}

/// librdkafka's settings for one sink: Ankusa's own first, then the `client:` map (which
/// validation kept free of the ones set here).
pub fn client_config(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("client.id", "ankusa")
        .set("compression.type", &config.compression)
        .set("message.timeout.ms", config.timeout_ms.to_string())
        // A missing topic fails its records with UnknownTopic within the attempt's time
        // instead of waiting librdkafka's default 30 s past it.
        .set(
            "topic.metadata.propagation.max.ms",
            (config.timeout_ms / 2).max(1).to_string(),
        );
    match config.acks {
        KafkaAcks::All => client.set("acks", "all").set("enable.idempotence", "true"),
        KafkaAcks::Leader => client.set("acks", "1").set("enable.idempotence", "false"),
    };
    // No linger unless the config asks for one: the pipeline has at most sink_concurrency
    // attempts of a (tenant, sink) in flight, so each record would wait out librdkafka's
    // 5 ms default for company that rarely comes (100,000 hooks drained at 1,424/s with it,
    // 18,300/s without, in one bench-gate drain sitting). Set only when the map names
    // neither spelling: ClientConfig is a map, and of two spellings either could win.
    let lingers = ["linger.ms", "queue.buffering.max.ms"];
    if !config
        .client
        .iter()
        .any(|(name, _)| lingers.contains(&name.as_str()))
    {
        client.set("linger.ms", "0");
    }
    for (name, value) in &config.client {
        client.set(name, value);
    }
    client
}

/// The metadata of the outbound contract and the provider's content type, as record
/// headers.
fn headers(message: &Message) -> OwnedHeaders {
    let fields = metadata(&message.context);
    let mut headers = OwnedHeaders::new_with_capacity(fields.len() + 1);
    for (name, value) in &fields {
        headers = headers.insert(Header {
            key: name,
            value: Some(value.as_bytes()),
        });
    }
    if let Some(content_type) = content_type(&message.hook) {
        headers = headers.insert(Header {
            key: CONTENT_TYPE_HEADER,
            value: Some(content_type),
        });
    }
    headers
}

/// Retry or permanent for a failed record. Only the broker's definitive answers about the
/// record or the topic are permanent; everything about reaching the cluster retries.
fn classify(error: &KafkaError, body_len: usize, topic: &str) -> Outcome {
    use RDKafkaErrorCode as Code;
    let permanent = |reason: String| Outcome::Permanent { reason };
    match error.rdkafka_error_code() {
        Some(Code::MessageSizeTooLarge | Code::MessageBatchTooLarge | Code::InvalidMessageSize) => {
            permanent(format!(
                "too_large: the record ({body_len} bytes of body) is over the producer's \
                 message.max.bytes or the topic's max.message.bytes ({error})"
            ))
        }
        Some(Code::UnknownTopic | Code::UnknownTopicOrPartition) => permanent(format!(
            "no_topic: topic {topic:?} does not exist ({error})"
        )),
        Some(Code::InvalidTopic) => permanent(format!("invalid_topic: {topic:?} ({error})")),
        Some(
            Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::SaslAuthenticationFailed
            | Code::Authentication,
        ) => permanent(format!("not_authorized: {error}")),
        Some(Code::InvalidRecord | Code::InvalidMessage | Code::UnsupportedForMessageFormat) => {
            permanent(format!("refused: {error}"))
        }
        _ => Outcome::Retry {
            reason: format!("kafka: {error}"),
            retry_after: None,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            brokers: "127.0.0.1:9092".into(),
            topic: "events".into(),
            acks: KafkaAcks::All,
            compression: "lz4".into(),
            client: vec![("linger.ms".into(), "20".into())],
            timeout_ms: 8000,
        }
    }

    #[test]
    fn acks_all_makes_an_idempotent_producer_and_client_settings_come_last() {
        let client = client_config(&config());
        assert_eq!(client.get("acks"), Some("all"));
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        assert_eq!(client.get("compression.type"), Some("lz4"));
        assert_eq!(client.get("message.timeout.ms"), Some("8000"));
        assert_eq!(
            client.get("topic.metadata.propagation.max.ms"),
            Some("4000")
        );
        assert_eq!(client.get("linger.ms"), Some("20"));
        // librdkafka takes the whole set.
        client.create_native_config().unwrap();
    }

    #[test]
    fn there_is_no_linger_unless_the_client_map_names_one() {
        let plain = client_config(&Config {
            client: Vec::new(),
            ..config()
        });
        assert_eq!(plain.get("linger.ms"), Some("0"));
        let alias = client_config(&Config {
            client: vec![("queue.buffering.max.ms".into(), "7".into())],
            ..config()
        });
        assert_eq!(alias.get("linger.ms"), None);
        assert_eq!(alias.get("queue.buffering.max.ms"), Some("7"));
    }

    #[test]
    fn acks_leader_is_not_idempotent() {
        let client = client_config(&Config {
            acks: KafkaAcks::Leader,
            ..config()
        });
        assert_eq!(client.get("acks"), Some("1"));
        assert_eq!(client.get("enable.idempotence"), Some("false"));
    }

    #[test]
    fn the_brokers_refusals_of_a_record_or_topic_are_permanent_and_the_rest_retry() {
        let outcome = |code| classify(&KafkaError::MessageProduction(code), 10, "events");
        let reason = |outcome: Outcome| match outcome {
            Outcome::Permanent { reason } => reason,
            other => panic!("expected permanent, got {other:?}"),
        };
        assert!(reason(outcome(RDKafkaErrorCode::MessageSizeTooLarge)).starts_with("too_large"));
        assert!(reason(outcome(RDKafkaErrorCode::UnknownTopicOrPartition)).starts_with("no_topic"));
        assert!(reason(outcome(RDKafkaErrorCode::UnknownTopic)).starts_with("no_topic"));
        assert!(reason(outcome(RDKafkaErrorCode::TopicAuthorizationFailed))
            .starts_with("not_authorized"));
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::QueueFull,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            assert!(
                matches!(outcome(code), Outcome::Retry { .. }),
                "{code:?} should retry"
            );
        }
    }
}
