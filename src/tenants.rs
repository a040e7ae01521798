//! The tenant directory: every tenant the node serves, its ordinal and its bounds.
//!
//! Declared tenants get their ordinals at boot. A `tenant_from: path` source with
//! `auto_tenants: true` creates a tenant on its first hook: the id must match the id
//! grammar, the node holds at most `admission.auto_tenants_max` tenants that the file does
//! not declare, and the new ordinal is persisted (synced) before the hook is taken. An
//! ordinal is never reused.
//!
//! Readers are the ingest cores, on every request, so a lookup takes no lock: each core
//! keeps its own [`View`] of an immutable [`Directory`] and swaps it for the current one
//! only when the directory's version moved. Creating a tenant (rare, bounded by the cap)
//! takes the one mutex.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::{self, Config, TenantBounds};
use crate::store::{Store, StoreError};

/// One tenant as the edge and the admin see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: Arc<str>,
    pub ordinal: u32,
    pub bounds: TenantBounds,
    /// Named in the config file (else created by an `auto_tenants` source).
    pub declared: bool,
}

/// An immutable snapshot: replaced whole when a tenant is added.
#[derive(Debug, Default, Clone)]
pub struct Directory {
    by_id: HashMap<Arc<str>, Tenant>,
    /// Ordinals of tenants being purged or purged: nothing may be added under them.
    retired: std::collections::HashSet<u32>,
}

impl Directory {
    pub fn get(&self, id: &str) -> Option<&Tenant> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every tenant, by ordinal.
    pub fn list(&self) -> Vec<Tenant> {
        let mut all: Vec<Tenant> = self.by_id.values().cloned().collect();
        all.sort_by_key(|tenant| tenant.ordinal);
        all
    }

    pub fn is_retired(&self, ordinal: u32) -> bool {
        self.retired.contains(&ordinal)
    }

    fn auto_count(&self) -> u64 {
        self.by_id.values().filter(|t| !t.declared).count() as u64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("invalid tenant id {id:?} ({})", config::ID_GRAMMAR)]
    InvalidId { id: String },
    #[error("this node already serves {max} auto tenants (admission.auto_tenants_max)")]
    CapReached { max: u64 },
    #[error("could not persist the new tenant: {0}")]
    Store(#[from] StoreError),
}

pub struct Tenants {
    store: Store,
    defaults: TenantBounds,
    auto_max: u64,
    version: AtomicU64,
    current: Mutex<Arc<Directory>>,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("version", &self.version.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Tenants {
    /// Assigns ordinals to the declared tenants (persisted, synced) and loads every tenant
    /// the store already knows. Tenants in the store that the file no longer declares are
    /// auto tenants: they keep their rows, and `auto_tenants` sources may still route to them.
    pub fn open(store: &Store, config: &Config) -> Result<Tenants, StoreError> {
        let declared = store.ensure_tenants(config.tenants.iter().map(|t| t.id.as_str()))?;
        let mut by_id = HashMap::new();
        for (id, ordinal) in store.tenants()? {
            let declared_bounds = config.tenants.iter().find(|t| t.id == id);
            let id: Arc<str> = id.into();
            by_id.insert(
                id.clone(),
                Tenant {
                    id,
                    ordinal,
                    bounds: declared_bounds
                        .map(|t| t.bounds)
                        .unwrap_or(config.tenant_defaults),
                    declared: declared_bounds.is_some(),
                },
            );
        }
        debug_assert!(declared
            .iter()
            .all(|(id, _)| by_id.contains_key(id.as_str())));
        Ok(Tenants {
            store: store.clone(),
            defaults: config.tenant_defaults,
            auto_max: config.admission.auto_tenants_max,
            version: AtomicU64::new(1),
            current: Mutex::new(Arc::new(Directory {
                by_id,
                retired: Default::default(),
            })),
        })
    }

    /// The current directory (takes the mutex: not for the request path; see [`View`]).
    pub fn snapshot(&self) -> Arc<Directory> {
        self.lock().clone()
    }

    /// A lock-free view for one ingest core.
    pub fn view(self: &Arc<Self>) -> View {
        View {
            tenants: self.clone(),
            seen: Cell::new(self.version.load(Ordering::Acquire)),
            directory: RefCell::new(self.snapshot()),
        }
    }

    /// Creates the auto tenant `id`, or returns it when another core just did.
    pub fn create_auto(&self, id: &str) -> Result<Tenant, CreateError> {
        if !config::is_valid_id(id) {
            return Err(CreateError::InvalidId { id: id.to_owned() });
        }
        let mut current = self.lock();
        if let Some(tenant) = current.get(id) {
            return Ok(tenant.clone());
        }
        if current.auto_count() >= self.auto_max {
            return Err(CreateError::CapReached { max: self.auto_max });
        }
        let assigned = self.store.ensure_tenants([id])?;
        let ordinal = assigned[0].1;
        let tenant = Tenant {
            id: id.into(),
            ordinal,
            bounds: self.defaults,
            declared: false,
        };
        let mut next = Directory::clone(&current);
        next.by_id.insert(tenant.id.clone(), tenant.clone());
        self.publish(&mut current, next);
        tracing::info!(tenant = id, ordinal, "auto tenant created");
        metrics::counter!("ankusa_tenants_created_total").increment(1);
        Ok(tenant)
    }

    /// Takes tenant `id` out of service for a purge: requests for it are no longer routed,
    /// and its ordinal is retired, so the writer refuses anything still on its way for it.
    pub fn retire(&self, id: &str) -> Option<Tenant> {
        let mut current = self.lock();
        let tenant = current.get(id)?.clone();
        let mut next = Directory::clone(&current);
        next.by_id.remove(id);
        next.retired.insert(tenant.ordinal);
        self.publish(&mut current, next);
        Some(tenant)
    }

    /// Puts a retired tenant back under its ordinal (a purge that could not start).
    pub fn restore(&self, tenant: Tenant) {
        let mut current = self.lock();
        let mut next = Directory::clone(&current);
        next.retired.remove(&tenant.ordinal);
        next.by_id.insert(tenant.id.clone(), tenant);
        self.publish(&mut current, next);
    }

    /// Gives a declared tenant whose old ordinal was purged a new ordinal (persisted): it
    /// keeps being served, from an empty store.
    pub fn reinstate(&self, retired: &Tenant) -> Result<Tenant, StoreError> {
        let mut current = self.lock();
        let assigned = self.store.ensure_tenants([&*retired.id])?;
        let tenant = Tenant {
            ordinal: assigned[0].1,
            ..retired.clone()
        };
        let mut next = Directory::clone(&current);
        next.by_id.insert(tenant.id.clone(), tenant.clone());
        self.publish(&mut current, next);
        Ok(tenant)
    }

    fn publish(&self, current: &mut Arc<Directory>, next: Directory) {
        *current = Arc::new(next);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<Directory>> {
        // The guarded value is replaced whole, never left half-written: a panic elsewhere
        // cannot poison its meaning.
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One core's copy of the directory: a lookup is one atomic load and a hash lookup.
pub struct View {
    tenants: Arc<Tenants>,
    seen: Cell<u64>,
    directory: RefCell<Arc<Directory>>,
}

impl std::fmt::Debug for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("seen", &self.seen.get())
            .finish_non_exhaustive()
    }
}

impl View {
    /// The tenant `id`, from the newest directory.
    pub fn get(&self, id: &str) -> Option<Tenant> {
        self.refresh();
        self.directory.borrow().get(id).cloned()
    }

    /// Whether `ordinal` is being or was purged.
    pub fn is_retired(&self, ordinal: u32) -> bool {
        self.refresh();
        self.directory.borrow().is_retired(ordinal)
    }

    fn refresh(&self) {
        let version = self.tenants.version.load(Ordering::Acquire);
        if version != self.seen.get() {
            *self.directory.borrow_mut() = self.tenants.snapshot();
            self.seen.set(version);
        }
    }

    pub fn tenants(&self) -> &Arc<Tenants> {
        &self.tenants
    }
}
