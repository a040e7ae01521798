//! The HTML report written beside the JSON of a `run` (`latest.html`) or a `compare`
//! (`compare.html`): the table printed on stdout and charts of the same rows, in one
//! self-contained file (inline CSS and SVG, no script, nothing fetched), so it opens
//! anywhere, CI artifacts included.
//!
//! - run: the ack latency CDF of every row (log latency against a "nines" percentile axis,
//!   so the tail is as wide as the median) and hooks/s over the window per
//!   `load::THROUGHPUT_INTERVAL`, with delivered/s beside it where the row has it;
//! - compare: head/base hooks/s and p99 per pair, one line per row, then per row each side's
//!   hooks/s per pair and latency CDF of its median run.
//!
//! Every series is a `<polyline>` named by `data-cell` and `data-server` (one row of the
//! table), with `data-series` saying what it plots and, in a compare, `data-side` (`base`
//! or `head`), so tests and scripts can find a row's line. All text is escaped: cell names
//! come from the cells file. Rendering is pure, like `report`'s.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::report::{self, CdfPoint, CompareReport, CompareRow, RunReport};

/// The SVG's size in user units; CSS scales it down to the page.
const WIDTH: f64 = 720.0;
const PLOT_HEIGHT: f64 = 300.0;
/// Room for the title above the plot, the tick labels left of and below it.
const MARGIN_TOP: f64 = 32.0;
const MARGIN_LEFT: f64 = 72.0;
const MARGIN_RIGHT: f64 = 24.0;
const MARGIN_BOTTOM: f64 = 44.0;
/// One legend entry per line under the plot: long cell names never overlap the lines.
const LEGEND_LINE: f64 = 18.0;
/// The percentile axis ends at 100 (the maximum) drawn this many nines up, one above the
/// last finite percentile drawn (99.99, four nines), so the maximum gets its own tick.
const NINES_TOP: f64 = 5.0;
/// Tableau 10: distinguishable, also in print.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
const BASE_COLOR: &str = "#4e79a7";
const HEAD_COLOR: &str = "#f28e2b";
/// Delivered/s is drawn dashed in its row's color, next to its row's solid hooks/s.
const DELIVERED_DASH: &str = "6 3";
/// Rows past the palette's length are dotted, so no two series look alike.
const SECOND_ROUND_DASH: &str = "1 3";

const STYLE: &str = "\
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; } h3 { font-size: 1em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ccc; padding: 2px 6px; white-space: nowrap; }
th { background: #f3f3f3; } td.number { text-align: right; } div.table { overflow-x: auto; }
pre { background: #f7f7f7; padding: 0.6em; white-space: pre-wrap; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
.pair { display: flex; flex-wrap: wrap; gap: 1em; } .pair figure { flex: 1 1 420px; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg .title { font-weight: bold; } svg .grid { stroke: #e4e4e4; } svg .frame { stroke: #888; }
";

/// The path of the HTML beside `json`: the same name with `.html`.
pub fn path_beside(json: &Path) -> PathBuf {
    let path = json.with_extension("html");
    if path == json {
        // A JSON path already ending in .html: add to the name rather than overwrite it.
        let mut name = json.as_os_str().to_owned();
        name.push(".html");
        return PathBuf::from(name);
    }
    path
}

/// Writes `html` to `path`, creating its directory.
pub fn write(path: &Path, html: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, html)
}

/// Escapes text for HTML and SVG, in element content and in quoted attributes alike.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// How values map onto an axis.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scale {
    Linear {
        min: f64,
        max: f64,
    },
    /// Decades; `min` and `max` are positive.
    Log {
        min: f64,
        max: f64,
    },
    /// Percentiles by their nines: 90 is one, 99 two, 99.9 three; 100 is [`NINES_TOP`].
    Nines,
}

impl Scale {
    /// Where `value` falls along the axis, 0 at its start and 1 at its end; values outside
    /// are drawn at the edge, so every coordinate stays inside the plot.
    fn fraction(self, value: f64) -> f64 {
        let fraction = match self {
            Scale::Linear { min, max } => (value - min) / (max - min),
            Scale::Log { min, max } => {
                if value <= 0.0 {
                    0.0
                } else {
                    (value.log10() - min.log10()) / (max.log10() - min.log10())
                }
            }
            Scale::Nines => {
                if value >= 100.0 {
                    1.0
                } else {
                    let nines = -(1.0 - value / 100.0).log10();
                    // Strictly under the maximum's place, whatever the percentile.
                    nines.min(NINES_TOP - 0.5) / NINES_TOP
                }
            }
        };
        if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        }
    }
}

#[derive(Debug, Clone)]
struct Axis {
    label: String,
    scale: Scale,
    ticks: Vec<(f64, String)>,
}

/// One line of a chart, and the table row it belongs to.
#[derive(Debug, Clone)]
struct Series {
    cell: String,
    server: String,
    /// What is plotted: `latency`, `hooks`, `delivered`, `throughput_ratio`, `p99_ratio`.
    kind: &'static str,
    /// `base` or `head` in a compare's per-row charts.
    side: Option<&'static str>,
    label: String,
    color: &'static str,
    dash: Option<&'static str>,
    points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone)]
struct Chart {
    /// Names the chart for tests and scripts (`data-chart`).
    id: String,
    title: String,
    x: Axis,
    y: Axis,
    /// Horizontal reference lines at these y values (a ratio of 1).
    guides: Vec<f64>,
    series: Vec<Series>,
}

fn number(value: f64) -> String {
    // One decimal of a user unit is finer than a pixel; finite by construction.
    format!("{value:.1}")
}

impl Chart {
    fn height(&self) -> f64 {
        MARGIN_TOP + PLOT_HEIGHT + MARGIN_BOTTOM + LEGEND_LINE * self.series.len() as f64 + 8.0
    }

    fn x_px(&self, value: f64) -> f64 {
        MARGIN_LEFT + self.x.scale.fraction(value) * (WIDTH - MARGIN_LEFT - MARGIN_RIGHT)
    }

    fn y_px(&self, value: f64) -> f64 {
        MARGIN_TOP + (1.0 - self.y.scale.fraction(value)) * PLOT_HEIGHT
    }

    fn render(&self) -> String {
        let height = self.height();
        let (left, right) = (MARGIN_LEFT, WIDTH - MARGIN_RIGHT);
        let (top, bottom) = (MARGIN_TOP, MARGIN_TOP + PLOT_HEIGHT);
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" data-chart=\"{}\" viewBox=\"0 0 {} {}\" \
             width=\"{}\" height=\"{}\" role=\"img\">",
            escape(&self.id),
            number(WIDTH),
            number(height),
            number(WIDTH),
            number(height)
        );
        let _ = writeln!(svg, "<title>{}</title>", escape(&self.title));
        let _ = writeln!(
            svg,
            "<text class=\"title\" x=\"{}\" y=\"20.0\">{}</text>",
            number(left),
            escape(&self.title)
        );
        for (value, label) in &self.x.ticks {
            let x = number(self.x_px(*value));
            let _ = writeln!(
                svg,
                "<line class=\"grid\" x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\
                 <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                number(top),
                number(bottom),
                number(bottom + 16.0),
                escape(label)
            );
        }
        for (value, label) in &self.y.ticks {
            let y = number(self.y_px(*value));
            let _ = writeln!(
                svg,
                "<line class=\"grid\" x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\"/>\
                 <text x=\"{}\" y=\"{y}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}\
                 </text>",
                number(left),
                number(right),
                number(left - 6.0),
                escape(label)
            );
        }
        for guide in &self.guides {
            let y = number(self.y_px(*guide));
            let _ = writeln!(
                svg,
                "<line class=\"guide\" x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#444\" \
                 stroke-dasharray=\"2 2\"/>",
                number(left),
                number(right)
            );
        }
        let _ = writeln!(
            svg,
            "<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\"/>",
            number(left),
            number(top),
            number(right - left),
            number(PLOT_HEIGHT)
        );
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            number((left + right) / 2.0),
            number(bottom + 34.0),
            escape(&self.x.label)
        );
        let _ = writeln!(
            svg,
            "<text x=\"14.0\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14.0 {})\">\
             {}</text>",
            number((top + bottom) / 2.0),
            number((top + bottom) / 2.0),
            escape(&self.y.label)
        );
        for series in &self.series {
            svg.push_str(&self.render_series(series));
        }
        for (index, series) in self.series.iter().enumerate() {
            let y = bottom + MARGIN_BOTTOM + LEGEND_LINE * index as f64 + 8.0;
            let _ = writeln!(
                svg,
                "<g class=\"legend\"><line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" \
                 stroke-width=\"2\"{}/><text x=\"{}\" y=\"{}\" dominant-baseline=\"middle\">{}\
                 </text></g>",
                number(left),
                number(y),
                number(left + 28.0),
                number(y),
                series.color,
                dash_attribute(series.dash),
                number(left + 36.0),
                number(y),
                escape(&series.label)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }

    fn render_series(&self, series: &Series) -> String {
        let points: Vec<String> = series
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{},{}", number(self.x_px(*x)), number(self.y_px(*y))))
            .collect();
        let side = series
            .side
            .map_or_else(String::new, |side| format!(" data-side=\"{side}\""));
        format!(
            "<polyline class=\"series\" data-cell=\"{}\" data-server=\"{}\" \
             data-series=\"{}\"{side} fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} \
             points=\"{}\"><title>{}</title></polyline>\n",
            escape(&series.cell),
            escape(&series.server),
            series.kind,
            series.color,
            dash_attribute(series.dash),
            points.join(" "),
            escape(&series.label)
        )
    }
}

fn dash_attribute(dash: Option<&str>) -> String {
    dash.map_or_else(String::new, |dash| format!(" stroke-dasharray=\"{dash}\""))
}

/// Round numbers from `min` to `max`, about `count` of them: (start, end, ticks).
fn linear_ticks(min: f64, max: f64, count: usize) -> (f64, f64, Vec<f64>) {
    let (min, max) = if !(min.is_finite() && max.is_finite()) {
        (0.0, 1.0)
    } else if max - min < 1e-9 * min.abs().max(1.0) {
        // A flat line gets a band around it rather than a zero-height axis.
        let pad = (min.abs() * 0.05).max(0.5);
        (min - pad, max + pad)
    } else {
        (min, max)
    };
    let raw_step = (max - min) / count.max(1) as f64;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|factor| factor * magnitude)
        .find(|step| *step >= raw_step)
        .unwrap_or(10.0 * magnitude);
    let start = (min / step).floor() * step;
    let end = (max / step).ceil() * step;
    let ticks = (0..)
        .map(|index| start + step * index as f64)
        .take_while(|tick| *tick <= end + step * 1e-6)
        .collect();
    (start, end, ticks)
}

/// A tick's label with as many decimals as the step between ticks needs (0.025: three).
fn tick_label(value: f64, ticks: &[f64]) -> String {
    let step = match ticks {
        [first, second, ..] => (second - first).abs(),
        _ => 1.0,
    };
    let decimals = (0..10)
        .find(|decimals| {
            let scaled = step * 10f64.powi(*decimals);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(10) as usize;
    format!("{value:.decimals$}")
}

fn linear_axis(label: &str, min: f64, max: f64) -> Axis {
    let (start, end, ticks) = linear_ticks(min, max, 5);
    Axis {
        label: label.into(),
        scale: Scale::Linear {
            min: start,
            max: end,
        },
        ticks: ticks
            .iter()
            .map(|tick| (*tick, tick_label(*tick, &ticks)))
            .collect(),
    }
}

/// A decade's label: 0.01, 1, 1k, 10M; far out, 1e-9.
fn decade_label(exponent: i32) -> String {
    match exponent {
        ..=-7 | 9.. => format!("1e{exponent}"),
        -6..=-1 => format!("0.{}1", "0".repeat((-exponent - 1) as usize)),
        0..=2 => 10u64.pow(exponent as u32).to_string(),
        3..=5 => format!("{}k", 10u64.pow(exponent as u32 - 3)),
        6..=8 => format!("{}M", 10u64.pow(exponent as u32 - 6)),
    }
}

/// A log axis over whole decades around the positive values; `fallback` (a decade
/// exponent range) when there are none.
fn log_axis(label: &str, values: impl Iterator<Item = f64>, fallback: (i32, i32)) -> Axis {
    let (low, high) = values
        .filter(|value| value.is_finite() && *value > 0.0)
        .fold(None, |range: Option<(f64, f64)>, value| {
            Some(range.map_or((value, value), |(low, high)| {
                (low.min(value), high.max(value))
            }))
        })
        .map_or(fallback, |(low, high)| {
            let low = low.log10().floor() as i32;
            let high = (high.log10().ceil() as i32).max(low + 1);
            (low, high)
        });
    Axis {
        label: label.into(),
        scale: Scale::Log {
            min: 10f64.powi(low),
            max: 10f64.powi(high),
        },
        ticks: (low..=high)
            .map(|exponent| (10f64.powi(exponent), decade_label(exponent)))
            .collect(),
    }
}

fn nines_axis() -> Axis {
    Axis {
        label: "percentile".into(),
        scale: Scale::Nines,
        ticks: [
            (0.0, "0"),
            (90.0, "90"),
            (99.0, "99"),
            (99.9, "99.9"),
            (99.99, "99.99"),
            (100.0, "max"),
        ]
        .iter()
        .map(|(value, label)| (*value, (*label).to_string()))
        .collect(),
    }
}

fn latency_points(cdf: &[CdfPoint]) -> Vec<(f64, f64)> {
    cdf.iter()
        .map(|point| (point.ms, point.percentile))
        .collect()
}

fn latency_axis<'a>(cdfs: impl Iterator<Item = &'a [CdfPoint]>) -> Axis {
    log_axis(
        "ack latency, ms (log)",
        cdfs.flat_map(|cdf| cdf.iter().map(|point| point.ms)),
        (-1, 2),
    )
}

/// A row's name in legends: the cell, and the server when it is not the gateway.
fn row_label(cell: &str, server: &str) -> String {
    if server == "ankusa" {
        cell.to_string()
    } else {
        format!("{cell} ({server})")
    }
}

fn row_style(index: usize) -> (&'static str, Option<&'static str>) {
    let dash = (index >= PALETTE.len()).then_some(SECOND_ROUND_DASH);
    (PALETTE[index % PALETTE.len()], dash)
}

fn run_charts(report: &RunReport) -> Vec<Chart> {
    let latency = Chart {
        id: "latency-cdf".into(),
        title: "Ack latency CDF, measurement window".into(),
        x: latency_axis(report.rows.iter().map(|row| row.ack_latency_cdf.as_slice())),
        y: nines_axis(),
        guides: Vec::new(),
        series: report
            .rows
            .iter()
            .enumerate()
            .map(|(index, row)| {
                let (color, dash) = row_style(index);
                Series {
                    cell: row.cell.clone(),
                    server: row.server.clone(),
                    kind: "latency",
                    side: None,
                    label: row_label(&row.cell, &row.server),
                    color,
                    dash,
                    points: latency_points(&row.ack_latency_cdf),
                }
            })
            .collect(),
    };
    let mut series = Vec::new();
    for (index, row) in report.rows.iter().enumerate() {
        let (color, dash) = row_style(index);
        let label = row_label(&row.cell, &row.server);
        series.push(Series {
            cell: row.cell.clone(),
            server: row.server.clone(),
            kind: "hooks",
            side: None,
            label: format!("{label} hooks/s"),
            color,
            dash,
            points: row
                .hooks_per_s_over_time
                .iter()
                .map(|point| (point.t_s, point.per_s))
                .collect(),
        });
        if !row.delivered_per_s_over_time.is_empty() {
            series.push(Series {
                cell: row.cell.clone(),
                server: row.server.clone(),
                kind: "delivered",
                side: None,
                label: format!("{label} delivered/s"),
                color,
                dash: Some(DELIVERED_DASH),
                points: row
                    .delivered_per_s_over_time
                    .iter()
                    .map(|point| (point.t_s, point.per_s))
                    .collect(),
            });
        }
    }
    let window_s = if report.measure_s > 0.0 {
        report.measure_s
    } else {
        1.0
    };
    let throughput = Chart {
        id: "throughput".into(),
        title: "Throughput over the measurement window".into(),
        x: linear_axis("seconds into the window", 0.0, window_s),
        y: log_axis(
            "per second (log)",
            series
                .iter()
                .flat_map(|series| series.points.iter().map(|(_, y)| *y)),
            (0, 5),
        ),
        guides: Vec::new(),
        series,
    };
    vec![latency, throughput]
}

fn html_table(header: &[&str], lines: &[Vec<String>], text_columns: usize) -> String {
    // Wrapped so a wide table scrolls on its own instead of widening the page.
    let mut html = String::from("<div class=\"table\">\n<table>\n<thead><tr>");
    for name in header {
        let _ = write!(html, "<th>{}</th>", escape(name));
    }
    html.push_str("</tr></thead>\n<tbody>\n");
    for line in lines {
        html.push_str("<tr>");
        for (index, cell) in line.iter().enumerate() {
            let class = if index < text_columns {
                ""
            } else {
                " class=\"number\""
            };
            let _ = write!(html, "<td{class}>{}</td>", escape(cell));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</tbody>\n</table>\n</div>\n");
    html
}

/// The lines of a text report after its table: its facts, warnings and failures.
fn notes(text: &str, rows: usize) -> String {
    let lines: Vec<&str> = text.lines().skip(1 + rows).collect();
    if lines.is_empty() {
        return String::new();
    }
    format!("<pre>{}</pre>\n", escape(&lines.join("\n")))
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n{body}\
         </body>\n</html>\n",
        escape(title),
        escape(title)
    )
}

fn figure(chart: &Chart, caption: &str) -> String {
    format!(
        "<figure>\n{}<figcaption>{}</figcaption>\n</figure>\n",
        chart.render(),
        escape(caption)
    )
}

/// The HTML report of a run.
pub fn render_run(report: &RunReport) -> String {
    let mut body = String::new();
    body.push_str(&html_table(
        &report::RUN_HEADER,
        &report::run_lines(report),
        report::RUN_TEXT_COLUMNS,
    ));
    body.push_str(&notes(&report::render_run(report), report.rows.len()));
    let charts = run_charts(report);
    let captions = [
        "Each row's ack latencies over the measurement window: a point at (latency, \
         percentile) says that share of the answers came within that latency. The percentile \
         axis spreads the tail: 90, 99, 99.9 and 99.99 are equally far apart.",
        "2xx answers per second (solid) per 250 ms of the window, from the load generator; \
         delivered/s (dashed, same color) per second, from ankusa_delivered_total scraped \
         during the window (gateway cells). Zero is drawn at the bottom of the log axis.",
    ];
    body.push_str("<h2>Charts</h2>\n");
    for (chart, caption) in charts.iter().zip(captions) {
        body.push_str(&figure(chart, caption));
    }
    page(
        &format!(
            "bench-gate run{}{}",
            if report.quick { " (--quick)" } else { "" },
            report
                .revision
                .as_ref()
                .map_or_else(String::new, |revision| format!(", {revision}"))
        ),
        &body,
    )
}

fn pair_axis(pairs: usize) -> Axis {
    let pairs = pairs.max(1);
    let (min, max) = if pairs == 1 {
        (0.5, 1.5)
    } else {
        (1.0, pairs as f64)
    };
    Axis {
        label: "pair, in the order run".into(),
        scale: Scale::Linear { min, max },
        ticks: (1..=pairs)
            .map(|pair| (pair as f64, pair.to_string()))
            .collect(),
    }
}

fn per_pair(values: &[f64]) -> Vec<(f64, f64)> {
    values
        .iter()
        .enumerate()
        .map(|(index, value)| ((index + 1) as f64, *value))
        .collect()
}

fn throughput_ratios(row: &CompareRow) -> &[f64] {
    &row.throughput_ratios
}

fn p99_ratios(row: &CompareRow) -> &[f64] {
    &row.p99_ratios
}

/// One head/base ratio per pair, one line per row, around a guide at 1.
fn ratio_chart(
    report: &CompareReport,
    (id, title, kind): (&str, &str, &'static str),
    ratios: fn(&CompareRow) -> &[f64],
) -> Chart {
    let pairs = report
        .rows
        .iter()
        .map(|row| ratios(row).len())
        .max()
        .unwrap_or(report.pairs);
    let (min, max) = report
        .rows
        .iter()
        .flat_map(|row| ratios(row).iter().copied())
        .filter(|value| value.is_finite())
        .chain([1.0])
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(min, max), value| {
            (min.min(value), max.max(value))
        });
    Chart {
        id: id.into(),
        title: title.into(),
        x: pair_axis(pairs),
        y: linear_axis("head / base", min, max),
        guides: vec![1.0],
        series: report
            .rows
            .iter()
            .enumerate()
            .map(|(index, row)| {
                let (color, dash) = row_style(index);
                Series {
                    cell: row.cell.clone(),
                    server: row.server.clone(),
                    kind,
                    side: None,
                    label: row_label(&row.cell, &row.server),
                    color,
                    dash,
                    points: per_pair(ratios(row)),
                }
            })
            .collect(),
    }
}

fn compare_charts(report: &CompareReport) -> Vec<Chart> {
    vec![
        ratio_chart(
            report,
            (
                "throughput-ratio",
                "hooks/s, head / base, per pair",
                "throughput_ratio",
            ),
            throughput_ratios,
        ),
        ratio_chart(
            report,
            (
                "p99-ratio",
                "p99 ack latency, head / base, per pair",
                "p99_ratio",
            ),
            p99_ratios,
        ),
    ]
}

/// Per compare row: each side's hooks/s per pair, and each side's median run's CDF.
fn compare_row_charts(row: &CompareRow, index: usize) -> [Chart; 2] {
    let side_series = |side: &'static str, kind: &'static str, points: Vec<(f64, f64)>| Series {
        cell: row.cell.clone(),
        server: row.server.clone(),
        kind,
        side: Some(side),
        label: side.into(),
        color: if side == "base" {
            BASE_COLOR
        } else {
            HEAD_COLOR
        },
        dash: None,
        points,
    };
    let label = row_label(&row.cell, &row.server);
    let (min, max) = row
        .base_hooks_per_s
        .iter()
        .chain(&row.head_hooks_per_s)
        .filter(|value| value.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(min, max), value| {
            (min.min(*value), max.max(*value))
        });
    let throughput = Chart {
        id: format!("hooks-{index}"),
        title: format!("{label}: hooks/s per pair"),
        x: pair_axis(row.base_hooks_per_s.len().max(row.head_hooks_per_s.len())),
        y: linear_axis("hooks/s", min, max),
        guides: Vec::new(),
        series: vec![
            side_series("base", "hooks", per_pair(&row.base_hooks_per_s)),
            side_series("head", "hooks", per_pair(&row.head_hooks_per_s)),
        ],
    };
    let latency = Chart {
        id: format!("latency-cdf-{index}"),
        title: format!("{label}: ack latency CDF, median run"),
        x: latency_axis(
            [
                row.base_latency_cdf.as_slice(),
                row.head_latency_cdf.as_slice(),
            ]
            .into_iter(),
        ),
        y: nines_axis(),
        guides: Vec::new(),
        series: vec![
            side_series("base", "latency", latency_points(&row.base_latency_cdf)),
            side_series("head", "latency", latency_points(&row.head_latency_cdf)),
        ],
    };
    [throughput, latency]
}

/// The HTML report of a compare.
pub fn render_compare(report: &CompareReport) -> String {
    let mut body = String::new();
    body.push_str(&html_table(
        &report::COMPARE_HEADER,
        &report::compare_lines(report),
        report::COMPARE_HEADER.len(),
    ));
    body.push_str(&notes(&report::render_compare(report), report.rows.len()));
    body.push_str("<h2>Head over base, pair by pair</h2>\n");
    let captions = [
        "Each pair's head hooks/s over its base hooks/s; above 1 the head was faster.",
        "Each pair's head p99 over its base p99; below 1 the head answered sooner.",
    ];
    for (chart, caption) in compare_charts(report).iter().zip(captions) {
        body.push_str(&figure(chart, caption));
    }
    body.push_str("<h2>Base and head per row</h2>\n");
    for (index, row) in report.rows.iter().enumerate() {
        let _ = writeln!(
            body,
            "<h3>{}</h3>\n<div class=\"pair\">",
            escape(&row_label(&row.cell, &row.server))
        );
        let [throughput, latency] = compare_row_charts(row, index);
        body.push_str(&figure(&throughput, "Each side's hooks/s, pair by pair."));
        body.push_str(&figure(
            &latency,
            "Each side's ack latency CDF, from its run with the median hooks/s.",
        ));
        body.push_str("</div>\n");
    }
    page(
        &format!("bench-gate compare: {} vs {}", report.head, report.base),
        &body,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            escape(r#"a<b&"c"'d>"#),
            "a&lt;b&amp;&quot;c&quot;&#39;d&gt;"
        );
        assert_eq!(escape("ack-unordered"), "ack-unordered");
    }

    #[test]
    fn scales_map_into_the_plot_and_clamp_outside_it() {
        let check = |scale: Scale, value: f64, expected: f64| {
            let got = scale.fraction(value);
            assert!((got - expected).abs() < 1e-9, "{scale:?} {value}: {got}");
        };
        let linear = Scale::Linear {
            min: 0.0,
            max: 10.0,
        };
        check(linear, 5.0, 0.5);
        check(linear, -3.0, 0.0);
        check(linear, 30.0, 1.0);
        check(linear, f64::NAN, 0.0);
        let log = Scale::Log {
            min: 0.1,
            max: 100.0,
        };
        check(log, 1.0, 1.0 / 3.0);
        check(log, 0.0, 0.0);
        check(log, 1e9, 1.0);
        check(Scale::Nines, 0.0, 0.0);
        check(Scale::Nines, 90.0, 0.2);
        check(Scale::Nines, 99.99, 0.8);
        check(Scale::Nines, 100.0, 1.0);
        // Past four nines but not the maximum: under the maximum's place.
        check(Scale::Nines, 99.999_999, 0.9);
        // Percentiles in increasing order keep their order.
        let fractions: Vec<f64> = crate::load::CDF_PERCENTILES
            .iter()
            .map(|percentile| Scale::Nines.fraction(*percentile))
            .collect();
        assert!(
            fractions.windows(2).all(|pair| pair[0] < pair[1]),
            "{fractions:?}"
        );
    }

    #[test]
    fn ticks_are_round() {
        let check = |min: f64, max: f64, expected: &[&str]| {
            let axis = linear_axis("x", min, max);
            let labels: Vec<&str> = axis.ticks.iter().map(|(_, label)| label.as_str()).collect();
            assert_eq!(labels, expected, "{min}..{max}");
        };
        check(0.0, 3.0, &["0", "1", "2", "3"]);
        check(0.0, 20.0, &["0", "5", "10", "15", "20"]);
        check(
            0.93,
            1.04,
            &["0.925", "0.950", "0.975", "1.000", "1.025", "1.050"],
        );
        check(
            40_000.0,
            47_000.0,
            &["40000", "42000", "44000", "46000", "48000"],
        );
        // A flat line still gets an axis.
        check(1.0, 1.0, &["0.4", "0.6", "0.8", "1.0", "1.2", "1.4", "1.6"]);
        let labels: Vec<String> = [-9, -3, -1, 0, 2, 3, 5, 6, 12]
            .iter()
            .map(|exponent| decade_label(*exponent))
            .collect();
        assert_eq!(
            labels,
            ["1e-9", "0.001", "0.1", "1", "100", "1k", "100k", "1M", "1e12"]
        );
        let axis = log_axis("ms", [0.4, 35.0].into_iter(), (0, 1));
        assert_eq!(axis.ticks.len(), 4);
        assert_eq!(
            axis.scale,
            Scale::Log {
                min: 0.1,
                max: 100.0
            }
        );
        assert_eq!(log_axis("ms", std::iter::empty(), (-1, 2)).ticks.len(), 4);
    }

    #[test]
    fn the_html_sits_beside_the_json() {
        let check = |json: &str, expected: &str| {
            assert_eq!(path_beside(Path::new(json)), PathBuf::from(expected));
        };
        check("bench-gate/out/latest.json", "bench-gate/out/latest.html");
        check("out/compare.json", "out/compare.html");
        check("out/run", "out/run.html");
        check("out/odd.html", "out/odd.html.html");
    }

    #[test]
    fn series_without_points_or_with_odd_values_stay_inside_the_plot() {
        let chart = Chart {
            id: "t".into(),
            title: "t".into(),
            x: linear_axis("x", 0.0, 10.0),
            y: linear_axis("y", 0.0, 10.0),
            guides: vec![1.0],
            series: vec![Series {
                cell: "c".into(),
                server: "ankusa".into(),
                kind: "hooks",
                side: None,
                label: "c".into(),
                color: PALETTE[0],
                dash: None,
                points: vec![
                    (f64::NAN, 1.0),
                    (-5.0, 1e12),
                    (5.0, f64::INFINITY),
                    (5.0, 5.0),
                ],
            }],
        };
        let svg = chart.render();
        assert!(
            svg.contains(&format!(
                "points=\"{},{} {},{}\"",
                number(MARGIN_LEFT),
                number(MARGIN_TOP),
                number(MARGIN_LEFT + (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) / 2.0),
                number(MARGIN_TOP + PLOT_HEIGHT / 2.0)
            )),
            "{svg}"
        );
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }
}
