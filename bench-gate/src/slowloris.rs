//! `bench-gate slowloris`: what connections that never finish their request head cost the
//! clients that do. One server (the `ack-unordered` cell's config), one open-loop load at a
//! fixed rate, measured twice in the same run: alone, then while N other connections each
//! hold a head open, one byte at a time, reconnecting whenever the edge cuts one off. The
//! verdict is the ratio of the two p99s; absolute numbers are printed for context only.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::cells::Cell;
use crate::load::{self, LoadPlan, LoadReport, Mode};
use crate::responder::Responder;
use crate::server::Ankusa;

/// The head every slow connection starts with; it then sends one more byte of the
/// `x-slow` value per tick and never ends the line.
const SLOW_HEAD: &[u8] = b"POST /hooks/demo HTTP/1.1\r\nhost: slowloris\r\nx-slow: ";

#[derive(Debug, Clone)]
pub struct SlowlorisSettings {
    pub bin: PathBuf,
    /// Connections that hold a head open.
    pub slow: usize,
    /// The well-behaved load: requests per second over `connections`.
    pub rate: f64,
    pub connections: usize,
    /// Each phase's measurement window (after a 2 s warm-up).
    pub measure: Duration,
    /// How often each slow connection sends one more byte.
    pub trickle: Duration,
}

impl SlowlorisSettings {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.slow == 0 || self.slow > 15_000 {
            problems.push(format!(
                "--slow must be 1 to 15000 (file descriptors), found {}",
                self.slow
            ));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            problems.push(format!("--rate must be positive, found {}", self.rate));
        }
        if self.connections == 0 {
            problems.push("--connections must be at least 1".into());
        }
        if self.measure.is_zero() {
            problems.push("--seconds must be at least 1".into());
        }
        if self.trickle.is_zero() {
            problems.push("--trickle-ms must be at least 1".into());
        }
        problems
    }
}

/// One phase's numbers.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Phase {
    pub ok_per_s: f64,
    pub non_2xx: u64,
    pub errors: u64,
    pub missed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

impl Phase {
    fn of(load: &LoadReport) -> Phase {
        Phase {
            ok_per_s: load.ok_per_s(),
            non_2xx: load.window.status_other,
            errors: load.window.errors,
            missed: load.missed,
            p50_ms: load.latency_ms(0.50),
            p99_ms: load.latency_ms(0.99),
            p999_ms: load.latency_ms(0.999),
        }
    }

    /// Every request of the phase was sent on time and acked.
    fn served(&self) -> bool {
        self.non_2xx == 0 && self.errors == 0 && self.missed == 0
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SlowlorisReport {
    pub revision: Option<String>,
    pub slow: usize,
    pub rate: f64,
    pub connections: usize,
    pub measure_s: f64,
    pub trickle_ms: u64,
    pub alone: Phase,
    pub attacked: Phase,
    /// attacked p99 / alone p99.
    pub p99_ratio: f64,
    /// Slow connections open when the attacked window ended.
    pub slow_held_at_end: u64,
    /// Slow connections the edge cut off (a 408 or a close), each then reopened.
    pub slow_cut: u64,
    /// Of those, answered 408 first.
    pub slow_408: u64,
}

impl SlowlorisReport {
    /// The other clients were served in full while the slow ones were held, and the edge
    /// cut the slow ones off rather than holding them for ever.
    pub fn passed(&self) -> bool {
        self.alone.served() && self.attacked.served() && self.slow_408 > 0
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }
}

pub fn render(report: &SlowlorisReport) -> String {
    let line = |name: &str, phase: &Phase| {
        format!(
            "{name:<9} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>6} {:>6}\n",
            phase.ok_per_s,
            phase.p50_ms,
            phase.p99_ms,
            phase.p999_ms,
            phase.non_2xx,
            phase.errors,
            phase.missed
        )
    };
    let mut out = format!(
        "slowloris: {} slow connections (a byte every {} ms), load {}/s over {} connections, {} s windows\n",
        report.slow, report.trickle_ms, report.rate, report.connections, report.measure_s
    );
    out.push_str("phase        ok/s   p50 ms   p99 ms  p999 ms  non2xx errors missed\n");
    out.push_str(&line("alone", &report.alone));
    out.push_str(&line("attacked", &report.attacked));
    out.push_str(&format!(
        "p99 attacked/alone {:.3}; slow held at end {}, cut by the edge {} ({} with 408) -> {}\n",
        report.p99_ratio,
        report.slow_held_at_end,
        report.slow_cut,
        report.slow_408,
        if report.passed() { "PASS" } else { "FAIL" }
    ));
    out
}

/// The slow side: threads that keep `target` connections holding a head open.
struct Attack {
    stop: Arc<AtomicBool>,
    open: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    cut_408: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Attack {
    fn start(target: SocketAddr, slow: usize, trickle: Duration) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let cut_408 = Arc::new(AtomicU64::new(0));
        let threads = (0..2)
            .map(|thread| {
                let count = slow / 2 + usize::from(thread < slow % 2);
                let (stop, open, cut, cut_408) =
                    (stop.clone(), open.clone(), cut.clone(), cut_408.clone());
                std::thread::spawn(move || {
                    hold(target, count, trickle, &stop, &open, &cut, &cut_408)
                })
            })
            .collect();
        Attack {
            stop,
            open,
            cut,
            cut_408,
            threads,
        }
    }

    /// Waits until every slow connection is open (or `timeout`).
    fn wait_open(&self, slow: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.open.load(Ordering::Relaxed) >= slow as u64 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn stop(self) -> (u64, u64, u64) {
        let held = self.open.load(Ordering::Relaxed);
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        (
            held,
            self.cut.load(Ordering::Relaxed),
            self.cut_408.load(Ordering::Relaxed),
        )
    }
}

fn open_slow(target: SocketAddr) -> Option<TcpStream> {
    let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(2)).ok()?;
    stream.write_all(SLOW_HEAD).ok()?;
    stream.set_nonblocking(true).ok()?;
    Some(stream)
}

/// Whether the edge has answered or closed `stream`: `Some(true)` for a 408.
fn cut_off(stream: &mut TcpStream) -> Option<bool> {
    let mut buf = [0u8; 512];
    match stream.read(&mut buf) {
        Ok(0) => Some(false),
        Ok(n) => Some(buf[..n].starts_with(b"HTTP/1.1 408")),
        Err(error) if error.kind() == ErrorKind::WouldBlock => None,
        Err(_) => Some(false),
    }
}

#[allow(clippy::too_many_arguments)]
fn hold(
    target: SocketAddr,
    count: usize,
    trickle: Duration,
    stop: &AtomicBool,
    open: &AtomicU64,
    cut: &AtomicU64,
    cut_408: &AtomicU64,
) {
    let mut streams: Vec<Option<TcpStream>> = Vec::with_capacity(count);
    for _ in 0..count {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let stream = open_slow(target);
        if stream.is_some() {
            open.fetch_add(1, Ordering::Relaxed);
        }
        streams.push(stream);
    }
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        for slot in streams.iter_mut() {
            if let Some(stream) = slot {
                let answer =
                    cut_off(stream).or_else(|| stream.write_all(b"z").err().map(|_| false));
                if let Some(was_408) = answer {
                    *slot = None;
                    open.fetch_sub(1, Ordering::Relaxed);
                    cut.fetch_add(1, Ordering::Relaxed);
                    if was_408 {
                        cut_408.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if slot.is_none() {
                *slot = open_slow(target);
                if slot.is_some() {
                    open.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let rest = trickle.saturating_sub(tick.elapsed());
        // Short naps, so a stop is seen at once.
        let until = Instant::now() + rest;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(rest.min(Duration::from_millis(50)));
        }
    }
}

fn phase(cell: &Cell, settings: &SlowlorisSettings, target: SocketAddr) -> anyhow::Result<Phase> {
    let plan = LoadPlan {
        target,
        connections: settings.connections,
        threads: 1,
        mode: Mode::Open {
            rate_per_s: settings.rate,
        },
        start_at: Instant::now() + Duration::from_millis(200),
        warmup: Duration::from_secs(2),
        measure: settings.measure,
        drain: Duration::from_secs(5),
        hooks: cell.hook_spec(),
        limit: None,
    };
    Ok(Phase::of(&load::run(&plan)?))
}

/// Runs both phases against one server started with `cell`'s config.
pub fn slowloris(
    settings: &SlowlorisSettings,
    cell: &Cell,
    revision: Option<String>,
) -> anyhow::Result<SlowlorisReport> {
    let dir = tempfile::Builder::new()
        .prefix("bench-gate-slowloris-")
        .tempdir()
        .context("creating a temp dir")?;
    let receiver = Responder::start(200)?;
    let server = Ankusa::start_cell(&settings.bin, cell, dir.path(), receiver.addr(), false)?;
    eprintln!("bench-gate: slowloris: the load alone");
    let alone = phase(cell, settings, server.ingest)?;
    eprintln!(
        "bench-gate: slowloris: opening {} slow connections",
        settings.slow
    );
    let attack = Attack::start(server.ingest, settings.slow, settings.trickle);
    let all_open = attack.wait_open(settings.slow, Duration::from_secs(30));
    eprintln!("bench-gate: slowloris: the load beside them");
    let attacked = phase(cell, settings, server.ingest);
    let (held, cut, cut_408) = attack.stop();
    let attacked = attacked?;
    anyhow::ensure!(
        all_open,
        "only {held} of {} slow connections could be opened",
        settings.slow
    );
    server.stop()?;
    receiver.stop();
    let p99_ratio = if alone.p99_ms > 0.0 {
        attacked.p99_ms / alone.p99_ms
    } else {
        0.0
    };
    Ok(SlowlorisReport {
        revision,
        slow: settings.slow,
        rate: settings.rate,
        connections: settings.connections,
        measure_s: settings.measure.as_secs_f64(),
        trickle_ms: settings.trickle.as_millis() as u64,
        alone,
        attacked,
        p99_ratio,
        slow_held_at_end: held,
        slow_cut: cut,
        slow_408: cut_408,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(non_2xx: u64, errors: u64, missed: u64, p99_ms: f64) -> Phase {
        Phase {
            ok_per_s: 1000.0,
            non_2xx,
            errors,
            missed,
            p50_ms: 0.5,
            p99_ms,
            p999_ms: p99_ms * 2.0,
        }
    }

    fn report(attacked: Phase, slow_408: u64) -> SlowlorisReport {
        SlowlorisReport {
            revision: None,
            slow: 1000,
            rate: 2000.0,
            connections: 16,
            measure_s: 10.0,
            trickle_ms: 1000,
            alone: phase(0, 0, 0, 1.0),
            p99_ratio: attacked.p99_ms,
            attacked,
            slow_held_at_end: 1000,
            slow_cut: slow_408,
            slow_408,
        }
    }

    #[test]
    fn it_passes_only_when_every_request_was_served_and_the_edge_cut_slow_heads() {
        assert!(report(phase(0, 0, 0, 3.0), 10).passed());
        assert!(!report(phase(1, 0, 0, 1.0), 10).passed());
        assert!(!report(phase(0, 1, 0, 1.0), 10).passed());
        assert!(!report(phase(0, 0, 1, 1.0), 10).passed());
        assert!(!report(phase(0, 0, 0, 1.0), 0).passed());
    }

    #[test]
    fn the_table_names_both_phases_and_the_verdict() {
        let text = render(&report(phase(0, 0, 0, 2.5), 7));
        assert!(text.contains("alone"), "{text}");
        assert!(text.contains("attacked"), "{text}");
        assert!(text.contains("p99 attacked/alone 2.500"), "{text}");
        assert!(text.contains("(7 with 408) -> PASS"), "{text}");
    }

    #[test]
    fn bad_settings_are_named() {
        let settings = SlowlorisSettings {
            bin: PathBuf::new(),
            slow: 0,
            rate: 0.0,
            connections: 0,
            measure: Duration::ZERO,
            trickle: Duration::ZERO,
        };
        assert_eq!(settings.problems().len(), 5);
    }
}
