//! The RabbitMQ sink against the real broker on 127.0.0.1:5672, read back with lapin (the
//! crate's own AMQP client) on a tokio runtime of the test's own.

use std::collections::BTreeMap;

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use super::*;
use crate::common::proxy::Proxy;
use crate::common::services::{available, unique_name, Service};

/// The test's own connection to the broker, straight to it (never through a proxy): it
/// declares the queues the sinks publish to and reads them back.
struct Broker {
    runtime: tokio::runtime::Runtime,
    connection: Connection,
    channel: Channel,
}

/// One message read back from a queue.
struct Received {
    exchange: String,
    routing_key: String,
    properties: BasicProperties,
    body: Vec<u8>,
}

impl Broker {
    fn connect() -> Broker {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (connection, channel) = runtime.block_on(async {
            let connection =
                Connection::connect(Service::Rabbitmq.url(), ConnectionProperties::default())
                    .await
                    .unwrap();
            let channel = connection.create_channel().await.unwrap();
            (connection, channel)
        });
        Broker {
            runtime,
            connection,
            channel,
        }
    }

    /// Declares a queue named `name`. Exclusive to this connection, so the broker deletes it
    /// when the test ends, even by a panic; publishers on other connections still reach it.
    fn queue(&self, name: &str) {
        self.runtime
            .block_on(self.channel.queue_declare(
                ShortString::from(name),
                QueueDeclareOptions {
                    exclusive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ))
            .unwrap();
    }

    /// Declares a direct exchange `exchange` and binds `queue` to it with `routing_key`.
    /// Auto-delete: it goes when the queue's binding goes.
    fn bind(&self, queue: &str, exchange: &str, routing_key: &str) {
        self.runtime.block_on(async {
            self.channel
                .exchange_declare(
                    ShortString::from(exchange),
                    ExchangeKind::Direct,
                    ExchangeDeclareOptions {
                        auto_delete: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            self.channel
                .queue_bind(
                    ShortString::from(queue),
                    ShortString::from(exchange),
                    ShortString::from(routing_key),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        });
    }

    fn delete_exchange(&self, exchange: &str) {
        self.runtime
            .block_on(self.channel.exchange_delete(
                ShortString::from(exchange),
                ExchangeDeleteOptions::default(),
            ))
            .unwrap();
    }

    /// The number of messages ready in `queue`, left where they are.
    fn depth(&self, queue: &str) -> u32 {
        self.runtime
            .block_on(self.channel.queue_declare(
                ShortString::from(queue),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ))
            .unwrap()
            .message_count()
    }

    /// Takes every message now in `queue`, in queue order (= publish order).
    fn drain(&self, queue: &str) -> Vec<Received> {
        self.runtime.block_on(async {
            let mut received = Vec::new();
            while let Some(message) = self
                .channel
                .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
            {
                let delivery = message.delivery;
                received.push(Received {
                    exchange: delivery.exchange.as_str().to_owned(),
                    routing_key: delivery.routing_key.as_str().to_owned(),
                    properties: delivery.properties,
                    body: delivery.data,
                });
            }
            received
        })
    }

    /// Takes messages from `queue` until there are at least `count`, in queue order.
    fn wait_messages(&self, queue: &str, count: usize) -> Vec<Received> {
        let mut received = Vec::new();
        wait_until(&format!("{count} messages in queue {queue}"), || {
            received.extend(self.drain(queue));
            (received.len() >= count).then_some(())
        });
        received
    }
}

impl Drop for Broker {
    /// Closes the connection, which deletes the test's exclusive queues.
    fn drop(&mut self) {
        let _ = self
            .runtime
            .block_on(self.connection.close(200, ShortString::from("test done")));
    }
}

/// The AMQP headers of a message, each a long string as the sink sends them.
fn headers(message: &Received) -> BTreeMap<String, String> {
    let headers = message
        .properties
        .headers()
        .as_ref()
        .expect("the message has headers");
    headers
        .inner()
        .iter()
        .map(|(name, value)| match value {
            AMQPValue::LongString(text) => (
                name.as_str().to_owned(),
                String::from_utf8(text.as_bytes().to_vec()).unwrap(),
            ),
            other => panic!("header {name} is not a long string: {other:?}"),
        })
        .collect()
}

fn property(value: &Option<ShortString>) -> Option<&str> {
    value.as_ref().map(ShortString::as_str)
}

#[test]
fn rabbitmq_gets_body_properties_and_headers() {
    if !available(
        Service::Rabbitmq,
        "rabbitmq_gets_body_properties_and_headers",
    ) {
        return;
    }
    let broker = Broker::connect();
    let (queue, exchange, routing_key) = (
        unique_name("queue"),
        unique_name("exchange"),
        unique_name("key"),
    );
    broker.queue(&queue);
    broker.bind(&queue, &exchange, &routing_key);
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Rabbitmq.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: rabbitmq, url: '{url}', exchange: '{exchange}', routing_key: '{routing_key}'}}"
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

    let messages = broker.wait_messages(&queue, posted.len());
    assert_eq!(messages.len(), posted.len(), "each hook once");
    let mut seqs = Vec::new();
    for message in &messages {
        let hook = posted
            .iter()
            .find(|hook| hook.body == message.body)
            .unwrap_or_else(|| panic!("a message whose body was never posted: {:?}", message.body));
        let properties = &message.properties;
        assert_eq!(message.exchange, exchange);
        assert_eq!(message.routing_key, routing_key);
        assert_eq!(property(properties.content_type()), Some(hook.content_type));
        assert_eq!(
            *properties.delivery_mode(),
            Some(2),
            "persistent by default"
        );
        let fields = headers(message);
        assert_metadata(&fields, "rabbitmq", None);
        assert_eq!(
            property(properties.message_id()),
            Some(fields["ankusa_idempotency_key"].as_str()),
            "message_id is the idempotency key"
        );
        let received_at: u64 = fields["ankusa_received_at"].parse().unwrap();
        assert_eq!(*properties.timestamp(), Some(received_at / 1_000));
        seqs.push(fields["ankusa_seq"].parse::<u64>().unwrap());
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), posted.len(), "distinct seqs: {seqs:?}");
    assert_eq!(server.stop().code(), Some(0));
    broker.delete_exchange(&exchange);
}

#[test]
fn rabbitmq_ordered_keeps_each_keys_order() {
    if !available(Service::Rabbitmq, "rabbitmq_ordered_keeps_each_keys_order") {
        return;
    }
    let broker = Broker::connect();
    let queue = unique_name("ordered");
    broker.queue(&queue);
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Rabbitmq.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: rabbitmq, url: '{url}', exchange: '', routing_key: '{queue}', ordered: true, ordering_key: {{json: customer}}}}"
        ),
    );
    let posted = post_orders(&server, 150, 5);
    let messages = broker.wait_messages(&queue, posted.len());
    assert_eq!(messages.len(), posted.len());
    for message in &messages {
        let fields = headers(message);
        let body: Value = serde_json::from_slice(&message.body).unwrap();
        assert_metadata(&fields, "rabbitmq", body["customer"].as_str());
    }
    let bodies: Vec<Vec<u8>> = messages
        .iter()
        .map(|message| message.body.clone())
        .collect();
    assert_eq!(
        per_customer(&bodies),
        expected_per_customer(&posted),
        "each key's hooks in the queue in the order they were posted"
    );
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn rabbitmq_outage_is_retried_then_delivered() {
    if !available(
        Service::Rabbitmq,
        "rabbitmq_outage_is_retried_then_delivered",
    ) {
        return;
    }
    let broker = Broker::connect();
    let queue = unique_name("outage");
    broker.queue(&queue);
    let proxy = Proxy::start(Service::Rabbitmq.addr());
    // The same credentials and vhost, through the proxy.
    let direct = Service::Rabbitmq.url();
    let url = direct.replace(Service::Rabbitmq.addr(), &proxy.addr().to_string());
    assert_ne!(url, direct, "the URL names {}", Service::Rabbitmq.addr());
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: rabbitmq, url: '{url}', exchange: '', routing_key: '{queue}', confirm_timeout_ms: 1000}}"
        ),
    );
    let before = post_orders(&server, 5, 1);
    wait_until("5 messages in the queue", || {
        (broker.depth(&queue) >= 5).then_some(())
    });

    let during = post_during_outage(&server, &proxy);
    assert_eq!(
        broker.depth(&queue),
        5,
        "nothing reaches RabbitMQ while it is down"
    );

    proxy.up();
    // At least once: a hook whose confirm was lost at the cut may come twice.
    let all: Vec<&Posted> = before.iter().chain(&during).collect();
    let mut bodies: Vec<Vec<u8>> = Vec::new();
    wait_until("every hook in the queue", || {
        bodies.extend(broker.drain(&queue).into_iter().map(|message| message.body));
        all.iter()
            .all(|hook| bodies.contains(&hook.body))
            .then_some(())
    });
    assert!(bodies.len() >= all.len(), "{} messages", bodies.len());
    assert_none_dead(&server);
    assert_eq!(server.stop().code(), Some(0));
}

#[test]
fn rabbitmq_refusals_dead_letter_with_the_reason() {
    if !available(
        Service::Rabbitmq,
        "rabbitmq_refusals_dead_letter_with_the_reason",
    ) {
        return;
    }
    // Neither is ever declared: no exchange of that name, no queue of that name for the
    // default exchange to route to.
    let (missing, nobody) = (unique_name("missing"), unique_name("nobody"));
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Rabbitmq.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{id: no-exchange, kind: rabbitmq, url: '{url}', exchange: '{missing}', routing_key: 'orders'}}
             - {{id: no-queue, kind: rabbitmq, url: '{url}', exchange: '', routing_key: '{nobody}'}}"
        ),
    );
    post_orders(&server, 3, 1);
    // An unknown exchange closes the sink's channel: every hook after the first is refused
    // the same way only if the sink opens a new channel for it.
    let dead = wait_dead(&server, 6);
    assert_eq!(dead.len(), 6, "{dead:?}");
    let mut per_sink: BTreeMap<&str, usize> = BTreeMap::new();
    for item in &dead {
        let sink = item["sink"].as_str().unwrap();
        let error = item["last_error"].as_str().unwrap();
        let reason = match sink {
            "no-exchange" => "no_exchange",
            "no-queue" => "unroutable",
            other => panic!("a dead letter of sink {other}: {item}"),
        };
        assert!(error.starts_with(reason), "{item}");
        assert_eq!(item["attempts"], 1, "refused at once, not retried: {item}");
        *per_sink.entry(sink).or_default() += 1;
    }
    assert_eq!(
        per_sink,
        BTreeMap::from([("no-exchange", 3), ("no-queue", 3)]),
        "each hook dead-letters once per sink"
    );
    assert_eq!(server.stop().code(), Some(0));
}
