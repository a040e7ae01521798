//! The HTML report's SVGs parse and hold one series per row of the table: every `<svg>` of
//! a run's and a compare's report is parsed with a real XML parser, each chart has exactly
//! one line per (cell, server) and kind (a compare's per-row charts one per side), every
//! coordinate is a finite number inside the viewBox, a CDF rises along its line, and a cell
//! named `a<b&"c"` comes back intact from the escaped markup. Run on synthetic rows, on
//! rows made from real load-generator output against the in-process receiver, and on a short
//! `run` of three cells against the real server, whose gateway rows carry delivered/s too.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bench_gate::cells::CellsFile;
use bench_gate::compare;
use bench_gate::hooks::{HookSpec, Shape, Signing};
use bench_gate::html;
use bench_gate::load::{self, LoadPlan, Mode, CDF_PERCENTILES};
use bench_gate::report::{CdfPoint, CellRow, RatePoint, RunReport};
use bench_gate::responder::Responder;
use bench_gate::run::{self, RunSettings, Timing};

const ODD_NAME: &str = r#"a<b&"c""#;

/// One `<polyline>` series as parsed back.
#[derive(Debug)]
struct Line {
    cell: String,
    server: String,
    kind: String,
    side: Option<String>,
    points: Vec<(f64, f64)>,
}

/// Parses every `<svg>` of `html` and checks what holds for any chart: it is well-formed
/// XML, and every coordinate is a finite number inside its viewBox. Returns each chart's
/// lines by its `data-chart`.
fn charts(html: &str) -> BTreeMap<String, Vec<Line>> {
    // Self-contained: nothing fetched, no script; the SVG namespace is the only URL.
    assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("href="));
    assert_eq!(
        html.matches("http").count(),
        html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    let mut charts = BTreeMap::new();
    let mut rest = html;
    while let Some(start) = rest.find("<svg ") {
        let end = rest[start..].find("</svg>").unwrap() + start + "</svg>".len();
        let text = &rest[start..end];
        rest = &rest[end..];
        let document = roxmltree::Document::parse(text)
            .unwrap_or_else(|error| panic!("an SVG does not parse: {error}\n{text}"));
        let svg = document.root_element();
        assert_eq!(svg.tag_name().name(), "svg");
        let view_box: Vec<f64> = svg
            .attribute("viewBox")
            .unwrap()
            .split(' ')
            .map(|number| number.parse().unwrap())
            .collect();
        let [min_x, min_y, width, height] = view_box[..] else {
            panic!("viewBox {view_box:?}");
        };
        let inside = |x: f64, y: f64| {
            assert!(
                x.is_finite() && y.is_finite(),
                "a coordinate is not a finite number: {x},{y}"
            );
            assert!(
                (min_x..=min_x + width).contains(&x) && (min_y..=min_y + height).contains(&y),
                "{x},{y} is outside the viewBox {view_box:?}"
            );
        };
        let mut lines = Vec::new();
        for node in svg.descendants().filter(|node| node.is_element()) {
            for (x_name, y_name) in [("x", "y"), ("x1", "y1"), ("x2", "y2")] {
                if let (Some(x), Some(y)) = (node.attribute(x_name), node.attribute(y_name)) {
                    inside(x.parse().unwrap(), y.parse().unwrap());
                }
            }
            if node.tag_name().name() != "polyline" {
                continue;
            }
            let points: Vec<(f64, f64)> = node
                .attribute("points")
                .unwrap()
                .split_whitespace()
                .map(|pair| {
                    let (x, y) = pair.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect();
            for (x, y) in &points {
                inside(*x, *y);
            }
            lines.push(Line {
                cell: node.attribute("data-cell").unwrap().to_string(),
                server: node.attribute("data-server").unwrap().to_string(),
                kind: node.attribute("data-series").unwrap().to_string(),
                side: node.attribute("data-side").map(str::to_string),
                points,
            });
        }
        let id = svg.attribute("data-chart").unwrap().to_string();
        assert!(
            charts.insert(id.clone(), lines).is_none(),
            "two charts {id}"
        );
    }
    charts
}

/// Exactly one line of `kind` in `lines` for each of `rows` (cell, server), and no other.
fn one_per_row(chart: &str, lines: &[Line], kind: &str, rows: &[(String, String)]) {
    let mut seen: Vec<(String, String)> = lines
        .iter()
        .filter(|line| line.kind == kind)
        .map(|line| (line.cell.clone(), line.server.clone()))
        .collect();
    seen.sort();
    let mut expected = rows.to_vec();
    expected.sort();
    assert_eq!(seen, expected, "{chart}: {kind} lines");
}

/// SVG's y axis points down: a rising CDF has falling y, and latency never goes left.
fn rises(line: &Line) {
    for pair in line.points.windows(2) {
        assert!(pair[1].1 < pair[0].1, "the CDF does not rise: {line:?}");
        assert!(pair[1].0 >= pair[0].0, "latency goes back: {line:?}");
    }
}

/// Checks a run's report against its rows.
fn check_run(report: &RunReport) -> String {
    let text = html::render_run(report);
    let charts = charts(&text);
    let rows: Vec<(String, String)> = report
        .rows
        .iter()
        .map(|row| (row.cell.clone(), row.server.clone()))
        .collect();
    let delivering: Vec<(String, String)> = report
        .rows
        .iter()
        .filter(|row| !row.delivered_per_s_over_time.is_empty())
        .map(|row| (row.cell.clone(), row.server.clone()))
        .collect();
    assert_eq!(
        charts.keys().collect::<Vec<_>>(),
        ["latency-cdf", "throughput"]
    );
    let latency = &charts["latency-cdf"];
    one_per_row("latency-cdf", latency, "latency", &rows);
    assert_eq!(latency.len(), rows.len());
    for (line, row) in latency.iter().zip(&report.rows) {
        assert_eq!(line.points.len(), row.ack_latency_cdf.len(), "{line:?}");
        rises(line);
    }
    let throughput = &charts["throughput"];
    one_per_row("throughput", throughput, "hooks", &rows);
    one_per_row("throughput", throughput, "delivered", &delivering);
    assert_eq!(throughput.len(), rows.len() + delivering.len());
    for (line, row) in throughput
        .iter()
        .filter(|line| line.kind == "hooks")
        .zip(&report.rows)
    {
        assert_eq!(line.points.len(), row.hooks_per_s_over_time.len());
    }
    text
}

fn cdf(scale_ms: f64) -> Vec<CdfPoint> {
    CDF_PERCENTILES
        .iter()
        .enumerate()
        .map(|(index, percentile)| CdfPoint {
            percentile: *percentile,
            // Flat stretches, as a coarse histogram gives, must still draw a rising line.
            ms: scale_ms * (1 + index / 3) as f64,
        })
        .collect()
}

fn rates(per_s: f64, step_s: f64, count: usize) -> Vec<RatePoint> {
    (0..count)
        .map(|index| RatePoint {
            t_s: (index as f64 + 0.5) * step_s,
            per_s: per_s * (1.0 + 0.1 * (index % 3) as f64),
        })
        .collect()
}

fn row(cell: &str, server: &str, hooks_per_s: f64, p99_ms: f64) -> CellRow {
    CellRow {
        cell: cell.into(),
        server: server.into(),
        load: "closed c=64".into(),
        hooks_per_s,
        ack_p50_ms: p99_ms / 3.0,
        ack_p99_ms: p99_ms,
        ack_p999_ms: p99_ms * 2.0,
        delivered_per_s: None,
        backlog: None,
        peak_rss_mib: 70.0,
        cpu_s_per_1k_hooks: Some(0.02),
        ratio_to_reference: None,
        total_2xx: 1000,
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
        ack_latency_cdf: cdf(p99_ms / 10.0),
        hooks_per_s_over_time: rates(hooks_per_s, 0.25, 12),
        delivered_per_s_over_time: Vec::new(),
    }
}

fn synthetic_run(scale: f64) -> RunReport {
    let mut ordered = row("ordered-8-keys-20ms", "ankusa", 20_000.0 * scale, 3.0);
    ordered.delivered_per_s = Some(390.0);
    ordered.delivered_per_s_over_time = rates(390.0, 1.0, 3);
    let mut odd = row(ODD_NAME, "ankusa", 30_000.0 * scale, 2.0);
    odd.delivered_per_s_over_time = rates(29_000.0, 1.0, 3);
    // A row without latencies (nothing answered) still gets its (empty) line.
    let mut silent = row("ack-verified", "ankusa", 0.0, 0.0);
    silent.ack_latency_cdf.clear();
    silent.hooks_per_s_over_time = rates(0.0, 0.25, 12);
    let mut report = RunReport {
        started_unix_s: 1_760_000_000,
        quick: true,
        warmup_s: 1.0,
        measure_s: 3.0,
        binary: "/tmp/<ankusa>".into(),
        revision: Some("c6e8814-dirty".into()),
        rows: vec![
            row("reference", "ankusa --reference", 90_000.0, 1.0),
            row("reference", "nginx", 120_000.0, 0.5),
            row("ack-unordered", "ankusa", 45_000.0 * scale, 2.5),
            ordered,
            odd,
            silent,
        ],
    };
    report.set_ratios();
    report
}

#[test]
fn a_runs_svgs_parse_and_hold_one_series_per_row() {
    let report = synthetic_run(1.0);
    let text = check_run(&report);
    // Every cell of the run is in every chart, the odd name intact after parsing.
    let charts = charts(&text);
    for lines in charts.values() {
        let mut cells: Vec<&str> = lines.iter().map(|line| line.cell.as_str()).collect();
        cells.sort();
        cells.dedup();
        assert_eq!(
            cells,
            [
                ODD_NAME,
                "ack-unordered",
                "ack-verified",
                "ordered-8-keys-20ms",
                "reference"
            ]
        );
    }
    // Escaped everywhere it is written: legend, table, data attributes, the binary path.
    assert!(!text.contains(ODD_NAME) && !text.contains("<ankusa>"));
    assert!(text.contains("<td>a&lt;b&amp;&quot;c&quot;</td>"), "{text}");
    assert!(text.contains("data-cell=\"a&lt;b&amp;&quot;c&quot;\""));
    assert!(text.contains("/tmp/&lt;ankusa&gt;"));
    assert!(text.starts_with("<!DOCTYPE html>\n") && text.ends_with("</html>\n"));
}

#[test]
fn a_compares_svgs_parse_and_hold_one_series_per_row_and_side() {
    let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
    let cells = file
        .select_for_compare(Some(&["ack-unordered".to_string()]))
        .unwrap();
    let base = vec![synthetic_run(1.0), synthetic_run(1.02), synthetic_run(0.98)];
    let head = vec![synthetic_run(0.95), synthetic_run(1.0), synthetic_run(0.97)];
    let report = compare::decide(
        &file,
        &cells,
        &base,
        &head,
        "main (c6e8814)".into(),
        "working tree".into(),
        true,
    );
    let text = html::render_compare(&report);
    let charts = charts(&text);
    let rows: Vec<(String, String)> = report
        .rows
        .iter()
        .map(|row| (row.cell.clone(), row.server.clone()))
        .collect();
    assert_eq!(rows.len(), 6);
    assert_eq!(charts.len(), 2 + 2 * rows.len());
    one_per_row(
        "throughput-ratio",
        &charts["throughput-ratio"],
        "throughput_ratio",
        &rows,
    );
    one_per_row("p99-ratio", &charts["p99-ratio"], "p99_ratio", &rows);
    assert_eq!(charts["throughput-ratio"].len(), rows.len());
    for (index, (cell, server)) in rows.iter().enumerate() {
        for (chart, kind) in [
            (format!("hooks-{index}"), "hooks"),
            (format!("latency-cdf-{index}"), "latency"),
        ] {
            let lines = &charts[&chart];
            let sides: Vec<(&str, &str, &str, Option<&str>)> = lines
                .iter()
                .map(|line| {
                    (
                        line.cell.as_str(),
                        line.server.as_str(),
                        line.kind.as_str(),
                        line.side.as_deref(),
                    )
                })
                .collect();
            assert_eq!(
                sides,
                [
                    (cell.as_str(), server.as_str(), kind, Some("base")),
                    (cell.as_str(), server.as_str(), kind, Some("head")),
                ],
                "{chart}"
            );
            if kind == "hooks" {
                assert!(lines.iter().all(|line| line.points.len() == 3), "{chart}");
            } else {
                let expected = if cell == "ack-verified" {
                    0
                } else {
                    CDF_PERCENTILES.len()
                };
                assert!(
                    lines.iter().all(|line| line.points.len() == expected),
                    "{chart}"
                );
                lines.iter().for_each(rises);
            }
        }
    }
    assert!(!text.contains(ODD_NAME));
    assert!(text.contains("<h3>a&lt;b&amp;&quot;c&quot;</h3>"));
}

#[test]
fn real_load_generator_output_makes_a_report_with_one_series_per_cell() {
    let responder = Responder::start(200).unwrap();
    let mut report = RunReport {
        started_unix_s: 0,
        quick: true,
        warmup_s: 0.2,
        measure_s: 1.0,
        binary: "in-process receiver".into(),
        revision: None,
        rows: Vec::new(),
    };
    let loads = [
        ("closed-1", 1, Mode::Closed),
        ("closed-4", 4, Mode::Closed),
        (ODD_NAME, 2, Mode::Open { rate_per_s: 400.0 }),
    ];
    for (name, connections, mode) in loads {
        let plan = LoadPlan {
            target: responder.addr(),
            connections,
            threads: 1,
            mode,
            start_at: Instant::now() + Duration::from_millis(50),
            warmup: Duration::from_millis(200),
            measure: Duration::from_secs(1),
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
        let load = load::run(&plan).unwrap();
        assert!(load.window.status_2xx > 0, "{name}");
        // The intervals split the window's 2xx answers, none lost or counted twice.
        assert_eq!(load.ok_per_interval.len(), 4);
        assert_eq!(
            load.ok_per_interval.iter().sum::<u64>(),
            load.window.status_2xx,
            "{name}"
        );
        let mut cell = row(name, "ankusa", load.ok_per_s(), load.latency_ms(0.99));
        cell.ack_latency_cdf = load
            .latency_cdf_ms()
            .into_iter()
            .map(|(percentile, ms)| CdfPoint { percentile, ms })
            .collect();
        cell.hooks_per_s_over_time = load
            .ok_per_s_over_time()
            .into_iter()
            .map(|(t_s, per_s)| RatePoint { t_s, per_s })
            .collect();
        assert_eq!(cell.ack_latency_cdf.len(), CDF_PERCENTILES.len());
        report.rows.push(cell);
    }
    responder.stop();
    let text = check_run(&report);
    assert!(!text.contains(ODD_NAME));
}

#[test]
fn a_short_run_of_real_cells_writes_a_report_with_one_series_per_cell() {
    let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
    let cells = file
        .select(Some(&[
            "ack-unordered".to_string(),
            "ordered-8-keys-20ms".to_string(),
        ]))
        .unwrap();
    let settings = RunSettings {
        bin: common::ankusa_bin().to_path_buf(),
        timing: Timing {
            warmup: Duration::from_millis(500),
            measure: Duration::from_secs(2),
            drain: Duration::from_secs(5),
            quick: true,
        },
        threads: 1,
        // nginx rows are the reference's business, not the report's.
        nginx: None,
    };
    let report = run::run_cells(&settings, &cells, None).unwrap();
    let names: Vec<&str> = report.rows.iter().map(|row| row.cell.as_str()).collect();
    assert_eq!(names, ["reference", "ack-unordered", "ordered-8-keys-20ms"]);
    for row in &report.rows {
        assert_eq!(
            row.ack_latency_cdf.len(),
            CDF_PERCENTILES.len(),
            "{}",
            row.cell
        );
        // 2 s of 250 ms intervals.
        assert_eq!(row.hooks_per_s_over_time.len(), 8, "{}", row.cell);
        let gateway = row.server == "ankusa";
        // Scraped on a 1 s grid (500 ms for the ordered cell), in 1 s steps: two.
        let expected = if gateway { 2 } else { 0 };
        assert_eq!(
            row.delivered_per_s_over_time.len(),
            expected,
            "{}: {:?}",
            row.cell,
            row.delivered_per_s_over_time
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out").join("latest.json");
    report.write_json(&json).unwrap();
    let text = check_run(&report);
    let path = html::path_beside(&json);
    html::write(&path, &text).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    assert!(path.ends_with("out/latest.html"));
}
