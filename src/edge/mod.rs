//! The ingest edge: one SO_REUSEPORT listener per ingest core, HTTP/1.1 keep-alive
//! connections, and the hand-off to the writer. A 2xx is written only after the writer
//! reports the hook's batch synced.
//!
//! - [`http`]: request framing and responses (sans-IO).
//! - [`ingest`]: routing, tenants, verification and the envelope (sans-IO).
//! - [`resolve`]: the keys read from a request (dedupe), with one shared JSON decode.
//! - [`conn`]: one connection's loop: reads, limits and timeouts, the ack wait.
//! - `listener`: one ingest core's accept loop, its connections and its orderly stop.

#[cfg(feature = "server")]
pub mod conn;
pub mod http;
#[cfg(feature = "server")]
pub mod ingest;
#[cfg(feature = "server")]
mod listener;
pub mod resolve;

#[cfg(feature = "server")]
pub use ingest::EdgeShared;
#[cfg(feature = "server")]
pub use listener::{run_core, CoreState};
