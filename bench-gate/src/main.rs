//! The `bench-gate` binary: parses the command line, loads the cells file, and hands over to
//! `run`, `compare`, `drain`, `crash` or `slowloris`; prints the table on stdout and writes the JSON to
//! `bench-gate/out/` (and, for `run` and `compare`, the HTML report beside it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use bench_gate::binary;
use bench_gate::cells::{CellsFile, Durations};
use bench_gate::compare::{self, CompareSettings};
use bench_gate::crash::{self, CrashSettings};
use bench_gate::drain::{self, DrainSettings, SinkKind};
use bench_gate::html;
use bench_gate::report;
use bench_gate::run::{self, RunSettings, Timing};
use bench_gate::server;
use bench_gate::slowloris::{self, SlowlorisSettings};

#[derive(Parser)]
#[command(
    name = "bench-gate",
    about = "Before/after performance gate for Ankusa: cells measured as ratios to an in-run reference."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the server (release), measure each cell, print the table and write
    /// bench-gate/out/latest.json and, beside it, latest.html (the table, latency CDFs and
    /// throughput over time); exit 1 when a row failed a check (the lane sweep ran
    /// with no ordered sink, an ordered hook missed its key).
    ///
    /// Example: bench-gate run --quick --cells ack-unordered,reference
    Run {
        #[command(flatten)]
        common: Common,
        /// Measure this binary instead of building the working tree.
        #[arg(long, value_name = "PATH")]
        bin: Option<PathBuf>,
        /// Where the JSON goes (default bench-gate/out/latest.json); the HTML report goes
        /// beside it, named .html.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Build REV (in a temporary git worktree) and the working tree, run them alternately,
    /// print head/base ratios per cell and PASS or FAIL, write bench-gate/out/compare.json
    /// and compare.html (base and head charted per cell); exit 0 on PASS, 1 on FAIL. Without
    /// --cells, cells with `in_compare: false` are left out.
    ///
    /// Example: bench-gate compare --base main --cells ack-unordered
    Compare {
        #[command(flatten)]
        common: Common,
        /// The base revision (anything `git rev-parse` takes).
        #[arg(long, value_name = "REV")]
        base: String,
        /// Pairs of runs (A B A B …); at least 3 (default from the cells file).
        #[arg(long, value_name = "N")]
        pairs: Option<usize>,
        /// Target dir of the base build.
        #[arg(long, value_name = "DIR", default_value = binary::DEFAULT_BASE_TARGET_DIR)]
        base_target_dir: PathBuf,
        /// Measure this binary as the base instead of building REV (REV only names it).
        #[arg(long, value_name = "PATH")]
        base_bin: Option<PathBuf>,
        /// Measure this binary as the head instead of building the working tree.
        #[arg(long, value_name = "PATH")]
        head_bin: Option<PathBuf>,
    },
    /// Measure how fast one sink drains a backlog: start the server with one tenant, one
    /// source and one sink of KIND delivering to a destination on loopback (http: the
    /// in-process receiver; redis: stream bench-drain-PID on 127.0.0.1:6379; nats: JetStream
    /// stream BENCH_DRAIN_PID on subject bench.drain.PID at 127.0.0.1:4222; rabbitmq: durable
    /// queue bench-drain-PID on amqp://guest:guest@127.0.0.1:5672/%2f; kafka: topic
    /// bench-drain-PID, 8 partitions, on librdkafka's mock cluster in this process; sqs: queue
    /// bench-drain-PID (bench-drain-PID.fifo with --keys) on moto at 127.0.0.1:5000, with
    /// moto's dummy AWS credentials in the server's environment, received and deleted while
    /// the run lasts by 3 consumer tasks (so moto's queue stays short) and counted as the
    /// distinct ankusa_seq received, each FIFO MessageGroupId's in increasing order; pubsub:
    /// topic
    /// bench-drain-PID in project bench-gate on the emulator at 127.0.0.1:8085, counted by
    /// pulling its subscription bench-drain-PID-count), post exactly --hooks
    /// 1 KiB Stripe-shaped hooks closed-loop, then poll ankusa_delivered_total every 100 ms
    /// until all are delivered. Prints ingest hooks/s, the backlog at the end of ingest, drain
    /// delivered/s after it and overall delivered/s, and writes
    /// bench-gate/out/drain-KIND.json; the destination is read back with its own client and
    /// removed. Exit 1 when a hook was not acked, not delivered within --timeout-s, or
    /// dead-lettered, or the destination holds fewer than --hooks, or an SQS FIFO group
    /// arrived out of order; exit 2 when a service is unreachable.
    ///
    /// Example: bench-gate drain --sink redis --hooks 20000 --keys 1000
    Drain {
        /// The sink kind measured: http, redis, nats, rabbitmq, kafka, sqs or pubsub.
        #[arg(long, value_name = "KIND")]
        sink: SinkKind,
        /// Hooks posted, exactly.
        #[arg(long, value_name = "N", default_value_t = 100_000)]
        hooks: u64,
        /// Ordering keys: with N > 0 the sink is `ordered: true` on data.object.customer
        /// and the hooks' customers cycle over cus_0 .. cus_{N-1}; 0 is unordered.
        #[arg(long, value_name = "N", default_value_t = 0)]
        keys: usize,
        /// Measure this binary instead of building the working tree.
        #[arg(long, value_name = "PATH")]
        bin: Option<PathBuf>,
        /// Keep-alive connections the hooks are posted over.
        #[arg(long, value_name = "N", default_value_t = 64)]
        connections: usize,
        /// Bound on ingest and drain together, from the first send.
        #[arg(long, value_name = "S", default_value_t = 600)]
        timeout_s: u64,
        /// A top-level key of the sink's entry, VALUE in YAML (repeatable), e.g.
        /// max_in_flight=8 or 'client={"linger.ms": "1"}'; the keys the drain sets itself
        /// (kind, id, the destination's, ordered, ordering_key) are refused. Recorded in
        /// the JSON.
        #[arg(long = "sink-option", value_name = "KEY=VALUE", value_parser = drain::parse_sink_option)]
        sink_options: Vec<drain::SinkOption>,
        /// Where the JSON goes (default bench-gate/out/drain-KIND.json).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Crash harness: start the real server (several tenants, an ordered and an unordered
    /// HTTP sink to a recording receiver), SIGKILL it at random moments of startup,
    /// recovery and load for --cycles cycles, run `ankusa store verify` after each kill,
    /// then drain everything and check: every acked hook delivered to every sink (lost),
    /// each lane's first deliveries in seq order with repeats only before a later hook
    /// (order), no retried hook delivered as two hooks (split). Prints one summary line and
    /// writes bench-gate/out/crash.json; exit 1 when a promise broke. With --fault NAME the
    /// server runs with that defect injected (ack_before_sync, ignore_lanes) and the run
    /// passes only when the check catches it.
    ///
    /// Example: bench-gate crash --cycles 100 --seed 7
    Crash {
        /// Kill-and-restart cycles before the final drain.
        #[arg(long, value_name = "N", default_value_t = 10)]
        cycles: u32,
        /// Seed of the schedule (kill moments, tenants, keys, the receiver's refusals);
        /// default: from the clock, printed in the summary for a replay.
        #[arg(long, value_name = "N")]
        seed: Option<u64>,
        #[arg(long, value_name = "N", default_value_t = 3)]
        tenants: usize,
        /// Ordering keys per tenant.
        #[arg(long, value_name = "N", default_value_t = 16)]
        keys: usize,
        /// Keep-alive connections of the posters.
        #[arg(long, value_name = "N", default_value_t = 8)]
        connections: usize,
        /// Hooks per second the posters send at most, all together.
        #[arg(long, value_name = "N", default_value_t = 1000)]
        rate: u64,
        /// Longest load before the kill in a cycle (each cycle draws from a tenth of it to
        /// all of it).
        #[arg(long, value_name = "MS", default_value_t = 2000)]
        max_load_ms: u64,
        /// Bound on the final drain.
        #[arg(long, value_name = "S", default_value_t = 300)]
        drain_timeout_s: u64,
        /// Inject this defect into the server and pass only when the check catches it.
        #[arg(long, value_name = "NAME")]
        fault: Option<String>,
        /// Test this binary instead of building the working tree.
        #[arg(long, value_name = "PATH")]
        bin: Option<PathBuf>,
        /// Where the JSON goes (default bench-gate/out/crash.json).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Slowloris: one server with the ack-unordered cell's config and an open-loop load,
    /// measured alone and then while --slow other connections each hold a request head open
    /// (a byte every --trickle-ms, reopened whenever the edge cuts one off). Prints both
    /// phases' latencies and the p99 ratio, writes bench-gate/out/slowloris.json; exit 1 when
    /// a request of the load was refused, lost or sent late, or no slow head was cut off.
    ///
    /// Example: bench-gate slowloris --slow 1000 --rate 2000
    Slowloris {
        #[arg(long, value_name = "N", default_value_t = 1000)]
        slow: usize,
        /// Requests per second of the well-behaved load (open loop).
        #[arg(long, value_name = "N", default_value_t = 2000.0)]
        rate: f64,
        /// Keep-alive connections of the well-behaved load.
        #[arg(long, value_name = "N", default_value_t = 16)]
        connections: usize,
        /// Measurement window of each phase (after a 2 s warm-up).
        #[arg(long, value_name = "S", default_value_t = 10)]
        seconds: u64,
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        trickle_ms: u64,
        /// Measure this binary instead of building the working tree.
        #[arg(long, value_name = "PATH")]
        bin: Option<PathBuf>,
        /// Where the JSON goes (default bench-gate/out/slowloris.json).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// List the cells of the cells file.
    List {
        #[arg(long, value_name = "FILE")]
        cells_file: Option<PathBuf>,
    },
}

#[derive(Args)]
struct Common {
    /// Comma-separated cell names (default: every cell); the reference is always measured.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    cells: Option<Vec<String>>,
    /// Shorter warm-up and measurement (quick_* in the cells file): proves the harness
    /// works, not a number to post.
    #[arg(long)]
    quick: bool,
    /// The cells file (default bench-gate/cells.yaml of the workspace).
    #[arg(long, value_name = "FILE")]
    cells_file: Option<PathBuf>,
    /// Warm-up seconds, overriding the cells file.
    #[arg(long, value_name = "S")]
    warmup_s: Option<f64>,
    /// Measurement seconds, overriding the cells file.
    #[arg(long, value_name = "S")]
    measure_s: Option<f64>,
    /// Load generator threads (event loops); the load and the server share the machine,
    /// so one is usually right on 2 cores.
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("bench-gate: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    let root = binary::workspace_root()?;
    match cli.command {
        Command::List { cells_file } => {
            let file = load_cells(&root, cells_file.as_ref())?;
            for cell in &file.cells {
                println!("{:<16} {}", cell.name, cell.about);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { common, bin, out } => {
            let file = load_cells(&root, common.cells_file.as_ref())?;
            let cells = file.select(common.cells.as_deref())?;
            let timing = timing(&file.durations, &common)?;
            let server = server_bin(&root, bin)?;
            let settings = RunSettings {
                bin: server.path.clone(),
                timing,
                threads: common.threads,
                nginx: server::nginx_on_path(),
            };
            let report = run::run_cells(&settings, &cells, server.revision.clone())?;
            let out = out.unwrap_or_else(|| root.join("bench-gate/out/latest.json"));
            finish(
                &report::render_run(&report),
                |path| Ok(report.write_json(path)?),
                &out,
                Some(&html::render_run(&report)),
                !report.failed(),
            )
        }
        Command::Drain {
            sink,
            hooks,
            keys,
            bin,
            connections,
            timeout_s,
            sink_options,
            out,
        } => {
            let mut settings = DrainSettings {
                bin: PathBuf::new(),
                sink,
                hooks,
                keys,
                connections,
                timeout: Duration::from_secs(timeout_s),
                sink_options,
            };
            // Bad settings fail before the build.
            let problems = settings.problems();
            anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
            let server = server_bin(&root, bin)?;
            settings.bin = server.path.clone();
            let report = drain::drain(&settings, server.revision.clone())?;
            let out = out
                .unwrap_or_else(|| root.join(format!("bench-gate/out/drain-{}.json", sink.name())));
            finish(
                &drain::render(&report),
                |path| Ok(report.write_json(path)?),
                &out,
                None,
                !report.failed(),
            )
        }
        Command::Crash {
            cycles,
            seed,
            tenants,
            keys,
            connections,
            rate,
            max_load_ms,
            drain_timeout_s,
            fault,
            bin,
            out,
        } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |elapsed| elapsed.as_nanos() as u64)
            });
            let mut settings = CrashSettings {
                bin: PathBuf::new(),
                cycles,
                seed,
                tenants,
                keys,
                connections,
                rate,
                max_load: Duration::from_millis(max_load_ms),
                drain_timeout: Duration::from_secs(drain_timeout_s),
                fault,
            };
            // Bad settings fail before the build.
            let problems = settings.problems();
            anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
            let server = server_bin(&root, bin)?;
            settings.bin = server.path.clone();
            let report = crash::crash(&settings, server.revision.clone())?;
            let out = out.unwrap_or_else(|| root.join("bench-gate/out/crash.json"));
            finish(
                &crash::render(&report),
                |path| report.write_json(path),
                &out,
                None,
                report.passed(),
            )
        }
        Command::Slowloris {
            slow,
            rate,
            connections,
            seconds,
            trickle_ms,
            bin,
            out,
        } => {
            let mut settings = SlowlorisSettings {
                bin: PathBuf::new(),
                slow,
                rate,
                connections,
                measure: Duration::from_secs(seconds),
                trickle: Duration::from_millis(trickle_ms),
            };
            let problems = settings.problems();
            anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
            let file = load_cells(&root, None)?;
            let cell = file
                .select(Some(&["ack-unordered".to_string()]))?
                .into_iter()
                .find(|cell| cell.name == "ack-unordered")
                .context("the cells file has no ack-unordered cell")?;
            let server = server_bin(&root, bin)?;
            settings.bin = server.path.clone();
            let report = slowloris::slowloris(&settings, &cell, server.revision.clone())?;
            let out = out.unwrap_or_else(|| root.join("bench-gate/out/slowloris.json"));
            finish(
                &slowloris::render(&report),
                |path| report.write_json(path),
                &out,
                None,
                report.passed(),
            )
        }
        Command::Compare {
            common,
            base,
            pairs,
            base_target_dir,
            base_bin,
            head_bin,
        } => {
            let file = load_cells(&root, common.cells_file.as_ref())?;
            let cells = file.select_for_compare(common.cells.as_deref())?;
            let pairs = pairs.unwrap_or(file.compare.pairs);
            anyhow::ensure!(pairs >= 3, "--pairs must be at least 3, found {pairs}");
            let settings = CompareSettings {
                repo: root.clone(),
                base_rev: base,
                base_bin,
                head_bin,
                head_target_dir: binary::target_dir(),
                base_target_dir,
                pairs,
                timing: timing(&file.durations, &common)?,
                threads: common.threads,
                nginx: server::nginx_on_path(),
            };
            let report = compare::compare(&settings, &file, &cells)?;
            finish(
                &report::render_compare(&report),
                |path| Ok(report.write_json(path)?),
                &root.join("bench-gate/out/compare.json"),
                Some(&html::render_compare(&report)),
                report.pass(),
            )
        }
    }
}

/// `bin`, or the working tree's server built and pinned under a private name in a temp
/// dir (kept while the returned dir lives), so a build by anyone else in the same target
/// dir cannot change what is measured halfway.
/// The server binary a verb measures: the one given with `--bin`, or `ankusa` built from
/// the working tree and pinned in a temp dir (kept alive by `_pinned`).
struct ServerBin {
    path: PathBuf,
    /// What the report names as measured: the tree's revision only when the binary was
    /// built from it; a given binary may be of any revision, so it is named by its path.
    revision: Option<String>,
    _pinned: Option<tempfile::TempDir>,
}

fn server_bin(root: &std::path::Path, bin: Option<PathBuf>) -> anyhow::Result<ServerBin> {
    Ok(match bin {
        Some(bin) => ServerBin {
            revision: Some(given_binary_label(&bin)),
            path: bin,
            _pinned: None,
        },
        None => {
            let built = binary::build_server(root, &binary::target_dir())?;
            let dir = tempfile::Builder::new()
                .prefix("bench-gate-bin-")
                .tempdir()
                .context("creating a temp dir")?;
            ServerBin {
                path: binary::pin(&built, dir.path(), "ankusa")?,
                revision: revision(root),
                _pinned: Some(dir),
            }
        }
    })
}

fn given_binary_label(bin: &std::path::Path) -> String {
    format!("binary {}", bin.display())
}

/// The end of every verb: the table on stdout, the JSON written to `out` (and the HTML
/// report, when the verb has one, beside it), and the exit code.
fn finish(
    table: &str,
    write_json: impl FnOnce(&std::path::Path) -> anyhow::Result<()>,
    out: &std::path::Path,
    html: Option<&str>,
    passed: bool,
) -> anyhow::Result<ExitCode> {
    print!("{table}");
    write_json(out).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("bench-gate: wrote {}", out.display());
    if let Some(html) = html {
        let path = html::path_beside(out);
        html::write(&path, html).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench-gate: wrote {}", path.display());
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The git revision measured, for the JSON.
fn revision(root: &std::path::Path) -> Option<String> {
    binary::git(root, &["describe", "--always", "--dirty"]).ok()
}

fn load_cells(root: &std::path::Path, path: Option<&PathBuf>) -> anyhow::Result<CellsFile> {
    let path = path
        .cloned()
        .unwrap_or_else(|| root.join("bench-gate/cells.yaml"));
    CellsFile::load(&path).with_context(|| format!("cells file {}", path.display()))
}

fn timing(durations: &Durations, common: &Common) -> anyhow::Result<Timing> {
    let (warmup_s, measure_s) = if common.quick {
        (durations.quick_warmup_s, durations.quick_measure_s)
    } else {
        (durations.warmup_s, durations.measure_s)
    };
    let warmup_s = common.warmup_s.unwrap_or(warmup_s);
    let measure_s = common.measure_s.unwrap_or(measure_s);
    let seconds = |name: &str, value: f64, minimum: f64| -> anyhow::Result<Duration> {
        anyhow::ensure!(
            value.is_finite() && (minimum..=3600.0).contains(&value),
            "{name} must be between {minimum} and 3600 seconds, found {value}"
        );
        Ok(Duration::from_secs_f64(value))
    };
    Ok(Timing {
        warmup: seconds("warm-up", warmup_s, 0.0)?,
        measure: seconds("measurement", measure_s, 0.1)?,
        drain: seconds("drain", durations.drain_s, 0.1)?,
        quick: common.quick,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_given_binary_is_named_by_its_path_not_by_the_tree() {
        let root = binary::workspace_root().unwrap();
        let given = PathBuf::from("/var/tmp/bin-base/ankusa");
        let server = server_bin(&root, Some(given.clone())).unwrap();
        assert_eq!(server.path, given);
        assert_eq!(
            server.revision.as_deref(),
            Some("binary /var/tmp/bin-base/ankusa")
        );
        assert!(
            server._pinned.is_none(),
            "a given binary is not built or pinned"
        );
    }
}
