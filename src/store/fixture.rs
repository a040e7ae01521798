//! Store fixtures: a store image of the current format holding every state a store of that
//! format can have, packed as a gzip tarball (`ankusa store fixture`, `fixtures/`), and
//! the unpacking and checking the upgrade tests do with every image.
//!
//! An image is built through the same paths the gateway writes by: [`Store::open`] and
//! [`Store::ensure_tenants`] at boot, the writer's ingest batch ([`ingest_batch`] mirrors
//! `writer::Collector::add` and `seal`), and [`Transitions`] for every later move of a row.
//! Every timestamp is fixed, and so is the instance id, so the keys and values of an image
//! are the same on every run; RocksDB's own files (ids, file numbers, options) are not,
//! which is fine: the upgrade tests read the data, never the files' bytes.
//!
//! The tarball holds [`SUMMARY_NAME`] (the [`FixtureSummary`] as JSON: what the image
//! holds, so a test of a later binary knows what to expect from an image it cannot build
//! any more) and the store directory's files, all at the top level with relative names.
//!
//! What a format-1 image holds (tenants `acme` = 1, `globex` = 2):
//!
//! | seq | tenant | source / sinks           | state                                            |
//! |-----|--------|--------------------------|--------------------------------------------------|
//! | 1   | acme   | `stripe` / `http`        | due, first attempt (`?D` kind 0)                 |
//! | 2   | acme   | `fanout` / `http-1 http-2` | both rows due, first attempt                   |
//! | 3   | acme   | `stripe` / `http`        | claimed (`?F`)                                   |
//! | 4   | acme   | `stripe` / `http`        | waiting for a retry (`?D` kind 1, attempts 1, last_error) |
//! | 5   | acme   | `stripe` / `http`        | dead-lettered after an attempt (`?X`)            |
//! | 6   | acme   | `stripe` / `http`        | delivered; hook moved to the archive             |
//! | 7   | globex | `shared` / `http`        | due, first attempt                               |
//! | 8   | globex | `relay` / `http-1 http-2` | `http-1` delivered, `http-2` dead-lettered before any attempt (`sink_gone`); the hook stays |
//!
//! Format 2 (the ordering lanes) adds, on acme's source `orders` with sinks `http`
//! (ordered, key `{json: customer}`) and `audit` (unordered), and on globex:
//!
//! | seq | tenant | state                                                                  |
//! |-----|--------|------------------------------------------------------------------------|
//! | 9   | acme   | `cus_A`: the lane's head, claimed (`?H`, `?F`); `audit` due            |
//! | 10  | acme   | `cus_A`: a member behind it (`?O`); `audit` due                        |
//! | 11  | acme   | `cus_B`: the head, waiting out a retry (`?D` kind 3, attempts 1); `audit` due |
//! | 12, 13 | acme | `cus_B`: members behind the blocked head; `audit` due                |
//! | 14  | acme   | no customer: the keyless lane's head, due (`?D` kind 2); `audit` due    |
//! | 15  | acme   | keyless: a member; `audit` due                                          |
//! | 16  | globex | `shared`, deduped: its `?K` entry, and one repeat counted              |
//! | 17  | globex | quarantined (`?Q`, no rows)                                             |
//! | 18  | acme   | `cus_A`: a member committed after the sweep, with the lane's marker (`?P`) |
//!
//! The format-1 image has no dedupe (`?K`) or quarantine (`?Q`) keys: the gateway of that
//! time refused both.
//!
//! Format 3 holds the states of format 2 with every hook record sealed by its integrity
//! digest (hook records of version 2, as [`HookRecord::encode`] writes them).
//!
//! Format 4 adds acme `stripe` hooks an archive replay sent again, their rows in the
//! replay class: seq 19 due as a first attempt (`?D` kind 4), seq 20 waiting out a retry
//! (`?D` kind 5, attempts 1).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::{Compression, GzBuilder};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::codec::{DeliveryRow, HookRecord, RowLane};
use super::deliveries::{lanes, Class, Ingest, RowId, Transitions};
use super::keys::{self, Counter, DueKind, Tag};
use super::{
    verify, Store, StoreError, WriteBatch, CF_ARCHIVE, CF_DELIVERIES, CF_HOOKS, CF_INDEX, CF_META,
    FORMAT,
};

/// The tarball entry holding the [`FixtureSummary`].
pub const SUMMARY_NAME: &str = "fixture.json";

/// Every timestamp of an image is an offset from this instant (2023-11-14T22:13:20Z), so
/// the data is the same on every run.
const BASE_MS: u64 = 1_700_000_000_000;

/// Written over the random id the store stamps at creation, so `meta` is deterministic
/// too: hex of `ankusa-fixture-1`.
const INSTANCE_ID: &str = "616e6b7573612d666978747572652d31";

#[derive(Debug, Error)]
pub enum FixtureError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {SUMMARY_NAME}: {source}")]
    Summary {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: entry {name:?} is not a plain file at the top level of the image")]
    Entry { path: PathBuf, name: String },
    #[error("{path}: no {SUMMARY_NAME} entry; not a store fixture")]
    MissingSummary { path: PathBuf },
    #[error(
        "this binary builds format {binary} images only, not format {asked}; \
         build a format {asked} image with the release that writes that format"
    )]
    Format { asked: u32, binary: u32 },
    #[error("the built image fails store verify: {}", problems.join("; "))]
    Unverified { problems: Vec<String> },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> FixtureError + '_ {
    move |source| FixtureError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What an image holds: the upgrade tests check a migrated store against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixtureSummary {
    /// The format the image was written in (`meta/format` before any migration).
    pub format: u32,
    /// `meta/seq`: the highest seq committed.
    pub last_seq: u64,
    pub tenants: Vec<TenantSummary>,
}

/// One tenant of an image: its gauge and total counters, and the keys of each family.
/// Fields a later format added default to zero in the summary of an older image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantSummary {
    pub id: String,
    pub ordinal: u32,
    /// Keys in `hooks` (hooks with a delivery row left).
    pub hooks: u64,
    /// Keys in `deliveries`, dead rows included.
    pub deliveries: u64,
    /// `?D` keys.
    pub due: u64,
    /// `?F` keys and the `inflight` counter.
    pub inflight: i64,
    /// `?X` keys and the `dead` counter.
    pub dead: i64,
    /// Keys in `archive`.
    pub archived: u64,
    pub pending: i64,
    pub bytes: i64,
    pub delivered_total: i64,
    pub dead_lettered_total: i64,
    pub ingested_total: i64,
    /// `?Q` keys and the `quarantined` counter.
    #[serde(default)]
    pub quarantined: i64,
    #[serde(default)]
    pub deduped_total: i64,
    /// `?K` keys.
    #[serde(default)]
    pub dedupe_keys: u64,
    /// `?H` keys and the `lanes` counter.
    #[serde(default)]
    pub lanes: i64,
    /// Due keys of kind 3 and the `lanes_blocked` counter.
    #[serde(default)]
    pub lanes_blocked: i64,
    /// `?O` keys and the `lane_members` counter.
    #[serde(default)]
    pub lane_members: i64,
    /// `?P` keys.
    #[serde(default)]
    pub lane_markers: u64,
}

impl TenantSummary {
    /// A row entered the DLQ: it stays a delivery row, and leaves pending and bytes.
    fn dead_counts(&mut self, size: u32) {
        self.dead += 1;
        self.dead_lettered_total += 1;
        self.pending -= 1;
        self.bytes -= i64::from(size);
    }

    /// Every counter with its expected value.
    fn counters(&self) -> [(Counter, i64); 12] {
        [
            (Counter::Pending, self.pending),
            (Counter::Bytes, self.bytes),
            (Counter::Inflight, self.inflight),
            (Counter::Dead, self.dead),
            (Counter::Quarantined, self.quarantined),
            (Counter::DeliveredTotal, self.delivered_total),
            (Counter::DeadLetteredTotal, self.dead_lettered_total),
            (Counter::IngestedTotal, self.ingested_total),
            (Counter::DedupedTotal, self.deduped_total),
            (Counter::Lanes, self.lanes),
            (Counter::LanesBlocked, self.lanes_blocked),
            (Counter::LaneMembers, self.lane_members),
        ]
    }
}

impl fmt::Display for FixtureSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "format {}, last seq {}", self.format, self.last_seq)?;
        for t in &self.tenants {
            write!(
                f,
                "; {} ({}): {} hooks, {} delivery rows ({} due, {} in flight, {} dead), \
                 {} archived, pending {}, bytes {}",
                t.id,
                t.ordinal,
                t.hooks,
                t.deliveries,
                t.due,
                t.inflight,
                t.dead,
                t.archived,
                t.pending,
                t.bytes
            )?;
        }
        Ok(())
    }
}

/// `ankusa store fixture`: builds an image of `format` (which must be this binary's) in a
/// scratch directory, checks it with `store verify`, and packs it to `out`.
pub fn generate(out: &Path, format: u32) -> Result<FixtureSummary, FixtureError> {
    if format != FORMAT {
        return Err(FixtureError::Format {
            asked: format,
            binary: FORMAT,
        });
    }
    let scratch = ScratchDir::new()?;
    let (store, summary) = build_open(&scratch.path)?;
    let report = verify::verify(&store)?;
    if !report.clean() {
        return Err(FixtureError::Unverified {
            problems: report
                .problems
                .into_iter()
                .chain(report.repairable)
                .collect(),
        });
    }
    store.flush()?;
    // The last handle: dropping it closes the database before its files are read.
    drop(store);
    pack(&scratch.path, &summary, out)?;
    Ok(summary)
}

/// Builds an image of the current format in `dir`, which must be empty or absent, and
/// closes it with its memtables flushed to table files.
pub fn build(dir: &Path) -> Result<FixtureSummary, StoreError> {
    let (store, summary) = build_open(dir)?;
    store.flush()?;
    drop(store);
    Ok(summary)
}

fn build_open(dir: &Path) -> Result<(Store, FixtureSummary), StoreError> {
    let store = Store::open(dir)?;
    // The summary counts from zero: a store that already held data would not match it.
    assert!(
        store.last_seq()? == 0 && store.tenants()?.is_empty(),
        "a fixture is built in an empty directory, not in the store at {}",
        dir.display()
    );
    let mut meta = WriteBatch::default();
    store.put_cf(
        &mut meta,
        CF_META,
        keys::META_INSTANCE_ID,
        INSTANCE_ID.as_bytes(),
    );
    store.write(meta, true)?;
    let ordinals = store.ensure_tenants(["acme", "globex"])?;
    let mut image = Image {
        store: &store,
        next_seq: 1,
        markers: BTreeMap::new(),
        tenants: ordinals
            .iter()
            .map(|(id, ordinal)| {
                let summary = TenantSummary {
                    id: id.clone(),
                    ordinal: *ordinal,
                    ..TenantSummary::default()
                };
                (*ordinal, summary)
            })
            .collect(),
    };
    let acme = ordinals[0].1;
    let globex = ordinals[1].1;

    // acme: due, a fanout due on both sinks, claimed, waiting for a retry, dead, archived.
    image.ingest(acme, "stripe", &["http"], 1_000, "invoice.paid")?;
    image.ingest(
        acme,
        "fanout",
        &["http-1", "http-2"],
        2_000,
        "order.created",
    )?;
    let claimed = image.ingest(acme, "stripe", &["http"], 3_000, "invoice.created")?;
    let retrying = image.ingest(acme, "stripe", &["http"], 4_000, "charge.failed")?;
    let dead = image.ingest(acme, "stripe", &["http"], 5_000, "customer.deleted")?;
    let archived = image.ingest(acme, "stripe", &["http"], 6_000, "invoice.finalized")?;
    // globex: due; a two-sink hook with one row delivered and one dead-lettered unattempted.
    image.ingest(globex, "shared", &["http"], 7_000, "push")?;
    let partial = image.ingest(globex, "relay", &["http-1", "http-2"], 8_000, "release")?;

    image.claim(&claimed, 0, 10_000)?;

    let row = image.claim(&retrying, 0, 11_000)?;
    let failed = DeliveryRow {
        last_error: "http 503: upstream unavailable".into(),
        ..row
    };
    image.retry(&retrying, 0, &failed, 11_000 + 30_000)?;

    let row = image.claim(&dead, 0, 12_000)?;
    let refused = DeliveryRow {
        last_error: "http 400: bad request".into(),
        ..row
    };
    image.dead_from_inflight(&dead, 0, &refused)?;

    image.claim(&archived, 0, 13_000)?;
    image.delivered(&archived, 0, true)?;

    image.claim(&partial, 0, 14_000)?;
    image.delivered(&partial, 0, false)?;
    image.dead_from_due(&partial, 1, "sink_gone")?;

    // Format 2: lanes on acme's `orders` (sink 0 ordered by customer, sink 1 not), a
    // dedupe entry and a quarantined hook on globex.
    let head_a = image.ingest_ordered(acme, 15_000, Some("cus_A"))?;
    image.ingest_ordered(acme, 15_001, Some("cus_A"))?;
    let head_b = image.ingest_ordered(acme, 15_002, Some("cus_B"))?;
    image.ingest_ordered(acme, 15_003, Some("cus_B"))?;
    image.ingest_ordered(acme, 15_004, Some("cus_B"))?;
    image.ingest_ordered(acme, 15_005, None)?;
    image.ingest_ordered(acme, 15_006, None)?;
    let swept_at = 16_000;
    image.sweep(acme, swept_at)?;
    image.claim_head(&head_a, swept_at, 17_000)?;
    let row = image.claim_head(&head_b, swept_at, 18_000)?;
    let failed = DeliveryRow {
        last_error: "http 503: upstream unavailable".into(),
        ..row
    };
    image.retry(&head_b, 0, &failed, 18_000 + 30_000)?;
    image.ingest_deduped(globex, "shared", 19_000, b"delivery-16")?;
    image.quarantine(globex, "shared", 20_000, "signature_invalid: no signature")?;
    image.ingest_ordered(acme, 21_000, Some("cus_A"))?;
    // Format 4: archive replays' hooks on acme, one due as a first attempt in the replay
    // class, one waiting out a retry in it.
    image.ingest_in(
        acme,
        "stripe",
        &["http"],
        22_000,
        "invoice.paid",
        Class::Replay,
    )?;
    let replayed = image.ingest_in(
        acme,
        "stripe",
        &["http"],
        22_001,
        "charge.failed",
        Class::Replay,
    )?;
    let row = image.claim(&replayed, 0, 23_000)?;
    let failed = DeliveryRow {
        last_error: "http 503: upstream unavailable".into(),
        ..row
    };
    image.retry(&replayed, 0, &failed, 23_000 + 30_000)?;

    let markers: Vec<(u32, u64)> = image
        .markers
        .iter()
        .map(|(ordinal, marked)| (*ordinal, marked.len() as u64))
        .collect();
    for (ordinal, marked) in markers {
        image.tenant(ordinal).lane_markers = marked;
    }
    let summary = FixtureSummary {
        format: FORMAT,
        last_seq: image.next_seq - 1,
        tenants: image.tenants.into_values().collect(),
    };
    Ok((store, summary))
}

/// The writer's ingest batch for one hook, through the writer's own [`Ingest`].
#[allow(clippy::too_many_arguments)]
fn ingest_batch(
    store: &Store,
    batch: &mut WriteBatch,
    ordinal: u32,
    seq: u64,
    hook_value: &[u8],
    sink_ids: &[&str],
    lanes: &[Option<RowLane>],
    due_ms: u64,
    class: Class,
) {
    let mut ingest = Ingest::new();
    ingest.add(
        store,
        batch,
        ordinal,
        seq,
        hook_value,
        sink_ids,
        lanes,
        hook_value.len() as u32,
        due_ms,
        class,
    );
    // An image is never served from this handle, so its in-memory gauges do not matter.
    let _gauges = ingest.seal(store, batch, seq);
}

/// An image being built: every step writes through the store's own paths and tallies
/// what it should have changed, so the summary is an expectation, not a recount.
struct Image<'s> {
    store: &'s Store,
    next_seq: u64,
    tenants: BTreeMap<u32, TenantSummary>,
    /// Lanes with a `?P` marker, per tenant.
    markers: BTreeMap<u32, std::collections::BTreeSet<keys::LaneId>>,
}

/// A hook as the writer left it.
struct Hook {
    ordinal: u32,
    seq: u64,
    received_at_ms: u64,
    size: u32,
    sink_ids: Vec<String>,
    /// Empty, or each sink's lane.
    lanes: Vec<Option<RowLane>>,
    value: Vec<u8>,
    /// The class its unlaned rows wait in.
    class: Class,
}

impl Hook {
    fn row(&self, sink: u16) -> RowId {
        RowId {
            ordinal: self.ordinal,
            seq: self.seq,
            sink,
        }
    }

    fn new_row(&self, sink: u16) -> DeliveryRow {
        DeliveryRow {
            sink_id: self.sink_ids[usize::from(sink)].clone(),
            attempts: 0,
            first_attempt_at_ms: 0,
            last_error: String::new(),
            size: self.size,
            lane: self.lanes.get(usize::from(sink)).cloned().flatten(),
        }
    }
}

impl Image<'_> {
    fn tenant(&mut self, ordinal: u32) -> &mut TenantSummary {
        match self.tenants.get_mut(&ordinal) {
            Some(tenant) => tenant,
            None => panic!("fixture tenant {ordinal} was not ensured"),
        }
    }

    /// Ingests one live hook received `at_ms` after [`BASE_MS`], due at once.
    fn ingest(
        &mut self,
        ordinal: u32,
        source_id: &str,
        sink_ids: &[&str],
        at_ms: u64,
        event: &str,
    ) -> Result<Hook, StoreError> {
        self.ingest_in(ordinal, source_id, sink_ids, at_ms, event, Class::Live)
    }

    /// Ingests one hook whose first attempts wait in `class`.
    fn ingest_in(
        &mut self,
        ordinal: u32,
        source_id: &str,
        sink_ids: &[&str],
        at_ms: u64,
        event: &str,
        class: Class,
    ) -> Result<Hook, StoreError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let received_at_ms = BASE_MS + at_ms;
        let tenant_id = self.tenant(ordinal).id.clone();
        let mut value = Vec::new();
        HookRecord {
            source_id: source_id.into(),
            tenant_id,
            received_at_ms,
            dedupe_key: Vec::new(),
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("user-agent".into(), b"fixture/1.0".to_vec()),
            ],
            body: format!("{{\"id\":\"evt_{seq}\",\"type\":\"{event}\"}}").into_bytes(),
        }
        .encode(&mut value);
        let size = value.len() as u32;
        let mut batch = WriteBatch::default();
        ingest_batch(
            self.store,
            &mut batch,
            ordinal,
            seq,
            &value,
            sink_ids,
            &[],
            received_at_ms,
            class,
        );
        self.store.write(batch, true)?;
        let rows = sink_ids.len() as u64;
        let tenant = self.tenant(ordinal);
        tenant.hooks += 1;
        tenant.deliveries += rows;
        tenant.due += rows;
        tenant.pending += rows as i64;
        tenant.bytes += rows as i64 * i64::from(size);
        tenant.ingested_total += 1;
        Ok(Hook {
            ordinal,
            seq,
            received_at_ms,
            size,
            sink_ids: sink_ids.iter().map(|s| s.to_string()).collect(),
            lanes: Vec::new(),
            value,
            class,
        })
    }

    /// Ingests one hook of acme's `orders` for `customer` (`None`: no key, the keyless
    /// lane): its `http` row joins the lane as a member with the lane's marker, its
    /// `audit` row is due at once.
    fn ingest_ordered(
        &mut self,
        ordinal: u32,
        at_ms: u64,
        customer: Option<&str>,
    ) -> Result<Hook, StoreError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let received_at_ms = BASE_MS + at_ms;
        let tenant_id = self.tenant(ordinal).id.clone();
        let body = match customer {
            Some(customer) => format!(
                "{{\"id\":\"evt_{seq}\",\"type\":\"order.updated\",\"customer\":\"{customer}\"}}"
            ),
            None => format!("{{\"id\":\"evt_{seq}\",\"type\":\"order.updated\"}}"),
        };
        let mut value = Vec::new();
        HookRecord {
            source_id: "orders".into(),
            tenant_id,
            received_at_ms,
            dedupe_key: Vec::new(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: body.into_bytes(),
        }
        .encode(&mut value);
        let size = value.len() as u32;
        let lane = RowLane::new(0, "orders", customer.map(str::as_bytes));
        let row_lanes = vec![Some(lane.clone()), None];
        let sink_ids = ["http", "audit"];
        let mut batch = WriteBatch::default();
        ingest_batch(
            self.store,
            &mut batch,
            ordinal,
            seq,
            &value,
            &sink_ids,
            &row_lanes,
            received_at_ms,
            Class::Live,
        );
        self.store.write(batch, true)?;
        self.markers.entry(ordinal).or_default().insert(lane.id);
        let tenant = self.tenant(ordinal);
        tenant.hooks += 1;
        tenant.deliveries += 2;
        tenant.due += 1;
        tenant.lane_members += 1;
        tenant.pending += 2;
        tenant.bytes += 2 * i64::from(size);
        tenant.ingested_total += 1;
        Ok(Hook {
            ordinal,
            seq,
            received_at_ms,
            size,
            sink_ids: sink_ids.iter().map(|s| s.to_string()).collect(),
            lanes: row_lanes,
            value,
            class: Class::Live,
        })
    }

    /// The pipeline's lane sweep of `ordinal` at `at_ms`: every marked lane without a
    /// head gets its first member as head, due then; every marker goes.
    fn sweep(&mut self, ordinal: u32, at_ms: u64) -> Result<(), StoreError> {
        let swept = lanes::sweep_at(self.store, None, ordinal, 1_000, BASE_MS + at_ms)?;
        let marked = self.markers.remove(&ordinal).unwrap_or_default();
        assert_eq!(swept.markers, marked.len(), "the sweep read every marker");
        let tenant = self.tenant(ordinal);
        let promoted = swept.promoted as i64;
        tenant.lanes += promoted;
        tenant.lane_members -= promoted;
        tenant.due += promoted as u64;
        Ok(())
    }

    /// Claims the head `hook`'s ordered row (sink 0), promoted at `due_at_ms`.
    fn claim_head(
        &mut self,
        hook: &Hook,
        due_at_ms: u64,
        at_ms: u64,
    ) -> Result<DeliveryRow, StoreError> {
        let now_ms = BASE_MS + at_ms;
        let row = DeliveryRow {
            attempts: 1,
            first_attempt_at_ms: now_ms,
            ..hook.new_row(0)
        };
        let mut transitions = Transitions::at(self.store, now_ms);
        transitions.claim(
            hook.row(0),
            BASE_MS + due_at_ms,
            DueKind::LaneFirstAttempt,
            &row,
            now_ms,
        );
        transitions.commit(true)?;
        let tenant = self.tenant(hook.ordinal);
        tenant.due -= 1;
        tenant.inflight += 1;
        Ok(row)
    }

    /// Ingests a hook of `source_id` with dedupe key `key` (its `?K` entry, expiring far
    /// in the future), then a repeat of it, counted.
    fn ingest_deduped(
        &mut self,
        ordinal: u32,
        source_id: &str,
        at_ms: u64,
        key: &[u8],
    ) -> Result<(), StoreError> {
        let hook = self.ingest(ordinal, source_id, &["http"], at_ms, "push")?;
        let mut full = Vec::new();
        keys::dedupe(&mut full, ordinal, source_id, key);
        let mut batch = WriteBatch::default();
        let mut ingest = Ingest::new();
        ingest.remember(self.store, &mut batch, &full, hook.seq, u64::MAX);
        ingest.duplicate(ordinal);
        let _gauges = ingest.seal(self.store, &mut batch, hook.seq);
        self.store.write(batch, true)?;
        let tenant = self.tenant(ordinal);
        tenant.dedupe_keys += 1;
        tenant.deduped_total += 1;
        Ok(())
    }

    /// Keeps a hook that failed verification: its hook row and `?Q` key, no rows.
    fn quarantine(
        &mut self,
        ordinal: u32,
        source_id: &str,
        at_ms: u64,
        reason: &str,
    ) -> Result<(), StoreError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let tenant_id = self.tenant(ordinal).id.clone();
        let mut value = Vec::new();
        HookRecord {
            source_id: source_id.into(),
            tenant_id,
            received_at_ms: BASE_MS + at_ms,
            dedupe_key: Vec::new(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: format!("{{\"id\":\"evt_{seq}\"}}").into_bytes(),
        }
        .encode(&mut value);
        let mut batch = WriteBatch::default();
        let mut ingest = Ingest::new();
        ingest.quarantine(self.store, &mut batch, ordinal, seq, &value, reason);
        let _gauges = ingest.seal(self.store, &mut batch, seq);
        self.store.write(batch, true)?;
        let tenant = self.tenant(ordinal);
        tenant.hooks += 1;
        tenant.quarantined += 1;
        Ok(())
    }

    /// Claims a first attempt of `hook`'s row `sink` at `at_ms` after [`BASE_MS`]; returns
    /// the row as the claim left it.
    fn claim(&mut self, hook: &Hook, sink: u16, at_ms: u64) -> Result<DeliveryRow, StoreError> {
        let now_ms = BASE_MS + at_ms;
        let row = DeliveryRow {
            attempts: 1,
            first_attempt_at_ms: now_ms,
            ..hook.new_row(sink)
        };
        let mut transitions = Transitions::at(self.store, BASE_MS);
        transitions.claim(
            hook.row(sink),
            hook.received_at_ms,
            hook.class.first_attempt(),
            &row,
            now_ms,
        );
        transitions.commit(true)?;
        let tenant = self.tenant(hook.ordinal);
        tenant.due -= 1;
        tenant.inflight += 1;
        Ok(row)
    }

    fn retry(
        &mut self,
        hook: &Hook,
        sink: u16,
        row: &DeliveryRow,
        due_at_ms: u64,
    ) -> Result<(), StoreError> {
        let mut transitions = Transitions::at(self.store, BASE_MS);
        transitions.retry(hook.row(sink), row, BASE_MS + due_at_ms, hook.class);
        transitions.commit(true)?;
        let tenant = self.tenant(hook.ordinal);
        tenant.inflight -= 1;
        tenant.due += 1;
        if row.lane.is_some() {
            tenant.lanes_blocked += 1;
        }
        Ok(())
    }

    fn dead_from_inflight(
        &mut self,
        hook: &Hook,
        sink: u16,
        row: &DeliveryRow,
    ) -> Result<(), StoreError> {
        let mut transitions = Transitions::at(self.store, BASE_MS);
        transitions.dead_from_inflight(hook.row(sink), row, &row.last_error)?;
        transitions.commit(true)?;
        let tenant = self.tenant(hook.ordinal);
        tenant.inflight -= 1;
        tenant.dead_counts(hook.size);
        Ok(())
    }

    fn dead_from_due(&mut self, hook: &Hook, sink: u16, reason: &str) -> Result<(), StoreError> {
        let row = DeliveryRow {
            last_error: reason.into(),
            ..hook.new_row(sink)
        };
        let mut transitions = Transitions::at(self.store, BASE_MS);
        transitions.dead_from_due(
            hook.row(sink),
            hook.received_at_ms,
            hook.size,
            Some(DueKind::FirstAttempt),
            Some(&row),
            reason,
        )?;
        transitions.commit(true)?;
        let tenant = self.tenant(hook.ordinal);
        tenant.due -= 1;
        tenant.dead_counts(hook.size);
        Ok(())
    }

    /// The claimed row `sink` of `hook` was delivered; with `last`, it was the hook's last
    /// row, and the hook moves to the archive in the same batch (as the pipeline does).
    fn delivered(&mut self, hook: &Hook, sink: u16, last: bool) -> Result<(), StoreError> {
        let mut transitions = Transitions::at(self.store, BASE_MS);
        transitions.delivered(hook.row(sink), &hook.new_row(sink))?;
        if last {
            transitions.archive_hook(hook.ordinal, hook.seq, hook.received_at_ms, &hook.value);
        }
        transitions.commit(true)?;
        let tenant = self.tenant(hook.ordinal);
        tenant.inflight -= 1;
        tenant.deliveries -= 1;
        tenant.pending -= 1;
        tenant.bytes -= i64::from(hook.size);
        tenant.delivered_total += 1;
        if last {
            tenant.hooks -= 1;
            tenant.archived += 1;
        }
        Ok(())
    }
}

/// Every difference between `store` and what `summary` says it holds: each tenant's
/// ordinal, counters and keys per family, the node aggregate and `meta/seq`. Empty when
/// they agree.
pub fn mismatches(store: &Store, summary: &FixtureSummary) -> Result<Vec<String>, StoreError> {
    let mut found = Vec::new();
    let known = store.tenants()?;
    if store.last_seq()? != summary.last_seq {
        found.push(format!(
            "meta/seq is {}, the summary says {}",
            store.last_seq()?,
            summary.last_seq
        ));
    }
    for tenant in &summary.tenants {
        let ordinal = tenant.ordinal;
        match known.iter().find(|(id, _)| *id == tenant.id) {
            Some((_, have)) if *have == ordinal => {}
            other => found.push(format!(
                "tenant {} has ordinal {:?}, the summary says {ordinal}",
                tenant.id,
                other.map(|(_, have)| *have)
            )),
        }
        for (field, want) in tenant.counters() {
            let have = store.counter(ordinal, field)?;
            if have != want {
                found.push(format!(
                    "tenant {}: counter {} is {have}, the summary says {want}",
                    tenant.id,
                    field.name()
                ));
            }
        }
        // Hook and delivery keys both start `ord seq`, so the hook keys of `ordinal` and
        // the next ordinal bound the tenant in either family.
        let mut start = Vec::with_capacity(keys::HOOK_LEN);
        keys::hook(&mut start, ordinal, 0);
        let end = ordinal.checked_add(1).map(|next| {
            let mut end = Vec::with_capacity(keys::HOOK_LEN);
            keys::hook(&mut end, next, 0);
            end
        });
        let (archive_start, archive_end) = keys::archive_before(ordinal, u64::MAX);
        let (due_start, due_end) = keys::family_range(Tag::Due, ordinal);
        let (inflight_start, inflight_end) = keys::family_range(Tag::Inflight, ordinal);
        let (dead_start, dead_end) = keys::family_range(Tag::Dead, ordinal);
        let index_keys = |tag: Tag| -> Result<u64, StoreError> {
            let (start, end) = keys::family_range(tag, ordinal);
            count(store, CF_INDEX, &start, Some(&end))
        };
        let families = [
            (
                "?H",
                index_keys(Tag::LaneHead)?,
                tenant.lanes.unsigned_abs(),
            ),
            (
                "?O",
                index_keys(Tag::LaneMember)?,
                tenant.lane_members.unsigned_abs(),
            ),
            ("?P", index_keys(Tag::LaneMarker)?, tenant.lane_markers),
            ("?K", index_keys(Tag::Dedupe)?, tenant.dedupe_keys),
            (
                "?Q",
                index_keys(Tag::Quarantine)?,
                tenant.quarantined.unsigned_abs(),
            ),
        ];
        for (family, have, want) in families {
            if have != want {
                found.push(format!(
                    "tenant {}: {have} {family} keys, the summary says {want}",
                    tenant.id
                ));
            }
        }
        let families = [
            (
                "hooks",
                count(store, CF_HOOKS, &start, end.as_deref())?,
                tenant.hooks,
            ),
            (
                "deliveries",
                count(store, CF_DELIVERIES, &start, end.as_deref())?,
                tenant.deliveries,
            ),
            (
                "archive",
                count(store, CF_ARCHIVE, &archive_start, Some(&archive_end))?,
                tenant.archived,
            ),
            (
                "?D",
                count(store, CF_INDEX, &due_start, Some(&due_end))?,
                tenant.due,
            ),
            (
                "?F",
                count(store, CF_INDEX, &inflight_start, Some(&inflight_end))?,
                tenant.inflight.unsigned_abs(),
            ),
            (
                "?X",
                count(store, CF_INDEX, &dead_start, Some(&dead_end))?,
                tenant.dead.unsigned_abs(),
            ),
        ];
        for (family, have, want) in families {
            if have != want {
                found.push(format!(
                    "tenant {}: {have} {family} keys, the summary says {want}",
                    tenant.id
                ));
            }
        }
    }
    for field in Counter::ALL {
        let want: i64 = summary
            .tenants
            .iter()
            .flat_map(|tenant| tenant.counters())
            .filter(|(counted, _)| *counted == field)
            .map(|(_, value)| value)
            .sum();
        let have = store.counter(keys::NODE_ORDINAL, field)?;
        if have != want {
            found.push(format!(
                "node counter {} is {have}, the summary says {want}",
                field.name()
            ));
        }
    }
    Ok(found)
}

fn count(store: &Store, cf: &str, start: &[u8], end: Option<&[u8]>) -> Result<u64, StoreError> {
    let mut total = 0u64;
    store.scan(cf, start, end, |_, _| {
        total += 1;
        Ok(true)
    })?;
    Ok(total)
}

/// Whether a file of a closed store directory belongs in an image. `LOCK` only guards a
/// running database and is recreated at open; `LOG` and `LOG.old.*` are RocksDB's
/// informational text logs, which name the absolute directory they were written in.
fn packed(name: &str) -> bool {
    name != "LOCK" && name != "LOG" && !name.starts_with("LOG.old.")
}

/// Packs the closed store in `dir` and its `summary` into a gzip tarball at `out`: the
/// summary first, then the directory's files sorted by name, all with relative names, mode
/// 0644, owner 0 and time 0, so the archive's own bytes vary only with RocksDB's files.
pub fn pack(dir: &Path, summary: &FixtureSummary, out: &Path) -> Result<(), FixtureError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let path = entry.path();
        let name = entry
            .file_name()
            .into_string()
            .map_err(|name| FixtureError::Entry {
                path: dir.to_path_buf(),
                name: name.to_string_lossy().into_owned(),
            })?;
        // A store directory is flat; anything else (a subdirectory, a link) is not ours.
        if !entry.file_type().map_err(io_error(&path))?.is_file() {
            return Err(FixtureError::Entry {
                path: dir.to_path_buf(),
                name,
            });
        }
        if packed(&name) {
            names.push(name);
        }
    }
    names.sort();

    let file = File::create(out).map_err(io_error(out))?;
    let gzip = GzBuilder::new()
        .mtime(0)
        .write(BufWriter::new(file), Compression::best());
    let mut archive = tar::Builder::new(gzip);
    let json = serde_json::to_vec_pretty(summary).map_err(|source| FixtureError::Summary {
        path: out.to_path_buf(),
        source,
    })?;
    append(&mut archive, SUMMARY_NAME, &json).map_err(io_error(out))?;
    for name in &names {
        let path = dir.join(name);
        let bytes = fs::read(&path).map_err(io_error(&path))?;
        append(&mut archive, name, &bytes).map_err(io_error(out))?;
    }
    let gzip = archive.into_inner().map_err(io_error(out))?;
    let buffered = gzip.finish().map_err(io_error(out))?;
    let file = buffered
        .into_inner()
        .map_err(|error| io_error(out)(error.into_error()))?;
    file.sync_all().map_err(io_error(out))
}

fn append<W: Write>(
    archive: &mut tar::Builder<W>,
    name: &str,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    archive.append_data(&mut header, name, bytes)
}

/// Unpacks the image at `tarball` into `dir` (created if absent) and returns its summary.
/// Every entry must be a plain file with a one-component relative name, so an image can
/// write nowhere but `dir`.
pub fn unpack(tarball: &Path, dir: &Path) -> Result<FixtureSummary, FixtureError> {
    fs::create_dir_all(dir).map_err(io_error(dir))?;
    let file = File::open(tarball).map_err(io_error(tarball))?;
    let mut archive = tar::Archive::new(GzDecoder::new(file));
    let mut summary = None;
    for entry in archive.entries().map_err(io_error(tarball))? {
        let mut entry = entry.map_err(io_error(tarball))?;
        let entry_path = entry.path().map_err(io_error(tarball))?.into_owned();
        let name = match entry_path.components().collect::<Vec<_>>().as_slice() {
            [Component::Normal(name)] => name.to_str().map(str::to_owned),
            _ => None,
        };
        let name = match name {
            Some(name) if entry.header().entry_type() == tar::EntryType::Regular => name,
            _ => {
                return Err(FixtureError::Entry {
                    path: tarball.to_path_buf(),
                    name: entry_path.display().to_string(),
                })
            }
        };
        if name == SUMMARY_NAME {
            let mut json = Vec::new();
            entry.read_to_end(&mut json).map_err(io_error(tarball))?;
            let parsed = serde_json::from_slice(&json).map_err(|source| FixtureError::Summary {
                path: tarball.to_path_buf(),
                source,
            })?;
            summary = Some(parsed);
        } else {
            let path = dir.join(&name);
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(io_error(tarball))?;
            fs::write(&path, &bytes).map_err(io_error(&path))?;
        }
    }
    summary.ok_or_else(|| FixtureError::MissingSummary {
        path: tarball.to_path_buf(),
    })
}

/// A directory under the system temp dir, removed when dropped: where `generate` builds.
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn new() -> Result<ScratchDir, FixtureError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("ankusa-fixture-{}-{nanos}", std::process::id()));
        fs::create_dir(&path).map_err(io_error(&path))?;
        Ok(ScratchDir { path })
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // Best effort: a leftover scratch store in the temp dir harms nothing.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Every key and value of every column family, in order: what two images must share to
/// hold the same data (RocksDB's own files differ from run to run).
pub type Dump = Vec<(&'static str, Vec<u8>, Vec<u8>)>;

pub fn dump(store: &Store) -> Result<Dump, StoreError> {
    let mut out = Vec::new();
    for cf in [CF_META, CF_HOOKS, CF_DELIVERIES, CF_INDEX, CF_ARCHIVE] {
        store.scan(cf, &[], None, |key, value| {
            out.push((cf, key.to_vec(), value.to_vec()));
            Ok(true)
        })?;
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dump(store: &Store) -> Dump {
        super::dump(store).unwrap()
    }

    #[test]
    fn build_pack_unpack_open_verify_round_trips() {
        let scratch = tempfile::tempdir().unwrap();
        let built = scratch.path().join("built");
        let summary = build(&built).unwrap();
        let tarball = scratch.path().join("store.tar.gz");
        pack(&built, &summary, &tarball).unwrap();

        let unpacked = scratch.path().join("unpacked");
        assert_eq!(unpack(&tarball, &unpacked).unwrap(), summary);
        let store = Store::open(&unpacked).unwrap();
        assert_eq!(store.format().unwrap(), Some(FORMAT));
        let report = verify::verify(&store).unwrap();
        assert!(
            report.clean(),
            "{:?} {:?}",
            report.problems,
            report.repairable
        );
        assert_eq!(mismatches(&store, &summary).unwrap(), Vec::<String>::new());
        let hooks: u64 = summary.tenants.iter().map(|t| t.hooks).sum();
        let rows: u64 = summary.tenants.iter().map(|t| t.deliveries).sum();
        assert_eq!((report.hooks, report.deliveries), (hooks, rows));

        // Every state the module doc lists is there.
        let acme = &summary.tenants[0];
        let globex = &summary.tenants[1];
        assert_eq!((acme.id.as_str(), globex.id.as_str()), ("acme", "globex"));
        // acme: 4 due rows of format 1, 8 `audit` rows and the heads of lanes cus_B
        // (retrying) and keyless; cus_A's head is claimed.
        assert_eq!(
            (acme.due, acme.inflight, acme.dead, acme.archived),
            (16, 2, 1, 1)
        );
        assert_eq!(
            (
                acme.lanes,
                acme.lanes_blocked,
                acme.lane_members,
                acme.lane_markers
            ),
            (3, 1, 5, 1)
        );
        assert_eq!(
            (globex.due, globex.inflight, globex.dead, globex.archived),
            (2, 0, 1, 0)
        );
        assert_eq!(
            (globex.quarantined, globex.dedupe_keys, globex.deduped_total),
            (1, 1, 1)
        );
        assert_eq!(summary.last_seq, 20);
        let retry = super::super::deliveries::read_row(
            &store,
            RowId {
                ordinal: acme.ordinal,
                seq: 4,
                sink: 0,
            },
        )
        .unwrap()
        .unwrap();
        let retry = DeliveryRow::decode(&retry).unwrap();
        assert_eq!(retry.attempts, 1);
        assert_eq!(retry.last_error, "http 503: upstream unavailable");
        let mut kinds = Vec::new();
        let (start, end) = keys::family_range(Tag::Due, acme.ordinal);
        store
            .scan(CF_INDEX, &start, Some(&end), |_, value| {
                kinds.push(keys::parse_due_value(value).unwrap().1);
                Ok(true)
            })
            .unwrap();
        assert_eq!(kinds.iter().filter(|k| **k == DueKind::Retry).count(), 1);
        assert_eq!(
            kinds.iter().filter(|k| **k == DueKind::LaneRetry).count(),
            1
        );
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == DueKind::LaneFirstAttempt)
                .count(),
            1
        );
        for kind in [DueKind::ReplayFirstAttempt, DueKind::ReplayRetry] {
            assert_eq!(kinds.iter().filter(|k| **k == kind).count(), 1, "{kind:?}");
        }
        assert_eq!(store.instance_id().unwrap().as_deref(), Some(INSTANCE_ID));
    }

    /// Two builds hold the same keys and values, byte for byte.
    #[test]
    fn the_data_of_an_image_is_deterministic() {
        let scratch = tempfile::tempdir().unwrap();
        let first = build(&scratch.path().join("a")).unwrap();
        let second = build(&scratch.path().join("b")).unwrap();
        assert_eq!(first, second);
        let a = dump(&Store::open(&scratch.path().join("a")).unwrap());
        let b = dump(&Store::open(&scratch.path().join("b")).unwrap());
        assert!(a.len() > 30, "only {} entries", a.len());
        assert_eq!(a, b);
    }

    #[test]
    fn an_image_has_relative_names_and_no_logs() {
        let scratch = tempfile::tempdir().unwrap();
        let built = scratch.path().join("built");
        let summary = build(&built).unwrap();
        assert!(
            built.join("LOG").exists(),
            "RocksDB wrote no LOG to leave out"
        );
        let tarball = scratch.path().join("store.tar.gz");
        pack(&built, &summary, &tarball).unwrap();
        let mut archive = tar::Archive::new(GzDecoder::new(File::open(&tarball).unwrap()));
        let names: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names[0], SUMMARY_NAME);
        assert!(names.iter().any(|n| n == "CURRENT"), "{names:?}");
        for name in &names {
            assert!(!name.contains('/') && packed(name), "{name}");
        }
    }

    #[test]
    fn unpack_refuses_an_entry_outside_the_directory() {
        let scratch = tempfile::tempdir().unwrap();
        let tarball = scratch.path().join("evil.tar.gz");
        let gzip = GzBuilder::new().write(File::create(&tarball).unwrap(), Compression::fast());
        let mut archive = tar::Builder::new(gzip);
        let mut header = tar::Header::new_gnu();
        // `set_path` refuses `..`, so the name is written raw, as a hostile archive would.
        let name = b"../escaped";
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_size(1);
        header.set_mode(0o644);
        header.set_cksum();
        archive.append(&header, &b"x"[..]).unwrap();
        archive.into_inner().unwrap().finish().unwrap();

        let error = unpack(&tarball, &scratch.path().join("store")).unwrap_err();
        assert!(
            matches!(&error, FixtureError::Entry { name, .. } if name == "../escaped"),
            "{error}"
        );
        assert!(!scratch.path().join("escaped").exists());
    }

    #[test]
    fn only_the_current_format_is_built() {
        let scratch = tempfile::tempdir().unwrap();
        let error = generate(&scratch.path().join("x.tar.gz"), FORMAT + 1).unwrap_err();
        assert!(
            matches!(error, FixtureError::Format { asked, binary } if asked == FORMAT + 1 && binary == FORMAT)
        );
    }
}
