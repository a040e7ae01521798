//! A trivial in-process HTTP/1.1 responder on `127.0.0.1:0`: the local receiver that the
//! cells' HTTP sinks deliver to (it answers 200 to everything), the fixed target of the
//! load generator's own tests, and, with a [`Judge`], the crash harness's receiver that
//! records each delivery and decides its status.
//!
//! One thread per connection with blocking I/O: the gateway's sink opens few connections
//! (its blocking pool bounds them), and a receiver that is simple to trust matters more here
//! than one that is fast. It counts the requests it answered, so a cell can compare them with
//! the gateway's delivery counter.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

/// Most connections served at once; more are closed on accept, so a runaway client cannot
/// make the gate spawn threads without bound.
const CONNECTIONS_MAX: usize = 4096;
/// How often a blocked connection thread looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(200);
/// Largest request head accepted.
const HEAD_MAX: usize = 64 * 1024;

#[derive(Debug, Error)]
pub enum ResponderError {
    #[error("cannot listen on 127.0.0.1:0: {0}")]
    Bind(std::io::Error),
    #[error("cannot start the responder thread: {0}")]
    Spawn(std::io::Error),
}

/// Decides the status of one request from its bytes (head and body); called on the
/// request's connection thread, so it may block (a slow destination) but must not panic.
pub type Judge = Arc<dyn Fn(&[u8]) -> u16 + Send + Sync>;

enum Answer {
    /// The whole answer, written after every request.
    Fixed(Vec<u8>),
    Judged(Judge),
}

fn answer_bytes(status: u16) -> Vec<u8> {
    format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\nok").into_bytes()
}

struct Shared {
    stop: AtomicBool,
    requests: AtomicU64,
    open_connections: AtomicUsize,
    answer: Answer,
    /// How long each request waits before its answer (a slow destination).
    delay: Duration,
}

/// A running responder; stopped on [`Responder::stop`] or drop.
pub struct Responder {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Responder")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Responder {
    /// Starts a responder that answers `status` with a two-byte body to every request.
    pub fn start(status: u16) -> Result<Responder, ResponderError> {
        Responder::start_delayed(status, Duration::ZERO)
    }

    /// Like [`Responder::start`], each answer sent `delay` after its request arrived.
    pub fn start_delayed(status: u16, delay: Duration) -> Result<Responder, ResponderError> {
        Responder::start_answering(Answer::Fixed(answer_bytes(status)), delay)
    }

    /// A responder that hands every complete request to `judge` and answers the status it
    /// returns (the crash harness's recording receiver).
    pub fn start_judging(judge: Judge) -> Result<Responder, ResponderError> {
        Responder::start_answering(Answer::Judged(judge), Duration::ZERO)
    }

    fn start_answering(answer: Answer, delay: Duration) -> Result<Responder, ResponderError> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(ResponderError::Bind)?;
        let addr = listener.local_addr().map_err(ResponderError::Bind)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            open_connections: AtomicUsize::new(0),
            answer,
            delay,
        });
        let accept_shared = shared.clone();
        let accept = std::thread::Builder::new()
            .name("bench-responder".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(ResponderError::Spawn)?;
        Ok(Responder {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Stops accepting; connection threads end within [`STOP_CHECK`].
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the blocking accept so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if shared.open_connections.load(Ordering::Acquire) >= CONNECTIONS_MAX {
            continue; // Dropping the stream closes it.
        }
        shared.open_connections.fetch_add(1, Ordering::AcqRel);
        let connection_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("bench-responder-conn".into())
            .spawn(move || {
                serve(stream, &connection_shared);
                connection_shared
                    .open_connections
                    .fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            shared.open_connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Answers requests on one keep-alive connection until the peer closes, a request is
/// malformed or the responder stops.
fn serve(mut stream: TcpStream, shared: &Shared) {
    if stream.set_read_timeout(Some(STOP_CHECK)).is_err() || stream.set_nodelay(true).is_err() {
        return;
    }
    let mut buffer: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        // Answer every complete request already buffered.
        loop {
            match request_len(&buffer) {
                Framing::Complete { length, close } => {
                    let judged;
                    let answer: &[u8] = match &shared.answer {
                        Answer::Fixed(fixed) => fixed,
                        Answer::Judged(judge) => {
                            judged = answer_bytes(judge(&buffer[..length]));
                            &judged
                        }
                    };
                    buffer.drain(..length);
                    if !shared.delay.is_zero() {
                        std::thread::sleep(shared.delay);
                    }
                    shared.requests.fetch_add(1, Ordering::Relaxed);
                    if stream.write_all(answer).is_err() || close {
                        return;
                    }
                }
                Framing::Incomplete => break,
                Framing::Invalid => return,
            }
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(count) => buffer.extend_from_slice(&chunk[..count]),
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Incomplete,
    Complete { length: usize, close: bool },
    Invalid,
}

/// The length of the request at the start of `buffer`, with a content-length or chunked
/// body (the gateway's sink may send either).
fn request_len(buffer: &[u8]) -> Framing {
    if buffer.is_empty() {
        return Framing::Incomplete;
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let head_len = match request.parse(buffer) {
        Ok(httparse::Status::Complete(head_len)) => head_len,
        Ok(httparse::Status::Partial) if buffer.len() < HEAD_MAX => return Framing::Incomplete,
        _ => return Framing::Invalid,
    };
    let mut content_length = 0usize;
    let mut chunked = false;
    let mut close = false;
    for header in request.headers.iter() {
        if header.name.eq_ignore_ascii_case("content-length") {
            match std::str::from_utf8(header.value)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                Some(length) => content_length = length,
                None => return Framing::Invalid,
            }
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = header
                .value
                .split(|byte| *byte == b',')
                .any(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if header.name.eq_ignore_ascii_case("connection") {
            close |= header.value.eq_ignore_ascii_case(b"close");
        }
    }
    if chunked {
        return match chunked_len(&buffer[head_len..]) {
            Framing::Complete { length, .. } => Framing::Complete {
                length: head_len + length,
                close,
            },
            other => other,
        };
    }
    if buffer.len() < head_len + content_length {
        return Framing::Incomplete;
    }
    Framing::Complete {
        length: head_len + content_length,
        close,
    }
}

/// The length of a chunked body (through its last chunk and trailers) at the start of
/// `body`.
fn chunked_len(body: &[u8]) -> Framing {
    let mut at = 0;
    loop {
        let Some(line_end) = find_crlf(&body[at..]) else {
            return Framing::Incomplete;
        };
        let line = &body[at..at + line_end];
        // Chunk extensions after `;` are ignored.
        let size_text = line.split(|byte| *byte == b';').next().unwrap_or(line);
        let Some(size) = std::str::from_utf8(size_text)
            .ok()
            .and_then(|text| usize::from_str_radix(text.trim(), 16).ok())
        else {
            return Framing::Invalid;
        };
        at += line_end + 2;
        if size == 0 {
            // Trailers, then an empty line.
            loop {
                let Some(trailer_end) = find_crlf(&body[at..]) else {
                    return Framing::Incomplete;
                };
                at += trailer_end + 2;
                if trailer_end == 0 {
                    return Framing::Complete {
                        length: at,
                        close: false,
                    };
                }
            }
        }
        if body.len() < at + size + 2 {
            return Framing::Incomplete;
        }
        at += size + 2;
    }
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|window| window == b"\r\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(input: &[u8], expected: Framing) {
        assert_eq!(
            request_len(input),
            expected,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }

    #[test]
    fn requests_are_framed() {
        let post = b"POST /a HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc";
        check(
            post,
            Framing::Complete {
                length: post.len(),
                close: false,
            },
        );
        check(&post[..post.len() - 1], Framing::Incomplete);
        let get = b"GET / HTTP/1.1\r\nconnection: close\r\n\r\nGET";
        check(
            get,
            Framing::Complete {
                length: get.len() - 3,
                close: true,
            },
        );
        let chunked = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        check(
            chunked,
            Framing::Complete {
                length: chunked.len(),
                close: false,
            },
        );
        check(&chunked[..chunked.len() - 2], Framing::Incomplete);
        check(
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            Framing::Invalid,
        );
        check(b"\x00\x01garbage\r\n\r\n", Framing::Invalid);
    }

    #[test]
    fn answers_keep_alive_requests_and_counts_them() {
        let responder = Responder::start(200).unwrap();
        let mut stream = TcpStream::connect(responder.addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        for _ in 0..3 {
            stream
                .write_all(b"POST /x HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
                .unwrap();
            let mut answer = [0u8; 64];
            let mut read = 0;
            while !answer[..read].ends_with(b"ok") {
                read += stream.read(&mut answer[read..]).unwrap();
            }
            assert!(answer.starts_with(b"HTTP/1.1 200 "));
        }
        assert_eq!(responder.requests(), 3);
        responder.stop();
    }
}
