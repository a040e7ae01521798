//! The `ankusa` verbs that talk to a running gateway over its admin API: `dlq list`,
//! `dlq revive`, `dlq purge`, `archive replay`, `quarantine list|show|release|delete`,
//! `tenants list|stats` and `stats`. This module owns their
//! command-line arguments (clap) and a small blocking HTTP client (`ureq`); `main` only
//! hands over. Each verb prints the answer and exits 0, or prints the API's error and
//! exits 1.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use thiserror::Error;

/// Where the admin listener is when the config does not move it.
pub const ADMIN_URL_DEFAULT: &str = "http://127.0.0.1:9090";
/// The environment variable the token is read from when `--token` is not given.
pub const TOKEN_ENV: &str = "ANKUSA_ADMIN_TOKEN";

/// How to reach the admin API.
#[derive(Debug, Clone, Args)]
pub struct AdminOptions {
    /// Base URL of the gateway's admin listener (instance.admin_listen).
    #[arg(long, value_name = "URL", default_value = ADMIN_URL_DEFAULT)]
    pub admin: String,
    /// Bearer token of the admin API (instance.admin_token); default: $ANKUSA_ADMIN_TOKEN.
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
}

/// Which dead rows a revive or purge takes: one row, a tenant's rows (optionally of one
/// source and/or sink), or every row of every tenant.
#[derive(Debug, Clone, Args)]
pub struct RowSelection {
    /// The tenant whose dead rows are taken.
    #[arg(long, value_name = "TENANT", required_unless_present = "all")]
    pub tenant: Option<String>,
    /// One hook's row: its seq (with --sink naming the row).
    #[arg(long, value_name = "N", requires = "sink", conflicts_with = "source")]
    pub seq: Option<u64>,
    /// Only rows of hooks that came in through this source.
    #[arg(long, value_name = "SOURCE")]
    pub source: Option<String>,
    /// Only rows of this sink id.
    #[arg(long, value_name = "ID")]
    pub sink: Option<String>,
    /// Every dead row of every tenant.
    #[arg(long, conflicts_with_all = ["tenant", "seq", "source", "sink"])]
    pub all: bool,
}

impl RowSelection {
    fn body(&self) -> Value {
        if self.all {
            return json!({ "all": true });
        }
        let mut body = serde_json::Map::new();
        let mut put = |name: &str, value: Option<Value>| {
            if let Some(value) = value {
                body.insert(name.to_owned(), value);
            }
        };
        put("tenant", self.tenant.clone().map(Value::from));
        put("seq", self.seq.map(Value::from));
        put("source", self.source.clone().map(Value::from));
        put("sink", self.sink.clone().map(Value::from));
        Value::Object(body)
    }
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List a tenant's dead-lettered rows, oldest first, one page at a time; the last line
    /// is the cursor of the next page.
    #[command(after_help = "Examples:
  ankusa dlq list --tenant acme
  ankusa dlq list --tenant acme --source stripe --limit 50 --after 1042:http    # the next page")]
    List {
        /// The tenant whose DLQ is listed.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Only rows of hooks that came in through this source.
        #[arg(long, value_name = "SOURCE")]
        source: Option<String>,
        /// Only rows of this sink id.
        #[arg(long, value_name = "ID")]
        sink: Option<String>,
        /// Rows per page (at most 1000).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        /// Start after this cursor (the `next:` of the previous page).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Revive dead rows: each becomes a new first attempt, due now, with a fresh retry
    /// horizon. Runs as an admin job: a progress bar shows on a terminal until it is done.
    #[command(after_help = "Examples:
  ankusa dlq revive --tenant acme --source stripe
  ankusa dlq revive --tenant acme --seq 1042 --sink http    # one row
  ankusa dlq revive --all                                   # every row of every tenant")]
    Revive {
        #[command(flatten)]
        selection: RowSelection,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Purge dead rows for good; a hook left without rows is deleted with them.
    #[command(after_help = "Examples:
  ankusa dlq purge --tenant acme --sink http-1
  ankusa dlq purge --tenant acme --seq 1042 --sink http     # one row
  ankusa dlq purge --all                                    # every row of every tenant")]
    Purge {
        #[command(flatten)]
        selection: RowSelection,
        #[command(flatten)]
        admin: AdminOptions,
    },
}

#[derive(Debug, Subcommand)]
pub enum ArchiveCommand {
    /// Replay a tenant's delivered hooks of one source received in [--from, --to) (Unix
    /// milliseconds): each is ingested again as a new hook, with a new seq, for the
    /// sinks its source has now. Runs as an admin job: a progress bar shows on a terminal
    /// until it is done.
    #[command(after_help = "Examples:
  ankusa archive replay --tenant acme --source stripe --from 1718000000000 --to 1718003600000")]
    Replay {
        /// The tenant whose archive is read.
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Only hooks that came in through this source; it must still be configured.
        #[arg(long, value_name = "SOURCE")]
        source: String,
        /// Received at or after, Unix milliseconds.
        #[arg(long, value_name = "MS")]
        from: u64,
        /// Received before, Unix milliseconds.
        #[arg(long, value_name = "MS")]
        to: u64,
        #[command(flatten)]
        admin: AdminOptions,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// List a tenant's quarantined hooks (failed verification or decoding), oldest first;
    /// the last line is the `--after` of the next page.
    #[command(after_help = "Examples:
  ankusa quarantine list --tenant acme
  ankusa quarantine list --tenant acme --limit 50 --after 1042    # the next page")]
    List {
        #[arg(long, value_name = "TENANT")]
        tenant: String,
        /// Hooks after this seq (the previous page's `next`).
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
        /// Hooks per page, 1 to 1000.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Print one quarantined hook: reason, stored headers and body.
    #[command(after_help = "Examples:
  ankusa quarantine show --tenant acme --seq 1042")]
    Show {
        #[command(flatten)]
        hook: HookArgs,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Release a quarantined hook: it is ingested again as a new hook of its source
    /// (without verification; dedupe applies) and delivered to its sinks.
    #[command(after_help = "Examples:
  ankusa quarantine release --tenant acme --seq 1042")]
    Release {
        #[command(flatten)]
        hook: HookArgs,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Delete a quarantined hook for good.
    #[command(after_help = "Examples:
  ankusa quarantine delete --tenant acme --seq 1042")]
    Delete {
        #[command(flatten)]
        hook: HookArgs,
        #[command(flatten)]
        admin: AdminOptions,
    },
}

/// One hook of a tenant.
#[derive(Debug, Clone, Args)]
pub struct HookArgs {
    #[arg(long, value_name = "TENANT")]
    pub tenant: String,
    #[arg(long, value_name = "SEQ")]
    pub seq: u64,
}

#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// List every tenant, declared and auto, with its bounds and counters.
    #[command(after_help = "Examples:
  ankusa tenants list
  ankusa tenants list --admin http://10.0.0.5:9090    # the token from $ANKUSA_ADMIN_TOKEN")]
    List {
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Print one tenant's bounds and counters.
    #[command(after_help = "Examples:
  ankusa tenants stats acme")]
    Stats {
        tenant: String,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Erase a tenant: every hook, delivery row, DLQ entry, quarantined hook, archive entry,
    /// dedupe entry and counter of it, in one batch. A declared tenant is served on under a
    /// new ordinal; an auto tenant is gone. Cannot be undone.
    #[command(after_help = "Examples:
  ankusa tenants purge acme --yes")]
    Purge {
        tenant: String,
        /// Confirms the erase.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        admin: AdminOptions,
    },
}

/// Why a verb failed.
#[derive(Debug, Error)]
pub enum CliError {
    #[error("cannot reach the admin API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{status} {code}: {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    #[error("the admin API answered something that is not the expected JSON: {0}")]
    BadAnswer(String),
}

pub fn dlq(command: DlqCommand) -> ExitCode {
    finish(match command {
        DlqCommand::List {
            tenant,
            source,
            sink,
            limit,
            after,
            admin,
        } => {
            let limit = limit.to_string();
            let mut query = vec![("tenant", tenant.as_str()), ("limit", limit.as_str())];
            query.extend(source.as_deref().map(|source| ("source", source)));
            query.extend(sink.as_deref().map(|sink| ("sink", sink)));
            query.extend(after.as_deref().map(|after| ("after", after)));
            Client::new(&admin)
                .get("/v1/dlq", &query)
                .and_then(|page| print_page(&page))
        }
        DlqCommand::Revive { selection, admin } => Client::new(&admin)
            .run_job("/v1/dlq/revive", selection.body(), "reviving")
            .map(|answer| println!("{answer}")),
        DlqCommand::Purge { selection, admin } => Client::new(&admin)
            .run_job("/v1/dlq/purge", selection.body(), "purging")
            .map(|answer| println!("{answer}")),
    })
}

pub fn archive(command: ArchiveCommand) -> ExitCode {
    finish(match command {
        ArchiveCommand::Replay {
            tenant,
            source,
            from,
            to,
            admin,
        } => Client::new(&admin)
            .run_job(
                "/v1/archive/replay",
                json!({ "tenant": tenant, "source": source, "from_ms": from, "to_ms": to }),
                "replaying",
            )
            .map(|answer| println!("{answer}")),
    })
}

pub fn quarantine(command: QuarantineCommand) -> ExitCode {
    finish(match command {
        QuarantineCommand::List {
            tenant,
            after,
            limit,
            admin,
        } => {
            let limit = limit.to_string();
            let after = after.map(|after| after.to_string());
            let mut query = vec![("tenant", tenant.as_str()), ("limit", limit.as_str())];
            query.extend(after.as_deref().map(|after| ("after", after)));
            Client::new(&admin)
                .get("/v1/quarantine", &query)
                .and_then(|page| print_quarantine_page(&page))
        }
        QuarantineCommand::Show { hook, admin } => {
            let seq = hook.seq.to_string();
            Client::new(&admin)
                .get(
                    "/v1/quarantine/hook",
                    &[("tenant", hook.tenant.as_str()), ("seq", seq.as_str())],
                )
                .map(|answer| print_pretty(&answer))
        }
        QuarantineCommand::Release { hook, admin } => Client::new(&admin)
            .post(
                "/v1/quarantine/release",
                &json!({ "tenant": hook.tenant, "seq": hook.seq }),
            )
            .map(|answer| println!("{answer}")),
        QuarantineCommand::Delete { hook, admin } => Client::new(&admin)
            .post(
                "/v1/quarantine/delete",
                &json!({ "tenant": hook.tenant, "seq": hook.seq }),
            )
            .map(|answer| println!("{answer}")),
    })
}

pub fn tenants(command: TenantsCommand) -> ExitCode {
    finish(match command {
        TenantsCommand::List { admin } => Client::new(&admin)
            .get("/v1/tenants", &[])
            .map(|answer| print_pretty(&answer)),
        TenantsCommand::Stats { tenant, admin } => Client::new(&admin)
            .get(&format!("/v1/tenants/{tenant}"), &[])
            .map(|answer| print_pretty(&answer)),
        TenantsCommand::Purge {
            tenant, yes: false, ..
        } => Err(CliError::Refused {
            status: 0,
            code: "not_confirmed".into(),
            message: format!("purging tenant {tenant:?} erases all of its data; add --yes"),
        }),
        TenantsCommand::Purge {
            tenant,
            yes: true,
            admin,
        } => Client::new(&admin)
            .post("/v1/tenants/purge", &json!({ "tenant": tenant }))
            .map(|answer| print_pretty(&answer)),
    })
}

fn print_pretty(answer: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(answer).unwrap_or_else(|_| answer.to_string())
    )
}

/// One line per hook, then the `--after` of the next page.
fn print_quarantine_page(page: &Value) -> Result<(), CliError> {
    let items = page["items"]
        .as_array()
        .ok_or_else(|| CliError::BadAnswer(page.to_string()))?;
    for item in items {
        println!(
            "{tenant} seq={seq} source={source} received_at_ms={received} bytes={bytes} reason={reason}",
            tenant = text(&item["tenant"]),
            seq = text(&item["seq"]),
            source = text(&item["source"]),
            received = text(&item["received_at_ms"]),
            bytes = text(&item["body_bytes"]),
            reason = text(&item["reason"]),
        );
    }
    match page["next"].as_u64() {
        Some(next) => println!("next: --after {next}"),
        None => println!("next: none ({} hooks; end of the quarantine)", items.len()),
    }
    Ok(())
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "?".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

pub fn stats(admin: AdminOptions) -> ExitCode {
    finish(
        Client::new(&admin)
            .get("/v1/stats", &[])
            .map(|answer| print_pretty(&answer)),
    )
}

/// How often a followed job is read: often enough for a smooth bar, rare enough to cost
/// the admin listener nothing.
/// `ankusa store migrate`: opens the store at `data_dir` (the gateway stopped), runs the
/// migrations up to this binary's format with a progress bar on stderr, and says what it
/// did. `serve` runs the same migrations at start; this runs them ahead, and watched.
pub fn store_migrate(data_dir: &std::path::Path) -> ExitCode {
    use crate::store::{migrate, Store, FORMAT};
    let before = match Store::open_existing(data_dir).and_then(|store| store.format()) {
        Ok(format) => format.unwrap_or(0),
        Err(error) => {
            eprintln!("ankusa: {error}");
            return ExitCode::FAILURE;
        }
    };
    if before == FORMAT {
        println!(
            "store at {} is at format {FORMAT}: nothing to migrate",
            data_dir.display()
        );
        return ExitCode::SUCCESS;
    }
    struct Bar(indicatif::ProgressBar);
    impl migrate::Progress for Bar {
        fn step(&self, from: u32, to: u32, total: u64) {
            self.0.set_message(format!("format {from} → {to}"));
            self.0.set_position(0);
            self.0.set_length(total);
        }
        fn advance(&self, records: u64) {
            self.0.inc(records);
        }
    }
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {human_pos}/{human_len} records ({per_sec}, {eta} left)",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let bar = Bar(bar);
    match Store::open_reporting(data_dir, crate::store::Memory::DEFAULT, &bar)
        .and_then(|store| store.close())
    {
        Ok(()) => {
            bar.0.finish();
            println!(
                "migrated store at {} from format {before} to {FORMAT}",
                data_dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            bar.0.abandon();
            eprintln!("ankusa: {error}");
            ExitCode::FAILURE
        }
    }
}

const JOB_POLL: Duration = Duration::from_millis(200);

fn finish(result: Result<(), CliError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ankusa: {error}");
            ExitCode::FAILURE
        }
    }
}

/// One line per row, then the cursor of the next page.
fn print_page(page: &Value) -> Result<(), CliError> {
    let items = page["items"]
        .as_array()
        .ok_or_else(|| CliError::BadAnswer(page.to_string()))?;
    for item in items {
        println!(
            "{tenant} seq={seq} source={source} sink={sink} attempts={attempts} received_at_ms={received} reason={reason}",
            tenant = text(&item["tenant"]),
            seq = text(&item["seq"]),
            source = text(&item["source"]),
            sink = text(&item["sink"]),
            attempts = text(&item["attempts"]),
            received = text(&item["received_at_ms"]),
            reason = text(&item["reason"]),
        );
    }
    match page["next"].as_str() {
        Some(next) => println!("next: {next}"),
        None => println!("next: none ({} rows; end of the DLQ)", items.len()),
    }
    Ok(())
}

/// A blocking client of the admin API.
struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    fn new(options: &AdminOptions) -> Client {
        let token = options
            .token
            .clone()
            .or_else(|| std::env::var(TOKEN_ENV).ok())
            .filter(|token| !token.is_empty());
        let agent = ureq::Agent::config_builder()
            // The API's 4xx and 5xx carry a JSON error to print, not a transport failure.
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            // No overall timeout: a revive or replay of a large selection takes as long
            // as it takes, and the server answers when it is done.
            .timeout_global(None)
            .build()
            .new_agent();
        Client {
            base: options.admin.trim_end_matches('/').to_owned(),
            token,
            agent,
        }
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.agent.get(&url);
        for (name, value) in query {
            request = request.query(*name, *value);
        }
        if let Some(token) = &self.token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        self.answer(&url, request.call())
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.agent.post(&url).content_type("application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        self.answer(&url, request.send(body.to_string().as_bytes()))
    }

    /// Starts a long operation as a background job and follows it to its end: a progress
    /// bar on stderr when that is a terminal, then the operation's own answer (what the
    /// call would have answered had it waited), or its error.
    fn run_job(&self, path: &str, mut body: Value, label: &'static str) -> Result<Value, CliError> {
        use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
        body["background"] = Value::Bool(true);
        let started = self.post(path, &body)?;
        let id = started["id"]
            .as_u64()
            .ok_or_else(|| CliError::BadAnswer(started.to_string()))?;
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{bar:40}] {human_pos}/{human_len} ({per_sec}, {eta} left)",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(label);
        let job_path = format!("/v1/jobs/{id}");
        loop {
            let job = self.get(&job_path, &[])?;
            if let Some(total) = job["total"].as_u64() {
                bar.set_length(total);
            }
            bar.set_position(job["done"].as_u64().unwrap_or(0));
            match job["state"].as_str() {
                Some("done") => {
                    bar.finish();
                    return Ok(job["result"].clone());
                }
                Some("failed") => {
                    bar.abandon();
                    let error = &job["error"];
                    return Err(CliError::Refused {
                        status: error["status"].as_u64().unwrap_or(500) as u16,
                        code: text(&error["code"]),
                        message: text(&error["message"]),
                    });
                }
                Some(_) => std::thread::sleep(JOB_POLL),
                None => return Err(CliError::BadAnswer(job.to_string())),
            }
        }
    }

    fn answer(
        &self,
        url: &str,
        result: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, CliError> {
        let mut response = result.map_err(|error| CliError::Unreachable {
            url: url.to_owned(),
            reason: error.to_string(),
        })?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|error| CliError::Unreachable {
                url: url.to_owned(),
                reason: error.to_string(),
            })?;
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if (200..300).contains(&status) {
            return json.ok_or(CliError::BadAnswer(text));
        }
        let field = |name: &str| {
            json.as_ref()
                .and_then(|json| json[name].as_str())
                .map(str::to_owned)
        };
        Err(CliError::Refused {
            status,
            code: field("error").unwrap_or_else(|| "error".to_owned()),
            message: field("message").unwrap_or(text),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn selection(tenant: Option<&str>, seq: Option<u64>, sink: Option<&str>) -> RowSelection {
        RowSelection {
            tenant: tenant.map(str::to_owned),
            seq,
            source: None,
            sink: sink.map(str::to_owned),
            all: false,
        }
    }

    #[test]
    fn selections_become_the_api_bodies() {
        assert_eq!(
            selection(Some("acme"), Some(4), Some("http")).body(),
            json!({"tenant": "acme", "seq": 4, "sink": "http"})
        );
        assert_eq!(
            selection(Some("acme"), None, None).body(),
            json!({"tenant": "acme"})
        );
        let all = RowSelection {
            all: true,
            ..selection(None, None, None)
        };
        assert_eq!(all.body(), json!({"all": true}));
    }
}
