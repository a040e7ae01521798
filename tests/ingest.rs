//! Ingest end to end against the real binary: 202 after the sync, the rows and counters
//! in the store, the orderly stop, routing refusals and the admin endpoints.
#![allow(clippy::unwrap_used)]

mod common;

use ankusa::store::codec::{DeliveryRow, HookRecord};
use ankusa::store::keys::{self, Counter};
use ankusa::store::{Store, CF_DELIVERIES, CF_HOOKS};
use common::*;

#[test]
fn accepted_hooks_are_in_the_store_with_their_rows_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config_yaml(&data, "", None));

    let body = br#"{"id":"evt_1","type":"charge.succeeded"}"#;
    let response = server.post(
        "/hooks/demo",
        &[("x-request-id", "r1"), ("authorization", "Bearer s3cret")],
        body,
    );
    assert_eq!(response.status, 202, "{response:?}");
    let json = response.json();
    assert_eq!(json["tenant"], "acme");
    assert_eq!(json["source"], "demo");
    let first_seq = json["seq"].as_u64().unwrap();
    assert_eq!(json["id"], format!("acme:{first_seq}"));

    let fanout = server.post("/hooks/fanout", &[], b"{}");
    assert_eq!(fanout.status, 202);
    let shared = server.post("/hooks/shared/globex", &[], b"{}");
    assert_eq!(shared.status, 202);
    assert_eq!(shared.json()["tenant"], "globex");

    let metrics = server.admin_get("/metrics");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("ankusa_writer_batch_records"),
        "{}",
        metrics.body
    );

    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");

    let store = Store::open_existing(&data).unwrap();
    let acme = store.tenant_ordinal("acme").unwrap().unwrap();
    let globex = store.tenant_ordinal("globex").unwrap().unwrap();
    let mut key = Vec::new();
    keys::hook(&mut key, acme, first_seq);
    let hook = HookRecord::decode(&store.get(CF_HOOKS, &key).unwrap().unwrap()).unwrap();
    assert_eq!(hook.body, body);
    assert_eq!(hook.source_id, "demo");
    assert_eq!(hook.tenant_id, "acme");
    assert!(hook
        .headers
        .iter()
        .any(|(n, v)| n == "x-request-id" && v == b"r1"));
    // The default store_headers policy drops credentials before they reach the disk.
    assert!(
        !hook.headers.iter().any(|(n, _)| n == "authorization"),
        "{:?}",
        hook.headers
    );

    key.clear();
    keys::delivery(&mut key, acme, first_seq, 0);
    let row = DeliveryRow::decode(&store.get(CF_DELIVERIES, &key).unwrap().unwrap()).unwrap();
    // The pipeline may have tried the (unreachable) sink already; the row is still the
    // one the writer made for it.
    assert_eq!(row.sink_id, "http");
    assert!(row.size > 0);

    // demo: 1 row, fanout: 2 rows for acme; shared: 1 row for globex.
    assert_eq!(store.counter(acme, Counter::Pending).unwrap(), 3);
    assert_eq!(store.counter(globex, Counter::Pending).unwrap(), 1);
    assert_eq!(
        store.counter(keys::NODE_ORDINAL, Counter::Pending).unwrap(),
        4
    );
    assert_eq!(store.counter(acme, Counter::IngestedTotal).unwrap(), 2);
    assert_eq!(
        store
            .counter(keys::NODE_ORDINAL, Counter::IngestedTotal)
            .unwrap(),
        3
    );
    assert!(store.counter(acme, Counter::Bytes).unwrap() > 0);
}

#[test]
fn routing_refusals_have_status_and_json_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config_yaml(&data, "", None));
    let check = |path: &str, status: u16, code: &str| {
        let response = server.post(path, &[], b"{}");
        assert_eq!(response.status, status, "{path}: {response:?}");
        assert_eq!(response.json()["error"], code, "{path}: {response:?}");
    };
    check("/hooks/nope", 404, "unknown_source");
    check("/hooks/shared", 404, "tenant_required");
    check("/hooks/shared/initech", 404, "unknown_tenant");
    check("/hooks/demo/acme", 404, "not_found");
    check("/elsewhere", 404, "not_found");

    let mut stream = server.connect();
    use std::io::Write;
    stream
        .write_all(b"GET /hooks/demo HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    let response = read_response(&mut stream).unwrap();
    assert_eq!(response.status, 405);
    assert_eq!(response.header("allow"), Some("POST"));

    assert_eq!(server.admin_get("/healthz").status, 200);
    assert_eq!(server.admin_get("/readyz").status, 200);
    assert_eq!(server.admin_get("/nope").status, 404);
    assert!(server.stop().success());
}

#[test]
fn keep_alive_connection_serves_many_hooks_in_seq_order() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config_yaml(&data, "", None));
    let mut stream = server.connect();
    let mut last = 0;
    for i in 0..50 {
        send_post(
            &mut stream,
            "/hooks/demo",
            &[],
            format!("{{\"n\":{i}}}").as_bytes(),
            false,
        );
        let response = read_response(&mut stream).unwrap();
        assert_eq!(response.status, 202);
        let seq = response.json()["seq"].as_u64().unwrap();
        assert!(seq > last, "seq {seq} after {last}");
        last = seq;
    }
    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    assert!(report.contains("50 hooks"), "{report}");
}

#[test]
fn a_store_with_a_newer_format_is_refused_with_both_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    {
        let store = Store::open(&data).unwrap();
        ankusa::store::migrate::stamp(&store, ankusa::store::FORMAT + 5).unwrap();
    }
    let config_path = dir.path().join("ankusa.yaml");
    std::fs::write(&config_path, config_yaml(&data, "", None)).unwrap();
    let output = std::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let expected = format!(
        "has format {}, newer than this binary's format {}",
        ankusa::store::FORMAT + 5,
        ankusa::store::FORMAT
    );
    assert!(stderr.contains(&expected), "{stderr}");
}
