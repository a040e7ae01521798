//! The admin port while the store migrates. A migration that rewrites records can take
//! minutes on a large store, and the admin listener proper needs the open store; meanwhile
//! an operator (or an orchestrator's probe) must see that the node is alive and how far it
//! is. So the first step of a migration starts this small listener on the admin address:
//!
//! - `GET /healthz`: 200, the process runs;
//! - `GET /readyz`: 503 `migrating`, with the progress in the message;
//! - `GET /v1/jobs` and `GET /v1/jobs/{id}`: the migration as a job (`store_migration`:
//!   done, total, rate, eta), under the API's token rule;
//! - `/console`: the web console's files, which show the migration's progress until the
//!   node is up;
//! - anything else: 503 `migrating` with a `Retry-After`.
//!
//! It closes when the store is open, before the admin listener proper takes the port; the
//! finished job is then listed by `/v1/jobs` with the other jobs. One thread, one request
//! per connection, blocking I/O with short timeouts: it serves probes, not traffic.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::admin::api::{self, ApiError};
use crate::admin::console;
use crate::admin::jobs::{Job, JobKind, Jobs};
use crate::edge::http;
use crate::store::migrate::Progress;

const HEAD_MAX: usize = 16 * 1024;
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the accept loop looks at its stop flag.
const POLL: Duration = Duration::from_millis(20);
/// How often the log reports progress.
const LOG_EVERY: Duration = Duration::from_secs(5);
/// What a refused request is told to wait before trying again.
const RETRY_AFTER_S: &str = "5";

/// A store migration as the node reports it: a job, a progress log, and the listener
/// that serves both while the store opens.
pub struct Migration {
    job: Arc<Job>,
    admin_listen: SocketAddr,
    token: Option<String>,
    started: AtomicBool,
    listener: Mutex<Option<Listener>>,
    logged_at: Mutex<Instant>,
}

struct Listener {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Migration {
    pub fn new(
        data_dir: &std::path::Path,
        admin_listen: SocketAddr,
        token: Option<String>,
    ) -> Migration {
        // A job of its own list: the node's list exists once the store is open, and adopts
        // it then.
        let job = Jobs::new().create(
            JobKind::StoreMigration,
            serde_json::json!({ "data_dir": data_dir.display().to_string() }),
        );
        Migration {
            job,
            admin_listen,
            token,
            started: AtomicBool::new(false),
            listener: Mutex::new(None),
            logged_at: Mutex::new(Instant::now()),
        }
    }

    /// Closes the listener (the store is open, or failed to open) and returns the job
    /// when a migration ran, finished with `outcome`, for the node's job list.
    pub fn finish(self, outcome: Result<serde_json::Value, ApiError>) -> Option<Arc<Job>> {
        if let Some(listener) = self
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            listener.stop.store(true, Ordering::Release);
            let _ = listener.thread.join();
        }
        if !self.started.load(Ordering::Acquire) {
            return None;
        }
        let done = self.job.view().done;
        match &outcome {
            Ok(_) => tracing::info!(records = done, "store migration finished"),
            Err(error) => {
                tracing::error!(records = done, error = %error.message, "store migration failed")
            }
        }
        self.job.finish(outcome);
        Some(self.job.clone())
    }

    fn start_listener(&self) {
        let stop = Arc::new(AtomicBool::new(false));
        let listener = match bind(self.admin_listen) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%error, admin = %self.admin_listen, "cannot serve the migration's progress on the admin address");
                return;
            }
        };
        let state = Shared {
            job: self.job.clone(),
            token: self.token.clone(),
            stop: stop.clone(),
        };
        match std::thread::Builder::new()
            .name("admin-boot".into())
            .spawn(move || state.serve(listener))
        {
            Ok(thread) => {
                *self.listener.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(Listener { stop, thread });
            }
            Err(error) => tracing::warn!(%error, "cannot start the migration's progress listener"),
        }
    }
}

impl Progress for Migration {
    fn step(&self, from: u32, to: u32, total: u64) {
        if !self.started.swap(true, Ordering::AcqRel) {
            self.job.begin();
            self.start_listener();
        }
        tracing::info!(
            from,
            to,
            records = total,
            admin = %self.admin_listen,
            "migrating the store; progress on GET /v1/jobs"
        );
        self.job.set_total(self.job.view().done + total);
    }

    fn advance(&self, records: u64) {
        self.job.add_done(records);
        let mut logged_at = self
            .logged_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if logged_at.elapsed() >= LOG_EVERY {
            *logged_at = Instant::now();
            let view = self.job.view();
            tracing::info!(
                done = view.done,
                total = view.total.unwrap_or(0),
                rate_per_s = view.rate_per_s as u64,
                "migrating the store"
            );
        }
    }
}

impl Drop for Migration {
    fn drop(&mut self) {
        if let Some(listener) = self
            .listener
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            listener.stop.store(true, Ordering::Release);
            let _ = listener.thread.join();
        }
    }
}

/// A listening socket on the admin address, beside the one `serve` reserved there (both
/// with SO_REUSEPORT, so a port 0 already resolved is shared).
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = crate::serve::reuse_port_socket(addr)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(64)?;
    let listener: TcpListener = socket.into();
    listener.set_nonblocking(true)?;
    Ok(listener)
}

struct Shared {
    job: Arc<Job>,
    token: Option<String>,
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn serve(self, listener: TcpListener) {
        while !self.stop.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(error) = self.answer(stream) {
                        tracing::debug!(%error, "migration progress request failed");
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(POLL)
                }
                Err(error) => {
                    tracing::warn!(%error, "admin accept failed during the migration");
                    std::thread::sleep(POLL);
                }
            }
        }
    }

    fn answer(&self, mut stream: TcpStream) -> std::io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_write_timeout(Some(READ_TIMEOUT))?;
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            if head.len() > HEAD_MAX {
                return write(
                    &mut stream,
                    431,
                    &error_body("header_too_large", "request head too large"),
                    &[],
                );
            }
            let read = stream.read(&mut chunk)?;
            if read == 0 {
                return Ok(());
            }
            head.extend_from_slice(&chunk[..read]);
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        if !matches!(request.parse(&head), Ok(httparse::Status::Complete(_))) {
            return write(
                &mut stream,
                400,
                &error_body("bad_request", "malformed admin request"),
                &[],
            );
        }
        let method = request.method.unwrap_or("");
        let path = request.path.unwrap_or("").split('?').next().unwrap_or("");
        let authorization = request
            .headers
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case("authorization"))
            .map(|header| header.value);
        if console::owns(path) {
            // The console's files need no store: served now, it shows the migration's
            // progress and loads its pages once the node is up.
            return match console::asset(path) {
                Some(asset) => write_typed(
                    &mut stream,
                    200,
                    asset.body,
                    asset.content_type,
                    &console::HEADERS,
                ),
                None => write(
                    &mut stream,
                    404,
                    &error_body("not_found", "no such console file"),
                    &[],
                ),
            };
        }
        let (status, body, headers) = self.respond(method, path, authorization);
        write(&mut stream, status, &body, headers)
    }

    fn respond(
        &self,
        method: &str,
        path: &str,
        authorization: Option<&[u8]>,
    ) -> (u16, Vec<u8>, &'static [(&'static str, &'static str)]) {
        const RETRY: &[(&str, &str)] = &[("retry-after", RETRY_AFTER_S)];
        let get = method == "GET" || method == "HEAD";
        let view = self.job.view();
        let migrating = format!(
            "the store is migrating: {} of {} records done; the node serves when it is open",
            view.done,
            view.total
                .map_or_else(|| "?".to_owned(), |total| total.to_string())
        );
        if path == "/v1" || path.starts_with("/v1/") {
            if !api::authorized(self.token.as_deref(), authorization) {
                return (
                    401,
                    error_body(
                        "unauthorized",
                        "the admin API needs Authorization: Bearer <instance.admin_token>",
                    ),
                    &[("www-authenticate", "Bearer")],
                );
            }
            let id = self.job.id().to_string();
            return match path.strip_prefix("/v1/jobs") {
                Some("") if get => (200, json(&[view]), &[]),
                Some(rest) if get && rest.strip_prefix('/') == Some(id.as_str()) => {
                    (200, json(&view), &[])
                }
                Some(rest) if get && rest.starts_with('/') => (
                    404,
                    error_body(
                        "unknown_job",
                        &format!("no job {:?} on this node", &rest[1..]),
                    ),
                    &[],
                ),
                _ => (503, error_body("migrating", &migrating), RETRY),
            };
        }
        match (get, path) {
            (true, "/healthz") => (200, br#"{"status":"ok"}"#.to_vec(), &[]),
            _ => (503, error_body("migrating", &migrating), RETRY),
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec())
}

fn error_body(code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    http::error_json(&mut body, code, message);
    body
}

fn write(
    stream: &mut TcpStream,
    status: u16,
    body: &[u8],
    headers: &[(&str, &str)],
) -> std::io::Result<()> {
    write_typed(stream, status, body, "application/json", headers)
}

fn write_typed(
    stream: &mut TcpStream,
    status: u16,
    body: &[u8],
    content_type: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
        http::reason(status),
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    stream.write_all(&out)
}
