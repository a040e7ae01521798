//! Ordering lanes end to end (the ordering lanes decision record, "Proof"): the real binary
//! delivers an ordered sink's hooks to a real HTTP receiver on loopback, one attempt of a
//! lane at a time and in seq order, through retries, a slow key, a restart, a dead head,
//! a DLQ revive and the keyless lane.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use ankusa::store::keys::{Counter, NODE_ORDINAL};
use ankusa::store::Store;
use common::receiver::{Received, Receiver, Reply};
use common::*;

const WAIT: Duration = Duration::from_secs(60);

/// Source `orders` of acme, ordered by the body's `customer`, and source `other` of globex
/// on the same receiver, ordered by the header `x-entity`. Fast retries, and a breaker
/// that never opens: a failing key must not stop the sink.
fn sources(url: &str, concurrency: Option<usize>) -> String {
    let dispatch = concurrency
        .map(|c| format!("dispatch: {{breaker_failures: 100000, sink_concurrency: {c}}}\n"))
        .unwrap_or_else(|| "dispatch: {breaker_failures: 100000}\n".into());
    format!(
        "
retry: {{initial_ms: 50, max_ms: 200}}
{dispatch}
sources:
  - id: orders
    tenant: acme
    sinks:
      - {{kind: http, url: '{url}', ordered: true, ordering_key: {{json: customer}}}}
  - id: other
    tenant: globex
    sinks:
      - {{kind: http, url: '{url}', ordered: true, ordering_key: {{header: x-entity}}}}
"
    )
}

fn config(data: &std::path::Path, url: &str, concurrency: Option<usize>) -> String {
    config_yaml(data, "", Some(&sources(url, concurrency)))
}

fn post_order(server: &Server, customer: Option<&str>, n: usize) {
    let body = match customer {
        Some(customer) => format!(r#"{{"customer":"{customer}","n":{n}}}"#),
        None => format!(r#"{{"n":{n}}}"#),
    };
    let response = server.post("/hooks/orders", &[], body.as_bytes());
    assert_eq!(response.status, 202, "{response:?}");
}

/// The `n` of each request, in arrival order, for one ordering key.
fn arrivals(received: &[Received], key: &str) -> Vec<u64> {
    received
        .iter()
        .filter(|r| r.ordering_key() == Some(key))
        .map(|r| r.field("n").parse().unwrap())
        .collect()
}

/// `n` values with each hook's repeats (retries, redeliveries) collapsed when adjacent.
fn collapsed(ns: &[u64]) -> Vec<u64> {
    let mut out: Vec<u64> = ns.to_vec();
    out.dedup();
    out
}

/// The hooks delivered per key once each (idempotency keys), for completeness checks.
fn delivered_once(received: &[Received]) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    let mut keys = std::collections::HashSet::new();
    for r in received {
        let id = r.header("x-ankusa-idempotency-key").unwrap().to_owned();
        if keys.insert(id) {
            *seen
                .entry(r.ordering_key().unwrap_or("").to_owned())
                .or_insert(0) += 1;
        }
    }
    seen
}

fn node_counter(data: &std::path::Path, field: Counter) -> i64 {
    Store::open_existing(data)
        .unwrap()
        .counter(NODE_ORDINAL, field)
        .unwrap()
}

fn settled_store(data: &std::path::Path) {
    let (ok, report) = store_verify(data);
    assert!(ok, "{report}");
    for field in [Counter::Lanes, Counter::LanesBlocked, Counter::LaneMembers] {
        assert_eq!(node_counter(data, field), 0, "{}", field.name());
    }
}

/// 100 hooks of one key, the 41st failing twice: every request comes in seq order (a
/// retry repeats its hook before any later one), one attempt of the lane at a time.
#[test]
fn a_keys_hooks_arrive_in_order_one_at_a_time_through_a_retry() {
    let receiver = Receiver::scripted(|request, earlier| {
        if request.field("n") == "40" && earlier < 2 {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config(&data, &receiver.url("/in"), None));
    for n in 0..100 {
        post_order(&server, Some("cus_1"), n);
    }
    let received = receiver.wait_for_hooks(100, WAIT);
    // A stop writes the outcomes of the attempts still running, so the lane is settled.
    assert!(server.stop().success());

    let ns = arrivals(&received, "cus_1");
    assert_eq!(ns.len(), 102, "100 hooks and two retries");
    assert_eq!(collapsed(&ns), (0..100).collect::<Vec<_>>());
    assert_eq!(ns.iter().filter(|n| **n == 40).count(), 3);
    assert_eq!(receiver.max_concurrency_per_ordering_key(), 1);
    for request in &received {
        assert_eq!(request.ordering_key(), Some("cus_1"));
    }
    settled_store(&data);
}

/// A key whose head keeps failing blocks its own lane and nothing else: with one slot per
/// (tenant, sink), other keys of the tenant and another tenant are delivered while it
/// waits (so the waiting head holds no slot), and once the receiver recovers its hooks
/// follow in order. The blocked lane shows in `ankusa_dispatch_lanes_blocked`.
#[test]
fn a_blocked_key_delays_no_other_key_or_tenant_and_holds_no_slot() {
    let receiver = Receiver::scripted(|request, _| {
        if request.ordering_key() == Some("cus_slow") {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config(&data, &receiver.url("/in"), Some(1)));
    for n in 0..20 {
        post_order(&server, Some("cus_slow"), n);
    }
    for n in 0..50 {
        post_order(&server, Some(&format!("cus_{}", n % 10)), 100 + n);
    }
    for n in 0..20 {
        let response = server.post(
            "/hooks/other",
            &[("x-entity", &format!("e{}", n % 4))],
            format!(r#"{{"n":{}}}"#, 200 + n).as_bytes(),
        );
        assert_eq!(response.status, 202);
    }
    let received = receiver.wait_for(WAIT, |received| {
        let once = delivered_once(received);
        let others: usize = once
            .iter()
            .filter(|(key, _)| key.as_str() != "cus_slow")
            .map(|(_, count)| *count)
            .sum();
        others == 70
    });
    // Only the slow lane's head was ever attempted.
    let slow = arrivals(&received, "cus_slow");
    assert!(!slow.is_empty());
    assert!(slow.iter().all(|n| *n == 0), "{slow:?}");
    for key in (0..10).map(|k| format!("cus_{k}")) {
        let ns = arrivals(&received, &key);
        assert_eq!(ns.len(), 5, "{key}");
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "{key}: {ns:?}");
    }
    let metrics = server.admin_get("/metrics").body;
    let deadline = std::time::Instant::now() + WAIT;
    let mut blocked = metric(&metrics, "ankusa_dispatch_lanes_blocked");
    while blocked != Some(1.0) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        blocked = metric(
            &server.admin_get("/metrics").body,
            "ankusa_dispatch_lanes_blocked",
        );
    }
    assert_eq!(blocked, Some(1.0));

    receiver.set_script(|_, _| Reply::status(200));
    let received = receiver.wait_for(WAIT, |received| {
        delivered_once(received).get("cus_slow") == Some(&20)
    });
    assert!(server.stop().success());
    let slow = collapsed(&arrivals(&received, "cus_slow"));
    assert_eq!(slow, (0..20).collect::<Vec<_>>());
    assert_eq!(receiver.max_concurrency(), 1);
    assert_eq!(receiver.max_concurrency_per_ordering_key(), 1);
    settled_store(&data);
}

/// SIGKILL with one lane's head in flight and another lane's head waiting out a retry
/// (the receiver asked for 30 s), members behind both: after the restart each lane
/// resumes in order, the in-flight head is delivered again before any later hook of its
/// lane, and the waiting head keeps its place before its members.
#[test]
fn a_restart_keeps_lane_order_and_redelivers_the_head_first() {
    let receiver = Receiver::scripted(|request, _| match request.ordering_key() {
        Some("cus_b") => Reply::status(503).with_header("retry-after", "30"),
        _ => Reply::status(200),
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let yaml = config(&data, &receiver.url("/in"), None);
    let server = Server::start(dir.path(), &yaml);
    for n in 0..10 {
        post_order(&server, Some("cus_b"), 100 + n);
    }
    // cus_b's head was refused once and now waits 30 s; its lane is blocked.
    receiver.wait_for(WAIT, |received| arrivals(received, "cus_b").len() == 1);
    receiver.hold();
    for n in 0..10 {
        post_order(&server, Some("cus_a"), n);
    }
    // cus_a's head is held in flight.
    receiver.wait_for(WAIT, |received| arrivals(received, "cus_a").len() == 1);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(arrivals(&receiver.received(), "cus_b").len(), 1);
    server.kill();
    let before = receiver.received().len();
    receiver.release();

    receiver.set_script(|_, _| Reply::status(200));
    let server = Server::start(dir.path(), &yaml);
    let received = receiver.wait_for(WAIT, |received| {
        delivered_once(&received[before..]).get("cus_a") == Some(&10)
    });
    let after = &received[before..];
    let a = arrivals(after, "cus_a");
    assert_eq!(a.first(), Some(&0), "the head first: {a:?}");
    assert_eq!(collapsed(&a), (0..10).collect::<Vec<_>>());
    assert!(
        arrivals(after, "cus_b").is_empty(),
        "the blocked head waits out its retry across the restart"
    );
    assert!(server.stop().success());
    let store = Store::open_existing(&data).unwrap();
    assert_eq!(
        store.counter(NODE_ORDINAL, Counter::LanesBlocked).unwrap(),
        1
    );
    assert_eq!(
        store.counter(NODE_ORDINAL, Counter::LaneMembers).unwrap(),
        9
    );
    drop(store);
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    assert_eq!(receiver.max_concurrency_per_ordering_key(), 1);
}

/// A head the receiver refuses for good goes to the DLQ and releases its lane; revived
/// while a later hook of the key is the head, it runs after that head and before the
/// members waiting behind it.
#[test]
fn a_dead_head_releases_its_lane_and_a_revive_waits_its_turn() {
    let receiver = Receiver::scripted(|request, earlier| {
        if request.field("n") == "0" && earlier == 0 {
            Reply::status(400)
        } else {
            Reply::status(200)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config(&data, &receiver.url("/in"), None));
    for n in 0..5 {
        post_order(&server, Some("cus_d"), n);
    }
    let received = receiver.wait_for(WAIT, |received| {
        delivered_once(received).get("cus_d") == Some(&5)
    });
    assert_eq!(arrivals(&received, "cus_d"), vec![0, 1, 2, 3, 4]);
    let dlq = server.admin_get("/v1/dlq?tenant=acme").json();
    let items = dlq["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{dlq}");
    let dead_seq = items[0]["seq"].as_u64().unwrap();

    // A later hook of the key becomes the head and is held in flight; two members wait.
    // First the server must have taken hook 4's answer: a hold set between the receiver
    // recording it and answering it would hold it too, and its timeout would send it again.
    wait_delivered(&server, 4);
    receiver.hold();
    post_order(&server, Some("cus_d"), 10);
    receiver.wait_for(WAIT, |received| arrivals(received, "cus_d").len() == 6);
    post_order(&server, Some("cus_d"), 11);
    post_order(&server, Some("cus_d"), 12);
    let revive = server.admin_post(
        "/v1/dlq/revive",
        &format!(r#"{{"tenant":"acme","seq":{dead_seq},"sink":"http"}}"#),
    );
    assert_eq!(revive.status, 200, "{revive:?}");
    assert_eq!(revive.json()["revived"], 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        arrivals(&receiver.received(), "cus_d").len(),
        6,
        "nothing runs beside the head"
    );
    receiver.release();
    let received = receiver.wait_for(WAIT, |received| arrivals(received, "cus_d").len() == 9);
    assert!(server.stop().success());
    assert_eq!(
        arrivals(&received, "cus_d")[5..].to_vec(),
        vec![10, 0, 11, 12],
        "the revived hook runs after the head it found, before later members"
    );
    settled_store(&data);
}

/// Hooks without the key share the sink's keyless lane (in order, one at a time, with the
/// default ordering key `<tenant>/<source>`), and each one counts in
/// `ankusa_dispatch_lane_key_missing_total{sink="http"}`.
#[test]
fn hooks_without_a_key_share_the_keyless_lane_and_are_counted() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config(&data, &receiver.url("/in"), None));
    for n in 0..30 {
        post_order(&server, None, n);
    }
    let received = receiver.wait_for_hooks(30, WAIT);
    assert_eq!(
        arrivals(&received, "acme/orders"),
        (0..30).collect::<Vec<_>>()
    );
    assert_eq!(receiver.max_concurrency_per_ordering_key(), 1);
    let metrics = server.admin_get("/metrics").body;
    assert_eq!(
        metric(
            &metrics,
            "ankusa_dispatch_lane_key_missing_total{sink=\"http\"}"
        ),
        Some(30.0),
        "{metrics}"
    );
    assert!(server.stop().success());
    settled_store(&data);
}

/// Unordered sinks never run the lane sweep: the sweep counter stays at zero (the bench
/// gate's `lane_members == 0` gate checks the same counter).
#[test]
fn without_an_ordered_sink_the_lane_sweep_never_runs() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let yaml = config_yaml(
        &data,
        "",
        Some(&format!(
            "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, url: '{}'}}
",
            receiver.url("/in")
        )),
    );
    let server = Server::start(dir.path(), &yaml);
    for n in 0..50 {
        let response = server.post("/hooks/demo", &[], format!(r#"{{"n":{n}}}"#).as_bytes());
        assert_eq!(response.status, 202);
    }
    let received = receiver.wait_for_hooks(50, WAIT);
    assert!(received.iter().all(|r| r.ordering_key().is_none()));
    let metrics = server.admin_get("/metrics").body;
    assert_eq!(
        metric(&metrics, "ankusa_dispatch_lane_sweeps_total").unwrap_or(0.0),
        0.0
    );
    assert!(server.stop().success());
}

/// Waits until the server counted `count` hooks delivered.
fn wait_delivered(server: &Server, count: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = server.admin_get("/metrics").body;
        if metric(&text, "ankusa_delivered_total").unwrap_or(0.0) >= count as f64 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{count} deliveries not counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
