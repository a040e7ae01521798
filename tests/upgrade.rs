//! Store upgrades: every image in `fixtures/` (one per store format, written by
//! `ankusa store fixture`) opens with this binary, migrates to its format, passes
//! `store verify` in-process and through the binary, and holds exactly what its summary
//! says; a store from a newer format is refused with both formats named; and the command
//! still builds the checked-in image of the current format.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ankusa::store::fixture::{self, FixtureSummary};
use ankusa::store::{migrate, verify, Store, FORMAT};
use common::*;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Every `store-v<N>.tar.gz` in `fixtures/`, with its N, in format order.
fn images() -> Vec<(u32, PathBuf)> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?;
            let format = name
                .strip_prefix("store-v")?
                .strip_suffix(".tar.gz")?
                .parse()
                .ok()?;
            Some((format, path))
        })
        .collect();
    found.sort();
    found
}

fn image_of(format: u32) -> PathBuf {
    fixtures_dir().join(format!("store-v{format}.tar.gz"))
}

#[test]
fn every_format_has_an_image() {
    let formats: Vec<u32> = images().into_iter().map(|(format, _)| format).collect();
    assert_eq!(
        formats,
        (1..=FORMAT).collect::<Vec<_>>(),
        "fixtures/ needs store-v1 … store-v{FORMAT}.tar.gz; write the new one with \
         `ankusa store fixture --out fixtures/store-v{FORMAT}.tar.gz` (see fixtures/README.md)"
    );
}

#[test]
fn every_image_opens_migrates_and_verifies() {
    let images = images();
    assert!(
        !images.is_empty(),
        "no store images in {:?}",
        fixtures_dir()
    );
    for (format, tarball) in images {
        let scratch = tempfile::tempdir().unwrap();
        let data = scratch.path().join("data");
        let summary: FixtureSummary = fixture::unpack(&tarball, &data).unwrap();
        assert_eq!(summary.format, format, "{tarball:?} holds another format");

        // As written, before any migration.
        let store = Store::open_existing(&data).unwrap();
        assert_eq!(store.format().unwrap(), Some(format), "{tarball:?}");
        drop(store);

        let store = Store::open(&data).unwrap();
        assert_eq!(store.format().unwrap(), Some(FORMAT), "{tarball:?}");
        let report = verify::verify(&store).unwrap();
        assert!(
            report.clean(),
            "{tarball:?}: {:?} {:?}",
            report.problems,
            report.repairable
        );
        let mismatches = fixture::mismatches(&store, &summary).unwrap();
        assert!(mismatches.is_empty(), "{tarball:?}: {mismatches:?}");
        let hooks: u64 = summary.tenants.iter().map(|t| t.hooks).sum();
        let rows: u64 = summary.tenants.iter().map(|t| t.deliveries).sum();
        assert_eq!(
            (report.hooks, report.deliveries),
            (hooks, rows),
            "{tarball:?}"
        );
        // The image is not a trivial one: each tenant has work in several states.
        let total = |field: fn(&fixture::TenantSummary) -> i64| -> i64 {
            summary.tenants.iter().map(field).sum()
        };
        assert!(
            total(|t| t.pending) > 0 && total(|t| t.inflight) > 0,
            "{summary}"
        );
        assert!(
            total(|t| t.dead) > 0 && total(|t| t.archived as i64) > 0,
            "{summary}"
        );
        drop(store);

        let (ok, output) = store_verify(&data);
        assert!(ok, "{tarball:?}: {output}");
    }
}

#[test]
fn a_store_of_a_newer_format_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    fixture::unpack(&image_of(FORMAT), &data).unwrap();
    let store = Store::open(&data).unwrap();
    migrate::stamp(&store, FORMAT + 1).unwrap();
    drop(store);

    let expected = format!(
        "store at {} has format {}, newer than this binary's format {FORMAT}; run a newer ankusa",
        data.display(),
        FORMAT + 1
    );
    let error = Store::open(&data).unwrap_err();
    assert_eq!(error.to_string(), expected);
    let (ok, output) = store_verify(&data);
    assert!(!ok && output.contains(&expected), "{output}");
}

fn dump(store: &Store) -> fixture::Dump {
    fixture::dump(store).unwrap()
}

/// The command writes an image with the same summary and the same keys and values as the
/// checked-in image of the current format, so that image is what the command makes today
/// (regenerate it when this fails after a deliberate change: fixtures/README.md).
#[test]
fn the_command_rebuilds_the_current_image() {
    let scratch = tempfile::tempdir().unwrap();
    let tarball = scratch.path().join("store.tar.gz");
    let output = Command::new(BIN)
        .args(["store", "fixture", "--out"])
        .arg(&tarball)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("wrote "), "{stdout}");

    let built = scratch.path().join("built");
    let checked_in = scratch.path().join("checked-in");
    let built_summary = fixture::unpack(&tarball, &built).unwrap();
    let checked_in_summary = fixture::unpack(&image_of(FORMAT), &checked_in).unwrap();
    assert_eq!(built_summary, checked_in_summary);
    let built_data = dump(&Store::open(&built).unwrap());
    let checked_in_data = dump(&Store::open(&checked_in).unwrap());
    assert_eq!(built_data, checked_in_data);

    let output = Command::new(BIN)
        .args(["store", "fixture", "--format"])
        .arg((FORMAT + 1).to_string())
        .arg("--out")
        .arg(scratch.path().join("newer.tar.gz"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "builds format {FORMAT} images only, not format {}",
            FORMAT + 1
        )),
        "{stderr}"
    );
}

/// The lanes image (format 2) served by this binary: every pending row is delivered, and
/// each lane drains in seq order from where the image left it — the claimed head of
/// `cus_A` again first, the retrying head of `cus_B` before its members, the keyless lane
/// under the default key `acme/orders`.
#[test]
fn the_lanes_image_drains_its_lanes_in_order() {
    drains_in_order(2);
}

/// The current image likewise, with its replay-class rows (format 4) delivered too.
#[test]
fn the_current_image_drains_every_row() {
    let received = drains_in_order(FORMAT);
    for seq in [19, 20] {
        assert!(
            received.iter().any(|r| r.seq() == seq),
            "the replay-class row of seq {seq} was not delivered"
        );
    }
}

/// Serves the image of `format` until every pending row is delivered; checks the lanes'
/// order and the drained store, and returns what the receiver got.
fn drains_in_order(format: u32) -> Vec<common::receiver::Received> {
    let receiver = common::receiver::Receiver::start();
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let summary = fixture::unpack(&image_of(format), &data).unwrap();
    let pending: i64 = summary.tenants.iter().map(|t| t.pending).sum();
    let url = receiver.url("/in");
    let sources = format!(
        "
sources:
  - {{id: stripe, tenant: acme, sinks: [{{kind: http, url: '{url}'}}]}}
  - {{id: fanout, tenant: acme, sinks: [{{kind: http, url: '{url}'}}, {{kind: http, url: '{url}'}}]}}
  - {{id: shared, tenant: globex, sinks: [{{kind: http, url: '{url}'}}]}}
  - {{id: relay, tenant: globex, sinks: [{{kind: http, url: '{url}'}}, {{kind: http, url: '{url}'}}]}}
  - id: orders
    tenant: acme
    sinks:
      - {{kind: http, id: http, url: '{url}', ordered: true, ordering_key: {{json: customer}}}}
      - {{kind: http, id: audit, url: '{url}'}}
"
    );
    let server = Server::start(
        scratch.path(),
        &config_yaml(
            &data,
            "retry: {initial_ms: 50, max_ms: 200}\n",
            Some(&sources),
        ),
    );
    let received = receiver.wait_for_hooks(pending as usize, Duration::from_secs(60));
    assert!(server.stop().success());
    let lane = |key: &str| -> Vec<u64> {
        let mut seqs: Vec<u64> = received
            .iter()
            .filter(|r| r.header("x-ankusa-ordering-key") == Some(key))
            .map(|r| r.seq())
            .collect();
        seqs.dedup();
        seqs
    };
    assert_eq!(lane("cus_A"), vec![9, 10, 18]);
    assert_eq!(lane("cus_B"), vec![11, 12, 13]);
    assert_eq!(lane("acme/orders"), vec![14, 15]);
    assert_eq!(receiver.max_concurrency_per_ordering_key(), 1);
    let (ok, output) = store_verify(&data);
    assert!(ok, "{output}");
    let store = Store::open_existing(&data).unwrap();
    assert_eq!(
        store
            .counter(0, ankusa::store::keys::Counter::Pending)
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .counter(0, ankusa::store::keys::Counter::Lanes)
            .unwrap(),
        0
    );
    received
}
