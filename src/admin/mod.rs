//! The admin listener: `/healthz`, `/readyz`, `/metrics`, and the JSON admin API under
//! `/v1/` (DLQ list, revive and purge; archive replay; stats). Runs as a task on the first
//! ingest core; its requests are rare and small, one per connection.
//!
//! With `instance.admin_token` set, every `/v1/` request needs `Authorization: Bearer
//! <token>`; health and metrics stay open for probes and scrapers. The `/v1/` work reads
//! and writes the store with `sync` and waits for the writer, so it never runs on this
//! executor: it runs on one of the admin's two one-thread `BlockingPool`s, whose future the
//! connection task awaits. `pool` answers the quick requests (listings, stats, tenants,
//! quarantine, a one-row revive or purge, a reload); `jobs_pool` runs the jobs that may
//! last minutes (an archive replay or a revive of a selection under a tenant's replay
//! budget, a purge of a selection), one at a time, the next one shown `queued` until it
//! starts. So the node can be looked at and operated while a replay runs; the operations
//! that read what they then move take `Operations::lock_moves` for each such step instead
//! of relying on one thread.
//!
//! - [`api`]: token check, requests and answers (sans-IO).
//! - [`operations`]: the blocking work on the store and the writer.
//! - [`budget`]: how fast a replay or revive may put rows in front of live ones.
//! - [`breakers`]: the circuit breakers that are not closed, per tenant and node-wide.
//! - [`console`]: the web console's embedded files under `/console`, a client of `/v1/`.
//! - [`boot`]: what the admin address answers while a store migration runs at startup.

pub mod api;
pub mod boot;
pub mod breakers;
pub mod budget;
pub mod console;
pub mod envelope;
pub mod jobs;
pub mod lanes;
pub mod operations;
pub mod reload;
pub mod tenancy;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

use crate::edge::http::{self, BodyFraming, Head, Method};
use crate::store::space::FreeSpace;
use api::{ApiError, DlqQuery, HookRef, PurgeTenant, QuarantineQuery, ReplayRequest, Selector};
use jobs::JobKind;
use operations::Operations;

pub struct Admin {
    pub prometheus: PrometheusHandle,
    /// True while the writer's committer runs: a 2xx is possible.
    pub writer_running: Arc<AtomicBool>,
    /// Under the free-space reserve the node takes no hooks, so it is not ready either.
    pub space: Arc<FreeSpace>,
    pub shutdown: shards::Shutdown,
    /// `instance.admin_token`: what `/v1/` requires when set.
    pub token: Option<String>,
    /// The `/v1/` work, run on `pool` or `jobs_pool`.
    pub operations: Arc<Operations>,
    /// One thread: keeps blocking store work off this executor and answers the quick
    /// requests one at a time.
    pub pool: Arc<shards::BlockingPool>,
    /// One thread: runs the long jobs (replays, revives of a selection) one at a time,
    /// beside `pool`, so a job that takes minutes never holds up a quick request.
    pub jobs_pool: Arc<shards::BlockingPool>,
}

pub async fn run(admin: Arc<Admin>, listener: TcpListener) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            while !admin.shutdown.requested() {
                glommio::timer::sleep(Duration::from_millis(50)).await;
            }
            None
        })
        .await;
        match accepted {
            None => {
                // The writer stops only when every handle is gone; a job still running
                // keeps its own clone until it is done.
                admin.operations.release_writer();
                return;
            }
            Some(Ok(stream)) => {
                glommio::spawn_local(serve(admin.clone(), stream)).detach();
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "admin accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).map_err(|error| std::io::Error::other(error.to_string()))
}

const ADMIN_HEAD_MAX: usize = 16 * 1024;
/// The largest request body: `/v1/` bodies are small JSON selectors.
const ADMIN_BODY_MAX: usize = 64 * 1024;
/// The whole request must arrive within this; an admin client has no reason to trickle.
const ADMIN_READ_DEADLINE: Duration = Duration::from_secs(10);

/// One admin request, read whole.
struct Request {
    method: Method,
    path: String,
    query: Vec<u8>,
    authorization: Option<Vec<u8>>,
    body: Vec<u8>,
}

/// One answer: status, JSON (or Prometheus text, or a console file) body, extra headers.
struct Response {
    status: u16,
    body: Vec<u8>,
    /// `None`: JSON. Otherwise the type of a 200 answer's body.
    content_type: Option<&'static str>,
    headers: Vec<(&'static str, &'static str)>,
}

impl Response {
    fn json(status: u16, body: Vec<u8>) -> Response {
        Response {
            status,
            body,
            content_type: None,
            headers: Vec::new(),
        }
    }

    fn console(asset: console::Asset) -> Response {
        Response {
            status: 200,
            body: asset.body.to_vec(),
            content_type: Some(asset.content_type),
            headers: console::HEADERS.to_vec(),
        }
    }

    fn error(error: &ApiError) -> Response {
        if error.problems.is_empty() {
            let mut body = Vec::new();
            http::error_json(&mut body, error.code, &error.message);
            return Response::json(error.status, body);
        }
        let body = serde_json::json!({
            "error": error.code,
            "message": error.message,
            "problems": error.problems,
        });
        Response::json(error.status, body.to_string().into_bytes())
    }

    fn with_header(mut self, name: &'static str, value: &'static str) -> Response {
        self.headers.push((name, value));
        self
    }
}

async fn serve(admin: Arc<Admin>, mut stream: TcpStream) {
    let response = match read_request(&mut stream).await {
        Ok(request) => respond(&admin, request).await,
        Err(Some(response)) => response,
        Err(None) => return,
    };
    let mut out = Vec::with_capacity(256 + response.body.len());
    if let Some(content_type) = response.content_type {
        write_ok(&mut out, content_type, &response.body, &response.headers);
    } else {
        let retry_after = (response.status == 503).then_some(1);
        http::write_response(
            &mut out,
            response.status,
            &response.body,
            false,
            retry_after,
            &response.headers,
        );
    }
    let _ = stream.write_all(&out).await;
    let _ = stream.close().await;
}

/// Reads one request: its head, then a Content-Length body of at most
/// [`ADMIN_BODY_MAX`]. `Err(None)`: the client went away or was too slow.
async fn read_request(stream: &mut TcpStream) -> Result<Request, Option<Response>> {
    let limits = http::Limits {
        body_max_bytes: ADMIN_BODY_MAX,
        header_count_max: 64,
        header_bytes_max: ADMIN_HEAD_MAX,
    };
    let mut buf = vec![0u8; ADMIN_HEAD_MAX];
    let mut filled = 0;
    let mut head = Head::new();
    let deadline = Instant::now() + ADMIN_READ_DEADLINE;
    loop {
        filled += read_some(stream, &mut buf[filled..], deadline)
            .await
            .ok_or(None)?;
        match http::parse_head(&buf[..filled], &limits, &mut head) {
            Ok(true) => break,
            Ok(false) if filled < buf.len() => continue,
            Ok(false) => return Err(Some(Response::error(&framing_error(None)))),
            Err(error) => return Err(Some(Response::error(&framing_error(Some(&error))))),
        }
    }
    let body_len = match head.framing {
        BodyFraming::None => 0,
        BodyFraming::Length(length) => length,
        BodyFraming::Chunked => {
            return Err(Some(Response::error(&ApiError::new(
                411,
                "length_required",
                "admin requests send their body with content-length",
            ))))
        }
    };
    let end = head.head_len + body_len;
    if buf.len() < end {
        buf.resize(end, 0);
    }
    while filled < end {
        filled += read_some(stream, &mut buf[filled..end], deadline)
            .await
            .ok_or(None)?;
    }
    let text = |range: std::ops::Range<usize>| buf.get(range).unwrap_or_default();
    Ok(Request {
        method: head.method,
        path: String::from_utf8_lossy(text(head.path.clone())).into_owned(),
        query: head.query.clone().map(text).unwrap_or_default().to_vec(),
        authorization: head.header(&buf, "authorization").map(<[u8]>::to_vec),
        body: buf[head.head_len..end].to_vec(),
    })
}

/// One read before `deadline`; `None` at end of stream, on an error or past the deadline.
async fn read_some(stream: &mut TcpStream, into: &mut [u8], deadline: Instant) -> Option<usize> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    if remaining.is_zero() || stream.set_read_timeout(Some(remaining)).is_err() {
        return None;
    }
    match stream.read(into).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

fn framing_error(error: Option<&http::HttpError>) -> ApiError {
    match error {
        Some(error) => ApiError::new(error.status(), error.code(), error.to_string()),
        None => ApiError::new(400, "bad_request", "malformed admin request"),
    }
}

async fn respond(admin: &Arc<Admin>, request: Request) -> Response {
    let get = matches!(request.method, Method::Get | Method::Head);
    let path = request.path.as_str();
    if path == "/v1" || path.starts_with("/v1/") {
        // Before routing, so a client without the token learns nothing about the routes.
        if !api::authorized(admin.token.as_deref(), request.authorization.as_deref()) {
            let error = ApiError::new(
                401,
                "unauthorized",
                "the admin API needs Authorization: Bearer <instance.admin_token>",
            );
            return Response::error(&error).with_header("www-authenticate", "Bearer");
        }
        return match v1(admin, &request).await {
            Ok(response) => response,
            Err(error) => {
                if error.status >= 500 {
                    tracing::error!(path, code = error.code, message = %error.message, "admin request failed");
                }
                Response::error(&error)
            }
        };
    }
    if console::owns(path) {
        return match (get, console::asset(path)) {
            (true, Some(asset)) => Response::console(asset),
            (false, Some(_)) => method_not_allowed("GET"),
            (_, None) => Response::error(&ApiError::new(404, "not_found", "no such console file")),
        };
    }
    match (get, path) {
        (true, "/healthz") => Response::json(200, br#"{"status":"ok"}"#.to_vec()),
        (true, "/readyz") => {
            if !admin.writer_running.load(Ordering::Acquire) || admin.shutdown.requested() {
                Response::error(&ApiError::new(
                    503,
                    "not_ready",
                    "the writer is not running",
                ))
            } else if admin.space.low() {
                Response::error(&ApiError::new(
                    503,
                    "disk_full",
                    "the data directory's free space is under store.min_free_bytes",
                ))
            } else {
                Response::json(200, br#"{"status":"ready"}"#.to_vec())
            }
        }
        (true, "/metrics") => Response {
            status: 200,
            body: admin.prometheus.render().into_bytes(),
            content_type: Some("text/plain; version=0.0.4"),
            headers: Vec::new(),
        },
        (false, "/healthz" | "/readyz" | "/metrics") => method_not_allowed("GET"),
        _ => Response::error(&ApiError::new(404, "not_found", "no such admin route")),
    }
}

/// The `/v1/` routes, after the token check.
async fn v1(admin: &Arc<Admin>, request: &Request) -> Result<Response, ApiError> {
    let get = matches!(request.method, Method::Get | Method::Head);
    let post = request.method == Method::Post;
    match request.path.as_str() {
        "/v1/dlq" if get => {
            let query = DlqQuery::parse(&request.query)?;
            on_pool(admin, move |operations| operations.list_dead(&query)).await
        }
        "/v1/dlq/hook" if get => {
            let hook = HookRef::from_query(&request.query)?;
            on_pool(admin, move |operations| operations.show_hook(&hook)).await
        }
        "/v1/dlq/revive" if post => {
            selection_job(admin, &request.body, JobKind::DlqRevive, Operations::revive).await
        }
        "/v1/dlq/purge" if post => {
            selection_job(admin, &request.body, JobKind::DlqPurge, Operations::purge).await
        }
        "/v1/archive/replay" if post => {
            let (background, body, shown) = jobs::split_background(&request.body)?;
            let replay = ReplayRequest::parse(&body)?;
            let job = admin.operations.jobs.create(JobKind::ArchiveReplay, shown);
            on_job(
                admin,
                &admin.jobs_pool,
                job,
                background,
                move |operations, job| operations.replay(&replay, job),
            )
            .await
        }
        // Read from the jobs' atomics, never through a pool.
        "/v1/jobs" if get => {
            to_json(&admin.operations.jobs.list()).map(|body| Response::json(200, body))
        }
        path if get && path.starts_with("/v1/jobs/") => {
            let id = &path["/v1/jobs/".len()..];
            let job = id
                .parse::<u64>()
                .ok()
                .and_then(|id| admin.operations.jobs.get(id))
                .ok_or_else(|| ApiError::new(404, "unknown_job", format!("no job {id:?} on this node (finished jobs are kept for a while, then forgotten)")))?;
            to_json(&job.view()).map(|body| Response::json(200, body))
        }
        "/v1/lanes" if get => {
            let query = lanes::LanesQuery::parse(&request.query)?;
            on_pool(admin, move |operations| operations.list_lanes(&query)).await
        }
        "/v1/stats" if get => on_pool(admin, |operations| operations.stats()).await,
        "/v1/tenants" if get => on_pool(admin, |operations| operations.list_tenants()).await,
        "/v1/quarantine" if get => {
            let query = QuarantineQuery::parse(&request.query)?;
            on_pool(admin, move |operations| operations.list_quarantine(&query)).await
        }
        "/v1/quarantine/hook" if get => {
            let hook = HookRef::from_query(&request.query)?;
            on_pool(admin, move |operations| operations.show_quarantined(&hook)).await
        }
        "/v1/quarantine/release" if post => {
            let hook = HookRef::parse(&request.body)?;
            on_pool(admin, move |operations| operations.release(&hook)).await
        }
        "/v1/quarantine/delete" if post => {
            let hook = HookRef::parse(&request.body)?;
            on_pool(admin, move |operations| {
                operations.delete_quarantined(&hook)
            })
            .await
        }
        "/v1/reload" if post => on_pool(admin, |operations| operations.reload_config()).await,
        "/v1/tenants/purge" if post => {
            let purge = PurgeTenant::parse(&request.body)?;
            on_pool(admin, move |operations| {
                operations.purge_tenant(&purge.tenant)
            })
            .await
        }
        "/v1/tenants/purge" | "/v1/reload" => Ok(method_not_allowed("POST")),
        path if get && path.starts_with("/v1/tenants/") => {
            let id = path["/v1/tenants/".len()..].to_owned();
            on_pool(admin, move |operations| operations.show_tenant(&id)).await
        }
        "/v1/dlq"
        | "/v1/dlq/hook"
        | "/v1/lanes"
        | "/v1/stats"
        | "/v1/tenants"
        | "/v1/quarantine"
        | "/v1/quarantine/hook" => Ok(method_not_allowed("GET")),
        path if path.starts_with("/v1/tenants/") => Ok(method_not_allowed("GET")),
        path if path == "/v1/jobs" || path.starts_with("/v1/jobs/") => {
            Ok(method_not_allowed("GET"))
        }
        "/v1/dlq/revive"
        | "/v1/dlq/purge"
        | "/v1/archive/replay"
        | "/v1/quarantine/release"
        | "/v1/quarantine/delete" => Ok(method_not_allowed("POST")),
        _ => Err(ApiError::new(404, "not_found", "no such admin route")),
    }
}

/// Runs `job` on the admin pool and answers its result as JSON with 200.
async fn on_pool<T, F>(admin: &Arc<Admin>, job: F) -> Result<Response, ApiError>
where
    F: FnOnce(&Operations) -> Result<T, ApiError> + Send + 'static,
    T: Serialize + Send + 'static,
{
    let operations = admin.operations.clone();
    let result = admin
        .pool
        .run(move || job(&operations).and_then(|answer| to_json(&answer)))
        .await;
    match result {
        Ok(Ok(body)) => Ok(Response::json(200, body)),
        Ok(Err(error)) => Err(error),
        Err(error) => Err(pool_error(error)),
    }
}

fn pool_error(error: shards::PoolError) -> ApiError {
    match error {
        shards::PoolError::Closed { .. } => {
            ApiError::new(503, "shutting_down", "the gateway is stopping")
        }
        error => ApiError::new(500, "internal", error.to_string()),
    }
}

/// A DLQ operation on a selection (`revive`, `purge`) as a job of `kind`. One row goes
/// at once on the admin pool, unbudgeted: a quick request, never behind a job. A tenant's
/// rows or the whole DLQ may take minutes, so they wait their turn on the jobs pool and the
/// quick requests are never held behind them.
async fn selection_job<T>(
    admin: &Arc<Admin>,
    body: &[u8],
    kind: JobKind,
    work: fn(&Operations, &Selector, &jobs::Job) -> Result<T, ApiError>,
) -> Result<Response, ApiError>
where
    T: Serialize + Send + 'static,
{
    let (background, body, shown) = jobs::split_background(body)?;
    let selector = Selector::parse(&body)?;
    let job = admin.operations.jobs.create(kind, shown);
    let pool = if matches!(selector, Selector::Row { .. }) {
        &admin.pool
    } else {
        &admin.jobs_pool
    };
    on_job(admin, pool, job, background, move |operations, job| {
        work(operations, &selector, job)
    })
    .await
}

/// Runs an operation as `job` on `pool` (the jobs pool, or the admin pool for a one-row
/// revive). In the background the caller gets 202 with the job to poll at once; otherwise
/// the operation's answer when it is done. The work runs in a detached task either way, so
/// a caller that hangs up neither cancels a queued job nor leaves it shown as queued
/// forever. A job still queued when a stop is requested fails `shutting_down` unrun.
async fn on_job<T, F>(
    admin: &Arc<Admin>,
    pool: &shards::BlockingPool,
    job: Arc<jobs::Job>,
    background: bool,
    work: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(&Operations, &jobs::Job) -> Result<T, ApiError> + Send + 'static,
    T: Serialize + Send + 'static,
{
    let operations = admin.operations.clone();
    let running = job.clone();
    let future = pool.run(move || {
        jobs::run(&running, |job| {
            if operations.stop_requested() {
                return Err(operations::stopping());
            }
            work(&operations, job)
        })
    });
    let abandoned = job.clone();
    let handle = glommio::spawn_local(async move {
        match future.await {
            Ok(outcome) => outcome,
            Err(error) => {
                let error = pool_error(error);
                jobs::abandon(&abandoned, error.clone());
                Err(error)
            }
        }
    })
    .detach();
    if background {
        return to_json(&job.view()).map(|body| Response::json(202, body));
    }
    match handle.await {
        Some(Ok(answer)) => to_json(&answer).map(|body| Response::json(200, body)),
        Some(Err(error)) => Err(error),
        None => Err(ApiError::new(
            500,
            "internal",
            "the job's task was cancelled",
        )),
    }
}

fn to_json(answer: &impl Serialize) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(answer).map_err(|error| ApiError::new(500, "internal", error.to_string()))
}

fn method_not_allowed(allow: &'static str) -> Response {
    let message = if allow == "GET" {
        "use GET"
    } else {
        "use POST"
    };
    Response::error(&ApiError::new(405, "method_not_allowed", message)).with_header("allow", allow)
}

/// A 200 answer whose body is not JSON (metrics, console files).
fn write_ok(
    out: &mut Vec<u8>,
    content_type: &str,
    body: &[u8],
    headers: &[(&'static str, &'static str)],
) {
    use std::io::Write;
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}
