//! Criterion benches of the functions on the ingest hot path (edge → writer): request head
//! parsing, signature verification, dedupe and ordering key resolution, a whole request to
//! its encoded envelope, hook record encode/decode, key encoding and the writer's batch
//! build. Run with `cargo bench --bench hot_path`; compare runs with
//! criterion's saved baselines (`--save-baseline` / `--baseline`), never with absolute
//! numbers across machines.

use std::hint::black_box;

use ankusa::config::{self, Source, Verify};
use ankusa::edge::http::{self, Head};
use ankusa::edge::ingest::{self, RequestHeaders};
use ankusa::edge::resolve::{self, JsonScratch};
use ankusa::store::codec::HookRecord;
use ankusa::store::deliveries::{Class, Ingest};
use ankusa::store::keys;
use ankusa::store::{Store, WriteBatch};
use ankusa::verify::{self, HeaderLookup};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

/// A Stripe-shaped event of about 1 KiB, the size the bench gate's headline cell posts.
fn body() -> Vec<u8> {
    let mut body = br#"{"id":"evt_1NkqG2Lkdi","object":"event","type":"charge.succeeded","data":{"object":{"id":"ch_3Nk","amount":2000,"currency":"usd","customer":"cus_123","description":""#.to_vec();
    body.extend(std::iter::repeat_n(b'x', 1024 - body.len() - 4));
    body.extend_from_slice(br#""}}}"#);
    body
}

fn request(body: &[u8], signature: &str) -> Vec<u8> {
    let mut request = format!(
        "POST /hooks/stripe HTTP/1.1\r\nhost: 127.0.0.1:8080\r\nuser-agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: {}\r\nstripe-signature: {signature}\r\nx-github-delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958\r\naccept: */*\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

struct Headers<'a>(&'a [(&'a str, String)]);

impl HeaderLookup for Headers<'_> {
    fn header(&self, lower_name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(lower_name))
            .map(|(_, value)| value.as_bytes())
    }
}

/// The one source of a config whose source has `extra` (YAML lines, indented 4).
fn source(extra: &str) -> Source {
    let body: String = extra.lines().map(|line| format!("    {line}\n")).collect();
    let yaml =
        format!("tenants: [{{id: acme}}]\nsources:\n  - id: stripe\n    tenant: acme\n{body}");
    let mut config = config::parse(&yaml).expect("bench config");
    config.sources.remove(0)
}

fn hot_path(c: &mut Criterion) {
    let body = body();
    let now_s = 1_700_000_000;
    let signature = verify::stripe_signature_header("whsec_bench", now_s, &body);
    let raw = request(&body, &signature);
    let limits = http::Limits {
        body_max_bytes: 1 << 20,
        header_count_max: 64,
        header_bytes_max: 16 * 1024,
    };

    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(1));
    let mut head = Head::new();
    group.bench_function("parse_head", |b| {
        b.iter(|| http::parse_head(black_box(&raw), &limits, &mut head))
    });

    let scheme = Verify::Stripe {
        secret: "whsec_bench".into(),
        tolerance_s: 300,
    };
    let header_list = [("stripe-signature", signature.clone())];
    let headers = Headers(&header_list);
    group.bench_function("verify_stripe", |b| {
        b.iter(|| verify::verify(&scheme, &headers, black_box(&body), now_s))
    });

    // Dedupe and ordering keys: a header read, one JSON decode for the event id, and the
    // same decode shared by the id and an ordering key.
    let sink = "sinks: [{kind: http, url: 'http://127.0.0.1:9000/x'}]";
    let by_header = source(&format!("dedupe: {{header: x-github-delivery}}\n{sink}"));
    let by_json = source(&format!("dedupe: {{json: id}}\n{sink}"));
    let with_lane = source(
        "dedupe: {json: id}\nsinks: [{kind: http, url: 'http://127.0.0.1:9000/x', ordered: true, ordering_key: {json: data.object.customer}}]",
    );
    let delivery = [(
        "x-github-delivery",
        "72d3162e-cc78-11e3-81ab-4c9367dc0958".to_owned(),
    )];
    let delivery = Headers(&delivery);
    let mut scratch = JsonScratch::default();
    for (name, source) in [
        ("dedupe_header", &by_header),
        ("dedupe_json_id", &by_json),
        ("dedupe_json_id_and_lane", &with_lane),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| resolve::resolve(source, &delivery, black_box(&body), &mut scratch))
        });
    }

    // A whole request to the envelope the writer gets: head, signature, keys, encoding.
    let verified = source(&format!(
        "verify: {{scheme: stripe, secret: whsec_bench}}\ndedupe: {{json: id}}\n{sink}"
    ));
    let mut envelope = Vec::with_capacity(2048);
    let hash_key = [7u8; 32];
    group.bench_function("request_to_envelope", |b| {
        b.iter(|| {
            http::parse_head(black_box(&raw), &limits, &mut head).expect("head");
            let headers = RequestHeaders {
                buf: &raw,
                head: &head,
            };
            let body = &raw[raw.len() - body.len()..];
            ingest::check_signature(&verified, &headers, body, now_s).expect("signature");
            let keys = resolve::resolve(&verified, &headers, body, &mut scratch).expect("keys");
            let dedupe = keys.dedupe.as_deref().unwrap_or_default();
            ingest::encode_hook(
                &mut envelope,
                &verified,
                "acme",
                &headers,
                body,
                now_s * 1000,
                dedupe,
                &hash_key,
            );
        })
    });

    let record = HookRecord {
        source_id: "stripe".into(),
        tenant_id: "acme".into(),
        received_at_ms: now_s * 1000,
        dedupe_key: Vec::new(),
        headers: vec![
            (
                "content-type".into(),
                b"application/json; charset=utf-8".to_vec(),
            ),
            ("stripe-signature".into(), signature.clone().into_bytes()),
            ("user-agent".into(), b"Stripe/1.0".to_vec()),
        ],
        body: body.clone(),
    };
    let mut encoded = Vec::with_capacity(2048);
    group.bench_function("hook_encode", |b| {
        b.iter(|| {
            encoded.clear();
            record.encode(&mut encoded);
        })
    });
    record.encode(&mut encoded);
    group.bench_function("hook_decode", |b| {
        b.iter(|| HookRecord::decode(black_box(&encoded)))
    });
    // The integrity digest's share of the two above and of request_to_envelope: the
    // SHA-256 a seal computes at ingest and every read checks.
    group.bench_function("hook_digest_check", |b| {
        b.iter(|| HookRecord::check_digest(black_box(&encoded)).map(|fields| fields.len()))
    });

    let mut key = Vec::with_capacity(32);
    group.bench_function("due_key", |b| {
        b.iter(|| {
            key.clear();
            keys::due(&mut key, black_box(7), 1_700_000_000_000, 42, 0);
        })
    });

    // The writer's per-hook work: hook row, one delivery row and due key per sink,
    // counters, then the once-per-batch seal (here for a batch of 64).
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path()).expect("store");
    let mut ingest = Ingest::new();
    group.throughput(Throughput::Elements(64));
    group.bench_function("writer_batch_64", |b| {
        b.iter_batched_ref(
            WriteBatch::default,
            |batch| {
                for seq in 0..64 {
                    ingest.add(
                        &store,
                        batch,
                        1,
                        seq,
                        &encoded,
                        &["http"],
                        &[],
                        1100,
                        1,
                        Class::Live,
                    );
                }
                let _gauges = ingest.seal(&store, batch, 63);
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, hot_path);
criterion_main!(benches);
