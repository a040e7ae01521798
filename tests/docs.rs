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

/// The lines under a heading whose text is `title`, up to the next heading of any level.
fn section<'a>(text: &'a str, title: &str) -> Option<Vec<&'a str>> {
    let mut lines = text.lines();
    lines.find(|line| line.starts_with('#') && line.trim_start_matches('#').trim() == title)?;
    Some(lines.take_while(|line| !line.starts_with('#')).collect())
}

/// The first backticked word of a table cell: `` `max_ms` `` → `max_ms`.
fn backticked(cell: &str) -> Option<&str> {
    cell.split('`').nth(1).filter(|word| !word.is_empty())
}

/// The rows of the first table in `lines`, as cells.
fn table<'a>(lines: &[&'a str]) -> Vec<Vec<&'a str>> {
    lines
        .iter()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // header and separator
        .map(|line| line.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect()
}

/// The keys a section's table lists in its first column.
fn table_keys(lines: &[&str]) -> HashSet<String> {
    table(lines)
        .iter()
        .filter_map(|row| backticked(row[0]).map(str::to_owned))
        .collect()
}

/// Reads the keys a section documents: `(section lines, accepted keys)`.
type KeyLister = fn(&[&str], &[&str]) -> HashSet<String>;

/// Keys every sink kind takes: configuration.md lists them once, in the `kind: http` table
/// ("Every kind takes `id`, `ordered` and `ordering_key` as below").
const COMMON_SINK_KEYS: &[&str] = &["kind", "id", "ordered", "ordering_key"];

/// configuration.md against the loader's own key tables: every key the loader accepts is
/// documented in the section of its mapping, and no table documents a key it refuses.
#[test]
fn configuration_md_documents_every_option_and_no_other() {
    let doc = prose(&std::fs::read_to_string(root().join("docs/configuration.md")).unwrap());
    let mut problems = Vec::new();
    for section_schema in ankusa::config::schema() {
        let ankusa::config::Section {
            path,
            variant,
            keys,
        } = section_schema;
        // The heading that documents this mapping, and how it lists the keys.
        let (title, listed): (String, KeyLister) = match (path, variant) {
            // The root's keys are the level-2 headings checked below.
            ("", None) => {
                let headings: HashSet<String> = doc
                    .lines()
                    .filter_map(|line| line.strip_prefix("## "))
                    .map(|title| title.trim().to_owned())
                    .collect();
                let documented = keys
                    .iter()
                    .filter(|key| headings.contains(**key))
                    .map(|key| key.to_string())
                    .collect();
                compare(&mut problems, "top-level sections".into(), documented, keys);
                continue;
            }
            ("tenants[]", None) => ("tenants".into(), |lines, _| table_keys(lines)),
            ("sources[]", None) => ("sources".into(), |lines, _| table_keys(lines)),
            // Prose sections: each key is named in backticks (or as `{key: …}`).
            ("instance.cores", None) => ("instance.cores".into(), mentioned),
            ("store_headers", None) => ("store_headers (instance and source)".into(), mentioned),
            ("sources[].dedupe", None) => ("sources[].dedupe".into(), mentioned),
            ("sources[].sinks[].ordering_key", None) => ("Ordered sinks".into(), mentioned),
            ("sources[].verify", Some(("scheme", scheme))) => {
                let Some(lines) = section(&doc, "sources[].verify") else {
                    problems.push("no section `### sources[].verify`".into());
                    continue;
                };
                let Some(row) = table(&lines)
                    .into_iter()
                    .find(|row| backticked(row[0]) == Some(scheme))
                else {
                    problems.push(format!("sources[].verify: no row for scheme `{scheme}`"));
                    continue;
                };
                // The keys column: `token` (required), `header` (default …).
                let mut documented: HashSet<String> = row[1]
                    .split(", ")
                    .filter_map(backticked)
                    .map(str::to_owned)
                    .collect();
                documented.insert("scheme".into());
                compare(
                    &mut problems,
                    format!("sources[].verify (scheme: {scheme})"),
                    documented,
                    keys,
                );
                continue;
            }
            ("sources[].sinks[]", Some(("kind", kind))) => {
                let Some(lines) = section(&doc, &format!("kind: {kind}")) else {
                    problems.push(format!("no section `#### kind: {kind}`"));
                    continue;
                };
                let mut documented = table_keys(&lines);
                documented.extend(COMMON_SINK_KEYS.iter().map(|key| key.to_string()));
                compare(
                    &mut problems,
                    format!("sources[].sinks[] (kind: {kind})"),
                    documented,
                    keys,
                );
                continue;
            }
            (path, None) => (path.to_owned(), |lines, _| table_keys(lines)),
            (path, Some((key, value))) => {
                problems.push(format!(
                    "{path} ({key}: {value}): the test knows no heading for it"
                ));
                continue;
            }
        };
        let Some(lines) = section(&doc, &title) else {
            problems.push(format!("{path}: no section headed `{title}`"));
            continue;
        };
        compare(&mut problems, path.to_owned(), listed(&lines, keys), keys);
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md and the loader disagree:\n{}",
        problems.join("\n")
    );
}

/// Records what `documented` lacks of the accepted `keys` and what it has beyond them.
fn compare(problems: &mut Vec<String>, what: String, documented: HashSet<String>, keys: &[&str]) {
    let accepted: HashSet<String> = keys.iter().map(|key| key.to_string()).collect();
    let mut undocumented: Vec<_> = accepted.difference(&documented).collect();
    let mut unknown: Vec<_> = documented.difference(&accepted).collect();
    undocumented.sort();
    unknown.sort();
    if !undocumented.is_empty() {
        problems.push(format!("{what}: not documented: {undocumented:?}"));
    }
    if !unknown.is_empty() {
        problems.push(format!(
            "{what}: documented but refused by the loader: {unknown:?}"
        ));
    }
}

/// The keys a prose section names: in backticks or as the key of a `{key: …}` form. Only
/// the accepted keys can be looked for in prose, so this side checks completeness only.
fn mentioned(lines: &[&str], keys: &[&str]) -> HashSet<String> {
    let text = lines.join("\n");
    keys.iter()
        .filter(|key| text.contains(&format!("`{key}`")) || text.contains(&format!("{{{key}: ")))
        .map(|key| key.to_string())
        .collect()
}
