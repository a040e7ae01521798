//! The admin API (`/v1/`) and the `ankusa` verbs that use it, against the real binary and a
//! real HTTP receiver: the DLQ listed page by page, revived and delivered, purged with the
//! hooks it leaves without rows; archived hooks replayed as new hooks; stats; the bearer
//! token. Faults injected: a receiver that refuses every hook with 400 and is then fixed;
//! a source removed from the config between two runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ankusa::store::keys::Counter;
use ankusa::store::Store;
use common::receiver::{Receiver, Reply};
use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// `demo` (one sink, id `http`) and `fanout` (sinks `a` and `b`), both of tenant acme.
fn sources(receiver: &Receiver) -> String {
    format!(
        "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, url: '{}'}}
  - id: fanout
    tenant: acme
    sinks:
      - {{id: a, kind: http, url: '{}'}}
      - {{id: b, kind: http, url: '{}'}}
",
        receiver.url("/in"),
        receiver.url("/a"),
        receiver.url("/b"),
    )
}

/// Posts `count` hooks on one connection; returns their seqs.
fn post_hooks(
    server: &Server,
    path: &str,
    count: usize,
    body: impl Fn(usize) -> String,
) -> Vec<u64> {
    let mut stream = server.connect();
    (0..count)
        .map(|index| {
            send_post(&mut stream, path, &[], body(index).as_bytes(), false);
            let response = read_response(&mut stream).unwrap();
            assert_eq!(response.status, 202, "{response:?}");
            response.json()["seq"].as_u64().unwrap()
        })
        .collect()
}

/// Polls `/v1/stats` until tenant acme's counters satisfy `done`; returns them.
fn wait_acme(server: &Server, headers: &[(&str, &str)], done: impl Fn(&Value) -> bool) -> Value {
    wait_tenant(server, headers, "acme", WAIT, done)
}

fn dlq_page(server: &Server, query: &str) -> (Vec<Value>, Option<String>) {
    let page = server.admin_json(&format!("/v1/dlq?{query}"));
    let next = page["next"].as_str().map(str::to_owned);
    (page["items"].as_array().unwrap().clone(), next)
}

fn assert_status(response: &Response, status: u16, code: &str) {
    assert_eq!(response.status, status, "{response:?}");
    assert_eq!(response.json()["error"], code, "{response:?}");
}

#[test]
fn dead_rows_are_listed_page_by_page_then_revived_and_delivered() {
    let receiver = Receiver::scripted(|_, _| Reply::status(400).with_body("bad payload"));
    let (_dir, data, server) = start_in_temp_dir("", Some(&sources(&receiver)));
    let seqs = post_hooks(&server, "/hooks/demo", 5, |n| format!(r#"{{"n":{n}}}"#));
    wait_acme(&server, &[], |acme| {
        acme["dead"] == 5 && acme["pending"] == 0
    });

    // Pages of two: 2, 2, 1, and the last one says there is nothing after it.
    let mut listed = Vec::new();
    let mut sizes = Vec::new();
    let mut after = String::new();
    loop {
        let (items, next) = dlq_page(&server, &format!("tenant=acme&limit=2&after={after}"));
        sizes.push(items.len());
        listed.extend(items);
        match next {
            Some(next) => after = next,
            None => break,
        }
        assert!(sizes.len() < 10, "paging does not end: {sizes:?}");
    }
    assert_eq!(sizes, vec![2, 2, 1]);
    let listed_seqs: Vec<u64> = listed
        .iter()
        .map(|item| item["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(listed_seqs, seqs, "every dead row once, in seq order");
    for item in &listed {
        assert_eq!(item["tenant"], "acme");
        assert_eq!(item["source"], "demo");
        assert_eq!(item["sink"], "http");
        assert_eq!(item["attempts"], 1);
        assert_eq!(item["reason"], "http 400: bad payload", "{item}");
        assert_eq!(item["last_error"], "http 400: bad payload");
        assert!(item["received_at_ms"].as_u64().unwrap() > 0);
    }
    // Filters read the row and the hook.
    assert_eq!(dlq_page(&server, "tenant=acme&sink=http").0.len(), 5);
    assert_eq!(
        dlq_page(&server, "tenant=acme&source=demo&sink=http")
            .0
            .len(),
        5
    );
    assert_eq!(
        dlq_page(&server, "tenant=acme&source=fanout"),
        (vec![], None)
    );
    assert_eq!(dlq_page(&server, "tenant=acme&sink=b"), (vec![], None));
    assert_eq!(dlq_page(&server, "tenant=globex"), (vec![], None));

    // Refusals, each with its status and a JSON error.
    assert_status(&server.admin_get("/v1/dlq"), 400, "bad_request");
    assert_status(
        &server.admin_get("/v1/dlq?tenant=acme&limit=5000"),
        400,
        "bad_request",
    );
    assert_status(
        &server.admin_get("/v1/dlq?tenant=acme&after=x"),
        400,
        "bad_request",
    );
    assert_status(
        &server.admin_get("/v1/dlq?tenant=nobody"),
        404,
        "unknown_tenant",
    );
    assert_status(&server.admin_get("/v1/nothing"), 404, "not_found");
    assert_status(
        &server.admin_post("/v1/dlq", "{}"),
        405,
        "method_not_allowed",
    );
    assert_status(
        &server.admin_get("/v1/dlq/revive"),
        405,
        "method_not_allowed",
    );
    assert_status(
        &server.admin_post("/v1/dlq/revive", "{"),
        400,
        "bad_request",
    );
    assert_status(
        &server.admin_post("/v1/dlq/revive", r#"{"tenant":"acme","seq":1}"#),
        400,
        "bad_request",
    );
    assert_status(
        &server.admin_post("/v1/dlq/revive", r#"{"tenant":"nobody"}"#),
        404,
        "unknown_tenant",
    );
    assert_status(
        &server.admin_request("POST", "/v1/dlq/revive", &[], None),
        411,
        "length_required",
    );
    // Over 64 KiB: refused from the head, before a byte of the body is read.
    let mut stream = std::net::TcpStream::connect(server.admin).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    std::io::Write::write_all(
        &mut stream,
        b"POST /v1/dlq/revive HTTP/1.1\r\nhost: test\r\ncontent-length: 70000\r\n\r\n",
    )
    .unwrap();
    assert_status(
        &read_response(&mut stream).unwrap(),
        413,
        "payload_too_large",
    );

    // The destination is fixed; a revive by source makes every row a new first attempt.
    receiver.set_script(|_, _| Reply::status(200));
    let revived = server.admin_post("/v1/dlq/revive", r#"{"tenant":"acme","source":"demo"}"#);
    assert_eq!(revived.status, 200, "{revived:?}");
    assert_eq!(revived.json()["revived"], 5);
    // Nothing is dead any more, so a second revive counts nothing.
    let again = server.admin_post("/v1/dlq/revive", r#"{"tenant":"acme","source":"demo"}"#);
    assert_eq!(again.json()["revived"], 0, "{again:?}");

    let received = receiver.wait_for(WAIT, |received| received.len() >= 10);
    let acme = wait_acme(&server, &[], |acme| {
        acme["delivered_total"] == 5 && acme["pending"] == 0
    });
    assert_eq!(acme["dead"], 0);
    assert_eq!(acme["dead_lettered_total"], 5);
    assert_eq!(acme["ingested_total"], 5);
    assert_eq!(acme["inflight"], 0);
    assert_eq!(
        received.len(),
        10,
        "one refused attempt and one delivery per hook"
    );
    for request in &received[5..] {
        assert_eq!(request.attempt(), 1, "a revived row starts over");
        assert!(seqs.contains(&request.seq()));
    }
    assert_eq!(dlq_page(&server, "tenant=acme"), (vec![], None));

    server.stop_and_verify();
    let store = Store::open_existing(&data).unwrap();
    assert_eq!(store.counter(0, Counter::Dead).unwrap(), 0);
    assert_eq!(store.counter(0, Counter::DeliveredTotal).unwrap(), 5);
}

#[test]
fn purge_removes_dead_rows_and_the_hooks_they_leave_without_rows() {
    // Sink `a` takes everything; the others refuse.
    let receiver = Receiver::scripted(|request, _| {
        if request.path == "/a" {
            Reply::status(200)
        } else {
            Reply::status(400).with_body("nope")
        }
    });
    let (_dir, data, server) = start_in_temp_dir("", Some(&sources(&receiver)));
    let demo = post_hooks(&server, "/hooks/demo", 3, |n| format!(r#"{{"n":{n}}}"#));
    let fanout = post_hooks(&server, "/hooks/fanout", 2, |n| format!(r#"{{"f":{n}}}"#));
    wait_acme(&server, &[], |acme| {
        acme["dead"] == 5 && acme["pending"] == 0 && acme["delivered_total"] == 2
    });
    let (items, _) = dlq_page(&server, "tenant=acme&source=fanout");
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|item| item["sink"] == "b"));

    // One row.
    let one = format!(r#"{{"tenant":"acme","seq":{},"sink":"http"}}"#, demo[0]);
    let purged = server.admin_post("/v1/dlq/purge", &one);
    assert_eq!(purged.status, 200, "{purged:?}");
    assert_eq!(purged.json()["purged"], 1);
    assert_eq!(purged.json()["hooks_deleted"], 1);
    assert_eq!(server.admin_post("/v1/dlq/purge", &one).json()["purged"], 0);
    // A source's rows: their other row was delivered, so the hooks go too.
    let purged = server.admin_post("/v1/dlq/purge", r#"{"tenant":"acme","source":"fanout"}"#);
    assert_eq!(purged.json()["purged"], 2, "{purged:?}");
    assert_eq!(purged.json()["hooks_deleted"], 2);
    assert_eq!(wait_acme(&server, &[], |_| true)["dead"], 2);
    // Everything else.
    let purged = server.admin_post("/v1/dlq/purge", r#"{"all":true}"#);
    assert_eq!(purged.json()["purged"], 2, "{purged:?}");
    let acme = wait_acme(&server, &[], |_| true);
    assert_eq!(acme["dead"], 0);
    assert_eq!(acme["pending"], 0);
    assert_eq!(dlq_page(&server, "tenant=acme"), (vec![], None));

    server.stop_and_verify();
    let store = Store::open_existing(&data).unwrap();
    let acme = store.tenant_ordinal("acme").unwrap().unwrap();
    for seq in demo.iter().chain(&fanout) {
        assert!(
            ankusa::store::deliveries::read_hook(&store, acme, *seq)
                .unwrap()
                .is_none(),
            "hook {seq} is still stored"
        );
        assert!(ankusa::store::deliveries::rows_of_hook(&store, acme, *seq)
            .unwrap()
            .is_empty());
    }
    assert_eq!(store.counter(0, Counter::Dead).unwrap(), 0);
}

#[test]
fn archive_replay_ingests_archived_hooks_again_as_new_seqs() {
    let receiver = Receiver::start();
    let (dir, data, server) = start_in_temp_dir("", Some(&sources(&receiver)));
    let early = post_hooks(&server, "/hooks/demo", 3, |n| format!(r#"{{"early":{n}}}"#));
    let boundary_ms = now_ms() + 1;
    std::thread::sleep(Duration::from_millis(30));
    post_hooks(&server, "/hooks/demo", 2, |n| format!(r#"{{"late":{n}}}"#));
    post_hooks(&server, "/hooks/fanout", 1, |_| r#"{"fanout":0}"#.into());
    // Five demo hooks and one fanout hook for two sinks, all delivered and archived.
    receiver.wait_for_hooks(7, WAIT);
    wait_acme(&server, &[], |acme| {
        acme["delivered_total"] == 7 && acme["pending"] == 0
    });
    let last_seq = *early.iter().max().unwrap() + 3;

    let request =
        format!(r#"{{"tenant":"acme","source":"demo","from_ms":0,"to_ms":{boundary_ms}}}"#);
    let replayed = server.admin_post("/v1/archive/replay", &request);
    assert_eq!(replayed.status, 200, "{replayed:?}");
    assert_eq!(replayed.json()["replayed"], 3);
    assert_eq!(replayed.json()["skipped"], 0);

    let received = receiver.wait_for_hooks(10, WAIT);
    let mut replays: Vec<_> = received.iter().filter(|r| r.seq() > last_seq).collect();
    replays.sort_by_key(|r| r.seq());
    assert_eq!(replays.len(), 3, "each replayed hook delivered once");
    let bodies: Vec<String> = replays
        .iter()
        .map(|r| String::from_utf8(r.body.clone()).unwrap())
        .collect();
    let expected: Vec<String> = (0..3).map(|n| format!(r#"{{"early":{n}}}"#)).collect();
    assert_eq!(bodies, expected, "the same bodies, in their order");
    for request in &replays {
        assert_eq!(request.header("x-ankusa-source"), Some("demo"));
        assert_eq!(request.path, "/in");
        assert_eq!(request.attempt(), 1);
    }
    wait_acme(&server, &[], |acme| {
        acme["delivered_total"] == 10 && acme["pending"] == 0 && acme["ingested_total"] == 9
    });

    assert_status(
        &server.admin_post(
            "/v1/archive/replay",
            r#"{"tenant":"nobody","source":"demo","from_ms":0,"to_ms":1}"#,
        ),
        404,
        "unknown_tenant",
    );
    assert_status(
        &server.admin_post(
            "/v1/archive/replay",
            r#"{"tenant":"acme","source":"demo","from_ms":2,"to_ms":1}"#,
        ),
        400,
        "bad_request",
    );
    server.stop_and_verify();

    // The next run has no `demo` source: its archived hooks cannot take the ingest path.
    let only_fanout = sources(&receiver)
        .split("  - id: fanout")
        .nth(1)
        .map(|rest| format!("\nsources:\n  - id: fanout{rest}"))
        .unwrap();
    let server = Server::start(dir.path(), &config_yaml(&data, "", Some(&only_fanout)));
    let everything = format!(r#""from_ms":0,"to_ms":{}"#, now_ms() + 3_600_000);
    let replayed = server.admin_post(
        "/v1/archive/replay",
        &format!(r#"{{"tenant":"acme","source":"demo",{everything}}}"#),
    );
    assert_eq!(replayed.status, 200, "{replayed:?}");
    assert_eq!(replayed.json()["replayed"], 0);
    assert_eq!(
        replayed.json()["skipped"],
        8,
        "5 hooks and 3 replays of demo"
    );
    let replayed = server.admin_post(
        "/v1/archive/replay",
        &format!(r#"{{"tenant":"acme","source":"fanout",{everything}}}"#),
    );
    assert_eq!(replayed.json()["replayed"], 1, "{replayed:?}");
    receiver.wait_for_hooks(12, WAIT);
    wait_acme(&server, &[], |acme| acme["pending"] == 0);
    server.stop_and_verify();
}

fn ankusa(args: &[&str], token_env: Option<&str>) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("ANKUSA_ADMIN_TOKEN");
    if let Some(token) = token_env {
        command.env("ANKUSA_ADMIN_TOKEN", token);
    }
    command.output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_token_guards_the_api_and_the_verbs_send_it() {
    let receiver = Receiver::scripted(|_, _| Reply::status(400).with_body("bad payload"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let yaml = with_admin_token(&config_yaml(&data, "", Some(&sources(&receiver))), "s3cret");
    let server = Server::start(dir.path(), &yaml);
    let bearer = [("authorization", "Bearer s3cret")];

    let response = server.admin_get("/v1/stats");
    assert_status(&response, 401, "unauthorized");
    assert_eq!(response.header("www-authenticate"), Some("Bearer"));
    let wrong = [("authorization", "Bearer s3crex")];
    assert_status(
        &server.admin_request("GET", "/v1/stats", &wrong, None),
        401,
        "unauthorized",
    );
    assert_status(
        &server.admin_post("/v1/dlq/revive", r#"{"all":true}"#),
        401,
        "unauthorized",
    );
    assert_status(&server.admin_get("/v1/nothing"), 401, "unauthorized");
    assert_eq!(
        server
            .admin_request("GET", "/v1/stats", &bearer, None)
            .status,
        200
    );
    // Probes and scrapers need no token.
    assert_eq!(server.admin_get("/healthz").status, 200);
    assert_eq!(server.admin_get("/readyz").status, 200);
    assert_eq!(server.admin_get("/metrics").status, 200);

    let seqs = post_hooks(&server, "/hooks/demo", 2, |n| format!(r#"{{"n":{n}}}"#));
    wait_acme(&server, &bearer, |acme| acme["dead"] == 2);
    let admin_url = format!("http://{}", server.admin);
    let admin = ["--admin", admin_url.as_str()];

    // Without the token the verb fails with the API's answer.
    let output = ankusa(
        &[&["dlq", "list", "--tenant", "acme"][..], &admin].concat(),
        None,
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("401 unauthorized"),
        "{}",
        stderr(&output)
    );

    // One row per page, the token from the environment.
    let list = |after: &str| {
        let mut args = vec!["dlq", "list", "--tenant", "acme", "--limit", "1"];
        if !after.is_empty() {
            args.extend(["--after", after]);
        }
        args.extend(admin);
        ankusa(&args, Some("s3cret"))
    };
    let output = list("");
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with(&format!(
            "acme seq={} source=demo sink=http attempts=1",
            seqs[0]
        )),
        "{text}"
    );
    assert!(lines[0].ends_with("reason=http 400: bad payload"), "{text}");
    let next = lines[1].strip_prefix("next: ").unwrap().to_owned();
    let output = list(&next);
    let text = stdout(&output);
    assert!(text.contains(&format!("seq={}", seqs[1])), "{text}");
    assert!(text.contains("next: none"), "{text}");

    // stats with --token.
    let output = ankusa(
        &[&["stats", "--token", "s3cret"][..], &admin].concat(),
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let stats: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(stats["node"]["dead"], 2, "{stats}");
    assert_eq!(stats["tenants"][0]["id"], "acme");
    assert_eq!(stats["tenants"][0]["dead"], 2);

    // Revive one row, then the rest by source (the receiver still refuses them).
    let seq = seqs[0].to_string();
    let output = ankusa(
        &[
            &[
                "dlq", "revive", "--tenant", "acme", "--seq", &seq, "--sink", "http",
            ][..],
            &admin,
        ]
        .concat(),
        Some("s3cret"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let answer: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(answer["revived"], 1, "{answer}");
    // The receiver refuses it again.
    receiver.wait_for(WAIT, |received| received.len() >= 3);
    wait_acme(&server, &bearer, |acme| {
        acme["dead"] == 2 && acme["pending"] == 0
    });
    let output = ankusa(
        &[
            &["dlq", "revive", "--tenant", "acme", "--source", "demo"][..],
            &admin,
        ]
        .concat(),
        Some("s3cret"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let answer: Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(answer["revived"], 2, "{answer}");
    receiver.wait_for(WAIT, |received| received.len() >= 5);
    wait_acme(&server, &bearer, |acme| {
        acme["dead"] == 2 && acme["pending"] == 0
    });

    // Archive replay and purge through the verbs.
    let output = ankusa(
        &[
            &[
                "archive", "replay", "--tenant", "acme", "--source", "demo", "--from", "0", "--to",
                "1",
            ][..],
            &admin,
        ]
        .concat(),
        Some("s3cret"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(r#""replayed":0"#),
        "{}",
        stdout(&output)
    );
    let output = ankusa(
        &[&["dlq", "purge", "--all"][..], &admin].concat(),
        Some("s3cret"),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(r#""purged":2"#),
        "{}",
        stdout(&output)
    );

    // Refusals: an unknown tenant is the API's 404; a bad selection is clap's.
    let output = ankusa(
        &[&["dlq", "list", "--tenant", "nobody"][..], &admin].concat(),
        Some("s3cret"),
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("404 unknown_tenant"),
        "{}",
        stderr(&output)
    );
    let output = ankusa(
        &[
            &["dlq", "revive", "--tenant", "acme", "--seq", "1"][..],
            &admin,
        ]
        .concat(),
        None,
    );
    assert_eq!(output.status.code(), Some(2), "--seq needs --sink");
    let output = ankusa(
        &[&["dlq", "purge", "--all", "--tenant", "acme"][..], &admin].concat(),
        None,
    );
    assert_eq!(output.status.code(), Some(2), "--all stands alone");
    let output = ankusa(&["dlq", "revive", "--help"], None);
    assert!(
        stdout(&output).contains("Examples:\n  ankusa dlq revive"),
        "{}",
        stdout(&output)
    );
    let output = ankusa(
        &[
            "dlq",
            "list",
            "--tenant",
            "acme",
            "--admin",
            "http://127.0.0.1:1",
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("cannot reach the admin API"),
        "{}",
        stderr(&output)
    );

    server.stop_and_verify();
}

/// `/v1/stats` until `done(stats)` holds; returns it.
fn wait_stats(server: &Server, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = server.admin_json("/v1/stats");
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "{what}: never; last {stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Breakers per tenant and node-wide. Tenant acme's only sink answers 503 until it is
/// fixed, so its breaker opens after two failures; globex's sink is healthy. `/v1/stats`
/// (and `/v1/tenants/{id}`) name acme's breaker by source and sink, none for globex, a node
/// total of 1 (the gauge agrees); once the receiver recovers and the probe closes the
/// breaker, no tenant and not the node shows one.
#[test]
fn stats_show_each_tenants_open_breakers_and_the_node_total() {
    let receiver = Receiver::scripted(|request, _| {
        if request.path == "/down" {
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    });
    let sources = format!(
        "
sources:
  - id: shaky
    tenant: acme
    sinks:
      - {{id: primary, kind: http, url: '{}'}}
  - id: steady
    tenant: globex
    sinks:
      - {{id: main, kind: http, url: '{}'}}
",
        receiver.url("/down"),
        receiver.url("/up"),
    );
    let extra = "
retry: {initial_ms: 10, max_ms: 20}
dispatch: {breaker_failures: 2, breaker_open_ms: 1500}
";
    let (_dir, _data, server) = start_in_temp_dir(extra, Some(&sources));
    let before_ms = now_ms();
    let none = serde_json::json!([]);

    // Nothing failed yet: no breaker anywhere.
    let stats = server.admin_get("/v1/stats").json();
    assert_eq!(
        (&stats["breakers_open"], &stats["breakers"]),
        (&0.into(), &none),
        "{stats}"
    );
    for id in ["acme", "globex"] {
        let tenant = find_tenant(&stats, id);
        assert_eq!(
            (&tenant["breakers_open"], &tenant["breakers"]),
            (&0.into(), &none),
            "{stats}"
        );
    }

    post_hooks(&server, "/hooks/shaky", 3, |n| format!(r#"{{"n":{n}}}"#));
    post_hooks(&server, "/hooks/steady", 3, |n| format!(r#"{{"n":{n}}}"#));
    receiver.wait_for(WAIT, |all| {
        all.iter().filter(|r| r.path == "/up").count() == 3
    });
    let stats = wait_stats(&server, "acme's breaker opens", |stats| {
        stats["breakers_open"] == 1
    });
    let breakers = stats["breakers"].as_array().unwrap();
    assert_eq!(breakers.len(), 1, "{stats}");
    let breaker = &breakers[0];
    assert_eq!(
        (
            &breaker["source"],
            &breaker["sink"],
            &breaker["kind"],
            &breaker["tenant"]
        ),
        (
            &"shaky".into(),
            &"primary".into(),
            &"http".into(),
            &"acme".into()
        ),
        "{stats}"
    );
    let state = breaker["state"].as_str().unwrap();
    assert!(state == "open" || state == "half_open", "{stats}");
    let since = breaker["since_ms"].as_u64().unwrap();
    assert!(
        since >= before_ms && since <= now_ms(),
        "since {since}: {stats}"
    );
    if state == "open" {
        assert!(
            breaker["next_probe_ms"].as_u64().unwrap() > since,
            "{stats}"
        );
    }
    assert!(
        breaker["consecutive_failures"].as_u64().unwrap() >= 2,
        "{stats}"
    );
    let acme = find_tenant(&stats, "acme");
    assert_eq!(acme["breakers_open"], 1, "{stats}");
    assert_eq!(acme["breakers"].as_array().unwrap().len(), 1, "{stats}");
    assert_eq!(
        (&acme["breakers"][0]["source"], &acme["breakers"][0]["sink"]),
        (&"shaky".into(), &"primary".into()),
        "{stats}"
    );
    let globex = find_tenant(&stats, "globex");
    assert_eq!(
        (&globex["breakers_open"], &globex["breakers"]),
        (&0.into(), &none),
        "{stats}"
    );
    // The same in a tenant's own answer.
    let acme = server.admin_get("/v1/tenants/acme").json();
    assert_eq!(acme["breakers_open"], 1, "{acme}");
    assert_eq!(
        (&acme["breakers"][0]["source"], &acme["breakers"][0]["sink"]),
        (&"shaky".into(), &"primary".into()),
        "{acme}"
    );
    let globex = server.admin_get("/v1/tenants/globex").json();
    assert_eq!(
        (&globex["breakers_open"], &globex["breakers"]),
        (&0.into(), &none),
        "{globex}"
    );
    let metrics = server.admin_get("/metrics").body;
    assert_eq!(metric(&metrics, "ankusa_dispatch_breakers_open"), Some(1.0));

    // The destination recovers: the next probe closes the breaker, the rows go out.
    receiver.set_script(|_, _| Reply::status(200));
    let stats = wait_stats(&server, "the breaker closes", |stats| {
        stats["breakers_open"] == 0 && find_tenant(stats, "acme")["pending"] == 0
    });
    assert_eq!(stats["breakers"], none, "{stats}");
    for id in ["acme", "globex"] {
        let tenant = find_tenant(&stats, id);
        assert_eq!(
            (&tenant["breakers_open"], &tenant["breakers"]),
            (&0.into(), &none),
            "{stats}"
        );
        let shown = server.admin_get(&format!("/v1/tenants/{id}")).json();
        assert_eq!(
            (&shown["breakers_open"], &shown["breakers"]),
            (&0.into(), &none),
            "{shown}"
        );
    }
    assert_eq!(find_tenant(&stats, "acme")["delivered_total"], 3, "{stats}");
    assert!(server.stop().success());
}
