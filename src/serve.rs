//! `ankusa serve`: the startup sequence and the orderly stop.
//!
//! Start: check the host (io_uring, memlock), place roles on cores, open and migrate the
//! store, assign tenant ordinals, start the writer, then the ingest cores, and print one
//! `ready` line. Stop (SIGTERM/SIGINT): the ingest cores stop accepting and answer what
//! they hold, the writer commits everything queued, the store syncs its WAL and closes;
//! exit 0.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use shards::{Placement, PlacementRequest, Role, Shutdown};

use crate::admin::{self, Admin};
use crate::config::Config;
use crate::dispatch::{self, DispatchShared};
use crate::edge::{self, EdgeShared};
use crate::live::Live;
use crate::published::Published;
use crate::store::keys::LaneId;
use crate::store::space::FreeSpace;
use crate::store::Store;
use crate::tenants::Tenants;
use crate::writer::{Writer, WriterSettings};

/// `reference`: answer 202 without storing (the benchmark reference responder).
/// `config_path`: the file a reload re-reads (`None`: the embedded quickstart config).
pub fn run(config: Config, config_path: Option<PathBuf>, reference: bool) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let fault = crate::faults::init_from_env().map_err(|error| anyhow::anyhow!(error))?;
    shards::preflight()?;
    let cores = &config.instance.cores;
    let request = PlacementRequest {
        ingest: cores.ingest.clone(),
        writer: cores.writer,
        pipeline: cores.pipeline.clone(),
        sink_io: cores.sink_io.clone(),
    };
    let placement = Placement::resolve(&request, &shards::available_cores())?;
    // Before any thread starts, so every thread inherits the mask and only the signal
    // thread below takes SIGTERM/SIGINT.
    shards::block_stop_signals();

    let data_dir = &config.instance.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data_dir {}", data_dir.display()))?;
    // Both ports are taken before the store opens: a migration serves its progress on the
    // admin address meanwhile (`admin::boot`), and a port 0 must resolve once for both.
    let (listen, listen_reservation) = reserve(config.instance.listen)?;
    let (admin_listen, admin_reservation) = reserve(config.instance.admin_listen)?;
    let migration =
        admin::boot::Migration::new(data_dir, admin_listen, config.instance.admin_token.clone());
    let opened = Store::open_reporting(data_dir, config.store.memory, &migration);
    let migration_job = migration.finish(match &opened {
        Ok(_) => Ok(serde_json::json!({ "format": crate::store::FORMAT })),
        Err(error) => Err(admin::api::ApiError::new(
            500,
            "store_error",
            error.to_string(),
        )),
    });
    let store = opened?;
    let tenants = Arc::new(Tenants::open(&store, &config)?);
    let header_hash_key = store.header_hash_key()?;
    let prometheus = crate::metrics::install()?;
    // Checked before the edge starts, so a node that starts on a full disk refuses its
    // first hook already.
    let space = Arc::new(FreeSpace::new(data_dir, config.store.min_free_bytes));
    crate::metrics::refresh_space(&space);
    crate::metrics::refresh_memory(&store);
    report_startup(&config, &placement, &store, &space, reference, fault)?;
    // Before any pipeline core runs, so every claim found belongs to a gone process.
    let restored = dispatch::restore_active_markers(&store)?;
    if restored > 0 {
        tracing::info!(
            tenants = restored,
            "restored the active markers of tenants with pending rows (a crash came between a marker's removal and its re-check)"
        );
    }
    let recovered = dispatch::recover_inflight(&store)?;
    if recovered > 0 {
        tracing::info!(
            rows = recovered,
            "recovered claims of the previous run; they are delivered again"
        );
    }

    let blocking_pool = shards::BlockingPool::new(
        "sink-io",
        config.dispatch.blocking_threads,
        &placement.sink_io,
    )
    .context("cannot start the sink I/O pool")?;
    let sink_runtimes = crate::sink::SinkRuntimes {
        pool: blocking_pool.clone(),
        io: crate::sink::io::SinkIo::new(&placement.sink_io)
            .context("cannot start the sink I/O runtime")?,
    };
    let sinks = crate::live::build_sinks(&config, &sink_runtimes, None);
    let live = Arc::new(Published::new(Live::new(
        config.clone(),
        sinks,
        &tenants.snapshot(),
    )));
    let dispatch_shared = Arc::new(DispatchShared::new(
        store.clone(),
        live.clone(),
        store.instance_id()?.unwrap_or_default(),
        placement.pipeline.len(),
    ));
    let notify = dispatch_shared.clone();

    let writer_running = Arc::new(AtomicBool::new(false));
    let mut writer = Writer::new(
        store.clone(),
        WriterSettings {
            batch_max: config.writer.batch_max,
            batch_bytes_max: config.writer.batch_bytes_max,
            sync: config.store.sync,
        },
        config.writer.channel_capacity,
        writer_running.clone(),
        Box::new(
            move |min_due_ms, tenants: &[u32], lanes: &[(u32, LaneId)]| {
                notify.notify_inserted(min_due_ms, tenants);
                notify.notify_lanes(lanes);
            },
        ),
    )?;
    writer.refuse_retired(tenants.clone());
    let (writer_handle, collect, commit) = writer.into_loops();
    let writer_shards = [
        shards::spawn_thread(Role::Writer, placement.writer, "writer-collect", collect)?,
        shards::spawn_thread(Role::Writer, placement.writer, "writer-commit", commit)?,
    ];

    let shutdown = Shutdown::new();
    let mut pipeline_shards = Vec::new();
    for (index, &core) in placement.pipeline.iter().enumerate() {
        let shared = dispatch_shared.clone();
        let shutdown = shutdown.clone();
        pipeline_shards.push(shards::spawn_executor(Role::Pipeline, core, move || {
            dispatch::pipeline::run_core(shared, index, shutdown)
        })?);
    }
    let upkeep_running = Arc::new(AtomicBool::new(true));
    let upkeep = crate::metrics::spawn_upkeep(
        store.clone(),
        space.clone(),
        prometheus.clone(),
        upkeep_running.clone(),
    )?;

    // One thread each, unpinned: admin work is rare. The admin pool answers the quick
    // `/v1/` requests; the jobs pool runs the replays and revives, which can last minutes
    // under their budget, one at a time beside it (see `admin::operations`).
    let admin_pool =
        shards::BlockingPool::new("admin", 1, &[]).context("cannot start the admin pool")?;
    let jobs_pool = shards::BlockingPool::new("admin-jobs", 1, &[])
        .context("cannot start the admin jobs pool")?;
    let admin_notify = dispatch_shared.clone();
    let operations = Arc::new(admin::operations::Operations::new(
        store.clone(),
        live.clone(),
        admin::operations::ReloadSource {
            path: config_path,
            sink_runtimes: sink_runtimes.clone(),
        },
        tenants.clone(),
        writer_handle.clone(),
        admin::operations::PipelineLink {
            // A revive names no tenants: every core rescans its active markers.
            notify_inserted: Box::new(move |min_due_ms| {
                admin_notify.notify_inserted(min_due_ms, &[])
            }),
            check_hooks: {
                let dispatch_shared = dispatch_shared.clone();
                Box::new(move |ordinal, seqs: &[u64]| dispatch_shared.check_hooks(ordinal, seqs))
            },
            retire: {
                let dispatch_shared = dispatch_shared.clone();
                Box::new(move |ordinal| {
                    dispatch_shared.retire(ordinal, std::time::Duration::from_secs(10))
                })
            },
            breakers: dispatch_shared.breakers.clone(),
        },
        shutdown.clone(),
    ));
    if let Some(job) = migration_job {
        operations.jobs.adopt(job);
    }
    let shared = Arc::new(EdgeShared {
        live,
        limits: config.edge.clone(),
        writer: writer_handle,
        reference,
        tenants: tenants.clone(),
        gauges: store.gauges().clone(),
        space: space.clone(),
        header_hash_key,
    });
    let admin = Arc::new(Admin {
        prometheus,
        writer_running: writer_running.clone(),
        space,
        shutdown: shutdown.clone(),
        token: config.instance.admin_token.clone(),
        operations: operations.clone(),
        pool: admin_pool.clone(),
        jobs_pool: jobs_pool.clone(),
    });

    let (bound_sender, bound_receiver) = std::sync::mpsc::channel();
    let mut ingest_shards = Vec::new();
    for (index, &core) in placement.ingest.iter().enumerate() {
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        let admin = (index == 0).then(|| admin.clone());
        let bound = bound_sender.clone();
        ingest_shards.push(shards::spawn_executor(
            Role::Ingest,
            core,
            move || async move {
                if let Some(admin) = admin {
                    match admin::bind(admin_listen) {
                        Ok(listener) => {
                            let _ = bound.send(Ok(()));
                            glommio::spawn_local(admin::run(admin, listener)).detach();
                        }
                        Err(error) => {
                            let _ = bound
                                .send(Err(format!("admin listener on {admin_listen}: {error}")));
                            shutdown.request();
                        }
                    }
                }
                edge::run_core(shared, listen, shutdown, bound).await;
            },
        )?);
    }
    // The cores hold their own handles; the writer stops when the last one is dropped.
    // The admin's is released when its listener stops.
    drop(shared);
    drop(admin);

    let signal_shutdown = shutdown.clone();
    let (reload_pool, reload_operations) = (admin_pool.clone(), operations.clone());
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let signal = shards::wait_for_signal();
            if signal == libc::SIGHUP {
                // On the admin's thread, like `POST /v1/reload`, so two reloads never
                // interleave; the outcome is logged either way.
                let operations = reload_operations.clone();
                let _ = futures_lite::future::block_on(
                    reload_pool.run(move || operations.reload_config()),
                );
                continue;
            }
            tracing::info!(signal, "stop requested");
            signal_shutdown.request();
            return;
        })?;

    drop(bound_sender);
    // Every ingest core reports its listener, and the first one the admin listener too.
    let mut bind_failure = None;
    for _ in 0..placement.ingest.len() + 1 {
        match bound_receiver.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                bind_failure.get_or_insert(error);
            }
            // A core that failed to start reports through its join below.
            Err(_) => break,
        }
    }
    drop(listen_reservation);
    drop(admin_reservation);
    if let Some(error) = &bind_failure {
        tracing::error!(%error, "cannot listen; stopping");
        shutdown.request();
    }
    if !shutdown.requested() {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "ankusa ready ingest={listen} admin={admin_listen}")?;
        stdout.flush()?;
        tracing::info!(%listen, %admin_listen, "ready");
    }

    let mut failure = None;
    for shard in ingest_shards {
        if let Err(error) = shard.join() {
            shutdown.request();
            failure.get_or_insert(error);
        }
    }
    // The admin listener ran on an ingest core, so it is gone too; its writer handle
    // goes now even if it never ran (a core that failed to start), or the writer would
    // wait for it forever.
    operations.release_writer();
    for shard in writer_shards {
        if let Err(error) = shard.join() {
            failure.get_or_insert(error);
        }
    }
    for shard in pipeline_shards {
        if let Err(error) = shard.join() {
            failure.get_or_insert(error);
        }
    }
    // Waits for an admin job still running; each stops at its next batch once a stop is
    // requested, and a job still queued fails unrun.
    jobs_pool.close();
    admin_pool.close();
    drop(operations);
    drop(dispatch_shared);
    blocking_pool.close();
    upkeep_running.store(false, Ordering::Release);
    let _ = upkeep.join();
    crate::metrics::refresh_gauges(&store);
    store.close()?;
    if let Some(error) = failure {
        return Err(error.into());
    }
    if let Some(error) = bind_failure {
        anyhow::bail!(error);
    }
    if writer_running.load(Ordering::Acquire) {
        anyhow::bail!("writer did not stop");
    }
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Binds (without listening) a SO_REUSEPORT socket on `addr`, so a port 0 becomes a
/// concrete port that every ingest core's listener (and a migration's progress listener)
/// can join.
fn reserve(addr: SocketAddr) -> anyhow::Result<(SocketAddr, socket2::Socket)> {
    let socket = reuse_port_socket(addr)?;
    socket
        .bind(&addr.into())
        .with_context(|| format!("cannot bind {addr}"))?;
    let bound = socket
        .local_addr()?
        .as_socket()
        .with_context(|| format!("{addr} is not an IP address"))?;
    Ok((bound, socket))
}

/// An unbound TCP socket for `addr`'s address family with SO_REUSEPORT set: what
/// `reserve` binds, and what a listener that joins a reserved port (a migration's
/// progress listener, `admin::boot`) binds beside it.
pub(crate) fn reuse_port_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    Ok(socket)
}

/// One log block: which core runs which role, the store, the limits in force and any
/// setting that weakens durability.
fn report_startup(
    config: &Config,
    placement: &Placement,
    store: &Store,
    space: &FreeSpace,
    reference: bool,
    fault: Option<crate::faults::Fault>,
) -> anyhow::Result<()> {
    let format = store.format()?.unwrap_or(0);
    let instance_id = store.instance_id()?.unwrap_or_default();
    tracing::info!(
        cores = %placement.describe(),
        data_dir = %config.instance.data_dir.display(),
        store_format = format,
        instance_id = %instance_id,
        last_seq = store.last_seq()?,
        free_bytes = space.free(),
        min_free_bytes = space.min_free(),
        memlock = %shards::memlock_limit().map(|b| b.to_string()).unwrap_or_else(|| "unlimited".into()),
        body_max_bytes = config.edge.body_max_bytes,
        connections_max = config.edge.connections_max,
        writer_channel = config.writer.channel_capacity,
        "starting ankusa"
    );
    if reference {
        tracing::warn!("reference mode: hooks are answered 202 and NOT stored (benchmarks only)");
    }
    if !config.store.sync {
        tracing::warn!(
            "UNSAFE: store.sync is false (store.i_understand_acks_are_not_durable is set): a 2xx \
             no longer means the hook is on disk, and a crash or power loss loses acknowledged hooks"
        );
    }
    if let Some(fault) = fault {
        tracing::error!(
            fault = fault.name(),
            "{} is set: a defect is injected on purpose (harness self-tests only)",
            crate::faults::ENV
        );
    }
    Ok(())
}
