//! Reload: SIGHUP and `POST /v1/reload` re-read the config file and, when it is valid and
//! changes nothing that needs a restart, replace the running config.
//!
//! A bad file is refused with every problem listed and the running config stays. Rows
//! already stored follow the row: a hook keeps the delivery rows it was accepted with, a
//! row goes to its sink by id, and a row whose sink or source the new file removed is
//! dead-lettered (`sink_gone`, `source_gone`) by the pipeline cores' sweep right after the
//! new config is published.

use std::sync::Arc;

use serde::Serialize;

use crate::config::{self, ConfigError};
use crate::live::{self, Live};

use super::api::ApiError;
use super::operations::Operations;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reloaded {
    /// The file that was read.
    pub path: String,
    pub sources: usize,
    pub tenants: usize,
    /// Sources and sinks (`source/sink`) of the running config the file no longer has:
    /// their pending rows are dead-lettered by the pipeline's sweep.
    pub removed_sources: Vec<String>,
    pub removed_sinks: Vec<String>,
}

impl Operations {
    pub fn reload_config(&self) -> Result<Reloaded, ApiError> {
        let result = self.try_reload();
        let outcome = if result.is_ok() { "applied" } else { "refused" };
        metrics::counter!("ankusa_config_reloads_total", "outcome" => outcome).increment(1);
        match &result {
            Ok(reloaded) => tracing::info!(
                path = %reloaded.path,
                sources = reloaded.sources,
                removed_sources = ?reloaded.removed_sources,
                removed_sinks = ?reloaded.removed_sinks,
                "config reloaded"
            ),
            Err(error) => tracing::error!(
                code = error.code,
                message = %error.message,
                problems = ?error.problems,
                "config reload refused; the running config stays"
            ),
        }
        result
    }

    fn try_reload(&self) -> Result<Reloaded, ApiError> {
        let Some(path) = &self.reload.path else {
            return Err(ApiError::new(
                409,
                "no_config_file",
                "the gateway runs the embedded quickstart config; there is no file to re-read",
            ));
        };
        let next = match config::load(path) {
            Ok(next) => next,
            Err(ConfigError::Invalid(problems)) => {
                return Err(ApiError::new(
                    400,
                    "invalid_config",
                    format!(
                        "{} has {} problem(s); the running config stays",
                        path.display(),
                        problems.len()
                    ),
                )
                .with_problems(problems))
            }
            Err(error) => return Err(ApiError::new(400, "unreadable_config", error.to_string())),
        };
        let running = self.live.load();
        let changes = live::restart_only_changes(&running.config, &next);
        if !changes.is_empty() {
            return Err(ApiError::new(
                409,
                "restart_required",
                "the file changes settings that only a restart applies; the running config stays",
            )
            .with_problems(changes));
        }
        let mut removed_sources = Vec::new();
        let mut removed_sinks = Vec::new();
        for source in &running.config.sources {
            match next.sources.iter().find(|s| s.id == source.id) {
                None => removed_sources.push(source.id.clone()),
                Some(kept) => removed_sinks.extend(
                    source
                        .sinks
                        .iter()
                        .filter(|sink| !kept.sinks.iter().any(|k| k.id == sink.id))
                        .map(|sink| format!("{}/{}", source.id, sink.id)),
                ),
            }
        }
        self.tenants.apply(&next)?;
        let sinks = live::build_sinks(
            &next,
            &self.reload.sink_runtimes,
            Some((&running.config, &running.sinks)),
        );
        let next = Arc::new(next);
        let directory = self.tenants.snapshot();
        self.live.store(Live::new(next.clone(), sinks, &directory));
        Ok(Reloaded {
            path: path.display().to_string(),
            sources: next.sources.len(),
            tenants: directory.len(),
            removed_sources,
            removed_sinks,
        })
    }
}
