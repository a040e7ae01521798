//! `bench-gate slowloris` end to end, small: 100 slow heads beside a 300/s load on the real
//! server. Every request of the load is acked on time in both phases, the slow heads are
//! held, and each is cut off with a 408 once the edge's 10 s header deadline passes.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bench_gate::cells::CellsFile;
use bench_gate::slowloris::{self, SlowlorisSettings};

#[test]
fn slow_heads_are_cut_off_while_the_load_is_served() {
    let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
    let cell = file
        .cells
        .iter()
        .find(|cell| cell.name == "ack-unordered")
        .unwrap();
    let settings = SlowlorisSettings {
        bin: common::ankusa_bin().to_path_buf(),
        slow: 100,
        rate: 300.0,
        connections: 4,
        // Past the 10 s header deadline, so every slow head is cut in the window.
        measure: Duration::from_secs(12),
        trickle: Duration::from_millis(500),
    };
    assert_eq!(settings.problems(), Vec::<String>::new());
    let report = slowloris::slowloris(&settings, cell, None).unwrap();
    let text = slowloris::render(&report);
    assert!(report.passed(), "{text}");
    for phase in [&report.alone, &report.attacked] {
        assert_eq!(
            (phase.non_2xx, phase.errors, phase.missed),
            (0, 0, 0),
            "{text}"
        );
        assert!(phase.ok_per_s > 0.0, "{text}");
    }
    assert!(
        report.slow_408 >= 100,
        "every slow head is cut with a 408: {text}"
    );
    assert!(report.slow_held_at_end > 0, "{text}");
    assert!(report.p99_ratio > 0.0, "{text}");
}
