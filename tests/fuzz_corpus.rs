//! Replays the fuzz targets' seed corpus and every input a fuzz run ever failed on
//! (`tests/fuzz/regressions/<target>/`) through the same harnesses, on the full server
//! build: a fixed finding stays fixed without nightly or libFuzzer.

#[path = "fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        files.extend(entries.map(|entry| entry.expect("corpus entry").path()));
    }
    files.sort();
    files
}

fn replay(target: &str) {
    let (_, harness) = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a harness of that name");
    let files = inputs(target);
    assert!(
        files.len() >= 5,
        "tests/fuzz/corpus/{target} holds {} seeds",
        files.len()
    );
    for file in files {
        let data = std::fs::read(&file).expect("read a corpus file");
        let outcome = std::panic::catch_unwind(|| harness(&data));
        assert!(outcome.is_ok(), "{} fails its harness", file.display());
    }
}

#[test]
fn http_corpus_and_regressions() {
    replay("http");
}

#[test]
fn config_corpus_and_regressions() {
    replay("config");
}

#[test]
fn records_corpus_and_regressions() {
    replay("records");
}

#[test]
fn json_keys_corpus_and_regressions() {
    replay("json_keys");
}
