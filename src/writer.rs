//! The writer: the one appender. Envelopes arrive from every ingest core on one bounded
//! channel; the collector assigns seq, builds one `WriteBatch` from everything waiting
//! (bounded by count and bytes) and hands it to the committer, which commits it with
//! `sync` and wakes every waiter of that batch. While one batch syncs, the collector keeps
//! filling the next, so the disk's sync latency becomes batch size, not ack latency.
//!
//! The collector sleeps on a [`WriterBell`], not on the channel: the edge hands envelopes
//! over quietly and rings once per executor tick, and the committer rings when it is free,
//! so a burst of hooks costs the collector one wake rather than one each.
//!
//! Commit order is seq order: one collector assigns seq in channel order and one committer
//! commits batches in the order they were built. The writer does blind puts and merges
//! only; it never reads a row to write it.

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, SendTimeoutError, Sender, TryRecvError, TrySendError};

use crate::ack::Ack;
use crate::clock;
use crate::store::codec::RowLane;
use crate::store::deliveries::{Class, Ingest};
use crate::store::gauges::GaugeDeltas;
use crate::store::keys::LaneId;
use crate::store::{Store, WriteBatch};

/// The longest the collector sleeps without a ring (see `Collector::park`).
const PARK_MAX: Duration = Duration::from_millis(50);

/// One accepted hook on its way to the store.
#[derive(Debug)]
pub struct Envelope {
    pub tenant_ordinal: u32,
    /// The ids of the sinks of the hook's source, under the config the edge accepted it
    /// by: one delivery row each.
    pub sink_ids: Arc<[String]>,
    /// Empty when no sink of the source is ordered; else aligned with `sink_ids`: the lane
    /// each ordered sink's row joins (resolved by the edge before the hand-off, because
    /// the lane a row joins is fixed before it is committed).
    pub lanes: Vec<Option<RowLane>>,
    /// Bytes each delivery row counts against the tenant's bounds.
    pub size: u32,
    /// The encoded [`crate::store::codec::HookRecord`], built by the edge.
    pub hook_value: Vec<u8>,
    /// The full `?K` key when the source dedupes and the hook has a key; else empty.
    pub dedupe_key: Vec<u8>,
    /// When the dedupe entry expires.
    pub dedupe_expires_ms: u64,
    /// What the writer does with the envelope.
    pub kind: EnvelopeKind,
    pub ack: Arc<Ack>,
}

impl Envelope {
    /// An envelope without a dedupe entry; `size` is the record's length.
    pub fn new(
        tenant_ordinal: u32,
        sink_ids: Arc<[String]>,
        hook_value: Vec<u8>,
        kind: EnvelopeKind,
        ack: Arc<Ack>,
    ) -> Envelope {
        Envelope {
            tenant_ordinal,
            sink_ids,
            lanes: Vec::new(),
            size: hook_value.len() as u32,
            hook_value,
            dedupe_key: Vec::new(),
            dedupe_expires_ms: 0,
            kind,
            ack,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvelopeKind {
    /// A new hook: delivery rows for every sink of its source.
    Hook,
    /// A hook an archive replay sends again: as `Hook`, with each row's first attempt in
    /// the replay class (`deliveries::Class::Replay`).
    Replay,
    /// A hook that failed verification or decoding, kept with this reason (`?Q`).
    Quarantine(String),
    /// A quarantined hook released by an operator: a new hook, and in the same batch the
    /// quarantined one (this seq) leaves quarantine. A repeat of a hook still in its dedupe
    /// window leaves quarantine too, and adds nothing.
    Release(u64),
    /// Adds nothing; its ack completes once every envelope taken before it is committed
    /// (a tenant purge waits for this after retiring the tenant).
    Barrier,
}

#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub batch_max: usize,
    pub batch_bytes_max: usize,
    pub sync: bool,
}

/// Wakes the collector. It parks only when there is nothing for it to do, and a sender
/// wakes it only when it finds it parked: an executor that hands over a burst of
/// envelopes rings once after the burst ([`WriterHandle::submit_quietly`]), so the
/// collector's thread is scheduled once per burst rather than once per envelope.
#[derive(Debug, Default)]
pub struct WriterBell {
    parked: AtomicBool,
    /// The collector's thread, set when it starts.
    thread: OnceLock<Thread>,
    /// Rings finished so far, so a test can wait for a particular one to land.
    #[cfg(test)]
    rung: std::sync::atomic::AtomicU64,
}

impl WriterBell {
    pub fn ring(&self) {
        // Pairs with the fence in `Collector::park`: either the collector sees what was
        // sent before this ring, or this ring sees it parked.
        fence(Ordering::SeqCst);
        if self.parked.swap(false, Ordering::AcqRel) {
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
        #[cfg(test)]
        self.rung.fetch_add(1, Ordering::AcqRel);
    }
}

/// The edge's side of the writer.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    sender: Sender<Envelope>,
    bell: Arc<WriterBell>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The channel is full: the writer is saturated (503 with Retry-After).
    Saturated,
    /// The writer has stopped (shutdown or a fatal error).
    Stopped,
}

impl WriterHandle {
    pub fn submit(&self, envelope: Envelope) -> Result<(), SubmitError> {
        self.submit_quietly(envelope)?;
        self.bell.ring();
        Ok(())
    }

    /// Like [`WriterHandle::submit`], but leaves waking the collector to the caller: the
    /// envelope is taken once [`WriterBell::ring`] of [`WriterHandle::bell`] is called
    /// (or the collector wakes for another reason).
    pub fn submit_quietly(&self, envelope: Envelope) -> Result<(), SubmitError> {
        match self.sender.try_send(envelope) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::Saturated),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }

    pub fn bell(&self) -> &Arc<WriterBell> {
        &self.bell
    }

    /// Like [`WriterHandle::submit`], but waits up to `timeout` for room in the channel and
    /// hands the envelope back when there is none, so a caller that must not drop it (an
    /// admin replay) can wait again. Blocks the calling thread: never call it on an
    /// executor.
    pub fn submit_wait(
        &self,
        envelope: Envelope,
        timeout: Duration,
    ) -> Result<(), (SubmitError, Box<Envelope>)> {
        match self.sender.send_timeout(envelope, timeout) {
            Ok(()) => {
                self.bell.ring();
                Ok(())
            }
            Err(SendTimeoutError::Timeout(envelope)) => {
                Err((SubmitError::Saturated, Box::new(envelope)))
            }
            Err(SendTimeoutError::Disconnected(envelope)) => {
                Err((SubmitError::Stopped, Box::new(envelope)))
            }
        }
    }
}

impl WriterHandle {
    /// Hands `envelope` over, waiting as long as the channel is full (live ingest has it);
    /// fails only when the writer has stopped. Blocks the calling thread: for the admin's
    /// thread, never an executor.
    pub fn submit_patiently(&self, mut envelope: Envelope) -> Result<(), SubmitError> {
        loop {
            match self.submit_wait(envelope, Duration::from_millis(100)) {
                Ok(()) => return Ok(()),
                Err((SubmitError::Saturated, back)) => envelope = *back,
                Err((SubmitError::Stopped, _)) => return Err(SubmitError::Stopped),
            }
        }
    }
}

/// `on_commit(min_due_ms, tenants, lanes)`, called after each committed batch: the
/// earliest due time of its rows, the tenants given rows, and the lanes given members.
pub type OnCommit = Box<dyn Fn(u64, &[u32], &[(u32, LaneId)]) + Send>;

/// Who waits for a batch, and what they are told once it commits.
enum Waiter {
    /// A new hook under this seq.
    Stored(Arc<Ack>, u64),
    /// A repeat of the hook with this seq (in this batch, the one before, or the store).
    Duplicate(Arc<Ack>, u64),
    /// A barrier: told once the batch commits.
    Barrier(Arc<Ack>),
}

/// A built batch on its way from the collector to the committer.
struct Pending {
    batch: WriteBatch,
    waiters: Vec<Waiter>,
    /// The lowest and highest seq the batch assigns (`first > last` when none).
    first_seq: u64,
    last_seq: u64,
    /// Pending and bytes the batch adds, for the store's gauges after the commit.
    gauges: GaugeDeltas,
    /// The earliest due time of the batch's rows, for the pipeline's scan cursors.
    min_due_ms: u64,
    /// The tenants with rows in the batch: the pipeline learns of new work from them
    /// instead of rescanning the active markers.
    tenants: Vec<u32>,
    /// The lanes given members in the batch: the pipeline checks them instead of scanning
    /// every lane marker of their tenants.
    lanes: Vec<(u32, LaneId)>,
}

pub struct Writer {
    pub handle: WriterHandle,
    collector: Collector,
    committer: Committer,
}

impl Writer {
    pub fn new(
        store: Store,
        settings: WriterSettings,
        channel_capacity: usize,
        running: Arc<AtomicBool>,
        on_commit: OnCommit,
    ) -> Result<Writer, crate::store::StoreError> {
        let (sender, receiver) = crossbeam_channel::bounded(channel_capacity);
        // Rendezvous: the collector hands over a batch only when the committer is free
        // (`committer_free`), and keeps filling it until then.
        let (commit_sender, commit_receiver) = crossbeam_channel::bounded(0);
        let bell = Arc::new(WriterBell::default());
        let committer_free = Arc::new(AtomicBool::new(false));
        let next_seq = store.last_seq()? + 1;
        Ok(Writer {
            handle: WriterHandle {
                sender,
                bell: bell.clone(),
            },
            collector: Collector {
                store: store.clone(),
                settings: settings.clone(),
                receiver,
                commit_sender,
                bell: bell.clone(),
                committer_free: committer_free.clone(),
                park_max: PARK_MAX,
                next_seq,
                ingest: Ingest::new(),
                dedupe_building: HashMap::new(),
                dedupe_committing: HashMap::new(),
                tenants: None,
            },
            committer: Committer {
                store,
                sync: settings.sync,
                receiver: commit_receiver,
                bell,
                free: committer_free,
                running,
                on_commit,
                failed_seqs: None,
            },
        })
    }

    /// Refuses envelopes of tenants the directory has retired (purged).
    pub fn refuse_retired(&mut self, tenants: Arc<crate::tenants::Tenants>) {
        self.collector.tenants = Some(tenants);
    }

    /// Splits into the two loops; each runs on its own thread on the writer core.
    pub fn into_loops(self) -> (WriterHandle, impl FnOnce() + Send, impl FnOnce() + Send) {
        let collector = self.collector;
        let committer = self.committer;
        (
            self.handle,
            move || collector.run(),
            move || committer.run(),
        )
    }
}

struct Collector {
    store: Store,
    settings: WriterSettings,
    receiver: Receiver<Envelope>,
    commit_sender: Sender<Pending>,
    /// Rung by senders and by the committer when it becomes free.
    bell: Arc<WriterBell>,
    /// Set by the committer when it waits for a batch; the collector clears it as it
    /// hands one over.
    committer_free: Arc<AtomicBool>,
    /// The longest it parks without a ring: [`PARK_MAX`].
    park_max: Duration,
    next_seq: u64,
    /// The batch being built: its rows, counters and active markers.
    ingest: Ingest,
    /// Dedupe keys (full `?K` keys) put by the batch being built and by the batch the
    /// committer holds, with their seqs: a repeat must find its first hook before that
    /// hook's batch is readable from the store. Once the collector hands a batch over, the
    /// one before it has committed, so two generations cover everything unreadable.
    dedupe_building: HashMap<Vec<u8>, u64>,
    dedupe_committing: HashMap<Vec<u8>, u64>,
    /// The tenant directory, for its retired ordinals: an envelope of a tenant being
    /// purged is refused rather than written under an ordinal about to be erased.
    tenants: Option<Arc<crate::tenants::Tenants>>,
}

impl Collector {
    fn run(mut self) {
        // The view is this thread's own (it caches without locking), so it is made here.
        let retired = self.tenants.take().map(|tenants| tenants.view());
        let retired = retired.as_ref();
        let _ = self.bell.thread.set(std::thread::current());
        let mut pending = self.new_pending();
        let mut bytes = 0usize;
        // Ends when every edge has dropped its handle: the final batch is committed, then
        // dropping `commit_sender` stops the committer.
        loop {
            // Take what is waiting; while the committer is busy the batch keeps growing.
            let mut disconnected = false;
            while !self.full(&pending, bytes) {
                match self.receiver.try_recv() {
                    Ok(envelope) => bytes += self.add(&mut pending, envelope, retired),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        disconnected = true;
                        break;
                    }
                }
            }
            let has_work = !pending.waiters.is_empty();
            if has_work && (disconnected || self.committer_free.swap(false, Ordering::AcqRel)) {
                // Sealed only once handed over: sealing twice would double the counters.
                self.seal(&mut pending);
                // Free (or, when stopping, soon free): the rendezvous completes at once.
                if self.commit_sender.send(pending).is_err() {
                    return;
                }
                self.handed_over();
                pending = self.new_pending();
                bytes = 0;
                continue;
            }
            if disconnected {
                return;
            }
            self.park(&pending, bytes);
        }
    }

    fn new_pending(&self) -> Pending {
        Pending {
            batch: WriteBatch::default(),
            waiters: Vec::new(),
            first_seq: self.next_seq,
            last_seq: 0,
            gauges: GaugeDeltas::default(),
            min_due_ms: u64::MAX,
            tenants: Vec::new(),
            lanes: Vec::new(),
        }
    }

    fn full(&self, pending: &Pending, bytes: usize) -> bool {
        pending.waiters.len() >= self.settings.batch_max || bytes >= self.settings.batch_bytes_max
    }

    /// Sleeps until a sender or the committer rings, unless there is work already.
    fn park(&self, pending: &Pending, bytes: usize) {
        self.bell.parked.store(true, Ordering::Release);
        // Pairs with the fence in `WriterBell::ring` (see there).
        fence(Ordering::SeqCst);
        let can_take = !self.full(pending, bytes) && !self.receiver.is_empty();
        let can_hand_over =
            !pending.waiters.is_empty() && self.committer_free.load(Ordering::Acquire);
        if !can_take && !can_hand_over {
            // Bounded: the last sender dropping its handle rings nobody, and the loop
            // must see the channel disconnect to commit the final batch and stop.
            std::thread::park_timeout(self.park_max);
        }
        self.bell.parked.store(false, Ordering::Release);
    }

    /// Puts the hook, its delivery rows and their due keys, or counts a repeat; returns
    /// the bytes added.
    fn add(
        &mut self,
        pending: &mut Pending,
        envelope: Envelope,
        retired: Option<&crate::tenants::View>,
    ) -> usize {
        let now_ms = clock::now_ms();
        if envelope.kind == EnvelopeKind::Barrier {
            pending.waiters.push(Waiter::Barrier(envelope.ack));
            return 0;
        }
        if let Some(tenants) = retired {
            if tenants.is_retired(envelope.tenant_ordinal) {
                envelope.ack.fail();
                return 0;
            }
        }
        if let EnvelopeKind::Quarantine(reason) = &envelope.kind {
            let seq = self.next_seq;
            self.next_seq += 1;
            pending.last_seq = seq;
            self.ingest.quarantine(
                &self.store,
                &mut pending.batch,
                envelope.tenant_ordinal,
                seq,
                &envelope.hook_value,
                reason,
            );
            pending.waiters.push(Waiter::Stored(envelope.ack, seq));
            return envelope.hook_value.len() + reason.len();
        }
        if let EnvelopeKind::Release(quarantined) = envelope.kind {
            self.ingest.unquarantine(
                &self.store,
                &mut pending.batch,
                envelope.tenant_ordinal,
                quarantined,
            );
        }
        if !envelope.dedupe_key.is_empty() {
            let key = envelope.dedupe_key.as_slice();
            let seen = match self
                .dedupe_building
                .get(key)
                .or_else(|| self.dedupe_committing.get(key))
            {
                Some(&seq) => Ok(Some(seq)),
                None => Ingest::remembered(&self.store, key, now_ms),
            };
            match seen {
                Ok(Some(first)) => {
                    self.ingest.duplicate(envelope.tenant_ordinal);
                    pending.waiters.push(Waiter::Duplicate(envelope.ack, first));
                    return 16;
                }
                Ok(None) => {}
                Err(error) => {
                    metrics::counter!("ankusa_writer_commit_errors_total").increment(1);
                    tracing::error!(%error, "dedupe lookup failed; answering 503");
                    envelope.ack.fail();
                    return 0;
                }
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        pending.last_seq = seq;
        let sink_ids = &envelope.sink_ids[..];
        // The edge only builds envelopes for configured sources, which have ≥ 1 sink.
        assert!(!sink_ids.is_empty(), "envelope without sinks");
        let due_ms = now_ms;
        pending.min_due_ms = pending.min_due_ms.min(due_ms);
        let class = if envelope.kind == EnvelopeKind::Replay {
            Class::Replay
        } else {
            Class::Live
        };
        self.ingest.add(
            &self.store,
            &mut pending.batch,
            envelope.tenant_ordinal,
            seq,
            &envelope.hook_value,
            sink_ids,
            &envelope.lanes,
            envelope.size,
            due_ms,
            class,
        );
        for lane in envelope.lanes.iter().flatten() {
            pending.lanes.push((envelope.tenant_ordinal, lane.id));
        }
        if !envelope.dedupe_key.is_empty() {
            self.ingest.remember(
                &self.store,
                &mut pending.batch,
                &envelope.dedupe_key,
                seq,
                envelope.dedupe_expires_ms,
            );
            self.dedupe_building.insert(envelope.dedupe_key, seq);
        }
        let added = envelope.hook_value.len() + 64 * sink_ids.len();
        pending.waiters.push(Waiter::Stored(envelope.ack, seq));
        added
    }

    /// Adds what belongs once per batch: counter merges, active markers, the seq mark.
    fn seal(&mut self, pending: &mut Pending) {
        pending.tenants.extend(self.ingest.tenants());
        pending.gauges = self
            .ingest
            .seal(&self.store, &mut pending.batch, self.next_seq - 1);
    }

    /// The committer took the sealed batch, so the one before it has committed: its dedupe
    /// keys are readable from the store now.
    fn handed_over(&mut self) {
        std::mem::swap(&mut self.dedupe_building, &mut self.dedupe_committing);
        self.dedupe_building.clear();
    }
}

struct Committer {
    store: Store,
    sync: bool,
    receiver: Receiver<Pending>,
    bell: Arc<WriterBell>,
    /// Set before each wait for a batch (see `Collector::committer_free`).
    free: Arc<AtomicBool>,
    /// Cleared when the committer stops, for `/readyz`.
    running: Arc<AtomicBool>,
    /// Called after each committed batch with its earliest due time and its tenants: the
    /// pipeline cores have new rows.
    on_commit: OnCommit,
    /// The seqs of the last batch that failed to commit: a repeat of one of them (in the
    /// next batch) must not be told its first hook is stored.
    failed_seqs: Option<(u64, u64)>,
}

impl Committer {
    fn run(mut self) {
        self.running.store(true, Ordering::Release);
        loop {
            self.free.store(true, Ordering::Release);
            self.bell.ring();
            let Ok(pending) = self.receiver.recv() else {
                break;
            };
            let records = pending.waiters.len();
            let acked_early = crate::faults::active(crate::faults::Fault::AckBeforeSync);
            if acked_early {
                for waiter in &pending.waiters {
                    if let Waiter::Stored(ack, seq) = waiter {
                        ack.complete(*seq);
                    }
                }
                std::thread::sleep(crate::faults::ACK_BEFORE_SYNC_DELAY);
            }
            if crate::faults::active(crate::faults::Fault::SlowCommit) {
                std::thread::sleep(crate::faults::SLOW_COMMIT_DELAY);
            }
            let started = Instant::now();
            let result = self.store.write(pending.batch, self.sync);
            let elapsed = started.elapsed();
            metrics::histogram!("ankusa_writer_batch_records").record(records as f64);
            metrics::histogram!("ankusa_writer_sync_seconds").record(elapsed.as_secs_f64());
            match result {
                Ok(()) => {
                    // The mirror moves before any ack: the edge returns its reservation on
                    // the ack, and the hook must be counted by then.
                    self.store.gauges().apply(&pending.gauges);
                    let failed = self.failed_seqs.take();
                    for waiter in pending.waiters {
                        match waiter {
                            Waiter::Stored(_, _) if acked_early => {}
                            Waiter::Stored(ack, seq) => ack.complete(seq),
                            Waiter::Duplicate(ack, first)
                                if failed.is_some_and(|(lo, hi)| (lo..=hi).contains(&first)) =>
                            {
                                ack.fail()
                            }
                            Waiter::Duplicate(ack, first) => ack.duplicate_of(first),
                            // A barrier has no seq of its own.
                            Waiter::Barrier(ack) => ack.complete(pending.last_seq.max(1)),
                        }
                    }
                    (self.on_commit)(pending.min_due_ms, &pending.tenants, &pending.lanes);
                }
                Err(error) => {
                    metrics::counter!("ankusa_writer_commit_errors_total").increment(1);
                    tracing::error!(%error, records, "writer batch failed to commit; answering 503");
                    self.failed_seqs = (pending.first_seq <= pending.last_seq)
                        .then_some((pending.first_seq, pending.last_seq));
                    for waiter in pending.waiters {
                        match waiter {
                            // Told "stored" already: the fault's lie stands.
                            Waiter::Stored(_, _) if acked_early => {}
                            Waiter::Stored(ack, _)
                            | Waiter::Duplicate(ack, _)
                            | Waiter::Barrier(ack) => ack.fail(),
                        }
                    }
                }
            }
        }
        self.running.store(false, Ordering::Release);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ack::AckOutcome;

    fn envelope(ack: &Arc<Ack>) -> Envelope {
        ack.reset();
        let sinks: Arc<[String]> = Arc::from(vec!["http".to_owned()]);
        Envelope::new(7, sinks, b"hook".to_vec(), EnvelopeKind::Hook, ack.clone())
    }

    /// Waits for `ack` from a plain thread, giving up after `limit`.
    fn outcome_within(ack: &Ack, limit: Duration) -> Option<AckOutcome> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(outcome) = ack.outcome() {
                return Some(outcome);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    }

    /// A writer whose collector never wakes on its own: every envelope is taken only
    /// because a ring (a sender's, or the committer's) reached it.
    fn writer_without_timeout(
        dir: &std::path::Path,
    ) -> (
        WriterHandle,
        Arc<AtomicBool>,
        Vec<std::thread::JoinHandle<()>>,
    ) {
        let store = Store::open(dir).unwrap();
        let settings = WriterSettings {
            batch_max: 64,
            batch_bytes_max: 1 << 20,
            sync: false,
        };
        let running = Arc::new(AtomicBool::new(false));
        let mut writer =
            Writer::new(store, settings, 1024, running, Box::new(|_, _, _| {})).unwrap();
        writer.collector.park_max = Duration::from_secs(3600);
        let committer_free = writer.collector.committer_free.clone();
        let (handle, collect, commit) = writer.into_loops();
        let threads = vec![std::thread::spawn(collect), std::thread::spawn(commit)];
        (handle, committer_free, threads)
    }

    /// Waits until `condition` holds, for at most 20 s.
    fn wait_for(condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !condition() {
            assert!(Instant::now() < deadline, "the writer did not settle");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn every_ring_reaches_the_collector() {
        // Four senders, each waiting for its ack before the next hook, race the collector
        // as it parks: a ring lost between its last look and its park leaves an ack
        // unanswered (the collector would sleep for an hour).
        let dir = tempfile::tempdir().unwrap();
        let (handle, _, threads) = writer_without_timeout(dir.path());
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let handle = handle.clone();
                std::thread::spawn(move || {
                    let ack = Arc::new(Ack::new());
                    let mut seqs = Vec::new();
                    for _ in 0..2_000 {
                        handle.submit(envelope(&ack)).unwrap();
                        match outcome_within(&ack, Duration::from_secs(20)) {
                            Some(AckOutcome::Committed(seq)) => seqs.push(seq),
                            other => panic!("hook {} answered {other:?}", seqs.len() + 1),
                        }
                    }
                    seqs
                })
            })
            .collect();
        let mut seqs: Vec<u64> = senders
            .into_iter()
            .flat_map(|sender| sender.join().unwrap())
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=8_000).collect::<Vec<u64>>());
        let bell = handle.bell().clone();
        drop(handle);
        bell.ring();
        for thread in threads {
            thread.join().unwrap();
        }
    }

    #[test]
    fn quiet_submissions_wait_for_a_ring() {
        let dir = tempfile::tempdir().unwrap();
        let (handle, committer_free, threads) = writer_without_timeout(dir.path());
        let warm = Arc::new(Ack::new());
        handle.submit(envelope(&warm)).unwrap();
        assert_eq!(
            outcome_within(&warm, Duration::from_secs(20)),
            Some(AckOutcome::Committed(1))
        );
        // Three rings so far or soon: the committer's at its start, the submit's, and the
        // committer's once free again (after the acks). Let the last land and the
        // collector park after it before the quiet hand-overs, or that ring would take
        // them. Nothing rings after it, and the collector's timed wake is an hour away.
        let bell = handle.bell().clone();
        wait_for(|| {
            committer_free.load(Ordering::Acquire) && bell.rung.load(Ordering::Acquire) == 3
        });
        wait_for(|| bell.parked.load(Ordering::Acquire));
        let acks: Vec<Arc<Ack>> = (0..10).map(|_| Arc::new(Ack::new())).collect();
        for ack in &acks {
            handle.submit_quietly(envelope(ack)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            bell.parked.load(Ordering::Acquire) && acks.iter().all(|ack| ack.outcome().is_none()),
            "a quiet submission woke the collector"
        );
        handle.bell().ring();
        for (i, ack) in acks.iter().enumerate() {
            assert_eq!(
                outcome_within(ack, Duration::from_secs(20)),
                Some(AckOutcome::Committed(i as u64 + 2))
            );
        }
        drop(handle);
        bell.ring();
        for thread in threads {
            thread.join().unwrap();
        }
    }
}
