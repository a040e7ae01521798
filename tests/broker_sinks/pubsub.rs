//! The Pub/Sub sink against the emulator on 127.0.0.1:8085, read back through the
//! emulator's own REST API (pull and acknowledge on a subscription made for the test).
//! Service-account auth runs against a token endpoint of the test's, with the publishes
//! going through a front that checks the bearer token before forwarding to the emulator.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;

use super::*;
use crate::common::proxy::Proxy;
use crate::common::services::{available, unique_name, Service};

const PROJECT: &str = "ankusa-test";
/// The throwaway key of the service-account test (fixtures/pubsub/README.md).
const RSA_KEY: &str = include_str!("../../fixtures/pubsub/test-rsa-key.pem");

/// One message as a subscriber pulled it.
#[derive(Debug, Clone)]
struct Pulled {
    data: Vec<u8>,
    attributes: BTreeMap<String, String>,
    ordering_key: Option<String>,
}

/// The emulator's REST API, as a subscriber and an administrator use it.
struct Emulator {
    agent: ureq::Agent,
}

impl Emulator {
    fn new() -> Emulator {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .new_agent();
        Emulator { agent }
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}/v1/projects/{PROJECT}/{path}", Service::Pubsub.url());
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .unwrap();
        let mut response = self.agent.run(request).unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        assert_eq!(status, 200, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// A topic and a subscription to it (message ordering on when `ordered`), both named
    /// after `prefix`; the subscription exists before anything is published, so it sees
    /// every message.
    fn topic_with_subscription(&self, prefix: &str, ordered: bool) -> (String, String) {
        let topic = unique_name(prefix);
        let subscription = format!("{topic}-sub");
        self.call("PUT", &format!("topics/{topic}"), serde_json::json!({}));
        self.call(
            "PUT",
            &format!("subscriptions/{subscription}"),
            serde_json::json!({
                "topic": format!("projects/{PROJECT}/topics/{topic}"),
                "enableMessageOrdering": ordered,
            }),
        );
        (topic, subscription)
    }

    /// What one pull returns at once, acknowledged, in delivery order.
    fn pull(&self, subscription: &str) -> Vec<Pulled> {
        let answer = self.call(
            "POST",
            &format!("subscriptions/{subscription}:pull"),
            // Without returnImmediately an empty subscription holds the pull open.
            serde_json::json!({"maxMessages": 1000, "returnImmediately": true}),
        );
        let Some(received) = answer["receivedMessages"].as_array() else {
            return Vec::new();
        };
        let ack_ids: Vec<&str> = received
            .iter()
            .map(|item| item["ackId"].as_str().unwrap())
            .collect();
        self.call(
            "POST",
            &format!("subscriptions/{subscription}:acknowledge"),
            serde_json::json!({"ackIds": ack_ids}),
        );
        received
            .iter()
            .map(|item| {
                let message = &item["message"];
                Pulled {
                    data: STANDARD
                        .decode(message["data"].as_str().unwrap_or(""))
                        .unwrap(),
                    attributes: message["attributes"]
                        .as_object()
                        .map(|map| {
                            map.iter()
                                .map(|(name, value)| {
                                    (name.clone(), value.as_str().unwrap().to_owned())
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    ordering_key: message["orderingKey"]
                        .as_str()
                        .filter(|key| !key.is_empty())
                        .map(str::to_owned),
                }
            })
            .collect()
    }

    /// Pulls until `count` messages came, in the order delivered.
    fn wait_messages(&self, subscription: &str, count: usize) -> Vec<Pulled> {
        let mut messages = Vec::new();
        wait_until(&format!("{count} messages on {subscription}"), || {
            messages.extend(self.pull(subscription));
            (messages.len() >= count).then_some(())
        });
        messages
    }

    fn delete(&self, topic: &str, subscription: &str) {
        self.call(
            "DELETE",
            &format!("subscriptions/{subscription}"),
            serde_json::json!({}),
        );
        self.call("DELETE", &format!("topics/{topic}"), serde_json::json!({}));
    }
}

fn seq_of(message: &Pulled) -> u64 {
    message.attributes["ankusa_seq"].parse().unwrap()
}

/// The metadata attributes (and content_type), for [`assert_metadata`].
fn text_fields(message: &Pulled) -> BTreeMap<String, String> {
    message
        .attributes
        .iter()
        .filter(|(name, _)| name.starts_with("ankusa_") || *name == "content_type")
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

#[test]
fn pubsub_unordered_gets_body_and_attributes() {
    if !available(Service::Pubsub, "pubsub_unordered_gets_body_and_attributes") {
        return;
    }
    let emulator = Emulator::new();
    let (topic, subscription) = emulator.topic_with_subscription("unordered", false);
    let dir = tempfile::tempdir().unwrap();
    // One request open at a time: the hooks that wait meanwhile share the next.
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: pubsub, project: {PROJECT}, topic: '{topic}', endpoint: '{}', max_in_flight: 1}}",
            Service::Pubsub.url()
        ),
    );
    let mut posted = post_orders_at_once(&server, 40, 3, 8);
    // Not UTF-8, not JSON: the bytes arrive as they were posted.
    let binary: Vec<u8> = (0..=255u8).rev().collect();
    post(&server, &binary, "application/octet-stream");
    posted.push(Posted {
        body: binary,
        content_type: "application/octet-stream",
        customer: String::new(),
        n: 40,
    });

    let messages = emulator.wait_messages(&subscription, posted.len());
    assert_eq!(messages.len(), posted.len(), "each hook once");
    let mut seqs = Vec::new();
    for message in &messages {
        let hook = posted
            .iter()
            .find(|hook| hook.body == message.data)
            .unwrap_or_else(|| panic!("a message whose body was never posted: {message:?}"));
        let fields = text_fields(message);
        assert_eq!(fields["content_type"], hook.content_type, "{message:?}");
        assert_metadata(&fields, "pubsub", None);
        assert_eq!(
            message.attributes.len(),
            fields.len(),
            "no other attributes: {message:?}"
        );
        assert_eq!(message.ordering_key, None, "{message:?}");
        seqs.push(seq_of(message));
    }
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), posted.len(), "distinct seqs: {seqs:?}");
    let (requests, sent) = batches(&server, "pubsub");
    assert_eq!(sent, posted.len() as f64, "each hook published once");
    assert!(
        requests < sent,
        "{requests} publish requests for {sent} messages: none held two"
    );
    assert_eq!(server.stop().code(), Some(0));
    emulator.delete(&topic, &subscription);
}

#[test]
fn pubsub_ordered_keeps_each_keys_order() {
    if !available(Service::Pubsub, "pubsub_ordered_keeps_each_keys_order") {
        return;
    }
    let emulator = Emulator::new();
    let (topic, subscription) = emulator.topic_with_subscription("ordered", true);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: pubsub, project: {PROJECT}, topic: '{topic}', endpoint: '{}', ordered: true, ordering_key: {{json: customer}}}}",
            Service::Pubsub.url()
        ),
    );
    let posted = post_orders(&server, 150, 5);
    let messages = emulator.wait_messages(&subscription, posted.len());
    assert_eq!(messages.len(), posted.len());
    for message in &messages {
        let body: Value = serde_json::from_slice(&message.data).unwrap();
        let customer = body["customer"].as_str().unwrap();
        assert_eq!(
            message.ordering_key.as_deref(),
            Some(customer),
            "{message:?}"
        );
        assert_metadata(&text_fields(message), "pubsub", Some(customer));
    }
    let bodies: Vec<Vec<u8>> = messages
        .iter()
        .map(|message| message.data.clone())
        .collect();
    assert_eq!(
        per_customer(&bodies),
        expected_per_customer(&posted),
        "each key's hooks delivered by the subscription in the order they were posted"
    );
    assert_eq!(server.stop().code(), Some(0));
    emulator.delete(&topic, &subscription);
}

#[test]
fn pubsub_fixed_ordering_key_without_ordered() {
    if !available(Service::Pubsub, "pubsub_fixed_ordering_key_without_ordered") {
        return;
    }
    let emulator = Emulator::new();
    let (topic, subscription) = emulator.topic_with_subscription("fixed", true);
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: pubsub, project: {PROJECT}, topic: '{topic}', endpoint: '{}', ordering_key: fixed-key}}",
            Service::Pubsub.url()
        ),
    );
    let posted = post_orders(&server, 10, 3);
    let messages = emulator.wait_messages(&subscription, posted.len());
    assert_eq!(messages.len(), posted.len());
    for message in &messages {
        assert_eq!(
            message.ordering_key.as_deref(),
            Some("fixed-key"),
            "{message:?}"
        );
        // Not an ordered sink: no lane, so no ankusa_ordering_key attribute.
        assert_metadata(&text_fields(message), "pubsub", None);
    }
    let mut bodies: Vec<Vec<u8>> = messages
        .iter()
        .map(|message| message.data.clone())
        .collect();
    bodies.sort();
    let mut expected: Vec<Vec<u8>> = posted.iter().map(|hook| hook.body.clone()).collect();
    expected.sort();
    assert_eq!(bodies, expected);
    assert_eq!(server.stop().code(), Some(0));
    emulator.delete(&topic, &subscription);
}

#[test]
fn pubsub_outage_is_retried_then_delivered() {
    if !available(Service::Pubsub, "pubsub_outage_is_retried_then_delivered") {
        return;
    }
    let emulator = Emulator::new();
    let (topic, subscription) = emulator.topic_with_subscription("outage", false);
    let proxy = Proxy::start(Service::Pubsub.addr());
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: pubsub, project: {PROJECT}, topic: '{topic}', endpoint: 'http://{}', timeout_ms: 1000}}",
            proxy.addr()
        ),
    );
    let before = post_orders(&server, 5, 1);
    let mut messages = emulator.wait_messages(&subscription, 5);

    let during = post_during_outage(&server, &proxy);
    assert!(
        emulator.pull(&subscription).is_empty(),
        "nothing reaches Pub/Sub while it is down"
    );

    proxy.up();
    wait_delivered(&server, 15);
    assert_none_dead(&server);
    assert_eq!(server.stop().code(), Some(0));

    // Every attempt is over. A publish whose answer was lost in the outage may have been
    // stored and sent again (at least once), so each hook arrives at least once.
    let distinct = |messages: &[Pulled]| {
        let mut seqs: Vec<u64> = messages.iter().map(seq_of).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs.len()
    };
    wait_until("every hook on the subscription", || {
        messages.extend(emulator.pull(&subscription));
        (distinct(&messages) >= 15).then_some(())
    });
    assert_eq!(distinct(&messages), 15, "15 hooks, no others");
    for hook in before.iter().chain(&during) {
        assert!(
            messages.iter().any(|message| message.data == hook.body),
            "hook {} was not delivered",
            hook.n
        );
    }
    emulator.delete(&topic, &subscription);
}

#[test]
fn pubsub_refusals_dead_letter_with_the_reason() {
    if !available(
        Service::Pubsub,
        "pubsub_refusals_dead_letter_with_the_reason",
    ) {
        return;
    }
    let emulator = Emulator::new();
    let (topic, subscription) = emulator.topic_with_subscription("refusals", false);
    // Never created: the emulator answers 404 NOT_FOUND to each publish.
    let missing = unique_name("missing");
    let dir = tempfile::tempdir().unwrap();
    let url = Service::Pubsub.url();
    let server = start(
        dir.path(),
        &format!(
            "- {{id: missing, kind: pubsub, project: {PROJECT}, topic: '{missing}', endpoint: '{url}'}}
             - {{id: topic, kind: pubsub, project: {PROJECT}, topic: '{topic}', endpoint: '{url}'}}"
        ),
    );
    let small = post_orders(&server, 3, 1);
    // A content type over Pub/Sub's 1024-byte attribute value: refused before sending.
    let long_type = format!("application/json; profile={}", "x".repeat(1100));
    post(&server, br#"{"customer":"c0","n":99}"#, &long_type);

    // Each hook dead on `missing`, the long-typed one on `topic` too.
    let dead = wait_dead(&server, 5);
    assert_eq!(dead.len(), 5, "{dead:?}");
    let delivered = emulator.wait_messages(&subscription, 3);
    assert_eq!(delivered.len(), 3, "the other hooks reach the topic");
    let mut bodies: Vec<Vec<u8>> = delivered
        .iter()
        .map(|message| message.data.clone())
        .collect();
    bodies.sort();
    let mut expected: Vec<Vec<u8>> = small.iter().map(|hook| hook.body.clone()).collect();
    expected.sort();
    assert_eq!(bodies, expected);
    let small_seqs: Vec<u64> = delivered.iter().map(seq_of).collect();

    let too_large: Vec<&Value> = dead.iter().filter(|item| item["sink"] == "topic").collect();
    assert_eq!(too_large.len(), 1, "{dead:?}");
    let long_seq = too_large[0]["seq"].as_u64().unwrap();
    assert!(!small_seqs.contains(&long_seq), "{dead:?}");
    for item in &dead {
        assert_eq!(item["attempts"], 1, "refused at once, not retried: {item}");
        let error = item["last_error"].as_str().unwrap();
        if item["seq"] == long_seq {
            // Over the limit whatever the topic: refused before sending.
            assert!(
                error.starts_with("too_large: the attribute content_type is 1126 bytes"),
                "{item}"
            );
        } else {
            assert_eq!(item["sink"], "missing", "{item}");
            assert!(
                small_seqs.contains(&item["seq"].as_u64().unwrap()),
                "{item}"
            );
            assert!(error.starts_with("no_topic: http 404 NOT_FOUND"), "{item}");
        }
    }
    assert_eq!(
        dead.iter().filter(|item| item["sink"] == "missing").count(),
        4,
        "every hook dead on missing: {dead:?}"
    );
    assert_eq!(server.stop().code(), Some(0));
    assert!(
        emulator.pull(&subscription).is_empty(),
        "nothing else published"
    );
    emulator.delete(&topic, &subscription);
}

// ---- Service-account auth: a token endpoint and a checking front of the test's. ----

/// One HTTP/1.1 request as a fake server read it.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// Serves requests on 127.0.0.1:0, answering each with `handler`'s (status, JSON body).
/// Returns its base URL; its threads end with the test process.
fn serve(handler: impl Fn(&Request) -> (u16, String) + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let handler = Arc::clone(&handler);
            std::thread::spawn(move || serve_connection(stream, &*handler));
        }
    });
    url
}

fn serve_connection(mut stream: TcpStream, handler: &dyn Fn(&Request) -> (u16, String)) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let mut parsed = [httparse::EMPTY_HEADER; 32];
        let mut head = httparse::Request::new(&mut parsed);
        head.parse(&buffer[..head_end]).unwrap();
        let headers: Vec<(String, String)> = head
            .headers
            .iter()
            .map(|header| {
                (
                    header.name.to_owned(),
                    String::from_utf8_lossy(header.value).into_owned(),
                )
            })
            .collect();
        let mut request = Request {
            path: head.path.unwrap().to_owned(),
            headers,
            body: Vec::new(),
        };
        let length: usize = request
            .header("content-length")
            .map_or(0, |value| value.parse().unwrap());
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        request.body = buffer[head_end..head_end + length].to_vec();
        buffer.drain(..head_end + length);
        let (status, body) = handler(&request);
        let response = format!(
            "HTTP/1.1 {status} Fake\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// The DER public key (RSAPublicKey) of the fixture's private key.
fn fixture_public_key() -> Vec<u8> {
    let base64: String = RSA_KEY
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    let pkcs8 = STANDARD.decode(base64).unwrap();
    let key = ring::signature::RsaKeyPair::from_pkcs8(&pkcs8).unwrap();
    key.public().as_ref().to_vec()
}

/// The claims of an RS256 JWT, once its header names RS256 and the key id and its
/// signature verifies with `public_key`; the reason otherwise.
fn verified_claims(assertion: &str, public_key: &[u8]) -> Result<Value, String> {
    let parts: Vec<&str> = assertion.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err(format!("{} parts", parts.len()));
    };
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|e| e.to_string());
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        public_key,
    )
    .verify(format!("{header}.{claims}").as_bytes(), &decode(signature)?)
    .map_err(|_| "bad signature".to_owned())?;
    let header: Value = serde_json::from_slice(&decode(header)?).map_err(|e| e.to_string())?;
    if header != serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "test-kid"}) {
        return Err(format!("header {header}"));
    }
    serde_json::from_slice(&decode(claims)?).map_err(|e| e.to_string())
}

fn write_key_file(dir: &Path, token_uri: &str) -> std::path::PathBuf {
    let path = dir.join("service-account.json");
    let key = serde_json::json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "test-kid",
        "private_key": RSA_KEY,
        "client_email": "ankusa@ankusa-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    });
    std::fs::write(&path, key.to_string()).unwrap();
    path
}

#[test]
fn pubsub_service_account_token_is_fetched_once_and_sent_with_every_publish() {
    if !available(
        Service::Pubsub,
        "pubsub_service_account_token_is_fetched_once_and_sent_with_every_publish",
    ) {
        return;
    }
    let emulator = Emulator::new();
    let (topic, subscription) = emulator.topic_with_subscription("service-account", false);

    // The token endpoint: checks the grant and the assertion, answers tok-1, tok-2, …
    let assertions: Arc<Mutex<Vec<Result<Value, String>>>> = Arc::default();
    let seen = Arc::clone(&assertions);
    let public_key = fixture_public_key();
    let token_url = serve(move |request| {
        let form = String::from_utf8_lossy(&request.body).into_owned();
        let assertion = form
            .strip_prefix(
                "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=",
            )
            .ok_or_else(|| format!("form {form}"))
            .and_then(|assertion| verified_claims(assertion, &public_key));
        let valid = assertion.is_ok()
            && request.path == "/token"
            && request.header("content-type") == Some("application/x-www-form-urlencoded");
        let mut seen = seen.lock().unwrap();
        seen.push(assertion);
        if !valid {
            return (
                400,
                r#"{"error":"invalid_grant","error_description":"bad assertion"}"#.into(),
            );
        }
        let token = format!("tok-{}", seen.len());
        (
            200,
            format!(r#"{{"access_token":"{token}","expires_in":3600,"token_type":"Bearer"}}"#),
        )
    });
    let token_uri = format!("{token_url}/token");

    // The front: records each publish's Authorization and how many messages it carried,
    // refuses one without tok-1 as Google would, and forwards the rest to the emulator.
    #[derive(Debug, Clone)]
    struct Publish {
        authorization: Option<String>,
        messages: usize,
    }
    let authorizations: Arc<Mutex<Vec<Publish>>> = Arc::default();
    let recorded = Arc::clone(&authorizations);
    let forward = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let front_url = serve(move |request| {
        let authorization = request.header("authorization").map(str::to_owned);
        let publish: Value = serde_json::from_slice(&request.body).unwrap();
        let messages = publish["messages"].as_array().map_or(0, Vec::len);
        recorded.lock().unwrap().push(Publish {
            authorization: authorization.clone(),
            messages,
        });
        if authorization.as_deref() != Some("Bearer tok-1") {
            let body = r#"{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}"#;
            return (401, body.into());
        }
        let mut response = forward
            .post(format!("{}{}", Service::Pubsub.url(), request.path))
            .header("content-type", "application/json")
            .send(&request.body[..])
            .unwrap();
        let status = response.status().as_u16();
        (status, response.body_mut().read_to_string().unwrap())
    });

    let dir = tempfile::tempdir().unwrap();
    let key_path = write_key_file(dir.path(), &token_uri);
    let server = start(
        dir.path(),
        &format!(
            "- {{kind: pubsub, project: {PROJECT}, topic: '{topic}', endpoint: '{front_url}', credentials_file: '{}'}}",
            key_path.display()
        ),
    );
    let posted = post_orders(&server, 8, 2);
    let messages = emulator.wait_messages(&subscription, posted.len());
    let mut bodies: Vec<Vec<u8>> = messages
        .iter()
        .map(|message| message.data.clone())
        .collect();
    bodies.sort();
    let mut expected: Vec<Vec<u8>> = posted.iter().map(|hook| hook.body.clone()).collect();
    expected.sort();
    assert_eq!(bodies, expected, "every hook published once");
    assert_eq!(server.stop().code(), Some(0));

    let assertions = assertions.lock().unwrap().clone();
    assert_eq!(
        assertions.len(),
        1,
        "one token for every publish: {assertions:?}"
    );
    let claims = assertions[0].as_ref().unwrap();
    let issued = claims["iat"].as_u64().unwrap();
    assert_eq!(
        claims,
        &serde_json::json!({
            "iss": "ankusa@ankusa-test.iam.gserviceaccount.com",
            "sub": "ankusa@ankusa-test.iam.gserviceaccount.com",
            "aud": token_uri,
            "scope": "https://www.googleapis.com/auth/pubsub",
            "iat": issued,
            "exp": issued + 3600,
        })
    );
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(issued.abs_diff(now_s) < 300, "iat {issued} is now");
    // Batching may carry several hooks in one publish: count messages, not requests.
    let authorizations = authorizations.lock().unwrap().clone();
    let published: usize = authorizations.iter().map(|publish| publish.messages).sum();
    assert_eq!(published, posted.len(), "{authorizations:?}");
    assert!(
        authorizations
            .iter()
            .all(|publish| publish.authorization.as_deref() == Some("Bearer tok-1")),
        "every publish carried the token: {authorizations:?}"
    );
    emulator.delete(&topic, &subscription);
}
