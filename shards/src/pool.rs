//! The blocking pool: a fixed set of pinned OS threads that run blocking calls (a `ureq`
//! request, a file read) on behalf of glommio executors, so an executor never blocks.
//!
//! An executor hands a job to [`BlockingPool::run`] and awaits the returned
//! [`PoolFuture`]. The job joins a queue under a mutex and wakes one sleeping worker, if
//! any sleeps; the worker stores the result in a one-shot slot shared with the future and
//! wakes the awaiting task through an [`AtomicWaker`]. glommio routes that wake from a
//! foreign thread to the owning executor through its eventfd, so no executor polls or
//! spins. Nor does a worker: an idle one sleeps on a condition variable at once. (A
//! channel whose receivers spin and `sched_yield` before sleeping costs dozens of context
//! switches per job when many workers share few cores.)
//!
//! The pool bounds how many jobs run at once (its thread count), not how many wait: the
//! callers bound that (the pipeline runs at most `dispatch.sink_concurrency` attempts per
//! tenant and sink), so the queue holds at most what they allow.

use std::any::Any;
use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::thread::JoinHandle;

use atomic_waker::AtomicWaker;
use thiserror::Error;

/// Why a job gave no result.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PoolError {
    /// The pool was closed before the job could run.
    #[error("blocking pool {pool} is closed")]
    Closed { pool: String },
    /// The job panicked; `message` is the panic's payload when it was a string.
    #[error("job on blocking pool {pool} panicked: {message}")]
    Panicked { pool: String, message: String },
}

/// A job as the workers see it: the caller's closure wrapped with its completion.
type Job = Box<dyn FnOnce() + Send + 'static>;

/// What the callers and the workers share.
struct Queue {
    state: Mutex<QueueState>,
    /// Signalled for each job queued while a worker sleeps, and for all at close.
    job_ready: Condvar,
}

struct QueueState {
    jobs: VecDeque<Job>,
    /// Workers asleep on `job_ready`: a job wakes one only when there is one to wake.
    sleeping: usize,
    /// Set by `close`: no job is taken after it, and the workers stop once `jobs` is
    /// empty.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Nothing panics while holding the lock (jobs run outside it).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bounded set of pinned threads for blocking work. Shared as `Arc<BlockingPool>` by
/// every core that hands it jobs.
pub struct BlockingPool {
    /// Names the threads (`<name>-<n>`) and the errors, so a stuck or panicking job
    /// points at its pool.
    name: String,
    thread_count: usize,
    queue: Arc<Queue>,
    /// Taken (emptied) by the first `close`, which joins them.
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl fmt::Debug for BlockingPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingPool")
            .field("name", &self.name)
            .field("thread_count", &self.thread_count)
            .finish()
    }
}

impl BlockingPool {
    /// Starts `threads` workers named `<name>-<n>`, pinned round-robin to `cores` (left
    /// unpinned when `cores` is empty). Fails when `threads` is 0 or a thread cannot be
    /// started; the workers started so far are stopped first.
    pub fn new(name: &str, threads: usize, cores: &[usize]) -> std::io::Result<Arc<BlockingPool>> {
        if threads == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("blocking pool {name} needs at least one thread"),
            ));
        }
        let pool = BlockingPool {
            name: name.to_owned(),
            thread_count: threads,
            queue: Arc::new(Queue {
                state: Mutex::new(QueueState {
                    jobs: VecDeque::new(),
                    sleeping: 0,
                    closed: false,
                }),
                job_ready: Condvar::new(),
            }),
            workers: Mutex::new(Vec::with_capacity(threads)),
        };
        for index in 0..threads {
            let core = (!cores.is_empty()).then(|| cores[index % cores.len()]);
            let queue = Arc::clone(&pool.queue);
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || work(index, core, &queue));
            match spawned {
                Ok(handle) => pool.lock_workers().push(handle),
                Err(error) => {
                    pool.close();
                    return Err(error);
                }
            }
        }
        Ok(Arc::new(pool))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many jobs can run at once.
    pub fn thread_count(&self) -> usize {
        self.thread_count
    }

    /// Queues `job` and returns a future for its result. The job is queued now, not at
    /// the first poll; dropping the future before a worker takes the job cancels it, and
    /// dropping it later discards the result.
    pub fn run<T, F>(&self, job: F) -> PoolFuture<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let slot = Arc::new(Slot::new());
        let completion = Completion {
            slot: Some(Arc::clone(&slot)),
            pool: self.name.clone(),
        };
        let wrapped: Job = Box::new(move || {
            // A future dropped before its job started wants no result: skip the call.
            if completion.cancelled() {
                return;
            }
            // AssertUnwindSafe: after a panic nothing of the job is used again; the slot
            // only receives the error.
            let result = catch_unwind(AssertUnwindSafe(job));
            completion.finish(result);
        });
        let mut state = self.queue.lock();
        if state.closed {
            drop(state);
            // Dropping the job unrun completes the future with `Closed`.
            drop(wrapped);
        } else {
            state.jobs.push_back(wrapped);
            let wake = state.sleeping > 0;
            drop(state);
            if wake {
                self.queue.job_ready.notify_one();
            }
        }
        PoolFuture { slot }
    }

    /// Stops taking jobs, lets the workers finish everything queued, and joins them.
    /// Blocks the calling thread until then, so call it at shutdown, not on an executor.
    /// Later calls, and `run` after it, find the pool closed.
    pub fn close(&self) {
        // Each worker's loop ends once it finds the queue closed and empty.
        self.queue.lock().closed = true;
        self.queue.job_ready.notify_all();
        let workers = std::mem::take(&mut *self.lock_workers());
        let current = std::thread::current().id();
        for worker in workers {
            // The last `Arc` may be dropped inside a job; a thread cannot join itself.
            if worker.thread().id() == current {
                continue;
            }
            if worker.join().is_err() {
                // Jobs run under catch_unwind, so only the pool's own code could panic.
                tracing::error!(pool = %self.name, "blocking pool worker panicked");
            }
        }
    }

    fn lock_workers(&self) -> std::sync::MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for BlockingPool {
    fn drop(&mut self) {
        self.close();
    }
}

thread_local! {
    static WORKER_INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the pool worker running the calling job (`<name>-<n>`'s `n`), or `None`
/// off a pool thread. A job keeps per-worker state by it without a lock: a client that
/// shares one connection pool among all workers takes its mutex on every request.
pub fn worker_index() -> Option<usize> {
    WORKER_INDEX.with(Cell::get)
}

/// A worker: runs jobs until the pool is closed and the queue is empty.
fn work(index: usize, core: Option<usize>, queue: &Queue) {
    WORKER_INDEX.with(|cell| cell.set(Some(index)));
    if let Some(core) = core {
        crate::pin_current_thread(core);
    }
    let mut state = queue.lock();
    loop {
        if let Some(job) = state.jobs.pop_front() {
            drop(state);
            job();
            state = queue.lock();
        } else if state.closed {
            return;
        } else {
            // A job queued while this worker sleeps wakes it (or another sleeper, which
            // takes the job; this one then finds the queue empty and sleeps again).
            state.sleeping += 1;
            state = queue
                .job_ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.sleeping -= 1;
        }
    }
}

/// The one-shot shared by a job's completion and its future.
struct Slot<T> {
    /// Written once by the completion, taken once by the future.
    result: Mutex<Option<Result<T, PoolError>>>,
    waker: AtomicWaker,
    /// Set when the future is dropped, so a job that has not started is skipped.
    cancelled: AtomicBool,
}

impl<T> Slot<T> {
    fn new() -> Slot<T> {
        Slot {
            result: Mutex::new(None),
            waker: AtomicWaker::new(),
            cancelled: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<T, PoolError>>> {
        // Nothing panics while holding the lock (it only moves a value), so poisoning
        // cannot leave a half-written result.
        self.result.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fill(&self, result: Result<T, PoolError>) {
        *self.lock() = Some(result);
        self.waker.wake();
    }
}

/// The worker's end of a slot. Dropped without finishing (the job was never run: the
/// pool closed, or the job was cancelled) it completes the future with `Closed`, so an
/// awaiting task can never hang.
struct Completion<T> {
    /// `None` once finished, so the drop does not complete the slot a second time.
    slot: Option<Arc<Slot<T>>>,
    pool: String,
}

impl<T> Completion<T> {
    fn cancelled(&self) -> bool {
        self.slot
            .as_ref()
            .is_some_and(|slot| slot.cancelled.load(Ordering::Acquire))
    }

    fn finish(mut self, result: Result<T, Box<dyn Any + Send>>) {
        let result = result.map_err(|payload| PoolError::Panicked {
            pool: self.pool.clone(),
            message: panic_message(payload.as_ref()),
        });
        if let Some(slot) = self.slot.take() {
            slot.fill(result);
        }
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.fill(Err(PoolError::Closed {
                pool: self.pool.clone(),
            }));
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// The result of one job; resolves when a worker has run it (or the pool could not).
pub struct PoolFuture<T> {
    slot: Arc<Slot<T>>,
}

impl<T> fmt::Debug for PoolFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolFuture").finish_non_exhaustive()
    }
}

impl<T> Future for PoolFuture<T> {
    type Output = Result<T, PoolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(result) = self.slot.lock().take() {
            return Poll::Ready(result);
        }
        self.slot.waker.register(cx.waker());
        // Re-check after registering: a completion between the first check and the
        // registration would otherwise never wake us.
        match self.slot.lock().take() {
            Some(result) => Poll::Ready(result),
            None => Poll::Pending,
        }
    }
}

impl<T> Drop for PoolFuture<T> {
    fn drop(&mut self) {
        self.slot.cancelled.store(true, Ordering::Release);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// Polls `future` to completion on this thread, parking between polls; enough for
    /// tests that do not need an executor.
    fn block_on<F: Future>(future: F) -> F::Output {
        futures_lite::future::block_on(future)
    }

    #[test]
    fn results_arrive() {
        let pool = BlockingPool::new("test-results", 3, &[]).unwrap();
        let futures: Vec<_> = (0..50u64).map(|n| pool.run(move || n * n)).collect();
        let results: Vec<u64> = futures
            .into_iter()
            .map(|future| block_on(future).unwrap())
            .collect();
        assert_eq!(results, (0..50u64).map(|n| n * n).collect::<Vec<_>>());
    }

    /// Each job sees the index of the worker running it, the one in the thread's name;
    /// off the pool there is none.
    #[test]
    fn a_job_knows_its_worker() {
        let pool = BlockingPool::new("test-index", 3, &[]).unwrap();
        let futures: Vec<_> = (0..30)
            .map(|_| {
                pool.run(|| {
                    let name = std::thread::current().name().unwrap().to_owned();
                    (worker_index(), name)
                })
            })
            .collect();
        for future in futures {
            let (index, name) = block_on(future).unwrap();
            let index = index.unwrap();
            assert!(index < 3);
            assert_eq!(name, format!("test-index-{index}"));
        }
        assert_eq!(worker_index(), None);
    }

    #[test]
    fn concurrency_never_exceeds_the_thread_count() {
        let pool = BlockingPool::new("test-bound", 3, &[]).unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let futures: Vec<_> = (0..24)
            .map(|_| {
                let running = Arc::clone(&running);
                let peak = Arc::clone(&peak);
                pool.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for future in futures {
            block_on(future).unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_panic_is_reported_and_the_worker_survives() {
        let pool = BlockingPool::new("test-panic", 1, &[]).unwrap();
        let error = block_on(pool.run(|| -> u32 { panic!("boom") })).unwrap_err();
        assert_eq!(
            error,
            PoolError::Panicked {
                pool: "test-panic".into(),
                message: "boom".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "job on blocking pool test-panic panicked: boom"
        );
        // The single worker caught it and still takes jobs.
        assert_eq!(block_on(pool.run(|| 7)).unwrap(), 7);
    }

    #[test]
    fn close_finishes_queued_jobs_then_refuses() {
        let pool = BlockingPool::new("test-close", 1, &[]).unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let futures: Vec<_> = (0..5)
            .map(|_| {
                let done = Arc::clone(&done);
                pool.run(move || {
                    std::thread::sleep(Duration::from_millis(5));
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        pool.close();
        assert_eq!(done.load(Ordering::SeqCst), 5);
        for future in futures {
            block_on(future).unwrap();
        }
        assert_eq!(
            block_on(pool.run(|| 1)).unwrap_err(),
            PoolError::Closed {
                pool: "test-close".into()
            }
        );
        pool.close();
    }

    #[test]
    fn a_dropped_future_cancels_a_job_not_yet_started() {
        let pool = BlockingPool::new("test-cancel", 1, &[]).unwrap();
        let (release, gate) = crossbeam_channel::bounded::<()>(0);
        let blocker = pool.run(move || gate.recv().unwrap());
        let ran = Arc::new(AtomicBool::new(false));
        let ran_in_job = Arc::clone(&ran);
        drop(pool.run(move || ran_in_job.store(true, Ordering::SeqCst)));
        release.send(()).unwrap();
        block_on(blocker).unwrap();
        pool.close();
        assert!(!ran.load(Ordering::SeqCst));
    }

    #[test]
    fn zero_threads_is_refused() {
        let error = BlockingPool::new("test-zero", 0, &[]).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[test]
    fn threads_are_pinned_round_robin() {
        let cores = crate::available_cores();
        let pool = BlockingPool::new("test-pin", 2, &cores[..1]).unwrap();
        let affinity = block_on(pool.run(crate::available_cores)).unwrap();
        assert_eq!(affinity, cores[..1]);
    }

    #[test]
    fn a_glommio_task_is_woken_from_the_worker() {
        let pool = BlockingPool::new("test-glommio", 2, &[]).unwrap();
        let executor = glommio::LocalExecutorBuilder::default().make().unwrap();
        let started = Instant::now();
        let (sum, elapsed) = executor.run(async move {
            let slow = pool.run(|| {
                std::thread::sleep(Duration::from_millis(50));
                40
            });
            let fast = pool.run(|| 2);
            // Awaited on the executor: completion comes from another thread's wake,
            // not from polling, so this only finishes if that wake arrives.
            let sum = slow.await.unwrap() + fast.await.unwrap();
            (sum, started.elapsed())
        });
        assert_eq!(sum, 42);
        assert!(elapsed >= Duration::from_millis(50), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }
}
