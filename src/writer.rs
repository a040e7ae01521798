//! The writer: the one appender. Envelopes arrive from every ingest core on one bounded
//! channel; the collector assigns seq, builds one `WriteBatch` from everything waiting
//! (bounded by count and bytes) and hands it to the committer, which commits it with
//! `sync` and wakes every waiter of that batch. While one batch syncs, the collector keeps
//! filling the next, so the disk's sync latency becomes batch size, not ack latency.
//!
//! Commit order is seq order: one collector assigns seq in channel order and one committer
//! commits batches in the order they were built. The writer does blind puts and merges
//! only; it never reads a row to write it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, SendTimeoutError, Sender, TrySendError};

use crate::ack::Ack;
use crate::clock;
use crate::store::codec::RowLane;
use crate::store::deliveries::{Class, Ingest};
use crate::store::gauges::GaugeDeltas;
use crate::store::keys::LaneId;
use crate::store::{Store, WriteBatch};

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

/// The edge's side of the writer.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    sender: Sender<Envelope>,
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
        match self.sender.try_send(envelope) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::Saturated),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
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
            Ok(()) => Ok(()),
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
        // Rendezvous: the collector hands over a batch only when the committer is free,
        // and keeps filling it until then.
        let (commit_sender, commit_receiver) = crossbeam_channel::bounded(0);
        let next_seq = store.last_seq()? + 1;
        Ok(Writer {
            handle: WriterHandle { sender },
            collector: Collector {
                store: store.clone(),
                settings: settings.clone(),
                receiver,
                commit_sender,
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
        // Ends when every edge has dropped its handle: the final batch is committed, then
        // dropping `commit_sender` stops the committer.
        while let Ok(first) = self.receiver.recv() {
            let mut pending = Pending {
                batch: WriteBatch::default(),
                waiters: Vec::new(),
                first_seq: self.next_seq,
                last_seq: 0,
                gauges: GaugeDeltas::default(),
                min_due_ms: u64::MAX,
                tenants: Vec::new(),
                lanes: Vec::new(),
            };
            let mut bytes = 0usize;
            bytes += self.add(&mut pending, first, retired);
            let mut disconnected = false;
            // Take what is already waiting, then keep adding while the committer is busy.
            while pending.waiters.len() < self.settings.batch_max
                && bytes < self.settings.batch_bytes_max
            {
                match self.receiver.try_recv() {
                    Ok(envelope) => bytes += self.add(&mut pending, envelope, retired),
                    Err(_) => break,
                }
            }
            loop {
                let full = pending.waiters.len() >= self.settings.batch_max
                    || bytes >= self.settings.batch_bytes_max;
                if full || disconnected {
                    self.seal(&mut pending);
                    if self.commit_sender.send(pending).is_err() {
                        return;
                    }
                    self.handed_over();
                    break;
                }
                // Seal before offering: the batch is only moved if the committer takes
                // it, and sealing twice would double the counters, so an envelope that
                // arrives first goes into the next batch instead.
                let mut select = Select::new();
                let send_index = select.send(&self.commit_sender);
                let recv_index = select.recv(&self.receiver);
                let ready = select.ready();
                if ready == send_index {
                    self.seal(&mut pending);
                    if self.commit_sender.send(pending).is_err() {
                        return;
                    }
                    self.handed_over();
                    break;
                }
                debug_assert_eq!(ready, recv_index);
                match self.receiver.try_recv() {
                    Ok(envelope) => bytes += self.add(&mut pending, envelope, retired),
                    Err(crossbeam_channel::TryRecvError::Disconnected) => disconnected = true,
                    Err(crossbeam_channel::TryRecvError::Empty) => {}
                }
            }
            if disconnected {
                break;
            }
        }
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
        while let Ok(pending) = self.receiver.recv() {
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
