//! Every verification scheme against the real binary: a valid signature is accepted; a
//! wrong one, a stale timestamp and a missing header each answer 401 with a JSON error,
//! and nothing refused reaches the store.
#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine;
use common::*;

const SOURCES: &str = "
sources:
  - id: token
    tenant: acme
    verify: {scheme: token, token: '${TOKEN}'}
    sinks: [{kind: http, url: 'http://127.0.0.1:9/t'}]
  - id: hmac
    tenant: acme
    verify: {scheme: hmac, secret: hmac-secret, header: x-signature}
    sinks: [{kind: http, url: 'http://127.0.0.1:9/h'}]
  - id: stripe
    tenant: acme
    verify: {scheme: stripe, secret: whsec_stripe}
    sinks: [{kind: http, url: 'http://127.0.0.1:9/s'}]
  - id: github
    tenant: acme
    verify: {scheme: github, secret: gh-secret}
    sinks: [{kind: http, url: 'http://127.0.0.1:9/g'}]
  - id: standard
    tenant: acme
    verify: {scheme: standard-webhooks, secret: 'whsec_c3RhbmRhcmQtc2VjcmV0LWtleS0xMjM0NQ=='}
    sinks: [{kind: http, url: 'http://127.0.0.1:9/w'}]
";

fn now() -> u64 {
    ankusa::clock::now_s()
}

#[test]
fn each_scheme_accepts_valid_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_env(
        dir.path(),
        &config_yaml(&data, "", Some(SOURCES)),
        &[("TOKEN", "tok-123")],
    );
    let body = br#"{"id":"evt_1"}"#;
    let accepted = |path: &str, headers: &[(&str, &str)]| {
        let response = server.post(path, headers, body);
        assert_eq!(response.status, 202, "{path} {headers:?}: {response:?}");
    };
    let refused = |path: &str, headers: &[(&str, &str)], code: &str| {
        let response = server.post(path, headers, body);
        assert_eq!(response.status, 401, "{path} {headers:?}: {response:?}");
        assert_eq!(response.json()["error"], code, "{path}: {response:?}");
    };
    let mut accepted_count = 0;

    accepted("/hooks/token", &[("authorization", "Bearer tok-123")]);
    refused(
        "/hooks/token",
        &[("authorization", "Bearer tok-124")],
        "signature_invalid",
    );
    refused("/hooks/token", &[], "signature_missing");
    accepted_count += 1;

    let good = ankusa::verify::hmac_hex(b"hmac-secret", body);
    accepted("/hooks/hmac", &[("x-signature", &good)]);
    accepted("/hooks/hmac", &[("x-signature", &format!("sha256={good}"))]);
    refused(
        "/hooks/hmac",
        &[("x-signature", &ankusa::verify::hmac_hex(b"other", body))],
        "signature_invalid",
    );
    refused("/hooks/hmac", &[], "signature_missing");
    accepted_count += 2;

    let t = now();
    accepted(
        "/hooks/stripe",
        &[(
            "stripe-signature",
            &ankusa::verify::stripe_signature_header("whsec_stripe", t, body),
        )],
    );
    refused(
        "/hooks/stripe",
        &[(
            "stripe-signature",
            &ankusa::verify::stripe_signature_header("whsec_other", t, body),
        )],
        "signature_invalid",
    );
    refused(
        "/hooks/stripe",
        &[(
            "stripe-signature",
            &ankusa::verify::stripe_signature_header("whsec_stripe", t - 301, body),
        )],
        "timestamp_stale",
    );
    refused("/hooks/stripe", &[], "signature_missing");
    accepted_count += 1;

    accepted(
        "/hooks/github",
        &[(
            "x-hub-signature-256",
            &ankusa::verify::github_signature_header("gh-secret", body),
        )],
    );
    refused(
        "/hooks/github",
        &[(
            "x-hub-signature-256",
            &ankusa::verify::github_signature_header("nope", body),
        )],
        "signature_invalid",
    );
    refused("/hooks/github", &[], "signature_missing");
    accepted_count += 1;

    let key = base64::engine::general_purpose::STANDARD
        .decode("c3RhbmRhcmQtc2VjcmV0LWtleS0xMjM0NQ==")
        .unwrap();
    let t = now();
    let t_text = t.to_string();
    let sig = ankusa::verify::standard_webhooks_signature(&key, "msg_1", t, body);
    accepted(
        "/hooks/standard",
        &[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", &t_text),
            ("webhook-signature", &sig),
        ],
    );
    let wrong = ankusa::verify::standard_webhooks_signature(b"another-key", "msg_1", t, body);
    refused(
        "/hooks/standard",
        &[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", &t_text),
            ("webhook-signature", &wrong),
        ],
        "signature_invalid",
    );
    let stale = (t - 400).to_string();
    let stale_sig = ankusa::verify::standard_webhooks_signature(&key, "msg_1", t - 400, body);
    refused(
        "/hooks/standard",
        &[
            ("webhook-id", "msg_1"),
            ("webhook-timestamp", &stale),
            ("webhook-signature", &stale_sig),
        ],
        "timestamp_stale",
    );
    refused(
        "/hooks/standard",
        &[("webhook-id", "msg_1"), ("webhook-timestamp", &t_text)],
        "signature_missing",
    );
    accepted_count += 1;

    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    assert!(
        report.contains(&format!("{accepted_count} hooks")),
        "only accepted hooks are stored: {report}"
    );
}
