//! Test harness: starts the real `ankusa` binary on loopback port 0 with a config written
//! to a temp dir, and talks to it over plain sockets.
#![allow(dead_code, clippy::unwrap_used)]

pub mod proxy;
pub mod receiver;
pub mod services;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ankusa");

pub struct Server {
    pub child: Child,
    /// Everything the server wrote to stderr so far, read on a thread so that a chatty
    /// server never blocks on a full pipe.
    stderr_text: std::sync::Arc<std::sync::Mutex<String>>,
    pub ingest: SocketAddr,
    pub admin: SocketAddr,
    pub data_dir: PathBuf,
    pub dir: PathBuf,
}

/// A config with one tenant `acme` and one source `demo` (verify none, one http sink);
/// `sources` replaces the sources section when given.
pub fn config_yaml(data_dir: &Path, extra: &str, sources: Option<&str>) -> String {
    let default_sources = "
sources:
  - id: demo
    tenant: acme
    sinks:
      - {kind: http, url: 'http://127.0.0.1:9/hooks'}
  - id: fanout
    tenant: acme
    sinks:
      - {kind: http, url: 'http://127.0.0.1:9/a'}
      - {kind: http, url: 'http://127.0.0.1:9/b'}
  - id: shared
    tenant_from: path
    sinks:
      - {kind: http, url: 'http://127.0.0.1:9/shared'}
";
    format!(
        "instance:
  data_dir: {}
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
tenants:
  - {{id: acme}}
  - {{id: globex}}
{}
{}",
        data_dir.display(),
        sources.unwrap_or(default_sources),
        extra
    )
}

/// A `sources:` section for [`config_yaml`]: each (source, tenant, url) with one http sink.
pub fn http_sources(sources: &[(&str, &str, &str)]) -> String {
    let mut yaml = String::from("\nsources:\n");
    for (id, tenant, url) in sources {
        yaml.push_str(&format!(
            "  - id: {id}\n    tenant: {tenant}\n    sinks:\n      - {{kind: http, url: '{url}'}}\n"
        ));
    }
    yaml
}

/// `yaml` (from [`config_yaml`]) with `instance.admin_token` set to `token`.
pub fn with_admin_token(yaml: &str, token: &str) -> String {
    yaml.replace(
        "admin_listen: 127.0.0.1:0",
        &format!("admin_listen: 127.0.0.1:0\n  admin_token: {token}"),
    )
}

/// A server on `config_yaml(data, extra, sources)` in a temp dir of its own; returns the
/// dir (removed on drop), `data` (the store, `<dir>/data`) and the server. Bind them in
/// that order, so the server stops before its dir goes.
pub fn start_in_temp_dir(
    extra: &str,
    sources: Option<&str>,
) -> (tempfile::TempDir, PathBuf, Server) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(dir.path(), &config_yaml(&data, extra, sources));
    (dir, data, server)
}

/// A test that panics before it stops its server must not leave the process running.
impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    pub fn start(dir: &Path, yaml: &str) -> Server {
        Server::start_env(dir, yaml, &[])
    }

    pub fn start_env(dir: &Path, yaml: &str, env: &[(&str, &str)]) -> Server {
        let config_path = dir.join("ankusa.yaml");
        std::fs::write(&config_path, yaml).unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--config"])
            .arg(&config_path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("ANKUSA_LOG", "warn");
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = match lines.next() {
            Some(Ok(line)) => line,
            _ => {
                let mut stderr = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr)
                    .unwrap();
                panic!("server did not become ready: {stderr}");
            }
        };
        // Keep draining stdout and stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let stderr_text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let collected = stderr_text.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut text = collected.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        });
        let ingest = field(&line, "ingest=");
        let admin = field(&line, "admin=");
        let data_dir = yaml_data_dir(yaml);
        Server {
            child,
            stderr_text,
            ingest,
            admin,
            data_dir,
            dir: dir.to_path_buf(),
        }
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.ingest).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
    }

    /// POSTs `body` to `path` on a fresh connection and returns the response.
    pub fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let mut stream = self.connect();
        send_post(&mut stream, path, headers, body, false);
        read_response(&mut stream).unwrap()
    }

    pub fn admin_get(&self, path: &str) -> Response {
        let mut stream = TcpStream::connect(self.admin).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
        read_response(&mut stream).unwrap()
    }

    /// Sends one request to the admin listener and returns its answer: `headers` as given,
    /// `body` with its content-length when given.
    pub fn admin_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Response {
        try_request(self.admin, method, path, headers, body)
            .unwrap_or_else(|| panic!("{method} {path}: no answer from {}", self.admin))
    }

    /// POSTs a JSON body to the admin API (no token).
    pub fn admin_post(&self, path: &str, body: &str) -> Response {
        self.admin_request("POST", path, &[], Some(body))
    }

    /// GETs `path` from the admin listener (no token), expects 200, returns the JSON.
    pub fn admin_json(&self, path: &str) -> serde_json::Value {
        let response = self.admin_get(path);
        assert_eq!(response.status, 200, "{response:?}");
        response.json()
    }

    /// SIGTERM and wait: the orderly stop must exit 0.
    pub fn stop(mut self) -> std::process::ExitStatus {
        unsafe_kill(self.child.id(), 15);
        self.child.wait().unwrap()
    }

    /// The orderly stop, then `ankusa store verify` of the server's store: both must pass.
    #[track_caller]
    pub fn stop_and_verify(self) {
        let data_dir = self.data_dir.clone();
        assert!(self.stop().success());
        let (ok, report) = store_verify(&data_dir);
        assert!(ok, "{report}");
    }

    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr_text.lock().unwrap().clone()
    }
}

/// Sends one request to `addr` and returns its answer: `headers` as given, `body` (JSON)
/// with its content-length when given. `None` when nothing answers there: a server still
/// starting, or one that stopped.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Option<Response> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: test\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        request.push_str("\r\n");
    }
    stream.write_all(request.as_bytes()).ok()?;
    read_response(&mut stream)
}

/// A loopback address whose port was free a moment ago, for a process that must be
/// reached at a port known before it starts (it cannot report one it chose itself).
pub fn free_loopback_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn unsafe_kill(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

fn field(line: &str, name: &str) -> SocketAddr {
    let start = line
        .find(name)
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        + name.len();
    line[start..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn yaml_data_dir(yaml: &str) -> PathBuf {
    let line = yaml
        .lines()
        .find(|l| l.trim_start().starts_with("data_dir:"))
        .unwrap();
    PathBuf::from(line.split_once(':').unwrap().1.trim())
}

pub fn send_post(
    stream: &mut TcpStream,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    close: bool,
) {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n",
        body.len()
    );
    // JSON unless the caller names its own content type.
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
    {
        request.push_str("content-type: application/json\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if close {
        request.push_str("connection: close\r\n");
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).unwrap();
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Reads one response (content-length framed). `None` when the server closed first.
pub fn read_response(stream: &mut TcpStream) -> Option<Response> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => return None,
            Ok(_) => head.push(byte[0]),
        }
    }
    let text = String::from_utf8(head).unwrap();
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    Some(Response {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    })
}

/// Runs `ankusa store verify` and returns (success, output).
pub fn store_verify(data_dir: &Path) -> (bool, String) {
    let output = Command::new(BIN)
        .args(["store", "verify", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Milliseconds since the Unix epoch: the clock hooks are stamped with.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Connections [`post_many`] posts over at once.
pub const POSTERS: usize = 8;

/// Posts `count` hooks (`{"n": <index>}`) to source `demo` over [`POSTERS`] connections at
/// once; each must be taken with 202.
pub fn post_many(server: &Server, count: usize) {
    std::thread::scope(|scope| {
        for poster in 0..POSTERS {
            scope.spawn(move || {
                let mut stream = server.connect();
                for index in (poster..count).step_by(POSTERS) {
                    let body = format!(r#"{{"n":{index}}}"#);
                    send_post(&mut stream, "/hooks/demo", &[], body.as_bytes(), false);
                    let response = read_response(&mut stream).unwrap();
                    assert_eq!(response.status, 202, "{response:?}");
                }
            });
        }
    });
}

/// Polls `done` every 50 ms until it holds; fails after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Tenant `id`'s entry of a `/v1/stats` answer.
pub fn find_tenant<'a>(stats: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tenant| tenant["id"] == id)
        .unwrap_or_else(|| panic!("no tenant {id} in {stats}"))
}

/// Tenant `id`'s entry of `/v1/stats`, now.
pub fn tenant_stats(server: &Server, id: &str) -> serde_json::Value {
    find_tenant(&server.admin_json("/v1/stats"), id).clone()
}

/// Polls `/v1/stats` (sent with `headers`) every 50 ms until tenant `id`'s entry satisfies
/// `done`; returns that entry. Fails after `timeout`.
pub fn wait_tenant(
    server: &Server,
    headers: &[(&str, &str)],
    id: &str,
    timeout: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    loop {
        let response = server.admin_request("GET", "/v1/stats", headers, None);
        assert_eq!(response.status, 200, "{response:?}");
        let stats = response.json();
        let tenant = find_tenant(&stats, id);
        if done(tenant) {
            return tenant.clone();
        }
        assert!(Instant::now() < deadline, "{id} never got there: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/v1/jobs/{id}`.
pub fn job_view(server: &Server, id: u64) -> serde_json::Value {
    server.admin_json(&format!("/v1/jobs/{id}"))
}

/// Reads job `id` every `every` until it has finished (done or failed); returns it. Fails
/// after `timeout`.
pub fn finish_job(
    server: &Server,
    id: u64,
    timeout: Duration,
    every: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    loop {
        let job = job_view(server, id);
        if job["state"] == "done" || job["state"] == "failed" {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} never finished: {job}");
        std::thread::sleep(every);
    }
}

/// Starts a background replay of source `demo`'s archive (tenant acme) from `from_ms` to
/// `to_ms`; expects 202 and returns the job.
pub fn start_replay_job(server: &Server, from_ms: u64, to_ms: u64) -> serde_json::Value {
    let request = format!(
        r#"{{"tenant":"acme","source":"demo","from_ms":{from_ms},"to_ms":{to_ms},"background":true}}"#
    );
    let started = server.admin_post("/v1/archive/replay", &request);
    assert_eq!(started.status, 202, "{started:?}");
    started.json()
}

/// [`start_replay_job`], returning the job's id.
pub fn start_replay(server: &Server, from_ms: u64, to_ms: u64) -> u64 {
    start_replay_job(server, from_ms, to_ms)["id"]
        .as_u64()
        .unwrap()
}

pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A format-2 store (hook records without integrity digests, as a format-2 binary wrote
/// them) holding `archived` archived hooks of tenant ordinal 1, source `demo`: what the
/// migration to format 3 has to seal.
pub fn unsealed_store(data_dir: &Path, archived: u64) {
    use ankusa::store::codec::{HookRecord, HOOK_DIGEST_LEN, HOOK_VERSION_UNDIGESTED};
    use ankusa::store::{keys, migrate, Store, WriteBatch, CF_ARCHIVE};
    let store = Store::open(data_dir).unwrap();
    let mut batch = WriteBatch::default();
    let mut key = Vec::new();
    let mut value = Vec::new();
    for seq in 1..=archived {
        let record = HookRecord {
            source_id: "demo".into(),
            tenant_id: "acme".into(),
            received_at_ms: 1_000 + seq,
            dedupe_key: Vec::new(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: format!("{{\"seq\":{seq},\"pad\":\"{}\"}}", "x".repeat(200)).into_bytes(),
        };
        value.clear();
        record.encode(&mut value);
        value.truncate(value.len() - HOOK_DIGEST_LEN);
        value[0] = HOOK_VERSION_UNDIGESTED;
        key.clear();
        keys::archive(&mut key, 1, 1_000 + seq, seq);
        store.put_cf(&mut batch, CF_ARCHIVE, &key, &value);
    }
    store.write(batch, true).unwrap();
    migrate::stamp(&store, 2).unwrap();
    store.close().unwrap();
}
