//! Test support: the `ankusa` binary the harness tests drive, built through cargo into the
//! target dir these tests were built in (`env!("CARGO_BIN_EXE_ankusa")` exists only inside
//! the `ankusa` package). Under `cargo test --release --workspace` the binary is already
//! fresh and the build is a no-op; run alone, the tests build it first.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn ankusa_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // The test executable is TARGET_DIR/<profile>/deps/<name>-<hash>.
        let exe = std::env::current_exe().unwrap();
        let target_dir = exe
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .unwrap()
            .to_path_buf();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        bench_gate::binary::build_server(root, &target_dir)
            .unwrap_or_else(|error| panic!("cannot build ankusa: {error}"))
    })
}

/// Writes `yaml` to `dir/<name>.yaml` and asserts that the real `ankusa check-config`
/// accepts it.
pub fn assert_check_config_accepts(dir: &Path, name: &str, yaml: &str) {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    let output = Command::new(ankusa_bin())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{name}: {}{}\n{yaml}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
