//! What a run and a compare produce: the rows (one per measured server per cell), the
//! plain-text tables printed to stdout, and the JSON written to `bench-gate/out/`.
//! Rendering is pure, so its exact output is tested. The HTML report drawn from the same
//! rows is `crate::html`'s.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One point of a latency CDF.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CdfPoint {
    /// 0 to 100; 100 is the maximum.
    pub percentile: f64,
    pub ms: f64,
}

/// One point of a rate over the measurement window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatePoint {
    /// Seconds from the window's start to the middle of the interval the rate is over.
    pub t_s: f64,
    pub per_s: f64,
}

/// One measured server of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRow {
    pub cell: String,
    /// `ankusa`, `ankusa --reference` or `nginx`.
    pub server: String,
    /// `closed c=64` or `open 5000/s c=64`.
    pub load: String,
    /// 2xx answers per second in the measurement window.
    pub hooks_per_s: f64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    pub ack_p999_ms: f64,
    /// `ankusa_delivered_total` growth per second over the window (gateway cells).
    pub delivered_per_s: Option<f64>,
    /// `ankusa_pending` once the load has stopped (gateway cells).
    pub backlog: Option<u64>,
    pub peak_rss_mib: f64,
    /// Server CPU seconds (user + system) per 1,000 hooks in the window.
    pub cpu_s_per_1k_hooks: Option<f64>,
    /// `hooks_per_s` over the `ankusa --reference` row's of the same run.
    pub ratio_to_reference: Option<f64>,
    /// Counts over the whole run (warm-up and drain included).
    pub total_2xx: u64,
    pub total_other_status: u64,
    pub total_errors: u64,
    /// Open loop: requests due but never sent because every connection was busy.
    pub missed: u64,
    /// The busiest load thread's CPU over the window, as a fraction of it (1.0 = a whole
    /// core): near 1 the generator set the pace, not the server.
    pub generator_busy: f64,
    /// `ankusa_dispatch_lane_sweeps_total` once the load has stopped, absent read as 0
    /// (gateway cells).
    #[serde(default)]
    pub lane_sweeps: Option<u64>,
    /// `ankusa_dispatch_lanes` (busy lanes): the most seen while the window was sampled,
    /// and the value once the load has stopped (ordered cells).
    #[serde(default)]
    pub lanes_peak: Option<u64>,
    #[serde(default)]
    pub lanes_last: Option<u64>,
    /// Delayed receiver: the most deliveries per second its lanes allow (see
    /// `Cell::delivery_bound_per_s`), to read `delivered_per_s` against.
    #[serde(default)]
    pub delivery_bound_per_s: Option<f64>,
    /// The writer over the window (gateway cells): mean records per committed batch and
    /// mean milliseconds per commit (WAL write and sync), from the growth of
    /// `ankusa_writer_batch_records` and `ankusa_writer_sync_seconds`. Closed-loop ack
    /// latency is about a batch's wait plus its commit, so these say where it goes.
    #[serde(default)]
    pub writer_batch_mean: Option<f64>,
    #[serde(default)]
    pub writer_commit_ms_mean: Option<f64>,
    /// Checks the row failed, whatever its numbers (say, the lane sweep ran with no ordered
    /// sink); a run with any exits 1.
    #[serde(default)]
    pub failures: Vec<String>,
    /// The window's ack latencies at `load::CDF_PERCENTILES`, for the HTML report's CDF.
    #[serde(default)]
    pub ack_latency_cdf: Vec<CdfPoint>,
    /// `hooks_per_s` per `load::THROUGHPUT_INTERVAL` of the window: a stall that the
    /// window's mean hides shows here.
    #[serde(default)]
    pub hooks_per_s_over_time: Vec<RatePoint>,
    /// `ankusa_delivered_total`'s growth per second, scraped during the window (gateway
    /// cells; empty otherwise).
    #[serde(default)]
    pub delivered_per_s_over_time: Vec<RatePoint>,
}

/// One `bench-gate run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub started_unix_s: u64,
    pub quick: bool,
    pub warmup_s: f64,
    pub measure_s: f64,
    /// The server binary measured.
    pub binary: String,
    /// `git describe --always --dirty` of the tree, when known.
    pub revision: Option<String>,
    pub rows: Vec<CellRow>,
}

impl RunReport {
    /// Whether any row failed a check.
    pub fn failed(&self) -> bool {
        self.rows.iter().any(|row| !row.failures.is_empty())
    }

    /// Fills every row's ratio to the `ankusa --reference` row.
    pub fn set_ratios(&mut self) {
        let reference = self
            .rows
            .iter()
            .find(|row| row.server == crate::run::REFERENCE_SERVER)
            .map(|row| row.hooks_per_s);
        for row in &mut self.rows {
            row.ratio_to_reference = match reference {
                Some(reference) if reference > 0.0 => Some(row.hooks_per_s / reference),
                _ => None,
            };
        }
    }

    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

/// A load thread busier than this (of one core) may be what limits the rate.
const GENERATOR_BUSY_WARNING: f64 = 0.9;

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_string(), |value| format!("{value:.decimals$}"))
}

/// The run table's columns; the first [`RUN_TEXT_COLUMNS`] are text, the rest numbers.
pub(crate) const RUN_HEADER: [&str; 19] = [
    "cell",
    "server",
    "load",
    "hooks/s",
    "p50 ms",
    "p99 ms",
    "p999 ms",
    "delivered/s",
    "backlog",
    "batch",
    "commit ms",
    "peak RSS MiB",
    "CPU s/1k",
    "vs ref",
    "2xx/other/err",
    "gen busy",
    "sweeps",
    "lanes pk/last",
    "checks",
];
pub(crate) const RUN_TEXT_COLUMNS: usize = 3;

/// The run table's lines, one per row, in [`RUN_HEADER`]'s order.
pub(crate) fn run_lines(report: &RunReport) -> Vec<Vec<String>> {
    let count = |value: Option<u64>| value.map_or_else(|| "-".to_string(), |n| n.to_string());
    report
        .rows
        .iter()
        .map(|row| {
            vec![
                row.cell.clone(),
                row.server.clone(),
                row.load.clone(),
                format!("{:.0}", row.hooks_per_s),
                format!("{:.2}", row.ack_p50_ms),
                format!("{:.2}", row.ack_p99_ms),
                format!("{:.2}", row.ack_p999_ms),
                optional(row.delivered_per_s, 0),
                row.backlog
                    .map_or_else(|| "-".to_string(), |backlog| backlog.to_string()),
                optional(row.writer_batch_mean, 1),
                optional(row.writer_commit_ms_mean, 2),
                format!("{:.1}", row.peak_rss_mib),
                optional(row.cpu_s_per_1k_hooks, 3),
                optional(row.ratio_to_reference, 2),
                format!(
                    "{}/{}/{}",
                    row.total_2xx, row.total_other_status, row.total_errors
                ),
                format!("{:.0}%", row.generator_busy * 100.0),
                count(row.lane_sweeps),
                match (row.lanes_peak, row.lanes_last) {
                    (None, None) => "-".to_string(),
                    (peak, last) => format!("{}/{}", count(peak), count(last)),
                },
                if !row.failures.is_empty() {
                    "FAIL".into()
                } else if row.lane_sweeps.is_some() {
                    "ok".into()
                } else {
                    "-".into()
                },
            ]
        })
        .collect()
}

/// The run's table: one line per row, then the run's facts.
pub fn render_run(report: &RunReport) -> String {
    let mut text = table(&RUN_HEADER, &run_lines(report), RUN_TEXT_COLUMNS);
    let _ = writeln!(
        text,
        "warm-up {} s, measured {} s{}; binary {}{}",
        report.warmup_s,
        report.measure_s,
        if report.quick { " (--quick)" } else { "" },
        report.binary,
        report
            .revision
            .as_ref()
            .map_or_else(String::new, |revision| format!(" ({revision})"))
    );
    if report
        .rows
        .iter()
        .any(|row| row.generator_busy > GENERATOR_BUSY_WARNING)
    {
        let _ = writeln!(
            text,
            "gen busy over {:.0}%: the load generator, not the server, may have set the pace \
             there; ratios understate differences (try --threads 2)",
            GENERATOR_BUSY_WARNING * 100.0
        );
    }
    let missed: u64 = report.rows.iter().map(|row| row.missed).sum();
    if missed > 0 {
        let _ = writeln!(
            text,
            "open loop: {missed} requests fell due with every connection busy and were not sent"
        );
    }
    for row in &report.rows {
        if let (Some(delivered), Some(bound)) = (row.delivered_per_s, row.delivery_bound_per_s) {
            if bound > 0.0 {
                // A cell that holds delivery back has a bound under one per second.
                let digits = if bound < 10.0 { 1 } else { 0 };
                let _ = writeln!(
                    text,
                    "{}: delivered/s is {:.2} of its bound of {bound:.digits$}/s (busy lanes x \
                     1 / receiver delay)",
                    row.cell,
                    delivered / bound
                );
            }
        }
    }
    let failures: usize = report.rows.iter().map(|row| row.failures.len()).sum();
    for row in &report.rows {
        for failure in &row.failures {
            let _ = writeln!(text, "FAIL {} ({}): {failure}", row.cell, row.server);
        }
    }
    if failures > 0 {
        let _ = writeln!(text, "FAIL: {failures} failed check(s)");
    }
    text
}

/// Columns left-aligned up to `text_columns`, right-aligned after, two spaces apart.
pub(crate) fn table(header: &[&str], lines: &[Vec<String>], text_columns: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|name| name.len()).collect();
    for line in lines {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut push = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (index, (cell, width)) in cells.zip(&widths).enumerate() {
            if index > 0 {
                line.push_str("  ");
            }
            if index < text_columns {
                let _ = write!(line, "{cell:<width$}");
            } else {
                let _ = write!(line, "{cell:>width$}");
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    };
    push(&mut header.iter().copied());
    for line in lines {
        push(&mut line.iter().map(String::as_str));
    }
    text
}

/// min, median and max of one head/base ratio over the pairs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    /// `None` for no values or any value that is not a finite number.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|value| !value.is_finite()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 {
            sorted[middle]
        } else {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        };
        Some(Spread {
            min: sorted[0],
            median,
            max: sorted[sorted.len() - 1],
        })
    }

    fn render(spread: Option<Spread>) -> String {
        spread.map_or_else(
            || "-".to_string(),
            |spread| {
                format!(
                    "{:.3} / {:.3} / {:.3}",
                    spread.min, spread.median, spread.max
                )
            },
        )
    }
}

/// One row of a compare: a measured server of a cell, head over base.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    pub cell: String,
    pub server: String,
    /// head hooks/s over base hooks/s, per pair.
    pub throughput_ratios: Vec<f64>,
    /// head p99 over base p99, per pair.
    pub p99_ratios: Vec<f64>,
    pub throughput: Option<Spread>,
    pub p99: Option<Spread>,
    pub thresholds: crate::cells::Thresholds,
    /// `None` for rows whose ratios are not gated (nginx: not our code; cells that are not
    /// `in_compare`) and that failed no check.
    pub pass: Option<bool>,
    /// Checks the head failed in some pair (`pair N: …`): each fails the row whatever its
    /// ratios.
    #[serde(default)]
    pub failures: Vec<String>,
    /// Each side's hooks/s per pair, in the order the pairs ran, for the HTML report.
    #[serde(default)]
    pub base_hooks_per_s: Vec<f64>,
    #[serde(default)]
    pub head_hooks_per_s: Vec<f64>,
    /// Each side's latency CDF from its median run by hooks/s.
    #[serde(default)]
    pub base_latency_cdf: Vec<CdfPoint>,
    #[serde(default)]
    pub head_latency_cdf: Vec<CdfPoint>,
}

impl CompareRow {
    /// Computes the spreads and the verdict: FAIL when the head failed a check, when the
    /// median throughput ratio is under the minimum or the median p99 ratio over the
    /// maximum; a gated row without a number fails.
    pub fn decide(&mut self, gated: bool) {
        self.throughput = Spread::of(&self.throughput_ratios);
        self.p99 = Spread::of(&self.p99_ratios);
        let inside = match (self.throughput, self.p99) {
            (Some(throughput), Some(p99)) => {
                throughput.median >= self.thresholds.throughput_ratio_min
                    && p99.median <= self.thresholds.p99_ratio_max
            }
            _ => false,
        };
        self.pass = if self.failures.is_empty() {
            gated.then_some(inside)
        } else {
            Some(false)
        };
    }
}

/// One `bench-gate compare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub base: String,
    pub head: String,
    pub pairs: usize,
    pub quick: bool,
    pub rows: Vec<CompareRow>,
}

impl CompareReport {
    /// PASS when every gated row passes.
    pub fn pass(&self) -> bool {
        self.rows.iter().all(|row| row.pass != Some(false))
    }

    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
    }
}

/// The compare table's columns.
pub(crate) const COMPARE_HEADER: [&str; 6] = [
    "cell",
    "server",
    "hooks/s head/base",
    "p99 head/base",
    "thresholds",
    "verdict",
];

/// The compare table's lines, one per row, in [`COMPARE_HEADER`]'s order.
pub(crate) fn compare_lines(report: &CompareReport) -> Vec<Vec<String>> {
    report
        .rows
        .iter()
        .map(|row| {
            vec![
                row.cell.clone(),
                row.server.clone(),
                Spread::render(row.throughput),
                Spread::render(row.p99),
                format!(
                    ">= {} / <= {}",
                    row.thresholds.throughput_ratio_min, row.thresholds.p99_ratio_max
                ),
                match row.pass {
                    Some(true) => "PASS".into(),
                    Some(false) => "FAIL".into(),
                    None => "(not gated)".into(),
                },
            ]
        })
        .collect()
}

/// The compare table: head/base ratios (min / median / max) and each cell's verdict.
pub fn render_compare(report: &CompareReport) -> String {
    let mut text = table(
        &COMPARE_HEADER,
        &compare_lines(report),
        COMPARE_HEADER.len(),
    );
    for row in &report.rows {
        for failure in &row.failures {
            let _ = writeln!(text, "FAIL {} ({}): head {failure}", row.cell, row.server);
        }
    }
    let _ = writeln!(
        text,
        "ratios min / median / max over {} pairs run alternately{}; base {}, head {}",
        report.pairs,
        if report.quick { " (--quick)" } else { "" },
        report.base,
        report.head
    );
    if report.quick {
        let _ = writeln!(
            text,
            "--quick measures a few seconds per cell: too short to gate a change on"
        );
    }
    let _ = writeln!(text, "{}", if report.pass() { "PASS" } else { "FAIL" });
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cells::Thresholds;

    fn row(cell: &str, server: &str, hooks_per_s: f64) -> CellRow {
        CellRow {
            cell: cell.into(),
            server: server.into(),
            load: "closed c=64".into(),
            hooks_per_s,
            ack_p50_ms: 0.8,
            ack_p99_ms: 2.345,
            ack_p999_ms: 4.5,
            delivered_per_s: None,
            backlog: None,
            peak_rss_mib: 70.25,
            cpu_s_per_1k_hooks: Some(0.0231),
            ratio_to_reference: None,
            total_2xx: 10,
            total_other_status: 0,
            total_errors: 0,
            missed: 0,
            generator_busy: 0.5,
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
        }
    }

    fn sample() -> RunReport {
        let mut gateway = row("ack-unordered", "ankusa", 45_000.0);
        gateway.delivered_per_s = Some(12_000.4);
        gateway.backlog = Some(99_000);
        gateway.total_2xx = 180_000;
        gateway.total_other_status = 2;
        gateway.total_errors = 1;
        gateway.lane_sweeps = Some(0);
        gateway.writer_batch_mean = Some(28.44);
        gateway.writer_commit_ms_mean = Some(1.624);
        gateway.ack_latency_cdf = vec![CdfPoint {
            percentile: 99.0,
            ms: 2.345,
        }];
        gateway.hooks_per_s_over_time = vec![RatePoint {
            t_s: 0.125,
            per_s: 44_000.0,
        }];
        gateway.delivered_per_s_over_time = vec![RatePoint {
            t_s: 0.5,
            per_s: 12_000.0,
        }];
        let mut report = RunReport {
            started_unix_s: 1_760_000_000,
            quick: true,
            warmup_s: 1.0,
            measure_s: 3.0,
            binary: "/var/tmp/ankusa-target/release/ankusa".into(),
            revision: Some("c6e8814-dirty".into()),
            rows: vec![
                row("reference", "ankusa --reference", 90_000.0),
                row("reference", "nginx", 120_000.0),
                gateway,
            ],
        };
        report.set_ratios();
        report
    }

    #[test]
    fn the_run_table_is_aligned_and_complete() {
        let expected = "\
cell           server              load         hooks/s  p50 ms  p99 ms  p999 ms  delivered/s  backlog  batch  commit ms  peak RSS MiB  CPU s/1k  vs ref  2xx/other/err  gen busy  sweeps  lanes pk/last  checks
reference      ankusa --reference  closed c=64    90000    0.80    2.35     4.50            -        -      -          -          70.2     0.023    1.00         10/0/0       50%       -              -       -
reference      nginx               closed c=64   120000    0.80    2.35     4.50            -        -      -          -          70.2     0.023    1.33         10/0/0       50%       -              -       -
ack-unordered  ankusa              closed c=64    45000    0.80    2.35     4.50        12000    99000   28.4       1.62          70.2     0.023    0.50     180000/2/1       50%       0              -      ok
warm-up 1 s, measured 3 s (--quick); binary /var/tmp/ankusa-target/release/ankusa (c6e8814-dirty)
";
        assert_eq!(render_run(&sample()), expected);
        let mut busy = sample();
        busy.rows[1].generator_busy = 0.95;
        busy.rows[2].missed = 7;
        let text = render_run(&busy);
        assert!(
            text.ends_with(
                "gen busy over 90%: the load generator, not the server, may have set the pace \
                 there; ratios understate differences (try --threads 2)\n\
                 open loop: 7 requests fell due with every connection busy and were not sent\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn failed_checks_are_marked_in_the_table_and_fail_the_run() {
        let mut report = sample();
        assert!(!report.failed());
        report.rows[2].lane_sweeps = Some(3);
        report.rows[2].failures = vec!["the lane sweep ran with no ordered sink".into()];
        let mut ordered = row("ordered-1-key-20ms", "ankusa", 100.0);
        ordered.delivered_per_s = Some(48.0);
        ordered.delivery_bound_per_s = Some(50.0);
        ordered.lane_sweeps = Some(1234);
        ordered.lanes_peak = Some(1);
        ordered.lanes_last = Some(1);
        report.rows.push(ordered);
        assert!(report.failed());
        let text = render_run(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].ends_with("gen busy  sweeps  lanes pk/last  checks"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("ack-unordered ")
                && lines[3].ends_with("50%       3              -    FAIL"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("ordered-1-key-20ms ")
                && lines[4].ends_with("50%    1234            1/1      ok"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "ordered-1-key-20ms: delivered/s is 0.96 of its bound of 50/s (busy lanes x 1 \
                 / receiver delay)\n\
                 FAIL ack-unordered (ankusa): the lane sweep ran with no ordered sink\n\
                 FAIL: 1 failed check(s)\n"
            ),
            "{text}"
        );
        // A cell holding delivery back: its 0.2/s bound must not read "0/s".
        let held = report.rows.last_mut().unwrap();
        held.delivered_per_s = Some(0.1);
        held.delivery_bound_per_s = Some(0.2);
        let text = render_run(&report);
        assert!(
            text.contains("delivered/s is 0.50 of its bound of 0.2/s"),
            "{text}"
        );
    }

    #[test]
    fn ratios_are_to_the_reference_row_and_absent_without_one() {
        let report = sample();
        let ratios: Vec<Option<f64>> = report
            .rows
            .iter()
            .map(|row| row.ratio_to_reference)
            .collect();
        assert_eq!(ratios, [Some(1.0), Some(120.0 / 90.0), Some(0.5)]);
        let mut without = sample();
        without.rows.remove(0);
        without.set_ratios();
        assert!(without
            .rows
            .iter()
            .all(|row| row.ratio_to_reference.is_none()));
    }

    #[test]
    fn the_json_round_trips_with_stable_field_names() {
        let report = sample();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out").join("latest.json");
        report.write_json(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back: RunReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let gateway = &value["rows"][2];
        assert_eq!(gateway["cell"], "ack-unordered");
        assert_eq!(gateway["hooks_per_s"], 45_000.0);
        assert_eq!(gateway["ack_p99_ms"], 2.345);
        assert_eq!(gateway["delivered_per_s"], 12_000.4);
        assert_eq!(gateway["backlog"], 99_000);
        assert_eq!(gateway["ratio_to_reference"], 0.5);
        assert_eq!(value["rows"][0]["backlog"], serde_json::Value::Null);
        assert_eq!(gateway["lane_sweeps"], 0);
        assert_eq!(gateway["failures"], serde_json::json!([]));
        assert_eq!(
            gateway["ack_latency_cdf"],
            serde_json::json!([{"percentile": 99.0, "ms": 2.345}])
        );
        assert_eq!(
            gateway["hooks_per_s_over_time"],
            serde_json::json!([{"t_s": 0.125, "per_s": 44_000.0}])
        );
        assert_eq!(
            gateway["delivered_per_s_over_time"],
            serde_json::json!([{"t_s": 0.5, "per_s": 12_000.0}])
        );
        // A report written before the lane fields still reads.
        let mut old = value.clone();
        for row in old["rows"].as_array_mut().unwrap() {
            let row = row.as_object_mut().unwrap();
            for field in [
                "lane_sweeps",
                "lanes_peak",
                "lanes_last",
                "delivery_bound_per_s",
                "failures",
                "ack_latency_cdf",
                "hooks_per_s_over_time",
                "delivered_per_s_over_time",
            ] {
                row.remove(field).unwrap();
            }
        }
        let old: RunReport = serde_json::from_value(old).unwrap();
        assert_eq!(old.rows[2].lane_sweeps, None);
        assert_eq!(value["quick"], true);
    }

    #[test]
    fn spreads() {
        let check = |values: &[f64], expected: Option<(f64, f64, f64)>| {
            assert_eq!(
                Spread::of(values).map(|spread| (spread.min, spread.median, spread.max)),
                expected,
                "{values:?}"
            );
        };
        check(&[1.0, 0.9, 1.1], Some((0.9, 1.0, 1.1)));
        check(&[1.0, 0.5, 0.9, 2.0], Some((0.5, 0.95, 2.0)));
        check(&[], None);
        check(&[1.0, f64::NAN], None);
    }

    fn compare_row(throughput: &[f64], p99: &[f64], gated: bool) -> CompareRow {
        let mut row = CompareRow {
            cell: "ack-unordered".into(),
            server: "ankusa".into(),
            throughput_ratios: throughput.to_vec(),
            p99_ratios: p99.to_vec(),
            throughput: None,
            p99: None,
            thresholds: Thresholds {
                throughput_ratio_min: 0.97,
                p99_ratio_max: 1.10,
            },
            pass: None,
            failures: Vec::new(),
            base_hooks_per_s: Vec::new(),
            head_hooks_per_s: Vec::new(),
            base_latency_cdf: Vec::new(),
            head_latency_cdf: Vec::new(),
        };
        row.decide(gated);
        row
    }

    #[test]
    fn verdicts_follow_the_medians() {
        let check = |throughput: &[f64], p99: &[f64], expected: Option<bool>| {
            assert_eq!(
                compare_row(throughput, p99, true).pass,
                expected,
                "{throughput:?} {p99:?}"
            );
        };
        check(&[1.0, 0.99, 1.01], &[1.0, 1.02, 0.98], Some(true));
        // One bad pair does not fail a cell; the median does.
        check(&[0.5, 0.99, 1.01], &[1.0, 3.0, 0.98], Some(true));
        check(&[0.96, 0.95, 1.2], &[1.0, 1.0, 1.0], Some(false));
        check(&[0.97, 0.97, 0.97], &[1.10, 1.10, 1.10], Some(true));
        check(&[1.0, 1.0, 1.0], &[1.11, 1.2, 1.0], Some(false));
        check(&[], &[], Some(false));
        assert_eq!(compare_row(&[0.1], &[9.0], false).pass, None);
        // A failed check fails the row whatever its ratios, gated or not.
        for gated in [true, false] {
            let mut row = compare_row(&[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0], gated);
            row.failures = vec!["pair 2: the lane sweep ran".into()];
            row.decide(gated);
            assert_eq!(row.pass, Some(false));
        }
    }

    #[test]
    fn the_compare_table_says_pass_or_fail() {
        let mut report = CompareReport {
            base: "main (c6e8814)".into(),
            head: "working tree".into(),
            pairs: 3,
            quick: false,
            rows: vec![
                compare_row(&[1.0, 0.99, 1.02], &[1.0, 1.05, 0.97], true),
                compare_row(&[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0], false),
            ],
        };
        report.rows[1].server = "nginx".into();
        let expected = "\
cell           server  hooks/s head/base      p99 head/base          thresholds        verdict
ack-unordered  ankusa  0.990 / 1.000 / 1.020  0.970 / 1.000 / 1.050  >= 0.97 / <= 1.1  PASS
ack-unordered  nginx   1.000 / 1.000 / 1.000  1.000 / 1.000 / 1.000  >= 0.97 / <= 1.1  (not gated)
ratios min / median / max over 3 pairs run alternately; base main (c6e8814), head working tree
PASS
";
        assert_eq!(render_compare(&report), expected);
        report.rows[0] = compare_row(&[0.9, 0.9, 0.9], &[1.0, 1.0, 1.0], true);
        assert!(!report.pass());
        assert!(render_compare(&report).ends_with("\nFAIL\n"));
        report.rows[0] = compare_row(&[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0], true);
        report.rows[0].failures = vec!["pair 3: the lane sweep ran".into()];
        report.rows[0].decide(true);
        let text = render_compare(&report);
        assert!(
            text.contains(
                "  FAIL\nack-unordered  nginx   1.000 / 1.000 / 1.000  1.000 / 1.000 / 1.000  \
                 >= 0.97 / <= 1.1  (not gated)\n\
                 FAIL ack-unordered (ankusa): head pair 3: the lane sweep ran\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("\nFAIL\n"), "{text}");
    }
}
