//! Integrity digests: a stored hook whose bytes changed after its ack never goes out. It
//! is dead-lettered `corrupt`, `ankusa_integrity_failures_total` moves, and `store
//! verify` names it — whether the change is a flipped byte in the value (written through
//! the store's raw API, as a faulty disk or a stray write would leave it) or a damaged SST
//! file. And the format 2 → 3 migration that seals older stores reports its progress on
//! the admin port while it runs.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa::store::codec::{HookRecord, HOOK_VERSION_UNDIGESTED};
use ankusa::store::{keys, Store, WriteBatch, CF_ARCHIVE, CF_HOOKS};
use common::receiver::Receiver;
use common::*;

/// A source whose one HTTP sink (id `http`) posts to `url`, forwarding the stored
/// `x-note` header.
fn sources(url: &str) -> String {
    format!(
        "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, id: http, url: '{url}', forward_headers: [x-note]}}
"
    )
}

const RETRY: &str = "retry: {initial_ms: 50, max_ms: 100}\n";

/// Posts `bodies` to `demo` with an `x-note` header each, and stops the server with every
/// hook still pending (its sink refuses connections).
fn store_pending(dir: &Path, data: &Path, bodies: &[Vec<u8>]) {
    let server = Server::start(
        dir,
        &config_yaml(data, RETRY, Some(&sources("http://127.0.0.1:1/refused"))),
    );
    for (index, body) in bodies.iter().enumerate() {
        let note = format!("note-{}", index + 1);
        let response = server.post(
            "/hooks/demo",
            &[
                ("content-type", "application/octet-stream"),
                ("x-note", &note),
            ],
            body,
        );
        assert_eq!(response.status, 202, "{}", response.body);
    }
    assert!(server.stop().success());
}

fn dead_items(server: &Server) -> Vec<serde_json::Value> {
    let response = server.admin_get("/v1/dlq?tenant=acme");
    assert_eq!(response.status, 200, "{}", response.body);
    response.json()["items"].as_array().unwrap().clone()
}

fn wait_for_dead(server: &Server, count: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let items = dead_items(server);
        if items.len() >= count || Instant::now() > deadline {
            return items;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn integrity_failures(server: &Server) -> f64 {
    let metrics = server.admin_get("/metrics").body;
    metric(
        &metrics,
        "ankusa_integrity_failures_total{stage=\"delivery\"}",
    )
    .unwrap()
}

/// Flips one bit of `seq`'s stored record at the first occurrence of `needle`, through the
/// store's raw API: the value keeps its shape, only its bytes differ.
fn flip_in_hook(data: &Path, seq: u64, needle: &[u8]) {
    let store = Store::open_existing(data).unwrap();
    let ordinal = store.tenant_ordinal("acme").unwrap().unwrap();
    let mut key = Vec::new();
    keys::hook(&mut key, ordinal, seq);
    let mut value = store.get(CF_HOOKS, &key).unwrap().unwrap();
    let at = value
        .windows(needle.len())
        .position(|window| window == needle)
        .unwrap_or_else(|| panic!("{needle:?} is not in hook {seq}"));
    value[at + needle.len() / 2] ^= 0x01;
    let mut batch = WriteBatch::default();
    store.put_cf(&mut batch, CF_HOOKS, &key, &value);
    store.write(batch, true).unwrap();
    store.close().unwrap();
}

#[test]
fn a_hook_changed_after_its_ack_is_dead_lettered_corrupt_and_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let bodies: Vec<Vec<u8>> = (1..=4)
        .map(|n| format!("{{\"n\":{n},\"amount\":\"1000{n}\"}}").into_bytes())
        .collect();
    store_pending(dir.path(), &data, &bodies);
    // Seq 2: a byte of its body. Seq 3: a byte of a stored header's value.
    flip_in_hook(&data, 2, b"10002");
    flip_in_hook(&data, 3, b"note-3");

    let receiver = Receiver::start();
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, RETRY, Some(&sources(&receiver.url("/in")))),
    );
    let dead = wait_for_dead(&server, 2);
    let received = receiver.wait_for_hooks(2, Duration::from_secs(20));
    let mut delivered: Vec<(u64, Vec<u8>, String)> = received
        .iter()
        .map(|r| {
            (
                r.seq(),
                r.body.clone(),
                r.header("x-note").unwrap_or("").to_owned(),
            )
        })
        .collect();
    delivered.sort();
    assert_eq!(
        delivered,
        vec![
            (1, bodies[0].clone(), "note-1".to_owned()),
            (4, bodies[3].clone(), "note-4".to_owned())
        ]
    );

    let mut reasons: Vec<(u64, String)> = dead
        .iter()
        .map(|item| {
            (
                item["seq"].as_u64().unwrap(),
                item["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{dead:?}");
    for ((seq, reason), expected) in reasons.iter().zip([2, 3]) {
        assert_eq!(*seq, expected);
        assert!(
            reason.starts_with("corrupt: hook record fails its integrity digest (stored "),
            "{reason}"
        );
    }
    assert_eq!(integrity_failures(&server), 2.0);
    let metrics = server.admin_get("/metrics").body;
    assert_eq!(
        metric(
            &metrics,
            "ankusa_dispatch_dead_lettered_total{kind=\"unknown\",cause=\"corrupt\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
    // A revive runs the check again: the row dies again and nothing is sent.
    let revived = server.admin_post(
        "/v1/dlq/revive",
        r#"{"tenant": "acme", "seq": 2, "sink": "http"}"#,
    );
    assert_eq!(revived.status, 200, "{}", revived.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    while integrity_failures(&server) < 3.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(integrity_failures(&server), 3.0);
    assert_eq!(receiver.received().len(), 2);
    assert!(server.stop().success());

    let (ok, output) = store_verify(&data);
    assert!(!ok, "{output}");
    for seq in [2, 3] {
        assert!(
            output.contains(&format!(
                "FAIL hook 1/{seq}: hook record fails its integrity digest"
            )),
            "{output}"
        );
    }
}

/// Bytes that no compressor shrinks, so they are stored as they are and can be found in
/// an SST file: base64 of a pseudo-random stream, with a marker to find.
fn incompressible(seed: u64, len: usize, marker: &str) -> Vec<u8> {
    use base64::Engine;
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let raw: Vec<u8> = (0..len * 3 / 4)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let text = base64::engine::general_purpose::STANDARD.encode(raw);
    format!("{marker}{text}").into_bytes()
}

#[test]
fn a_damaged_sst_file_never_sends_the_damaged_hook() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    const HOOKS: u64 = 40;
    let marker = "MARKER-OF-HOOK-20-0123456789abcdef";
    let bodies: Vec<Vec<u8>> = (1..=HOOKS)
        .map(|n| {
            let marker = if n == 20 { marker } else { "" };
            incompressible(n, 1024, marker)
        })
        .collect();
    store_pending(dir.path(), &data, &bodies);
    // The hooks are in the WAL and the memtable: flush them into an SST file.
    let store = Store::open_existing(&data).unwrap();
    store.flush().unwrap();
    store.close().unwrap();
    let mut damaged = 0;
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("sst") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes
            .windows(marker.len())
            .position(|w| w == marker.as_bytes())
        {
            bytes[at + marker.len() / 2] ^= 0x01;
            std::fs::write(&path, bytes).unwrap();
            damaged += 1;
        }
    }
    assert_eq!(damaged, 1, "hook 20's body should be in one SST file");

    let receiver = Receiver::start();
    let server = Server::start(
        dir.path(),
        &config_yaml(&data, RETRY, Some(&sources(&receiver.url("/in")))),
    );
    // Every hook ends delivered or dead-lettered: RocksDB's block checksum fails the block
    // holding hook 20 (and whatever hooks share that block).
    let deadline = Instant::now() + Duration::from_secs(30);
    let (received, dead) = loop {
        let received = receiver.received();
        let dead = dead_items(&server);
        if received.len() + dead.len() >= HOOKS as usize || Instant::now() > deadline {
            break (received, dead);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let dead_seqs: Vec<u64> = dead
        .iter()
        .map(|item| item["seq"].as_u64().unwrap())
        .collect();
    assert!(dead_seqs.contains(&20), "{dead:?}");
    assert!(
        dead_seqs.len() < 10,
        "only the damaged block's hooks die: {dead_seqs:?}"
    );
    for item in &dead {
        let reason = item["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("corrupt: hook unreadable: rocksdb: Corruption"),
            "{reason}"
        );
    }
    for r in &received {
        assert!(!dead_seqs.contains(&r.seq()));
        assert_eq!(
            r.body,
            bodies[r.seq() as usize - 1],
            "hook {} arrived changed",
            r.seq()
        );
    }
    assert_eq!(received.len() + dead.len(), HOOKS as usize);
    assert_eq!(integrity_failures(&server), dead.len() as f64);
    assert!(server.stop().success());

    let (ok, output) = store_verify(&data);
    assert!(!ok, "{output}");
    assert!(
        output.contains("FAIL hooks family is damaged; entries past the damage were not checked: rocksdb: Corruption"),
        "{output}"
    );
}

/// One GET on a server that may not be listening yet: (status, retry-after, JSON body).
fn probe(
    admin: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Option<(u16, Option<String>, serde_json::Value)> {
    let mut stream = TcpStream::connect(admin).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let authorization = token
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: test\r\n{authorization}\r\n"
    )
    .ok()?;
    let response = read_response(&mut stream)?;
    let json = serde_json::from_str(&response.body).unwrap_or(serde_json::Value::Null);
    Some((
        response.status,
        response.header("retry-after").map(str::to_owned),
        json,
    ))
}

/// A format-2 store (hook records without digests) migrates to format 4 at start, and
/// while it does the admin port answers: `/healthz` 200, `/readyz` and other routes 503
/// `migrating` with a Retry-After, `/v1/` only with the token, and `/v1/jobs` the
/// migration's progress: done grows to the total. Once the node is ready the job is listed
/// done with every record, every record is sealed, and `store migrate` finds nothing to do.
#[test]
fn a_migration_reports_its_progress_on_the_admin_port() {
    const ARCHIVED: u64 = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    unsealed_store(&data, ARCHIVED);
    // `store migrate` on a copy: its own path to the same migration.
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let migrate_copy = |expected: &str| {
        let output = std::process::Command::new(BIN)
            .args(["store", "migrate", "--data-dir"])
            .arg(&copy)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(stdout.trim(), format!("{expected}"));
    };
    migrate_copy(&format!(
        "migrated store at {} from format 2 to 4",
        copy.display()
    ));
    migrate_copy(&format!(
        "store at {} is at format 4: nothing to migrate",
        copy.display()
    ));
    let (ok, output) = store_verify(&copy);
    assert!(ok, "{output}");

    let admin = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let token = "migration-token";
    let yaml = config_yaml(&data, "", None).replace(
        "admin_listen: 127.0.0.1:0",
        &format!("admin_listen: {admin}\n  admin_token: {token}"),
    );

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut others = Vec::new();
            while !stop.load(Ordering::Acquire) {
                if let Some((200, _, jobs)) = probe(admin, "/v1/jobs", Some(token)) {
                    let job = &jobs[0];
                    if job["kind"] == "store_migration" && job["state"] == "running" {
                        samples.push((job["done"].as_u64().unwrap(), job["total"].as_u64()));
                        if others.is_empty() {
                            for (path, token) in [
                                ("/healthz", None),
                                ("/readyz", None),
                                ("/v1/dlq", Some(token)),
                                ("/v1/jobs", None),
                            ] {
                                others.push((path, probe(admin, path, token)));
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (samples, others)
        })
    };
    let server = Server::start_env(
        dir.path(),
        &yaml,
        &[("ANKUSA_TEST_FAULT", "slow_migration")],
    );
    stop.store(true, Ordering::Release);
    let (samples, others) = watcher.join().unwrap();

    let running: Vec<u64> = samples.iter().map(|(done, _)| *done).collect();
    assert!(
        running.windows(2).all(|w| w[0] <= w[1]),
        "done went back: {running:?}"
    );
    assert!(
        samples.iter().all(|(_, total)| *total == Some(ARCHIVED)),
        "{samples:?}"
    );
    let mut distinct = running.clone();
    distinct.dedup();
    assert!(
        distinct
            .iter()
            .filter(|&&done| done > 0 && done < ARCHIVED)
            .count()
            >= 3,
        "too few progress points seen: {running:?}"
    );
    let status = |path: &str| {
        others
            .iter()
            .find(|(p, _)| *p == path)
            .and_then(|(_, r)| r.clone())
            .unwrap()
    };
    assert_eq!(status("/healthz").0, 200);
    for path in ["/readyz", "/v1/dlq"] {
        let (code, retry_after, body) = status(path);
        assert_eq!((code, retry_after.as_deref()), (503, Some("5")), "{path}");
        assert_eq!(body["error"], "migrating", "{path}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .starts_with("the store is migrating: "),
            "{body}"
        );
    }
    assert_eq!(status("/v1/jobs").0, 401);

    let authorization = format!("Bearer {token}");
    let jobs = server
        .admin_request(
            "GET",
            "/v1/jobs",
            &[("authorization", &authorization)],
            None,
        )
        .json();
    let job = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["kind"] == "store_migration")
        .unwrap_or_else(|| panic!("{jobs}"));
    assert_eq!(job["state"], "done");
    assert_eq!(
        (job["done"].as_u64(), job["total"].as_u64()),
        (Some(ARCHIVED), Some(ARCHIVED))
    );
    assert!(server.stop().success());

    let (ok, output) = store_verify(&data);
    assert!(ok, "{output}");
    let store = Store::open_existing(&data).unwrap();
    let mut sealed = 0;
    store
        .scan(CF_ARCHIVE, &[], None, |_, value| {
            assert_ne!(value[0], HOOK_VERSION_UNDIGESTED);
            HookRecord::decode(value).unwrap();
            sealed += 1;
            Ok(true)
        })
        .unwrap();
    assert_eq!(sealed, ARCHIVED);
}
