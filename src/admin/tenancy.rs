//! The admin API's tenant and quarantine work: list tenants with their bounds and counters;
//! list, show, release and delete quarantined hooks.
//!
//! Like the rest of [`Operations`], everything here blocks and runs on the admin pool, but a
//! job may run beside it: a release or a delete reads the hook's quarantine entry and moves
//! it under [`Operations::lock_moves`], so a release and a delete of one hook never both
//! take it out (and the quarantined counter never drops twice), and a tenant purge reads
//! the counters it takes off the node under the same lock, so a revive's batch lands
//! wholly before or after it. A release takes the ingest path:
//! the stored hook's keys are resolved the way the edge resolves a new hook's, and the
//! writer stores it as a new hook and takes the quarantined one out in the same batch.

use std::sync::Arc;

use base64::Engine as _;

use crate::ack::{Ack, AckOutcome};
use crate::clock;
use crate::edge::resolve::{self, JsonScratch};
use crate::store::codec::HookRecord;
use crate::store::deliveries::{self, Transitions};
use crate::store::keys::{self, Counter};
use crate::tenants::Tenant;
use crate::writer::{Envelope, EnvelopeKind};

use super::api::{
    ApiError, Counters, Deleted, HookRef, QuarantineDetail, QuarantineItem, QuarantinePage,
    QuarantineQuery, Released, TenantInfo, TenantList, TenantPurged,
};
use super::operations::{stopping, Operations};

impl Operations {
    fn tenant(&self, id: &str) -> Result<Tenant, ApiError> {
        self.tenants
            .snapshot()
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::unknown_tenant(id))
    }

    pub(super) fn counters(&self, ordinal: u32) -> Result<Counters, ApiError> {
        Counter::ALL
            .iter()
            .map(|field| Ok((field.name(), self.store.counter(ordinal, *field)?)))
            .collect()
    }

    fn tenant_info(
        &self,
        tenant: Tenant,
        breakers: &super::breakers::Breakers<'_>,
    ) -> Result<TenantInfo, ApiError> {
        let open = breakers.of_tenant(&tenant.id, tenant.ordinal);
        Ok(TenantInfo {
            counters: self.counters(tenant.ordinal)?,
            id: tenant.id.to_string(),
            ordinal: tenant.ordinal,
            declared: tenant.declared,
            max_pending: tenant.bounds.max_pending,
            max_bytes: tenant.bounds.max_bytes,
            max_quarantined: tenant.bounds.max_quarantined,
            replay_rate_per_s: tenant.bounds.replay_rate_per_s,
            replay_max_pending: tenant.bounds.replay_max_pending,
            replay_concurrency: tenant.bounds.replay_concurrency,
            breakers_open: open.len(),
            breakers: open,
        })
    }

    /// Every tenant, declared and auto, by ordinal: counters are point reads.
    pub fn list_tenants(&self) -> Result<TenantList, ApiError> {
        let breakers = self.breakers();
        let tenants = self
            .tenants
            .snapshot()
            .list()
            .into_iter()
            .map(|tenant| self.tenant_info(tenant, &breakers))
            .collect::<Result<_, _>>()?;
        Ok(TenantList { tenants })
    }

    pub fn show_tenant(&self, id: &str) -> Result<TenantInfo, ApiError> {
        let tenant = self.tenant(id)?;
        self.tenant_info(tenant, &self.breakers())
    }

    /// Erases a tenant: every key of its ordinal in one batch, the node aggregate moved by
    /// its counters. First the tenant leaves the directory (the edge stops routing it and
    /// the writer refuses what is still on its way), a writer barrier makes sure nothing of
    /// it is left uncommitted, and its pipeline core stops moving it; from then on nothing
    /// but this operation writes the ordinal, so its counters can be read and taken off
    /// the node. A declared tenant is served on under a new ordinal.
    pub fn purge_tenant(&self, id: &str) -> Result<TenantPurged, ApiError> {
        let tenant = self
            .tenants
            .retire(id)
            .ok_or_else(|| ApiError::unknown_tenant(id))?;
        let ordinal = tenant.ordinal;
        if let Err(error) = self.writer_barrier(ordinal) {
            self.tenants.restore(tenant);
            return Err(error);
        }
        if !(self.pipeline.retire)(ordinal) {
            // The pipeline may hold the tenant in an unknown state now: leave it out of
            // service rather than serve it half-frozen. A restart clears the retirement.
            return Err(ApiError::new(
                503,
                "pipeline_unavailable",
                format!("the pipeline did not confirm; tenant {id:?} is out of service until the gateway restarts, then purge it again"),
            ));
        }
        // A revive job's batch of this tenant's dead rows may still be committing: it
        // lands wholly before the counters are read, or finds no row to move after.
        let moves = self.lock_moves();
        let counters: Vec<(Counter, i64)> = Counter::ALL
            .iter()
            .map(|field| Ok((*field, self.store.counter(ordinal, *field)?)))
            .collect::<Result<_, ApiError>>()?;
        let mut transitions = Transitions::new(&self.store);
        transitions.purge_tenant(ordinal, &tenant.id, &counters);
        transitions.commit(true)?;
        drop(moves);
        let new_ordinal = if tenant.declared {
            Some(self.tenants.reinstate(&tenant)?.ordinal)
        } else {
            None
        };
        tracing::warn!(tenant = id, ordinal, ?new_ordinal, "tenant purged");
        Ok(TenantPurged {
            tenant: id.to_owned(),
            ordinal,
            new_ordinal,
            counters: counters
                .into_iter()
                .map(|(field, value)| (field.name(), value))
                .collect(),
        })
    }

    /// Returns once every envelope the writer took before now is committed.
    fn writer_barrier(&self, ordinal: u32) -> Result<(), ApiError> {
        let writer = self.writer_handle()?;
        let ack = Arc::new(Ack::new());
        let envelope = Envelope::new(
            ordinal,
            Arc::from(Vec::new()),
            Vec::new(),
            EnvelopeKind::Barrier,
            ack.clone(),
        );
        writer.submit_patiently(envelope).map_err(|_| stopping())?;
        match futures_lite::future::block_on(ack.wait()) {
            AckOutcome::Failed => Err(ApiError::new(
                503,
                "store_unavailable",
                "the writer could not commit; nothing was purged",
            )),
            _ => Ok(()),
        }
    }

    /// One page of a tenant's quarantine, in seq order.
    pub fn list_quarantine(&self, query: &QuarantineQuery) -> Result<QuarantinePage, ApiError> {
        let tenant = self.tenant(&query.tenant)?;
        // One more than asked: whether a next page exists, without a second scan.
        let mut entries =
            deliveries::quarantined(&self.store, tenant.ordinal, query.after, query.limit + 1)?;
        let next = (entries.len() > query.limit).then(|| entries[query.limit - 1].0);
        entries.truncate(query.limit);
        let items = entries
            .into_iter()
            .map(|(seq, reason)| {
                let hook = self.quarantined_hook(tenant.ordinal, seq)?;
                Ok(item(&tenant, seq, reason, hook.as_ref()))
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(QuarantinePage { items, next })
    }

    pub fn show_quarantined(&self, hook_ref: &HookRef) -> Result<QuarantineDetail, ApiError> {
        let tenant = self.tenant(&hook_ref.tenant)?;
        let reason = self.reason(&tenant, hook_ref.seq)?;
        let hook = self.quarantined_hook(tenant.ordinal, hook_ref.seq)?;
        let (headers, body) = match &hook {
            Some(hook) => (
                hook.headers
                    .iter()
                    .map(|(name, value)| {
                        (name.clone(), String::from_utf8_lossy(value).into_owned())
                    })
                    .collect(),
                hook.body.clone(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        Ok(QuarantineDetail {
            item: item(&tenant, hook_ref.seq, reason, hook.as_ref()),
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            body_base64: base64::engine::general_purpose::STANDARD.encode(&body),
        })
    }

    /// Re-ingests a quarantined hook as a new hook of its source, skipping verification
    /// (the operator vouches for it) but resolving its keys like the edge: a repeat of a
    /// hook inside its dedupe window is answered as such, and leaves quarantine too.
    pub fn release(&self, hook_ref: &HookRef) -> Result<Released, ApiError> {
        let tenant = self.tenant(&hook_ref.tenant)?;
        // From the look at the entry until the writer has taken it out.
        let _moves = self.lock_moves();
        self.reason(&tenant, hook_ref.seq)?;
        let Some(mut hook) = self.quarantined_hook(tenant.ordinal, hook_ref.seq)? else {
            return Err(ApiError::new(
                409,
                "undecodable",
                format!(
                    "quarantined hook {} cannot be decoded; delete it instead",
                    hook_ref.seq
                ),
            ));
        };
        let live = self.live.load();
        let Some(source_index) = live.source_serving(&hook.source_id, &tenant.id) else {
            return Err(ApiError::new(
                409,
                "source_gone",
                format!(
                    "source {:?} no longer serves tenant {:?}; delete the hook instead",
                    hook.source_id, hook_ref.tenant
                ),
            ));
        };
        let source = &live.config.sources[source_index];
        let resolved = resolve::resolve(source, &hook, &hook.body, &mut JsonScratch::default())
            .map_err(|refusal| {
                ApiError::new(
                    409,
                    refusal.code,
                    format!("the hook cannot be released: {}", refusal.message),
                )
            })?;
        hook.received_at_ms = clock::now_ms();
        hook.dedupe_key = resolved.dedupe.clone().unwrap_or_default();
        let mut hook_value = Vec::new();
        hook.encode(&mut hook_value);
        let ack = Arc::new(Ack::new());
        let mut envelope = Envelope::new(
            tenant.ordinal,
            live.sink_ids[source_index].clone(),
            hook_value,
            EnvelopeKind::Release(hook_ref.seq),
            ack.clone(),
        );
        envelope.lanes = resolved.lanes;
        if let Some(key) = &resolved.dedupe {
            keys::dedupe(&mut envelope.dedupe_key, tenant.ordinal, &source.id, key);
            envelope.dedupe_expires_ms = clock::now_ms().saturating_add(source.dedupe_window_ms);
        }
        self.writer_handle()?
            .submit_patiently(envelope)
            .map_err(|_| stopping())?;
        let (new_seq, duplicate_of) = match futures_lite::future::block_on(ack.wait()) {
            AckOutcome::Committed(seq) => (Some(seq), None),
            AckOutcome::Duplicate(first) => (None, Some(first)),
            AckOutcome::Failed => {
                return Err(ApiError::new(
                    503,
                    "store_unavailable",
                    "the release could not be stored; the hook stays in quarantine",
                ))
            }
        };
        tracing::info!(tenant = %hook_ref.tenant, seq = hook_ref.seq, ?new_seq, ?duplicate_of, "quarantined hook released");
        Ok(Released {
            seq: hook_ref.seq,
            new_seq,
            duplicate_of,
        })
    }

    pub fn delete_quarantined(&self, hook_ref: &HookRef) -> Result<Deleted, ApiError> {
        let tenant = self.tenant(&hook_ref.tenant)?;
        let moves = self.lock_moves();
        self.reason(&tenant, hook_ref.seq)?;
        let mut transitions = Transitions::new(&self.store);
        transitions.delete_quarantined(tenant.ordinal, hook_ref.seq);
        transitions.commit(true)?;
        drop(moves);
        tracing::info!(tenant = %hook_ref.tenant, seq = hook_ref.seq, "quarantined hook deleted");
        Ok(Deleted { seq: hook_ref.seq })
    }

    /// The quarantine reason, or 404 when the hook is not in quarantine.
    fn reason(&self, tenant: &Tenant, seq: u64) -> Result<String, ApiError> {
        deliveries::quarantine_reason(&self.store, tenant.ordinal, seq)?.ok_or_else(|| {
            ApiError::new(
                404,
                "not_quarantined",
                format!("tenant {:?} has no quarantined hook {seq}", &*tenant.id),
            )
        })
    }

    /// The quarantined hook's record; `None` when it is missing or undecodable.
    fn quarantined_hook(&self, ordinal: u32, seq: u64) -> Result<Option<HookRecord>, ApiError> {
        Ok(deliveries::read_hook(&self.store, ordinal, seq)?
            .and_then(|bytes| HookRecord::decode(&bytes).ok()))
    }
}

fn item(tenant: &Tenant, seq: u64, reason: String, hook: Option<&HookRecord>) -> QuarantineItem {
    QuarantineItem {
        tenant: tenant.id.to_string(),
        seq,
        source: hook.map(|hook| hook.source_id.clone()),
        reason,
        received_at_ms: hook.map(|hook| hook.received_at_ms),
        body_bytes: hook.map(|hook| hook.body.len()),
    }
}
