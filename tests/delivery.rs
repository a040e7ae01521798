//! Delivery end to end: the real binary delivers to a real HTTP receiver on loopback.
//! Faults injected: receivers that fail, refuse, hang or throttle; SIGKILL with attempts in
//! flight; a sink removed from the config between runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use ankusa::store::codec::HookRecord;
use ankusa::store::keys::{self, Counter};
use ankusa::store::{Store, CF_ARCHIVE, CF_INDEX};
use common::receiver::{distinct_keys, Receiver, Reply};
use common::*;

const WAIT: Duration = Duration::from_secs(60);

fn sources(url: &str) -> String {
    format!(
        "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, url: '{url}', headers: {{x-static: yes}}, forward_headers: [x-request-id]}}
"
    )
}

const FAST_RETRY: &str = "
retry: {initial_ms: 50, max_ms: 200}
";

fn post_many(server: &Server, path: &str, count: usize, body: impl Fn(usize) -> String) {
    let mut stream = server.connect();
    for index in 0..count {
        send_post(
            &mut stream,
            path,
            &[("x-request-id", &format!("r{index}"))],
            body(index).as_bytes(),
            false,
        );
        let response = read_response(&mut stream).unwrap();
        assert_eq!(response.status, 202, "{response:?}");
    }
}

fn ordinal(store: &Store, tenant: &str) -> u32 {
    store.tenant_ordinal(tenant).unwrap().unwrap()
}

fn count_keys(store: &Store, cf: &str, start: &[u8], end: &[u8]) -> usize {
    let mut count = 0;
    store
        .scan(cf, start, Some(end), |_, _| {
            count += 1;
            Ok(true)
        })
        .unwrap();
    count
}

fn dead_reasons(store: &Store, ordinal: u32) -> Vec<String> {
    let mut reasons = Vec::new();
    ankusa::store::deliveries::dead_rows(store, ordinal, None, |row| {
        reasons.push(row.reason);
        Ok(true)
    })
    .unwrap();
    reasons
}

#[test]
fn a_thousand_hooks_reach_a_healthy_receiver_with_body_and_metadata() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, "", Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 1000, |i| format!(r#"{{"n":{i}}}"#));
    let received = receiver.wait_for_hooks(1000, WAIT);
    // Idle for over a second, the tenant leaves the pipeline's rounds and its active
    // marker is removed (checked in the store below).
    wait_for_metric(&server, "ankusa_dispatch_active_tenants", 0.0);
    assert!(server.stop().success());

    for request in &received {
        assert_eq!(request.path, "/in");
        let seq = request.seq();
        let n: usize = serde_json::from_slice::<serde_json::Value>(&request.body).unwrap()["n"]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(request.header("x-ankusa-message-version"), Some("1"));
        assert_eq!(request.header("x-ankusa-tenant"), Some("acme"));
        assert_eq!(request.header("x-ankusa-source"), Some("demo"));
        assert_eq!(request.header("x-static"), Some("yes"));
        assert_eq!(
            request.header("x-request-id"),
            Some(format!("r{n}").as_str())
        );
        assert!(request.header("x-ankusa-received-at").is_some());
        let key = request.header("x-ankusa-idempotency-key").unwrap();
        assert!(key.ends_with(&format!(":{seq}:http")), "{key}");
        assert_eq!(request.header("x-ankusa-ordering-key"), None);
    }
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    let store = Store::open_existing(&data).unwrap();
    let acme = ordinal(&store, "acme");
    let (start, end) = keys::archive_between(acme, 0, u64::MAX);
    // The archive holds each hook's record as acked: digest intact, body as posted.
    let mut archived_bodies = Vec::new();
    store
        .scan(CF_ARCHIVE, &start, Some(&end), |_, value| {
            let record = HookRecord::decode(value).unwrap();
            assert_eq!(record.tenant_id, "acme");
            archived_bodies.push(String::from_utf8(record.body).unwrap());
            Ok(true)
        })
        .unwrap();
    archived_bodies.sort();
    let mut posted: Vec<String> = (0..1000).map(|i| format!(r#"{{"n":{i}}}"#)).collect();
    posted.sort();
    assert_eq!(archived_bodies, posted);
    assert_eq!(store.counter(acme, Counter::Pending).unwrap(), 0);
    assert_eq!(store.counter(acme, Counter::DeliveredTotal).unwrap(), 1000);
    assert_eq!(
        ankusa::store::deliveries::active_tenants(&store).unwrap(),
        Vec::<u32>::new()
    );
    assert_eq!(store.counter(0, Counter::Inflight).unwrap(), 0);
}

#[test]
fn a_failing_receiver_gets_each_hook_on_the_third_attempt() {
    // Two 500s, then 200, per hook.
    let receiver = Receiver::scripted(|_, earlier| {
        if earlier < 2 {
            Reply::status(500).with_body("boom")
        } else {
            Reply::status(200)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Forty failures in a row would open the breaker; this test is about retries.
    let extra = format!("{FAST_RETRY}dispatch: {{breaker_failures: 1000}}\n");
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, &extra, Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 20, |i| format!("{{\"n\":{i}}}"));
    let received = receiver.wait_for(WAIT, |received| {
        received.iter().filter(|r| r.attempt() == 3).count() >= 20
    });
    assert!(server.stop().success());
    assert_eq!(received.len(), 60, "exactly three attempts per hook");
    for attempt in 1..=3 {
        assert_eq!(
            received.iter().filter(|r| r.attempt() == attempt).count(),
            20
        );
    }
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    let store = Store::open_existing(&data).unwrap();
    assert_eq!(store.counter(0, Counter::DeliveredTotal).unwrap(), 20);
    assert_eq!(store.counter(0, Counter::Pending).unwrap(), 0);
}

#[test]
fn retry_after_is_honoured() {
    let receiver = Receiver::scripted(|_, earlier| {
        if earlier == 0 {
            Reply::status(503).with_header("retry-after", "2")
        } else {
            Reply::status(200)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, FAST_RETRY, Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 1, |_| "{}".into());
    let received = receiver.wait_for(WAIT, |received| received.len() >= 2);
    assert!(server.stop().success());
    let gap = received[1].at - received[0].at;
    assert!(
        gap >= Duration::from_secs(2),
        "second attempt {gap:?} after the first, before Retry-After: 2"
    );
}

#[test]
fn a_refused_hook_is_dead_lettered_after_one_attempt() {
    let receiver = Receiver::scripted(|_, _| Reply::status(400).with_body("bad payload"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, FAST_RETRY, Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 3, |_| "{}".into());
    receiver.wait_for_hooks(3, WAIT);
    // The rows leave pending when they are dead-lettered.
    wait_for_metric(&server, "ankusa_dead", 3.0);
    assert!(server.stop().success());
    assert_eq!(receiver.received().len(), 3, "one attempt each");
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    let store = Store::open_existing(&data).unwrap();
    let acme = ordinal(&store, "acme");
    let reasons = dead_reasons(&store, acme);
    assert_eq!(reasons, vec!["http 400: bad payload".to_string(); 3]);
    assert_eq!(store.counter(acme, Counter::Dead).unwrap(), 3);
    assert_eq!(store.counter(acme, Counter::Pending).unwrap(), 0);
}

#[test]
fn an_always_failing_receiver_dead_letters_at_the_horizon() {
    let receiver = Receiver::scripted(|_, _| Reply::status(502));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let extra = "
retry: {initial_ms: 20, max_ms: 50, max_elapsed_ms: 400}
dispatch: {breaker_failures: 1000}
";
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, extra, Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 2, |_| "{}".into());
    wait_for_metric(&server, "ankusa_dead", 2.0);
    assert!(server.stop().success());
    let store = Store::open_existing(&data).unwrap();
    let reasons = dead_reasons(&store, ordinal(&store, "acme"));
    assert_eq!(reasons.len(), 2);
    for reason in reasons {
        assert!(reason.starts_with("horizon: http 502"), "{reason}");
    }
    assert!(receiver.received().len() > 2, "it retried before giving up");
}

#[test]
fn the_breaker_stops_attempts_until_half_open_and_closes_on_recovery() {
    let receiver = Receiver::scripted(|_, _| Reply::status(503));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let extra = "
retry: {initial_ms: 10, max_ms: 20}
dispatch: {breaker_failures: 3, breaker_open_ms: 3000, sink_concurrency: 1}
";
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, extra, Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 5, |_| "{}".into());
    // Three failures open the breaker; the receiver heals only once it is open (a request
    // is recorded before it is answered, so waiting for three arrivals is not enough).
    wait_for_metric(&server, "ankusa_dispatch_breaker_opens_total", 1.0);
    let third = receiver.received()[2].at;
    receiver.set_script(|_, _| Reply::status(200));
    let received = receiver.wait_for_hooks(5, WAIT);
    assert!(server.stop().success());
    // With one attempt at a time the third failure is the last before the opening; the
    // next request is the probe, which waits out the open period.
    let after: Vec<_> = received.iter().filter(|r| r.at > third).collect();
    let probe = after.first().unwrap();
    assert!(
        probe.at - third >= Duration::from_millis(2900),
        "an attempt {:?} after the breaker opened",
        probe.at - third
    );
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

#[test]
fn at_most_eight_attempts_run_at_once_per_tenant_and_sink() {
    let receiver = Receiver::scripted(|_, _| Reply::status(200).after(Duration::from_millis(150)));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, "", Some(&sources(&receiver.url("/in")))),
    );
    post_many(&server, "/hooks/demo", 60, |_| "{}".into());
    receiver.wait_for_hooks(60, WAIT);
    assert!(server.stop().success());
    let max = receiver.max_concurrency();
    assert!(max <= 8, "{max} attempts at once");
    assert!(max >= 2, "attempts ran one at a time ({max})");
}

#[test]
fn a_hanging_sink_of_one_tenant_does_not_hold_up_another() {
    let stuck = Receiver::start();
    stuck.hold();
    let healthy = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sources = format!(
        "
sources:
  - id: slow
    tenant: acme
    sinks:
      - {{kind: http, url: '{}', timeout_ms: 60000}}
  - id: fast
    tenant: globex
    sinks:
      - {{kind: http, url: '{}'}}
",
        stuck.url("/stuck"),
        healthy.url("/ok")
    );
    let server = Server::start(dir.path(), &config_yaml(&data, "", Some(&sources)));
    post_many(&server, "/hooks/slow", 30, |_| "{}".into());
    stuck.wait_for(WAIT, |received| received.len() >= 8);
    post_many(&server, "/hooks/fast", 50, |_| "{}".into());
    healthy.wait_for_hooks(50, WAIT);
    // Every one of globex's hooks was delivered while acme's sink still held its first
    // attempts unanswered.
    let stuck_now = stuck.received();
    assert_eq!(
        stuck_now.len(),
        8,
        "acme's sink got only its concurrency's worth"
    );
    stuck.release();
    stuck.wait_for_hooks(30, WAIT);
    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

#[test]
fn sigkill_with_attempts_in_flight_loses_nothing() {
    let receiver = Receiver::start();
    receiver.hold();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let yaml = config_yaml(&data, "", Some(&sources(&receiver.url("/in"))));
    let server = Server::start(dir.path(), &yaml);
    post_many(&server, "/hooks/demo", 40, |i| format!("{{\"n\":{i}}}"));
    receiver.wait_for(WAIT, |received| received.len() >= 8);
    server.kill();
    let (ok, report) = store_verify(&data);
    assert!(ok, "after SIGKILL: {report}");
    {
        let store = Store::open_existing(&data).unwrap();
        assert!(
            store.counter(0, Counter::Inflight).unwrap() > 0,
            "claims were in flight"
        );
    }

    // Nothing was answered before the kill, so every hook must arrive after the restart;
    // the claimed ones arrive twice in all (a duplicate, never a loss).
    let restarted = std::time::Instant::now();
    receiver.release();
    let server = Server::start(dir.path(), &yaml);
    let after_restart = |received: &[common::receiver::Received]| {
        received
            .iter()
            .filter(|r| r.at >= restarted)
            .cloned()
            .collect::<Vec<_>>()
    };
    receiver.wait_for(WAIT, |received| {
        distinct_keys(&after_restart(received)) >= 40
    });
    assert!(server.stop().success());
    let received = receiver.received();
    assert_eq!(
        distinct_keys(&after_restart(&received)),
        40,
        "every hook delivered"
    );
    assert!(received.len() >= 48, "the claimed ones were sent again");
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    let store = Store::open_existing(&data).unwrap();
    assert_eq!(store.counter(0, Counter::Pending).unwrap(), 0);
    assert_eq!(store.counter(0, Counter::Inflight).unwrap(), 0);
}

#[test]
fn a_sink_removed_from_the_config_dead_letters_its_rows() {
    let receiver = Receiver::start();
    receiver.hold();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let two_sinks = format!(
        "
sources:
  - id: fanout
    tenant: acme
    sinks:
      - {{kind: http, id: keep, url: '{0}'}}
      - {{kind: http, id: gone, url: '{1}'}}
",
        receiver.url("/keep"),
        receiver.url("/gone")
    );
    let server = Server::start(dir.path(), &config_yaml(&data, "", Some(&two_sinks)));
    post_many(&server, "/hooks/fanout", 3, |_| "{}".into());
    // Both sinks' attempts hang; the kill leaves them claimed, and the restart puts them
    // back to due under the new config.
    receiver.wait_for(WAIT, |received| received.len() >= 6);
    server.kill();

    receiver.release();
    let one_sink = format!(
        "
sources:
  - id: fanout
    tenant: acme
    sinks:
      - {{kind: http, id: keep, url: '{0}'}}
",
        receiver.url("/keep")
    );
    let server = Server::start(dir.path(), &config_yaml(&data, "", Some(&one_sink)));
    receiver.wait_for_hooks(3, WAIT);
    wait_for_metric(&server, "ankusa_dead", 3.0);
    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    let store = Store::open_existing(&data).unwrap();
    let reasons = dead_reasons(&store, ordinal(&store, "acme"));
    assert_eq!(reasons.len(), 3);
    for reason in reasons {
        assert!(reason.starts_with("sink_gone"), "{reason}");
    }
    // The hooks stay (their dead rows can be revived); nothing is due any more.
    let (start, end) = keys::family_range(keys::Tag::Due, ordinal(&store, "acme"));
    assert_eq!(count_keys(&store, CF_INDEX, &start, &end), 0);
}

/// Polls `/metrics` until `name` reaches `value` (gauges refresh every 250 ms).
fn wait_for_metric(server: &Server, name: &str, value: f64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let text = server.admin_get("/metrics").body;
        if metric(&text, name) == Some(value) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never reached {value}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
