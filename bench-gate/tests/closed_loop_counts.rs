//! The load generator's counts are the server's: after a short closed-loop run against the
//! real `ankusa serve`, the 2xx answers it counted equal `ankusa_ingested_total` exactly,
//! for signed Stripe-shaped hooks on one tenant and signed GitHub-shaped hooks spread over
//! tenants by path (a bad signature would show as 401s, not 2xx).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use bench_gate::cells::{Cell, CellsFile};
use bench_gate::hooks::{Shape, Signing};
use bench_gate::load::{self, LoadPlan, Mode};
use bench_gate::responder::Responder;
use bench_gate::server::Ankusa;

fn check_counts(cell: &Cell) {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Responder::start(200).unwrap();
    let config = dir.path().join("ankusa.yaml");
    std::fs::write(
        &config,
        cell.server_yaml(&dir.path().join("data"), receiver.addr()),
    )
    .unwrap();
    let server = Ankusa::start(
        common::ankusa_bin(),
        &config,
        false,
        &[],
        &dir.path().join("stderr.log"),
    )
    .unwrap();
    let plan = LoadPlan {
        target: server.ingest,
        connections: cell.connections,
        threads: 1,
        mode: Mode::Closed,
        start_at: Instant::now() + Duration::from_millis(100),
        warmup: Duration::from_millis(300),
        measure: Duration::from_millis(700),
        drain: Duration::from_secs(10),
        hooks: cell.hook_spec(),
        limit: None,
    };
    let report = load::run(&plan).unwrap();
    assert!(report.total.status_2xx > 0, "{}: no 2xx at all", cell.name);
    assert_eq!(
        report.total.duplicates, 0,
        "{}: a new hook answered 200",
        cell.name
    );
    assert_eq!(
        (report.total.status_other, report.total.errors),
        (0, 0),
        "{}: statuses {:?}",
        cell.name,
        report.total.statuses
    );
    assert!(report.window.status_2xx > 0 && report.window.status_2xx <= report.total.status_2xx);
    // The gauge is refreshed every 250 ms: wait until it shows the run, then make sure it
    // stays there.
    let expected = report.total.status_2xx as f64;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ingested = 0.0;
    while Instant::now() < deadline {
        ingested = server
            .metrics()
            .unwrap()
            .required("ankusa_ingested_total")
            .unwrap();
        if ingested >= expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(600));
    let settled = server
        .metrics()
        .unwrap()
        .required("ankusa_ingested_total")
        .unwrap();
    assert_eq!(
        (ingested, settled),
        (expected, expected),
        "{}: the generator counted {expected} 2xx",
        cell.name
    );
    server.stop().unwrap();
    receiver.stop();
}

#[test]
fn two_xx_count_equals_the_servers_ingest_counter() {
    let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
    let verified = file
        .cells
        .iter()
        .find(|cell| cell.name == "ack-verified")
        .unwrap();
    assert_eq!(verified.verify, Signing::Stripe);
    check_counts(&Cell {
        connections: 16,
        ..verified.clone()
    });
    check_counts(&Cell {
        name: "github-tenants".into(),
        tenants: 5,
        tenant_from_path: true,
        shape: Shape::Github,
        verify: Signing::Github,
        body_bytes: 2048,
        connections: 8,
        ..verified.clone()
    });
}
