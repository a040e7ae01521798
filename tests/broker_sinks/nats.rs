//! The NATS JetStream sink against the real server on 127.0.0.1:4222, read back with the
//! async-nats crate's own client on a runtime of the test's.

use std::collections::BTreeMap;

use async_nats::jetstream::{self, message::StreamMessage};
use tokio::runtime::Runtime;

use super::*;
use crate::common::proxy::Proxy;
use crate::common::services::{available, unique_name, Service};

/// A client of the test's NATS server with the runtime that drives it.
struct Nats {
    runtime: Runtime,
    client: async_nats::Client,
    jetstream: jetstream::Context,
}

impl Nats {
    fn connect() -> Nats {
        let runtime = Runtime::new().unwrap();
        // The JetStream context spawns its acker task: it is made on the runtime.
        let (client, jetstream) = runtime.block_on(async {
            let client = async_nats::connect(Service::Nats.url()).await.unwrap();
            let jetstream = jetstream::new(client.clone());
            (client, jetstream)
        });
        Nats {
            runtime,
            client,
            jetstream,
        }
    }

    /// A stream that takes exactly `subject`.
    fn create_stream(&self, name: &str, subject: &str) {
        let config = jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            ..Default::default()
        };
        self.runtime
            .block_on(self.jetstream.create_stream(config))
            .unwrap();
    }

    /// How many messages the stream holds.
    fn count(&self, name: &str) -> u64 {
        self.runtime.block_on(async {
            let mut stream = self.jetstream.get_stream(name).await.unwrap();
            stream.info().await.unwrap().state.messages
        })
    }

    /// Every message of the stream, in stream order.
    fn messages(&self, name: &str) -> Vec<StreamMessage> {
        self.runtime.block_on(async {
            let mut stream = self.jetstream.get_stream(name).await.unwrap();
            let state = stream.info().await.unwrap().state.clone();
            let mut messages = Vec::new();
            if state.messages == 0 {
                return messages;
            }
            for seq in state.first_sequence..=state.last_sequence {
                messages.push(stream.get_raw_message(seq).await.unwrap());
            }
            assert_eq!(messages.len() as u64, state.messages, "no gaps in {name}");
            messages
        })
    }

    fn wait_messages(&self, name: &str, count: u64) -> Vec<StreamMessage> {
        wait_until(&format!("{count} messages in stream {name}"), || {
            (self.count(name) >= count).then_some(())
        });
        self.messages(name)
    }

    /// The largest message (headers and payload) the server takes.
    fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    fn delete_stream(&self, name: &str) {
        self.runtime
            .block_on(self.jetstream.delete_stream(name))
            .unwrap();
    }
}

/// A stream name (no `.`) and a subject of its own: `<unique>.hooks`.
fn stream_and_subject(prefix: &str) -> (String, String) {
    let name: String = unique_name(prefix)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let subject = format!("{name}.hooks");
    (name, subject)
}

fn header<'a>(message: &'a StreamMessage, name: &str) -> &'a str {
    message
        .headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header: {:?}", message.headers))
        .as_str()
}

/// The `ankusa_*` headers, each carried once.
fn metadata_headers(message: &StreamMessage) -> BTreeMap<String, String> {
    message
        .headers
        .iter()
        .filter(|(name, _)| name.to_string().starts_with("ankusa_"))
        .map(|(name, values)| {
            assert_eq!(values.len(), 1, "{name} once: {values:?}");
            (name.to_string(), values[0].as_str().to_owned())
        })
        .collect()
}

fn seq_of(message: &StreamMessage) -> u64 {
    header(message, "ankusa_seq").parse().unwrap()
}

#[test]
fn nats_jetstream_gets_body_and_headers() {
    if !available(Service::Nats, "nats_jetstream_gets_body_and_headers") {
        return;
    }
    let nats = Nats::connect();
    let (stream, subject) = stream_and_subject("headers");
    nats.create_stream(&stream, &subject);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: nats, url: '{}', subject: '{subject}'}}",
            Service::Nats.url()
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

    let messages = nats.wait_messages(&stream, posted.len() as u64);
    assert_eq!(messages.len(), posted.len(), "each hook once");
    let mut seqs = Vec::new();
    for message in &messages {
        assert_eq!(message.subject.as_str(), subject);
        let hook = posted
            .iter()
            .find(|hook| hook.body == message.payload)
            .unwrap_or_else(|| panic!("a message whose body was never posted: {message:?}"));
        assert_eq!(
            header(message, "Content-Type"),
            hook.content_type,
            "{message:?}"
        );
        let fields = metadata_headers(message);
        assert_eq!(
            header(message, "Nats-Msg-Id"),
            fields["ankusa_idempotency_key"],
            "JetStream dedupes on the idempotency key"
        );
        assert_metadata(&fields, "nats", None);
        seqs.push(seq_of(message));
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), posted.len(), "distinct seqs: {seqs:?}");
    assert_eq!(server.stop().code(), Some(0));
    nats.delete_stream(&stream);
}

#[test]
fn nats_ordered_keeps_each_keys_order() {
    if !available(Service::Nats, "nats_ordered_keeps_each_keys_order") {
        return;
    }
    let nats = Nats::connect();
    let (stream, subject) = stream_and_subject("ordered");
    nats.create_stream(&stream, &subject);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: nats, url: '{}', subject: '{subject}', ordered: true, ordering_key: {{json: customer}}}}",
            Service::Nats.url()
        ),
    );
    let posted = post_orders(&server, 150, 5);
    let messages = nats.wait_messages(&stream, posted.len() as u64);
    assert_eq!(messages.len(), posted.len());
    for message in &messages {
        let body: Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(
            header(message, "ankusa_ordering_key"),
            body["customer"].as_str().unwrap()
        );
        assert_metadata(
            &metadata_headers(message),
            "nats",
            body["customer"].as_str(),
        );
    }
    let bodies: Vec<Vec<u8>> = messages
        .iter()
        .map(|message| message.payload.to_vec())
        .collect();
    assert_eq!(
        per_customer(&bodies),
        expected_per_customer(&posted),
        "each key's hooks in the stream in the order they were posted"
    );
    assert_eq!(server.stop().code(), Some(0));
    nats.delete_stream(&stream);
}

#[test]
fn nats_outage_is_retried_then_delivered() {
    if !available(Service::Nats, "nats_outage_is_retried_then_delivered") {
        return;
    }
    let nats = Nats::connect();
    let (stream, subject) = stream_and_subject("outage");
    nats.create_stream(&stream, &subject);
    let proxy = Proxy::start(Service::Nats.addr());
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: nats, url: 'nats://{}', subject: '{subject}', timeout_ms: 1000}}",
            proxy.addr()
        ),
    );
    let before = post_orders(&server, 5, 1);
    nats.wait_messages(&stream, 5);

    let during = post_during_outage(&server, &proxy);
    assert_eq!(
        nats.count(&stream),
        5,
        "nothing reaches NATS while it is down"
    );

    proxy.up();
    nats.wait_messages(&stream, 15);
    wait_delivered(&server, 15);
    assert_none_dead(&server);
    assert_eq!(server.stop().code(), Some(0));

    // Every attempt is over: a publish whose ack was lost in the outage and was sent again
    // is stored once, deduped by its Nats-Msg-Id.
    let messages = nats.messages(&stream);
    assert_eq!(messages.len(), 15, "each hook exactly once");
    let mut bodies: Vec<Vec<u8>> = messages
        .iter()
        .map(|message| message.payload.to_vec())
        .collect();
    bodies.sort();
    let mut expected: Vec<Vec<u8>> = before
        .iter()
        .chain(&during)
        .map(|hook| hook.body.clone())
        .collect();
    expected.sort();
    assert_eq!(
        bodies, expected,
        "the stream holds each body once, as posted"
    );
    let mut seqs: Vec<u64> = messages.iter().map(seq_of).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 15, "distinct seqs: {seqs:?}");
    nats.delete_stream(&stream);
}

#[test]
fn nats_refusals_dead_letter_with_the_reason() {
    if !available(Service::Nats, "nats_refusals_dead_letter_with_the_reason") {
        return;
    }
    let nats = Nats::connect();
    let (stream, subject) = stream_and_subject("refusals");
    nats.create_stream(&stream, &subject);
    // No stream takes this subject: JetStream has no responder for it.
    let (_, nowhere) = stream_and_subject("nowhere");
    let max_payload = nats.max_payload();
    assert!(
        max_payload < 4 * 1024 * 1024,
        "the server's max_payload {max_payload} leaves no body over it under edge.body_max_bytes"
    );
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Nats.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{id: nowhere, kind: nats, url: '{url}', subject: '{nowhere}'}}
             - {{id: stream, kind: nats, url: '{url}', subject: '{subject}'}}"
        ),
    );
    let small = post_orders(&server, 3, 1);
    let big = vec![b'x'; max_payload + 1];
    post(&server, &big, "application/octet-stream");

    // Each hook dead on `nowhere`, the big one on `stream` too.
    let dead = wait_dead(&server, 5);
    assert_eq!(dead.len(), 5, "{dead:?}");
    let delivered = nats.wait_messages(&stream, 3);
    assert_eq!(delivered.len(), 3, "the small hooks reach the stream");
    let small_seqs: Vec<u64> = delivered.iter().map(seq_of).collect();
    let mut bodies: Vec<Vec<u8>> = delivered
        .iter()
        .map(|message| message.payload.to_vec())
        .collect();
    bodies.sort();
    let mut expected: Vec<Vec<u8>> = small.iter().map(|hook| hook.body.clone()).collect();
    expected.sort();
    assert_eq!(bodies, expected);

    let too_large: Vec<&Value> = dead
        .iter()
        .filter(|item| item["sink"] == "stream")
        .collect();
    assert_eq!(too_large.len(), 1, "{dead:?}");
    let big_seq = too_large[0]["seq"].as_u64().unwrap();
    assert!(!small_seqs.contains(&big_seq), "{dead:?}");
    for item in &dead {
        assert_eq!(item["attempts"], 1, "refused at once, not retried: {item}");
        assert_eq!(item["source"], "orders", "{item}");
        let seq = item["seq"].as_u64().unwrap();
        let error = item["last_error"].as_str().unwrap();
        if seq == big_seq {
            // Over the server's max_payload whatever the subject: refused before sending.
            assert!(error.starts_with("too_large"), "{item}");
        } else {
            assert_eq!(item["sink"], "nowhere", "{item}");
            assert!(small_seqs.contains(&seq), "{item}");
            assert!(error.starts_with("no_stream"), "{item}");
        }
    }
    let nowhere_seqs: Vec<u64> = dead
        .iter()
        .filter(|item| item["sink"] == "nowhere")
        .map(|item| item["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        nowhere_seqs.len(),
        4,
        "every hook dead on nowhere: {dead:?}"
    );
    assert_eq!(server.stop().code(), Some(0));
    assert_eq!(
        nats.count(&stream),
        3,
        "the big hook never reached the stream"
    );
    nats.delete_stream(&stream);
}
