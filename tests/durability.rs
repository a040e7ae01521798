//! Crash durability. Fault injected: SIGKILL of the real process right after its 202s,
//! with several connections posting concurrently. Checked after reopening: every acked
//! hook and its delivery rows are present, seqs strictly increase in commit order, and
//! `store verify` passes.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;

use ankusa::store::codec::HookRecord;
use ankusa::store::keys;
use ankusa::store::{Store, CF_DELIVERIES, CF_HOOKS};
use common::*;

#[test]
fn every_acked_hook_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config_yaml(&data, "", None));

    const CONNECTIONS: usize = 8;
    const PER_CONNECTION: usize = 40;
    let ingest = server.ingest;
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            std::thread::spawn(move || {
                let mut stream = std::net::TcpStream::connect(ingest).unwrap();
                let mut acked = Vec::new();
                for i in 0..PER_CONNECTION {
                    let body = format!("{{\"connection\":{c},\"n\":{i}}}");
                    send_post(&mut stream, "/hooks/fanout", &[], body.as_bytes(), false);
                    let response = read_response(&mut stream).unwrap();
                    assert_eq!(response.status, 202);
                    acked.push((response.json()["seq"].as_u64().unwrap(), body));
                }
                acked
            })
        })
        .collect();
    let acked: Vec<(u64, String)> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    server.kill();

    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    let store = Store::open(&data).unwrap();
    let acme = store.tenant_ordinal("acme").unwrap().unwrap();
    let seqs: BTreeSet<u64> = acked.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs.len(), acked.len(), "a seq was handed out twice");
    for (seq, body) in &acked {
        let mut key = Vec::new();
        keys::hook(&mut key, acme, *seq);
        let hook = store
            .get(CF_HOOKS, &key)
            .unwrap()
            .unwrap_or_else(|| panic!("acked hook {seq} lost"));
        assert_eq!(HookRecord::decode(&hook).unwrap().body, body.as_bytes());
        for sink in 0..2 {
            key.clear();
            keys::delivery(&mut key, acme, *seq, sink);
            assert!(
                store.get(CF_DELIVERIES, &key).unwrap().is_some(),
                "row {seq}/{sink} lost"
            );
        }
    }
    // Seq order is commit order: within one connection, later acks have higher seqs.
    for chunk in acked.chunks(PER_CONNECTION) {
        assert!(
            chunk.windows(2).all(|w| w[0].0 < w[1].0),
            "seqs not increasing on a connection"
        );
    }
    // The recovered writer continues above every committed seq.
    assert!(store.last_seq().unwrap() >= *seqs.iter().max().unwrap());
    drop(store);
    let server = Server::start(dir.path(), &config_yaml(&data, "", None));
    let response = server.post("/hooks/demo", &[], b"{}");
    assert_eq!(response.status, 202);
    assert!(response.json()["seq"].as_u64().unwrap() > *seqs.iter().max().unwrap());
    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
}
