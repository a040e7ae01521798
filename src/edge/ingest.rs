//! What the edge decides about one complete request: route, method, tenant, signature,
//! and the envelope it hands the writer. Sans-IO, so every refusal is unit-testable; the
//! connection loop in `edge::conn` owns the sockets.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Config, HeaderAction, Source, Tenancy};
use crate::edge::http::Head;
use crate::store::codec::HookEncoder;
use crate::verify::{self, HeaderLookup, VerifyError};
use crate::writer::{SinkTable, WriterHandle};

/// Everything the ingest cores share, read-only after startup.
#[derive(Debug)]
pub struct EdgeShared {
    pub config: Arc<Config>,
    pub writer: WriterHandle,
    /// Benchmark reference mode (`serve --reference`): answer 202 after routing and
    /// verification without touching the writer, to measure the edge alone.
    pub reference: bool,
    sources: HashMap<String, usize>,
    tenants: HashMap<String, u32>,
}

impl EdgeShared {
    pub fn new(
        config: Arc<Config>,
        writer: WriterHandle,
        ordinals: &[(String, u32)],
        reference: bool,
    ) -> EdgeShared {
        let sources = config
            .sources
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.clone(), i))
            .collect();
        let tenants = ordinals.iter().cloned().collect();
        EdgeShared {
            config,
            writer,
            reference,
            sources,
            tenants,
        }
    }

    /// The sink ids per source index, for the writer.
    pub fn sink_table(config: &Config) -> SinkTable {
        SinkTable {
            sink_ids: config
                .sources
                .iter()
                .map(|s| s.sinks.iter().map(|k| k.id.clone()).collect())
                .collect(),
        }
    }
}

/// A refusal: status, stable code, message for the JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }
}

/// Where a hook goes, resolved from the path before the body is read.
#[derive(Debug, Clone, Copy)]
pub struct Target<'s> {
    pub source_index: usize,
    pub source: &'s Source,
    pub tenant_id: &'s str,
    pub tenant_ordinal: u32,
}

/// Resolves `/hooks/{source}` or `/hooks/{source}/{tenant}`.
pub fn route<'s>(shared: &'s EdgeShared, path: &[u8]) -> Result<Target<'s>, Refusal> {
    let not_found = || {
        Refusal::new(
            404,
            "not_found",
            "no such route; hooks go to POST /hooks/{source}",
        )
    };
    let rest = path.strip_prefix(b"/hooks/").ok_or_else(not_found)?;
    let rest = rest.strip_suffix(b"/").unwrap_or(rest);
    let mut parts = rest.splitn(3, |b| *b == b'/');
    let source_part = parts
        .next()
        .filter(|p| !p.is_empty())
        .ok_or_else(not_found)?;
    let tenant_part = parts.next();
    if parts.next().is_some() {
        return Err(not_found());
    }
    let source_id = std::str::from_utf8(source_part).map_err(|_| not_found())?;
    let &source_index = shared.sources.get(source_id).ok_or_else(|| {
        Refusal::new(
            404,
            "unknown_source",
            format!("no source named {source_id:?}"),
        )
    })?;
    let source = &shared.config.sources[source_index];
    let tenant_id: &str = match (&source.tenancy, tenant_part) {
        (Tenancy::Fixed(tenant), None) => tenant,
        (Tenancy::Fixed(_), Some(_)) => {
            return Err(Refusal::new(
                404,
                "not_found",
                format!("source {source_id:?} names its tenant; post to /hooks/{source_id}"),
            ))
        }
        (Tenancy::Path, None) => {
            return Err(Refusal::new(
                404,
                "tenant_required",
                format!("source {source_id:?} takes its tenant from the path: /hooks/{source_id}/{{tenant}}"),
            ))
        }
        (Tenancy::Path, Some(tenant)) => std::str::from_utf8(tenant).map_err(|_| not_found())?,
    };
    let (tenant_id, &tenant_ordinal) =
        shared.tenants.get_key_value(tenant_id).ok_or_else(|| {
            Refusal::new(
                404,
                "unknown_tenant",
                format!("no tenant named {tenant_id:?}"),
            )
        })?;
    Ok(Target {
        source_index,
        source,
        tenant_id,
        tenant_ordinal,
    })
}

/// Header access over the connection's read buffer.
pub struct RequestHeaders<'a> {
    pub buf: &'a [u8],
    pub head: &'a Head,
}

impl HeaderLookup for RequestHeaders<'_> {
    fn header(&self, lower_name: &str) -> Option<&[u8]> {
        self.head.header(self.buf, lower_name)
    }
}

pub fn check_signature(
    source: &Source,
    headers: &RequestHeaders<'_>,
    body: &[u8],
    now_s: u64,
) -> Result<(), Refusal> {
    verify::verify(&source.verify, headers, body, now_s).map_err(|error| {
        let code = match error {
            VerifyError::MissingHeader(_) => "signature_missing",
            VerifyError::StaleTimestamp { .. } => "timestamp_stale",
            _ => "signature_invalid",
        };
        Refusal::new(401, code, error.to_string())
    })
}

/// Encodes the hook record into `out` (cleared first), applying the source's
/// store_headers policy: dropped headers never reach the disk, hashed ones keep only
/// `sha256:<hex>` of their value.
pub fn encode_hook(
    out: &mut Vec<u8>,
    target: &Target<'_>,
    headers: &RequestHeaders<'_>,
    body: &[u8],
    received_at_ms: u64,
) {
    use sha2::{Digest, Sha256};
    out.clear();
    let mut encoder = HookEncoder::start(
        out,
        &target.source.id,
        target.tenant_id,
        received_at_ms,
        &[],
    );
    let rules = &target.source.store_headers.rules;
    for (name, value) in &headers.head.headers {
        let name = &headers.buf[name.clone()];
        let value = &headers.buf[value.clone()];
        let action = rules
            .iter()
            .find(|(rule, _)| rule.as_bytes().eq_ignore_ascii_case(name))
            .map(|(_, action)| *action)
            .unwrap_or(HeaderAction::Keep);
        match action {
            HeaderAction::Keep => encoder.header(name, value),
            HeaderAction::Drop => {}
            HeaderAction::Hash => {
                let mut hashed = [0u8; 7 + 64];
                hashed[..7].copy_from_slice(b"sha256:");
                let digest = Sha256::digest(value);
                // 32 bytes always encode to exactly 64 hex digits.
                let _ = hex::encode_to_slice(digest, &mut hashed[7..]);
                encoder.header(name, &hashed);
            }
        }
    }
    encoder.finish(body);
}
