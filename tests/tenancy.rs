//! Tenancy and admission end to end, on the real binary: both tenant shapes and auto
//! tenants, per-tenant and node bounds, dedupe in every key form, and store_headers on disk.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use ankusa::store::keys::{self, Counter, IndexKey, Tag};
use ankusa::store::{Store, CF_ARCHIVE, CF_DELIVERIES, CF_HOOKS, CF_INDEX, CF_META};
use common::receiver::{Receiver, Reply};
use common::*;

const WAIT: Duration = Duration::from_secs(60);

/// Tenants `acme` (bounded by `acme_bounds`) and `globex`; `extra` holds more root sections.
fn yaml(data_dir: &Path, acme_bounds: &str, sources: &str, extra: &str) -> String {
    format!(
        "instance:
  data_dir: {}
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
retry: {{initial_ms: 50, max_ms: 200}}
tenants:
  - {{id: acme{acme_bounds}}}
  - {{id: globex}}
sources:
{sources}
{extra}",
        data_dir.display()
    )
}

/// Source `a` of acme and source `g` of globex, one http sink each.
fn two_sources(acme_url: &str, globex_url: &str) -> String {
    format!(
        "  - id: a
    tenant: acme
    sinks: [{{kind: http, url: '{acme_url}'}}]
  - id: g
    tenant: globex
    sinks: [{{kind: http, url: '{globex_url}'}}]
"
    )
}

fn status_and_json(response: &Response) -> (u16, serde_json::Value) {
    (response.status, response.json())
}

fn counter(data_dir: &Path, tenant: Option<&str>, field: Counter) -> i64 {
    let store = Store::open_existing(data_dir).unwrap();
    let ordinal = match tenant {
        Some(tenant) => store.tenant_ordinal(tenant).unwrap().unwrap(),
        None => keys::NODE_ORDINAL,
    };
    store.counter(ordinal, field).unwrap()
}

// ---------------------------------------------------------------------------------------
// Bounds

#[test]
fn a_tenant_at_max_pending_gets_429_while_another_is_served_and_then_is_accepted_again() {
    let dir = tempfile::tempdir().unwrap();
    // acme's sink refuses (503, retried) until the test opens it; globex's always takes.
    let receiver = Receiver::scripted(|received, _| {
        if received.path == "/acme" {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    });
    let sources = two_sources(&receiver.url("/acme"), &receiver.url("/globex"));
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &yaml(
            &data,
            ", max_pending: 3",
            &sources,
            "admission: {tenant_retry_after_s: 7, retry_after_max_s: 9}",
        ),
    );
    for index in 0..3 {
        let response = server.post("/hooks/a", &[], format!("{{\"n\":{index}}}").as_bytes());
        assert_eq!(response.status, 202, "{response:?}");
    }
    let refused = server.post("/hooks/a", &[], b"{\"n\":3}");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.json()["error"], "tenant_over_bound");
    // Nothing of acme drains (its sink answers 503): once its drain has been measured the
    // Retry-After is the longest, before that the configured one.
    assert_retry_after_settles(&server, "/hooks/a", 429, "7", "9");

    // Meanwhile the other tenant is accepted and delivered without waiting on acme.
    for index in 0..5 {
        let response = server.post("/hooks/g", &[], format!("{{\"g\":{index}}}").as_bytes());
        assert_eq!(response.status, 202, "{response:?}");
    }
    receiver.wait_for(WAIT, |all| {
        all.iter().filter(|r| r.path == "/globex").count() >= 5
    });
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 429);

    // acme's sink recovers: its rows drain and its hooks are taken again.
    receiver.set_script(|_, _| Reply::status(200));
    receiver.wait_for(WAIT, |all| {
        let mut seqs: Vec<u64> = all
            .iter()
            .filter(|r| r.path == "/acme" && r.header("x-ankusa-seq").is_some())
            .map(|r| r.seq())
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs.len() >= 3
    });
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let response = server.post("/hooks/a", &[], b"{\"again\":true}");
        if response.status == 202 {
            break;
        }
        assert_eq!(response.status, 429, "{response:?}");
        assert!(
            std::time::Instant::now() < deadline,
            "acme never accepted again"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
    assert!(store_verify(&data).0);
}

/// Posts to `path` until its refusal names `measured` as Retry-After; every refusal before
/// that must name `unmeasured` (the drain rate is sampled once a second).
fn assert_retry_after_settles(
    server: &Server,
    path: &str,
    status: u16,
    unmeasured: &str,
    measured: &str,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let refused = server.post(path, &[], b"{}");
        assert_eq!(refused.status, status, "{refused:?}");
        match refused.header("retry-after") {
            Some(value) if value == measured => return,
            Some(value) if value == unmeasured => {}
            other => panic!("Retry-After {other:?}, expected {unmeasured} or {measured}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the drain was never measured"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Posts to `path` until the tenant is at its bound; returns the refusal's Retry-After.
fn top_up(server: &Server, path: &str) -> u32 {
    for _ in 0..2_000 {
        let response = server.post(path, &[], b"{}");
        if response.status == 429 {
            assert_eq!(response.json()["error"], "tenant_over_bound");
            return response.header("retry-after").unwrap().parse().unwrap();
        }
        assert_eq!(response.status, 202, "{response:?}");
    }
    panic!("{path} never reached its bound");
}

#[test]
fn a_429_names_the_time_its_tenants_backlog_takes_to_drain() {
    // Sinks of known speed, one attempt at a time: acme's answers in 200 ms (5 hooks/s),
    // globex's in 40 ms (25 hooks/s). Both tenants are bounded at 400 pending rows, so
    // each must drain 40 rows (to 90% of its bound): about 8 s and 2 s.
    let receiver = Receiver::scripted(|received, _| {
        let delay = if received.path == "/slow" { 200 } else { 40 };
        Reply::status(200).after(Duration::from_millis(delay))
    });
    let sources = two_sources(&receiver.url("/slow"), &receiver.url("/fast"));
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &yaml(
            &dir.path().join("data"),
            ", max_pending: 400",
            &sources,
            "dispatch: {sink_concurrency: 1}\ntenant_defaults: {max_pending: 400}",
        ),
    );
    top_up(&server, "/hooks/a");
    top_up(&server, "/hooks/g");
    // A few seconds of steady draining for the smoothed rates to settle, then both
    // tenants are filled to their bounds again.
    std::thread::sleep(Duration::from_secs(5));
    let slow = top_up(&server, "/hooks/a");
    let fast = top_up(&server, "/hooks/g");
    eprintln!("Retry-After: acme {slow} s (5 hooks/s), globex {fast} s (25 hooks/s)");
    assert!(
        (6..=14).contains(&slow),
        "acme (5 hooks/s): Retry-After {slow}"
    );
    assert!(
        (1..=4).contains(&fast),
        "globex (25 hooks/s): Retry-After {fast}"
    );
    assert!(slow > 2 * fast, "acme {slow} s vs globex {fast} s");
    server.kill();
}

#[test]
fn bounds_hold_across_a_restart_and_the_node_bound_answers_503() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sources = "  - id: a
    tenant: acme
    sinks: [{kind: http, url: 'http://127.0.0.1:9/dead'}]
  - id: g
    tenant: globex
    sinks: [{kind: http, url: 'http://127.0.0.1:9/dead'}]
";
    // Bytes bound: each hook's record is well over 100 bytes, so two fit under 1 KiB and a
    // large one does not.
    let config = yaml(
        &data,
        ", max_pending: 2, max_bytes: 4KiB",
        sources,
        "admission: {max_pending: 3, retry_after_s: 2, retry_after_max_s: 11}",
    );
    let server = Server::start(dir.path(), &config);
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 202);
    let big = vec![b'x'; 5000];
    let too_big = server.post("/hooks/a", &[], &big);
    assert_eq!(too_big.status, 429, "{too_big:?}");
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 202);
    server.stop();

    // The bound is counted from the store after a restart, not from zero.
    let server = Server::start(dir.path(), &config);
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 429);
    assert_eq!(server.post("/hooks/g", &[], b"{}").status, 202);
    // The node holds 3 pending rows now: its bound refuses globex with 503.
    let refused = server.post("/hooks/g", &[], b"{}");
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.json()["error"], "node_over_bound");
    // The node's rows go to a dead sink: nothing drains.
    assert_retry_after_settles(&server, "/hooks/g", 503, "2", "11");
    let metrics = server.admin_get("/metrics").body;
    assert!(
        metrics.contains(r#"ankusa_ingest_refused_total{reason="tenant_bound"} 1"#),
        "{metrics}"
    );
    server.stop();
    assert_eq!(counter(&data, None, Counter::Pending), 3);
    assert!(store_verify(&data).0);
}

// ---------------------------------------------------------------------------------------
// Tenant shapes

#[test]
fn both_tenant_shapes_and_auto_tenants_with_their_cap_and_grammar() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let sources = format!(
        "  - id: own
    tenant: acme
    sinks: [{{kind: http, url: '{url}'}}]
  - id: shared
    tenant_from: path
    sinks: [{{kind: http, url: '{url}'}}]
  - id: open
    tenant_from: path
    auto_tenants: true
    verify: {{scheme: token, token: s3cret}}
    sinks: [{{kind: http, url: '{url}'}}]
",
        url = receiver.url("/in")
    );
    let config = yaml(&data, "", &sources, "admission: {auto_tenants_max: 2}");
    let server = Server::start(dir.path(), &config);
    let auth = [("authorization", "Bearer s3cret")];

    let own = server.post("/hooks/own", &[], b"{}");
    assert_eq!(own.status, 202);
    assert_eq!(own.json()["tenant"], "acme");
    let shared = server.post("/hooks/shared/globex", &[], b"{}");
    assert_eq!(shared.json()["tenant"], "globex");
    let (status, body) = status_and_json(&server.post("/hooks/shared/nobody", &[], b"{}"));
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_tenant"))
    );

    // An unverified request never creates a tenant.
    assert_eq!(server.post("/hooks/open/t1", &[], b"{}").status, 401);
    let t1 = server.post("/hooks/open/t1", &auth, b"{}");
    assert_eq!((t1.status, t1.json()["tenant"].as_str()), (202, Some("t1")));
    assert_eq!(server.post("/hooks/open/t1", &auth, b"{}").status, 202);
    assert_eq!(server.post("/hooks/open/t2", &auth, b"{}").status, 202);
    // Declared tenants do not count against the cap, and an auto source serves them.
    assert_eq!(server.post("/hooks/open/acme", &auth, b"{}").status, 202);
    let (status, body) = status_and_json(&server.post("/hooks/open/t3", &auth, b"{}"));
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("tenant_cap_reached"))
    );
    for bad in ["Upper", "-lead", "a%2Fb", &"x".repeat(65)] {
        let (status, body) =
            status_and_json(&server.post(&format!("/hooks/open/{bad}"), &auth, b"{}"));
        assert_eq!(
            (status, body["error"].as_str()),
            (404, Some("invalid_tenant_id")),
            "{bad}"
        );
    }
    // A plain path source does not serve a tenant only an auto source created.
    assert_eq!(server.post("/hooks/shared/t1", &[], b"{}").status, 404);

    let received = receiver.wait_for_hooks(6, WAIT);
    let mut tenants: Vec<&str> = received
        .iter()
        .map(|r| r.header("x-ankusa-tenant").unwrap())
        .collect();
    tenants.sort_unstable();
    assert_eq!(tenants, ["acme", "acme", "globex", "t1", "t1", "t2"]);

    let stats = server.admin_get("/v1/stats").json();
    let ids: Vec<&str> = stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["acme", "globex", "t1", "t2"]);
    server.stop();

    // Auto tenants persist with their ordinals, and still count against the cap.
    let before = Store::open_existing(&data)
        .unwrap()
        .tenant_ordinal("t1")
        .unwrap();
    let server = Server::start(dir.path(), &config);
    assert_eq!(server.post("/hooks/open/t1", &auth, b"{}").status, 202);
    assert_eq!(server.post("/hooks/open/t9", &auth, b"{}").status, 403);
    server.stop();
    let store = Store::open_existing(&data).unwrap();
    assert_eq!(store.tenant_ordinal("t1").unwrap(), before);
    assert_eq!(store.tenant_ordinal("t9").unwrap(), None);
}

// ---------------------------------------------------------------------------------------
// Dedupe

fn dedupe_sources(url: &str) -> String {
    format!(
        "  - id: byjson
    tenant: acme
    dedupe: {{json: data.id}}
    sinks: [{{kind: http, url: '{url}'}}]
  - id: byheader
    tenant: acme
    dedupe: {{header: x-delivery}}
    sinks: [{{kind: http, url: '{url}'}}]
  - id: bybody
    tenant: acme
    dedupe: body
    sinks: [{{kind: http, url: '{url}'}}]
  - id: short
    tenant: acme
    dedupe: {{header: x-delivery}}
    dedupe_window_ms: 1000
    sinks: [{{kind: http, url: '{url}'}}]
"
    )
}

#[test]
fn a_repeat_answers_200_with_the_first_id_and_adds_nothing_in_every_key_form() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &yaml(&data, "", &dedupe_sources(&receiver.url("/in")), ""),
    );

    let first = server.post("/hooks/byjson", &[], br#"{"data":{"id":"evt_1"},"n":1}"#);
    assert_eq!(first.status, 202);
    // Another body with the same key is the same hook.
    let repeat = server.post("/hooks/byjson", &[], br#"{"n":2,"data":{"id":"evt_1"}}"#);
    assert_eq!(repeat.status, 200, "{repeat:?}");
    assert_eq!(repeat.json()["duplicate"], true);
    assert_eq!(repeat.json()["id"], first.json()["id"]);
    assert_eq!(repeat.json()["seq"], first.json()["seq"]);
    assert_eq!(first.json().get("duplicate"), None);
    // No key: taken, without dedupe.
    assert_eq!(
        server.post("/hooks/byjson", &[], br#"{"data":{}}"#).status,
        202
    );
    assert_eq!(
        server.post("/hooks/byjson", &[], br#"{"data":{}}"#).status,
        202
    );
    let not_json = server.post("/hooks/byjson", &[], b"a=1");
    assert_eq!(
        (not_json.status, not_json.json()["error"].as_str()),
        (400, Some("body_not_json"))
    );

    let header = |value: &str| [("x-delivery", value.to_owned())];
    let post_h = |source: &str, value: &str| {
        let headers = header(value);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        server.post(&format!("/hooks/{source}"), &headers, b"{}")
    };
    assert_eq!(post_h("byheader", "d-1").status, 202);
    assert_eq!(post_h("byheader", "d-1").status, 200);
    assert_eq!(post_h("byheader", "d-2").status, 202);
    // Keys are per source: the same key on another source is another hook.
    assert_eq!(post_h("short", "d-1").status, 202);

    assert_eq!(server.post("/hooks/bybody", &[], b"same bytes").status, 202);
    assert_eq!(server.post("/hooks/bybody", &[], b"same bytes").status, 200);
    assert_eq!(
        server.post("/hooks/bybody", &[], b"other bytes").status,
        202
    );

    // A 300-byte key is stored as its hash and still dedupes.
    let long = "L".repeat(300);
    assert_eq!(post_h("byheader", &long).status, 202);
    assert_eq!(post_h("byheader", &long).status, 200);

    // The window: after it, the key is new again.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(post_h("short", "d-1").status, 202);
    assert_eq!(post_h("short", "d-1").status, 200);

    // 202s: byjson 3, byheader 3, short 2, bybody 2 = 10 hooks delivered, once each.
    let received = receiver.wait_for_hooks(10, WAIT);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.received().len(), 10, "{received:?}");
    let metrics = server.admin_get("/metrics").body;
    assert_eq!(
        metric(&metrics, "ankusa_ingest_dedupe_key_missing_total"),
        Some(2.0)
    );
    server.stop();

    // Repeats: byjson evt_1, byheader d-1, bybody, the long key, short d-1 in its window.
    assert_eq!(counter(&data, Some("acme"), Counter::DedupedTotal), 5);
    assert_eq!(counter(&data, None, Counter::DedupedTotal), 5);
    assert_eq!(counter(&data, Some("acme"), Counter::IngestedTotal), 10);
    let store = Store::open_existing(&data).unwrap();
    let mut stored_keys = Vec::new();
    let (start, end) = keys::family_range_all(Tag::Dedupe);
    store
        .scan(CF_INDEX, &start, Some(&end), |key, _| {
            if let Ok(IndexKey::Dedupe {
                dedupe_key,
                source_id,
                ..
            }) = keys::parse_index(key)
            {
                stored_keys.push((
                    String::from_utf8_lossy(source_id).into_owned(),
                    String::from_utf8_lossy(dedupe_key).into_owned(),
                ));
            }
            Ok(true)
        })
        .unwrap();
    assert!(stored_keys.contains(&("byjson".into(), "evt_1".into())));
    assert!(!stored_keys.iter().any(|(_, key)| key.contains("LLLL")));
    assert!(stored_keys.iter().any(|(source, key)| source == "byheader"
        && key.starts_with("sha256:")
        && key.len() == 71));
    drop(store);
    assert!(store_verify(&data).0);
}

#[test]
fn concurrent_duplicates_on_many_connections_make_one_hook() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &yaml(&data, "", &dedupe_sources(&receiver.url("/in")), ""),
    );
    for round in 0..20 {
        let body = format!(r#"{{"data":{{"id":"race-{round}"}}}}"#);
        let mut streams: Vec<_> = (0..8).map(|_| server.connect()).collect();
        // Every request is on the wire before any answer is read.
        for stream in &mut streams {
            send_post(stream, "/hooks/byjson", &[], body.as_bytes(), false);
        }
        let responses: Vec<Response> = streams
            .iter_mut()
            .map(|stream| read_response(stream).unwrap())
            .collect();
        let created = responses.iter().filter(|r| r.status == 202).count();
        assert_eq!(created, 1, "round {round}: {responses:?}");
        let seqs: std::collections::HashSet<String> = responses
            .iter()
            .map(|r| r.json()["seq"].to_string())
            .collect();
        assert_eq!(
            seqs.len(),
            1,
            "round {round}: every answer names the one hook"
        );
    }
    receiver.wait_for_hooks(20, WAIT);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(receiver.received().len(), 20);
    server.stop();
    assert_eq!(counter(&data, Some("acme"), Counter::DedupedTotal), 20 * 7);
}

#[test]
fn expired_dedupe_entries_leave_the_store_at_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(
        dir.path(),
        &yaml(&data, "", &dedupe_sources("http://127.0.0.1:9/dead"), ""),
    );
    for key in ["a", "b", "c"] {
        assert_eq!(
            server
                .post("/hooks/short", &[("x-delivery", key)], b"{}")
                .status,
            202
        );
    }
    assert_eq!(
        server
            .post("/hooks/byheader", &[("x-delivery", "kept")], b"{}")
            .status,
        202
    );
    server.stop();
    std::thread::sleep(Duration::from_millis(1100));
    let store = Store::open_existing(&data).unwrap();
    let dedupe_keys = |store: &Store| {
        let (start, end) = keys::family_range_all(Tag::Dedupe);
        let mut count = 0;
        store
            .scan(CF_INDEX, &start, Some(&end), |_, _| {
                count += 1;
                Ok(true)
            })
            .unwrap();
        count
    };
    assert_eq!(dedupe_keys(&store), 4);
    store.flush().unwrap();
    store.compact_index();
    assert_eq!(dedupe_keys(&store), 1, "only the unexpired entry stays");
}

// ---------------------------------------------------------------------------------------
// store_headers

#[test]
fn a_dropped_header_never_reaches_the_disk_and_a_hashed_one_only_as_its_keyed_hash() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let sources = format!(
        "  - id: s
    tenant: acme
    store_headers: {{drop: [x-secret, authorization], hash: [x-token]}}
    sinks: [{{kind: http, url: '{}', forward_headers: [x-token, x-kept, x-secret]}}]
",
        receiver.url("/in")
    );
    let server = Server::start(dir.path(), &yaml(&data, "", &sources, ""));
    let dropped = "DROPPED-5ecret-value-8c1f";
    let hashed = "HASHED-t0ken-value-77ab";
    let response = server.post(
        "/hooks/s",
        &[
            ("x-secret", dropped),
            ("authorization", "Bearer AUTH-VALUE-91"),
            ("x-token", hashed),
            ("x-kept", "KEPT-VALUE-42"),
        ],
        b"{\"body\":\"BODY-VALUE-13\"}",
    );
    assert_eq!(response.status, 202);
    let delivered = receiver.wait_for_hooks(1, WAIT).remove(0);
    assert_eq!(delivered.header("x-secret"), None);
    assert_eq!(delivered.header("x-kept"), Some("KEPT-VALUE-42"));
    let token = delivered.header("x-token").unwrap();
    assert!(
        token.starts_with("hmac-sha256:") && token.len() == 12 + 64,
        "{token}"
    );
    server.stop();

    // The WAL holds every committed record raw, so a search of the files sees the stored
    // bytes; the kept values prove the search reads them at all.
    let raw = all_bytes(&data);
    assert!(contains(&raw, "KEPT-VALUE-42"));
    assert!(contains(&raw, "BODY-VALUE-13"));
    assert!(contains(&raw, &token["hmac-sha256:".len()..]));
    for secret in [dropped, "AUTH-VALUE-91", hashed] {
        assert!(!contains(&raw, secret), "{secret} is in the data directory");
    }

    // After a flush and a full compaction the table files hold compressed blocks, so the
    // values are read back through the store as well as searched raw.
    let store = Store::open_existing(&data).unwrap();
    store.flush().unwrap();
    store.compact_all();
    let mut values = Vec::new();
    for cf in [CF_META, CF_HOOKS, CF_DELIVERIES, CF_INDEX, CF_ARCHIVE] {
        store
            .scan(cf, &[], None, |key, value| {
                values.extend_from_slice(key);
                values.extend_from_slice(value);
                Ok(true)
            })
            .unwrap();
    }
    drop(store);
    assert!(contains(&values, "KEPT-VALUE-42"));
    let raw = all_bytes(&data);
    for secret in [dropped, "AUTH-VALUE-91", hashed] {
        assert!(!contains(&values, secret), "{secret} is stored");
        assert!(!contains(&raw, secret), "{secret} is in the data directory");
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// Every byte of every file under `dir`.
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(all_bytes(&path));
        } else {
            out.extend(std::fs::read(&path).unwrap());
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Quarantine

#[test]
fn quarantined_hooks_are_listed_shown_released_into_delivery_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let sources = format!(
        "  - id: q
    tenant: acme
    quarantine: true
    verify: {{scheme: token, token: good, header: x-token}}
    dedupe: {{json: id}}
    store_headers: {{drop: [x-token]}}
    sinks: [{{kind: http, url: '{}'}}]
",
        receiver.url("/in")
    );
    let config = yaml(&data, ", max_quarantined: 4", &sources, "");
    let server = Server::start(dir.path(), &config);

    // Refused as ever, and kept.
    let bad = server.post("/hooks/q", &[("x-token", "wrong")], br#"{"id":"e1","v":1}"#);
    assert_eq!(bad.status, 401);
    let not_json = server.post("/hooks/q", &[("x-token", "good")], b"not json");
    assert_eq!(not_json.status, 400);
    // The same event later arrives properly signed...
    let good = server.post("/hooks/q", &[("x-token", "good")], br#"{"id":"e2"}"#);
    assert_eq!(good.status, 202);
    // ...and a forged copy of it is quarantined too.
    assert_eq!(
        server
            .post("/hooks/q", &[("x-token", "nope")], br#"{"id":"e2"}"#)
            .status,
        401
    );

    let page = server
        .admin_get("/v1/quarantine?tenant=acme&limit=2")
        .json();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert!(items[0]["reason"]
        .as_str()
        .unwrap()
        .starts_with("signature_invalid: "));
    assert!(items[1]["reason"]
        .as_str()
        .unwrap()
        .starts_with("body_not_json: "));
    assert_eq!(items[0]["source"], "q");
    let next = page["next"].as_u64().unwrap();
    let rest = server
        .admin_get(&format!("/v1/quarantine?tenant=acme&after={next}"))
        .json();
    assert_eq!(rest["items"].as_array().unwrap().len(), 1);
    assert_eq!(rest["next"], serde_json::Value::Null);
    let seqs: Vec<u64> = items
        .iter()
        .chain(rest["items"].as_array().unwrap())
        .map(|item| item["seq"].as_u64().unwrap())
        .collect();

    let shown = server
        .admin_get(&format!("/v1/quarantine/hook?tenant=acme&seq={}", seqs[0]))
        .json();
    assert_eq!(shown["body"], r#"{"id":"e1","v":1}"#);
    let header_names: Vec<&str> = shown["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| pair[0].as_str().unwrap())
        .collect();
    assert!(header_names.contains(&"content-type"));
    assert!(
        !header_names.contains(&"x-token"),
        "the policy applies to quarantine too"
    );

    // Release: a new hook, delivered; the quarantine entry is gone.
    let released = server.admin_post(
        "/v1/quarantine/release",
        &format!(r#"{{"tenant":"acme","seq":{}}}"#, seqs[0]),
    );
    assert_eq!(released.status, 200, "{released:?}");
    let new_seq = released.json()["new_seq"].as_u64().unwrap();
    let delivered = receiver.wait_for(WAIT, |all| all.iter().any(|r| r.seq() == new_seq));
    let hook = delivered.iter().find(|r| r.seq() == new_seq).unwrap();
    assert_eq!(hook.body, br#"{"id":"e1","v":1}"#);

    // A body that is not JSON cannot be keyed: it cannot be released, only deleted.
    let refused = server.admin_post(
        "/v1/quarantine/release",
        &format!(r#"{{"tenant":"acme","seq":{}}}"#, seqs[1]),
    );
    assert_eq!(
        (refused.status, refused.json()["error"].as_str()),
        (409, Some("body_not_json"))
    );
    let deleted = server.admin_post(
        "/v1/quarantine/delete",
        &format!(r#"{{"tenant":"acme","seq":{}}}"#, seqs[1]),
    );
    assert_eq!(deleted.status, 200);

    // The forged copy repeats a stored hook: releasing it adds nothing.
    let repeat = server.admin_post(
        "/v1/quarantine/release",
        &format!(r#"{{"tenant":"acme","seq":{}}}"#, seqs[2]),
    );
    assert_eq!(repeat.status, 200);
    assert_eq!(repeat.json()["new_seq"], serde_json::Value::Null);
    assert_eq!(repeat.json()["duplicate_of"], good.json()["seq"]);

    let gone = server.admin_post(
        "/v1/quarantine/delete",
        &format!(r#"{{"tenant":"acme","seq":{}}}"#, seqs[1]),
    );
    assert_eq!(
        (gone.status, gone.json()["error"].as_str()),
        (404, Some("not_quarantined"))
    );
    let empty = server.admin_get("/v1/quarantine?tenant=acme").json();
    assert_eq!(empty["items"].as_array().unwrap().len(), 0);

    // The bound: at most 4 kept; refusals past it are still answered, not kept.
    for index in 0..6 {
        let body = format!(r#"{{"id":"x{index}"}}"#);
        assert_eq!(
            server
                .post("/hooks/q", &[("x-token", "bad")], body.as_bytes())
                .status,
            401
        );
    }
    let tenant = server.admin_get("/v1/tenants/acme").json();
    assert_eq!(tenant["counters"]["quarantined"], 4);
    assert_eq!(tenant["max_quarantined"], 4);
    let metrics = server.admin_get("/metrics").body;
    assert!(
        metrics.contains(r#"ankusa_quarantine_refused_total{reason="full"} 2"#),
        "{metrics}"
    );
    receiver.wait_for_hooks(2, WAIT);
    server.stop();
    assert_eq!(counter(&data, None, Counter::Quarantined), 4);
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

#[test]
fn the_tenant_list_names_every_tenant_with_its_bounds_and_counters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sources = "  - id: a
    tenant: acme
    sinks: [{kind: http, url: 'http://127.0.0.1:9/dead'}]
";
    let server = Server::start(
        dir.path(),
        &yaml(
            &data,
            ", max_pending: 50",
            sources,
            "tenant_defaults: {max_bytes: 2MiB}",
        ),
    );
    assert_eq!(server.post("/hooks/a", &[], b"{}").status, 202);
    let list = server.admin_get("/v1/tenants").json();
    let tenants = list["tenants"].as_array().unwrap();
    assert_eq!(tenants.len(), 2);
    assert_eq!(tenants[0]["id"], "acme");
    assert_eq!(tenants[0]["declared"], true);
    assert_eq!(tenants[0]["max_pending"], 50);
    assert_eq!(tenants[0]["max_bytes"], 2 << 20);
    assert_eq!(tenants[0]["counters"]["pending"], 1);
    assert_eq!(tenants[1]["id"], "globex");
    assert_eq!(tenants[1]["max_pending"], 1_000_000);
    let missing = server.admin_get("/v1/tenants/nobody");
    assert_eq!(missing.status, 404);
    server.stop();
}

// ---------------------------------------------------------------------------------------
// Purge

/// Whether any key of any column family belongs to `ordinal`.
fn keys_of_ordinal(store: &Store, ordinal: u32) -> Vec<String> {
    let mut found = Vec::new();
    let prefix = ordinal.to_be_bytes();
    for cf in [CF_HOOKS, CF_DELIVERIES, CF_ARCHIVE] {
        store
            .scan(cf, &[], None, |key, _| {
                if key.starts_with(&prefix) {
                    found.push(format!("{cf}/{}", hex(key)));
                }
                Ok(true)
            })
            .unwrap();
    }
    store
        .scan(CF_INDEX, &[], None, |key, _| {
            if key.len() >= 5 && key[1..5] == prefix {
                found.push(format!("index/{}", hex(key)));
            }
            Ok(true)
        })
        .unwrap();
    found
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_purge_erases_every_key_of_the_ordinal_moves_the_node_counters_and_never_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let receiver = Receiver::scripted(|received, _| {
        if received.path == "/dead" {
            Reply::status(400)
        } else {
            Reply::status(200)
        }
    });
    let slow = Receiver::start();
    let sources = format!(
        "  - id: a
    tenant: acme
    quarantine: true
    verify: {{scheme: token, token: ok, header: x-token}}
    dedupe: {{json: id}}
    sinks:
      - {{kind: http, id: ok, url: '{ok}'}}
      - {{kind: http, id: dead, url: '{dead}'}}
  - id: held
    tenant: acme
    sinks: [{{kind: http, url: '{held}'}}]
  - id: g
    tenant: globex
    sinks: [{{kind: http, url: '{ok}'}}]
  - id: open
    tenant_from: path
    auto_tenants: true
    sinks: [{{kind: http, url: '{ok}'}}]
",
        ok = receiver.url("/ok"),
        dead = receiver.url("/dead"),
        held = slow.url("/held"),
    );
    let config = yaml(&data, "", &sources, "");
    let server = Server::start(dir.path(), &config);
    let signed = [("x-token", "ok")];
    for index in 0..3 {
        let body = format!(r#"{{"id":"evt_{index}"}}"#);
        assert_eq!(
            server.post("/hooks/a", &signed, body.as_bytes()).status,
            202
        );
        assert_eq!(server.post("/hooks/g", &[], body.as_bytes()).status, 202);
    }
    assert_eq!(
        server
            .post("/hooks/a", &[("x-token", "forged")], b"{}")
            .status,
        401
    );
    assert_eq!(server.post("/hooks/open/t1", &[], b"{}").status, 202);
    // Every acme and globex hook is delivered or dead-lettered, then two attempts hang.
    receiver.wait_for(WAIT, |all| all.len() >= 10);
    slow.hold();
    for _ in 0..2 {
        assert_eq!(server.post("/hooks/held", &[], b"{}").status, 202);
    }
    slow.wait_for(WAIT, |all| all.len() >= 2);
    let before = server.admin_get("/v1/tenants/acme").json();
    let old_ordinal = before["ordinal"].as_u64().unwrap() as u32;
    assert_eq!(before["counters"]["dead"], 3);
    assert_eq!(before["counters"]["quarantined"], 1);
    assert_eq!(before["counters"]["inflight"], 2);

    let purged = server.admin_post("/v1/tenants/purge", r#"{"tenant":"acme"}"#);
    assert_eq!(purged.status, 200, "{purged:?}");
    let purged = purged.json();
    assert_eq!(purged["ordinal"], old_ordinal);
    let new_ordinal = purged["new_ordinal"].as_u64().unwrap() as u32;
    assert!(new_ordinal > old_ordinal);
    assert_eq!(purged["counters"]["pending"], 2);
    assert_eq!(purged["counters"]["ingested_total"], 5);

    // The hung attempts end after the purge: their outcomes are dropped.
    slow.release();
    std::thread::sleep(Duration::from_millis(500));
    let node = server.admin_get("/v1/stats").json()["node"].clone();
    assert_eq!(node["inflight"], 0);
    assert_eq!(node["dead"], 0);
    assert_eq!(node["quarantined"], 0);
    assert_eq!(
        node["ingested_total"],
        3 + 1,
        "globex's and t1's hooks remain"
    );

    // acme is served on, from nothing: an old event id is new again.
    let again = server.post("/hooks/a", &signed, br#"{"id":"evt_0"}"#);
    assert_eq!(again.status, 202, "{again:?}");
    assert_eq!(
        server.admin_get("/v1/tenants/acme").json()["ordinal"],
        new_ordinal
    );

    // An auto tenant is gone after its purge; its next hook creates it anew.
    let t1 = server
        .admin_post("/v1/tenants/purge", r#"{"tenant":"t1"}"#)
        .json();
    assert_eq!(t1["new_ordinal"], serde_json::Value::Null);
    assert_eq!(server.admin_get("/v1/tenants/t1").status, 404);
    assert_eq!(server.post("/hooks/open/t1", &[], b"{}").status, 202);
    let t1_again = server.admin_get("/v1/tenants/t1").json()["ordinal"]
        .as_u64()
        .unwrap();
    assert!(t1_again > u64::from(new_ordinal));
    assert_eq!(
        server
            .admin_post("/v1/tenants/purge", r#"{"tenant":"nobody"}"#)
            .status,
        404
    );
    receiver.wait_for(WAIT, |all| {
        all.iter()
            .filter(|r| r.header("x-ankusa-tenant") == Some("acme"))
            .count()
            >= 7
    });
    server.stop();

    let store = Store::open_existing(&data).unwrap();
    assert_eq!(keys_of_ordinal(&store, old_ordinal), Vec::<String>::new());
    drop(store);
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

// ---------------------------------------------------------------------------------------
// Verbs

fn ankusa(args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .env_remove("ANKUSA_ADMIN_TOKEN")
        .output()
        .unwrap()
}

#[test]
fn the_quarantine_and_tenants_verbs_call_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let data = dir.path().join("data");
    let sources = format!(
        "  - id: q
    tenant: acme
    quarantine: true
    verify: {{scheme: token, token: good, header: x-token}}
    sinks: [{{kind: http, url: '{}'}}]
",
        receiver.url("/in")
    );
    let server = Server::start(dir.path(), &yaml(&data, "", &sources, ""));
    assert_eq!(
        server
            .post("/hooks/q", &[("x-token", "bad")], b"{\"a\":1}")
            .status,
        401
    );
    let admin_url = format!("http://{}", server.admin);
    let admin = ["--admin", admin_url.as_str()];
    let text = |output: &std::process::Output| String::from_utf8_lossy(&output.stdout).into_owned();

    let listed = ankusa(&[&["quarantine", "list", "--tenant", "acme"][..], &admin].concat());
    assert!(listed.status.success(), "{listed:?}");
    let listed = text(&listed);
    let first = listed.lines().next().unwrap();
    assert!(
        first.starts_with("acme seq=") && first.contains("source=q"),
        "{listed}"
    );
    assert!(first.contains("reason=signature_invalid: "), "{listed}");
    assert!(
        listed.contains("next: none (1 hooks; end of the quarantine)"),
        "{listed}"
    );
    let seq = first["acme seq=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .to_owned();

    let shown = ankusa(
        &[
            &["quarantine", "show", "--tenant", "acme", "--seq", &seq][..],
            &admin,
        ]
        .concat(),
    );
    let shown: serde_json::Value = serde_json::from_str(&text(&shown)).unwrap();
    assert_eq!(shown["body"], "{\"a\":1}");
    let released = ankusa(
        &[
            &["quarantine", "release", "--tenant", "acme", "--seq", &seq][..],
            &admin,
        ]
        .concat(),
    );
    assert!(released.status.success(), "{released:?}");
    receiver.wait_for_hooks(1, WAIT);
    let again = ankusa(
        &[
            &["quarantine", "delete", "--tenant", "acme", "--seq", &seq][..],
            &admin,
        ]
        .concat(),
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("404 not_quarantined"),
        "{again:?}"
    );

    let tenants = ankusa(&[&["tenants", "list"][..], &admin].concat());
    let tenants: serde_json::Value = serde_json::from_str(&text(&tenants)).unwrap();
    assert_eq!(tenants["tenants"].as_array().unwrap().len(), 2);
    let stats = ankusa(&[&["tenants", "stats", "acme"][..], &admin].concat());
    let stats: serde_json::Value = serde_json::from_str(&text(&stats)).unwrap();
    assert_eq!(stats["counters"]["ingested_total"], 1);

    let unconfirmed = ankusa(&[&["tenants", "purge", "acme"][..], &admin].concat());
    assert_eq!(unconfirmed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("add --yes"));
    assert_eq!(
        server.admin_get("/v1/tenants/acme").json()["counters"]["ingested_total"],
        1
    );
    let purged = ankusa(&[&["tenants", "purge", "acme", "--yes"][..], &admin].concat());
    assert!(purged.status.success(), "{purged:?}");
    let purged: serde_json::Value = serde_json::from_str(&text(&purged)).unwrap();
    assert_eq!(purged["counters"]["ingested_total"], 1);
    assert_eq!(
        server.admin_get("/v1/tenants/acme").json()["counters"]["ingested_total"],
        0
    );
    server.stop();
}
