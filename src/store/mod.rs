//! The embedded store: the RocksDB database (`db`: column families, format stamp and
//! migrations, tenant ordinals, counters), the key families ([`keys`]) and the value
//! codecs ([`codec`]). Only `db` imports `rocksdb`; key bytes come from [`keys`], value
//! bytes from [`codec`]. `keys`, `codec`, `memory` and `space` are sans-IO and build without the
//! `server` feature.

pub mod codec;
#[cfg(feature = "server")]
mod db;
#[cfg(feature = "server")]
pub mod deliveries;
#[cfg(feature = "server")]
pub mod fixture;
#[cfg(feature = "server")]
pub mod gauges;
pub mod keys;
pub mod memory;
#[cfg(feature = "server")]
pub mod migrate;
pub mod space;
#[cfg(feature = "server")]
pub mod verify;

#[cfg(feature = "server")]
pub use db::*;
#[cfg(all(test, feature = "server"))]
pub(crate) use db::{blocks_touched, perf_count};
pub use memory::Memory;
