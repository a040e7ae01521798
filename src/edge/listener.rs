//! One ingest core's accept loop: its SO_REUSEPORT listener, the registry of its open
//! connections (to half-close them at a stop), and its status-class counters.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use glommio::net::TcpListener;

use super::{conn, EdgeShared};
use crate::writer::{Envelope, SubmitError, WriterHandle};

/// Per-core state of the edge: live connections (so a stop can cut idle ones) and the
/// counters this core publishes on a timer.
pub struct CoreState {
    /// This core's lock-free view of the tenant directory.
    pub tenants: crate::tenants::View,
    /// This core's copy of the running config.
    pub live: crate::published::Local<crate::live::Live>,
    pub connections: RefCell<HashMap<u64, RawFd>>,
    next_connection: Cell<u64>,
    stopped: Cell<bool>,
    accept_waker: RefCell<Option<Waker>>,
    /// Responses by status class (index = first digit), flushed to metrics every second.
    pub status_classes: Cell<[u64; 6]>,
    /// Whether a ring of the writer's bell is queued for the end of this tick.
    writer_ring_queued: Rc<Cell<bool>>,
}

impl CoreState {
    pub fn new(
        tenants: crate::tenants::View,
        live: crate::published::Local<crate::live::Live>,
    ) -> CoreState {
        CoreState {
            tenants,
            live,
            connections: RefCell::default(),
            next_connection: Cell::default(),
            stopped: Cell::default(),
            accept_waker: RefCell::default(),
            status_classes: Cell::default(),
            writer_ring_queued: Rc::default(),
        }
    }

    /// Hands `envelope` to the writer. The collector is woken once for all the envelopes
    /// this core hands over in the same tick: the ring is a task queued behind the tasks
    /// already runnable, so the connections that became readable together are collected
    /// with one wake instead of one each.
    pub fn submit(&self, writer: &WriterHandle, envelope: Envelope) -> Result<(), SubmitError> {
        writer.submit_quietly(envelope)?;
        if !self.writer_ring_queued.replace(true) {
            let queued = self.writer_ring_queued.clone();
            let bell = writer.bell().clone();
            glommio::spawn_local(async move {
                queued.set(false);
                bell.ring();
            })
            .detach();
        }
        Ok(())
    }

    pub fn count_status(&self, status: u16) {
        let mut classes = self.status_classes.get();
        classes[(status / 100).min(5) as usize] += 1;
        self.status_classes.set(classes);
    }

    fn register(&self, fd: RawFd) -> u64 {
        let id = self.next_connection.get();
        self.next_connection.set(id + 1);
        self.connections.borrow_mut().insert(id, fd);
        id
    }

    fn unregister(&self, id: u64) {
        self.connections.borrow_mut().remove(&id);
    }

    pub fn stopped(&self) -> bool {
        self.stopped.get()
    }

    /// Stops accepting and half-closes every connection's read side: a request being
    /// processed finishes and is answered; an idle connection sees end of stream.
    fn stop(&self) {
        self.stopped.set(true);
        if let Some(waker) = self.accept_waker.borrow_mut().take() {
            waker.wake();
        }
        for fd in self.connections.borrow().values() {
            // SAFETY: the fd belongs to a live connection of this core (unregistered
            // before its stream drops); shutdown(2) does not close it.
            unsafe {
                libc::shutdown(*fd, libc::SHUT_RD);
            }
        }
    }
}

/// Resolves when the core is stopped; used to race `accept`.
struct Stopped<'a>(&'a CoreState);

impl std::future::Future for Stopped<'_> {
    type Output = ();
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0.stopped.get() {
            std::task::Poll::Ready(())
        } else {
            *self.0.accept_waker.borrow_mut() = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    }
}

/// Runs one ingest core until `shutdown`: accepts, serves, then waits for its open
/// requests to be answered.
/// `bound` hears once whether this core's listener bound, so startup can announce
/// readiness only when every core accepts.
pub async fn run_core(
    shared: Arc<EdgeShared>,
    listen: SocketAddr,
    shutdown: shards::Shutdown,
    bound: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let listener = match TcpListener::bind(listen) {
        Ok(listener) => {
            let _ = bound.send(Ok(()));
            listener
        }
        Err(error) => {
            let _ = bound.send(Err(format!("ingest listener on {listen}: {error}")));
            shutdown.request();
            return;
        }
    };
    let core = Rc::new(CoreState::new(
        shared.tenants.view(),
        crate::published::Local::new(shared.live.clone()),
    ));
    let ack_latency = metrics::histogram!("ankusa_ingest_ack_seconds");
    let watcher = glommio::spawn_local(watch(core.clone(), shutdown.clone())).detach();

    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            Stopped(&core).await;
            None
        })
        .await;
        let stream = match accepted {
            None => break,
            Some(Ok(stream)) => stream,
            Some(Err(error)) => {
                tracing::warn!(%error, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let limit = shared.limits.connections_max;
        if core.connections.borrow().len() >= limit {
            glommio::spawn_local(conn::refuse_over_capacity(stream, core.clone())).detach();
            continue;
        }
        use std::os::fd::AsRawFd;
        let id = core.register(stream.as_raw_fd());
        let (shared, core_for_task, ack_latency) =
            (shared.clone(), core.clone(), ack_latency.clone());
        glommio::spawn_local(async move {
            conn::serve(stream, &shared, &core_for_task, &ack_latency).await;
            core_for_task.unregister(id);
        })
        .detach();
    }
    drop(listener);
    // Every connection was half-closed by stop(); wait for their last answers.
    while !core.connections.borrow().is_empty() {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    flush_counters(&core);
    drop(watcher);
}

/// Publishes the core's counters every second and turns the process-wide shutdown flag
/// into this core's stop.
async fn watch(core: Rc<CoreState>, shutdown: shards::Shutdown) {
    let mut ticks = 0u32;
    loop {
        glommio::timer::sleep(Duration::from_millis(20)).await;
        if shutdown.requested() {
            core.stop();
            return;
        }
        ticks += 1;
        if ticks.is_multiple_of(50) {
            flush_counters(&core);
        }
    }
}

const STATUS_CLASS_LABELS: [&str; 6] = ["0xx", "1xx", "2xx", "3xx", "4xx", "5xx"];

fn flush_counters(core: &CoreState) {
    let classes = core.status_classes.replace([0; 6]);
    for (class, count) in classes.iter().enumerate() {
        if *count > 0 {
            metrics::counter!("ankusa_ingest_requests_total", "status" => STATUS_CLASS_LABELS[class])
                .increment(*count);
        }
    }
}
