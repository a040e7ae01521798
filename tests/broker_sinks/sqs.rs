//! The SQS sink against moto's server on 127.0.0.1:5000, read back with aws-sdk-sqs on a
//! tokio runtime of the test's own. The server gets moto's dummy credentials in its
//! environment (the AWS default chain reads them), and IMDS is off so the chain never
//! waits on a metadata service.

use std::collections::BTreeMap;

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use base64::Engine as _;

use super::*;
use crate::common::proxy::Proxy;
use crate::common::services::{available, unique_name, Service};

const REGION: &str = "us-east-1";

/// The server's environment: moto takes any key, the chain needs one.
const ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

/// The test's own client, straight to moto (never through a proxy).
struct Sqs {
    runtime: tokio::runtime::Runtime,
    client: aws_sdk_sqs::Client,
}

/// One message read back (and deleted from its queue).
#[derive(Debug)]
struct Received {
    body: String,
    /// The String attributes.
    attributes: BTreeMap<String, String>,
    group_id: Option<String>,
    deduplication_id: Option<String>,
}

impl Received {
    /// The body's bytes: decoded when the sink sent it base64.
    fn bytes(&self) -> Vec<u8> {
        match self
            .attributes
            .get("ankusa_body_encoding")
            .map(String::as_str)
        {
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(&self.body)
                .unwrap(),
            Some(other) => panic!("unknown body encoding {other}"),
            None => self.body.as_bytes().to_vec(),
        }
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        self.attributes
            .iter()
            .filter(|(name, _)| name.starts_with("ankusa_") && *name != "ankusa_body_encoding")
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }

    fn seq(&self) -> u64 {
        self.attributes["ankusa_seq"].parse().unwrap()
    }
}

impl Sqs {
    fn connect() -> Sqs {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let config = runtime.block_on(
            aws_config::defaults(BehaviorVersion::latest())
                .region(Region::new(REGION))
                .endpoint_url(Service::Sqs.url())
                .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
                .http_client(http)
                .load(),
        );
        Sqs {
            runtime,
            client: aws_sdk_sqs::Client::new(&config),
        }
    }

    /// A new queue's URL; a FIFO one (`.fifo`) dedupes only on the ids it is sent.
    fn create_queue(&self, prefix: &str, fifo: bool) -> String {
        let mut request = self.client.create_queue();
        if fifo {
            request = request
                .queue_name(format!("{}.fifo", unique_name(prefix)))
                .attributes(QueueAttributeName::FifoQueue, "true")
                .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
        } else {
            request = request.queue_name(unique_name(prefix));
        }
        let created = self.runtime.block_on(request.send()).unwrap();
        created.queue_url().unwrap().to_owned()
    }

    fn delete_queue(&self, url: &str) {
        self.runtime
            .block_on(self.client.delete_queue().queue_url(url).send())
            .unwrap();
    }

    /// How many messages the queue holds, as moto counts them.
    fn count(&self, url: &str) -> u64 {
        let answer = self
            .runtime
            .block_on(
                self.client
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                    .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                    .send(),
            )
            .unwrap();
        let attributes = answer.attributes().unwrap();
        [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        ]
        .iter()
        .map(|name| attributes[name].parse::<u64>().unwrap())
        .sum()
    }

    /// One ReceiveMessage (up to 10, waiting up to `wait_s` for the first), in the queue's
    /// order; what it got is deleted, so a FIFO queue hands out the rest of each group next.
    fn receive(&self, url: &str, wait_s: i32) -> Vec<Received> {
        self.runtime.block_on(async {
            let answer = self
                .client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .wait_time_seconds(wait_s)
                .visibility_timeout(300)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                .message_system_attribute_names(MessageSystemAttributeName::MessageDeduplicationId)
                .send()
                .await
                .unwrap();
            let mut received = Vec::new();
            for message in answer.messages() {
                let mut attributes = BTreeMap::new();
                for (name, value) in message.message_attributes().into_iter().flatten() {
                    assert_eq!(value.data_type(), "String", "{name}: {value:?}");
                    attributes.insert(name.clone(), value.string_value().unwrap().to_owned());
                }
                let system_attributes = message.attributes();
                let system = |name: MessageSystemAttributeName| {
                    system_attributes.and_then(|map| map.get(&name)).cloned()
                };
                received.push(Received {
                    body: message.body().unwrap().to_owned(),
                    attributes,
                    group_id: system(MessageSystemAttributeName::MessageGroupId),
                    deduplication_id: system(MessageSystemAttributeName::MessageDeduplicationId),
                });
                self.client
                    .delete_message()
                    .queue_url(url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
            received
        })
    }

    /// Receives until `count` messages were read, in the order the queue handed them out.
    fn drain(&self, url: &str, count: usize) -> Vec<Received> {
        let mut read = Vec::new();
        wait_until(&format!("{count} messages from {url}"), || {
            read.extend(self.receive(url, 1));
            (read.len() >= count).then_some(())
        });
        read
    }

    /// Nothing more to receive: no message twice, none unexpected.
    fn assert_drained(&self, url: &str) {
        let more = self.receive(url, 1);
        assert!(more.is_empty(), "messages left in {url}: {more:?}");
    }
}

/// A sink of kind sqs for `queue_url`, through `endpoint`, with `extra` YAML keys.
fn sink(queue_url: &str, endpoint: &str, extra: &str) -> String {
    format!(
        "- {{kind: sqs, queue_url: '{queue_url}', region: {REGION}, endpoint: '{endpoint}'{extra}}}"
    )
}

fn find<'p>(posted: &'p [Posted], message: &Received) -> &'p Posted {
    let bytes = message.bytes();
    posted
        .iter()
        .find(|hook| hook.body == bytes)
        .unwrap_or_else(|| panic!("a message whose body was never posted: {message:?}"))
}

#[test]
fn sqs_standard_queue_gets_body_and_attributes() {
    if !available(Service::Sqs, "sqs_standard_queue_gets_body_and_attributes") {
        return;
    }
    let sqs = Sqs::connect();
    let queue = sqs.create_queue("standard", false);
    let dir = tempfile::tempdir().unwrap();
    let server = start_env(dir.path(), &sink(&queue, Service::Sqs.url(), ""), ENV);
    let posted = post_orders(&server, 12, 3);

    let messages = sqs.drain(&queue, posted.len());
    assert_eq!(messages.len(), posted.len(), "each hook once");
    let mut seqs = Vec::new();
    for message in &messages {
        let hook = find(&posted, message);
        assert_eq!(
            message.body.as_bytes(),
            hook.body,
            "the body as posted: {message:?}"
        );
        assert_eq!(message.attributes["content_type"], hook.content_type);
        assert!(!message.attributes.contains_key("ankusa_body_encoding"));
        assert_metadata(&message.metadata(), "sqs", None);
        assert_eq!(message.group_id, None, "a standard queue has no groups");
        assert_eq!(message.deduplication_id, None);
        seqs.push(message.seq());
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), posted.len(), "distinct seqs: {seqs:?}");
    assert_eq!(server.stop().code(), Some(0));
    sqs.assert_drained(&queue);
    sqs.delete_queue(&queue);
}

#[test]
fn sqs_fifo_ordered_groups_by_key_in_posting_order() {
    if !available(
        Service::Sqs,
        "sqs_fifo_ordered_groups_by_key_in_posting_order",
    ) {
        return;
    }
    let sqs = Sqs::connect();
    let queue = sqs.create_queue("ordered", true);
    let dir = tempfile::tempdir().unwrap();
    // One request open at a time: the lanes' heads that wait meanwhile share the next.
    let server = start_env(
        dir.path(),
        &sink(
            &queue,
            Service::Sqs.url(),
            ", ordered: true, ordering_key: {json: customer}, max_in_flight: 1",
        ),
        ENV,
    );
    let posted = post_orders(&server, 60, 4);

    // FIFO receive hands out each group's messages in the order SQS took them.
    let messages = sqs.drain(&queue, posted.len());
    assert_eq!(messages.len(), posted.len());
    for message in &messages {
        let body: Value = serde_json::from_slice(&message.bytes()).unwrap();
        let customer = body["customer"].as_str().unwrap();
        assert_eq!(message.group_id.as_deref(), Some(customer), "{message:?}");
        assert_eq!(
            message.deduplication_id.as_deref(),
            Some(message.attributes["ankusa_idempotency_key"].as_str()),
            "SQS dedupes on the idempotency key"
        );
        assert_metadata(&message.metadata(), "sqs", Some(customer));
    }
    let bodies: Vec<Vec<u8>> = messages.iter().map(Received::bytes).collect();
    assert_eq!(
        per_customer(&bodies),
        expected_per_customer(&posted),
        "each key's hooks in its group in the order they were posted"
    );
    let (requests, sent) = batches(&server, "sqs");
    assert_eq!(sent, 60.0, "each hook sent once");
    assert!(
        requests < sent,
        "{requests} SendMessageBatch requests for {sent} messages: none held two"
    );
    assert_eq!(server.stop().code(), Some(0));
    sqs.assert_drained(&queue);
    sqs.delete_queue(&queue);
}

#[test]
fn sqs_fifo_unordered_groups_by_source() {
    if !available(Service::Sqs, "sqs_fifo_unordered_groups_by_source") {
        return;
    }
    let sqs = Sqs::connect();
    let queue = sqs.create_queue("unordered", true);
    let dir = tempfile::tempdir().unwrap();
    let server = start_env(dir.path(), &sink(&queue, Service::Sqs.url(), ""), ENV);
    let posted = post_orders(&server, 10, 2);

    let messages = sqs.drain(&queue, posted.len());
    assert_eq!(messages.len(), posted.len());
    for message in &messages {
        find(&posted, message);
        assert_eq!(message.group_id.as_deref(), Some("acme/orders"));
        assert_eq!(
            message.deduplication_id.as_deref(),
            Some(message.attributes["ankusa_idempotency_key"].as_str())
        );
        assert_metadata(&message.metadata(), "sqs", None);
    }
    assert_eq!(server.stop().code(), Some(0));
    sqs.assert_drained(&queue);
    sqs.delete_queue(&queue);
}

#[test]
fn sqs_outage_is_retried_then_delivered() {
    if !available(Service::Sqs, "sqs_outage_is_retried_then_delivered") {
        return;
    }
    let sqs = Sqs::connect();
    // FIFO: an attempt abandoned at its timeout that SQS still took (moto under load) and
    // its resend are one message, deduped on the idempotency key, so the count is exact.
    let queue = sqs.create_queue("outage", true);
    let proxy = Proxy::start(Service::Sqs.addr());
    let dir = tempfile::tempdir().unwrap();
    let server = start_env(
        dir.path(),
        &sink(
            &queue,
            &format!("http://{}", proxy.addr()),
            ", timeout_ms: 1000",
        ),
        ENV,
    );
    let before = post_orders(&server, 5, 1);
    wait_delivered(&server, 5);
    assert_eq!(sqs.count(&queue), 5);

    let during = post_during_outage(&server, &proxy);
    assert_eq!(sqs.count(&queue), 5, "nothing reaches SQS while it is down");

    proxy.up();
    wait_delivered(&server, 15);
    assert_none_dead(&server);
    assert_eq!(server.stop().code(), Some(0));

    let messages = sqs.drain(&queue, 15);
    assert_eq!(messages.len(), 15, "each hook exactly once");
    let mut bodies: Vec<Vec<u8>> = messages.iter().map(Received::bytes).collect();
    bodies.sort();
    let mut expected: Vec<Vec<u8>> = before
        .iter()
        .chain(&during)
        .map(|hook| hook.body.clone())
        .collect();
    expected.sort();
    assert_eq!(
        bodies, expected,
        "the queue holds each body once, as posted"
    );
    for message in &messages {
        assert_eq!(message.group_id.as_deref(), Some("acme/orders"));
    }
    sqs.assert_drained(&queue);
    sqs.delete_queue(&queue);
}

#[test]
fn sqs_refusals_dead_letter_and_a_binary_body_arrives_as_base64() {
    if !available(
        Service::Sqs,
        "sqs_refusals_dead_letter_and_a_binary_body_arrives_as_base64",
    ) {
        return;
    }
    let sqs = Sqs::connect();
    let queue = sqs.create_queue("refusals", false);
    let missing = format!(
        "{}/123456789012/{}",
        Service::Sqs.url(),
        unique_name("missing")
    );
    let dir = tempfile::tempdir().unwrap();
    let endpoint = Service::Sqs.url();
    let sinks = format!(
        "{}\n{}",
        sink(&missing, endpoint, ", id: missing"),
        sink(&queue, endpoint, ", id: small, max_message_bytes: 1024"),
    );
    let server = start_env(dir.path(), &sinks, ENV);
    let mut posted = post_orders(&server, 2, 1);
    // Not UTF-8: SQS takes no such body as text.
    let binary: Vec<u8> = (0..=255u8).rev().collect();
    post(&server, &binary, "application/octet-stream");
    posted.push(Posted {
        body: binary.clone(),
        content_type: "application/octet-stream",
        customer: String::new(),
        n: 2,
    });
    let big = vec![b'x'; 2_000];
    post(&server, &big, "text/plain");

    // Every hook dead on `missing`, the big one on `small` too.
    let dead = wait_dead(&server, 5);
    assert_eq!(dead.len(), 5, "{dead:?}");
    let messages = sqs.drain(&queue, 3);
    assert_eq!(messages.len(), 3, "the small hooks reach the queue");
    let small_seqs: Vec<u64> = messages.iter().map(Received::seq).collect();
    for message in &messages {
        let hook = find(&posted, message);
        assert_eq!(message.attributes["content_type"], hook.content_type);
        assert_metadata(&message.metadata(), "small", None);
        if hook.body == binary {
            assert_eq!(message.attributes["ankusa_body_encoding"], "base64");
            assert_eq!(message.bytes(), binary, "decodes to the exact bytes");
        } else {
            assert!(!message.attributes.contains_key("ankusa_body_encoding"));
            assert_eq!(message.body.as_bytes(), hook.body);
        }
    }

    let too_large: Vec<&Value> = dead.iter().filter(|item| item["sink"] == "small").collect();
    assert_eq!(too_large.len(), 1, "{dead:?}");
    let big_seq = too_large[0]["seq"].as_u64().unwrap();
    assert!(!small_seqs.contains(&big_seq), "{dead:?}");
    for item in &dead {
        assert_eq!(item["attempts"], 1, "refused at once, not retried: {item}");
        assert_eq!(item["source"], "orders", "{item}");
        let error = item["last_error"].as_str().unwrap();
        if item["sink"] == "small" {
            assert!(error.starts_with("too_large"), "{item}");
        } else {
            assert_eq!(item["sink"], "missing", "{item}");
            assert!(error.starts_with("no_queue"), "{item}");
        }
    }
    let missing_seqs: Vec<u64> = dead
        .iter()
        .filter(|item| item["sink"] == "missing")
        .map(|item| item["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        missing_seqs.len(),
        4,
        "every hook dead on missing: {dead:?}"
    );
    assert!(missing_seqs.contains(&big_seq), "{dead:?}");
    assert_eq!(server.stop().code(), Some(0));
    sqs.assert_drained(&queue);
    sqs.delete_queue(&queue);
}
