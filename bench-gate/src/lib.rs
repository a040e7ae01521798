//! bench-gate: before/after performance numbers for Ankusa, taken as ratios within one run
//! on one machine, because on a shared, noisy machine an absolute figure means little.
//!
//! # Layout
//!
//! - [`cells`]: `bench-gate/cells.yaml`, what each cell is and the gateway config it runs;
//! - [`hooks`]: Stripe- and GitHub-shaped request bodies and their signatures;
//! - [`load`]: the load generator (keep-alive connections, closed and open loop, latencies
//!   corrected for coordinated omission);
//! - [`responder`]: the in-process HTTP receiver the cells' sinks deliver to;
//! - [`server`]: the processes measured (`ankusa serve`, nginx), their `/metrics` and `/proc`;
//! - [`binary`]: building `ankusa`, pinning the built file, git worktrees of a base revision;
//! - [`run`]: measuring cells into rows;
//! - [`compare`]: base and head alternately, head/base ratios and the verdict;
//! - [`drain`]: how fast one sink (http, redis, nats, rabbitmq) drains a backlog;
//! - [`crash`]: the crash harness (SIGKILL at random moments; lost, order, split checks);
//! - [`slowloris`]: what connections that never finish a head cost the other clients;
//! - [`report`]: the tables and the JSON;
//! - [`html`]: the HTML report beside the JSON, with SVG charts of the same rows.

pub mod binary;
pub mod cells;
pub mod compare;
pub mod crash;
pub mod drain;
pub mod hooks;
pub mod html;
pub mod load;
pub mod report;
pub mod responder;
pub mod run;
pub mod server;
pub mod slowloris;
