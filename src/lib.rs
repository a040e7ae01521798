//! # Ankusa: a webhook ingest gateway
//!
//! Providers POST webhooks; Ankusa verifies each one, commits it to RocksDB with a synced
//! WAL and only then answers 2xx; delivery to the sinks follows from the stored rows.
//!
//! # Layout
//!
//! - [`config`]: YAML → validated [`config::Config`], every problem with its YAML path.
//! - [`edge`]: the ingest cores: HTTP/1.1, routing, verification, the hand-off.
//! - [`verify`]: provider signature schemes.
//! - [`writer`]: the one appender: seq, group commit, acks.
//! - [`ack`]: the writer's answer to one envelope, awaited by the edge.
//! - [`dispatch`]: the pipeline cores: claim, attempt, retry, breaker, dead-letter, archive.
//! - [`sink`]: the `Sink` interface and the sinks (HTTP).
//! - [`store`]: RocksDB, the key families, record codecs, format and `store verify`.
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics` and the JSON admin API under `/v1/`
//!   (DLQ, archive replay, stats).
//! - [`cli`]: the `ankusa` verbs that talk to a running gateway's admin API.
//! - [`metrics`]: metric names and the counter gauges.
//! - [`serve`]: startup and the orderly stop.
//! - [`faults`]: defects injected on purpose, for the crash harness's own proof.
//! - `shards` (a crate of its own): pinned executors, placement, signals.
//!
//! Without the default `server` feature only the sans-IO layer builds: `config`,
//! `edge::http`, `edge::resolve`, `verify`, the key and record codecs of `store`, `faults`,
//! `clock` (the fuzz targets in tests/fuzz use it that way).

#[cfg(feature = "server")]
pub mod ack;
#[cfg(feature = "server")]
pub mod admin;
#[cfg(feature = "server")]
pub mod cli;
pub mod clock;
pub mod config;
#[cfg(feature = "server")]
pub mod dispatch;
pub mod edge;
pub mod faults;
#[cfg(feature = "server")]
pub mod live;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod published;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod sink;
pub mod store;
#[cfg(feature = "server")]
pub mod tenants;
pub mod verify;
#[cfg(feature = "server")]
pub mod writer;
