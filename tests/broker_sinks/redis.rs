//! The Redis sink against the real server on 127.0.0.1:6379, read back with the redis
//! crate's own (synchronous) client.

use std::collections::BTreeMap;

use ::redis::streams::StreamRangeReply;
use ::redis::Commands as _;

use super::*;
use crate::common::proxy::Proxy;
use crate::common::services::{available, unique_name, Service};

fn connection() -> ::redis::Connection {
    ::redis::Client::open(Service::Redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Every entry of a stream, oldest first, as field → value (bytes).
fn entries(key: &str) -> Vec<BTreeMap<String, Vec<u8>>> {
    let reply: StreamRangeReply = ::redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(&mut connection())
        .unwrap();
    reply
        .ids
        .into_iter()
        .map(|entry| {
            entry
                .map
                .into_iter()
                .map(|(field, value)| match value {
                    ::redis::Value::BulkString(bytes) => (field, bytes),
                    other => panic!("field {field} is not a string: {other:?}"),
                })
                .collect()
        })
        .collect()
}

fn wait_entries(key: &str, count: usize) -> Vec<BTreeMap<String, Vec<u8>>> {
    wait_until(&format!("{count} entries in stream {key}"), || {
        let entries = entries(key);
        (entries.len() >= count).then_some(entries)
    })
}

fn text_fields(entry: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, String> {
    entry
        .iter()
        .filter(|(name, _)| name.starts_with("ankusa_") || *name == "content_type")
        .map(|(name, value)| (name.clone(), String::from_utf8(value.clone()).unwrap()))
        .collect()
}

fn cleanup(keys: &[&str]) {
    let _: () = connection().del(keys).unwrap();
}

#[test]
fn redis_stream_gets_body_and_metadata_and_a_list_gets_the_body() {
    if !available(Service::Redis, "redis_stream_gets_body_and_metadata") {
        return;
    }
    let (stream, list) = (unique_name("stream"), unique_name("list"));
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Redis.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: redis, url: '{url}', stream: '{stream}', maxlen: 100000}}
             - {{kind: redis, url: '{url}', list: '{list}'}}"
        ),
    );
    let mut posted = post_orders(&server, 12, 3);
    // Not UTF-8, not JSON: the bytes arrive as they were posted.
    let binary: Vec<u8> = (0..=255u8).rev().collect();
    post(&server, &binary, "application/octet-stream");
    posted.push(Posted {
        body: binary,
        content_type: "application/octet-stream",
        customer: String::new(),
        n: 12,
    });

    let entries = wait_entries(&stream, posted.len());
    assert_eq!(entries.len(), posted.len(), "each hook once");
    let mut seqs = Vec::new();
    for entry in &entries {
        let hook = posted
            .iter()
            .find(|hook| hook.body == entry["body"])
            .unwrap_or_else(|| panic!("an entry whose body was never posted: {entry:?}"));
        let fields = text_fields(entry);
        assert_eq!(fields["content_type"], hook.content_type);
        assert_metadata(&fields, "redis-1", None);
        seqs.push(fields["ankusa_seq"].parse::<u64>().unwrap());
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), posted.len(), "distinct seqs: {seqs:?}");

    let pushed: Vec<Vec<u8>> = wait_until("the list", || {
        let values: Vec<Vec<u8>> = connection().lrange(&list, 0, -1).unwrap();
        (values.len() >= posted.len()).then_some(values)
    });
    let mut pushed_sorted = pushed.clone();
    pushed_sorted.sort();
    let mut bodies: Vec<Vec<u8>> = posted.iter().map(|hook| hook.body.clone()).collect();
    bodies.sort();
    assert_eq!(
        pushed_sorted, bodies,
        "the list holds each body once, as posted"
    );
    assert_eq!(server.stop().code(), Some(0));
    cleanup(&[&stream, &list]);
}

#[test]
fn redis_ordered_stream_keeps_each_keys_order() {
    if !available(Service::Redis, "redis_ordered_stream_keeps_each_keys_order") {
        return;
    }
    let stream = unique_name("ordered");
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Redis.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: redis, url: '{url}', stream: '{stream}', ordered: true, ordering_key: {{json: customer}}}}"
        ),
    );
    let posted = post_orders(&server, 150, 5);
    let entries = wait_entries(&stream, posted.len());
    assert_eq!(entries.len(), posted.len());
    for entry in &entries {
        let fields = text_fields(entry);
        let body: Value = serde_json::from_slice(&entry["body"]).unwrap();
        assert_metadata(&fields, "redis", body["customer"].as_str());
    }
    let bodies: Vec<Vec<u8>> = entries.iter().map(|entry| entry["body"].clone()).collect();
    assert_eq!(
        per_customer(&bodies),
        expected_per_customer(&posted),
        "each key's hooks in the stream in the order they were posted"
    );
    assert_eq!(server.stop().code(), Some(0));
    cleanup(&[&stream]);
}

#[test]
fn redis_outage_is_retried_then_delivered() {
    if !available(Service::Redis, "redis_outage_is_retried_then_delivered") {
        return;
    }
    let stream = unique_name("outage");
    let proxy = Proxy::start(Service::Redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: redis, url: 'redis://{}/', stream: '{stream}', timeout_ms: 1000}}",
            proxy.addr()
        ),
    );
    post_orders(&server, 5, 1);
    wait_entries(&stream, 5);

    let during = post_during_outage(&server, &proxy);
    assert_eq!(
        entries(&stream).len(),
        5,
        "nothing reaches Redis while it is down"
    );

    proxy.up();
    let entries = wait_entries(&stream, 15);
    let bodies: Vec<&Vec<u8>> = entries.iter().map(|entry| &entry["body"]).collect();
    for hook in &during {
        assert!(
            bodies.contains(&&hook.body),
            "hook {} was not delivered",
            hook.n
        );
    }
    assert_none_dead(&server);
    assert_eq!(server.stop().code(), Some(0));
    cleanup(&[&stream]);
}

#[test]
fn redis_refusal_dead_letters_with_the_reason() {
    if !available(Service::Redis, "redis_refusal_dead_letters_with_the_reason") {
        return;
    }
    // A string where the sink expects a stream: Redis answers WRONGTYPE to every XADD.
    let key = unique_name("wrongtype");
    let _: () = connection().set(&key, "not a stream").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: redis, url: '{}', stream: '{key}'}}",
            Service::Redis.url()
        ),
    );
    post_orders(&server, 3, 1);
    let dead = wait_dead(&server, 3);
    assert_eq!(dead.len(), 3);
    for item in &dead {
        assert_eq!(item["sink"], "redis", "{item}");
        assert_eq!(item["attempts"], 1, "refused at once, not retried: {item}");
        let error = item["last_error"].as_str().unwrap();
        assert!(error.contains("WRONGTYPE"), "{item}");
    }
    assert_eq!(server.stop().code(), Some(0));
    cleanup(&[&key]);
}
