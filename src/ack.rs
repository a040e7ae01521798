//! The writer's answer to one envelope, awaited by the edge connection that sent it.
//!
//! One `Ack` per connection, reused for every request on it (a connection waits for one
//! ack at a time), so the hot path allocates nothing here. The writer's committer thread
//! completes it and wakes the edge task; glommio routes that foreign wake to the owning
//! executor through its eventfd.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

const PENDING: u64 = 0;
const FAILED: u64 = u64::MAX;
/// Set on the seq of a repeat: the seq is the first hook's. Seqs stay far below it.
const DUPLICATE: u64 = 1 << 62;

#[derive(Debug, Default)]
pub struct Ack {
    /// `PENDING`, `FAILED`, the committed seq (seqs start at 1), or `DUPLICATE` | the
    /// first hook's seq.
    state: AtomicU64,
    waker: AtomicWaker,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Synced to the WAL under this seq.
    Committed(u64),
    /// A repeat of the hook with this seq, inside its dedupe window: nothing was added.
    /// Answered only once the batch that counted it is synced.
    Duplicate(u64),
    /// The batch's commit failed: nothing of it is durable.
    Failed,
}

impl Ack {
    pub fn new() -> Ack {
        Ack::default()
    }

    /// Called by the edge before it hands an envelope to the writer.
    pub fn reset(&self) {
        self.state.store(PENDING, Ordering::Release);
    }

    pub fn complete(&self, seq: u64) {
        debug_assert!(seq != PENDING && seq != FAILED);
        self.state.store(seq, Ordering::Release);
        self.waker.wake();
    }

    pub fn duplicate_of(&self, seq: u64) {
        debug_assert!(seq != PENDING && seq < DUPLICATE);
        self.state.store(DUPLICATE | seq, Ordering::Release);
        self.waker.wake();
    }

    pub fn fail(&self) {
        self.state.store(FAILED, Ordering::Release);
        self.waker.wake();
    }

    pub(crate) fn outcome(&self) -> Option<AckOutcome> {
        match self.state.load(Ordering::Acquire) {
            PENDING => None,
            FAILED => Some(AckOutcome::Failed),
            state if state & DUPLICATE != 0 => Some(AckOutcome::Duplicate(state & !DUPLICATE)),
            seq => Some(AckOutcome::Committed(seq)),
        }
    }

    pub fn wait(&self) -> AckWait<'_> {
        AckWait { ack: self }
    }
}

pub struct AckWait<'a> {
    ack: &'a Ack,
}

impl Future for AckWait<'_> {
    type Output = AckOutcome;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<AckOutcome> {
        if let Some(outcome) = self.ack.outcome() {
            return Poll::Ready(outcome);
        }
        self.ack.waker.register(cx.waker());
        // Re-check after registering: a completion between the first check and the
        // registration would otherwise be missed.
        match self.ack.outcome() {
            Some(outcome) => Poll::Ready(outcome),
            None => Poll::Pending,
        }
    }
}
