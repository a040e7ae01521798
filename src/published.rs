//! A value many cores read on every request and one rare writer replaces: the tenant
//! directory, the running configuration.
//!
//! The value is immutable and replaced whole. Each reading core or thread keeps a
//! [`Local`] copy of the `Arc` and swaps it for the current one only when the version
//! moved, so a read is one atomic load and, on the hot path, no lock and no shared
//! reference count. Replacing takes the one mutex.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What a [`Local`] hands out: its own counted handle of the shared value. The extra `Rc`
/// is the point: cloning it on every request is a plain increment, where cloning the
/// `Arc` would be an atomic one on a cache line every core shares.
#[allow(clippy::redundant_allocation)]
pub type Held<T> = Rc<Arc<T>>;

pub struct Published<T> {
    version: AtomicU64,
    current: Mutex<Arc<T>>,
}

impl<T> std::fmt::Debug for Published<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Published")
            .field("version", &self.version.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T> Published<T> {
    pub fn new(value: T) -> Published<T> {
        Published {
            version: AtomicU64::new(1),
            current: Mutex::new(Arc::new(value)),
        }
    }

    /// The current value (takes the mutex: for rare readers; cores use [`Local`]).
    pub fn load(&self) -> Arc<T> {
        self.lock().clone()
    }

    /// Replaces the value; readers see it on their next read.
    pub fn store(&self, value: T) {
        let mut current = self.lock();
        *current = Arc::new(value);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Replaces the value with `update(current)` under the mutex, so two updates never
    /// lose each other's change. `update` returns the new value and what the caller wants
    /// back, or an error that leaves the value as it is.
    pub fn update<R, E>(&self, update: impl FnOnce(&T) -> Result<(T, R), E>) -> Result<R, E> {
        let mut current = self.lock();
        let (next, answer) = update(&current)?;
        *current = Arc::new(next);
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(answer)
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, Arc<T>> {
        // The guarded value is replaced whole, never left half-written: a panic elsewhere
        // cannot poison its meaning.
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One core's or thread's copy of a [`Published`] value.
pub struct Local<T> {
    published: Arc<Published<T>>,
    seen: Cell<u64>,
    cached: RefCell<Held<T>>,
}

impl<T> std::fmt::Debug for Local<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local")
            .field("seen", &self.seen.get())
            .finish_non_exhaustive()
    }
}

impl<T> Local<T> {
    pub fn new(published: Arc<Published<T>>) -> Local<T> {
        let seen = published.version();
        let cached = RefCell::new(Rc::new(published.load()));
        Local {
            published,
            seen: Cell::new(seen),
            cached,
        }
    }

    /// The newest value. The `Rc` may be held across awaits: a replacement meanwhile
    /// does not change what this holder sees.
    pub fn get(&self) -> Held<T> {
        let version = self.published.version();
        if version != self.seen.get() {
            *self.cached.borrow_mut() = Rc::new(self.published.load());
            self.seen.set(version);
        }
        self.cached.borrow().clone()
    }

    /// The version of the value [`Local::get`] last returned.
    pub fn seen(&self) -> u64 {
        self.seen.get()
    }

    pub fn published(&self) -> &Arc<Published<T>> {
        &self.published
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_copy_follows_replacements_and_holders_keep_theirs() {
        let published = Arc::new(Published::new(1));
        let local = Local::new(published.clone());
        let held = local.get();
        assert_eq!(**held, 1);
        published.store(2);
        assert_eq!(**local.get(), 2);
        assert_eq!(**held, 1, "a holder keeps the value it read");
        let refused: Result<(), &str> = published.update(|_| Err("no"));
        assert_eq!(refused, Err("no"));
        assert_eq!(**local.get(), 2);
        assert_eq!(published.update(|n| Ok::<_, ()>((n + 1, n * 10))), Ok(20));
        assert_eq!(**local.get(), 3);
    }
}
