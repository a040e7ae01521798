//! The admin listener: `/healthz`, `/readyz`, `/metrics`. Runs as a task on the first
//! ingest core; its requests are rare and small. The JSON admin API under `/v1/` arrives
//! with the delivery and tenancy work; until then `/v1/` answers 404 like any unknown path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::edge::http::{self, Head, Method};

pub struct Admin {
    pub prometheus: PrometheusHandle,
    /// True while the writer's committer runs: a 2xx is possible.
    pub writer_running: Arc<AtomicBool>,
    pub shutdown: shards::Shutdown,
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
            None => return,
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

async fn serve(admin: Arc<Admin>, mut stream: TcpStream) {
    let limits = http::Limits {
        body_max_bytes: 0,
        header_count_max: 64,
        header_bytes_max: ADMIN_HEAD_MAX,
    };
    let mut buf = vec![0u8; ADMIN_HEAD_MAX];
    let mut filled = 0;
    let mut head = Head::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || stream.set_read_timeout(Some(remaining)).is_err() {
            return;
        }
        let n = match stream.read(&mut buf[filled..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        filled += n;
        match http::parse_head(&buf[..filled], &limits, &mut head) {
            Ok(true) => break,
            Ok(false) if filled < buf.len() => continue,
            _ => {
                let mut out = Vec::new();
                let mut body = Vec::new();
                http::error_json(&mut body, "bad_request", "malformed admin request");
                http::write_response(&mut out, 400, &body, false, None, &[]);
                let _ = stream.write_all(&out).await;
                return;
            }
        }
    }
    let path = &buf[head.path.clone()];
    let mut out = Vec::with_capacity(4096);
    let get = matches!(head.method, Method::Get | Method::Head);
    match (get, path) {
        (true, b"/healthz") => {
            http::write_response(&mut out, 200, br#"{"status":"ok"}"#, false, None, &[])
        }
        (true, b"/readyz") => {
            if admin.writer_running.load(Ordering::Acquire) && !admin.shutdown.requested() {
                http::write_response(&mut out, 200, br#"{"status":"ready"}"#, false, None, &[])
            } else {
                let mut body = Vec::new();
                http::error_json(&mut body, "not_ready", "the writer is not running");
                http::write_response(&mut out, 503, &body, false, Some(1), &[])
            }
        }
        (true, b"/metrics") => {
            let text = admin.prometheus.render();
            write_text(&mut out, &text);
        }
        (false, b"/healthz" | b"/readyz" | b"/metrics") => {
            let mut body = Vec::new();
            http::error_json(&mut body, "method_not_allowed", "use GET");
            http::write_response(&mut out, 405, &body, false, None, &[("allow", "GET")])
        }
        _ => {
            let mut body = Vec::new();
            http::error_json(&mut body, "not_found", "no such admin route");
            http::write_response(&mut out, 404, &body, false, None, &[])
        }
    }
    let _ = stream.write_all(&out).await;
    let _ = stream.close().await;
}

fn write_text(out: &mut Vec<u8>, text: &str) {
    use std::io::Write;
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    out.extend_from_slice(text.as_bytes());
}
