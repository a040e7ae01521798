//! Whole-file tests of `config::parse_with_env`: a table of bad configs each paired with the
//! exact problems it must report, the DESIGN section 6 example, the quickstart, and
//! `summary`. Reader-level cases (sizes, `${ENV}`) live beside `walk`.

#![allow(clippy::unwrap_used)]

use super::*;

/// The environment every case sees; anything else is unset.
fn env(name: &str) -> Option<String> {
    match name {
        "STRIPE_WEBHOOK_SECRET" => Some("whsec_stripe_test".to_owned()),
        "ANKUSA_ADMIN_TOKEN" => Some("admin-t0ken".to_owned()),
        "PORT" => Some("8081".to_owned()),
        _ => None,
    }
}

/// Parses `yaml` and asserts the outcome: `Ok` when `expected` is empty, else exactly these
/// problems in this order.
#[track_caller]
fn check(yaml: &str, expected: &[&str]) {
    match parse_with_env(yaml, &env) {
        Ok(_) => assert!(
            expected.is_empty(),
            "parsed, but expected {expected:#?}\n{yaml}"
        ),
        Err(ConfigError::Invalid(problems)) => {
            assert_eq!(problems, expected, "\n{yaml}")
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

fn good(yaml: &str) -> Config {
    match parse_with_env(yaml, &env) {
        Ok(config) => config,
        Err(error) => panic!("{error}\n{yaml}"),
    }
}

/// The smallest valid file, for cases that change one thing.
const MINIMAL: &str = "
tenants: [{id: acme}]
sources:
  - id: s
    tenant: acme
    sinks: [{kind: http, url: 'http://127.0.0.1:9000/x'}]
";

/// `MINIMAL` with `extra` (top-level sections) prepended.
fn with(extra: &str) -> String {
    format!("{extra}\n{MINIMAL}")
}

/// One source with the given body lines (indented 4) after `id` and `tenant`.
fn with_source(lines: &str) -> String {
    let body: String = lines.lines().map(|line| format!("    {line}\n")).collect();
    format!("tenants: [{{id: acme}}]\nsources:\n  - id: s\n    tenant: acme\n{body}")
}

const SINK: &str = "sinks: [{kind: http, url: 'http://h/x'}]";

#[test]
fn minimal_config_takes_defaults() {
    let config = good(MINIMAL);
    assert_eq!(config.instance.data_dir, PathBuf::from("./data"));
    assert_eq!(config.instance.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.instance.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(config.instance.admin_token, None);
    assert_eq!(config.instance.cores, Cores::default());
    assert_eq!(
        config.instance.store_headers.rules,
        [
            ("authorization".to_owned(), HeaderAction::Drop),
            ("cookie".to_owned(), HeaderAction::Drop)
        ]
    );
    assert!(config.store.sync);
    assert_eq!(config.edge.body_max_bytes, 1 << 20);
    assert_eq!(config.edge.header_count_max, 64);
    assert_eq!(config.edge.header_bytes_max, 16 * 1024);
    assert_eq!(
        config.edge.header_read_timeout,
        std::time::Duration::from_secs(10)
    );
    assert_eq!(
        config.edge.body_read_timeout,
        std::time::Duration::from_secs(30)
    );
    assert_eq!(config.edge.idle_timeout, std::time::Duration::from_secs(60));
    assert_eq!(config.edge.connections_max, 10_000);
    assert_eq!(config.writer.channel_capacity, 65_536);
    assert_eq!(config.writer.batch_max, 1024);
    assert_eq!(config.writer.batch_bytes_max, 8 << 20);
    assert_eq!(
        (config.dispatch.batch, config.dispatch.sink_concurrency),
        (256, 8)
    );
    assert_eq!(
        (
            config.retry.initial_ms,
            config.retry.max_ms,
            config.retry.max_elapsed_ms
        ),
        (500, 600_000, 86_400_000)
    );
    assert_eq!(config.tenants[0].bounds.max_pending, 1_000_000);
    assert_eq!(config.tenants[0].bounds.max_bytes, 1 << 30);
    let source = &config.sources[0];
    assert_eq!(source.tenancy, Tenancy::Fixed("acme".into()));
    assert_eq!(source.verify, Verify::None);
    assert_eq!(source.dedupe, None);
    assert_eq!(source.store_headers, config.instance.store_headers);
    assert!(!source.quarantine);
    assert_eq!(source.sinks[0].id, "http");
    let SinkKind::Http(http) = &source.sinks[0].kind else {
        panic!("not an http sink")
    };
    assert_eq!(http.timeout_ms, 10_000);
    assert_eq!(http.connect_timeout_ms, 5_000);
    assert!(http.headers.is_empty() && http.forward_headers.is_empty());
    assert_eq!(http.signing_secret, None);
}

#[test]
fn bad_configs_report_exact_problems() {
    let cases: Vec<(String, Vec<&str>)> = vec![
        // 1. YAML syntax: one problem with its position.
        (
            "sources: [\n".into(),
            vec!["yaml: did not find expected node content at line 2 column 1, while parsing a flow node"],
        ),
        // 2. Empty file.
        ("".into(), vec!["sources: at least one source is required"]),
        // 3. Root of the wrong type.
        ("- a\n".into(), vec!["(root): expected a mapping, found a list"]),
        // 4. Unknown keys at the top and inside a section.
        (
            with("instanse: {}\nstore: {sync: true, fsync: false}"),
            vec![
                "instanse: unknown key (expected one of: instance, store, edge, writer, dispatch, retry, archive, admission, tenant_defaults, tenants, sources)",
                "store.fsync: unknown key (expected one of: sync, i_understand_acks_are_not_durable, min_free_bytes, block_cache_bytes, memtable_bytes)",
            ],
        ),
        // 4a. Acks that are not durable need saying so, in so many words.
        (
            with("store: {sync: false}"),
            vec!["store.sync: false acks a hook before its batch is on disk, so a crash or power loss loses acknowledged hooks; to run that way anyway, also set store.i_understand_acks_are_not_durable: true"],
        ),
        (
            with("store: {sync: false, i_understand_acks_are_not_durable: false}"),
            vec!["store.sync: false acks a hook before its batch is on disk, so a crash or power loss loses acknowledged hooks; to run that way anyway, also set store.i_understand_acks_are_not_durable: true"],
        ),
        (
            with("store: {sync: false, i_understand_acks_are_not_durable: true}"),
            vec![],
        ),
        // 4b. Breaker periods that contradict each other.
        (
            with("dispatch: {breaker_open_ms: 60000, breaker_open_max_ms: 1000}"),
            vec!["dispatch.breaker_open_max_ms: must be at least breaker_open_ms (60000), found 1000"],
        ),
        // 5. Unknown key on a source.
        (
            with_source(&format!("verfy: {{scheme: none}}\n{SINK}")),
            vec!["sources[0].verfy: unknown key (expected one of: id, tenant, tenant_from, auto_tenants, provider, verify, dedupe, dedupe_window_ms, store_headers, quarantine, sinks)"],
        ),
        // 6. Bad socket addresses.
        (
            with("instance: {listen: x, admin_listen: 'localhost:9090'}"),
            vec![
                "instance.listen: not a socket address: \"x\"",
                "instance.admin_listen: not a socket address: \"localhost:9090\"",
            ],
        ),
        // 7. Admin on a public address without a token.
        (
            with("instance: {admin_listen: '0.0.0.0:9090'}"),
            vec!["instance.admin_token: required when admin_listen (0.0.0.0:9090) is not a loopback address"],
        ),
        // 8. Cores: duplicate, negative, non-integer, empty list, unknown role.
        (
            with("instance: {cores: {ingest: [0, 1, 0], writer: -1, pipeline: [a], sink_io: [], io: 3}}"),
            vec![
                "instance.cores.io: unknown key (expected one of: ingest, writer, pipeline, sink_io)",
                "instance.cores.ingest[2]: core 0 is listed twice",
                "instance.cores.writer: expected a non-negative integer, found -1",
                "instance.cores.pipeline[0]: expected a non-negative integer, found \"a\"",
                "instance.cores.sink_io: must list at least one core",
            ],
        ),
        // 9. Header policy: a name in two lists, a bad name, a non-list.
        (
            with("instance: {store_headers: {drop: [Cookie], hash: [cookie, 'x y'], keep: authorization}}"),
            vec![
                "instance.store_headers.hash[0]: header \"cookie\" is already listed under drop",
                "instance.store_headers.hash[1]: not a valid header name: \"x y\" (letters, digits and !#$%&'*+-.^_`|~ only)",
                "instance.store_headers.keep: expected a list, found \"authorization\"",
            ],
        ),
        // 10. Edge sizes and limits.
        (
            with("edge: {body_max_bytes: 1MB5, header_bytes_max: 0, header_count_max: many, idle_timeout_ms: 0}"),
            vec![
                "edge.body_max_bytes: expected a size like 512KiB, 1MiB or 1048576, found \"1MB5\"",
                "edge.header_count_max: expected a non-negative integer, found \"many\"",
                "edge.header_bytes_max: must be at least 1, found 0",
                "edge.idle_timeout_ms: must be at least 1, found 0",
            ],
        ),
        // 11. Writer, dispatch and store types.
        (
            with("writer: {batch_max: 1.5, batch_bytes_max: [1]}\ndispatch: {batch: 0, sink_concurrency: 0}\nstore: {sync: yes, min_free_bytes: lots, block_cache_bytes: 4MiB, memtable_bytes: 1KB}"),
            vec![
                "store.sync: expected true or false, found \"yes\"",
                "store.min_free_bytes: expected a size like 512KiB, 1MiB or 1048576, found \"lots\"",
                "store.block_cache_bytes: must be at least 8MiB, found 4194304 bytes",
                "store.memtable_bytes: must be at least 16MiB, found 1000 bytes",
                "writer.batch_max: expected a non-negative integer, found 1.5",
                "writer.batch_bytes_max: expected a size like 512KiB, 1MiB or 1048576, found a list",
                "dispatch.batch: must be at least 1, found 0",
                "dispatch.sink_concurrency: must be at least 1, found 0",
            ],
        ),
        // 12. Retry bounds.
        (
            with("retry: {initial_ms: 0}"),
            vec!["retry.initial_ms: must be at least 1, found 0"],
        ),
        (
            with("retry: {initial_ms: 1000, max_ms: 100}"),
            vec!["retry.max_ms: must be at least initial_ms (1000), found 100"],
        ),
        // 13. Tenant ids: grammar, duplicates, missing; bad bounds.
        (
            "tenants:\n  - {id: Acme}\n  - {id: ok}\n  - {id: ok}\n  - {max_pending: -3, max_bytes: big}\nsources: []\n".into(),
            vec![
                "tenants[0].id: invalid id \"Acme\" (1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit)",
                "tenants[2].id: duplicate tenant id \"ok\"",
                "tenants[3].id: required",
                "tenants[3].max_pending: expected a non-negative integer, found -3",
                "tenants[3].max_bytes: expected a size like 512KiB, 1MiB or 1048576, found \"big\"",
                "sources: at least one source is required",
            ],
        ),
        // 14. Sources of the wrong type.
        ("sources: {id: s}\n".into(), vec!["sources: expected a list, found a mapping"]),
        // 15. Tenancy: unknown tenant, both, neither, bad tenant_from.
        (
            format!(
                "tenants: [{{id: acme}}]\nsources:\n  - {{id: a, tenant: nope, {SINK}}}\n  - {{id: b, tenant: acme, tenant_from: path, {SINK}}}\n  - {{id: c, {SINK}}}\n  - {{id: d, tenant_from: query, {SINK}}}\n"
            ),
            vec![
                "sources[0].tenant: unknown tenant \"nope\" (declare it under tenants)",
                "sources[1]: set only one of tenant or tenant_from",
                "sources[2]: one of tenant or tenant_from is required",
                "sources[3].tenant_from: expected \"path\", found \"query\"",
            ],
        ),
        // 16. Source ids: duplicate and bad grammar.
        (
            format!(
                "tenants: [{{id: acme}}]\nsources:\n  - {{id: s, tenant: acme, {SINK}}}\n  - {{id: s, tenant: acme, {SINK}}}\n  - {{id: -s, tenant: acme, {SINK}}}\n"
            ),
            vec![
                "sources[1].id: duplicate source id \"s\"",
                "sources[2].id: invalid id \"-s\" (1-64 characters of a-z, 0-9, _ and -, starting with a letter or digit)",
            ],
        ),
        // 17. Verify: unknown scheme, missing scheme.
        (
            with_source(&format!("verify: {{scheme: md5}}\n{SINK}")),
            vec!["sources[0].verify.scheme: unknown scheme \"md5\" (expected one of: none, token, hmac, stripe, github, standard-webhooks, shopify, slack, twilio)"],
        ),
        (
            with_source(&format!("verify: {{secret: x}}\n{SINK}")),
            vec!["sources[0].verify.scheme: required (one of: none, token, hmac, stripe, github, standard-webhooks, shopify, slack, twilio)"],
        ),
        // 18. Verify: unset secret, empty secret, key not valid for the scheme.
        (
            with_source(&format!("verify: {{scheme: stripe, secret: '${{STRIPE_SECRET_TYPO}}', header: x}}\n{SINK}")),
            vec![
                "sources[0].verify.header: unknown key (expected one of: scheme, secret, tolerance_s)",
                "sources[0].verify.secret: environment variable STRIPE_SECRET_TYPO is not set",
            ],
        ),
        (
            with_source(&format!("verify: {{scheme: token, token: ''}}\n{SINK}")),
            vec!["sources[0].verify.token: must not be empty"],
        ),
        (
            with_source(&format!("verify: {{scheme: hmac, header: 'x sig'}}\n{SINK}")),
            vec![
                "sources[0].verify.secret: required",
                "sources[0].verify.header: not a valid header name: \"x sig\" (letters, digits and !#$%&'*+-.^_`|~ only)",
            ],
        ),
        // 19. Standard Webhooks: bad base64, bad tolerance.
        (
            with_source(&format!("verify: {{scheme: standard-webhooks, secret: 'whsec_!!!', tolerance_s: 0}}\n{SINK}")),
            vec![
                "sources[0].verify.secret: not valid base64 (Invalid symbol 33, offset 0.)",
                "sources[0].verify.tolerance_s: must be at least 1, found 0",
            ],
        ),
        // 20. Dedupe shapes.
        (
            with_source(&format!("dedupe: {{json: 'data..id'}}\n{SINK}")),
            vec!["sources[0].dedupe.json: empty segment in dot path \"data..id\""],
        ),
        (
            with_source(&format!("dedupe: bdy\n{SINK}")),
            vec!["sources[0].dedupe: expected {header: NAME}, {json: DOT.PATH}, body or none, found \"bdy\""],
        ),
        (
            with_source(&format!("dedupe: {{header: x-id, json: id, path: a}}\n{SINK}")),
            vec![
                "sources[0].dedupe.path: unknown key (expected one of: header, json, non_json)",
                "sources[0].dedupe: set exactly one of header or json",
            ],
        ),
        // 21. Sinks: none, missing.
        (with_source("sinks: []"), vec!["sources[0].sinks: at least one sink is required"]),
        (with_source("quarantine: 1"), vec![
            "sources[0].quarantine: expected true or false, found 1",
            "sources[0].sinks: at least one sink is required",
        ]),
        // 22. Sink kinds: unknown, missing.
        (
            with_source("sinks:\n  - {kind: http, url: 'http://h/x'}\n  - {kind: kafka, brokers: 'k:9092', topic: t}\n  - {kind: ftp}\n  - {url: 'http://h'}"),
            vec![
                "sources[0].sinks[2].kind: unknown sink kind \"ftp\" (expected one of: http, kafka, sqs, pubsub, rabbitmq, nats, redis)",
                "sources[0].sinks[3].kind: required (one of: http, kafka, sqs, pubsub, rabbitmq, nats, redis)",
            ],
        ),
        // 23. HTTP sink URLs.
        (
            with_source("sinks:\n  - {kind: http, url: 'ftp://h/x'}\n  - {kind: http, url: 'http:///x'}\n  - {kind: http, url: 'http://h:99999/'}\n  - {kind: http, url: 'h/x'}\n  - {kind: http}"),
            vec![
                "sources[0].sinks[0].url: not a valid URL: scheme must be http or https (\"ftp://h/x\")",
                "sources[0].sinks[1].url: not a valid URL: missing host (\"http:///x\")",
                "sources[0].sinks[2].url: not a valid URL: port must be at most 65535 (\"http://h:99999/\")",
                "sources[0].sinks[3].url: not a valid URL: expected http:// or https:// (\"h/x\")",
                "sources[0].sinks[4].url: required",
            ],
        ),
        // 24. HTTP sink options: bad headers, bad timeout, typo (the ordering is fine).
        (
            with_source("sinks:\n  - kind: http\n    url: 'https://h/x'\n    ordered: true\n    ordering_key: {json: id}\n    timeout_ms: 0\n    headers: {'bad name': v, x-ok: \"a\\nb\"}\n    forward_headers: [X-Request-Id, '']\n    signing_secret: ''\n    retries: 3"),
            vec![
                "sources[0].sinks[0].retries: unknown key (expected one of: kind, id, url, timeout_ms, connect_timeout_ms, headers, forward_headers, signing_secret, ordered, ordering_key)",
                "sources[0].sinks[0].timeout_ms: must be at least 1, found 0",
                "sources[0].sinks[0].headers.bad name: not a valid header name: \"bad name\" (letters, digits and !#$%&'*+-.^_`|~ only)",
                "sources[0].sinks[0].headers.x-ok: header value must not contain CR or LF",
                "sources[0].sinks[0].forward_headers[1]: not a valid header name: \"\" (letters, digits and !#$%&'*+-.^_`|~ only)",
                "sources[0].sinks[0].signing_secret: must not be empty",
            ],
        ),
        // 25. Sink ids: explicit duplicate, default colliding with an explicit id.
        (
            with_source("sinks:\n  - {kind: http, id: main, url: 'http://h/1'}\n  - {kind: http, id: main, url: 'http://h/2'}\n  - {kind: http, id: http-4, url: 'http://h/3'}\n  - {kind: http, url: 'http://h/4'}"),
            vec![
                "sources[0].sinks[1].id: duplicate sink id \"main\" in this source",
                "sources[0].sinks[3]: default id \"http-4\" is already taken by another sink; set id explicitly",
            ],
        ),
        // 25b. HTTP sink signing key (the Standard Webhooks key format) and connect timeout.
        (
            with_source("sinks:\n  - {kind: http, url: 'http://h/1', signing_secret: 'whsec_!!!', connect_timeout_ms: 0}\n  - {kind: http, url: 'http://h/2', signing_secret: 'whsec_', connect_timeout_ms: soon}"),
            vec![
                "sources[0].sinks[0].connect_timeout_ms: must be at least 1, found 0",
                "sources[0].sinks[0].signing_secret: not valid base64 (Invalid symbol 33, offset 0.)",
                "sources[0].sinks[1].connect_timeout_ms: expected a non-negative integer, found \"soon\"",
                "sources[0].sinks[1].signing_secret: must not be empty",
            ],
        ),
        // 25c. ordering_key without ordered: true (absent or false); a bad ordered is not
        // judged twice.
        (
            with_source("sinks:\n  - {kind: http, url: 'http://h/1', ordering_key: {header: x-id}}\n  - {kind: http, url: 'http://h/2', ordered: false, ordering_key: customer}\n  - {kind: http, url: 'http://h/3', ordered: yes, ordering_key: {json: id}}"),
            vec![
                "sources[0].sinks[0].ordering_key: needs ordered: true (only a pubsub sink takes an ordering_key without ordered, as a plain string)",
                "sources[0].sinks[1].ordering_key: needs ordered: true (only a pubsub sink takes an ordering_key without ordered, as a plain string)",
                "sources[0].sinks[2].ordered: expected true or false, found \"yes\"",
            ],
        ),
        // 25d. ordered: true with a key of another form than {header: NAME} or {json: DOT.PATH}.
        (
            with_source("sinks:\n  - {kind: http, url: 'http://h/1', ordered: true, ordering_key: customer}\n  - {kind: http, url: 'http://h/2', ordered: true, ordering_key: [x-id]}\n  - {kind: http, url: 'http://h/3', ordered: true, ordering_key: }"),
            vec![
                "sources[0].sinks[0].ordering_key: expected {header: NAME} or {json: DOT.PATH}, found \"customer\"",
                "sources[0].sinks[1].ordering_key: expected {header: NAME} or {json: DOT.PATH}, found a list",
                "sources[0].sinks[2].ordering_key: expected {header: NAME} or {json: DOT.PATH}, found null",
            ],
        ),
        // 25e. ordering_key mappings: both keys, neither, an unknown key, a bad header name,
        // an empty path segment.
        (
            with_source("sinks:\n  - {kind: http, url: 'http://h/1', ordered: true, ordering_key: {header: x-id, json: id}}\n  - {kind: http, url: 'http://h/2', ordered: true, ordering_key: {}}\n  - {kind: http, url: 'http://h/3', ordered: true, ordering_key: {header: x-id, lane: a}}\n  - {kind: http, url: 'http://h/4', ordered: true, ordering_key: {header: 'x id'}}\n  - {kind: http, url: 'http://h/5', ordered: true, ordering_key: {json: 'data..customer'}}"),
            vec![
                "sources[0].sinks[0].ordering_key: set exactly one of header or json",
                "sources[0].sinks[1].ordering_key: set exactly one of header or json",
                "sources[0].sinks[2].ordering_key.lane: unknown key (expected one of: header, json)",
                "sources[0].sinks[3].ordering_key.header: not a valid header name: \"x id\" (letters, digits and !#$%&'*+-.^_`|~ only)",
                "sources[0].sinks[4].ordering_key.json: empty segment in dot path \"data..customer\"",
            ],
        ),
        // 25f. A header ordering key the source's store_headers drops (the instance default
        // drops authorization) or hashes.
        (
            with_source("sinks:\n  - {kind: http, url: 'http://h/1', ordered: true, ordering_key: {header: Authorization}}"),
            vec!["sources[0].sinks[0].ordering_key: header \"authorization\" is the ordering key, but this source's store_headers drops it: a released or replayed hook could not be put in the same lane (keep it)"],
        ),
        (
            with_source("store_headers: {hash: [x-entity-id]}\nsinks:\n  - {kind: http, url: 'http://h/1', ordered: true, ordering_key: {header: X-Entity-Id}}\n  - {kind: http, url: 'http://h/2', ordered: true, ordering_key: {json: x-entity-id}}"),
            vec!["sources[0].sinks[0].ordering_key: header \"x-entity-id\" is the ordering key, but this source's store_headers hashes it: a released or replayed hook could not be put in the same lane (keep it)"],
        ),
        // 25g. A store_headers that did not read is reported once; the key is not judged by
        // the default policy standing in for it.
        (
            with_source("store_headers: [authorization]\nsinks:\n  - {kind: http, url: 'http://h/1', ordered: true, ordering_key: {header: authorization}}"),
            vec!["sources[0].store_headers: expected a mapping, found a list"],
        ),
        // 26. Wrong types where mappings are expected, tagged values, non-string keys.
        (
            with_source("verify: none\nstore_headers: [cookie]\nsinks: [http]"),
            vec![
                "sources[0].verify: expected a mapping, found \"none\"",
                "sources[0].store_headers: expected a mapping, found a list",
                "sources[0].sinks[0]: expected a mapping, found \"http\"",
            ],
        ),
        (
            with("instance: {data_dir: !path ./x, 7: a}"),
            vec![
                "instance: keys must be strings, found 7",
                "instance.data_dir: expected a string, found a value tagged !path",
            ],
        ),
    ];
    assert!(cases.len() >= 20);
    for (yaml, expected) in &cases {
        check(yaml, expected);
    }
}

#[test]
fn several_sections_fail_together() {
    let yaml = "
instance: {listen: nowhere, admin_listen: '10.0.0.1:9090'}
edge: {body_max_bytes: huge}
tenants: [{id: acme}]
sources:
  - id: s
    tenant: ghost
    verify: {scheme: github, secret: '${GITHUB_SECRET}'}
    sinks: [{kind: sqs, queue_url: 'http://q/queue.fifo', region: r, ordered: true, max_message_bytes: 2MiB}]
";
    check(
        yaml,
        &[
            "instance.listen: not a socket address: \"nowhere\"",
            "instance.admin_token: required when admin_listen (10.0.0.1:9090) is not a loopback address",
            "edge.body_max_bytes: expected a size like 512KiB, 1MiB or 1048576, found \"huge\"",
            "sources[0].tenant: unknown tenant \"ghost\" (declare it under tenants)",
            "sources[0].verify.secret: environment variable GITHUB_SECRET is not set",
            "sources[0].sinks[0].max_message_bytes: SQS takes 1024 to 1048576 bytes (the queue's MaximumMessageSize), found 2097152",
        ],
    );
}

#[test]
fn env_substitution_in_values() {
    let yaml = "
instance:
  listen: '127.0.0.1:${PORT}'
  data_dir: '${DATA_DIR:-/var/lib/ankusa}'
tenants: [{id: acme, max_pending: '${MAX_PENDING:-7}'}]
sources:
  - id: s
    tenant: acme
    verify: {scheme: stripe, secret: '${STRIPE_WEBHOOK_SECRET}'}
    sinks: [{kind: http, url: 'http://h/x', headers: {authorization: 'Bearer ${ANKUSA_ADMIN_TOKEN}'}}]
";
    let config = good(yaml);
    assert_eq!(config.instance.listen.port(), 8081);
    assert_eq!(config.instance.data_dir, PathBuf::from("/var/lib/ankusa"));
    assert_eq!(config.tenants[0].bounds.max_pending, 7);
    assert_eq!(
        config.sources[0].verify,
        Verify::Stripe {
            secret: "whsec_stripe_test".into(),
            tolerance_s: 300
        }
    );
    let SinkKind::Http(http) = &config.sources[0].sinks[0].kind else {
        panic!("not an http sink")
    };
    assert_eq!(
        http.headers,
        [("authorization".to_owned(), "Bearer admin-t0ken".to_owned())]
    );
}

#[test]
fn substituted_secrets_cannot_inject_yaml() {
    let yaml = MINIMAL.replace(
        "tenant: acme",
        "tenant: acme\n    verify: {scheme: github, secret: '${EVIL}'}",
    );
    let evil = |name: &str| (name == "EVIL").then(|| "x}\nsources: []\n#".to_owned());
    let config = parse_with_env(&yaml, &evil).unwrap();
    assert_eq!(config.sources.len(), 1);
    assert_eq!(
        config.sources[0].verify,
        Verify::Github {
            secret: "x}\nsources: []\n#".into()
        }
    );
}

/// DESIGN section 6 writes `secret: ${STRIPE_WEBHOOK_SECRET}` unquoted inside `{…}`, which
/// is not valid YAML (the `}` closes the mapping); the message must say to quote it.
#[test]
fn unquoted_reference_in_flow_mapping_gets_a_hint() {
    check(
        &with_source(&format!("verify: {{scheme: stripe, secret: ${{STRIPE_WEBHOOK_SECRET}}}}\n{SINK}")),
        &["yaml: did not find expected ',' or '}' at line 5 column 39, while parsing a flow mapping \
           at line 5 column 13 (inside {…} or […], quote ${NAME} references: '${NAME}')"],
    );
}

/// DESIGN section 6 as written, except the stripe secret is quoted (see above).
#[test]
fn design_example_loads() {
    let design = "
instance:
  data_dir: ./data
  listen: 127.0.0.1:8080
  admin_listen: 127.0.0.1:9090
  admin_token: ${ANKUSA_ADMIN_TOKEN}   # optional on loopback
  cores: {ingest: [0], writer: 1, pipeline: [0], sink_io: [1]}   # defaults fit the box
store: {sync: true}
dispatch: {batch: 256, sink_concurrency: 8}
retry: {initial_ms: 500, max_ms: 600000, max_elapsed_ms: 86400000}
tenants:
  - {id: acme, max_pending: 1000000, max_bytes: 1GiB}
sources:
  - id: stripe
    tenant: acme                       # or: tenant_from: path
    verify: {scheme: stripe, secret: '${STRIPE_WEBHOOK_SECRET}'}
    dedupe: {json: id}
    sinks:
      - kind: http
        url: http://127.0.0.1:9000/stripe
        ordered: true
        ordering_key: {json: data.object.customer}
      - kind: kafka
        brokers: 127.0.0.1:9092
        topic: stripe-events
";
    let config = good(design);
    assert_eq!(config.instance.admin_token.as_deref(), Some("admin-t0ken"));
    assert_eq!(
        config.instance.cores,
        Cores {
            ingest: Some(vec![0]),
            writer: Some(1),
            pipeline: Some(vec![0]),
            sink_io: Some(vec![1])
        }
    );
    assert!(config.store.sync);
    assert_eq!(
        (config.dispatch.batch, config.dispatch.sink_concurrency),
        (256, 8)
    );
    assert_eq!(config.retry.max_elapsed_ms, 86_400_000);
    assert_eq!(config.tenants.len(), 1);
    assert_eq!(
        (
            config.tenants[0].bounds.max_pending,
            config.tenants[0].bounds.max_bytes
        ),
        (1_000_000, 1 << 30)
    );
    let stripe = &config.sources[0];
    assert_eq!(stripe.id, "stripe");
    assert_eq!(stripe.tenancy, Tenancy::Fixed("acme".into()));
    assert_eq!(
        stripe.verify,
        Verify::Stripe {
            secret: "whsec_stripe_test".into(),
            tolerance_s: 300
        }
    );
    assert_eq!(stripe.dedupe, Some(Dedupe::Json(vec!["id".into()])));
    assert_eq!(stripe.dedupe_window_ms, 72 * 3_600_000);
    assert_eq!(stripe.sinks.len(), 2);
    assert_eq!(stripe.sinks[0].id, "http");
    assert_eq!(stripe.sinks[1].id, "kafka");
    assert_eq!(
        stripe.sinks[1].kind,
        SinkKind::Kafka(KafkaSink {
            brokers: "127.0.0.1:9092".into(),
            topic: "stripe-events".into(),
            acks: KafkaAcks::All,
            compression: "none".into(),
            client: Vec::new(),
            timeout_ms: 10_000,
        })
    );
    assert_eq!(stripe.sinks[1].ordering, None);
    let SinkKind::Http(http) = &stripe.sinks[0].kind else {
        panic!("not an http sink")
    };
    assert_eq!(http.url, "http://127.0.0.1:9000/stripe");
    assert_eq!(
        stripe.sinks[0].ordering,
        Some(SinkOrdering {
            key: Some(OrderingKey::Json(vec![
                "data".into(),
                "object".into(),
                "customer".into()
            ]))
        })
    );
    assert!(stripe.ordered());
}

#[test]
fn ordering_lanes_accepted_forms() {
    let yaml = with_source(
        "store_headers: {keep: [authorization]}\nsinks:\n  - {kind: http, url: 'http://h/1', ordered: true, ordering_key: {header: X-Entity-Id}}\n  - {kind: http, url: 'http://h/2', ordered: true, ordering_key: {json: data.object.customer}}\n  - {kind: http, url: 'http://h/3', ordered: true}\n  - {kind: http, url: 'http://h/4', ordered: false}\n  - {kind: http, url: 'http://h/5', ordered: '${ORDERED:-true}', ordering_key: {header: authorization}}\n  - {kind: http, url: 'http://h/6'}",
    );
    let config = good(&yaml);
    let source = &config.sources[0];
    let orderings: Vec<Option<SinkOrdering>> = source
        .sinks
        .iter()
        .map(|sink| sink.ordering.clone())
        .collect();
    let keyed = |key: OrderingKey| Some(SinkOrdering { key: Some(key) });
    assert_eq!(
        orderings,
        [
            // Stored lower-case, as the edge looks headers up.
            keyed(OrderingKey::Header("x-entity-id".into())),
            keyed(OrderingKey::Json(vec![
                "data".into(),
                "object".into(),
                "customer".into()
            ])),
            // No key: every hook of the sink shares its keyless lane.
            Some(SinkOrdering { key: None }),
            None,
            // A header the source's own policy keeps, although the instance one drops it.
            keyed(OrderingKey::Header("authorization".into())),
            None,
        ]
    );
    assert!(source.ordered());
    assert!(!good(MINIMAL).sources[0].ordered());
    let unordered = good(&with_source(
        "sinks: [{kind: http, url: 'http://h/', ordered: false}]",
    ));
    assert!(!unordered.sources[0].ordered());
}

#[test]
fn every_verify_scheme_and_option() {
    let yaml = with_source(
        "verify: {scheme: token, token: t0k}\nstore_headers: {keep: [Authorization], hash: [x-forwarded-for]}\nsinks:\n  - {kind: http, url: 'https://user:pw@h:8443/a?b#c', timeout_ms: 250, connect_timeout_ms: 750, forward_headers: [X-Request-Id], signing_secret: whsec_c2lnbg==}\n  - {kind: http, id: backup, url: 'http://[::1]:9000/'}\n  - {kind: http, url: 'http://h/3'}",
    );
    let config = good(&yaml);
    let source = &config.sources[0];
    assert_eq!(
        source.verify,
        Verify::Token {
            header: "authorization".into(),
            token: "t0k".into()
        }
    );
    assert_eq!(source.dedupe, None);
    assert!(!source.quarantine);
    // The override replaces the default: cookie is no longer dropped.
    assert_eq!(
        source.store_headers.rules,
        [
            ("authorization".to_owned(), HeaderAction::Keep),
            ("x-forwarded-for".to_owned(), HeaderAction::Hash)
        ]
    );
    let ids: Vec<&str> = source.sinks.iter().map(|sink| sink.id.as_str()).collect();
    assert_eq!(ids, ["http-1", "backup", "http-3"]);
    let SinkKind::Http(http) = &source.sinks[0].kind else {
        panic!("not an http sink")
    };
    assert_eq!(http.timeout_ms, 250);
    assert_eq!(http.forward_headers, ["x-request-id"]);
    assert_eq!(http.connect_timeout_ms, 750);
    // The key is decoded at load: `c2lnbg==` is base64 of `sign`.
    assert_eq!(http.signing_secret.as_deref(), Some(&b"sign"[..]));

    let schemes = [
        (
            "{scheme: hmac, secret: k}",
            Verify::Hmac {
                header: "x-signature".into(),
                secret: "k".into(),
            },
        ),
        (
            "{scheme: hmac, secret: k, header: X-Hub-Signature-256}",
            Verify::Hmac {
                header: "x-hub-signature-256".into(),
                secret: "k".into(),
            },
        ),
        (
            "{scheme: github, secret: g}",
            Verify::Github { secret: "g".into() },
        ),
        (
            "{scheme: stripe, secret: s, tolerance_s: 60}",
            Verify::Stripe {
                secret: "s".into(),
                tolerance_s: 60,
            },
        ),
        (
            "{scheme: standard-webhooks, secret: 'whsec_aGVsbG8='}",
            Verify::StandardWebhooks {
                secret: b"hello".to_vec(),
                tolerance_s: 300,
            },
        ),
        (
            "{scheme: standard-webhooks, secret: 'aGVsbG8'}",
            Verify::StandardWebhooks {
                secret: b"hello".to_vec(),
                tolerance_s: 300,
            },
        ),
        ("{scheme: none}", Verify::None),
    ];
    for (verify, expected) in schemes {
        let config = good(&with_source(&format!("verify: {verify}\n{SINK}")));
        assert_eq!(config.sources[0].verify, expected, "{verify}");
    }
}

#[test]
fn cores_accept_a_scalar_for_list_roles() {
    let config = good(&with("instance: {cores: {ingest: 2, sink_io: [3, 4]}}"));
    assert_eq!(config.instance.cores.ingest, Some(vec![2]));
    assert_eq!(config.instance.cores.sink_io, Some(vec![3, 4]));
    assert_eq!(config.instance.cores.writer, None);
}

#[test]
fn public_admin_with_a_token_is_fine() {
    let config = good(&with(
        "instance: {admin_listen: '0.0.0.0:9090', admin_token: '${ANKUSA_ADMIN_TOKEN}'}",
    ));
    assert_eq!(config.instance.admin_token.as_deref(), Some("admin-t0ken"));
}

#[test]
fn tenant_from_path() {
    let config = good(&format!("sources: [{{id: s, tenant_from: path, {SINK}}}]"));
    assert_eq!(config.sources[0].tenancy, Tenancy::Path { auto: false });
}

#[test]
fn quickstart_parses_with_an_empty_environment() {
    let config = parse_with_env(QUICKSTART_YAML, &|_| None).unwrap();
    assert_eq!(config.instance.data_dir, PathBuf::from("./data"));
    assert_eq!(config.instance.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.instance.admin_listen.to_string(), "127.0.0.1:9090");
    let ids: Vec<&str> = config
        .sources
        .iter()
        .map(|source| source.id.as_str())
        .collect();
    assert_eq!(ids, ["demo", "github"]);
    assert_eq!(config.sources[0].verify, Verify::None);
    assert_eq!(
        config.sources[1].verify,
        Verify::Github {
            secret: "quickstart-secret".into()
        }
    );
    let SinkKind::Http(http) = &config.sources[0].sinks[0].kind else {
        panic!("not an http sink")
    };
    assert_eq!(http.url, "http://127.0.0.1:9000/hooks");
}

#[test]
fn the_store_memory_bounds_default_and_take_sizes() {
    assert_eq!(
        good(MINIMAL).store.memory,
        crate::store::Memory {
            block_cache_bytes: 64 << 20,
            memtable_bytes: 256 << 20,
        }
    );
    let config = good(&with(
        "store: {block_cache_bytes: 2GiB, memtable_bytes: 16MiB}",
    ));
    assert_eq!(
        config.store.memory,
        crate::store::Memory {
            block_cache_bytes: 2 << 30,
            memtable_bytes: 16 << 20,
        }
    );
}

#[test]
fn summary_shows_the_shape_and_no_secret() {
    let yaml = "
instance: {admin_listen: '0.0.0.0:9090', admin_token: admin-t0ken}
store: {sync: false, i_understand_acks_are_not_durable: true, min_free_bytes: 1GiB, block_cache_bytes: 1GiB}
tenants: [{id: acme}]
sources:
  - id: stripe
    tenant: acme
    verify: {scheme: stripe, secret: whsec_stripe_test}
    sinks: [{kind: http, url: 'https://bob:hunter2@h/x', signing_secret: whsec_c2lnbi1tZQ==, headers: {x-key: hdr-secret}}]
  - id: multi
    tenant_from: path
    verify: {scheme: token, token: tok-secret}
    sinks: [{kind: http, url: 'http://h/y'}]
";
    let text = summary(&good(yaml));
    for secret in [
        "admin-t0ken",
        "whsec_stripe_test",
        "hunter2",
        "bob",
        "c2lnbi1tZQ",
        "hdr-secret",
        "tok-secret",
    ] {
        assert!(!text.contains(secret), "{secret} leaked:\n{text}");
    }
    for expected in [
        "listen:       127.0.0.1:8080",
        "admin_listen: 0.0.0.0:9090 (admin token set)",
        "data_dir:     ./data",
        "store.sync:   false",
        "store.min_free_bytes: 1073741824 (under it new hooks get 503 disk_full)",
        "store memory: block cache 1073741824 bytes, memtables 268435456 bytes (RocksDB's bounds)",
        "tenants:      1 (acme)",
        "sources:      2",
        "  stripe: tenant acme, verify stripe, dedupe none",
        "    sink http: http https://***@h/x",
        "  multi: tenant from path, verify token, dedupe none",
        "    sink http: http http://h/y",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn load_reads_a_file_and_reports_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ankusa.yaml");
    std::fs::write(&path, QUICKSTART_YAML).unwrap();
    assert_eq!(load(&path).unwrap().sources.len(), 2);
    let missing = dir.path().join("missing.yaml");
    let error = load(&missing).unwrap_err();
    assert!(matches!(error, ConfigError::Read { .. }), "{error:?}");
    assert!(error
        .to_string()
        .starts_with(&format!("cannot read {}: ", missing.display())));
}

#[test]
fn invalid_displays_one_problem_per_line() {
    let error = parse_with_env("store: {sync: 3}\n", &env).unwrap_err();
    assert_eq!(
        error.to_string(),
        "store.sync: expected true or false, found 3\nsources: at least one source is required"
    );
}

/// The complete example of docs/configuration.md is a config users copy: it must load.
#[test]
fn the_documented_complete_example_loads() {
    let page = include_str!("../../docs/configuration.md");
    let section = &page[page
        .find("## Complete example")
        .expect("the page has a complete example")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").expect("closed block")];
    let docs_env = |name: &str| match name {
        "SVIX_SECRET" | "ANKUSA_SIGNING_SECRET" => Some("whsec_c2VjcmV0LWtleS1ieXRlcw==".into()),
        "ANKUSA_ADMIN_TOKEN" => None,
        _ => Some(format!("value-of-{name}")),
    };
    let config = match parse_with_env(yaml, &docs_env) {
        Ok(config) => config,
        Err(error) => panic!("docs/configuration.md example fails:\n{error}"),
    };
    assert_eq!(config.dispatch.breaker_failures, 5);
    assert_eq!(config.archive.retention_ms, 604_800_000);
    assert_eq!(config.sources.len(), 6);
    assert_eq!(
        config.sources[0].sinks[0].ordering,
        Some(SinkOrdering {
            key: Some(OrderingKey::Json(vec![
                "data".into(),
                "object".into(),
                "customer".into()
            ]))
        })
    );
    // The broker sinks of the `internal` source, with their ids.
    let internal = &config.sources[3];
    let kinds: Vec<(&str, &str)> = internal
        .sinks
        .iter()
        .map(|sink| (sink.id.as_str(), sink.kind.name()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("http", "http"),
            ("events", "redis"),
            ("jobs", "redis"),
            ("nats", "nats"),
            ("rabbitmq", "rabbitmq"),
        ]
    );
    let SinkKind::Rabbitmq(rabbit) = &internal.sinks[4].kind else {
        panic!("not a rabbitmq sink")
    };
    assert_eq!(
        rabbit.url,
        "amqp://ankusa:value-of-RABBITMQ_PASSWORD@127.0.0.1:5672/%2f"
    );
    assert_eq!(internal.sinks[4].ordering, Some(SinkOrdering { key: None }));
    let svix = config
        .sources
        .iter()
        .find(|source| source.id == "svix")
        .expect("the svix source");
    let kinds: Vec<&str> = svix.sinks.iter().map(|sink| sink.kind.name()).collect();
    assert_eq!(kinds, ["http", "kafka", "sqs", "pubsub"]);
    let SinkKind::Kafka(kafka) = &svix.sinks[1].kind else {
        panic!("not a kafka sink")
    };
    assert_eq!(
        kafka.client.last(),
        Some(&("sasl.password".into(), "value-of-KAFKA_PASSWORD".into()))
    );
    assert!(svix.sinks[2].ordering.is_some());
    let SinkKind::Pubsub(pubsub) = &svix.sinks[3].kind else {
        panic!("not a pubsub sink")
    };
    assert_eq!(pubsub.fixed_ordering_key.as_deref(), Some("svix"));
    assert_eq!(svix.sinks[3].ordering, None);
}

#[test]
fn admission_tenant_defaults_and_auto_tenants() {
    let yaml = "
admission: {max_pending: 10, max_bytes: 1MiB, auto_tenants_max: 3, retry_after_s: 2, tenant_retry_after_s: 9, retry_after_max_s: 120}
tenant_defaults: {max_pending: 7}
tenants:
  - {id: acme}
  - {id: big, max_bytes: 2GiB}
sources:
  - id: open
    tenant_from: path
    auto_tenants: true
    dedupe: body
    dedupe_window_ms: 60000
    sinks: [{kind: http, url: 'http://h/'}]
";
    let config = good(yaml);
    assert_eq!(
        (
            config.admission.max_pending,
            config.admission.max_bytes,
            config.admission.auto_tenants_max,
            config.admission.retry_after_s,
            config.admission.tenant_retry_after_s,
            config.admission.retry_after_max_s
        ),
        (10, 1 << 20, 3, 2, 9, 120)
    );
    assert_eq!(
        config.tenant_defaults,
        TenantBounds {
            max_pending: 7,
            max_bytes: 1 << 30,
            max_quarantined: 10_000,
            replay_rate_per_s: 500,
            replay_max_pending: 128,
            replay_concurrency: 2,
        }
    );
    assert_eq!(config.tenants[0].bounds, config.tenant_defaults);
    assert_eq!(
        config.tenants[1].bounds,
        TenantBounds {
            max_pending: 7,
            max_bytes: 2 << 30,
            max_quarantined: 10_000,
            replay_rate_per_s: 500,
            replay_max_pending: 128,
            replay_concurrency: 2,
        }
    );
    assert_eq!(config.sources[0].tenancy, Tenancy::Path { auto: true });
    assert_eq!(config.sources[0].dedupe, Some(Dedupe::Body));
    assert_eq!(config.sources[0].dedupe_window_ms, 60_000);
}

#[test]
fn admission_and_auto_tenant_mistakes_are_reported_with_their_paths() {
    check(
        "
admission: {retry_after_s: 0, tenant_retry_after_s: 7200, auto_tenants_max: -1, burst: 3}
tenant_defaults: {max_pending: 0}
tenants: [{id: acme}]
sources:
  - id: fixed
    tenant: acme
    auto_tenants: true
    dedupe_window_ms: 5
    sinks: [{kind: http, url: 'http://h/'}]
",
        &[
            "admission.burst: unknown key (expected one of: max_pending, max_bytes, auto_tenants_max, retry_after_s, tenant_retry_after_s, retry_after_max_s)",
            "admission.auto_tenants_max: expected a non-negative integer, found -1",
            "admission.retry_after_s: must be at least 1, found 0",
            "admission.tenant_retry_after_s: must be at most 3600 seconds, found 7200",
            "tenant_defaults.max_pending: must be at least 1, found 0",
            "sources[0].auto_tenants: only a source with tenant_from: path creates tenants",
            "sources[0].dedupe_window_ms: has no effect without dedupe",
        ],
    );
}

#[test]
fn a_dedupe_header_the_policy_drops_or_hashes_is_refused() {
    check(
        &with_source(
            "dedupe: {header: Authorization}\nsinks: [{kind: http, url: 'http://h/'}]",
        ),
        &["sources[0].dedupe: header \"authorization\" is the dedupe key, but this source's store_headers drops it: a released or replayed hook could not be keyed the same way (keep it)"],
    );
    check(
        &with_source(
            "dedupe: {header: x-id}\nstore_headers: {hash: [x-id]}\nsinks: [{kind: http, url: 'http://h/'}]",
        ),
        &["sources[0].dedupe: header \"x-id\" is the dedupe key, but this source's store_headers hashes it: a released or replayed hook could not be keyed the same way (keep it)"],
    );
}

#[test]
fn broker_sinks_take_their_options_and_defaults() {
    let config = good(&with_source(
        "sinks:
  - {kind: redis, url: 'redis://127.0.0.1:6379/2', stream: hooks, maxlen: 1000}
  - {kind: redis, url: 'rediss://user:pw@cache.internal', list: jobs, timeout_ms: 500}
  - {kind: nats, url: 'nats://a:4222, nats://b:4222', subject: hooks.stripe}
  - {kind: nats, url: 'n', subject: s, jetstream: false, timeout_ms: 2000}
  - {kind: rabbitmq, url: 'amqp://guest:guest@127.0.0.1:5672/%2f', exchange: '', routing_key: hooks, ordered: true, ordering_key: {json: id}}
  - {kind: rabbitmq, url: 'amqps://h/v', exchange: events.x, routing_key: r, persistent: false, mandatory: false, confirm_timeout_ms: 2000}",
    ));
    let sinks = &config.sources[0].sinks;
    let ids: Vec<&str> = sinks.iter().map(|sink| sink.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "redis-1",
            "redis-2",
            "nats-1",
            "nats-2",
            "rabbitmq-1",
            "rabbitmq-2"
        ]
    );
    let kinds: Vec<&SinkKind> = sinks.iter().map(|sink| &sink.kind).collect();
    let SinkKind::Redis(stream) = kinds[0] else {
        panic!("{:?}", kinds[0])
    };
    assert_eq!(
        stream,
        &RedisSink {
            url: "redis://127.0.0.1:6379/2".into(),
            target: RedisTarget::Stream {
                key: "hooks".into(),
                maxlen: Some(1000)
            },
            timeout_ms: 10_000,
        }
    );
    let SinkKind::Redis(list) = kinds[1] else {
        panic!("{:?}", kinds[1])
    };
    assert_eq!(list.target, RedisTarget::List { key: "jobs".into() });
    assert_eq!(list.timeout_ms, 500);
    let SinkKind::Nats(nats) = kinds[2] else {
        panic!("{:?}", kinds[2])
    };
    assert_eq!(
        nats,
        &NatsSink {
            url: "nats://a:4222, nats://b:4222".into(),
            subject: "hooks.stripe".into(),
            jetstream: true,
            credentials_file: None,
            timeout_ms: 10_000,
        }
    );
    let SinkKind::Nats(core) = kinds[3] else {
        panic!("{:?}", kinds[3])
    };
    assert!(!core.jetstream);
    let SinkKind::Rabbitmq(rabbit) = kinds[4] else {
        panic!("{:?}", kinds[4])
    };
    assert_eq!(
        rabbit,
        &RabbitmqSink {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            exchange: String::new(),
            routing_key: "hooks".into(),
            persistent: true,
            mandatory: true,
            confirm_timeout_ms: 10_000,
        }
    );
    assert!(sinks[4].ordering.is_some());
    let SinkKind::Rabbitmq(plain) = kinds[5] else {
        panic!("{:?}", kinds[5])
    };
    assert!(!plain.persistent && !plain.mandatory);
    assert_eq!(plain.confirm_timeout_ms, 2_000);
}

#[test]
fn broker_sink_options_are_checked_with_their_paths() {
    check(
        &with_source(
            "sinks:
  - {kind: redis, url: 'http://r', stream: s}
  - {kind: redis, url: 'redis://r'}
  - {kind: redis, url: 'redis://r', stream: a, list: b}
  - {kind: redis, url: 'redis://r', list: b, maxlen: 10}
  - {kind: redis, url: 'redis://r', stream: '', maxlen: 0, topic: t}
  - {kind: nats, url: 'nats://a:4222, ::bad::', subject: 'a..b'}
  - {kind: nats, url: n, subject: 'hooks.>', credentials_file: /nonexistent/ankusa.creds}
  - {kind: nats, subject: 'has space'}
  - {kind: rabbitmq, url: 'http://h', exchange: 'bad name', routing_key: r}
  - {kind: rabbitmq, url: 'amqp://h', routing_key: r, confirm_timeout_ms: 0}",
        ),
        &[
            "sources[0].sinks[0].url: not a valid Redis URL (redis://[user:password@]host[:port][/db] or rediss://…): not a redis:// or rediss:// URL",
            "sources[0].sinks[1]: set one of stream (XADD) or list (LPUSH)",
            "sources[0].sinks[2]: set exactly one of stream or list, not both",
            "sources[0].sinks[3].maxlen: applies to a stream only (a list is not trimmed)",
            "sources[0].sinks[4].topic: unknown key (expected one of: kind, id, url, stream, list, maxlen, timeout_ms, ordered, ordering_key)",
            "sources[0].sinks[4].stream: must not be empty",
            "sources[0].sinks[4].maxlen: must be at least 1, found 0",
            "sources[0].sinks[5].url: not a valid NATS server address (nats://host:port, several separated by commas): NATS server URL is invalid: empty host",
            "sources[0].sinks[5].subject: not a publish subject: an empty token (two dots, or a dot at an end) (\"a..b\")",
            "sources[0].sinks[6].subject: not a publish subject: wildcards subscribe; a publish names one subject (\"hooks.>\")",
            "sources[0].sinks[6].credentials_file: no such file: /nonexistent/ankusa.creds",
            "sources[0].sinks[7].url: required",
            "sources[0].sinks[7].subject: not a publish subject: only visible ASCII, no spaces (\"has space\")",
            "sources[0].sinks[8].url: not a valid AMQP URL (amqp://user:password@host:port/vhost or amqps://…): Invalid AMQP scheme: http",
            "sources[0].sinks[8].exchange: not a valid exchange name \"bad name\" (letters, digits, - _ . : only; \"\" is the default exchange)",
            "sources[0].sinks[9].exchange: required",
            "sources[0].sinks[9].confirm_timeout_ms: must be at least 1, found 0",
        ],
    );
}

#[test]
fn kafka_sqs_and_pubsub_sinks_take_their_options_and_defaults() {
    let config = good(&with_source(
        "sinks:
  - {kind: kafka, brokers: 'k1:9092,k2:9093', topic: hooks.v1, acks: 1, compression: zstd, client: {linger.ms: 20, security.protocol: ssl, socket.keepalive.enable: true}, timeout_ms: 5000}
  - {kind: sqs, queue_url: 'https://sqs.eu-west-1.amazonaws.com/123456789012/hooks.fifo', region: eu-west-1, ordered: true, ordering_key: {json: customer}}
  - {kind: sqs, queue_url: 'http://127.0.0.1:5000/000000000000/plain', region: us-east-1, endpoint: 'http://127.0.0.1:5000', max_message_bytes: 1MiB, batch_size: 1, max_in_flight: 64, timeout_ms: 3000}
  - {kind: pubsub, project: my-proj, topic: hooks, access_token: tok, ordering_key: fixed}
  - {kind: pubsub, project: p-1, topic: events, endpoint: 'http://127.0.0.1:8085/', batch_size: 1000, max_in_flight: 2, ordered: true, ordering_key: {header: x-key}}",
    ));
    let sinks = &config.sources[0].sinks;
    let ids: Vec<&str> = sinks.iter().map(|sink| sink.id.as_str()).collect();
    assert_eq!(ids, ["kafka", "sqs-1", "sqs-2", "pubsub-1", "pubsub-2"]);
    assert_eq!(
        sinks[0].kind,
        SinkKind::Kafka(KafkaSink {
            brokers: "k1:9092,k2:9093".into(),
            topic: "hooks.v1".into(),
            acks: KafkaAcks::Leader,
            compression: "zstd".into(),
            client: vec![
                ("linger.ms".into(), "20".into()),
                ("security.protocol".into(), "ssl".into()),
                ("socket.keepalive.enable".into(), "true".into()),
            ],
            timeout_ms: 5000,
        })
    );
    let SinkKind::Sqs(fifo) = &sinks[1].kind else {
        panic!("{:?}", sinks[1].kind)
    };
    assert_eq!(
        fifo,
        &SqsSink {
            queue_url: "https://sqs.eu-west-1.amazonaws.com/123456789012/hooks.fifo".into(),
            region: "eu-west-1".into(),
            endpoint: None,
            max_message_bytes: 262_144,
            batch_size: 10,
            max_in_flight: 4,
            timeout_ms: 10_000,
        }
    );
    assert!(fifo.fifo());
    assert!(sinks[1].ordering.is_some());
    let SinkKind::Sqs(plain) = &sinks[2].kind else {
        panic!("{:?}", sinks[2].kind)
    };
    assert!(!plain.fifo());
    assert_eq!(plain.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
    assert_eq!(
        (
            plain.max_message_bytes,
            plain.batch_size,
            plain.max_in_flight,
            plain.timeout_ms
        ),
        (1 << 20, 1, 64, 3000)
    );
    assert_eq!(
        sinks[3].kind,
        SinkKind::Pubsub(PubsubSink {
            project: "my-proj".into(),
            topic: "hooks".into(),
            endpoint: "https://pubsub.googleapis.com".into(),
            auth: PubsubAuth::AccessToken("tok".into()),
            fixed_ordering_key: Some("fixed".into()),
            batch_size: 100,
            max_in_flight: 4,
            timeout_ms: 10_000,
        })
    );
    assert_eq!(sinks[3].ordering, None, "a fixed key is not a lane");
    assert_eq!(
        sinks[4].kind,
        SinkKind::Pubsub(PubsubSink {
            project: "p-1".into(),
            topic: "events".into(),
            endpoint: "http://127.0.0.1:8085".into(),
            auth: PubsubAuth::None,
            fixed_ordering_key: None,
            batch_size: 1000,
            max_in_flight: 2,
            timeout_ms: 10_000,
        })
    );
    assert_eq!(
        sinks[4].ordering,
        Some(SinkOrdering {
            key: Some(OrderingKey::Header("x-key".into()))
        })
    );
}

#[test]
fn kafka_sqs_and_pubsub_options_are_checked_with_their_paths() {
    check(
        &with_source(
            "sinks:
  - {kind: kafka, brokers: 'k1, :9092, k3:99999', topic: 'bad topic', acks: 0, compression: brotli}
  - {kind: kafka, brokers: 'k:9092', topic: t, acks: some, client: {acks: '0', enable.idempotence: false, no.such.setting: 1, linger.ms: soon}}
  - {kind: kafka, topic: '..', ordering_key: {json: id}}
  - {kind: sqs, queue_url: 'https://sqs.us-east-1.amazonaws.com/1/plain', region: us-east-1, ordered: true}
  - {kind: sqs, queue_url: 'https://sqs.x/1/bad name', region: 'US East', max_message_bytes: 100, batch_size: 11, max_in_flight: 0}
  - {kind: sqs, region: r, endpoint: 'localhost:5000'}
  - {kind: pubsub, project: p, topic: hooks}
  - {kind: pubsub, project: 'Bad_Project', topic: 'goog-x', endpoint: 'http://e', ordering_key: {json: id}}
  - {kind: pubsub, project: p, topic: topic1, credentials_file: /nonexistent/key.json, access_token: tok}
  - {kind: pubsub, project: p, topic: hooks, endpoint: 'http://e', ordered: true, ordering_key: fixed, batch_size: 0, max_in_flight: 2000}",
        ),
        &[
            "sources[0].sinks[0].brokers: not a broker address \"k1\": missing :port (host:port, several separated by commas)",
            "sources[0].sinks[0].brokers: not a broker address \":9092\": missing host (host:port, several separated by commas)",
            "sources[0].sinks[0].brokers: not a broker address \"k3:99999\": port must be a number from 1 to 65535 (host:port, several separated by commas)",
            "sources[0].sinks[0].topic: not a valid topic name \"bad topic\": letters, digits, . _ - only",
            "sources[0].sinks[0].acks: acks 0 never confirms a record, and a hook counts as delivered only once the destination confirms it (use all or 1)",
            "sources[0].sinks[0].compression: unknown compression \"brotli\" (expected one of: none, gzip, snappy, lz4, zstd)",
            "sources[0].sinks[1].acks: expected all or 1, found \"some\"",
            "sources[0].sinks[1].client.acks: set by the sink itself; use the sink's acks key",
            "sources[0].sinks[1].client.enable.idempotence: set by the sink itself; use the sink's acks (all makes the producer idempotent) key",
            "sources[0].sinks[1].client.no.such.setting: librdkafka refuses it: No such configuration property: \"no.such.setting\"",
            "sources[0].sinks[1].client.linger.ms: librdkafka refuses it: Invalid value for configuration property \"queue.buffering.max.ms\"",
            "sources[0].sinks[2].ordering_key: needs ordered: true (only a pubsub sink takes an ordering_key without ordered, as a plain string)",
            "sources[0].sinks[2].brokers: required",
            "sources[0].sinks[2].topic: not a valid topic name \"..\": \".\" and \"..\" are not topic names",
            "sources[0].sinks[3].ordered: needs a FIFO queue (queue_url ending .fifo): a standard queue does not keep order, so ordered delivery there would be a promise SQS breaks",
            "sources[0].sinks[4].queue_url: not a valid URL: contains whitespace or control characters (\"https://sqs.x/1/bad name\")",
            "sources[0].sinks[4].region: not a region name \"US East\" (like us-east-1)",
            "sources[0].sinks[4].max_message_bytes: SQS takes 1024 to 1048576 bytes (the queue's MaximumMessageSize), found 100",
            "sources[0].sinks[4].batch_size: must be 1 to 10, found 11",
            "sources[0].sinks[4].max_in_flight: must be 1 to 1024, found 0",
            "sources[0].sinks[5].queue_url: required",
            "sources[0].sinks[5].endpoint: not a valid URL: expected http:// or https:// (\"localhost:5000\")",
            "sources[0].sinks[6]: needs credentials_file (a service account key) or access_token to publish to Google; only an endpoint (the emulator) takes none",
            "sources[0].sinks[7].ordering_key: without ordered: true a pubsub ordering_key is a plain string (one fixed key for every message); {header: …} or {json: …} needs ordered: true",
            "sources[0].sinks[7].project: not a project id \"Bad_Project\" (lower-case letters, digits, - . :)",
            "sources[0].sinks[7].topic: not a valid topic name \"goog-x\": must not start with goog",
            "sources[0].sinks[8].credentials_file: /nonexistent/key.json: cannot read it: No such file or directory (os error 2)",
            "sources[0].sinks[9].ordering_key: expected {header: NAME} or {json: DOT.PATH}, found \"fixed\"",
            "sources[0].sinks[9].batch_size: must be 1 to 1000, found 0",
            "sources[0].sinks[9].max_in_flight: must be 1 to 1024, found 2000",
        ],
    );
}

#[test]
fn replay_budgets_default_per_tenant_and_are_checked() {
    let config = good(
        "
tenant_defaults: {replay_rate_per_s: 200}
tenants:
  - {id: acme}
  - {id: big, replay_rate_per_s: 1000000, replay_max_pending: 8, replay_concurrency: 6}
sources:
  - id: s
    tenant: acme
    sinks: [{kind: http, url: 'http://h/'}]
",
    );
    let budget = |bounds: TenantBounds| {
        (
            bounds.replay_rate_per_s,
            bounds.replay_max_pending,
            bounds.replay_concurrency,
        )
    };
    assert_eq!(budget(config.tenant_defaults), (200, 128, 2));
    assert_eq!(budget(config.tenants[0].bounds), (200, 128, 2));
    assert_eq!(budget(config.tenants[1].bounds), (1_000_000, 8, 6));
    assert_eq!(budget(good(MINIMAL).tenant_defaults), (500, 128, 2));
    let cases: &[(&str, &[&str])] = &[
        (
            "tenant_defaults: {replay_rate_per_s: 0, replay_max_pending: 0, replay_concurrency: 0}",
            &[
                "tenant_defaults.replay_rate_per_s: must be 1 to 1000000, found 0",
                "tenant_defaults.replay_max_pending: must be 1 to 1000000, found 0",
                "tenant_defaults.replay_concurrency: must be 1 to 1000000, found 0",
            ],
        ),
        (
            "tenant_defaults: {replay_rate_per_s: 1000001, replay_max_pending: -3}",
            &[
                "tenant_defaults.replay_rate_per_s: must be 1 to 1000000, found 1000001",
                "tenant_defaults.replay_max_pending: expected a non-negative integer, found -3",
            ],
        ),
        (
            "tenant_defaults: {replay_rate_per_s: fast}",
            &["tenant_defaults.replay_rate_per_s: expected a non-negative integer, found \"fast\""],
        ),
    ];
    for (extra, expected) in cases {
        check(&format!("{MINIMAL}{extra}\n"), expected);
    }
    check(
        "
tenants: [{id: acme, replay_max_pending: 0, replay_rate: 5}]
sources:
  - id: s
    tenant: acme
    sinks: [{kind: http, url: 'http://h/'}]
",
        &[
            "tenants[0].replay_rate: unknown key (expected one of: id, max_pending, max_bytes, max_quarantined, replay_rate_per_s, replay_max_pending, replay_concurrency)",
            "tenants[0].replay_max_pending: must be 1 to 1000000, found 0",
        ],
    );
}

/// One source with `provider: NAME` and the given extra lines, parsed.
fn preset_source(provider: &str, lines: &str) -> Source {
    good(&with_source(&format!(
        "provider: {provider}\n{lines}\n{SINK}"
    )))
    .sources
    .remove(0)
}

fn rules(keep: &[&str]) -> Vec<(String, HeaderAction)> {
    keep.iter()
        .map(|name| (name.to_string(), HeaderAction::Keep))
        .chain(
            ["authorization", "cookie", "proxy-authorization"]
                .iter()
                .map(|name| (name.to_string(), HeaderAction::Drop)),
        )
        .collect()
}

#[test]
fn each_provider_preset_expands_to_its_scheme_key_window_and_policy() {
    const HOUR_MS: u64 = 3_600_000;
    let header = |name: &str| Some(Dedupe::Header(name.into()));
    // (provider, verify block, verify, dedupe, window, headers kept)
    type Case = (
        &'static str,
        &'static str,
        Verify,
        Option<Dedupe>,
        u64,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "stripe",
            "verify: {secret: '${STRIPE_WEBHOOK_SECRET}'}",
            Verify::Stripe {
                secret: "whsec_stripe_test".into(),
                tolerance_s: 300,
            },
            Some(Dedupe::Json(vec!["id".into()])),
            96 * HOUR_MS,
            vec!["stripe-signature", "content-type", "user-agent"],
        ),
        (
            "github",
            "verify: {secret: gh}",
            Verify::Github {
                secret: "gh".into(),
            },
            header("x-github-delivery"),
            96 * HOUR_MS,
            vec![
                "x-hub-signature-256",
                "x-github-delivery",
                "x-github-event",
                "x-github-hook-id",
                "x-github-hook-installation-target-id",
                "x-github-hook-installation-target-type",
                "content-type",
                "user-agent",
            ],
        ),
        (
            "shopify",
            "verify: {secret: shp}",
            Verify::Shopify {
                secret: "shp".into(),
            },
            header("x-shopify-webhook-id"),
            48 * HOUR_MS,
            vec![
                "x-shopify-hmac-sha256",
                "x-shopify-webhook-id",
                "x-shopify-event-id",
                "x-shopify-topic",
                "x-shopify-shop-domain",
                "x-shopify-api-version",
                "x-shopify-triggered-at",
                "content-type",
            ],
        ),
        (
            "standard-webhooks",
            "verify: {secret: 'whsec_aGVsbG8='}",
            Verify::StandardWebhooks {
                secret: b"hello".to_vec(),
                tolerance_s: 300,
            },
            header("webhook-id"),
            72 * HOUR_MS,
            vec![
                "webhook-id",
                "webhook-timestamp",
                "webhook-signature",
                "content-type",
            ],
        ),
        (
            "slack",
            "verify: {secret: sl}",
            Verify::Slack {
                secret: "sl".into(),
                tolerance_s: 300,
            },
            Some(Dedupe::JsonOrKeyless(vec!["event_id".into()])),
            24 * HOUR_MS,
            vec![
                "x-slack-signature",
                "x-slack-request-timestamp",
                "x-slack-retry-num",
                "x-slack-retry-reason",
                "content-type",
            ],
        ),
        (
            "twilio",
            "verify: {secret: tw, public_url: 'https://gw.example.com/'}",
            Verify::Twilio {
                secret: "tw".into(),
                public_url: "https://gw.example.com".into(),
            },
            header("i-twilio-idempotency-token"),
            24 * HOUR_MS,
            vec![
                "x-twilio-signature",
                "i-twilio-idempotency-token",
                "content-type",
            ],
        ),
    ];
    for (provider, lines, verify, dedupe, window_ms, keep) in cases {
        let source = preset_source(provider, lines);
        assert_eq!(source.provider, Some(provider));
        assert_eq!(source.verify, verify, "{provider}");
        assert_eq!(source.dedupe, dedupe, "{provider}");
        assert_eq!(source.dedupe_window_ms, window_ms, "{provider}");
        assert_eq!(source.store_headers.rules, rules(&keep), "{provider}");
    }
}

#[test]
fn the_sources_own_keys_win_over_the_preset() {
    let source = preset_source(
        "github",
        "verify: {secret: gh}\ndedupe: {json: hook_id}\ndedupe_window_ms: 1000\nstore_headers: {drop: [x-github-event]}",
    );
    assert_eq!(source.dedupe, Some(Dedupe::Json(vec!["hook_id".into()])));
    assert_eq!(source.dedupe_window_ms, 1000);
    assert_eq!(
        source.store_headers.rules,
        [("x-github-event".to_owned(), HeaderAction::Drop)]
    );
    // `dedupe: none` turns the preset's key off.
    let source = preset_source(
        "stripe",
        "verify: {secret: s, tolerance_s: 30}\ndedupe: none",
    );
    assert_eq!(source.dedupe, None);
    assert_eq!(
        source.verify,
        Verify::Stripe {
            secret: "s".into(),
            tolerance_s: 30
        }
    );
    // A window alone keeps the preset's key.
    let source = preset_source("shopify", "verify: {secret: s}\ndedupe_window_ms: 5000");
    assert_eq!(
        source.dedupe,
        Some(Dedupe::Header("x-shopify-webhook-id".into()))
    );
    assert_eq!(source.dedupe_window_ms, 5000);
    // The instance policy still applies to headers the preset does not name, and a preset
    // keeps its own headers even where the instance would drop them.
    let config = good(
        "
instance: {store_headers: {drop: [x-api-key, stripe-signature], hash: [authorization]}}
tenants: [{id: acme}]
sources:
  - id: s
    tenant: acme
    provider: stripe
    verify: {secret: s}
    sinks: [{kind: http, url: 'http://h/x'}]
",
    );
    let mut expected = rules(&["stripe-signature", "content-type", "user-agent"]);
    expected.push(("x-api-key".into(), HeaderAction::Drop));
    assert_eq!(config.sources[0].store_headers.rules, expected);
}

#[test]
fn preset_mistakes_are_reported_with_their_paths() {
    let cases: &[(&str, &[&str])] = &[
        (
            "provider: paypal\nverify: {secret: s}",
            &["sources[0].provider: unknown provider \"paypal\" (expected one of: stripe, github, shopify, standard-webhooks, slack, twilio)"],
        ),
        (
            "provider: stripe",
            &["sources[0].verify: required with provider stripe: give its secret as verify: {secret: ...}"],
        ),
        (
            "provider: stripe\nverify: {scheme: stripe, secret: s}",
            &["sources[0].verify.scheme: provider stripe sets the scheme; remove scheme here (or remove provider and set verify, dedupe and store_headers yourself)"],
        ),
        (
            "provider: github\nverify: {scheme: hmac, secret: s}",
            &["sources[0].verify.scheme: provider github sets the scheme; remove scheme here (or remove provider and set verify, dedupe and store_headers yourself)"],
        ),
        ("provider: github\nverify: {}", &["sources[0].verify.secret: required"]),
        (
            "provider: github\nverify: {secret: s, tolerance_s: 10}",
            &["sources[0].verify.tolerance_s: unknown key (expected one of: scheme, secret)"],
        ),
        (
            "provider: twilio\nverify: {secret: t}",
            &["sources[0].verify.public_url: required"],
        ),
        (
            "provider: twilio\nverify: {secret: t, public_url: 'https://gw.example.com/t?x=1'}",
            &["sources[0].verify.public_url: must not have a query or fragment: the request's own path and query are appended to it (\"https://gw.example.com/t?x=1\")"],
        ),
        (
            "provider: twilio\nverify: {secret: t, public_url: 'ftp://gw'}",
            &["sources[0].verify.public_url: not a valid URL: scheme must be http or https (\"ftp://gw\")"],
        ),
        (
            "provider: slack\nverify: {secret: ''}",
            &["sources[0].verify.secret: must not be empty"],
        ),
        (
            "provider: stripe\nverify: {secret: s}\ndedupe: none\ndedupe_window_ms: 1000",
            &["sources[0].dedupe_window_ms: has no effect without dedupe"],
        ),
        (
            "provider: github\nverify: {secret: s}\nstore_headers: {hash: [x-github-delivery]}",
            &["sources[0].store_headers: header \"x-github-delivery\" is the dedupe key (provider github), but this source's store_headers hashes it: a released or replayed hook could not be keyed the same way (keep it)"],
        ),
        (
            "dedupe: {header: x-id, non_json: keyless}",
            &["sources[0].dedupe.non_json: only a {json: …} key reads the body"],
        ),
        (
            "dedupe: {json: id, non_json: skip}",
            &["sources[0].dedupe.non_json: expected keyless or refuse, found \"skip\""],
        ),
    ];
    for (lines, expected) in cases {
        check(&with_source(&format!("{lines}\n{SINK}")), expected);
    }
    // The new schemes are usable without a preset, under the same keys.
    let source = good(&with_source(&format!(
        "verify: {{scheme: twilio, secret: t, public_url: 'http://127.0.0.1:8080'}}\n{SINK}"
    )))
    .sources
    .remove(0);
    assert_eq!(source.provider, None);
    assert_eq!(source.dedupe, None);
    assert_eq!(
        source.verify,
        Verify::Twilio {
            secret: "t".into(),
            public_url: "http://127.0.0.1:8080".into()
        }
    );
    let dedupe = good(&with_source(&format!(
        "dedupe: {{json: event_id, non_json: refuse}}\n{SINK}"
    )))
    .sources
    .remove(0)
    .dedupe;
    assert_eq!(dedupe, Some(Dedupe::Json(vec!["event_id".into()])));
}

#[test]
fn summary_shows_what_a_preset_expanded_to() {
    let yaml = "
tenants: [{id: acme}]
sources:
  - id: gh
    tenant: acme
    provider: github
    verify: {secret: gh-secret-value}
    dedupe_window_ms: 7200000
    sinks: [{kind: http, url: 'http://h/x'}]
  - id: tw
    tenant: acme
    provider: twilio
    verify: {secret: tw-secret-value, public_url: 'https://gw.example.com'}
    sinks: [{kind: http, url: 'http://h/y'}]
";
    let text = summary(&good(yaml));
    for secret in ["gh-secret-value", "tw-secret-value"] {
        assert!(!text.contains(secret), "{secret} leaked:\n{text}");
    }
    for expected in [
        "  gh: tenant acme, verify github, dedupe header x-github-delivery (2 h window)",
        "    provider github expands to:",
        "      verify:        github, header x-hub-signature-256",
        "      dedupe:        header x-github-delivery",
        "      dedupe window: 2 h (set by the source)",
        "      store_headers: keep x-hub-signature-256 x-github-delivery x-github-event x-github-hook-id x-github-hook-installation-target-id x-github-hook-installation-target-type content-type user-agent; drop authorization cookie proxy-authorization; hash -",
        "    provider twilio expands to:",
        "      verify:        twilio, header x-twilio-signature, signed URL https://gw.example.com + request path and query",
        "      dedupe:        header i-twilio-idempotency-token",
        "      dedupe window: 24 h",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}
