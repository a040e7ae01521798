//! `bench-gate drain`: how fast one sink drains a backlog. The real `ankusa serve` gets one
//! tenant, one source and one sink of the kind asked for, delivering to a destination on
//! loopback (the in-process receiver, or a Redis stream, a NATS JetStream stream, a RabbitMQ
//! queue, a Kafka topic on librdkafka's mock cluster made in this process, an SQS queue on
//! moto's server or a Pub/Sub topic on the emulator, of this run's own); a fixed number of
//! hooks is posted closed-loop, which leaves a backlog, and `ankusa_delivered_total` is
//! polled until every hook is delivered.
//!
//! From the first send (t0), the end of ingest (the last answer) and the poll that saw every
//! hook delivered (t_done) come the row's rates: ingest hooks/s, the backlog left at the end
//! of ingest, drain delivered/s after it, and overall delivered/s. The destination is then
//! read back with its own client (at-least-once: it must hold at least every hook) and
//! removed. The gauges behind `/metrics` refresh every 250 ms, so t_done is late by up to
//! about 0.35 s and the backlog read at the end of ingest is up to 250 ms old.
//!
//! The destination's own count: `XLEN`, the JetStream stream's and the queue's message
//! counts, the sum of the Kafka topic's high watermarks, and for Pub/Sub, which keeps no
//! count, the distinct message ids pulled (and acknowledged) from the run's subscription, so a
//! redelivery is not counted twice.
//!
//! SQS is consumed while the run lasts, as a real consumer would: moto computes a queue's
//! attributes, which scans every message it holds, on each SendMessage, so a queue left to
//! fill slows the sink down as it grows (90 sends/s at depth 0–1,000, 11 at 5,000) and a
//! drain of 100,000 hooks never ends. From just before the first hook is posted,
//! [`SQS_CONSUMERS`] tasks on the drain's runtime each ReceiveMessage up to 10 messages
//! (asking for `ankusa_seq`, and on a FIFO queue MessageGroupId) and DeleteMessageBatch what
//! they got. The count is the distinct `ankusa_seq` received, so a redelivery is not counted
//! twice; once the server has stopped the tasks are stopped and a final receive loop ends
//! after [`SQS_EMPTY_RECEIVES`] empty receives in a row. On a FIFO queue (`--keys`) each
//! MessageGroupId's seqs must arrive in increasing order (a redelivery of its latest is no
//! violation); one lower than its group's latest is a failure of the run. A standard queue
//! is long-polled (1 s). On a FIFO queue the tasks' receives take turns and poll without a
//! wait, their deletes running alongside: moto serves concurrent receives without a lock,
//! so two at once could hand one group's consecutive messages to two tasks (which SQS never
//! does), and a long poll that finds only messages of groups in flight spins through its
//! whole wait ([`Consuming::receive_once`]).
//!
//! `--sink-option KEY=VALUE` adds a top-level key to the generated sink entry (VALUE is YAML,
//! e.g. `max_in_flight=8` or `client={"linger.ms": "1"}`); the keys the drain sets itself
//! (kind, id, the destination's, `ordered` and `ordering_key`) are refused. The options are
//! recorded in the report.
//!
//! Every wait is bounded: ingest and drain together by the timeout, each broker operation by
//! [`BROKER_TIMEOUT`], the Pub/Sub and SQS counts by their own limits.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::ClientConfig;

use crate::cells::SOURCE_ID;
use crate::hooks::{HookSpec, Shape, Signing, ORDERING_KEYS_MAX, ORDERING_KEY_PATH};
use crate::load::{self, LoadPlan, Mode};
use crate::responder::Responder;
use crate::server::{Ankusa, Metrics};

/// The services the broker sinks deliver to, where `.ci/services` runs them.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const NATS_URL: &str = "nats://127.0.0.1:4222";
pub const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// moto's server, serving SQS.
pub const SQS_ENDPOINT: &str = "http://127.0.0.1:5000";
pub const SQS_REGION: &str = "us-east-1";
/// The credentials of the SQS sink and client: moto takes any key, the AWS default chain the
/// server reads needs one, and IMDS is off so the chain never waits on it. Given to the
/// server's environment.
pub const SQS_ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];
/// The Pub/Sub emulator, and the project the run's topic is made in.
pub const PUBSUB_ENDPOINT: &str = "http://127.0.0.1:8085";
pub const PUBSUB_PROJECT: &str = "bench-gate";
/// Partitions of the run's Kafka topic.
pub const KAFKA_PARTITIONS: i32 = 8;
/// The sink's id in the generated config.
pub const SINK_ID: &str = "drain";
/// Each hook's body: 1 KiB, Stripe-shaped (the cells' default).
pub const BODY_BYTES: usize = 1024;
/// Most hooks one run may post (the tenant's default `max_pending` is 1,000,000).
pub const HOOKS_MAX: u64 = 1_000_000;
pub const CONNECTIONS_MAX: usize = 4096;
pub const TIMEOUT_MAX_S: u64 = 3600;

/// How often `ankusa_delivered_total` is read while the backlog drains.
const POLL: Duration = Duration::from_millis(100);
/// How often the drain's progress is said on stderr.
const PROGRESS: Duration = Duration::from_secs(5);
/// The gauges refresh every 250 ms; after this long the last scrape shows the end.
const GAUGE_SETTLE: Duration = Duration::from_millis(600);
/// How long answers still outstanding when ingest reaches the timeout are waited for.
const ANSWER_DRAIN: Duration = Duration::from_secs(10);
/// Time limit of each broker operation (connect, declare, count, delete).
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages asked for by one Pub/Sub pull.
const PUBSUB_PULL_MAX: u64 = 1000;
/// Empty pulls in a row, [`PUBSUB_EMPTY_PAUSE`] apart, that end the Pub/Sub count.
const PUBSUB_EMPTY_PULLS: u32 = 3;
const PUBSUB_EMPTY_PAUSE: Duration = Duration::from_millis(200);
/// Bound on the whole Pub/Sub count (pulls and acknowledgements).
const PUBSUB_COUNT_LIMIT: Duration = Duration::from_secs(600);
/// Most bytes of one emulator answer (a pull of 1000 1 KiB hooks is about 2.5 MB).
const PUBSUB_ANSWER_BYTES: u64 = 64 << 20;
/// Consumer tasks of the SQS queue while the run lasts. Measured on moto with 5,000 hooks:
/// one task falls behind the sink's 4 SendMessageBatch in flight (moto serves requests in
/// turn under Python's GIL), the queue grows past 1,600 and the drain sinks to 17 hooks/s
/// (6 on a FIFO queue); 2 or 3 keep it under about 20 messages at 170–250 hooks/s, FIFO
/// included; 4 add requests that slow moto (134 hooks/s). Three leave room to spare.
pub const SQS_CONSUMERS: usize = 3;
/// Messages asked for by one ReceiveMessage (SQS's most).
const SQS_RECEIVE_MAX: i32 = 10;
/// ReceiveMessage's long poll on a standard queue, in seconds: an empty queue answers after
/// this long, or as soon as a message arrives. A FIFO queue is polled without a wait, and
/// [`SQS_EMPTY_PAUSE`] after an empty answer (see [`Consuming::receive_once`]).
const SQS_WAIT_S: i32 = 1;
const SQS_EMPTY_PAUSE: Duration = Duration::from_millis(100);
/// How long a received message stays hidden from other receives; it is deleted long before.
const SQS_VISIBILITY_S: i32 = 120;
/// Empty receives in a row that end the final SQS count.
pub const SQS_EMPTY_RECEIVES: u32 = 3;
/// Failed receives in a row that end the final SQS count with an error.
const SQS_FAILED_RECEIVES: u32 = 10;
/// Pause after a failed receive or delete, before the next.
const SQS_ERROR_PAUSE: Duration = Duration::from_millis(200);
/// Bound on the whole SQS count (stopping the consumers and the final receive loop).
const SQS_COUNT_LIMIT: Duration = Duration::from_secs(600);
/// The message attribute that names a hook: the SQS sink sends it on every message.
pub const SEQ_ATTRIBUTE: &str = "ankusa_seq";
/// Order violations described in the report; the rest are only counted.
const ORDER_EXAMPLES: usize = 5;

const DELIVERED: &str = "ankusa_delivered_total";
const DEAD_LETTERED: &str = "ankusa_dead_lettered_total";
const KEY_MISSING: &str = "ankusa_dispatch_lane_key_missing_total";

/// The sink kind measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    Http,
    Redis,
    Nats,
    Rabbitmq,
    Kafka,
    Sqs,
    Pubsub,
}

impl SinkKind {
    pub fn name(self) -> &'static str {
        match self {
            SinkKind::Http => "http",
            SinkKind::Redis => "redis",
            SinkKind::Nats => "nats",
            SinkKind::Rabbitmq => "rabbitmq",
            SinkKind::Kafka => "kafka",
            SinkKind::Sqs => "sqs",
            SinkKind::Pubsub => "pubsub",
        }
    }

    /// The keys of the sink entry the drain sets itself for this kind (`ordered` and
    /// `ordering_key` with `--keys`), which `--sink-option` may not.
    pub fn drain_keys(self) -> &'static [&'static str] {
        match self {
            SinkKind::Http => &["kind", "id", "url", "ordered", "ordering_key"],
            SinkKind::Redis => &["kind", "id", "url", "stream", "ordered", "ordering_key"],
            SinkKind::Nats => &["kind", "id", "url", "subject", "ordered", "ordering_key"],
            SinkKind::Rabbitmq => &[
                "kind",
                "id",
                "url",
                "exchange",
                "routing_key",
                "ordered",
                "ordering_key",
            ],
            SinkKind::Kafka => &["kind", "id", "brokers", "topic", "ordered", "ordering_key"],
            SinkKind::Sqs => &[
                "kind",
                "id",
                "queue_url",
                "region",
                "endpoint",
                "ordered",
                "ordering_key",
            ],
            SinkKind::Pubsub => &[
                "kind",
                "id",
                "project",
                "topic",
                "endpoint",
                "ordered",
                "ordering_key",
            ],
        }
    }
}

/// One `--sink-option KEY=VALUE`: a top-level key of the generated sink entry, its VALUE
/// read as YAML (and kept in its JSON form, which is how it is written into the config and
/// recorded in the report).
#[derive(Debug, Clone, PartialEq)]
pub struct SinkOption {
    pub key: String,
    pub value: serde_json::Value,
}

/// Parses `KEY=VALUE` (split at the first `=`): KEY is letters, digits, `_`, `-` or `.`;
/// VALUE is any YAML with a JSON form (`8`, `zstd`, `{"linger.ms": "1"}`, `[a, b]`).
pub fn parse_sink_option(text: &str) -> Result<SinkOption, String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!(
            "{text:?} is not KEY=VALUE (e.g. max_in_flight=8, or 'client={{\"linger.ms\": \"1\"}}')"
        ));
    };
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(format!(
            "{key:?} is not a sink key (letters, digits, '_', '-' or '.', as max_in_flight)"
        ));
    }
    if value.trim().is_empty() {
        return Err(format!(
            "{key}: the value is empty (it is YAML: 8, zstd, {{a: b}})"
        ));
    }
    let yaml: serde_yaml_ng::Value = serde_yaml_ng::from_str(value)
        .map_err(|error| format!("{key}: the value {value:?} is not YAML: {error}"))?;
    let value = serde_json::to_value(&yaml)
        .map_err(|error| format!("{key}: the value {value:?} has no JSON form: {error}"))?;
    Ok(SinkOption {
        key: key.to_owned(),
        value,
    })
}

/// Every problem with `options` for a sink of `kind`: a key the drain sets itself, or one
/// given twice.
pub fn sink_option_problems(kind: SinkKind, options: &[SinkOption]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for option in options {
        let key = option.key.as_str();
        if kind.drain_keys().contains(&key) {
            let hint = match key {
                "kind" => "choose the kind with --sink",
                "ordered" | "ordering_key" => {
                    "--keys N makes the sink ordered on data.object.customer"
                }
                "id" => "the report and the metrics name the sink by it",
                _ => "the destination is this run's own, made and removed by the drain",
            };
            problems.push(format!(
                "--sink-option {key}: the drain sets {key} itself for a {} sink ({hint}); it \
                 sets {}",
                kind.name(),
                kind.drain_keys().join(", ")
            ));
        } else if !seen.insert(key) {
            problems.push(format!("--sink-option {key} is given more than once"));
        }
    }
    problems
}

/// `value` as YAML flow text for a config line: JSON, with a space after each `:` and `,`
/// (libyaml reads `{"a":1}` only with the space).
fn flow_yaml(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(flow_yaml).collect();
            format!("[{}]", items.join(", "))
        }
        serde_json::Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .map(|(key, value)| {
                    format!(
                        "{}: {}",
                        serde_json::Value::from(key.as_str()),
                        flow_yaml(value)
                    )
                })
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// The Redis stream key, RabbitMQ queue, NATS stream and subject, Kafka topic, SQS queue
/// name and Pub/Sub topic and subscription of the run of process `pid`, so runs side by side
/// never share a destination.
pub fn redis_stream(pid: u32) -> String {
    format!("bench-drain-{pid}")
}
pub fn rabbitmq_queue(pid: u32) -> String {
    format!("bench-drain-{pid}")
}
pub fn nats_stream(pid: u32) -> String {
    format!("BENCH_DRAIN_{pid}")
}
pub fn nats_subject(pid: u32) -> String {
    format!("bench.drain.{pid}")
}
pub fn kafka_topic(pid: u32) -> String {
    format!("bench-drain-{pid}")
}
/// A FIFO queue's name ends `.fifo`.
pub fn sqs_queue(pid: u32, fifo: bool) -> String {
    let suffix = if fifo { ".fifo" } else { "" };
    format!("bench-drain-{pid}{suffix}")
}
pub fn pubsub_topic(pid: u32) -> String {
    format!("bench-drain-{pid}")
}
pub fn pubsub_subscription(topic: &str) -> String {
    format!("{topic}-count")
}

/// Where the sink delivers, as its config names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The in-process receiver.
    Http { receiver: SocketAddr },
    /// `XADD` to a stream.
    Redis { url: String, stream: String },
    /// JetStream publishes on a subject a stream takes.
    Nats { url: String, subject: String },
    /// The default exchange, routed to a queue by its name.
    Rabbitmq { url: String, queue: String },
    /// A topic on the mock cluster's brokers.
    Kafka { brokers: String, topic: String },
    /// SendMessage to a queue (FIFO when its URL ends `.fifo`) on an endpoint.
    Sqs {
        endpoint: String,
        region: String,
        queue_url: String,
    },
    /// REST publish to a topic on an endpoint; counted through its subscription.
    Pubsub {
        endpoint: String,
        project: String,
        topic: String,
    },
}

impl Target {
    /// The broker target of `kind` for the run of process `pid` on the loopback services
    /// (`None` for http, kafka and sqs: the receiver's address, the mock cluster's port and
    /// the queue's URL are known only once they exist).
    pub fn broker(kind: SinkKind, pid: u32) -> Option<Target> {
        match kind {
            SinkKind::Http | SinkKind::Kafka | SinkKind::Sqs => None,
            SinkKind::Redis => Some(Target::Redis {
                url: REDIS_URL.into(),
                stream: redis_stream(pid),
            }),
            SinkKind::Nats => Some(Target::Nats {
                url: NATS_URL.into(),
                subject: nats_subject(pid),
            }),
            SinkKind::Rabbitmq => Some(Target::Rabbitmq {
                url: RABBITMQ_URL.into(),
                queue: rabbitmq_queue(pid),
            }),
            SinkKind::Pubsub => Some(Target::Pubsub {
                endpoint: PUBSUB_ENDPOINT.into(),
                project: PUBSUB_PROJECT.into(),
                topic: pubsub_topic(pid),
            }),
        }
    }

    pub fn kind(&self) -> SinkKind {
        match self {
            Target::Http { .. } => SinkKind::Http,
            Target::Redis { .. } => SinkKind::Redis,
            Target::Nats { .. } => SinkKind::Nats,
            Target::Rabbitmq { .. } => SinkKind::Rabbitmq,
            Target::Kafka { .. } => SinkKind::Kafka,
            Target::Sqs { .. } => SinkKind::Sqs,
            Target::Pubsub { .. } => SinkKind::Pubsub,
        }
    }

    /// The sink's entry in the source's `sinks:` list (one flow mapping); with `keys > 0`
    /// it is ordered on the body's customer.
    pub fn sink_yaml(&self, keys: usize) -> String {
        let ordering = if keys > 0 {
            format!(", ordered: true, ordering_key: {{json: {ORDERING_KEY_PATH}}}")
        } else {
            String::new()
        };
        let specific = match self {
            Target::Http { receiver } => format!("url: 'http://{receiver}/{SINK_ID}'"),
            Target::Redis { url, stream } => format!("url: '{url}', stream: '{stream}'"),
            Target::Nats { url, subject } => format!("url: '{url}', subject: '{subject}'"),
            Target::Rabbitmq { url, queue } => {
                format!("url: '{url}', exchange: '', routing_key: '{queue}'")
            }
            Target::Kafka { brokers, topic } => format!("brokers: '{brokers}', topic: '{topic}'"),
            Target::Sqs {
                endpoint,
                region,
                queue_url,
            } => format!("queue_url: '{queue_url}', region: '{region}', endpoint: '{endpoint}'"),
            Target::Pubsub {
                endpoint,
                project,
                topic,
            } => format!("project: '{project}', topic: '{topic}', endpoint: '{endpoint}'"),
        };
        format!(
            "{{kind: {}, id: {SINK_ID}, {specific}{ordering}}}",
            self.kind().name()
        )
    }

    /// [`Target::sink_yaml`] with each `--sink-option` merged in as a top-level key (checked
    /// by [`sink_option_problems`] first, so none repeats a key of the drain's).
    pub fn sink_entry(&self, keys: usize, options: &[SinkOption]) -> String {
        let mut entry = self.sink_yaml(keys);
        // The flow mapping's closing brace goes back on after the options.
        entry.pop();
        for option in options {
            let _ = write!(
                entry,
                ", {}: {}",
                serde_json::Value::from(option.key.as_str()),
                flow_yaml(&option.value)
            );
        }
        entry.push('}');
        entry
    }

    /// How the destination's count is read back, for the report.
    pub fn count_label(&self) -> String {
        match self {
            Target::Http { receiver } => format!("requests answered by the receiver {receiver}"),
            Target::Redis { stream, .. } => format!("XLEN {stream}"),
            Target::Nats { subject, .. } => {
                format!(
                    "messages in JetStream stream {} ({subject})",
                    stream_of(subject)
                )
            }
            Target::Rabbitmq { queue, .. } => format!("messages in queue {queue}"),
            Target::Kafka { topic, .. } => format!(
                "sum of the high watermarks of topic {topic}'s {KAFKA_PARTITIONS} partitions"
            ),
            Target::Sqs { queue_url, .. } => {
                let name = queue_url.rsplit('/').next().unwrap_or(queue_url);
                let order = if name.ends_with(".fifo") {
                    ", each MessageGroupId in increasing order"
                } else {
                    ""
                };
                format!(
                    "distinct hooks ({SEQ_ATTRIBUTE}) received and deleted from queue {name} \
                     while the run lasted{order}"
                )
            }
            Target::Pubsub { project, topic, .. } => format!(
                "distinct messages pulled from subscription projects/{project}/subscriptions/{}",
                pubsub_subscription(topic)
            ),
        }
    }
}

/// The stream that takes `subject` (`bench.drain.PID` → `BENCH_DRAIN_PID`).
fn stream_of(subject: &str) -> String {
    subject.replace('.', "_").to_ascii_uppercase()
}

/// The gateway config of a drain run: listeners on `127.0.0.1:0`, the store in `data_dir`
/// with sync on, a breaker that never opens (a slow broker is ridden out by retries), one
/// tenant `t0`, one source `bench` with the one sink (and its `--sink-option`s).
pub fn server_yaml(
    data_dir: &Path,
    target: &Target,
    keys: usize,
    options: &[SinkOption],
) -> String {
    let mut yaml = String::new();
    // Writing to a String cannot fail; results are ignored for that reason.
    let _ = writeln!(
        yaml,
        "# Generated by bench-gate drain ({} sink).\ninstance:\n  data_dir: '{}'\n  \
         listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0\nstore: {{sync: true}}\n\
         dispatch: {{breaker_failures: 100000}}\ntenants:\n  - {{id: t0}}\nsources:\n  \
         - id: {SOURCE_ID}\n    tenant: t0\n    sinks:\n      - {}",
        target.kind().name(),
        data_dir.display(),
        target.sink_entry(keys, options)
    );
    yaml
}

/// The requests of a drain run: 1 KiB Stripe-shaped, unsigned, to the one source; with
/// `keys > 0` the customers cycle over `cus_0` … `cus_{keys-1}`.
pub fn hook_spec(keys: usize) -> HookSpec {
    HookSpec {
        shape: Shape::Stripe,
        body_bytes: BODY_BYTES,
        signing: Signing::None,
        paths: vec![format!("/hooks/{SOURCE_ID}")],
        ordering_keys: (keys > 0).then_some(keys),
    }
}

/// What a drain run measures with.
#[derive(Debug, Clone)]
pub struct DrainSettings {
    pub bin: PathBuf,
    pub sink: SinkKind,
    pub hooks: u64,
    /// Ordering keys; 0 is an unordered sink.
    pub keys: usize,
    pub connections: usize,
    /// Bounds ingest and drain together, from the first send.
    pub timeout: Duration,
    /// `--sink-option`s, merged into the sink's entry.
    pub sink_options: Vec<SinkOption>,
}

impl DrainSettings {
    /// Every problem with the settings, one per entry.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=HOOKS_MAX).contains(&self.hooks) {
            problems.push(format!(
                "--hooks must be between 1 and {HOOKS_MAX}, found {}",
                self.hooks
            ));
        }
        if self.keys > ORDERING_KEYS_MAX {
            problems.push(format!(
                "--keys must be between 0 and {ORDERING_KEYS_MAX}, found {}",
                self.keys
            ));
        }
        if !(1..=CONNECTIONS_MAX).contains(&self.connections) {
            problems.push(format!(
                "--connections must be between 1 and {CONNECTIONS_MAX}, found {}",
                self.connections
            ));
        }
        let timeout_s = self.timeout.as_secs_f64();
        if !(1.0..=TIMEOUT_MAX_S as f64).contains(&timeout_s) {
            problems.push(format!(
                "--timeout-s must be between 1 and {TIMEOUT_MAX_S}, found {timeout_s}"
            ));
        }
        problems.extend(sink_option_problems(self.sink, &self.sink_options));
        problems
    }
}

/// The rates of one run, from its counts and its times in seconds after t0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub ingest_hooks_per_s: f64,
    /// Hooks not yet delivered when ingest ended.
    pub backlog: u64,
    /// t_done − t_ingest_end, when every hook was delivered.
    pub drain_s: Option<f64>,
    /// backlog / drain_s (`None` without a backlog or before every hook was delivered).
    pub drain_delivered_per_s: Option<f64>,
    /// hooks / t_done.
    pub overall_delivered_per_s: Option<f64>,
}

/// The rates of `hooks` hooks, `delivered_at_ingest_end` of them delivered when ingest ended
/// at `ingest_s`, all delivered at `done_s` (`None`: not all were).
pub fn rates(
    hooks: u64,
    delivered_at_ingest_end: u64,
    ingest_s: f64,
    done_s: Option<f64>,
) -> Rates {
    let per_s = |count: u64, seconds: f64| (seconds > 0.0).then(|| count as f64 / seconds);
    let backlog = hooks.saturating_sub(delivered_at_ingest_end);
    let drain_s = done_s.map(|done_s| (done_s - ingest_s).max(0.0));
    Rates {
        ingest_hooks_per_s: per_s(hooks, ingest_s).unwrap_or(0.0),
        backlog,
        drain_s,
        drain_delivered_per_s: drain_s
            .filter(|_| backlog > 0)
            .and_then(|seconds| per_s(backlog, seconds)),
        overall_delivered_per_s: done_s.and_then(|seconds| per_s(hooks, seconds)),
    }
}

/// One `bench-gate drain`, as printed and written to `bench-gate/out/drain-<sink>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainReport {
    pub started_unix_s: u64,
    pub binary: String,
    pub revision: Option<String>,
    pub sink: SinkKind,
    /// Ordering keys (0: unordered).
    pub keys: usize,
    /// Hooks asked for (`--hooks`).
    pub hooks: u64,
    pub connections: usize,
    pub timeout_s: f64,
    /// The `--sink-option`s merged into the sink's entry, KEY: VALUE.
    #[serde(default)]
    pub sink_options: serde_json::Map<String, serde_json::Value>,
    /// Answers to the posts: 2xx, other statuses, errors (lost connections).
    pub acked: u64,
    pub other_status: u64,
    pub errors: u64,
    /// t_ingest_end − t0.
    pub ingest_s: f64,
    pub ingest_hooks_per_s: f64,
    pub delivered_at_ingest_end: u64,
    /// acked − delivered at the end of ingest.
    pub backlog_at_ingest_end: u64,
    /// t_done − t_ingest_end, t_done − t0 and the rates over them; `None` when not every
    /// hook was delivered within the timeout.
    pub drain_s: Option<f64>,
    pub drain_delivered_per_s: Option<f64>,
    pub total_s: Option<f64>,
    pub overall_delivered_per_s: Option<f64>,
    /// `ankusa_delivered_total` at the poll that ended the drain (every hook, or what the
    /// timeout reached), and `ankusa_dead_lettered_total` a moment after it.
    pub delivered: u64,
    pub dead_lettered: u64,
    /// With keys: hooks that had no ordering key (must be 0).
    pub key_missing: Option<u64>,
    /// What the destination's count is (`XLEN bench-drain-123`, …) and the count, read back
    /// with the service's own client once the server has stopped.
    pub destination: String,
    pub destination_count: Option<u64>,
    /// SQS: what the run's consumer received (absent for the other kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs_consumer: Option<SqsConsumerStats>,
    /// Checks the run failed; any makes `drain` exit 1.
    pub failures: Vec<String>,
}

/// What the SQS consumer of a run did and received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SqsConsumerStats {
    /// Consumer tasks while the run lasted (then the final receive loop alone).
    pub tasks: usize,
    pub fifo: bool,
    /// ReceiveMessage requests answered, and the messages they carried.
    pub receives: u64,
    pub messages: u64,
    /// Distinct `ankusa_seq` received: the destination's count.
    pub distinct: u64,
    /// Messages whose `ankusa_seq` had been received before.
    pub redeliveries: u64,
    /// Messages without a readable `ankusa_seq` (must be 0).
    pub without_seq: u64,
    /// FIFO: messages whose seq was below the latest of their MessageGroupId (must be 0),
    /// and the first few of them; `None` on a standard queue.
    pub order_violations: Option<u64>,
    pub order_examples: Vec<String>,
    /// Failed or unanswered ReceiveMessage and DeleteMessageBatch requests, and entries a
    /// DeleteMessageBatch refused (each retried or redelivered; the first one said).
    pub receive_errors: u64,
    pub delete_errors: u64,
    pub first_error: Option<String>,
    /// Most messages waiting in the queue (delivered − distinct received) at the drain's
    /// polls after ingest.
    pub max_depth: u64,
}

impl DrainReport {
    pub fn failed(&self) -> bool {
        !self.failures.is_empty()
    }

    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

/// The checks of a run: every hook acked, every one delivered in time, none dead-lettered,
/// none without its key, and the destination holding at least every one. `count_error` is
/// why the destination could not be read back, if it could not.
pub fn failures(report: &DrainReport, count_error: Option<&str>) -> Vec<String> {
    let mut failures = Vec::new();
    if report.acked != report.hooks || report.other_status > 0 || report.errors > 0 {
        failures.push(format!(
            "{} of {} hooks were acked 2xx ({} other statuses, {} errors)",
            report.acked, report.hooks, report.other_status, report.errors
        ));
    }
    if report.total_s.is_none() {
        failures.push(format!(
            "delivered {} of {} hooks within the {} s timeout",
            report.delivered, report.acked, report.timeout_s
        ));
    }
    if report.dead_lettered > 0 {
        failures.push(format!(
            "{} hooks were dead-lettered ({DEAD_LETTERED}), must be 0",
            report.dead_lettered
        ));
    }
    if let Some(missing) = report.key_missing.filter(|missing| *missing > 0) {
        failures.push(format!(
            "{missing} hooks had no ordering key ({KEY_MISSING}), though every body carries one"
        ));
    }
    match (report.destination_count, count_error) {
        (_, Some(error)) => failures.push(format!("cannot read back the destination: {error}")),
        (Some(count), None) if count < report.acked => failures.push(format!(
            "the destination holds {count} ({}), fewer than the {} hooks acked \
             (at-least-once: at least every hook)",
            report.destination, report.acked
        )),
        (Some(_), None) => {}
        (None, None) => failures.push("the destination's count was not read".into()),
    }
    if let Some(consumer) = &report.sqs_consumer {
        if consumer.without_seq > 0 {
            failures.push(format!(
                "{} SQS messages had no readable {SEQ_ATTRIBUTE} attribute, though the sink \
                 sends it on every one",
                consumer.without_seq
            ));
        }
        if let Some(violations) = consumer.order_violations.filter(|count| *count > 0) {
            failures.push(format!(
                "{violations} SQS messages arrived below the latest {SEQ_ATTRIBUTE} of their \
                 MessageGroupId (each group must arrive in increasing order): {}",
                consumer.order_examples.join("; ")
            ));
        }
    }
    failures
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |value| format!("{value:.decimals$}"))
}

/// The run's table: a header and one row, then its failures.
pub fn render(report: &DrainReport) -> String {
    let header = [
        "sink",
        "keys",
        "hooks",
        "ingest hooks/s",
        "backlog@ingest end",
        "drain delivered/s",
        "overall delivered/s",
        "dead-lettered",
        "destination count",
        "checks",
    ];
    let row = vec![
        report.sink.name().to_string(),
        report.keys.to_string(),
        report.hooks.to_string(),
        format!("{:.0}", report.ingest_hooks_per_s),
        report.backlog_at_ingest_end.to_string(),
        optional(report.drain_delivered_per_s, 0),
        optional(report.overall_delivered_per_s, 0),
        report.dead_lettered.to_string(),
        report
            .destination_count
            .map_or_else(|| "-".to_string(), |count| count.to_string()),
        if report.failed() { "FAIL" } else { "ok" }.to_string(),
    ];
    let mut text = crate::report::table(&header, &[row], 1);
    let _ = writeln!(
        text,
        "ingest {:.2} s over {} connections, drain {} s after it, {} s in all; \
         destination: {}; binary {}{}",
        report.ingest_s,
        report.connections,
        optional(report.drain_s, 2),
        optional(report.total_s, 2),
        report.destination,
        report.binary,
        report
            .revision
            .as_ref()
            .map_or_else(String::new, |revision| format!(" ({revision})"))
    );
    if !report.sink_options.is_empty() {
        let options: Vec<String> = report
            .sink_options
            .iter()
            .map(|(key, value)| format!("{key}={}", flow_yaml(value)))
            .collect();
        let _ = writeln!(text, "sink options: {}", options.join(" "));
    }
    if let Some(consumer) = &report.sqs_consumer {
        let _ = writeln!(
            text,
            "SQS consumer: {} task{} ({}), {} receives, {} messages, {} distinct, {} \
             redelivered, {} receive and {} delete errors, queue depth at most {} at the polls",
            consumer.tasks,
            if consumer.tasks == 1 { "" } else { "s" },
            if consumer.fifo { "FIFO" } else { "standard" },
            consumer.receives,
            consumer.messages,
            consumer.distinct,
            consumer.redeliveries,
            consumer.receive_errors,
            consumer.delete_errors,
            consumer.max_depth
        );
    }
    for failure in &report.failures {
        let _ = writeln!(text, "FAIL: {failure}");
    }
    text
}

/// A gauge or counter sample as a count; negative or non-finite values read as 0.
fn as_count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value as u64
    } else {
        0
    }
}

/// Runs one drain measurement: prepares the destination, measures, reads the destination
/// back, removes it, and returns the report with its checks. Progress goes to stderr.
pub fn drain(settings: &DrainSettings, revision: Option<String>) -> anyhow::Result<DrainReport> {
    let problems = settings.problems();
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let started_unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let mut destination = Destination::prepare(settings.sink, std::process::id(), settings.keys)?;
    let target = destination.target();
    eprintln!(
        "bench-gate: drain {} sink ({}), {} hooks, {} keys, {} connections",
        settings.sink.name(),
        target.count_label(),
        settings.hooks,
        settings.keys,
        settings.connections
    );
    let measured = measure(settings, &mut destination, &target);
    // Read back and removed whatever happened, so a failed run leaves nothing behind.
    let count = match &measured {
        Ok(_) => Some(destination.count()),
        Err(_) => None,
    };
    let sqs_consumer = destination.sqs_stats();
    if let Err(error) = destination.remove() {
        eprintln!("bench-gate: drain: could not remove the destination: {error:#}");
    }
    let measured = measured?;
    let (destination_count, count_error) = match count {
        Some(Ok(count)) => (Some(count), None),
        Some(Err(error)) => (None, Some(format!("{error:#}"))),
        None => (None, None),
    };
    let rates = rates(
        measured.acked,
        measured.delivered_at_ingest_end,
        measured.ingest_s,
        measured.done_s,
    );
    let mut report = DrainReport {
        started_unix_s,
        binary: settings.bin.display().to_string(),
        revision,
        sink: settings.sink,
        keys: settings.keys,
        hooks: settings.hooks,
        connections: settings.connections,
        timeout_s: settings.timeout.as_secs_f64(),
        sink_options: settings
            .sink_options
            .iter()
            .map(|option| (option.key.clone(), option.value.clone()))
            .collect(),
        acked: measured.acked,
        other_status: measured.other_status,
        errors: measured.errors,
        ingest_s: measured.ingest_s,
        ingest_hooks_per_s: rates.ingest_hooks_per_s,
        delivered_at_ingest_end: measured.delivered_at_ingest_end,
        backlog_at_ingest_end: rates.backlog,
        drain_s: rates.drain_s,
        drain_delivered_per_s: rates.drain_delivered_per_s,
        total_s: measured.done_s,
        overall_delivered_per_s: rates.overall_delivered_per_s,
        delivered: measured.delivered,
        dead_lettered: measured.dead_lettered,
        key_missing: measured.key_missing,
        destination: target.count_label(),
        destination_count,
        sqs_consumer,
        failures: Vec::new(),
    };
    report.failures = failures(&report, count_error.as_deref());
    Ok(report)
}

/// What the server side of a run measured.
struct Measured {
    acked: u64,
    other_status: u64,
    errors: u64,
    ingest_s: f64,
    delivered_at_ingest_end: u64,
    /// Seconds after t0 of the poll that saw every acked hook delivered.
    done_s: Option<f64>,
    /// Delivered at that poll, or at the last one before the timeout.
    delivered: u64,
    dead_lettered: u64,
    key_missing: Option<u64>,
}

fn measure(
    settings: &DrainSettings,
    destination: &mut Destination,
    target: &Target,
) -> anyhow::Result<Measured> {
    let dir = tempfile::Builder::new()
        .prefix("bench-gate-drain-")
        .tempdir()
        .context("creating a temp dir")?;
    let config = dir.path().join("ankusa.yaml");
    std::fs::write(
        &config,
        server_yaml(
            &dir.path().join("data"),
            target,
            settings.keys,
            &settings.sink_options,
        ),
    )
    .context("writing the drain config")?;
    // The AWS default chain of the server finds moto's dummy credentials here.
    let env = if settings.sink == SinkKind::Sqs {
        SQS_ENV
    } else {
        &[]
    };
    let server = Ankusa::start(
        &settings.bin,
        &config,
        false,
        env,
        &dir.path().join("stderr.log"),
    )?;
    let plan = LoadPlan {
        target: server.ingest,
        connections: settings.connections,
        threads: 1,
        mode: Mode::Closed,
        // A moment to spare, so every connection is open before the first request.
        start_at: Instant::now() + Duration::from_millis(200),
        warmup: Duration::ZERO,
        measure: settings.timeout,
        drain: ANSWER_DRAIN,
        hooks: hook_spec(settings.keys),
        limit: Some(settings.hooks),
    };
    let t0 = plan.start_at;
    let deadline = t0 + settings.timeout;
    // SQS: consumed from here on, so moto's queue stays short.
    destination.start_consumer();
    let load = load::run(&plan)?;
    let ingest_end = Instant::now();
    let delivered_at_ingest_end = as_count(server.metrics()?.required(DELIVERED)?);
    let acked = load.total.status_2xx;
    let ingest_s = ingest_end.duration_since(t0).as_secs_f64();
    eprintln!(
        "bench-gate: drain: {acked} hooks acked in {ingest_s:.2} s; {} delivered then; draining",
        delivered_at_ingest_end
    );
    let mut done_s = None;
    let mut last_progress = Instant::now();
    // What the poll that ended the drain read: all delivered, or what the timeout reached.
    let delivered = loop {
        let now = Instant::now();
        let metrics = server.metrics()?;
        let delivered = as_count(metrics.required(DELIVERED)?);
        let dead = metrics.value(DEAD_LETTERED).map_or(0, as_count);
        let consumed = destination.observe(delivered);
        if delivered >= acked {
            done_s = Some(now.duration_since(t0).as_secs_f64());
            break delivered;
        }
        // Every row is delivered or dead-lettered: none is left to wait for.
        if delivered + dead >= acked || now >= deadline {
            break delivered;
        }
        if now.duration_since(last_progress) >= PROGRESS {
            eprintln!(
                "bench-gate: drain: {delivered} of {acked} delivered, {dead} dead-lettered{}",
                consumed.unwrap_or_default()
            );
            last_progress = now;
        }
        std::thread::sleep((now + POLL).saturating_duration_since(Instant::now()));
    };
    // A dead letter of the last moment shows once the gauges refresh.
    std::thread::sleep(GAUGE_SETTLE);
    let last = server.metrics()?;
    let measured = Measured {
        acked,
        other_status: load.total.status_other,
        errors: load.total.errors,
        ingest_s,
        delivered_at_ingest_end,
        done_s,
        delivered,
        dead_lettered: last.value(DEAD_LETTERED).map_or(0, as_count),
        key_missing: key_missing(&last, settings.sink, settings.keys),
    };
    server.stop()?;
    Ok(measured)
}

/// With keys, the hooks of the sink's kind that had none (an absent counter reads as 0).
fn key_missing(metrics: &Metrics, sink: SinkKind, keys: usize) -> Option<u64> {
    (keys > 0).then(|| {
        metrics
            .labelled_value(KEY_MISSING, &format!("sink=\"{}\"", sink.name()))
            .map_or(0, as_count)
    })
}

/// A small runtime for the async broker clients: one worker, so it takes little from the
/// server it shares the machine with.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-drain-io")
        .enable_all()
        .build()
        .context("starting a tokio runtime")
}

/// `future` on `runtime`, failing after [`BROKER_TIMEOUT`] with `what` in the message.
fn bounded<T, E>(
    runtime: &tokio::runtime::Runtime,
    what: &str,
    future: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    bounded_within(runtime, BROKER_TIMEOUT, what, future)
}

fn bounded_within<T, E>(
    runtime: &tokio::runtime::Runtime,
    limit: Duration,
    what: &str,
    future: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    // The timer is made inside the runtime: tokio's timers need its context.
    runtime
        .block_on(async { tokio::time::timeout(limit, future).await })
        .map_err(|_| anyhow::anyhow!("{what}: no answer within {} s", limit.as_secs_f64()))?
        .map_err(|error| anyhow::Error::new(error).context(what.to_string()))
}

fn unreachable(service: &str, url: &str) -> String {
    format!(
        "{service} at {url} is unreachable (the {service} sink needs it on loopback; \
         .ci/services starts Redis, NATS with JetStream, RabbitMQ, moto's SQS server and the \
         Pub/Sub emulator)"
    )
}

/// Fails with [`unreachable`] when nothing takes a TCP connection at `addr`.
fn probe(service: &str, addr: &str, url: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = addr.parse().context("a loopback address")?;
    TcpStream::connect_timeout(&addr, BROKER_TIMEOUT)
        .map(drop)
        .with_context(|| unreachable(service, url))
}

/// The destination of a run, live: the receiver, or the broker resource of this run.
enum Destination {
    Http(Responder),
    Redis {
        client: redis::Client,
        stream: String,
    },
    Nats {
        runtime: tokio::runtime::Runtime,
        stream: String,
        subject: String,
    },
    Rabbitmq {
        runtime: tokio::runtime::Runtime,
        queue: String,
    },
    /// The mock cluster lives as long as this: dropping it stops its brokers.
    Kafka {
        cluster: MockCluster<'static, DefaultProducerContext>,
        topic: String,
    },
    Sqs {
        runtime: tokio::runtime::Runtime,
        client: aws_sdk_sqs::Client,
        queue_url: String,
        /// Started just before the first hook is posted.
        consumer: Option<SqsConsumer>,
    },
    Pubsub(PubsubAdmin),
}

impl Destination {
    /// Starts the receiver, or makes the broker resource of process `pid` anew (removing a
    /// leftover of the same name first, so its count is this run's alone). With `keys > 0`
    /// the SQS queue is FIFO and the Pub/Sub subscription ordered.
    fn prepare(kind: SinkKind, pid: u32, keys: usize) -> anyhow::Result<Destination> {
        match kind {
            SinkKind::Http => Ok(Destination::Http(
                Responder::start(200).context("starting the in-process receiver")?,
            )),
            SinkKind::Redis => {
                let client = redis::Client::open(REDIS_URL).context("the Redis URL")?;
                let stream = redis_stream(pid);
                let mut connection = redis_connection(&client)?;
                let _: () = redis::cmd("DEL")
                    .arg(&stream)
                    .query(&mut connection)
                    .with_context(|| format!("Redis: DEL {stream}"))?;
                Ok(Destination::Redis { client, stream })
            }
            SinkKind::Nats => {
                let runtime = runtime()?;
                let (stream, subject) = (nats_stream(pid), nats_subject(pid));
                // The JetStream context spawns its acker: it needs the runtime's context,
                // kept until it is dropped.
                let _entered = runtime.enter();
                let jetstream = nats_jetstream(&runtime)?;
                // A leftover of this name may not exist; only the create must succeed.
                let _ = bounded(
                    &runtime,
                    "NATS: deleting a leftover stream",
                    jetstream.delete_stream(&stream),
                );
                let config = async_nats::jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![subject.clone()],
                    ..Default::default()
                };
                bounded(
                    &runtime,
                    &format!(
                        "NATS: creating JetStream stream {stream} on {subject} (is JetStream \
                         on? nats-server -js)"
                    ),
                    jetstream.create_stream(config),
                )?;
                Ok(Destination::Nats {
                    runtime,
                    stream,
                    subject,
                })
            }
            SinkKind::Rabbitmq => {
                let runtime = runtime()?;
                let queue = rabbitmq_queue(pid);
                let (connection, channel) = rabbitmq_channel(&runtime)?;
                bounded(
                    &runtime,
                    &format!("RabbitMQ: deleting a leftover queue {queue}"),
                    channel.queue_delete(
                        queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    ),
                )?;
                bounded(
                    &runtime,
                    &format!("RabbitMQ: declaring the durable queue {queue}"),
                    channel.queue_declare(
                        queue.as_str().into(),
                        lapin::options::QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        lapin::types::FieldTable::default(),
                    ),
                )?;
                rabbitmq_close(&runtime, &connection);
                Ok(Destination::Rabbitmq { runtime, queue })
            }
            SinkKind::Kafka => {
                let topic = kafka_topic(pid);
                let cluster = MockCluster::new(1)
                    .context("Kafka: starting librdkafka's mock cluster (one broker)")?;
                cluster
                    .create_topic(&topic, KAFKA_PARTITIONS, 1)
                    .with_context(|| {
                        format!("Kafka: creating topic {topic} on the mock cluster")
                    })?;
                Ok(Destination::Kafka { cluster, topic })
            }
            SinkKind::Sqs => {
                probe("SQS", "127.0.0.1:5000", SQS_ENDPOINT)?;
                let runtime = runtime()?;
                let client = sqs_client(&runtime);
                let name = sqs_queue(pid, keys > 0);
                // A leftover of this name may not exist; only the create must succeed.
                let leftover = bounded(
                    &runtime,
                    "SQS: looking up a leftover queue",
                    client.get_queue_url().queue_name(&name).send(),
                );
                if let Some(url) = leftover.ok().as_ref().and_then(|found| found.queue_url()) {
                    bounded(
                        &runtime,
                        &format!("SQS: deleting the leftover queue {name}"),
                        client.delete_queue().queue_url(url).send(),
                    )?;
                }
                let mut create = client.create_queue().queue_name(&name);
                if keys > 0 {
                    create = create
                        .attributes(QueueAttributeName::FifoQueue, "true")
                        .attributes(QueueAttributeName::ContentBasedDeduplication, "false");
                }
                let created = bounded(
                    &runtime,
                    &format!("SQS: creating queue {name}"),
                    create.send(),
                )?;
                let queue_url = created
                    .queue_url()
                    .with_context(|| format!("SQS: CreateQueue {name} answered without a URL"))?
                    .to_owned();
                Ok(Destination::Sqs {
                    runtime,
                    client,
                    queue_url,
                    consumer: None,
                })
            }
            SinkKind::Pubsub => {
                probe("Pub/Sub", "127.0.0.1:8085", PUBSUB_ENDPOINT)?;
                let admin = PubsubAdmin::new(pubsub_topic(pid));
                admin.prepare(keys > 0)?;
                Ok(Destination::Pubsub(admin))
            }
        }
    }

    fn target(&self) -> Target {
        match self {
            Destination::Http(responder) => Target::Http {
                receiver: responder.addr(),
            },
            Destination::Redis { stream, .. } => Target::Redis {
                url: REDIS_URL.into(),
                stream: stream.clone(),
            },
            Destination::Nats { subject, .. } => Target::Nats {
                url: NATS_URL.into(),
                subject: subject.clone(),
            },
            Destination::Rabbitmq { queue, .. } => Target::Rabbitmq {
                url: RABBITMQ_URL.into(),
                queue: queue.clone(),
            },
            Destination::Kafka { cluster, topic } => Target::Kafka {
                brokers: cluster.bootstrap_servers(),
                topic: topic.clone(),
            },
            Destination::Sqs { queue_url, .. } => Target::Sqs {
                endpoint: SQS_ENDPOINT.into(),
                region: SQS_REGION.into(),
                queue_url: queue_url.clone(),
            },
            Destination::Pubsub(admin) => Target::Pubsub {
                endpoint: PUBSUB_ENDPOINT.into(),
                project: PUBSUB_PROJECT.into(),
                topic: admin.topic.clone(),
            },
        }
    }

    /// SQS: starts the [`SQS_CONSUMERS`] consumer tasks of the run's queue; the other
    /// destinations are read only at the end.
    fn start_consumer(&mut self) {
        if let Destination::Sqs {
            runtime,
            client,
            queue_url,
            consumer,
        } = self
        {
            if consumer.is_none() {
                *consumer = Some(SqsConsumer::start(
                    runtime,
                    client.clone(),
                    queue_url.clone(),
                    SQS_CONSUMERS,
                ));
            }
        }
    }

    /// SQS: notes `delivered` against what the consumer has received (the queue's depth) and
    /// says both for the progress line; `None` for the other destinations.
    fn observe(&self, delivered: u64) -> Option<String> {
        match self {
            Destination::Sqs {
                consumer: Some(consumer),
                ..
            } => {
                let (distinct, depth) = consumer.observe(delivered);
                Some(format!(
                    ", {distinct} received by the SQS consumer (queue depth {depth})"
                ))
            }
            _ => None,
        }
    }

    /// SQS: what the consumer did and received so far.
    fn sqs_stats(&self) -> Option<SqsConsumerStats> {
        match self {
            Destination::Sqs {
                consumer: Some(consumer),
                ..
            } => Some(consumer.stats()),
            _ => None,
        }
    }

    /// What the destination holds (the receiver: requests it answered; SQS: the distinct
    /// hooks its consumer received, once it has taken what is left).
    fn count(&mut self) -> anyhow::Result<u64> {
        match self {
            Destination::Http(responder) => Ok(responder.requests()),
            Destination::Redis { client, stream } => {
                let mut connection = redis_connection(client)?;
                redis::cmd("XLEN")
                    .arg(stream.as_str())
                    .query(&mut connection)
                    .with_context(|| format!("Redis: XLEN {stream}"))
            }
            Destination::Nats {
                runtime, stream, ..
            } => {
                // The JetStream context spawns its acker: it needs the runtime's context,
                // kept until it is dropped.
                let _entered = runtime.enter();
                let jetstream = nats_jetstream(runtime)?;
                let mut handle = bounded(
                    runtime,
                    &format!("NATS: stream {stream}"),
                    jetstream.get_stream(stream.as_str()),
                )?;
                let info = bounded(
                    runtime,
                    &format!("NATS: stream {stream}'s info"),
                    handle.info(),
                )?;
                Ok(info.state.messages)
            }
            Destination::Rabbitmq { runtime, queue } => {
                let (connection, channel) = rabbitmq_channel(runtime)?;
                let declared = bounded(
                    runtime,
                    &format!("RabbitMQ: counting queue {queue}"),
                    channel.queue_declare(
                        queue.as_str().into(),
                        lapin::options::QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        lapin::types::FieldTable::default(),
                    ),
                );
                rabbitmq_close(runtime, &connection);
                Ok(u64::from(declared?.message_count()))
            }
            Destination::Kafka { cluster, topic } => {
                let consumer: BaseConsumer = ClientConfig::new()
                    .set("bootstrap.servers", cluster.bootstrap_servers())
                    .set("group.id", "bench-gate-drain")
                    .create()
                    .context("Kafka: creating a consumer of the mock cluster")?;
                let mut records = 0;
                for partition in 0..KAFKA_PARTITIONS {
                    let (_, high) = consumer
                        .fetch_watermarks(topic, partition, BROKER_TIMEOUT)
                        .with_context(|| {
                            format!("Kafka: the watermarks of {topic} partition {partition}")
                        })?;
                    records += u64::try_from(high).unwrap_or(0);
                }
                Ok(records)
            }
            Destination::Sqs {
                runtime,
                client,
                queue_url,
                consumer,
            } => consumer
                .get_or_insert_with(|| {
                    SqsConsumer::start(runtime, client.clone(), queue_url.clone(), 0)
                })
                .finish(runtime),
            Destination::Pubsub(admin) => admin.count(),
        }
    }

    /// Stops the receiver or the mock cluster, or deletes the run's stream, stream, queue,
    /// or topic and subscription.
    fn remove(self) -> anyhow::Result<()> {
        match self {
            Destination::Http(responder) => {
                responder.stop();
                Ok(())
            }
            Destination::Redis { client, stream } => {
                let mut connection = redis_connection(&client)?;
                redis::cmd("DEL")
                    .arg(&stream)
                    .query::<()>(&mut connection)
                    .with_context(|| format!("Redis: DEL {stream}"))
            }
            Destination::Nats {
                runtime, stream, ..
            } => {
                // The JetStream context spawns its acker: it needs the runtime's context,
                // kept until it is dropped.
                let _entered = runtime.enter();
                let jetstream = nats_jetstream(&runtime)?;
                bounded(
                    &runtime,
                    &format!("NATS: deleting stream {stream}"),
                    jetstream.delete_stream(&stream),
                )?;
                Ok(())
            }
            Destination::Rabbitmq { runtime, queue } => {
                let (connection, channel) = rabbitmq_channel(&runtime)?;
                let deleted = bounded(
                    &runtime,
                    &format!("RabbitMQ: deleting queue {queue}"),
                    channel.queue_delete(
                        queue.as_str().into(),
                        lapin::options::QueueDeleteOptions::default(),
                    ),
                );
                rabbitmq_close(&runtime, &connection);
                deleted.map(|_| ())
            }
            Destination::Kafka { cluster, .. } => {
                drop(cluster);
                Ok(())
            }
            Destination::Sqs {
                runtime,
                client,
                queue_url,
                consumer,
            } => {
                if let Some(consumer) = consumer {
                    consumer.abort();
                }
                bounded(
                    &runtime,
                    &format!("SQS: deleting queue {queue_url}"),
                    client.delete_queue().queue_url(&queue_url).send(),
                )
                .map(drop)
            }
            Destination::Pubsub(admin) => admin.remove(),
        }
    }
}

/// An SQS client of moto's server: HTTP through rustls with ring (no aws-lc), moto's dummy
/// credentials. Building it calls nothing.
fn sqs_client(runtime: &tokio::runtime::Runtime) -> aws_sdk_sqs::Client {
    let _entered = runtime.enter();
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https();
    let config = runtime.block_on(
        aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(SQS_REGION))
            .endpoint_url(SQS_ENDPOINT)
            .credentials_provider(Credentials::new(
                SQS_ENV[0].1,
                SQS_ENV[1].1,
                None,
                None,
                "bench-gate",
            ))
            .http_client(http)
            .load(),
    );
    aws_sdk_sqs::Client::new(&config)
}

/// What an SQS consumer has received: the distinct hooks by `ankusa_seq`, and on a FIFO
/// queue the latest seq of each MessageGroupId, against which the next is checked.
#[derive(Debug, Default)]
pub struct Received {
    seqs: HashSet<u64>,
    latest_in_group: HashMap<String, u64>,
    pub messages: u64,
    pub redeliveries: u64,
    pub without_seq: u64,
    pub order_violations: u64,
    /// The first [`ORDER_EXAMPLES`] violations, described.
    pub order_examples: Vec<String>,
}

impl Received {
    /// One message, in the order received: its `ankusa_seq` (`None`: it had no readable one)
    /// and on a FIFO queue its MessageGroupId. A seq below its group's latest is a violation;
    /// the latest again is a redelivery, not one.
    pub fn record(&mut self, seq: Option<u64>, group: Option<&str>) {
        self.messages += 1;
        let Some(seq) = seq else {
            self.without_seq += 1;
            return;
        };
        if !self.seqs.insert(seq) {
            self.redeliveries += 1;
        }
        let Some(group) = group else {
            return;
        };
        match self.latest_in_group.get_mut(group) {
            Some(latest) if seq < *latest => {
                self.order_violations += 1;
                if self.order_examples.len() < ORDER_EXAMPLES {
                    self.order_examples
                        .push(format!("group {group}: seq {seq} after {latest}"));
                }
            }
            Some(latest) => *latest = seq,
            None => {
                self.latest_in_group.insert(group.to_owned(), seq);
            }
        }
    }

    /// Distinct hooks received.
    pub fn distinct(&self) -> u64 {
        self.seqs.len() as u64
    }
}

/// The seq a received message carries in its `ankusa_seq` attribute.
fn seq_of(message: &aws_sdk_sqs::types::Message) -> Option<u64> {
    message
        .message_attributes()?
        .get(SEQ_ATTRIBUTE)?
        .string_value()?
        .parse()
        .ok()
}

/// The consumer's tallies, shared by its tasks.
#[derive(Debug, Default)]
struct Tally {
    received: Received,
    receives: u64,
    receive_errors: u64,
    delete_errors: u64,
    first_error: Option<String>,
    max_depth: u64,
}

/// What the consumer tasks share.
struct Consuming {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    fifo: bool,
    /// FIFO: the tasks' receives take turns (their deletes do not).
    receive_turn: tokio::sync::Mutex<()>,
    stop: AtomicBool,
    tally: Mutex<Tally>,
}

impl Consuming {
    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        // A task that panicked holding the lock left counts that are still counts.
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failed(&self, receive: bool, error: String) {
        let mut tally = self.tally();
        if receive {
            tally.receive_errors += 1;
        } else {
            tally.delete_errors += 1;
        }
        tally.first_error.get_or_insert(error);
    }

    /// One ReceiveMessage, what it got recorded, then one DeleteMessageBatch of it: the
    /// messages received, or `None` when the receive failed (after a pause). Each request is
    /// bounded by [`BROKER_TIMEOUT`]; a failed delete leaves its messages to be redelivered
    /// once their visibility ends (counted once).
    ///
    /// On a FIFO queue the receives take turns, each recorded before the next is sent, and
    /// poll without a wait. moto serves concurrent receives without a lock, each with its own
    /// snapshot of the groups in flight, so two at once could hand one group's consecutive
    /// messages to two tasks, which SQS never does; and a receive that finds only messages of
    /// groups in flight (their deletes not yet in) spins through its whole wait. A delete
    /// may run alongside the next receive: that receive either still sees the group in
    /// flight and skips its next message, or sees the delete done, after the record.
    async fn receive_once(&self) -> Option<usize> {
        let turn = if self.fifo {
            Some(self.receive_turn.lock().await)
        } else {
            None
        };
        let mut receive = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(SQS_RECEIVE_MAX)
            .wait_time_seconds(if self.fifo { 0 } else { SQS_WAIT_S })
            .visibility_timeout(SQS_VISIBILITY_S)
            .message_attribute_names(SEQ_ATTRIBUTE);
        if self.fifo {
            receive =
                receive.message_system_attribute_names(MessageSystemAttributeName::MessageGroupId);
        }
        let answer = match tokio::time::timeout(BROKER_TIMEOUT, receive.send()).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                drop(turn);
                self.failed(
                    true,
                    format!("ReceiveMessage: {}", DisplayErrorContext(&error)),
                );
                tokio::time::sleep(SQS_ERROR_PAUSE).await;
                return None;
            }
            Err(_) => {
                drop(turn);
                let limit = BROKER_TIMEOUT.as_secs_f64();
                self.failed(true, format!("ReceiveMessage: no answer within {limit} s"));
                return None;
            }
        };
        let messages = answer.messages();
        // Recorded before the delete: on a FIFO queue a group's next message is not handed
        // out while this one is in flight, so the order recorded is the order received.
        {
            let mut tally = self.tally();
            tally.receives += 1;
            for message in messages {
                let group = message
                    .attributes()
                    .and_then(|attributes| {
                        attributes.get(&MessageSystemAttributeName::MessageGroupId)
                    })
                    .map(String::as_str);
                tally.received.record(seq_of(message), group);
            }
        }
        drop(turn);
        if messages.is_empty() && self.fifo {
            tokio::time::sleep(SQS_EMPTY_PAUSE).await;
        }
        let entries: Vec<DeleteMessageBatchRequestEntry> = messages
            .iter()
            .enumerate()
            .filter_map(|(index, message)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(index.to_string())
                    .set_receipt_handle(message.receipt_handle().map(str::to_owned))
                    .build()
                    .ok()
            })
            .collect();
        if entries.is_empty() {
            return Some(messages.len());
        }
        let delete = self
            .client
            .delete_message_batch()
            .queue_url(&self.queue_url)
            .set_entries(Some(entries))
            .send();
        match tokio::time::timeout(BROKER_TIMEOUT, delete).await {
            Ok(Ok(answer)) => {
                if let Some(refused) = answer.failed().first() {
                    let error = format!(
                        "DeleteMessageBatch refused {} entries: {} {}",
                        answer.failed().len(),
                        refused.code(),
                        refused.message().unwrap_or_default()
                    );
                    let mut tally = self.tally();
                    tally.delete_errors += answer.failed().len() as u64;
                    tally.first_error.get_or_insert(error);
                }
            }
            Ok(Err(error)) => {
                self.failed(
                    false,
                    format!("DeleteMessageBatch: {}", DisplayErrorContext(&error)),
                );
                tokio::time::sleep(SQS_ERROR_PAUSE).await;
            }
            Err(_) => {
                let limit = BROKER_TIMEOUT.as_secs_f64();
                self.failed(
                    false,
                    format!("DeleteMessageBatch: no answer within {limit} s"),
                );
            }
        }
        Some(messages.len())
    }
}

/// The consumer of a run's SQS queue: tasks on the drain's runtime receiving and deleting
/// while the run lasts, then [`SqsConsumer::finish`]'s final receive loop.
struct SqsConsumer {
    consuming: Arc<Consuming>,
    /// Tasks started, and those not yet stopped.
    started: usize,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl SqsConsumer {
    /// Spawns `tasks` consumer tasks of `queue_url` (a FIFO queue when it ends `.fifo`).
    fn start(
        runtime: &tokio::runtime::Runtime,
        client: aws_sdk_sqs::Client,
        queue_url: String,
        tasks: usize,
    ) -> SqsConsumer {
        let consuming = Arc::new(Consuming {
            fifo: queue_url.ends_with(".fifo"),
            client,
            queue_url,
            receive_turn: tokio::sync::Mutex::new(()),
            stop: AtomicBool::new(false),
            tally: Mutex::new(Tally::default()),
        });
        let started = tasks;
        let tasks = (0..tasks)
            .map(|_| {
                let consuming = Arc::clone(&consuming);
                runtime.spawn(async move {
                    while !consuming.stop.load(Ordering::Relaxed) {
                        consuming.receive_once().await;
                    }
                })
            })
            .collect();
        SqsConsumer {
            consuming,
            started,
            tasks,
        }
    }

    /// Notes `delivered` hooks against the distinct ones received: (distinct, depth).
    fn observe(&self, delivered: u64) -> (u64, u64) {
        let mut tally = self.consuming.tally();
        let distinct = tally.received.distinct();
        let depth = delivered.saturating_sub(distinct);
        tally.max_depth = tally.max_depth.max(depth);
        (distinct, depth)
    }

    fn stats(&self) -> SqsConsumerStats {
        let tally = self.consuming.tally();
        SqsConsumerStats {
            tasks: self.started,
            fifo: self.consuming.fifo,
            receives: tally.receives,
            messages: tally.received.messages,
            distinct: tally.received.distinct(),
            redeliveries: tally.received.redeliveries,
            without_seq: tally.received.without_seq,
            order_violations: self
                .consuming
                .fifo
                .then_some(tally.received.order_violations),
            order_examples: tally.received.order_examples.clone(),
            receive_errors: tally.receive_errors,
            delete_errors: tally.delete_errors,
            first_error: tally.first_error.clone(),
            max_depth: tally.max_depth,
        }
    }

    /// Stops the tasks (each ends after its receive and delete), then receives and deletes
    /// until [`SQS_EMPTY_RECEIVES`] receives in a row come back empty: the distinct hooks
    /// received in all. Bounded by [`SQS_COUNT_LIMIT`]; [`SQS_FAILED_RECEIVES`] failed
    /// receives in a row end it with the error.
    fn finish(&mut self, runtime: &tokio::runtime::Runtime) -> anyhow::Result<u64> {
        let deadline = Instant::now() + SQS_COUNT_LIMIT;
        let queue_url = self.consuming.queue_url.clone();
        self.consuming.stop.store(true, Ordering::Relaxed);
        let tasks = std::mem::take(&mut self.tasks);
        let count = tasks.len();
        let aborts: Vec<_> = tasks.iter().map(|task| task.abort_handle()).collect();
        // A receive and a delete each within BROKER_TIMEOUT, and a pause.
        let limit = BROKER_TIMEOUT * 2 + Duration::from_secs(1);
        let joined = runtime.block_on(async {
            tokio::time::timeout(limit, async {
                for task in tasks {
                    let _ = task.await;
                }
            })
            .await
        });
        if joined.is_err() {
            aborts.iter().for_each(tokio::task::AbortHandle::abort);
            anyhow::bail!(
                "SQS: the {count} consumer tasks of {queue_url} did not stop within {} s",
                limit.as_secs_f64()
            );
        }
        let (mut empty, mut failed) = (0, 0);
        while empty < SQS_EMPTY_RECEIVES {
            let distinct = self.consuming.tally().received.distinct();
            anyhow::ensure!(
                Instant::now() < deadline,
                "SQS: still receiving from {queue_url} after {} s ({distinct} hooks so far)",
                SQS_COUNT_LIMIT.as_secs()
            );
            match runtime.block_on(self.consuming.receive_once()) {
                Some(0) => (empty, failed) = (empty + 1, 0),
                Some(_) => (empty, failed) = (0, 0),
                None => {
                    failed += 1;
                    if failed >= SQS_FAILED_RECEIVES {
                        let error = self.consuming.tally().first_error.clone();
                        anyhow::bail!(
                            "SQS: {failed} receives in a row from {queue_url} failed \
                             ({distinct} hooks so far); the first error: {}",
                            error.unwrap_or_default()
                        );
                    }
                }
            }
        }
        Ok(self.consuming.tally().received.distinct())
    }

    /// Stops the tasks at once (the run failed; nothing is counted).
    fn abort(&self) {
        self.consuming.stop.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The run's Pub/Sub topic and its subscription on the emulator, through its REST API.
struct PubsubAdmin {
    agent: ureq::Agent,
    topic: String,
}

/// An HTTP method of the emulator's REST API.
#[derive(Debug, Clone, Copy)]
enum Method {
    Put,
    Post,
    Delete,
}

impl PubsubAdmin {
    fn new(topic: String) -> PubsubAdmin {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(BROKER_TIMEOUT))
            .http_status_as_error(false)
            .build()
            .into();
        PubsubAdmin { agent, topic }
    }

    fn topic_path(&self) -> String {
        format!("projects/{PUBSUB_PROJECT}/topics/{}", self.topic)
    }

    fn subscription_path(&self) -> String {
        format!(
            "projects/{PUBSUB_PROJECT}/subscriptions/{}",
            pubsub_subscription(&self.topic)
        )
    }

    /// `method` on `/v1/{path}` with a JSON `body`: the answer's status and JSON (`null`
    /// when empty).
    fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let url = format!("{PUBSUB_ENDPOINT}/v1/{path}");
        let json = |builder: ureq::RequestBuilder<ureq::typestate::WithBody>| match body {
            Some(body) => builder
                .header("content-type", "application/json")
                .send(body.to_string()),
            None => builder.send_empty(),
        };
        let answer = match method {
            Method::Put => json(self.agent.put(&url)),
            Method::Post => json(self.agent.post(&url)),
            Method::Delete => self.agent.delete(&url).call(),
        };
        let mut answer = answer.with_context(|| format!("Pub/Sub: {method:?} {url}"))?;
        let status = answer.status().as_u16();
        let text = answer
            .body_mut()
            .with_config()
            .limit(PUBSUB_ANSWER_BYTES)
            .read_to_string()
            .with_context(|| format!("Pub/Sub: reading the answer to {method:?} {url}"))?;
        let value = if text.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&text)
                .with_context(|| format!("Pub/Sub: {method:?} {url} answered {status}: {text}"))?
        };
        Ok((status, value))
    }

    /// [`PubsubAdmin::call`] that must answer 2xx (or 404 when `absent_ok`).
    fn expect(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        absent_ok: bool,
    ) -> anyhow::Result<serde_json::Value> {
        let (status, value) = self.call(method, path, body)?;
        anyhow::ensure!(
            (200..300).contains(&status) || (absent_ok && status == 404),
            "Pub/Sub: {method:?} /v1/{path} answered {status}: {value}"
        );
        Ok(value)
    }

    /// Removes a leftover topic and subscription of the same names, then makes them anew;
    /// the subscription is ordered when `ordered`, and its ack deadline long enough that a
    /// message pulled is acknowledged before it could be redelivered.
    fn prepare(&self, ordered: bool) -> anyhow::Result<()> {
        self.expect(Method::Delete, &self.subscription_path(), None, true)?;
        self.expect(Method::Delete, &self.topic_path(), None, true)?;
        self.expect(Method::Put, &self.topic_path(), None, false)?;
        let subscription = serde_json::json!({
            "topic": self.topic_path(),
            "enableMessageOrdering": ordered,
            "ackDeadlineSeconds": 600,
        });
        self.expect(
            Method::Put,
            &self.subscription_path(),
            Some(&subscription),
            false,
        )?;
        Ok(())
    }

    /// Pulls and acknowledges until [`PUBSUB_EMPTY_PULLS`] pulls in a row come back empty;
    /// the distinct message ids seen. The emulator keeps no count of a topic, so this is the
    /// count; a message redelivered (not acknowledged within the deadline) keeps its id and
    /// is counted once, while a message published twice is two.
    fn count(&self) -> anyhow::Result<u64> {
        let subscription = self.subscription_path();
        let pull = serde_json::json!({"maxMessages": PUBSUB_PULL_MAX, "returnImmediately": true});
        let deadline = Instant::now() + PUBSUB_COUNT_LIMIT;
        let mut seen = HashSet::new();
        let mut empty = 0;
        while empty < PUBSUB_EMPTY_PULLS {
            anyhow::ensure!(
                Instant::now() < deadline,
                "Pub/Sub: still pulling from {subscription} after {} s ({} messages so far)",
                PUBSUB_COUNT_LIMIT.as_secs(),
                seen.len()
            );
            let answer = self.expect(
                Method::Post,
                &format!("{subscription}:pull"),
                Some(&pull),
                false,
            )?;
            let received = answer["receivedMessages"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            if received.is_empty() {
                empty += 1;
                std::thread::sleep(PUBSUB_EMPTY_PAUSE);
                continue;
            }
            empty = 0;
            let mut ack_ids = Vec::with_capacity(received.len());
            for message in received {
                let (Some(ack_id), Some(id)) = (
                    message["ackId"].as_str(),
                    message["message"]["messageId"].as_str(),
                ) else {
                    anyhow::bail!(
                        "Pub/Sub: a pulled message without ackId or messageId: {message}"
                    );
                };
                ack_ids.push(ack_id);
                seen.insert(id.to_owned());
            }
            self.expect(
                Method::Post,
                &format!("{subscription}:acknowledge"),
                Some(&serde_json::json!({ "ackIds": ack_ids })),
                false,
            )?;
        }
        Ok(seen.len() as u64)
    }

    /// Deletes the subscription and the topic (both tried).
    fn remove(&self) -> anyhow::Result<()> {
        let subscription = self.expect(Method::Delete, &self.subscription_path(), None, false);
        let topic = self.expect(Method::Delete, &self.topic_path(), None, false);
        subscription.and(topic).map(drop)
    }
}

fn redis_connection(client: &redis::Client) -> anyhow::Result<redis::Connection> {
    let connection = client
        .get_connection_with_timeout(BROKER_TIMEOUT)
        .with_context(|| unreachable("Redis", "127.0.0.1:6379"))?;
    connection
        .set_read_timeout(Some(BROKER_TIMEOUT))
        .and_then(|()| connection.set_write_timeout(Some(BROKER_TIMEOUT)))
        .context("Redis: setting timeouts")?;
    Ok(connection)
}

fn nats_jetstream(
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<async_nats::jetstream::Context> {
    let client = bounded(
        runtime,
        &unreachable("NATS", "127.0.0.1:4222"),
        async_nats::ConnectOptions::new()
            .connection_timeout(BROKER_TIMEOUT)
            .connect(NATS_URL),
    )?;
    Ok(async_nats::jetstream::new(client))
}

fn rabbitmq_channel(
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(lapin::Connection, lapin::Channel)> {
    let connection = bounded(
        runtime,
        &unreachable("RabbitMQ", "127.0.0.1:5672 (guest/guest, vhost /)"),
        lapin::Connection::connect(RABBITMQ_URL, lapin::ConnectionProperties::default()),
    )?;
    let channel = bounded(
        runtime,
        "RabbitMQ: opening a channel",
        connection.create_channel(),
    )?;
    Ok((connection, channel))
}

/// Closes an AMQP connection politely; a failure only leaves it for the broker to drop.
fn rabbitmq_close(runtime: &tokio::runtime::Runtime, connection: &lapin::Connection) {
    let _ = bounded(
        runtime,
        "RabbitMQ: closing the connection",
        connection.close(200, "OK".into()),
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> serde_json::Value {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
        serde_json::to_value(value).unwrap()
    }

    fn sink_of(yaml: &str) -> serde_json::Value {
        let config = parse(yaml);
        let sinks = config["sources"][0]["sinks"].as_array().unwrap().clone();
        assert_eq!(sinks.len(), 1, "{yaml}");
        sinks[0].clone()
    }

    #[test]
    fn names_are_per_process() {
        assert_eq!(redis_stream(42), "bench-drain-42");
        assert_eq!(rabbitmq_queue(42), "bench-drain-42");
        assert_eq!(nats_stream(42), "BENCH_DRAIN_42");
        assert_eq!(nats_subject(42), "bench.drain.42");
        assert_eq!(stream_of(&nats_subject(42)), nats_stream(42));
        assert_eq!(kafka_topic(42), "bench-drain-42");
        assert_eq!(sqs_queue(42, false), "bench-drain-42");
        assert_eq!(sqs_queue(42, true), "bench-drain-42.fifo");
        assert_eq!(pubsub_topic(42), "bench-drain-42");
        assert_eq!(
            pubsub_subscription(&pubsub_topic(42)),
            "bench-drain-42-count"
        );
        // Known only once the receiver listens, the mock cluster runs, the queue exists.
        for kind in [SinkKind::Http, SinkKind::Kafka, SinkKind::Sqs] {
            assert_eq!(Target::broker(kind, 42), None, "{kind:?}");
        }
    }

    fn kafka() -> Target {
        Target::Kafka {
            brokers: "127.0.0.1:39092".into(),
            topic: kafka_topic(7),
        }
    }

    fn sqs(fifo: bool) -> Target {
        Target::Sqs {
            endpoint: SQS_ENDPOINT.into(),
            region: SQS_REGION.into(),
            queue_url: format!("{SQS_ENDPOINT}/123456789012/{}", sqs_queue(7, fifo)),
        }
    }

    #[test]
    fn kafka_sqs_and_pubsub_sinks_are_configured_for_their_destinations() {
        let yaml = |target: &Target| server_yaml(Path::new("/d"), target, 0, &[]);
        assert_eq!(
            sink_of(&yaml(&kafka())),
            serde_json::json!({"kind": "kafka", "id": "drain", "brokers": "127.0.0.1:39092",
                               "topic": "bench-drain-7"})
        );
        assert_eq!(
            sink_of(&yaml(&sqs(false))),
            serde_json::json!({"kind": "sqs", "id": "drain",
                               "queue_url": "http://127.0.0.1:5000/123456789012/bench-drain-7",
                               "region": "us-east-1", "endpoint": "http://127.0.0.1:5000"})
        );
        let pubsub = Target::broker(SinkKind::Pubsub, 7).unwrap();
        assert_eq!(
            sink_of(&yaml(&pubsub)),
            serde_json::json!({"kind": "pubsub", "id": "drain", "project": "bench-gate",
                               "topic": "bench-drain-7", "endpoint": "http://127.0.0.1:8085"})
        );
        for target in [kafka(), sqs(false), pubsub] {
            let yaml = yaml(&target);
            assert!(!yaml.contains("ordered"), "{yaml}");
        }
        // Ordered: the same keys as every kind's, on the FIFO queue for SQS.
        for target in [
            kafka(),
            sqs(true),
            Target::broker(SinkKind::Pubsub, 7).unwrap(),
        ] {
            let sink = sink_of(&server_yaml(Path::new("/d"), &target, 100, &[]));
            assert_eq!(sink["kind"], target.kind().name());
            assert_eq!(sink["ordered"], true, "{sink}");
            assert_eq!(
                sink["ordering_key"],
                serde_json::json!({"json": "data.object.customer"})
            );
        }
        assert!(
            sink_of(&server_yaml(Path::new("/d"), &sqs(true), 100, &[]))["queue_url"]
                .as_str()
                .unwrap()
                .ends_with("/bench-drain-7.fifo")
        );
    }

    #[test]
    fn each_destination_count_is_labelled() {
        assert_eq!(
            kafka().count_label(),
            "sum of the high watermarks of topic bench-drain-7's 8 partitions"
        );
        assert_eq!(
            sqs(false).count_label(),
            "distinct hooks (ankusa_seq) received and deleted from queue bench-drain-7 while \
             the run lasted"
        );
        assert_eq!(
            sqs(true).count_label(),
            "distinct hooks (ankusa_seq) received and deleted from queue bench-drain-7.fifo \
             while the run lasted, each MessageGroupId in increasing order"
        );
        assert_eq!(
            Target::broker(SinkKind::Pubsub, 7).unwrap().count_label(),
            "distinct messages pulled from subscription \
             projects/bench-gate/subscriptions/bench-drain-7-count"
        );
        assert_eq!(
            Target::broker(SinkKind::Redis, 7).unwrap().count_label(),
            "XLEN bench-drain-7"
        );
        for kind in [SinkKind::Kafka, SinkKind::Sqs, SinkKind::Pubsub] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.name());
            assert_eq!(serde_json::from_value::<SinkKind>(json).unwrap(), kind);
        }
    }

    #[test]
    fn the_config_has_one_tenant_source_and_sink_with_sync_and_a_breaker_that_never_opens() {
        let target = Target::Http {
            receiver: "127.0.0.1:4000".parse().unwrap(),
        };
        let yaml = server_yaml(Path::new("/tmp/d/data"), &target, 0, &[]);
        let config = parse(&yaml);
        assert_eq!(config["instance"]["data_dir"], "/tmp/d/data");
        assert_eq!(config["instance"]["listen"], "127.0.0.1:0");
        assert_eq!(config["instance"]["admin_listen"], "127.0.0.1:0");
        assert_eq!(config["store"]["sync"], true);
        assert_eq!(config["dispatch"]["breaker_failures"], 100_000);
        assert_eq!(config["tenants"], serde_json::json!([{"id": "t0"}]));
        let sources = config["sources"].as_array().unwrap();
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0]["id"], "bench");
        assert_eq!(sources[0]["tenant"], "t0");
        assert_eq!(
            sink_of(&yaml),
            serde_json::json!({"kind": "http", "id": "drain", "url": "http://127.0.0.1:4000/drain"})
        );
    }

    #[test]
    fn each_sink_kind_is_configured_for_its_destination() {
        let yaml = |kind| server_yaml(Path::new("/d"), &Target::broker(kind, 7).unwrap(), 0, &[]);
        assert_eq!(
            sink_of(&yaml(SinkKind::Redis)),
            serde_json::json!({"kind": "redis", "id": "drain", "url": "redis://127.0.0.1:6379",
                               "stream": "bench-drain-7"})
        );
        assert_eq!(
            sink_of(&yaml(SinkKind::Nats)),
            serde_json::json!({"kind": "nats", "id": "drain", "url": "nats://127.0.0.1:4222",
                               "subject": "bench.drain.7"})
        );
        assert_eq!(
            sink_of(&yaml(SinkKind::Rabbitmq)),
            serde_json::json!({"kind": "rabbitmq", "id": "drain",
                               "url": "amqp://guest:guest@127.0.0.1:5672/%2f",
                               "exchange": "", "routing_key": "bench-drain-7"})
        );
        for kind in [SinkKind::Redis, SinkKind::Nats, SinkKind::Rabbitmq] {
            let yaml = yaml(kind);
            assert!(!yaml.contains("ordered"), "{yaml}");
            assert!(
                yaml.contains("dispatch: {breaker_failures: 100000}\n"),
                "{yaml}"
            );
        }
    }

    #[test]
    fn keys_make_the_sink_ordered_on_the_customer_and_the_load_keyed() {
        let targets = [
            Target::Http {
                receiver: "127.0.0.1:4000".parse().unwrap(),
            },
            Target::broker(SinkKind::Redis, 7).unwrap(),
            Target::broker(SinkKind::Nats, 7).unwrap(),
            Target::broker(SinkKind::Rabbitmq, 7).unwrap(),
        ];
        for target in &targets {
            let sink = sink_of(&server_yaml(Path::new("/d"), target, 1000, &[]));
            assert_eq!(sink["kind"], target.kind().name());
            assert_eq!(sink["ordered"], true, "{sink}");
            assert_eq!(
                sink["ordering_key"],
                serde_json::json!({"json": "data.object.customer"})
            );
        }
        assert_eq!(hook_spec(0).ordering_keys, None);
        let keyed = hook_spec(1000);
        assert_eq!(keyed.ordering_keys, Some(1000));
        assert_eq!(
            (keyed.shape, keyed.body_bytes, keyed.signing),
            (Shape::Stripe, 1024, Signing::None)
        );
        assert_eq!(keyed.paths, ["/hooks/bench"]);
        // The keyed bodies are built, so the key count is in range.
        crate::hooks::RequestFactory::new(&keyed).unwrap();
    }

    #[test]
    fn rates_split_ingest_and_drain() {
        // 20,000 hooks acked in 4 s, 5,000 delivered by then, all at 10 s.
        let rates = rates(20_000, 5_000, 4.0, Some(10.0));
        assert_eq!(rates.ingest_hooks_per_s, 5_000.0);
        assert_eq!(rates.backlog, 15_000);
        assert_eq!(rates.drain_s, Some(6.0));
        assert_eq!(rates.drain_delivered_per_s, Some(2_500.0));
        assert_eq!(rates.overall_delivered_per_s, Some(2_000.0));
        // Not all delivered: no drain rates, the rest stands.
        let rates = super::rates(20_000, 5_000, 4.0, None);
        assert_eq!(
            (rates.backlog, rates.drain_s, rates.drain_delivered_per_s),
            (15_000, None, None)
        );
        assert_eq!(rates.overall_delivered_per_s, None);
        // No backlog: nothing drained after ingest, so no drain rate.
        let rates = super::rates(100, 100, 0.5, Some(0.5));
        assert_eq!((rates.backlog, rates.drain_delivered_per_s), (0, None));
        assert_eq!(rates.overall_delivered_per_s, Some(200.0));
        // Zero times never divide.
        let rates = super::rates(0, 0, 0.0, Some(0.0));
        assert_eq!(rates.ingest_hooks_per_s, 0.0);
        assert_eq!(rates.overall_delivered_per_s, None);
        // A stale gauge above the acked count is no negative backlog.
        assert_eq!(super::rates(10, 12, 1.0, Some(2.0)).backlog, 0);
    }

    fn report() -> DrainReport {
        DrainReport {
            started_unix_s: 0,
            binary: "/bin/ankusa".into(),
            revision: Some("abc1234".into()),
            sink: SinkKind::Redis,
            keys: 1000,
            hooks: 20_000,
            connections: 64,
            timeout_s: 600.0,
            sink_options: serde_json::Map::new(),
            acked: 20_000,
            other_status: 0,
            errors: 0,
            ingest_s: 4.0,
            ingest_hooks_per_s: 5_000.0,
            delivered_at_ingest_end: 5_000,
            backlog_at_ingest_end: 15_000,
            drain_s: Some(6.0),
            drain_delivered_per_s: Some(2_500.0),
            total_s: Some(10.0),
            overall_delivered_per_s: Some(2_000.0),
            delivered: 20_000,
            dead_lettered: 0,
            key_missing: Some(0),
            destination: "XLEN bench-drain-7".into(),
            destination_count: Some(20_000),
            sqs_consumer: None,
            failures: Vec::new(),
        }
    }

    #[test]
    fn checks_need_every_hook_acked_delivered_and_at_the_destination() {
        let good = report();
        assert!(failures(&good, None).is_empty());
        // At-least-once: a redelivery is more, never a failure.
        let more = DrainReport {
            destination_count: Some(20_003),
            ..good.clone()
        };
        assert!(failures(&more, None).is_empty());
        let bad = DrainReport {
            acked: 19_990,
            other_status: 10,
            total_s: None,
            delivered: 19_000,
            dead_lettered: 2,
            key_missing: Some(3),
            destination_count: Some(18_999),
            ..good.clone()
        };
        assert_eq!(
            failures(&bad, None),
            [
                "19990 of 20000 hooks were acked 2xx (10 other statuses, 0 errors)",
                "delivered 19000 of 19990 hooks within the 600 s timeout",
                "2 hooks were dead-lettered (ankusa_dead_lettered_total), must be 0",
                "3 hooks had no ordering key (ankusa_dispatch_lane_key_missing_total), though \
                 every body carries one",
                "the destination holds 18999 (XLEN bench-drain-7), fewer than the 19990 hooks \
                 acked (at-least-once: at least every hook)",
            ]
        );
        let unread = DrainReport {
            destination_count: None,
            ..good
        };
        assert_eq!(
            failures(&unread, Some("Redis: XLEN x: broken pipe")),
            ["cannot read back the destination: Redis: XLEN x: broken pipe"]
        );
    }

    #[test]
    fn the_row_and_its_json() {
        let report = report();
        assert_eq!(
            render(&report),
            "sink   keys  hooks  ingest hooks/s  backlog@ingest end  drain delivered/s  \
             overall delivered/s  dead-lettered  destination count  checks\n\
             redis  1000  20000            5000               15000               2500\
             \x20                2000              0              20000      ok\n\
             ingest 4.00 s over 64 connections, drain 6.00 s after it, 10.00 s in all; \
             destination: XLEN bench-drain-7; binary /bin/ankusa (abc1234)\n"
        );
        let failed = DrainReport {
            total_s: None,
            drain_s: None,
            drain_delivered_per_s: None,
            overall_delivered_per_s: None,
            failures: vec!["delivered 1 of 2 hooks within the 600 s timeout".into()],
            ..report.clone()
        };
        let text = render(&failed);
        assert!(text.contains("  -  "), "{text}");
        assert!(text.lines().nth(1).unwrap().ends_with("FAIL"), "{text}");
        assert!(text.ends_with("FAIL: delivered 1 of 2 hooks within the 600 s timeout\n"));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["sink"], "redis");
        assert_eq!(json["backlog_at_ingest_end"], 15_000);
        assert_eq!(json["drain_delivered_per_s"], 2_500.0);
        assert_eq!(json["destination_count"], 20_000);
        let back: DrainReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn settings_are_checked() {
        let settings = DrainSettings {
            bin: PathBuf::from("/bin/ankusa"),
            sink: SinkKind::Nats,
            hooks: 100_000,
            keys: 0,
            connections: 64,
            timeout: Duration::from_secs(600),
            sink_options: vec![parse_sink_option("max_in_flight=8").unwrap()],
        };
        assert!(settings.problems().is_empty());
        let bad = DrainSettings {
            hooks: 0,
            keys: ORDERING_KEYS_MAX + 1,
            connections: 0,
            timeout: Duration::ZERO,
            ..settings
        };
        assert_eq!(
            bad.problems(),
            [
                "--hooks must be between 1 and 1000000, found 0",
                "--keys must be between 0 and 1000000, found 1000001",
                "--connections must be between 1 and 4096, found 0",
                "--timeout-s must be between 1 and 3600, found 0",
            ]
        );
    }

    fn option(text: &str) -> SinkOption {
        parse_sink_option(text).unwrap()
    }

    #[test]
    fn a_sink_option_is_a_key_and_a_yaml_value() {
        assert_eq!(option("max_in_flight=8").value, serde_json::json!(8));
        assert_eq!(option("compression=zstd").value, serde_json::json!("zstd"));
        assert_eq!(option("ordered_retry=true").value, serde_json::json!(true));
        assert_eq!(
            option(r#"client={"linger.ms": "1"}"#),
            SinkOption {
                key: "client".into(),
                value: serde_json::json!({"linger.ms": "1"}),
            }
        );
        // Flow YAML too, and the value is split off at the first '='.
        assert_eq!(
            option("client={linger.ms: 5, acks: all}").value,
            serde_json::json!({"linger.ms": 5, "acks": "all"})
        );
        assert_eq!(option("x=a=b").value, serde_json::json!("a=b"));
        assert_eq!(option("list=[1, two]").value, serde_json::json!([1, "two"]));
        for (text, error) in [
            ("max_in_flight", "\"max_in_flight\" is not KEY=VALUE"),
            ("=8", "\"\" is not a sink key"),
            ("max in flight=8", "\"max in flight\" is not a sink key"),
            ("max_in_flight=", "max_in_flight: the value is empty"),
            (
                "client={linger.ms: 1",
                "client: the value \"{linger.ms: 1\" is not YAML",
            ),
        ] {
            let refused = parse_sink_option(text).unwrap_err();
            assert!(refused.starts_with(error), "{text}: {refused}");
        }
    }

    #[test]
    fn sink_options_are_merged_as_top_level_keys_of_the_sink_entry() {
        let options = [
            option("max_in_flight=8"),
            option(r#"client={"linger.ms": "1", "queue.buffering.max.messages": 100000}"#),
            option("compression='a, b: {c}'"),
            option(r#"note="it's \"quoted\"\n""#),
            option("list=[1, [2, {x: y}]]"),
        ];
        let sink = sink_of(&server_yaml(Path::new("/d"), &kafka(), 0, &options));
        assert_eq!(
            sink,
            serde_json::json!({
                "kind": "kafka", "id": "drain", "brokers": "127.0.0.1:39092",
                "topic": "bench-drain-7", "max_in_flight": 8,
                "client": {"linger.ms": "1", "queue.buffering.max.messages": 100_000},
                "compression": "a, b: {c}", "note": "it's \"quoted\"\n",
                "list": [1, [2, {"x": "y"}]],
            })
        );
        // With keys the ordering stays, the options after it; none: the entry as it was.
        let ordered = sink_of(&server_yaml(
            Path::new("/d"),
            &sqs(true),
            100,
            &[option("max_in_flight=8")],
        ));
        assert_eq!(ordered["ordered"], true);
        assert_eq!(ordered["max_in_flight"], 8);
        assert_eq!(kafka().sink_entry(0, &[]), kafka().sink_yaml(0));
    }

    #[test]
    fn sink_options_the_drain_sets_are_refused() {
        let kinds = [
            SinkKind::Http,
            SinkKind::Redis,
            SinkKind::Nats,
            SinkKind::Rabbitmq,
            SinkKind::Kafka,
            SinkKind::Sqs,
            SinkKind::Pubsub,
        ];
        for kind in kinds {
            for key in ["kind", "id", "ordered", "ordering_key"] {
                assert!(kind.drain_keys().contains(&key), "{kind:?} {key}");
            }
            for key in kind.drain_keys() {
                let problems = sink_option_problems(kind, &[option(&format!("{key}=x"))]);
                assert_eq!(problems.len(), 1, "{kind:?} {key}");
                assert!(
                    problems[0].starts_with(&format!(
                        "--sink-option {key}: the drain sets {key} itself for a {} sink",
                        kind.name()
                    )),
                    "{}",
                    problems[0]
                );
            }
            // Each key the drain writes for the kind is on its list.
            let target = match kind {
                SinkKind::Http => Target::Http {
                    receiver: "127.0.0.1:4000".parse().unwrap(),
                },
                SinkKind::Kafka => kafka(),
                SinkKind::Sqs => sqs(true),
                _ => Target::broker(kind, 7).unwrap(),
            };
            let entry = sink_of(&server_yaml(Path::new("/d"), &target, 10, &[]));
            for key in entry.as_object().unwrap().keys() {
                assert!(kind.drain_keys().contains(&key.as_str()), "{kind:?} {key}");
            }
        }
        assert_eq!(
            sink_option_problems(SinkKind::Kafka, &[option("topic=other")]),
            [
                "--sink-option topic: the drain sets topic itself for a kafka sink (the \
              destination is this run's own, made and removed by the drain); it sets kind, id, \
              brokers, topic, ordered, ordering_key"
            ]
        );
        assert_eq!(
            sink_option_problems(SinkKind::Sqs, &[option("ordered=true")]),
            [
                "--sink-option ordered: the drain sets ordered itself for a sqs sink (--keys N \
              makes the sink ordered on data.object.customer); it sets kind, id, queue_url, \
              region, endpoint, ordered, ordering_key"
            ]
        );
        // Another kind's destination key is the sink's to refuse, not the drain's.
        assert!(sink_option_problems(SinkKind::Kafka, &[option("stream=s")]).is_empty());
        assert_eq!(
            sink_option_problems(
                SinkKind::Kafka,
                &[option("linger=1"), option("acks=all"), option("linger=2")]
            ),
            ["--sink-option linger is given more than once"]
        );
        // Checked with the other settings, before anything runs.
        let settings = DrainSettings {
            bin: PathBuf::from("/bin/ankusa"),
            sink: SinkKind::Redis,
            hooks: 10,
            keys: 0,
            connections: 1,
            timeout: Duration::from_secs(60),
            sink_options: vec![option("stream=x")],
        };
        let problems = settings.problems();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("--sink-option stream: the drain sets stream"));
    }

    #[test]
    fn the_sqs_consumer_counts_distinct_hooks_and_checks_each_groups_order() {
        let mut received = Received::default();
        // A standard queue: no groups, any order; a redelivery is counted once.
        for seq in [3, 1, 2, 3] {
            received.record(Some(seq), None);
        }
        received.record(None, None);
        assert_eq!(
            (
                received.messages,
                received.distinct(),
                received.redeliveries
            ),
            (5, 3, 1)
        );
        assert_eq!((received.without_seq, received.order_violations), (1, 0));

        let mut fifo = Received::default();
        for (seq, group) in [(1, "a"), (2, "b"), (3, "a"), (3, "a"), (4, "b"), (5, "a")] {
            fifo.record(Some(seq), Some(group));
        }
        // The latest again is a redelivery, not out of order.
        assert_eq!((fifo.distinct(), fifo.redeliveries), (5, 1));
        assert_eq!(fifo.order_violations, 0);
        // Below its group's latest, whether new or seen before: out of order.
        fifo.record(Some(2), Some("a"));
        fifo.record(Some(1), Some("a"));
        fifo.record(Some(6), Some("b"));
        assert_eq!(fifo.order_violations, 2);
        assert_eq!(
            fifo.order_examples,
            ["group a: seq 2 after 5", "group a: seq 1 after 5"]
        );
        assert_eq!((fifo.distinct(), fifo.redeliveries), (6, 3));
        // Counted all, described the first few.
        for seq in 0..10 {
            fifo.record(Some(seq), Some("b"));
        }
        assert_eq!(fifo.order_violations, 8);
        assert_eq!(fifo.order_examples.len(), ORDER_EXAMPLES);
    }

    fn consumer_stats() -> SqsConsumerStats {
        SqsConsumerStats {
            tasks: 1,
            fifo: true,
            receives: 3000,
            messages: 20_001,
            distinct: 20_000,
            redeliveries: 1,
            without_seq: 0,
            order_violations: Some(0),
            order_examples: Vec::new(),
            receive_errors: 2,
            delete_errors: 0,
            first_error: Some("ReceiveMessage: no answer within 10 s".into()),
            max_depth: 40,
        }
    }

    #[test]
    fn the_sqs_consumer_fails_a_run_for_order_and_missing_seqs() {
        let good = DrainReport {
            sink: SinkKind::Sqs,
            sqs_consumer: Some(consumer_stats()),
            ..report()
        };
        assert!(failures(&good, None).is_empty());
        let bad = DrainReport {
            sqs_consumer: Some(SqsConsumerStats {
                without_seq: 2,
                order_violations: Some(2),
                order_examples: vec![
                    "group cus_1: seq 9 after 12".into(),
                    "group cus_4: seq 3 after 5".into(),
                ],
                ..consumer_stats()
            }),
            ..good.clone()
        };
        assert_eq!(
            failures(&bad, None),
            [
                "2 SQS messages had no readable ankusa_seq attribute, though the sink sends it \
                 on every one",
                "2 SQS messages arrived below the latest ankusa_seq of their MessageGroupId \
                 (each group must arrive in increasing order): group cus_1: seq 9 after 12; \
                 group cus_4: seq 3 after 5",
            ]
        );
        // A standard queue has no order to check.
        let standard = DrainReport {
            sqs_consumer: Some(SqsConsumerStats {
                fifo: false,
                order_violations: None,
                ..consumer_stats()
            }),
            ..good
        };
        assert!(failures(&standard, None).is_empty());
    }

    #[test]
    fn options_and_the_sqs_consumer_are_in_the_row_and_the_json() {
        let mut options = serde_json::Map::new();
        options.insert("client".into(), serde_json::json!({"linger.ms": "1"}));
        options.insert("max_in_flight".into(), serde_json::json!(8));
        let report = DrainReport {
            sink: SinkKind::Sqs,
            sink_options: options,
            sqs_consumer: Some(consumer_stats()),
            ..report()
        };
        let text = render(&report);
        assert!(
            text.contains("\nsink options: client={\"linger.ms\": \"1\"} max_in_flight=8\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\nSQS consumer: 1 task (FIFO), 3000 receives, 20001 messages, 20000 distinct, 1 \
                 redelivered, 2 receive and 0 delete errors, queue depth at most 40 at the polls\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["sink_options"]["client"]["linger.ms"], "1");
        assert_eq!(json["sqs_consumer"]["order_violations"], 0);
        let back: DrainReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        // The other kinds have no consumer in their JSON; a report without options reads.
        let mut plain = serde_json::to_value(super::tests::report()).unwrap();
        assert!(plain.get("sqs_consumer").is_none());
        plain.as_object_mut().unwrap().remove("sink_options");
        let back: DrainReport = serde_json::from_value(plain).unwrap();
        assert!(back.sink_options.is_empty());
    }

    #[test]
    fn broker_operations_are_bounded_and_name_what_failed() {
        let runtime = runtime().unwrap();
        let ok: anyhow::Result<u8> =
            bounded(&runtime, "ready", async { Ok::<u8, std::io::Error>(7) });
        assert_eq!(ok.unwrap(), 7);
        let failed = bounded(&runtime, "Redis: XLEN x", async {
            Err::<u8, _>(std::io::Error::other("broken pipe"))
        });
        assert_eq!(
            format!("{:#}", failed.unwrap_err()),
            "Redis: XLEN x: broken pipe"
        );
        let hung = bounded_within(
            &runtime,
            Duration::from_millis(20),
            "NATS: stream S",
            std::future::pending::<Result<u8, std::io::Error>>(),
        );
        assert_eq!(
            hung.unwrap_err().to_string(),
            "NATS: stream S: no answer within 0.02 s"
        );
    }

    #[test]
    fn an_unreachable_service_is_named() {
        assert_eq!(
            unreachable("NATS", "127.0.0.1:4222"),
            "NATS at 127.0.0.1:4222 is unreachable (the NATS sink needs it on loopback; \
             .ci/services starts Redis, NATS with JetStream, RabbitMQ, moto's SQS server and \
             the Pub/Sub emulator)"
        );
        // Port 1 takes no connection.
        let refused = probe("SQS", "127.0.0.1:1", "http://127.0.0.1:1").unwrap_err();
        assert!(
            format!("{refused:#}").starts_with("SQS at http://127.0.0.1:1 is unreachable"),
            "{refused:#}"
        );
    }

    #[test]
    fn key_misses_are_read_for_the_sinks_kind_only_with_keys() {
        let metrics = Metrics {
            text: "ankusa_dispatch_lane_key_missing_total{sink=\"nats\"} 4\n".into(),
        };
        assert_eq!(key_missing(&metrics, SinkKind::Nats, 10), Some(4));
        assert_eq!(key_missing(&metrics, SinkKind::Redis, 10), Some(0));
        assert_eq!(key_missing(&metrics, SinkKind::Nats, 0), None);
    }
}
