//! Ankusa's YAML configuration: loading, `${ENV}` substitution, validation and the
//! human summary printed by `ankusa check-config`.
//!
//! A file goes YAML text → `serde_yaml_ng::Value` → a checked [`Config`] in one pass that
//! collects every problem as `yaml.path: message`, so a bad file fails at load with the
//! full list rather than one error per run. Environment references are substituted in
//! string values after the YAML is parsed, never in the raw text, so a secret holding
//! YAML syntax stays a plain string.
//!
//! - `model`: the validated types everything else takes.
//! - `walk`: the generic walker (paths, problems, typed scalars, unknown keys, `${ENV}`).
//! - `validate`: the sections, their defaults and their cross-checks.
//! - `presets`: `provider: NAME`, what each provider's preset fills in.
//! - `clients`: the settings a client library checks (URLs, librdkafka properties).

mod clients;
pub mod model;
mod presets;
mod validate;
mod walk;

#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use model::*;
pub use validate::{is_valid_id, schema, Section, ID_GRAMMAR};

/// The config `ankusa` uses when told to start without one: needs nothing installed and no
/// environment.
pub const QUICKSTART_YAML: &str = include_str!("quickstart.yaml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Every problem found, each `yaml.path: message`, in document order per section.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
}

/// Reads `path` and parses it with the process environment.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let yaml = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&yaml)
}

/// Parses a config, taking `${NAME}` values from the process environment.
pub fn parse(yaml: &str) -> Result<Config, ConfigError> {
    parse_with_env(yaml, &|name| std::env::var(name).ok())
}

/// Parses a config, taking `${NAME}` values from `env` (tests pass a fixed table).
pub fn parse_with_env(
    yaml: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    // A syntax error leaves no tree to walk, so it is the one problem reported.
    let mut document: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml)
        .map_err(|error| ConfigError::Invalid(vec![syntax_problem(yaml, &error)]))?;
    document
        .apply_merge()
        .map_err(|error| ConfigError::Invalid(vec![format!("yaml: {error}")]))?;
    // Nothing below the root can be read when it is not a mapping, so that is the one
    // problem; an empty file is an empty mapping and fails for want of sources.
    if !matches!(
        document,
        serde_yaml_ng::Value::Mapping(_) | serde_yaml_ng::Value::Null
    ) {
        let found = walk::describe(&document);
        return Err(ConfigError::Invalid(vec![format!(
            "(root): expected a mapping, found {found}"
        )]));
    }
    let problems = RefCell::new(Vec::new());
    let config = validate::config(&walk::Ctx::root(&problems, env), &document);
    let problems = problems.into_inner();
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// A YAML syntax error with its position. An unquoted `${NAME}` inside `{…}` is the likely
/// slip (its `}` closes the flow mapping), so the message says how to fix it.
fn syntax_problem(yaml: &str, error: &serde_yaml_ng::Error) -> String {
    let line_has_reference = error
        .location()
        .and_then(|location| yaml.lines().nth(location.line().saturating_sub(1)))
        .is_some_and(|line| line.contains("${"));
    if line_has_reference && error.to_string().contains("flow") {
        format!("yaml: {error} (inside {{…}} or […], quote ${{NAME}} references: '${{NAME}}')")
    } else {
        format!("yaml: {error}")
    }
}

/// What `ankusa check-config` prints for a good file. Secrets and tokens are never shown,
/// only whether they are set, and credentials in sink URLs are masked.
pub fn summary(config: &Config) -> String {
    let instance = &config.instance;
    let mut out = String::new();
    // Writing to a String cannot fail, so the results are ignored.
    let _ = writeln!(out, "listen:       {}", instance.listen);
    let _ = writeln!(
        out,
        "admin_listen: {} (admin token {})",
        instance.admin_listen,
        if instance.admin_token.is_some() {
            "set"
        } else {
            "not set"
        }
    );
    let _ = writeln!(out, "data_dir:     {}", instance.data_dir.display());
    let _ = writeln!(out, "cores:        {}", describe_cores(&instance.cores));
    let _ = writeln!(
        out,
        "store.sync:   {}",
        if config.store.sync {
            "true"
        } else {
            "false (UNSAFE: a 2xx no longer means the hook is on disk)"
        }
    );
    let _ = writeln!(
        out,
        "store.min_free_bytes: {} (under it new hooks get 503 disk_full)",
        config.store.min_free_bytes
    );
    let _ = writeln!(
        out,
        "store memory: block cache {} bytes, memtables {} bytes (RocksDB's bounds)",
        config.store.memory.block_cache_bytes, config.store.memory.memtable_bytes
    );
    let tenant_ids: Vec<&str> = config
        .tenants
        .iter()
        .map(|tenant| tenant.id.as_str())
        .collect();
    let _ = writeln!(
        out,
        "tenants:      {} ({})",
        tenant_ids.len(),
        tenant_ids.join(", ")
    );
    let _ = writeln!(out, "sources:      {}", config.sources.len());
    for source in &config.sources {
        let tenancy = match &source.tenancy {
            Tenancy::Fixed(tenant) => format!("tenant {tenant}"),
            Tenancy::Path { auto: false } => "tenant from path".to_owned(),
            Tenancy::Path { auto: true } => "tenant from path, auto tenants".to_owned(),
        };
        let dedupe = match &source.dedupe {
            None => "none".to_owned(),
            Some(dedupe) => describe_dedupe(dedupe),
        };
        let dedupe = match source.dedupe {
            Some(_) => format!(
                "{dedupe} ({} h window)",
                source.dedupe_window_ms / 3_600_000
            ),
            None => dedupe,
        };
        let _ = writeln!(
            out,
            "  {}: {tenancy}, verify {}, dedupe {dedupe}{}",
            source.id,
            scheme_name(&source.verify),
            if source.quarantine {
                ", quarantine"
            } else {
                ""
            }
        );
        if let Some(name) = source.provider {
            describe_preset(&mut out, config, source, name);
        }
        for sink in &source.sinks {
            let ordering = match &sink.ordering {
                None => String::new(),
                Some(SinkOrdering { key: None }) => ", ordered (one keyless lane)".into(),
                Some(SinkOrdering {
                    key: Some(OrderingKey::Header(name)),
                }) => format!(", ordered by header {name}"),
                Some(SinkOrdering {
                    key: Some(OrderingKey::Json(path)),
                }) => format!(", ordered by json {}", path.join(".")),
            };
            let destination = match &sink.kind {
                SinkKind::Http(http) => mask_userinfo(&http.url),
                SinkKind::Redis(redis) => {
                    let target = match &redis.target {
                        RedisTarget::Stream { key, maxlen: None } => format!("stream {key}"),
                        RedisTarget::Stream {
                            key,
                            maxlen: Some(maxlen),
                        } => format!("stream {key} (maxlen ~{maxlen})"),
                        RedisTarget::List { key } => format!("list {key}"),
                    };
                    format!("{} {target}", mask_userinfo(&redis.url))
                }
                SinkKind::Nats(nats) => format!(
                    "{} subject {}{}",
                    nats.url
                        .split(',')
                        .map(|server| mask_userinfo(server.trim()))
                        .collect::<Vec<_>>()
                        .join(","),
                    nats.subject,
                    if nats.jetstream {
                        " (jetstream)"
                    } else {
                        " (core, not persisted)"
                    }
                ),
                SinkKind::Rabbitmq(rabbit) => format!(
                    "{} exchange {:?} routing key {:?}{}",
                    mask_userinfo(&rabbit.url),
                    rabbit.exchange,
                    rabbit.routing_key,
                    if rabbit.persistent {
                        ""
                    } else {
                        ", not persistent"
                    }
                ),
                SinkKind::Kafka(kafka) => format!(
                    "{} topic {} (acks {}, compression {}{})",
                    kafka.brokers,
                    kafka.topic,
                    match kafka.acks {
                        KafkaAcks::All => "all, idempotent",
                        KafkaAcks::Leader => "1",
                    },
                    kafka.compression,
                    // Names only: values may be SASL passwords.
                    if kafka.client.is_empty() {
                        String::new()
                    } else {
                        let names: Vec<&str> =
                            kafka.client.iter().map(|(name, _)| name.as_str()).collect();
                        format!(", client {}", names.join(" "))
                    }
                ),
                SinkKind::Sqs(sqs) => format!(
                    "{} ({}, {}{})",
                    sqs.queue_url,
                    sqs.region,
                    if sqs.fifo() { "fifo" } else { "standard" },
                    sqs.endpoint
                        .as_deref()
                        .map(|endpoint| format!(", endpoint {}", mask_userinfo(endpoint)))
                        .unwrap_or_default()
                ),
                SinkKind::Pubsub(pubsub) => format!(
                    "{}/v1/projects/{}/topics/{} ({}{})",
                    mask_userinfo(&pubsub.endpoint),
                    pubsub.project,
                    pubsub.topic,
                    match &pubsub.auth {
                        PubsubAuth::ServiceAccount(path) =>
                            format!("service account {}", path.display()),
                        PubsubAuth::AccessToken(_) => "access token".to_owned(),
                        PubsubAuth::None => "no credentials".to_owned(),
                    },
                    pubsub
                        .fixed_ordering_key
                        .as_deref()
                        .map(|key| format!(", fixed ordering key {key:?}"))
                        .unwrap_or_default()
                ),
            };
            let _ = writeln!(
                out,
                "    sink {}: {} {destination}{ordering}",
                sink.id,
                sink.kind.name()
            );
        }
    }
    // The caller prints it with `println!`, which adds the last newline.
    out.pop();
    out
}

/// The placement as written, in the startup log's form. The machine's cores are not
/// consulted: `serve` resolves the defaults and refuses a core it may not use.
fn describe_cores(cores: &Cores) -> String {
    let list = |cores: &Option<Vec<usize>>| match cores {
        Some(cores) => format!(
            "[{}]",
            cores
                .iter()
                .map(|core| core.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
        None => "default".to_owned(),
    };
    format!(
        "ingest={} writer={} pipeline={} sink_io={} (checked against this machine by serve)",
        list(&cores.ingest),
        cores
            .writer
            .map_or_else(|| "default".to_owned(), |core| core.to_string()),
        list(&cores.pipeline),
        list(&cores.sink_io)
    )
}

fn describe_dedupe(dedupe: &Dedupe) -> String {
    match dedupe {
        Dedupe::Header(name) => format!("header {name}"),
        Dedupe::Json(path) => format!("json {}", path.join(".")),
        Dedupe::JsonOrKeyless(path) => {
            format!("json {} (a body that is not JSON: no key)", path.join("."))
        }
        Dedupe::Body => "body".to_owned(),
    }
}

/// What `provider: NAME` expanded to for `source`: the values in force, each marked where
/// the source's own keys replaced the preset's.
fn describe_preset(out: &mut String, config: &Config, source: &Source, name: &str) {
    let Some(preset) = presets::preset(name) else {
        return;
    };
    let mark = |overridden: bool| {
        if overridden {
            " (set by the source)"
        } else {
            ""
        }
    };
    let _ = writeln!(out, "    provider {name} expands to:");
    let _ = writeln!(
        out,
        "      verify:        {}, {}",
        scheme_name(&source.verify),
        describe_scheme(&source.verify)
    );
    let preset_dedupe = preset.dedupe();
    let dedupe = match &source.dedupe {
        None => "none".to_owned(),
        Some(dedupe) => describe_dedupe(dedupe),
    };
    let _ = writeln!(
        out,
        "      dedupe:        {dedupe}{}",
        mark(source.dedupe.as_ref() != Some(&preset_dedupe))
    );
    let _ = writeln!(
        out,
        "      dedupe window: {} h{}",
        source.dedupe_window_ms / 3_600_000,
        mark(source.dedupe_window_ms != preset.dedupe_window_ms)
    );
    let rules = |wanted: HeaderAction| {
        let names: Vec<&str> = source
            .store_headers
            .rules
            .iter()
            .filter(|(_, action)| *action == wanted)
            .map(|(name, _)| name.as_str())
            .collect();
        if names.is_empty() {
            "-".to_owned()
        } else {
            names.join(" ")
        }
    };
    let preset_policy = preset.store_headers(&config.instance.store_headers);
    let _ = writeln!(
        out,
        "      store_headers: keep {}; drop {}; hash {}{}",
        rules(HeaderAction::Keep),
        rules(HeaderAction::Drop),
        rules(HeaderAction::Hash),
        mark(source.store_headers != preset_policy)
    );
}

/// The headers (and settings other than secrets) a scheme checks.
fn describe_scheme(verify: &Verify) -> String {
    match verify {
        Verify::None => "no check".to_owned(),
        Verify::Token { header, .. } => format!("header {header}"),
        Verify::Hmac { header, .. } => format!("header {header}"),
        Verify::Stripe { tolerance_s, .. } => {
            format!("header stripe-signature, tolerance {tolerance_s} s")
        }
        Verify::Github { .. } => "header x-hub-signature-256".to_owned(),
        Verify::StandardWebhooks { tolerance_s, .. } => format!(
            "headers webhook-id webhook-timestamp webhook-signature, tolerance {tolerance_s} s"
        ),
        Verify::Shopify { .. } => "header x-shopify-hmac-sha256".to_owned(),
        Verify::Slack { tolerance_s, .. } => format!(
            "headers x-slack-signature x-slack-request-timestamp, tolerance {tolerance_s} s"
        ),
        Verify::Twilio { public_url, .. } => format!(
            "header x-twilio-signature, signed URL {} + request path and query",
            mask_userinfo(public_url)
        ),
    }
}

fn scheme_name(verify: &Verify) -> &'static str {
    match verify {
        Verify::None => "none",
        Verify::Token { .. } => "token",
        Verify::Hmac { .. } => "hmac",
        Verify::Stripe { .. } => "stripe",
        Verify::Github { .. } => "github",
        Verify::StandardWebhooks { .. } => "standard-webhooks",
        Verify::Shopify { .. } => "shopify",
        Verify::Slack { .. } => "slack",
        Verify::Twilio { .. } => "twilio",
    }
}

/// `https://user:pass@host/x` → `https://***@host/x`: a URL may carry credentials.
fn mask_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_owned(),
    }
}
