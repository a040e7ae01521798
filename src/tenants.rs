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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::{self, Config, TenantBounds};
use crate::published::{Held, Local, Published};
use crate::store::{Store, StoreError};

/// One tenant as the edge and the admin see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: Arc<str>,
    pub ordinal: u32,
    pub bounds: TenantBounds,
    /// Named in the config file (else created by an `auto_tenants` source, or declared
    /// once and since removed from the file).
    pub declared: bool,
}

/// An immutable snapshot: replaced whole when a tenant is added, retired or the config is
/// reloaded.
#[derive(Debug, Clone)]
pub struct Directory {
    by_id: HashMap<Arc<str>, Tenant>,
    /// Ordinals of tenants being purged or purged: nothing may be added under them.
    retired: HashSet<u32>,
    /// Bounds of every tenant the file does not declare.
    defaults: TenantBounds,
    auto_max: u64,
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

    /// The bounds of the tenant with `ordinal`, or the defaults when none has it (a tenant
    /// purged meanwhile): what a long job re-reads between batches, so a reload applies.
    pub fn bounds_of(&self, ordinal: u32) -> TenantBounds {
        self.by_id
            .values()
            .find(|tenant| tenant.ordinal == ordinal)
            .map_or(self.defaults, |tenant| tenant.bounds)
    }

    pub fn is_retired(&self, ordinal: u32) -> bool {
        self.retired.contains(&ordinal)
    }

    fn auto_count(&self) -> u64 {
        self.by_id.values().filter(|t| !t.declared).count() as u64
    }

    /// Every tenant the store knows, declared or not as `config` says.
    fn build(
        store: &Store,
        config: &Config,
        retired: HashSet<u32>,
    ) -> Result<Directory, StoreError> {
        store.ensure_tenants(config.tenants.iter().map(|t| t.id.as_str()))?;
        let mut by_id = HashMap::new();
        for (id, ordinal) in store.tenants()? {
            // A tenant being purged stays out of service.
            if retired.contains(&ordinal) {
                continue;
            }
            let declared = config.tenants.iter().find(|t| t.id == id);
            let id: Arc<str> = id.into();
            let tenant = Tenant {
                id: id.clone(),
                ordinal,
                bounds: declared.map_or(config.tenant_defaults, |t| t.bounds),
                declared: declared.is_some(),
            };
            by_id.insert(id, tenant);
        }
        Ok(Directory {
            by_id,
            retired,
            defaults: config.tenant_defaults,
            auto_max: config.admission.auto_tenants_max,
        })
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

#[derive(Debug)]
pub struct Tenants {
    store: Store,
    directory: Arc<Published<Directory>>,
}

impl Tenants {
    /// Assigns ordinals to the declared tenants (persisted, synced) and loads every tenant
    /// the store already knows. Tenants in the store that the file does not declare are
    /// served like auto tenants: they keep their rows, and `auto_tenants` sources may
    /// still route to them.
    pub fn open(store: &Store, config: &Config) -> Result<Tenants, StoreError> {
        let directory = Directory::build(store, config, HashSet::new())?;
        Ok(Tenants {
            store: store.clone(),
            directory: Arc::new(Published::new(directory)),
        })
    }

    /// Follows a reloaded config: new declared tenants get ordinals, bounds and defaults
    /// change, tenants no longer declared stay with their rows as undeclared ones.
    pub fn apply(&self, config: &Config) -> Result<(), StoreError> {
        self.directory.update(|current| {
            Ok((
                Directory::build(&self.store, config, current.retired.clone())?,
                (),
            ))
        })
    }

    /// The current directory (takes the mutex: not for the request path; see [`View`]).
    pub fn snapshot(&self) -> Arc<Directory> {
        self.directory.load()
    }

    /// A lock-free view for one core or thread.
    pub fn view(&self) -> View {
        View {
            local: Local::new(self.directory.clone()),
        }
    }

    /// Creates the auto tenant `id`, or returns it when another core just did.
    pub fn create_auto(&self, id: &str) -> Result<Tenant, CreateError> {
        if !config::is_valid_id(id) {
            return Err(CreateError::InvalidId { id: id.to_owned() });
        }
        let created = self.directory.update(|current| {
            if let Some(tenant) = current.get(id) {
                return Err(Ok(tenant.clone()));
            }
            if current.auto_count() >= current.auto_max {
                return Err(Err(CreateError::CapReached {
                    max: current.auto_max,
                }));
            }
            let assigned = self
                .store
                .ensure_tenants([id])
                .map_err(|error| Err(error.into()))?;
            let tenant = Tenant {
                id: id.into(),
                ordinal: assigned[0].1,
                bounds: current.defaults,
                declared: false,
            };
            let mut next = current.clone();
            next.by_id.insert(tenant.id.clone(), tenant.clone());
            Ok((next, tenant))
        });
        match created {
            Ok(tenant) => {
                tracing::info!(tenant = id, ordinal = tenant.ordinal, "auto tenant created");
                metrics::counter!("ankusa_tenants_created_total").increment(1);
                Ok(tenant)
            }
            // Another core created it first.
            Err(Ok(tenant)) => Ok(tenant),
            Err(Err(error)) => Err(error),
        }
    }

    /// Takes tenant `id` out of service for a purge: requests for it are no longer routed,
    /// and its ordinal is retired, so the writer refuses anything still on its way for it.
    pub fn retire(&self, id: &str) -> Option<Tenant> {
        self.directory
            .update(|current| {
                let tenant = current.get(id).cloned().ok_or(())?;
                let mut next = current.clone();
                next.by_id.remove(id);
                next.retired.insert(tenant.ordinal);
                Ok::<_, ()>((next, tenant))
            })
            .ok()
    }

    /// Puts a retired tenant back under its ordinal (a purge that could not start).
    pub fn restore(&self, tenant: Tenant) {
        let _ = self.directory.update(|current| {
            let mut next = current.clone();
            next.retired.remove(&tenant.ordinal);
            next.by_id.insert(tenant.id.clone(), tenant);
            Ok::<_, ()>((next, ()))
        });
    }

    /// Gives a declared tenant whose old ordinal was purged a new ordinal (persisted): it
    /// keeps being served, from an empty store.
    pub fn reinstate(&self, retired: &Tenant) -> Result<Tenant, StoreError> {
        self.directory.update(|current| {
            let assigned = self.store.ensure_tenants([&*retired.id])?;
            let tenant = Tenant {
                ordinal: assigned[0].1,
                ..retired.clone()
            };
            let mut next = current.clone();
            next.by_id.insert(tenant.id.clone(), tenant.clone());
            Ok((next, tenant))
        })
    }
}

/// One core's copy of the directory: a lookup is one atomic load and a hash lookup.
#[derive(Debug)]
pub struct View {
    local: Local<Directory>,
}

impl View {
    fn directory(&self) -> Held<Directory> {
        self.local.get()
    }

    /// The tenant `id`, from the newest directory.
    pub fn get(&self, id: &str) -> Option<Tenant> {
        self.directory().get(id).cloned()
    }

    /// Whether `ordinal` is being or was purged.
    pub fn is_retired(&self, ordinal: u32) -> bool {
        self.directory().is_retired(ordinal)
    }
}
