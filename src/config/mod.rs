//! STUB (replaced by the config module).
pub mod model;
pub use model::*;
use std::path::{Path, PathBuf};
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
}
pub const QUICKSTART_YAML: &str = "";
pub fn load(_path: &Path) -> Result<Config, ConfigError> { Err(ConfigError::Invalid(vec![])) }
pub fn parse(_yaml: &str) -> Result<Config, ConfigError> { Err(ConfigError::Invalid(vec![])) }
pub fn summary(_config: &Config) -> String { String::new() }
