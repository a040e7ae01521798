//! Ankusa's config sections: which keys each mapping allows, their defaults and the checks
//! that turn a YAML tree into a `Config`. Every problem is recorded through `walk::Ctx`, so
//! one run reports all of them; the generic reading lives in `walk`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use serde_yaml_ng::Value;

use super::clients;
use super::model::*;
use super::presets::{self, Preset};
use super::walk::{describe, Ctx, Fields};

const ROOT_KEYS: &[&str] = &[
    "instance",
    "store",
    "edge",
    "writer",
    "dispatch",
    "retry",
    "archive",
    "admission",
    "tenant_defaults",
    "tenants",
    "sources",
];
const INSTANCE_KEYS: &[&str] = &[
    "data_dir",
    "listen",
    "admin_listen",
    "admin_token",
    "cores",
    "store_headers",
];
const CORES_KEYS: &[&str] = &["ingest", "writer", "pipeline", "sink_io"];
const POLICY_KEYS: &[&str] = &["drop", "hash", "keep"];
const STORE_KEYS: &[&str] = &[
    "sync",
    "i_understand_acks_are_not_durable",
    "min_free_bytes",
    "block_cache_bytes",
    "memtable_bytes",
];
const EDGE_KEYS: &[&str] = &[
    "body_max_bytes",
    "header_count_max",
    "header_bytes_max",
    "header_read_timeout_ms",
    "body_read_timeout_ms",
    "idle_timeout_ms",
    "connections_max",
];
const WRITER_KEYS: &[&str] = &["channel_capacity", "batch_max", "batch_bytes_max"];
const DISPATCH_KEYS: &[&str] = &[
    "batch",
    "sink_concurrency",
    "blocking_threads",
    "breaker_failures",
    "breaker_open_ms",
    "breaker_open_max_ms",
];
const ARCHIVE_KEYS: &[&str] = &["retention_ms"];
const RETRY_KEYS: &[&str] = &["initial_ms", "max_ms", "max_elapsed_ms"];
const ADMISSION_KEYS: &[&str] = &[
    "max_pending",
    "max_bytes",
    "auto_tenants_max",
    "retry_after_s",
    "tenant_retry_after_s",
    "retry_after_max_s",
];
const BOUNDS_KEYS: &[&str] = &[
    "max_pending",
    "max_bytes",
    "max_quarantined",
    "replay_rate_per_s",
    "replay_max_pending",
    "replay_concurrency",
];
const TENANT_KEYS: &[&str] = &[
    "id",
    "max_pending",
    "max_bytes",
    "max_quarantined",
    "replay_rate_per_s",
    "replay_max_pending",
    "replay_concurrency",
];
const SOURCE_KEYS: &[&str] = &[
    "id",
    "tenant",
    "tenant_from",
    "auto_tenants",
    "provider",
    "verify",
    "dedupe",
    "dedupe_window_ms",
    "store_headers",
    "quarantine",
    "sinks",
];
const SCHEMES: &[&str] = &[
    "none",
    "token",
    "hmac",
    "stripe",
    "github",
    "standard-webhooks",
    "shopify",
    "slack",
    "twilio",
];
const DEDUPE_KEYS: &[&str] = &["header", "json", "non_json"];
const ORDERING_KEY_KEYS: &[&str] = &["header", "json"];
/// Every kind users may write.
const SINK_KINDS: &[&str] = &[
    "http", "kafka", "sqs", "pubsub", "rabbitmq", "nats", "redis",
];
const HTTP_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "url",
    "timeout_ms",
    "connect_timeout_ms",
    "headers",
    "forward_headers",
    "signing_secret",
    "ordered",
    "ordering_key",
];
const REDIS_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "url",
    "stream",
    "list",
    "maxlen",
    "timeout_ms",
    "ordered",
    "ordering_key",
];
const NATS_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "url",
    "subject",
    "jetstream",
    "credentials_file",
    "timeout_ms",
    "ordered",
    "ordering_key",
];
const RABBITMQ_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "url",
    "exchange",
    "routing_key",
    "persistent",
    "mandatory",
    "confirm_timeout_ms",
    "ordered",
    "ordering_key",
];
const KAFKA_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "brokers",
    "topic",
    "acks",
    "compression",
    "client",
    "timeout_ms",
    "ordered",
    "ordering_key",
];
const KAFKA_COMPRESSIONS: &[&str] = &["none", "gzip", "snappy", "lz4", "zstd"];
/// librdkafka settings that a sink's own keys own: set there, not in `client`, so the
/// delivery guarantee cannot be weakened by a stray setting.
const KAFKA_OWNED_SETTINGS: &[(&str, &str)] = &[
    ("bootstrap.servers", "brokers"),
    ("metadata.broker.list", "brokers"),
    ("acks", "acks"),
    ("request.required.acks", "acks"),
    (
        "enable.idempotence",
        "acks (all makes the producer idempotent)",
    ),
    ("compression.type", "compression"),
    ("compression.codec", "compression"),
    ("message.timeout.ms", "timeout_ms"),
    ("delivery.timeout.ms", "timeout_ms"),
    ("enable.gapless.guarantee", "acks"),
    (
        "max.in.flight.requests.per.connection",
        "acks (idempotence bounds it)",
    ),
];
const SQS_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "queue_url",
    "region",
    "endpoint",
    "max_message_bytes",
    "batch_size",
    "max_in_flight",
    "timeout_ms",
    "ordered",
    "ordering_key",
];
/// SQS's own bounds on a message, body and attributes together.
const SQS_MESSAGE_BYTES_DEFAULT: u64 = 256 * 1024;
const SQS_MESSAGE_BYTES_MAX: u64 = 1024 * 1024;
/// SendMessageBatch takes up to 10 entries.
const SQS_BATCH_MAX: u64 = 10;
/// A publish takes up to 1,000 messages.
const PUBSUB_BATCH_MAX: u64 = 1000;
const PUBSUB_BATCH_DEFAULT: usize = 100;
/// Requests one batching sink keeps open at once, unless set: fewer than the attempts one
/// tenant may have open (`dispatch.sink_concurrency`, 8), so a busy tenant fills batches.
const BATCH_IN_FLIGHT_DEFAULT: usize = 4;
const BATCH_IN_FLIGHT_MAX: u64 = 1024;
const PUBSUB_SINK_KEYS: &[&str] = &[
    "kind",
    "id",
    "project",
    "topic",
    "endpoint",
    "credentials_file",
    "access_token",
    "batch_size",
    "max_in_flight",
    "timeout_ms",
    "ordered",
    "ordering_key",
];
const PUBSUB_ENDPOINT: &str = "https://pubsub.googleapis.com";
/// Pub/Sub's bound on an orderingKey.
const PUBSUB_ORDERING_KEY_MAX: usize = 1024;
/// The attempt timeout of the broker sinks unless set.
const BROKER_TIMEOUT_MS: u64 = 10_000;

/// The keys a `verify` mapping allows under each scheme.
fn verify_keys(scheme: &str) -> Option<&'static [&'static str]> {
    Some(match scheme {
        "none" => &["scheme"],
        "token" => &["scheme", "token", "header"],
        "hmac" => &["scheme", "secret", "header"],
        "stripe" | "standard-webhooks" | "slack" => &["scheme", "secret", "tolerance_s"],
        "github" | "shopify" => &["scheme", "secret"],
        "twilio" => &["scheme", "secret", "public_url"],
        _ => return None,
    })
}

/// A sink kind's canonical name and the keys its entry allows.
fn sink_keys(kind: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match kind {
        "http" => ("http", HTTP_SINK_KEYS),
        "redis" => ("redis", REDIS_SINK_KEYS),
        "nats" => ("nats", NATS_SINK_KEYS),
        "rabbitmq" => ("rabbitmq", RABBITMQ_SINK_KEYS),
        "kafka" => ("kafka", KAFKA_SINK_KEYS),
        "sqs" => ("sqs", SQS_SINK_KEYS),
        "pubsub" => ("pubsub", PUBSUB_SINK_KEYS),
        _ => return None,
    })
}

/// One mapping of the config file and the keys the loader accepts in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// Where the mapping sits: `""` for the root, `sources[].sinks[]`, ….
    pub path: &'static str,
    /// The key and value that choose this set of keys (`kind: http`), if another one does.
    pub variant: Option<(&'static str, &'static str)>,
    pub keys: &'static [&'static str],
}

/// Every mapping the loader reads and the keys it accepts there: the same tables the
/// loader checks against, so documentation can be compared with them.
pub fn schema() -> Vec<Section> {
    let plain = |path, keys| Section {
        path,
        variant: None,
        keys,
    };
    let mut sections = vec![
        plain("", ROOT_KEYS),
        plain("instance", INSTANCE_KEYS),
        plain("instance.cores", CORES_KEYS),
        plain("store_headers", POLICY_KEYS),
        plain("store", STORE_KEYS),
        plain("edge", EDGE_KEYS),
        plain("writer", WRITER_KEYS),
        plain("dispatch", DISPATCH_KEYS),
        plain("retry", RETRY_KEYS),
        plain("archive", ARCHIVE_KEYS),
        plain("admission", ADMISSION_KEYS),
        plain("tenant_defaults", BOUNDS_KEYS),
        plain("tenants[]", TENANT_KEYS),
        plain("sources[]", SOURCE_KEYS),
        plain("sources[].dedupe", DEDUPE_KEYS),
        plain("sources[].sinks[].ordering_key", ORDERING_KEY_KEYS),
    ];
    for &scheme in SCHEMES {
        sections.push(Section {
            path: "sources[].verify",
            variant: Some(("scheme", scheme)),
            keys: verify_keys(scheme).expect("every scheme has its keys"),
        });
    }
    for &kind in SINK_KINDS {
        sections.push(Section {
            path: "sources[].sinks[]",
            variant: Some(("kind", kind)),
            keys: sink_keys(kind).expect("every sink kind has its keys").1,
        });
    }
    sections
}

const MIB: u64 = 1 << 20;
const DEFAULT_TENANT_BOUNDS: TenantBounds = TenantBounds {
    max_pending: 1_000_000,
    max_bytes: 1 << 30,
    max_quarantined: 10_000,
    // 500 hooks/s replays a day of 40 hooks/s in two hours, yet is a small share of what
    // one sink at `sink_concurrency` 8 takes (thousands/s on a LAN). 128 pending is that
    // rate times a quarter second (a slow disk's sync plus a delivery), so on a healthy
    // node the rate, not the pending bound, sets the pace; 128 rows ahead of a live hook
    // are 16 rounds of the sink's 8 attempts.
    replay_rate_per_s: 500,
    replay_max_pending: 128,
    // Two of `sink_concurrency`'s 8 slots: a replay keeps a sink busy, live rows keep 6.
    replay_concurrency: 2,
};
/// The largest replay budget values: a bucket and a pending list of this size are
/// "unbudgeted" in practice, and stay small in memory.
const REPLAY_BUDGET_MAX: u64 = 1_000_000;
/// 72 h: longer than the retry horizon of the common providers (Stripe retries for 3 days).
const DEFAULT_DEDUPE_WINDOW_MS: u64 = 72 * 3_600_000;
const DEFAULT_TOLERANCE_S: u64 = 300;

/// Decodes and checks a whole document. The result is only meaningful when no problem was
/// recorded; the caller checks that.
pub(crate) fn config(ctx: &Ctx, document: &Value) -> Config {
    // `parse_with_env` has already refused a root that is neither a mapping nor empty.
    let root = match document {
        Value::Mapping(map) => Fields::new(ctx.clone(), map, ROOT_KEYS),
        _ => Fields::empty(ctx.clone()),
    };
    let instance = instance(&root.section("instance", INSTANCE_KEYS));
    let store = root.section("store", STORE_KEYS);
    let sync = store.opt("sync", Ctx::bool).unwrap_or(true);
    let unsafe_acks = store
        .opt("i_understand_acks_are_not_durable", Ctx::bool)
        .unwrap_or(false);
    if !sync && !unsafe_acks {
        store.ctx().field("sync").error(
            "false acks a hook before its batch is on disk, so a crash or power loss loses \
             acknowledged hooks; to run that way anyway, also set \
             store.i_understand_acks_are_not_durable: true",
        );
    }
    let store = Store {
        sync,
        min_free_bytes: store
            .opt("min_free_bytes", Ctx::size)
            .unwrap_or(crate::store::space::DEFAULT_MIN_FREE_BYTES),
        memory: store_memory(&store),
    };
    let edge = edge(&root.section("edge", EDGE_KEYS));
    let writer = writer(&root.section("writer", WRITER_KEYS));
    let dispatch = dispatch(&root.section("dispatch", DISPATCH_KEYS));
    let retry = retry(&root.section("retry", RETRY_KEYS));
    let archive = archive(&root.section("archive", ARCHIVE_KEYS));
    let admission = admission(&root.section("admission", ADMISSION_KEYS));
    let tenant_defaults = bounds(
        &root.section("tenant_defaults", BOUNDS_KEYS),
        DEFAULT_TENANT_BOUNDS,
    );
    let tenants = tenants(&root, tenant_defaults);
    let sources = sources(&root, &tenants, &instance.store_headers);
    Config {
        instance,
        store,
        edge,
        writer,
        dispatch,
        retry,
        archive,
        admission,
        tenant_defaults,
        tenants,
        sources,
    }
}

/// The smallest memory bounds taken. A smaller cache evicts a large store's index and
/// filter blocks between two reads of them; smaller memtables flush a few thousand hooks
/// at a time, and every flush is a table file for compaction to merge again.
const BLOCK_CACHE_MIN: u64 = 8 << 20;
const MEMTABLE_MIN: u64 = 16 << 20;

fn store_memory(fields: &Fields) -> crate::store::Memory {
    let bound = |key, min: u64, default: usize| {
        fields
            .opt(key, |ctx, value| {
                let n = ctx.size(value)?;
                if n < min {
                    ctx.error(format_args!(
                        "must be at least {}MiB, found {n} bytes",
                        min >> 20
                    ));
                    return None;
                }
                ctx.to_usize(n)
            })
            .unwrap_or(default)
    };
    let default = crate::store::Memory::DEFAULT;
    crate::store::Memory {
        block_cache_bytes: bound(
            "block_cache_bytes",
            BLOCK_CACHE_MIN,
            default.block_cache_bytes,
        ),
        memtable_bytes: bound("memtable_bytes", MEMTABLE_MIN, default.memtable_bytes),
    }
}

fn instance(fields: &Fields) -> Instance {
    let data_dir = fields
        .opt("data_dir", Ctx::non_empty_string)
        .unwrap_or_else(|| "./data".into());
    let listen = fields
        .opt("listen", socket_addr)
        .unwrap_or(([127, 0, 0, 1], 8080).into());
    let admin_listen = fields.opt("admin_listen", socket_addr);
    // A bad address was reported already; judging the token against it would only add noise.
    let admin_listen_readable = admin_listen.is_some() || !fields.has("admin_listen");
    let admin_listen = admin_listen.unwrap_or(([127, 0, 0, 1], 9090).into());
    // An empty token counts as none, so `${ANKUSA_ADMIN_TOKEN:-}` makes it optional.
    let admin_token = fields
        .opt("admin_token", Ctx::string)
        .filter(|token| !token.is_empty());
    if admin_listen_readable && !admin_listen.ip().is_loopback() && admin_token.is_none() {
        fields.ctx().field("admin_token").error(format_args!(
            "required when admin_listen ({admin_listen}) is not a loopback address"
        ));
    }
    let cores = cores(&fields.section("cores", CORES_KEYS));
    let store_headers = fields
        .opt("store_headers", header_policy)
        .unwrap_or_else(|| HeaderPolicy {
            rules: vec![
                ("authorization".into(), HeaderAction::Drop),
                ("cookie".into(), HeaderAction::Drop),
            ],
        });
    Instance {
        data_dir: PathBuf::from(data_dir),
        listen,
        admin_listen,
        admin_token,
        cores,
        store_headers,
    }
}

/// `ip:port` only: a host name would need a resolver at load and could change later.
fn socket_addr(ctx: &Ctx, value: &Value) -> Option<SocketAddr> {
    let text = ctx.string(value)?;
    let addr = text.parse().ok();
    if addr.is_none() {
        ctx.error(format_args!("not a socket address: {text:?}"));
    }
    addr
}

fn cores(fields: &Fields) -> Cores {
    Cores {
        ingest: fields.opt("ingest", core_list),
        writer: fields.opt("writer", core_id),
        pipeline: fields.opt("pipeline", core_list),
        sink_io: fields.opt("sink_io", core_list),
    }
}

fn core_id(ctx: &Ctx, value: &Value) -> Option<usize> {
    ctx.uint(value).and_then(|n| ctx.to_usize(n))
}

/// A list of distinct core ids; a single id is a list of one.
fn core_list(ctx: &Ctx, value: &Value) -> Option<Vec<usize>> {
    let Value::Sequence(items) = value else {
        return core_id(ctx, value).map(|core| vec![core]);
    };
    if items.is_empty() {
        ctx.error("must list at least one core");
        return None;
    }
    let mut cores = Vec::with_capacity(items.len());
    let mut complete = true;
    for (index, item) in items.iter().enumerate() {
        let item_ctx = ctx.index(index);
        match core_id(&item_ctx, item) {
            Some(core) if cores.contains(&core) => {
                item_ctx.error(format_args!("core {core} is listed twice"));
                complete = false;
            }
            Some(core) => cores.push(core),
            None => complete = false,
        }
    }
    complete.then_some(cores)
}

/// `{drop: [..], hash: [..], keep: [..]}`. Rules follow the file order: lists in the order
/// written, names within a list in order. A name may appear once across all lists.
fn header_policy(ctx: &Ctx, value: &Value) -> Option<HeaderPolicy> {
    let fields = ctx.mapping(value, POLICY_KEYS)?;
    let mut rules: Vec<(String, HeaderAction)> = Vec::new();
    let mut list_of: Vec<&str> = Vec::new();
    for (key, list_ctx, list_value) in fields.entries() {
        let action = match key {
            "drop" => HeaderAction::Drop,
            "hash" => HeaderAction::Hash,
            "keep" => HeaderAction::Keep,
            _ => continue, // Unknown keys were reported when the mapping was read.
        };
        let Some(items) = list_ctx.list(list_value) else {
            continue;
        };
        for (index, item) in items.iter().enumerate() {
            let item_ctx = list_ctx.index(index);
            let Some(name) = header_name(&item_ctx, item) else {
                continue;
            };
            match rules.iter().position(|(known, _)| *known == name) {
                Some(at) => item_ctx.error(format_args!(
                    "header {name:?} is already listed under {}",
                    list_of[at]
                )),
                None => {
                    rules.push((name, action));
                    list_of.push(key);
                }
            }
        }
    }
    Some(HeaderPolicy { rules })
}

/// A header name, lower-cased: HTTP token characters only.
fn header_name(ctx: &Ctx, value: &Value) -> Option<String> {
    let name = ctx.string(value)?;
    if !is_http_token(&name) {
        ctx.error(format_args!(
            "not a valid header name: {name:?} (letters, digits and !#$%&'*+-.^_`|~ only)"
        ));
        return None;
    }
    Some(name.to_ascii_lowercase())
}

fn is_http_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

fn edge(fields: &Fields) -> Edge {
    let count = |key: &str, default: u64| {
        let n = fields.opt(key, |ctx, value| {
            ctx.uint(value)
                .and_then(|n| ctx.at_least(n, 1))
                .and_then(|n| ctx.to_usize(n))
        });
        n.unwrap_or(default as usize)
    };
    let bytes =
        |key: &str, default: u64| fields.opt(key, positive_size).unwrap_or(default as usize);
    let millis = |key: &str, default: u64| {
        Duration::from_millis(fields.opt(key, positive_uint).unwrap_or(default))
    };
    Edge {
        body_max_bytes: bytes("body_max_bytes", MIB),
        header_count_max: count("header_count_max", 64),
        header_bytes_max: bytes("header_bytes_max", 16 * 1024),
        header_read_timeout: millis("header_read_timeout_ms", 10_000),
        body_read_timeout: millis("body_read_timeout_ms", 30_000),
        idle_timeout: millis("idle_timeout_ms", 60_000),
        connections_max: count("connections_max", 10_000),
    }
}

fn writer(fields: &Fields) -> Writer {
    Writer {
        channel_capacity: fields
            .opt("channel_capacity", positive_count)
            .unwrap_or(65_536),
        batch_max: fields.opt("batch_max", positive_count).unwrap_or(1024),
        batch_bytes_max: fields
            .opt("batch_bytes_max", positive_size)
            .unwrap_or(8 << 20),
    }
}

fn dispatch(fields: &Fields) -> Dispatch {
    let breaker_open_ms = fields
        .opt("breaker_open_ms", positive_uint)
        .unwrap_or(30_000);
    let breaker_open_max_ms = fields.opt("breaker_open_max_ms", positive_uint);
    if let Some(max) = breaker_open_max_ms {
        if max < breaker_open_ms {
            fields
                .ctx()
                .field("breaker_open_max_ms")
                .error(format_args!(
                    "must be at least breaker_open_ms ({breaker_open_ms}), found {max}"
                ));
        }
    }
    Dispatch {
        batch: fields.opt("batch", positive_count).unwrap_or(256),
        sink_concurrency: fields.opt("sink_concurrency", positive_count).unwrap_or(8),
        blocking_threads: fields.opt("blocking_threads", positive_count).unwrap_or(64),
        breaker_failures: fields
            .opt("breaker_failures", |ctx, value| {
                positive_uint(ctx, value).and_then(|n| match u32::try_from(n) {
                    Ok(n) => Some(n),
                    Err(_) => {
                        ctx.error(format_args!("must be at most {}, found {n}", u32::MAX));
                        None
                    }
                })
            })
            .unwrap_or(5),
        breaker_open_ms,
        breaker_open_max_ms: breaker_open_max_ms.unwrap_or(breaker_open_ms.max(600_000)),
    }
}

fn archive(fields: &Fields) -> Archive {
    Archive {
        retention_ms: fields
            .opt("retention_ms", Ctx::uint)
            .unwrap_or(7 * 24 * 3_600_000),
    }
}

fn retry(fields: &Fields) -> Retry {
    let initial_ms = fields.opt("initial_ms", positive_uint);
    let max_ms = fields.opt("max_ms", Ctx::uint);
    let max_elapsed_ms = fields
        .opt("max_elapsed_ms", Ctx::uint)
        .unwrap_or(86_400_000);
    // Compare only values that read well; a bad one was reported already.
    let readable = |key: &str, read: Option<u64>| read.is_some() || !fields.has(key);
    let checkable = readable("initial_ms", initial_ms) && readable("max_ms", max_ms);
    let initial_ms = initial_ms.unwrap_or(500);
    let max_ms = max_ms.unwrap_or(600_000);
    if checkable && max_ms < initial_ms {
        if fields.has("max_ms") {
            fields.ctx().field("max_ms").error(format_args!(
                "must be at least initial_ms ({initial_ms}), found {max_ms}"
            ));
        } else {
            fields.ctx().field("initial_ms").error(format_args!(
                "must be at most max_ms ({max_ms} by default), found {initial_ms}"
            ));
        }
    }
    Retry {
        initial_ms,
        max_ms,
        max_elapsed_ms,
    }
}

fn positive_uint(ctx: &Ctx, value: &Value) -> Option<u64> {
    ctx.uint(value).and_then(|n| ctx.at_least(n, 1))
}

fn positive_count(ctx: &Ctx, value: &Value) -> Option<usize> {
    positive_uint(ctx, value).and_then(|n| ctx.to_usize(n))
}

fn positive_size(ctx: &Ctx, value: &Value) -> Option<usize> {
    ctx.size(value)
        .and_then(|n| ctx.at_least(n, 1))
        .and_then(|n| ctx.to_usize(n))
}

/// Tenant and source ids appear in URLs and store keys, hence the narrow grammar: 1-64
/// characters of a-z, 0-9, `_` and `-`, starting with a letter or digit. Auto tenants
/// named by a request path are held to it too.
pub fn is_valid_id(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .bytes()
            .next()
            .is_some_and(|first| first.is_ascii_alphanumeric())
        && text
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"_-".contains(&byte))
}

pub const ID_GRAMMAR: &str =
    "1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit";

fn id(ctx: &Ctx, value: &Value) -> Option<String> {
    let text = ctx.string(value)?;
    if !is_valid_id(&text) {
        ctx.error(format_args!("invalid id {text:?} ({ID_GRAMMAR})"));
        return None;
    }
    Some(text)
}

fn admission(fields: &Fields) -> Admission {
    let retry_after = |key: &str, default: u32| {
        fields
            .opt(key, |ctx, value| {
                positive_uint(ctx, value).and_then(|n| match u32::try_from(n) {
                    Ok(n) if n <= 3_600 => Some(n),
                    _ => {
                        ctx.error(format_args!("must be at most 3600 seconds, found {n}"));
                        None
                    }
                })
            })
            .unwrap_or(default)
    };
    Admission {
        max_pending: fields
            .opt("max_pending", positive_uint)
            .unwrap_or(100_000_000),
        max_bytes: fields
            .opt("max_bytes", |ctx, value| {
                ctx.size(value).and_then(|n| ctx.at_least(n, 1))
            })
            .unwrap_or(64 << 30),
        auto_tenants_max: fields
            .opt("auto_tenants_max", positive_uint)
            .unwrap_or(10_000),
        retry_after_s: retry_after("retry_after_s", 1),
        tenant_retry_after_s: retry_after("tenant_retry_after_s", 5),
        retry_after_max_s: retry_after("retry_after_max_s", 300),
    }
}

/// A tenant's bounds and replay budget from a mapping, each key defaulting to `defaults`.
fn bounds(fields: &Fields, defaults: TenantBounds) -> TenantBounds {
    TenantBounds {
        max_pending: fields
            .opt("max_pending", positive_uint)
            .unwrap_or(defaults.max_pending),
        max_bytes: fields
            .opt("max_bytes", |ctx, value| {
                ctx.size(value).and_then(|n| ctx.at_least(n, 1))
            })
            .unwrap_or(defaults.max_bytes),
        max_quarantined: fields
            .opt("max_quarantined", Ctx::uint)
            .unwrap_or(defaults.max_quarantined),
        replay_rate_per_s: fields
            .opt("replay_rate_per_s", replay_budget)
            .unwrap_or(defaults.replay_rate_per_s),
        replay_max_pending: fields
            .opt("replay_max_pending", replay_budget)
            .unwrap_or(defaults.replay_max_pending),
        replay_concurrency: fields
            .opt("replay_concurrency", replay_budget)
            .unwrap_or(defaults.replay_concurrency),
    }
}

/// A replay budget value: 0 would stop every replay for good, so it is refused.
fn replay_budget(ctx: &Ctx, value: &Value) -> Option<u64> {
    ctx.uint(value)
        .and_then(|n| ctx.in_range(n, 1..=REPLAY_BUDGET_MAX))
}

fn tenants(root: &Fields, defaults: TenantBounds) -> Vec<Tenant> {
    let Some((ctx, value)) = root.get("tenants") else {
        return Vec::new();
    };
    let Some(items) = ctx.list(value) else {
        return Vec::new();
    };
    let mut tenants: Vec<Tenant> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Some(fields) = ctx.index(index).mapping(item, TENANT_KEYS) else {
            continue;
        };
        let id = fields.required("id", id);
        let bounds = bounds(&fields, defaults);
        let Some(id) = id else { continue };
        if tenants.iter().any(|tenant| tenant.id == id) {
            fields
                .ctx()
                .field("id")
                .error(format_args!("duplicate tenant id {id:?}"));
            continue;
        }
        tenants.push(Tenant { id, bounds });
    }
    tenants
}

fn sources(root: &Fields, tenants: &[Tenant], default_policy: &HeaderPolicy) -> Vec<Source> {
    let ctx = root.ctx().field("sources");
    let items: &[Value] = match root.get("sources") {
        None | Some((_, Value::Null)) => &[],
        Some((_, value)) => match ctx.list(value) {
            Some(items) => items,
            None => return Vec::new(),
        },
    };
    if items.is_empty() {
        ctx.error("at least one source is required");
    }
    let mut sources: Vec<Source> = Vec::with_capacity(items.len());
    let mut seen_ids = HashSet::new();
    for (index, item) in items.iter().enumerate() {
        let source_ctx = ctx.index(index);
        let Some(fields) = source_ctx.mapping(item, SOURCE_KEYS) else {
            continue;
        };
        let id = fields.required("id", id);
        if let Some(id) = &id {
            if !seen_ids.insert(id.clone()) {
                fields
                    .ctx()
                    .field("id")
                    .error(format_args!("duplicate source id {id:?}"));
            }
        }
        let tenancy = tenancy(&fields, tenants);
        let preset = fields.opt("provider", provider);
        let verify = match preset {
            Some(preset) => preset_verify(&fields, preset),
            // An unknown provider was reported; its verify block would only add noise.
            None if fields.has("provider") => None,
            None => fields.opt("verify", verify),
        }
        .unwrap_or(Verify::None);
        // The source's own `dedupe` (`none` included) wins over the preset's.
        let explicit_dedupe = fields.opt("dedupe", dedupe);
        let dedupe_read = explicit_dedupe.is_some() || !fields.has("dedupe");
        let dedupe = match explicit_dedupe {
            Some(explicit) => explicit,
            None => preset.map(Preset::dedupe),
        };
        let dedupe_window_ms = fields.opt("dedupe_window_ms", positive_uint);
        if dedupe_window_ms.is_some() && dedupe.is_none() && dedupe_read {
            fields
                .ctx()
                .field("dedupe_window_ms")
                .error("has no effect without dedupe");
        }
        // A source's policy replaces the instance default entirely rather than merging with
        // it: one place then says what happens to each header of this source, and a source
        // that must keep `authorization` lists it under `keep` without fighting a `drop`.
        let source_policy = fields.opt("store_headers", header_policy);
        // A policy that is not a mapping was reported already and stands in as the default;
        // judging a sink's ordering key against that stand-in would only add noise.
        let policy_read = source_policy.is_some() || !fields.has("store_headers");
        // A preset's policy keeps its provider's headers, then applies the instance's.
        let store_headers = source_policy.unwrap_or_else(|| match preset {
            Some(preset) => preset.store_headers(default_policy),
            None => default_policy.clone(),
        });
        if let Some(Dedupe::Header(name)) = &dedupe {
            if let Some(verb) = loses_header(&store_headers, name) {
                // A key the preset chose is judged where the file dropped it.
                let (key, whose) = if fields.has("dedupe") {
                    ("dedupe", String::new())
                } else {
                    (
                        "store_headers",
                        format!(" (provider {})", preset.map_or("", |p| p.name)),
                    )
                };
                fields.ctx().field(key).error(format_args!(
                    "header {name:?} is the dedupe key{whose}, but this source's store_headers \
                     {verb} it: a released or replayed hook could not be keyed the same way \
                     (keep it)"
                ));
            }
        }
        let quarantine = fields.opt("quarantine", Ctx::bool).unwrap_or(false);
        let sinks = sinks(&fields, policy_read.then_some(&store_headers));
        let (Some(id), Some(tenancy)) = (id, tenancy) else {
            continue;
        };
        let window_default = preset.map_or(DEFAULT_DEDUPE_WINDOW_MS, |p| p.dedupe_window_ms);
        sources.push(Source {
            id,
            provider: preset.map(|preset| preset.name),
            tenancy,
            verify,
            dedupe,
            dedupe_window_ms: dedupe_window_ms.unwrap_or(window_default),
            store_headers,
            quarantine,
            sinks,
        });
    }
    sources
}

/// `Some("drops")` or `Some("hashes")` when `policy` does not store header `name` as
/// received: a key read from that header could not be read again from a stored hook.
fn loses_header(policy: &HeaderPolicy, name: &str) -> Option<&'static str> {
    let (_, action) = policy.rules.iter().find(|(rule, _)| rule == name)?;
    match action {
        HeaderAction::Drop => Some("drops"),
        HeaderAction::Hash => Some("hashes"),
        HeaderAction::Keep => None,
    }
}

fn tenancy(fields: &Fields, tenants: &[Tenant]) -> Option<Tenancy> {
    let auto = fields.opt("auto_tenants", Ctx::bool);
    match (fields.get("tenant"), fields.get("tenant_from")) {
        (Some((ctx, value)), None) => {
            if auto.is_some() {
                fields
                    .ctx()
                    .field("auto_tenants")
                    .error("only a source with tenant_from: path creates tenants");
            }
            let name = ctx.string(value)?;
            if !tenants.iter().any(|tenant| tenant.id == name) {
                ctx.error(format_args!(
                    "unknown tenant {name:?} (declare it under tenants)"
                ));
                return None;
            }
            Some(Tenancy::Fixed(name))
        }
        (None, Some((ctx, value))) => match value {
            Value::String(text) if text == "path" => Some(Tenancy::Path {
                auto: auto.unwrap_or(false),
            }),
            other => {
                ctx.expected("\"path\"", other);
                None
            }
        },
        (Some(_), Some(_)) => {
            fields.ctx().error("set only one of tenant or tenant_from");
            None
        }
        (None, None) => {
            fields
                .ctx()
                .error("one of tenant or tenant_from is required");
            None
        }
    }
}

fn verify(ctx: &Ctx, value: &Value) -> Option<Verify> {
    let map = ctx.raw_mapping(value)?;
    let scheme_ctx = ctx.field("scheme");
    let scheme = match map.get("scheme") {
        Some(scheme) => scheme_ctx.string(scheme)?,
        None => {
            scheme_ctx.error(format_args!("required (one of: {})", SCHEMES.join(", ")));
            return None;
        }
    };
    // The allowed keys depend on the scheme, so the key check waits until it is known.
    let Some(allowed) = verify_keys(&scheme) else {
        scheme_ctx.error(format_args!(
            "unknown scheme {scheme:?} (expected one of: {})",
            SCHEMES.join(", ")
        ));
        return None;
    };
    let fields = Fields::new(ctx.clone(), map, allowed);
    verify_scheme(&fields, &scheme)
}

/// `provider: NAME`: the preset named, or `None` (reported) for a name no preset has.
fn provider(ctx: &Ctx, value: &Value) -> Option<&'static Preset> {
    let name = ctx.string(value)?;
    let preset = presets::preset(&name);
    if preset.is_none() {
        ctx.error(format_args!(
            "unknown provider {name:?} (expected one of: {})",
            presets::names()
        ));
    }
    preset
}

/// The `verify` block of a source with `provider`: the provider names the scheme, so the
/// block holds only that scheme's other keys (its secret, at least). A `scheme` there is
/// refused rather than weighed against the provider: one source, one way to read it.
fn preset_verify(source: &Fields, preset: &Preset) -> Option<Verify> {
    let Some((ctx, value)) = source.get("verify") else {
        source.ctx().field("verify").error(format_args!(
            "required with provider {}: give its secret as verify: {{secret: ...}}",
            preset.name
        ));
        return None;
    };
    let map = ctx.raw_mapping(value)?;
    if map.contains_key("scheme") {
        ctx.field("scheme").error(format_args!(
            "provider {} sets the scheme; remove scheme here (or remove provider and set \
             verify, dedupe and store_headers yourself)",
            preset.name
        ));
        return None;
    }
    let allowed = verify_keys(preset.scheme).expect("every preset's scheme has its keys");
    let fields = Fields::new(ctx, map, allowed);
    verify_scheme(&fields, preset.scheme)
}

/// The keys of a `verify` block whose scheme is known (and whose unknown keys were
/// reported).
fn verify_scheme(fields: &Fields, scheme: &str) -> Option<Verify> {
    let secret = || fields.required("secret", Ctx::non_empty_string);
    let tolerance_s = || {
        fields
            .opt("tolerance_s", positive_uint)
            .unwrap_or(DEFAULT_TOLERANCE_S)
    };
    match scheme {
        "token" => {
            let token = fields.required("token", Ctx::non_empty_string);
            let header = fields
                .opt("header", header_name)
                .unwrap_or_else(|| "authorization".into());
            Some(Verify::Token {
                header,
                token: token?,
            })
        }
        "hmac" => {
            let secret = secret();
            let header = fields
                .opt("header", header_name)
                .unwrap_or_else(|| "x-signature".into());
            Some(Verify::Hmac {
                header,
                secret: secret?,
            })
        }
        "stripe" => {
            let secret = secret();
            let tolerance_s = tolerance_s();
            Some(Verify::Stripe {
                secret: secret?,
                tolerance_s,
            })
        }
        "github" => Some(Verify::Github { secret: secret()? }),
        "standard-webhooks" => {
            let key = fields.required("secret", standard_webhooks_key);
            let tolerance_s = tolerance_s();
            Some(Verify::StandardWebhooks {
                secret: key?,
                tolerance_s,
            })
        }
        "shopify" => Some(Verify::Shopify { secret: secret()? }),
        "slack" => {
            let secret = secret();
            let tolerance_s = tolerance_s();
            Some(Verify::Slack {
                secret: secret?,
                tolerance_s,
            })
        }
        "twilio" => {
            let secret = secret();
            let public_url = fields.required("public_url", public_url);
            Some(Verify::Twilio {
                secret: secret?,
                public_url: public_url?,
            })
        }
        _ => Some(Verify::None),
    }
}

/// Twilio's `public_url`: the scheme, host and any path prefix Twilio calls, to which the
/// request's own target (path and query) is appended. A query or fragment here could only
/// be a mistake: the request carries its own query.
fn public_url(ctx: &Ctx, value: &Value) -> Option<String> {
    let url = http_url(ctx, value)?;
    if url.contains(['?', '#']) {
        ctx.error(format_args!(
            "must not have a query or fragment: the request's own path and query are \
             appended to it ({url:?})"
        ));
        return None;
    }
    Some(url.trim_end_matches('/').to_owned())
}

/// `whsec_<base64>` or bare base64, decoded now so a bad key fails at load.
fn standard_webhooks_key(ctx: &Ctx, value: &Value) -> Option<Vec<u8>> {
    let text = ctx.non_empty_string(value)?;
    let encoded = text.strip_prefix("whsec_").unwrap_or(&text);
    // Providers differ on padding; the key bytes are what matter.
    let engine = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    match engine.decode(encoded) {
        Ok(key) if key.is_empty() => {
            ctx.error("must not be empty");
            None
        }
        Ok(key) => Some(key),
        Err(error) => {
            ctx.error(format_args!("not valid base64 ({error})"));
            None
        }
    }
}

/// A source's `dedupe`: `Some(None)` for `none`, which turns a provider's key off.
fn dedupe(ctx: &Ctx, value: &Value) -> Option<Option<Dedupe>> {
    const EXPECTED: &str = "{header: NAME}, {json: DOT.PATH}, body or none";
    match value {
        Value::String(text) if text == "body" => Some(Some(Dedupe::Body)),
        Value::String(text) if text == "none" => Some(None),
        Value::Mapping(map) => {
            let fields = Fields::new(ctx.clone(), map, DEDUPE_KEYS);
            // `non_json: keyless` takes a body that is not JSON without a key; `refuse`
            // (the default) answers it 400.
            let keyless = fields.opt("non_json", |ctx, value| match value {
                Value::String(text) if text == "keyless" => Some(true),
                Value::String(text) if text == "refuse" => Some(false),
                other => {
                    ctx.expected("keyless or refuse", other);
                    None
                }
            });
            if keyless.is_some() && fields.has("header") {
                ctx.field("non_json")
                    .error("only a {json: …} key reads the body");
                return None;
            }
            match (fields.get("header"), fields.get("json")) {
                (Some((ctx, value)), None) => {
                    header_name(&ctx, value).map(Dedupe::Header).map(Some)
                }
                (None, Some((ctx, value))) => json_path(&ctx, value)
                    .map(|path| match keyless {
                        Some(true) => Dedupe::JsonOrKeyless(path),
                        _ => Dedupe::Json(path),
                    })
                    .map(Some),
                _ => {
                    ctx.error("set exactly one of header or json");
                    None
                }
            }
        }
        other => {
            ctx.expected(EXPECTED, other);
            None
        }
    }
}

fn json_path(ctx: &Ctx, value: &Value) -> Option<Vec<String>> {
    let text = ctx.string(value)?;
    let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
    if segments.iter().any(String::is_empty) {
        ctx.error(format_args!("empty segment in dot path {text:?}"));
        return None;
    }
    Some(segments)
}

/// Decodes a source's sinks, then names the ones without an explicit id. `policy` is the
/// source's resolved store_headers, `None` when it did not read (nothing is judged by it).
fn sinks(source: &Fields, policy: Option<&HeaderPolicy>) -> Vec<SinkEntry> {
    let ctx = source.ctx().field("sinks");
    let items: &[Value] = match source.get("sinks") {
        None | Some((_, Value::Null)) => &[],
        Some((_, value)) => match ctx.list(value) {
            Some(items) => items,
            None => return Vec::new(),
        },
    };
    if items.is_empty() {
        ctx.error("at least one sink is required");
    }
    // (index, context, decoded sink) for each sink that decoded.
    let mut decoded = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let sink_ctx = ctx.index(index);
        if let Some(sink) = sink(&sink_ctx, item, policy) {
            decoded.push((index, sink_ctx, sink));
        }
    }
    let mut entries: Vec<SinkEntry> = Vec::with_capacity(decoded.len());
    for (index, sink_ctx, sink) in decoded {
        let DecodedSink {
            id: explicit_id,
            kind_name,
            kind,
            ordering,
        } = sink;
        let (id, defaulted) = match explicit_id {
            Some(id) => (id, false),
            None => (default_sink_id(items, index, kind_name), true),
        };
        if entries.iter().any(|entry| entry.id == id) {
            if defaulted {
                sink_ctx.error(format_args!(
                    "default id {id:?} is already taken by another sink; set id explicitly"
                ));
            } else {
                sink_ctx
                    .field("id")
                    .error(format_args!("duplicate sink id {id:?} in this source"));
            }
            continue;
        }
        entries.push(SinkEntry { id, kind, ordering });
    }
    entries
}

/// `<kind>` when the source has one sink of that kind, else `<kind>-<n>` counting sinks of
/// that kind from 1 in file order. Counted over the raw entries, so adding a sink of another
/// kind never renames an existing one (delivery rows refer to sinks by this id).
fn default_sink_id(items: &[Value], index: usize, kind_name: &str) -> String {
    let same_kind = |item: &&Value| item.get("kind").and_then(Value::as_str) == Some(kind_name);
    if items.iter().filter(same_kind).count() <= 1 {
        return kind_name.to_owned();
    }
    let ordinal = items[..index].iter().filter(same_kind).count() + 1;
    format!("{kind_name}-{ordinal}")
}

/// One sink entry as written, before its default id is given.
struct DecodedSink {
    id: Option<String>,
    kind_name: &'static str,
    kind: SinkKind,
    ordering: Option<SinkOrdering>,
}

fn sink(ctx: &Ctx, value: &Value, policy: Option<&HeaderPolicy>) -> Option<DecodedSink> {
    let map = ctx.raw_mapping(value)?;
    let kind_ctx = ctx.field("kind");
    let kind = match map.get("kind") {
        Some(kind) => kind_ctx.string(kind)?,
        None => {
            kind_ctx.error(format_args!("required (one of: {})", SINK_KINDS.join(", ")));
            return None;
        }
    };
    let Some((kind_name, keys)) = sink_keys(&kind) else {
        kind_ctx.error(format_args!(
            "unknown sink kind {kind:?} (expected one of: {})",
            SINK_KINDS.join(", ")
        ));
        return None;
    };
    let fields = Fields::new(ctx.clone(), map, keys);
    let id = fields.opt("id", id);
    let id_failed = fields.get("id").is_some() && id.is_none();
    // A pubsub sink's plain-string ordering_key is its own legacy option, read below.
    let ordering = sink_ordering(&fields, policy, kind_name == "pubsub");
    let kind = match kind_name {
        "redis" => SinkKind::Redis(redis_sink(&fields)?),
        "nats" => SinkKind::Nats(nats_sink(&fields)?),
        "rabbitmq" => SinkKind::Rabbitmq(rabbitmq_sink(&fields)?),
        "kafka" => SinkKind::Kafka(kafka_sink(&fields)?),
        "sqs" => SinkKind::Sqs(sqs_sink(&fields, ordering.is_some())?),
        "pubsub" => SinkKind::Pubsub(pubsub_sink(&fields, ordering.is_some())?),
        _ => SinkKind::Http(http_sink(&fields)?),
    };
    if id_failed {
        return None;
    }
    Some(DecodedSink {
        id,
        kind_name,
        kind,
        ordering,
    })
}

/// `ordered` and `ordering_key` of a sink entry: `Some` only with `ordered: true`. Core
/// reads them, not the sink, so every kind takes this grammar; a pubsub sink
/// (`fixed_key_kind`) also takes a plain `ordering_key` string without `ordered`: its own
/// fixed publish key, which `pubsub_sink` reads.
fn sink_ordering(
    fields: &Fields,
    policy: Option<&HeaderPolicy>,
    fixed_key_kind: bool,
) -> Option<SinkOrdering> {
    let ordered = fields.opt("ordered", Ctx::bool);
    // A bad `ordered` was reported already; judging the key against it would only add noise.
    let ordered_read = ordered.is_some() || !fields.has("ordered");
    let key = fields.get("ordering_key");
    if ordered != Some(true) {
        if let Some((key_ctx, value)) = key.filter(|_| ordered_read) {
            if !fixed_key_kind {
                key_ctx.error(
                    "needs ordered: true (only a pubsub sink takes an ordering_key without \
                     ordered, as a plain string)",
                );
            } else if !matches!(value, Value::String(_)) {
                key_ctx.error(
                    "without ordered: true a pubsub ordering_key is a plain string (one fixed \
                     key for every message); {header: …} or {json: …} needs ordered: true",
                );
            }
        }
        return None;
    }
    let key = key.and_then(|(key_ctx, value)| {
        let key = ordering_key(&key_ctx, value)?;
        if let (OrderingKey::Header(name), Some(policy)) = (&key, policy) {
            if let Some(verb) = loses_header(policy, name) {
                key_ctx.error(format_args!(
                    "header {name:?} is the ordering key, but this source's store_headers \
                     {verb} it: a released or replayed hook could not be put in the same \
                     lane (keep it)"
                ));
            }
        }
        Some(key)
    });
    // Without a key every hook of the sink shares the keyless lane.
    Some(SinkOrdering { key })
}

/// `{header: NAME}` or `{json: DOT.PATH}`, with the rules of the same dedupe forms.
fn ordering_key(ctx: &Ctx, value: &Value) -> Option<OrderingKey> {
    let Value::Mapping(map) = value else {
        ctx.expected("{header: NAME} or {json: DOT.PATH}", value);
        return None;
    };
    let fields = Fields::new(ctx.clone(), map, ORDERING_KEY_KEYS);
    match (fields.get("header"), fields.get("json")) {
        (Some((ctx, value)), None) => header_name(&ctx, value).map(OrderingKey::Header),
        (None, Some((ctx, value))) => json_path(&ctx, value).map(OrderingKey::Json),
        _ => {
            ctx.error("set exactly one of header or json");
            None
        }
    }
}

fn http_sink(fields: &Fields) -> Option<HttpSink> {
    let url = fields.required("url", http_url);
    let timeout_ms = fields.opt("timeout_ms", positive_uint).unwrap_or(10_000);
    let connect_timeout_ms = fields
        .opt("connect_timeout_ms", positive_uint)
        .unwrap_or(5_000);
    let headers = fields.opt("headers", static_headers).unwrap_or_default();
    let forward_headers = fields
        .opt("forward_headers", |ctx, value| {
            let items = ctx.list(value)?;
            let names: Vec<Option<String>> = items
                .iter()
                .enumerate()
                .map(|(index, item)| header_name(&ctx.index(index), item))
                .collect();
            names.into_iter().collect::<Option<Vec<String>>>()
        })
        .unwrap_or_default();
    // The same key format as the inbound scheme, decoded now so a bad key fails at load.
    let signing_secret = fields.opt("signing_secret", standard_webhooks_key);
    Some(HttpSink {
        url: url?,
        timeout_ms,
        connect_timeout_ms,
        headers,
        forward_headers,
        signing_secret,
    })
}

fn redis_sink(fields: &Fields) -> Option<RedisSink> {
    let url = fields.required("url", |ctx, value| {
        let url = ctx.string(value)?;
        // Parsed now so a typo fails at load; the reason never echoes the URL, which may
        // hold a password.
        match clients::redis_url(&url) {
            Ok(()) => Some(url),
            Err(reason) => {
                ctx.error(format_args!(
                    "not a valid Redis URL (redis://[user:password@]host[:port][/db] or \
                     rediss://…): {reason}"
                ));
                None
            }
        }
    });
    let stream = fields.opt("stream", redis_key);
    let list = fields.opt("list", redis_key);
    let maxlen = fields.opt("maxlen", positive_uint);
    let timeout_ms = fields
        .opt("timeout_ms", positive_uint)
        .unwrap_or(BROKER_TIMEOUT_MS);
    let target = match (stream, list, fields.has("stream"), fields.has("list")) {
        (Some(key), None, _, false) => Some(RedisTarget::Stream { key, maxlen }),
        (None, Some(key), false, _) => {
            if let Some((ctx, _)) = fields.get("maxlen") {
                ctx.error("applies to a stream only (a list is not trimmed)");
            }
            Some(RedisTarget::List { key })
        }
        (_, _, true, true) => {
            fields
                .ctx()
                .error("set exactly one of stream or list, not both");
            None
        }
        (_, _, false, false) => {
            fields
                .ctx()
                .error("set one of stream (XADD) or list (LPUSH)");
            None
        }
        // The key that failed to read was reported.
        _ => None,
    };
    Some(RedisSink {
        url: url?,
        target: target?,
        timeout_ms,
    })
}

fn redis_key(ctx: &Ctx, value: &Value) -> Option<String> {
    ctx.non_empty_string(value)
}

fn nats_sink(fields: &Fields) -> Option<NatsSink> {
    let url = fields.required("url", |ctx, value| {
        let url = ctx.string(value)?;
        let mut complete = !url.trim().is_empty();
        for server in url.split(',') {
            if let Err(error) = clients::nats_server(server.trim()) {
                ctx.error(format_args!(
                    "not a valid NATS server address (nats://host:port, several separated \
                     by commas): {error}"
                ));
                complete = false;
            }
        }
        if url.trim().is_empty() {
            ctx.error("must not be empty");
        }
        complete.then_some(url)
    });
    let subject = fields.required("subject", |ctx, value| {
        let subject = ctx.string(value)?;
        match check_nats_subject(&subject) {
            Ok(()) => Some(subject),
            Err(reason) => {
                ctx.error(format_args!(
                    "not a publish subject: {reason} ({subject:?})"
                ));
                None
            }
        }
    });
    let jetstream = fields.opt("jetstream", Ctx::bool).unwrap_or(true);
    let credentials_file = fields.opt("credentials_file", |ctx, value| {
        let path = PathBuf::from(ctx.non_empty_string(value)?);
        if !path.is_file() {
            ctx.error(format_args!("no such file: {}", path.display()));
            return None;
        }
        Some(path)
    });
    let credentials_failed = fields.has("credentials_file") && credentials_file.is_none();
    let timeout_ms = fields
        .opt("timeout_ms", positive_uint)
        .unwrap_or(BROKER_TIMEOUT_MS);
    if credentials_failed {
        return None;
    }
    Some(NatsSink {
        url: url?,
        subject: subject?,
        jetstream,
        credentials_file,
        timeout_ms,
    })
}

/// Dot-separated tokens of visible ASCII, none empty, no wildcard: a subject one message
/// can be published to.
fn check_nats_subject(subject: &str) -> Result<(), &'static str> {
    if subject.is_empty() {
        return Err("empty");
    }
    if !subject.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err("only visible ASCII, no spaces");
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err("an empty token (two dots, or a dot at an end)");
        }
        if token == "*" || token == ">" {
            return Err("wildcards subscribe; a publish names one subject");
        }
    }
    Ok(())
}

fn rabbitmq_sink(fields: &Fields) -> Option<RabbitmqSink> {
    let url = fields.required("url", |ctx, value| {
        let url = ctx.string(value)?;
        match clients::amqp_url(&url) {
            Ok(()) => Some(url),
            Err(error) => {
                ctx.error(format_args!(
                    "not a valid AMQP URL (amqp://user:password@host:port/vhost or \
                     amqps://…): {error}"
                ));
                None
            }
        }
    });
    // AMQP 0-9-1 short strings: at most 255 bytes.
    let short_string = |ctx: &Ctx, value: &Value| {
        let text = ctx.string(value)?;
        if text.len() > 255 {
            ctx.error(format_args!("at most 255 bytes, found {}", text.len()));
            return None;
        }
        Some(text)
    };
    let exchange = fields.required("exchange", |ctx, value| {
        let name = short_string(ctx, value)?;
        if !name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-_.:".contains(&byte))
        {
            ctx.error(format_args!(
                "not a valid exchange name {name:?} (letters, digits, - _ . : only; \"\" is the \
                 default exchange)"
            ));
            return None;
        }
        Some(name)
    });
    let routing_key = fields.required("routing_key", short_string);
    let persistent = fields.opt("persistent", Ctx::bool).unwrap_or(true);
    let mandatory = fields.opt("mandatory", Ctx::bool).unwrap_or(true);
    let confirm_timeout_ms = fields
        .opt("confirm_timeout_ms", positive_uint)
        .unwrap_or(BROKER_TIMEOUT_MS);
    Some(RabbitmqSink {
        url: url?,
        exchange: exchange?,
        routing_key: routing_key?,
        persistent,
        mandatory,
        confirm_timeout_ms,
    })
}

fn kafka_sink(fields: &Fields) -> Option<KafkaSink> {
    let brokers = fields.required("brokers", |ctx, value| {
        let brokers = ctx.non_empty_string(value)?;
        let mut complete = true;
        for broker in brokers.split(',').map(str::trim) {
            if let Err(reason) = check_broker(broker) {
                ctx.error(format_args!(
                    "not a broker address {broker:?}: {reason} (host:port, several separated \
                     by commas)"
                ));
                complete = false;
            }
        }
        complete.then_some(brokers)
    });
    let topic = fields.required("topic", |ctx, value| {
        let topic = ctx.string(value)?;
        match check_kafka_topic(&topic) {
            Ok(()) => Some(topic),
            Err(reason) => {
                ctx.error(format_args!("not a valid topic name {topic:?}: {reason}"));
                None
            }
        }
    });
    let acks = fields.opt("acks", |ctx, value| {
        let text = match value {
            Value::Number(number) => number.to_string(),
            _ => ctx.string(value)?,
        };
        match text.as_str() {
            "all" | "-1" => Some(KafkaAcks::All),
            "1" => Some(KafkaAcks::Leader),
            "0" => {
                ctx.error(
                    "acks 0 never confirms a record, and a hook counts as delivered only \
                         once the destination confirms it (use all or 1)",
                );
                None
            }
            _ => {
                ctx.error(format_args!("expected all or 1, found {text:?}"));
                None
            }
        }
    });
    let acks_failed = fields.has("acks") && acks.is_none();
    let compression = fields
        .opt("compression", |ctx, value| {
            let text = ctx.string(value)?;
            if KAFKA_COMPRESSIONS.contains(&text.as_str()) {
                Some(text)
            } else {
                ctx.error(format_args!(
                    "unknown compression {text:?} (expected one of: {})",
                    KAFKA_COMPRESSIONS.join(", ")
                ));
                None
            }
        })
        .unwrap_or_else(|| "none".to_owned());
    let client = fields.opt("client", kafka_client_settings);
    let client_failed = fields.has("client") && client.is_none();
    let timeout_ms = fields
        .opt("timeout_ms", positive_uint)
        .unwrap_or(BROKER_TIMEOUT_MS);
    if client_failed || acks_failed {
        return None;
    }
    Some(KafkaSink {
        brokers: brokers?,
        topic: topic?,
        acks: acks.unwrap_or(KafkaAcks::All),
        compression,
        client: client.unwrap_or_default(),
        timeout_ms,
    })
}

/// `host:port` with a numeric port; librdkafka resolves the host when it connects.
fn check_broker(broker: &str) -> Result<(), &'static str> {
    let Some((host, port)) = broker.rsplit_once(':') else {
        return Err("missing :port");
    };
    let host = host
        .strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err("missing host");
    }
    if !host
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || b"-._:".contains(&byte))
    {
        return Err("bad character in host");
    }
    match port.parse::<u16>() {
        Ok(port) if port > 0 => Ok(()),
        _ => Err("port must be a number from 1 to 65535"),
    }
}

/// Kafka's own rule: 1-249 characters of a-z, A-Z, 0-9, `.`, `_`, `-`; not `.` or `..`.
fn check_kafka_topic(topic: &str) -> Result<(), &'static str> {
    if topic.is_empty() || topic.len() > 249 {
        return Err("1 to 249 characters");
    }
    if topic == "." || topic == ".." {
        return Err("\".\" and \"..\" are not topic names");
    }
    if !topic
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte))
    {
        return Err("letters, digits, . _ - only");
    }
    Ok(())
}

/// The `client:` map of librdkafka settings. Each is checked by librdkafka itself (an
/// unknown name or a bad value fails here, at load, not at the first delivery); the
/// settings Ankusa's own keys own are refused with the key to use instead.
fn kafka_client_settings(ctx: &Ctx, value: &Value) -> Option<Vec<(String, String)>> {
    let map = ctx.raw_mapping(value)?;
    let mut settings = Vec::with_capacity(map.len());
    let mut complete = true;
    for (key, value) in map {
        let Value::String(name) = key else {
            ctx.error(format_args!(
                "setting names must be strings, found {}",
                describe(key)
            ));
            complete = false;
            continue;
        };
        let setting_ctx = ctx.field(name);
        if let Some((_, owner)) = KAFKA_OWNED_SETTINGS.iter().find(|(owned, _)| owned == name) {
            setting_ctx.error(format_args!(
                "set by the sink itself; use the sink's {owner} key"
            ));
            complete = false;
            continue;
        }
        let text = match value {
            Value::Bool(flag) => flag.to_string(),
            Value::Number(number) => number.to_string(),
            _ => match setting_ctx.string(value) {
                Some(text) => text,
                None => {
                    complete = false;
                    continue;
                }
            },
        };
        if let Err(reason) = clients::kafka_property(name, &text) {
            setting_ctx.error(format_args!("librdkafka refuses it: {reason}"));
            complete = false;
            continue;
        }
        settings.push((name.clone(), text));
    }
    complete.then_some(settings)
}

fn sqs_sink(fields: &Fields, ordered: bool) -> Option<SqsSink> {
    let queue_url = fields.required("queue_url", |ctx, value| {
        let url = http_url(ctx, value)?;
        let name = url
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default();
        let bare = name.strip_suffix(".fifo").unwrap_or(name);
        if bare.is_empty()
            || bare.len() > 75
            || !bare
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"-_".contains(&byte))
        {
            ctx.error(format_args!(
                "the URL must end with the queue name (1-80 characters of letters, digits, - \
                 and _, and .fifo for a FIFO queue), found {name:?}"
            ));
            return None;
        }
        Some(url)
    });
    let region = fields.required("region", |ctx, value| {
        let region = ctx.non_empty_string(value)?;
        if !region
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        {
            ctx.error(format_args!(
                "not a region name {region:?} (like us-east-1)"
            ));
            return None;
        }
        Some(region)
    });
    let endpoint = fields.opt("endpoint", http_url);
    let endpoint_failed = fields.has("endpoint") && endpoint.is_none();
    let max_message_bytes = fields
        .opt("max_message_bytes", |ctx, value| {
            let size = ctx.size(value)?;
            if !(1024..=SQS_MESSAGE_BYTES_MAX).contains(&size) {
                ctx.error(format_args!(
                    "SQS takes 1024 to {SQS_MESSAGE_BYTES_MAX} bytes (the queue's \
                     MaximumMessageSize), found {size}"
                ));
                return None;
            }
            Some(size)
        })
        .unwrap_or(SQS_MESSAGE_BYTES_DEFAULT);
    let (batch_size, max_in_flight) = batching(fields, SQS_BATCH_MAX, SQS_BATCH_MAX as usize);
    let timeout_ms = fields
        .opt("timeout_ms", positive_uint)
        .unwrap_or(BROKER_TIMEOUT_MS);
    let sink = SqsSink {
        queue_url: queue_url?,
        region: region?,
        endpoint,
        max_message_bytes,
        batch_size,
        max_in_flight,
        timeout_ms,
    };
    if ordered && !sink.fifo() {
        fields.ctx().field("ordered").error(
            "needs a FIFO queue (queue_url ending .fifo): a standard queue does not keep \
             order, so ordered delivery there would be a promise SQS breaks",
        );
        return None;
    }
    if endpoint_failed {
        return None;
    }
    Some(sink)
}

fn pubsub_sink(fields: &Fields, ordered: bool) -> Option<PubsubSink> {
    let project = fields.required("project", |ctx, value| {
        let project = ctx.non_empty_string(value)?;
        // Project ids, and the domain-scoped `example.com:project` form.
        if project.len() > 100
            || !project.bytes().all(|byte| {
                byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"-.:".contains(&byte)
            })
        {
            ctx.error(format_args!(
                "not a project id {project:?} (lower-case letters, digits, - . :)"
            ));
            return None;
        }
        Some(project)
    });
    let topic = fields.required("topic", |ctx, value| {
        let topic = ctx.string(value)?;
        match check_pubsub_topic(&topic) {
            Ok(()) => Some(topic),
            Err(reason) => {
                ctx.error(format_args!("not a valid topic name {topic:?}: {reason}"));
                None
            }
        }
    });
    let endpoint = fields.opt("endpoint", http_url);
    let endpoint_failed = fields.has("endpoint") && endpoint.is_none();
    let credentials_file = fields.opt("credentials_file", |ctx, value| {
        let path = PathBuf::from(ctx.non_empty_string(value)?);
        match clients::pubsub_credentials_file(&path) {
            Ok(()) => Some(path),
            Err(reason) => {
                ctx.error(format_args!("{}: {reason}", path.display()));
                None
            }
        }
    });
    let access_token = fields.opt("access_token", Ctx::non_empty_string);
    let auth_failed = (fields.has("credentials_file") && credentials_file.is_none())
        || (fields.has("access_token") && access_token.is_none());
    let auth = match (credentials_file, access_token) {
        (Some(_), Some(_)) => {
            fields
                .ctx()
                .error("set at most one of credentials_file or access_token");
            return None;
        }
        (Some(path), None) => PubsubAuth::ServiceAccount(path),
        (None, Some(token)) => PubsubAuth::AccessToken(token),
        (None, None) => {
            if !auth_failed && !fields.has("endpoint") {
                fields.ctx().error(
                    "needs credentials_file (a service account key) or access_token to \
                     publish to Google; only an endpoint (the emulator) takes none",
                );
                return None;
            }
            PubsubAuth::None
        }
    };
    // Without `ordered`, a plain string is the legacy fixed key; sink_ordering judged the
    // other forms.
    let fixed_ordering_key = if ordered {
        None
    } else {
        fields.opt("ordering_key", |ctx, value| {
            let Value::String(_) = value else {
                return None;
            };
            let key = ctx.non_empty_string(value)?;
            if key.len() > PUBSUB_ORDERING_KEY_MAX {
                ctx.error(format_args!(
                    "Pub/Sub takes ordering keys of at most {PUBSUB_ORDERING_KEY_MAX} bytes, \
                     found {}",
                    key.len()
                ));
                return None;
            }
            Some(key)
        })
    };
    let (batch_size, max_in_flight) = batching(fields, PUBSUB_BATCH_MAX, PUBSUB_BATCH_DEFAULT);
    let timeout_ms = fields
        .opt("timeout_ms", positive_uint)
        .unwrap_or(BROKER_TIMEOUT_MS);
    if endpoint_failed || auth_failed {
        return None;
    }
    Some(PubsubSink {
        project: project?,
        topic: topic?,
        endpoint: endpoint
            .map(|endpoint| endpoint.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| PUBSUB_ENDPOINT.to_owned()),
        auth,
        fixed_ordering_key,
        batch_size,
        max_in_flight,
        timeout_ms,
    })
}

/// `batch_size` (1 to what one request of the service takes) and `max_in_flight`, with
/// their defaults.
fn batching(fields: &Fields, batch_max: u64, batch_default: usize) -> (usize, usize) {
    let batch_size = fields
        .opt("batch_size", |ctx, value| {
            ctx.uint(value)
                .and_then(|n| ctx.in_range(n, 1..=batch_max))
                .and_then(|n| ctx.to_usize(n))
        })
        .unwrap_or(batch_default);
    let max_in_flight = fields
        .opt("max_in_flight", |ctx, value| {
            ctx.uint(value)
                .and_then(|n| ctx.in_range(n, 1..=BATCH_IN_FLIGHT_MAX))
                .and_then(|n| ctx.to_usize(n))
        })
        .unwrap_or(BATCH_IN_FLIGHT_DEFAULT);
    (batch_size, max_in_flight)
}

/// Pub/Sub's rule: 3-255 characters, starting with a letter, of letters, digits and
/// `- _ . ~ + %`, not starting with `goog`.
fn check_pubsub_topic(topic: &str) -> Result<(), &'static str> {
    if !(3..=255).contains(&topic.len()) {
        return Err("3 to 255 characters");
    }
    if !topic.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("must start with a letter");
    }
    if topic.to_ascii_lowercase().starts_with("goog") {
        return Err("must not start with goog");
    }
    if !topic
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || b"-_.~+%".contains(&byte))
    {
        return Err("letters, digits, - _ . ~ + % only");
    }
    Ok(())
}

/// Static headers sent with every delivery. Values may hold `${ENV}`; CR and LF are
/// refused so a value cannot smuggle a second header into the request.
fn static_headers(ctx: &Ctx, value: &Value) -> Option<Vec<(String, String)>> {
    let map = ctx.raw_mapping(value)?;
    let mut headers = Vec::with_capacity(map.len());
    let mut complete = true;
    for (key, value) in map {
        let Value::String(name) = key else {
            ctx.error(format_args!(
                "header names must be strings, found {}",
                describe(key)
            ));
            complete = false;
            continue;
        };
        let header_ctx = ctx.field(name);
        if !is_http_token(name) {
            header_ctx.error(format_args!(
                "not a valid header name: {name:?} (letters, digits and !#$%&'*+-.^_`|~ only)"
            ));
            complete = false;
            continue;
        }
        match header_ctx.string(value) {
            Some(text) if text.contains(['\r', '\n']) => {
                header_ctx.error("header value must not contain CR or LF");
                complete = false;
            }
            Some(text) => headers.push((name.clone(), text)),
            None => complete = false,
        }
    }
    complete.then_some(headers)
}

fn http_url(ctx: &Ctx, value: &Value) -> Option<String> {
    let url = ctx.string(value)?;
    match check_http_url(&url) {
        Ok(()) => Some(url),
        Err(reason) => {
            ctx.error(format_args!("not a valid URL: {reason} ({url:?})"));
            None
        }
    }
}

/// Enough of RFC 3986 to catch typos at load: an http(s) scheme, a host, a numeric port,
/// no whitespace. The HTTP client parses the URL fully when it connects.
pub(crate) fn check_http_url(url: &str) -> Result<(), &'static str> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters");
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("expected http:// or https://");
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err("scheme must be http or https");
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host_port)| host_port);
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let Some((address, after)) = bracketed.split_once(']') else {
            return Err("unclosed [ in IPv6 host");
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("bad IPv6 address");
        }
        match after {
            "" => (address, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (address, Some(port)),
                None => return Err("unexpected text after IPv6 host"),
            },
        }
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err("missing host");
    }
    let is_ipv6 = host.contains(':');
    if !is_ipv6
        && !host
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-._~%".contains(&byte))
    {
        return Err("bad character in host");
    }
    if let Some(port) = port {
        if port.is_empty() || !port.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err("port must be a number");
        }
        if port.parse::<u16>().is_err() {
            return Err("port must be at most 65535");
        }
    }
    Ok(())
}
