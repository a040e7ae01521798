//! A load with a request limit sends exactly that many requests and ends as soon as they
//! are answered, long before its window would: the fixed-count stop `bench-gate drain`
//! posts its hooks with.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bench_gate::hooks::{HookSpec, Shape, Signing};
use bench_gate::load::{self, LoadPlan, Mode};
use bench_gate::responder::Responder;

#[test]
fn a_limited_closed_loop_sends_exactly_its_limit_and_stops() {
    let responder = Responder::start(200).unwrap();
    for (threads, limit) in [(1, 1), (1, 5_000), (2, 5_001)] {
        let before = responder.requests();
        let plan = LoadPlan {
            target: responder.addr(),
            connections: 16,
            threads,
            mode: Mode::Closed,
            start_at: Instant::now() + Duration::from_millis(50),
            warmup: Duration::ZERO,
            measure: Duration::from_secs(60),
            drain: Duration::from_secs(5),
            hooks: HookSpec {
                shape: Shape::Stripe,
                body_bytes: 1024,
                signing: Signing::None,
                paths: vec!["/hooks/bench".into()],
                ordering_keys: Some(10),
            },
            limit: Some(limit),
        };
        let started = Instant::now();
        let report = load::run(&plan).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{threads} threads, limit {limit}: ran to the window's end"
        );
        assert_eq!(report.total.status_2xx, limit, "{threads} threads");
        assert_eq!((report.total.status_other, report.total.errors), (0, 0));
        assert_eq!(responder.requests() - before, limit, "{threads} threads");
    }
    responder.stop();
}

#[test]
fn a_limited_open_loop_stops_at_its_limit() {
    let responder = Responder::start(200).unwrap();
    let plan = LoadPlan {
        target: responder.addr(),
        connections: 4,
        threads: 1,
        mode: Mode::Open { rate_per_s: 2000.0 },
        start_at: Instant::now() + Duration::from_millis(50),
        warmup: Duration::ZERO,
        measure: Duration::from_secs(60),
        drain: Duration::from_secs(5),
        hooks: HookSpec {
            shape: Shape::Stripe,
            body_bytes: 1024,
            signing: Signing::None,
            paths: vec!["/hooks/bench".into()],
            ordering_keys: None,
        },
        limit: Some(500),
    };
    let started = Instant::now();
    let report = load::run(&plan).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(report.total.status_2xx, 500);
    assert_eq!(report.missed, 0);
    assert_eq!(responder.requests(), 500);
    responder.stop();
}
