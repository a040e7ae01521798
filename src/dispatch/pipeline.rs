//! One pipeline core: visit the owned active tenants round-robin, claim their due rows,
//! run the attempts, flush the outcomes. Everything here runs on one glommio executor;
//! the state is in `Rc`/`RefCell` because no other thread touches it.
//!
//! Store calls on this executor are reads (block cache) and unsynced writes (the WAL's
//! page cache): microseconds, never a sink's latency. Attempts run as tasks and only wait.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock;
use crate::dispatch::breaker::{Admit, Breaker, Change};
use crate::dispatch::retry::{self, Jitter};
use crate::dispatch::{DispatchShared, OpenBreaker};
use crate::live::Live;
use crate::published::Local;
use crate::sink::{Message, Outcome, Sink, SinkContext};
use crate::store::codec::{DeliveryRow, HookRecord};
use crate::store::deliveries::lanes::{self, LaneFloors};
use crate::store::deliveries::{self, Class, DueRow, RowId, Transitions};
use crate::store::keys::{DueKind, LaneId};
use crate::store::Store;

/// Due keys examined per visit, as a multiple of `dispatch.batch`: rows of a sink at its
/// concurrency limit are skipped, and this bounds what skipping can cost.
const EXAMINE_FACTOR: usize = 4;
/// Replay-class rows a visit may step over (their sink's replay slots are taken) on top
/// of the examined ones, so live rows due behind a replay's waiting rows are still
/// reached. The replay budget keeps fewer than this waiting (`replay_max_pending`).
const REPLAY_SKIP_MAX: usize = 1024;
/// Longest sleep when nothing is due; the writer's wake-up usually comes first.
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(50);
/// The first and the longest pause after the store refused a write (a full disk, an I/O
/// error): the round is tried again, but not in a spin that floods the log.
const STORE_BACKOFF_MIN: Duration = Duration::from_millis(10);
const STORE_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long a stop waits for attempts in flight before leaving them to recovery.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a tenant stays idle (nothing due, claimed or running) before its active marker
/// is removed. A tenant whose sink keeps up drains between two writer commits, so without
/// this its marker went and came back every round, each removal a commit and two seeks.
const RETIRE_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The gauge of the tenants the pipeline cores visit, each core adding its own share.
const ACTIVE_TENANTS: &str = "ankusa_dispatch_active_tenants";
/// How often the active markers are read even when no one asked (a safety net).
const ACTIVE_RESCAN_EVERY: Duration = Duration::from_secs(2);
/// How often every scan cursor is dropped (see `Core::cursors`).
const CURSOR_RESET_EVERY: Duration = Duration::from_secs(10);
/// How often every tenant's lane markers are scanned even when no one asked (a safety net
/// under the writer's lane notices).
const LANE_RESCAN_EVERY: Duration = Duration::from_secs(5);
/// How often the core checks its tenants' archive retention.
const ARCHIVE_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A claimed row being attempted.
struct Attempt {
    id: RowId,
    /// Indices in the config of `generation`.
    source: usize,
    sink: usize,
    /// The version of the running config the attempt was claimed under: its indices
    /// name a breaker only while that config runs.
    generation: u64,
    target: Arc<dyn Sink>,
    /// The row as claimed (attempts counted, first claim time set).
    row: DeliveryRow,
    received_at_ms: u64,
    /// The hook's bytes as stored, kept from the claim's read: when this is the hook's
    /// last row, they go to the archive as they are, without a second read.
    stored: Rc<Vec<u8>>,
    probe: bool,
    /// The row's class: a replay-class attempt holds one of the sink's replay slots.
    class: Class,
}

struct Finished {
    attempt: Attempt,
    outcome: Outcome,
}

/// Counts attempts running per (tenant, source, sink) and per tenant, and of those the
/// replay class's per (tenant, source, sink).
#[derive(Default)]
struct Running {
    per_sink: HashMap<(u32, usize, usize), usize>,
    per_tenant: HashMap<u32, usize>,
    replay_per_sink: HashMap<(u32, usize, usize), usize>,
}

fn count_up<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: K) {
    *counts.entry(key).or_default() += 1;
}

fn count_down<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: K) {
    if let Some(count) = counts.get_mut(&key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&key);
        }
    }
}

impl Running {
    fn sink_count(&self, ordinal: u32, source: usize, sink: usize) -> usize {
        self.per_sink
            .get(&(ordinal, source, sink))
            .copied()
            .unwrap_or(0)
    }

    fn replay_count(&self, ordinal: u32, source: usize, sink: usize) -> usize {
        self.replay_per_sink
            .get(&(ordinal, source, sink))
            .copied()
            .unwrap_or(0)
    }

    /// Replay attempts running for `ordinal`, over all its sinks.
    fn replay_tenant_count(&self, ordinal: u32) -> usize {
        self.replay_per_sink
            .iter()
            .filter(|((owner, _, _), _)| *owner == ordinal)
            .map(|(_, count)| count)
            .sum()
    }

    fn start(&mut self, ordinal: u32, source: usize, sink: usize, replay: bool) {
        count_up(&mut self.per_sink, (ordinal, source, sink));
        count_up(&mut self.per_tenant, ordinal);
        if replay {
            count_up(&mut self.replay_per_sink, (ordinal, source, sink));
        }
    }

    fn end(&mut self, ordinal: u32, source: usize, sink: usize, replay: bool) {
        count_down(&mut self.per_sink, (ordinal, source, sink));
        count_down(&mut self.per_tenant, ordinal);
        if replay {
            count_down(&mut self.replay_per_sink, (ordinal, source, sink));
        }
    }

    fn total(&self) -> usize {
        self.per_tenant.values().sum()
    }
}

struct Core {
    shared: Arc<DispatchShared>,
    index: usize,
    running: RefCell<Running>,
    finished: RefCell<Vec<Finished>>,
    breakers: RefCell<HashMap<(usize, usize), Breaker>>,
    jitter: RefCell<Jitter>,
    /// Due time of the oldest due row seen in this round.
    oldest_due_ms: Cell<u64>,
    /// Per tenant: no due key before this time is left to claim, so scans start here
    /// rather than stepping over the tombstones of every row consumed before it.
    cursors: RefCell<HashMap<u32, u64>>,
    cursors_reset_at: Cell<Instant>,
    /// Per tenant: since when it has been idle, until its marker is removed
    /// (`RETIRE_IDLE_AFTER`).
    idle_since: RefCell<HashMap<u32, Instant>>,
    /// The owned tenants with work, visited in ordinal order each round.
    active: RefCell<BTreeSet<u32>>,
    /// This core's share of `ankusa_dispatch_active_tenants`, as last published.
    active_published: Cell<usize>,
    active_scanned_at: Cell<Instant>,
    /// Purged tenants: never visited again, and outcomes of their attempts still running
    /// are dropped (their rows are gone).
    retired: RefCell<HashSet<u32>>,
    /// This core's copy of the running config, read once per round.
    live: Local<Live>,
    /// The config version the breakers were made for: a reload may move sinks, so the
    /// breakers (keyed by index) start over.
    breakers_generation: Cell<u64>,
    /// After a reload: owned tenants whose due rows are still to be checked for a sink or
    /// source the new config removed, each with the due time to go on from.
    gone_sweep: RefCell<Vec<(u32, u64)>>,
    /// Per tenant: lanes named by the writer or a revive since the last sweep.
    lane_work: RefCell<HashMap<u32, HashSet<LaneId>>>,
    /// Where each of this core's lanes seeks its next member from.
    lane_floors: LaneFloors,
    /// Bumped when every tenant's markers are to be scanned (at start, after a notice was
    /// lost to a full inbox, now and then); a tenant scanned in this epoch is not again.
    lane_scan_epoch: Cell<u64>,
    lanes_scanned: RefCell<HashMap<u32, u64>>,
    lane_scan_at: Cell<Instant>,
    /// Set when a store read or write of this round failed; the loop then backs off.
    store_failed: Cell<bool>,
}

impl Core {
    fn new(shared: Arc<DispatchShared>, index: usize) -> Core {
        let seed = clock::now_ms() ^ ((index as u64 + 1) << 48) ^ u64::from(std::process::id());
        let live = Local::new(shared.live.clone());
        Core {
            breakers_generation: Cell::new(live.seen()),
            live,
            shared,
            index,
            running: RefCell::new(Running::default()),
            finished: RefCell::new(Vec::new()),
            breakers: RefCell::new(HashMap::new()),
            jitter: RefCell::new(Jitter::new(seed)),
            oldest_due_ms: Cell::new(0),
            cursors: RefCell::new(HashMap::new()),
            cursors_reset_at: Cell::new(Instant::now()),
            idle_since: RefCell::new(HashMap::new()),
            active: RefCell::new(BTreeSet::new()),
            active_published: Cell::new(0),
            active_scanned_at: Cell::new(Instant::now()),
            retired: RefCell::new(HashSet::new()),
            gone_sweep: RefCell::new(Vec::new()),
            lane_work: RefCell::new(HashMap::new()),
            lane_floors: LaneFloors::new(),
            lane_scan_epoch: Cell::new(0),
            lanes_scanned: RefCell::new(HashMap::new()),
            lane_scan_at: Cell::new(Instant::now()),
            store_failed: Cell::new(false),
        }
    }

    /// A batch of this core's transitions: its lane releases seek from the core's floors.
    fn transitions(&self) -> Transitions<'_> {
        Transitions::new(&self.shared.store).with_lane_floors(&self.lane_floors)
    }
}

/// Runs pipeline core `index` until `shutdown`, then waits (briefly) for its attempts.
pub async fn run_core(shared: Arc<DispatchShared>, index: usize, shutdown: shards::Shutdown) {
    let core = Rc::new(Core::new(shared, index));
    let wakeup = core.shared.wakeups[index].clone();
    let mut idle_sleep = Duration::from_millis(1);
    let mut last_archive_sweep = Instant::now();
    let mut store_backoff = STORE_BACKOFF_MIN;
    while !shutdown.requested() {
        flush(&core);
        let claimed = round(&core);
        publish_oldest_due(&core);
        publish_active(&core);
        if core.index == 0 && last_archive_sweep.elapsed() >= ARCHIVE_SWEEP_EVERY {
            last_archive_sweep = Instant::now();
            sweep_archive(&core.shared, &core.live.get());
        }
        if core.store_failed.take() {
            // Outcomes stay buffered and rows where they are; the next round tries again.
            futures_lite::future::or(wakeup.wait(), glommio::timer::sleep(store_backoff)).await;
            store_backoff = (store_backoff * 2).min(STORE_BACKOFF_MAX);
            continue;
        }
        store_backoff = STORE_BACKOFF_MIN;
        if claimed > 0 || !core.finished.borrow().is_empty() || !core.gone_sweep.borrow().is_empty()
        {
            idle_sleep = Duration::from_millis(1);
            // Let the attempts just started run before the next round.
            futures_lite::future::yield_now().await;
            continue;
        }
        // Nothing to do: sleep until the writer commits, an attempt ends, or the timer
        // (retries come due without anyone announcing them).
        futures_lite::future::or(wakeup.wait(), glommio::timer::sleep(idle_sleep)).await;
        idle_sleep = (idle_sleep * 2).min(IDLE_SLEEP_MAX);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while core.running.borrow().total() > 0 && Instant::now() < deadline {
        futures_lite::future::or(
            wakeup.wait(),
            glommio::timer::sleep(Duration::from_millis(20)),
        )
        .await;
        flush(&core);
    }
    flush(&core);
    metrics::gauge!(ACTIVE_TENANTS).decrement(core.active_published.take() as f64);
    let left = core.running.borrow().total();
    if left > 0 {
        tracing::warn!(
            core = index,
            attempts = left,
            "stopping with attempts in flight; they are delivered again after restart"
        );
    }
}

/// One pass over the owned active tenants. Returns the rows claimed.
fn round(core: &Rc<Core>) -> usize {
    let shared = &core.shared;
    let live = follow_reload(core);
    take_retirements(core);
    sweep_gone(core, &live);
    refresh_active(core);
    check_hooks(core);
    core.oldest_due_ms.set(0);
    // Rows put by others behind a cursor move it back. As a safety net every cursor is
    // dropped now and then: one full seek per tenant costs little that often.
    let inserted = shared.inserted_due_ms[core.index].swap(u64::MAX, Ordering::AcqRel);
    if core.cursors_reset_at.get().elapsed() >= CURSOR_RESET_EVERY {
        core.cursors.borrow_mut().clear();
        core.cursors_reset_at.set(Instant::now());
    } else if inserted != u64::MAX {
        for cursor in core.cursors.borrow_mut().values_mut() {
            *cursor = (*cursor).min(inserted);
        }
    }
    take_lane_notices(core);
    // The lane sweep runs only while some lane has a member: a node with no ordered sink
    // pays one atomic load per round for lanes (the counter's in-memory mirror), and
    // nothing per tenant. Read after the notices: a member named by one is counted by
    // then, so with none counted every notice taken is stale.
    let lanes_live = shared.store.gauges().lane_members() > 0;
    if !lanes_live {
        core.lane_work.borrow_mut().clear();
    }
    let mut claimed = 0;
    let tenants: Vec<u32> = core.active.borrow().iter().copied().collect();
    for ordinal in tenants {
        match visit(core, &live, ordinal, lanes_live) {
            Ok(count) => claimed += count,
            Err(error) => {
                core.store_failed.set(true);
                tracing::error!(%error, tenant = ordinal, "tenant visit failed");
            }
        }
    }
    claimed
}

/// The running config for this step. After a reload the breakers start over: they are
/// keyed by source and sink index, which the new config may have moved.
fn follow_reload(core: &Core) -> crate::published::Held<Live> {
    let live = core.live.get();
    if core.live.seen() != core.breakers_generation.get() {
        let open = core
            .breakers
            .borrow()
            .values()
            .filter(|breaker| breaker.is_open())
            .count();
        metrics::gauge!("ankusa_dispatch_breakers_open").decrement(open as f64);
        core.breakers.borrow_mut().clear();
        core.shared.breakers.publish(core.index, Vec::new());
        core.breakers_generation.set(core.live.seen());
        // Rows of removed sinks and sources go to the DLQ now, not when they come due.
        let tenants: Vec<(u32, u64)> = core.active.borrow().iter().map(|&o| (o, 0)).collect();
        *core.gone_sweep.borrow_mut() = tenants;
        core.shared.rescan[core.index].store(true, Ordering::Release);
    }
    live
}

/// One step of the sweep after a reload: up to `dispatch.batch` due rows of one tenant,
/// whatever their due time, each dead-lettered if its sink or source is gone.
fn sweep_gone(core: &Core, live: &Live) {
    let Some((ordinal, from_ms)) = core.gone_sweep.borrow().last().copied() else {
        return;
    };
    let store = &core.shared.store;
    let limit = live.config.dispatch.batch;
    let mut rows = Vec::with_capacity(limit.min(1024));
    let scanned = deliveries::due_rows(store, ordinal, from_ms, u64::MAX, |row| {
        if let Ok(row) = row {
            rows.push(row);
        }
        rows.len() < limit
    });
    let mut transitions = core.transitions();
    let mut hook_cache: Option<(u64, Option<HookRecord>)> = None;
    let result = scanned.and_then(|()| {
        for due in &rows {
            let Some(row) = deliveries::read_row(store, due.id)?
                .and_then(|bytes| DeliveryRow::decode(&bytes).ok())
            else {
                // Visits deal with rows that cannot be read.
                continue;
            };
            if hook_cache.as_ref().map(|(seq, _)| *seq) != Some(due.id.seq) {
                let hook = deliveries::read_hook(store, ordinal, due.id.seq)?
                    .and_then(|bytes| HookRecord::decode(&bytes).ok());
                hook_cache = Some((due.id.seq, hook));
            }
            let Some((_, Some(hook))) = &hook_cache else {
                continue;
            };
            if let Err((cause, reason)) = route_row(live, hook, &row) {
                dead_letter_gone(&mut transitions, live, hook, due, &row, cause, &reason)?;
            }
        }
        transitions.commit(false)
    });
    let mut sweep = core.gone_sweep.borrow_mut();
    match result {
        // Fewer rows than asked: the tenant is done.
        Ok(()) if rows.len() < limit => {
            sweep.pop();
        }
        Ok(()) => {
            let last_ms = rows.last().map_or(from_ms, |row| row.due_ms);
            // Rows sharing one due time past the limit are left to their visit.
            let next_ms = if last_ms == from_ms {
                last_ms.saturating_add(1)
            } else {
                last_ms
            };
            if let Some(entry) = sweep.last_mut() {
                entry.1 = next_ms;
            }
        }
        Err(error) => {
            tracing::error!(%error, tenant = ordinal, "sweep after reload failed; rows are checked when due");
            sweep.pop();
        }
    }
}

/// The source and sink indices of a row under `live`, or why it can never be delivered:
/// its source or sink is no longer configured (cause, reason).
fn route_row(
    live: &Live,
    hook: &HookRecord,
    row: &DeliveryRow,
) -> Result<(usize, usize), (&'static str, String)> {
    let Some(source) = live.source_index(&hook.source_id) else {
        return Err((
            "source_gone",
            format!("source_gone: source {:?} is not configured", hook.source_id),
        ));
    };
    let Some(sink) = live.config.sources[source]
        .sinks
        .iter()
        .position(|entry| entry.id == row.sink_id)
    else {
        return Err((
            "sink_gone",
            format!(
                "sink_gone: sink {:?} is not configured on source {:?}",
                row.sink_id, hook.source_id
            ),
        ));
    };
    Ok((source, sink))
}

/// Why an in-flight row can no longer be delivered under `live`, if it cannot. A hook that
/// cannot be read leaves the check to the row's next claim.
fn gone_now(
    store: &Store,
    live: &Live,
    id: RowId,
    row: &DeliveryRow,
) -> Option<(&'static str, String)> {
    let bytes = deliveries::read_hook(store, id.ordinal, id.seq).ok()??;
    let hook = HookRecord::decode(&bytes).ok()?;
    route_row(live, &hook, row).err()
}

/// Stops moving the tenants a purge asked for. Runs between flushes, so once it answers,
/// this core writes nothing of those tenants again.
fn take_retirements(core: &Core) {
    for (ordinal, done) in core.shared.retirements[core.index].1.try_iter() {
        core.retired.borrow_mut().insert(ordinal);
        core.active.borrow_mut().remove(&ordinal);
        core.cursors.borrow_mut().remove(&ordinal);
        core.idle_since.borrow_mut().remove(&ordinal);
        core.lane_work.borrow_mut().remove(&ordinal);
        core.lanes_scanned.borrow_mut().remove(&ordinal);
        core.finished
            .borrow_mut()
            .retain(|finished| finished.attempt.id.ordinal != ordinal);
        let _ = done.send(());
    }
}

/// Adds the tenants the writer named since the last round to the active set, and reads
/// the active markers when asked to or now and then. The markers are the durable record
/// (a restart starts from them); the writer puts one in every batch, so a scan of them
/// steps over one version per batch and is kept off the per-round path.
fn refresh_active(core: &Core) {
    let shared = &core.shared;
    let mut active = core.active.borrow_mut();
    let retired = core.retired.borrow();
    active.extend(
        shared.inboxes[core.index]
            .1
            .try_iter()
            .filter(|ordinal| !retired.contains(ordinal)),
    );
    let rescan = shared.rescan[core.index].swap(false, Ordering::AcqRel);
    if !rescan && core.active_scanned_at.get().elapsed() < ACTIVE_RESCAN_EVERY {
        return;
    }
    core.active_scanned_at.set(Instant::now());
    match deliveries::active_tenants(&shared.store) {
        Ok(tenants) => {
            active.extend(tenants.into_iter().filter(|ordinal| {
                shared.owner(*ordinal) == core.index && !retired.contains(ordinal)
            }))
        }
        Err(error) => {
            tracing::error!(%error, "cannot list active tenants; retrying");
            shared.rescan[core.index].store(true, Ordering::Release);
        }
    }
}

/// Deletes the hooks other paths asked about that have no delivery row left. Runs between
/// this core's flushes, so its own view of the hook's live rows is final.
fn check_hooks(core: &Core) {
    let shared = &core.shared;
    let store = &shared.store;
    let mut transitions = core.transitions();
    for (ordinal, seq) in shared.hook_checks[core.index].1.try_iter() {
        if core.retired.borrow().contains(&ordinal) {
            continue;
        }
        let orphan = deliveries::rows_of_hook(store, ordinal, seq)
            .map(|rows| rows.is_empty())
            .and_then(|empty| Ok(empty && deliveries::read_hook(store, ordinal, seq)?.is_some()));
        match orphan {
            Ok(true) => transitions.delete_hook(ordinal, seq),
            Ok(false) => {}
            Err(error) => tracing::error!(%error, tenant = ordinal, seq, "hook check failed"),
        }
    }
    if let Err(error) = transitions.commit(false) {
        tracing::error!(%error, "hook check failed to commit");
    }
}

/// Each core posts the oldest due time of its round; core 0 turns them into the gauge.
fn publish_oldest_due(core: &Core) {
    let slots = &core.shared.oldest_due_ms;
    slots[core.index].store(core.oldest_due_ms.get(), Ordering::Relaxed);
    if core.index != 0 {
        return;
    }
    let oldest = slots
        .iter()
        .map(|slot| slot.load(Ordering::Relaxed))
        .filter(|due_ms| *due_ms != 0)
        .min();
    let age_s = oldest.map_or(0.0, |due_ms| {
        clock::now_ms().saturating_sub(due_ms) as f64 / 1000.0
    });
    metrics::gauge!("ankusa_dispatch_oldest_due_age_seconds").set(age_s);
}

/// Moves `ankusa_dispatch_active_tenants` by the change in this core's active tenants: the
/// gauge is the sum of every core's share.
fn publish_active(core: &Core) {
    let now = core.active.borrow().len();
    let before = core.active_published.replace(now);
    if now != before {
        metrics::gauge!(ACTIVE_TENANTS).increment(now as f64 - before as f64);
    }
}

/// Visits one tenant: promotes lane members whose turn came (`lanes_live`), claims what
/// is due and may run, parks what its breaker holds, dead-letters what can never be
/// delivered, and starts the attempts.
fn visit(
    core: &Rc<Core>,
    live: &Live,
    ordinal: u32,
    lanes_live: bool,
) -> Result<usize, crate::store::StoreError> {
    let shared = &core.shared;
    let store = &shared.store;
    if lanes_live {
        // Before the due fold, so a head promoted now is claimed in the same scan.
        sweep_lanes(core, live, ordinal, false)?;
    }
    let now_ms = clock::now_ms();
    let from_ms = core.cursors.borrow().get(&ordinal).copied().unwrap_or(0);
    let Some(earliest) = deliveries::earliest_due_ms(store, ordinal, from_ms)? else {
        retire_if_idle(core, live, ordinal)?;
        return Ok(0);
    };
    core.idle_since.borrow_mut().remove(&ordinal);
    if earliest > now_ms {
        return Ok(0);
    }
    // No due key lies before `earliest`, and this core's own retries and parks are due
    // after now; rows others put behind it move it back (`inserted_due_ms`). Kept at once,
    // because a visit may end below without claiming (every sink busy), and a cursor left
    // behind makes each such visit seek over the same tombstones again: after a reset, a
    // busy tenant's every round stepped over its whole memtable of claimed keys.
    core.cursors.borrow_mut().insert(ordinal, earliest);
    let oldest = core.oldest_due_ms.get();
    if oldest == 0 || earliest < oldest {
        core.oldest_due_ms.set(earliest);
    }

    let sink_concurrency = live.config.dispatch.sink_concurrency;
    // Attempts this tenant may still start: when every sink it can use is busy, the
    // visit reads nothing more.
    let tenant_sources = live.sources_of_tenant(ordinal);
    let mut free = match tenant_sources {
        Some(sources) => {
            let running = core.running.borrow();
            sources
                .iter()
                .flat_map(|&source| (0..live.sinks[source].len()).map(move |sink| (source, sink)))
                .map(|(source, sink)| {
                    sink_concurrency.saturating_sub(running.sink_count(ordinal, source, sink))
                })
                .sum()
        }
        None => usize::MAX,
    };
    if free == 0 {
        return Ok(0);
    }
    let only_source = match tenant_sources {
        Some([source]) => Some(*source),
        _ => None,
    };
    // The replay class's slots per sink; with several sources, what the fold may read of
    // the class at most (the claim below holds each sink to its own slots).
    let replay_slots = live.replay_concurrency(ordinal);
    let replay_readable = match tenant_sources {
        Some(sources) => {
            let sinks: usize = sources.iter().map(|&source| live.sinks[source].len()).sum();
            (replay_slots * sinks)
                .saturating_sub(core.running.borrow().replay_tenant_count(ordinal))
        }
        None => usize::MAX,
    };

    let batch = live.config.dispatch.batch;
    // Read only as many due keys as this visit can claim: a backlog of a million rows
    // behind a busy sink must not be re-read on every round.
    let wanted = free.min(batch);
    let examine_max = batch * EXAMINE_FACTOR;
    let mut due = Vec::with_capacity(wanted.min(1024));
    let mut corrupt = Vec::new();
    let mut examined = 0usize;
    // Where the next visit starts: the first row this visit leaves due (skipped, or not
    // reached), else the last one it consumed (more may share its due time).
    let mut next_cursor_ms: Option<u64> = None;
    let mut wanted_per_sink: HashMap<usize, usize> = HashMap::new();
    let mut wanted_replay_per_sink: HashMap<usize, usize> = HashMap::new();
    let mut replay_read = 0usize;
    let mut replay_skipped = 0usize;
    deliveries::due_rows(store, ordinal, earliest, now_ms, |row| {
        match row {
            Ok(row) => {
                let replay = row.kind.is_replay();
                // With one possible source, the key's sink index names its sink without
                // reading the row, so rows of a busy sink are skipped here for free. (A
                // row whose sink moved in the config is found by its id once read; this
                // only decides what to read.)
                let sink = usize::from(row.id.sink);
                let count =
                    |wanted: &HashMap<usize, usize>| wanted.get(&sink).copied().unwrap_or(0);
                let busy = only_source.is_some_and(|source| {
                    let running = core.running.borrow();
                    sink < live.sinks[source].len()
                        && (running.sink_count(ordinal, source, sink) + count(&wanted_per_sink)
                            >= sink_concurrency
                            || replay
                                && running.replay_count(ordinal, source, sink)
                                    + count(&wanted_replay_per_sink)
                                    >= replay_slots)
                });
                let busy = busy || replay && replay_read >= replay_readable;
                if busy {
                    next_cursor_ms.get_or_insert(row.due_ms);
                    if replay {
                        // Stepped over without a read: live rows behind it still count.
                        replay_skipped += 1;
                    } else {
                        examined += 1;
                    }
                } else {
                    examined += 1;
                    *wanted_per_sink.entry(sink).or_default() += 1;
                    if replay {
                        *wanted_replay_per_sink.entry(sink).or_default() += 1;
                        replay_read += 1;
                    }
                    due.push(row);
                }
            }
            Err(id) => {
                examined += 1;
                corrupt.push(id);
            }
        }
        due.len() < wanted && examined < examine_max && replay_skipped < REPLAY_SKIP_MAX
    })?;

    let mut transitions = core.transitions();
    for (id, due_ms) in corrupt {
        // Without a readable due value the size comes from the row itself.
        let row = deliveries::read_row(store, id)?.and_then(|b| DeliveryRow::decode(&b).ok());
        match row {
            Some(row) => dead_letter_due(
                &mut transitions,
                id,
                due_ms,
                row.size,
                None,
                Some(&row),
                "undecodable",
                "undecodable: due value",
            )?,
            None => transitions.drop_orphan_due(id, due_ms, 0, None)?,
        }
    }

    // Every row and hook the claims below may need, each family in one batched lookup:
    // under a backlog they are in table files, and consecutive hooks share their blocks.
    let ids: Vec<RowId> = due.iter().map(|due_row| due_row.id).collect();
    let mut rows = deliveries::read_rows(store, &ids).into_iter();
    let mut seqs: Vec<u64> = ids.iter().map(|id| id.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let mut hooks: HashMap<u64, HookRead> = HashMap::with_capacity(seqs.len());
    for (&seq, read) in seqs
        .iter()
        .zip(deliveries::read_hooks(store, ordinal, &seqs))
    {
        hooks.insert(seq, hook_to_deliver(read)?);
    }
    let mut to_start: Vec<(Attempt, Arc<HookRecord>)> = Vec::new();
    // Claims made in this visit count against the limit before their tasks start.
    let mut claiming: HashMap<(usize, usize), usize> = HashMap::new();
    let mut claiming_replay: HashMap<(usize, usize), usize> = HashMap::new();
    let mut last_examined_ms = earliest;
    for due_row in due {
        if to_start.len() >= batch || free == 0 {
            next_cursor_ms.get_or_insert(due_row.due_ms);
            break;
        }
        last_examined_ms = due_row.due_ms;
        let DueRow {
            id,
            due_ms,
            size,
            kind,
        } = due_row;
        let read = rows.next().expect("one row read for every due row")?;
        let row = match read.map(|b| DeliveryRow::decode(&b)) {
            Some(Ok(row)) => row,
            Some(Err(error)) => {
                let reason = format!("undecodable: delivery row: {error}");
                dead_letter_due(
                    &mut transitions,
                    id,
                    due_ms,
                    size,
                    Some(kind),
                    None,
                    "undecodable",
                    &reason,
                )?;
                continue;
            }
            None => {
                tracing::warn!(
                    tenant = ordinal,
                    seq = id.seq,
                    sink = id.sink,
                    "due key without its delivery row; dropping the key"
                );
                transitions.drop_orphan_due(id, due_ms, size, Some(kind))?;
                continue;
            }
        };
        let hook = hooks[&id.seq].clone();
        let (hook, stored) = match hook {
            HookRead::Found { record, stored } => (record, stored),
            HookRead::Unreadable { cause, reason } => {
                if cause == "corrupt" {
                    metrics::counter!("ankusa_integrity_failures_total", "stage" => "delivery")
                        .increment(1);
                }
                dead_letter_due(
                    &mut transitions,
                    id,
                    due_ms,
                    size,
                    Some(kind),
                    Some(&row),
                    cause,
                    &reason,
                )?;
                continue;
            }
        };
        let (source, sink) = match route_row(live, &hook, &row) {
            Ok(route) => route,
            Err((cause, reason)) => {
                dead_letter_gone(
                    &mut transitions,
                    live,
                    &hook,
                    &due_row,
                    &row,
                    cause,
                    &reason,
                )?;
                continue;
            }
        };
        let running = core.running.borrow().sink_count(ordinal, source, sink)
            + claiming.get(&(source, sink)).copied().unwrap_or(0);
        if running >= sink_concurrency {
            next_cursor_ms.get_or_insert(due_ms);
            continue;
        }
        let class = Class::of(kind);
        let replay = class == Class::Replay;
        if replay
            && core.running.borrow().replay_count(ordinal, source, sink)
                + claiming_replay.get(&(source, sink)).copied().unwrap_or(0)
                >= replay_slots
        {
            next_cursor_ms.get_or_insert(due_ms);
            continue;
        }
        let (admit, change) = {
            let mut breakers = core.breakers.borrow_mut();
            breakers
                .entry((source, sink))
                .or_insert_with(|| new_breaker(live))
                .admit(now_ms)
        };
        if let Some(change) = change {
            breaker_changed(core, live, source, sink, change);
        }
        let probe = match admit {
            Admit::Attempt => false,
            Admit::Probe => true,
            Admit::Park { until_ms } => {
                transitions.park(id, due_ms, until_ms, size, due_row.kind);
                metrics::counter!("ankusa_dispatch_parked_total", "kind" => live.sinks[source][sink].kind())
                    .increment(1);
                continue;
            }
        };
        let mut claimed_row = row;
        claimed_row.attempts = claimed_row.attempts.saturating_add(1);
        if claimed_row.first_attempt_at_ms == 0 {
            claimed_row.first_attempt_at_ms = now_ms;
        }
        transitions.claim(id, due_ms, kind, &claimed_row, now_ms);
        *claiming.entry((source, sink)).or_default() += 1;
        if replay {
            *claiming_replay.entry((source, sink)).or_default() += 1;
        }
        free = free.saturating_sub(1);
        to_start.push((
            Attempt {
                id,
                source,
                sink,
                generation: core.live.seen(),
                target: live.sinks[source][sink].clone(),
                row: claimed_row,
                received_at_ms: hook.received_at_ms,
                stored,
                probe,
                class,
            },
            hook,
        ));
    }
    if let Err(error) = transitions.commit(false) {
        // Nothing of the batch happened; the rows are still due and the next round
        // tries again. Probes admitted above are given back.
        for (attempt, _) in &to_start {
            if attempt.probe {
                if let Some(breaker) = core
                    .breakers
                    .borrow_mut()
                    .get_mut(&(attempt.source, attempt.sink))
                {
                    breaker.probe_abandoned();
                }
            }
        }
        return Err(error);
    }
    core.cursors
        .borrow_mut()
        .insert(ordinal, next_cursor_ms.unwrap_or(last_examined_ms));
    let claimed = to_start.len();
    for (attempt, hook) in to_start {
        start_attempt(core, live, attempt, hook);
    }
    Ok(claimed)
}

fn new_breaker(live: &Live) -> Breaker {
    Breaker::new(
        live.config.dispatch.breaker_failures,
        live.config.dispatch.breaker_open_ms,
        live.config.dispatch.breaker_open_max_ms,
    )
}

#[allow(clippy::too_many_arguments)]
fn dead_letter_due(
    transitions: &mut Transitions<'_>,
    id: RowId,
    due_ms: u64,
    size: u32,
    kind: Option<DueKind>,
    row: Option<&DeliveryRow>,
    cause: &'static str,
    reason: &str,
) -> Result<(), crate::store::StoreError> {
    tracing::warn!(
        tenant = id.ordinal,
        seq = id.seq,
        sink = id.sink,
        reason,
        "dead-lettering row"
    );
    let updated = row.map(|row| DeliveryRow {
        last_error: reason.to_owned(),
        ..row.clone()
    });
    transitions.dead_from_due(id, due_ms, size, kind, updated.as_ref(), reason)?;
    metrics::counter!("ankusa_dispatch_dead_lettered_total", "kind" => "unknown", "cause" => cause)
        .increment(1);
    Ok(())
}

/// A hook as read for a claim: what the attempt sends, or why nothing will be sent.
#[derive(Clone)]
enum HookRead {
    Found {
        record: Arc<HookRecord>,
        stored: Rc<Vec<u8>>,
    },
    /// `cause` is `corrupt` (the bytes are not the ones stored: the digest does not match,
    /// or the store's own checksum failed) or `undecodable` (missing, or unreadable).
    Unreadable { cause: &'static str, reason: String },
}

/// Checks the hook a claimed row delivers, as read. Every delivery reads it for its claim,
/// so a record changed after its ack is caught before any byte of it goes out.
fn hook_to_deliver(
    read: Result<Option<Vec<u8>>, crate::store::StoreError>,
) -> Result<HookRead, crate::store::StoreError> {
    let unreadable = |cause, reason| Ok(HookRead::Unreadable { cause, reason });
    match read {
        Ok(Some(bytes)) => match HookRecord::decode(&bytes) {
            Ok(hook) => Ok(HookRead::Found {
                record: Arc::new(hook),
                stored: Rc::new(bytes),
            }),
            Err(error) if error.is_corrupt() => unreadable("corrupt", format!("corrupt: {error}")),
            Err(error) => unreadable("undecodable", format!("undecodable: {error}")),
        },
        Ok(None) => unreadable("undecodable", "undecodable: hook missing".to_owned()),
        Err(error) if error.is_corruption() => {
            unreadable("corrupt", format!("corrupt: hook unreadable: {error}"))
        }
        Err(error) => Err(error),
    }
}

/// Dead-letters a due row whose sink or source is gone. A lane head takes along the
/// members behind it that are gone too (in bounded steps), so a removed ordered sink
/// drains its lanes without promoting their members one round at a time.
fn dead_letter_gone(
    transitions: &mut Transitions<'_>,
    live: &Live,
    hook: &HookRecord,
    due: &DueRow,
    row: &DeliveryRow,
    cause: &'static str,
    reason: &str,
) -> Result<(), crate::store::StoreError> {
    let Some(lane) = &row.lane else {
        return dead_letter_due(
            transitions,
            due.id,
            due.due_ms,
            due.size,
            Some(due.kind),
            Some(row),
            cause,
            reason,
        );
    };
    tracing::warn!(
        tenant = due.id.ordinal,
        seq = due.id.seq,
        sink = due.id.sink,
        reason,
        "dead-lettering a lane head and the members behind it that cannot be delivered either"
    );
    let updated = DeliveryRow {
        last_error: reason.to_owned(),
        ..row.clone()
    };
    let before = transitions.len();
    // Members of one lane share the head's source; each is checked by its own sink id.
    transitions.dead_gone_lane(
        due.id,
        due.due_ms,
        due.kind,
        &updated,
        &lane.id,
        reason,
        |member| {
            route_row(live, hook, member)
                .err()
                .map(|(_, reason)| reason)
        },
    )?;
    metrics::counter!("ankusa_dispatch_dead_lettered_total", "kind" => "unknown", "cause" => cause)
        .increment((transitions.len() - before) as u64);
    Ok(())
}

/// Takes the lanes the writer and the admin named since the last round, and starts a new
/// scan epoch when a notice was lost or the safety-net period passed.
fn take_lane_notices(core: &Core) {
    let shared = &core.shared;
    {
        let retired = core.retired.borrow();
        let mut work = core.lane_work.borrow_mut();
        for (ordinal, lane) in shared.lane_inboxes[core.index].1.try_iter() {
            if !retired.contains(&ordinal) {
                work.entry(ordinal).or_default().insert(lane);
            }
        }
    }
    let lost = shared.lane_rescan[core.index].swap(false, Ordering::AcqRel);
    if lost || core.lane_scan_at.get().elapsed() >= LANE_RESCAN_EVERY {
        core.lane_scan_epoch.set(core.lane_scan_epoch.get() + 1);
        core.lane_scan_at.set(Instant::now());
    }
}

/// Promotes the tenant's lane members whose turn came (the lane sweep): the lanes named
/// since the last sweep, or every marked lane when the tenant is due for a scan (`scan`,
/// or not scanned in this epoch). Returns whether a head was promoted.
fn sweep_lanes(
    core: &Core,
    live: &Live,
    ordinal: u32,
    scan: bool,
) -> Result<bool, crate::store::StoreError> {
    let store = &core.shared.store;
    let limit = live.config.dispatch.batch;
    let epoch = core.lane_scan_epoch.get();
    let scan = scan || core.lanes_scanned.borrow().get(&ordinal) != Some(&epoch);
    let swept = if scan {
        // Markers are read before the named lanes are dropped: a lane named now was
        // committed before this scan, so the scan sees its marker.
        let named = core.lane_work.borrow_mut().remove(&ordinal);
        let swept = lanes::sweep(store, &core.lane_floors, ordinal, limit)?;
        if swept.markers < limit {
            core.lanes_scanned.borrow_mut().insert(ordinal, epoch);
        } else if let Some(named) = named {
            // The scan stopped at its limit: the named lanes stay named.
            core.lane_work.borrow_mut().insert(ordinal, named);
        }
        swept
    } else {
        let Some(named) = core.lane_work.borrow_mut().remove(&ordinal) else {
            return Ok(false);
        };
        let named: Vec<LaneId> = named.into_iter().collect();
        lanes::sweep_lanes_at(
            store,
            Some(&core.lane_floors),
            ordinal,
            &named,
            clock::now_ms(),
        )?
    };
    metrics::counter!("ankusa_dispatch_lane_sweeps_total").increment(1);
    if swept.promoted > 0 {
        // Promoted heads are due now: a cursor past them would skip them.
        core.cursors.borrow_mut().remove(&ordinal);
    }
    Ok(swept.promoted > 0)
}

/// Removes the active marker of a tenant with nothing due, claimed or running for
/// `RETIRE_IDLE_AFTER`. The writer may commit a new row between the check and the
/// delete, so the due family is read once more after the delete and the marker put back
/// if a row appeared.
///
/// Claimed rows (`?F`) are known without a read: only this core claims this tenant's
/// rows, and each claimed row is running or has its outcome buffered until the next
/// flush. (A seek of `?F` would step over the tombstone of every row delivered since the
/// last memtable flush.)
///
/// Lane members count too: a tenant keeps its marker while it has a lane marker (`?P`),
/// and a marker found here gets a sweep of its own, which promotes what waits and removes
/// markers with nothing behind them.
fn retire_if_idle(core: &Core, live: &Live, ordinal: u32) -> Result<(), crate::store::StoreError> {
    let claimed = core.running.borrow().per_tenant.contains_key(&ordinal)
        || core
            .finished
            .borrow()
            .iter()
            .any(|finished| finished.attempt.id.ordinal == ordinal);
    if claimed {
        core.idle_since.borrow_mut().remove(&ordinal);
        return Ok(());
    }
    let idle_since = *core
        .idle_since
        .borrow_mut()
        .entry(ordinal)
        .or_insert_with(Instant::now);
    if idle_since.elapsed() < RETIRE_IDLE_AFTER {
        return Ok(());
    }
    core.idle_since.borrow_mut().remove(&ordinal);
    let store = &core.shared.store;
    if lanes::has_marker(store, ordinal)? {
        sweep_lanes(core, live, ordinal, true)?;
        if lanes::has_marker(store, ordinal)? || deliveries::has_due(store, ordinal)? {
            return Ok(());
        }
    }
    let mut transitions = Transitions::new(store);
    transitions.clear_active(ordinal);
    transitions.commit(false)?;
    if deliveries::has_due(store, ordinal)? || lanes::has_marker(store, ordinal)? {
        let mut transitions = Transitions::new(store);
        transitions.set_active(ordinal);
        transitions.commit(false)?;
    } else {
        core.active.borrow_mut().remove(&ordinal);
    }
    Ok(())
}

fn start_attempt(core: &Rc<Core>, live: &Live, attempt: Attempt, hook: Arc<HookRecord>) {
    let shared = &core.shared;
    let sink: Arc<dyn Sink> = attempt.target.clone();
    let source = &live.config.sources[attempt.source];
    let sink_id = &source.sinks[attempt.sink].id;
    let context = SinkContext {
        tenant_id: hook.tenant_id.clone(),
        source_id: source.id.clone(),
        sink_id: sink_id.clone(),
        seq: attempt.id.seq,
        attempt: attempt.row.attempts,
        idempotency_key: format!("{}:{}:{}", shared.instance_id, attempt.id.seq, sink_id),
        received_at_ms: attempt.received_at_ms,
        ordering_key: attempt.row.lane.as_ref().map(|lane| {
            if lane.ordering_key.is_empty() {
                format!("{}/{}", hook.tenant_id, source.id)
            } else {
                lane.ordering_key.clone()
            }
        }),
        lane: attempt.row.lane.as_ref().map(|lane| hex::encode(lane.id)),
    };
    core.running.borrow_mut().start(
        attempt.id.ordinal,
        attempt.source,
        attempt.sink,
        attempt.class == Class::Replay,
    );
    let core = core.clone();
    glommio::spawn_local(async move {
        let started = Instant::now();
        let ordered = context.lane.is_some();
        let outcome = sink.deliver(Message { hook, context }).await;
        let kind = sink.kind();
        tracing::debug!(
            target: "ankusa::dispatch",
            kind,
            ordered,
            tenant = attempt.id.ordinal,
            seq = attempt.id.seq,
            sink = attempt.id.sink,
            outcome = outcome.label(),
            "attempt finished"
        );
        metrics::histogram!("ankusa_dispatch_attempt_seconds", "kind" => kind)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("ankusa_dispatch_attempts_total", "kind" => kind, "outcome" => outcome.label())
            .increment(1);
        core.running.borrow_mut().end(
            attempt.id.ordinal,
            attempt.source,
            attempt.sink,
            attempt.class == Class::Replay,
        );
        core.finished.borrow_mut().push(Finished { attempt, outcome });
        core.shared.wakeups[core.index].notify();
    })
    .detach();
}

/// Writes the buffered outcomes in one batch. On a failed commit they stay buffered and
/// the next round writes them again (their rows are still claimed).
fn flush(core: &Core) {
    let mut finished = std::mem::take(&mut *core.finished.borrow_mut());
    {
        let retired = core.retired.borrow();
        if !retired.is_empty() {
            finished.retain(|finished| !retired.contains(&finished.attempt.id.ordinal));
        }
    }
    if finished.is_empty() {
        return;
    }
    let shared = &core.shared;
    let store = &shared.store;
    let live = follow_reload(core);
    let policy = &live.config.retry;
    let now_ms = clock::now_ms();
    let mut transitions = core.transitions();
    let mut delivered: HashSet<RowId> = HashSet::new();
    let mut hooks_touched: Vec<&Attempt> = Vec::new();
    let mut breaker_changes = Vec::new();
    let mut dead_causes: Vec<(&'static str, &'static str)> = Vec::new();
    // Lane releases read the store: a read that fails leaves the whole flush for later.
    let mut moved: Result<(), crate::store::StoreError> = Ok(());
    for Finished { attempt, outcome } in &finished {
        if moved.is_err() {
            break;
        }
        let id = attempt.id;
        let kind = attempt.target.kind();
        let success = !matches!(outcome, Outcome::Retry { .. });
        let current = attempt.generation == core.breakers_generation.get();
        if let Some(breaker) = current
            .then(|| core.breakers.borrow_mut())
            .as_mut()
            .and_then(|breakers| breakers.get_mut(&(attempt.source, attempt.sink)))
        {
            if let Some(change) = breaker.record(success, attempt.probe, now_ms) {
                breaker_changes.push((attempt.source, attempt.sink, change));
            }
        }
        match outcome {
            Outcome::Delivered => {
                moved = transitions.delivered(id, &attempt.row);
                delivered.insert(id);
                hooks_touched.push(attempt);
            }
            Outcome::Retry {
                reason,
                retry_after,
            } => {
                let mut row = attempt.row.clone();
                row.last_error = reason.clone();
                // Claimed before a reload: the sweep after it did not see this row (it was
                // in flight), so a sink or source the reload removed is checked here rather
                // than when the retry comes due.
                let gone = if current {
                    None
                } else {
                    gone_now(store, &live, id, &row)
                };
                if let Some((cause, gone_reason)) = gone {
                    row.last_error = gone_reason.clone();
                    moved = transitions.dead_from_inflight(id, &row, &gone_reason);
                    dead_causes.push((kind, cause));
                } else if retry::past_horizon(policy, row.first_attempt_at_ms, now_ms) {
                    let reason = format!("horizon: {reason}");
                    row.last_error = reason.clone();
                    moved = transitions.dead_from_inflight(id, &row, &reason);
                    dead_causes.push((kind, "horizon"));
                } else {
                    let due_ms = retry::next_due_ms(
                        policy,
                        now_ms,
                        row.attempts,
                        retry_after.map(|d| d.as_millis() as u64),
                        core.jitter.borrow_mut().next_u64(),
                    );
                    transitions.retry(id, &row, due_ms, attempt.class);
                }
            }
            Outcome::Permanent { reason } => {
                let mut row = attempt.row.clone();
                row.last_error = reason.clone();
                moved = transitions.dead_from_inflight(id, &row, reason);
                dead_causes.push((kind, "permanent"));
            }
        }
    }
    if let Err(error) = moved.and_then(|()| {
        archive_finished(shared, &live, &mut transitions, &delivered, &hooks_touched)
    }) {
        tracing::error!(%error, "cannot read the store to finish the outcomes; retrying the flush");
        core.store_failed.set(true);
        core.finished.borrow_mut().extend(finished);
        return;
    }
    match transitions.commit(false) {
        Ok(()) => {
            for (kind, cause) in dead_causes {
                metrics::counter!("ankusa_dispatch_dead_lettered_total", "kind" => kind, "cause" => cause)
                    .increment(1);
            }
        }
        Err(error) => {
            tracing::error!(%error, outcomes = finished.len(), "outcome flush failed; retrying");
            core.store_failed.set(true);
            core.finished.borrow_mut().extend(finished);
            return;
        }
    }
    for (source, sink, change) in breaker_changes {
        breaker_changed(core, &live, source, sink, change);
    }
}

/// Archives (or, with retention 0, deletes) every touched hook whose last delivery row
/// this flush removes. Only this core moves this tenant's rows, so what the store holds
/// now minus what the flush deletes is what remains.
fn archive_finished(
    shared: &DispatchShared,
    live: &Live,
    transitions: &mut Transitions<'_>,
    delivered: &HashSet<RowId>,
    hooks_touched: &[&Attempt],
) -> Result<(), crate::store::StoreError> {
    // By tenant, then seq: each tenant's hooks are read with one iterator per run.
    let hooks: BTreeMap<(u32, u64), &Attempt> = hooks_touched
        .iter()
        .map(|attempt| ((attempt.id.ordinal, attempt.id.seq), *attempt))
        .collect();
    let mut remaining: HashSet<(u32, u64)> = HashSet::new();
    let mut hooks_left = hooks.keys().copied().peekable();
    while let Some(&(ordinal, _)) = hooks_left.peek() {
        let mut seqs = Vec::new();
        while let Some((_, seq)) = hooks_left.next_if(|&(of, _)| of == ordinal) {
            seqs.push(seq);
        }
        for (seq, sink) in deliveries::rows_of_hooks(&shared.store, ordinal, &seqs)? {
            if !delivered.contains(&RowId { ordinal, seq, sink }) {
                remaining.insert((ordinal, seq));
            }
        }
    }
    for (&(ordinal, seq), attempt) in &hooks {
        if remaining.contains(&(ordinal, seq)) {
            continue;
        }
        if live.config.archive.retention_ms == 0 {
            transitions.delete_hook(ordinal, seq);
        } else {
            transitions.archive_hook(ordinal, seq, attempt.received_at_ms, &attempt.stored);
        }
    }
    Ok(())
}

/// Logs and counts a breaker's change, and publishes the core's breakers that are not
/// closed (`DispatchShared::breakers`): a change of state is the only time they are.
fn breaker_changed(core: &Core, live: &Live, source: usize, sink: usize, change: Change) {
    let kind = live.sinks[source][sink].kind();
    let source_id = &live.config.sources[source].id;
    let sink_id = &live.config.sources[source].sinks[sink].id;
    let open_ms = live.config.dispatch.breaker_open_ms;
    let open_breakers = metrics::gauge!("ankusa_dispatch_breakers_open");
    match change {
        Change::Opened => {
            tracing::warn!(source = %source_id, sink = %sink_id, open_ms, "breaker opened; parking the sink's rows");
            metrics::counter!("ankusa_dispatch_breaker_opens_total", "kind" => kind).increment(1);
            open_breakers.increment(1.0);
        }
        Change::Reopened => {
            tracing::warn!(source = %source_id, sink = %sink_id, open_ms, "breaker probe failed; open again");
        }
        Change::HalfOpened => {
            tracing::info!(source = %source_id, sink = %sink_id, "breaker half-open; sending one probe");
        }
        Change::Closed => {
            tracing::info!(source = %source_id, sink = %sink_id, "breaker closed");
            open_breakers.decrement(1.0);
        }
    }
    publish_breakers(core, live);
}

/// Replaces this core's slot of `DispatchShared::breakers` with its breakers that are not
/// closed, by source and sink id. `live` is the config the breakers were made for.
fn publish_breakers(core: &Core, live: &Live) {
    let mut open: Vec<OpenBreaker> = core
        .breakers
        .borrow()
        .iter()
        .filter_map(|(&(source, sink), breaker)| {
            let view = breaker.view()?;
            let entry = live.config.sources.get(source)?;
            Some(OpenBreaker {
                core: core.index,
                source: entry.id.clone(),
                sink: entry.sinks.get(sink)?.id.clone(),
                kind: live.sinks.get(source)?.get(sink)?.kind(),
                view,
            })
        })
        .collect();
    open.sort_by(|a, b| (&a.source, &a.sink).cmp(&(&b.source, &b.sink)));
    core.shared.breakers.publish(core.index, open);
}

/// Removes archive entries past retention: per tenant, one seek to see whether anything
/// expired, then one range delete — live data is never scanned.
fn sweep_archive(shared: &DispatchShared, live: &Live) {
    let retention_ms = live.config.archive.retention_ms;
    if retention_ms == 0 {
        return;
    }
    let store = &shared.store;
    let cutoff_ms = clock::now_ms().saturating_sub(retention_ms);
    let tenants = match store.tenants() {
        Ok(tenants) => tenants,
        Err(error) => {
            tracing::error!(%error, "archive sweep: cannot list tenants");
            return;
        }
    };
    let mut transitions = Transitions::new(store);
    for (_, ordinal) in tenants {
        let (start, end) = crate::store::keys::archive_before(ordinal, cutoff_ms);
        match store.first(crate::store::CF_ARCHIVE, &start, &end) {
            Ok(Some(_)) => transitions.expire_archive(ordinal, cutoff_ms),
            Ok(None) => {}
            Err(error) => tracing::error!(%error, "archive sweep failed"),
        }
    }
    if let Err(error) = transitions.commit(false) {
        tracing::error!(%error, "archive sweep failed");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rocksdb::perf::PerfMetric;

    use crate::store::deliveries::Ingest;
    use crate::store::{Store, WriteBatch};

    /// Commits one hook of `source` (tenant `tenant`) with `body` per `(seq, due_ms)`,
    /// each with one delivery row to `sink_id`, as the writer does.
    fn ingest_hooks(
        store: &Store,
        ordinal: u32,
        (source, tenant): (&str, &str),
        sink_id: &str,
        body: &[u8],
        hooks: impl IntoIterator<Item = (u64, u64)>,
    ) {
        let mut hook = Vec::new();
        HookRecord {
            source_id: source.into(),
            tenant_id: tenant.into(),
            received_at_ms: 10,
            dedupe_key: Vec::new(),
            headers: Vec::new(),
            body: body.to_vec(),
        }
        .encode(&mut hook);
        let mut batch = WriteBatch::default();
        let mut ingest = Ingest::new();
        let mut last_seq = 0;
        for (seq, due_ms) in hooks {
            ingest.add(
                store,
                &mut batch,
                ordinal,
                seq,
                &hook,
                &[sink_id],
                &[],
                4,
                due_ms,
                Class::Live,
            );
            last_seq = last_seq.max(seq);
        }
        let gauges = ingest.seal(store, &mut batch, last_seq);
        store.write(batch, false).unwrap();
        store.gauges().apply(&gauges);
    }

    /// Claims hook `seq`'s row to sink 0 and delivers it, as the pipeline does.
    fn deliver(store: &Store, ordinal: u32, seq: u64) {
        let id = RowId {
            ordinal,
            seq,
            sink: 0,
        };
        let row = DeliveryRow::decode(&deliveries::read_row(store, id).unwrap().unwrap()).unwrap();
        let mut transitions = Transitions::new(store);
        transitions.claim(id, 10, DueKind::FirstAttempt, &row, 11);
        transitions.commit(false).unwrap();
        let mut transitions = Transitions::new(store);
        transitions.delivered(id, &row).unwrap();
        transitions.commit(false).unwrap();
    }

    /// One pipeline core's shared state for the quickstart config, with no sink built: for
    /// tests that run no attempt.
    fn quickstart_shared(store: &Store) -> Arc<DispatchShared> {
        let config = crate::config::parse(crate::config::QUICKSTART_YAML).unwrap();
        let tenants = crate::tenants::Tenants::open(store, &config).unwrap();
        let live = Live::new(
            Arc::new(config),
            vec![Vec::new(), Vec::new()],
            &tenants.snapshot(),
        );
        Arc::new(DispatchShared::new(
            store.clone(),
            Arc::new(crate::published::Published::new(live)),
            "test".into(),
            1,
        ))
    }

    /// Pipeline core 0 of one for `config`, whose one source has one HTTP sink (built, so
    /// a claim can start its attempt; none runs unless the test awaits it).
    fn http_core(store: &Store, config: crate::config::Config) -> Rc<Core> {
        let crate::config::SinkKind::Http(http) = &config.sources[0].sinks[0].kind else {
            unreachable!("the config declares an http sink");
        };
        let pool = shards::BlockingPool::new("test-sink", 1, &[]).unwrap();
        let sink: Arc<dyn Sink> = Arc::new(crate::sink::http::HttpSink::new(
            &config.sources[0].sinks[0].id,
            http,
            pool,
        ));
        let tenants = crate::tenants::Tenants::open(store, &config).unwrap();
        let live = Live::new(Arc::new(config), vec![vec![sink]], &tenants.snapshot());
        let shared = Arc::new(DispatchShared::new(
            store.clone(),
            Arc::new(crate::published::Published::new(live)),
            "test".into(),
            1,
        ));
        Rc::new(Core::new(shared, 0))
    }

    /// Due keys a visit steps over because they were deleted (claimed), counted by RocksDB.
    fn deleted_keys_stepped_over(visit: impl FnOnce()) -> u64 {
        crate::store::perf_count(&[PerfMetric::InternalDeleteSkippedCount], visit)
    }

    /// A tenant whose every sink is at its concurrency claims nothing, and its visit ends
    /// early; it must still keep its place. Otherwise, once the cursor is dropped (the
    /// periodic reset), every round seeks from the start of the tenant's due keys again,
    /// over every key claimed since the last memtable flush: milliseconds per round under
    /// load, spent while the sink waits for room.
    #[test]
    fn a_visit_at_a_full_sink_keeps_its_place() {
        const CLAIMED: u64 = 3000;
        const WAITING: u64 = 200;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let config = crate::config::parse(
            "tenants: [{id: t}]\nsources:\n  - id: s\n    tenant: t\n    sinks:\n      \
             - {kind: http, url: 'http://127.0.0.1:9/in'}\n",
        )
        .unwrap();
        let ordinal = store.ensure_tenants(["t"]).unwrap()[0].1;
        ingest_hooks(
            &store,
            ordinal,
            ("s", "t"),
            "http",
            b"{}",
            (1..=CLAIMED + WAITING).map(|seq| (seq, 10 + seq / 16)),
        );
        // The first rows are claimed, leaving their due keys deleted in the memtable.
        let mut transitions = Transitions::new(&store);
        for seq in 1..=CLAIMED {
            let id = RowId {
                ordinal,
                seq,
                sink: 0,
            };
            let row =
                DeliveryRow::decode(&deliveries::read_row(&store, id).unwrap().unwrap()).unwrap();
            transitions.claim(id, 10 + seq / 16, DueKind::FirstAttempt, &row, 100);
        }
        transitions.commit(false).unwrap();

        let concurrency = config.dispatch.sink_concurrency;
        let core = http_core(&store, config);
        for _ in 0..concurrency {
            core.running.borrow_mut().start(ordinal, 0, 0, false);
        }
        let live = core.live.get();

        // No cursor yet (a start, or the reset): the first visit seeks over every claim.
        let first = deleted_keys_stepped_over(|| {
            assert_eq!(visit(&core, &live, ordinal, false).unwrap(), 0);
        });
        assert!(
            first >= CLAIMED,
            "the first seek stepped over {first} claimed keys"
        );
        for round in 1..=3 {
            let again = deleted_keys_stepped_over(|| {
                assert_eq!(visit(&core, &live, ordinal, false).unwrap(), 0);
            });
            assert!(
                again < 64,
                "visit {round} at a full sink stepped over {again} claimed keys again"
            );
        }
        // Its place is the oldest waiting row, which a visit with room then claims.
        let oldest_waiting_ms = 10 + (CLAIMED + 1) / 16;
        assert_eq!(
            core.cursors.borrow().get(&ordinal),
            Some(&oldest_waiting_ms)
        );
        assert_eq!(core.oldest_due_ms.get(), oldest_waiting_ms);
    }

    /// A visit reads the rows and hooks it claims with one batched lookup per family. Under
    /// a backlog they are in table files, where a get per row and per hook would touch a
    /// data block each (two per claim); batched, consecutive rows and hooks share theirs.
    #[test]
    fn a_visit_reads_the_rows_and_hooks_it_claims_in_batches() {
        const HOOKS: u64 = 100;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let config = crate::config::parse(
            "dispatch: {sink_concurrency: 128}\ntenants: [{id: t}]\nsources:\n  - id: s\n    \
             tenant: t\n    sinks:\n      - {kind: http, url: 'http://127.0.0.1:9/in'}\n",
        )
        .unwrap();
        let ordinal = store.ensure_tenants(["t"]).unwrap()[0].1;
        let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(1000));
        ingest_hooks(
            &store,
            ordinal,
            ("s", "t"),
            "http",
            body.as_bytes(),
            (1..=HOOKS).map(|seq| (seq, 10)),
        );
        store.flush().unwrap();
        let core = http_core(&store, config);
        let live = core.live.get();

        let executor = glommio::LocalExecutorBuilder::default().make().unwrap();
        let blocks = executor.run(async {
            crate::store::blocks_touched(|| {
                assert_eq!(visit(&core, &live, ordinal, false).unwrap(), HOOKS as usize);
            })
        });
        assert!(
            blocks < HOOKS,
            "claiming {HOOKS} hooks from a table file touched {blocks} blocks; \
             a read per row and per hook touches at least {}",
            2 * HOOKS
        );
    }

    /// A tenant with nothing due or claimed keeps its active marker for `RETIRE_IDLE_AFTER`.
    /// A tenant whose sink keeps up is drained in most rounds; were its marker removed each
    /// time (and put back by the writer's next batch), every round would pay a commit and a
    /// seek over the due family's tombstones. A claimed row keeps the marker however long
    /// the tenant has been idle; past the delay, an idle tenant's marker goes.
    #[test]
    fn an_idle_tenant_keeps_its_marker_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let ordinal = store.ensure_tenants(["demo"]).unwrap()[0].1;
        ingest_hooks(&store, ordinal, ("demo", "demo"), "http", b"{}", [(1, 10)]);
        // The hook is delivered: nothing is due or claimed, the marker stays from ingest.
        deliver(&store, ordinal, 1);
        assert_eq!(deliveries::active_tenants(&store).unwrap(), [ordinal]);

        let shared = quickstart_shared(&store);
        let core = Core::new(shared, 0);
        core.active.borrow_mut().insert(ordinal);
        let live = core.live.get();
        let held = |core: &Core| {
            core.active.borrow().contains(&ordinal)
                && deliveries::active_tenants(&store).unwrap() == [ordinal]
        };
        let long_ago = Instant::now() - RETIRE_IDLE_AFTER * 2;

        // Drained round after drained round within the delay: the marker stays.
        for _ in 0..5 {
            retire_if_idle(&core, &live, ordinal).unwrap();
            assert!(held(&core));
        }
        // An attempt running: idle for however long before, the marker stays and the idle
        // time starts over.
        core.idle_since.borrow_mut().insert(ordinal, long_ago);
        core.running.borrow_mut().start(ordinal, 0, 0, false);
        retire_if_idle(&core, &live, ordinal).unwrap();
        assert!(held(&core));
        assert!(core.idle_since.borrow().is_empty());
        core.running.borrow_mut().end(ordinal, 0, 0, false);

        // Idle past the delay: the marker is removed from the store and the rounds.
        retire_if_idle(&core, &live, ordinal).unwrap();
        assert!(held(&core));
        core.idle_since.borrow_mut().insert(ordinal, long_ago);
        retire_if_idle(&core, &live, ordinal).unwrap();
        assert!(!core.active.borrow().contains(&ordinal));
        assert_eq!(
            deliveries::active_tenants(&store).unwrap(),
            Vec::<u32>::new()
        );
        assert!(core.idle_since.borrow().is_empty());
    }

    /// A purge that raced a delivery can leave a hook with no row; the owner core deletes
    /// it when asked, and leaves a hook that still has rows alone.
    #[test]
    fn a_hook_check_deletes_only_a_hook_without_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let ordinals = store.ensure_tenants(["demo"]).unwrap();
        let ordinal = ordinals[0].1;
        ingest_hooks(
            &store,
            ordinal,
            ("demo", "demo"),
            "http",
            b"{}",
            [(1, 10), (2, 10)],
        );
        // Hook 1 loses its only row the way a delivery does; hook 2 keeps its row.
        deliver(&store, ordinal, 1);

        let shared = quickstart_shared(&store);
        shared.check_hooks(ordinal, &[1, 2]);
        check_hooks(&Core::new(shared, 0));
        assert!(deliveries::read_hook(&store, ordinal, 1).unwrap().is_none());
        assert!(deliveries::read_hook(&store, ordinal, 2).unwrap().is_some());
        let report = crate::store::verify::verify(&store).unwrap();
        assert!(
            report.clean(),
            "{:?} {:?}",
            report.problems,
            report.repairable
        );
    }
}
