//! The observability kit in docs/deploy: the Grafana dashboard and the Prometheus alert
//! rules. Their queries name metrics, labels and label values by hand, and nothing else
//! checks them: a renamed metric or label would leave a panel empty or an alert silent. So
//! the files are loaded, every `ankusa_*` selector of every query is extracted, and the
//! real binary, driven through a scenario that makes each of those series appear, must
//! export every one of them with the labels and values the queries use.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::receiver::{Receiver, Reply};
use common::*;
use serde::Deserialize;
use serde_json::Value;

const DASHBOARD: &str = "docs/deploy/grafana-dashboard.json";
const ALERTS: &str = "docs/deploy/prometheus-alerts.yaml";
const OPERATIONS: &str = "docs/operations.md";

/// Labels Prometheus adds to every series of a target; the server never exports them.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(path(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

// ---------------------------------------------------------------------------------------
// The files

/// One PromQL expression and where it was found, for failure messages. `prose` is an
/// alert's annotations: only the metric names in it are checked (its query templates sit
/// inside strings).
#[derive(Debug, Clone)]
struct Query {
    origin: String,
    expr: String,
    prose: bool,
}

#[derive(Debug)]
struct Panel {
    title: String,
    kind: String,
    unit: Option<String>,
    datasource: Option<String>,
    exprs: Vec<String>,
    target_datasources: Vec<Option<String>>,
}

fn datasource_uid(value: &Value) -> Option<String> {
    value["datasource"]["uid"].as_str().map(str::to_owned)
}

/// Every panel, those nested in rows included, in file order.
fn panels(dashboard: &Value) -> Vec<Panel> {
    fn walk(list: &Value, out: &mut Vec<Panel>) {
        for panel in list.as_array().into_iter().flatten() {
            let targets = panel["targets"].as_array().cloned().unwrap_or_default();
            out.push(Panel {
                title: panel["title"].as_str().unwrap_or("").to_owned(),
                kind: panel["type"].as_str().unwrap_or("").to_owned(),
                unit: panel["fieldConfig"]["defaults"]["unit"]
                    .as_str()
                    .map(str::to_owned),
                datasource: datasource_uid(panel),
                exprs: targets
                    .iter()
                    .filter_map(|t| t["expr"].as_str().map(str::to_owned))
                    .collect(),
                target_datasources: targets.iter().map(datasource_uid).collect(),
            });
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query of the dashboard: each `expr` anywhere in it (panels, their targets, rows
/// and whatever else holds one) and the template variables' queries.
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    fn walk(value: &Value, origin: &str, out: &mut Vec<Query>) {
        match value {
            Value::Object(map) => {
                let origin = match (map.get("title"), map.get("type")) {
                    (Some(Value::String(title)), Some(Value::String(_))) => {
                        format!("{DASHBOARD} panel {title:?}")
                    }
                    _ => origin.to_owned(),
                };
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", Value::String(expr)) => out.push(Query {
                            origin: origin.clone(),
                            expr: expr.clone(),
                            prose: false,
                        }),
                        _ => walk(value, &origin, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, origin, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, DASHBOARD, &mut out);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let origin = format!("{DASHBOARD} variable {}", variable["name"]);
        let query = &variable["query"];
        for text in [
            query.as_str(),
            query["query"].as_str(),
            variable["definition"].as_str(),
        ]
        .into_iter()
        .flatten()
        {
            out.push(Query {
                origin: origin.clone(),
                expr: text.to_owned(),
                prose: false,
            });
        }
    }
    out
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for")]
    for_: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn rules() -> Vec<Rule> {
    let file: RuleFile = serde_yaml_ng::from_str(&read(ALERTS))
        .unwrap_or_else(|e| panic!("{ALERTS} is not a rules file: {e}"));
    assert!(!file.groups.is_empty(), "{ALERTS}: no groups");
    for group in &file.groups {
        assert!(
            !group.rules.is_empty(),
            "{ALERTS}: group {} is empty",
            group.name
        );
    }
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

fn alert_queries(rules: &[Rule]) -> Vec<Query> {
    rules
        .iter()
        .flat_map(|rule| {
            let annotations: Vec<&str> = rule.annotations.values().map(String::as_str).collect();
            [
                Query {
                    origin: format!("{ALERTS} alert {}", rule.alert),
                    expr: rule.expr.clone(),
                    prose: false,
                },
                Query {
                    origin: format!("{ALERTS} alert {} annotations", rule.alert),
                    expr: annotations.join("\n"),
                    prose: true,
                },
            ]
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// PromQL, as far as these files need it

#[derive(Debug, Clone, PartialEq)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

#[derive(Debug, Clone)]
struct Selector {
    name: String,
    matchers: Vec<Matcher>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Skips a quoted string starting at `chars[i]`; returns the index past it and its text.
fn quoted(chars: &[char], mut i: usize) -> (usize, String) {
    let quote = chars[i];
    let mut text = String::new();
    i += 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && i + 1 < chars.len() {
            i += 1;
        }
        text.push(chars[i]);
        i += 1;
    }
    (i + 1, text)
}

/// The `ankusa_*` selectors of `expr` with their label matchers, and the label lists of
/// its `by`, `without`, `on` and `ignoring` clauses. Strings are skipped, so a label value
/// never reads as a metric.
fn parse(expr: &str) -> (Vec<Selector>, Vec<String>) {
    let chars: Vec<char> = expr.chars().collect();
    let mut selectors = Vec::new();
    let mut grouping = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = quoted(&chars, i).0;
            continue;
        }
        if !is_ident(c) || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == '$')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let mut j = i;
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        if word.starts_with("ankusa_") {
            let mut matchers = Vec::new();
            if chars.get(j) == Some(&'{') {
                j += 1;
                loop {
                    while j < chars.len() && (chars[j].is_whitespace() || chars[j] == ',') {
                        j += 1;
                    }
                    if j >= chars.len() || chars[j] == '}' {
                        break;
                    }
                    let label_start = j;
                    while j < chars.len() && is_ident(chars[j]) {
                        j += 1;
                    }
                    let label: String = chars[label_start..j].iter().collect();
                    while j < chars.len() && chars[j].is_whitespace() {
                        j += 1;
                    }
                    let op_start = j;
                    while j < chars.len() && matches!(chars[j], '=' | '!' | '~') {
                        j += 1;
                    }
                    let op: String = chars[op_start..j].iter().collect();
                    while j < chars.len() && chars[j].is_whitespace() {
                        j += 1;
                    }
                    assert!(
                        !label.is_empty()
                            && !op.is_empty()
                            && matches!(chars.get(j), Some('"' | '\'')),
                        "cannot read the matchers of {word} in {expr:?}"
                    );
                    let (next, value) = quoted(&chars, j);
                    j = next;
                    matchers.push(Matcher { label, op, value });
                }
                i = j + 1;
            }
            selectors.push(Selector {
                name: word,
                matchers,
            });
        } else if matches!(word.as_str(), "by" | "without" | "on" | "ignoring")
            && chars.get(j) == Some(&'(')
        {
            let end = chars[j..].iter().position(|&c| c == ')').unwrap() + j;
            let list: String = chars[j + 1..end].iter().collect();
            grouping.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
            i = end + 1;
        }
    }
    (selectors, grouping)
}

/// Every `ankusa_[a-z0-9_]+` word of `text`, strings included.
fn names_in_text(text: &str) -> BTreeSet<String> {
    text.match_indices("ankusa_")
        .filter(|(at, _)| !text[..*at].chars().next_back().is_some_and(is_ident))
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect()
        })
        .collect()
}

/// Prometheus durations as the rules file writes them (`90s`, `15m`, `1h30m`), in seconds.
fn duration_s(text: &str) -> Option<u64> {
    let mut total = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().ok()?;
        number.clear();
        total += n * match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return None,
        };
    }
    number.is_empty().then_some(total)
}

/// Whether `text` names `name` as a whole identifier (`ankusa_pending` is not named by
/// `ankusa_pending_bytes`).
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

// ---------------------------------------------------------------------------------------
// The static checks

#[test]
fn the_dashboard_and_the_rules_are_well_formed_and_cover_every_area() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"));
    let mut problems = Vec::new();

    // The dashboard: a current schema, a data source chosen at import, a node selector.
    let schema = dashboard["schemaVersion"].as_u64().unwrap_or(0);
    if schema < 36 {
        problems.push(format!("schemaVersion {schema}, want 36 or newer"));
    }
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
    match variable("datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
        other => problems.push(format!(
            "no Prometheus data source variable `datasource`: {other:?}"
        )),
    }
    match variable("instance") {
        Some(v) if v["type"] == "query" && v["multi"] == true && v["includeAll"] == true => {}
        other => problems.push(format!(
            "no multi-value `instance` variable with All: {other:?}"
        )),
    }

    let panels = panels(&dashboard);
    let mut ids = BTreeSet::new();
    fn collect_ids(list: &Value, ids: &mut BTreeSet<u64>, problems: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            let id = panel["id"].as_u64().unwrap_or(0);
            if !ids.insert(id) {
                problems.push(format!("panel id {id} is used twice"));
            }
            if !panel["gridPos"].is_object() {
                problems.push(format!("panel {} has no gridPos", panel["title"]));
            }
            collect_ids(&panel["panels"], ids, problems);
        }
    }
    collect_ids(&dashboard["panels"], &mut ids, &mut problems);
    for panel in panels.iter().filter(|p| p.kind != "row") {
        let title = &panel.title;
        if panel.exprs.is_empty() {
            problems.push(format!("panel {title:?} has no query"));
        }
        if panel.unit.as_deref().unwrap_or("").is_empty() {
            problems.push(format!("panel {title:?} sets no unit"));
        }
        let mut uids = std::iter::once(&panel.datasource).chain(&panel.target_datasources);
        if uids.any(|uid| uid.as_deref() != Some("${datasource}")) {
            problems.push(format!("panel {title:?} does not use ${{datasource}}"));
        }
        for expr in &panel.exprs {
            let (selectors, grouping) = parse(expr);
            // Every series is filtered by the node selector, so one dashboard serves one
            // node or all of them.
            for selector in &selectors {
                let by_node = Matcher {
                    label: "instance".into(),
                    op: "=~".into(),
                    value: "$instance".into(),
                };
                if !selector.matchers.contains(&by_node) {
                    problems.push(format!(
                        "panel {title:?}: {} is not filtered by instance=~\"$instance\"",
                        selector.name
                    ));
                }
            }
            // Grafana picks a window of at least four scrapes for rate() and increase().
            for (at, _) in expr.match_indices('[') {
                if !expr[at..].starts_with("[$__rate_interval]") {
                    problems.push(format!(
                        "panel {title:?}: a range other than $__rate_interval in {expr:?}"
                    ));
                }
            }
            // A quantile of a histogram sums its buckets by `le` across series first.
            if selectors.iter().any(|s| s.name.ends_with("_bucket"))
                && !(expr.contains("histogram_quantile(") && grouping.iter().any(|l| l == "le"))
            {
                problems.push(format!(
                    "panel {title:?}: buckets outside histogram_quantile(…, sum by (…le) (…)) in {expr:?}"
                ));
            }
        }
    }

    // Each area of the dashboard has a panel: (area, metric, something else the query needs).
    let areas: [(&str, &str, &str); 13] = [
        ("ingest rate", "ankusa_ingest_requests_total", "rate("),
        (
            "ingest statuses",
            "ankusa_ingest_requests_total",
            "by (status)",
        ),
        (
            "ack latency quantiles",
            "ankusa_ingest_ack_seconds_bucket",
            "histogram_quantile(",
        ),
        (
            "writer batch size",
            "ankusa_writer_batch_records_bucket",
            "histogram_quantile(",
        ),
        (
            "writer sync latency",
            "ankusa_writer_sync_seconds_bucket",
            "histogram_quantile(",
        ),
        ("pending per node", "ankusa_pending", "by (instance)"),
        (
            "pending bytes per node",
            "ankusa_pending_bytes",
            "by (instance)",
        ),
        (
            "attempts by sink kind and outcome",
            "ankusa_dispatch_attempts_total",
            "by (kind, outcome)",
        ),
        ("breakers", "ankusa_dispatch_breakers_open", ""),
        ("DLQ", "ankusa_dead", ""),
        (
            "dead letters by kind and cause",
            "ankusa_dispatch_dead_lettered_total",
            "by (kind, cause)",
        ),
        ("lanes", "ankusa_dispatch_lanes", ""),
        ("blocked lanes", "ankusa_dispatch_lanes_blocked", ""),
    ];
    for (area, metric, needs) in areas {
        let covered = panels.iter().any(|panel| {
            panel.kind != "row"
                && panel
                    .exprs
                    .iter()
                    .any(|expr| mentions(expr, metric) && expr.contains(needs))
        });
        if !covered {
            problems.push(format!("no panel shows {area} ({metric}, {needs:?})"));
        }
    }

    // The rules: complete, with a severity, a duration and annotations that say where.
    let rules = rules();
    let mut names = BTreeSet::new();
    for rule in &rules {
        let alert = &rule.alert;
        if !names.insert(alert.clone()) {
            problems.push(format!("alert {alert} is defined twice"));
        }
        if duration_s(&rule.for_).is_none() {
            problems.push(format!(
                "alert {alert}: `for: {}` is not a duration",
                rule.for_
            ));
        }
        match rule.labels.get("severity").map(String::as_str) {
            Some("critical" | "warning" | "info") => {}
            other => problems.push(format!("alert {alert}: severity {other:?}")),
        }
        let summary = rule.annotations.get("summary").map_or("", String::as_str);
        let description = rule
            .annotations
            .get("description")
            .map_or("", String::as_str);
        if summary.is_empty() || description.len() < 80 {
            problems.push(format!(
                "alert {alert}: a summary and a description that explains it are needed"
            ));
        }
        let text = format!("{summary}\n{description}");
        if text.matches("{{").count() != text.matches("}}").count() {
            problems.push(format!("alert {alert}: unbalanced template braces"));
        }
        // absent() has no series to take labels or a value from.
        if !rule.expr.trim_start().starts_with("absent(") {
            if !text.contains("{{ $labels.instance }}") {
                problems.push(format!(
                    "alert {alert}: the annotations do not name the node"
                ));
            }
            if !text.contains("{{ $value") && !text.contains("| query }}") {
                problems.push(format!("alert {alert}: the annotations show no value"));
            }
        }
    }

    // The alerts the kit promises, each found by what it watches.
    let has = |what: &str, min_for_s: u64, test: &dyn Fn(&str) -> bool| {
        let found = rules
            .iter()
            .any(|rule| test(&rule.expr) && duration_s(&rule.for_).is_some_and(|s| s >= min_for_s));
        (!found).then(|| format!("no alert for {what}"))
    };
    let required = [
        has("a growing DLQ", 5 * 60, &|e| {
            mentions(e, "ankusa_dead_lettered_total") || mentions(e, "ankusa_dead")
        }),
        has("lanes blocked for long", 10 * 60, &|e| {
            mentions(e, "ankusa_dispatch_lanes_blocked")
        }),
        has("the oldest due age", 5 * 60, &|e| {
            mentions(e, "ankusa_dispatch_oldest_due_age_seconds")
        }),
        has("the 5xx share", 60, &|e| {
            mentions(e, "ankusa_ingest_requests_total") && e.contains("5xx")
        }),
        has("503 refusals by reason", 60, &|e| {
            mentions(e, "ankusa_ingest_refused_total") && e.contains("node_bound")
        }),
        has("a low disk", 0, &|e| mentions(e, "ankusa_store_disk_low")),
        has("free space trending to the reserve", 10 * 60, &|e| {
            e.contains("predict_linear(ankusa_store_free_bytes")
        }),
        has("writer commit errors", 0, &|e| {
            mentions(e, "ankusa_writer_commit_errors_total")
        }),
        has("integrity failures", 0, &|e| {
            mentions(e, "ankusa_integrity_failures_total")
        }),
        has("breakers open for long", 10 * 60, &|e| {
            mentions(e, "ankusa_dispatch_breakers_open")
        }),
        has("a target that cannot be scraped", 60, &|e| {
            e.contains("up{") && e.contains("== 0")
        }),
    ];
    problems.extend(required.into_iter().flatten());

    // Every alert is explained where operators look.
    let operations = read(OPERATIONS);
    for rule in &rules {
        if !mentions(&operations, &rule.alert) {
            problems.push(format!(
                "{OPERATIONS} does not explain alert {}",
                rule.alert
            ));
        }
    }

    // promtool, where it is installed, checks the PromQL and the templates for real.
    match std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(path(ALERTS))
        .output()
    {
        Ok(output) => {
            if !output.status.success() {
                problems.push(format!(
                    "promtool check rules: {}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
        Err(_) => {
            eprintln!("promtool is not installed: the rules file's PromQL is not checked by it")
        }
    }

    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// The server

/// A scrape of /metrics: each family's type and each sample's name and labels.
#[derive(Debug, Default)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, Vec<BTreeMap<String, String>>>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                let (name, kind) = (words.next().unwrap(), words.next().unwrap());
                scrape.types.insert(name.into(), kind.into());
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let name_end = line.find(|c: char| !is_ident(c)).unwrap();
            let name = &line[..name_end];
            let mut labels = BTreeMap::new();
            if line[name_end..].starts_with('{') {
                let chars: Vec<char> = line[name_end + 1..].chars().collect();
                let mut i = 0;
                while i < chars.len() && chars[i] != '}' {
                    let start = i;
                    while chars[i] != '=' {
                        i += 1;
                    }
                    let label: String = chars[start..i].iter().collect();
                    let (next, value) = quoted(&chars, i + 1);
                    labels.insert(label.trim_start_matches(',').to_owned(), value);
                    i = next;
                }
            }
            scrape.samples.entry(name.into()).or_default().push(labels);
        }
        scrape
    }

    /// The family a query's name belongs to (`x_bucket` to the histogram `x`), and the
    /// samples that answer it; `None` when the server exports no such series.
    fn resolve(&self, name: &str) -> (String, Option<&Vec<BTreeMap<String, String>>>) {
        const SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];
        let histogram = |base: &str| self.types.get(base).map(String::as_str) == Some("histogram");
        for suffix in SUFFIXES {
            if let Some(base) = name.strip_suffix(suffix).filter(|base| histogram(base)) {
                let complete = SUFFIXES
                    .iter()
                    .all(|s| self.samples.contains_key(&format!("{base}{s}")));
                return (base.into(), self.samples.get(name).filter(|_| complete));
            }
        }
        if histogram(name) {
            // No series has a histogram's bare name.
            return (
                format!("{name} (a histogram: query _bucket, _sum or _count)"),
                None,
            );
        }
        match self.samples.get(name) {
            Some(samples) => (name.into(), Some(samples)),
            None => {
                let base = SUFFIXES.iter().find_map(|s| name.strip_suffix(s));
                (base.unwrap_or(name).into(), None)
            }
        }
    }

    /// The families whose names start with `ankusa_`.
    fn families(&self) -> BTreeSet<String> {
        self.types
            .keys()
            .filter(|name| name.starts_with("ankusa_"))
            .cloned()
            .collect()
    }
}

/// What the queries name that the scrape does not answer: missing metrics, labels and
/// label values, each with the places that named it.
fn unanswered(queries: &[Query], scrape: &Scrape) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for query in queries {
        if query.prose {
            for name in names_in_text(&query.expr) {
                if let (family, None) = scrape.resolve(&name) {
                    out.entry(format!("metric {family}"))
                        .or_default()
                        .insert(query.origin.clone());
                }
            }
            continue;
        }
        let (selectors, grouping) = parse(&query.expr);
        let mut labels_here = BTreeSet::new();
        let mut complete = true;
        for selector in &selectors {
            let (family, samples) = scrape.resolve(&selector.name);
            let Some(samples) = samples else {
                out.entry(format!("metric {family}"))
                    .or_default()
                    .insert(query.origin.clone());
                complete = false;
                continue;
            };
            labels_here.extend(samples.iter().flat_map(|s| s.keys().cloned()));
            for matcher in &selector.matchers {
                if TARGET_LABELS.contains(&matcher.label.as_str()) {
                    continue;
                }
                let seen: BTreeSet<&str> = samples
                    .iter()
                    .filter_map(|s| s.get(&matcher.label).map(String::as_str))
                    .collect();
                if seen.is_empty() {
                    out.entry(format!("label {}{{{}}}", selector.name, matcher.label))
                        .or_default()
                        .insert(query.origin.clone());
                    continue;
                }
                // A value or an alternation of plain values must be one the server sends.
                let plain = matcher.value.split('|').all(|v| {
                    !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
                if matches!(matcher.op.as_str(), "=" | "=~") && plain {
                    for value in matcher.value.split('|') {
                        if !seen.contains(value) {
                            out.entry(format!(
                                "value {}{{{}=\"{value}\"}} (seen: {seen:?})",
                                selector.name, matcher.label
                            ))
                            .or_default()
                            .insert(query.origin.clone());
                        }
                    }
                }
            }
        }
        // With a metric missing, its labels are unknown; the metric is reported already.
        for label in grouping.iter().filter(|_| complete) {
            if TARGET_LABELS.contains(&label.as_str()) || labels_here.contains(label) {
                continue;
            }
            out.entry(format!("label {label} (grouped by in {:?})", query.expr))
                .or_default()
                .insert(query.origin.clone());
        }
    }
    out
}

fn sources(receiver: &str) -> String {
    format!(
        "
sources:
  - id: ok
    tenant: acme
    sinks:
      - {{kind: http, url: '{receiver}/ok'}}
      - {{kind: pubsub, project: test, topic: hooks, endpoint: '{receiver}', max_in_flight: 1}}
  - id: failing
    tenant: acme
    sinks:
      - {{kind: http, url: '{receiver}/fail'}}
  - id: refused
    tenant: acme
    sinks:
      - {{kind: http, url: '{receiver}/refuse'}}
  - id: ordered
    tenant: acme
    sinks:
      - {{kind: http, url: '{receiver}/ordered', ordered: true, ordering_key: {{json: customer}}}}
  - id: tight
    tenant: tight
    sinks:
      - {{kind: http, url: '{receiver}/fail'}}
"
    )
}

#[test]
fn every_metric_label_and_value_the_files_name_is_exported_by_the_server() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut queries = dashboard_queries(&dashboard);
    queries.extend(alert_queries(&rules()));
    let named: BTreeSet<String> = queries
        .iter()
        .filter(|q| !q.prose)
        .flat_map(|q| parse(&q.expr).0)
        .map(|s| s.name)
        .collect();
    assert!(named.len() >= 20, "the files name only {named:?}");

    // Failures and refusals by path; Pub/Sub publishes answered as Pub/Sub does.
    let receiver = Receiver::scripted(|request, _| {
        if request.path.ends_with(":publish") {
            let body: Value = serde_json::from_slice(&request.body).unwrap();
            let count = body["messages"].as_array().map_or(0, Vec::len);
            let ids: Vec<String> = (0..count).map(|n| format!("\"{n}\"")).collect();
            return Reply::status(200)
                .with_body(&format!("{{\"messageIds\": [{}]}}", ids.join(",")));
        }
        match request.path.as_str() {
            "/ok" => Reply::status(200),
            "/refuse" => Reply::status(400).with_body("no such customer"),
            _ => Reply::status(503),
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Short retries and two failures per breaker, held open past the test, so retries,
    // openings and parked rows happen within a second or two.
    let yaml = format!(
        "instance:
  data_dir: {}
  listen: 127.0.0.1:0
  admin_listen: 127.0.0.1:0
store: {{memtable_bytes: 32MiB}}
retry: {{initial_ms: 10, max_ms: 20}}
dispatch: {{breaker_failures: 2, breaker_open_ms: 60000}}
tenants:
  - {{id: acme}}
  - {{id: tight, max_pending: 1}}
{}",
        data.display(),
        sources(&format!("http://{}", receiver.addr))
    );
    let server = Server::start(dir.path(), &yaml);

    let post = |path: &str, body: &str| server.post(path, &[], body.as_bytes()).status;
    for n in 0..3 {
        assert_eq!(post("/hooks/ok", &format!("{{\"n\": {n}}}")), 202);
        assert_eq!(post("/hooks/failing", &format!("{{\"n\": {n}}}")), 202);
    }
    assert_eq!(post("/hooks/refused", "{}"), 202);
    // Two hooks of one key (the second waits behind the failing head) and one without a key.
    assert_eq!(post("/hooks/ordered", r#"{"customer": "c1", "n": 1}"#), 202);
    assert_eq!(post("/hooks/ordered", r#"{"customer": "c1", "n": 2}"#), 202);
    assert_eq!(post("/hooks/ordered", r#"{"n": 3}"#), 202);
    assert_eq!(post("/hooks/nowhere", "{}"), 404);
    // The tenant's first hook never leaves (its sink fails), so its bound refuses more.
    let statuses: Vec<u16> = (0..3).map(|_| post("/hooks/tight", "{}")).collect();
    assert!(
        statuses.contains(&429),
        "no 429 from the tenant bound: {statuses:?}"
    );
    let reload = server.admin_post("/v1/reload", "");
    assert_eq!(reload.status, 200, "{reload:?}");

    // The scenario did what it is for: the series exist because their events happened.
    let unmet = |text: &str| -> Vec<String> {
        [
            ("ankusa_dispatch_breakers_open", 1.0),
            ("ankusa_dispatch_parked_total", 1.0),
            ("ankusa_dispatch_lanes_blocked", 1.0),
            ("ankusa_dispatch_lane_members", 1.0),
            ("ankusa_dead", 1.0),
            // The hooks posted above are in the memtables.
            ("ankusa_store_memtable_bytes", 1.0),
            (r#"ankusa_ingest_refused_total{reason="tenant_bound"}"#, 1.0),
            (
                r#"ankusa_dispatch_attempts_total{kind="http",outcome="retry"}"#,
                2.0,
            ),
            (
                r#"ankusa_dispatch_attempts_total{kind="pubsub",outcome="delivered"}"#,
                3.0,
            ),
        ]
        .into_iter()
        .filter_map(|(series, at_least)| {
            let value = metric(text, series).unwrap_or(0.0);
            (value < at_least).then(|| format!("{series} is {value}, want at least {at_least}"))
        })
        .collect()
    };
    // Counters flush within a second and gauges every 250 ms: wait until nothing is
    // missing, then hold the last answer to the check.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (scrape, missing, unmet) = loop {
        let text = server.admin_get("/metrics").body;
        let scrape = Scrape::parse(&text);
        let missing = unanswered(&queries, &scrape);
        let unmet = unmet(&text);
        if (missing.is_empty() && unmet.is_empty()) || Instant::now() > deadline {
            break (scrape, missing, unmet);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let report: Vec<String> = missing
        .iter()
        .map(|(what, origins)| {
            let origins: Vec<&str> = origins.iter().map(String::as_str).collect();
            format!("  {what}\n      named by {}", origins.join("; "))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the observability files name what the server does not export:\n{}\n\nexported families: {:?}\nstderr:\n{}",
        report.join("\n"),
        scrape.families(),
        server.stderr()
    );

    assert!(unmet.is_empty(), "the scenario fell short: {unmet:?}");
    // store.memtable_bytes reached RocksDB: its OPTIONS file records the total.
    let options = std::fs::read_dir(&data)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().contains("/OPTIONS-"))
        .max()
        .expect("RocksDB wrote no OPTIONS file");
    let options = std::fs::read_to_string(options).unwrap();
    assert!(
        options
            .lines()
            .any(|line| line.trim() == "db_write_buffer_size=33554432"),
        "store.memtable_bytes: 32MiB did not reach RocksDB"
    );

    // Every family the server exports is in the metrics table of the operations guide.
    let operations = read(OPERATIONS);
    let undocumented: Vec<String> = scrape
        .families()
        .into_iter()
        .filter(|name| !mentions(&operations, name))
        .collect();
    assert!(
        undocumented.is_empty(),
        "{OPERATIONS} does not document {undocumented:?}"
    );

    assert!(server.stop().success());
}
