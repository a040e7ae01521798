//! The cells file (`bench-gate/cells.yaml`): what each cell is, the run's durations and the
//! compare thresholds; parsed once, validated with every problem reported by its YAML path,
//! and turned into the gateway config each cell's server runs with.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

use crate::hooks::{
    HookSpec, Shape, Signing, BODY_BYTES_MAX, ORDERING_KEYS_MAX, ORDERING_KEY_PATH,
};
use crate::load::Mode;

/// The source id of every bench config; requests go to `/hooks/bench[/TENANT]`.
pub const SOURCE_ID: &str = "bench";

const TENANTS_MAX: usize = 100_000;
const SINKS_MAX: usize = 16;
const CONNECTIONS_MAX: usize = 4096;
/// Under the HTTP sink's default 10 s timeout, so a delayed answer is never a failed attempt.
const SINK_DELAY_MAX_MS: u64 = 5_000;
/// `dispatch.sink_concurrency` of a cell whose receiver is delayed, written into its config
/// because its delivery bound (see [`Cell::delivery_bound_per_s`]) depends on it.
pub const DELAYED_SINK_CONCURRENCY: usize = 8;
const SINK_CONCURRENCY_MAX: usize = 4096;
const BLOCKING_THREADS_MAX: usize = 1024;

#[derive(Debug, Error)]
pub enum CellsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("yaml: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    /// Every problem, one per line, as `yaml.path: message`.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    #[error("unknown cell {name:?} (cells: {known})")]
    UnknownCell { name: String, known: String },
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellsFile {
    pub durations: Durations,
    pub thresholds: Thresholds,
    #[serde(default)]
    pub compare: CompareSettings,
    pub cells: Vec<Cell>,
}

/// Phase lengths in seconds; `quick_*` apply with `--quick`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Durations {
    pub warmup_s: f64,
    pub measure_s: f64,
    pub quick_warmup_s: f64,
    pub quick_measure_s: f64,
    /// How long answers outstanding at the end are waited for.
    pub drain_s: f64,
}

/// When `compare` fails a cell: its median head/base throughput ratio under
/// `throughput_ratio_min`, or its median head/base p99 ratio over `p99_ratio_max`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    pub throughput_ratio_min: f64,
    pub p99_ratio_max: f64,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompareSettings {
    /// Base/head pairs run alternately (A B A B …); at least 3.
    #[serde(default = "default_pairs")]
    pub pairs: usize,
}

impl Default for CompareSettings {
    fn default() -> Self {
        CompareSettings {
            pairs: default_pairs(),
        }
    }
}

fn default_pairs() -> usize {
    3
}

/// What a cell's server is.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `ankusa serve` with the cell's config.
    #[default]
    Gateway,
    /// `ankusa serve --reference` (answers 202 without storing), and nginx `return 202`
    /// when `nginx` is on PATH and the cell asks for it.
    Reference,
}

/// How the bench source recognises a repeat (the source's `dedupe`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Dedupe {
    #[default]
    None,
    /// `dedupe: {json: id}`: the body's top-level `id`, unique per request in a Stripe body.
    JsonId,
}

/// How the sinks' URLs name the in-process receiver.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
pub enum SinkHost {
    /// Its address, `127.0.0.1`: the HTTP sink connects without a lookup.
    #[default]
    #[serde(rename = "127.0.0.1")]
    Address,
    /// `localhost`: the HTTP sink resolves the name (and keeps its addresses for 30 s).
    #[serde(rename = "localhost")]
    Localhost,
}

/// One cell: a server config and the load against it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    pub name: String,
    /// One line on what the cell shows.
    pub about: String,
    #[serde(default)]
    pub kind: Kind,
    /// Tenants declared, `t0`, `t1`, …; more than one needs `tenant_from_path`.
    #[serde(default = "one")]
    pub tenants: usize,
    /// A `tenant_from: path` source; requests go to every tenant in turn.
    #[serde(default)]
    pub tenant_from_path: bool,
    /// HTTP sinks of the source, all to the in-process receiver.
    #[serde(default = "one")]
    pub sinks: usize,
    /// Signature scheme of the source; requests are signed to match.
    #[serde(default)]
    pub verify: Signing,
    /// Dedupe on the source.
    #[serde(default)]
    pub dedupe: Dedupe,
    #[serde(default)]
    pub shape: Shape,
    #[serde(default = "default_body_bytes")]
    pub body_bytes: usize,
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Open loop at this many hooks/s; closed loop when absent.
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// The store's `sync`; a 2xx means on disk only with `true`.
    #[serde(default = "yes")]
    pub sync: bool,
    /// Reference cells: also measure nginx `return 202` when nginx is installed.
    #[serde(default)]
    pub nginx: bool,
    /// Overrides the file's thresholds for this cell.
    #[serde(default)]
    pub thresholds: Option<Thresholds>,
    /// Every HTTP sink is `ordered: true` with `ordering_key: {json: data.object.customer}`,
    /// and each request's customer is one of this many keys (`cus_0` …), in turn. `None`:
    /// unordered sinks, and the lane sweep must never run.
    #[serde(default)]
    pub ordering_keys: Option<usize>,
    /// The in-process receiver waits this long before answering each delivery: a slow
    /// destination, so delivery is bound by the round trip, not by CPU.
    #[serde(default)]
    pub sink_delay_ms: u64,
    /// Every sink's URL names a loopback port where nothing listens, so each attempt's
    /// connection is refused: a dead destination. Rows wait out their retries and the
    /// breaker, and nothing is delivered.
    #[serde(default)]
    pub sink_down: bool,
    /// How the sinks' URLs name the receiver.
    #[serde(default)]
    pub sink_host: SinkHost,
    /// `dispatch.sink_concurrency` of the gateway: attempts in flight per (tenant, sink).
    /// Absent: the gateway's default (8), or [`DELAYED_SINK_CONCURRENCY`] written out when
    /// the receiver is delayed.
    #[serde(default)]
    pub sink_concurrency: Option<usize>,
    /// `dispatch.blocking_threads` of the gateway: the threads that run the HTTP sink's
    /// blocking requests. Absent: the gateway's default (64).
    #[serde(default)]
    pub blocking_threads: Option<usize>,
    /// `instance.cores` of the server: which cores run which role. Absent: the
    /// gateway's placement for this machine's core count.
    #[serde(default)]
    pub cores: Option<Cores>,
    /// Whether `compare` measures the cell when no `--cells` are named; a cell named there is
    /// measured either way, and its ratios are gated only when this is true.
    #[serde(default = "yes")]
    pub in_compare: bool,
}

/// A cell's `instance.cores`; a role left out keeps the gateway's default placement.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Cores {
    #[serde(default)]
    pub ingest: Option<Vec<usize>>,
    #[serde(default)]
    pub writer: Option<usize>,
    #[serde(default)]
    pub pipeline: Option<Vec<usize>>,
    #[serde(default)]
    pub sink_io: Option<Vec<usize>>,
}

impl Cores {
    /// The roles set, in the config's flow form: `{ingest: [0], writer: 1}`.
    fn yaml(&self) -> String {
        let list = |cores: &[usize]| {
            let ids: Vec<String> = cores.iter().map(usize::to_string).collect();
            format!("[{}]", ids.join(", "))
        };
        let roles: Vec<String> = [
            ("ingest", self.ingest.as_deref().map(list)),
            ("writer", self.writer.map(|core| core.to_string())),
            ("pipeline", self.pipeline.as_deref().map(list)),
            ("sink_io", self.sink_io.as_deref().map(list)),
        ]
        .into_iter()
        .filter_map(|(role, cores)| cores.map(|cores| format!("{role}: {cores}")))
        .collect();
        format!("{{{}}}", roles.join(", "))
    }

    fn check(&self, at: &str, problems: &mut Vec<String>) {
        if self == &Cores::default() {
            problems.push(format!(
                "{at}.cores: name at least one of ingest, writer, pipeline, sink_io"
            ));
        }
        for (role, cores) in [
            ("ingest", &self.ingest),
            ("pipeline", &self.pipeline),
            ("sink_io", &self.sink_io),
        ] {
            if cores.as_ref().is_some_and(Vec::is_empty) {
                problems.push(format!("{at}.cores.{role}: must name at least one core"));
            }
        }
    }
}

fn one() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn default_body_bytes() -> usize {
    1024
}
fn default_connections() -> usize {
    64
}

impl CellsFile {
    pub fn load(path: &Path) -> Result<CellsFile, CellsError> {
        let text = std::fs::read_to_string(path).map_err(|source| CellsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        CellsFile::parse(&text)
    }

    pub fn parse(text: &str) -> Result<CellsFile, CellsError> {
        let file: CellsFile = serde_yaml_ng::from_str(text)?;
        let problems = file.problems();
        if problems.is_empty() {
            Ok(file)
        } else {
            Err(CellsError::Invalid(problems))
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let durations = &self.durations;
        for (name, value, minimum) in [
            ("warmup_s", durations.warmup_s, 0.0),
            ("measure_s", durations.measure_s, 0.1),
            ("quick_warmup_s", durations.quick_warmup_s, 0.0),
            ("quick_measure_s", durations.quick_measure_s, 0.1),
            ("drain_s", durations.drain_s, 0.1),
        ] {
            if !(value.is_finite() && value >= minimum && value <= 3600.0) {
                problems.push(format!(
                    "durations.{name}: must be between {minimum} and 3600 seconds, found {value}"
                ));
            }
        }
        check_thresholds(&mut problems, "thresholds", &self.thresholds);
        if self.compare.pairs < 3 {
            problems.push(format!(
                "compare.pairs: must be at least 3, found {}",
                self.compare.pairs
            ));
        }
        if self.cells.is_empty() {
            problems.push("cells: at least one cell is required".into());
        }
        let mut seen: Vec<&str> = Vec::new();
        for (index, cell) in self.cells.iter().enumerate() {
            let at = format!("cells[{index}]");
            if seen.contains(&cell.name.as_str()) {
                problems.push(format!("{at}.name: duplicate cell name {:?}", cell.name));
            }
            seen.push(&cell.name);
            if cell.name.is_empty()
                || !cell
                    .name
                    .bytes()
                    .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
            {
                problems.push(format!(
                    "{at}.name: use a-z, 0-9 and '-', found {:?}",
                    cell.name
                ));
            }
            cell.check(&at, &mut problems);
        }
        let references = self
            .cells
            .iter()
            .filter(|cell| cell.kind == Kind::Reference)
            .count();
        if references != 1 {
            problems.push(format!(
                "cells: exactly one cell of kind reference is required, found {references}"
            ));
        }
        problems
    }

    /// The reference cell (validation guarantees exactly one).
    pub fn reference(&self) -> Option<&Cell> {
        self.cells.iter().find(|cell| cell.kind == Kind::Reference)
    }

    /// The cells named in `names` (all when `None`), in file order, the reference always
    /// first: every cell's ratio is to the reference measured in the same run.
    pub fn select(&self, names: Option<&[String]>) -> Result<Vec<Cell>, CellsError> {
        if let Some(names) = names {
            for name in names {
                if !self.cells.iter().any(|cell| &cell.name == name) {
                    return Err(CellsError::UnknownCell {
                        name: name.clone(),
                        known: self
                            .cells
                            .iter()
                            .map(|cell| cell.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            }
        }
        let wanted = |cell: &Cell| names.is_none_or(|names| names.contains(&cell.name));
        let mut selected: Vec<Cell> = self.reference().into_iter().cloned().collect();
        selected.extend(
            self.cells
                .iter()
                .filter(|cell| cell.kind != Kind::Reference && wanted(cell))
                .cloned(),
        );
        Ok(selected)
    }

    /// Like [`CellsFile::select`], but with no names only the cells that are `in_compare`.
    pub fn select_for_compare(&self, names: Option<&[String]>) -> Result<Vec<Cell>, CellsError> {
        let mut selected = self.select(names)?;
        if names.is_none() {
            selected.retain(|cell| cell.in_compare || cell.kind == Kind::Reference);
        }
        Ok(selected)
    }

    pub fn thresholds_of(&self, cell: &Cell) -> Thresholds {
        cell.thresholds.unwrap_or(self.thresholds)
    }
}

fn check_thresholds(problems: &mut Vec<String>, at: &str, thresholds: &Thresholds) {
    if !(thresholds.throughput_ratio_min.is_finite() && thresholds.throughput_ratio_min > 0.0) {
        problems.push(format!(
            "{at}.throughput_ratio_min: must be a positive ratio, found {}",
            thresholds.throughput_ratio_min
        ));
    }
    if !(thresholds.p99_ratio_max.is_finite() && thresholds.p99_ratio_max > 0.0) {
        problems.push(format!(
            "{at}.p99_ratio_max: must be a positive ratio, found {}",
            thresholds.p99_ratio_max
        ));
    }
}

impl Cell {
    fn check(&self, at: &str, problems: &mut Vec<String>) {
        let mut range = |key: &str, value: usize, minimum: usize, maximum: usize| {
            if value < minimum || value > maximum {
                problems.push(format!(
                    "{at}.{key}: must be between {minimum} and {maximum}, found {value}"
                ));
            }
        };
        range("tenants", self.tenants, 1, TENANTS_MAX);
        range("sinks", self.sinks, 1, SINKS_MAX);
        range("connections", self.connections, 1, CONNECTIONS_MAX);
        range(
            "body_bytes",
            self.body_bytes,
            self.shape.body_bytes_min(),
            BODY_BYTES_MAX,
        );
        if self.tenants > 1 && !self.tenant_from_path {
            problems.push(format!(
                "{at}.tenants: more than one tenant needs tenant_from_path: true"
            ));
        }
        if let Some(rate) = self.rate_per_s {
            if !(rate.is_finite() && rate > 0.0) {
                problems.push(format!(
                    "{at}.rate_per_s: must be a positive number of hooks/s, found {rate}"
                ));
            }
        }
        if self.nginx && self.kind != Kind::Reference {
            problems.push(format!("{at}.nginx: only a reference cell runs nginx"));
        }
        if self.dedupe == Dedupe::JsonId && self.shape != Shape::Stripe {
            problems.push(format!(
                "{at}.dedupe: json-id needs shape: stripe (a github body has no top-level id)"
            ));
        }
        if let Some(thresholds) = &self.thresholds {
            check_thresholds(problems, &format!("{at}.thresholds"), thresholds);
        }
        if let Some(keys) = self.ordering_keys {
            if keys == 0 || keys > ORDERING_KEYS_MAX {
                problems.push(format!(
                    "{at}.ordering_keys: must be between 1 and {ORDERING_KEYS_MAX}, found {keys}"
                ));
            }
            if self.shape != Shape::Stripe {
                problems.push(format!(
                    "{at}.ordering_keys: needs shape: stripe (the key is the body's \
                     {ORDERING_KEY_PATH}, which a {} body lacks)",
                    self.shape.name()
                ));
            }
            if self.kind == Kind::Reference {
                problems.push(format!(
                    "{at}.ordering_keys: only a gateway cell has ordered sinks"
                ));
            }
        }
        if self.sink_delay_ms > SINK_DELAY_MAX_MS {
            problems.push(format!(
                "{at}.sink_delay_ms: must be at most {SINK_DELAY_MAX_MS} (under the sink's \
                 10 s timeout), found {}",
                self.sink_delay_ms
            ));
        }
        if !self.in_compare && self.kind == Kind::Reference {
            problems.push(format!(
                "{at}.in_compare: the reference is always measured; every ratio is to it"
            ));
        }
        if self.sink_delay_ms > 0 && self.kind == Kind::Reference {
            problems.push(format!(
                "{at}.sink_delay_ms: only a gateway cell delivers to the receiver"
            ));
        }
        if self.sink_down {
            if self.kind == Kind::Reference {
                problems.push(format!(
                    "{at}.sink_down: only a gateway cell delivers to the receiver"
                ));
            }
            if self.sink_delay_ms > 0 {
                problems.push(format!(
                    "{at}.sink_down: a refused connection has no receiver to delay; drop \
                     sink_delay_ms"
                ));
            }
        }
        if self.sink_host != SinkHost::Address && self.kind == Kind::Reference {
            problems.push(format!(
                "{at}.sink_host: only a gateway cell delivers to the receiver"
            ));
        }
        if let Some(concurrency) = self.sink_concurrency {
            if concurrency == 0 || concurrency > SINK_CONCURRENCY_MAX {
                problems.push(format!(
                    "{at}.sink_concurrency: must be 1 to {SINK_CONCURRENCY_MAX}, found \
                     {concurrency}"
                ));
            }
            if self.kind == Kind::Reference {
                problems.push(format!(
                    "{at}.sink_concurrency: only a gateway cell delivers to the receiver"
                ));
            }
        }
        if let Some(cores) = &self.cores {
            cores.check(at, problems);
        }
        if let Some(threads) = self.blocking_threads {
            if threads == 0 || threads > BLOCKING_THREADS_MAX {
                problems.push(format!(
                    "{at}.blocking_threads: must be 1 to {BLOCKING_THREADS_MAX}, found {threads}"
                ));
            }
            if self.kind == Kind::Reference {
                problems.push(format!(
                    "{at}.blocking_threads: only a gateway cell delivers to the receiver"
                ));
            }
        }
    }

    /// The `dispatch.sink_concurrency` written into the cell's config, if any.
    fn configured_sink_concurrency(&self) -> Option<usize> {
        self.sink_concurrency
            .or((self.sink_delay_ms > 0).then_some(DELAYED_SINK_CONCURRENCY))
    }

    /// Whether the cell's sinks are ordered.
    pub fn ordered(&self) -> bool {
        self.ordering_keys.is_some()
    }

    /// With a delayed receiver, the most deliveries per second the sinks can make: each
    /// busy lane (an ordered sink's key; an unordered sink's attempt slot) completes one
    /// delivery per round trip, and each sink runs at most its `sink_concurrency`
    /// ([`DELAYED_SINK_CONCURRENCY`] unless the cell sets it)
    /// at once. `None` without a delay, or over several tenants (lanes per tenant then
    /// depend on how keys and paths interleave).
    pub fn delivery_bound_per_s(&self) -> Option<f64> {
        if self.sink_delay_ms == 0 || self.tenants > 1 || self.kind == Kind::Reference {
            return None;
        }
        let slots = self
            .configured_sink_concurrency()
            .unwrap_or(DELAYED_SINK_CONCURRENCY);
        let lanes_per_sink = self.ordering_keys.map_or(slots, |keys| keys.min(slots));
        Some((self.sinks * lanes_per_sink) as f64 * 1000.0 / self.sink_delay_ms as f64)
    }

    pub fn mode(&self) -> Mode {
        match self.rate_per_s {
            Some(rate_per_s) => Mode::Open { rate_per_s },
            None => Mode::Closed,
        }
    }

    /// How the load is described in the table: `closed c=64` or `open 5000/s c=64`.
    pub fn load_label(&self) -> String {
        match self.rate_per_s {
            Some(rate) => format!("open {rate}/s c={}", self.connections),
            None => format!("closed c={}", self.connections),
        }
    }

    /// The requests of this cell's load.
    pub fn hook_spec(&self) -> HookSpec {
        let paths = if self.tenant_from_path {
            (0..self.tenants)
                .map(|tenant| format!("/hooks/{SOURCE_ID}/t{tenant}"))
                .collect()
        } else {
            vec![format!("/hooks/{SOURCE_ID}")]
        };
        HookSpec {
            shape: self.shape,
            body_bytes: self.body_bytes,
            signing: self.verify,
            paths,
            ordering_keys: self.ordering_keys,
        }
    }

    /// The gateway config of this cell: listeners on `127.0.0.1:0`, the store in
    /// `data_dir`, every sink delivering to `receiver`.
    pub fn server_yaml(&self, data_dir: &Path, receiver: SocketAddr) -> String {
        let mut yaml = String::new();
        // Writing to a String cannot fail; results are ignored for that reason.
        let _ = writeln!(
            yaml,
            "# Generated by bench-gate for cell {}.\ninstance:\n  data_dir: '{}'\n  \
             listen: 127.0.0.1:0\n  admin_listen: 127.0.0.1:0",
            self.name,
            data_dir.display(),
        );
        if let Some(cores) = &self.cores {
            let _ = writeln!(yaml, "  cores: {}", cores.yaml());
        }
        let _ = writeln!(
            yaml,
            "store: {{sync: {}}}",
            if self.sync {
                "true"
            } else {
                // The gateway refuses an unsynced store unless told the acks are not durable.
                "false, i_understand_acks_are_not_durable: true"
            }
        );
        let dispatch: Vec<String> = [
            ("sink_concurrency", self.configured_sink_concurrency()),
            ("blocking_threads", self.blocking_threads),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.map(|value| format!("{key}: {value}")))
        .collect();
        if !dispatch.is_empty() {
            let _ = writeln!(yaml, "dispatch: {{{}}}", dispatch.join(", "));
        }
        let _ = writeln!(yaml, "tenants:");
        for tenant in 0..self.tenants {
            let _ = writeln!(yaml, "  - {{id: t{tenant}}}");
        }
        let _ = writeln!(yaml, "sources:\n  - id: {SOURCE_ID}");
        if self.tenant_from_path {
            let _ = writeln!(yaml, "    tenant_from: path");
        } else {
            let _ = writeln!(yaml, "    tenant: t0");
        }
        match self.verify {
            Signing::None => {}
            Signing::Stripe => {
                let _ = writeln!(
                    yaml,
                    "    verify: {{scheme: stripe, secret: '{}'}}",
                    crate::hooks::STRIPE_SECRET
                );
            }
            Signing::Github => {
                let _ = writeln!(
                    yaml,
                    "    verify: {{scheme: github, secret: '{}'}}",
                    crate::hooks::GITHUB_SECRET
                );
            }
        }
        match self.dedupe {
            Dedupe::None => {}
            Dedupe::JsonId => {
                let _ = writeln!(yaml, "    dedupe: {{json: id}}");
            }
        }
        let _ = writeln!(yaml, "    sinks:");
        let ordering = if self.ordered() {
            format!(", ordered: true, ordering_key: {{json: {ORDERING_KEY_PATH}}}")
        } else {
            String::new()
        };
        let host = match self.sink_host {
            SinkHost::Address => receiver.to_string(),
            SinkHost::Localhost => format!("localhost:{}", receiver.port()),
        };
        for sink in 1..=self.sinks {
            let _ = writeln!(
                yaml,
                "      - {{kind: http, id: s{sink}, url: 'http://{host}/s{sink}'{ordering}}}"
            );
        }
        yaml
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../cells.yaml");

    /// The shipped cell called `name`.
    fn shipped(name: &str) -> Cell {
        let file = CellsFile::parse(SHIPPED).unwrap();
        file.cells
            .into_iter()
            .find(|cell| cell.name == name)
            .unwrap_or_else(|| panic!("no shipped cell {name:?}"))
    }

    #[test]
    fn the_shipped_file_is_valid_and_has_the_required_cells() {
        let file = CellsFile::parse(SHIPPED).unwrap();
        for name in [
            "ack-unordered",
            "fanout-3",
            "tenants-1000",
            "delivery",
            "reference",
        ] {
            assert!(
                file.cells.iter().any(|cell| cell.name == name),
                "missing {name}"
            );
        }
        let tenants = shipped("tenants-1000");
        assert_eq!(tenants.tenants, 1000);
        assert!(tenants.tenant_from_path);
        assert_eq!(tenants.hook_spec().paths.len(), 1000);
        let ack = shipped("ack-unordered");
        assert_eq!((ack.body_bytes, ack.connections, ack.sinks), (1024, 64, 1));
        assert!(ack.sync);
        assert_eq!(file.thresholds.throughput_ratio_min, 0.97);
        assert_eq!(file.thresholds.p99_ratio_max, 1.10);
    }

    fn check(cells_yaml: &str, expected: &[&str]) {
        let text = format!(
            "durations: {{warmup_s: 1, measure_s: 2, quick_warmup_s: 0, quick_measure_s: 1, \
             drain_s: 5}}\nthresholds: {{throughput_ratio_min: 0.97, p99_ratio_max: 1.1}}\n\
             {cells_yaml}"
        );
        match CellsFile::parse(&text) {
            Ok(_) => assert!(expected.is_empty(), "accepted, expected {expected:?}"),
            Err(CellsError::Invalid(problems)) => assert_eq!(problems, expected),
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn problems_name_their_yaml_path() {
        check(
            "cells:\n  - {name: reference, about: r, kind: reference}\n  - {name: a, about: x}",
            &[],
        );
        check(
            "cells:\n  - {name: a, about: x, tenants: 5, connections: 0}\n  \
             - {name: a, about: y, nginx: true, rate_per_s: -1}",
            &[
                "cells[0].connections: must be between 1 and 4096, found 0",
                "cells[0].tenants: more than one tenant needs tenant_from_path: true",
                "cells[1].name: duplicate cell name \"a\"",
                "cells[1].rate_per_s: must be a positive number of hooks/s, found -1",
                "cells[1].nginx: only a reference cell runs nginx",
                "cells: exactly one cell of kind reference is required, found 0",
            ],
        );
        check(
            "compare: {pairs: 2}\ncells:\n  - {name: Ref, about: r, kind: reference, body_bytes: 10}",
            &[
                "compare.pairs: must be at least 3, found 2",
                "cells[0].name: use a-z, 0-9 and '-', found \"Ref\"",
                "cells[0].body_bytes: must be between 545 and 1048576, found 10",
            ],
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let error = CellsFile::parse(
            "durations: {warmup_s: 1, measure_s: 2, quick_warmup_s: 0, quick_measure_s: 1, \
             drain_s: 5}\nthresholds: {throughput_ratio_min: 0.97, p99_ratio_max: 1.1}\n\
             cells:\n  - {name: a, about: x, conections: 3}",
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("unknown field `conections`"),
            "{error}"
        );
    }

    #[test]
    fn selection_puts_the_reference_first_and_refuses_unknown_names() {
        let file = CellsFile::parse(SHIPPED).unwrap();
        let selected = file
            .select(Some(&["fanout-3".to_string(), "reference".to_string()]))
            .unwrap();
        let names: Vec<&str> = selected.iter().map(|cell| cell.name.as_str()).collect();
        assert_eq!(names, ["reference", "fanout-3"]);
        let selected = file.select(Some(&["delivery".to_string()])).unwrap();
        assert_eq!(selected[0].name, "reference");
        let error = file.select(Some(&["nope".to_string()])).unwrap_err();
        assert!(error
            .to_string()
            .starts_with("unknown cell \"nope\" (cells: "));
    }

    #[test]
    fn server_yaml_declares_tenants_sources_and_sinks() {
        let receiver: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let fanout = shipped("fanout-3");
        let yaml = fanout.server_yaml(Path::new("/tmp/d"), receiver);
        assert_eq!(yaml.matches("kind: http").count(), 3, "{yaml}");
        assert!(yaml.contains("url: 'http://127.0.0.1:4000/s3'"), "{yaml}");
        assert!(yaml.contains("tenant: t0"), "{yaml}");
        let tenants = shipped("tenants-1000");
        let yaml = tenants.server_yaml(Path::new("/tmp/d"), receiver);
        assert_eq!(yaml.matches("{id: t").count(), 1000);
        assert!(yaml.contains("tenant_from: path"), "{yaml}");
        let signed = Cell {
            verify: Signing::Stripe,
            ..fanout.clone()
        };
        assert!(signed
            .server_yaml(Path::new("/tmp/d"), receiver)
            .contains("verify: {scheme: stripe, secret: 'whsec_bench_gate_not_a_real_secret'}"));
    }

    #[test]
    fn server_yaml_declares_dedupe_only_when_asked() {
        let receiver: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let yaml_of = |name: &str| shipped(name).server_yaml(Path::new("/tmp/d"), receiver);
        let deduped = yaml_of("ack-verified-dedupe");
        assert!(deduped.contains("\n    dedupe: {json: id}\n"), "{deduped}");
        assert!(
            deduped.contains("\n    verify: {scheme: stripe"),
            "{deduped}"
        );
        let plain = yaml_of("ack-verified");
        assert!(!plain.contains("dedupe"), "{plain}");
        check(
            "cells:\n  - {name: reference, about: r, kind: reference}\n  \
             - {name: a, about: x, dedupe: json-id, shape: github}",
            &["cells[1].dedupe: json-id needs shape: stripe (a github body has no top-level id)"],
        );
        let error = CellsFile::parse(
            "durations: {warmup_s: 1, measure_s: 2, quick_warmup_s: 0, quick_measure_s: 1, \
             drain_s: 5}\nthresholds: {throughput_ratio_min: 0.97, p99_ratio_max: 1.1}\n\
             cells:\n  - {name: a, about: x, dedupe: header}",
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("unknown variant `header`, expected `none` or `json-id`"),
            "{error}"
        );
    }

    #[test]
    fn ordered_cells_declare_ordered_sinks_and_keyed_loads() {
        let file = CellsFile::parse(SHIPPED).unwrap();
        let receiver: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let ordered = shipped("ordered-1000-keys");
        assert_eq!(ordered.ordering_keys, Some(1000));
        let ack = shipped("ack-unordered");
        // ack-unordered but ordered: the same load otherwise.
        assert_eq!(
            Cell {
                name: ordered.name.clone(),
                about: ordered.about.clone(),
                ordering_keys: Some(1000),
                ..ack.clone()
            },
            ordered
        );
        let yaml = ordered.server_yaml(Path::new("/tmp/d"), receiver);
        assert!(
            yaml.contains(
                "\n      - {kind: http, id: s1, url: 'http://127.0.0.1:4000/s1', ordered: true, \
                 ordering_key: {json: data.object.customer}}\n"
            ),
            "{yaml}"
        );
        assert!(!yaml.contains("dispatch:"), "{yaml}");
        assert_eq!(ordered.hook_spec().ordering_keys, Some(1000));
        assert!(ordered.in_compare);

        let fanout = Cell {
            ordering_keys: Some(2),
            ..shipped("fanout-3")
        };
        let yaml = fanout.server_yaml(Path::new("/tmp/d"), receiver);
        assert_eq!(yaml.matches("ordered: true").count(), 3, "{yaml}");

        for unordered in file.cells.iter().filter(|c| c.ordering_keys.is_none()) {
            let yaml = unordered.server_yaml(Path::new("/tmp/d"), receiver);
            assert!(!yaml.contains("ordered: "), "{}: {yaml}", unordered.name);
            assert!(!yaml.contains("ordering_key"), "{}: {yaml}", unordered.name);
            assert_eq!(unordered.hook_spec().ordering_keys, None);
        }
    }

    #[test]
    fn delayed_cells_bound_their_delivery_by_lanes_and_round_trip() {
        let receiver: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let one = shipped("ordered-1-key-20ms");
        assert_eq!(
            (one.ordering_keys, one.sink_delay_ms, one.in_compare),
            (Some(1), 20, false)
        );
        assert_eq!(one.delivery_bound_per_s(), Some(50.0));
        assert!(matches!(one.mode(), Mode::Open { .. }));
        let eight = shipped("ordered-8-keys-20ms");
        assert_eq!((eight.ordering_keys, eight.sink_delay_ms), (Some(8), 20));
        assert_eq!(eight.delivery_bound_per_s(), Some(400.0));
        let yaml = eight.server_yaml(Path::new("/tmp/d"), receiver);
        assert!(
            yaml.contains("\nstore: {sync: true}\ndispatch: {sink_concurrency: 8}\ntenants:\n"),
            "{yaml}"
        );
        // More keys than attempts at once: the concurrency bounds it.
        let many = Cell {
            ordering_keys: Some(1000),
            ..eight.clone()
        };
        assert_eq!(many.delivery_bound_per_s(), Some(400.0));
        let unordered = Cell {
            ordering_keys: None,
            sinks: 2,
            sink_delay_ms: 100,
            ..eight.clone()
        };
        assert_eq!(unordered.delivery_bound_per_s(), Some(160.0));
        assert_eq!(shipped("delivery").delivery_bound_per_s(), None);
        assert_eq!(shipped("ack-unordered").sink_delay_ms, 0);
    }

    #[test]
    fn ordering_keys_and_delays_are_checked() {
        check(
            "cells:\n  - {name: reference, about: r, kind: reference, ordering_keys: 2, \
             sink_delay_ms: 5, in_compare: false}\n  \
             - {name: a, about: x, ordering_keys: 4, shape: github}\n  \
             - {name: b, about: y, ordering_keys: 0, sink_delay_ms: 5001}\n  \
             - {name: c, about: z, ordering_keys: 1000001}",
            &[
                "cells[0].ordering_keys: only a gateway cell has ordered sinks",
                "cells[0].in_compare: the reference is always measured; every ratio is to it",
                "cells[0].sink_delay_ms: only a gateway cell delivers to the receiver",
                "cells[1].ordering_keys: needs shape: stripe (the key is the body's \
                 data.object.customer, which a github body lacks)",
                "cells[2].ordering_keys: must be between 1 and 1000000, found 0",
                "cells[2].sink_delay_ms: must be at most 5000 (under the sink's 10 s timeout), \
                 found 5001",
                "cells[3].ordering_keys: must be between 1 and 1000000, found 1000001",
            ],
        );
        check(
            "cells:\n  - {name: reference, about: r, kind: reference}\n  \
             - {name: a, about: x, ordering_keys: 1, sink_delay_ms: 5000, in_compare: false}",
            &[],
        );
    }

    #[test]
    fn a_cell_sets_the_sink_concurrency_of_its_gateway() {
        check(
            "cells:\n  - {name: reference, about: r, kind: reference, sink_concurrency: 8}\n  \
             - {name: a, about: x, sink_concurrency: 0}\n  \
             - {name: b, about: y, sink_concurrency: 4097}",
            &[
                "cells[0].sink_concurrency: only a gateway cell delivers to the receiver",
                "cells[1].sink_concurrency: must be 1 to 4096, found 0",
                "cells[2].sink_concurrency: must be 1 to 4096, found 4097",
            ],
        );
        let headline = shipped("ack-unordered");
        let wide = Cell {
            sink_concurrency: Some(64),
            ..headline.clone()
        };
        let yaml = wide.server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap());
        assert!(
            yaml.contains("\nstore: {sync: true}\ndispatch: {sink_concurrency: 64}\ntenants:\n"),
            "{yaml}"
        );
        // A delayed receiver's bound follows the cell's slots: 64 per 20 ms.
        let delayed = Cell {
            sink_delay_ms: 20,
            ..wide
        };
        assert_eq!(delayed.delivery_bound_per_s(), Some(3200.0));
    }

    #[test]
    fn a_cell_names_a_dead_or_named_receiver() {
        check(
            "cells:\n  - {name: reference, about: r, kind: reference, sink_down: true, \
             sink_host: localhost}\n  \
             - {name: a, about: x, sink_down: true, sink_delay_ms: 20, in_compare: false}",
            &[
                "cells[0].sink_down: only a gateway cell delivers to the receiver",
                "cells[0].sink_host: only a gateway cell delivers to the receiver",
                "cells[1].sink_down: a refused connection has no receiver to delay; drop \
                 sink_delay_ms",
            ],
        );
        let receiver: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let named = Cell {
            sink_host: SinkHost::Localhost,
            ..shipped("ack-unordered")
        };
        let yaml = named.server_yaml(Path::new("/tmp/d"), receiver);
        assert!(yaml.contains("url: 'http://localhost:4000/s1'"), "{yaml}");
        let dead = shipped("dead-sink");
        assert!(dead.sink_down && !dead.in_compare && dead.tenants > 1);
        assert_eq!(
            shipped("delivery-wide-localhost").sink_host,
            SinkHost::Localhost
        );
    }

    #[test]
    fn a_cell_sets_the_blocking_threads_of_its_gateway() {
        check(
            "cells:\n  - {name: reference, about: r, kind: reference, blocking_threads: 8}\n  \
             - {name: a, about: x, blocking_threads: 0}\n  \
             - {name: b, about: y, blocking_threads: 1025}",
            &[
                "cells[0].blocking_threads: only a gateway cell delivers to the receiver",
                "cells[1].blocking_threads: must be 1 to 1024, found 0",
                "cells[2].blocking_threads: must be 1 to 1024, found 1025",
            ],
        );
        let headline = shipped("ack-unordered");
        let threads_only = Cell {
            blocking_threads: Some(8),
            ..headline.clone()
        };
        let yaml = threads_only.server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap());
        assert!(
            yaml.contains("\nstore: {sync: true}\ndispatch: {blocking_threads: 8}\ntenants:\n"),
            "{yaml}"
        );
        let both = Cell {
            sink_concurrency: Some(64),
            ..threads_only
        };
        let yaml = both.server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap());
        assert!(
            yaml.contains("\ndispatch: {sink_concurrency: 64, blocking_threads: 8}\ntenants:\n"),
            "{yaml}"
        );
    }

    #[test]
    fn a_cell_places_the_roles_of_its_server_on_cores() {
        check(
            "cells:\n  - {name: reference, about: r, kind: reference, cores: {ingest: [1]}}\n  \
             - {name: a, about: x, cores: {}}\n  \
             - {name: b, about: y, cores: {ingest: [], sink_io: []}}",
            &[
                "cells[1].cores: name at least one of ingest, writer, pipeline, sink_io",
                "cells[2].cores.ingest: must name at least one core",
                "cells[2].cores.sink_io: must name at least one core",
            ],
        );
        let error = CellsFile::parse(
            "durations: {warmup_s: 1, measure_s: 2, quick_warmup_s: 0, quick_measure_s: 1, \
             drain_s: 5}\nthresholds: {throughput_ratio_min: 0.97, p99_ratio_max: 1.1}\n\
             cells:\n  - {name: a, about: x, cores: {sinks: [1]}}",
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("unknown field `sinks`"),
            "{error}"
        );
        let placed = Cell {
            cores: Some(Cores {
                ingest: Some(vec![0]),
                writer: Some(1),
                pipeline: Some(vec![1]),
                sink_io: Some(vec![0, 1]),
            }),
            ..shipped("ack-unordered")
        };
        let yaml = placed.server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap());
        assert!(
            yaml.contains(
                "\n  admin_listen: 127.0.0.1:0\n  cores: {ingest: [0], writer: 1, pipeline: [1], \
                 sink_io: [0, 1]}\nstore: {sync: true}\n"
            ),
            "{yaml}"
        );
        let one_role = Cell {
            cores: Some(Cores {
                pipeline: Some(vec![1]),
                ..Cores::default()
            }),
            ..placed
        };
        let yaml = one_role.server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap());
        assert!(yaml.contains("\n  cores: {pipeline: [1]}\n"), "{yaml}");
        assert!(!shipped("ack-unordered")
            .server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap())
            .contains("cores"));
    }

    #[test]
    fn an_unsynced_cell_says_its_acks_are_not_durable() {
        let headline = shipped("ack-unordered");
        let unsynced = Cell {
            sync: false,
            ..headline.clone()
        };
        let yaml = unsynced.server_yaml(Path::new("/tmp/x"), "127.0.0.1:9".parse().unwrap());
        assert!(
            yaml.contains("\nstore: {sync: false, i_understand_acks_are_not_durable: true}\n"),
            "{yaml}"
        );
    }

    #[test]
    fn compare_leaves_out_cells_not_in_compare_unless_named() {
        let file = CellsFile::parse(SHIPPED).unwrap();
        let names =
            |cells: Vec<Cell>| -> Vec<String> { cells.into_iter().map(|cell| cell.name).collect() };
        let default = names(file.select_for_compare(None).unwrap());
        assert_eq!(default[0], "reference");
        assert!(default.contains(&"ordered-1000-keys".to_string()));
        assert!(!default.contains(&"ordered-1-key-20ms".to_string()));
        assert!(!default.contains(&"ordered-8-keys-20ms".to_string()));
        assert!(!default.contains(&"delivery-wide".to_string()));
        assert!(!default.contains(&"ingest-alone".to_string()));
        assert!(!default.contains(&"delivery-wide-localhost".to_string()));
        assert!(!default.contains(&"dead-sink".to_string()));
        assert!(!default.contains(&"ordered-wide".to_string()));
        assert_eq!(default.len(), file.cells.len() - 7);
        let named = ["ordered-1-key-20ms".to_string()];
        assert_eq!(
            names(file.select_for_compare(Some(&named)).unwrap()),
            ["reference", "ordered-1-key-20ms"]
        );
        // run measures every cell.
        assert_eq!(file.select(None).unwrap().len(), file.cells.len());
    }
}
