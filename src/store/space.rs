//! Free space of the data directory, and the reserve that keeps delivery going on a full disk.
//!
//! Ingest is what fills the disk; delivery is what empties it, and delivery writes too (a
//! claim, an outcome, a lane release, RocksDB's flushes and compactions). So the edge stops
//! taking hooks (503 `disk_full`) while the file system's free space is under
//! `store.min_free_bytes`, and the space left is the reserve that the pipeline spends on
//! draining. Ingest resumes once free space is back above the reserve plus a margin, so a
//! disk at the edge of the bound does not flap between 202 and 503 on every check.
//!
//! If the disk fills anyway (another process, a reserve set too small), RocksDB's write of
//! the batch fails and the writer answers 503 for every hook of it: never a 2xx that was not
//! synced.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The default reserve: room for several memtable flushes and a compaction of a busy node.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 256 << 20;

/// The data directory's free space, refreshed by [`FreeSpace::check`] (the metrics upkeep
/// thread, every 250 ms) and read by the edge with one relaxed load per hook.
#[derive(Debug)]
pub struct FreeSpace {
    path: PathBuf,
    min_free: u64,
    resume_at: u64,
    free: AtomicU64,
    low: AtomicBool,
}

impl FreeSpace {
    /// A guard of `path` with a reserve of `min_free` bytes (0: never refuse). Free space
    /// counts as plenty until the first check.
    pub fn new(path: &Path, min_free: u64) -> FreeSpace {
        FreeSpace {
            path: path.to_path_buf(),
            min_free,
            resume_at: resume_threshold(min_free),
            free: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
        }
    }

    /// Reads the file system's free space (as an unprivileged process sees it) and moves
    /// the low flag. Returns the free bytes.
    pub fn check(&self) -> io::Result<u64> {
        let free = available_bytes(&self.path)?;
        self.free.store(free, Ordering::Relaxed);
        let was_low = self.low.load(Ordering::Relaxed);
        let low = next_low(was_low, free, self.min_free, self.resume_at);
        if low != was_low {
            self.low.store(low, Ordering::Relaxed);
            if low {
                tracing::error!(
                    free_bytes = free,
                    min_free_bytes = self.min_free,
                    data_dir = %self.path.display(),
                    "free space under store.min_free_bytes: refusing new hooks (503 disk_full) \
                     until it is back; delivery goes on"
                );
            } else {
                tracing::warn!(
                    free_bytes = free,
                    data_dir = %self.path.display(),
                    "free space is back: taking hooks again"
                );
            }
        }
        Ok(free)
    }

    /// Whether the edge must refuse new hooks.
    #[inline]
    pub fn low(&self) -> bool {
        self.low.load(Ordering::Relaxed)
    }

    /// The free bytes at the last check (`u64::MAX` before the first).
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    pub fn min_free(&self) -> u64 {
        self.min_free
    }
}

/// Free space must climb an eighth of the reserve (at most 64 MiB) past it before ingest
/// resumes.
fn resume_threshold(min_free: u64) -> u64 {
    min_free.saturating_add((min_free / 8).min(64 << 20))
}

fn next_low(was_low: bool, free: u64, min_free: u64, resume_at: u64) -> bool {
    if was_low {
        free < resume_at
    } else {
        free < min_free
    }
}

/// Bytes that an unprivileged writer can still use on the file system holding `path`.
fn available_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let mut c_path = path.as_os_str().as_bytes().to_vec();
    c_path.push(0);
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated and outlives the call; `stat` is written by the
    // call before it is read, and only read on success.
    let result = unsafe { libc::statvfs(c_path.as_ptr().cast(), stat.as_mut_ptr()) };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn low_starts_under_the_reserve_and_ends_past_the_margin() {
        let min = 1000;
        let resume = resume_threshold(min);
        assert_eq!(resume, 1125);
        assert!(!next_low(false, 1000, min, resume));
        assert!(next_low(false, 999, min, resume));
        // Back at the reserve is not enough: the margin keeps it from flapping.
        assert!(next_low(true, 1000, min, resume));
        assert!(next_low(true, 1124, min, resume));
        assert!(!next_low(true, 1125, min, resume));
        // A reserve of 0 never refuses.
        assert!(!next_low(false, 0, 0, resume_threshold(0)));
        assert!(!next_low(true, 0, 0, resume_threshold(0)));
        // The margin is capped.
        assert_eq!(resume_threshold(8 << 30), (8 << 30) + (64 << 20));
    }

    #[test]
    fn a_real_directory_has_free_space_and_a_missing_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let guard = FreeSpace::new(dir.path(), 0);
        assert_eq!(guard.free(), u64::MAX);
        let free = guard.check().unwrap();
        assert!(free > 0);
        assert_eq!(guard.free(), free);
        assert!(!guard.low());
        // No file system has u64::MAX bytes free.
        let greedy = FreeSpace::new(dir.path(), u64::MAX);
        greedy.check().unwrap();
        assert!(greedy.low());
        let missing = FreeSpace::new(&dir.path().join("absent"), 0);
        assert_eq!(missing.check().unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
