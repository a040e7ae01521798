//! Where the server binaries under test come from: the workspace root, a release build of
//! `ankusa` through cargo (its path taken from cargo's own JSON messages, so any target dir
//! works), a private link to the built file so a later build cannot swap it mid-run, and
//! temporary git worktrees of a base revision for `compare`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use thiserror::Error;

/// The target dir this repository builds in when `CARGO_TARGET_DIR` is not set: outside the
/// clone, so RocksDB's C++ (16 minutes cold on 2 cores) is built once per machine.
pub const DEFAULT_TARGET_DIR: &str = "/var/tmp/ankusa-target";
/// The target dir of `compare`'s base builds, kept apart from the head's so switching
/// between them never rebuilds anything but the workspace's own crates.
pub const DEFAULT_BASE_TARGET_DIR: &str = "/var/tmp/ankusa-target-base";

#[derive(Debug, Error)]
pub enum BuildError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed with {status}")]
    Failed { command: String, status: String },
    #[error("cargo reported no `ankusa` executable")]
    NoExecutable,
    #[error("no workspace with bench-gate/cells.yaml above {0}")]
    NoWorkspace(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

/// The workspace root: the nearest directory at or above the working directory that holds
/// `bench-gate/cells.yaml`, else the one this binary was built from.
pub fn workspace_root() -> Result<PathBuf, BuildError> {
    let current = std::env::current_dir().map_err(|source| BuildError::Io {
        context: "reading the working directory".into(),
        source,
    })?;
    let is_root = |dir: &Path| dir.join("bench-gate").join("cells.yaml").is_file();
    if let Some(root) = current.ancestors().find(|dir| is_root(dir)) {
        return Ok(root.to_path_buf());
    }
    let built_from = Path::new(env!("CARGO_MANIFEST_DIR"));
    match built_from.parent() {
        Some(root) if is_root(root) => Ok(root.to_path_buf()),
        _ => Err(BuildError::NoWorkspace(current.display().to_string())),
    }
}

/// `CARGO_TARGET_DIR`, or [`DEFAULT_TARGET_DIR`].
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|value| !value.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_TARGET_DIR), PathBuf::from)
}

/// `cargo build --release --bin ankusa` in `tree` with `target_dir`; returns the built
/// executable. Cargo's progress and errors go to this process's stderr.
pub fn build_server(tree: &Path, target_dir: &Path) -> Result<PathBuf, BuildError> {
    // Under `cargo run`, CARGO names the cargo that started us; use the same one.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut child = Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--bin",
            "ankusa",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(tree)
        .env("CARGO_TARGET_DIR", target_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| BuildError::Spawn {
            program: cargo.to_string_lossy().into_owned(),
            source,
        })?;
    let mut executable = None;
    if let Some(stdout) = child.stdout.take() {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(path) = executable_of(&line) {
                executable = Some(path);
            }
        }
    }
    let status = child.wait().map_err(|source| BuildError::Io {
        context: "waiting for cargo".into(),
        source,
    })?;
    if !status.success() {
        return Err(BuildError::Failed {
            command: format!(
                "cargo build --release --bin ankusa (in {}, CARGO_TARGET_DIR={})",
                tree.display(),
                target_dir.display()
            ),
            status: status.to_string(),
        });
    }
    executable.ok_or(BuildError::NoExecutable)
}

/// The `ankusa` executable named by one line of cargo's JSON messages, if it names one.
fn executable_of(line: &str) -> Option<PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["target"]["name"] != "ankusa" {
        return None;
    }
    message["executable"].as_str().map(PathBuf::from)
}

/// Gives this run its own name for `built` inside `dir`: a hard link (the target dir and the
/// temp dir usually share a filesystem), else a copy. Cargo replaces its output file on the
/// next build instead of rewriting it, so the link keeps the binary this run measures.
pub fn pin(built: &Path, dir: &Path, name: &str) -> Result<PathBuf, BuildError> {
    let pinned = dir.join(name);
    if std::fs::hard_link(built, &pinned).is_ok() {
        return Ok(pinned);
    }
    std::fs::copy(built, &pinned).map_err(|source| BuildError::Io {
        context: format!("copying {} to {}", built.display(), pinned.display()),
        source,
    })?;
    Ok(pinned)
}

/// Runs git in `repo` and returns its trimmed stdout.
pub fn git(repo: &Path, args: &[&str]) -> Result<String, BuildError> {
    let output = Command::new("git")
        .args(args)
        .current_dir(repo)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BuildError::Spawn {
            program: "git".into(),
            source,
        })?;
    if !output.status.success() {
        return Err(BuildError::Failed {
            command: format!(
                "git {} ({})",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            status: output.status.to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// A detached `git worktree` of one revision, removed again on drop.
#[derive(Debug)]
pub struct Worktree {
    repo: PathBuf,
    pub path: PathBuf,
    pub commit: String,
}

impl Worktree {
    pub fn add(repo: &Path, rev: &str, path: &Path) -> Result<Worktree, BuildError> {
        let commit = git(
            repo,
            &["rev-parse", "--verify", &format!("{rev}^{{commit}}")],
        )?;
        let path_text = path.to_string_lossy().into_owned();
        git(
            repo,
            &[
                "worktree", "add", "--detach", "--quiet", &path_text, &commit,
            ],
        )?;
        Ok(Worktree {
            repo: repo.to_path_buf(),
            path: path.to_path_buf(),
            commit,
        })
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        let path = self.path.to_string_lossy().into_owned();
        if git(&self.repo, &["worktree", "remove", "--force", &path]).is_err() {
            // The directory may be gone already; forget the registration anyway.
            let _ = git(&self.repo, &["worktree", "prune"]);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_comes_from_cargos_artifact_message() {
        let artifact = r#"{"reason":"compiler-artifact","target":{"name":"ankusa","kind":["bin"]},"executable":"/t/release/ankusa","fresh":true}"#;
        assert_eq!(
            executable_of(artifact),
            Some(PathBuf::from("/t/release/ankusa"))
        );
        let library = r#"{"reason":"compiler-artifact","target":{"name":"ankusa","kind":["lib"]},"executable":null}"#;
        assert_eq!(executable_of(library), None);
        let other =
            r#"{"reason":"compiler-artifact","target":{"name":"shards"},"executable":"/x"}"#;
        assert_eq!(executable_of(other), None);
        assert_eq!(
            executable_of(r#"{"reason":"build-finished","success":true}"#),
            None
        );
        assert_eq!(executable_of("not json"), None);
    }

    #[test]
    fn a_worktree_holds_the_revision_and_is_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let setup: &[&[&str]] = &[
            &["init", "--quiet"],
            &["config", "user.email", "bench@example.com"],
            &["config", "user.name", "bench"],
        ];
        for args in setup {
            git(&repo, args).unwrap();
        }
        std::fs::write(repo.join("file"), "one").unwrap();
        git(&repo, &["add", "file"]).unwrap();
        git(
            &repo,
            &[
                "-c",
                "commit.gpgsign=false",
                "commit",
                "--quiet",
                "-m",
                "one",
            ],
        )
        .unwrap();
        let first = git(&repo, &["rev-parse", "HEAD"]).unwrap();
        std::fs::write(repo.join("file"), "two").unwrap();
        git(
            &repo,
            &[
                "-c",
                "commit.gpgsign=false",
                "commit",
                "--quiet",
                "-am",
                "two",
            ],
        )
        .unwrap();

        let path = dir.path().join("base-tree");
        let worktree = Worktree::add(&repo, "HEAD~1", &path).unwrap();
        assert_eq!(worktree.commit, first);
        assert_eq!(std::fs::read_to_string(path.join("file")).unwrap(), "one");
        drop(worktree);
        assert!(!path.exists());
        assert!(!git(&repo, &["worktree", "list"])
            .unwrap()
            .contains("base-tree"));
        assert!(Worktree::add(&repo, "no-such-rev", &path).is_err());
    }

    #[test]
    fn pin_links_or_copies() {
        let dir = tempfile::tempdir().unwrap();
        let built = dir.path().join("built");
        std::fs::write(&built, b"binary").unwrap();
        let pinned = pin(&built, dir.path(), "pinned").unwrap();
        // Cargo replaces its output by unlinking it: the pinned name must survive that.
        std::fs::remove_file(&built).unwrap();
        assert_eq!(std::fs::read(pinned).unwrap(), b"binary");
    }
}
