//! `GET /v1/dlq/hook?tenant=T&seq=N`: one stored hook as an operator inspects a dead
//! letter — its stored headers, a preview of its body, and each delivery row it still has
//! (attempts, last error, and whether the row is dead or still pending).
//!
//! Point reads only: the hook row and the rows of one hook (at most one per sink of its
//! source). Runs on the admin's blocking thread like the rest of [`Operations`].

use serde::Serialize;

use crate::store::codec::{DeliveryRow, HookRecord};
use crate::store::deliveries::{self, RowId};

use super::api::{ApiError, HookRef};
use super::operations::Operations;

/// Body bytes an answer carries at most: enough to recognise a payload, small enough for
/// a page that lists it. `body_bytes` tells the whole size.
pub const BODY_PREVIEW_BYTES: usize = 16 * 1024;

/// One hook with its remaining delivery rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookEnvelope {
    pub tenant: String,
    pub seq: u64,
    pub source: String,
    pub received_at_ms: u64,
    /// The headers kept by the store_headers policy, values as UTF-8 (lossy).
    pub headers: Vec<(String, String)>,
    /// The first [`BODY_PREVIEW_BYTES`] of the body as UTF-8 (lossy).
    pub body_preview: String,
    pub body_bytes: usize,
    pub body_truncated: bool,
    pub rows: Vec<EnvelopeRow>,
}

/// One delivery row of the hook. Fields an undecodable row cannot give are `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvelopeRow {
    pub sink: Option<String>,
    /// `dead` (in the DLQ) or `pending` (due, in flight or waiting in its lane).
    pub state: &'static str,
    /// The dead-letter reason; `null` for a pending row.
    pub reason: Option<String>,
    pub attempts: Option<u32>,
    pub first_attempt_at_ms: Option<u64>,
    pub last_error: Option<String>,
    pub ordering_key: Option<String>,
}

impl Operations {
    pub fn show_hook(&self, hook_ref: &HookRef) -> Result<HookEnvelope, ApiError> {
        let ordinal = self
            .tenants
            .snapshot()
            .get(&hook_ref.tenant)
            .map(|tenant| tenant.ordinal)
            .ok_or_else(|| ApiError::unknown_tenant(&hook_ref.tenant))?;
        let not_stored = || {
            ApiError::new(
                404,
                "no_such_hook",
                format!(
                    "tenant {:?} stores no hook {} (delivered hooks are in the archive)",
                    hook_ref.tenant, hook_ref.seq
                ),
            )
        };
        let corrupt = |error: &dyn std::fmt::Display| {
            ApiError::new(
                409,
                "corrupt",
                format!(
                    "hook {} is corrupt; none of it is shown: {error}",
                    hook_ref.seq
                ),
            )
        };
        let bytes = match deliveries::read_hook(&self.store, ordinal, hook_ref.seq) {
            Err(error) if error.is_corruption() => return Err(corrupt(&error)),
            read => read?.ok_or_else(not_stored)?,
        };
        let hook = HookRecord::decode(&bytes).map_err(|error| {
            if error.is_corrupt() {
                return corrupt(&error);
            }
            ApiError::new(
                409,
                "undecodable",
                format!("hook {} cannot be decoded: {error}", hook_ref.seq),
            )
        })?;
        let mut rows = Vec::new();
        for sink in deliveries::rows_of_hook(&self.store, ordinal, hook_ref.seq)? {
            let id = RowId {
                ordinal,
                seq: hook_ref.seq,
                sink,
            };
            let reason = deliveries::dead_reason(&self.store, id)?;
            let row = deliveries::read_row(&self.store, id)?
                .and_then(|bytes| DeliveryRow::decode(&bytes).ok());
            rows.push(envelope_row(reason, row));
        }
        let preview = &hook.body[..hook.body.len().min(BODY_PREVIEW_BYTES)];
        Ok(HookEnvelope {
            tenant: hook_ref.tenant.clone(),
            seq: hook_ref.seq,
            source: hook.source_id.clone(),
            received_at_ms: hook.received_at_ms,
            headers: hook
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), String::from_utf8_lossy(value).into_owned()))
                .collect(),
            body_preview: String::from_utf8_lossy(preview).into_owned(),
            body_bytes: hook.body.len(),
            body_truncated: preview.len() < hook.body.len(),
            rows,
        })
    }
}

fn envelope_row(reason: Option<String>, row: Option<DeliveryRow>) -> EnvelopeRow {
    let state = if reason.is_some() { "dead" } else { "pending" };
    match row {
        Some(row) => EnvelopeRow {
            sink: Some(row.sink_id),
            state,
            reason,
            attempts: Some(row.attempts),
            first_attempt_at_ms: Some(row.first_attempt_at_ms).filter(|at| *at > 0),
            last_error: Some(row.last_error).filter(|error| !error.is_empty()),
            ordering_key: row.lane.map(|lane| lane.ordering_key),
        },
        None => EnvelopeRow {
            sink: None,
            state,
            reason,
            attempts: None,
            first_attempt_at_ms: None,
            last_error: None,
            ordering_key: None,
        },
    }
}
