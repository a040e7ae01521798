//! Hostile input against the real binary: request smuggling shapes, invalid UTF-8, path
//! tricks, and every edge limit at and just past its bound. A refused request gets its
//! status and a JSON error, a framing error closes the connection (so no byte after it is
//! read as a request), and nothing refused is stored.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};

use common::*;

const LIMITS: &str = "
edge:
  body_max_bytes: 1KiB
  header_count_max: 16
  header_bytes_max: 2KiB
";

fn sources() -> &'static str {
    "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {kind: http, url: 'http://127.0.0.1:9/hooks'}
  - id: open
    tenant_from: path
    auto_tenants: true
    sinks:
      - {kind: http, url: 'http://127.0.0.1:9/open'}
"
}

fn start(dir: &std::path::Path) -> Server {
    Server::start(
        dir,
        &config_yaml(&dir.join("data"), LIMITS, Some(sources())),
    )
}

/// The pipelined request every smuggling shape carries after its own: if the edge ever
/// reads it as a request, a hook is stored and the final count shows it.
const SMUGGLED: &[u8] =
    b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 14\r\n\r\n{\"smuggled\":1}";

/// Sends `request` and then [`SMUGGLED`] on one connection: the answer must be `status`
/// with a JSON error, and then the connection must be closed.
fn assert_refused_and_closed(server: &Server, request: &[u8], status: u16) {
    let mut stream = server.connect();
    let mut bytes = request.to_vec();
    bytes.extend_from_slice(SMUGGLED);
    // The edge may close before it has read everything; a reset on write is fine.
    let _ = stream.write_all(&bytes);
    let shown = String::from_utf8_lossy(request);
    let response = read_response(&mut stream).unwrap_or_else(|| panic!("no response to {shown:?}"));
    assert_eq!(response.status, status, "{shown:?}: {response:?}");
    assert!(
        response.json()["error"].is_string(),
        "{shown:?}: {response:?}"
    );
    assert_eq!(
        response.header("connection"),
        Some("close"),
        "{shown:?}: {response:?}"
    );
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => assert!(
            rest.is_empty(),
            "{shown:?}: more after the refusal: {:?}",
            String::from_utf8_lossy(&rest)
        ),
        // A reset (the edge closed with our bytes unread) is a close too.
        Err(error) => assert_eq!(
            error.kind(),
            std::io::ErrorKind::ConnectionReset,
            "{shown:?}"
        ),
    }
}

#[test]
fn smuggling_shapes_are_refused_and_the_connection_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let bad_request: &[&[u8]] = &[
        // Content-Length with Transfer-Encoding, in both orders (RFC 9112 §6.3: a smuggling
        // shape; refused rather than one of them believed).
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n0\r\n\r\n",
        // Duplicate Content-Length, different values and as a list.
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 2, 2\r\n\r\n{}",
        // Content-Length that is not a plain decimal.
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: +2\r\n\r\n{}",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 0x2\r\n\r\n{}",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 99999999999999999999999\r\n\r\n{}",
        // Bad chunk sizes: not hex, negative, overflowing, missing, ended by a bare LF.
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff2\r\n{}\r\n0\r\n\r\n",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n\r\n{}\r\n0\r\n\r\n",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n2\n{}\r\n0\r\n\r\n",
        // Chunk data longer than its size line says.
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n1\r\n{}\r\n0\r\n\r\n",
        // Header shapes that proxies read differently: obs-fold, space before the colon.
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\nx-a: 1\r\n folded\r\ncontent-length: 2\r\n\r\n{}",
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length : 2\r\n\r\n{}",
        // A request line with no version, or with a byte a path may not hold.
        b"POST /hooks/demo\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}",
        b"POST /hooks/de\xffmo HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}",
        b"POST /hooks/open/acme\xff HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}",
    ];
    for request in bad_request {
        assert_refused_and_closed(&server, request, 400);
    }
    // A transfer coding Ankusa does not implement: 501 (RFC 9112 §6.1), and closed.
    for request in [
        &b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"[..],
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    ] {
        assert_refused_and_closed(&server, request, 501);
    }
    // The edge still serves a plain request on a new connection.
    assert_eq!(server.post("/hooks/demo", &[], b"{}").status, 202);
    // A bare LF ending a head line is a line end (RFC 9112 §2.2 lets a server take it
    // so); the head's framing is still exact, so nothing is read past the body.
    let mut stream = server.connect();
    stream
        .write_all(b"POST /hooks/demo HTTP/1.1\nhost: t\ncontent-length: 2\n\n{}")
        .unwrap();
    assert_eq!(read_response(&mut stream).unwrap().status, 202);
    assert!(server.stop().success());
    let (ok, report) = store_verify(&dir.path().join("data"));
    assert!(ok, "{report}");
    assert!(report.contains("2 hooks"), "{report}");
}

#[test]
fn invalid_utf8_and_path_tricks_never_reach_a_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let post_raw = |path: &[u8], extra_header: &[u8]| {
        let mut request = b"POST ".to_vec();
        request.extend_from_slice(path);
        request.extend_from_slice(b" HTTP/1.1\r\nhost: t\r\n");
        request.extend_from_slice(extra_header);
        request.extend_from_slice(b"content-length: 2\r\n\r\n{}");
        let mut stream = server.connect();
        stream.write_all(&request).unwrap();
        read_response(&mut stream).expect("no response")
    };
    // Paths that are not a route, or name a source or tenant that is not there: 404 with a
    // code, never a 2xx, never a new tenant. Ankusa does not percent-decode or normalise a
    // path, so `..` and `%2e%2e` are plain names that match nothing. (A path with invalid
    // UTF-8 is not even a request line: 400, in the smuggling test.)
    for (path, code) in [
        (&b"/hooks/../admin"[..], "unknown_source"),
        (b"/hooks/./demo", "unknown_source"),
        (b"/hooks/%2e%2e/demo", "unknown_source"),
        (b"/hooks/demo/../demo", "not_found"),
        (b"/hooks//demo", "not_found"),
        (b"/hooks/demo%2F..", "unknown_source"),
        (b"/v1/stats", "not_found"),
        (b"/hooks/open/..", "invalid_tenant_id"),
        (b"/hooks/open/.", "invalid_tenant_id"),
        (b"/hooks/open/%2e%2e", "invalid_tenant_id"),
        (b"/hooks/open/ACME", "invalid_tenant_id"),
        (b"/hooks/open/a/b", "not_found"),
        (b"/hooks/open/acme%00", "invalid_tenant_id"),
    ] {
        let response = post_raw(path, b"");
        let shown = String::from_utf8_lossy(path);
        assert_eq!(response.status, 404, "{shown}: {response:?}");
        assert_eq!(response.json()["error"], code, "{shown}: {response:?}");
    }
    let long_tenant = format!("/hooks/open/{}", "a".repeat(65));
    let response = post_raw(long_tenant.as_bytes(), b"");
    assert_eq!(
        response.json()["error"],
        "invalid_tenant_id",
        "{response:?}"
    );
    // A request target that is not origin-form is no route either.
    let response = post_raw(b"http://evil.example/hooks/demo", b"");
    assert_eq!(response.status, 404, "{response:?}");

    // Invalid UTF-8 in a header name is a malformed request; in a value it is obs-text,
    // which HTTP allows: the hook is taken and its header kept as bytes.
    let response = post_raw(b"/hooks/demo", b"x-\xff: 1\r\n");
    assert_eq!(response.status, 400, "{response:?}");
    let response = post_raw(b"/hooks/demo", b"x-odd: \xff\xfe\r\n");
    assert_eq!(response.status, 202, "{response:?}");
    // The auto source's valid tenant is still served, and is the only tenant it made.
    assert_eq!(post_raw(b"/hooks/open/acme-2", b"").status, 202);
    let tenants = server.admin_get("/v1/tenants");
    assert_eq!(tenants.status, 200, "{tenants:?}");
    let mut ids: Vec<String> = tenants.json()["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tenant| tenant["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, ["acme", "acme-2", "globex"], "{tenants:?}");
    assert!(server.stop().success());
    let (ok, report) = store_verify(&dir.path().join("data"));
    assert!(ok, "{report}");
    assert!(report.contains("2 hooks"), "{report}");
}

/// A request head of exactly `len` bytes with `count` headers (host and content-length
/// among them) and a `len_body`-byte body.
fn request_of(len: usize, count: usize, len_body: usize) -> Vec<u8> {
    let mut head =
        format!("POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: {len_body}\r\n");
    for i in 2..count - 1 {
        head.push_str(&format!("x-h{i:02}: v\r\n"));
    }
    // The last header pads the head to `len`.
    let fixed = head.len() + "x-pad: \r\n\r\n".len();
    assert!(len >= fixed, "{len} < {fixed}");
    head.push_str(&format!("x-pad: {}\r\n\r\n", "p".repeat(len - fixed)));
    assert_eq!(head.len(), len);
    let mut request = head.into_bytes();
    request.extend(std::iter::repeat_n(b'x', len_body));
    request
}

#[test]
fn limits_hold_at_their_bound_and_refuse_just_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let send = |request: Vec<u8>| {
        let mut stream = server.connect();
        let _ = stream.write_all(&request);
        read_response(&mut stream).expect("no response")
    };
    // header_count_max 16, header_bytes_max 2 KiB (the whole head), body_max_bytes 1 KiB.
    for (request, status, what) in [
        (request_of(2048, 16, 1024), 202, "every bound exactly"),
        (request_of(2049, 16, 10), 431, "head one byte over"),
        (request_of(600, 17, 10), 431, "one header over"),
        (request_of(600, 16, 1025), 413, "body one byte over"),
    ] {
        let response = send(request);
        assert_eq!(response.status, status, "{what}: {response:?}");
        if status != 202 {
            assert!(response.json()["error"].is_string(), "{what}: {response:?}");
        }
    }
    // A chunked body is held to the same bound, counted in decoded bytes.
    let chunked = |len: usize| {
        let mut request =
            b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for part in [len / 2, len - len / 2] {
            request.extend_from_slice(format!("{part:x}\r\n").as_bytes());
            request.extend(std::iter::repeat_n(b'y', part));
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
        request
    };
    assert_eq!(send(chunked(1024)).status, 202);
    let over = send(chunked(1025));
    assert_eq!(over.status, 413, "{over:?}");
    assert_eq!(over.json()["error"], "payload_too_large", "{over:?}");
    assert!(server.stop().success());
    let (ok, report) = store_verify(&dir.path().join("data"));
    assert!(ok, "{report}");
    assert!(
        report.contains("2 hooks"),
        "nothing refused may be stored: {report}"
    );
}

/// A slowloris: 1,000 connections that send a head one byte at a time and never finish it.
/// Other clients' hooks keep being acked while they are held, and each is cut off with 408
/// once `header_read_timeout_ms` has passed since its first byte. (`bench-gate slowloris`
/// measures what the held connections cost the others' latency.)
#[test]
fn a_slowloris_of_a_thousand_connections_does_not_hold_up_other_clients() {
    let dir = tempfile::tempdir().unwrap();
    let limits = "
edge:
  header_read_timeout_ms: 5000
";
    let server = Server::start(
        dir.path(),
        &config_yaml(&dir.path().join("data"), limits, Some(sources())),
    );
    let mut slow = Vec::new();
    for _ in 0..1000 {
        let mut stream = server.connect();
        stream
            .write_all(b"POST /hooks/demo HTTP/1.1\r\nx-slow: ")
            .unwrap();
        slow.push(stream);
    }
    // A byte more a second later does not restart a connection's deadline (written well
    // before it, so no write meets a closed socket and resets the 408 away).
    std::thread::sleep(std::time::Duration::from_secs(1));
    for stream in &mut slow {
        stream.write_all(b"z").unwrap();
    }
    // While they are held, hooks are acked.
    for round in 0..10 {
        for i in 0..20 {
            let body = format!(r#"{{"round":{round},"i":{i}}}"#);
            let response = server.post("/hooks/demo", &[], body.as_bytes());
            assert_eq!(response.status, 202, "{response:?}");
        }
    }
    // Every slow head is cut off with 408 and its connection closed.
    for (i, stream) in slow.iter_mut().enumerate() {
        let response = read_response(stream)
            .unwrap_or_else(|| panic!("slow connection {i}: closed without a 408"));
        assert_eq!(response.status, 408, "slow connection {i}: {response:?}");
        assert_eq!(response.json()["error"], "header_timeout", "{response:?}");
    }
    assert!(server.stop().success());
    let (ok, report) = store_verify(&dir.path().join("data"));
    assert!(ok, "{report}");
    assert!(report.contains("200 hooks"), "{report}");
}
