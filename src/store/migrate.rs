//! Store format migrations: a registry of `(from, to, step)`, forward-only, run at boot.
//! Each step must be bounded and resumable: it commits its work in batches, and `to` is
//! stamped only after its last batch, so a crash mid-step reruns the step on the
//! already-migrated prefix harmlessly. A step that rewrites records reports its progress
//! (records counted, then done) to a [`Progress`]: the admin API's job during `serve`, a
//! bar in `ankusa store migrate`.

use super::codec::HookRecord;
use super::{keys, Store, StoreError, WriteBatch, CF_ARCHIVE, CF_HOOKS, CF_META, FORMAT};

pub type Step = fn(&Store, &dyn Progress) -> Result<(), StoreError>;

/// Format 1 is the base store; 2 adds the ordering lanes; 3 seals every hook record with
/// an integrity digest; 4 adds the replay class of due keys (kind 4).
pub const REGISTRY: &[(u32, u32, Step)] = &[
    (1, 2, ordering_lanes),
    (2, 3, integrity_digests),
    (3, 4, replay_class),
];

/// Where a migration reports how far it is.
pub trait Progress: Sync {
    /// A step from `from` to `to` begins and will visit `total` records.
    fn step(&self, from: u32, to: u32, total: u64);
    /// `records` more were visited (rewritten or found already done).
    fn advance(&self, records: u64);
}

/// No report (tests, fixtures, offline tools that show nothing).
pub struct Silent;

impl Progress for Silent {
    fn step(&self, _: u32, _: u32, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// Records rewritten per committed batch of a step, and the bytes they may hold: bounded
/// so a large store migrates in steps a crash can resume from.
const BATCH_RECORDS: usize = 1024;
const BATCH_BYTES: usize = 8 << 20;

/// 1 → 2: the ordering lanes. No lane exists in a format-1 store, so nothing is rewritten:
/// the step only leads to the new stamp, the one-way door a format-1 binary refuses.
fn ordering_lanes(_store: &Store, progress: &dyn Progress) -> Result<(), StoreError> {
    progress.step(1, 2, 0);
    Ok(())
}

/// 3 → 4: the replay class. No format-3 store has a due key of kind 4, so nothing is
/// rewritten; a format-3 binary must refuse what follows (it would dead-letter such a key
/// as undecodable).
fn replay_class(_store: &Store, progress: &dyn Progress) -> Result<(), StoreError> {
    progress.step(3, 4, 0);
    Ok(())
}

/// 2 → 3: every hook record, pending or archived, is rewritten as version 2, sealed with
/// the digest of what the store holds. A record that does not decode is left as it is
/// (sealing it would vouch for bytes nobody can read; `store verify` names it).
fn integrity_digests(store: &Store, progress: &dyn Progress) -> Result<(), StoreError> {
    let families = [CF_HOOKS, CF_ARCHIVE];
    let mut total = 0u64;
    for family in families {
        store.scan(family, &[], None, |_, _| {
            total += 1;
            Ok(true)
        })?;
    }
    progress.step(2, 3, total);
    for family in families {
        let mut from: Vec<u8> = Vec::new();
        loop {
            let mut batch = WriteBatch::default();
            let (mut records, mut bytes, mut visited) = (0usize, 0usize, 0u64);
            let mut next = None;
            store.scan(family, &from, None, |key, value| {
                if records >= BATCH_RECORDS || bytes >= BATCH_BYTES {
                    next = Some(key.to_vec());
                    return Ok(false);
                }
                visited += 1;
                match HookRecord::upgrade(value) {
                    Ok(Some(sealed)) => {
                        bytes += sealed.len();
                        records += 1;
                        store.put_cf(&mut batch, family, key, &sealed);
                    }
                    Ok(None) => {}
                    Err(error) => tracing::warn!(
                        family,
                        key = %hex::encode(key),
                        %error,
                        "hook record does not decode; left unsealed"
                    ),
                }
                Ok(true)
            })?;
            if records > 0 {
                if crate::faults::active(crate::faults::Fault::SlowMigration) {
                    std::thread::sleep(crate::faults::SLOW_MIGRATION_DELAY);
                }
                store.write(batch, true)?;
            }
            progress.advance(visited);
            match next {
                Some(key) => from = key,
                None => break,
            }
        }
    }
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
/// up to [`FORMAT`], reporting to `progress`.
pub fn run(store: &Store, progress: &dyn Progress) -> Result<(), StoreError> {
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
        step(store, progress)?;
        format = *to;
        stamp(store, format)?;
    }
    Ok(())
}

fn stamp_new(store: &Store) -> Result<(), StoreError> {
    let mut batch = WriteBatch::default();
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
    let mut batch = WriteBatch::default();
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

    /// The previous binary's check (its constant was 3) refuses a format-4 store, naming
    /// both formats; an empty format-1 store migrates to 4 and only its stamp changes.
    #[test]
    fn a_format_3_binary_refuses_the_replay_class_store_and_format_1_migrates() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(FORMAT, 4);
        let error = refuse_newer(dir.path(), store.format().unwrap().unwrap(), 3).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "store at {} has format 4, newer than this binary's format 3; run a newer ankusa",
                dir.path().display()
            )
        );
        stamp(&store, 1).unwrap();
        let before = crate::store::fixture::dump(&store).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.format().unwrap(), Some(4));
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

    #[derive(Default)]
    struct Counted {
        steps: std::sync::Mutex<Vec<(u32, u32, u64)>>,
        done: std::sync::atomic::AtomicU64,
    }

    impl Progress for Counted {
        fn step(&self, from: u32, to: u32, total: u64) {
            self.steps.lock().unwrap().push((from, to, total));
        }
        fn advance(&self, records: u64) {
            self.done
                .fetch_add(records, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Format 2 → 3 seals every pending and archived hook (over several batches), keeps
    /// each record's fields, leaves an undecodable one unsealed, reports every record it
    /// visits, and a second run (a crash before the stamp) rewrites nothing.
    #[test]
    fn format_2_records_are_sealed_in_batches_with_progress() {
        use crate::store::codec::{HOOK_VERSION, HOOK_VERSION_UNDIGESTED};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let record = |seq: u64| HookRecord {
            source_id: "stripe".into(),
            tenant_id: "acme".into(),
            received_at_ms: 1_000 + seq,
            dedupe_key: Vec::new(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: format!("{{\"seq\":{seq}}}").into_bytes(),
        };
        let unsealed = |seq: u64| {
            let mut out = Vec::new();
            record(seq).encode(&mut out);
            out.truncate(out.len() - crate::store::codec::HOOK_DIGEST_LEN);
            out[0] = HOOK_VERSION_UNDIGESTED;
            out
        };
        let pending = BATCH_RECORDS as u64 + 7;
        let mut batch = WriteBatch::default();
        let mut key = Vec::new();
        for seq in 1..=pending {
            key.clear();
            keys::hook(&mut key, 1, seq);
            store.put_cf(&mut batch, CF_HOOKS, &key, &unsealed(seq));
        }
        for seq in pending + 1..=pending + 5 {
            key.clear();
            keys::archive(&mut key, 1, 1_000 + seq, seq);
            store.put_cf(&mut batch, CF_ARCHIVE, &key, &unsealed(seq));
        }
        key.clear();
        keys::hook(&mut key, 2, 1);
        store.put_cf(&mut batch, CF_HOOKS, &key, &[HOOK_VERSION_UNDIGESTED, 0, 9]);
        store.write(batch, true).unwrap();
        stamp(&store, 2).unwrap();
        drop(store);

        let progress = Counted::default();
        let store =
            Store::open_reporting(dir.path(), crate::store::Memory::DEFAULT, &progress).unwrap();
        assert_eq!(store.format().unwrap(), Some(4));
        let total = pending + 5 + 1;
        assert_eq!(
            *progress.steps.lock().unwrap(),
            vec![(2, 3, total), (3, 4, 0)]
        );
        assert_eq!(
            progress.done.load(std::sync::atomic::Ordering::Relaxed),
            total
        );
        let mut sealed = 0;
        for family in [CF_HOOKS, CF_ARCHIVE] {
            store
                .scan(family, &[], None, |key, value| {
                    if keys::parse_hook(key).ok() == Some((2, 1)) {
                        assert_eq!(value, [HOOK_VERSION_UNDIGESTED, 0, 9]);
                        return Ok(true);
                    }
                    assert_eq!(value[0], HOOK_VERSION);
                    let decoded = HookRecord::decode(value).unwrap();
                    let seq = decoded.received_at_ms - 1_000;
                    assert_eq!(decoded, record(seq));
                    sealed += 1;
                    Ok(true)
                })
                .unwrap();
        }
        assert_eq!(sealed, pending + 5);

        // Rerun as after a crash between the last batch and the stamp.
        let before = crate::store::fixture::dump(&store).unwrap();
        stamp(&store, 2).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(crate::store::fixture::dump(&store).unwrap(), before);
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
