//! Measuring cells: for each cell, start its server on loopback (data dir in a temp dir) and
//! the in-process receiver its sinks deliver to, run the load (warm-up, then the window),
//! sample the server's CPU time, metrics and peak RSS at the window's edges, stop it with
//! SIGTERM (it must exit 0), and make the cell's rows.
//!
//! The orchestration is the top of the program, so its errors are `anyhow` with context;
//! the modules it drives have their own error types.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use crate::cells::{Cell, Kind};
use crate::load::{self, LoadPlan, LoadReport};
use crate::report::{CellRow, RunReport};
use crate::responder::Responder;
use crate::server::{self, Ankusa, Nginx, ProcSample};

/// The `server` of the row every ratio is taken against.
pub const REFERENCE_SERVER: &str = "ankusa --reference";
/// The gauges behind `/metrics` are refreshed every 250 ms; waiting this long after the load
/// stops makes the last scrape show its end.
const GAUGE_SETTLE: Duration = Duration::from_millis(600);

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
    let receiver = Responder::start(200)?;
    let config = dir.path().join("ankusa.yaml");
    std::fs::write(
        &config,
        cell.server_yaml(&dir.path().join("data"), receiver.addr()),
    )
    .context("writing the cell's config")?;
    let server = Ankusa::start(
        &settings.bin,
        &config,
        reference,
        &dir.path().join("stderr.log"),
    )?;
    let plan = plan(settings, cell, server.ingest);
    let pid = server.pid();
    let sample = |server: &Ankusa| -> anyhow::Result<Edge> {
        Ok(Edge {
            proc: server::proc_sample(pid)?,
            delivered: if reference {
                None
            } else {
                Some(server.metrics()?.required("ankusa_delivered_total")?)
            },
        })
    };
    let (load, start, end) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let load = scope.spawn(|| load::run(&plan));
        sleep_until(plan.measure_start());
        let start = sample(&server);
        sleep_until(plan.end());
        let end = sample(&server);
        let load = load
            .join()
            .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
        Ok((load, start?, end?))
    })?;
    let mut row = row(cell, server_name, &load, &start.proc, &end.proc);
    if !reference {
        std::thread::sleep(GAUGE_SETTLE);
        let metrics = server.metrics()?;
        if let (Some(first), Some(last)) = (start.delivered, end.delivered) {
            row.delivered_per_s = Some((last - first) / load.window_s);
        }
        row.backlog = Some(metrics.required("ankusa_pending")? as u64);
    }
    row.peak_rss_mib = server::proc_sample(pid)?.peak_rss_kib as f64 / 1024.0;
    server.stop()?;
    receiver.stop();
    complain(&row, &load);
    Ok(row)
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
    }
}

/// Says on stderr when a row's numbers rest on refusals or errors.
fn complain(row: &CellRow, load: &LoadReport) {
    if row.total_other_status > 0 || row.total_errors > 0 {
        eprintln!(
            "bench-gate: {} ({}): {} non-2xx answers (by status: {:?}) and {} errors; \
             its numbers count only 2xx",
            row.cell, row.server, row.total_other_status, load.total.statuses, row.total_errors
        );
    }
}
