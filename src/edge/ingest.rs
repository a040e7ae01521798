//! What the edge decides about one complete request: route, method, tenant, signature,
//! and the envelope it hands the writer. Sans-IO, so every refusal is unit-testable; the
//! connection loop in `edge::conn` owns the sockets.

use std::sync::Arc;

use crate::config::{self, HeaderAction, Source, Tenancy};
use crate::edge::http::{Head, Refusal};
use crate::live::Live;
use crate::published::Published;
use crate::store::codec::HookEncoder;
use crate::store::gauges::Gauges;
use crate::store::space::FreeSpace;
use crate::tenants::{self, Tenant, Tenants};
use crate::verify::{self, HeaderLookup, VerifyError};
use crate::writer::WriterHandle;

/// Everything the ingest cores share. The running config and the tenant directory change
/// only by replacement (a reload, a new tenant), read through each core's local copy.
#[derive(Debug)]
pub struct EdgeShared {
    /// The running config (sources, sinks, admission), replaced by a reload.
    pub live: Arc<Published<Live>>,
    /// The edge's limits: fixed for the life of the process.
    pub limits: config::Edge,
    pub writer: WriterHandle,
    /// Benchmark reference mode (`serve --reference`): answer 202 after routing and
    /// verification without touching the writer, to measure the edge alone.
    pub reference: bool,
    pub tenants: Arc<Tenants>,
    /// The store's mirror of pending and bytes, for admission.
    pub gauges: Arc<Gauges>,
    /// The data directory's free space: under the reserve, new hooks get 503 `disk_full`.
    pub space: Arc<FreeSpace>,
    /// The instance's key for hashed headers (store_headers `hash`).
    pub header_hash_key: [u8; 32],
}

/// Where a hook goes, resolved from the path before the body is read.
#[derive(Debug, Clone)]
pub struct Target<'l> {
    pub source_index: usize,
    pub source: &'l Source,
    pub tenant: TenantRef,
}

/// The tenant of a request: known, or one an `auto_tenants` source creates once the hook
/// has passed verification (an unverified request never creates a tenant).
#[derive(Debug, Clone)]
pub enum TenantRef {
    Known(Tenant),
    /// A well-formed id the directory does not hold yet.
    Auto(Box<str>),
}

/// Resolves `/hooks/{source}` or `/hooks/{source}/{tenant}`.
pub fn route<'l>(
    live: &'l Live,
    tenants: &tenants::View,
    path: &[u8],
) -> Result<Target<'l>, Refusal> {
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
    let source_index = live.source_index(source_id).ok_or_else(|| {
        Refusal::new(
            404,
            "unknown_source",
            format!("no source named {source_id:?}"),
        )
    })?;
    let source = &live.config.sources[source_index];
    let unknown = |tenant_id: &str| {
        Refusal::new(
            404,
            "unknown_tenant",
            format!("no tenant named {tenant_id:?}"),
        )
    };
    let tenant = match (&source.tenancy, tenant_part) {
        (Tenancy::Fixed(tenant_id), None) => {
            TenantRef::Known(tenants.get(tenant_id).ok_or_else(|| unknown(tenant_id))?)
        }
        (Tenancy::Fixed(_), Some(_)) => {
            return Err(Refusal::new(
                404,
                "not_found",
                format!("source {source_id:?} names its tenant; post to /hooks/{source_id}"),
            ))
        }
        (Tenancy::Path { .. }, None) => {
            return Err(Refusal::new(
                404,
                "tenant_required",
                format!("source {source_id:?} takes its tenant from the path: /hooks/{source_id}/{{tenant}}"),
            ))
        }
        (Tenancy::Path { auto }, Some(tenant_part)) => {
            let tenant_id = std::str::from_utf8(tenant_part).map_err(|_| not_found())?;
            match tenants.get(tenant_id) {
                // A tenant only an auto source created is not one a plain path source
                // serves.
                Some(tenant) if tenant.declared || *auto => TenantRef::Known(tenant),
                Some(_) => return Err(unknown(tenant_id)),
                None if *auto && config::is_valid_id(tenant_id) => {
                    TenantRef::Auto(tenant_id.into())
                }
                None if *auto => {
                    return Err(Refusal::new(
                        404,
                        "invalid_tenant_id",
                        format!(
                            "{tenant_id:?} is not a valid tenant id ({})",
                            config::ID_GRAMMAR
                        ),
                    ))
                }
                None => return Err(unknown(tenant_id)),
            }
        }
    };
    Ok(Target {
        source_index,
        source,
        tenant,
    })
}

/// The tenant of a verified request, creating an auto tenant on its first hook.
pub fn admit_tenant(shared: &EdgeShared, tenant: TenantRef) -> Result<Tenant, Refusal> {
    match tenant {
        TenantRef::Known(tenant) => Ok(tenant),
        TenantRef::Auto(id) => shared
            .tenants
            .create_auto(&id)
            .map_err(|error| match error {
                tenants::CreateError::InvalidId { .. } => {
                    Refusal::new(404, "invalid_tenant_id", error.to_string())
                }
                tenants::CreateError::CapReached { .. } => {
                    Refusal::new(403, "tenant_cap_reached", error.to_string())
                }
                tenants::CreateError::Store(_) => {
                    tracing::error!(%error, tenant = &*id, "auto tenant not created");
                    Refusal::new(
                        503,
                        "store_unavailable",
                        "the new tenant could not be stored; nothing was accepted",
                    )
                }
            }),
    }
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

    /// The query follows the path after one `?`, so the target is one range of the buffer.
    fn request_target(&self) -> Option<&[u8]> {
        let end = self
            .head
            .query
            .as_ref()
            .map_or(self.head.path.end, |query| query.end);
        self.buf.get(self.head.path.start..end)
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
/// `hmac-sha256:<hex>` of their value under the instance's key (a keyed hash, so a
/// low-entropy secret cannot be recovered by hashing guesses).
#[allow(clippy::too_many_arguments)]
pub fn encode_hook(
    out: &mut Vec<u8>,
    source: &Source,
    tenant_id: &str,
    headers: &RequestHeaders<'_>,
    body: &[u8],
    received_at_ms: u64,
    dedupe_key: &[u8],
    header_hash_key: &[u8; 32],
) {
    use hmac::{Hmac, Mac};
    use sha2::Sha256;
    out.clear();
    let mut encoder = HookEncoder::start(out, &source.id, tenant_id, received_at_ms, dedupe_key);
    let rules = &source.store_headers.rules;
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
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(header_hash_key)
                    .expect("HMAC accepts any key length");
                mac.update(value);
                let mut hashed = [0u8; HASHED_PREFIX.len() + 64];
                hashed[..HASHED_PREFIX.len()].copy_from_slice(HASHED_PREFIX);
                // 32 bytes always encode to exactly 64 hex digits.
                let _ = hex::encode_to_slice(
                    mac.finalize().into_bytes(),
                    &mut hashed[HASHED_PREFIX.len()..],
                );
                encoder.header(name, &hashed);
            }
        }
    }
    encoder.finish(body);
}

/// What a hashed header's stored value starts with.
pub const HASHED_PREFIX: &[u8] = b"hmac-sha256:";
