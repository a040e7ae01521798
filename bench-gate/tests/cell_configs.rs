//! Every cell's generated gateway config is one the real `ankusa check-config` accepts, so a
//! run never fails at startup on a config the cells file produced.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use bench_gate::cells::CellsFile;

#[test]
fn every_cell_config_passes_check_config() {
    let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let receiver = "127.0.0.1:9".parse().unwrap();
    for cell in &file.cells {
        let path = dir.path().join(format!("{}.yaml", cell.name));
        std::fs::write(&path, cell.server_yaml(&dir.path().join("data"), receiver)).unwrap();
        let output = Command::new(common::ankusa_bin())
            .args(["check-config", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}: {}",
            cell.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
