//! The circuit breakers that are not closed, node-wide and per tenant, for `/v1/stats` and
//! `/v1/tenants`: read from what the pipeline cores publish on each change of state
//! ([`crate::dispatch::BreakerBoard`]), never from the store.
//!
//! A breaker belongs to a (source, sink) on one pipeline core. A source that names its
//! tenant gives its breakers to that tenant. A `tenant_from: path` source serves many
//! tenants, and its breaker on a core parks the rows of every tenant that core moves: it is
//! listed (with `tenant: null`) under each tenant the core owns, and once node-wide.

use crate::config::Tenancy;
use crate::dispatch::{BreakerBoard, OpenBreaker};
use crate::live::Live;

use super::api::BreakerInfo;

/// Whose rows a breaker parks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parks {
    /// The source names this tenant.
    Tenant(String),
    /// A `tenant_from: path` source: every tenant its core owns.
    CoreTenants,
    /// The source left the config (a reload the core has not followed yet): no tenant.
    Nobody,
}

/// One reading of the board, each breaker's tenant resolved against the running config.
#[derive(Debug)]
pub struct Breakers<'a> {
    board: &'a BreakerBoard,
    entries: Vec<(BreakerInfo, Parks)>,
}

impl<'a> Breakers<'a> {
    pub fn read(board: &'a BreakerBoard, live: &Live) -> Breakers<'a> {
        let entries = board
            .snapshot()
            .into_iter()
            .map(|open| {
                let parks = match live
                    .source_index(&open.source)
                    .map(|index| &live.config.sources[index].tenancy)
                {
                    Some(Tenancy::Fixed(tenant)) => Parks::Tenant(tenant.to_string()),
                    Some(Tenancy::Path { .. }) => Parks::CoreTenants,
                    None => Parks::Nobody,
                };
                (info(open, &parks), parks)
            })
            .collect();
        Breakers { board, entries }
    }

    /// Every breaker of the node that is not closed.
    pub fn node(&self) -> Vec<BreakerInfo> {
        self.entries.iter().map(|(info, _)| info.clone()).collect()
    }

    /// The breakers that park the rows of tenant `id` (ordinal `ordinal`).
    pub fn of_tenant(&self, id: &str, ordinal: u32) -> Vec<BreakerInfo> {
        self.entries
            .iter()
            .filter(|(info, parks)| match parks {
                Parks::Tenant(tenant) => tenant == id,
                Parks::CoreTenants => self.board.owner(ordinal) == info.core,
                Parks::Nobody => false,
            })
            .map(|(info, _)| info.clone())
            .collect()
    }
}

fn info(open: OpenBreaker, parks: &Parks) -> BreakerInfo {
    BreakerInfo {
        source: open.source,
        sink: open.sink,
        kind: open.kind,
        state: if open.view.half_open {
            "half_open"
        } else {
            "open"
        },
        since_ms: open.view.opened_at_ms,
        next_probe_ms: open.view.next_probe_ms,
        consecutive_failures: open.view.consecutive_failures,
        core: open.core,
        tenant: match parks {
            Parks::Tenant(tenant) => Some(tenant.clone()),
            Parks::CoreTenants | Parks::Nobody => None,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dispatch::breaker::View;

    fn open(core: usize, source: &str) -> OpenBreaker {
        OpenBreaker {
            core,
            source: source.into(),
            sink: "http".into(),
            kind: "http",
            view: View {
                half_open: false,
                opened_at_ms: 5,
                next_probe_ms: Some(30_005),
                consecutive_failures: 5,
            },
        }
    }

    /// A fixed source's breaker is its tenant's only; a shared source's is listed under
    /// every tenant of the core that keeps it; a source the config lost, under none. The
    /// node lists each once.
    #[test]
    fn each_breaker_goes_to_the_tenants_whose_rows_it_parks() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let config = crate::config::parse(&format!(
            "instance: {{data_dir: {}}}
tenants: [{{id: acme}}, {{id: globex}}]
sources:
  - {{id: own, tenant: acme, sinks: [{{kind: http, url: 'http://127.0.0.1:9/'}}]}}
  - {{id: shared, tenant_from: path, sinks: [{{kind: http, url: 'http://127.0.0.1:9/'}}]}}
",
            dir.path().display()
        ))
        .unwrap();
        let tenants = crate::tenants::Tenants::open(&store, &config).unwrap();
        let directory = tenants.snapshot();
        let live = Live::new(Arc::new(config), vec![Vec::new(), Vec::new()], &directory);
        let (acme, globex) = (
            directory.get("acme").unwrap().ordinal,
            directory.get("globex").unwrap().ordinal,
        );
        let board = BreakerBoard::new(2);
        assert_ne!(
            board.owner(acme),
            board.owner(globex),
            "the test needs two cores"
        );
        board.publish(board.owner(acme), vec![open(board.owner(acme), "own")]);
        board.publish(
            board.owner(globex),
            vec![
                open(board.owner(globex), "shared"),
                open(board.owner(globex), "gone"),
            ],
        );

        let breakers = Breakers::read(&board, &live);
        let named = |list: Vec<BreakerInfo>| -> Vec<(String, Option<String>)> {
            list.into_iter().map(|b| (b.source, b.tenant)).collect()
        };
        assert_eq!(
            named(breakers.of_tenant("acme", acme)),
            [("own".to_owned(), Some("acme".to_owned()))]
        );
        assert_eq!(
            named(breakers.of_tenant("globex", globex)),
            [("shared".to_owned(), None)]
        );
        let mut node = named(breakers.node());
        node.sort();
        assert_eq!(
            node,
            [
                ("gone".to_owned(), None),
                ("own".to_owned(), Some("acme".to_owned())),
                ("shared".to_owned(), None)
            ]
        );
        let shown = &breakers.of_tenant("acme", acme)[0];
        assert_eq!(
            (
                shown.state,
                shown.since_ms,
                shown.next_probe_ms,
                shown.consecutive_failures
            ),
            ("open", 5, Some(30_005), 5)
        );

        // A reload empties a core's slot.
        board.publish(board.owner(globex), Vec::new());
        let breakers = Breakers::read(&board, &live);
        assert!(breakers.of_tenant("globex", globex).is_empty());
        assert_eq!(breakers.node().len(), 1);
    }
}
