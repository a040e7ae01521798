//! `bench-gate compare --base REV`: builds REV in a temporary git worktree and the working
//! tree (each in its own target dir), runs base and head alternately, pair after pair
//! (A B A B …), and turns each pair into head/base ratios per cell: throughput (hooks/s) and
//! p99. A cell passes when the medians over the pairs are inside its thresholds and the head
//! failed none of its checks (the run's lane checks) in any pair.
//!
//! Alternating, rather than all of A then all of B, spreads the machine's drift (another
//! process, thermal state, the page cache) over both sides.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;

use crate::binary::{self, Worktree};
use crate::cells::{Cell, CellsFile};
use crate::report::{CdfPoint, CellRow, CompareReport, CompareRow, RunReport};
use crate::run::{self, RunSettings, Timing};

/// What a compare needs.
#[derive(Debug, Clone)]
pub struct CompareSettings {
    pub repo: PathBuf,
    pub base_rev: String,
    /// Measure this binary as the base instead of building `base_rev` (which then only
    /// names it).
    pub base_bin: Option<PathBuf>,
    /// Measure this binary as the head instead of building the working tree.
    pub head_bin: Option<PathBuf>,
    pub head_target_dir: PathBuf,
    pub base_target_dir: PathBuf,
    pub pairs: usize,
    pub timing: Timing,
    pub threads: usize,
    pub nginx: Option<PathBuf>,
}

/// Builds both sides, runs the pairs and returns the decided report.
pub fn compare(
    settings: &CompareSettings,
    file: &CellsFile,
    cells: &[Cell],
) -> anyhow::Result<CompareReport> {
    let scratch = tempfile::Builder::new()
        .prefix("bench-gate-compare-")
        .tempdir()
        .context("creating a temp dir")?;
    let (base_bin, base_commit) = match &settings.base_bin {
        Some(bin) => {
            let commit = binary::git(
                &settings.repo,
                &["rev-parse", "--short", &settings.base_rev],
            )
            .unwrap_or_else(|_| "given binary".into());
            (bin.clone(), commit)
        }
        None => {
            let worktree = Worktree::add(
                &settings.repo,
                &settings.base_rev,
                &scratch.path().join("base-tree"),
            )?;
            eprintln!(
                "bench-gate: building base {} ({}) in {}",
                settings.base_rev,
                worktree.commit,
                settings.base_target_dir.display()
            );
            let built = binary::build_server(&worktree.path, &settings.base_target_dir)?;
            let pinned = binary::pin(&built, scratch.path(), "ankusa-base")?;
            (pinned, worktree.commit.clone())
            // The worktree is removed here; the pinned binary is all the runs need.
        }
    };
    let head_bin = match &settings.head_bin {
        Some(bin) => bin.clone(),
        None => {
            eprintln!(
                "bench-gate: building head (the working tree) in {}",
                settings.head_target_dir.display()
            );
            let built = binary::build_server(&settings.repo, &settings.head_target_dir)?;
            binary::pin(&built, scratch.path(), "ankusa-head")?
        }
    };
    let head_revision = binary::git(&settings.repo, &["describe", "--always", "--dirty"]).ok();

    let side = |bin: &PathBuf| RunSettings {
        bin: bin.clone(),
        timing: settings.timing,
        threads: settings.threads,
        nginx: settings.nginx.clone(),
    };
    let mut base_runs = Vec::with_capacity(settings.pairs);
    let mut head_runs = Vec::with_capacity(settings.pairs);
    for pair in 1..=settings.pairs {
        eprintln!("bench-gate: pair {pair} of {}: base", settings.pairs);
        base_runs.push(
            run::run_cells(&side(&base_bin), cells, Some(base_commit.clone()))
                .with_context(|| format!("pair {pair}, base"))?,
        );
        eprintln!("bench-gate: pair {pair} of {}: head", settings.pairs);
        head_runs.push(
            run::run_cells(&side(&head_bin), cells, head_revision.clone())
                .with_context(|| format!("pair {pair}, head"))?,
        );
    }
    Ok(decide(
        file,
        cells,
        &base_runs,
        &head_runs,
        format!("{} ({base_commit})", settings.base_rev),
        format!(
            "working tree ({})",
            head_revision.unwrap_or_else(|| "unknown revision".into())
        ),
        settings.timing.quick,
    ))
}

/// Pairs up the runs' rows by (cell, server) and decides every row.
pub fn decide(
    file: &CellsFile,
    cells: &[Cell],
    base_runs: &[RunReport],
    head_runs: &[RunReport],
    base: String,
    head: String,
    quick: bool,
) -> CompareReport {
    // (cell, server) → per-pair (head/base hooks/s, head/base p99), in the order of the
    // first head run.
    let mut order: Vec<(String, String)> = Vec::new();
    let mut ratios: BTreeMap<(String, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    // The head's failed checks, per (cell, server); the base's are not the change's doing.
    let mut failures: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    // Each side's rows per (cell, server), pair by pair, for the report's charts.
    let mut sides: BTreeMap<(String, String), SideRows> = BTreeMap::new();
    for (pair, (base_run, head_run)) in base_runs.iter().zip(head_runs).enumerate() {
        for head_row in &head_run.rows {
            let key = (head_row.cell.clone(), head_row.server.clone());
            if !head_row.failures.is_empty() {
                failures.entry(key.clone()).or_default().extend(
                    head_row
                        .failures
                        .iter()
                        .map(|failure| format!("pair {}: {failure}", pair + 1)),
                );
            }
            let Some(base_row) = base_run
                .rows
                .iter()
                .find(|row| row.cell == key.0 && row.server == key.1)
            else {
                continue;
            };
            if !order.contains(&key) {
                order.push(key.clone());
            }
            let side = sides.entry(key.clone()).or_default();
            side.base.push(base_row);
            side.head.push(head_row);
            let entry = ratios.entry(key).or_default();
            entry.0.push(head_row.hooks_per_s / base_row.hooks_per_s);
            entry.1.push(head_row.ack_p99_ms / base_row.ack_p99_ms);
        }
    }
    let rows = order
        .into_iter()
        .map(|key| {
            let (throughput_ratios, p99_ratios) = ratios.remove(&key).unwrap_or_default();
            let cell = cells.iter().find(|cell| cell.name == key.0);
            let thresholds = cell.map_or(file.thresholds, |cell| file.thresholds_of(cell));
            // nginx is the same program on both sides: shown for the machine's drift, never
            // a reason to fail. A cell outside compare's default set is sink-bound: its
            // ratios say nothing about the change.
            let gated = key.1 != "nginx" && cell.is_none_or(|cell| cell.in_compare);
            let failures = failures.remove(&key).unwrap_or_default();
            let side = sides.remove(&key).unwrap_or_default();
            let mut row = CompareRow {
                cell: key.0,
                server: key.1,
                throughput_ratios,
                p99_ratios,
                throughput: None,
                p99: None,
                thresholds,
                pass: None,
                failures,
                base_hooks_per_s: side.base.iter().map(|row| row.hooks_per_s).collect(),
                head_hooks_per_s: side.head.iter().map(|row| row.hooks_per_s).collect(),
                base_latency_cdf: median_run_cdf(&side.base),
                head_latency_cdf: median_run_cdf(&side.head),
            };
            row.decide(gated);
            row
        })
        .collect();
    CompareReport {
        base,
        head,
        pairs: base_runs.len().min(head_runs.len()),
        quick,
        rows,
    }
}

/// One (cell, server)'s rows of each side, pair by pair.
#[derive(Default)]
struct SideRows<'a> {
    base: Vec<&'a CellRow>,
    head: Vec<&'a CellRow>,
}

/// The latency CDF of the run whose hooks/s is the median of `rows` (the lower middle one
/// of an even count): a run that happened, rather than a blend of several.
fn median_run_cdf(rows: &[&CellRow]) -> Vec<CdfPoint> {
    let mut sorted = rows.to_vec();
    sorted.sort_by(|first, second| first.hooks_per_s.total_cmp(&second.hooks_per_s));
    match sorted.len() {
        0 => Vec::new(),
        count => sorted[(count - 1) / 2].ack_latency_cdf.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::report::CellRow;

    fn run(values: &[(&str, &str, f64, f64)]) -> RunReport {
        RunReport {
            started_unix_s: 0,
            quick: true,
            warmup_s: 1.0,
            measure_s: 3.0,
            binary: "x".into(),
            revision: None,
            rows: values
                .iter()
                .map(|(cell, server, hooks_per_s, p99)| CellRow {
                    cell: (*cell).into(),
                    server: (*server).into(),
                    load: "closed c=64".into(),
                    hooks_per_s: *hooks_per_s,
                    ack_p50_ms: 1.0,
                    ack_p99_ms: *p99,
                    ack_p999_ms: 9.0,
                    delivered_per_s: None,
                    backlog: None,
                    peak_rss_mib: 1.0,
                    cpu_s_per_1k_hooks: None,
                    ratio_to_reference: None,
                    total_2xx: 1,
                    total_other_status: 0,
                    total_errors: 0,
                    missed: 0,
                    generator_busy: 0.5,
                    lane_sweeps: Some(0),
                    lanes_peak: None,
                    lanes_last: None,
                    delivery_bound_per_s: None,
                    writer_batch_mean: None,
                    writer_commit_ms_mean: None,
                    failures: Vec::new(),
                    ack_latency_cdf: vec![CdfPoint {
                        percentile: 99.0,
                        ms: *p99,
                    }],
                    hooks_per_s_over_time: Vec::new(),
                    delivered_per_s_over_time: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn identical_sides_pass_and_a_slower_head_fails() {
        let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
        let cells = file.select(Some(&["ack-unordered".to_string()])).unwrap();
        let base = vec![
            run(&[
                ("reference", "ankusa --reference", 100.0, 2.0),
                ("reference", "nginx", 150.0, 1.0),
                ("ack-unordered", "ankusa", 50.0, 4.0)
            ]);
            3
        ];
        let same = decide(&file, &cells, &base, &base, "b".into(), "h".into(), true);
        assert!(same.pass());
        assert_eq!(same.rows.len(), 3);
        assert_eq!(same.rows[2].throughput.unwrap().median, 1.0);
        assert_eq!(same.rows[1].pass, None);

        let slow = vec![
            run(&[
                ("reference", "ankusa --reference", 100.0, 2.0),
                ("reference", "nginx", 10.0, 9.0),
                ("ack-unordered", "ankusa", 45.0, 4.0)
            ]);
            3
        ];
        let report = decide(&file, &cells, &base, &slow, "b".into(), "h".into(), true);
        assert!(!report.pass());
        assert_eq!(report.rows[0].pass, Some(true));
        // nginx moved a lot, but it is not ours: not gated.
        assert_eq!(report.rows[1].pass, None);
        assert_eq!(report.rows[2].pass, Some(false));
        assert_eq!(report.rows[2].throughput.unwrap().median, 0.9);
        // Each side's numbers per pair are kept for the report's charts.
        assert_eq!(report.rows[2].base_hooks_per_s, [50.0; 3]);
        assert_eq!(report.rows[2].head_hooks_per_s, [45.0; 3]);
        assert_eq!(report.rows[1].head_latency_cdf[0].ms, 9.0);
    }

    #[test]
    fn the_median_run_by_throughput_gives_the_cdf() {
        let runs: Vec<RunReport> = [(30.0, 3.0), (10.0, 1.0), (20.0, 2.0), (40.0, 4.0)]
            .iter()
            .map(|(hooks_per_s, p99)| run(&[("c", "ankusa", *hooks_per_s, *p99)]))
            .collect();
        let rows: Vec<&CellRow> = runs.iter().map(|run| &run.rows[0]).collect();
        assert_eq!(median_run_cdf(&rows[..3])[0].ms, 2.0);
        assert_eq!(median_run_cdf(&rows)[0].ms, 2.0);
        assert!(median_run_cdf(&[]).is_empty());
    }

    #[test]
    fn a_failed_check_of_the_head_fails_the_cell_and_the_base_does_not() {
        let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
        let cells = file.select(Some(&["ack-unordered".to_string()])).unwrap();
        let rows = [
            ("reference", "ankusa --reference", 100.0, 2.0),
            ("ack-unordered", "ankusa", 50.0, 4.0),
        ];
        let clean = vec![run(&rows); 3];
        let mut swept = clean.clone();
        swept[1].rows[1].failures = vec!["the lane sweep ran".into()];
        let report = decide(&file, &cells, &clean, &swept, "b".into(), "h".into(), false);
        assert!(!report.pass());
        assert_eq!(report.rows[0].pass, Some(true));
        assert_eq!(report.rows[1].pass, Some(false));
        assert_eq!(report.rows[1].failures, ["pair 2: the lane sweep ran"]);
        assert_eq!(report.rows[1].throughput.unwrap().median, 1.0);
        let report = decide(&file, &cells, &swept, &clean, "b".into(), "h".into(), false);
        assert!(report.pass());
    }

    #[test]
    fn cells_outside_the_default_set_are_shown_but_not_gated() {
        let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
        let cells = file
            .select_for_compare(Some(&["ordered-1-key-20ms".to_string()]))
            .unwrap();
        let base = vec![
            run(&[
                ("reference", "ankusa --reference", 100.0, 2.0),
                ("ordered-1-key-20ms", "ankusa", 100.0, 4.0)
            ]);
            3
        ];
        let noisy = vec![
            run(&[
                ("reference", "ankusa --reference", 100.0, 2.0),
                ("ordered-1-key-20ms", "ankusa", 100.0, 8.0)
            ]);
            3
        ];
        let report = decide(&file, &cells, &base, &noisy, "b".into(), "h".into(), false);
        assert_eq!(report.rows[1].pass, None);
        assert_eq!(report.rows[1].p99.unwrap().median, 2.0);
        assert!(report.pass());
    }
}
