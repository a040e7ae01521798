//! The sink-I/O runtime: one multi-threaded tokio runtime whose workers are pinned to the
//! `sink_io` cores. The broker clients (redis, async-nats, lapin) are bound to tokio, so
//! their attempts run here; a pipeline core on glommio only awaits a one-shot answer.
//!
//! The answer crosses runtimes through `tokio::sync::oneshot`, whose receiver is a plain
//! future: polled on a glommio executor, it registers that executor's waker, and the send
//! from a tokio worker wakes it through glommio's foreign-wake path (as the blocking
//! pool's answers do).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Outcome, OutcomeFuture};

/// Time past a sink's `timeout_ms` that an attempt waits for its client's own verdict: the
/// client's timeout (librdkafka's `message.timeout.ms`, the SDK's operation timeout,
/// ureq's) fires first and names the cause, rather than a timer of ours.
pub const CLIENT_TIMEOUT_SLACK: Duration = Duration::from_secs(2);

pub struct SinkIo {
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for SinkIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkIo").finish_non_exhaustive()
    }
}

impl SinkIo {
    /// Starts one worker per entry of `cores`, each pinned to its core (one unpinned worker
    /// when `cores` is empty, as in unit tests).
    pub fn new(cores: &[usize]) -> std::io::Result<Arc<SinkIo>> {
        let cores: Arc<[usize]> = cores.into();
        let next = Arc::new(AtomicUsize::new(0));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores.len().max(1))
            // Blocking work in these clients is rare (DNS); a handful of threads bounds it.
            .max_blocking_threads(4)
            .thread_name("sink-io-rt")
            .enable_all()
            .on_thread_start(move || {
                if !cores.is_empty() {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    shards::pin_current_thread(cores[index % cores.len()]);
                }
            })
            .build()?;
        Ok(Arc::new(SinkIo { runtime }))
    }

    /// Runs `task` on the runtime, detached (a sink's background work, such as its
    /// batcher).
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.runtime.spawn(task);
    }

    /// Runs one attempt on the runtime; the returned future resolves on the caller's
    /// executor. An attempt still running after `timeout` is abandoned as a retry: the
    /// destination may yet take it, which at-least-once delivery allows.
    pub fn attempt<F>(&self, timeout: Duration, attempt: F) -> OutcomeFuture
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.runtime.spawn(async move {
            let outcome = match tokio::time::timeout(timeout, attempt).await {
                Ok(outcome) => outcome,
                Err(_) => Outcome::Retry {
                    reason: format!("no confirmation within {} ms", timeout.as_millis()),
                    retry_after: None,
                },
            };
            // The pipeline stopped waiting (shutdown): nothing to tell.
            let _ = answer.send(outcome);
        });
        Box::pin(async move {
            answered.await.unwrap_or_else(|_| Outcome::Retry {
                reason: "the sink I/O runtime stopped before the attempt finished".into(),
                retry_after: None,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_answers_a_glommio_task_and_a_slow_one_becomes_a_retry() {
        let io = SinkIo::new(&[]).expect("runtime");
        let executor = glommio::LocalExecutorBuilder::default()
            .make()
            .expect("executor");
        executor.run(async {
            // Runs on a tokio worker (tokio's timer), answers the glommio task.
            let delivered = io
                .attempt(Duration::from_secs(5), async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Outcome::Delivered
                })
                .await;
            assert_eq!(delivered, Outcome::Delivered);
            let slow = io
                .attempt(Duration::from_millis(50), async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Outcome::Delivered
                })
                .await;
            assert_eq!(
                slow,
                Outcome::Retry {
                    reason: "no confirmation within 50 ms".into(),
                    retry_after: None,
                }
            );
        });
    }
}
