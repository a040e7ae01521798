//! Reload end to end: `POST /v1/reload` and SIGHUP re-read the file; a bad file is refused
//! with its problems and the running config stays; stored rows follow the row.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::receiver::{Receiver, Reply};
use common::*;

const WAIT: Duration = Duration::from_secs(60);

fn yaml(data_dir: &Path, tenants: &str, sources: &str) -> String {
    format!(
        "instance:
  data_dir: {}
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
retry: {{initial_ms: 50, max_ms: 100}}
tenants:
{tenants}
sources:
{sources}",
        data_dir.display()
    )
}

/// Rewrites the running server's config file.
fn rewrite(server: &Server, yaml: &str) {
    std::fs::write(server.dir.join("ankusa.yaml"), yaml).unwrap();
}

#[test]
fn a_reload_adds_sources_and_tenants_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let url = receiver.url("/in");
    let one = format!("  - {{id: a, tenant: acme, sinks: [{{kind: http, url: '{url}'}}]}}\n");
    let server = Server::start(dir.path(), &yaml(&data, "  - {id: acme}\n", &one));
    assert_eq!(server.post("/hooks/b", &[], b"{}").status, 404);

    let two =
        format!("{one}  - {{id: b, tenant: globex, sinks: [{{kind: http, url: '{url}'}}]}}\n");
    rewrite(
        &server,
        &yaml(&data, "  - {id: acme}\n  - {id: globex}\n", &two),
    );
    let reloaded = server.admin_post("/v1/reload", "");
    assert_eq!(reloaded.status, 200, "{reloaded:?}");
    assert_eq!(reloaded.json()["sources"], 2);
    let accepted = server.post("/hooks/b", &[], b"{\"new\":1}");
    assert_eq!(accepted.status, 202, "{accepted:?}");
    assert_eq!(accepted.json()["tenant"], "globex");
    let delivered = receiver.wait_for_hooks(1, WAIT);
    assert_eq!(delivered[0].header("x-ankusa-source"), Some("b"));

    // A bad file: every problem with its path, and the running config stays.
    rewrite(
        &server,
        &yaml(
            &data,
            "  - {id: acme}\n",
            "  - {id: c, tenant: ghost, sinks: []}\n",
        ),
    );
    let refused = server.admin_post("/v1/reload", "");
    assert_eq!(refused.status, 400, "{refused:?}");
    let body = refused.json();
    assert_eq!(body["error"], "invalid_config");
    let problems: Vec<&str> = body["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(
        problems,
        [
            "sources[0].tenant: unknown tenant \"ghost\" (declare it under tenants)",
            "sources[0].sinks: at least one sink is required",
        ]
    );
    assert_eq!(server.post("/hooks/b", &[], b"{}").status, 202);

    // A change only a restart applies is refused whole.
    let moved = yaml(&data, "  - {id: acme}\n  - {id: globex}\n", &two).replace(
        "retry:",
        "store: {sync: false, i_understand_acks_are_not_durable: true}\nretry:",
    );
    rewrite(&server, &moved);
    let refused = server.admin_post("/v1/reload", "");
    assert_eq!(refused.status, 409, "{refused:?}");
    assert_eq!(refused.json()["error"], "restart_required");
    assert_eq!(
        refused.json()["problems"][0],
        "store.sync: changing it needs a restart (running true, file false)"
    );
    let metrics = server.admin_get("/metrics").body;
    assert!(
        metrics.contains(r#"ankusa_config_reloads_total{outcome="applied"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"ankusa_config_reloads_total{outcome="refused"} 2"#),
        "{metrics}"
    );
    server.stop();
}

#[test]
fn stored_rows_follow_the_row_and_removed_sinks_and_sources_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    // Everything is refused (and retried) until the test says otherwise.
    let receiver = Receiver::scripted(|_, _| Reply::status(503));
    let data = dir.path().join("data");
    let sources = |sinks: &str, with_other: bool| {
        let mut text = format!("  - id: a\n    tenant: acme\n    sinks:\n{sinks}");
        if with_other {
            text.push_str(&format!(
                "  - {{id: other, tenant: acme, sinks: [{{kind: http, url: '{}'}}]}}\n",
                receiver.url("/other")
            ));
        }
        text
    };
    let sink = |id: &str| {
        format!(
            "      - {{kind: http, id: {id}, url: '{}'}}\n",
            receiver.url(&format!("/{id}"))
        )
    };
    let tenants = "  - {id: acme}\n";
    let server = Server::start(
        dir.path(),
        &yaml(
            &data,
            tenants,
            &sources(&format!("{}{}", sink("keep"), sink("drop")), true),
        ),
    );
    assert_eq!(server.post("/hooks/a", &[], b"{\"first\":1}").status, 202);
    assert_eq!(
        server.post("/hooks/other", &[], b"{\"other\":1}").status,
        202
    );
    receiver.wait_for(WAIT, |all| all.len() >= 3);

    // Sink `drop` and source `other` go; sink `late` comes.
    rewrite(
        &server,
        &yaml(
            &data,
            tenants,
            &sources(&format!("{}{}", sink("keep"), sink("late")), false),
        ),
    );
    assert_eq!(server.admin_post("/v1/reload", "").status, 200);
    receiver.set_script(|_, _| Reply::status(200));
    assert_eq!(server.post("/hooks/a", &[], b"{\"second\":2}").status, 202);

    // The first hook keeps its rows (keep, drop): keep is delivered, drop dead-lettered;
    // it gets no row for late. The second hook has rows for keep and late.
    let deadline = std::time::Instant::now() + WAIT;
    while server.admin_get("/v1/stats").json()["node"]["pending"] != 0 {
        assert!(std::time::Instant::now() < deadline, "rows left pending");
        std::thread::sleep(Duration::from_millis(50));
    }
    let received = receiver.received();
    let paths_of = |body: &[u8]| {
        let mut paths: Vec<String> = received
            .iter()
            .filter(|r| r.body == body)
            .map(|r| r.path.clone())
            .collect();
        paths.sort();
        paths.dedup();
        paths
    };
    assert_eq!(paths_of(b"{\"first\":1}"), ["/drop", "/keep"]);
    assert_eq!(paths_of(b"{\"second\":2}"), ["/keep", "/late"]);
    let reasons = loop {
        let page = server.admin_get("/v1/dlq?tenant=acme").json();
        let reasons: Vec<String> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["reason"].as_str().unwrap().to_owned())
            .collect();
        if reasons.len() >= 2 || std::time::Instant::now() > deadline {
            break reasons;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("sink_gone: sink \"drop\"")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("source_gone: source \"other\"")),
        "{reasons:?}"
    );
    server.stop();
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

#[test]
fn sighup_applies_new_tenant_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sources =
        "  - {id: a, tenant: acme, sinks: [{kind: http, url: 'http://127.0.0.1:9/dead'}]}\n";
    let server = Server::start(dir.path(), &yaml(&data, "  - {id: acme}\n", sources));
    for _ in 0..3 {
        assert_eq!(server.post("/hooks/a", &[], b"{}").status, 202);
    }
    rewrite(
        &server,
        &yaml(&data, "  - {id: acme, max_pending: 3}\n", sources),
    );
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let tenant = server.admin_get("/v1/tenants/acme").json();
        if tenant["max_pending"] == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 429);
    assert_eq!(
        server.stop().code(),
        Some(0),
        "SIGHUP does not stop the server"
    );
}

/// One tenant `acme` with `sources`, whose rows wait a minute after a failed attempt.
fn minute_retries(data: &Path, sources: &str) -> String {
    format!(
        "instance:
  data_dir: {}
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
retry: {{initial_ms: 60000, max_ms: 60000}}
tenants: [{{id: acme}}]
sources:
{sources}",
        data.display()
    )
}

#[test]
fn rows_of_a_removed_sink_or_source_are_dead_lettered_at_once_not_when_due() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::scripted(|_, _| Reply::status(503));
    let data = dir.path().join("data");
    let with = |body: &str| minute_retries(&data, body);
    let a = |sinks: &str| format!("  - {{id: a, tenant: acme, sinks: [{sinks}]}}\n");
    let sink = |id: &str| {
        format!(
            "{{kind: http, id: {id}, url: '{}'}}",
            receiver.url(&format!("/{id}"))
        )
    };
    let other = format!("  - {{id: other, tenant: acme, sinks: [{}]}}\n", sink("o"));
    let server = Server::start(
        dir.path(),
        &with(&format!(
            "{}{other}",
            a(&format!("{}, {}", sink("x"), sink("y")))
        )),
    );
    for _ in 0..3 {
        assert_eq!(server.post("/hooks/a", &[], b"{}").status, 202);
        assert_eq!(server.post("/hooks/other", &[], b"{}").status, 202);
    }
    // Every row has had its first attempt and waits a minute for the next.
    receiver.wait_for(WAIT, |all| all.len() >= 9);
    rewrite(&server, &with(&a(&sink("x"))));
    let reloaded = server.admin_post("/v1/reload", "").json();
    assert_eq!(reloaded["removed_sources"], serde_json::json!(["other"]));
    assert_eq!(reloaded["removed_sinks"], serde_json::json!(["a/y"]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let node = server.admin_get("/v1/stats").json()["node"].clone();
        if node["dead"] == 6 {
            assert_eq!(node["pending"], 3, "x's rows still wait");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not dead-lettered: {node}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

#[test]
fn a_row_in_flight_during_a_reload_is_dead_lettered_when_its_attempt_fails() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::scripted(|_, _| Reply::status(503));
    let data = dir.path().join("data");
    let with = |body: &str| minute_retries(&data, body);
    let sink = |id: &str| {
        format!(
            "{{kind: http, id: {id}, url: '{}'}}",
            receiver.url(&format!("/{id}"))
        )
    };
    let a = |sinks: &str| format!("  - {{id: a, tenant: acme, sinks: [{sinks}]}}\n");
    let other = format!("  - {{id: other, tenant: acme, sinks: [{}]}}\n", sink("o"));
    let server = Server::start(
        dir.path(),
        &with(&format!(
            "{}{other}",
            a(&format!("{}, {}", sink("x"), sink("y")))
        )),
    );
    // The first attempts are held open across the reload.
    receiver.hold();
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 202);
    assert_eq!(server.post("/hooks/other", &[], b"{}").status, 202);
    receiver.wait_for(WAIT, |all| all.len() >= 3);
    rewrite(&server, &with(&a(&sink("x"))));
    let reloaded = server.admin_post("/v1/reload", "").json();
    assert_eq!(reloaded["removed_sinks"], serde_json::json!(["a/y"]));
    receiver.release();

    // The 503s come after the reload: y's and other's rows die then, not a minute later
    // when their retries would come due; x's row waits for its retry.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let node = server.admin_get("/v1/stats").json()["node"].clone();
        if node["dead"] == 2 {
            assert_eq!(node["pending"], 1, "x's row still waits: {node}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not dead-lettered: {node}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let page = server.admin_get("/v1/dlq?tenant=acme").json();
    let mut reasons: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["reason"].as_str().unwrap())
        .collect();
    reasons.sort_unstable();
    assert_eq!(
        reasons,
        [
            "sink_gone: sink \"y\" is not configured on source \"a\"",
            "source_gone: source \"other\" is not configured",
        ]
    );
    server.stop();
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}
