//! `bench-gate drain`'s configs are ones the real `ankusa check-config` accepts for every
//! sink kind, keyed or not, and a small drain through the HTTP sink runs end to end: every
//! hook acked, delivered and answered by the receiver, with rates that add up.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bench_gate::drain::{self, DrainSettings, SinkKind, Target};

#[test]
fn every_sink_kinds_config_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let targets = [
        Target::Http {
            receiver: "127.0.0.1:9".parse().unwrap(),
        },
        Target::broker(SinkKind::Redis, 7).unwrap(),
        Target::broker(SinkKind::Nats, 7).unwrap(),
        Target::broker(SinkKind::Rabbitmq, 7).unwrap(),
        Target::Kafka {
            brokers: "127.0.0.1:9092".into(),
            topic: drain::kafka_topic(7),
        },
        // FIFO: the keyed config is ordered, which a standard queue refuses.
        Target::Sqs {
            endpoint: drain::SQS_ENDPOINT.into(),
            region: drain::SQS_REGION.into(),
            queue_url: format!(
                "{}/123456789012/{}",
                drain::SQS_ENDPOINT,
                drain::sqs_queue(7, true)
            ),
        },
        Target::broker(SinkKind::Pubsub, 7).unwrap(),
    ];
    for target in &targets {
        for keys in [0, 1000] {
            let name = format!("{}-{keys}", target.kind().name());
            let yaml = drain::server_yaml(&dir.path().join("data"), target, keys, &[]);
            common::assert_check_config_accepts(dir.path(), &name, &yaml);
        }
    }
}

#[test]
fn sink_options_make_configs_check_config_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let option = |text: &str| drain::parse_sink_option(text).unwrap();
    let kafka = Target::Kafka {
        brokers: "127.0.0.1:9092".into(),
        topic: drain::kafka_topic(7),
    };
    let cases = [
        (kafka.clone(), vec![option(r#"client={"linger.ms": "1"}"#)]),
        (
            kafka,
            vec![option("client={linger.ms: 0}"), option("timeout_ms=5000")],
        ),
        (
            Target::broker(SinkKind::Pubsub, 7).unwrap(),
            vec![option("max_in_flight=8"), option("batch_size=50")],
        ),
    ];
    for (index, (target, options)) in cases.iter().enumerate() {
        let yaml = drain::server_yaml(&dir.path().join("data"), target, 0, options);
        common::assert_check_config_accepts(dir.path(), &index.to_string(), &yaml);
    }
}

fn drain_http(keys: usize) {
    let hooks = 2_000;
    let settings = DrainSettings {
        bin: common::ankusa_bin().to_path_buf(),
        sink: SinkKind::Http,
        hooks,
        keys,
        connections: 16,
        timeout: Duration::from_secs(120),
        sink_options: Vec::new(),
    };
    let report = drain::drain(&settings, None).unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!((report.acked, report.delivered), (hooks, hooks));
    assert_eq!(report.dead_lettered, 0);
    assert!(report.destination_count.unwrap() >= hooks);
    assert_eq!(
        report.backlog_at_ingest_end,
        hooks - report.delivered_at_ingest_end
    );
    let total_s = report.total_s.unwrap();
    assert!(total_s >= report.ingest_s, "{report:?}");
    let overall = report.overall_delivered_per_s.unwrap();
    assert!(
        (overall - hooks as f64 / total_s).abs() < 1e-6,
        "{report:?}"
    );
    assert!(report.ingest_hooks_per_s > 0.0);
    assert_eq!(report.key_missing, (keys > 0).then_some(0));
    let text = drain::render(&report);
    assert!(text.lines().nth(1).unwrap().starts_with("http "), "{text}");
}

#[test]
fn an_http_drain_delivers_every_hook() {
    drain_http(0);
}

#[test]
fn an_ordered_http_drain_delivers_every_hook_with_its_key() {
    drain_http(100);
}
