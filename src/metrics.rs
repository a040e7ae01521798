//! Prometheus metrics: the recorder, the names and their help text, and the gauges that
//! are read from the store's counters (never from scans) every 250 ms.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::store::keys::{Counter, NODE_ORDINAL};
use crate::store::space::FreeSpace;
use crate::store::Store;

/// Latency buckets in seconds: 50 µs to 10 s.
const LATENCY_BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];
const BATCH_BUCKETS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Installs the process-wide recorder. Called once by `serve`.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("ankusa_writer_batch_records".into()),
            &BATCH_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("ankusa_sink_batch_messages".into()),
            &BATCH_BUCKETS,
        )?
        .install_recorder()?;
    describe();
    export_from_start();
    Ok(handle)
}

/// Registers at 0 the counters and gauges whose label values are fixed, before any event.
/// An alert's `increase()` sees a series' first event only if the series was scraped
/// before it, and a missing series reads as "No data" where the answer is 0. Series
/// labelled by sink kind appear with their kind's first attempt.
fn export_from_start() {
    for status in ["2xx", "4xx", "5xx"] {
        metrics::counter!("ankusa_ingest_requests_total", "status" => status).increment(0);
    }
    for reason in ["tenant_bound", "node_bound", "disk_full"] {
        metrics::counter!("ankusa_ingest_refused_total", "reason" => reason).increment(0);
    }
    for reason in ["full", "writer", "store"] {
        metrics::counter!("ankusa_quarantine_refused_total", "reason" => reason).increment(0);
    }
    for outcome in ["applied", "refused"] {
        metrics::counter!("ankusa_config_reloads_total", "outcome" => outcome).increment(0);
    }
    for stage in ["delivery", "replay"] {
        metrics::counter!("ankusa_integrity_failures_total", "stage" => stage).increment(0);
    }
    for name in [
        "ankusa_writer_commit_errors_total",
        "ankusa_ingest_dedupe_key_missing_total",
        "ankusa_tenants_created_total",
        "ankusa_dispatch_lane_sweeps_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    // Pipeline cores move it by increments, so only ever add to it.
    metrics::gauge!("ankusa_dispatch_breakers_open").increment(0.0);
    metrics::gauge!("ankusa_dispatch_active_tenants").increment(0.0);
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "ankusa_ingest_requests_total",
        "Ingest responses by status class."
    );
    describe_histogram!(
        "ankusa_ingest_ack_seconds",
        Unit::Seconds,
        "Time from a complete request head to its 202, including the writer's sync."
    );
    describe_counter!(
        "ankusa_ingest_refused_total",
        "Hooks refused by admission, by reason (tenant_bound: 429, node_bound and disk_full: 503)."
    );
    describe_gauge!(
        "ankusa_store_free_bytes",
        Unit::Bytes,
        "Free space of the file system that holds the data directory."
    );
    describe_gauge!(
        "ankusa_store_min_free_bytes",
        Unit::Bytes,
        "store.min_free_bytes: the reserve under which new hooks get 503 disk_full."
    );
    describe_gauge!(
        "ankusa_store_block_cache_bytes",
        Unit::Bytes,
        "What RocksDB's block cache holds (index and filter blocks included); at most store.block_cache_bytes."
    );
    describe_gauge!(
        "ankusa_store_memtable_bytes",
        Unit::Bytes,
        "What RocksDB's memtables hold, every column family together; flushed past store.memtable_bytes."
    );
    describe_gauge!(
        "ankusa_store_disk_low",
        "1 while free space is under store.min_free_bytes and new hooks get 503 disk_full."
    );
    describe_counter!(
        "ankusa_ingest_dedupe_key_missing_total",
        "Hooks of a deduping source that carried no dedupe key (taken without dedupe)."
    );
    describe_counter!(
        "ankusa_quarantine_refused_total",
        "Failing hooks of a quarantine source not kept, by reason (full, writer, store)."
    );
    describe_counter!(
        "ankusa_tenants_created_total",
        "Tenants created by auto_tenants sources."
    );
    describe_counter!(
        "ankusa_config_reloads_total",
        "Config reloads (SIGHUP, POST /v1/reload) by outcome (applied, refused)."
    );
    describe_histogram!(
        "ankusa_writer_batch_records",
        "Hooks per committed writer batch."
    );
    describe_histogram!(
        "ankusa_writer_sync_seconds",
        Unit::Seconds,
        "Duration of one batch commit with sync."
    );
    describe_counter!(
        "ankusa_writer_commit_errors_total",
        "Writer batches whose commit failed (every waiter got 503)."
    );
    describe_gauge!(
        "ankusa_pending",
        "Delivery rows not yet terminal (node aggregate counter)."
    );
    describe_gauge!(
        "ankusa_pending_bytes",
        Unit::Bytes,
        "Bytes of pending delivery rows."
    );
    describe_gauge!("ankusa_inflight", "Claimed delivery rows.");
    describe_gauge!("ankusa_dead", "Delivery rows in the dead-letter queue.");
    describe_gauge!("ankusa_quarantined", "Hooks in quarantine.");
    describe_gauge!(
        "ankusa_ingested_total",
        "Hooks accepted since the store was created."
    );
    describe_gauge!(
        "ankusa_delivered_total",
        "Delivery rows delivered since the store was created."
    );
    describe_gauge!(
        "ankusa_dead_lettered_total",
        "Delivery rows dead-lettered since the store was created."
    );
    describe_counter!(
        "ankusa_dispatch_attempts_total",
        "Delivery attempts by sink kind and outcome (delivered, retry, permanent)."
    );
    describe_histogram!(
        "ankusa_dispatch_attempt_seconds",
        Unit::Seconds,
        "Duration of one delivery attempt, by sink kind."
    );
    describe_histogram!(
        "ankusa_sink_batch_messages",
        "Messages per batch request of a batching sink (sqs, pubsub), by sink kind."
    );
    describe_counter!(
        "ankusa_dispatch_dead_lettered_total",
        "Rows dead-lettered by this process, by sink kind and cause (permanent, horizon, \
         sink_gone, source_gone, undecodable, corrupt)."
    );
    describe_counter!(
        "ankusa_integrity_failures_total",
        "Stored hooks whose bytes failed their integrity digest or the store's checksum \
         when read to be sent, by stage (delivery: one per delivery row refused; replay: \
         one per archive entry left out). None of their bytes went out."
    );
    describe_counter!(
        "ankusa_dispatch_parked_total",
        "Due rows parked by an open breaker, by sink kind."
    );
    describe_counter!(
        "ankusa_dispatch_breaker_opens_total",
        "Breakers opened (from closed), by sink kind."
    );
    describe_gauge!(
        "ankusa_dispatch_breakers_open",
        "Breakers open or half-open now, summed over pipeline cores."
    );
    describe_gauge!(
        "ankusa_dispatch_lanes",
        "Busy ordering lanes: lanes with a head (node aggregate counter)."
    );
    describe_gauge!(
        "ankusa_dispatch_lanes_blocked",
        "Lane heads waiting out a retry or a breaker park: the lanes that hold their next hook."
    );
    describe_gauge!(
        "ankusa_dispatch_lane_members",
        "Delivery rows waiting in a lane behind its head."
    );
    describe_counter!(
        "ankusa_dispatch_lane_key_missing_total",
        "Hooks of an ordered sink with a configured key that had none (absent header or \
         JSON path, non-string value, body too large or not JSON): they take the sink's \
         keyless lane. By sink kind."
    );
    describe_counter!(
        "ankusa_dispatch_lane_sweeps_total",
        "Tenant visits that ran the lane sweep (promotion of waiting members); stays 0 \
         while no lane has members."
    );
    describe_gauge!(
        "ankusa_dispatch_active_tenants",
        "Tenants the pipeline cores visit each round: rows due, claimed or waiting in a lane, \
         or idle for under a second; summed over pipeline cores."
    );
    describe_gauge!(
        "ankusa_dispatch_oldest_due_age_seconds",
        Unit::Seconds,
        "How long the oldest due row has been due (0 when nothing is overdue)."
    );
    describe_histogram!(
        "ankusa_replay_throttled_seconds",
        Unit::Seconds,
        "Each wait of an archive replay or DLQ revive held back by its tenant's replay \
         budget, by kind (archive_replay, dlq_revive) and limit (rate, pending); the sum \
         is the time throttled."
    );
}

const GAUGES: [(Counter, &str); 11] = [
    (Counter::Pending, "ankusa_pending"),
    (Counter::Bytes, "ankusa_pending_bytes"),
    (Counter::Inflight, "ankusa_inflight"),
    (Counter::Dead, "ankusa_dead"),
    (Counter::Quarantined, "ankusa_quarantined"),
    (Counter::IngestedTotal, "ankusa_ingested_total"),
    (Counter::DeliveredTotal, "ankusa_delivered_total"),
    (Counter::DeadLetteredTotal, "ankusa_dead_lettered_total"),
    (Counter::Lanes, "ankusa_dispatch_lanes"),
    (Counter::LanesBlocked, "ankusa_dispatch_lanes_blocked"),
    (Counter::LaneMembers, "ankusa_dispatch_lane_members"),
];

/// Sets every counter gauge from the node aggregate counters.
pub fn refresh_gauges(store: &Store) {
    for (field, name) in GAUGES {
        match store.counter(NODE_ORDINAL, field) {
            Ok(value) => metrics::gauge!(name).set(value as f64),
            Err(error) => tracing::warn!(%error, counter = field.name(), "cannot read counter"),
        }
    }
}

/// Sets the gauges of RocksDB's memory against its two bounds.
pub fn refresh_memory(store: &Store) {
    match store.memory_usage() {
        Ok(usage) => {
            metrics::gauge!("ankusa_store_block_cache_bytes").set(usage.block_cache_bytes as f64);
            metrics::gauge!("ankusa_store_memtable_bytes").set(usage.memtable_bytes as f64);
        }
        Err(error) => tracing::warn!(%error, "cannot read RocksDB's memory usage"),
    }
}

/// Checks the data directory's free space (which moves the edge's `disk_full` refusal)
/// and sets its gauges.
pub fn refresh_space(space: &FreeSpace) {
    match space.check() {
        Ok(free) => metrics::gauge!("ankusa_store_free_bytes").set(free as f64),
        Err(error) => tracing::warn!(%error, "cannot read the data directory's free space"),
    }
    metrics::gauge!("ankusa_store_disk_low").set(if space.low() { 1.0 } else { 0.0 });
    metrics::gauge!("ankusa_store_min_free_bytes").set(space.min_free() as f64);
}

/// How often the drain rates behind a refusal's Retry-After are sampled.
const DRAIN_SAMPLE: Duration = Duration::from_secs(1);

/// A low-priority thread: gauges, free space and histogram upkeep every 250 ms, and the
/// admission's drain rates every second, until `running` clears.
pub fn spawn_upkeep(
    store: Store,
    space: Arc<FreeSpace>,
    handle: PrometheusHandle,
    running: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            let mut sampled = std::time::Instant::now();
            while running.load(Ordering::Acquire) {
                refresh_gauges(&store);
                refresh_memory(&store);
                refresh_space(&space);
                handle.run_upkeep();
                // The admission's drain rates (for Retry-After), about once a second.
                let elapsed = sampled.elapsed();
                if elapsed >= DRAIN_SAMPLE {
                    sampled = std::time::Instant::now();
                    store.gauges().sample_drain(elapsed.as_secs_f64());
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
}
