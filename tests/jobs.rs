//! Progress of long operations through the admin API, against the real binary and a real
//! HTTP receiver: an archive replay of 10,000 hooks started in the background answers 202
//! with its job, and `/v1/jobs/{id}` read while it runs shows a total of 10,000 and done
//! counts that only grow, up to that total; a DLQ revive and a DLQ purge of every row do the
//! same. The `ankusa` verbs follow the same jobs and print the operations' answers.
//!
//! Jobs run on a thread of their own: while a budgeted replay runs, the rest of `/v1/`
//! answers; a revive of every row beside single-row revives and purges of the same rows
//! moves each row once; a stop during a replay exits cleanly.
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

/// `demo` (acme) delivers to `/in`.
fn demo(receiver: &Receiver) -> String {
    http_sources(&[("demo", "acme", &receiver.url("/in"))])
}

fn wait_acme(server: &Server, done: impl Fn(&Value) -> bool) {
    wait_tenant(server, &[], "acme", WAIT, done);
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
            "job {id} never finished in {WAIT:?}: first {}, last {}, {} views",
            seen[0],
            seen[seen.len() - 1],
            seen.len()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `ankusa ARGS --admin <server>` and checks that it succeeded.
fn verb(server: &Server, args: &[&str]) -> std::process::Output {
    let output = Command::new(env!("CARGO_BIN_EXE_ankusa"))
        .args(args)
        .args(["--admin", &format!("http://{}", server.admin)])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    output
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
fn a_replay_a_revive_and_a_purge_report_growing_progress_up_to_their_totals() {
    let receiver = Receiver::start();
    let (_dir, _data, server) = start_in_temp_dir("", Some(&demo(&receiver)));
    let started_ms = now_ms();
    post_many(&server, HOOKS);
    receiver.wait_for_hooks(HOOKS, WAIT);
    wait_acme(&server, |acme| {
        acme["delivered_total"] == HOOKS as u64 && acme["pending"] == 0
    });
    // The posted hooks were received before this; the replays' hooks after it.
    let posted_until_ms = now_ms() + 1;

    // Every hook delivered to the receiver is now in the archive: replay them all, and
    // let every replayed hook fail for good so the revive below has 10,000 rows.
    receiver.set_script(|_, _| Reply::status(400));
    let job = start_replay_job(&server, started_ms, posted_until_ms);
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

    // The posted hooks once more, each dead-lettered at once, then the whole DLQ purged
    // through the verb: each row was its hook's last, so every hook goes with it.
    receiver.set_script(|_, _| Reply::status(400));
    let replay = start_replay(&server, started_ms, posted_until_ms);
    let replayed = follow(&server, replay);
    assert_eq!(replayed.last().unwrap()["result"]["replayed"], HOOKS as u64);
    wait_acme(&server, |acme| {
        acme["dead"] == HOOKS as u64 && acme["pending"] == 0
    });
    let output = verb(&server, &["dlq", "purge", "--all"]);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{{\"hooks_deleted\":{HOOKS},\"purged\":{HOOKS}}}\n")
    );
    wait_acme(&server, |acme| acme["dead"] == 0);
    let purge = &server.admin_get("/v1/jobs").json()[0];
    assert_eq!(purge["kind"], "dlq_purge", "{purge}");
    assert_eq!(
        purge["request"],
        serde_json::json!({"all": true}),
        "{purge}"
    );
    assert_eq!(purge["total"], HOOKS as u64, "{purge}");
    assert_eq!(purge["done"], HOOKS as u64, "{purge}");

    // Every job is listed, newest first; unknown ids and other methods are refused.
    let listed = server.admin_get("/v1/jobs").json();
    let kinds: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "dlq_purge",
            "archive_replay",
            "dlq_revive",
            "archive_replay"
        ],
        "{listed}"
    );
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
    let replay = ["archive", "replay", "--tenant", "acme", "--source", "demo"];
    let output = verb(
        &server,
        &[&replay[..], &["--from", "0", "--to", "1"]].concat(),
    );
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
        5
    );

    server.stop_and_verify();
}

/// Sources for the tests below: `demo` (acme) delivers to `/acme`; `other` (globex) to
/// `/dead`, which the receiver refuses for good at a hook's first attempt.
fn two_tenants(receiver: &Receiver) -> String {
    http_sources(&[
        ("demo", "acme", &receiver.url("/acme")),
        ("other", "globex", &receiver.url("/dead")),
    ])
}

/// Reads the job until `until` holds of it (and fails the test if it finishes first).
fn job_until(server: &Server, id: u64, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let job = job_view(server, id);
        if until(&job) {
            return job;
        }
        assert!(
            job["state"] != "done" && job["state"] != "failed",
            "job {id} finished first: {job}"
        );
        assert!(Instant::now() < deadline, "job {id} never got there: {job}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn job_finished(server: &Server, id: u64) -> Value {
    finish_job(server, id, WAIT, Duration::from_millis(50))
}

/// Archives `count` hooks of `demo` (acme), all delivered; returns the range they were
/// received in.
fn archive_hooks(server: &Server, receiver: &Receiver, count: usize) -> (u64, u64) {
    let from_ms = now_ms();
    post_many(server, count);
    receiver.wait_for(WAIT, |received| {
        received.iter().filter(|r| r.path == "/acme").count() >= count
    });
    wait_until("acme never drained", WAIT, || {
        tenant_stats(server, "acme")["pending"] == 0
    });
    (from_ms, now_ms() + 1)
}

/// A replay runs on the jobs thread: while it does, at a budget that makes it last over
/// ten seconds, every other `/v1/` request is answered at once, with what the store holds.
/// Each request below would wait for the whole replay if it ran on the job's thread (and
/// the harness's 10 s read timeout would fail it); the job still running after all of them
/// answered is what shows they did not wait.
#[test]
fn the_admin_api_answers_while_a_budgeted_replay_runs() {
    const ARCHIVED: usize = 3_000;
    let receiver = Receiver::scripted(|request, earlier| {
        if request.path == "/dead" && earlier == 0 {
            Reply::status(400)
        } else {
            Reply::status(200)
        }
    });
    let budget = "tenant_defaults: {replay_rate_per_s: 200, replay_max_pending: 32}";
    let (_dir, _data, server) = start_in_temp_dir(budget, Some(&two_tenants(&receiver)));
    let (from_ms, to_ms) = archive_hooks(&server, &receiver, ARCHIVED);
    for index in 0..5 {
        let body = format!(r#"{{"dead":{index}}}"#);
        let response = server.post("/hooks/other", &[], body.as_bytes());
        assert_eq!(response.status, 202, "{response:?}");
    }
    wait_until("globex's hooks never died", WAIT, || {
        tenant_stats(&server, "globex")["dead"] == 5
    });

    let replay = start_replay(&server, from_ms, to_ms);
    job_until(&server, replay, |job| job["state"] == "running");

    let stats = server.admin_get("/v1/stats");
    assert_eq!(stats.status, 200, "{stats:?}");
    let stats = stats.json();
    let acme = find_tenant(&stats, "acme");
    assert!(
        acme["delivered_total"].as_u64().unwrap() >= ARCHIVED as u64,
        "{stats}"
    );
    assert!(stats["node"]["dead"].as_u64().unwrap() >= 5, "{stats}");

    let dlq = server.admin_get("/v1/dlq?tenant=globex");
    assert_eq!(dlq.status, 200, "{dlq:?}");
    let items = dlq.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 5, "{items:?}");
    assert!(
        items
            .iter()
            .all(|item| item["source"] == "other" && item["sink"] == "http"),
        "{items:?}"
    );

    let tenant = server.admin_get("/v1/tenants/acme");
    assert_eq!(tenant.status, 200, "{tenant:?}");
    let tenant = tenant.json();
    assert_eq!(tenant["id"], "acme", "{tenant}");
    assert_eq!(tenant["replay_rate_per_s"], 200, "{tenant}");
    let tenants = server.admin_get("/v1/tenants");
    assert_eq!(tenants.status, 200, "{tenants:?}");
    assert_eq!(tenants.json()["tenants"].as_array().unwrap().len(), 2);
    let quarantine = server.admin_get("/v1/quarantine?tenant=acme");
    assert_eq!(quarantine.status, 200, "{quarantine:?}");
    assert_eq!(quarantine.json()["items"], serde_json::json!([]));

    // Operated, not only looked at: one row revived (delivered at its second attempt) and
    // one purged, each answered at once.
    let (revive, purge) = (&items[0], &items[1]);
    let one_row = |item: &Value| {
        format!(
            r#"{{"tenant":"globex","seq":{},"sink":"http"}}"#,
            item["seq"]
        )
    };
    let revived = server.admin_post("/v1/dlq/revive", &one_row(revive));
    assert_eq!(revived.status, 200, "{revived:?}");
    assert_eq!(revived.json()["revived"], 1, "{revived:?}");
    let purged = server.admin_post("/v1/dlq/purge", &one_row(purge));
    assert_eq!(purged.status, 200, "{purged:?}");
    assert_eq!(purged.json()["purged"], 1, "{purged:?}");
    assert_eq!(purged.json()["hooks_deleted"], 1, "{purged:?}");
    let dlq = server.admin_get("/v1/dlq?tenant=globex").json();
    assert_eq!(dlq["items"].as_array().unwrap().len(), 3, "{dlq}");

    // All of that was answered while the replay ran.
    let running = job_view(&server, replay);
    assert_eq!(running["state"], "running", "{running}");
    assert!(
        running["done"].as_u64().unwrap() < ARCHIVED as u64,
        "{running}"
    );

    let done = job_finished(&server, replay);
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["result"]["replayed"], ARCHIVED as u64, "{done}");
    receiver.wait_for(WAIT, |received| {
        received.iter().filter(|r| r.path == "/acme").count() >= 2 * ARCHIVED
            && received.iter().filter(|r| r.path == "/dead").count() >= 6
    });
    server.stop_and_verify();
}

/// A revive of every row runs as a job beside single-row revives and purges of the same
/// rows: each row ends revived or purged exactly once. The job scans its rows before it
/// moves them, a few at a time under a budget of 25 rows/s, so the rows the single
/// requests take (the second half of the queue, which the job reaches seconds later) are
/// in its scan already: without the move lock and the re-read under it, the job would
/// revive rows that were purged or revived meanwhile (a row delivered twice, counters and
/// answers adding up to more rows than there were, a row without its hook).
#[test]
fn concurrent_revives_and_purges_move_each_dead_row_once() {
    const ROWS: usize = 400;
    let receiver = Receiver::scripted(|_, _| Reply::status(400));
    let budget = "tenant_defaults: {replay_rate_per_s: 25, replay_max_pending: 8}";
    let (_dir, _data, server) = start_in_temp_dir(budget, Some(&demo(&receiver)));
    post_many(&server, ROWS);
    wait_acme(&server, |acme| {
        acme["dead"] == ROWS as u64 && acme["pending"] == 0
    });
    let refused = receiver.received().len();
    assert_eq!(refused, ROWS);
    receiver.set_script(|_, _| Reply::status(200));

    let page = server.admin_get("/v1/dlq?tenant=acme&limit=1000").json();
    let mut seqs: Vec<u64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            assert_eq!(item["sink"], "http", "{item}");
            item["seq"].as_u64().unwrap()
        })
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs.len(), ROWS, "{page}");

    let started = server.admin_post("/v1/dlq/revive", r#"{"all":true,"background":true}"#);
    assert_eq!(started.status, 202, "{started:?}");
    let job = started.json()["id"].as_u64().unwrap();
    job_until(&server, job, |job| job["state"] == "running");

    // The second half, and a few rows of the first the job has already revived. Every
    // third is revived, every second purged: every sixth gets both, in either order.
    let targets: Vec<u64> = seqs[..8].iter().chain(&seqs[ROWS / 2..]).copied().collect();
    let revive_targets: Vec<u64> = targets.iter().copied().step_by(3).collect();
    let purge_targets: Vec<u64> = targets.iter().copied().step_by(2).collect();
    let one_row = |seq: u64| format!(r#"{{"tenant":"acme","seq":{seq},"sink":"http"}}"#);
    let (revived_by_one, purged_rows): (Vec<u64>, Vec<u64>) = std::thread::scope(|scope| {
        let reviver = scope.spawn(|| {
            let mut revived = Vec::new();
            for &seq in &revive_targets {
                let answer = server.admin_post("/v1/dlq/revive", &one_row(seq));
                assert_eq!(answer.status, 200, "{answer:?}");
                let answer = answer.json();
                assert_eq!(answer["skipped"], 0, "{answer}");
                match answer["revived"].as_u64().unwrap() {
                    0 => {}
                    1 => revived.push(seq),
                    other => panic!("one row revived {other} times"),
                }
            }
            revived
        });
        let purger = scope.spawn(|| {
            let mut purged = Vec::new();
            for &seq in &purge_targets {
                let answer = server.admin_post("/v1/dlq/purge", &one_row(seq));
                assert_eq!(answer.status, 200, "{answer:?}");
                let answer = answer.json();
                match answer["purged"].as_u64().unwrap() {
                    0 => {}
                    1 => {
                        assert_eq!(answer["hooks_deleted"], 1, "{answer}");
                        purged.push(seq);
                    }
                    other => panic!("one row purged {other} times"),
                }
            }
            purged
        });
        (reviver.join().unwrap(), purger.join().unwrap())
    });
    // The single requests all ran while the job did.
    let running = job_view(&server, job);
    assert_eq!(running["state"], "running", "{running}");

    let done = job_finished(&server, job);
    assert_eq!(done["state"], "done", "{done}");
    let revived_by_job = done["result"]["revived"].as_u64().unwrap();
    assert_eq!(done["result"]["skipped"], 0, "{done}");
    // The second half was taken by the single requests before the job got there.
    let second_half: BTreeSet<u64> = seqs[ROWS / 2..].iter().copied().collect();
    let taken: BTreeSet<u64> = revived_by_one.iter().chain(&purged_rows).copied().collect();
    let expected_taken = second_half
        .iter()
        .filter(|seq| revive_targets.contains(seq) || purge_targets.contains(seq))
        .count();
    assert_eq!(
        taken.iter().filter(|seq| second_half.contains(seq)).count(),
        expected_taken,
        "every targeted row of the second half was revived or purged by its single request"
    );
    assert_eq!(
        taken.len(),
        revived_by_one.len() + purged_rows.len(),
        "a row was both revived and purged"
    );
    assert_eq!(
        revived_by_job + revived_by_one.len() as u64 + purged_rows.len() as u64,
        ROWS as u64,
        "job {done}; {} revived and {} purged one at a time",
        revived_by_one.len(),
        purged_rows.len()
    );

    // Each row not purged is delivered exactly once more; no purged row is.
    let delivered_expected = ROWS - purged_rows.len();
    wait_acme(&server, |acme| {
        acme["delivered_total"] == delivered_expected as u64
            && acme["dead"] == 0
            && acme["pending"] == 0
            && acme["inflight"] == 0
    });
    receiver.wait_for(WAIT, |received| {
        received.len() >= refused + delivered_expected
    });
    // A second delivery of a row would come right after the first.
    std::thread::sleep(Duration::from_millis(500));
    let delivered: Vec<u64> = receiver.received()[refused..]
        .iter()
        .map(|request| request.seq())
        .collect();
    let distinct: BTreeSet<u64> = delivered.iter().copied().collect();
    assert_eq!(distinct.len(), delivered.len(), "a row was delivered twice");
    let purged: BTreeSet<u64> = purged_rows.iter().copied().collect();
    let not_purged: BTreeSet<u64> = seqs
        .iter()
        .copied()
        .filter(|seq| !purged.contains(seq))
        .collect();
    assert_eq!(distinct, not_purged);

    server.stop_and_verify();
}

/// SIGTERM while a budgeted replay runs in the background: the job stops at its next batch
/// and the process exits 0 well within a stop timeout, with a store that verifies.
#[test]
fn a_stop_during_a_background_replay_exits_cleanly() {
    const ARCHIVED: usize = 2_000;
    let receiver = Receiver::start();
    let budget = "tenant_defaults: {replay_rate_per_s: 100, replay_max_pending: 32}";
    let (_dir, data, mut server) = start_in_temp_dir(budget, Some(&two_tenants(&receiver)));
    let (from_ms, to_ms) = archive_hooks(&server, &receiver, ARCHIVED);
    let replay = start_replay(&server, from_ms, to_ms);
    // A second job queues behind the first: a stop must not start it.
    let queued = start_replay(&server, from_ms, to_ms);
    job_until(&server, replay, |job| {
        job["state"] == "running" && job["done"].as_u64().unwrap() > 0
    });
    assert_eq!(job_view(&server, queued)["state"], "queued");

    let stop_requested = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            stop_requested.elapsed() < Duration::from_secs(15),
            "still running 15 s after SIGTERM: {}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}: {}", server.stderr());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}
