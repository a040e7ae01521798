//! Natural batching for sinks whose service takes several messages in one request (SQS
//! SendMessageBatch, Pub/Sub publish). An attempt hands its prepared message to the sink's
//! [`Batcher`] and waits for its own outcome. The batcher sends what is waiting as soon as a
//! request slot is free: there is no linger, so a lone attempt goes at once, and while every
//! slot is busy the attempts that arrive meanwhile gather into the next batch.
//!
//! Two hooks of one lane never share a batch: the pipeline starts a lane's next attempt only
//! after the previous one's outcome, so they are never waiting at once.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::io::SinkIo;
use super::Outcome;

/// What one request may carry, and how many requests may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_messages: usize,
    /// The sum of the messages' [`Item::bytes`] in one request.
    pub max_bytes: usize,
    pub max_in_flight: usize,
    /// A request without an answer after this long gives each of its messages a retry,
    /// and its slot back.
    pub timeout: Duration,
}

/// One message, ready for the service.
#[derive(Debug)]
pub struct Item<T> {
    pub message: T,
    /// What the message adds to a request, as the service counts it; at most
    /// [`Limits::max_bytes`] (the sink refuses a bigger one before it gets here).
    pub bytes: usize,
    /// Messages share a request only when their groups are equal (Pub/Sub takes one
    /// ordering key per publish).
    pub group: Option<String>,
}

/// Sends one batch and answers one outcome per message, in the batch's order.
pub type SendBatch<T> =
    Arc<dyn Fn(Vec<T>) -> Pin<Box<dyn Future<Output = Vec<Outcome>> + Send>> + Send + Sync>;

pub struct Batcher<T> {
    entries: mpsc::UnboundedSender<Entry<T>>,
}

impl<T> std::fmt::Debug for Batcher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

struct Entry<T> {
    item: Item<T>,
    answer: oneshot::Sender<Outcome>,
}

impl<T: Send + 'static> Batcher<T> {
    /// Starts the batcher's collector on the sink-I/O runtime; it ends when the batcher is
    /// dropped and the requests it started are answered. `kind` labels the sizes of its
    /// batches (`ankusa_sink_batch_messages`).
    pub fn start(
        io: &SinkIo,
        kind: &'static str,
        limits: Limits,
        send: SendBatch<T>,
    ) -> Batcher<T> {
        assert!(
            limits.max_messages > 0 && limits.max_in_flight > 0,
            "{limits:?}"
        );
        let (entries, received) = mpsc::unbounded_channel();
        io.spawn(collect(received, kind, limits, send));
        Batcher { entries }
    }

    /// Queues `item` for the next batch and waits for its outcome.
    pub async fn submit(&self, item: Item<T>) -> Outcome {
        let (answer, answered) = oneshot::channel();
        if self.entries.send(Entry { item, answer }).is_err() {
            return stopped();
        }
        answered.await.unwrap_or_else(|_| stopped())
    }
}

fn stopped() -> Outcome {
    Outcome::Retry {
        reason: "the sink I/O runtime stopped before the attempt finished".into(),
        retry_after: None,
    }
}

async fn collect<T: Send + 'static>(
    mut received: mpsc::UnboundedReceiver<Entry<T>>,
    kind: &'static str,
    limits: Limits,
    send: SendBatch<T>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_in_flight));
    // Received but not sent yet; bounded by the attempts the pipeline has open.
    let mut waiting: VecDeque<Entry<T>> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match received.recv().await {
                Some(entry) => waiting.push_back(entry),
                None => return,
            }
        }
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        // Whatever arrived while every slot was busy joins this batch.
        while let Ok(entry) = received.try_recv() {
            waiting.push_back(entry);
        }
        let batch = take_batch(&mut waiting, &limits);
        if batch.is_empty() {
            continue;
        }
        metrics::histogram!("ankusa_sink_batch_messages", "kind" => kind)
            .record(batch.len() as f64);
        let send = Arc::clone(&send);
        let timeout = limits.timeout;
        tokio::spawn(async move {
            let (messages, answers): (Vec<T>, Vec<_>) = batch
                .into_iter()
                .map(|entry| (entry.item.message, entry.answer))
                .unzip();
            let count = answers.len();
            let outcomes = match tokio::time::timeout(timeout, send(messages)).await {
                Ok(outcomes) => outcomes,
                Err(_) => vec![no_answer(timeout); count],
            };
            debug_assert_eq!(outcomes.len(), count);
            for (answer, outcome) in answers.into_iter().zip(outcomes) {
                // The attempt gave up waiting (its own timeout): nothing to tell.
                let _ = answer.send(outcome);
            }
            drop(slot);
        });
    }
}

fn no_answer(timeout: Duration) -> Outcome {
    Outcome::Retry {
        reason: format!("no confirmation within {} ms", timeout.as_millis()),
        retry_after: None,
    }
}

/// The next batch: the oldest waiting entry and, in arrival order, every later one of its
/// group that fits the limits. Entries whose attempt already gave up are dropped unsent.
fn take_batch<T>(waiting: &mut VecDeque<Entry<T>>, limits: &Limits) -> Vec<Entry<T>> {
    waiting.retain(|entry| !entry.answer.is_closed());
    let Some(first) = waiting.pop_front() else {
        return Vec::new();
    };
    let mut bytes = first.item.bytes;
    let mut batch = vec![first];
    let mut index = 0;
    while index < waiting.len() && batch.len() < limits.max_messages {
        let entry = &waiting[index];
        if entry.item.group == batch[0].item.group && bytes + entry.item.bytes <= limits.max_bytes {
            bytes += entry.item.bytes;
            batch.extend(waiting.remove(index));
        } else {
            index += 1;
        }
    }
    batch
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn entry(
        message: u32,
        bytes: usize,
        group: Option<&str>,
    ) -> (Entry<u32>, oneshot::Receiver<Outcome>) {
        let (answer, answered) = oneshot::channel();
        let item = Item {
            message,
            bytes,
            group: group.map(str::to_owned),
        };
        (Entry { item, answer }, answered)
    }

    fn limits(max_messages: usize, max_bytes: usize) -> Limits {
        Limits {
            max_messages,
            max_bytes,
            max_in_flight: 1,
            timeout: Duration::from_secs(5),
        }
    }

    fn messages(batch: &[Entry<u32>]) -> Vec<u32> {
        batch.iter().map(|entry| entry.item.message).collect()
    }

    #[test]
    fn a_batch_takes_the_oldest_and_its_group_within_the_limits() {
        let mut waiting = VecDeque::new();
        let mut receivers = Vec::new();
        for (message, bytes, group) in [
            (1, 10, Some("a")),
            (2, 10, Some("b")),
            (3, 10, Some("a")),
            (4, 90, Some("a")),
            (5, 10, Some("a")),
            (6, 10, Some("a")),
            (7, 10, Some("a")),
        ] {
            let (entry, receiver) = entry(message, bytes, group);
            waiting.push_back(entry);
            receivers.push(receiver);
        }
        // 4 would take the batch over 100 bytes; 7 over 4 messages.
        let batch = take_batch(&mut waiting, &limits(4, 100));
        assert_eq!(messages(&batch), [1, 3, 5, 6]);
        let batch = take_batch(&mut waiting, &limits(4, 100));
        assert_eq!(messages(&batch), [2], "another group goes alone");
        let batch = take_batch(&mut waiting, &limits(4, 100));
        assert_eq!(messages(&batch), [4, 7]);
        assert!(take_batch(&mut waiting, &limits(4, 100)).is_empty());
    }

    #[test]
    fn an_entry_whose_attempt_gave_up_is_not_sent() {
        let mut waiting = VecDeque::new();
        let (first, first_answer) = entry(1, 1, None);
        let (second, second_answer) = entry(2, 1, None);
        waiting.extend([first, second]);
        drop(first_answer);
        let batch = take_batch(&mut waiting, &limits(10, 100));
        assert_eq!(messages(&batch), [2]);
        drop(second_answer);
    }

    /// Sends that wait until the test opens the gate, recording each batch.
    #[test]
    fn attempts_gather_while_every_slot_is_busy() {
        let io = SinkIo::new(&[]).unwrap();
        let sent: Arc<Mutex<Vec<Vec<u32>>>> = Arc::default();
        let gate = Arc::new(tokio::sync::Notify::new());
        let send: SendBatch<u32> = {
            let sent = Arc::clone(&sent);
            let gate = Arc::clone(&gate);
            Arc::new(move |batch: Vec<u32>| {
                let sent = Arc::clone(&sent);
                let gate = Arc::clone(&gate);
                Box::pin(async move {
                    let first = batch[0];
                    sent.lock().unwrap().push(batch.clone());
                    if first == 0 {
                        gate.notified().await;
                    }
                    batch
                        .iter()
                        .map(|&message| {
                            if message == 4 {
                                Outcome::Permanent {
                                    reason: "four".into(),
                                }
                            } else {
                                Outcome::Delivered
                            }
                        })
                        .collect()
                })
            })
        };
        let batcher = Arc::new(Batcher::start(&io, "test", limits(3, 1000), send));
        let submit = |message: u32| attempt(&io, &batcher, message);
        let first = submit(0);
        // The first batch holds the only slot until the gate opens.
        while sent.lock().unwrap().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let rest: Vec<_> = (1..=5).map(submit).collect();
        // Nothing more goes out while the slot is taken.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(sent.lock().unwrap().clone(), vec![vec![0]]);
        gate.notify_one();
        let outcomes: Vec<Outcome> = futures_block_on(first, rest);
        assert_eq!(
            sent.lock().unwrap().clone(),
            vec![vec![0], vec![1, 2, 3], vec![4, 5]],
            "the waiting attempts in batches of at most 3, in arrival order"
        );
        let mut expected = vec![Outcome::Delivered; 6];
        expected[4] = Outcome::Permanent {
            reason: "four".into(),
        };
        assert_eq!(outcomes, expected, "each attempt gets its own outcome");
    }

    /// An attempt of one byte-sized message, as a sink's `deliver` makes it.
    fn attempt(
        io: &SinkIo,
        batcher: &Arc<Batcher<u32>>,
        message: u32,
    ) -> super::super::OutcomeFuture {
        let batcher = Arc::clone(batcher);
        io.attempt(Duration::from_secs(30), async move {
            batcher
                .submit(Item {
                    message,
                    bytes: 1,
                    group: None,
                })
                .await
        })
    }

    fn futures_block_on(
        first: super::super::OutcomeFuture,
        rest: Vec<super::super::OutcomeFuture>,
    ) -> Vec<Outcome> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let mut outcomes = vec![first.await];
            for future in rest {
                outcomes.push(future.await);
            }
            outcomes
        })
    }

    #[test]
    fn a_request_without_an_answer_retries_its_messages_and_frees_its_slot() {
        let io = SinkIo::new(&[]).unwrap();
        let send: SendBatch<u32> = Arc::new(|batch: Vec<u32>| {
            Box::pin(async move {
                if batch[0] == 0 {
                    std::future::pending::<()>().await;
                }
                vec![Outcome::Delivered; batch.len()]
            })
        });
        let batcher = Arc::new(Batcher::start(
            &io,
            "test",
            Limits {
                timeout: Duration::from_millis(100),
                ..limits(10, 100)
            },
            send,
        ));
        let submit = |message: u32| attempt(&io, &batcher, message);
        let stuck = submit(0);
        let after = submit(1);
        assert_eq!(
            futures_block_on(stuck, vec![after]),
            vec![
                Outcome::Retry {
                    reason: "no confirmation within 100 ms".into(),
                    retry_after: None
                },
                Outcome::Delivered
            ]
        );
    }
}
