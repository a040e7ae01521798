//! Store format migrations: a registry of `(from, to, step)`, forward-only, run at boot.
//! Each step must be bounded and resumable: it commits its work in batches and stamps
//! `to` in the batch of its last piece, so a crash mid-step reruns the step on the
//! already-migrated prefix harmlessly.

use super::{keys, Store, StoreError, CF_META, FORMAT};

pub type Step = fn(&Store) -> Result<(), StoreError>;

/// Format 1 is the base store; later formats add entries here (the ordering lanes are
/// the next one).
pub const REGISTRY: &[(u32, u32, Step)] = &[];

/// Stamps a new store, refuses a newer one, and runs every step from the store's format
/// up to [`FORMAT`].
pub fn run(store: &Store) -> Result<(), StoreError> {
    let Some(mut format) = store.format()? else {
        stamp_new(store)?;
        return Ok(());
    };
    if format > FORMAT {
        return Err(StoreError::FormatNewer {
            path: store.path().to_path_buf(),
            store: format,
            binary: FORMAT,
        });
    }
    while format < FORMAT {
        let Some((_, to, step)) = REGISTRY.iter().find(|(from, _, _)| *from == format) else {
            return Err(StoreError::NoMigration {
                path: store.path().to_path_buf(),
                store: format,
                binary: FORMAT,
            });
        };
        tracing::info!(from = format, to = *to, "migrating store");
        step(store)?;
        format = *to;
        stamp(store, format)?;
    }
    Ok(())
}

fn stamp_new(store: &Store) -> Result<(), StoreError> {
    let mut batch = super::WriteBatch::default();
    let instance_id = new_instance_id();
    store.put_cf(
        &mut batch,
        CF_META,
        keys::META_INSTANCE_ID,
        instance_id.as_bytes(),
    );
    store.put_cf(
        &mut batch,
        CF_META,
        keys::META_FORMAT,
        &FORMAT.to_be_bytes(),
    );
    store.write(batch, true)
}

/// Sets `meta/format`; also how tests make a store from the future.
pub fn stamp(store: &Store, format: u32) -> Result<(), StoreError> {
    let mut batch = super::WriteBatch::default();
    store.put_cf(
        &mut batch,
        CF_META,
        keys::META_FORMAT,
        &format.to_be_bytes(),
    );
    store.write(batch, true)
}

/// 128 random bits from the kernel, hex: names this store in logs and multi-node setups.
fn new_instance_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if filled.is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes = (nanos ^ u128::from(std::process::id())).to_be_bytes();
    }
    hex::encode(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn new_store_is_stamped_and_newer_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.format().unwrap(), Some(FORMAT));
        assert_eq!(store.instance_id().unwrap().map(|id| id.len()), Some(32));
        stamp(&store, FORMAT + 1).unwrap();
        drop(store);
        let error = Store::open(dir.path()).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "store at {} has format {}, newer than this binary's format {}; run a newer ankusa",
                dir.path().display(),
                FORMAT + 1,
                FORMAT
            )
        );
    }

    #[test]
    fn ordinals_are_persisted_and_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let first = store.ensure_tenants(["acme", "globex"]).unwrap();
        assert_eq!(first, vec![("acme".into(), 1), ("globex".into(), 2)]);
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        // A tenant removed from the config keeps its ordinal; a new one gets the next.
        let second = store.ensure_tenants(["globex", "initech"]).unwrap();
        assert_eq!(second, vec![("globex".into(), 2), ("initech".into(), 3)]);
        assert_eq!(store.tenants().unwrap().len(), 3);
    }
}
