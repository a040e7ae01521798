//! `bench-gate crash`: the crash harness. It attacks the real `ankusa serve` the way
//! RocksDB's crash test and Jepsen's queue checks do, and checks the promises a user
//! relies on: an acknowledged hook is never lost, a lane's hooks arrive in seq order, a
//! provider's retry of an unanswered hook never becomes a second hook, and the store stays
//! consistent.
//!
//! One run: a recording receiver on loopback ([`Receiver`]) takes the deliveries of one
//! source with several tenants (`POST /hooks/crash/{tenant}`, dedupe on the body's `id`)
//! and two HTTP sinks, `ordered` (ordered on the body's `key`) and `unordered`; it refuses a
//! few attempts with 503 so heads also wait out retries, and waits a random moment before
//! it records, so concurrent attempts land in a random order. Each cycle starts the server
//! and either SIGKILLs it during startup (recovery of the previous run's claims included) or
//! lets posters send hooks at a bounded rate and SIGKILLs it at a random moment of the load;
//! `ankusa store verify` then checks the store at rest. A hook with no answer, or a 503, is
//! sent again with the same id in the next cycle, as a provider retries. After the last
//! cycle the server runs until every hook is answered and the backlog is drained, stops
//! with SIGTERM (exit 0 expected) and the store is verified once more.
//!
//! The checks ([`check`]), over the ledger of answers and the receiver's record:
//! - lost: an acked hook (any 2xx) that some sink never received;
//! - order: in each lane (tenant, key of the ordered sink) the first deliveries of hooks
//!   come in seq order, and a repeat of a hook (the redelivery of a head that was in flight
//!   at a kill) comes before the first delivery of any later hook;
//! - split: one hook id delivered under two seqs, or under a seq other than the one it was
//!   acked with (a retry that became a second hook);
//! - refused: a hook answered with a status other than 2xx, 429 or 503;
//! - verify: `store verify` failed after a kill or at the end (it checks every counter
//!   against the keys it counts, and the lane invariant); after the final orderly stop it
//!   must not even find a state the next start would repair.
//!
//! The schedule (kill moments, tenants, keys, the receiver's refusals) comes from the seed,
//! so `--seed` replays a failing run's schedule; thread timing still differs between runs.
//!
//! `--fault NAME` proves the harness itself: the server runs with a defect injected on
//! purpose (`ANKUSA_TEST_FAULT`, see `src/faults.rs`), and the run passes only when the
//! check catches it: `ack_before_sync` must show lost hooks, `ignore_lanes` order
//! violations.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::responder::Responder;
use crate::server::{Ankusa, Metrics};

/// The source's id and the sinks' ids (the receiver's paths are `/{sink id}`).
const SOURCE: &str = "crash";
const SINK_ORDERED: &str = "ordered";
const SINK_UNORDERED: &str = "unordered";
/// How long a started server may take to print its ready line (recovery included).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Time limit of one request of a poster.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause of a poster after a 503/429 or a failed connect.
const POSTER_PAUSE: Duration = Duration::from_millis(20);
/// The receiver refuses one attempt in this many with 503.
const REFUSE_ONE_IN: u64 = 50;
/// The receiver waits up to this long before it records a delivery.
const RECORD_JITTER_US: u64 = 2000;
/// How often the final drain reads the receiver and the server's gauges.
const DRAIN_POLL: Duration = Duration::from_millis(200);
/// Polls in a row with nothing pending or in flight that end the final drain early (the
/// server has nothing left to send; whatever is missing is lost).
const DRAIN_IDLE_POLLS: u32 = 10;
/// Size of the padding of each hook's body.
const BODY_PAD: usize = 200;

/// Faults the harness knows how to prove it catches, with what must show.
pub const FAULTS: [(&str, &str); 2] = [
    ("ack_before_sync", "lost hooks"),
    ("ignore_lanes", "order violations"),
];

#[derive(Debug, Clone)]
pub struct CrashSettings {
    pub bin: PathBuf,
    pub cycles: u32,
    pub seed: u64,
    pub tenants: usize,
    /// Ordering keys per tenant.
    pub keys: usize,
    pub connections: usize,
    /// Hooks per second the posters send at most, all together.
    pub rate: u64,
    /// Longest load before a kill, in a cycle that gets past startup.
    pub max_load: Duration,
    /// Bound on the final drain.
    pub drain_timeout: Duration,
    /// The fault injected on purpose (see [`FAULTS`]).
    pub fault: Option<String>,
}

impl CrashSettings {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=10_000).contains(&self.cycles) {
            problems.push(format!(
                "--cycles must be between 1 and 10000, found {}",
                self.cycles
            ));
        }
        if !(1..=100).contains(&self.tenants) {
            problems.push(format!(
                "--tenants must be between 1 and 100, found {}",
                self.tenants
            ));
        }
        if !(1..=10_000).contains(&self.keys) {
            problems.push(format!(
                "--keys must be between 1 and 10000, found {}",
                self.keys
            ));
        }
        if !(1..=256).contains(&self.connections) {
            problems.push(format!(
                "--connections must be between 1 and 256, found {}",
                self.connections
            ));
        }
        if !(1..=100_000).contains(&self.rate) {
            problems.push(format!(
                "--rate must be between 1 and 100000, found {}",
                self.rate
            ));
        }
        if self.max_load < Duration::from_millis(100) {
            problems.push("--max-load-ms must be at least 100".into());
        }
        if let Some(fault) = &self.fault {
            if !FAULTS.iter().any(|(name, _)| name == fault) {
                let known: Vec<&str> = FAULTS.iter().map(|(name, _)| *name).collect();
                problems.push(format!(
                    "--fault {fault:?} is not one the harness can prove (known: {})",
                    known.join(", ")
                ));
            }
        }
        problems
    }
}

/// splitmix64: small, fast, and the same sequence for the same seed everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to.saturating_sub(from) + 1))
    }
}

/// One hook the harness posts: its id, tenant and ordering key are fixed from the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookPlan {
    pub id: u64,
    pub tenant: u32,
    pub key: u32,
}

impl HookPlan {
    fn of(seed: u64, id: u64, tenants: usize, keys: usize) -> HookPlan {
        let mut rng = Rng::new(seed ^ id.wrapping_mul(0xA24B_AED4_963E_E407));
        HookPlan {
            id,
            tenant: rng.below(tenants as u64) as u32,
            key: rng.below(keys as u64) as u32,
        }
    }

    fn body(&self) -> String {
        format!(
            r#"{{"id":"h{}","key":"k{}","tenant":"t{}","pad":"{}"}}"#,
            self.id,
            self.key,
            self.tenant,
            "x".repeat(BODY_PAD)
        )
    }
}

/// What the harness knows of one hook's answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Answers {
    /// The seq of its first 2xx.
    pub acked_seq: Option<u64>,
    /// Another seq some later 2xx named (a split the edge itself admitted).
    pub other_seq: Option<u64>,
    /// Sends with no answer (the connection died) or a 503/429.
    pub unanswered: u32,
    /// The first status that was neither 2xx, 429 nor 503.
    pub refused: Option<u16>,
}

/// A delivery the receiver answered 200: the unit of the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub ordered: bool,
    pub hook: u64,
    pub tenant: u32,
    pub key: u32,
    pub seq: u64,
}

/// The hooks posted: their plans (by id) and answers, and the ids to send again.
struct Ledger {
    hooks: Vec<(HookPlan, Answers)>,
    retry: VecDeque<u64>,
}

impl Ledger {
    fn answered(&mut self, id: u64, status: u16, seq: Option<u64>) {
        let (_, answers) = &mut self.hooks[id as usize];
        match (status, seq) {
            (200..=299, Some(seq)) => match answers.acked_seq {
                None => answers.acked_seq = Some(seq),
                Some(first) if first != seq => answers.other_seq = Some(seq),
                Some(_) => {}
            },
            (429 | 503, _) | (200..=299, None) => {
                answers.unanswered += 1;
                self.retry.push_back(id);
            }
            _ => {
                answers.refused.get_or_insert(status);
            }
        }
    }

    fn unanswered(&mut self, id: u64) {
        self.hooks[id as usize].1.unanswered += 1;
        self.retry.push_back(id);
    }
}

/// The recording receiver: answers 200 and records the delivery, or refuses one attempt in
/// [`REFUSE_ONE_IN`] with 503.
struct Receiver {
    responder: Responder,
    record: Arc<Mutex<Vec<Delivery>>>,
    /// Requests it could not make sense of (answered 400): the gateway sent something else
    /// than a hook of this run.
    malformed: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
}

impl Receiver {
    fn start(seed: u64) -> anyhow::Result<Receiver> {
        let record: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let malformed = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let draws = Arc::new(AtomicU64::new(0));
        let judge = {
            let record = Arc::clone(&record);
            let malformed = Arc::clone(&malformed);
            let refused = Arc::clone(&refused);
            Arc::new(move |request: &[u8]| -> u16 {
                let Some(delivery) = parse_delivery(request) else {
                    malformed.fetch_add(1, Ordering::Relaxed);
                    return 400;
                };
                let mut rng = Rng::new(seed ^ draws.fetch_add(1, Ordering::Relaxed));
                if rng.below(REFUSE_ONE_IN) == 0 {
                    refused.fetch_add(1, Ordering::Relaxed);
                    return 503;
                }
                std::thread::sleep(Duration::from_micros(rng.below(RECORD_JITTER_US)));
                record
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(delivery);
                200
            })
        };
        let responder =
            Responder::start_judging(judge).context("starting the recording receiver")?;
        Ok(Receiver {
            responder,
            record,
            malformed,
            refused,
        })
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.record
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// A delivery from one request of the gateway's HTTP sink: the path names the sink,
/// `x-ankusa-seq` the seq, and the body (the hook as posted) its id, tenant and key.
fn parse_delivery(request: &[u8]) -> Option<Delivery> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head_len) = parsed.parse(request).ok()? else {
        return None;
    };
    let ordered = match parsed.path? {
        "/ordered" => true,
        "/unordered" => false,
        _ => return None,
    };
    let seq = parsed
        .headers
        .iter()
        .find(|header| header.name.eq_ignore_ascii_case("x-ankusa-seq"))
        .and_then(|header| std::str::from_utf8(header.value).ok()?.parse().ok())?;
    let body: serde_json::Value = serde_json::from_slice(&request[head_len..]).ok()?;
    let number = |field: &str, prefix: char| -> Option<u64> {
        body.get(field)?
            .as_str()?
            .strip_prefix(prefix)?
            .parse()
            .ok()
    };
    Some(Delivery {
        ordered,
        hook: number("id", 'h')?,
        tenant: u32::try_from(number("tenant", 't')?).ok()?,
        key: u32::try_from(number("key", 'k')?).ok()?,
        seq,
    })
}

/// What the checks found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// Hooks with a 2xx.
    pub acked: u64,
    /// Hooks never answered 2xx by the end.
    pub never_acked: u64,
    /// Deliveries recorded (both sinks, repeats included).
    pub delivered: u64,
    /// Deliveries of a (hook, sink) after its first.
    pub duplicates: u64,
    /// Acked hooks that a sink never received.
    pub lost: u64,
    /// Deliveries against the lane rules (see the module doc).
    pub order_violations: u64,
    /// Hooks delivered or acked under more than one seq.
    pub split: u64,
    /// Hooks answered with a status other than 2xx, 429 or 503.
    pub refused: u64,
    /// Deliveries of hooks the harness never posted.
    pub phantom: u64,
    /// The first few problems, for the reader.
    pub examples: Vec<String>,
}

const EXAMPLES_MAX: usize = 20;

impl Findings {
    fn example(&mut self, text: String) {
        if self.examples.len() < EXAMPLES_MAX {
            self.examples.push(text);
        }
    }
}

/// The checks of the module doc over the answers (indexed by hook id, with each hook's
/// plan) and the deliveries in the order the receiver recorded them.
pub fn check(hooks: &[(HookPlan, Answers)], deliveries: &[Delivery]) -> Findings {
    let mut findings = Findings {
        delivered: deliveries.len() as u64,
        ..Findings::default()
    };
    // (hook, ordered) → deliveries; hook → seqs.
    let mut received: HashMap<(u64, bool), u64> = HashMap::new();
    let mut seqs: HashMap<u64, HashSet<u64>> = HashMap::new();
    for delivery in deliveries {
        let Some((plan, _)) = hooks.get(delivery.hook as usize) else {
            findings.phantom += 1;
            findings.example(format!("phantom delivery of hook h{}", delivery.hook));
            continue;
        };
        if (plan.tenant, plan.key) != (delivery.tenant, delivery.key) {
            findings.phantom += 1;
            findings.example(format!("hook h{} arrived with another body", delivery.hook));
            continue;
        }
        let count = received
            .entry((delivery.hook, delivery.ordered))
            .or_default();
        *count += 1;
        if *count > 1 {
            findings.duplicates += 1;
        }
        seqs.entry(delivery.hook).or_default().insert(delivery.seq);
    }
    for (plan, answers) in hooks {
        if answers.refused.is_some() {
            findings.refused += 1;
            findings.example(format!(
                "hook h{} answered {}",
                plan.id,
                answers.refused.unwrap_or_default()
            ));
        }
        let delivered_seqs = seqs.get(&plan.id);
        let mut all: HashSet<u64> = delivered_seqs.cloned().unwrap_or_default();
        all.extend(answers.acked_seq);
        all.extend(answers.other_seq);
        if all.len() > 1 {
            findings.split += 1;
            let mut sorted: Vec<u64> = all.into_iter().collect();
            sorted.sort_unstable();
            findings.example(format!("hook h{} has seqs {sorted:?}", plan.id));
        }
        let Some(seq) = answers.acked_seq else {
            findings.never_acked += 1;
            continue;
        };
        findings.acked += 1;
        let missing: Vec<&str> = [(true, SINK_ORDERED), (false, SINK_UNORDERED)]
            .into_iter()
            .filter(|(ordered, _)| !received.contains_key(&(plan.id, *ordered)))
            .map(|(_, name)| name)
            .collect();
        if !missing.is_empty() {
            findings.lost += 1;
            findings.example(format!(
                "hook h{} (seq {seq}) acked, never delivered to {}",
                plan.id,
                missing.join(", ")
            ));
        }
    }
    // Lanes: for each (tenant, key) of the ordered sink, the highest seq delivered so far
    // and the seqs seen.
    let mut lanes: HashMap<(u32, u32), (u64, HashSet<u64>)> = HashMap::new();
    for delivery in deliveries.iter().filter(|delivery| delivery.ordered) {
        let (highest, seen) = lanes.entry((delivery.tenant, delivery.key)).or_default();
        let first = seen.insert(delivery.seq);
        if delivery.seq < *highest {
            findings.order_violations += 1;
            findings.example(format!(
                "lane t{}/k{}: {} of seq {} after seq {}",
                delivery.tenant,
                delivery.key,
                if first { "first delivery" } else { "repeat" },
                delivery.seq,
                highest
            ));
        }
        *highest = (*highest).max(delivery.seq);
    }
    findings
}

/// One run's report.
#[derive(Debug, Clone, Serialize)]
pub struct CrashReport {
    pub binary: String,
    pub revision: Option<String>,
    pub seed: u64,
    pub fault: Option<String>,
    pub cycles: u32,
    /// Cycles killed before the server was ready (startup and recovery).
    pub startup_kills: u32,
    pub posted: u64,
    pub receiver_refused: u64,
    pub receiver_malformed: u64,
    /// `store verify` failures, each with its cycle and output; at the end, after the
    /// orderly stop, a state to repair counts as one.
    pub verify_failures: Vec<String>,
    /// States `store verify` found after a kill that the next start repairs (its `NOTE`
    /// lines): not failures, counted to show how often a kill lands in such a window.
    pub repairable_after_kill: u64,
    /// The final stop did not exit 0.
    pub stop_error: Option<String>,
    /// The final drain ended by its timeout with hooks still pending.
    pub drain_timed_out: bool,
    pub findings: Findings,
    pub elapsed_s: f64,
}

impl CrashReport {
    /// Whether the run shows no broken promise.
    pub fn clean(&self) -> bool {
        let findings = &self.findings;
        findings.lost == 0
            && findings.order_violations == 0
            && findings.split == 0
            && findings.refused == 0
            && findings.phantom == 0
            && findings.never_acked == 0
            && self.receiver_malformed == 0
            && self.verify_failures.is_empty()
            && self.stop_error.is_none()
    }

    /// Under `--fault`: whether the check caught the fault (what [`FAULTS`] says must
    /// show).
    pub fn fault_caught(&self) -> Option<bool> {
        Some(match self.fault.as_deref()? {
            "ack_before_sync" => self.findings.lost > 0,
            "ignore_lanes" => self.findings.order_violations > 0,
            _ => false,
        })
    }

    /// The run's verdict: clean, or with `--fault`, the fault caught.
    pub fn passed(&self) -> bool {
        self.fault_caught().unwrap_or_else(|| self.clean())
    }

    pub fn summary(&self) -> String {
        let findings = &self.findings;
        let mut line = format!(
            "crash: cycles={} startup_kills={} posted={} acked={} delivered={} duplicates={} \
             lost={} order_violations={} split={} refused={} verify_failures={} \
             repairable_after_kill={} seed={}",
            self.cycles,
            self.startup_kills,
            self.posted,
            findings.acked,
            findings.delivered,
            findings.duplicates,
            findings.lost,
            findings.order_violations,
            findings.split,
            findings.refused,
            self.verify_failures.len(),
            self.repairable_after_kill,
            self.seed
        );
        match (&self.fault, self.fault_caught()) {
            (Some(fault), Some(true)) => {
                let _ = write!(line, " fault={fault} CAUGHT");
            }
            (Some(fault), _) => {
                let _ = write!(line, " fault={fault} MISSED");
            }
            (None, _) => line.push_str(if self.clean() { " PASS" } else { " FAIL" }),
        }
        line
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }
}

/// The server's config: one source over `tenants` declared tenants with the two sinks to
/// the receiver. Quick retries, so a refused head waits moments, not minutes; a breaker
/// that does not open on the receiver's few refusals; attempt timeouts far above any
/// answer time, so no attempt completes at the receiver after the gateway gave up on it
/// (the one documented way a late duplicate can land after a later hook).
pub fn server_yaml(data_dir: &Path, receiver: SocketAddr, tenants: usize) -> String {
    let mut yaml = format!(
        "# Generated by bench-gate crash.\ninstance:\n  data_dir: '{}'\n  listen: 127.0.0.1:0\n  \
         admin_listen: 127.0.0.1:0\nstore: {{sync: true}}\n\
         dispatch: {{breaker_failures: 100000}}\n\
         retry: {{initial_ms: 20, max_ms: 200}}\ntenants:\n",
        data_dir.display()
    );
    for tenant in 0..tenants {
        let _ = writeln!(yaml, "  - {{id: t{tenant}}}");
    }
    let _ = write!(
        yaml,
        "sources:\n  - id: {SOURCE}\n    tenant_from: path\n    dedupe: {{json: id}}\n    sinks:\n      \
         - {{kind: http, id: {SINK_ORDERED}, url: 'http://{receiver}/{SINK_ORDERED}', \
         ordered: true, ordering_key: {{json: key}}, timeout_ms: 60000}}\n      \
         - {{kind: http, id: {SINK_UNORDERED}, url: 'http://{receiver}/{SINK_UNORDERED}', \
         timeout_ms: 60000}}\n"
    );
    yaml
}

/// The posters of one cycle: `connections` threads sending the ledger's retries first, then
/// new hooks, at most `rate` per second in all, until told to stop.
struct Posters {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Posters {
    fn start(
        settings: &CrashSettings,
        target: SocketAddr,
        ledger: &Arc<Mutex<Ledger>>,
        next_id: &Arc<AtomicU64>,
        max_new: Option<u64>,
    ) -> Posters {
        let stop = Arc::new(AtomicBool::new(false));
        let interval = Duration::from_secs_f64(settings.connections as f64 / settings.rate as f64);
        let threads = (0..settings.connections)
            .map(|_| {
                let stop = Arc::clone(&stop);
                let ledger = Arc::clone(ledger);
                let next_id = Arc::clone(next_id);
                let (seed, tenants, keys) = (settings.seed, settings.tenants, settings.keys);
                std::thread::spawn(move || {
                    let poster = Poster {
                        target,
                        ledger,
                        next_id,
                        stop,
                        interval,
                        max_new,
                        seed,
                        tenants,
                        keys,
                    };
                    poster.run();
                })
            })
            .collect();
        Posters { stop, threads }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

struct Poster {
    target: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
    next_id: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    interval: Duration,
    /// With `Some(n)`: no new hook past id n (the final phase sends retries only).
    max_new: Option<u64>,
    seed: u64,
    tenants: usize,
    keys: usize,
}

impl Poster {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next hook to send: a retry, else a new one.
    fn next(&self) -> Option<HookPlan> {
        let mut ledger = self.lock();
        if let Some(id) = ledger.retry.pop_front() {
            return Some(ledger.hooks[id as usize].0);
        }
        let id = self.next_id.load(Ordering::Acquire);
        if self.max_new.is_some_and(|max| id >= max) {
            return None;
        }
        // Taken under the ledger's lock, so ids enter the ledger in order.
        self.next_id.store(id + 1, Ordering::Release);
        let plan = HookPlan::of(self.seed, id, self.tenants, self.keys);
        ledger.hooks.push((plan, Answers::default()));
        Some(plan)
    }

    fn run(self) {
        let mut connection: Option<TcpStream> = None;
        let mut buffer = Vec::with_capacity(4096);
        let mut due = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            due = due.max(now) + self.interval;
            let stream = match connection.as_mut() {
                Some(stream) => stream,
                None => match connect(self.target) {
                    Ok(stream) => connection.insert(stream),
                    Err(_) => {
                        std::thread::sleep(POSTER_PAUSE);
                        continue;
                    }
                },
            };
            let Some(plan) = self.next() else {
                std::thread::sleep(POSTER_PAUSE);
                continue;
            };
            match post(stream, &plan, &mut buffer) {
                Ok((status, seq)) => {
                    self.lock().answered(plan.id, status, seq);
                    if matches!(status, 429 | 503) {
                        std::thread::sleep(POSTER_PAUSE);
                    }
                }
                Err(_) => {
                    self.lock().unanswered(plan.id);
                    connection = None;
                }
            }
        }
    }
}

fn connect(target: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&target, REQUEST_TIMEOUT)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends one hook and reads the answer: its status and, for a 2xx, the seq it names.
fn post(
    stream: &mut TcpStream,
    plan: &HookPlan,
    buffer: &mut Vec<u8>,
) -> std::io::Result<(u16, Option<u64>)> {
    let body = plan.body();
    let request = format!(
        "POST /hooks/{SOURCE}/t{} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        plan.tenant,
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    buffer.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head_len) = response
            .parse(buffer)
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?
        {
            let status = response.code.unwrap_or(0);
            let length: usize = response
                .headers
                .iter()
                .find(|header| header.name.eq_ignore_ascii_case("content-length"))
                .and_then(|header| std::str::from_utf8(header.value).ok()?.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= head_len + length {
                let seq = serde_json::from_slice::<serde_json::Value>(
                    &buffer[head_len..head_len + length],
                )
                .ok()
                .and_then(|answer| answer.get("seq")?.as_u64());
                // A refusal may close the connection; the next send reconnects.
                return Ok((status, seq));
            }
        }
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// What `store verify` said of the store at rest.
#[derive(Debug, Default)]
struct Verified {
    /// Its output when it failed.
    failure: Option<String>,
    /// Its `NOTE` lines: states a crash may leave that the next start repairs.
    repairable: Vec<String>,
}

/// Runs `bin store verify --data-dir DIR`.
fn store_verify(bin: &Path, data_dir: &Path) -> Verified {
    if !data_dir.exists() {
        // Killed before the store was created: nothing to verify.
        return Verified::default();
    }
    match std::process::Command::new(bin)
        .args(["store", "verify", "--data-dir"])
        .arg(data_dir)
        .output()
    {
        Ok(output) => {
            let stdout = String::from_utf8_lossy(&output.stdout);
            Verified {
                failure: (!output.status.success())
                    .then(|| format!("{stdout}{}", String::from_utf8_lossy(&output.stderr))),
                repairable: stdout
                    .lines()
                    .filter_map(|line| line.strip_prefix("NOTE "))
                    .map(str::to_owned)
                    .collect(),
            }
        }
        Err(error) => Verified {
            failure: Some(format!(
                "cannot run {} store verify: {error}",
                bin.display()
            )),
            repairable: Vec::new(),
        },
    }
}

/// The gauges the final drain reads: pending and in-flight rows of the node.
fn backlog(metrics: &Metrics) -> Option<(f64, f64)> {
    Some((
        metrics.value("ankusa_pending")?,
        metrics.value("ankusa_inflight")?,
    ))
}

/// Runs the harness. Progress goes to stderr; the run's files (config, each cycle's
/// stderr, the store) are kept in a temp dir whose path is printed when the run did not
/// pass.
pub fn crash(settings: &CrashSettings, revision: Option<String>) -> anyhow::Result<CrashReport> {
    let problems = settings.problems();
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("bench-gate-crash-")
        .tempdir()
        .context("creating a temp dir")?;
    let data_dir = dir.path().join("data");
    let receiver = Receiver::start(settings.seed)?;
    let config = dir.path().join("ankusa.yaml");
    std::fs::write(
        &config,
        server_yaml(&data_dir, receiver.responder.addr(), settings.tenants),
    )
    .context("writing the crash config")?;
    let fault_env: Vec<(&str, &str)> = settings
        .fault
        .as_deref()
        .map(|fault| vec![("ANKUSA_TEST_FAULT", fault)])
        .unwrap_or_default();
    let ledger = Arc::new(Mutex::new(Ledger {
        hooks: Vec::new(),
        retry: VecDeque::new(),
    }));
    let next_id = Arc::new(AtomicU64::new(0));
    let mut schedule = Rng::new(settings.seed);
    let mut startup_kills = 0;
    let mut verify_failures = Vec::new();
    let mut repairable_after_kill = 0;
    eprintln!(
        "bench-gate: crash: {} cycles, seed {}, {} tenants x {} keys, {} connections, {} hooks/s{}; files in {}",
        settings.cycles,
        settings.seed,
        settings.tenants,
        settings.keys,
        settings.connections,
        settings.rate,
        settings
            .fault
            .as_deref()
            .map(|fault| format!(", fault {fault}"))
            .unwrap_or_default(),
        dir.path().display()
    );
    for cycle in 1..=settings.cycles {
        let stderr = dir.path().join(format!("cycle-{cycle}.stderr"));
        let starting = Ankusa::spawn(&settings.bin, &config, false, &fault_env, &stderr)?;
        // One cycle in five dies before it is ready: while it opens the store or recovers
        // the previous run's claims. A fault run kills under load only, where the faults
        // show.
        if settings.fault.is_none() && schedule.below(5) == 0 {
            std::thread::sleep(schedule.millis(0, 400));
            starting.kill();
            startup_kills += 1;
        } else {
            let server = starting
                .ready(READY_TIMEOUT)
                .with_context(|| format!("cycle {cycle}: the server did not start"))?;
            let posters = Posters::start(settings, server.ingest, &ledger, &next_id, None);
            let max_load = settings.max_load.as_millis() as u64;
            std::thread::sleep(schedule.millis(max_load / 10, max_load));
            server.kill();
            posters.stop();
        }
        let verified = store_verify(&settings.bin, &data_dir);
        if let Some(output) = verified.failure {
            eprintln!("bench-gate: crash: cycle {cycle}: store verify FAILED:\n{output}");
            verify_failures.push(format!("after cycle {cycle}: {output}"));
        }
        for state in verified.repairable {
            eprintln!("bench-gate: crash: cycle {cycle}: store verify NOTE {state}");
            repairable_after_kill += 1;
        }
        let (posted, waiting) = {
            let ledger = ledger
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (ledger.hooks.len(), ledger.retry.len())
        };
        eprintln!(
            "bench-gate: crash: cycle {cycle}/{}: {posted} hooks posted, {waiting} to send again, {} deliveries recorded",
            settings.cycles,
            receiver.deliveries().len()
        );
    }

    // The end: every hook answered, the backlog drained, an orderly stop.
    let stderr = dir.path().join("final.stderr");
    let server = Ankusa::spawn(&settings.bin, &config, false, &fault_env, &stderr)?
        .ready(READY_TIMEOUT)
        .context("the final start: the server did not start")?;
    let drain_deadline = Instant::now() + settings.drain_timeout;
    let posted = next_id.load(Ordering::Acquire);
    let posters = Posters::start(settings, server.ingest, &ledger, &next_id, Some(posted));
    let mut idle_polls = 0;
    let mut drain_timed_out = false;
    loop {
        let retries_left = !ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retry
            .is_empty();
        let (pending, inflight) = backlog(&server.metrics()?).unwrap_or((-1.0, -1.0));
        if !retries_left && pending == 0.0 && inflight == 0.0 {
            idle_polls += 1;
        } else {
            idle_polls = 0;
        }
        if idle_polls >= DRAIN_IDLE_POLLS {
            break;
        }
        if Instant::now() >= drain_deadline {
            drain_timed_out = true;
            eprintln!(
                "bench-gate: crash: the final drain reached its timeout with {pending} rows pending, {inflight} in flight"
            );
            break;
        }
        std::thread::sleep(DRAIN_POLL);
    }
    posters.stop();
    let stop_error = server.stop().err().map(|error| error.to_string());
    // After an orderly stop nothing may be left to repair.
    let verified = store_verify(&settings.bin, &data_dir);
    if let Some(output) = verified.failure {
        eprintln!("bench-gate: crash: final store verify FAILED:\n{output}");
        verify_failures.push(format!("at the end: {output}"));
    }
    for state in verified.repairable {
        eprintln!("bench-gate: crash: final store verify: {state}");
        verify_failures.push(format!("at the end, after an orderly stop: {state}"));
    }
    let deliveries = receiver.deliveries();
    let findings = {
        let ledger = ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        check(&ledger.hooks, &deliveries)
    };
    let report = CrashReport {
        binary: settings.bin.display().to_string(),
        revision,
        seed: settings.seed,
        fault: settings.fault.clone(),
        cycles: settings.cycles,
        startup_kills,
        posted,
        receiver_refused: receiver.refused.load(Ordering::Relaxed),
        receiver_malformed: receiver.malformed.load(Ordering::Relaxed),
        verify_failures,
        repairable_after_kill,
        stop_error,
        drain_timed_out,
        findings,
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    receiver.responder.stop();
    if !report.passed() {
        let kept = dir.keep();
        eprintln!(
            "bench-gate: crash: the run's files are kept in {}",
            kept.display()
        );
    }
    Ok(report)
}

/// The report as text: the summary line, then the examples of what went wrong.
pub fn render(report: &CrashReport) -> String {
    let mut text = String::new();
    for example in &report.findings.examples {
        let _ = writeln!(text, "  {example}");
    }
    for failure in &report.verify_failures {
        let _ = writeln!(text, "  store verify {failure}");
    }
    if let Some(error) = &report.stop_error {
        let _ = writeln!(text, "  final stop: {error}");
    }
    if report.drain_timed_out {
        let _ = writeln!(text, "  the final drain reached its timeout");
    }
    let _ = writeln!(text, "{}", report.summary());
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn plans(count: u64) -> Vec<(HookPlan, Answers)> {
        (0..count)
            .map(|id| {
                (
                    HookPlan {
                        id,
                        tenant: 0,
                        key: 0,
                    },
                    Answers {
                        acked_seq: Some(id + 1),
                        ..Answers::default()
                    },
                )
            })
            .collect()
    }

    fn delivery(hook: u64, ordered: bool) -> Delivery {
        Delivery {
            ordered,
            hook,
            tenant: 0,
            key: 0,
            seq: hook + 1,
        }
    }

    fn both(hooks: &[u64]) -> Vec<Delivery> {
        hooks
            .iter()
            .flat_map(|hook| [delivery(*hook, true), delivery(*hook, false)])
            .collect()
    }

    #[test]
    fn a_clean_record_has_no_findings() {
        let findings = check(&plans(3), &both(&[0, 1, 2]));
        assert_eq!(
            findings,
            Findings {
                acked: 3,
                delivered: 6,
                ..Findings::default()
            }
        );
    }

    #[test]
    fn an_acked_hook_missing_at_one_sink_is_lost() {
        let mut deliveries = both(&[0, 2]);
        deliveries.push(delivery(1, false));
        let findings = check(&plans(3), &deliveries);
        assert_eq!(findings.lost, 1);
        assert_eq!(
            findings.examples,
            ["hook h1 (seq 2) acked, never delivered to ordered"]
        );
    }

    #[test]
    fn a_hook_never_acked_is_not_lost_but_counted() {
        let mut hooks = plans(2);
        hooks[1].1.acked_seq = None;
        let findings = check(&hooks, &both(&[0]));
        assert_eq!((findings.lost, findings.never_acked), (0, 1));
    }

    #[test]
    fn a_repeat_of_the_head_before_its_successor_is_a_duplicate_in_order() {
        // h1 was in flight at a kill: delivered again before h2.
        let deliveries = both(&[0, 1, 1, 2]);
        let findings = check(&plans(3), &deliveries);
        assert_eq!((findings.duplicates, findings.order_violations), (2, 0));
    }

    #[test]
    fn a_repeat_after_a_later_hook_is_an_order_violation() {
        let deliveries = [0, 1, 2, 1].map(|hook| delivery(hook, true));
        let mut deliveries = deliveries.to_vec();
        deliveries.extend([0, 1, 2].map(|hook| delivery(hook, false)));
        let findings = check(&plans(3), &deliveries);
        assert_eq!(findings.order_violations, 1);
        assert_eq!(
            findings.examples,
            ["lane t0/k0: repeat of seq 2 after seq 3"]
        );
    }

    #[test]
    fn a_first_delivery_out_of_seq_order_is_a_violation_only_on_the_ordered_sink() {
        let deliveries: Vec<Delivery> = [1, 0, 2]
            .into_iter()
            .flat_map(|hook| [delivery(hook, true), delivery(hook, false)])
            .collect();
        let findings = check(&plans(3), &deliveries);
        assert_eq!(findings.order_violations, 1);
        assert_eq!(
            findings.examples,
            ["lane t0/k0: first delivery of seq 1 after seq 2"]
        );
    }

    #[test]
    fn lanes_are_per_tenant_and_key() {
        // Two keys interleaved in opposite seq directions: each lane is in order.
        let mut hooks = plans(4);
        hooks[1].0.key = 1;
        hooks[3].0.key = 1;
        let order = [1, 0, 3, 2];
        let deliveries: Vec<Delivery> = order
            .iter()
            .flat_map(|hook| {
                [true, false].map(|ordered| Delivery {
                    key: hooks[*hook as usize].0.key,
                    ..delivery(*hook, ordered)
                })
            })
            .collect();
        assert_eq!(check(&hooks, &deliveries).order_violations, 0);
    }

    #[test]
    fn a_retry_that_became_a_second_hook_is_split() {
        let mut deliveries = both(&[0, 1]);
        deliveries.push(Delivery {
            seq: 9,
            ..delivery(1, false)
        });
        let findings = check(&plans(2), &deliveries);
        assert_eq!(findings.split, 1);
        assert_eq!(findings.examples, ["hook h1 has seqs [2, 9]"]);
    }

    #[test]
    fn a_delivery_the_harness_never_posted_is_a_phantom() {
        let mut deliveries = both(&[0]);
        deliveries.push(delivery(7, true));
        deliveries.push(Delivery {
            key: 3,
            ..delivery(0, false)
        });
        assert_eq!(check(&plans(1), &deliveries).phantom, 2);
    }

    #[test]
    fn answers_are_recorded_and_unanswered_hooks_are_sent_again() {
        let mut ledger = Ledger {
            hooks: plans(3)
                .into_iter()
                .map(|(plan, _)| (plan, Answers::default()))
                .collect(),
            retry: VecDeque::new(),
        };
        ledger.answered(0, 202, Some(5));
        ledger.answered(0, 200, Some(5));
        ledger.answered(1, 503, None);
        ledger.unanswered(2);
        ledger.answered(2, 200, Some(8));
        ledger.answered(2, 202, Some(9));
        assert_eq!(ledger.retry, [1, 2]);
        assert_eq!(ledger.hooks[0].1.acked_seq, Some(5));
        assert_eq!(ledger.hooks[0].1.other_seq, None);
        assert_eq!(ledger.hooks[1].1.unanswered, 1);
        assert_eq!(
            (ledger.hooks[2].1.acked_seq, ledger.hooks[2].1.other_seq),
            (Some(8), Some(9))
        );
        ledger.answered(1, 400, None);
        assert_eq!(ledger.hooks[1].1.refused, Some(400));
    }

    #[test]
    fn the_receiver_reads_a_delivery_from_the_sinks_request() {
        let plan = HookPlan {
            id: 42,
            tenant: 2,
            key: 7,
        };
        let body = plan.body();
        let request = format!(
            "POST /ordered HTTP/1.1\r\nx-ankusa-seq: 1234\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(
            parse_delivery(request.as_bytes()),
            Some(Delivery {
                ordered: true,
                hook: 42,
                tenant: 2,
                key: 7,
                seq: 1234
            })
        );
        let elsewhere = request.replace("/ordered", "/other");
        assert_eq!(parse_delivery(elsewhere.as_bytes()), None);
        let no_seq = request.replace("x-ankusa-seq", "x-other");
        assert_eq!(parse_delivery(no_seq.as_bytes()), None);
    }

    #[test]
    fn the_schedule_is_the_seeds() {
        let draws = |seed| {
            let mut rng = Rng::new(seed);
            (0..4).map(|_| rng.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        assert_eq!(HookPlan::of(7, 3, 4, 16), HookPlan::of(7, 3, 4, 16));
        let plan = HookPlan::of(7, 3, 4, 16);
        assert!(plan.tenant < 4 && plan.key < 16);
    }

    #[test]
    fn the_config_has_both_sinks_and_every_tenant() {
        let yaml = server_yaml(Path::new("/d"), "127.0.0.1:9".parse().unwrap(), 2);
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(value["tenants"][1]["id"].as_str(), Some("t1"));
        let sinks = &value["sources"][0]["sinks"];
        assert_eq!(sinks[0]["url"].as_str(), Some("http://127.0.0.1:9/ordered"));
        assert_eq!(sinks[0]["ordered"].as_bool(), Some(true));
        assert_eq!(
            sinks[1]["url"].as_str(),
            Some("http://127.0.0.1:9/unordered")
        );
        assert_eq!(value["sources"][0]["dedupe"]["json"].as_str(), Some("id"));
    }

    #[test]
    fn settings_problems_name_each_bad_value() {
        let settings = CrashSettings {
            bin: PathBuf::from("ankusa"),
            cycles: 0,
            seed: 1,
            tenants: 3,
            keys: 0,
            connections: 8,
            rate: 1000,
            max_load: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(60),
            fault: Some("drop_everything".into()),
        };
        assert_eq!(
            settings.problems(),
            [
                "--cycles must be between 1 and 10000, found 0",
                "--keys must be between 1 and 10000, found 0",
                "--fault \"drop_everything\" is not one the harness can prove (known: ack_before_sync, ignore_lanes)"
            ]
        );
    }
}
