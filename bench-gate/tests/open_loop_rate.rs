//! Open-loop mode keeps its schedule: against the in-process trivial responder, requests
//! answered per second in the window are within 2% of the asked rate, none was missed, and
//! every answer has a latency.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bench_gate::hooks::{HookSpec, Shape, Signing};
use bench_gate::load::{self, LoadPlan, Mode};
use bench_gate::responder::Responder;

#[test]
fn open_loop_holds_its_rate_within_two_percent() {
    let responder = Responder::start(200).unwrap();
    let rate_per_s = 4000.0;
    let plan = LoadPlan {
        target: responder.addr(),
        connections: 8,
        threads: 1,
        mode: Mode::Open { rate_per_s },
        start_at: Instant::now() + Duration::from_millis(100),
        warmup: Duration::from_millis(300),
        measure: Duration::from_millis(2500),
        drain: Duration::from_secs(5),
        hooks: HookSpec {
            shape: Shape::Stripe,
            body_bytes: 1024,
            signing: Signing::None,
            paths: vec!["/hooks/bench".into()],
            ordering_keys: None,
        },
        limit: None,
    };
    let report = load::run(&plan).unwrap();
    let achieved = report.answers_per_s();
    assert!(
        (achieved - rate_per_s).abs() / rate_per_s < 0.02,
        "asked {rate_per_s}/s, got {achieved:.1}/s"
    );
    assert_eq!(report.missed, 0);
    assert_eq!((report.total.status_other, report.total.errors), (0, 0));
    assert_eq!(report.latency_us.len(), report.window.status_2xx);
    // Every request was answered: the whole run's count is the schedule's.
    let due = ((plan.warmup + plan.measure).as_secs_f64() * rate_per_s).ceil() as u64;
    assert_eq!(report.total.status_2xx, due);
    assert_eq!(responder.requests(), due);
    responder.stop();
}
