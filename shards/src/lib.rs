//! # shards: the thread-per-core runtime
//!
//! Places roles on cores and starts them: pinned glommio executors for the async roles
//! (ingest, pipeline), pinned OS threads for roles whose work is blocking by nature (the
//! writer's commits). Roles may share a core; the defaults fit any box. It also checks
//! what io_uring needs before anything starts, so a misconfigured host fails with the fix
//! in the message rather than deep inside the first executor, and it turns SIGTERM/SIGINT
//! into an orderly stop. It knows nothing about webhooks.
//!
//! [`BlockingPool`] (in `pool`) runs blocking calls on pinned OS threads for the
//! executors, so no executor ever blocks.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use thiserror::Error;

pub use glommio;

mod pool;

pub use pool::{worker_index, BlockingPool, PoolError, PoolFuture};

/// glommio's own floor for locked memory (its io_uring rings are mlocked).
pub const MEMLOCK_MIN_BYTES: u64 = 512 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Ingest,
    Writer,
    Pipeline,
    SinkIo,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Ingest => "ingest",
            Role::Writer => "writer",
            Role::Pipeline => "pipeline",
            Role::SinkIo => "sink_io",
        })
    }
}

/// Which cores run which role, after defaults and checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub ingest: Vec<usize>,
    pub writer: usize,
    pub pipeline: Vec<usize>,
    pub sink_io: Vec<usize>,
}

/// The `cores:` section as configured; `None` takes the default for the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlacementRequest {
    pub ingest: Option<Vec<usize>>,
    pub writer: Option<usize>,
    pub pipeline: Option<Vec<usize>>,
    pub sink_io: Option<Vec<usize>>,
}

#[derive(Debug, Error)]
pub enum StartError {
    #[error("instance.cores.{role}: core {core} is not available to this process (available: {available})")]
    NoSuchCore {
        role: Role,
        core: usize,
        available: String,
    },
    #[error("instance.cores.{role}: needs at least one core")]
    EmptyRole { role: Role },
    #[error(
        "locked-memory limit is {found} bytes; io_uring needs at least {needed}. Raise it with \
         `ulimit -l unlimited` (or at least {needed_kib}) in the shell, `LimitMEMLOCK=infinity` \
         in the systemd unit, or `memlock` in /etc/security/limits.conf"
    )]
    MemlockTooLow {
        found: u64,
        needed: u64,
        needed_kib: u64,
    },
    #[error(
        "io_uring is unavailable: {0}. Ankusa needs Linux 5.8 or newer with io_uring enabled \
         (check /proc/sys/kernel/io_uring_disabled, and that no seccomp profile blocks io_uring_setup)"
    )]
    IoUringUnavailable(String),
    #[error("{role} executor on core {core} failed to start: {reason}")]
    Executor {
        role: Role,
        core: usize,
        reason: String,
    },
    #[error("cannot start {role} thread on core {core}: {source}")]
    Thread {
        role: Role,
        core: usize,
        source: std::io::Error,
    },
}

/// The cores this process may run on (its affinity mask), ascending.
pub fn available_cores() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1))
                .collect();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|cpu| libc::CPU_ISSET(*cpu, &set))
            .collect()
    }
}

impl Placement {
    /// Fills unset roles with defaults for `available` and checks every core exists.
    ///
    /// Defaults: one core runs everything; two cores put ingest and pipeline on the first
    /// and the writer and sink I/O on the second; more cores give the writer and sink I/O
    /// one core each at the top, a quarter of the rest to pipelines, and the remainder to
    /// ingest.
    pub fn resolve(
        request: &PlacementRequest,
        available: &[usize],
    ) -> Result<Placement, StartError> {
        let defaults = Placement::defaults(available);
        let placement = Placement {
            ingest: request.ingest.clone().unwrap_or(defaults.ingest),
            writer: request.writer.unwrap_or(defaults.writer),
            pipeline: request.pipeline.clone().unwrap_or(defaults.pipeline),
            sink_io: request.sink_io.clone().unwrap_or(defaults.sink_io),
        };
        let list = available
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let check = |role: Role, cores: &[usize]| -> Result<(), StartError> {
            if cores.is_empty() {
                return Err(StartError::EmptyRole { role });
            }
            for &core in cores {
                if !available.contains(&core) {
                    return Err(StartError::NoSuchCore {
                        role,
                        core,
                        available: list.clone(),
                    });
                }
            }
            Ok(())
        };
        check(Role::Ingest, &placement.ingest)?;
        check(Role::Writer, &[placement.writer])?;
        check(Role::Pipeline, &placement.pipeline)?;
        check(Role::SinkIo, &placement.sink_io)?;
        Ok(placement)
    }

    fn defaults(available: &[usize]) -> Placement {
        let cores: Vec<usize> = if available.is_empty() {
            vec![0]
        } else {
            available.to_vec()
        };
        match cores.len() {
            1 => Placement {
                ingest: vec![cores[0]],
                writer: cores[0],
                pipeline: vec![cores[0]],
                sink_io: vec![cores[0]],
            },
            // The pipeline beside the writer, not the edge: on the ingest core it lost the
            // core to the edge and delivery fell behind ingest. The sink threads go on
            // both cores and fill whichever has room.
            2 => Placement {
                ingest: vec![cores[0]],
                writer: cores[1],
                pipeline: vec![cores[1]],
                sink_io: vec![cores[0], cores[1]],
            },
            n => {
                let writer = cores[n - 1];
                let sink_io = cores[n - 2];
                let rest = &cores[..n - 2];
                let pipeline_count = (rest.len() / 4).max(1);
                let pipeline = if rest.len() > pipeline_count {
                    rest[rest.len() - pipeline_count..].to_vec()
                } else {
                    rest.to_vec()
                };
                let ingest_end = if rest.len() > pipeline_count {
                    rest.len() - pipeline_count
                } else {
                    rest.len()
                };
                Placement {
                    ingest: rest[..ingest_end].to_vec(),
                    writer,
                    pipeline,
                    sink_io: vec![sink_io],
                }
            }
        }
    }

    /// One line per role, for the startup report.
    pub fn describe(&self) -> String {
        let list = |cores: &[usize]| {
            cores
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "ingest=[{}] writer={} pipeline=[{}] sink_io=[{}]",
            list(&self.ingest),
            self.writer,
            list(&self.pipeline),
            list(&self.sink_io)
        )
    }
}

/// The soft RLIMIT_MEMLOCK of this process, `None` when unlimited.
pub fn memlock_limit() -> Option<u64> {
    // SAFETY: getrlimit writes into the struct we pass.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur == libc::RLIM_INFINITY {
            None
        } else {
            Some(limit.rlim_cur)
        }
    }
}

/// Fails with the fix in the message when io_uring cannot be set up here.
pub fn preflight() -> Result<(), StartError> {
    check_memlock(memlock_limit())?;
    if let Ok(text) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        if text.trim() == "2" {
            return Err(StartError::IoUringUnavailable(
                "kernel.io_uring_disabled is 2".to_string(),
            ));
        }
    }
    Ok(())
}

fn check_memlock(limit: Option<u64>) -> Result<(), StartError> {
    match limit {
        Some(found) if found < MEMLOCK_MIN_BYTES => Err(StartError::MemlockTooLow {
            found,
            needed: MEMLOCK_MIN_BYTES,
            needed_kib: MEMLOCK_MIN_BYTES / 1024,
        }),
        _ => Ok(()),
    }
}

/// A started role: joined at shutdown, and its start-up failure surfaces there too
/// (glommio reports a failed executor only through the join).
pub struct Shard {
    pub role: Role,
    pub core: usize,
    inner: ShardInner,
}

enum ShardInner {
    Executor(glommio::ExecutorJoinHandle<()>),
    Thread(JoinHandle<()>),
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard")
            .field("role", &self.role)
            .field("core", &self.core)
            .finish()
    }
}

impl Shard {
    pub fn join(self) -> Result<(), StartError> {
        let (role, core) = (self.role, self.core);
        match self.inner {
            ShardInner::Executor(handle) => handle.join().map_err(|error| {
                let reason = error.to_string();
                if reason.contains("MemLock") || reason.contains("memlock") {
                    StartError::MemlockTooLow {
                        found: memlock_limit().unwrap_or(0),
                        needed: MEMLOCK_MIN_BYTES,
                        needed_kib: MEMLOCK_MIN_BYTES / 1024,
                    }
                } else if reason.contains("io_uring") || reason.contains("Function not implemented")
                {
                    StartError::IoUringUnavailable(reason)
                } else {
                    StartError::Executor { role, core, reason }
                }
            }),
            ShardInner::Thread(handle) => handle.join().map_err(|_| StartError::Executor {
                role,
                core,
                reason: "thread panicked".into(),
            }),
        }
    }
}

/// Starts a glommio executor pinned to `core` running the future `make` builds there.
pub fn spawn_executor<G, F>(role: Role, core: usize, make: G) -> Result<Shard, StartError>
where
    G: FnOnce() -> F + Send + 'static,
    F: Future<Output = ()> + 'static,
{
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(core))
        .name(&format!("{role}-{core}"))
        .spawn(make)
        .map_err(|error| StartError::Executor {
            role,
            core,
            reason: error.to_string(),
        })?;
    Ok(Shard {
        role,
        core,
        inner: ShardInner::Executor(handle),
    })
}

/// Starts a plain OS thread pinned to `core`, for a role that blocks by design.
pub fn spawn_thread<F>(role: Role, core: usize, name: &str, run: F) -> Result<Shard, StartError>
where
    F: FnOnce() + Send + 'static,
{
    let handle = std::thread::Builder::new()
        .name(format!("{name}-{core}"))
        .spawn(move || {
            pin_current_thread(core);
            run()
        })
        .map_err(|source| StartError::Thread { role, core, source })?;
    Ok(Shard {
        role,
        core,
        inner: ShardInner::Thread(handle),
    })
}

/// Pins the calling thread to `core`; a failure is logged and the thread runs unpinned.
pub fn pin_current_thread(core: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(core, "could not pin thread; running unpinned");
        }
    }
}

/// Set once SIGTERM or SIGINT arrives; every role polls it and winds down.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown::default()
    }
    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
    pub fn request(&self) {
        self.flag.store(true, Ordering::Release);
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread; threads spawned after inherit the
/// mask, so the signals are only ever taken by [`wait_for_signal`]. Call before starting
/// any role.
pub fn block_stop_signals() {
    // SAFETY: plain libc signal-mask calls on a stack sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits (blocking) for SIGTERM, SIGINT or SIGHUP and returns its number.
pub fn wait_for_signal() -> i32 {
    // SAFETY: sigwait on a set of signals this thread has blocked.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        let mut signal = 0;
        libc::sigwait(&set, &mut signal);
        signal
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn resolve(request: PlacementRequest, available: &[usize]) -> Result<Placement, StartError> {
        Placement::resolve(&request, available)
    }

    #[test]
    fn defaults_fit_small_and_large_boxes() {
        let one = resolve(PlacementRequest::default(), &[0]).unwrap();
        assert_eq!(
            one,
            Placement {
                ingest: vec![0],
                writer: 0,
                pipeline: vec![0],
                sink_io: vec![0]
            }
        );
        let two = resolve(PlacementRequest::default(), &[0, 1]).unwrap();
        assert_eq!(
            two,
            Placement {
                ingest: vec![0],
                writer: 1,
                pipeline: vec![1],
                sink_io: vec![0, 1]
            }
        );
        let many: Vec<usize> = (0..64).collect();
        let big = resolve(PlacementRequest::default(), &many).unwrap();
        assert_eq!(big.writer, 63);
        assert_eq!(big.sink_io, vec![62]);
        assert_eq!(big.pipeline, (47..62).collect::<Vec<_>>());
        assert_eq!(big.ingest, (0..47).collect::<Vec<_>>());
    }

    #[test]
    fn a_missing_core_is_named() {
        let request = PlacementRequest {
            writer: Some(7),
            ..Default::default()
        };
        let error = resolve(request, &[0, 1]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "instance.cores.writer: core 7 is not available to this process (available: 0, 1)"
        );
    }

    #[test]
    fn low_memlock_names_the_fix() {
        let error = check_memlock(Some(64 * 1024)).unwrap_err().to_string();
        assert!(error.contains("ulimit -l"), "{error}");
        assert!(error.contains("LimitMEMLOCK"), "{error}");
        assert!(check_memlock(None).is_ok());
        assert!(check_memlock(Some(8 << 20)).is_ok());
    }
}
