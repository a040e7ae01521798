//! Long operations as jobs: an archive replay or a DLQ revive or purge counts what it will touch,
//! then reports how much it has done as it goes, so the CLI can draw a progress bar and the
//! console a progress line while the work runs.
//!
//! Every replay, revive and purge is a job, whether its caller waits for the answer (the plain
//! API call) or takes `"background": true` and a 202 with the job to poll. Jobs run on the
//! admin's jobs pool, one thread: one job at a time, in the order they came, the others
//! `queued` meanwhile (one job at a time keeps a node's replay load what one tenant's
//! budget allows, and the order plain). The admin pool, which answers every other `/v1/`
//! request, stays free for them; a one-row revive or purge, quick and unbudgeted, runs there
//! as a job too. Reading a job (`GET /v1/jobs/{id}`) touches only its atomics, on no pool.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::Value;

use crate::admin::api::ApiError;
use crate::clock;

/// Finished jobs kept for reading back; older ones are forgotten first.
const FINISHED_KEPT: usize = 64;

/// `total` before the job has counted.
const UNCOUNTED: u64 = u64::MAX;

/// What a job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    ArchiveReplay,
    DlqRevive,
    DlqPurge,
    /// A store format migration at boot (see `admin::boot`).
    StoreMigration,
}

/// Where a job is in its life; only ever moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for the jobs pool (another job runs; jobs run one at a time).
    Queued = 0,
    /// Counting what it will touch: `total` is not known yet.
    Counting = 1,
    Running = 2,
    Done = 3,
    Failed = 4,
}

impl JobState {
    fn from_u8(value: u8) -> JobState {
        match value {
            0 => JobState::Queued,
            1 => JobState::Counting,
            2 => JobState::Running,
            3 => JobState::Done,
            _ => JobState::Failed,
        }
    }

    fn finished(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed)
    }
}

/// One job. The counters are written by the pool thread and read by any request.
#[derive(Debug)]
pub struct Job {
    id: u64,
    kind: JobKind,
    /// The request as the caller sent it (without `background`), to show what runs.
    request: Value,
    created_at_ms: u64,
    started_at_ms: AtomicU64,
    finished_at_ms: AtomicU64,
    state: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    /// The answer a waiting caller would have had, or the error.
    outcome: Mutex<Option<Result<Value, JobError>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

/// What `GET /v1/jobs/{id}` answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    pub id: u64,
    pub kind: JobKind,
    pub state: JobState,
    pub request: Value,
    /// Items handled so far (replayed or skipped hooks; revived, purged or skipped rows;
    /// records a migration visited).
    pub done: u64,
    /// Items the job found to handle; `null` while it counts.
    pub total: Option<u64>,
    /// Items per second since the job started running.
    pub rate_per_s: f64,
    /// Seconds left at that rate; `null` before a rate or a total exists.
    pub eta_s: Option<f64>,
    pub created_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub result: Option<Value>,
    pub error: Option<JobError>,
}

impl Job {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn state(&self) -> JobState {
        JobState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Called by the operation once it has counted: from here `done` moves toward it.
    pub fn set_total(&self, total: u64) {
        self.total
            .store(total.min(UNCOUNTED - 1), Ordering::Release);
        self.started_at_ms.store(clock::now_ms(), Ordering::Release);
        self.state.store(JobState::Running as u8, Ordering::Release);
    }

    /// Called after each committed step: `done` only grows.
    pub fn add_done(&self, items: u64) {
        self.done.fetch_add(items, Ordering::AcqRel);
    }

    pub(crate) fn begin(&self) {
        self.started_at_ms.store(clock::now_ms(), Ordering::Release);
        self.state
            .store(JobState::Counting as u8, Ordering::Release);
    }

    pub(crate) fn finish(&self, outcome: Result<Value, ApiError>) {
        let state = match &outcome {
            Ok(_) => {
                // Entries can leave between the count and the pass (retention, a purge):
                // a finished job shows the count it really handled, never a bar short of
                // its end.
                let done = self.done.load(Ordering::Acquire);
                self.total.store(done, Ordering::Release);
                JobState::Done
            }
            Err(_) => JobState::Failed,
        };
        *self.lock_outcome() = Some(outcome.map_err(|error| JobError {
            status: error.status,
            code: error.code,
            message: error.message,
        }));
        self.finished_at_ms
            .store(clock::now_ms(), Ordering::Release);
        self.state.store(state as u8, Ordering::Release);
    }

    fn lock_outcome(&self) -> std::sync::MutexGuard<'_, Option<Result<Value, JobError>>> {
        // Nothing panics while holding it (it only moves a value).
        self.outcome.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn view(&self) -> JobView {
        let state = self.state();
        let done = self.done.load(Ordering::Acquire);
        // Rows can join a selection between its count and its pass (a revive of a DLQ that
        // still grows): the total is never shown under what was done.
        let total = Some(self.total.load(Ordering::Acquire))
            .filter(|&total| total != UNCOUNTED)
            .map(|total| total.max(done));
        let started_at_ms = Some(self.started_at_ms.load(Ordering::Acquire)).filter(|&ms| ms > 0);
        let finished_at_ms = Some(self.finished_at_ms.load(Ordering::Acquire)).filter(|&ms| ms > 0);
        let rate_per_s = match started_at_ms {
            Some(started) => {
                let until = finished_at_ms.unwrap_or_else(clock::now_ms);
                let elapsed_s = until.saturating_sub(started) as f64 / 1000.0;
                if elapsed_s > 0.0 {
                    done as f64 / elapsed_s
                } else {
                    0.0
                }
            }
            None => 0.0,
        };
        let eta_s = match (state, total) {
            (JobState::Done, _) => Some(0.0),
            (JobState::Running, Some(total)) if rate_per_s > 0.0 => {
                Some(total.saturating_sub(done) as f64 / rate_per_s)
            }
            _ => None,
        };
        let (result, error) = match self.lock_outcome().clone() {
            Some(Ok(result)) => (Some(result), None),
            Some(Err(error)) => (None, Some(error)),
            None => (None, None),
        };
        JobView {
            id: self.id,
            kind: self.kind,
            state,
            request: self.request.clone(),
            done,
            total,
            rate_per_s,
            eta_s,
            created_at_ms: self.created_at_ms,
            started_at_ms,
            finished_at_ms,
            result,
            error,
        }
    }
}

/// The node's jobs: the running and queued ones, and the last [`FINISHED_KEPT`] finished.
#[derive(Debug, Default)]
pub struct Jobs {
    next_id: AtomicU64,
    recent: Mutex<VecDeque<Arc<Job>>>,
}

impl Jobs {
    pub fn new() -> Jobs {
        Jobs::default()
    }

    /// Registers a queued job.
    pub fn create(&self, kind: JobKind, request: Value) -> Arc<Job> {
        let job = Arc::new(Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            kind,
            request,
            created_at_ms: clock::now_ms(),
            started_at_ms: AtomicU64::new(0),
            finished_at_ms: AtomicU64::new(0),
            state: AtomicU8::new(JobState::Queued as u8),
            done: AtomicU64::new(0),
            total: AtomicU64::new(UNCOUNTED),
            outcome: Mutex::new(None),
        });
        let mut recent = self.lock();
        recent.push_back(job.clone());
        let finished = recent.iter().filter(|job| job.state().finished()).count();
        if finished > FINISHED_KEPT {
            let mut excess = finished - FINISHED_KEPT;
            recent.retain(|job| {
                if excess > 0 && job.state().finished() {
                    excess -= 1;
                    false
                } else {
                    true
                }
            });
        }
        job
    }

    /// Lists a job made before this list existed (the boot's store migration), and numbers
    /// later jobs after it.
    pub fn adopt(&self, job: Arc<Job>) {
        self.next_id.fetch_max(job.id, Ordering::Relaxed);
        self.lock().push_back(job);
    }

    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.lock().iter().find(|job| job.id == id).cloned()
    }

    /// Newest first.
    pub fn list(&self) -> Vec<JobView> {
        self.lock().iter().rev().map(|job| job.view()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Job>>> {
        // Nothing panics while holding it (it only moves handles).
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs `work` as `job` (on the pool its kind runs on): counting first,
/// then the pass, and records its answer or error.
pub fn run<T: Serialize>(
    job: &Job,
    work: impl FnOnce(&Job) -> Result<T, ApiError>,
) -> Result<Value, ApiError> {
    job.begin();
    let outcome = work(job).and_then(|answer| {
        serde_json::to_value(answer)
            .map_err(|error| ApiError::new(500, "internal", error.to_string()))
    });
    job.finish(outcome.clone());
    outcome
}

/// Marks a job that never ran (the pool closed first).
pub fn abandon(job: &Job, error: ApiError) {
    job.finish(Err(error));
}

/// Splits `"background": true` off a request body: the rest goes to the operation's own
/// parser, which refuses unknown fields.
pub fn split_background(body: &[u8]) -> Result<(bool, Vec<u8>, Value), ApiError> {
    let mut value: Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("bad JSON body: {error}")))?;
    let background = match value
        .as_object_mut()
        .and_then(|map| map.remove("background"))
    {
        None => false,
        Some(Value::Bool(flag)) => flag,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "background must be true or false, found {other}"
            )))
        }
    };
    let rest = serde_json::to_vec(&value)
        .map_err(|error| ApiError::new(500, "internal", error.to_string()))?;
    Ok((background, rest, value))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_job_counts_then_runs_and_ends_at_its_total() {
        let jobs = Jobs::new();
        let job = jobs.create(JobKind::ArchiveReplay, json!({"tenant": "acme"}));
        assert_eq!(job.view().state, JobState::Queued);
        assert_eq!(job.view().total, None);
        let answer = run(&job, |job| {
            assert_eq!(job.view().state, JobState::Counting);
            assert_eq!(job.view().total, None);
            job.set_total(10);
            job.add_done(4);
            let view = job.view();
            assert_eq!(
                (view.state, view.done, view.total),
                (JobState::Running, 4, Some(10))
            );
            job.add_done(5);
            Ok(json!({"replayed": 9, "skipped": 0}))
        })
        .unwrap();
        assert_eq!(answer, json!({"replayed": 9, "skipped": 0}));
        let view = jobs.get(job.id()).unwrap().view();
        // One entry left between the count and the pass: the finished job ends at 9 of 9.
        assert_eq!(
            (view.state, view.done, view.total),
            (JobState::Done, 9, Some(9))
        );
        assert_eq!(view.result, Some(answer));
        assert_eq!(view.eta_s, Some(0.0));
        assert!(view.finished_at_ms.is_some());
    }

    #[test]
    fn a_failed_job_keeps_its_error_and_what_it_did() {
        let jobs = Jobs::new();
        let job = jobs.create(JobKind::DlqRevive, json!({"all": true}));
        let error = run(&job, |job| -> Result<(), ApiError> {
            job.set_total(3);
            job.add_done(1);
            Err(ApiError::new(503, "store_unavailable", "disk"))
        })
        .unwrap_err();
        assert_eq!(error.code, "store_unavailable");
        let view = job.view();
        assert_eq!(
            (view.state, view.done, view.total),
            (JobState::Failed, 1, Some(3))
        );
        assert_eq!(view.error.unwrap().code, "store_unavailable");
        assert_eq!(view.result, None);
    }

    #[test]
    fn old_finished_jobs_are_forgotten_first_and_running_ones_never() {
        let jobs = Jobs::new();
        let running = jobs.create(JobKind::DlqRevive, json!({}));
        for _ in 0..FINISHED_KEPT + 5 {
            let job = jobs.create(JobKind::DlqRevive, json!({}));
            run(&job, |_| Ok(())).unwrap();
        }
        let listed = jobs.list();
        assert!(jobs.get(running.id()).is_some());
        // The newest job was created after the last trim, so one finished job too many
        // may remain until the next create.
        assert!(listed.len() <= FINISHED_KEPT + 2, "{}", listed.len());
        assert!(jobs.get(2).is_none(), "the oldest finished job is gone");
        assert!(
            listed.windows(2).all(|pair| pair[0].id > pair[1].id),
            "newest first"
        );
    }

    #[test]
    fn background_is_split_off_and_checked() {
        let (background, rest, request) =
            split_background(br#"{"tenant":"acme","background":true}"#).unwrap();
        assert!(background);
        assert_eq!(
            serde_json::from_slice::<Value>(&rest).unwrap(),
            json!({"tenant": "acme"})
        );
        assert_eq!(request, json!({"tenant": "acme"}));
        let (background, _, _) = split_background(br#"{"all":true}"#).unwrap();
        assert!(!background);
        let error = split_background(br#"{"background":"yes"}"#).unwrap_err();
        assert_eq!(
            error.message,
            "background must be true or false, found \"yes\""
        );
    }
}
