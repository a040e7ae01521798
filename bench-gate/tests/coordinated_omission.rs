//! Open-loop latency is measured from when a request was due, not from when a busy
//! connection could finally send it: against a destination that takes 10 ms per answer on
//! one connection, a schedule of one request every 5 ms shows latencies growing far past
//! 10 ms (and the requests it could not send as missed), while a closed loop against the
//! same destination shows about 10 ms.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bench_gate::hooks::{HookSpec, Shape, Signing};
use bench_gate::load::{self, LoadPlan, LoadReport, Mode};
use bench_gate::responder::Responder;

fn run(mode: Mode, target: std::net::SocketAddr) -> LoadReport {
    load::run(&LoadPlan {
        target,
        connections: 1,
        threads: 1,
        mode,
        start_at: Instant::now() + Duration::from_millis(50),
        warmup: Duration::from_millis(200),
        measure: Duration::from_millis(1000),
        drain: Duration::from_secs(5),
        hooks: HookSpec {
            shape: Shape::Stripe,
            body_bytes: 1024,
            signing: Signing::None,
            paths: vec!["/hooks/bench".into()],
            ordering_keys: None,
        },
        limit: None,
    })
    .unwrap()
}

#[test]
fn open_loop_latency_counts_the_wait_for_a_connection() {
    let slow = Responder::start_delayed(200, Duration::from_millis(10)).unwrap();
    let closed = run(Mode::Closed, slow.addr());
    let open = run(Mode::Open { rate_per_s: 200.0 }, slow.addr());
    let closed_p50 = closed.latency_ms(0.5);
    let open_p50 = open.latency_ms(0.5);
    assert!(
        (9.0..30.0).contains(&closed_p50),
        "closed loop p50 {closed_p50} ms"
    );
    // By the window's middle the schedule is hundreds of ms ahead of the answers.
    assert!(open_p50 > 100.0, "open loop p50 {open_p50} ms");
    assert!(
        open.missed > 0,
        "requests due while the connection was busy"
    );
    assert_eq!((open.total.errors, closed.total.errors), (0, 0));
    slow.stop();
}
