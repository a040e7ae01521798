//! RocksDB's two memory bounds, as the config names them. Sans-IO: the config reads it
//! without the `server` feature; `db` applies it.

/// RocksDB's two memory bounds (`store.block_cache_bytes`, `store.memtable_bytes`). With
/// RocksDB's defaults each family had a cache of its own and kept its files' index and
/// filter blocks outside any cache, so memory grew with the store; with these two bounds
/// it does not grow with the backlog (docs/operations.md, Memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// The block cache every family shares, index and filter blocks included.
    pub block_cache_bytes: usize,
    /// The memtables of every family together: past this RocksDB flushes the largest one.
    pub memtable_bytes: usize,
}

impl Memory {
    pub const DEFAULT: Memory = Memory {
        block_cache_bytes: 64 << 20,
        memtable_bytes: 256 << 20,
    };
}

impl Default for Memory {
    fn default() -> Memory {
        Memory::DEFAULT
    }
}
