//! Measuring cells: for each cell, start its server on loopback (data dir in a temp dir) and
//! the in-process receiver its sinks deliver to, run the load (warm-up, then the window),
//! sample the server's CPU time, metrics and peak RSS at the window's edges (and a gateway's
//! metrics during the window too, for delivered/s over time), check its lane metrics once the
//! load has stopped, stop it with SIGTERM (it must exit 0), and make the cell's rows.
//!
//! The orchestration is the top of the program, so its errors are `anyhow` with context;
//! the modules it drives have their own error types.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::cells::{Cell, Kind};
use crate::load::{self, LoadPlan, LoadReport};
use crate::report::{CdfPoint, CellRow, RatePoint, RunReport};
use crate::responder::Responder;
use crate::server::{self, Ankusa, Metrics, Nginx, ProcSample, ServerError};

/// The `server` of the row every ratio is taken against.
pub const REFERENCE_SERVER: &str = "ankusa --reference";
/// The gauges behind `/metrics` are refreshed every 250 ms; waiting this long after the load
/// stops makes the last scrape show its end.
const GAUGE_SETTLE: Duration = Duration::from_millis(600);
/// How often an ordered cell's busy lanes are scraped during the window, for their peak:
/// twice the gauges' refresh period, so each scrape sees a new value at little cost.
const LANES_SAMPLE: Duration = Duration::from_millis(500);
/// How often any other gateway cell's metrics are scraped during the window, for
/// delivered/s over time: rarely, so the scrapes cost the measured server next to nothing.
const DELIVERED_SAMPLE: Duration = Duration::from_secs(1);
/// The step of delivered/s over time. The counter behind it is refreshed every 250 ms, so
/// a step much shorter than a second would mostly show the refresh.
const DELIVERED_STEP_S: f64 = 1.0;

const LANE_SWEEPS: &str = "ankusa_dispatch_lane_sweeps_total";
const LANES: &str = "ankusa_dispatch_lanes";
const LANE_KEY_MISSING: &str = "ankusa_dispatch_lane_key_missing_total";

/// How long each phase lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
    pub drain: Duration,
    pub quick: bool,
}

/// What a run measures with.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub bin: PathBuf,
    pub timing: Timing,
    /// Load generator threads (one event loop each).
    pub threads: usize,
    /// Whether the reference cell also measures nginx.
    pub nginx: Option<PathBuf>,
}

/// Measures `cells` in order (the reference first, see `CellsFile::select`) and returns the
/// report with every ratio filled in. Progress goes to stderr.
pub fn run_cells(
    settings: &RunSettings,
    cells: &[Cell],
    revision: Option<String>,
) -> anyhow::Result<RunReport> {
    let mut report = RunReport {
        started_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs()),
        quick: settings.timing.quick,
        warmup_s: settings.timing.warmup.as_secs_f64(),
        measure_s: settings.timing.measure.as_secs_f64(),
        binary: settings.bin.display().to_string(),
        revision,
        rows: Vec::new(),
    };
    for cell in cells {
        let rows = measure_cell(settings, cell).with_context(|| format!("cell {}", cell.name))?;
        report.rows.extend(rows);
    }
    report.set_ratios();
    Ok(report)
}

/// One cell's rows: one for a gateway cell; the reference and, when asked and installed,
/// nginx for the reference cell.
pub fn measure_cell(settings: &RunSettings, cell: &Cell) -> anyhow::Result<Vec<CellRow>> {
    let mut rows = vec![measure_ankusa(settings, cell)?];
    if cell.kind == Kind::Reference && cell.nginx {
        match &settings.nginx {
            Some(nginx) => rows.push(measure_nginx(settings, cell, nginx)?),
            None => eprintln!("bench-gate: nginx is not on PATH; the reference has no nginx row"),
        }
    }
    Ok(rows)
}

fn temp_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("bench-gate-")
        .tempdir()
        .context("creating a temp dir")
}

fn plan(settings: &RunSettings, cell: &Cell, target: std::net::SocketAddr) -> LoadPlan {
    LoadPlan {
        target,
        connections: cell.connections,
        threads: settings.threads.clamp(1, cell.connections),
        mode: cell.mode(),
        // A moment to spare, so every connection is open before the first request.
        start_at: Instant::now() + Duration::from_millis(200),
        warmup: settings.timing.warmup,
        measure: settings.timing.measure,
        drain: settings.timing.drain,
        hooks: cell.hook_spec(),
        limit: None,
    }
}

fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// What is sampled at one edge of the window.
struct Edge {
    proc: ProcSample,
    delivered: Option<f64>,
    lanes: Option<f64>,
    writer: Option<WriterSample>,
}

/// The writer's histograms' sums and counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriterSample {
    pub batch_records_sum: f64,
    pub batches: f64,
    pub commit_seconds_sum: f64,
    pub commits: f64,
}

impl WriterSample {
    fn read(metrics: &Metrics) -> Option<WriterSample> {
        Some(WriterSample {
            batch_records_sum: metrics.value("ankusa_writer_batch_records_sum")?,
            batches: metrics.value("ankusa_writer_batch_records_count")?,
            commit_seconds_sum: metrics.value("ankusa_writer_sync_seconds_sum")?,
            commits: metrics.value("ankusa_writer_sync_seconds_count")?,
        })
    }
}

/// Mean records per batch and mean commit milliseconds between two samples; `None` when
/// no batch was committed between them.
pub fn writer_means(start: WriterSample, end: WriterSample) -> (Option<f64>, Option<f64>) {
    let batches = end.batches - start.batches;
    let commits = end.commits - start.commits;
    let batch =
        (batches > 0.0).then(|| (end.batch_records_sum - start.batch_records_sum) / batches);
    let commit_ms = (commits > 0.0)
        .then(|| (end.commit_seconds_sum - start.commit_seconds_sum) * 1000.0 / commits);
    (batch, commit_ms)
}

/// One scrape of a gateway's metrics during the window.
struct WindowSample {
    /// Seconds from the window's start.
    t_s: f64,
    delivered: Option<f64>,
    lanes: Option<f64>,
}

/// A counter's growth per second between its samples `(seconds, value)`, over steps of
/// at least `step_s` (the last may be shorter); each point sits at its step's middle.
pub fn counter_rates(samples: &[(f64, f64)], step_s: f64) -> Vec<RatePoint> {
    let mut rates = Vec::new();
    let Some((&first, rest)) = samples.split_first() else {
        return rates;
    };
    let mut from = first;
    for (index, &(t_s, value)) in rest.iter().enumerate() {
        let last = index + 1 == rest.len();
        let span_s = t_s - from.0;
        // A millisecond's slack: samples on a one-second grid are never exactly 1 s apart.
        if span_s >= step_s - 1e-3 || (last && span_s > 0.0) {
            rates.push(RatePoint {
                t_s: from.0 + span_s / 2.0,
                per_s: (value - from.1) / span_s,
            });
            from = (t_s, value);
        }
    }
    rates
}

/// The lane checks of a gateway cell, from its metrics once the load has stopped. With no
/// ordered sink the lane sweep must never run: any sweep fails the cell (an absent counter
/// reads as 0, as in a build without lanes). With ordered sinks every request carries its
/// key, so a hook that missed it means the cell measured the keyless lane instead.
pub fn lane_failures(ordered: bool, sweeps: Option<f64>, keys_missing: Option<f64>) -> Vec<String> {
    let mut failures = Vec::new();
    // NaN is no 0 either: anything but an absent or zero counter fails.
    let nonzero = |value: Option<f64>| value.filter(|value| *value != 0.0);
    if !ordered {
        if let Some(sweeps) = nonzero(sweeps) {
            failures.push(format!(
                "the lane sweep ran with no ordered sink: {LANE_SWEEPS} is {sweeps}, must stay 0"
            ));
        }
    } else if let Some(missing) = nonzero(keys_missing) {
        failures.push(format!(
            "{missing} hooks had no ordering key ({LANE_KEY_MISSING}{{sink=\"http\"}}), though \
             every body carries one"
        ));
    }
    failures
}

/// Scrapes the metrics every `period` from `start` until `until`, on a grid from `start`
/// so the samples are evenly spaced.
fn watch_window(
    server: &Ankusa,
    start: Instant,
    until: Instant,
    period: Duration,
) -> Result<Vec<WindowSample>, ServerError> {
    let mut samples = Vec::new();
    for step in 1u32.. {
        let next = start + period * step;
        if next >= until {
            break;
        }
        sleep_until(next);
        let t_s = Instant::now()
            .saturating_duration_since(start)
            .as_secs_f64();
        let metrics = server.metrics()?;
        samples.push(WindowSample {
            t_s,
            delivered: metrics.value("ankusa_delivered_total"),
            lanes: metrics.value(LANES),
        });
    }
    Ok(samples)
}

fn max_of(first: Option<f64>, second: Option<f64>) -> Option<f64> {
    match (first, second) {
        (Some(first), Some(second)) => Some(first.max(second)),
        (first, second) => first.or(second),
    }
}

/// A gauge or counter sample as a count; negative or non-finite values read as 0.
fn as_count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value as u64
    } else {
        0
    }
}

fn measure_ankusa(settings: &RunSettings, cell: &Cell) -> anyhow::Result<CellRow> {
    let reference = cell.kind == Kind::Reference;
    let server_name = if reference {
        REFERENCE_SERVER
    } else {
        "ankusa"
    };
    eprintln!(
        "bench-gate: {} ({server_name}, {})",
        cell.name,
        cell.load_label()
    );
    let dir = temp_dir()?;
    let receiver = Responder::start_delayed(200, Duration::from_millis(cell.sink_delay_ms))?;
    let sinks_at = if cell.sink_down {
        refused_addr()?
    } else {
        receiver.addr()
    };
    let server = Ankusa::start_cell(&settings.bin, cell, dir.path(), sinks_at, reference)?;
    let plan = plan(settings, cell, server.ingest);
    let pid = server.pid();
    let ordered = cell.ordered();
    let sample = |server: &Ankusa| -> anyhow::Result<Edge> {
        let proc = server::proc_sample(pid)?;
        if reference {
            return Ok(Edge {
                proc,
                delivered: None,
                lanes: None,
                writer: None,
            });
        }
        let metrics = server.metrics()?;
        Ok(Edge {
            proc,
            delivered: Some(metrics.required("ankusa_delivered_total")?),
            lanes: metrics.value(LANES),
            writer: WriterSample::read(&metrics),
        })
    };
    let (load, start, end, watched) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let load = scope.spawn(|| load::run(&plan));
        sleep_until(plan.measure_start());
        let start = sample(&server);
        let period = if ordered {
            LANES_SAMPLE
        } else {
            DELIVERED_SAMPLE
        };
        let watched = if reference {
            Ok(Vec::new())
        } else {
            watch_window(&server, plan.measure_start(), plan.end(), period)
        };
        sleep_until(plan.end());
        let end = sample(&server);
        let load = load
            .join()
            .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
        Ok((load, start?, end?, watched?))
    })?;
    let mut row = row(cell, server_name, &load, &start.proc, &end.proc);
    if !reference {
        std::thread::sleep(GAUGE_SETTLE);
        let metrics = server.metrics()?;
        if let (Some(first), Some(last)) = (start.delivered, end.delivered) {
            row.delivered_per_s = Some((last - first) / load.window_s);
            let mut delivered = vec![(0.0, first)];
            delivered.extend(
                watched
                    .iter()
                    .filter_map(|sample| sample.delivered.map(|value| (sample.t_s, value))),
            );
            delivered.push((load.window_s, last));
            row.delivered_per_s_over_time = counter_rates(&delivered, DELIVERED_STEP_S);
        }
        if let (Some(first), Some(last)) = (start.writer, end.writer) {
            (row.writer_batch_mean, row.writer_commit_ms_mean) = writer_means(first, last);
        }
        let lanes_seen = watched.iter().map(|sample| sample.lanes).fold(None, max_of);
        row.backlog = Some(metrics.required("ankusa_pending")? as u64);
        check_lanes(
            &mut row,
            cell,
            &metrics,
            [start.lanes, lanes_seen, end.lanes],
        );
        row.failures
            .extend(duplicate_failure(load.total.duplicates));
    }
    row.peak_rss_mib = server::proc_sample(pid)?.peak_rss_kib as f64 / 1024.0;
    server.stop()?;
    receiver.stop();
    complain(&row, &load);
    Ok(row)
}

/// A loopback address where nothing listens: a port bound for a moment, then let go, so a
/// connection there is refused.
fn refused_addr() -> std::io::Result<std::net::SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

/// A gateway row fails when any hook was answered 200: the generator's hooks are all new
/// (unique ids and bodies), so a duplicate answer means a hook was not stored.
pub fn duplicate_failure(duplicates: u64) -> Option<String> {
    (duplicates > 0).then(|| {
        format!(
            "{duplicates} hooks were answered 200 (duplicate) though every hook sent was new: \
             the gateway deduped hooks it should have stored"
        )
    })
}

/// Fills the row's lane columns and checks from the metrics read once the load has stopped;
/// `seen` are the busy lanes sampled during the window.
fn check_lanes(row: &mut CellRow, cell: &Cell, after: &Metrics, seen: [Option<f64>; 3]) {
    let ordered = cell.ordered();
    let sweeps = after.value(LANE_SWEEPS);
    row.lane_sweeps = Some(sweeps.map_or(0, as_count));
    if ordered {
        let last = after.value(LANES);
        let peak = seen.into_iter().fold(last, max_of);
        row.lanes_peak = peak.map(as_count);
        row.lanes_last = last.map(as_count);
    }
    row.delivery_bound_per_s = cell.delivery_bound_per_s();
    row.failures = lane_failures(
        ordered,
        sweeps,
        after.labelled_value(LANE_KEY_MISSING, "sink=\"http\""),
    );
}

fn measure_nginx(settings: &RunSettings, cell: &Cell, nginx: &Path) -> anyhow::Result<CellRow> {
    eprintln!("bench-gate: {} (nginx, {})", cell.name, cell.load_label());
    let dir = temp_dir()?;
    let server = Nginx::start(nginx, dir.path())?;
    let plan = plan(settings, cell, server.addr);
    let pid = server.pid();
    let (load, start, end) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let load = scope.spawn(|| load::run(&plan));
        sleep_until(plan.measure_start());
        let start = server::proc_sample(pid);
        sleep_until(plan.end());
        let end = server::proc_sample(pid);
        let load = load
            .join()
            .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
        Ok((load, start?, end?))
    })?;
    let mut row = row(cell, "nginx", &load, &start, &end);
    row.peak_rss_mib = server::proc_sample(pid)?.peak_rss_kib as f64 / 1024.0;
    server.stop()?;
    complain(&row, &load);
    Ok(row)
}

fn row(
    cell: &Cell,
    server: &str,
    load: &LoadReport,
    start: &ProcSample,
    end: &ProcSample,
) -> CellRow {
    let hooks = load.window.status_2xx;
    CellRow {
        cell: cell.name.clone(),
        server: server.to_string(),
        load: cell.load_label(),
        hooks_per_s: load.ok_per_s(),
        ack_p50_ms: load.latency_ms(0.50),
        ack_p99_ms: load.latency_ms(0.99),
        ack_p999_ms: load.latency_ms(0.999),
        delivered_per_s: None,
        backlog: None,
        peak_rss_mib: end.peak_rss_kib as f64 / 1024.0,
        cpu_s_per_1k_hooks: (hooks > 0).then(|| (end.cpu_s - start.cpu_s) / hooks as f64 * 1000.0),
        ratio_to_reference: None,
        total_2xx: load.total.status_2xx,
        total_other_status: load.total.status_other,
        total_errors: load.total.errors,
        missed: load.missed,
        generator_busy: load.generator_busy,
        lane_sweeps: None,
        lanes_peak: None,
        lanes_last: None,
        delivery_bound_per_s: None,
        writer_batch_mean: None,
        writer_commit_ms_mean: None,
        failures: Vec::new(),
        ack_latency_cdf: load
            .latency_cdf_ms()
            .into_iter()
            .map(|(percentile, ms)| CdfPoint { percentile, ms })
            .collect(),
        hooks_per_s_over_time: load
            .ok_per_s_over_time()
            .into_iter()
            .map(|(t_s, per_s)| RatePoint { t_s, per_s })
            .collect(),
        delivered_per_s_over_time: Vec::new(),
    }
}

/// Says on stderr when a row's numbers rest on refusals or errors, or it failed a check.
fn complain(row: &CellRow, load: &LoadReport) {
    for failure in &row.failures {
        eprintln!("bench-gate: {} ({}): FAIL: {failure}", row.cell, row.server);
    }
    if row.total_other_status > 0 || row.total_errors > 0 {
        eprintln!(
            "bench-gate: {} ({}): {} non-2xx answers (by status: {:?}) and {} errors; \
             its numbers count only 2xx",
            row.cell, row.server, row.total_other_status, load.total.statuses, row.total_errors
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn writer_means_are_taken_over_the_window_from_the_histograms() {
        let metrics = Metrics {
            text: "\
# TYPE ankusa_writer_batch_records histogram
ankusa_writer_batch_records_bucket{le=\"32\"} 30
ankusa_writer_batch_records_sum 1000
ankusa_writer_batch_records_count 50
ankusa_writer_sync_seconds_sum 0.1
ankusa_writer_sync_seconds_count 50
"
            .into(),
        };
        let start = WriterSample::read(&metrics).unwrap();
        assert_eq!(start.batch_records_sum, 1000.0);
        assert_eq!(start.commits, 50.0);
        let end = WriterSample {
            batch_records_sum: 4000.0,
            batches: 150.0,
            commit_seconds_sum: 0.3,
            commits: 150.0,
        };
        let (batch, commit_ms) = writer_means(start, end);
        // 3000 records in 100 batches; 0.2 s over 100 commits.
        assert_eq!(batch, Some(30.0));
        assert!((commit_ms.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(writer_means(end, end), (None, None));
        assert!(WriterSample::read(&Metrics {
            text: String::new()
        })
        .is_none());
    }

    #[test]
    fn the_lane_sweep_must_not_run_without_an_ordered_sink() {
        // Unordered: an absent or zero counter passes, anything else fails.
        assert_eq!(duplicate_failure(0), None);
        assert!(duplicate_failure(3)
            .unwrap()
            .starts_with("3 hooks were answered 200"));
        assert!(lane_failures(false, None, None).is_empty());
        assert!(lane_failures(false, Some(0.0), None).is_empty());
        assert_eq!(
            lane_failures(false, Some(3.0), None),
            ["the lane sweep ran with no ordered sink: \
              ankusa_dispatch_lane_sweeps_total is 3, must stay 0"]
        );
        assert_eq!(lane_failures(false, Some(f64::NAN), None).len(), 1);
        // Ordered: sweeps are expected; a hook without its key is not.
        assert!(lane_failures(true, Some(12_345.0), None).is_empty());
        assert!(lane_failures(true, Some(12_345.0), Some(0.0)).is_empty());
        assert_eq!(
            lane_failures(true, None, Some(7.0)),
            ["7 hooks had no ordering key \
              (ankusa_dispatch_lane_key_missing_total{sink=\"http\"}), though every body \
              carries one"]
        );
    }

    #[test]
    fn lane_columns_and_checks_come_from_the_metrics_after_the_load() {
        let file = crate::cells::CellsFile::parse(include_str!("../cells.yaml")).unwrap();
        let cell = |name: &str| file.cells.iter().find(|c| c.name == name).cloned().unwrap();
        let blank = || CellRow {
            cell: "x".into(),
            server: "ankusa".into(),
            load: "closed c=1".into(),
            hooks_per_s: 0.0,
            ack_p50_ms: 0.0,
            ack_p99_ms: 0.0,
            ack_p999_ms: 0.0,
            delivered_per_s: None,
            backlog: None,
            peak_rss_mib: 0.0,
            cpu_s_per_1k_hooks: None,
            ratio_to_reference: None,
            total_2xx: 0,
            total_other_status: 0,
            total_errors: 0,
            missed: 0,
            generator_busy: 0.0,
            lane_sweeps: None,
            lanes_peak: None,
            lanes_last: None,
            delivery_bound_per_s: None,
            writer_batch_mean: None,
            writer_commit_ms_mean: None,
            failures: Vec::new(),
            ack_latency_cdf: Vec::new(),
            hooks_per_s_over_time: Vec::new(),
            delivered_per_s_over_time: Vec::new(),
        };
        let metrics = |text: &str| Metrics { text: text.into() };

        let mut row = blank();
        check_lanes(
            &mut row,
            &cell("ack-unordered"),
            &metrics("ankusa_pending 0\n"),
            [None; 3],
        );
        assert_eq!((row.lane_sweeps, row.lanes_peak), (Some(0), None));
        assert!(row.failures.is_empty());

        let mut row = blank();
        check_lanes(
            &mut row,
            &cell("ack-unordered"),
            &metrics("ankusa_dispatch_lane_sweeps_total 2\n"),
            [None; 3],
        );
        assert_eq!(row.lane_sweeps, Some(2));
        assert_eq!(row.failures.len(), 1);

        let mut row = blank();
        check_lanes(
            &mut row,
            &cell("ordered-8-keys-20ms"),
            &metrics(
                "ankusa_dispatch_lane_sweeps_total 900\nankusa_dispatch_lanes 6\n\
                 ankusa_dispatch_lane_key_missing_total{sink=\"http\"} 0\n",
            ),
            [Some(7.0), Some(8.0), None],
        );
        assert_eq!(
            (row.lane_sweeps, row.lanes_peak, row.lanes_last),
            (Some(900), Some(8), Some(6))
        );
        assert_eq!(row.delivery_bound_per_s, Some(400.0));
        assert!(row.failures.is_empty(), "{:?}", row.failures);
    }

    #[test]
    fn delivered_over_time_is_the_counters_growth_per_step() {
        let check = |samples: &[(f64, f64)], expected: &[(f64, f64)]| {
            let got: Vec<(f64, f64)> = counter_rates(samples, 1.0)
                .iter()
                .map(|point| (point.t_s, point.per_s))
                .collect();
            assert_eq!(got, expected, "{samples:?}");
        };
        check(&[], &[]);
        check(&[(0.0, 5.0)], &[]);
        // Samples every 500 ms (an ordered cell's) make one-second steps.
        check(
            &[
                (0.0, 0.0),
                (0.5, 10.0),
                (1.0, 100.0),
                (1.5, 150.0),
                (2.0, 300.0),
            ],
            &[(0.5, 100.0), (1.5, 200.0)],
        );
        // A sample a hair early still closes its step.
        let early = counter_rates(&[(0.0, 0.0), (0.9995, 100.0), (1.5, 120.0)], 1.0);
        assert_eq!(early.len(), 2);
        assert!((early[0].per_s - 100.0 / 0.9995).abs() < 1e-9);
        // The window's end closes a shorter last step.
        check(
            &[(0.0, 0.0), (1.0, 100.0), (1.5, 200.0)],
            &[(0.5, 100.0), (1.25, 200.0)],
        );
    }
}
