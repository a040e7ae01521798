//! Provider presets against the real binary: for each `provider:`, a request signed the way
//! the provider documents (computed here with the HMAC crates directly, not with
//! `ankusa::verify`) is taken with 202, a tampered one is refused with 401, and the
//! provider's redelivery of the same event is answered as a duplicate (200, the first
//! hook's id). `check-config` prints what each preset expanded to.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use base64::Engine;
use common::*;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

const STRIPE_SECRET: &str = "whsec_preset_stripe";
const GITHUB_SECRET: &str = "gh-preset-secret";
const SHOPIFY_SECRET: &str = "shpss_preset_secret";
/// base64 of `standard-preset-key`, with the `whsec_` prefix Svix gives.
const STANDARD_SECRET: &str = "whsec_c3RhbmRhcmQtcHJlc2V0LWtleQ==";
const SLACK_SECRET: &str = "slack-preset-signing-secret";
const TWILIO_TOKEN: &str = "twilio-preset-auth-token";
/// Where Twilio believes it posts: a proxy in front of Ankusa, not the loopback listener.
const TWILIO_PUBLIC_URL: &str = "https://hooks.example.com";

fn sources() -> String {
    format!(
        "
sources:
  - id: stripe
    tenant: acme
    provider: stripe
    verify: {{secret: {STRIPE_SECRET}}}
    sinks: [{{kind: http, url: 'http://127.0.0.1:9/s'}}]
  - id: github
    tenant: acme
    provider: github
    verify: {{secret: {GITHUB_SECRET}}}
    sinks: [{{kind: http, url: 'http://127.0.0.1:9/g'}}]
  - id: shopify
    tenant: acme
    provider: shopify
    verify: {{secret: {SHOPIFY_SECRET}}}
    sinks: [{{kind: http, url: 'http://127.0.0.1:9/p'}}]
  - id: standard
    tenant: acme
    provider: standard-webhooks
    verify: {{secret: '{STANDARD_SECRET}'}}
    sinks: [{{kind: http, url: 'http://127.0.0.1:9/w'}}]
  - id: slack
    tenant: acme
    provider: slack
    verify: {{secret: {SLACK_SECRET}}}
    sinks: [{{kind: http, url: 'http://127.0.0.1:9/k'}}]
  - id: twilio
    tenant: acme
    provider: twilio
    verify: {{secret: {TWILIO_TOKEN}, public_url: '{TWILIO_PUBLIC_URL}'}}
    sinks: [{{kind: http, url: 'http://127.0.0.1:9/t'}}]
"
    )
}

fn now() -> u64 {
    ankusa::clock::now_s()
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Stripe: `t=<unix s>,v1=<hex HMAC-SHA256 of "{t}.{body}">`, keyed with the endpoint
/// secret as given.
fn stripe_signature(t: u64, body: &[u8]) -> String {
    let tag = hmac_sha256(
        STRIPE_SECRET.as_bytes(),
        &[t.to_string().as_bytes(), b".", body],
    );
    format!("t={t},v1={}", hex::encode(tag))
}

/// GitHub: `sha256=<hex HMAC-SHA256 of the body>`.
fn github_signature(body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(hmac_sha256(GITHUB_SECRET.as_bytes(), &[body]))
    )
}

/// Shopify: base64 HMAC-SHA256 of the raw body.
fn shopify_signature(body: &[u8]) -> String {
    base64(&hmac_sha256(SHOPIFY_SECRET.as_bytes(), &[body]))
}

/// Standard Webhooks: `v1,<base64 HMAC-SHA256 of "{id}.{t}.{body}">`, keyed with the
/// base64-decoded secret.
fn standard_signature(id: &str, t: u64, body: &[u8]) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(STANDARD_SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let tag = hmac_sha256(
        &key,
        &[id.as_bytes(), b".", t.to_string().as_bytes(), b".", body],
    );
    format!("v1,{}", base64(&tag))
}

/// Slack: `v0=<hex HMAC-SHA256 of "v0:{timestamp}:{body}">`.
fn slack_signature(t: u64, body: &[u8]) -> String {
    let tag = hmac_sha256(
        SLACK_SECRET.as_bytes(),
        &[b"v0:", t.to_string().as_bytes(), b":", body],
    );
    format!("v0={}", hex::encode(tag))
}

/// Twilio: base64 HMAC-SHA1 of the full URL followed by each POST parameter's name and
/// value, sorted by name.
fn twilio_signature(url: &str, parameters: &[(&str, &str)]) -> String {
    let mut sorted = parameters.to_vec();
    sorted.sort();
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(TWILIO_TOKEN.as_bytes()).unwrap();
    mac.update(url.as_bytes());
    for (name, value) in sorted {
        mac.update(name.as_bytes());
        mac.update(value.as_bytes());
    }
    base64(&mac.finalize().into_bytes())
}

/// Posts, expects `status`, and returns the answer's JSON.
#[track_caller]
fn expect(
    server: &Server,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    status: u16,
) -> serde_json::Value {
    let response = server.post(path, headers, body);
    assert_eq!(response.status, status, "{path} {headers:?}: {response:?}");
    response.json()
}

/// A provider's signed hook is taken with 202, and the same headers over `tampered` are
/// refused with 401 `signature_invalid`. Returns the first answer.
#[track_caller]
fn signed_and_tampered(
    server: &Server,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    tampered: &[u8],
) -> serde_json::Value {
    let first = expect(server, path, headers, body, 202);
    let refused = expect(server, path, headers, tampered, 401);
    assert_eq!(refused["error"], "signature_invalid");
    first
}

/// The provider's redelivery of `body` with `headers` is answered 200 as a duplicate of
/// `first`.
#[track_caller]
fn assert_duplicate(
    server: &Server,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    first: &serde_json::Value,
) {
    let repeat = expect(server, path, headers, body, 200);
    assert_eq!(repeat["duplicate"], true, "{repeat}");
    assert_eq!(repeat["id"], first["id"], "{repeat}");
    assert_eq!(first.get("duplicate"), None, "{first}");
}

#[test]
fn each_preset_takes_its_providers_signed_hooks_and_dedupes_redeliveries() {
    let (_dir, data, server) = start_in_temp_dir("", Some(&sources()));
    let t = now();
    let mut stored = 0;

    // Stripe: a retry carries the same event, signed again at a later time.
    let body = br#"{"id":"evt_preset_1","object":"event","type":"charge.succeeded"}"#;
    let tampered = br#"{"id":"evt_preset_1","object":"event","type":"charge.refunded"}"#;
    let first = signed_and_tampered(
        &server,
        "/hooks/stripe",
        &[("Stripe-Signature", &stripe_signature(t, body))],
        body,
        tampered,
    );
    stored += 1;
    assert_duplicate(
        &server,
        "/hooks/stripe",
        &[("Stripe-Signature", &stripe_signature(t + 1, body))],
        body,
        &first,
    );

    // GitHub: a redelivery keeps the X-GitHub-Delivery GUID.
    let body = br#"{"ref":"refs/heads/main","repository":{"full_name":"acme/app"}}"#;
    let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    let headers = [
        ("X-GitHub-Event", "push"),
        ("X-GitHub-Delivery", delivery),
        ("X-Hub-Signature-256", &github_signature(body)),
    ];
    let tampered = br#"{"ref":"refs/heads/evil"}"#;
    let first = signed_and_tampered(&server, "/hooks/github", &headers, body, tampered);
    stored += 1;
    assert_duplicate(&server, "/hooks/github", &headers, body, &first);

    // Shopify: every retry of a delivery carries its X-Shopify-Webhook-Id.
    let body = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let headers = [
        ("X-Shopify-Topic", "orders/create"),
        ("X-Shopify-Shop-Domain", "acme.myshopify.com"),
        (
            "X-Shopify-Webhook-Id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        ),
        ("X-Shopify-Hmac-Sha256", &shopify_signature(body)),
    ];
    let first = signed_and_tampered(&server, "/hooks/shopify", &headers, body, br#"{"id":1}"#);
    stored += 1;
    let unsigned = expect(&server, "/hooks/shopify", &headers[..3], body, 401);
    assert_eq!(unsigned["error"], "signature_missing");
    assert_duplicate(&server, "/hooks/shopify", &headers, body, &first);

    // Standard Webhooks: a retry keeps webhook-id and is signed at its own time.
    let body = br#"{"type":"invoice.paid","data":{"id":"inv_1"}}"#;
    let t_text = t.to_string();
    let signature = standard_signature("msg_preset_1", t, body);
    let headers = [
        ("webhook-id", "msg_preset_1"),
        ("webhook-timestamp", t_text.as_str()),
        ("webhook-signature", signature.as_str()),
    ];
    let first = signed_and_tampered(
        &server,
        "/hooks/standard",
        &headers,
        body,
        br#"{"type":"x"}"#,
    );
    stored += 1;
    let later = (t + 2).to_string();
    let resigned = standard_signature("msg_preset_1", t + 2, body);
    let retry = [
        ("webhook-id", "msg_preset_1"),
        ("webhook-timestamp", later.as_str()),
        ("webhook-signature", resigned.as_str()),
    ];
    assert_duplicate(&server, "/hooks/standard", &retry, body, &first);

    // Slack: an Events API retry (X-Slack-Retry-Num) carries the same event_id.
    let body =
        br#"{"type":"event_callback","event_id":"Ev08MFMKH6","event":{"type":"app_mention"}}"#;
    let signature = slack_signature(t, body);
    let headers = [
        ("X-Slack-Request-Timestamp", t_text.as_str()),
        ("X-Slack-Signature", signature.as_str()),
    ];
    let tampered = br#"{"type":"event_callback","event_id":"Ev2"}"#;
    let first = signed_and_tampered(&server, "/hooks/slack", &headers, body, tampered);
    stored += 1;
    let stale_text = (t - 600).to_string();
    let stale_signature = slack_signature(t - 600, body);
    let stale = [
        ("X-Slack-Request-Timestamp", stale_text.as_str()),
        ("X-Slack-Signature", stale_signature.as_str()),
    ];
    let refused = expect(&server, "/hooks/slack", &stale, body, 401);
    assert_eq!(refused["error"], "timestamp_stale");
    let retry_signature = slack_signature(t + 60, body);
    let retry_text = (t + 60).to_string();
    let retry = [
        ("X-Slack-Request-Timestamp", retry_text.as_str()),
        ("X-Slack-Signature", retry_signature.as_str()),
        ("X-Slack-Retry-Num", "1"),
        ("X-Slack-Retry-Reason", "http_timeout"),
    ];
    assert_duplicate(&server, "/hooks/slack", &retry, body, &first);
    // An interaction is form-encoded and has no event_id: taken, without dedupe, both times.
    let form = b"payload=%7B%22type%22%3A%22block_actions%22%7D";
    let signature = slack_signature(t, form);
    let headers = [
        ("content-type", "application/x-www-form-urlencoded"),
        ("X-Slack-Request-Timestamp", t_text.as_str()),
        ("X-Slack-Signature", signature.as_str()),
    ];
    expect(&server, "/hooks/slack", &headers, form, 202);
    expect(&server, "/hooks/slack", &headers, form, 202);
    stored += 2;

    // Twilio, a form post: the signed URL is the public one, query included.
    let body =
        b"MessageSid=SM1234567890abcdef&From=%2B15005550006&To=%2B15005550001&Body=Hello+there";
    let parameters = [
        ("MessageSid", "SM1234567890abcdef"),
        ("From", "+15005550006"),
        ("To", "+15005550001"),
        ("Body", "Hello there"),
    ];
    let signature = twilio_signature(
        &format!("{TWILIO_PUBLIC_URL}/hooks/twilio?account=main"),
        &parameters,
    );
    let headers = [
        ("content-type", "application/x-www-form-urlencoded"),
        ("I-Twilio-Idempotency-Token", "idem-form-1"),
        ("X-Twilio-Signature", signature.as_str()),
    ];
    let tampered =
        b"MessageSid=SM1234567890abcdef&From=%2B15005550006&To=%2B15005550001&Body=Hello+thera";
    let first = signed_and_tampered(
        &server,
        "/hooks/twilio?account=main",
        &headers,
        body,
        tampered,
    );
    stored += 1;
    // The query is part of the signed URL.
    let refused = expect(&server, "/hooks/twilio?account=other", &headers, body, 401);
    assert_eq!(refused["error"], "signature_invalid");
    assert_duplicate(
        &server,
        "/hooks/twilio?account=main",
        &headers,
        body,
        &first,
    );
    // Twilio, a JSON body: the URL carries bodySHA256 and is signed alone.
    let body = br#"{"flow":"FW123","event":"completed"}"#;
    let target = format!(
        "/hooks/twilio?bodySHA256={}",
        hex::encode(Sha256::digest(body))
    );
    let signature = twilio_signature(&format!("{TWILIO_PUBLIC_URL}{target}"), &[]);
    let headers = [
        ("I-Twilio-Idempotency-Token", "idem-json-1"),
        ("X-Twilio-Signature", signature.as_str()),
    ];
    let tampered = br#"{"flow":"FW123","event":"failed"}"#;
    signed_and_tampered(&server, &target, &headers, body, tampered);
    stored += 1;
    let unsigned = expect(&server, &target, &headers[..1], body, 401);
    assert_eq!(unsigned["error"], "signature_missing");

    assert!(server.stop().success());
    let (ok, report) = store_verify(&data);
    assert!(ok, "{report}");
    assert!(
        report.contains(&format!("{stored} hooks")),
        "only first deliveries are stored ({stored}): {report}"
    );
}

#[test]
fn check_config_prints_what_each_preset_expanded_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("presets.yaml");
    let data = dir.path().join("data");
    std::fs::write(&path, config_yaml(&data, "", Some(&sources()))).unwrap();
    let output = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for secret in [
        STRIPE_SECRET,
        GITHUB_SECRET,
        SHOPIFY_SECRET,
        SLACK_SECRET,
        TWILIO_TOKEN,
        "c3RhbmRhcmQt",
    ] {
        assert!(!stdout.contains(secret), "{secret} leaked:\n{stdout}");
    }
    for expected in [
        "  stripe: tenant acme, verify stripe, dedupe json id (96 h window)",
        "    provider stripe expands to:",
        "      verify:        stripe, header stripe-signature, tolerance 300 s",
        "      dedupe:        json id",
        "      dedupe window: 96 h",
        "      store_headers: keep stripe-signature content-type user-agent; drop authorization cookie proxy-authorization; hash -",
        "    provider github expands to:",
        "      dedupe:        header x-github-delivery",
        "    provider shopify expands to:",
        "      verify:        shopify, header x-shopify-hmac-sha256",
        "      dedupe:        header x-shopify-webhook-id",
        "      dedupe window: 48 h",
        "    provider standard-webhooks expands to:",
        "      dedupe:        header webhook-id",
        "      dedupe window: 72 h",
        "    provider slack expands to:",
        "      verify:        slack, headers x-slack-signature x-slack-request-timestamp, tolerance 300 s",
        "      dedupe:        json event_id (a body that is not JSON: no key)",
        "      dedupe window: 24 h",
        "    provider twilio expands to:",
        "      verify:        twilio, header x-twilio-signature, signed URL https://hooks.example.com + request path and query",
        "      dedupe:        header i-twilio-idempotency-token",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
}
