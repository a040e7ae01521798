//! The admin API's work on the store: list, revive and purge the dead-letter queue, replay
//! the archive, read the counters.
//!
//! Everything here blocks — RocksDB reads, commits with `sync`, waits for the writer's
//! acks — so it never runs on an executor: the admin listener runs the quick requests on
//! the admin `BlockingPool` (one thread) and the jobs (an archive replay, a revive of a
//! selection), which can run for minutes under their budget, on the jobs pool (one thread,
//! one job at a time), so a replay never holds up a listing or a one-row revive.
//!
//! Two operations can therefore run at once, and some read what they then move: a revive
//! or purge reads a dead row, then moves it; interleaved, two of them could both count
//! (and both move) one row. Each such read-then-move is one step under
//! [`Operations::lock_moves`]: the step reads its rows again under the lock (a scan made
//! before it, or before a budget's sleep, is only a candidate list) and commits before it
//! lets go. The pipeline never moves a dead row, so nothing else races them for `?X` keys.
//!
//! Rows move only through `store::deliveries::Transitions`, committed in batches of at
//! most [`COMMIT_ROWS_MAX`] rows with `sync`: an operator's revive or purge is durable
//! when it is answered. An archive replay takes the ingest path: each hook becomes a new
//! `Envelope` for the writer, which gives it a new seq and one delivery row per sink its
//! source has now.
//!
//! A replay and a revive of more than one row go through the tenant's replay budget
//! ([`super::budget`]): they inject in small batches at `replay_rate_per_s` and wait while
//! `replay_max_pending` of their own rows have not been through their first attempt, so
//! live hooks never queue behind the whole of them. The waits are sleeps on the job's
//! thread, in short naps that check the stop flag, and never hold the move lock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::ack::{Ack, AckOutcome};
use crate::clock;
use crate::edge::resolve::{self, JsonScratch};
use crate::live::Live;
use crate::published::Published;
use crate::store::codec::{DeliveryRow, HookRecord};
use crate::store::deliveries::{self, Class, DeadRow, RowId, Transitions};
use crate::store::{Store, StoreError};
use crate::tenants::Tenants;
use crate::writer::{Envelope, EnvelopeKind, WriterHandle};

use super::api::{
    ApiError, Cursor, DlqItem, DlqPage, DlqQuery, Purged, ReplayRequest, Replayed, Revived,
    Selector, Stats, TenantStats,
};
use super::budget::{Budget, Grant, Limits};
use super::jobs::{Job, Jobs};

/// Rows per committed batch of a revive or purge: bounded, so a huge DLQ moves in steps
/// and a stop can interrupt between them.
const COMMIT_ROWS_MAX: usize = 1024;
/// A DLQ page examines at most this many keys per row it may return, so a filter that
/// matches little cannot turn one page into a scan of the whole queue; the client pages
/// on with the cursor.
const LIST_SCAN_FACTOR: usize = 10;
/// Hooks submitted to the writer before the replay waits for their acks. It bounds how
/// much of the writer's channel a replay takes from live ingest.
const REPLAY_BATCH_HOOKS: usize = 256;
/// Bytes of hook records one replay batch holds in memory.
const REPLAY_BATCH_BYTES: usize = 8 << 20;
/// The longest sleep of a job held back by its budget: the stop flag is checked after each.
const BUDGET_NAP_MAX: Duration = Duration::from_millis(50);

/// What the admin's blocking operations need, shared by the admin pool and the jobs pool.
pub struct Operations {
    pub(super) store: Store,
    /// The running config; a reload replaces it.
    pub(super) live: Arc<Published<Live>>,
    /// Where a reload reads its config from, and the pool its new sinks run on.
    pub(super) reload: ReloadSource,
    /// Every tenant, declared or auto.
    pub(super) tenants: Arc<Tenants>,
    /// The replay's way into the writer. Taken away at shutdown
    /// ([`Operations::release_writer`]): the writer stops only when every handle is gone.
    writer: Mutex<Option<WriterHandle>>,
    /// What the operations ask of the pipeline cores.
    pub(super) pipeline: PipelineLink,
    /// Checked between batches: a long revive or replay stops promptly at SIGTERM.
    shutdown: shards::Shutdown,
    /// Held around each read-then-move of rows that only the admin moves (dead rows,
    /// quarantined hooks, a purged tenant's counters): see [`Operations::lock_moves`].
    moves: Mutex<()>,
    /// The replays and revives, running and recent, with their progress.
    pub(crate) jobs: Jobs,
}

/// `check_hooks(ordinal, seqs)`: see [`PipelineLink::check_hooks`].
pub type CheckHooks = Box<dyn Fn(u32, &[u64]) + Send + Sync>;

/// What a reload needs besides the running config.
#[derive(Debug)]
pub struct ReloadSource {
    /// The file `serve` was started with; `None` for the embedded quickstart config,
    /// which has nothing to re-read.
    pub path: Option<std::path::PathBuf>,
    /// Where the new config's sinks run (fixed for the process).
    pub sink_runtimes: crate::sink::SinkRuntimes,
}

/// The admin's calls into the pipeline cores (the only movers of pending rows).
pub struct PipelineLink {
    /// Tells the pipeline cores that due rows were put (a revive), so their scan cursors
    /// move back to them.
    pub notify_inserted: Box<dyn Fn(u64) + Send + Sync>,
    /// Hands the pipeline hooks whose dead rows a purge removed while live rows remained:
    /// if the pipeline delivered those at the same moment, neither side saw the hook's
    /// last row go, and only the pipeline (the mover of live rows) can decide it.
    pub check_hooks: CheckHooks,
    /// Makes the pipeline stop moving a tenant for good (a tenant purge); true once its
    /// core confirmed.
    pub retire: Box<dyn Fn(u32) -> bool + Send + Sync>,
    /// The pipeline cores' breakers that are not closed, as they publish them.
    pub breakers: Arc<crate::dispatch::BreakerBoard>,
}

impl std::fmt::Debug for Operations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operations")
            .field("store", &self.store)
            .field("tenants", &self.tenants.snapshot().len())
            .finish_non_exhaustive()
    }
}

impl Operations {
    pub fn new(
        store: Store,
        live: Arc<Published<Live>>,
        reload: ReloadSource,
        tenants: Arc<Tenants>,
        writer: WriterHandle,
        pipeline: PipelineLink,
        shutdown: shards::Shutdown,
    ) -> Operations {
        Operations {
            store,
            live,
            reload,
            tenants,
            writer: Mutex::new(Some(writer)),
            pipeline,
            shutdown,
            moves: Mutex::new(()),
            jobs: Jobs::new(),
        }
    }

    /// Whether the gateway is stopping: a job that has not started yet does not start.
    pub(super) fn stop_requested(&self) -> bool {
        self.shutdown.requested()
    }

    /// The admin's move lock. Jobs run on their own thread beside the quick requests, so
    /// two operations can work at once; every operation that reads what it then moves —
    /// a dead row it revives or purges, a quarantined hook it releases or deletes, the
    /// counters a tenant purge takes off the node — reads it again and commits under this
    /// lock, so two of them never both count or move one row. Held for one batch (its
    /// reads and its commit, or a release's wait for the writer), never across a budget's
    /// sleep.
    pub(super) fn lock_moves(&self) -> std::sync::MutexGuard<'_, ()> {
        // Guards no data: a panic while holding it leaves nothing half-changed in memory.
        self.moves.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a dead row is now: `None` when it is no longer dead (another operation
    /// revived or purged it since it was scanned), `Some(None)` when it is dead but its
    /// delivery row is missing or undecodable. Read under [`Operations::lock_moves`].
    fn dead_now(&self, id: RowId) -> Result<Option<Option<DeliveryRow>>, StoreError> {
        if deliveries::dead_reason(&self.store, id)?.is_none() {
            return Ok(None);
        }
        Ok(Some(
            deliveries::read_row(&self.store, id)?
                .and_then(|bytes| DeliveryRow::decode(&bytes).ok()),
        ))
    }

    /// One reading of the breakers that are not closed (see [`super::breakers`]).
    pub(super) fn breakers(&self) -> super::breakers::Breakers<'_> {
        super::breakers::Breakers::read(&self.pipeline.breakers, &self.live.load())
    }

    /// Drops the admin's writer handle, so the writer can stop. A replay running now
    /// keeps its own clone until it has its acks.
    pub fn release_writer(&self) {
        self.lock_writer().take();
    }

    /// The writer, unless the gateway is stopping.
    pub(super) fn writer_handle(&self) -> Result<WriterHandle, ApiError> {
        self.lock_writer().clone().ok_or_else(stopping)
    }

    fn lock_writer(&self) -> std::sync::MutexGuard<'_, Option<WriterHandle>> {
        // Nothing panics while holding the lock (it only moves a handle).
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ordinal(&self, tenant: &str) -> Result<u32, ApiError> {
        self.tenants
            .snapshot()
            .get(tenant)
            .map(|tenant| tenant.ordinal)
            .ok_or_else(|| ApiError::unknown_tenant(tenant))
    }

    /// One page of a tenant's DLQ in (seq, sink) order.
    pub fn list_dead(&self, query: &DlqQuery) -> Result<DlqPage, ApiError> {
        let ordinal = self.ordinal(&query.tenant)?;
        let filter = Filter {
            source: query.source.as_deref(),
            sink: query.sink.as_deref(),
        };
        let examine_max = query.limit.saturating_mul(LIST_SCAN_FACTOR);
        let mut heads = HookHeads::default();
        let mut items = Vec::new();
        let mut examined = 0usize;
        let mut last: Option<Cursor> = None;
        let mut next = None;
        let after = query.after.map(|cursor| (cursor.seq, cursor.sink));
        deliveries::dead_rows(&self.store, ordinal, after, |dead| {
            // Stopping only once another key exists means `next` is null exactly when the
            // queue has nothing past this page.
            if items.len() == query.limit || examined == examine_max {
                next = last;
                return Ok(false);
            }
            examined += 1;
            last = Some(Cursor {
                seq: dead.id.seq,
                sink: dead.id.sink,
            });
            let detail = Detail::load(&self.store, &mut heads, dead, true)?;
            let reason_ok = query
                .reason
                .as_deref()
                .is_none_or(|reason| detail.dead.reason.contains(reason));
            if reason_ok && filter.matches(&detail) {
                items.push(detail.into_item(&query.tenant));
            }
            Ok(true)
        })?;
        Ok(DlqPage {
            items,
            next: next.map(|cursor| cursor.to_string()),
        })
    }

    /// `?X` → `?D` for every selected row: each becomes a new first attempt, due now. The
    /// job learns the selection's size first, then each committed batch.
    pub fn revive(&self, selector: &Selector, job: &Job) -> Result<Revived, ApiError> {
        job.set_total(self.count_selected(selector)?);
        let mut revived = 0u64;
        let mut skipped = 0u64;
        // One row is an operator's deliberate fix and goes at once; a selection goes
        // through its tenant's budget (a new one when `all` moves to the next tenant).
        let budgeted = !matches!(selector, Selector::Row { .. });
        let mut budget: Option<(u32, Budget<RowId>)> = None;
        self.each_selected_batch(selector, |ordinal, mut details| {
            while !details.is_empty() {
                let take = if budgeted {
                    if budget.as_ref().is_some_and(|(owner, _)| *owner != ordinal) {
                        budget = None;
                    }
                    let (_, budget) = budget.get_or_insert_with(|| {
                        let limits = self.replay_limits(ordinal);
                        (ordinal, Budget::new(limits, Instant::now()))
                    });
                    let granted =
                        self.wait_for_budget(budget, ordinal, "dlq_revive", details.len(), |id| {
                            self.row_waits(*id)
                        })?;
                    match granted {
                        Some(take) => take,
                        // Stopping: the rows not taken stay dead.
                        None => return Ok(()),
                    }
                } else {
                    details.len()
                };
                let chunk: Vec<Detail> = details.drain(..take.min(details.len())).collect();
                let rows = chunk.len() as u64;
                // The scan read these rows without the lock (and the budget may have slept
                // since): under it each is read again, and one another operation moved
                // meanwhile is neither revived nor skipped.
                let moves = self.lock_moves();
                let now_ms = clock::now_ms();
                let mut transitions = Transitions::new(&self.store);
                let mut chunk_revived = Vec::with_capacity(chunk.len());
                // A selection's rows wait in the replay class, beside live ones.
                let class = if budgeted { Class::Replay } else { Class::Live };
                for detail in chunk {
                    match self.dead_now(detail.dead.id)? {
                        Some(Some(row)) => {
                            transitions.revive(detail.dead.id, &row, now_ms, class);
                            chunk_revived.push(detail.dead.id);
                        }
                        Some(None) => skipped += 1,
                        None => {}
                    }
                }
                transitions.commit(true)?;
                drop(moves);
                if !chunk_revived.is_empty() {
                    (self.pipeline.notify_inserted)(now_ms);
                }
                revived += chunk_revived.len() as u64;
                if let Some((_, budget)) = &mut budget {
                    budget.spend(chunk_revived);
                }
                job.add_done(rows);
            }
            Ok(())
        })?;
        if revived > 0 || skipped > 0 {
            tracing::info!(?selector, revived, skipped, "dead rows revived");
        }
        Ok(Revived { revived, skipped })
    }

    /// `?X` → gone for every selected row, and a hook whose last delivery row that was is
    /// deleted with it (a hook without rows would never be archived nor deleted). The job
    /// learns the selection's size first, then each committed batch.
    pub fn purge(&self, selector: &Selector, job: &Job) -> Result<Purged, ApiError> {
        job.set_total(self.count_selected(selector)?);
        let mut purged = 0u64;
        let mut hooks_deleted = 0u64;
        self.each_selected_batch(selector, |ordinal, details| {
            // Under the lock, only the rows still dead (a revive may have taken some since
            // the scan), and what remains of their hooks read then.
            let moves = self.lock_moves();
            let mut transitions = Transitions::new(&self.store);
            let mut purged_of_hook: HashMap<u64, HashSet<u16>> = HashMap::new();
            let mut batch_purged = 0u64;
            for detail in &details {
                let id = detail.dead.id;
                if deliveries::dead_reason(&self.store, id)?.is_none() {
                    continue;
                }
                transitions.purge_dead(id);
                purged_of_hook.entry(id.seq).or_default().insert(id.sink);
                batch_purged += 1;
            }
            // What the store holds minus what this batch deletes is what remains. Rows of
            // one hook are adjacent in the DLQ, so a hook split over two batches is
            // deleted by the second.
            let mut deleted = 0;
            let mut with_live_rows = Vec::new();
            for (seq, slots) in &purged_of_hook {
                let remaining = deliveries::rows_of_hook(&self.store, ordinal, *seq)?
                    .into_iter()
                    .filter(|sink| !slots.contains(sink))
                    .count();
                if remaining == 0 {
                    transitions.delete_hook(ordinal, *seq);
                    deleted += 1;
                } else {
                    with_live_rows.push(*seq);
                }
            }
            transitions.commit(true)?;
            drop(moves);
            if !with_live_rows.is_empty() {
                (self.pipeline.check_hooks)(ordinal, &with_live_rows);
            }
            purged += batch_purged;
            hooks_deleted += deleted;
            job.add_done(details.len() as u64);
            Ok(())
        })?;
        if purged > 0 {
            tracing::info!(?selector, purged, hooks_deleted, "dead rows purged");
        }
        Ok(Purged {
            purged,
            hooks_deleted,
        })
    }

    /// How many dead rows `selector` takes now: a job's total.
    fn count_selected(&self, selector: &Selector) -> Result<u64, ApiError> {
        let mut selected = 0u64;
        self.each_selected_batch(selector, |_, details| {
            selected += details.len() as u64;
            Ok(())
        })?;
        Ok(selected)
    }

    /// Calls `apply(ordinal, rows)` with the selected dead rows, at most
    /// [`COMMIT_ROWS_MAX`] at a time, each batch of one tenant. `apply` commits them, so
    /// the scan after it starts past rows that are gone.
    fn each_selected_batch(
        &self,
        selector: &Selector,
        mut apply: impl FnMut(u32, Vec<Detail>) -> Result<(), ApiError>,
    ) -> Result<(), ApiError> {
        let (ordinals, filter) = match selector {
            Selector::Row { tenant, seq, sink } => {
                let ordinal = self.ordinal(tenant)?;
                let rows = self.select_row(ordinal, *seq, sink)?;
                if !rows.is_empty() {
                    apply(ordinal, rows)?;
                }
                return Ok(());
            }
            Selector::Matching {
                tenant,
                source,
                sink,
            } => (
                vec![self.ordinal(tenant)?],
                Filter {
                    source: source.as_deref(),
                    sink: sink.as_deref(),
                },
            ),
            Selector::All => (
                self.tenants
                    .snapshot()
                    .list()
                    .iter()
                    .map(|tenant| tenant.ordinal)
                    .collect(),
                Filter::default(),
            ),
        };
        // Only a source filter needs the hook; a revive or purge needs the row.
        let need_hook = filter.source.is_some();
        for ordinal in ordinals {
            let mut after = None;
            loop {
                if self.shutdown.requested() {
                    tracing::warn!(
                        ?selector,
                        "stopping: the rest of the selection is untouched"
                    );
                    return Ok(());
                }
                let mut heads = HookHeads::default();
                let mut batch = Vec::new();
                let mut last = None;
                let mut more = false;
                deliveries::dead_rows(&self.store, ordinal, after, |dead| {
                    if batch.len() == COMMIT_ROWS_MAX {
                        more = true;
                        return Ok(false);
                    }
                    last = Some((dead.id.seq, dead.id.sink));
                    let detail = Detail::load(&self.store, &mut heads, dead, need_hook)?;
                    if filter.matches(&detail) {
                        batch.push(detail);
                    }
                    Ok(true)
                })?;
                if !batch.is_empty() {
                    apply(ordinal, batch)?;
                }
                if !more {
                    break;
                }
                after = last;
            }
        }
        Ok(())
    }

    /// The dead row of hook `seq` whose sink id is `sink_id` (none when it is not dead).
    fn select_row(&self, ordinal: u32, seq: u64, sink_id: &str) -> Result<Vec<Detail>, ApiError> {
        let mut heads = HookHeads::default();
        let mut selected = Vec::new();
        for sink in deliveries::rows_of_hook(&self.store, ordinal, seq)? {
            let id = RowId { ordinal, seq, sink };
            let Some(reason) = deliveries::dead_reason(&self.store, id)? else {
                continue;
            };
            let detail = Detail::load(&self.store, &mut heads, DeadRow { id, reason }, false)?;
            if detail
                .row
                .as_ref()
                .is_some_and(|row| row.sink_id == sink_id)
            {
                selected.push(detail);
            }
        }
        Ok(selected)
    }

    /// Submits the tenant's archived hooks of one source received in `[from_ms, to_ms)` to
    /// the writer as new hooks, and waits until each is committed.
    ///
    /// Each replayed hook is received anew: it gets a new seq, the current time as its
    /// `received_at` (so retention and a later replay by time count from the replay) and
    /// one delivery row per sink its source has now. Hooks archived after the replay
    /// started are left out, so a range reaching into the present never replays what the
    /// replay itself produced.
    ///
    /// The job learns how many entries of the source the range holds first, then each
    /// batch handed over and stored.
    pub fn replay(&self, request: &ReplayRequest, job: &Job) -> Result<Replayed, ApiError> {
        let ordinal = self.ordinal(&request.tenant)?;
        let live = self.live.load();
        let source_index = live.source_serving(&request.source, &request.tenant);
        let writer = match source_index {
            Some(_) => Some(self.writer_handle()?),
            None => None,
        };
        let last_seq_before = self.store.last_seq()?;
        job.set_total(self.count_archived(ordinal, request, last_seq_before)?);
        let mut replayed = 0u64;
        let mut skipped = 0u64;
        let mut after = None;
        // Tracks the new hooks by seq: a hook waits while one of its rows does.
        let mut budget: Budget<u64> = Budget::new(self.replay_limits(ordinal), Instant::now());
        loop {
            let granted = self.wait_for_budget(
                &mut budget,
                ordinal,
                "archive_replay",
                REPLAY_BATCH_HOOKS,
                |seq| self.hook_waits(ordinal, *seq),
            )?;
            let Some(batch_hooks) = granted else {
                tracing::warn!(
                    replayed,
                    "stopping an archive replay: the rest is not replayed"
                );
                break;
            };
            let mut hooks = Vec::new();
            let mut bytes = 0usize;
            let mut last = None;
            let mut more = false;
            deliveries::archived_hooks(
                &self.store,
                ordinal,
                request.from_ms,
                request.to_ms,
                after,
                |entry| {
                    if hooks.len() >= batch_hooks || bytes >= REPLAY_BATCH_BYTES {
                        more = true;
                        return Ok(false);
                    }
                    last = Some((entry.received_at_ms, entry.seq));
                    if entry.seq > last_seq_before {
                        return Ok(true);
                    }
                    match HookRecord::decode(entry.hook) {
                        Ok(hook) if hook.source_id == request.source => {
                            bytes += entry.hook.len();
                            hooks.push(hook);
                        }
                        Ok(_) => {}
                        Err(error) => {
                            if error.is_corrupt() {
                                metrics::counter!("ankusa_integrity_failures_total", "stage" => "replay")
                                    .increment(1);
                            }
                            tracing::warn!(%error, seq = entry.seq, "archive entry is undecodable; not replayed");
                            skipped += 1;
                            job.add_done(1);
                        }
                    }
                    Ok(true)
                },
            )?;
            let handled = hooks.len() as u64;
            match (&writer, source_index) {
                (Some(writer), Some(index)) => {
                    let sink_ids = live.sink_ids[index].clone();
                    let source = &live.config.sources[index];
                    let seqs =
                        self.submit_all(writer, ordinal, source, &sink_ids, hooks, replayed)?;
                    replayed += seqs.len() as u64;
                    budget.spend(seqs);
                }
                _ => skipped += handled,
            }
            job.add_done(handled);
            if !more {
                break;
            }
            after = last;
        }
        tracing::info!(
            tenant = %request.tenant,
            source = %request.source,
            from_ms = request.from_ms,
            to_ms = request.to_ms,
            replayed,
            skipped,
            "archive replayed"
        );
        Ok(Replayed { replayed, skipped })
    }

    /// How many archive entries a replay of `request` will handle: those of its source
    /// (and the undecodable ones, which it skips) received in the range and stored before
    /// the replay started.
    fn count_archived(
        &self,
        ordinal: u32,
        request: &ReplayRequest,
        last_seq_before: u64,
    ) -> Result<u64, ApiError> {
        let mut count = 0u64;
        deliveries::archived_hooks(
            &self.store,
            ordinal,
            request.from_ms,
            request.to_ms,
            None,
            |entry| {
                if entry.seq <= last_seq_before {
                    match HookRecord::decode(entry.hook) {
                        Ok(hook) if hook.source_id != request.source => {}
                        _ => count += 1,
                    }
                }
                Ok(!self.shutdown.requested())
            },
        )?;
        Ok(count)
    }

    /// Hands `hooks` to the writer, waiting for room when its channel is full (never
    /// dropping one), then waits for every ack. Returns the seqs of the committed hooks.
    fn submit_all(
        &self,
        writer: &WriterHandle,
        ordinal: u32,
        source: &crate::config::Source,
        sink_ids: &Arc<[String]>,
        hooks: Vec<HookRecord>,
        replayed_before: u64,
    ) -> Result<Vec<u64>, ApiError> {
        let mut acks = Vec::with_capacity(hooks.len());
        let mut json = JsonScratch::default();
        for mut hook in hooks {
            // The ingest path: each row joins its lane as a new hook's would, behind the
            // lane's current members.
            let lanes = resolve::stored_lanes(source, &hook, &hook.body, &mut json);
            hook.received_at_ms = clock::now_ms();
            let mut hook_value = Vec::new();
            hook.encode(&mut hook_value);
            let ack = Arc::new(Ack::new());
            // A replay is a deliberate second delivery: it bypasses dedupe, and its rows
            // wait in the replay class.
            let mut envelope = Envelope::new(
                ordinal,
                sink_ids.clone(),
                hook_value,
                EnvelopeKind::Replay,
                ack.clone(),
            );
            envelope.lanes = lanes;
            if writer.submit_patiently(envelope).is_err() {
                return Err(stopping_after(replayed_before + wait_acks(&acks).0));
            }
            acks.push(ack);
        }
        let mut seqs = Vec::with_capacity(acks.len());
        let mut failed = 0u64;
        for ack in &acks {
            match futures_lite::future::block_on(ack.wait()) {
                AckOutcome::Committed(seq) | AckOutcome::Duplicate(seq) => seqs.push(seq),
                AckOutcome::Failed => failed += 1,
            }
        }
        if failed > 0 {
            return Err(ApiError::new(
                503,
                "store_unavailable",
                format!(
                    "{failed} hooks could not be stored (writer commit failed); {} were replayed before the failure",
                    replayed_before + seqs.len() as u64
                ),
            ));
        }
        Ok(seqs)
    }

    /// The tenant's replay budget as the running config has it (re-read between batches,
    /// so a reload applies to a job already running).
    fn replay_limits(&self, ordinal: u32) -> Limits {
        Limits::from(self.tenants.snapshot().bounds_of(ordinal))
    }

    /// Sleeps until `budget` lets the job (`kind`, a metric label) inject at least one of
    /// `want` items, and returns how many it may; `None` when the gateway is stopping. Each
    /// sleep is short, recorded in `ankusa_replay_throttled_seconds`, and followed by a
    /// look at the stop flag.
    fn wait_for_budget<T>(
        &self,
        budget: &mut Budget<T>,
        ordinal: u32,
        kind: &'static str,
        want: usize,
        mut waits: impl FnMut(&T) -> Result<bool, StoreError>,
    ) -> Result<Option<usize>, ApiError> {
        loop {
            if self.shutdown.requested() {
                return Ok(None);
            }
            let limits = self.replay_limits(ordinal);
            if budget.should_settle(limits, want) {
                budget.settle(&mut waits)?;
            }
            match budget.grant(limits, want, Instant::now()) {
                Grant::Take(count) => return Ok(Some(count)),
                Grant::Wait { wait, limit } => {
                    let slept = Instant::now();
                    std::thread::sleep(wait.min(BUDGET_NAP_MAX));
                    metrics::histogram!(
                        "ankusa_replay_throttled_seconds",
                        "kind" => kind,
                        "limit" => limit.name()
                    )
                    .record(slept.elapsed().as_secs_f64());
                }
            }
        }
    }

    /// Whether a replayed hook still has a row before or in its first attempt.
    fn hook_waits(&self, ordinal: u32, seq: u64) -> Result<bool, StoreError> {
        for sink in deliveries::rows_of_hook(&self.store, ordinal, seq)? {
            if self.row_waits(RowId { ordinal, seq, sink })? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether an injected row is still ahead of live rows: it exists and has not been
    /// attempted since it was injected (due, or a lane member), or its attempt is running.
    /// A row past its first attempt (retrying with backoff, dead) no longer counts: it
    /// comes due again only at the pace of its backoff, as any live row that failed.
    fn row_waits(&self, id: RowId) -> Result<bool, StoreError> {
        let Some(bytes) = deliveries::read_row(&self.store, id)? else {
            return Ok(false);
        };
        // An undecodable row is the pipeline's to dead-letter; it does not hold the job.
        let unattempted = DeliveryRow::decode(&bytes).is_ok_and(|row| row.attempts == 0);
        Ok(unattempted || deliveries::is_inflight(&self.store, id)?)
    }

    /// Every tenant's counters and the node aggregate: point reads, no scans; and the
    /// breakers that are not closed, from the pipeline cores' memory.
    pub fn stats(&self) -> Result<Stats, ApiError> {
        let breakers = self.breakers();
        let tenants = self
            .tenants
            .snapshot()
            .list()
            .into_iter()
            .map(|tenant| {
                let open = breakers.of_tenant(&tenant.id, tenant.ordinal);
                Ok(TenantStats {
                    id: tenant.id.to_string(),
                    ordinal: tenant.ordinal,
                    counters: self.counters(tenant.ordinal)?,
                    breakers_open: open.len(),
                    breakers: open,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        let node_breakers = breakers.node();
        Ok(Stats {
            node: self.counters(crate::store::keys::NODE_ORDINAL)?,
            tenants,
            breakers_open: node_breakers.len(),
            breakers: node_breakers,
        })
    }
}

/// Waits for every ack: (committed, failed).
fn wait_acks(acks: &[Arc<Ack>]) -> (u64, u64) {
    let mut committed = 0;
    let mut failed = 0;
    for ack in acks {
        // The committer completes each ack from its own thread and wakes this one.
        match futures_lite::future::block_on(ack.wait()) {
            AckOutcome::Committed(_) | AckOutcome::Duplicate(_) => committed += 1,
            AckOutcome::Failed => failed += 1,
        }
    }
    (committed, failed)
}

pub(super) fn stopping() -> ApiError {
    ApiError::new(503, "shutting_down", "the gateway is stopping")
}

fn stopping_after(replayed: u64) -> ApiError {
    ApiError::new(
        503,
        "shutting_down",
        format!("the gateway is stopping; {replayed} hooks were replayed before"),
    )
}

/// The optional source and sink filters of a listing or a selection.
#[derive(Debug, Default, Clone, Copy)]
struct Filter<'a> {
    source: Option<&'a str>,
    sink: Option<&'a str>,
}

impl Filter<'_> {
    /// A row whose row or hook cannot be read matches no filter on what it lacks.
    fn matches(&self, detail: &Detail) -> bool {
        let source_ok = self.source.is_none_or(|source| {
            detail
                .hook
                .as_ref()
                .is_some_and(|hook| hook.source_id == source)
        });
        let sink_ok = self
            .sink
            .is_none_or(|sink| detail.row.as_ref().is_some_and(|row| row.sink_id == sink));
        source_ok && sink_ok
    }
}

/// What a listing or a filter needs of a hook: not its body.
#[derive(Debug, Clone)]
struct HookHead {
    source_id: String,
    received_at_ms: u64,
}

/// The last hook read, by (ordinal, seq): the rows of one hook are adjacent in the DLQ,
/// so a hook with several dead rows is read once.
#[derive(Debug, Default)]
struct HookHeads {
    last: Option<((u32, u64), Option<HookHead>)>,
}

impl HookHeads {
    fn get(
        &mut self,
        store: &Store,
        ordinal: u32,
        seq: u64,
    ) -> Result<Option<HookHead>, StoreError> {
        if let Some((key, head)) = &self.last {
            if *key == (ordinal, seq) {
                return Ok(head.clone());
            }
        }
        // A hook the store cannot read back (its block fails RocksDB's checksum) is listed
        // like an undecodable one: the row's reason says `corrupt`.
        let bytes = match deliveries::read_hook(store, ordinal, seq) {
            Err(error) if error.is_corruption() => None,
            read => read?,
        };
        let head = bytes
            .and_then(|bytes| HookRecord::decode(&bytes).ok())
            .map(|hook| HookHead {
                source_id: hook.source_id,
                received_at_ms: hook.received_at_ms,
            });
        self.last = Some(((ordinal, seq), head.clone()));
        Ok(head)
    }
}

/// One dead row with what could be read of its delivery row and hook.
#[derive(Debug)]
struct Detail {
    dead: DeadRow,
    /// `None`: missing or undecodable.
    row: Option<DeliveryRow>,
    /// `None`: not read, missing or undecodable.
    hook: Option<HookHead>,
}

impl Detail {
    fn load(
        store: &Store,
        heads: &mut HookHeads,
        dead: DeadRow,
        need_hook: bool,
    ) -> Result<Detail, StoreError> {
        let row = deliveries::read_row(store, dead.id)?
            .and_then(|bytes| DeliveryRow::decode(&bytes).ok());
        let hook = if need_hook {
            heads.get(store, dead.id.ordinal, dead.id.seq)?
        } else {
            None
        };
        Ok(Detail { dead, row, hook })
    }

    fn into_item(self, tenant: &str) -> DlqItem {
        let (sink, attempts, last_error) = match self.row {
            Some(row) => (Some(row.sink_id), Some(row.attempts), Some(row.last_error)),
            None => (None, None, None),
        };
        let (source, received_at_ms) = match self.hook {
            Some(hook) => (Some(hook.source_id), Some(hook.received_at_ms)),
            None => (None, None),
        };
        DlqItem {
            tenant: tenant.to_owned(),
            seq: self.dead.id.seq,
            sink,
            source,
            reason: self.dead.reason,
            attempts,
            last_error,
            received_at_ms,
        }
    }
}
