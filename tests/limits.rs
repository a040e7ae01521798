//! Edge limits and framing against the real binary: every refusal is the right status
//! with a JSON error, slow clients are cut off, and both body framings are accepted.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;

const LIMITS: &str = "
edge:
  body_max_bytes: 1KiB
  header_count_max: 16
  header_bytes_max: 2KiB
  header_read_timeout_ms: 400
  body_read_timeout_ms: 400
  idle_timeout_ms: 3000
";

fn start(dir: &std::path::Path) -> Server {
    Server::start(dir, &config_yaml(&dir.join("data"), LIMITS, None))
}

fn raw(server: &Server, request: &[u8]) -> Option<Response> {
    let mut stream = server.connect();
    stream.write_all(request).unwrap();
    read_response(&mut stream)
}

fn assert_refused(response: Option<Response>, status: u16) {
    let response = response.expect("no response");
    assert_eq!(response.status, status, "{response:?}");
    assert!(response.json()["error"].is_string(), "{response:?}");
}

#[test]
fn refusals() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());

    // Oversized body: refused from the head, before the body is read.
    let big = vec![b'x'; 2048];
    assert_refused(Some(server.post("/hooks/demo", &[], &big)), 413);

    let mut many = String::from("POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n");
    for i in 0..20 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n{}");
    assert_refused(raw(&server, many.as_bytes()), 431);

    let long = format!(
        "POST /hooks/demo HTTP/1.1\r\nhost: t\r\nx-long: {}\r\ncontent-length: 2\r\n\r\n{{}}",
        "a".repeat(3000)
    );
    assert_refused(raw(&server, long.as_bytes()), 431);

    assert_refused(raw(&server, b"BLAH\r\n\r\n"), 400);
    assert_refused(
        raw(&server, b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n{}"),
        400,
    );
    assert_refused(
        raw(&server, b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\n\r\n"),
        411,
    );
    assert!(server.stop().success());
}

#[test]
fn chunked_and_expect_continue_bodies_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let response = raw(
        &server,
        b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n",
    );
    assert_eq!(response.unwrap().status, 202);

    let mut stream = server.connect();
    stream
        .write_all(b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n")
        .unwrap();
    let mut interim = [0u8; 25];
    stream.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(b"{}").unwrap();
    assert_eq!(read_response(&mut stream).unwrap().status, 202);
    assert!(server.stop().success());
}

#[test]
fn slow_clients_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());

    // A head that never completes: 408 once header_read_timeout_ms passes.
    let mut stream = server.connect();
    let started = Instant::now();
    stream
        .write_all(b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\n")
        .unwrap();
    let response = read_response(&mut stream);
    assert_refused(response, 408);
    assert!(started.elapsed() < Duration::from_secs(10));

    // A body that stops short of its content-length.
    let mut stream = server.connect();
    stream
        .write_all(
            b"POST /hooks/demo HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{\"partial\":",
        )
        .unwrap();
    assert_refused(read_response(&mut stream), 408);

    // An idle keep-alive connection is closed after idle_timeout_ms.
    let mut stream = server.connect();
    let mut byte = [0u8; 1];
    assert_eq!(
        stream.read(&mut byte).unwrap(),
        0,
        "idle connection was not closed"
    );
    assert!(server.stop().success());
    let (ok, report) = store_verify(&dir.path().join("data"));
    assert!(ok, "{report}");
    assert!(
        report.contains("0 hooks"),
        "nothing partial may be stored: {report}"
    );
}
