//! A full disk against the real binary, on a small tmpfs data directory filled with a
//! ballast file: the edge answers 503 and never acks what it could not sync, delivery goes
//! on, ingest comes back when space returns, and the store verifies clean.
//!
//! Mounting a tmpfs needs root (CI runs as root). Without it the tests say SKIPPED loudly,
//! and under CI they fail.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::receiver::{Receiver, Reply};
use common::*;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size_mib: u64, test: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(path).unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(path)
            .output();
        let error = match output {
            Ok(output) if output.status.success() => {
                return Some(Tmpfs {
                    path: path.to_path_buf(),
                })
            }
            Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_string(),
            Err(error) => error.to_string(),
        };
        let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
        assert!(
            !ci,
            "{test}: cannot mount a tmpfs ({error}); CI runs as root and needs this test"
        );
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED: {test}: cannot mount a tmpfs ({error}); run as root"
        );
        None
    }

    /// Free bytes as an unprivileged writer sees them.
    fn free(&self) -> u64 {
        let output = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.path)
            .output()
            .unwrap();
        let text = String::from_utf8(output.stdout).unwrap();
        text.lines().nth(1).unwrap().trim().parse().unwrap()
    }

    /// Writes a ballast file that leaves about `leave` bytes free (or fills the disk).
    fn fill_leaving(&self, name: &str, leave: u64) -> PathBuf {
        let path = self.path.join(name);
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 1 << 20];
        loop {
            let free = self.free();
            if free <= leave {
                break;
            }
            let step = (free - leave).min(chunk.len() as u64) as usize;
            if file.write_all(&chunk[..step]).is_err() {
                break;
            }
            file.flush().unwrap();
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn config(data: &Path, receiver: &Receiver, min_free: &str) -> String {
    let sources = format!(
        "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {{kind: http, url: '{}'}}
",
        receiver.url("/in")
    );
    let extra = format!(
        "
store: {{min_free_bytes: {min_free}}}
edge: {{body_max_bytes: 256KiB}}
retry: {{initial_ms: 20, max_ms: 200}}
dispatch: {{breaker_open_ms: 100, breaker_open_max_ms: 200}}
"
    );
    config_yaml(data, &extra, Some(&sources))
}

/// A 64 KiB JSON body whose `id` names it, padded with hex digits that do not compress
/// (RocksDB compresses what it flushes, and a disk fills only with what it cannot shrink).
fn body(id: usize) -> Vec<u8> {
    let mut state = (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let pad: String = (0..64 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b"0123456789abcdef"[(state & 15) as usize])
        })
        .collect();
    format!(r#"{{"id":"h{id}","pad":"{pad}"}}"#).into_bytes()
}

/// Posts hooks from `next` on until one is refused (at most `max`); returns the acked ids
/// and the refusal.
fn post_until_refused(
    server: &Server,
    next: &mut usize,
    max: usize,
) -> (Vec<String>, Option<Response>) {
    let mut acked = Vec::new();
    for _ in 0..max {
        let id = *next;
        *next += 1;
        let response = server.post("/hooks/demo", &[], &body(id));
        if response.status == 202 {
            acked.push(format!("h{id}"));
        } else {
            return (acked, Some(response));
        }
    }
    (acked, None)
}

fn delivered_ids(receiver: &Receiver) -> BTreeSet<String> {
    receiver
        .received()
        .iter()
        .map(|received| received.field("id"))
        .collect()
}

fn wait_until_delivered(server: &Server, receiver: &Receiver, acked: &BTreeSet<String>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delivered = delivered_ids(receiver);
        if acked.is_subset(&delivered) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "acked but not delivered: {:?}\n{}\n{}",
            acked.difference(&delivered).collect::<Vec<_>>(),
            server.admin_get("/metrics").body,
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A server on a new tmpfs of `size_mib` with the reserve `min_free`, its receiver
/// answering 503 (deliveries wait until the test lets them through), and 8 hooks acked
/// while the disk is empty. `None` (the test skips) when no tmpfs can be mounted.
type Rig = (
    tempfile::TempDir,
    Tmpfs,
    Receiver,
    Server,
    usize,
    Vec<String>,
);

fn rig(test: &str, size_mib: u64, min_free: &str) -> Option<Rig> {
    let dir = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&dir.path().join("disk"), size_mib, test)?;
    let receiver = Receiver::start();
    receiver.set_script(|_, _| Reply::status(503));
    let data = disk.path.join("data");
    let server = Server::start(dir.path(), &config(&data, &receiver, min_free));
    let mut next = 0;
    let (acked, refusal) = post_until_refused(&server, &mut next, 8);
    assert_eq!(acked.len(), 8, "{refusal:?}");
    Some((dir, disk, receiver, server, next, acked))
}

/// The reserve: under `store.min_free_bytes` new hooks get 503 `disk_full` with
/// Retry-After and readiness fails, while the hooks already taken are delivered; once the
/// ballast goes, hooks are taken again.
#[test]
fn under_the_reserve_hooks_are_refused_and_delivery_goes_on() {
    let test = "under_the_reserve_hooks_are_refused_and_delivery_goes_on";
    // The default reserve: room for a new WAL (~70 MiB, preallocated at once) and a
    // memtable flush (64 MiB), which RocksDB needs to go on writing.
    let Some((_dir, disk, receiver, server, mut next, mut acked)) = rig(test, 1024, "256MiB")
    else {
        return;
    };
    let data = disk.path.join("data");
    let ballast = disk.fill_leaving("ballast", 264 << 20);
    // The WAL fills the room it preallocated first (up to ~70 MiB), then takes free space.
    let (more, refusal) = post_until_refused(&server, &mut next, 4000);
    acked.extend(more);
    let refusal = refusal.expect("the reserve never refused a hook");
    assert_eq!(refusal.status, 503, "{refusal:?}");
    assert_eq!(refusal.json()["error"], "disk_full", "{refusal:?}");
    assert!(refusal.header("retry-after").is_some(), "{refusal:?}");
    let ready = server.admin_get("/readyz");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["error"], "disk_full");
    let metrics = server.admin_get("/metrics").body;
    assert_eq!(metric(&metrics, "ankusa_store_disk_low"), Some(1.0));
    // Refused stays refused while the disk is low.
    let again = server.post("/hooks/demo", &[], &body(next));
    next += 1;
    assert_eq!(again.status, 503);

    // Delivery goes on under the reserve.
    receiver.set_script(|_, _| Reply::status(200));
    let acked: BTreeSet<String> = acked.into_iter().collect();
    wait_until_delivered(&server, &receiver, &acked);

    // Space returns: hooks are taken again within a few upkeep ticks.
    std::fs::remove_file(ballast).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let resumed = loop {
        let response = server.post("/hooks/demo", &[], &body(next));
        next += 1;
        if response.status == 202 {
            break format!("h{}", next - 1);
        }
        assert_eq!(
            response.json()["error"],
            "disk_full",
            "{response:?}\n{}",
            server.stderr()
        );
        assert!(Instant::now() < deadline, "ingest did not resume");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(server.admin_get("/readyz").status, 200);
    wait_until_delivered(&server, &receiver, &BTreeSet::from([resumed]));
    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}

/// The pipeline's failed store writes so far, as logged.
fn store_write_failures(server: &Server) -> usize {
    server
        .stderr()
        .lines()
        .filter(|line| {
            line.contains("tenant visit failed") || line.contains("outcome flush failed")
        })
        .count()
}

/// No reserve and a disk filled to the last byte: RocksDB's write fails and every hook of
/// that batch gets 503; nothing answered 2xx is lost, across a restart; ingest resumes once
/// space returns.
#[test]
fn a_full_disk_never_acks_what_it_could_not_sync() {
    let test = "a_full_disk_never_acks_what_it_could_not_sync";
    let Some((dir, disk, receiver, server, mut next, mut acked)) = rig(test, 512, "0") else {
        return;
    };
    let data = disk.path.join("data");
    let ballast = disk.fill_leaving("ballast", 0);
    let (more, refusal) = post_until_refused(&server, &mut next, 4000);
    acked.extend(more);
    let refusal = refusal.expect("a full disk took every hook");
    assert_eq!(refusal.status, 503, "{refusal:?}");
    assert_eq!(refusal.json()["error"], "store_unavailable", "{refusal:?}");
    assert!(refusal.header("retry-after").is_some(), "{refusal:?}");

    // The rig's receiver answers 503, so retries keep coming due and each claim is a store
    // write that now fails: the pipeline backs off (10 ms doubling to 1 s) rather than
    // retrying in a spin, which logged thousands of failures a second.
    let before = store_write_failures(&server);
    std::thread::sleep(Duration::from_secs(3));
    let during = store_write_failures(&server) - before;
    // Typically 1 before and 8 during (two cores backing off); a spin logs thousands.
    assert!(
        before + during >= 1 && during <= 200,
        "{before} failed pipeline store writes, then {during} in 3 s of a full disk\n{}",
        server.stderr()
    );

    std::fs::remove_file(ballast).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let response = server.post("/hooks/demo", &[], &body(next));
        next += 1;
        if response.status == 202 {
            acked.push(format!("h{}", next - 1));
            break;
        }
        assert_eq!(response.status, 503, "{response:?}");
        assert!(
            Instant::now() < deadline,
            "ingest did not resume after space returned: {response:?}\n{}",
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Every acked hook survives a restart and is delivered.
    server.kill();
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    receiver.set_script(|_, _| Reply::status(200));
    let server = Server::start(dir.path(), &config(&data, &receiver, "0"));
    let acked: BTreeSet<String> = acked.into_iter().collect();
    wait_until_delivered(&server, &receiver, &acked);
    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}
