//! Progress of long operations through the admin API, against the real binary and a real
//! HTTP receiver: an archive replay of 10,000 hooks started in the background answers 202
//! with its job, and `/v1/jobs/{id}` read while it runs shows a total of 10,000 and done
//! counts that only grow, up to that total; a DLQ revive of every row does the same. The
//! `ankusa` verbs follow the same jobs and print the operations' answers.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::receiver::{Receiver, Reply};
use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const HOOKS: usize = 10_000;
const POSTERS: usize = 8;

fn demo(receiver: &Receiver) -> String {
    format!(
        "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, url: '{}'}}
",
        receiver.url("/in")
    )
}

/// Posts `count` hooks over [`POSTERS`] connections at once.
fn post_many(server: &Server, count: usize) {
    std::thread::scope(|scope| {
        for poster in 0..POSTERS {
            scope.spawn(move || {
                let mut stream = server.connect();
                for index in (poster..count).step_by(POSTERS) {
                    let body = format!(r#"{{"n":{index}}}"#);
                    send_post(&mut stream, "/hooks/demo", &[], body.as_bytes(), false);
                    let response = read_response(&mut stream).unwrap();
                    assert_eq!(response.status, 202, "{response:?}");
                }
            });
        }
    });
}

fn acme_stats(server: &Server) -> Value {
    let stats = server.admin_get("/v1/stats").json();
    stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tenant| tenant["id"] == "acme")
        .unwrap()
        .clone()
}

fn wait_acme(server: &Server, done: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let acme = acme_stats(server);
        if done(&acme) {
            return;
        }
        assert!(Instant::now() < deadline, "acme never got there: {acme}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads the job until it has finished; returns every view seen, in order.
fn follow(server: &Server, id: u64) -> Vec<Value> {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        let response = server.admin_get(&format!("/v1/jobs/{id}"));
        assert_eq!(response.status, 200, "{response:?}");
        let job = response.json();
        let state = job["state"].as_str().unwrap().to_owned();
        seen.push(job);
        if state == "done" || state == "failed" {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} never finished: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Done counts never fall, every total shown is `total`, and the job ends done at it.
fn assert_progress(seen: &[Value], total: u64) {
    let mut last_done = 0;
    let mut distinct = BTreeSet::new();
    for job in seen {
        let done = job["done"].as_u64().unwrap();
        assert!(
            done >= last_done,
            "done fell from {last_done} to {done}: {job}"
        );
        last_done = done;
        distinct.insert(done);
        match job["state"].as_str().unwrap() {
            "queued" | "counting" => assert_eq!(job["total"], Value::Null, "{job}"),
            "running" | "done" => {
                assert_eq!(job["total"], total, "{job}");
                assert!(done <= total, "{job}");
                assert!(job["rate_per_s"].as_f64().unwrap() >= 0.0, "{job}");
            }
            other => panic!("unexpected state {other}: {job}"),
        }
    }
    let last = seen.last().unwrap();
    assert_eq!(last["state"], "done", "{last}");
    assert_eq!(last["done"], total, "{last}");
    assert!(last["finished_at_ms"].as_u64().is_some(), "{last}");
    // Reported as it goes, not only at the end: batches are a few hundred hooks and the
    // job is read every few milliseconds.
    assert!(
        distinct.len() >= 3,
        "only done counts {distinct:?} were seen for a total of {total}"
    );
}

#[test]
fn a_replay_and_a_revive_report_growing_progress_up_to_their_totals() {
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config_yaml(&data, "", Some(&demo(&receiver))));
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    post_many(&server, HOOKS);
    receiver.wait_for_hooks(HOOKS, WAIT);
    wait_acme(&server, |acme| {
        acme["delivered_total"] == HOOKS as u64 && acme["pending"] == 0
    });

    // Every hook delivered to the receiver is now in the archive: replay them all, and
    // let every replayed hook fail for good so the revive below has 10,000 rows.
    receiver.set_script(|_, _| Reply::status(400));
    let request = format!(
        r#"{{"tenant":"acme","source":"demo","from_ms":{started_ms},"to_ms":{},"background":true}}"#,
        started_ms + 3_600_000
    );
    let started = server.admin_post("/v1/archive/replay", &request);
    assert_eq!(started.status, 202, "{started:?}");
    let job = started.json();
    assert_eq!(job["kind"], "archive_replay", "{job}");
    assert_eq!(job["request"]["tenant"], "acme", "{job}");
    assert_eq!(job["request"].get("background"), None, "{job}");
    let seen = follow(&server, job["id"].as_u64().unwrap());
    assert_progress(&seen, HOOKS as u64);
    let last = seen.last().unwrap();
    assert_eq!(last["result"]["replayed"], HOOKS as u64, "{last}");
    assert_eq!(last["result"]["skipped"], 0, "{last}");

    wait_acme(&server, |acme| {
        acme["dead"] == HOOKS as u64 && acme["pending"] == 0
    });
    receiver.set_script(|_, _| Reply::status(200));
    let started = server.admin_post("/v1/dlq/revive", r#"{"all":true,"background":true}"#);
    assert_eq!(started.status, 202, "{started:?}");
    assert_eq!(started.json()["kind"], "dlq_revive");
    let seen = follow(&server, started.json()["id"].as_u64().unwrap());
    assert_progress(&seen, HOOKS as u64);
    assert_eq!(seen.last().unwrap()["result"]["revived"], HOOKS as u64);
    wait_acme(&server, |acme| {
        acme["delivered_total"] == 2 * HOOKS as u64 && acme["pending"] == 0
    });

    // Both jobs are listed, newest first; unknown ids and other methods are refused.
    let listed = server.admin_get("/v1/jobs").json();
    let kinds: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["dlq_revive", "archive_replay"], "{listed}");
    let unknown = server.admin_get("/v1/jobs/999");
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(unknown.json()["error"], "unknown_job");
    let posted = server.admin_post("/v1/jobs", "{}");
    assert_eq!(posted.status, 405, "{posted:?}");
    let bad = server.admin_post("/v1/dlq/revive", r#"{"all":true,"background":"yes"}"#);
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(
        bad.json()["message"],
        "background must be true or false, found \"yes\""
    );

    // The verb follows a job of its own and prints the replay's answer; its progress
    // bar is drawn only on a terminal, so nothing but the answer reaches the pipe.
    let output = Command::new(env!("CARGO_BIN_EXE_ankusa"))
        .args(["archive", "replay", "--tenant", "acme", "--source", "demo"])
        .args(["--from", "0", "--to", "1"])
        .args(["--admin", &format!("http://{}", server.admin)])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "{\"replayed\":0,\"skipped\":0}\n"
    );
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
    assert_eq!(
        server
            .admin_get("/v1/jobs")
            .json()
            .as_array()
            .unwrap()
            .len(),
        3
    );

    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}
