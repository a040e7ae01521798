//! One ingest connection: read a request head within its deadline, the body within its
//! own, decide, hand the envelope to the writer, wait for the sync, answer. Keep-alive
//! and pipelined requests reuse every buffer of the connection; the only allocation per
//! request is the envelope's record, which the writer takes.

use std::io::ErrorKind;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

use crate::ack::{Ack, AckOutcome};
use crate::clock;
use crate::edge::http::{self, BodyFraming, ChunkedDecoder, Head, HttpError, Method, Refusal};
use crate::edge::ingest::{self, EdgeShared, RequestHeaders};
use crate::edge::resolve::{self, JsonScratch};
use crate::edge::CoreState;
use crate::live::Live;
use crate::store::gauges::{Bounds, Over};
use crate::store::keys::{self, NODE_ORDINAL};
use crate::writer::{Envelope, EnvelopeKind, SubmitError};

const READ_CHUNK: usize = 16 * 1024;

enum ReadError {
    /// The peer closed its side (or the core half-closed it at shutdown).
    Closed,
    TimedOut,
    Io,
}

/// The connection's read buffer: `bytes[..filled]` holds data not yet consumed.
struct ReadBuffer {
    bytes: Vec<u8>,
    filled: usize,
}

impl ReadBuffer {
    fn data(&self) -> &[u8] {
        &self.bytes[..self.filled]
    }

    /// Reads at least one byte, waiting at most until `deadline`.
    async fn fill(
        &mut self,
        stream: &mut TcpStream,
        deadline: Instant,
    ) -> Result<usize, ReadError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ReadError::TimedOut);
        }
        if self.bytes.len() - self.filled < READ_CHUNK / 4 {
            self.bytes.resize(self.bytes.len() + READ_CHUNK, 0);
        }
        if stream.set_read_timeout(Some(remaining)).is_err() {
            return Err(ReadError::Io);
        }
        match stream.read(&mut self.bytes[self.filled..]).await {
            Ok(0) => Err(ReadError::Closed),
            Ok(n) => {
                self.filled += n;
                Ok(n)
            }
            Err(error) if error.kind() == ErrorKind::TimedOut => Err(ReadError::TimedOut),
            Err(_) => Err(ReadError::Io),
        }
    }

    /// Drops the first `count` bytes (a consumed request), keeping pipelined ones.
    fn consume(&mut self, count: usize) {
        self.bytes.copy_within(count..self.filled, 0);
        self.filled -= count;
        // A large body grew the buffer; give the memory back once it is consumed.
        if self.filled == 0 && self.bytes.len() > 4 * READ_CHUNK {
            self.bytes.truncate(READ_CHUNK);
            self.bytes.shrink_to(READ_CHUNK);
        }
    }

    /// Removes `range` (chunk framing already decoded) so the buffer does not grow with it.
    fn remove(&mut self, start: usize, end: usize) {
        self.bytes.copy_within(end..self.filled, start);
        self.filled -= end - start;
    }
}

/// Answers a connection over `edge.connections_max` and closes it.
pub async fn refuse_over_capacity(mut stream: TcpStream, core: Rc<CoreState>) {
    let mut out = Vec::with_capacity(256);
    respond_refusal(
        &mut out,
        &Refusal {
            status: 503,
            code: "too_many_connections",
            message: "connection limit reached".into(),
        },
        false,
        Some(1),
    );
    core.count_status(503);
    let _ = stream.write_all(&out).await;
    let _ = stream.close().await;
}

fn respond_refusal(
    out: &mut Vec<u8>,
    refusal: &Refusal,
    keep_alive: bool,
    retry_after_s: Option<u32>,
) {
    let mut body = Vec::with_capacity(96);
    http::error_json(&mut body, refusal.code, &refusal.message);
    http::write_response(out, refusal.status, &body, keep_alive, retry_after_s, &[]);
}

fn http_refusal(error: &HttpError) -> Refusal {
    Refusal {
        status: error.status(),
        code: error.code(),
        message: error.to_string(),
    }
}

/// What the request loop does after one request.
enum Next {
    KeepAlive,
    Close,
}

pub async fn serve(
    mut stream: TcpStream,
    shared: &EdgeShared,
    core: &CoreState,
    ack_latency: &metrics::Histogram,
) {
    let _ = stream.set_nodelay(true);
    let edge = &shared.limits;
    let limits = http::Limits {
        body_max_bytes: edge.body_max_bytes,
        header_count_max: edge.header_count_max,
        header_bytes_max: edge.header_bytes_max,
    };
    let mut buffer = ReadBuffer {
        bytes: vec![0; READ_CHUNK],
        filled: 0,
    };
    let mut head = Head::new();
    let mut chunked = ChunkedDecoder::new();
    let mut decoded: Vec<u8> = Vec::new();
    let mut json = JsonScratch::default();
    let mut out: Vec<u8> = Vec::with_capacity(512);
    let ack = Arc::new(Ack::new());

    loop {
        out.clear();
        // Head: the idle timeout runs until the first byte, the header timeout after it.
        let mut head_deadline = None;
        loop {
            if buffer.filled > 0 {
                match http::parse_head(buffer.data(), &limits, &mut head) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(error) => {
                        respond_refusal(&mut out, &http_refusal(&error), false, None);
                        finish(&mut stream, &out, core, error.status()).await;
                        return;
                    }
                }
            }
            let deadline = match head_deadline {
                Some(deadline) => deadline,
                None if buffer.filled > 0 => {
                    let deadline = Instant::now() + edge.header_read_timeout;
                    head_deadline = Some(deadline);
                    deadline
                }
                None => Instant::now() + edge.idle_timeout,
            };
            match buffer.fill(&mut stream, deadline).await {
                Ok(_) => {
                    if head_deadline.is_none() {
                        head_deadline = Some(Instant::now() + edge.header_read_timeout);
                    }
                }
                Err(ReadError::TimedOut) if buffer.filled > 0 => {
                    let refusal = Refusal {
                        status: 408,
                        code: "header_timeout",
                        message: format!(
                            "request head not received within {} ms",
                            edge.header_read_timeout.as_millis()
                        ),
                    };
                    respond_refusal(&mut out, &refusal, false, None);
                    finish(&mut stream, &out, core, 408).await;
                    return;
                }
                Err(_) => {
                    let _ = stream.close().await;
                    return;
                }
            }
        }

        let started = Instant::now();
        let next = handle_request(
            &mut stream,
            shared,
            core,
            &limits,
            &mut buffer,
            &head,
            &mut chunked,
            &mut decoded,
            &mut json,
            &mut out,
            &ack,
        )
        .await;
        if out.starts_with(b"HTTP/1.1 202") {
            ack_latency.record(started.elapsed().as_secs_f64());
        }
        let keep = matches!(next, Next::KeepAlive) && !core.stopped();
        if stream.write_all(&out).await.is_err() {
            return;
        }
        if !keep {
            let _ = stream.close().await;
            return;
        }
    }
}

async fn finish(stream: &mut TcpStream, out: &[u8], core: &CoreState, status: u16) {
    core.count_status(status);
    let _ = stream.write_all(out).await;
    let _ = stream.close().await;
}

#[allow(clippy::too_many_arguments)]
async fn handle_request(
    stream: &mut TcpStream,
    shared: &EdgeShared,
    core: &CoreState,
    limits: &http::Limits,
    buffer: &mut ReadBuffer,
    head: &Head,
    chunked: &mut ChunkedDecoder,
    decoded: &mut Vec<u8>,
    json: &mut JsonScratch,
    out: &mut Vec<u8>,
    ack: &Arc<Ack>,
) -> Next {
    let edge = &shared.limits;
    let refuse = |out: &mut Vec<u8>, refusal: Refusal, keep: bool, retry: Option<u32>| {
        core.count_status(refusal.status);
        respond_refusal(out, &refusal, keep, retry);
        if keep {
            Next::KeepAlive
        } else {
            Next::Close
        }
    };

    let path = &buffer.data()[head.path.clone()];
    // Refusals before the body is read close the connection: the unread body would
    // otherwise be parsed as the next request.
    // This request's config: a reload meanwhile changes the next request, not this one.
    let live = core.live.get();
    let target = match ingest::route(&live, &core.tenants, path) {
        Ok(target) => target,
        Err(refusal) => return refuse(out, refusal, false, None),
    };
    if head.method != Method::Post {
        core.count_status(405);
        let mut body = Vec::new();
        http::error_json(
            &mut body,
            "method_not_allowed",
            "hooks are accepted with POST only",
        );
        http::write_response(out, 405, &body, false, None, &[("allow", "POST")]);
        return Next::Close;
    }

    // Body.
    let body_deadline = Instant::now() + edge.body_read_timeout;
    let body_timeout = |out: &mut Vec<u8>| {
        refuse(
            out,
            Refusal {
                status: 408,
                code: "body_timeout",
                message: format!(
                    "request body not received within {} ms",
                    edge.body_read_timeout.as_millis()
                ),
            },
            false,
            None,
        )
    };
    let (body_range, consumed) = match head.framing {
        BodyFraming::None => ((head.head_len, head.head_len), head.head_len),
        BodyFraming::Length(length) => {
            let total = head.head_len + length;
            if head.expect_continue
                && buffer.filled < total
                && stream.write_all(http::CONTINUE_100).await.is_err()
            {
                return Next::Close;
            }
            while buffer.filled < total {
                if buffer.bytes.len() < total {
                    buffer.bytes.resize(total, 0);
                }
                match buffer.fill(stream, body_deadline).await {
                    Ok(_) => {}
                    Err(ReadError::TimedOut) => return body_timeout(out),
                    Err(_) => return Next::Close,
                }
            }
            ((head.head_len, total), total)
        }
        BodyFraming::Chunked => {
            if head.expect_continue
                && buffer.filled == head.head_len
                && stream.write_all(http::CONTINUE_100).await.is_err()
            {
                return Next::Close;
            }
            decoded.clear();
            chunked.reset();
            loop {
                let start = head.head_len;
                match chunked.decode(&buffer.data()[start..], decoded, limits.body_max_bytes) {
                    Ok((used, done)) => {
                        buffer.remove(start, start + used);
                        if done {
                            break;
                        }
                    }
                    Err(error) => return refuse(out, http_refusal(&error), false, None),
                }
                match buffer.fill(stream, body_deadline).await {
                    Ok(_) => {}
                    Err(ReadError::TimedOut) => return body_timeout(out),
                    Err(_) => return Next::Close,
                }
            }
            ((0, 0), head.head_len)
        }
    };
    let data = buffer.data();
    let body: &[u8] = match head.framing {
        BodyFraming::Chunked => decoded,
        _ => &data[body_range.0..body_range.1],
    };
    let keep_alive = head.keep_alive;
    let headers = RequestHeaders { buf: data, head };

    let admission = &live.config.admission;
    let next = 'answer: {
        let verdict = ingest::check_signature(target.source, &headers, body, clock::now_s())
            .and_then(|()| resolve::resolve(target.source, &headers, body, json));
        let resolved = match verdict {
            Ok(resolved) => resolved,
            Err(refusal) => {
                if target.source.quarantine {
                    keep_in_quarantine(shared, &live, &target, &headers, body, &refusal, ack).await;
                }
                break 'answer refuse(out, refusal, keep_alive, None);
            }
        };
        if resolved.dedupe_missing {
            metrics::counter!("ankusa_ingest_dedupe_key_missing_total").increment(1);
        }
        for &sink in &resolved.lane_keys_missing {
            let kind = target.source.sinks[sink].kind.name();
            metrics::counter!("ankusa_dispatch_lane_key_missing_total", "sink" => kind)
                .increment(1);
        }
        if shared.space.low() {
            let refusal = Refusal::new(
                503,
                "disk_full",
                "the gateway's disk is nearly full; nothing was accepted, retry later",
            );
            metrics::counter!("ankusa_ingest_refused_total", "reason" => "disk_full").increment(1);
            break 'answer refuse(out, refusal, keep_alive, Some(admission.retry_after_s));
        }
        let tenant = match ingest::admit_tenant(shared, target.tenant) {
            Ok(tenant) => tenant,
            Err(refusal) => {
                let retry = (refusal.status == 503).then_some(admission.retry_after_s);
                break 'answer refuse(out, refusal, keep_alive, retry);
            }
        };
        let dedupe_key = resolved.dedupe.as_deref().unwrap_or_default();
        let mut hook_value = Vec::new();
        ingest::encode_hook(
            &mut hook_value,
            target.source,
            &tenant.id,
            &headers,
            body,
            clock::now_ms(),
            dedupe_key,
            &shared.header_hash_key,
        );
        let size = hook_value.len() as u32;
        let rows = target.source.sinks.len() as u32;
        let tenant_bounds = Bounds {
            max_pending: tenant.bounds.max_pending,
            max_bytes: tenant.bounds.max_bytes,
        };
        // Held until the ack resolves: by then a stored hook is in the committed gauges.
        let _reservation = match shared.gauges.reserve(
            tenant.ordinal,
            rows,
            size,
            tenant_bounds,
            Bounds {
                max_pending: admission.max_pending,
                max_bytes: admission.max_bytes,
            },
        ) {
            Ok(reservation) => reservation,
            Err(Over::Tenant) => {
                let refusal = Refusal::new(
                    429,
                    "tenant_over_bound",
                    format!(
                        "tenant {:?} is at its bound ({} pending deliveries, max_pending {}, \
                         max_bytes {}); retry later",
                        &*tenant.id,
                        shared.gauges.pending(tenant.ordinal),
                        tenant.bounds.max_pending,
                        tenant.bounds.max_bytes
                    ),
                );
                metrics::counter!("ankusa_ingest_refused_total", "reason" => "tenant_bound")
                    .increment(1);
                let retry_after_s = shared
                    .gauges
                    .retry_after_s(tenant.ordinal, tenant_bounds, admission.retry_after_max_s)
                    .unwrap_or(admission.tenant_retry_after_s);
                break 'answer refuse(out, refusal, keep_alive, Some(retry_after_s));
            }
            Err(Over::Node) => {
                let refusal = Refusal::new(
                    503,
                    "node_over_bound",
                    "this node is at its admission bound (admission.max_pending or max_bytes); \
                     retry later",
                );
                metrics::counter!("ankusa_ingest_refused_total", "reason" => "node_bound")
                    .increment(1);
                let node_bounds = Bounds {
                    max_pending: admission.max_pending,
                    max_bytes: admission.max_bytes,
                };
                let retry_after_s = shared
                    .gauges
                    .retry_after_s(NODE_ORDINAL, node_bounds, admission.retry_after_max_s)
                    .unwrap_or(admission.retry_after_s);
                break 'answer refuse(out, refusal, keep_alive, Some(retry_after_s));
            }
        };
        ack.reset();
        if shared.reference {
            // The same work as a real hook up to the hand-off, then an immediate answer.
            drop(hook_value);
            ack.complete(1);
        } else {
            let mut envelope = Envelope::new(
                tenant.ordinal,
                live.sink_ids[target.source_index].clone(),
                hook_value,
                EnvelopeKind::Hook,
                ack.clone(),
            );
            envelope.lanes = resolved.lanes;
            if let Some(key) = &resolved.dedupe {
                keys::dedupe(
                    &mut envelope.dedupe_key,
                    tenant.ordinal,
                    &target.source.id,
                    key,
                );
                envelope.dedupe_expires_ms =
                    clock::now_ms().saturating_add(target.source.dedupe_window_ms);
            }
            if let Err(error) = core.submit(&shared.writer, envelope) {
                let (code, message) = match error {
                    SubmitError::Saturated => (
                        "writer_saturated",
                        "the writer queue is full; retry shortly",
                    ),
                    SubmitError::Stopped => ("shutting_down", "the gateway is stopping"),
                };
                let refusal = Refusal {
                    status: 503,
                    code,
                    message: message.into(),
                };
                break 'answer refuse(out, refusal, keep_alive, Some(admission.retry_after_s));
            }
        }
        let (status, seq, duplicate) = match ack.wait().await {
            AckOutcome::Committed(seq) => (202, seq, false),
            AckOutcome::Duplicate(seq) => (200, seq, true),
            AckOutcome::Failed => {
                break 'answer refuse(
                    out,
                    Refusal {
                        status: 503,
                        code: "store_unavailable",
                        message: "the hook could not be stored; nothing was accepted".into(),
                    },
                    keep_alive,
                    Some(admission.retry_after_s),
                )
            }
        };
        core.count_status(status);
        let mut body = Vec::with_capacity(128);
        use std::io::Write;
        let _ = write!(
            body,
            r#"{{"id":"{}:{}","seq":{},"tenant":"{}","source":"{}"{}}}"#,
            &*tenant.id,
            seq,
            seq,
            &*tenant.id,
            target.source.id,
            if duplicate {
                r#","duplicate":true"#
            } else {
                ""
            }
        );
        http::write_response(out, status, &body, keep_alive, None, &[]);
        if keep_alive {
            Next::KeepAlive
        } else {
            Next::Close
        }
    };
    buffer.consume(consumed);
    next
}

/// Keeps a hook its source refused (verification, decoding) in quarantine, when the source
/// asks for it and the tenant has room, and waits until it is stored. The provider's answer
/// is the refusal either way. A tenant that does not exist yet is never created for it.
async fn keep_in_quarantine(
    shared: &EdgeShared,
    live: &Live,
    target: &ingest::Target<'_>,
    headers: &RequestHeaders<'_>,
    body: &[u8],
    refusal: &Refusal,
    ack: &Arc<Ack>,
) {
    let ingest::TenantRef::Known(tenant) = &target.tenant else {
        return;
    };
    if shared.reference {
        return;
    }
    if shared.gauges.quarantined(tenant.ordinal) >= tenant.bounds.max_quarantined as i64 {
        metrics::counter!("ankusa_quarantine_refused_total", "reason" => "full").increment(1);
        return;
    }
    let mut hook_value = Vec::new();
    ingest::encode_hook(
        &mut hook_value,
        target.source,
        &tenant.id,
        headers,
        body,
        clock::now_ms(),
        &[],
        &shared.header_hash_key,
    );
    ack.reset();
    let envelope = Envelope::new(
        tenant.ordinal,
        live.sink_ids[target.source_index].clone(),
        hook_value,
        EnvelopeKind::Quarantine(format!("{}: {}", refusal.code, refusal.message)),
        ack.clone(),
    );
    if shared.writer.submit(envelope).is_err() {
        metrics::counter!("ankusa_quarantine_refused_total", "reason" => "writer").increment(1);
        return;
    }
    if ack.wait().await == AckOutcome::Failed {
        metrics::counter!("ankusa_quarantine_refused_total", "reason" => "store").increment(1);
    }
}
