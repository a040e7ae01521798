//! The documents stay true to the tree: every relative link in README.md and docs/ names a
//! file that exists (and, with `#anchor`, a heading of that file), and every repository path
//! they quote in backticks exists, so a rename that forgets the docs fails here.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's heading anchors: lower case, only letters, digits, `-`, `_` and spaces kept,
/// spaces to `-`; a repeated heading gets `-1`, `-2`, ….
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for line in prose(text).lines() {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let slug: String = heading
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
    }
    seen
}

/// `(target, anchor)` of every inline link `[text](target)` that is not a URL.
fn relative_links(text: &str) -> Vec<(String, Option<String>)> {
    let prose = prose(text);
    let mut links = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        rest = &rest[end..];
        if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor.to_owned())),
            None => (target, None),
        };
        links.push((path.to_owned(), anchor));
    }
    links
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for (path, anchor) in relative_links(&text) {
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(&path)
            };
            if !file.exists() {
                broken.push(format!("{name}: {path} does not exist"));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&target_text).contains(&anchor) {
                    broken.push(format!("{name}: {path}#{anchor}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Paths the documents quote that a run creates rather than the repository holds.
const GENERATED: &[&str] = &["bench-gate/out/", "tests/fuzz/artifacts/", "target/"];

/// Top-level directories whose quoted paths must exist.
const TREE: &[&str] = &[
    "src",
    "tests",
    "shards",
    "benches",
    "fixtures",
    "bench-gate",
    "docs",
    ".ci",
];

#[test]
fn every_quoted_repository_path_exists() {
    let mut missing = Vec::new();
    for doc in documents() {
        let text = prose(&std::fs::read_to_string(&doc).unwrap());
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for (index, span) in text.split('`').enumerate() {
            // Odd pieces are inside backticks.
            if index % 2 == 0 || !span.contains('/') || span.contains(char::is_whitespace) {
                continue;
            }
            let path = span.trim_end_matches('/');
            let first = path.split('/').next().unwrap_or_default();
            let plain = path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'));
            if !plain || !TREE.contains(&first) || GENERATED.iter().any(|g| span.starts_with(g)) {
                continue;
            }
            if !root().join(path).exists() {
                missing.push(format!("{name}: `{span}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "quoted paths that do not exist:\n{}",
        missing.join("\n")
    );
}
