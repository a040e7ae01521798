//! The load generator: HTTP/1.1 keep-alive POSTs over a fixed set of connections, driven by
//! one small epoll loop (mio) per thread, in one of two modes:
//!
//! - closed loop: every connection sends its next request as soon as the previous answer
//!   arrives, so the rate is whatever the server sustains;
//! - open loop: requests are due at a fixed rate whatever the server does; a request that
//!   finds no idle connection waits, and its latency is measured from when it was due, not
//!   from when it could finally be sent. Measuring from the send would hide exactly the
//!   stalls a benchmark exists to show (coordinated omission).
//!
//! A run has a warm-up and a measurement window. Totals count every answer of the run (they
//! must equal what the server counted); the window's counts and latencies make the numbers.
//! Every loop is bounded: sending stops at the window's end (or once the plan's `limit` of
//! requests is sent, whichever comes first), and answers still missing after the drain
//! period are counted as errors.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use thiserror::Error;

use crate::hooks::{HookError, HookSpec, RequestFactory};

/// Latencies are recorded in microseconds, from 1 µs to this (a minute).
const LATENCY_MAX_US: u64 = 60_000_000;
/// Bytes read from a socket at once.
const READ_CHUNK: usize = 16 * 1024;
/// Response heads longer than this are a protocol error (the servers send a few hundred).
const RESPONSE_HEAD_MAX: usize = 16 * 1024;
/// How long a lost connection waits before it is opened again, so a refusing server is not
/// hammered with connects.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The poll's timer has millisecond granularity: requests due just before the end may be
/// seen only just after it, and are still sent within this grace.
const TIMER_GRACE: Duration = Duration::from_millis(3);
/// The window's 2xx answers are also counted per interval this long, so a report can show
/// throughput over time: short enough to show a stall of a fraction of a second, long
/// enough that each interval of a busy run holds many answers.
pub const THROUGHPUT_INTERVAL: Duration = Duration::from_millis(250);
/// The percentiles a latency CDF is drawn through: dense in the tail, where runs differ.
/// The last is the maximum.
pub const CDF_PERCENTILES: [f64; 22] = [
    0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 75.0, 80.0, 85.0, 90.0, 95.0, 97.0, 98.0, 99.0,
    99.5, 99.7, 99.9, 99.95, 99.99, 100.0,
];

/// Whether the generator waits for answers or keeps a schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Closed,
    /// Requests per second over all connections.
    Open {
        rate_per_s: f64,
    },
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub target: SocketAddr,
    pub connections: usize,
    /// Event-loop threads; connections and the open-loop rate are split evenly over them.
    pub threads: usize,
    pub mode: Mode,
    /// When the first request is sent; the caller samples the server on the same clock.
    pub start_at: Instant,
    pub warmup: Duration,
    pub measure: Duration,
    /// How long answers still outstanding at the end are waited for.
    pub drain: Duration,
    pub hooks: HookSpec,
    /// At most this many requests in all, split evenly over the threads; the run ends once
    /// they are sent and answered, or at the window's end if that comes first. `None`: as
    /// many as the window allows.
    pub limit: Option<u64>,
}

impl LoadPlan {
    pub fn measure_start(&self) -> Instant {
        self.start_at + self.warmup
    }

    pub fn end(&self) -> Instant {
        self.start_at + self.warmup + self.measure
    }
}

/// Why a load run could not be made (answers the server refuses are counted, not errors).
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot connect to {target}: {source}")]
    Connect {
        target: SocketAddr,
        source: std::io::Error,
    },
    #[error("event loop: {0}")]
    Poll(std::io::Error),
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error(
        "a plan needs at least one connection and one thread, and no more threads than connections"
    )]
    BadPlan,
    #[error("the open-loop rate must be a positive number of requests per second")]
    BadRate,
    #[error("a request limit must be at least 1")]
    BadLimit,
    #[error("a load thread panicked")]
    Panicked,
}

/// Answers counted by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub status_2xx: u64,
    /// Of `status_2xx`, the 200s: the gateway's answer to a hook it already had. Every
    /// hook the generator sends is new, so against the gateway each one is a defect.
    pub duplicates: u64,
    pub status_other: u64,
    /// Lost connections, answers that could not be parsed, answers still missing at the end.
    pub errors: u64,
    /// Non-2xx statuses and how often each came, to say why a run went wrong.
    pub statuses: BTreeMap<u16, u64>,
}

impl Tally {
    fn count_status(&mut self, status: u16) {
        if (200..300).contains(&status) {
            self.status_2xx += 1;
            self.duplicates += u64::from(status == 200);
        } else {
            self.status_other += 1;
            *self.statuses.entry(status).or_default() += 1;
        }
    }

    fn add(&mut self, other: &Tally) {
        self.status_2xx += other.status_2xx;
        self.duplicates += other.duplicates;
        self.status_other += other.status_other;
        self.errors += other.errors;
        for (status, count) in &other.statuses {
            *self.statuses.entry(*status).or_default() += count;
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Every answer of the run, warm-up and drain included.
    pub total: Tally,
    /// Answers that arrived inside the measurement window.
    pub window: Tally,
    /// Latencies (µs) of the window's answers: from the send in closed loop, from the due
    /// time in open loop.
    pub latency_us: Histogram<u64>,
    /// The window's 2xx answers per [`THROUGHPUT_INTERVAL`], in order from the window's
    /// start (the last interval may be cut short by the window's end).
    pub ok_per_interval: Vec<u64>,
    pub window_s: f64,
    /// Open loop: requests that fell due before the end but were never sent because every
    /// connection was busy (0 in closed loop). A rate was held only if this is 0.
    pub missed: u64,
    /// The busiest load thread's CPU time over the window, as a fraction of the window.
    /// Near 1 the generator, not the server, set the pace, and ratios understate
    /// differences.
    pub generator_busy: f64,
}

impl LoadReport {
    /// 2xx answers per second in the window.
    pub fn ok_per_s(&self) -> f64 {
        if self.window_s > 0.0 {
            self.window.status_2xx as f64 / self.window_s
        } else {
            0.0
        }
    }

    /// All answers (any status) per second in the window.
    pub fn answers_per_s(&self) -> f64 {
        if self.window_s > 0.0 {
            (self.window.status_2xx + self.window.status_other) as f64 / self.window_s
        } else {
            0.0
        }
    }

    /// The latency at `quantile` in milliseconds (0 when nothing was measured).
    pub fn latency_ms(&self, quantile: f64) -> f64 {
        if self.latency_us.is_empty() {
            return 0.0;
        }
        self.latency_us.value_at_quantile(quantile) as f64 / 1000.0
    }

    /// The latency CDF as (percentile, ms) at each of [`CDF_PERCENTILES`]; empty when
    /// nothing was measured. Latencies never decrease along it.
    pub fn latency_cdf_ms(&self) -> Vec<(f64, f64)> {
        if self.latency_us.is_empty() {
            return Vec::new();
        }
        CDF_PERCENTILES
            .iter()
            .map(|percentile| (*percentile, self.latency_ms(percentile / 100.0)))
            .collect()
    }

    /// 2xx answers per second over time as (seconds into the window at the interval's
    /// middle, answers per second), one point per [`THROUGHPUT_INTERVAL`].
    pub fn ok_per_s_over_time(&self) -> Vec<(f64, f64)> {
        let interval_s = THROUGHPUT_INTERVAL.as_secs_f64();
        self.ok_per_interval
            .iter()
            .enumerate()
            .filter_map(|(index, count)| {
                let start_s = index as f64 * interval_s;
                let length_s = (self.window_s - start_s).min(interval_s);
                (length_s > 0.0).then(|| (start_s + length_s / 2.0, *count as f64 / length_s))
            })
            .collect()
    }
}

/// How many [`THROUGHPUT_INTERVAL`]s cover a window of `measure` (the last may be partial).
fn interval_count(measure: Duration) -> usize {
    let interval = THROUGHPUT_INTERVAL.as_nanos();
    usize::try_from(measure.as_nanos().div_ceil(interval)).unwrap_or(usize::MAX)
}

fn new_histogram() -> Histogram<u64> {
    // Fixed, valid bounds: a refusal would be a programmer error.
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("valid histogram bounds")
}

/// Runs `plan` to its end and returns what it measured. Blocks for warm-up + measurement
/// (+ at most the drain period).
pub fn run(plan: &LoadPlan) -> Result<LoadReport, LoadError> {
    if plan.connections == 0 || plan.threads == 0 || plan.threads > plan.connections {
        return Err(LoadError::BadPlan);
    }
    if let Mode::Open { rate_per_s } = plan.mode {
        if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
            return Err(LoadError::BadRate);
        }
    }
    if plan.limit == Some(0) {
        return Err(LoadError::BadLimit);
    }
    // Build every factory first so a bad spec fails before any thread starts.
    RequestFactory::new(&plan.hooks)?;
    let results: Vec<Result<ThreadReport, LoadError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..plan.threads)
            .map(|index| {
                let connections = plan.connections / plan.threads
                    + usize::from(index < plan.connections % plan.threads);
                let mode = match plan.mode {
                    Mode::Closed => Mode::Closed,
                    Mode::Open { rate_per_s } => Mode::Open {
                        rate_per_s: rate_per_s / plan.threads as f64,
                    },
                };
                let quota = thread_quota(plan.limit, plan.threads, index);
                scope.spawn(move || run_thread(plan, index, connections, mode, quota))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or(Err(LoadError::Panicked)))
            .collect()
    });
    let mut report = LoadReport {
        total: Tally::default(),
        window: Tally::default(),
        latency_us: new_histogram(),
        ok_per_interval: vec![0; interval_count(plan.measure)],
        window_s: plan.measure.as_secs_f64(),
        missed: 0,
        generator_busy: 0.0,
    };
    for result in results {
        let thread = result?;
        report.total.add(&thread.total);
        report.window.add(&thread.window);
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = report.latency_us.add(&thread.latency_us);
        for (sum, count) in report
            .ok_per_interval
            .iter_mut()
            .zip(&thread.ok_per_interval)
        {
            *sum += count;
        }
        report.missed += thread.missed;
        report.generator_busy = report.generator_busy.max(thread.busy);
    }
    Ok(report)
}

/// Thread `index`'s share of `limit` requests over `threads` threads: the shares differ by
/// at most one and add up to `limit`. No limit: no bound.
fn thread_quota(limit: Option<u64>, threads: usize, index: usize) -> u64 {
    match limit {
        None => u64::MAX,
        Some(limit) => {
            let threads = threads.max(1) as u64;
            limit / threads + u64::from((index as u64) < limit % threads)
        }
    }
}

struct ThreadReport {
    total: Tally,
    window: Tally,
    latency_us: Histogram<u64>,
    ok_per_interval: Vec<u64>,
    missed: u64,
    busy: f64,
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `time` is, and nothing else.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    if status != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(time.tv_sec).unwrap_or(0),
        u32::try_from(time.tv_nsec).unwrap_or(0),
    )
}

/// Where a connection is.
enum State {
    /// Ready for a request.
    Idle,
    /// A request is on its way or its answer is awaited; `since` is where its latency
    /// starts (the send, or the due time in open loop).
    Busy { since: Instant },
    /// Lost; opened again at `retry_at`.
    Broken { retry_at: Instant },
}

struct Connection {
    stream: Option<TcpStream>,
    state: State,
    factory: RequestFactory,
    /// The request being written and how much of it is out.
    outgoing: Vec<u8>,
    written: usize,
    /// Answer bytes received so far.
    incoming: Vec<u8>,
}

/// One parsed answer at the front of a buffer.
enum Parsed {
    Incomplete,
    Complete {
        status: u16,
        length: usize,
        close: bool,
    },
    Invalid,
}

/// Parses the answer at the start of `buffer`, framed by content-length (what the gateway,
/// the receiver and nginx send).
fn parse_response(buffer: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buffer) {
        Ok(httparse::Status::Complete(head_len)) => head_len,
        Ok(httparse::Status::Partial) if buffer.len() < RESPONSE_HEAD_MAX => {
            return Parsed::Incomplete
        }
        _ => return Parsed::Invalid,
    };
    let Some(status) = response.code else {
        return Parsed::Invalid;
    };
    let mut content_length: Option<usize> = None;
    let mut close = false;
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(header.value)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                Some(length) => content_length = Some(length),
                None => return Parsed::Invalid,
            }
        } else if header.name.eq_ignore_ascii_case("connection") {
            close |= header.value.eq_ignore_ascii_case(b"close");
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked answers are not sent by anything this gate measures.
            return Parsed::Invalid;
        }
    }
    let body_len = match (content_length, status) {
        (Some(length), _) => length,
        (None, 204 | 304) => 0,
        (None, _) => return Parsed::Invalid,
    };
    if buffer.len() < head_len + body_len {
        return Parsed::Incomplete;
    }
    Parsed::Complete {
        status,
        length: head_len + body_len,
        close,
    }
}

fn connect(target: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = StdTcpStream::connect_timeout(&target, CONNECT_TIMEOUT)?;
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    Ok(TcpStream::from_std(stream))
}

fn unix_now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// Counts answers and latencies of one thread against the plan's window.
struct Recorder {
    measure_start: Instant,
    end: Instant,
    total: Tally,
    window: Tally,
    latency_us: Histogram<u64>,
    /// Allocated for the whole window up front, so counting is an increment.
    ok_per_interval: Vec<u64>,
}

impl Recorder {
    fn in_window(&self, at: Instant) -> bool {
        at >= self.measure_start && at < self.end
    }

    fn answer(&mut self, status: u16, since: Instant, at: Instant) {
        self.total.count_status(status);
        if self.in_window(at) {
            self.window.count_status(status);
            let micros = at.saturating_duration_since(since).as_micros();
            let micros = u64::try_from(micros).unwrap_or(LATENCY_MAX_US).max(1);
            self.latency_us
                .saturating_record(micros.min(LATENCY_MAX_US));
            if (200..300).contains(&status) {
                let elapsed = at.saturating_duration_since(self.measure_start).as_nanos();
                let index =
                    usize::try_from(elapsed / THROUGHPUT_INTERVAL.as_nanos()).unwrap_or(usize::MAX);
                if let Some(count) = self.ok_per_interval.get_mut(index) {
                    *count += 1;
                }
            }
        }
    }

    fn error(&mut self, at: Instant) {
        self.total.errors += 1;
        if self.in_window(at) {
            self.window.errors += 1;
        }
    }
}

fn run_thread(
    plan: &LoadPlan,
    thread_index: usize,
    connection_count: usize,
    mode: Mode,
    quota: u64,
) -> Result<ThreadReport, LoadError> {
    let mut poll = Poll::new().map_err(LoadError::Poll)?;
    let mut connections = Vec::with_capacity(connection_count);
    for index in 0..connection_count {
        let mut stream = connect(plan.target).map_err(|source| LoadError::Connect {
            target: plan.target,
            source,
        })?;
        poll.registry()
            .register(
                &mut stream,
                Token(index),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(LoadError::Poll)?;
        connections.push(Connection {
            stream: Some(stream),
            state: State::Idle,
            factory: RequestFactory::new(&plan.hooks)?,
            outgoing: Vec::with_capacity(plan.hooks.body_bytes + 512),
            written: 0,
            incoming: Vec::with_capacity(READ_CHUNK),
        });
    }
    let mut recorder = Recorder {
        measure_start: plan.measure_start(),
        end: plan.end(),
        total: Tally::default(),
        window: Tally::default(),
        latency_us: new_histogram(),
        ok_per_interval: vec![0; interval_count(plan.measure)],
    };
    // Ids are unique over the run: the thread's index in the top bits, a count below.
    let mut next_id: u64 = (thread_index as u64) << 48;
    let interval = match mode {
        Mode::Closed => None,
        Mode::Open { rate_per_s } => Some(Duration::from_secs_f64(1.0 / rate_per_s)),
    };
    let start = plan.start_at;
    let end = plan.end();
    let give_up = end + plan.drain;
    // Open loop: the due time of the next request is start + due_count × interval,
    // computed from the count so rounding never accumulates.
    let mut due_count: u64 = 0;
    // Requests sent so far, against the thread's quota.
    let mut sent: u64 = 0;
    let due_at = |count: u64, interval: Duration| start + interval.mul_f64(count as f64);
    let mut unix_s = unix_now_s();
    let mut unix_s_checked = Instant::now();

    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
    }
    let mut events = Events::with_capacity(connection_count.max(16));
    let (mut cpu_at_window_start, mut cpu_at_window_end) = (None, None);
    loop {
        let now = Instant::now();
        if cpu_at_window_start.is_none() && now >= recorder.measure_start {
            cpu_at_window_start = Some(thread_cpu());
        }
        if cpu_at_window_end.is_none() && now >= end {
            cpu_at_window_end = Some(thread_cpu());
        }
        // The Stripe signature's timestamp, refreshed once a second instead of per request.
        if now.duration_since(unix_s_checked) >= Duration::from_secs(1) {
            unix_s = unix_now_s();
            unix_s_checked = now;
        }
        for (index, connection) in connections.iter_mut().enumerate() {
            if let State::Broken { retry_at } = connection.state {
                if now >= retry_at && now < end {
                    reopen(&poll, connection, index, plan.target, now);
                }
            }
        }
        // Open loop: a request due before the end is sent even if the loop sees it a
        // timer tick late.
        let sending = sent < quota
            && match interval {
                None => now < end,
                Some(interval) => due_at(due_count, interval) < end && now < end + TIMER_GRACE,
            };
        if sending {
            match interval {
                None => {
                    for connection in connections.iter_mut() {
                        if sent >= quota {
                            break;
                        }
                        if matches!(connection.state, State::Idle) {
                            send(connection, &mut next_id, unix_s, now, &mut recorder);
                            sent += 1;
                        }
                    }
                }
                Some(interval) => {
                    let mut idle = connections
                        .iter_mut()
                        .filter(|connection| matches!(connection.state, State::Idle));
                    loop {
                        let due = due_at(due_count, interval);
                        if due > now || due >= end || sent >= quota {
                            break;
                        }
                        let Some(connection) = idle.next() else { break };
                        send(connection, &mut next_id, unix_s, due, &mut recorder);
                        due_count += 1;
                        sent += 1;
                    }
                }
            }
        }
        let busy = connections
            .iter()
            .filter(|connection| matches!(connection.state, State::Busy { .. }))
            .count();
        if !sending && busy == 0 {
            break;
        }
        if now >= give_up {
            // Answers that never came: each is an error, and the run ends here.
            for _ in 0..busy {
                recorder.error(now);
            }
            break;
        }
        let mut timeout = if sending {
            end.saturating_duration_since(now)
                .max(Duration::from_millis(1))
        } else {
            give_up - now
        };
        if sending {
            if let Some(interval) = interval {
                let due = due_at(due_count, interval);
                let any_idle = connections
                    .iter()
                    .any(|connection| matches!(connection.state, State::Idle));
                if any_idle {
                    timeout = timeout.min(due.saturating_duration_since(now));
                }
            }
            if connections
                .iter()
                .any(|connection| matches!(connection.state, State::Broken { .. }))
            {
                timeout = timeout.min(RECONNECT_PAUSE);
            }
        }
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(LoadError::Poll(error)),
        }
        for event in events.iter() {
            let Some(connection) = connections.get_mut(event.token().0) else {
                continue;
            };
            if event.is_writable() {
                flush(connection, &mut recorder);
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                receive(connection, &mut recorder);
            }
        }
    }
    // Open loop: every request that fell due before the end and was not sent was missed.
    let missed = match interval {
        None => 0,
        Some(interval) => {
            let due_total =
                (end.duration_since(start).as_secs_f64() / interval.as_secs_f64()).ceil() as u64;
            due_total.min(quota).saturating_sub(due_count)
        }
    };
    let busy = match (cpu_at_window_start, cpu_at_window_end) {
        (Some(first), Some(last)) if !plan.measure.is_zero() => {
            last.saturating_sub(first).as_secs_f64() / plan.measure.as_secs_f64()
        }
        _ => 0.0,
    };
    Ok(ThreadReport {
        total: recorder.total,
        window: recorder.window,
        latency_us: recorder.latency_us,
        ok_per_interval: recorder.ok_per_interval,
        missed,
        busy,
    })
}

/// Builds and starts writing the next request on an idle connection.
fn send(
    connection: &mut Connection,
    next_id: &mut u64,
    unix_s: u64,
    since: Instant,
    recorder: &mut Recorder,
) {
    connection
        .factory
        .write_request(*next_id, unix_s, &mut connection.outgoing);
    *next_id += 1;
    connection.written = 0;
    connection.state = State::Busy { since };
    flush(connection, recorder);
}

/// Writes what is left of the outgoing request until done or the socket is full.
fn flush(connection: &mut Connection, recorder: &mut Recorder) {
    if !matches!(connection.state, State::Busy { .. }) {
        return;
    }
    let Some(stream) = connection.stream.as_mut() else {
        return;
    };
    while connection.written < connection.outgoing.len() {
        match stream.write(&connection.outgoing[connection.written..]) {
            Ok(0) => return lose(connection, recorder),
            Ok(count) => connection.written += count,
            Err(error) if error.kind() == ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return lose(connection, recorder),
        }
    }
}

/// Reads until the socket is empty (the poll is edge-triggered) and settles the answer.
fn receive(connection: &mut Connection, recorder: &mut Recorder) {
    let Some(stream) = connection.stream.as_mut() else {
        return;
    };
    let mut chunk = [0u8; READ_CHUNK];
    let mut closed = false;
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(count) => connection.incoming.extend_from_slice(&chunk[..count]),
            Err(error) if error.kind() == ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                closed = true;
                break;
            }
        }
    }
    if !connection.incoming.is_empty() {
        let State::Busy { since } = connection.state else {
            // Bytes nobody asked for: the connection is out of step.
            return lose(connection, recorder);
        };
        match parse_response(&connection.incoming) {
            Parsed::Incomplete => {}
            Parsed::Invalid => return lose(connection, recorder),
            Parsed::Complete {
                status,
                length,
                close,
            } => {
                recorder.answer(status, since, Instant::now());
                if connection.incoming.len() > length {
                    // Answers are one per request; anything more is out of step.
                    return lose_quietly(connection);
                }
                connection.incoming.clear();
                connection.state = State::Idle;
                if close {
                    return lose_quietly(connection);
                }
            }
        }
    }
    if closed {
        lose(connection, recorder);
    }
}

/// Drops a connection; an answer it still owed is an error.
fn lose(connection: &mut Connection, recorder: &mut Recorder) {
    if matches!(connection.state, State::Busy { .. }) {
        recorder.error(Instant::now());
    }
    lose_quietly(connection);
}

fn lose_quietly(connection: &mut Connection) {
    connection.stream = None;
    connection.incoming.clear();
    connection.state = State::Broken {
        retry_at: Instant::now() + RECONNECT_PAUSE,
    };
}

fn reopen(
    poll: &Poll,
    connection: &mut Connection,
    index: usize,
    target: SocketAddr,
    now: Instant,
) {
    let opened = connect(target).and_then(|mut stream| {
        poll.registry()
            .register(
                &mut stream,
                Token(index),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map(|()| stream)
    });
    match opened {
        Ok(stream) => {
            connection.stream = Some(stream);
            connection.state = State::Idle;
        }
        Err(_) => {
            connection.state = State::Broken {
                retry_at: now + RECONNECT_PAUSE,
            };
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(input: &[u8], expected: Option<(u16, usize, bool)>) {
        let got = match parse_response(input) {
            Parsed::Complete {
                status,
                length,
                close,
            } => Some((status, length, close)),
            Parsed::Incomplete => None,
            Parsed::Invalid => Some((0, 0, false)),
        };
        assert_eq!(got, expected, "{:?}", String::from_utf8_lossy(input));
    }

    #[test]
    fn responses_are_framed_by_content_length() {
        let ok = b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\n\r\n{}";
        check(ok, Some((202, ok.len(), false)));
        check(&ok[..ok.len() - 1], None);
        check(b"HTTP/1.1 202 Accepted\r\ncontent-le", None);
        let close = b"HTTP/1.1 503 X\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        check(close, Some((503, close.len(), true)));
        check(b"HTTP/1.1 204 No Content\r\n\r\n", Some((204, 27, false)));
        // No framing, chunked and garbage are refused (Invalid shows as status 0).
        check(b"HTTP/1.1 200 OK\r\n\r\n", Some((0, 0, false)));
        check(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            Some((0, 0, false)),
        );
        check(b"NOT HTTP\r\n\r\n", Some((0, 0, false)));
        check(
            b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            Some((0, 0, false)),
        );
    }

    #[test]
    fn plans_are_checked() {
        let plan = LoadPlan {
            target: "127.0.0.1:9".parse().unwrap(),
            connections: 1,
            threads: 2,
            mode: Mode::Closed,
            start_at: Instant::now(),
            warmup: Duration::ZERO,
            measure: Duration::ZERO,
            drain: Duration::ZERO,
            hooks: HookSpec {
                shape: crate::hooks::Shape::Stripe,
                body_bytes: 1024,
                signing: crate::hooks::Signing::None,
                paths: vec!["/".into()],
                ordering_keys: None,
            },
            limit: None,
        };
        assert!(matches!(run(&plan), Err(LoadError::BadPlan)));
        let plan = LoadPlan {
            threads: 1,
            mode: Mode::Open { rate_per_s: 0.0 },
            ..plan
        };
        assert!(matches!(run(&plan), Err(LoadError::BadRate)));
        let plan = LoadPlan {
            mode: Mode::Closed,
            limit: Some(0),
            ..plan
        };
        assert!(matches!(run(&plan), Err(LoadError::BadLimit)));
    }

    #[test]
    fn throughput_over_time_and_the_cdf_come_from_the_window() {
        let mut report = LoadReport {
            total: Tally::default(),
            window: Tally::default(),
            latency_us: new_histogram(),
            // 625 ms: two whole intervals and a last one of 125 ms.
            ok_per_interval: vec![250, 500, 100],
            window_s: 0.625,
            missed: 0,
            generator_busy: 0.0,
        };
        assert_eq!(interval_count(Duration::from_millis(625)), 3);
        assert_eq!(interval_count(Duration::from_millis(500)), 2);
        assert_eq!(
            report.ok_per_s_over_time(),
            [(0.125, 1000.0), (0.375, 2000.0), (0.5625, 800.0)]
        );
        assert!(report.latency_cdf_ms().is_empty());
        for micros in 1..=1000 {
            report.latency_us.record(micros).unwrap();
        }
        let cdf = report.latency_cdf_ms();
        assert_eq!(cdf.len(), CDF_PERCENTILES.len());
        assert_eq!(cdf[0], (0.0, 0.001));
        assert_eq!(cdf[5], (50.0, 0.5));
        assert_eq!(cdf[cdf.len() - 1], (100.0, 1.0));
        assert!(cdf
            .windows(2)
            .all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1));
    }

    #[test]
    fn a_limit_is_split_evenly_over_the_threads() {
        let shares = |limit: u64, threads: usize| -> Vec<u64> {
            (0..threads)
                .map(|index| thread_quota(Some(limit), threads, index))
                .collect()
        };
        assert_eq!(shares(10, 1), [10]);
        assert_eq!(shares(10, 3), [4, 3, 3]);
        assert_eq!(shares(2, 4), [1, 1, 0, 0]);
        assert_eq!(shares(100_000, 2).iter().sum::<u64>(), 100_000);
        assert_eq!(thread_quota(None, 2, 1), u64::MAX);
    }
}
