//! The processes a cell measures and what is read from them: `ankusa serve` (started with a
//! config file, ready when it prints `ankusa ready ingest=ADDR admin=ADDR`, stopped with
//! SIGTERM and expected to exit 0), nginx `return 202` (a generated config in a temp dir,
//! one worker), the gateway's `/metrics`, and CPU time and peak RSS from `/proc`.
//!
//! Every wait is bounded, and a process handle that is dropped without an orderly stop is
//! killed (SIGKILL, which the crash harness uses on purpose), so an error anywhere in a run leaves no server behind.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::cells::Cell;

/// How long `ankusa serve` may take to print its ready line (it opens RocksDB first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an orderly stop may take before the process is killed and the cell fails.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} did not become ready within {timeout_s} s; its stderr:\n{stderr}")]
    NotReady {
        program: String,
        timeout_s: u64,
        stderr: String,
    },
    #[error("{program} exited with {status} instead of 0; its stderr:\n{stderr}")]
    BadExit {
        program: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{program} did not stop within {timeout_s} s of SIGTERM and was killed")]
    StopTimeout { program: String, timeout_s: u64 },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("/proc/{pid}: {message}")]
    Proc { pid: u32, message: String },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let context = context.into();
    move |source| ServerError::Io { context, source }
}

/// A child process that is killed if dropped before [`Process::stop`].
struct Process {
    program: String,
    child: Option<Child>,
    stderr_path: PathBuf,
}

impl Process {
    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn stderr_text(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        // The end says why; a long log is cut from the front.
        let skip = text.len().saturating_sub(4000);
        let start = (skip..text.len())
            .find(|index| text.is_char_boundary(*index))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// SIGTERM, then a bounded wait; a process still running after it is killed.
    fn stop(mut self) -> Result<ExitStatus, ServerError> {
        let Some(mut child) = self.child.take() else {
            return Err(ServerError::Proc {
                pid: 0,
                message: "already stopped".into(),
            });
        };
        signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ServerError::StopTimeout {
                        program: self.program.clone(),
                        timeout_s: STOP_TIMEOUT.as_secs(),
                    });
                }
                Err(source) => {
                    return Err(ServerError::Io {
                        context: format!("waiting for {}", self.program),
                        source,
                    })
                }
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; `pid` is our own
    // child, not yet reaped, so it cannot name another process.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// A running `ankusa serve`.
pub struct Ankusa {
    process: Process,
    pub ingest: SocketAddr,
    pub admin: SocketAddr,
}

impl std::fmt::Debug for Ankusa {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Ankusa")
            .field("pid", &self.process.pid())
            .field("ingest", &self.ingest)
            .finish()
    }
}

/// `ankusa serve` spawned, its ready line not yet read.
pub struct Starting {
    process: Process,
    ready_line: mpsc::Receiver<String>,
}

impl Starting {
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Waits up to `timeout` for the ready line.
    pub fn ready(self, timeout: Duration) -> Result<Ankusa, ServerError> {
        let Starting {
            process,
            ready_line,
        } = self;
        let not_ready = |process: &Process| ServerError::NotReady {
            program: process.program.clone(),
            timeout_s: timeout.as_secs(),
            stderr: process.stderr_text(),
        };
        let line = match ready_line.recv_timeout(timeout) {
            Ok(line) => line,
            Err(_) => {
                // Give a process that exited a moment to flush its stderr.
                std::thread::sleep(Duration::from_millis(100));
                return Err(not_ready(&process));
            }
        };
        let (Some(ingest), Some(admin)) = (field(&line, "ingest="), field(&line, "admin=")) else {
            // Dropping the process kills it.
            return Err(not_ready(&process));
        };
        Ok(Ankusa {
            process,
            ingest,
            admin,
        })
    }

    /// SIGKILL, wherever its startup is, and reaps it.
    pub fn kill(self) {
        drop(self.process);
    }
}

impl Ankusa {
    /// Starts `bin serve --config CONFIG [--reference]` with `env` added to its
    /// environment, its stderr going to `stderr_path`, and waits for its ready line.
    pub fn start(
        bin: &Path,
        config: &Path,
        reference: bool,
        env: &[(&str, &str)],
        stderr_path: &Path,
    ) -> Result<Ankusa, ServerError> {
        Ankusa::spawn(bin, config, reference, env, stderr_path)?.ready(READY_TIMEOUT)
    }

    /// Starts the server on `cell`'s config, written into `dir` with its data under
    /// `dir/data` and its sink at `receiver`; its stderr goes to `dir/stderr.log`.
    pub fn start_cell(
        bin: &Path,
        cell: &Cell,
        dir: &Path,
        receiver: SocketAddr,
        reference: bool,
    ) -> Result<Ankusa, ServerError> {
        let config = dir.join("ankusa.yaml");
        std::fs::write(&config, cell.server_yaml(&dir.join("data"), receiver))
            .map_err(io("writing the cell's config"))?;
        Ankusa::start(bin, &config, reference, &[], &dir.join("stderr.log"))
    }

    /// Spawns `bin serve --config CONFIG [--reference]` like [`Ankusa::start`], without
    /// waiting for it.
    pub fn spawn(
        bin: &Path,
        config: &Path,
        reference: bool,
        env: &[(&str, &str)],
        stderr_path: &Path,
    ) -> Result<Starting, ServerError> {
        let program = if reference {
            "ankusa serve --reference".to_string()
        } else {
            "ankusa serve".to_string()
        };
        let stderr_file = std::fs::File::create(stderr_path)
            .map_err(io(format!("creating {}", stderr_path.display())))?;
        let mut command = Command::new(bin);
        command
            .arg("serve")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr_file))
            .env("ANKUSA_LOG", "warn")
            .envs(env.iter().copied());
        if reference {
            command.arg("--reference");
        }
        let mut child = command.spawn().map_err(|source| ServerError::Spawn {
            program: bin.display().to_string(),
            source,
        })?;
        let stdout = child.stdout.take();
        let process = Process {
            program,
            child: Some(child),
            stderr_path: stderr_path.to_path_buf(),
        };
        let (line_sender, line_receiver) = mpsc::channel();
        if let Some(stdout) = stdout {
            // Reads the ready line, then keeps draining so the server never blocks on a
            // full pipe; ends when the server closes stdout.
            std::thread::spawn(move || {
                let mut lines = BufReader::new(stdout).lines();
                if let Some(Ok(line)) = lines.next() {
                    let _ = line_sender.send(line);
                }
                for _ in lines {}
            });
        }
        Ok(Starting {
            process,
            ready_line: line_receiver,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// SIGKILL, and reaps it: a crash, not a stop.
    pub fn kill(self) {
        drop(self.process);
    }

    /// The gateway's `/metrics` as text.
    pub fn metrics(&self) -> Result<Metrics, ServerError> {
        let text = http_get(self.admin, "/metrics")?;
        Ok(Metrics { text })
    }

    /// SIGTERM and a bounded wait; anything but exit 0 is an error carrying its stderr.
    pub fn stop(self) -> Result<(), ServerError> {
        let program = self.process.program.clone();
        let stderr_path = self.process.stderr_path.clone();
        let status = self.process.stop()?;
        if status.success() {
            Ok(())
        } else {
            Err(ServerError::BadExit {
                program,
                status,
                stderr: std::fs::read_to_string(stderr_path).unwrap_or_default(),
            })
        }
    }
}

fn field(line: &str, name: &str) -> Option<SocketAddr> {
    let start = line.find(name)? + name.len();
    line[start..].split_whitespace().next()?.parse().ok()
}

/// One scrape of `/metrics`.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub text: String,
}

impl Metrics {
    /// The value of the unlabelled sample `name`.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let rest = line.strip_prefix(name)?;
                let value = rest.strip_prefix(' ')?;
                value.trim().parse().ok()
            })
    }

    /// The value of the sample `name{labels}`, `labels` exactly as exported
    /// (`sink="http"`).
    pub fn labelled_value(&self, name: &str, labels: &str) -> Option<f64> {
        self.text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix('{')?;
                let value = rest.strip_prefix(labels)?.strip_prefix("} ")?;
                value.trim().parse().ok()
            })
    }

    pub fn required(&self, name: &str) -> Result<f64, ServerError> {
        self.value(name)
            .ok_or_else(|| ServerError::Metrics(format!("no sample {name}")))
    }
}

/// `GET path` on `addr` with `connection: close`; returns the body of a 200.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, ServerError> {
    let context = format!("GET http://{addr}{path}");
    let mut stream =
        TcpStream::connect_timeout(&addr, METRICS_TIMEOUT).map_err(io(context.clone()))?;
    stream
        .set_read_timeout(Some(METRICS_TIMEOUT))
        .map_err(io(context.clone()))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .map_err(io(context.clone()))?;
    let mut answer = Vec::new();
    stream
        .take(64 * 1024 * 1024)
        .read_to_end(&mut answer)
        .map_err(io(context.clone()))?;
    let text = String::from_utf8_lossy(&answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(ServerError::Metrics(format!(
            "{context}: no complete answer"
        )));
    };
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(ServerError::Metrics(format!("{context}: {status}")));
    }
    Ok(body.to_string())
}

/// CPU time and peak resident memory of a process, read from `/proc`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// User + system CPU seconds of every thread so far.
    pub cpu_s: f64,
    /// Peak resident set size so far (`VmHWM`), in KiB.
    pub peak_rss_kib: u64,
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`.
pub fn proc_sample(pid: u32) -> Result<ProcSample, ServerError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|error| {
        ServerError::Proc {
            pid,
            message: format!("stat: {error}"),
        }
    })?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|error| {
        ServerError::Proc {
            pid,
            message: format!("status: {error}"),
        }
    })?;
    let cpu_ticks = parse_stat_cpu_ticks(&stat).ok_or_else(|| ServerError::Proc {
        pid,
        message: format!("cannot parse stat {stat:?}"),
    })?;
    let peak_rss_kib = parse_status_kib(&status, "VmHWM:").ok_or_else(|| ServerError::Proc {
        pid,
        message: "no VmHWM in status".into(),
    })?;
    Ok(ProcSample {
        cpu_s: cpu_ticks as f64 / clock_ticks_per_s(),
        peak_rss_kib,
    })
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted from its last `)`.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: field 3 (state) is index 0, so utime (14) is index 11.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// A running nginx answering `return 202` on loopback, one worker, in its own temp dir.
pub struct Nginx {
    process: Process,
    pub addr: SocketAddr,
}

impl std::fmt::Debug for Nginx {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Nginx")
            .field("pid", &self.process.pid())
            .field("addr", &self.addr)
            .finish()
    }
}

/// The nginx binary on PATH, if any.
pub fn nginx_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
}

/// nginx's config: a single process (no master) so `/proc/PID` is the worker that does
/// the work; no logs; keep-alive without a request limit; the body read and discarded.
pub fn nginx_config(dir: &Path, port: u16) -> String {
    let dir = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {dir}/nginx.pid;\n\
         error_log {dir}/error.log warn;\nevents {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  \
         proxy_temp_path {dir}/proxy;\n  fastcgi_temp_path {dir}/fastcgi;\n  \
         uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n  \
         client_max_body_size 2m;\n  client_body_buffer_size 1m;\n  \
         keepalive_requests 100000000;\n  keepalive_timeout 120s;\n  \
         default_type application/json;\n  server {{\n    listen 127.0.0.1:{port};\n    \
         location / {{ return 202 '{{}}'; }}\n  }}\n}}\n"
    )
}

impl Nginx {
    /// Starts nginx on a free loopback port with its config in `dir`.
    pub fn start(nginx: &Path, dir: &Path) -> Result<Nginx, ServerError> {
        // A free port: bind :0, read it, release it. Another process could take it in
        // between; nginx then fails to start and the error says so.
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").map_err(io("finding a port"))?;
            listener.local_addr().map_err(io("finding a port"))?.port()
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let config_path = dir.join("nginx.conf");
        std::fs::write(&config_path, nginx_config(dir, port))
            .map_err(io(format!("writing {}", config_path.display())))?;
        let stderr_path = dir.join("nginx.stderr");
        let stderr_file = std::fs::File::create(&stderr_path)
            .map_err(io(format!("creating {}", stderr_path.display())))?;
        let child = Command::new(nginx)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&config_path)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr_file))
            .spawn()
            .map_err(|source| ServerError::Spawn {
                program: nginx.display().to_string(),
                source,
            })?;
        let mut process = Process {
            program: "nginx".into(),
            child: Some(child),
            stderr_path,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(Nginx { process, addr });
            }
            let exited = process
                .child
                .as_mut()
                .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))));
            if exited || Instant::now() >= deadline {
                let error_log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                return Err(ServerError::NotReady {
                    program: "nginx".into(),
                    timeout_s: 10,
                    stderr: format!("{}{error_log}", process.stderr_text()),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// SIGTERM (nginx's fast shutdown) and a bounded wait.
    pub fn stop(self) -> Result<(), ServerError> {
        self.process.stop().map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_skip_a_name_with_spaces_and_parentheses() {
        let stat = "4242 (ankusa (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 75 0 0 20 0 9 0 123 456 789";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
        assert_eq!(parse_stat_cpu_ticks("no name here"), None);
    }

    #[test]
    fn status_peak_rss() {
        let status = "Name:\tankusa\nVmPeak:\t  100 kB\nVmHWM:\t   70424 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_status_kib(status, "VmHWM:"), Some(70424));
        assert_eq!(parse_status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let sample = proc_sample(std::process::id()).unwrap();
        assert!(sample.peak_rss_kib > 0);
        assert!(sample.cpu_s >= 0.0);
    }

    #[test]
    fn metrics_values_are_read_by_exact_name() {
        let metrics = Metrics {
            text: "# HELP ankusa_pending x\n# TYPE ankusa_pending gauge\nankusa_pending 12\n\
                   ankusa_pending_bytes 4096\nankusa_ingested_total 1e3\n\
                   ankusa_ingest_requests_total{class=\"2xx\"} 5\n"
                .into(),
        };
        assert_eq!(metrics.value("ankusa_pending"), Some(12.0));
        assert_eq!(metrics.value("ankusa_pending_bytes"), Some(4096.0));
        assert_eq!(metrics.value("ankusa_ingested_total"), Some(1000.0));
        assert_eq!(metrics.value("ankusa_ingest_requests_total"), None);
        assert!(metrics.required("ankusa_delivered_total").is_err());
        assert_eq!(
            metrics.labelled_value("ankusa_ingest_requests_total", "class=\"2xx\""),
            Some(5.0)
        );
        assert_eq!(
            metrics.labelled_value("ankusa_ingest_requests_total", "class=\"4xx\""),
            None
        );
        assert_eq!(metrics.labelled_value("ankusa_pending", ""), None);
    }
}
