//! Store format migrations: a registry of `(from, to, step)`, forward-only, run at boot.
//! Each step must be bounded and resumable: it commits its work in batches and stamps
//! `to` in the batch of its last piece, so a crash mid-step reruns the step on the
//! already-migrated prefix harmlessly.

use super::{keys, Store, StoreError, CF_META, FORMAT};

pub type Step = fn(&Store) -> Result<(), StoreError>;

/// Format 1 is the base store; 2 adds the ordering lanes.
pub const REGISTRY: &[(u32, u32, Step)] = &[(1, 2, ordering_lanes)];

/// 1 → 2: the ordering lanes. No lane exists in a format-1 store, so nothing is rewritten:
/// the step only leads to the new stamp, the one-way door a format-1 binary refuses.
fn ordering_lanes(_store: &Store) -> Result<(), StoreError> {
    Ok(())
}

/// Refuses a store of format `store` in a binary of format `binary` when the store is
/// newer, naming both.
pub fn refuse_newer(path: &std::path::Path, store: u32, binary: u32) -> Result<(), StoreError> {
    if store > binary {
        return Err(StoreError::FormatNewer {
            path: path.to_path_buf(),
            store,
            binary,
        });
    }
    Ok(())
}

/// Stamps a new store, refuses a newer one, and runs every step from the store's format
/// up to [`FORMAT`].
pub fn run(store: &Store) -> Result<(), StoreError> {
    let Some(mut format) = store.format()? else {
        stamp_new(store)?;
        return Ok(());
    };
    refuse_newer(store.path(), format, FORMAT)?;
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

    /// The format-1 binary's check (its constant was 1) refuses a format-2 store, naming
    /// both formats; a format-1 store migrates to 2 and rewrites nothing.
    #[test]
    fn a_format_1_binary_refuses_the_lanes_store_and_format_1_migrates() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(FORMAT, 2);
        let error = refuse_newer(dir.path(), store.format().unwrap().unwrap(), 1).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "store at {} has format 2, newer than this binary's format 1; run a newer ankusa",
                dir.path().display()
            )
        );
        stamp(&store, 1).unwrap();
        let before = crate::store::fixture::dump(&store).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.format().unwrap(), Some(2));
        let after = crate::store::fixture::dump(&store).unwrap();
        let differs: Vec<_> = before
            .iter()
            .zip(&after)
            .filter(|(a, b)| a != b)
            .map(|(a, _)| String::from_utf8_lossy(&a.1).into_owned())
            .collect();
        assert_eq!(before.len(), after.len());
        assert_eq!(differs, vec!["format".to_owned()], "only the stamp changes");
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
