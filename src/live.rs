//! The running configuration: what a reload (SIGHUP, `POST /v1/reload`) replaces.
//!
//! A [`Live`] is the config with what is built from it: the source index, each source's
//! sink ids (handed to the writer with every envelope, so a hook gets the rows of the
//! config it was accepted under), and the built sinks. The edge, the pipeline cores and
//! the admin read it through [`crate::published`]; a reload builds a new one and publishes
//! it whole. Stored rows follow the row, not the config: a row names its sink by id and
//! its hook names its source, and a row whose sink or source is gone is dead-lettered
//! (`sink_gone`, `source_gone`) when the pipeline next takes it up.
//!
//! Some sections are fixed for the life of the process (listeners, cores, the data
//! directory, the store, the edge's limits, the writer, the sink pool's size):
//! [`restart_only_changes`] names every one a new file changes, and a reload that changes
//! any is refused whole.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use crate::config::{Config, SinkEntry, Tenancy};
use crate::sink::{Sink, SinkRuntimes};
use crate::tenants::Directory;

pub struct Live {
    pub config: Arc<Config>,
    sources: HashMap<String, usize>,
    /// Per source index: the ids of its sinks, in order (the writer's delivery rows).
    pub sink_ids: Vec<Arc<[String]>>,
    /// Per source index and sink index: the built sink.
    pub sinks: Vec<Vec<Arc<dyn Sink>>>,
    /// Tenant ordinal → the sources it can receive hooks from (its own and every
    /// `tenant_from: path` source). A tenant not listed may have any.
    tenant_sources: HashMap<u32, Vec<usize>>,
    /// Tenant ordinal → its `replay_concurrency`, for tenants the file declares (the
    /// others have the defaults').
    replay_concurrency: HashMap<u32, usize>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("sources", &self.sources.len())
            .finish_non_exhaustive()
    }
}

impl Live {
    /// `sinks` are built from `config` (`crate::sink::build`), per source and sink.
    pub fn new(config: Arc<Config>, sinks: Vec<Vec<Arc<dyn Sink>>>, tenants: &Directory) -> Live {
        let sources = config
            .sources
            .iter()
            .enumerate()
            .map(|(index, source)| (source.id.clone(), index))
            .collect();
        let sink_ids = config
            .sources
            .iter()
            .map(|source| source.sinks.iter().map(|sink| sink.id.clone()).collect())
            .collect();
        let tenant_sources = tenants
            .list()
            .into_iter()
            .map(|tenant| {
                let sources = config
                    .sources
                    .iter()
                    .enumerate()
                    .filter(|(_, source)| match &source.tenancy {
                        Tenancy::Fixed(fixed) => **fixed == *tenant.id,
                        Tenancy::Path { .. } => true,
                    })
                    .map(|(index, _)| index)
                    .collect();
                (tenant.ordinal, sources)
            })
            .collect();
        let replay_concurrency = tenants
            .list()
            .into_iter()
            .filter(|tenant| {
                tenant.bounds.replay_concurrency != config.tenant_defaults.replay_concurrency
            })
            .map(|tenant| (tenant.ordinal, tenant.bounds.replay_concurrency as usize))
            .collect();
        Live {
            config,
            sources,
            sink_ids,
            sinks,
            tenant_sources,
            replay_concurrency,
        }
    }

    pub fn source_index(&self, source_id: &str) -> Option<usize> {
        self.sources.get(source_id).copied()
    }

    /// The sources `ordinal` can have rows of, when the config says (`None`: any).
    pub fn sources_of_tenant(&self, ordinal: u32) -> Option<&[usize]> {
        self.tenant_sources.get(&ordinal).map(Vec::as_slice)
    }

    /// How many attempts of replayed or revived rows may run at once per sink of
    /// `ordinal`.
    pub fn replay_concurrency(&self, ordinal: u32) -> usize {
        self.replay_concurrency
            .get(&ordinal)
            .copied()
            .unwrap_or(self.config.tenant_defaults.replay_concurrency as usize)
    }

    /// The index of the source `source_id` if it serves `tenant_id`.
    pub fn source_serving(&self, source_id: &str, tenant_id: &str) -> Option<usize> {
        let index = self.source_index(source_id)?;
        match &self.config.sources[index].tenancy {
            Tenancy::Fixed(fixed) if fixed != tenant_id => None,
            _ => Some(index),
        }
    }
}

/// One source's built sinks, in the order of its entries.
pub type SourceSinks = Vec<Arc<dyn Sink>>;

/// Builds every sink of `config`, per source and sink, on `runtimes`. A sink that the
/// `running` config and its built sinks have with the same source, id and options is kept
/// as it is, with its open connection: a reload reconnects only the sinks it changes.
pub fn build_sinks(
    config: &Config,
    runtimes: &SinkRuntimes,
    running: Option<(&Config, &[SourceSinks])>,
) -> Vec<SourceSinks> {
    config
        .sources
        .iter()
        .map(|source| {
            source
                .sinks
                .iter()
                .map(|entry| {
                    running
                        .and_then(|(config, sinks)| same_sink(config, sinks, &source.id, entry))
                        .unwrap_or_else(|| crate::sink::build(entry, runtimes))
                })
                .collect()
        })
        .collect()
}

/// The built sink of `source_id` whose entry equals `entry` in id and options.
fn same_sink(
    config: &Config,
    sinks: &[SourceSinks],
    source_id: &str,
    entry: &SinkEntry,
) -> Option<Arc<dyn Sink>> {
    let index = config.sources.iter().position(|s| s.id == source_id)?;
    let position = config.sources[index]
        .sinks
        .iter()
        .position(|running| running.id == entry.id && running.kind == entry.kind)?;
    Some(Arc::clone(sinks.get(index)?.get(position)?))
}

/// Every setting `next` changes that only a restart can apply, as `path: message`.
pub fn restart_only_changes(running: &Config, next: &Config) -> Vec<String> {
    let (a, b) = (&running.instance, &next.instance);
    let mut changes: Vec<String> = [
        changed("instance.data_dir", &a.data_dir, &b.data_dir),
        changed("instance.listen", &a.listen, &b.listen),
        changed("instance.admin_listen", &a.admin_listen, &b.admin_listen),
        // Never print a token.
        (a.admin_token != b.admin_token)
            .then(|| "instance.admin_token: changing it needs a restart".to_owned()),
        changed("instance.cores", &a.cores, &b.cores),
        changed("store.sync", &running.store.sync, &next.store.sync),
        changed(
            "store.min_free_bytes",
            &running.store.min_free_bytes,
            &next.store.min_free_bytes,
        ),
        changed(
            "store.block_cache_bytes",
            &running.store.memory.block_cache_bytes,
            &next.store.memory.block_cache_bytes,
        ),
        changed(
            "store.memtable_bytes",
            &running.store.memory.memtable_bytes,
            &next.store.memory.memtable_bytes,
        ),
        changed("edge", &running.edge, &next.edge),
        changed("writer", &running.writer, &next.writer),
        changed(
            "dispatch.blocking_threads",
            &running.dispatch.blocking_threads,
            &next.dispatch.blocking_threads,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    changes.shrink_to_fit();
    changes
}

fn changed<T: Debug + PartialEq>(path: &str, running: &T, next: &T) -> Option<String> {
    (running != next).then(|| {
        format!("{path}: changing it needs a restart (running {running:?}, file {next:?})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    const BASE: &str = "
instance: {listen: 127.0.0.1:8080, admin_token: s3cret}
tenants: [{id: acme}]
sources:
  - {id: s, tenant: acme, sinks: [{kind: http, url: 'http://h/'}]}
";

    #[test]
    fn a_reload_keeps_the_sinks_it_does_not_change() {
        let runtimes = SinkRuntimes {
            pool: shards::BlockingPool::new("test", 1, &[]).expect("pool"),
            io: crate::sink::io::SinkIo::new(&[]).expect("runtime"),
        };
        let sinks = "sinks: [{kind: redis, id: r, url: 'redis://127.0.0.1/', stream: a}, \
                     {kind: nats, id: n, url: 'nats://127.0.0.1', subject: a}]";
        let running = config::parse(&format!(
            "tenants: [{{id: acme}}]\nsources:\n  - {{id: s, tenant: acme, {sinks}}}\n"
        ))
        .expect("running");
        let built = build_sinks(&running, &runtimes, None);
        // Same redis sink; the nats one changes its subject; a new source has the same ids.
        let next = config::parse(&format!(
            "tenants: [{{id: acme}}]\nsources:\n  - {{id: s, tenant: acme, {}}}\n  - {{id: t, tenant: acme, {sinks}}}\n",
            sinks.replace("subject: a", "subject: b")
        ))
        .expect("next");
        let rebuilt = build_sinks(&next, &runtimes, Some((&running, &built)));
        assert!(Arc::ptr_eq(&rebuilt[0][0], &built[0][0]), "unchanged: kept");
        assert!(
            !Arc::ptr_eq(&rebuilt[0][1], &built[0][1]),
            "changed: rebuilt"
        );
        assert!(
            !Arc::ptr_eq(&rebuilt[1][0], &built[0][0]),
            "another source's: its own"
        );
        runtimes.pool.close();
    }

    #[test]
    fn live_sections_may_change_and_the_rest_are_named() {
        let running = config::parse(BASE).expect("base");
        let live_only = config::parse(&format!(
            "{BASE}  - {{id: t, tenant: acme, sinks: [{{kind: http, url: 'http://h/2'}}]}}\nretry: {{initial_ms: 10}}\nadmission: {{max_pending: 5}}\n"
        ))
        .expect("live changes");
        assert_eq!(
            restart_only_changes(&running, &live_only),
            Vec::<String>::new()
        );

        let fixed = config::parse(
            &BASE
                .replace("127.0.0.1:8080", "127.0.0.1:8081")
                .replace("s3cret", "other"),
        )
        .expect("fixed changes");
        let fixed = Config {
            store: config::Store {
                sync: false,
                memory: crate::store::Memory {
                    memtable_bytes: 512 << 20,
                    ..fixed.store.memory
                },
                ..fixed.store
            },
            ..fixed
        };
        assert_eq!(
            restart_only_changes(&running, &fixed),
            vec![
                "instance.listen: changing it needs a restart (running 127.0.0.1:8080, file 127.0.0.1:8081)",
                "instance.admin_token: changing it needs a restart",
                "store.sync: changing it needs a restart (running true, file false)",
                "store.memtable_bytes: changing it needs a restart (running 268435456, file 536870912)",
            ]
        );
    }
}
