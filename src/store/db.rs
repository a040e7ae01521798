//! The RocksDB database: column families, options, the format stamp and its migrations,
//! tenant ordinals, counters, reads and writes. The one module that imports `rocksdb`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::compaction_filter::Decision as CompactionDecision;
use rocksdb::{
    BlockBasedIndexType, BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor,
    DBCompressionType, Direction, IteratorMode, MergeOperands, Options, ReadOptions, WriteOptions,
    DB,
};
use thiserror::Error;

pub use rocksdb::WriteBatch;

use super::keys::{self, Counter};
use super::memory::Memory;
use super::{gauges, migrate};

/// The format this binary writes. 1 is the base store (DESIGN section 2 without lanes); 2
/// adds the ordering lanes (`?O`, `?H`, `?P`, due kinds 2 and 3, counters 10–12, laned
/// delivery rows). A store that never enables ordering differs from format 1 only in its
/// stamp, but a format-1 binary must refuse it: it could not read what a lane leaves. 3
/// seals every hook record with an integrity digest (hook records of version 2), which a
/// format-2 binary could not read. 4 adds due keys of kind 4, the replay class of first
/// attempts (`deliveries::Class`), which a format-3 binary would dead-letter as
/// undecodable.
pub const FORMAT: u32 = 4;

pub const CF_META: &str = "meta";
pub const CF_HOOKS: &str = "hooks";
pub const CF_DELIVERIES: &str = "deliveries";
pub const CF_INDEX: &str = "index";
pub const CF_ARCHIVE: &str = "archive";
const ALL_CFS: [&str; 5] = [CF_META, CF_HOOKS, CF_DELIVERIES, CF_INDEX, CF_ARCHIVE];

/// What RocksDB holds of the two bounds now (`ankusa_store_block_cache_bytes`,
/// `ankusa_store_memtable_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    pub block_cache_bytes: u64,
    pub memtable_bytes: u64,
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("store at {path} has format {store}, newer than this binary's format {binary}; run a newer ankusa")]
    FormatNewer {
        path: PathBuf,
        store: u32,
        binary: u32,
    },
    #[error("store at {path} has format {store} and no migration leads from it to {binary}")]
    NoMigration {
        path: PathBuf,
        store: u32,
        binary: u32,
    },
    #[error("store at {path} is not an ankusa store: {reason}")]
    NotAStore { path: PathBuf, reason: String },
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt {what}: {reason}")]
    Corrupt { what: String, reason: String },
    #[error("tenant ordinals exhausted")]
    OrdinalsExhausted,
}

impl StoreError {
    /// RocksDB found stored bytes that fail its own checksums (a damaged SST file or
    /// WAL): the data is gone, so retrying the read cannot help.
    pub fn is_corruption(&self) -> bool {
        matches!(self, StoreError::Rocks(error) if error.kind() == rocksdb::ErrorKind::Corruption)
    }
}

/// One entry as read from a scan or seek.
pub type KeyValue = (Box<[u8]>, Box<[u8]>);

/// The open store. Cheap to clone; every clone is the same database.
#[derive(Clone)]
pub struct Store {
    db: Arc<DB>,
    path: PathBuf,
    /// Pending and bytes of every tenant, mirrored in memory for admission.
    gauges: Arc<gauges::Gauges>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Counters merge by adding big-endian i64 deltas; a malformed operand is skipped rather
/// than poisoning the key, and `store verify` reports the resulting mismatch.
fn add_i64(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut total = existing
        .and_then(|v| keys::decode_counter(v).ok())
        .unwrap_or(0);
    for operand in operands {
        if let Ok(delta) = keys::decode_counter(operand) {
            total = total.wrapping_add(delta);
        }
    }
    Some(keys::encode_counter_delta(total).to_vec())
}

/// Expired dedupe entries leave the store at compaction: no sweep ever scans live data for
/// them. The writer treats an expired entry it still finds as absent, so the moment of the
/// compaction does not matter.
fn drop_expired_dedupe(_level: u32, key: &[u8], value: &[u8]) -> CompactionDecision {
    if key.first() != Some(&(keys::Tag::Dedupe as u8)) {
        return CompactionDecision::Keep;
    }
    match keys::parse_dedupe_value(value) {
        Ok((_, expires_ms)) if expires_ms <= crate::clock::now_ms() => CompactionDecision::Remove,
        _ => CompactionDecision::Keep,
    }
}

/// The size of one partition of a table file's index or filter.
const METADATA_BLOCK_BYTES: usize = 4096;

/// Merge operands a counter key keeps in the memtable before a write folds them.
const COUNTER_OPERANDS_MAX: usize = 64;

fn cf_options(name: &str, cache: &Cache) -> Options {
    let mut options = Options::default();
    let mut table = BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table.set_block_cache(cache);
    // Index and filter blocks count against the cache rather than beside it; level 0's
    // stay pinned, as its files are read on every lookup. Both are partitioned into
    // blocks of `METADATA_BLOCK_BYTES`: whole, a flushed memtable's index is megabytes,
    // more than one shard of the cache holds, so it was dropped after each use and read
    // again by the next lookup (delivery fell from 11k to 1.3k hooks/s once the backlog
    // left the memtables). Only the small top level of each stays pinned.
    table.set_cache_index_and_filter_blocks(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table.set_index_type(BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(METADATA_BLOCK_BYTES);
    table.set_pin_top_level_index_and_filter(true);
    options.set_block_based_table_factory(&table);
    match name {
        CF_INDEX => {
            options.set_merge_operator_associative("ankusa_add_i64", add_i64);
            // Every committed batch adds a merge operand to a few counters. Unbounded, a
            // counter read walks every operand since the last flush (tens of thousands under
            // load, for each gauge refresh); past this many the write folds them into one
            // value instead (from memory only, never a file read on the write path).
            options.set_max_successive_merges(COUNTER_OPERANDS_MAX);
            options.set_compaction_filter("ankusa_dedupe_expiry", drop_expired_dedupe);
            options.set_compression_type(DBCompressionType::Lz4);
        }
        // A pending hook is read once more, at its claim, soon after it was written; in a
        // store this small its first compaction is already the bottommost level, so ZSTD
        // there would put a decompression on every claim under a backlog. Only archived
        // hooks, read rarely and kept for days, are worth the denser encoding.
        CF_ARCHIVE => {
            options.set_compression_type(DBCompressionType::Lz4);
            options.set_bottommost_compression_type(DBCompressionType::Zstd);
        }
        _ => options.set_compression_type(DBCompressionType::Lz4),
    }
    options
}

impl Store {
    /// Opens (creating if absent) the store at `path`, stamps a new store with [`FORMAT`],
    /// refuses a newer one and runs the migrations of an older one.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_reporting(path, Memory::DEFAULT, &migrate::Silent)
    }

    /// [`Store::open`] within `memory`, with a migration's progress reported to `progress`.
    pub fn open_reporting(
        path: &Path,
        memory: Memory,
        progress: &dyn migrate::Progress,
    ) -> Result<Store, StoreError> {
        let store = Store::open_raw(path, true, memory)?;
        migrate::run(&store, progress)?;
        Ok(store)
    }

    /// Opens an existing store without creating or migrating it (offline tools).
    pub fn open_existing(path: &Path) -> Result<Store, StoreError> {
        if !path.join("CURRENT").exists() {
            return Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: "no RocksDB CURRENT file".into(),
            });
        }
        let store = Store::open_raw(path, false, Memory::DEFAULT)?;
        let format = store.format()?;
        match format {
            None => Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: "meta/format is missing".into(),
            }),
            Some(found) => {
                migrate::refuse_newer(path, found, FORMAT)?;
                Ok(store)
            }
        }
    }

    fn open_raw(path: &Path, create: bool, memory: Memory) -> Result<Store, StoreError> {
        let mut options = Options::default();
        options.create_if_missing(create);
        options.create_missing_column_families(create);
        // The writer syncs every batch itself; RocksDB's own background threads are few
        // because the box's cores belong to the pinned roles.
        options.set_max_background_jobs(2);
        options.set_bytes_per_sync(1 << 20);
        options.set_keep_log_file_num(4);
        options.set_db_write_buffer_size(memory.memtable_bytes);

        let cache = Cache::new_lru_cache(memory.block_cache_bytes);
        let descriptors = ALL_CFS
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(*name, cf_options(name, &cache)));
        let db = DB::open_cf_descriptors(&options, path, descriptors)?;
        let store = Store {
            db: Arc::new(db),
            path: path.to_path_buf(),
            gauges: Arc::new(gauges::Gauges::new()),
        };
        store.seed_gauges()?;
        Ok(store)
    }

    /// Loads the pending, bytes and quarantined counters of every tenant and the node into
    /// the mirror.
    fn seed_gauges(&self) -> Result<(), StoreError> {
        let (start, end) = keys::family_range_all(keys::Tag::Counter);
        let mut seeded: Vec<(u32, [i64; 3])> = Vec::new();
        self.scan(CF_INDEX, &start, Some(&end), |key, value| {
            if let Ok(keys::IndexKey::Counter { ordinal, field }) = keys::parse_index(key) {
                let value = keys::decode_counter(value).unwrap_or(0);
                if seeded.last().map(|s| s.0) != Some(ordinal) {
                    seeded.push((ordinal, [0; 3]));
                }
                if let Some((_, last)) = seeded.last_mut() {
                    match Counter::from_field(field) {
                        Some(Counter::Pending) => last[0] = value,
                        Some(Counter::Bytes) => last[1] = value,
                        Some(Counter::Quarantined) => last[2] = value,
                        Some(Counter::LaneMembers) if ordinal == keys::NODE_ORDINAL => {
                            self.gauges.seed_lane_members(value);
                        }
                        _ => {}
                    }
                }
            }
            Ok(true)
        })?;
        for (ordinal, values) in seeded {
            self.gauges.seed(ordinal, values);
        }
        Ok(())
    }

    /// The in-memory mirror of pending and bytes, for admission.
    pub fn gauges(&self) -> &Arc<gauges::Gauges> {
        &self.gauges
    }

    /// The instance's secret key for hashed headers, made (random, synced) on first use.
    /// It stays in the store: hashes of one store stay comparable across restarts, and a
    /// copy of the data directory alone does not let anyone test guesses elsewhere.
    pub fn header_hash_key(&self) -> Result<[u8; 32], StoreError> {
        let meta = self.cf(CF_META);
        if let Some(bytes) = self.db.get_cf(meta, keys::META_HEADER_HASH_KEY)? {
            return <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| StoreError::Corrupt {
                what: "meta/header_hash_key".into(),
                reason: format!("{} bytes, expected 32", bytes.len()),
            });
        }
        let mut key = [0u8; 32];
        use std::io::Read as _;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut random| random.read_exact(&mut key))
            .map_err(|error| StoreError::Corrupt {
                what: "header hash key".into(),
                reason: format!("cannot read /dev/urandom: {error}"),
            })?;
        let mut batch = WriteBatch::default();
        batch.put_cf(meta, keys::META_HEADER_HASH_KEY, key);
        self.write(batch, true)?;
        Ok(key)
    }

    /// Compacts the whole index family range: expired dedupe entries go (tests and
    /// `store compact`).
    pub fn compact_index(&self) {
        self.db
            .compact_range_cf::<&[u8], &[u8]>(self.cf(CF_INDEX), None, None);
    }

    /// Compacts every column family fully (after a flush, the data directory then holds
    /// only live values).
    pub fn compact_all(&self) {
        for name in ALL_CFS {
            self.db
                .compact_range_cf::<&[u8], &[u8]>(self.cf(name), None, None);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn cf(&self, name: &str) -> &ColumnFamily {
        // Every name in ALL_CFS is opened by open_raw, so absence is a programmer error.
        match self.db.cf_handle(name) {
            Some(cf) => cf,
            None => panic!("column family {name} was not opened"),
        }
    }

    pub fn format(&self) -> Result<Option<u32>, StoreError> {
        match self.db.get_cf(self.cf(CF_META), keys::META_FORMAT)? {
            None => Ok(None),
            Some(bytes) => Ok(Some(decode_u32(&bytes, "meta/format")?)),
        }
    }

    pub fn instance_id(&self) -> Result<Option<String>, StoreError> {
        Ok(self
            .db
            .get_cf(self.cf(CF_META), keys::META_INSTANCE_ID)?
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Highest seq ever committed (0 for a new store).
    pub fn last_seq(&self) -> Result<u64, StoreError> {
        match self.db.get_cf(self.cf(CF_META), keys::META_SEQ)? {
            None => Ok(0),
            Some(bytes) => decode_u64(&bytes, "meta/seq"),
        }
    }

    /// Returns the ordinal of every tenant id, assigning new ordinals (persisted, synced,
    /// never reused) to ids the store has not seen. Runs at boot, before the writer starts,
    /// so it is the only writer of `meta/tenant/*` and `meta/next_ordinal`.
    pub fn ensure_tenants<'a>(
        &self,
        tenant_ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<(String, u32)>, StoreError> {
        let meta = self.cf(CF_META);
        let mut next = match self.db.get_cf(meta, keys::META_NEXT_ORDINAL)? {
            None => 1,
            Some(bytes) => decode_u32(&bytes, "meta/next_ordinal")?,
        };
        let mut batch = WriteBatch::default();
        let mut assigned = Vec::new();
        for tenant_id in tenant_ids {
            let key = keys::meta_tenant(tenant_id);
            let ordinal = match self.db.get_cf(meta, &key)? {
                Some(bytes) => decode_u32(&bytes, "meta/tenant")?,
                None => {
                    let ordinal = next;
                    next = next.checked_add(1).ok_or(StoreError::OrdinalsExhausted)?;
                    batch.put_cf(meta, &key, ordinal.to_be_bytes());
                    ordinal
                }
            };
            assigned.push((tenant_id.to_string(), ordinal));
        }
        if !batch.is_empty() {
            batch.put_cf(meta, keys::META_NEXT_ORDINAL, next.to_be_bytes());
            self.write(batch, true)?;
        }
        Ok(assigned)
    }

    /// The ordinal of `tenant_id`, if the store has assigned one: one point read.
    pub fn tenant_ordinal(&self, tenant_id: &str) -> Result<Option<u32>, StoreError> {
        match self
            .db
            .get_cf(self.cf(CF_META), keys::meta_tenant(tenant_id))?
        {
            None => Ok(None),
            Some(bytes) => Ok(Some(decode_u32(&bytes, "meta/tenant")?)),
        }
    }

    /// Every tenant the store knows, with its ordinal.
    pub fn tenants(&self) -> Result<Vec<(String, u32)>, StoreError> {
        let mut out = Vec::new();
        let prefix = keys::meta_tenant_prefix();
        for item in self.db.iterator_cf(
            self.cf(CF_META),
            IteratorMode::From(prefix, Direction::Forward),
        ) {
            let (key, value) = item?;
            let Some(id) = keys::parse_meta_tenant(&key) else {
                break;
            };
            out.push((
                String::from_utf8_lossy(id).into_owned(),
                decode_u32(&value, "meta/tenant")?,
            ));
        }
        Ok(out)
    }

    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        let mut options = WriteOptions::default();
        options.set_sync(sync);
        self.db.write_opt(batch, &options)?;
        Ok(())
    }

    pub fn counter(&self, ordinal: u32, field: Counter) -> Result<i64, StoreError> {
        let mut key = Vec::with_capacity(6);
        keys::counter(&mut key, ordinal, field);
        match self.db.get_cf(self.cf(CF_INDEX), &key)? {
            None => Ok(0),
            Some(bytes) => keys::decode_counter(&bytes).map_err(|e| StoreError::Corrupt {
                what: "counter".into(),
                reason: e.to_string(),
            }),
        }
    }

    pub fn get(&self, cf: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db.get_cf(self.cf(cf), key)?)
    }

    /// Point reads of many keys of `cf` in one call, each result in the place of its key.
    /// The keys go to RocksDB's batched lookup in ascending order, so neighbouring keys
    /// share each index partition, filter and data block that single gets would each walk
    /// again (a claim reads a run of consecutive hooks).
    pub fn get_many<K: AsRef<[u8]>>(
        &self,
        cf: &str,
        keys: &[K],
    ) -> Vec<Result<Option<Vec<u8>>, StoreError>> {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by(|&a, &b| keys[a].as_ref().cmp(keys[b].as_ref()));
        let sorted = order.iter().map(|&index| keys[index].as_ref());
        let mut answers: Vec<_> = order
            .iter()
            .zip(self.db.batched_multi_get_cf(self.cf(cf), sorted, true))
            .map(|(&index, answer)| {
                let answer = answer
                    .map(|value| value.map(|value| value.to_vec()))
                    .map_err(StoreError::from);
                (index, answer)
            })
            .collect();
        answers.sort_unstable_by_key(|&(index, _)| index);
        answers.into_iter().map(|(_, answer)| answer).collect()
    }

    /// Visits every entry of `cf` in `[start, end)` in key order; `visit` returns false to
    /// stop. The upper bound is enforced by RocksDB, so the scan never reads past it.
    pub fn scan(
        &self,
        cf: &str,
        start: &[u8],
        end: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let mut options = ReadOptions::default();
        if let Some(end) = end {
            options.set_iterate_upper_bound(end.to_vec());
        }
        let iterator = self.db.iterator_cf_opt(
            self.cf(cf),
            options,
            IteratorMode::From(start, Direction::Forward),
        );
        for item in iterator {
            let (key, value) = item?;
            if !visit(&key, &value)? {
                break;
            }
        }
        Ok(())
    }

    /// Visits every entry of `cf` in each of `ranges` (ascending, disjoint `[start, end)`)
    /// with one iterator, seeking only to a range the iterator has not reached yet. Making
    /// an iterator costs more than a seek, which is why a caller reading many small nearby
    /// ranges wants this. Between two ranges the iterator steps over whatever lies there,
    /// deleted keys included, so the caller keeps the ranges close together.
    pub fn scan_ranges<K: AsRef<[u8]>>(
        &self,
        cf: &str,
        ranges: &[(K, K)],
        mut visit: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), StoreError> {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return Ok(());
        };
        let mut options = ReadOptions::default();
        options.set_iterate_lower_bound(first.0.as_ref().to_vec());
        options.set_iterate_upper_bound(last.1.as_ref().to_vec());
        let mut iterator = self.db.raw_iterator_cf_opt(self.cf(cf), options);
        for (start, end) in ranges {
            let (start, end) = (start.as_ref(), end.as_ref());
            if !iterator.valid() || iterator.key().is_some_and(|key| key < start) {
                iterator.seek(start);
            }
            while let (Some(key), Some(value)) = (iterator.key(), iterator.value()) {
                if key >= end {
                    break;
                }
                visit(key, value);
                iterator.next();
            }
            iterator.status()?;
        }
        Ok(())
    }

    pub fn put_cf(&self, batch: &mut WriteBatch, cf: &str, key: &[u8], value: &[u8]) {
        batch.put_cf(self.cf(cf), key, value);
    }

    pub fn merge_cf(&self, batch: &mut WriteBatch, cf: &str, key: &[u8], value: &[u8]) {
        batch.merge_cf(self.cf(cf), key, value);
    }

    pub fn delete_cf(&self, batch: &mut WriteBatch, cf: &str, key: &[u8]) {
        batch.delete_cf(self.cf(cf), key);
    }

    /// Deletes every key of `cf` in `[start, end)` with one range tombstone: no scan.
    pub fn delete_range_cf(&self, batch: &mut WriteBatch, cf: &str, start: &[u8], end: &[u8]) {
        batch.delete_range_cf(self.cf(cf), start, end);
    }

    /// The first entry of `cf` in `[start, end)`: one seek.
    pub fn first(
        &self,
        cf: &str,
        start: &[u8],
        end: &[u8],
    ) -> Result<Option<KeyValue>, StoreError> {
        let mut options = ReadOptions::default();
        options.set_iterate_upper_bound(end.to_vec());
        let mut iterator = self.db.iterator_cf_opt(
            self.cf(cf),
            options,
            IteratorMode::From(start, Direction::Forward),
        );
        Ok(iterator.next().transpose()?)
    }

    /// Writes every column family's memtable to table files and waits for it, so the
    /// directory holds the data in SST files, not only in the WAL (store fixtures: an
    /// image should exercise the table format an upgraded store reads).
    pub fn flush(&self) -> Result<(), StoreError> {
        for name in ALL_CFS {
            self.db.flush_cf(self.cf(name))?;
        }
        Ok(())
    }

    /// What RocksDB holds now of its two memory bounds ([`Memory`]). The cache is one for
    /// every family, so any family reports it whole; each family has its own memtables.
    pub fn memory_usage(&self) -> Result<MemoryUsage, StoreError> {
        let property = |name: &str, key: &str| -> Result<u64, StoreError> {
            Ok(self
                .db
                .property_int_value_cf(self.cf(name), key)?
                .unwrap_or(0))
        };
        let mut memtable_bytes = 0;
        for name in ALL_CFS {
            memtable_bytes += property(name, "rocksdb.cur-size-all-mem-tables")?;
        }
        Ok(MemoryUsage {
            block_cache_bytes: property(CF_META, "rocksdb.block-cache-usage")?,
            memtable_bytes,
        })
    }

    /// Syncs the WAL; called once at shutdown after the writer's last batch.
    pub fn close(self) -> Result<(), StoreError> {
        self.db.flush_wal(true)?;
        Ok(())
    }
}

pub(crate) fn decode_u32(bytes: &[u8], what: &str) -> Result<u32, StoreError> {
    <[u8; 4]>::try_from(bytes)
        .map(u32::from_be_bytes)
        .map_err(|_| StoreError::Corrupt {
            what: what.into(),
            reason: format!("{} bytes, expected 4", bytes.len()),
        })
}

pub(crate) fn decode_u64(bytes: &[u8], what: &str) -> Result<u64, StoreError> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt {
            what: what.into(),
            reason: format!("{} bytes, expected 8", bytes.len()),
        })
}

/// The sum of RocksDB's perf context `metrics` over what `read` does on this thread: how
/// tests count the work a read does (blocks touched, tombstones stepped over).
#[cfg(test)]
pub(crate) fn perf_count(metrics: &[rocksdb::perf::PerfMetric], read: impl FnOnce()) -> u64 {
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfStatsLevel};
    set_perf_stats(PerfStatsLevel::EnableCount);
    let mut context = PerfContext::default();
    context.reset();
    read();
    let count = metrics.iter().map(|&metric| context.metric(metric)).sum();
    set_perf_stats(PerfStatsLevel::Disable);
    count
}

/// Blocks what `read` does on this thread touches, from the cache or the file.
#[cfg(test)]
pub(crate) fn blocks_touched(read: impl FnOnce()) -> u64 {
    use rocksdb::perf::PerfMetric;
    perf_count(
        &[PerfMetric::BlockCacheHitCount, PerfMetric::BlockReadCount],
        read,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rocksdb::perf::PerfMetric;

    use super::*;

    /// Merge operands a read of one counter key feeds the merge operator.
    fn operands_read(store: &Store, key: &[u8]) -> u64 {
        let mut end = key.to_vec();
        end.push(0);
        perf_count(&[PerfMetric::InternalMergeCount], || {
            store
                .scan(CF_INDEX, key, Some(&end), |_, _| Ok(true))
                .unwrap();
        })
    }

    #[test]
    fn a_counter_keeps_its_sum_and_a_bounded_operand_chain() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut key = Vec::new();
        keys::counter(&mut key, 7, Counter::Pending);
        let writes = COUNTER_OPERANDS_MAX * 5 + 3;
        let mut expected = 0i64;
        for round in 0..writes {
            let delta = if round % 3 == 0 { -2 } else { 5 };
            expected += delta;
            let mut batch = WriteBatch::default();
            store.merge_cf(
                &mut batch,
                CF_INDEX,
                &key,
                &keys::encode_counter_delta(delta),
            );
            store.write(batch, false).unwrap();
            assert_eq!(store.counter(7, Counter::Pending).unwrap(), expected);
            if round == COUNTER_OPERANDS_MAX * 2 {
                store.flush().unwrap();
            }
        }
        // Unbounded, this read would fold every operand written since the flush.
        let operands = operands_read(&store, &key);
        assert!(
            operands <= COUNTER_OPERANDS_MAX as u64 + 1,
            "{operands} operands read for one counter after {writes} merges"
        );
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.counter(7, Counter::Pending).unwrap(), expected);
    }

    /// `.cargo/config.toml` turns on SSE4.2 so RocksDB's CRC32C (each WAL record, each
    /// block read) uses the instruction; a build that lost it still works, only slower,
    /// so nothing but this check would notice.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn families_compress_as_configured() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let options = options_file(dir.path());
        let option = |family: &str, key: &str| {
            option_of(&options, &format!("[CFOptions \"{family}\"]"), key)
        };
        // Pending hooks are LZ4 at every level: a claim under a backlog never pays ZSTD.
        for family in [CF_HOOKS, CF_DELIVERIES, CF_INDEX, CF_META] {
            assert_eq!(option(family, "compression"), "kLZ4Compression", "{family}");
            assert_eq!(
                option(family, "bottommost_compression"),
                "kDisableCompressionOption",
                "{family}"
            );
        }
        assert_eq!(option(CF_ARCHIVE, "compression"), "kLZ4Compression");
        assert_eq!(option(CF_ARCHIVE, "bottommost_compression"), "kZSTD");
    }

    /// A claim reads a run of consecutive hooks with one batched lookup: each result comes
    /// back in the place of its key whatever the order asked, and neighbouring keys share
    /// the index partitions and data blocks that single gets would each walk again.
    #[test]
    fn many_reads_answer_each_key_in_its_place_and_share_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let key = |seq: u64| {
            let mut key = Vec::new();
            keys::hook(&mut key, 3, seq);
            key
        };
        let value = |seq: u64| format!("hook {seq} ").repeat(100).into_bytes();
        let mut batch = WriteBatch::default();
        for seq in (0..400).step_by(2) {
            store.put_cf(&mut batch, CF_HOOKS, &key(seq), &value(seq));
        }
        store.write(batch, false).unwrap();
        store.flush().unwrap();

        // Out of order, with absent keys (odd seqs) and one key twice.
        let asked: Vec<u64> = vec![398, 7, 0, 120, 121, 2, 398, 250];
        let asked_keys: Vec<Vec<u8>> = asked.iter().map(|&seq| key(seq)).collect();
        let answers: Vec<Option<Vec<u8>>> = store
            .get_many(CF_HOOKS, &asked_keys)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let expected: Vec<Option<Vec<u8>>> = asked
            .iter()
            .map(|&seq| (seq % 2 == 0).then(|| value(seq)))
            .collect();
        assert_eq!(answers, expected);
        assert!(store.get_many::<Vec<u8>>(CF_HOOKS, &[]).is_empty());

        // 100 consecutive hooks (about 1 KiB each) from a table file: the batched lookup
        // touches each shared block once; single gets touch a data block for every key
        // (level 0's index and filter are pinned, so neither counts here).
        let run: Vec<Vec<u8>> = (100..300).step_by(2).map(key).collect();
        let single = blocks_touched(|| {
            for key in &run {
                store.get(CF_HOOKS, key).unwrap().unwrap();
            }
        });
        let batched = blocks_touched(|| {
            for answer in store.get_many(CF_HOOKS, &run) {
                answer.unwrap().unwrap();
            }
        });
        assert!(
            single >= run.len() as u64,
            "single gets touched {single} blocks"
        );
        assert!(
            batched * 4 <= single,
            "the batched lookup touched {batched} blocks, single gets {single}"
        );
    }

    /// What RocksDB keeps in memory has two bounds, whatever the backlog: one block cache
    /// for every family that holds the index and filter blocks too, and a total for the
    /// memtables.
    #[test]
    fn memory_is_bounded_by_one_cache_and_a_memtable_total() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_bounds(&store, Memory::DEFAULT);
        // One cache, not one per family: a block read through one family is the usage of all.
        let usage = |family: &str| {
            store
                .db
                .property_int_value_cf(store.cf(family), "rocksdb.block-cache-usage")
                .unwrap()
                .unwrap()
        };
        let mut batch = WriteBatch::default();
        for n in 0..2000u32 {
            batch.put_cf(store.cf(CF_HOOKS), n.to_be_bytes(), [7u8; 512]);
        }
        store.write(batch, false).unwrap();
        store.db.flush_cf(store.cf(CF_HOOKS)).unwrap();
        let before = usage(CF_ARCHIVE);
        for n in (0..2000u32).step_by(7) {
            store.get(CF_HOOKS, &n.to_be_bytes()).unwrap().unwrap();
        }
        assert!(
            usage(CF_ARCHIVE) > before,
            "reading hooks did not show in the archive family's cache usage: one cache each"
        );
        let options = options_file(dir.path());
        for family in ALL_CFS {
            let table = format!("[TableOptions/BlockBasedTable \"{family}\"]");
            for key in [
                "cache_index_and_filter_blocks",
                "pin_l0_filter_and_index_blocks_in_cache",
                "partition_filters",
                "pin_top_level_index_and_filter",
            ] {
                assert_eq!(option_of(&options, &table, key), "true", "{table} {key}");
            }
            // A whole index or filter larger than a cache shard is read again on every
            // lookup; partitions are cached 4 KiB at a time.
            assert_eq!(
                option_of(&options, &table, "index_type"),
                "kTwoLevelIndexSearch",
                "{table}"
            );
            assert_eq!(
                option_of(&options, &table, "metadata_block_size"),
                "4096",
                "{table}"
            );
        }
    }

    /// The store runs within the bounds it was opened with, and reports what it holds of
    /// them: the cache as one, the memtables of every family summed.
    #[test]
    fn the_memory_bounds_are_the_ones_asked_for_and_their_usage_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let memory = Memory {
            block_cache_bytes: 16 << 20,
            memtable_bytes: 48 << 20,
        };
        let store = Store::open_reporting(dir.path(), memory, &migrate::Silent).unwrap();
        assert_bounds(&store, memory);
        let before = store.memory_usage().unwrap();
        let mut batch = WriteBatch::default();
        for n in 0..1000u32 {
            batch.put_cf(store.cf(CF_HOOKS), n.to_be_bytes(), [1u8; 1024]);
            batch.put_cf(store.cf(CF_ARCHIVE), n.to_be_bytes(), [2u8; 1024]);
        }
        store.write(batch, false).unwrap();
        let written = store.memory_usage().unwrap();
        // Two families' memtables, each holding at least the values put in it.
        assert!(
            written.memtable_bytes >= before.memtable_bytes + 2 * 1000 * 1024,
            "{before:?} -> {written:?}"
        );
        store.db.flush_cf(store.cf(CF_HOOKS)).unwrap();
        for n in (0..1000u32).step_by(10) {
            store.get(CF_HOOKS, &n.to_be_bytes()).unwrap().unwrap();
        }
        let read = store.memory_usage().unwrap();
        assert!(
            read.block_cache_bytes > written.block_cache_bytes,
            "{written:?} -> {read:?}"
        );
        assert!(read.block_cache_bytes <= memory.block_cache_bytes as u64);
        // The flushed family's memtable is empty again; the other's is not.
        assert!(read.memtable_bytes < written.memtable_bytes);
        assert!(read.memtable_bytes >= 1000 * 1024, "{read:?}");
    }

    /// Every family's cache has `memory`'s capacity, and the memtables its total.
    fn assert_bounds(store: &Store, memory: Memory) {
        for family in ALL_CFS {
            let capacity = store
                .db
                .property_int_value_cf(store.cf(family), "rocksdb.block-cache-capacity")
                .unwrap();
            assert_eq!(capacity, Some(memory.block_cache_bytes as u64), "{family}");
        }
        let options = options_file(store.path());
        assert_eq!(
            option_of(&options, "[DBOptions]", "db_write_buffer_size"),
            memory.memtable_bytes.to_string()
        );
    }

    /// The newest OPTIONS file RocksDB wrote: the options the store runs with.
    fn options_file(dir: &Path) -> String {
        let newest = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("OPTIONS-"))
            })
            .max()
            .expect("RocksDB wrote no OPTIONS file");
        std::fs::read_to_string(newest).unwrap()
    }

    /// `key`'s value in the OPTIONS section headed `header`.
    fn option_of(options: &str, header: &str, key: &str) -> String {
        let section = options
            .split_once(header)
            .unwrap_or_else(|| panic!("no {header} in OPTIONS"))
            .1;
        let section = section.split("\n[").next().unwrap();
        section
            .lines()
            .map(str::trim)
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {header}"))
            .to_string()
    }

    #[test]
    fn rocksdb_checksums_with_the_crc32_instruction() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let log = std::fs::read_to_string(dir.path().join("LOG")).unwrap();
        let line = log
            .lines()
            .find(|line| line.contains("Fast CRC32 supported"))
            .unwrap_or_else(|| panic!("no CRC32 line in RocksDB's LOG:\n{log}"));
        assert!(
            line.ends_with("Fast CRC32 supported: Supported on x86"),
            "{line}"
        );
    }
}
