//! Unit tests of the request and the answer's classification, then the sink against a fake
//! Pub/Sub and token endpoint on 127.0.0.1:0 (a std listener whose handler answers each
//! request), driven through `PubsubSink` on a glommio executor.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::auth::tests::{key_file, verified_claims};
use super::auth::ServiceAccountKey;
use super::*;
use crate::sink::io::SinkIo;
use crate::sink::SinkContext;
use crate::store::codec::HookRecord;
use shards::BlockingPool;

/// Not UTF-8, with CR LF and a NUL: the data must carry it untouched.
const BODY: &[u8] = b"{\"id\":\"evt_1\"}\r\n\x00\xff\xfe";

fn config(endpoint: &str) -> Config {
    Config {
        project: "proj".into(),
        topic: "hooks".into(),
        endpoint: endpoint.into(),
        auth: PubsubAuth::None,
        fixed_ordering_key: None,
        batch_size: 100,
        max_in_flight: 4,
        timeout_ms: 5_000,
    }
}

/// The publish request of `message` alone.
fn publish_request(config: &Config, message: &Message) -> Result<Vec<u8>, String> {
    prepare(config, message).map(|prepared| request_body(&[prepared]))
}

fn message_with(body: &[u8], headers: &[(&str, &[u8])], ordering_key: Option<&str>) -> Message {
    Message {
        hook: Arc::new(HookRecord {
            source_id: "stripe".into(),
            tenant_id: "acme".into(),
            received_at_ms: 1_700_000_000_123,
            dedupe_key: Vec::new(),
            headers: headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.to_vec()))
                .collect(),
            body: body.to_vec(),
        }),
        context: SinkContext {
            tenant_id: "acme".into(),
            source_id: "stripe".into(),
            sink_id: "pubsub".into(),
            seq: 42,
            attempt: 3,
            idempotency_key: "node:42:pubsub".into(),
            received_at_ms: 1_700_000_000_123,
            ordering_key: ordering_key.map(str::to_owned),
            lane: None,
        },
    }
}

fn message(ordering_key: Option<&str>) -> Message {
    message_with(BODY, &[("content-type", b"application/json")], ordering_key)
}

/// The one message of a publish request, as JSON.
fn published(request: &[u8]) -> serde_json::Value {
    let json: serde_json::Value = serde_json::from_slice(request).unwrap();
    let messages = json["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{json}");
    assert_eq!(json.as_object().unwrap().len(), 1, "only messages: {json}");
    messages[0].clone()
}

fn attributes(message: &serde_json::Value) -> BTreeMap<String, String> {
    message["attributes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, value)| (name.clone(), value.as_str().unwrap().to_owned()))
        .collect()
}

fn expected_attributes(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut expected: BTreeMap<String, String> = [
        ("ankusa_message_version", "1"),
        ("ankusa_idempotency_key", "node:42:pubsub"),
        ("ankusa_tenant", "acme"),
        ("ankusa_source", "stripe"),
        ("ankusa_seq", "42"),
        ("ankusa_received_at", "1700000000123"),
        ("ankusa_attempt", "3"),
    ]
    .iter()
    .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
    .collect();
    for (name, value) in extra {
        expected.insert((*name).to_owned(), (*value).to_owned());
    }
    expected
}

fn permanent_reason(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Permanent { reason } => reason,
        other => panic!("not permanent: {other:?}"),
    }
}

fn retry_reason(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Retry { reason, .. } => reason,
        other => panic!("not a retry: {other:?}"),
    }
}

#[test]
fn the_request_carries_data_attributes_and_the_ordering_key_of_its_mode() {
    let unordered = published(&publish_request(&config("http://x"), &message(None)).unwrap());
    assert_eq!(
        STANDARD
            .decode(unordered["data"].as_str().unwrap())
            .unwrap(),
        BODY
    );
    assert_eq!(
        attributes(&unordered),
        expected_attributes(&[("content_type", "application/json")])
    );
    assert_eq!(unordered.get("orderingKey"), None, "{unordered}");
    assert_eq!(unordered.as_object().unwrap().len(), 2, "{unordered}");

    let ordered =
        published(&publish_request(&config("http://x"), &message(Some("cus_9"))).unwrap());
    assert_eq!(ordered["orderingKey"], "cus_9");
    assert_eq!(
        attributes(&ordered),
        expected_attributes(&[
            ("content_type", "application/json"),
            ("ankusa_ordering_key", "cus_9")
        ])
    );

    // The legacy fixed key: every message carries it, and no lane's key attribute.
    let mut fixed_config = config("http://x");
    fixed_config.fixed_ordering_key = Some("fixed-key".into());
    let fixed = published(&publish_request(&fixed_config, &message(None)).unwrap());
    assert_eq!(fixed["orderingKey"], "fixed-key");
    assert!(!attributes(&fixed).contains_key("ankusa_ordering_key"));

    // A stored content type that is not UTF-8, and none at all: no content_type attribute.
    for headers in [&[("content-type", &b"text/\xff"[..])][..], &[]] {
        let request = publish_request(&config("http://x"), &message_with(b"", headers, None));
        let without = published(&request.unwrap());
        assert_eq!(attributes(&without), expected_attributes(&[]));
        assert_eq!(without["data"], "");
    }
}

#[test]
fn the_topic_url_is_built_and_encoded() {
    let mut with_slash = config("http://127.0.0.1:8085/");
    with_slash.project = "example.com:proj".into();
    with_slash.topic = "hooks+v1%x".into();
    assert_eq!(
        publish_url(&with_slash),
        "http://127.0.0.1:8085/v1/projects/example.com%3Aproj/topics/hooks%2Bv1%25x:publish"
    );
    assert_eq!(
        publish_url(&config("https://pubsub.googleapis.com")),
        "https://pubsub.googleapis.com/v1/projects/proj/topics/hooks:publish"
    );
}

#[test]
fn budgets_are_checked_before_sending() {
    let at = |bytes: usize| "k".repeat(bytes);
    let config = config("http://x");
    assert!(publish_request(&config, &message(Some(&at(1024)))).is_ok());
    let reason = publish_request(&config, &message(Some(&at(1025)))).unwrap_err();
    // The lane's key is also an attribute value, over the same 1024 bytes.
    assert!(reason.starts_with("too_large: "), "{reason}");
    let mut fixed = config.clone();
    fixed.fixed_ordering_key = Some(at(1025));
    assert_eq!(
        publish_request(&fixed, &message(None)).unwrap_err(),
        "too_large: the ordering key is 1025 bytes, over Pub/Sub's 1024"
    );

    let content_type = |bytes: usize| format!("text/{}", at(bytes - 5)).into_bytes();
    let typed = |bytes: usize| {
        let value = content_type(bytes);
        publish_request(
            &config,
            &message_with(BODY, &[("content-type", &value)], None),
        )
    };
    assert!(typed(1024).is_ok());
    assert_eq!(
        typed(1025).unwrap_err(),
        "too_large: the attribute content_type is 1025 bytes, over Pub/Sub's 1024"
    );

    // The request limit counts the JSON as sent, base64 and all: 7.8 MB of body fits,
    // 7.9 MB does not, although both are under Pub/Sub's 10 MB per (decoded) message.
    let fits = publish_request(&config, &message_with(&vec![7u8; 7_800_000], &[], None)).unwrap();
    assert!(fits.len() <= REQUEST_MAX_BYTES, "{}", fits.len());
    let reason =
        publish_request(&config, &message_with(&vec![7u8; 7_900_000], &[], None)).unwrap_err();
    assert!(
        reason.starts_with("too_large: the publish request is 105"),
        "{reason}"
    );
    assert!(reason.ends_with("over Pub/Sub's 10485760"), "{reason}");

    let many: Vec<(&str, String)> = (0..101).map(|_| ("a", String::new())).collect();
    assert_eq!(
        check_attributes(&many).unwrap_err(),
        "too_large: 101 attributes, over Pub/Sub's 100"
    );
    assert!(check_attributes(&many[..100]).is_ok());
    let long_name = at(257);
    assert_eq!(
        check_attributes(&[(long_name.as_str(), String::new())]).unwrap_err(),
        "too_large: an attribute name is 257 bytes, over Pub/Sub's 256"
    );
    assert!(check_attributes(&[(&long_name[..256], at(1024))]).is_ok());
}

#[test]
fn answers_map_to_outcomes() {
    let google = |code: u16, status: &str, message: &str| {
        serde_json::json!({"error": {"code": code, "message": message, "status": status}})
            .to_string()
    };
    let delivered = publish_outcome(200, None, br#"{"messageIds":["123"]}"#, 1);
    assert_eq!(delivered, Outcome::Delivered);
    let both = publish_outcome(200, None, br#"{"messageIds":["1","2"]}"#, 2);
    assert_eq!(both, Outcome::Delivered);
    for (body, count) in [
        (&br#"{"messageIds":[]}"#[..], 1),
        (br#"{"messageIds":["1"]}"#, 2),
        (b"<html>ok</html>", 1),
        (b"", 1),
    ] {
        let outcome = publish_outcome(200, None, body, count);
        let reason = retry_reason(&outcome);
        assert!(
            reason.starts_with(&format!(
                "pubsub answered 200 without one message id for each of its {count} messages"
            )),
            "{reason}"
        );
    }

    let not_found = google(404, "NOT_FOUND", "Resource not found (resource=hooks).");
    assert_eq!(
        permanent_reason(&publish_outcome(404, None, not_found.as_bytes(), 1)),
        "no_topic: http 404 NOT_FOUND: Resource not found (resource=hooks)."
    );
    let invalid = google(400, "INVALID_ARGUMENT", "The value for 0 is too small.");
    assert_eq!(
        permanent_reason(&publish_outcome(400, None, invalid.as_bytes(), 1)),
        "http 400 INVALID_ARGUMENT: The value for 0 is too small."
    );
    let payload = google(
        400,
        "INVALID_ARGUMENT",
        "Request payload size exceeds the limit: 10485760 bytes.",
    );
    assert_eq!(
        permanent_reason(&publish_outcome(400, None, payload.as_bytes(), 1)),
        "too_large: http 400 INVALID_ARGUMENT: Request payload size exceeds the limit: 10485760 bytes."
    );
    let denied = google(
        403,
        "PERMISSION_DENIED",
        "User not authorized to perform this action.",
    );
    assert_eq!(
        permanent_reason(&publish_outcome(403, None, denied.as_bytes(), 1)),
        "permission_denied: http 403 PERMISSION_DENIED: User not authorized to perform this action."
    );
    assert_eq!(
        permanent_reason(&publish_outcome(413, None, b"", 1)),
        "too_large: http 413"
    );
    assert_eq!(
        permanent_reason(&publish_outcome(301, None, b"", 1)),
        "http 301"
    );

    let expired = google(
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials.",
    );
    assert_eq!(
        publish_outcome(401, None, expired.as_bytes(), 1),
        Outcome::Retry {
            reason: "unauthenticated: http 401 UNAUTHENTICATED: Request had invalid authentication credentials.".into(),
            retry_after: None,
        }
    );
    let hint = Some(Duration::from_secs(7));
    for (status, code) in [
        (408, "DEADLINE_EXCEEDED"),
        (409, "ABORTED"),
        (429, "RESOURCE_EXHAUSTED"),
        (499, "CANCELLED"),
        (500, "INTERNAL"),
        (502, ""),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
    ] {
        let body = if code.is_empty() {
            "<html>Bad Gateway</html>".to_owned()
        } else {
            google(status, code, "try later")
        };
        let outcome = publish_outcome(status, hint, body.as_bytes(), 1);
        let expected = if code.is_empty() {
            format!("http {status}: <html>Bad Gateway</html>")
        } else {
            format!("http {status} {code}: try later")
        };
        assert_eq!(
            outcome,
            Outcome::Retry {
                reason: expected,
                retry_after: hint
            },
            "{status}"
        );
    }
}

#[test]
fn reasons_are_one_line_and_short() {
    let long = format!("line one\nline two {}", "é".repeat(150));
    let body =
        serde_json::json!({"error": {"code": 400, "message": long, "status": "INVALID_ARGUMENT"}});
    let reason = error_text(400, body.to_string().as_bytes());
    // 200 bytes of message: "line one line two " is 18, then 91 whole 'é' (182 bytes).
    assert_eq!(
        reason,
        format!(
            "http 400 INVALID_ARGUMENT: line one line two {}",
            "é".repeat(91)
        )
    );
    // Not Google's JSON: the start of the body, as the HTTP sink words it.
    assert_eq!(
        error_text(502, &[b'x'; 300]),
        format!("http 502: {}", "x".repeat(200))
    );
}

// ---- The sink against a fake Pub/Sub and token endpoint. ----

/// One request as the fake server saw it.
#[derive(Debug, Clone)]
struct Recorded {
    path: String,
    /// Names lower-cased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(known, _)| known == name)
            .map(|(_, value)| value.as_str())
    }
}

enum Reply {
    Json(u16, String),
    /// Never answer; hold the connection until the client leaves.
    Silent,
}

type Handler = dyn Fn(&Recorded) -> Reply + Send + Sync;

struct Fake {
    url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl Fake {
    /// Listens on 127.0.0.1:0 and answers each request with `handler`; its threads end
    /// with the test process.
    fn start(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let recorded = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (recorded, handler) = (Arc::clone(&recorded), Arc::clone(&handler));
                std::thread::spawn(move || serve(stream, &recorded, &*handler));
            }
        });
        Fake { url, requests }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    fn on(&self, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|request| request.path == path)
            .collect()
    }
}

fn serve(mut stream: TcpStream, requests: &Mutex<Vec<Recorded>>, handler: &Handler) {
    let mut buffer: Vec<u8> = Vec::new();
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
        let mut request = httparse::Request::new(&mut parsed);
        request.parse(&buffer[..head_end]).unwrap();
        let path = request.path.unwrap().to_owned();
        let headers: Vec<(String, String)> = request
            .headers
            .iter()
            .map(|header| {
                (
                    header.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(header.value).into_owned(),
                )
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(name, _)| name == "content-length")
            .map_or(0, |(_, value)| value.parse().unwrap());
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 65536];
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let recorded = Recorded {
            path,
            headers,
            body: buffer[head_end..head_end + length].to_vec(),
        };
        buffer.drain(..head_end + length);
        requests.lock().unwrap().push(recorded.clone());
        match handler(&recorded) {
            Reply::Silent => {
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest);
                return;
            }
            Reply::Json(status, body) => {
                let response = format!(
                    "HTTP/1.1 {status} Fake\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(response.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

const PUBLISH_PATH: &str = "/v1/projects/proj/topics/hooks:publish";

fn published_ok() -> Reply {
    Reply::Json(200, r#"{"messageIds":["1"]}"#.into())
}

fn runtimes(pool_name: &str) -> SinkRuntimes {
    SinkRuntimes {
        pool: BlockingPool::new(pool_name, 2, &[]).unwrap(),
        io: SinkIo::new(&[]).unwrap(),
    }
}

/// Delivers each message in turn on one glommio executor, as a pipeline core would.
fn deliver_all(sink: &PubsubSink, messages: Vec<Message>) -> Vec<Outcome> {
    let executor = glommio::LocalExecutorBuilder::default().make().unwrap();
    executor.run(async {
        let mut outcomes = Vec::new();
        for message in messages {
            outcomes.push(sink.deliver(message).await);
        }
        outcomes
    })
}

fn deliver(sink: &PubsubSink, message: Message) -> Outcome {
    deliver_all(sink, vec![message]).pop().unwrap()
}

#[test]
fn a_publish_reaches_the_topic_with_the_configured_auth() {
    let fake = Fake::start(|_| published_ok());
    let mut with_token = config(&fake.url);
    with_token.auth = PubsubAuth::AccessToken("static-tok".into());
    let sink = PubsubSink::new(&with_token, &runtimes("test-pubsub-static"));
    assert_eq!(sink.kind(), "pubsub");
    assert_eq!(deliver(&sink, message(Some("cus_1"))), Outcome::Delivered);
    let emulator = PubsubSink::new(&config(&fake.url), &runtimes("test-pubsub-none"));
    assert_eq!(deliver(&emulator, message(None)), Outcome::Delivered);

    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(request.path, PUBLISH_PATH);
        assert_eq!(request.header("content-type"), Some("application/json"));
    }
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer static-tok")
    );
    assert_eq!(published(&requests[0].body)["orderingKey"], "cus_1");
    assert_eq!(requests[1].header("authorization"), None);
    let data = published(&requests[1].body)["data"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(STANDARD.decode(data).unwrap(), BODY);
}

/// A key file in `dir` whose token_uri is `token_uri`.
fn write_key_file(dir: &std::path::Path, token_uri: &str) -> std::path::PathBuf {
    let path = dir.join("key.json");
    std::fs::write(&path, key_file(token_uri).to_string()).unwrap();
    path
}

/// The assertion of a token request's form, once its fields are checked.
fn assertion_of(request: &Recorded) -> String {
    let form = std::str::from_utf8(&request.body).unwrap();
    let (grant, assertion) = form.split_once('&').unwrap();
    assert_eq!(
        grant,
        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer"
    );
    assert_eq!(
        request.header("content-type"),
        Some("application/x-www-form-urlencoded")
    );
    assertion.strip_prefix("assertion=").unwrap().to_owned()
}

#[test]
fn a_service_account_token_is_fetched_once_and_replaced_after_a_401() {
    let dir = tempfile::tempdir().unwrap();
    let key_text = key_file("unused").to_string();
    let public_key = ServiceAccountKey::parse(key_text.as_bytes())
        .unwrap()
        .public_key();
    let tokens = Arc::new(AtomicUsize::new(0));
    let refuse_next = Arc::new(AtomicUsize::new(0));
    let (issued, refusing) = (Arc::clone(&tokens), Arc::clone(&refuse_next));
    let fake = Fake::start(move |request| {
        if request.path == "/token" {
            let (_, claims) = verified_claims(&assertion_of(request), &public_key).unwrap();
            assert_eq!(claims["scope"], "https://www.googleapis.com/auth/pubsub");
            assert!(claims["aud"].as_str().unwrap().ends_with("/token"));
            let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
            return Reply::Json(
                200,
                format!(r#"{{"access_token":"tok-{n}","expires_in":3599,"token_type":"Bearer"}}"#),
            );
        }
        if refusing.swap(0, Ordering::SeqCst) == 1 {
            let body = r#"{"error":{"code":401,"message":"Request had invalid authentication credentials.","status":"UNAUTHENTICATED"}}"#;
            return Reply::Json(401, body.into());
        }
        published_ok()
    });
    let mut with_key = config(&fake.url);
    with_key.auth =
        PubsubAuth::ServiceAccount(write_key_file(dir.path(), &format!("{}/token", fake.url)));
    let sink = PubsubSink::new(&with_key, &runtimes("test-pubsub-sa"));

    let outcomes = deliver_all(&sink, vec![message(None), message(None), message(None)]);
    assert_eq!(
        outcomes,
        [Outcome::Delivered, Outcome::Delivered, Outcome::Delivered]
    );
    assert_eq!(fake.on("/token").len(), 1, "one token for every publish");

    refuse_next.store(1, Ordering::SeqCst);
    let outcomes = deliver_all(&sink, vec![message(None), message(None)]);
    assert!(
        retry_reason(&outcomes[0]).starts_with("unauthenticated: http 401 UNAUTHENTICATED"),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1], Outcome::Delivered);
    assert_eq!(fake.on("/token").len(), 2, "the refused token was replaced");
    let bearers: Vec<String> = fake
        .on(PUBLISH_PATH)
        .iter()
        .map(|request| request.header("authorization").unwrap().to_owned())
        .collect();
    assert_eq!(
        bearers,
        [
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-2"
        ]
    );
}

#[test]
fn a_refused_or_missing_credential_is_retried_without_publishing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(|request| {
        if request.path == "/token" {
            Reply::Json(
                400,
                r#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#.into(),
            )
        } else {
            published_ok()
        }
    });
    let mut refused = config(&fake.url);
    refused.auth =
        PubsubAuth::ServiceAccount(write_key_file(dir.path(), &format!("{}/token", fake.url)));
    let sink = PubsubSink::new(&refused, &runtimes("test-pubsub-refused"));
    assert_eq!(
        deliver(&sink, message(None)),
        Outcome::Retry {
            reason: "token endpoint: http 400: invalid_grant: Invalid JWT Signature.".into(),
            retry_after: None,
        }
    );

    let mut missing = config(&fake.url);
    let absent = dir.path().join("absent.json");
    missing.auth = PubsubAuth::ServiceAccount(absent.clone());
    let sink = PubsubSink::new(&missing, &runtimes("test-pubsub-missing"));
    let outcome = deliver(&sink, message(None));
    let reason = retry_reason(&outcome);
    assert!(
        reason.starts_with(&format!(
            "credentials_file {}: cannot read it: ",
            absent.display()
        )),
        "{reason}"
    );
    assert!(
        fake.on(PUBLISH_PATH).is_empty(),
        "nothing published without a token"
    );
}

#[test]
fn an_oversized_hook_is_refused_without_a_request() {
    let fake = Fake::start(|_| published_ok());
    let sink = PubsubSink::new(&config(&fake.url), &runtimes("test-pubsub-large"));
    let outcome = deliver(&sink, message_with(&vec![1u8; 8_000_000], &[], None));
    assert!(
        permanent_reason(&outcome).starts_with("too_large: "),
        "{outcome:?}"
    );
    assert!(fake.requests().is_empty());
}

#[test]
fn transport_failures_retry() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let closed = PubsubSink::new(
        &config(&format!("http://127.0.0.1:{port}")),
        &runtimes("test-pubsub-closed"),
    );
    let outcome = deliver(&closed, message(None));
    assert!(
        retry_reason(&outcome).starts_with("connect: "),
        "{outcome:?}"
    );

    let fake = Fake::start(|_| Reply::Silent);
    let mut slow = config(&fake.url);
    slow.timeout_ms = 300;
    let sink = PubsubSink::new(&slow, &runtimes("test-pubsub-silent"));
    assert_eq!(deliver(&sink, message(None)), retry("timeout".into()));
}

#[test]
fn a_closed_pool_retries() {
    let fake = Fake::start(|_| published_ok());
    let runtimes = runtimes("test-pubsub-closed-pool");
    let sink = PubsubSink::new(&config(&fake.url), &runtimes);
    runtimes.pool.close();
    assert_eq!(
        deliver(&sink, message(None)),
        retry("blocking pool test-pubsub-closed-pool is closed".into())
    );
    assert!(fake.requests().is_empty());
}
