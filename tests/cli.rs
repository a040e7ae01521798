//! The command line: `check-config` lists every problem with its YAML path and exits 1,
//! or prints a summary and exits 0; `store verify` refuses a directory that is no store;
//! every verb's help shows examples, and each example parses.
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

/// The verbs (or sub-verbs) a help text lists under `Commands:`, without `help`.
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        // A wrapped description continues deeper indented.
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The command lines of a help text's `Examples:` block (indented lines that start with
/// `ankusa`), each without its trailing `# comment`.
fn examples(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Examples:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| line.starts_with("ankusa "))
        .map(str::to_owned)
        .collect()
}

/// `args --help` (or `help`), which must exit 0.
fn help_of(args: &[&str]) -> String {
    let output = Command::new(BIN).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "ankusa {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs one example against nothing and fails if clap refused its command line.
///
/// There is no parse-only mode, so the example runs for real with its values pointed at
/// nothing: paths into an empty directory (no config, no store, nowhere that matters to
/// write) and the admin API at a port nobody listens on. The locked-memory limit is 0,
/// so a `serve` that got past its config refuses to start before it binds or writes
/// anything. What is left is the verb's own failure (exit 1, or 2 for a config the loader
/// refused), never clap's usage error (exit 2 with `Usage:`).
fn assert_example_parses(example: &str, sandbox: &std::path::Path, closed_admin: &str) {
    use std::os::unix::process::CommandExt;
    assert!(
        !example.contains(['"', '\'', '$', '`']),
        "example {example:?}: keep examples to plain words so they can be run here"
    );
    let mut words = example.split_whitespace().skip(1);
    let mut args: Vec<String> = Vec::new();
    let mut has_admin = false;
    while let Some(word) = words.next() {
        args.push(word.to_owned());
        let value = match word {
            "--config" | "--data-dir" | "--out" => {
                let given = words.next().unwrap_or_default();
                let name = std::path::Path::new(given).file_name().unwrap_or_default();
                sandbox.join("none").join(name).display().to_string()
            }
            "--admin" => {
                has_admin = true;
                words.next();
                closed_admin.to_owned()
            }
            _ => continue,
        };
        args.push(value);
    }
    let admin_verb = !matches!(
        args.first().map(String::as_str),
        Some("serve" | "check-config" | "store")
    );
    if admin_verb && !has_admin {
        args.extend(["--admin".to_owned(), closed_admin.to_owned()]);
    }
    let mut command = Command::new(BIN);
    command.args(&args).current_dir(sandbox);
    // SAFETY: getrlimit and setrlimit are async-signal-safe; only the child's own soft
    // limit is lowered.
    unsafe {
        command.pre_exec(|| {
            let mut limit: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = 0;
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refused_config =
        output.status.code() == Some(2) && stderr.starts_with("ankusa: invalid config");
    assert!(
        !stderr.contains("Usage:") && (output.status.code() != Some(2) || refused_config),
        "example {example:?} (run as ankusa {}) does not parse: exit {:?}\n{stderr}",
        args.join(" "),
        output.status.code()
    );
    if args[0] == "serve" {
        assert!(
            refused_config || stderr.contains("locked-memory limit"),
            "example {example:?} got further than it may here:\n{stderr}"
        );
    }
    if admin_verb && !stderr.contains("add --yes") {
        assert!(
            stderr.contains("cannot reach the admin API"),
            "example {example:?} did not get as far as the admin API:\n{stderr}"
        );
    }
}

/// `ankusa help`, and `--help` of every verb and sub-verb, show at least one example, each
/// example names the command whose help shows it, and each example's command line parses.
#[test]
fn every_verb_shows_examples_that_parse() {
    let sandbox = tempfile::tempdir().unwrap();
    let closed_admin = {
        // A port that was just free: nothing answers there.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let top = help_of(&["help"]);
    let mut paths: Vec<Vec<String>> = vec![vec![]];
    for verb in commands(&top) {
        let help = help_of(&[verb.as_str(), "--help"]);
        for sub in commands(&help) {
            paths.push(vec![verb.clone(), sub]);
        }
        paths.push(vec![verb]);
    }
    // Every verb of the tool, so a verb that stops being listed is noticed too.
    for verb in [
        "serve",
        "check-config",
        "store",
        "dlq",
        "archive",
        "quarantine",
        "tenants",
        "stats",
    ] {
        assert!(
            paths.iter().any(|path| path == &[verb]),
            "{verb} is not listed by ankusa help:\n{top}"
        );
    }
    let mut checked = 0;
    for path in &paths {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        let help = if args.is_empty() {
            top.clone()
        } else {
            args.push("--help");
            help_of(&args)
        };
        let shown = examples(&help);
        let name = format!("ankusa {}", path.join(" ")).trim_end().to_owned();
        assert!(!shown.is_empty(), "{name} --help shows no example:\n{help}");
        for example in &shown {
            assert!(
                example == &name || example.starts_with(&format!("{name} ")),
                "{name} --help shows an example of another command: {example}"
            );
            assert_example_parses(example, sandbox.path(), &closed_admin);
            checked += 1;
        }
    }
    // The top level, 8 verbs and (at least) the 13 sub-verbs below them: sub-verbs were
    // found too.
    assert!(paths.len() >= 22, "{paths:?}");
    assert!(checked >= paths.len());
}
