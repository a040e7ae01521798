//! The Kafka sink against librdkafka's mock cluster: real Kafka brokers speaking the wire
//! protocol on loopback, run inside this test process, so Kafka needs no service of its own.
//! The gateway, a separate process, produces to them; the test reads back with rdkafka's
//! own consumer.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

use super::*;
use crate::common::services::unique_name;

/// One record as read back: where it sat and what it carried.
#[derive(Debug, Clone)]
struct Record {
    partition: i32,
    key: Option<Vec<u8>>,
    body: Vec<u8>,
    headers: BTreeMap<String, String>,
    /// How many times each header name occurred.
    header_counts: BTreeMap<String, usize>,
}

impl Record {
    fn read(message: &BorrowedMessage<'_>) -> Record {
        let mut headers = BTreeMap::new();
        let mut header_counts = BTreeMap::new();
        if let Some(list) = message.headers() {
            for header in list.iter() {
                let value = String::from_utf8(header.value.unwrap_or_default().to_vec()).unwrap();
                *header_counts.entry(header.key.to_owned()).or_insert(0) += 1;
                headers.insert(header.key.to_owned(), value);
            }
        }
        Record {
            partition: message.partition(),
            key: message.key().map(<[u8]>::to_vec),
            body: message.payload().unwrap_or_default().to_vec(),
            headers,
            header_counts,
        }
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        self.headers
            .iter()
            .filter(|(name, _)| name.starts_with("ankusa_"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }

    fn seq(&self) -> u64 {
        self.headers["ankusa_seq"].parse().unwrap()
    }
}

/// A mock cluster of one broker and a topic on it.
struct Kafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
    topic: String,
    partitions: i32,
}

impl Kafka {
    fn start(prefix: &str, partitions: i32) -> Kafka {
        let cluster = MockCluster::new(1).unwrap();
        let topic = unique_name(prefix);
        cluster.create_topic(&topic, partitions, 1).unwrap();
        Kafka {
            cluster,
            topic,
            partitions,
        }
    }

    fn brokers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// Every record of the topic, partition by partition in offset order, read until
    /// `count` are there (or fails after [`WAIT`]), then for a short while longer so a
    /// duplicate would show.
    fn records(&self, count: usize) -> Vec<Record> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.brokers())
            .set("group.id", unique_name("reader"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut assignment = TopicPartitionList::new();
        for partition in 0..self.partitions {
            assignment
                .add_partition_offset(&self.topic, partition, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let mut records = Vec::new();
        let mut settle = None;
        wait_until(&format!("{count} records in {}", self.topic), || {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(message)) => records.push(Record::read(&message)),
                Some(Err(error)) => panic!("consumer: {error}"),
                None => {}
            }
            if records.len() >= count {
                let since = settle.get_or_insert_with(std::time::Instant::now);
                return (since.elapsed() > Duration::from_millis(500)).then_some(());
            }
            None
        });
        // Per partition, in offset order (poll interleaves partitions).
        records.sort_by_key(|record| record.partition);
        records
    }
}

#[test]
fn kafka_gets_body_and_headers() {
    let kafka = Kafka::start("kafka-headers", 1);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: kafka, brokers: '{}', topic: '{}'}}",
            kafka.brokers(),
            kafka.topic
        ),
    );
    let mut posted = post_orders(&server, 12, 3);
    // Not UTF-8, not JSON: the bytes arrive as they were posted.
    let binary: Vec<u8> = (0..=255u8).rev().collect();
    post(&server, &binary, "application/octet-stream");
    posted.push(Posted {
        body: binary,
        content_type: "application/octet-stream",
        customer: String::new(),
        n: 12,
    });

    let records = kafka.records(posted.len());
    assert_eq!(records.len(), posted.len(), "each hook once");
    let mut seqs = Vec::new();
    for record in &records {
        let hook = posted
            .iter()
            .find(|hook| hook.body == record.body)
            .unwrap_or_else(|| panic!("a record whose body was never posted: {record:?}"));
        assert_eq!(
            record.headers["content_type"], hook.content_type,
            "{record:?}"
        );
        assert_eq!(record.key, None, "unordered records have no key");
        assert!(
            record.header_counts.values().all(|&count| count == 1),
            "each header once: {record:?}"
        );
        assert_metadata(&record.metadata(), "kafka", None);
        seqs.push(record.seq());
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), posted.len(), "distinct seqs: {seqs:?}");
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn kafka_ordered_keys_records_and_keeps_each_keys_order() {
    let kafka = Kafka::start("kafka-ordered", 4);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: kafka, brokers: '{}', topic: '{}', ordered: true, ordering_key: {{json: customer}}}}",
            kafka.brokers(),
            kafka.topic
        ),
    );
    let posted = post_orders(&server, 160, 8);
    let records = kafka.records(posted.len());
    assert_eq!(records.len(), posted.len(), "each hook once");
    let mut partition_of: BTreeMap<String, i32> = BTreeMap::new();
    for record in &records {
        let body: Value = serde_json::from_slice(&record.body).unwrap();
        let customer = body["customer"].as_str().unwrap();
        assert_eq!(
            record.key.as_deref(),
            Some(customer.as_bytes()),
            "the record key is the ordering key"
        );
        assert_metadata(&record.metadata(), "kafka", Some(customer));
        let partition = *partition_of
            .entry(customer.to_owned())
            .or_insert(record.partition);
        assert_eq!(
            partition, record.partition,
            "one key, one partition: {customer}"
        );
    }
    assert!(
        partition_of
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1,
        "8 keys over 4 partitions use more than one: {partition_of:?}"
    );
    let bodies: Vec<Vec<u8>> = records.iter().map(|record| record.body.clone()).collect();
    assert_eq!(
        per_customer(&bodies),
        expected_per_customer(&posted),
        "each key's records in its partition in the order the hooks were posted"
    );
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn kafka_outage_is_retried_then_delivered() {
    let kafka = Kafka::start("kafka-outage", 1);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: kafka, brokers: '{}', topic: '{}', timeout_ms: 1000}}",
            kafka.brokers(),
            kafka.topic
        ),
    );
    let before = post_orders(&server, 5, 1);
    kafka.records(5);

    kafka.cluster.broker_down(1).unwrap();
    let during: Vec<Posted> = (5..15)
        .map(|n| {
            let body = format!(r#"{{"customer":"c0","n":{n}}}"#).into_bytes();
            post(&server, &body, "application/json");
            Posted {
                body,
                content_type: "application/json",
                customer: "c0".into(),
                n,
            }
        })
        .collect();
    wait_until("retried attempts while the broker is down", || {
        (counter(
            &server,
            "ankusa_dispatch_attempts_total",
            &["outcome=\"retry\""],
        ) >= 3.0)
            .then_some(())
    });
    kafka.cluster.broker_up(1).unwrap();
    wait_delivered(&server, 15);
    assert_none_dead(&server);
    assert_eq!(server.stop().code(), Some(0));

    // At least once: a record whose report was lost to the outage may be there twice, but
    // every hook is there.
    let records = kafka.records(15);
    let mut bodies: Vec<Vec<u8>> = records.iter().map(|record| record.body.clone()).collect();
    bodies.sort();
    bodies.dedup();
    let mut expected: Vec<Vec<u8>> = before
        .iter()
        .chain(&during)
        .map(|hook| hook.body.clone())
        .collect();
    expected.sort();
    assert_eq!(bodies, expected, "every hook reached the topic");
}

#[test]
fn kafka_refusals_dead_letter_with_the_reason() {
    let kafka = Kafka::start("kafka-refusals", 1);
    let missing = unique_name("kafka-missing");
    // The broker answers every request about this topic: it does not exist.
    kafka
        .cluster
        .topic_error(
            &missing,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let brokers = kafka.brokers();
    let server = start(
        dir.path(),
        &format!(
            "- {{id: missing, kind: kafka, brokers: '{brokers}', topic: '{missing}', timeout_ms: 2000}}
             - {{id: small, kind: kafka, brokers: '{brokers}', topic: '{}', client: {{message.max.bytes: 4096}}}}",
            kafka.topic
        ),
    );
    let big = vec![b'x'; 8192];
    post(&server, &big, "application/octet-stream");
    post(&server, br#"{"customer":"c0","n":1}"#, "application/json");

    // Both hooks dead-letter from `missing`, the big one from `small` too.
    let dead = wait_dead(&server, 3);
    let reasons: Vec<(String, String)> = dead
        .iter()
        .map(|item| {
            (
                item["sink"].as_str().unwrap().to_owned(),
                item["last_error"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    for item in &dead {
        assert_eq!(item["attempts"], 1, "refused at once, not retried: {item}");
    }
    assert_eq!(
        reasons
            .iter()
            .filter(|(sink, reason)| sink == "missing" && reason.starts_with("no_topic"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|(sink, reason)| sink == "small" && reason.starts_with("too_large"))
            .count(),
        1,
        "{reasons:?}"
    );
    // The small hook reached the topic; the big one never did.
    let records = kafka.records(1);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].body, br#"{"customer":"c0","n":1}"#);
    assert_eq!(server.stop().code(), Some(0));
}
