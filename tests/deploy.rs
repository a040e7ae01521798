//! The deployment kit in docs/deploy/ is what it claims: the systemd unit passes
//! `systemd-analyze verify` without a warning about it, the 16-core example config passes
//! `check-config` and places every role as documented, and every sysctl it recommends
//! exists on this kernel with a value of the right shape.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::BIN;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/deploy")
        .join(file)
}

/// Absent tools skip a test outside CI, loudly, and fail it under CI.
fn skip_or_fail(why: &str) {
    if std::env::var("CI").is_ok_and(|ci| ci == "true") {
        panic!("{why} (CI=true: required)");
    }
    eprintln!("SKIPPED: {why}");
}

/// The unit's `[Service]` value of `key` (the last one wins, as in systemd).
fn unit_value<'a>(unit: &'a str, key: &str) -> Option<&'a str> {
    unit.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| name.trim() == key)
        .map(|(_, value)| value.trim())
        .next_back()
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(deploy("ankusa.service")).unwrap();
    // What the unit promises, so a later edit cannot drop it unnoticed.
    for (key, value) in [
        ("Type", "exec"), // ankusa does not implement sd_notify
        ("User", "ankusa"),
        ("Group", "ankusa"),
        ("StateDirectory", "ankusa"),
        (
            "ExecStart",
            "/usr/local/bin/ankusa serve --config /etc/ankusa/ankusa.yaml",
        ),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("KillSignal", "SIGTERM"),
        ("Restart", "on-failure"),
        ("LimitMEMLOCK", "infinity"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
    ] {
        assert_eq!(unit_value(&unit, key), Some(value), "{key}");
    }

    let Some(analyze) = find_on_path("systemd-analyze") else {
        skip_or_fail("systemd-analyze is not installed; the unit was not verified");
        return;
    };
    // `verify` refuses a unit whose ExecStart binary does not exist, and this host has no
    // /usr/local/bin/ankusa: a temporary copy of the unit runs the binary under test
    // instead. Nothing else is changed.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("ankusa.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/ankusa", BIN)).unwrap();
    let output = Command::new(analyze)
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("systemd-analyze verify: exit {:?}\n{text}", output.status);
    assert!(
        output.status.success(),
        "systemd-analyze verify failed:\n{text}"
    );
    // An unknown key or an unparsable value is only a warning (exit 0): any line about
    // this unit fails the test. Lines about other units of the host are not ours.
    let about_unit: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("ankusa.service"))
        .collect();
    assert!(
        about_unit.is_empty(),
        "systemd-analyze verify warns about the unit:\n{}",
        about_unit.join("\n")
    );
}

fn find_on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(tool))
        .find(|path| path.is_file())
}

#[test]
fn the_16_core_config_passes_check_config_with_its_placement() {
    let path = deploy("ankusa.yaml");
    // check-config reads the secrets' ${VAR}s like serve does; it does not check the cores
    // against this machine (serve does, at start), so a 2-core host checks the file too.
    let output = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&path)
        .env("ANKUSA_ADMIN_TOKEN", "admin-token")
        .env("STRIPE_WEBHOOK_SECRET", "whsec_stripe")
        .env("GITHUB_WEBHOOK_SECRET", "github-secret")
        .env("ANKUSA_SIGNING_SECRET", "whsec_c2lnbmluZy1zZWNyZXQ=")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{stdout}");
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("cores:"))
        .unwrap_or_else(|| panic!("no cores line in:\n{stdout}"))
        .trim();
    assert_eq!(
        line,
        "ingest=[2,3,4,5,6,7,8,9] writer=15 pipeline=[10,11,12] sink_io=[13,14] \
         (checked against this machine by serve)"
    );

    // The placement's rules, as docs/operations.md states them: cores 0 and 1 are left to
    // the kernel, interrupts and unpinned threads; the writer has its core to itself; no
    // role shares a core; every core of a 16-core box is used.
    let cores = |role: &str| -> Vec<usize> {
        let value = line
            .split_whitespace()
            .find_map(|field| field.strip_prefix(&format!("{role}=")))
            .unwrap();
        value
            .trim_matches(['[', ']'])
            .split(',')
            .map(|core| core.parse().unwrap())
            .collect()
    };
    let mut used: Vec<usize> = ["ingest", "writer", "pipeline", "sink_io"]
        .iter()
        .flat_map(|role| cores(role))
        .collect();
    used.sort_unstable();
    assert_eq!(used, (2..16).collect::<Vec<_>>(), "{line}");

    // LimitNOFILE covers every ingest core's connections with as much again for RocksDB's
    // open table files and the sinks' connections.
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let connections = yaml["edge"]["connections_max"].as_u64().unwrap();
    let ingest = cores("ingest").len() as u64;
    let unit = std::fs::read_to_string(deploy("ankusa.service")).unwrap();
    let nofile: u64 = unit_value(&unit, "LimitNOFILE").unwrap().parse().unwrap();
    assert!(
        nofile >= 2 * connections * ingest,
        "LimitNOFILE={nofile} for {ingest} ingest cores x {connections} connections"
    );
}

#[test]
fn every_recommended_sysctl_exists_and_its_value_parses() {
    let text = std::fs::read_to_string(deploy("99-ankusa.conf")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut keys = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not key = value: {line}", index + 1));
        let value = value.trim();
        // "-key": systemd-sysctl and sysctl ignore the key where the kernel lacks it.
        let (optional, key) = match key.trim().strip_prefix('-') {
            Some(key) => (true, key.trim()),
            None => (false, key.trim()),
        };
        assert!(
            index > 0 && lines[index - 1].starts_with('#'),
            "{key}: no comment above it says why"
        );
        assert!(!keys.contains(&key), "{key} is set twice");
        keys.push(key);
        let file = Path::new("/proc/sys").join(key.replace('.', "/"));
        let Ok(current) = std::fs::read_to_string(&file) else {
            assert!(optional, "{key}: {} does not exist", file.display());
            println!("{key}: absent on this kernel (optional)");
            continue;
        };
        // Read only: a test never changes the host's kernel settings.
        let fields: Vec<&str> = value.split_whitespace().collect();
        for field in &fields {
            assert!(
                field.parse::<i64>().is_ok(),
                "{key} = {value}: {field:?} is not an integer"
            );
        }
        assert_eq!(
            fields.len(),
            current.split_whitespace().count(),
            "{key} = {value}: the kernel's value {current:?} has another number of fields"
        );
        println!("{key}: {} now, {value} recommended", current.trim());
    }
    assert!(keys.len() >= 5, "{keys:?}");
}
