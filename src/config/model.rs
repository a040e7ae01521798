//! The validated configuration: what every other module takes. Built only by
//! `config::load`/`config::parse` after every check in `config::validate` has passed, so
//! code that holds a `Config` never re-checks it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Config {
    pub instance: Instance,
    pub store: Store,
    pub edge: Edge,
    pub writer: Writer,
    pub dispatch: Dispatch,
    pub retry: Retry,
    pub archive: Archive,
    pub admission: Admission,
    /// Bounds of a tenant that names none, and of every auto tenant.
    pub tenant_defaults: TenantBounds,
    /// Declared tenants, in file order.
    pub tenants: Vec<Tenant>,
    pub sources: Vec<Source>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Bearer token for `/v1/`; required when `admin_listen` is not loopback.
    pub admin_token: Option<String>,
    pub cores: Cores,
    /// Instance default policy; a source may override it.
    pub store_headers: HeaderPolicy,
}

/// Core placement by role. `None` fields were not given and take the machine default,
/// resolved by `shards::Placement` at startup (it knows the machine's cores).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cores {
    pub ingest: Option<Vec<usize>>,
    pub writer: Option<usize>,
    pub pipeline: Option<Vec<usize>>,
    pub sink_io: Option<Vec<usize>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    /// `false` weakens durability: a 2xx no longer means the WAL is on disk.
    pub sync: bool,
    /// Free space of the data directory kept for delivery: under it the edge answers 503
    /// `disk_full` (0: never).
    pub min_free_bytes: u64,
    /// RocksDB's block cache and memtable bounds (`block_cache_bytes`, `memtable_bytes`).
    pub memory: crate::store::Memory,
}

/// Limits of the ingest edge. Every refusal is a status and a JSON error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub body_max_bytes: usize,
    pub header_count_max: usize,
    pub header_bytes_max: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// Per ingest core.
    pub connections_max: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// Envelopes the edge may queue before it answers 503.
    pub channel_capacity: usize,
    pub batch_max: usize,
    pub batch_bytes_max: usize,
}

#[derive(Debug, Clone)]
pub struct Dispatch {
    /// Due rows claimed per tenant visit.
    pub batch: usize,
    /// Attempts in flight at once per (tenant, sink).
    pub sink_concurrency: usize,
    /// Threads of the pool that runs blocking sink clients (HTTP), shared by every sink.
    pub blocking_threads: usize,
    /// Consecutive failed attempts that open a sink's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker parks its sink's rows before one probe is let through.
    pub breaker_open_ms: u64,
    /// The longest open period: each failed probe doubles it up to this.
    pub breaker_open_max_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Archive {
    /// How long a delivered hook stays in the archive for replay; 0 deletes delivered
    /// hooks at once.
    pub retention_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Retry {
    pub initial_ms: u64,
    pub max_ms: u64,
    pub max_elapsed_ms: u64,
}

/// Node-wide admission: what the edge refuses with 503 before any tenant bound is reached,
/// and the Retry-After it names with each refusal.
#[derive(Debug, Clone)]
pub struct Admission {
    /// Pending delivery rows of the whole node.
    pub max_pending: u64,
    /// Sum of the sizes of the node's pending rows.
    pub max_bytes: u64,
    /// Tenants that `auto_tenants` sources may create, in all.
    pub auto_tenants_max: u64,
    /// Retry-After of a 503 that no drain rate predicts (writer saturated, store
    /// unavailable, disk full), and of a node-bound 503 before the node's drain is measured.
    pub retry_after_s: u32,
    /// Retry-After of a 429 before the tenant's drain is measured (the first second).
    pub tenant_retry_after_s: u32,
    /// The longest Retry-After a bound's refusal names (a backlog that does not drain).
    pub retry_after_max_s: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantBounds {
    pub max_pending: u64,
    pub max_bytes: u64,
    /// Hooks kept in quarantine at most; past it a failing hook is refused but not kept.
    pub max_quarantined: u64,
    /// Hooks (replay) or rows (revive) per second an archive replay or a DLQ revive of
    /// the tenant may inject: the refill of the job's token bucket.
    pub replay_rate_per_s: u64,
    /// Hooks or rows a replay or revive may have injected and not yet seen through their
    /// first attempt: at most this many of its own rows sit in front of live ones.
    pub replay_max_pending: u64,
    /// Attempts of replayed or revived rows that may run at once per sink of the tenant:
    /// the rest of `dispatch.sink_concurrency` stays free for live rows.
    pub replay_concurrency: u64,
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: String,
    pub bounds: TenantBounds,
}

#[derive(Debug, Clone)]
pub struct Source {
    pub id: String,
    /// `provider: NAME`: the preset that filled in verify, dedupe, its window and
    /// store_headers where the source left them out (`config::presets`).
    pub provider: Option<&'static str>,
    pub tenancy: Tenancy,
    pub verify: Verify,
    pub dedupe: Option<Dedupe>,
    /// How long a dedupe key is remembered after its first hook.
    pub dedupe_window_ms: u64,
    /// Resolved: the source override or else the instance default.
    pub store_headers: HeaderPolicy,
    /// Keep hooks that fail verification or cannot be decoded (`?Q`), for inspection
    /// and release.
    pub quarantine: bool,
    pub sinks: Vec<SinkEntry>,
}

impl Source {
    /// Whether any sink of the source is ordered: only then does the edge resolve
    /// ordering keys.
    pub fn ordered(&self) -> bool {
        self.sinks.iter().any(|sink| sink.ordering.is_some())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tenancy {
    /// The source names its tenant: `POST /hooks/{source}`.
    Fixed(String),
    /// `tenant_from: path`: `POST /hooks/{source}/{tenant}`. With `auto`, a tenant the
    /// file does not declare is created on its first hook, with the default bounds.
    Path { auto: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    None,
    /// `header` carries the token verbatim (default `authorization`, `Bearer ` stripped).
    Token {
        header: String,
        token: String,
    },
    /// Hex or `sha256=`-prefixed HMAC-SHA256 of the body in `header`.
    Hmac {
        header: String,
        secret: String,
    },
    Stripe {
        secret: String,
        tolerance_s: u64,
    },
    Github {
        secret: String,
    },
    /// `secret` is the decoded key (a `whsec_` prefix and base64 are removed at load).
    StandardWebhooks {
        secret: Vec<u8>,
        tolerance_s: u64,
    },
    /// `X-Shopify-Hmac-Sha256`: base64 HMAC-SHA256 of the body, keyed with the app's
    /// client secret.
    Shopify {
        secret: String,
    },
    /// `X-Slack-Signature: v0=<hex>` over `v0:{X-Slack-Request-Timestamp}:{body}`, keyed
    /// with the app's signing secret.
    Slack {
        secret: String,
        tolerance_s: u64,
    },
    /// `X-Twilio-Signature`: base64 HMAC-SHA1, keyed with the account's auth token, of the
    /// URL Twilio called and the sorted form parameters (or, for a JSON body, of the URL
    /// alone, whose `bodySHA256` parameter covers the body).
    Twilio {
        secret: String,
        /// The public URL the request target is appended to, without a trailing `/`: what
        /// Twilio called when a proxy stands in front of Ankusa.
        public_url: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dedupe {
    Header(String),
    /// Dot path, split into segments at load. A body that is not JSON is refused (400).
    Json(Vec<String>),
    /// `{json: …, non_json: keyless}`: like `Json`, but a body that is not JSON (Slack's
    /// form-encoded interactions) has no key and is taken without dedupe.
    JsonOrKeyless(Vec<String>),
    Body,
}

/// What happens to each named provider header before it is stored. Header names are
/// lower-case. Headers not named are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderPolicy {
    pub rules: Vec<(String, HeaderAction)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderAction {
    Keep,
    Drop,
    Hash,
}

#[derive(Debug, Clone)]
pub struct SinkEntry {
    /// Stable name of the sink within its source, stored in every delivery row so a row
    /// follows its sink, not its position. Default `<kind>` or `<kind>-<n>` when a source
    /// has several sinks of one kind.
    pub id: String,
    pub kind: SinkKind,
    /// `ordered: true`: the sink's hooks go through ordering lanes (one attempt of a lane
    /// at a time, in seq order). `None`: unordered.
    pub ordering: Option<SinkOrdering>,
}

/// A sink's ordering lanes: where each hook's ordering key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkOrdering {
    /// `None`: no key is configured, so every hook of the sink (per tenant and source)
    /// shares the keyless lane: one strict order for the whole sink.
    pub key: Option<OrderingKey>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderingKey {
    /// The value of this request header (name lower-case).
    Header(String),
    /// A JSON string at this dot path of the body, split into segments at load.
    Json(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkKind {
    Http(HttpSink),
    Redis(RedisSink),
    Nats(NatsSink),
    Rabbitmq(RabbitmqSink),
    Kafka(KafkaSink),
    Sqs(SqsSink),
    Pubsub(PubsubSink),
}

impl SinkKind {
    /// The kind as written in YAML: a bounded metric label.
    pub fn name(&self) -> &'static str {
        match self {
            SinkKind::Http(_) => "http",
            SinkKind::Redis(_) => "redis",
            SinkKind::Nats(_) => "nats",
            SinkKind::Rabbitmq(_) => "rabbitmq",
            SinkKind::Kafka(_) => "kafka",
            SinkKind::Sqs(_) => "sqs",
            SinkKind::Pubsub(_) => "pubsub",
        }
    }
}

/// `kind: redis`: a stream (XADD) or a list (LPUSH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSink {
    /// `redis://[user:password@]host[:port][/db]` or `rediss://` for TLS.
    pub url: String,
    pub target: RedisTarget,
    /// Time for one attempt, connecting included.
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// XADD with the body and the metadata as fields; `maxlen` trims approximately (`~`).
    Stream { key: String, maxlen: Option<u64> },
    /// LPUSH of the body alone: a list element has no room for metadata.
    List { key: String },
}

/// `kind: nats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsSink {
    /// `nats://host:port`, several separated by commas.
    pub url: String,
    pub subject: String,
    /// `true` (default): publish to JetStream and wait for the stream's ack. `false`: core
    /// NATS, delivered once the server has the message (flush), with no persistence.
    pub jetstream: bool,
    pub credentials_file: Option<std::path::PathBuf>,
    /// Time for one attempt, the stream's ack included.
    pub timeout_ms: u64,
}

/// `kind: rabbitmq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitmqSink {
    /// `amqp://user:password@host:port/vhost` or `amqps://`.
    pub url: String,
    /// `""` is the default exchange (routing key = queue name).
    pub exchange: String,
    pub routing_key: String,
    /// Delivery mode 2 (default): the broker writes the message to disk before it confirms.
    pub persistent: bool,
    /// Publish with `mandatory`: a message no queue takes comes back and dead-letters as
    /// `unroutable` instead of vanishing.
    pub mandatory: bool,
    /// Time for one attempt, the publisher confirm included.
    pub confirm_timeout_ms: u64,
}

/// `kind: kafka`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSink {
    /// `host:port`, several separated by commas (librdkafka's `bootstrap.servers`).
    pub brokers: String,
    pub topic: String,
    pub acks: KafkaAcks,
    /// librdkafka's `compression.type`: none, gzip, snappy, lz4 or zstd.
    pub compression: String,
    /// Further librdkafka producer settings (`client:` map), applied after Ankusa's own;
    /// the settings Ankusa owns (brokers, acks, idempotence, compression, timeouts) are
    /// refused there at load.
    pub client: Vec<(String, String)>,
    /// librdkafka's `message.timeout.ms`: how long the producer may try, its own retries
    /// included, before the attempt is a retry of Ankusa's.
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaAcks {
    /// `acks: all` (default): every in-sync replica has the record; the producer is
    /// idempotent, so its own retries never write a record twice.
    All,
    /// `acks: 1`: the partition leader has it. librdkafka's idempotence needs `all`, so
    /// this producer is not idempotent.
    Leader,
}

/// `kind: sqs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqsSink {
    /// `https://sqs.<region>.amazonaws.com/<account>/<name>`; a name ending `.fifo` is a
    /// FIFO queue.
    pub queue_url: String,
    pub region: String,
    /// The SQS endpoint (a local server such as moto); `None`: AWS's own for the region.
    pub endpoint: Option<String>,
    /// The queue's `MaximumMessageSize`: body and attributes together, checked before
    /// sending. Default 262,144 (256 KiB).
    pub max_message_bytes: u64,
    /// Messages per SendMessageBatch (1 to 10; default 10); a batch's messages together
    /// stay within `max_message_bytes`, as SQS counts a batch.
    pub batch_size: usize,
    /// SendMessageBatch requests open at once; attempts arriving while all are open
    /// gather into the next batch. Default 4: below the 8 attempts a tenant may have open
    /// (`dispatch.sink_concurrency`), so one busy tenant already fills batches.
    pub max_in_flight: usize,
    /// Time for one attempt, SendMessage's answer included.
    pub timeout_ms: u64,
}

impl SqsSink {
    /// A FIFO queue: MessageGroupId and MessageDeduplicationId on every send.
    pub fn fifo(&self) -> bool {
        self.queue_url.ends_with(".fifo")
    }
}

/// `kind: pubsub`: Google Cloud Pub/Sub through its REST publish API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubsubSink {
    pub project: String,
    pub topic: String,
    /// `https://pubsub.googleapis.com` unless set; the emulator is `http://host:port`. Use a
    /// regional endpoint (`https://<region>-pubsub.googleapis.com`) with ordering keys.
    pub endpoint: String,
    pub auth: PubsubAuth,
    /// The legacy fixed `ordering_key` string (without `ordered`): every message of the
    /// sink carries it as its orderingKey.
    pub fixed_ordering_key: Option<String>,
    /// Messages per publish request (1 to 1,000; default 100), all with one orderingKey
    /// (or none), as Pub/Sub requires.
    pub batch_size: usize,
    /// Publish requests open at once (each takes a blocking-pool thread). Default 4.
    pub max_in_flight: usize,
    /// Time for one attempt, the token refresh and the publish answer included.
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PubsubAuth {
    /// A service account key file (JSON): RS256 JWTs exchanged for access tokens.
    ServiceAccount(std::path::PathBuf),
    /// A bearer token as given (`access_token: ${ENV}`), refreshed by whoever sets it.
    AccessToken(String),
    /// No credentials: only with an `endpoint` (the emulator takes none).
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSink {
    pub url: String,
    /// Total time for one attempt: connect, send, and the response with its body.
    pub timeout_ms: u64,
    /// Time to open the connection, within `timeout_ms`; a dead host fails fast.
    pub connect_timeout_ms: u64,
    /// Static headers, names as written in the file.
    pub headers: Vec<(String, String)>,
    /// Provider headers copied from the stored hook, names lower-case.
    pub forward_headers: Vec<String>,
    /// The decoded Standard Webhooks key (`whsec_` prefix and base64 removed at load);
    /// `None` sends unsigned.
    pub signing_secret: Option<Vec<u8>>,
}
