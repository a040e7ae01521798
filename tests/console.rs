//! The web console in headless Chromium, driven over the W3C WebDriver protocol through
//! chromedriver: the console loads from the admin listener, a missing and a wrong token are
//! refused (the page says so; the API answered 401), a dead letter the test made is listed,
//! inspected and revived through the page and then delivered, and a quarantined hook
//! released through the page is delivered too, and an archive replay started from the page
//! runs as a job the page follows to its end. Then, each by clicking as an operator would:
//! a quarantined hook deleted from its inspect view, dead letters selected and revived
//! (only those are delivered), selected and purged after a second click (gone from the DLQ
//! and its counts), and the rest revived by one background job the page follows. A second
//! test starts a node on a store that must migrate: the page shows the migration's progress
//! and then loads by itself. A screenshot of each state is written to
//! `$CARGO_TARGET_TMPDIR/console-screenshots/`.
//!
//! Faults injected: receivers that refuse every hook with 400 and are then fixed; hooks
//! with a wrong token, which their source quarantines; an ordered sink answering 503 with
//! an hour's Retry-After, which blocks its lane (listed by the lanes page); globex's sink
//! answering 503 for good, which opens its breaker after two failures; a migration
//! slowed to 100 ms a batch (`slow_migration`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/setup` installs them). Without
//! them the test is skipped with a loud line, except under CI (CI=true), where it fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::receiver::{Receiver, Reply};
use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "s3cret-console";

#[test]
fn the_console_revives_a_dead_letter_releases_a_quarantined_hook_and_refuses_bad_tokens() {
    let Some(tools) = browser_tools("console") else {
        return;
    };
    let fixed = Arc::new(AtomicBool::new(false));
    let fixed_in_script = fixed.clone();
    let bulk_fixed = Arc::new(AtomicBool::new(false));
    let bulk_fixed_in_script = bulk_fixed.clone();
    let receiver = Receiver::scripted(move |request, _| {
        if request.path == "/in" && !fixed_in_script.load(Ordering::Acquire) {
            Reply::status(400).with_body("bad payload")
        } else if request.path == "/bulk" && !bulk_fixed_in_script.load(Ordering::Acquire) {
            Reply::status(400).with_body("bad batch")
        } else if request.path == "/ordered" {
            // The lane's head waits an hour for its retry: the lane stays blocked.
            Reply::status(503).with_header("retry-after", "3600")
        } else if request.path == "/shaky" {
            // globex's destination is down: its breaker opens and stays open.
            Reply::status(503)
        } else {
            Reply::status(200)
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sources = format!(
        "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, url: '{}'}}
  - id: q
    tenant: acme
    quarantine: true
    verify: {{scheme: token, token: good, header: x-token}}
    sinks:
      - {{kind: http, url: '{}'}}
  - id: orders
    tenant: acme
    sinks:
      - {{kind: http, url: '{}', ordered: true, ordering_key: {{json: customer}}}}
  - id: bulk
    tenant: acme
    sinks:
      - {{kind: http, url: '{}'}}
  - id: shaky
    tenant: globex
    sinks:
      - {{kind: http, url: '{}'}}
",
        receiver.url("/in"),
        receiver.url("/q"),
        receiver.url("/ordered"),
        receiver.url("/bulk"),
        receiver.url("/shaky"),
    );
    // Two failures in a row open a breaker (the ordered sink fails once an hour).
    let extra = "dispatch: {breaker_failures: 2}";
    // A token on a loopback listener: set, it is required there too.
    let yaml = with_admin_token(&config_yaml(&data, extra, Some(&sources)), TOKEN);
    let server = Server::start(dir.path(), &yaml);
    let bearer_value = format!("Bearer {TOKEN}");
    let bearer = [("authorization", bearer_value.as_str())];

    // A dead letter: the receiver refuses the hook's only attempt with 400.
    let dead_body = br#"{"console":"dead letter","n":1}"#;
    let response = server.post("/hooks/demo", &[], dead_body);
    assert_eq!(response.status, 202, "{response:?}");
    let dead_seq = response.json()["seq"].as_u64().unwrap();
    wait_stats(&server, &bearer, |acme| {
        acme["dead"] == 1 && acme["pending"] == 0
    });
    // A quarantined hook: its token is wrong.
    let quarantined_body = br#"{"console":"quarantined","n":2}"#;
    let response = server.post("/hooks/q", &[("x-token", "forged")], quarantined_body);
    assert_eq!(response.status, 401, "{response:?}");
    let quarantine = server.admin_request("GET", "/v1/quarantine?tenant=acme", &bearer, None);
    let quarantined_seq = quarantine.json()["items"][0]["seq"].as_u64().unwrap();
    // A blocked lane: customer c1's head waits for its retry, two members behind it.
    let order_seqs: Vec<u64> = (0..3)
        .map(|n| {
            let body = format!(r#"{{"customer":"c1","n":{n}}}"#);
            let response = server.post("/hooks/orders", &[], body.as_bytes());
            assert_eq!(response.status, 202, "{response:?}");
            response.json()["seq"].as_u64().unwrap()
        })
        .collect();
    wait_stats(&server, &bearer, |acme| {
        acme["lanes_blocked"] == 1 && acme["lane_members"] == 2
    });
    // An open breaker: globex's two hooks fail at once, and the sink is parked.
    for n in 0..2 {
        let body = format!(r#"{{"shaky":{n}}}"#);
        let response = server.post("/hooks/shaky", &[], body.as_bytes());
        assert_eq!(response.status, 202, "{response:?}");
    }
    wait_until("globex's breaker opens", WAIT, || {
        let stats = server
            .admin_request("GET", "/v1/stats", &bearer, None)
            .json();
        stats["breakers_open"] == 1
    });

    // The files are served without a token, with their types and a strict policy.
    let index = server.admin_get("/console");
    assert_eq!(index.status, 200, "{index:?}");
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(index
        .header("content-security-policy")
        .unwrap()
        .starts_with("default-src 'self'"));
    assert_eq!(index.header("cache-control"), Some("no-cache"));
    let script = server.admin_get("/console/app.js");
    assert_eq!(
        script.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(server.admin_get("/console/nothing.js").status, 404);
    assert_eq!(
        server
            .admin_request("POST", "/console", &[], Some("{}"))
            .status,
        405
    );
    // What the console's requests meet without the token and with a wrong one.
    assert_eq!(server.admin_get("/v1/stats").status, 401);
    let wrong = [("authorization", "Bearer wrong")];
    assert_eq!(
        server
            .admin_request("GET", "/v1/stats", &wrong, None)
            .status,
        401
    );

    // The routes the pages added to the API, over plain HTTP.
    let get = |path: &str| {
        let response = server.admin_request("GET", path, &bearer, None);
        assert_eq!(response.status, 200, "{path}: {response:?}");
        response.json()
    };
    let by_reason = get("/v1/dlq?tenant=acme&reason=http+400");
    assert_eq!(
        by_reason["items"].as_array().unwrap().len(),
        1,
        "{by_reason}"
    );
    let none = get("/v1/dlq?tenant=acme&reason=http+503");
    assert_eq!(none["items"], json!([]), "{none}");
    let envelope = get(&format!("/v1/dlq/hook?tenant=acme&seq={dead_seq}"));
    assert_eq!(envelope["source"], "demo");
    assert_eq!(
        envelope["body_preview"].as_str().unwrap().as_bytes(),
        dead_body
    );
    assert_eq!(envelope["body_bytes"], dead_body.len());
    assert_eq!(
        envelope["rows"],
        json!([{"sink": "http", "state": "dead", "reason": "http 400: bad payload",
                "attempts": 1, "first_attempt_at_ms": envelope["rows"][0]["first_attempt_at_ms"],
                "last_error": "http 400: bad payload", "ordering_key": null}])
    );
    let missing = server.admin_request("GET", "/v1/dlq/hook?tenant=acme&seq=999", &bearer, None);
    assert_eq!(
        (missing.status, missing.json()["error"].as_str()),
        (404, Some("no_such_hook"))
    );
    let lanes = get("/v1/lanes?tenant=acme&blocked=true");
    assert_eq!(lanes["items"].as_array().unwrap().len(), 1, "{lanes}");
    assert_eq!(lanes["items"][0]["head_seq"], order_seqs[0]);
    assert_eq!(lanes["items"][0]["members_waiting"], 2);
    assert_eq!(lanes["next"], Value::Null);
    let other_sink = get("/v1/lanes?tenant=acme&sink=nothing");
    assert_eq!(other_sink["items"], json!([]), "{other_sink}");

    let shots = screenshot_dir();
    let driver = Chromedriver::start(&tools, dir.path());
    let browser = driver.session(&tools, dir.path());
    let console = format!("http://{}/console", server.admin);

    // No token: the page loads and says the API wants one.
    browser.navigate(&format!("{console}#/overview"));
    browser.wait_js("return document.body.dataset.auth === 'refused'");
    let banner = browser.text("#auth-banner");
    assert!(banner.starts_with("Token required"), "{banner}");
    browser.screenshot(&shots, "01-token-missing");

    // A wrong token: refused.
    browser.type_into("#token", "wrong");
    browser.click("#token-use");
    browser.wait_js(
        "return document.body.dataset.auth === 'refused' \
         && document.getElementById('auth-banner').textContent.startsWith('Token refused')",
    );
    browser.screenshot(&shots, "02-token-refused");

    // The right token: the overview fills in.
    browser.type_into("#token", TOKEN);
    browser.click("#token-use");
    browser.wait_js(
        "return document.body.dataset.auth === 'ok' \
         && document.querySelector('#overview-tenants tr[data-tenant=\"acme\"]') !== null",
    );
    let dead_card = browser.text("#card-dead");
    assert!(dead_card.contains("Dead letters\n1"), "{dead_card:?}");
    // globex's open breaker, in its row and the node's list; none in acme's row.
    let globex_breaker = "#overview-tenants tr[data-tenant=\"globex\"] \
                          li.breaker[data-source=\"shaky\"][data-sink=\"http\"]";
    browser.wait_for(globex_breaker);
    let shown = browser.text(globex_breaker);
    assert!(
        shown.starts_with("shaky → http ") && shown.contains(" since "),
        "{shown:?}"
    );
    let open = browser
        .js(
            "return Array.from(document.querySelectorAll('#overview-tenants tr[data-tenant]'), \
             row => [row.dataset.tenant, row.querySelector('td.breakers').dataset.breakers, \
                     Array.from(row.querySelectorAll('li.breaker'), li => li.dataset.source + ' → ' + li.dataset.sink)])",
        )
        .unwrap();
    assert_eq!(
        open,
        json!([["acme", "0", []], ["globex", "1", ["shaky → http"]]]),
        "breakers per tenant row"
    );
    let node_breakers = browser
        .js(
            "return Array.from(document.querySelectorAll('#overview-breakers tr[data-source]'), \
             row => row.cells[0].textContent + ' ' + row.cells[6].textContent)",
        )
        .unwrap();
    assert_eq!(node_breakers, json!(["shaky → http globex"]));
    let breakers_card = browser.text("#card-breakers");
    assert!(
        breakers_card.starts_with("Breakers open\n1"),
        "{breakers_card:?}"
    );
    // A second refresh gives rates.
    browser.wait_js("return !document.getElementById('card-ingest').textContent.includes('—')");
    browser.screenshot(&shots, "03-overview");

    // The dead letter, listed and inspected.
    browser.navigate(&format!("{console}#/dlq?tenant=acme"));
    let row = format!("#dlq-list tr[data-seq=\"{dead_seq}\"][data-sink=\"http\"]");
    browser.wait_for(&row);
    let listed = browser.text(&row);
    assert!(listed.contains("http 400: bad payload"), "{listed}");
    browser.click(&format!("{row} a.inspect"));
    browser.wait_for("#dlq-body");
    assert_eq!(
        browser.text("#dlq-body").as_bytes(),
        dead_body,
        "the stored body"
    );
    let detail = browser.text("#dlq-detail");
    assert!(detail.contains("content-type"), "stored headers: {detail}");
    browser.screenshot(&shots, "04-dlq");

    // The destination is fixed; revived from the page, the hook is delivered.
    fixed.store(true, Ordering::Release);
    browser.click(&format!("{row} button.revive"));
    wait_notice(&browser, "Revived 1 row.");
    let received = receiver.wait_for(WAIT, |all| requests_for(all, "/in", dead_seq).len() >= 2);
    let attempts = requests_for(&received, "/in", dead_seq);
    assert_eq!(attempts.len(), 2, "the refused attempt and the delivery");
    assert_eq!(attempts[1].attempt(), 1, "a revived row starts over");
    assert_eq!(attempts[1].body, dead_body, "the revived hook's bytes");
    wait_stats(&server, &bearer, |acme| {
        acme["dead"] == 0 && acme["delivered_total"] == 1
    });
    browser.wait_js(&format!(
        "return document.querySelector('#dlq-list tr[data-seq=\"{dead_seq}\"]') === null"
    ));
    browser.screenshot(&shots, "05-dlq-revived");

    // The quarantined hook, inspected and released from the page, is delivered.
    browser.navigate(&format!("{console}#/quarantine?tenant=acme"));
    let row = format!("#quarantine-list tr[data-seq=\"{quarantined_seq}\"]");
    browser.wait_for(&row);
    assert!(browser.text(&row).contains("signature_invalid"));
    browser.click(&format!("{row} a.inspect"));
    browser.wait_for("#quarantine-body");
    assert_eq!(
        browser.text("#quarantine-body").as_bytes(),
        quarantined_body
    );
    browser.screenshot(&shots, "06-quarantine");
    browser.click(&format!("{row} button.release"));
    browser.wait_js(&format!(
        "return document.getElementById('notice').textContent.startsWith('Released hook {quarantined_seq} as hook ')"
    ));
    let received = receiver.wait_for(WAIT, |all| all.iter().any(|request| request.path == "/q"));
    let released = received
        .iter()
        .find(|request| request.path == "/q")
        .unwrap();
    assert_eq!(released.body, quarantined_body, "the released hook's bytes");
    assert!(released.seq() > quarantined_seq, "a new hook");
    browser.wait_js(&format!(
        "return document.querySelector('#quarantine-list tr[data-seq=\"{quarantined_seq}\"]') === null"
    ));
    browser.screenshot(&shots, "07-quarantine-released");

    // The other pages render.
    // The blocked lane, with its head's attempt and the members behind it.
    browser.navigate(&format!("{console}#/lanes?tenant=acme&blocked=true"));
    let lane = "#lanes-list tr[data-state=\"retrying\"]";
    browser.wait_for(lane);
    let cells = browser.cells(lane);
    let head = order_seqs[0].to_string();
    assert_eq!(
        cells[..6],
        ["orders", "http", "c1", head.as_str(), "retrying", "1"],
        "{cells:?}"
    );
    assert!(cells[6].contains("503"), "the head's last error: {cells:?}");
    assert_eq!(cells[7], "2", "members waiting: {cells:?}");
    browser.screenshot(&shots, "08-lanes");

    // The revived hook, delivered, is in the archive: replayed from the page as a job that
    // counts it, then delivers it again under a new seq.
    browser.navigate(&format!("{console}#/replay?tenant=acme&source=demo"));
    browser.wait_for("#replay-form");
    browser.click("#replay-start");
    browser
        .wait_js("return document.querySelector('#replay-jobs tr[data-kind=\"archive_replay\"][data-state=\"done\"]') !== null");
    let job = browser.text("#replay-jobs tr[data-kind=\"archive_replay\"][data-state=\"done\"]");
    assert!(
        job.contains("1 of 1") && job.contains("replayed 1"),
        "{job}"
    );
    let received = receiver.wait_for(WAIT, |all| {
        all.iter()
            .any(|request| request.path == "/in" && request.seq() > dead_seq)
    });
    let replayed = received
        .iter()
        .find(|request| request.path == "/in" && request.seq() > dead_seq)
        .unwrap();
    assert_eq!(replayed.body, dead_body, "the replayed hook's bytes");
    browser.screenshot(&shots, "09-replay");

    // Another quarantined hook, deleted from its inspect view after a second click: gone
    // from the quarantine, and never delivered.
    let deleted_body = br#"{"console":"quarantined","n":3}"#;
    let response = server.post("/hooks/q", &[("x-token", "forged")], deleted_body);
    assert_eq!(response.status, 401, "{response:?}");
    let quarantine = get("/v1/quarantine?tenant=acme");
    let deleted_seq = quarantine["items"][0]["seq"].as_u64().unwrap();
    browser.navigate(&format!("{console}#/quarantine?tenant=acme"));
    let row = format!("#quarantine-list tr[data-seq=\"{deleted_seq}\"]");
    browser.click(&format!("{row} a.inspect"));
    browser.wait_for("#quarantine-body");
    assert_eq!(browser.text("#quarantine-body").as_bytes(), deleted_body);
    let delete = "#quarantine-detail button.delete";
    browser.click(delete);
    wait_text(&browser, delete, "Click again to delete");
    assert_eq!(
        get("/v1/quarantine?tenant=acme")["items"],
        quarantine["items"]
    );
    browser.screenshot(&shots, "10-quarantine-delete-confirm");
    browser.click(delete);
    wait_notice(
        &browser,
        &format!("Deleted quarantined hook {deleted_seq}."),
    );
    browser.wait_js(&format!(
        "return document.querySelector('#quarantine-list tr[data-seq=\"{deleted_seq}\"]') === null"
    ));
    assert_eq!(get("/v1/quarantine?tenant=acme")["items"], json!([]));
    let gone = server.admin_request(
        "GET",
        &format!("/v1/quarantine/hook?tenant=acme&seq={deleted_seq}"),
        &bearer,
        None,
    );
    assert_eq!(gone.status, 404, "{gone:?}");
    wait_stats(&server, &bearer, |acme| acme["quarantined"] == 0);
    browser.screenshot(&shots, "11-quarantine-deleted");

    // Six dead letters of another source, for the DLQ's selection and filter actions.
    let bulk: Vec<u64> = (0..6)
        .map(|n| {
            let body = format!(r#"{{"bulk":{n}}}"#);
            let response = server.post("/hooks/bulk", &[], body.as_bytes());
            assert_eq!(response.status, 202, "{response:?}");
            response.json()["seq"].as_u64().unwrap()
        })
        .collect();
    wait_stats(&server, &bearer, |acme| acme["dead"] == 6);
    let dead_of_bulk = || -> Vec<u64> {
        get("/v1/dlq?tenant=acme&source=bulk")["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["seq"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(dead_of_bulk(), bulk);
    bulk_fixed.store(true, Ordering::Release);
    browser.navigate(&format!("{console}#/dlq?tenant=acme&source=bulk"));
    let select = |seqs: &[u64]| {
        for seq in seqs {
            browser.click(&format!(
                "#dlq-list tr[data-seq=\"{seq}\"][data-sink=\"http\"] input.select"
            ));
        }
        wait_text(
            &browser,
            "#dlq-selected",
            &format!("{} selected", seqs.len()),
        );
    };

    // Two selected and revived: those two are delivered, the others stay dead.
    select(&bulk[..2]);
    browser.screenshot(&shots, "12-dlq-selection");
    browser.click("#dlq-revive-selected");
    wait_notice(&browser, "Revived 2 rows.");
    receiver.wait_for(WAIT, |all| {
        bulk[..2]
            .iter()
            .all(|&seq| requests_for(all, "/bulk", seq).len() == 2)
    });
    wait_stats(&server, &bearer, |acme| acme["dead"] == 4);
    assert_eq!(dead_of_bulk(), bulk[2..]);
    let received = receiver.received();
    for &seq in &bulk[2..] {
        assert_eq!(requests_for(&received, "/bulk", seq).len(), 1, "hook {seq}");
    }

    // Two selected and purged: nothing before the second click, then gone.
    select(&bulk[2..4]);
    browser.click("#dlq-purge-selected");
    wait_text(
        &browser,
        "#dlq-purge-selected",
        "Click again to purge 2 row(s)",
    );
    assert_eq!(dead_of_bulk(), bulk[2..]);
    browser.screenshot(&shots, "13-dlq-purge-confirm");
    browser.click("#dlq-purge-selected");
    browser.wait_js(
        "return document.getElementById('notice').textContent.startsWith('Purged 2 rows (')",
    );
    wait_stats(&server, &bearer, |acme| acme["dead"] == 2);
    assert_eq!(dead_of_bulk(), bulk[4..]);

    // The rest, revived by the filter shown: one background job, followed to its end.
    browser.click("#dlq-revive-all");
    wait_text(
        &browser,
        "#dlq-revive-all",
        "Click again to revive every dead row of tenant acme, source bulk",
    );
    browser.click("#dlq-revive-all");
    browser.wait_js("return document.getElementById('dlq-job').dataset.state === 'done'");
    let line = browser.text("#dlq-job");
    assert!(line.ends_with("done: revived 2, skipped 0."), "{line}");
    let job_id = browser
        .js("return document.getElementById('dlq-job').dataset.job")
        .unwrap();
    let job = get(&format!("/v1/jobs/{}", job_id.as_str().unwrap()));
    assert_eq!(
        (&job["kind"], &job["request"], &job["result"]),
        (
            &json!("dlq_revive"),
            &json!({"tenant": "acme", "source": "bulk"}),
            &json!({"revived": 2, "skipped": 0})
        ),
        "{job}"
    );
    receiver.wait_for(WAIT, |all| {
        bulk[4..]
            .iter()
            .all(|&seq| requests_for(all, "/bulk", seq).len() == 2)
    });
    wait_stats(&server, &bearer, |acme| acme["dead"] == 0);
    assert_eq!(dead_of_bulk(), Vec::<u64>::new());
    browser.wait_js("return document.querySelector('#dlq-list tr[data-seq]') === null");
    browser.screenshot(&shots, "14-dlq-revived-all");
    // The purged hooks and the deleted quarantined one were never delivered.
    let received = receiver.received();
    for &seq in &bulk[2..4] {
        assert_eq!(requests_for(&received, "/bulk", seq).len(), 1, "hook {seq}");
    }
    assert!(
        !received.iter().any(|request| request.body == deleted_body),
        "the deleted quarantined hook was delivered"
    );

    // Nothing the page did broke its own policy or threw.
    let problems = browser.console_problems();
    assert!(problems.is_empty(), "browser console: {problems:#?}");

    drop(browser);
    server.stop_and_verify();
}

/// A store that must migrate at start: while it migrates, the console served by the admin
/// address shows the migration's progress in its banner; once the store is open the page
/// loads by itself (the overview, the banner gone).
#[test]
fn the_console_shows_a_store_migration_then_loads_by_itself() {
    // 100 ms per batch of 1,024: about 6 s of migration, long enough to load the page.
    const ARCHIVED: u64 = 60_000;
    let Some(tools) = browser_tools("console_migration") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    unsealed_store(&data, ARCHIVED);
    // A fixed admin port: the server reports its ports once ready, after the migration.
    let admin = free_loopback_addr();
    let yaml = config_yaml(&data, "", None).replace(
        "admin_listen: 127.0.0.1:0",
        &format!("admin_listen: {admin}"),
    );
    let shots = screenshot_dir();
    let driver = Chromedriver::start(&tools, dir.path());
    let browser = driver.session(&tools, dir.path());
    // Server::start returns once the node is ready: on a thread, while the page loads.
    let starting = {
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || {
            Server::start_env(&dir, &yaml, &[("ANKUSA_TEST_FAULT", "slow_migration")])
        })
    };
    // The progress listener answers from the migration's first batch on.
    wait_until("the admin address answers", WAIT, || {
        try_request(admin, "GET", "/healthz", &[], None).is_some()
    });
    browser.navigate(&format!("http://{admin}/console#/overview"));
    browser.wait_js(
        "const banner = document.getElementById('error-banner'); \
         return !banner.classList.contains('hidden') && /^The store is migrating to this \
         version's format: [0-9,]+ of [0-9,]+ records/.test(banner.textContent)",
    );
    let banner = browser.text("#error-banner");
    assert!(banner.contains(" of 60,000 records"), "{banner}");
    browser.screenshot(&shots, "15-migration");

    browser.wait_js(
        "return document.querySelector('#overview-tenants tr[data-tenant=\"acme\"]') !== null \
         && document.getElementById('error-banner').classList.contains('hidden')",
    );
    let server = starting.join().unwrap();
    browser.screenshot(&shots, "16-migration-done");
    let jobs = server.admin_request("GET", "/v1/jobs", &[], None).json();
    let migration = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["kind"] == "store_migration")
        .unwrap_or_else(|| panic!("{jobs}"));
    assert_eq!(
        (&migration["state"], &migration["done"], &migration["total"]),
        (&json!("done"), &json!(ARCHIVED), &json!(ARCHIVED)),
        "{migration}"
    );
    // Polls that fell between the progress listener's close and the node's listener found
    // nothing listening: expected, and handled (the page waited).
    let problems: Vec<String> = browser
        .console_problems()
        .into_iter()
        .filter(|message| !message.contains("net::ERR_CONNECTION_REFUSED"))
        .collect();
    assert!(problems.is_empty(), "browser console: {problems:#?}");

    drop(browser);
    server.stop_and_verify();
}

/// The requests `receiver` saw for hook `seq` on `path`, attempts in order.
fn requests_for(
    all: &[common::receiver::Received],
    path: &str,
    seq: u64,
) -> Vec<common::receiver::Received> {
    all.iter()
        .filter(|request| request.path == path && request.seq() == seq)
        .cloned()
        .collect()
}

/// Waits until the page's notice line reads `text`.
fn wait_notice(browser: &Browser, text: &str) {
    wait_text(browser, "#notice", text);
}

/// Waits until the element `selector` names holds exactly `text`.
fn wait_text(browser: &Browser, selector: &str, text: &str) {
    let (selector, text) = (
        serde_json::to_string(selector).unwrap(),
        serde_json::to_string(text).unwrap(),
    );
    browser.wait_js(&format!(
        "const node = document.querySelector({selector}); \
         return node !== null && node.textContent === {text}"
    ));
}

/// Polls `/v1/stats` until tenant acme's counters satisfy `done`.
fn wait_stats(server: &Server, headers: &[(&str, &str)], done: impl Fn(&Value) -> bool) {
    wait_tenant(server, headers, "acme", WAIT, done);
}

fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Where the browser and its driver are.
struct Tools {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

/// The browser and its driver from PATH; `None` (with a loud line) when one is missing,
/// except under CI, where that fails the test.
fn browser_tools(test: &str) -> Option<Tools> {
    let find = |names: &[&str]| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
            .find(|candidate| candidate.is_file())
    };
    let chromium = find(&["chromium", "chromium-browser"]);
    let chromedriver = find(&["chromedriver"]);
    if let (Some(chromium), Some(chromedriver)) = (chromium.clone(), chromedriver.clone()) {
        return Some(Tools {
            chromium,
            chromedriver,
        });
    }
    let missing = match (chromium, chromedriver) {
        (None, None) => "chromium and chromedriver are",
        (None, _) => "chromium is",
        _ => "chromedriver is",
    };
    let under_ci = std::env::var("CI")
        .map(|value| value.eq_ignore_ascii_case("true") || value == "1")
        .unwrap_or(false);
    if under_ci {
        panic!("{test}: {missing} not on PATH, and CI requires them: `.ci/setup` installs chromium and chromium-driver");
    }
    // Straight to stderr: the harness would hide an eprintln! of a passing test.
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {test}: {missing} not on PATH; `apt-get install chromium chromium-driver` (or `bash .ci/setup`)"
    );
    None
}

/// A chromedriver process on a free loopback port, killed on drop.
struct Chromedriver {
    child: std::process::Child,
    url: String,
    agent: ureq::Agent,
}

impl Drop for Chromedriver {
    /// Asks chromedriver to quit its browsers and itself first: killed at once, it would
    /// leave a browser behind.
    fn drop(&mut self) {
        let _ = self.call("GET", "/shutdown", None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Chromedriver {
    fn start(tools: &Tools, dir: &Path) -> Chromedriver {
        let port = free_loopback_addr().port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
        let child = std::process::Command::new(&tools.chromedriver)
            .arg(format!("--port={port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(WAIT))
            .build()
            .into();
        let driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = driver.call("GET", "/status", None) {
                if status["ready"] == true {
                    return driver;
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start: {}",
                std::fs::read_to_string(dir.join("chromedriver.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One WebDriver command: its `value`, or the error it answered.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.url);
        let response = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.unwrap_or_else(|| json!({})).to_string()),
        };
        let mut response = response.map_err(|error| error.to_string())?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|error| error.to_string())?;
        let answer: Value =
            serde_json::from_str(&text).map_err(|error| format!("{error}: {text}"))?;
        if status == 200 {
            Ok(answer["value"].clone())
        } else {
            Err(format!("{method} {path}: {status} {}", answer["value"]))
        }
    }

    fn session(&self, tools: &Tools, dir: &Path) -> Browser<'_> {
        let profile = dir.join("chromium-profile");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": tools.chromium,
                // No sandbox: test machines run as root, which Chromium's sandbox refuses.
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    "--no-first-run", "--disable-extensions",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let session = self
            .call("POST", "/session", Some(capabilities))
            .unwrap_or_else(|error| panic!("no browser session: {error}"));
        Browser {
            driver: self,
            id: session["sessionId"].as_str().unwrap().to_owned(),
        }
    }
}

/// One browser session.
struct Browser<'a> {
    driver: &'a Chromedriver,
    id: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser<'_> {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        self.driver
            .call(method, &format!("/session/{}{path}", self.id), body)
    }

    fn navigate(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })))
            .unwrap();
    }

    /// Runs `script` (a function body) in the page and returns its result.
    fn js(&self, script: &str) -> Result<Value, String> {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Waits until `script` returns true.
    fn wait_js(&self, script: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.js(script) == Ok(Value::Bool(true)) {
                return;
            }
            if Instant::now() > deadline {
                let page = self
                    .js("return document.body.innerText")
                    .unwrap_or_default();
                panic!("never true: {script}\npage text: {page}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_for(&self, selector: &str) {
        let selector = serde_json::to_string(selector).unwrap();
        self.wait_js(&format!(
            "return document.querySelector({selector}) !== null"
        ));
    }

    /// Retries `action` on the element `selector` names: a live refresh may replace the
    /// element between the lookup and the action.
    fn on_element(&self, selector: &str, action: impl Fn(&str) -> Result<Value, String>) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self
                .call(
                    "POST",
                    "/element",
                    Some(json!({"using": "css selector", "value": selector})),
                )
                .and_then(|element| {
                    let id = element[ELEMENT].as_str().unwrap_or_default().to_owned();
                    action(&id)
                });
            match found {
                Ok(value) => return value,
                Err(error) if Instant::now() > deadline => panic!("{selector}: {error}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn click(&self, selector: &str) {
        self.on_element(selector, |id| {
            self.call("POST", &format!("/element/{id}/click"), None)
        });
    }

    /// Replaces the text of an input.
    fn type_into(&self, selector: &str, text: &str) {
        self.on_element(selector, |id| {
            self.call("POST", &format!("/element/{id}/clear"), None)?;
            self.call(
                "POST",
                &format!("/element/{id}/value"),
                Some(json!({ "text": text })),
            )
        });
    }

    /// The rendered text of an element.
    fn text(&self, selector: &str) -> String {
        let value = self.on_element(selector, |id| {
            self.call("GET", &format!("/element/{id}/text"), None)
        });
        value.as_str().unwrap().to_owned()
    }

    /// The text of each cell of the table row `selector` names.
    fn cells(&self, selector: &str) -> Vec<String> {
        let selector = serde_json::to_string(selector).unwrap();
        let cells = self
            .js(&format!(
                "return Array.from(document.querySelector({selector}).cells, cell => cell.textContent)"
            ))
            .unwrap();
        serde_json::from_value(cells).unwrap()
    }

    fn screenshot(&self, dir: &Path, name: &str) {
        use base64::Engine as _;
        let png = self.call("GET", "/screenshot", None).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        let _ = writeln!(std::io::stderr().lock(), "screenshot: {}", path.display());
    }

    /// Entries of the browser's console that show a broken page: an error thrown, a
    /// violated content security policy. Answers the page expects and handles (the 401s
    /// the test provoked, a 404 for a hook that left the DLQ) are not.
    fn console_problems(&self) -> Vec<String> {
        let entries = self
            .call("POST", "/se/log", Some(json!({"type": "browser"})))
            .unwrap_or_else(|error| panic!("browser log: {error}"));
        entries
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| entry["message"].as_str().unwrap_or_default().to_owned())
            .filter(|message| !message.contains("Failed to load resource: the server responded"))
            .collect()
    }
}

/// Ends the session, on a failing test too, so the browser quits.
impl Drop for Browser<'_> {
    fn drop(&mut self) {
        let _ = self.call("DELETE", "", None);
    }
}
