//! Every cell's generated gateway config is one the real `ankusa check-config` accepts, so a
//! run never fails at startup on a config the cells file produced.
#![allow(clippy::unwrap_used)]

mod common;

use bench_gate::cells::CellsFile;

#[test]
fn every_cell_config_passes_check_config() {
    let file = CellsFile::parse(include_str!("../cells.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let receiver = "127.0.0.1:9".parse().unwrap();
    for cell in &file.cells {
        let yaml = cell.server_yaml(&dir.path().join("data"), receiver);
        common::assert_check_config_accepts(dir.path(), &cell.name, &yaml);
        // The keys no shipped cell sets yet, so a cells file that sets them still starts.
        let variant = bench_gate::cells::Cell {
            sync: !cell.sync,
            blocking_threads: Some(4),
            ..cell.clone()
        };
        let yaml = variant.server_yaml(&dir.path().join("data"), receiver);
        common::assert_check_config_accepts(dir.path(), &format!("{} (variant)", cell.name), &yaml);
    }
}
