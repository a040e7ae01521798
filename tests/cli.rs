//! The command line: `check-config` lists every problem with its YAML path and exits 1,
//! or prints a summary and exits 0; `store verify` refuses a directory that is no store.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::BIN;

#[test]
fn check_config_reports_every_problem_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "instance:\n  listen: nowhere\n  colour: blue\nsources:\n  - id: s\n    tenant: missing\n    sinks: [{kind: http, url: 'ftp://x'}]\n",
    )
    .unwrap();
    let output = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "instance.listen:",
        "instance.colour: unknown key",
        "sources[0].tenant:",
        "sources[0].sinks[0].url:",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
}

#[test]
fn check_config_summarises_a_good_config_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("good.yaml");
    std::fs::write(
        &path,
        "tenants: [{id: acme}]\nsources:\n  - id: gh\n    tenant: acme\n    verify: {scheme: github, secret: topsecretvalue}\n    sinks:\n      - {kind: http, url: 'http://127.0.0.1:9000/x'}\n      - {kind: http, url: 'http://127.0.0.1:9000/y', ordered: true, ordering_key: {json: repository.full_name}}\n",
    )
    .unwrap();
    let output = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("gh"), "{stdout}");
    assert!(!stdout.contains("topsecretvalue"), "{stdout}");
    assert!(
        stdout.contains("    sink http-1: http http://127.0.0.1:9000/x\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "    sink http-2: http http://127.0.0.1:9000/y, ordered by json repository.full_name"
        ),
        "{stdout}"
    );
}

#[test]
fn store_verify_refuses_a_directory_that_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["store", "verify", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not an ankusa store"));
}
