//! The admin API's requests and answers, sans-IO: the bearer-token check, query strings,
//! JSON bodies into typed requests, and the JSON shapes answered. Every refusal is an
//! [`ApiError`] with its status, a stable code and a message for the JSON error body, so
//! each one is unit-testable without a socket.

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// Rows a DLQ page holds when the client does not say.
pub const DLQ_LIMIT_DEFAULT: usize = 100;
/// The most rows one DLQ page may hold: a page is read in one job of the admin pool.
pub const DLQ_LIMIT_MAX: usize = 1000;

/// A refusal or failure of an admin request: status, stable code, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
    /// Every problem, when there are several (a reloaded config's), answered as
    /// `"problems": [...]` beside the message.
    pub problems: Vec<String>,
}

impl ApiError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            problems: Vec::new(),
        }
    }

    pub fn with_problems(mut self, problems: Vec<String>) -> ApiError {
        self.problems = problems;
        self
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "bad_request", message)
    }

    pub fn unknown_tenant(tenant: &str) -> ApiError {
        ApiError::new(
            404,
            "unknown_tenant",
            format!("no tenant named {tenant:?} in the config"),
        )
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> ApiError {
        ApiError::new(500, "store_error", error.to_string())
    }
}

/// Whether a request may use `/v1/`: always when no token is configured, else only with
/// `Authorization: Bearer <token>`. The comparison is constant-time, so the answer's
/// timing does not tell how much of a guess was right.
pub fn authorized(token: Option<&str>, authorization: Option<&[u8]>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let Some(value) = authorization else {
        return false;
    };
    const SCHEME: &[u8] = b"bearer ";
    // The scheme name is case-insensitive (RFC 9110 §11.1).
    let Some(presented) = value
        .get(..SCHEME.len())
        .filter(|scheme| scheme.eq_ignore_ascii_case(SCHEME))
        .map(|_| value[SCHEME.len()..].trim_ascii())
    else {
        return false;
    };
    presented.ct_eq(token.as_bytes()).into()
}

/// Splits a query string into decoded `(name, value)` pairs (`%XX` and `+` for a space).
pub fn parse_query(query: &[u8]) -> Result<Vec<(String, String)>, ApiError> {
    query
        .split(|byte| *byte == b'&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = match pair.iter().position(|byte| *byte == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, &b""[..]),
            };
            Ok((percent_decode(name)?, percent_decode(value)?))
        })
        .collect()
}

fn percent_decode(text: &[u8]) -> Result<String, ApiError> {
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        match text[at] {
            b'+' => out.push(b' '),
            b'%' => {
                let byte = text
                    .get(at + 1..at + 3)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                    .ok_or_else(|| ApiError::bad_request("malformed %-escape in the query"))?;
                out.push(byte);
                at += 2;
            }
            byte => out.push(byte),
        }
        at += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_request("the query is not UTF-8"))
}

/// A DLQ page cursor, `SEQ:SINK`: the last row a page examined (its seq and the slot of
/// its sink in the hook), so the next page starts right after it. Clients pass it back
/// as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub seq: u64,
    pub sink: u16,
}

impl Cursor {
    pub fn parse(text: &str) -> Result<Cursor, ApiError> {
        let bad = || ApiError::bad_request(format!("after: {text:?} is not a SEQ:SINK cursor"));
        let (seq, sink) = text.split_once(':').ok_or_else(bad)?;
        Ok(Cursor {
            seq: seq.parse().map_err(|_| bad())?,
            sink: sink.parse().map_err(|_| bad())?,
        })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.sink)
    }
}

/// `GET /v1/dlq?tenant=T[&source=S][&sink=ID][&reason=TEXT][&after=SEQ:SINK][&limit=N]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqQuery {
    pub tenant: String,
    pub source: Option<String>,
    pub sink: Option<String>,
    /// Rows whose reason contains this text (reasons are free text: `http 400: …`).
    pub reason: Option<String>,
    pub after: Option<Cursor>,
    pub limit: usize,
}

impl DlqQuery {
    pub fn parse(query: &[u8]) -> Result<DlqQuery, ApiError> {
        let mut tenant = None;
        let mut source = None;
        let mut sink = None;
        let mut reason = None;
        let mut after = None;
        let mut limit = DLQ_LIMIT_DEFAULT;
        for (name, value) in parse_query(query)? {
            match name.as_str() {
                "tenant" => tenant = Some(value),
                "source" => source = Some(value),
                "sink" => sink = Some(value),
                "reason" => reason = Some(value).filter(|reason| !reason.is_empty()),
                "after" if value.is_empty() => after = None,
                "after" => after = Some(Cursor::parse(&value)?),
                "limit" => limit = parse_limit(&value)?,
                // A misspelt filter would otherwise list everything.
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {name:?}; use tenant, source, sink, reason, after, limit"
                    )))
                }
            }
        }
        let tenant = tenant
            .filter(|tenant| !tenant.is_empty())
            .ok_or_else(|| ApiError::bad_request("tenant is required"))?;
        Ok(DlqQuery {
            tenant,
            source,
            sink,
            reason,
            after,
            limit,
        })
    }
}

/// Which dead rows a revive or purge takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// One row: a hook's seq and the sink id of its row.
    Row {
        tenant: String,
        seq: u64,
        sink: String,
    },
    /// Every dead row of a tenant, optionally only of one source and/or one sink id.
    Matching {
        tenant: String,
        source: Option<String>,
        sink: Option<String>,
    },
    /// Every dead row of every tenant.
    All,
}

/// The JSON body of a revive or purge, before its combination is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectorBody {
    tenant: Option<String>,
    seq: Option<u64>,
    source: Option<String>,
    sink: Option<String>,
    #[serde(default)]
    all: bool,
}

impl Selector {
    pub fn parse(body: &[u8]) -> Result<Selector, ApiError> {
        let body: SelectorBody = parse_json(body)?;
        if body.all {
            if body.tenant.is_some()
                || body.seq.is_some()
                || body.source.is_some()
                || body.sink.is_some()
            {
                return Err(ApiError::bad_request(
                    "all selects every tenant's rows; give it alone",
                ));
            }
            return Ok(Selector::All);
        }
        let tenant = body
            .tenant
            .filter(|tenant| !tenant.is_empty())
            .ok_or_else(|| ApiError::bad_request("tenant is required (or all: true)"))?;
        match body.seq {
            Some(seq) => {
                if body.source.is_some() {
                    return Err(ApiError::bad_request(
                        "seq selects one row: give tenant, seq and sink only",
                    ));
                }
                let sink = body
                    .sink
                    .ok_or_else(|| ApiError::bad_request("seq needs the sink id of the row"))?;
                Ok(Selector::Row { tenant, seq, sink })
            }
            None => Ok(Selector::Matching {
                tenant,
                source: body.source,
                sink: body.sink,
            }),
        }
    }
}

/// `POST /v1/archive/replay`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub tenant: String,
    pub source: String,
    /// Received at or after, Unix milliseconds.
    pub from_ms: u64,
    /// Received before, Unix milliseconds.
    pub to_ms: u64,
}

impl ReplayRequest {
    pub fn parse(body: &[u8]) -> Result<ReplayRequest, ApiError> {
        let request: ReplayRequest = parse_json(body)?;
        if request.from_ms > request.to_ms {
            return Err(ApiError::bad_request(format!(
                "from_ms ({}) is after to_ms ({})",
                request.from_ms, request.to_ms
            )));
        }
        Ok(request)
    }
}

fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("bad JSON body: {error}")))
}

/// One dead row as listed. Fields the row or its hook could not give (undecodable or
/// missing) are `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqItem {
    pub tenant: String,
    pub seq: u64,
    pub sink: Option<String>,
    pub source: Option<String>,
    pub reason: String,
    pub attempts: Option<u32>,
    pub last_error: Option<String>,
    pub received_at_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DlqPage {
    pub items: Vec<DlqItem>,
    /// Where the next page starts; `null` when the scan reached the end of the DLQ.
    pub next: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Revived {
    pub revived: u64,
    /// Selected rows that could not be revived: their delivery row is missing or
    /// undecodable (purge them instead).
    pub skipped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Purged {
    pub purged: u64,
    /// Hooks deleted because their last delivery row was purged.
    pub hooks_deleted: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Replayed {
    pub replayed: u64,
    /// Entries of the source that were not replayed: the source is no longer configured
    /// (or no longer serves the tenant), or the entry is undecodable.
    pub skipped: u64,
}

/// Counter values by name (`store::keys::Counter::name`).
pub type Counters = std::collections::BTreeMap<&'static str, i64>;

/// A circuit breaker that is not closed: its sink's due rows are parked (open), or one
/// probe attempt is let through (half-open). Read from the pipeline cores' memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerInfo {
    pub source: String,
    pub sink: String,
    /// The sink's kind (`http`, `redis`, …).
    pub kind: &'static str,
    /// `open` or `half_open`.
    pub state: &'static str,
    /// When it opened from closed (a failed probe does not move it), Unix ms.
    pub since_ms: u64,
    /// While open: when the next probe may go, Unix ms. `null` while half-open.
    pub next_probe_ms: Option<u64>,
    /// Failed attempts in a row: those that opened it, and each failed probe since.
    pub consecutive_failures: u32,
    /// The pipeline core that keeps it (each core has its own breaker per sink).
    pub core: usize,
    /// The tenant of its source; `null` for a `tenant_from: path` source, whose breaker
    /// parks the rows of every tenant its core moves.
    pub tenant: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantStats {
    pub id: String,
    pub ordinal: u32,
    #[serde(flatten)]
    pub counters: Counters,
    /// The breakers not closed that park this tenant's rows, and how many.
    pub breakers_open: usize,
    pub breakers: Vec<BreakerInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub node: Counters,
    pub tenants: Vec<TenantStats>,
    /// Every breaker of the node that is not closed (a shared source's counted once per
    /// core), and how many.
    pub breakers_open: usize,
    pub breakers: Vec<BreakerInfo>,
}

/// `GET /v1/quarantine?tenant=T[&after=SEQ][&limit=N]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineQuery {
    pub tenant: String,
    pub after: Option<u64>,
    pub limit: usize,
}

impl QuarantineQuery {
    pub fn parse(query: &[u8]) -> Result<QuarantineQuery, ApiError> {
        let mut tenant = None;
        let mut after = None;
        let mut limit = DLQ_LIMIT_DEFAULT;
        for (name, value) in parse_query(query)? {
            match name.as_str() {
                "tenant" => tenant = Some(value),
                "after" if value.is_empty() => after = None,
                "after" => {
                    after = Some(value.parse().map_err(|_| {
                        ApiError::bad_request(format!("after: {value:?} is not a seq"))
                    })?)
                }
                "limit" => limit = parse_limit(&value)?,
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {name:?}; use tenant, after, limit"
                    )))
                }
            }
        }
        let tenant = tenant
            .filter(|tenant| !tenant.is_empty())
            .ok_or_else(|| ApiError::bad_request("tenant is required"))?;
        Ok(QuarantineQuery {
            tenant,
            after,
            limit,
        })
    }
}

fn parse_limit(value: &str) -> Result<usize, ApiError> {
    value
        .parse()
        .ok()
        .filter(|limit| (1..=DLQ_LIMIT_MAX).contains(limit))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "limit: {value:?} is not a number from 1 to {DLQ_LIMIT_MAX}"
            ))
        })
}

/// One hook of a tenant, by seq: the body of a quarantine show, release or delete.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookRef {
    pub tenant: String,
    pub seq: u64,
}

impl HookRef {
    pub fn parse(body: &[u8]) -> Result<HookRef, ApiError> {
        parse_json(body)
    }

    /// From a query string: `tenant=T&seq=N`.
    pub fn from_query(query: &[u8]) -> Result<HookRef, ApiError> {
        let mut tenant = None;
        let mut seq = None;
        for (name, value) in parse_query(query)? {
            match name.as_str() {
                "tenant" => tenant = Some(value),
                "seq" => {
                    seq = Some(value.parse().map_err(|_| {
                        ApiError::bad_request(format!("seq: {value:?} is not a seq"))
                    })?)
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {name:?}; use tenant, seq"
                    )))
                }
            }
        }
        match (tenant, seq) {
            (Some(tenant), Some(seq)) if !tenant.is_empty() => Ok(HookRef { tenant, seq }),
            _ => Err(ApiError::bad_request("tenant and seq are required")),
        }
    }
}

/// One quarantined hook as listed. Fields its hook row could not give are `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantineItem {
    pub tenant: String,
    pub seq: u64,
    pub source: Option<String>,
    pub reason: String,
    pub received_at_ms: Option<u64>,
    pub body_bytes: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantinePage {
    pub items: Vec<QuarantineItem>,
    /// The `after` of the next page; `null` at the end.
    pub next: Option<u64>,
}

/// One quarantined hook with its stored headers and body (UTF-8, lossy; `body_base64`
/// holds the exact bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantineDetail {
    #[serde(flatten)]
    pub item: QuarantineItem,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub body_base64: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Released {
    /// The quarantined hook's seq.
    pub seq: u64,
    /// The new hook's seq, or, for a repeat inside its dedupe window, `null`…
    pub new_seq: Option<u64>,
    /// …and the seq of the hook it repeats.
    pub duplicate_of: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Deleted {
    pub seq: u64,
}

/// A tenant, its bounds and its counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantInfo {
    pub id: String,
    pub ordinal: u32,
    /// Named in the config file; else created by an `auto_tenants` source.
    pub declared: bool,
    pub max_pending: u64,
    pub max_bytes: u64,
    pub max_quarantined: u64,
    /// The replay budget: hooks or rows per second a replay or revive may inject…
    pub replay_rate_per_s: u64,
    /// …and how many of them may wait for their first attempt at once.
    pub replay_max_pending: u64,
    /// …and how many of their attempts may run at once per sink.
    pub replay_concurrency: u64,
    pub counters: Counters,
    /// The breakers not closed that park this tenant's rows, and how many (as in
    /// `/v1/stats`).
    pub breakers_open: usize,
    pub breakers: Vec<BreakerInfo>,
}

/// `POST /v1/tenants/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeTenant {
    pub tenant: String,
}

impl PurgeTenant {
    pub fn parse(body: &[u8]) -> Result<PurgeTenant, ApiError> {
        parse_json(body)
    }
}

/// What a tenant purge erased.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantPurged {
    pub tenant: String,
    /// The erased ordinal; never assigned again.
    pub ordinal: u32,
    /// A declared tenant is served on under a new ordinal; an auto tenant is gone.
    pub new_ordinal: Option<u32>,
    /// The tenant's counters at the purge, taken off the node aggregate.
    pub counters: Counters,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantList {
    pub tenants: Vec<TenantInfo>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_checked_only_when_set() {
        fn check(token: Option<&str>, header: Option<&str>, expected: bool) {
            let header = header.map(str::as_bytes);
            assert_eq!(authorized(token, header), expected, "{token:?} {header:?}");
        }
        check(None, None, true);
        check(None, Some("Bearer anything"), true);
        check(Some("s3cret"), None, false);
        check(Some("s3cret"), Some("Bearer s3cret"), true);
        check(Some("s3cret"), Some("bearer  s3cret "), true);
        check(Some("s3cret"), Some("Bearer s3cre"), false);
        check(Some("s3cret"), Some("Bearer s3cretx"), false);
        check(Some("s3cret"), Some("Basic s3cret"), false);
        check(Some("s3cret"), Some("s3cret"), false);
    }

    fn check_query(query: &str, expected: Result<DlqQuery, u16>) {
        let parsed = DlqQuery::parse(query.as_bytes()).map_err(|error| error.status);
        assert_eq!(parsed, expected, "{query}");
    }

    #[test]
    fn dlq_queries() {
        let base = DlqQuery {
            tenant: "acme".into(),
            source: None,
            sink: None,
            reason: None,
            after: None,
            limit: DLQ_LIMIT_DEFAULT,
        };
        check_query("tenant=acme", Ok(base.clone()));
        check_query(
            "tenant=ac%2Dme&source=a+b&sink=http-1&reason=http+4&after=12:3&limit=2",
            Ok(DlqQuery {
                tenant: "ac-me".into(),
                source: Some("a b".into()),
                sink: Some("http-1".into()),
                reason: Some("http 4".into()),
                after: Some(Cursor { seq: 12, sink: 3 }),
                limit: 2,
            }),
        );
        check_query("tenant=acme&after=", Ok(base));
        check_query("", Err(400));
        check_query("tenant=acme&limit=0", Err(400));
        check_query("tenant=acme&limit=1001", Err(400));
        check_query("tenant=acme&after=12", Err(400));
        check_query("tenant=acme&after=x:1", Err(400));
        check_query("tenant=acme&sorce=demo", Err(400));
        check_query("tenant=%zz", Err(400));
        assert_eq!(Cursor { seq: 7, sink: 1 }.to_string(), "7:1");
    }

    fn check_selector(body: &str, expected: Result<Selector, u16>) {
        let parsed = Selector::parse(body.as_bytes()).map_err(|error| error.status);
        assert_eq!(parsed, expected, "{body}");
    }

    #[test]
    fn selectors() {
        check_selector(
            r#"{"tenant":"acme","seq":4,"sink":"http"}"#,
            Ok(Selector::Row {
                tenant: "acme".into(),
                seq: 4,
                sink: "http".into(),
            }),
        );
        check_selector(
            r#"{"tenant":"acme","source":"demo"}"#,
            Ok(Selector::Matching {
                tenant: "acme".into(),
                source: Some("demo".into()),
                sink: None,
            }),
        );
        check_selector(
            r#"{"tenant":"acme"}"#,
            Ok(Selector::Matching {
                tenant: "acme".into(),
                source: None,
                sink: None,
            }),
        );
        check_selector(r#"{"all":true}"#, Ok(Selector::All));
        check_selector(r#"{"all":true,"tenant":"acme"}"#, Err(400));
        check_selector(r#"{"tenant":"acme","seq":4}"#, Err(400));
        check_selector(
            r#"{"tenant":"acme","seq":4,"sink":"h","source":"s"}"#,
            Err(400),
        );
        check_selector(r#"{"source":"demo"}"#, Err(400));
        check_selector(r#"{"tenant":"acme","tennant":"x"}"#, Err(400));
        check_selector("{", Err(400));
        check_selector("", Err(400));
    }

    #[test]
    fn replay_requests() {
        let parsed =
            ReplayRequest::parse(br#"{"tenant":"acme","source":"demo","from_ms":1,"to_ms":2}"#)
                .unwrap();
        assert_eq!(parsed.from_ms, 1);
        assert_eq!(parsed.to_ms, 2);
        for bad in [
            r#"{"tenant":"acme","source":"demo","from_ms":3,"to_ms":2}"#,
            r#"{"tenant":"acme","source":"demo","from_ms":1}"#,
            r#"{"tenant":"acme","source":"demo","from_ms":-1,"to_ms":2}"#,
        ] {
            assert_eq!(
                ReplayRequest::parse(bad.as_bytes()).map_err(|e| e.status),
                Err(400),
                "{bad}"
            );
        }
    }

    #[test]
    fn stats_flatten_the_counters_beside_the_tenant() {
        let stats = Stats {
            node: Counters::from([("dead", 2)]),
            tenants: vec![TenantStats {
                id: "acme".into(),
                ordinal: 1,
                counters: Counters::from([("dead", 2)]),
                breakers_open: 0,
                breakers: Vec::new(),
            }],
            breakers_open: 0,
            breakers: Vec::new(),
        };
        assert_eq!(
            serde_json::to_string(&stats).unwrap(),
            r#"{"node":{"dead":2},"tenants":[{"id":"acme","ordinal":1,"dead":2,"breakers_open":0,"breakers":[]}],"breakers_open":0,"breakers":[]}"#
        );
    }
}
