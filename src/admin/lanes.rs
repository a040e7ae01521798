//! `GET /v1/lanes?tenant=T[&sink=ID][&blocked=true][&after=LANE][&limit=N]`: a tenant's
//! busy ordering lanes (those with a head), a page at a time, each with its head's
//! attempts and last error and how many members wait behind it.
//!
//! Every read is bounded: a page examines at most [`LANES_SCAN_FACTOR`] heads per lane it
//! may return (a narrow filter answers a short page with a cursor, as the DLQ does), and
//! counts each lane's members up to [`MEMBERS_COUNT_MAX`]. The lane families are read
//! through `store::deliveries::lanes`, which owns them.

use serde::Serialize;

use crate::store::codec::{DeliveryRow, HookRecord};
use crate::store::deliveries::{self, lanes, RowId};
use crate::store::keys::LaneId;

use super::api::{parse_query, ApiError};
use super::operations::Operations;

pub const LANES_LIMIT_DEFAULT: usize = 50;
/// Each lane listed costs a few point reads and a member count; a page stays small.
pub const LANES_LIMIT_MAX: usize = 200;
/// Heads examined per lane a page may return.
const LANES_SCAN_FACTOR: usize = 10;
/// Members counted per lane; past it the answer says `members_more`.
pub const MEMBERS_COUNT_MAX: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanesQuery {
    pub tenant: String,
    /// Only lanes of this sink id.
    pub sink: Option<String>,
    /// Only lanes whose head waits for a retry.
    pub blocked: bool,
    pub after: Option<LaneId>,
    pub limit: usize,
}

impl LanesQuery {
    pub fn parse(query: &[u8]) -> Result<LanesQuery, ApiError> {
        let mut tenant = None;
        let mut sink = None;
        let mut blocked = false;
        let mut after = None;
        let mut limit = LANES_LIMIT_DEFAULT;
        for (name, value) in parse_query(query)? {
            match name.as_str() {
                "tenant" => tenant = Some(value),
                "sink" => sink = Some(value).filter(|sink| !sink.is_empty()),
                "blocked" => {
                    blocked = match value.as_str() {
                        "true" => true,
                        "false" | "" => false,
                        _ => {
                            return Err(ApiError::bad_request(format!(
                                "blocked: {value:?} is not true or false"
                            )))
                        }
                    }
                }
                "after" if value.is_empty() => after = None,
                "after" => after = Some(parse_lane(&value)?),
                "limit" => {
                    limit = value
                        .parse()
                        .ok()
                        .filter(|limit| (1..=LANES_LIMIT_MAX).contains(limit))
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "limit: {value:?} is not a number from 1 to {LANES_LIMIT_MAX}"
                            ))
                        })?
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {name:?}; use tenant, sink, blocked, after, limit"
                    )))
                }
            }
        }
        let tenant = tenant
            .filter(|tenant| !tenant.is_empty())
            .ok_or_else(|| ApiError::bad_request("tenant is required"))?;
        Ok(LanesQuery {
            tenant,
            sink,
            blocked,
            after,
            limit,
        })
    }
}

fn parse_lane(text: &str) -> Result<LaneId, ApiError> {
    let mut lane = LaneId::default();
    hex::decode_to_slice(text, &mut lane)
        .map_err(|_| ApiError::bad_request(format!("after: {text:?} is not a lane id")))?;
    Ok(lane)
}

/// One busy lane. Fields its head row or hook cannot give (undecodable) are `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneItem {
    /// The lane id, hex: the page cursor.
    pub lane: String,
    pub source: Option<String>,
    pub sink: Option<String>,
    /// Empty in the sink's keyless lane.
    pub ordering_key: Option<String>,
    pub head_seq: u64,
    /// `in_flight` (an attempt runs), `retrying` (attempted, waiting for its next
    /// attempt: the lane is blocked) or `due` (not attempted yet, or parked behind an
    /// open breaker).
    pub state: &'static str,
    pub attempts: Option<u32>,
    pub first_attempt_at_ms: Option<u64>,
    pub last_error: Option<String>,
    /// Members waiting behind the head, counted up to [`MEMBERS_COUNT_MAX`]…
    pub members_waiting: usize,
    /// …and whether there are more than that.
    pub members_more: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LanePage {
    pub items: Vec<LaneItem>,
    /// The `after` of the next page; `null` when the scan reached the last lane.
    pub next: Option<String>,
}

impl Operations {
    pub fn list_lanes(&self, query: &LanesQuery) -> Result<LanePage, ApiError> {
        let ordinal = self
            .tenants
            .snapshot()
            .get(&query.tenant)
            .map(|tenant| tenant.ordinal)
            .ok_or_else(|| ApiError::unknown_tenant(&query.tenant))?;
        let examine_max = query.limit.saturating_mul(LANES_SCAN_FACTOR);
        let mut items = Vec::new();
        let mut examined = 0usize;
        let mut last = None;
        let mut next = None;
        lanes::headed_lanes(&self.store, ordinal, query.after.as_ref(), |headed| {
            // Stopping only once another head exists: `next` is null exactly at the end.
            if items.len() == query.limit || examined == examine_max {
                next = last;
                return Ok(false);
            }
            examined += 1;
            last = Some(headed.lane);
            let id = RowId {
                ordinal,
                seq: headed.seq,
                sink: headed.sink,
            };
            let row = deliveries::read_row(&self.store, id)?
                .and_then(|bytes| DeliveryRow::decode(&bytes).ok());
            if let Some(sink) = &query.sink {
                if row.as_ref().is_none_or(|row| &row.sink_id != sink) {
                    return Ok(true);
                }
            }
            let state = if deliveries::is_inflight(&self.store, id)? {
                "in_flight"
            } else if row.as_ref().is_some_and(|row| row.attempts > 0) {
                "retrying"
            } else {
                "due"
            };
            if query.blocked && state != "retrying" {
                return Ok(true);
            }
            let source = deliveries::read_hook(&self.store, ordinal, headed.seq)?
                .and_then(|bytes| HookRecord::decode(&bytes).ok())
                .map(|hook| hook.source_id);
            let waiting =
                lanes::members_waiting(&self.store, ordinal, &headed.lane, MEMBERS_COUNT_MAX + 1)?;
            items.push(LaneItem {
                lane: hex::encode(headed.lane),
                source,
                sink: row.as_ref().map(|row| row.sink_id.clone()),
                ordering_key: row
                    .as_ref()
                    .and_then(|row| row.lane.as_ref())
                    .map(|lane| lane.ordering_key.clone()),
                head_seq: headed.seq,
                state,
                attempts: row.as_ref().map(|row| row.attempts),
                first_attempt_at_ms: row
                    .as_ref()
                    .map(|row| row.first_attempt_at_ms)
                    .filter(|at| *at > 0),
                last_error: row
                    .as_ref()
                    .map(|row| row.last_error.clone())
                    .filter(|error| !error.is_empty()),
                members_waiting: waiting.min(MEMBERS_COUNT_MAX),
                members_more: waiting > MEMBERS_COUNT_MAX,
            });
            Ok(true)
        })?;
        Ok(LanePage {
            items,
            next: next.map(hex::encode),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(query: &str, expected: Result<(bool, Option<&str>, usize), u16>) {
        let parsed = LanesQuery::parse(query.as_bytes())
            .map(|query| (query.blocked, query.after.map(hex::encode), query.limit))
            .map_err(|error| error.status);
        let expected =
            expected.map(|(blocked, after, limit)| (blocked, after.map(str::to_owned), limit));
        assert_eq!(parsed, expected, "{query}");
    }

    #[test]
    fn lanes_queries() {
        let lane = "00112233445566778899aabbccddeeff";
        check("tenant=acme", Ok((false, None, LANES_LIMIT_DEFAULT)));
        check(
            &format!("tenant=acme&blocked=true&sink=http&after={lane}&limit=3"),
            Ok((true, Some(lane), 3)),
        );
        check("tenant=acme&after=", Ok((false, None, LANES_LIMIT_DEFAULT)));
        check("", Err(400));
        check("tenant=acme&after=0011", Err(400));
        check(
            "tenant=acme&after=zz112233445566778899aabbccddeeff",
            Err(400),
        );
        check("tenant=acme&blocked=yes", Err(400));
        check("tenant=acme&limit=0", Err(400));
        check("tenant=acme&limit=201", Err(400));
        check("tenant=acme&sinks=http", Err(400));
    }
}
