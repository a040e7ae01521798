//! Broker sinks end to end: the real binary delivers to real Redis, NATS JetStream,
//! RabbitMQ, SQS (moto), Pub/Sub (the emulator) and Kafka (librdkafka's mock cluster)
//! servers on loopback, and each test reads the messages back with that
//! service's own client: the body byte for byte, the metadata, each key's order in ordered
//! mode, retries through an outage, and the destination's refusals in the DLQ.
//!
//! A test whose service is absent is skipped with a message naming it, except under CI.
#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod kafka;
mod nats;
mod pubsub;
mod rabbitmq;
mod redis;
mod sqs;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{config_yaml, Server};
use serde_json::Value;

pub const WAIT: Duration = Duration::from_secs(60);

/// Hooks of the `orders` source (tenant acme): fast retries and a breaker that never
/// opens, so an outage is ridden out by retries alone. `sinks` is the YAML list's items,
/// one per line, indented by the caller as list items (`- {kind: …}`).
pub fn start(dir: &std::path::Path, sinks: &str) -> Server {
    start_env(dir, sinks, &[])
}

/// [`start`] with extra environment variables for the server process (credentials).
pub fn start_env(dir: &std::path::Path, sinks: &str, env: &[(&str, &str)]) -> Server {
    let sinks: String = sinks
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| format!("      {}\n", line.trim()))
        .collect();
    let sources = format!(
        "
retry: {{initial_ms: 50, max_ms: 500}}
dispatch: {{breaker_failures: 100000}}
edge: {{body_max_bytes: 4MiB}}
sources:
  - id: orders
    tenant: acme
    sinks:
{sinks}"
    );
    Server::start_env(
        dir,
        &config_yaml(&dir.join("data"), "", Some(&sources)),
        env,
    )
}

/// One posted hook: its body, content type, and the ordering key and counter in the body.
#[derive(Debug, Clone)]
pub struct Posted {
    pub body: Vec<u8>,
    pub content_type: &'static str,
    pub customer: String,
    pub n: u64,
}

/// `count` JSON hooks cycling over `customers` keys (`c0`, `c1`, …), each acked 202.
pub fn post_orders(server: &Server, count: u64, customers: u64) -> Vec<Posted> {
    (0..count)
        .map(|n| {
            let order = order(n, customers);
            post(server, &order.body, order.content_type);
            order
        })
        .collect()
}

/// [`post_orders`]' hooks posted from `threads` threads at once: the writer commits several
/// in one batch, so the pipeline finds them due together.
pub fn post_orders_at_once(
    server: &Server,
    count: u64,
    customers: u64,
    threads: u64,
) -> Vec<Posted> {
    std::thread::scope(|scope| {
        let posters: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || {
                    (thread..count)
                        .step_by(threads as usize)
                        .map(|n| {
                            let order = order(n, customers);
                            post(server, &order.body, order.content_type);
                            order
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        posters
            .into_iter()
            .flat_map(|poster| poster.join().unwrap())
            .collect()
    })
}

fn order(n: u64, customers: u64) -> Posted {
    let customer = format!("c{}", n % customers);
    Posted {
        body: format!(r#"{{"customer":"{customer}","n":{n},"note":"ü"}}"#).into_bytes(),
        content_type: "application/json",
        customer,
        n,
    }
}

pub fn post(server: &Server, body: &[u8], content_type: &str) {
    let response = server.post("/hooks/orders", &[("content-type", content_type)], body);
    assert_eq!(response.status, 202, "{response:?}");
}

/// The outage half of every outage test: cuts `proxy`, posts hooks 5..15 of customer `c0`
/// while it is down, and waits until the server counted at least three retried attempts.
pub fn post_during_outage(server: &Server, proxy: &Proxy) -> Vec<Posted> {
    proxy.down();
    let during = (5..15)
        .map(|n| {
            let body = format!(r#"{{"customer":"c0","n":{n}}}"#).into_bytes();
            post(server, &body, "application/json");
            Posted {
                body,
                content_type: "application/json",
                customer: "c0".into(),
                n,
            }
        })
        .collect();
    wait_until("retried attempts during the outage", || {
        (counter(
            server,
            "ankusa_dispatch_attempts_total",
            &["outcome=\"retry\""],
        ) >= 3.0)
            .then_some(())
    });
    during
}

/// Polls `probe` until it returns `Some`, or fails after [`WAIT`] naming `what`.
pub fn wait_until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The DLQ items of acme once there are `count` of them.
pub fn wait_dead(server: &Server, count: usize) -> Vec<Value> {
    wait_until(&format!("{count} dead-lettered hooks"), || {
        let response = server.admin_get("/v1/dlq?tenant=acme");
        assert_eq!(response.status, 200, "{response:?}");
        let items = response.json()["items"].as_array().unwrap().clone();
        (items.len() >= count).then_some(items)
    })
}

/// The sum of a counter's series whose labels contain every `label="value"` given.
pub fn counter(server: &Server, name: &str, labels: &[&str]) -> f64 {
    let text = server.admin_get("/metrics").body;
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until the server counted `count` delivered attempts.
pub fn wait_delivered(server: &Server, count: u64) {
    wait_until(&format!("{count} delivered attempts"), || {
        (counter(
            server,
            "ankusa_dispatch_attempts_total",
            &["outcome=\"delivered\""],
        ) >= count as f64)
            .then_some(())
    });
}

/// No row was dead-lettered: an outage costs retries, never a hook.
pub fn assert_none_dead(server: &Server) {
    assert_eq!(
        counter(server, "ankusa_dispatch_dead_lettered_total", &[]),
        0.0,
        "dead-lettered rows"
    );
}

/// Batch requests of a batching sink and the messages they carried
/// (`ankusa_sink_batch_messages{kind}`'s count and sum).
pub fn batches(server: &Server, kind: &str) -> (f64, f64) {
    let label = format!("kind=\"{kind}\"");
    (
        counter(server, "ankusa_sink_batch_messages_count", &[&label]),
        counter(server, "ankusa_sink_batch_messages_sum", &[&label]),
    )
}

/// Metadata every broker sink sends, checked on one message: `fields` maps names to
/// values as the medium carries them.
pub fn assert_metadata(
    fields: &BTreeMap<String, String>,
    sink_id: &str,
    ordered_key: Option<&str>,
) {
    assert_eq!(fields["ankusa_message_version"], "1", "{fields:?}");
    assert_eq!(fields["ankusa_tenant"], "acme", "{fields:?}");
    assert_eq!(fields["ankusa_source"], "orders", "{fields:?}");
    let seq: u64 = fields["ankusa_seq"].parse().unwrap();
    assert!(
        fields["ankusa_idempotency_key"].ends_with(&format!(":{seq}:{sink_id}")),
        "{fields:?}"
    );
    let received_at: u64 = fields["ankusa_received_at"].parse().unwrap();
    assert!(received_at > 1_600_000_000_000, "{fields:?}");
    assert!(
        fields["ankusa_attempt"].parse::<u32>().unwrap() >= 1,
        "{fields:?}"
    );
    assert_eq!(
        fields.get("ankusa_ordering_key").map(String::as_str),
        ordered_key,
        "{fields:?}"
    );
}

/// The `n` of each JSON body, per `customer`, in the order given.
pub fn per_customer(bodies: &[Vec<u8>]) -> BTreeMap<String, Vec<u64>> {
    let mut order: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for body in bodies {
        let value: Value = serde_json::from_slice(body).unwrap();
        order
            .entry(value["customer"].as_str().unwrap().to_owned())
            .or_default()
            .push(value["n"].as_u64().unwrap());
    }
    order
}

/// What `posted` looks like per customer: each key's `n` in posting order.
pub fn expected_per_customer(posted: &[Posted]) -> BTreeMap<String, Vec<u64>> {
    let mut order: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for hook in posted {
        order.entry(hook.customer.clone()).or_default().push(hook.n);
    }
    order
}
