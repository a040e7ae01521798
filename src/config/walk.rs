//! The generic half of config decoding: walking a parsed `serde_yaml_ng::Value` tree while
//! carrying the YAML path, collecting every problem as `path: message`, reading typed
//! scalars (with `${ENV}` substitution in strings) and rejecting unknown keys. It knows
//! nothing about Ankusa's sections; `validate` does.
//!
//! Readers return `Option<T>`: `None` means the problem has already been recorded, so the
//! caller only picks a placeholder and carries on. The caller never builds a `Config` from
//! placeholders because `parse_with_env` refuses once any problem was recorded.

use std::cell::RefCell;
use std::fmt::Display;

use serde_yaml_ng::{Mapping, Value};

/// Looks up one environment variable; tests pass a closure over a fixed table.
pub(crate) type EnvLookup<'e> = dyn Fn(&str) -> Option<String> + 'e;

/// Where the walk is in the document, plus the shared sinks every reader reports into.
#[derive(Clone)]
pub(crate) struct Ctx<'a> {
    /// `sources[2].sinks[0].url`; empty at the root.
    path: String,
    /// Shared by every `Ctx` of one parse, so a reader deep in the tree needs no `&mut`.
    problems: &'a RefCell<Vec<String>>,
    env: &'a EnvLookup<'a>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn root(problems: &'a RefCell<Vec<String>>, env: &'a EnvLookup<'a>) -> Self {
        Ctx {
            path: String::new(),
            problems,
            env,
        }
    }

    /// The context of `key` inside the current mapping.
    pub(crate) fn field(&self, key: &str) -> Ctx<'a> {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Ctx {
            path,
            problems: self.problems,
            env: self.env,
        }
    }

    /// The context of element `index` of the current list.
    pub(crate) fn index(&self, index: usize) -> Ctx<'a> {
        Ctx {
            path: format!("{}[{index}]", self.path),
            problems: self.problems,
            env: self.env,
        }
    }

    /// Records one problem at this path.
    pub(crate) fn error(&self, message: impl Display) {
        let path = if self.path.is_empty() {
            "(root)"
        } else {
            self.path.as_str()
        };
        self.problems
            .borrow_mut()
            .push(format!("{path}: {message}"));
    }

    /// Records a type mismatch: what the key needs and what the file holds.
    pub(crate) fn expected(&self, what: &str, found: &Value) {
        self.error(format_args!("expected {what}, found {}", describe(found)));
    }

    /// A mapping whose keys must all be in `allowed`.
    pub(crate) fn mapping<'v>(
        &self,
        value: &'v Value,
        allowed: &'static [&'static str],
    ) -> Option<Fields<'v, 'a>> {
        let map = self.raw_mapping(value)?;
        Some(Fields::new(self.clone(), map, allowed))
    }

    /// A mapping without the key check, for callers that pick the allowed keys from one of
    /// its values (a `verify` block's scheme) or that allow any key (static HTTP headers).
    pub(crate) fn raw_mapping<'v>(&self, value: &'v Value) -> Option<&'v Mapping> {
        match value {
            Value::Mapping(map) => Some(map),
            other => {
                self.expected("a mapping", other);
                None
            }
        }
    }

    pub(crate) fn list<'v>(&self, value: &'v Value) -> Option<&'v [Value]> {
        match value {
            Value::Sequence(items) => Some(items),
            other => {
                self.expected("a list", other);
                None
            }
        }
    }

    /// A string with `${NAME}` / `${NAME:-default}` substituted.
    pub(crate) fn string(&self, value: &Value) -> Option<String> {
        match value {
            Value::String(text) => self.substitute(text),
            other => {
                self.expected("a string", other);
                None
            }
        }
    }

    /// A string that must not be empty after substitution (ids, secrets, tokens).
    pub(crate) fn non_empty_string(&self, value: &Value) -> Option<String> {
        let text = self.string(value)?;
        if text.is_empty() {
            self.error("must not be empty");
            return None;
        }
        Some(text)
    }

    /// `true`/`false`, or a string that is one of them after substitution, so a flag can
    /// come from the environment.
    pub(crate) fn bool(&self, value: &Value) -> Option<bool> {
        let text = match value {
            Value::Bool(flag) => return Some(*flag),
            Value::String(text) => self.substitute(text)?,
            other => {
                self.expected("true or false", other);
                return None;
            }
        };
        match text.as_str() {
            "true" => Some(true),
            "false" => Some(false),
            _ => {
                self.error(format_args!("expected true or false, found {text:?}"));
                None
            }
        }
    }

    /// A non-negative integer, or a string of digits after substitution.
    pub(crate) fn uint(&self, value: &Value) -> Option<u64> {
        let text = match value {
            Value::Number(number) => match number.as_u64() {
                Some(n) => return Some(n),
                None => {
                    self.expected("a non-negative integer", value);
                    return None;
                }
            },
            Value::String(text) => self.substitute(text)?,
            other => {
                self.expected("a non-negative integer", other);
                return None;
            }
        };
        let digits = text.trim();
        match digits.parse::<u64>() {
            Ok(n) if digits.bytes().all(|byte| byte.is_ascii_digit()) => Some(n),
            _ => {
                self.error(format_args!(
                    "expected a non-negative integer, found {text:?}"
                ));
                None
            }
        }
    }

    /// A byte size: an integer, or a string like `512KiB`, `1MiB`, `64KB` (see `parse_size`).
    pub(crate) fn size(&self, value: &Value) -> Option<u64> {
        let text = match value {
            Value::Number(number) if number.as_u64().is_some() => return number.as_u64(),
            Value::String(text) => self.substitute(text)?,
            other => {
                self.expected("a size like 512KiB, 1MiB or 1048576", other);
                return None;
            }
        };
        let size = parse_size(&text);
        if size.is_none() {
            self.error(format_args!(
                "expected a size like 512KiB, 1MiB or 1048576, found {text:?}"
            ));
        }
        size
    }

    /// Checks a lower bound; used as `ctx.uint(v).and_then(|n| ctx.at_least(n, 1))`.
    pub(crate) fn at_least(&self, n: u64, min: u64) -> Option<u64> {
        if n < min {
            self.error(format_args!("must be at least {min}, found {n}"));
            return None;
        }
        Some(n)
    }

    /// `n` when it is within `range`.
    pub(crate) fn in_range(&self, n: u64, range: std::ops::RangeInclusive<u64>) -> Option<u64> {
        if !range.contains(&n) {
            self.error(format_args!(
                "must be {} to {}, found {n}",
                range.start(),
                range.end()
            ));
            return None;
        }
        Some(n)
    }

    /// Narrows a count to `usize`; only fails on targets narrower than 64 bits.
    pub(crate) fn to_usize(&self, n: u64) -> Option<usize> {
        let narrowed = usize::try_from(n).ok();
        if narrowed.is_none() {
            self.error(format_args!("{n} is too large for this machine"));
        }
        narrowed
    }

    /// Replaces `${NAME}` and `${NAME:-default}` in `text`. `$${` is a literal `${`.
    /// Substituted values are not scanned again, so a secret holding `${` stays as it is.
    /// Like the shell, `:-` also applies when the variable is set but empty.
    fn substitute(&self, text: &str) -> Option<String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        let mut complete = true;
        while let Some(dollar) = rest.find('$') {
            out.push_str(&rest[..dollar]);
            let from_dollar = &rest[dollar..];
            if let Some(tail) = from_dollar.strip_prefix("$${") {
                out.push_str("${");
                rest = tail;
                continue;
            }
            let Some(reference) = from_dollar.strip_prefix("${") else {
                out.push('$');
                rest = &from_dollar[1..];
                continue;
            };
            let Some(close) = reference.find('}') else {
                self.error("unterminated ${ (expected ${NAME} or ${NAME:-default})");
                return None;
            };
            rest = &reference[close + 1..];
            let (name, default) = match reference[..close].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&reference[..close], None),
            };
            if !is_env_name(name) {
                self.error(format_args!(
                    "invalid environment variable name {name:?} (expected letters, digits and _)"
                ));
                complete = false;
                continue;
            }
            match ((self.env)(name), default) {
                (Some(value), Some(default)) if value.is_empty() => out.push_str(default),
                (Some(value), _) => out.push_str(&value),
                (None, Some(default)) => out.push_str(default),
                (None, None) => {
                    self.error(format_args!("environment variable {name} is not set"));
                    complete = false;
                }
            }
        }
        out.push_str(rest);
        complete.then_some(out)
    }
}

/// One mapping being read; its unknown keys were reported when it was made.
pub(crate) struct Fields<'v, 'a> {
    ctx: Ctx<'a>,
    map: &'v Mapping,
}

impl<'v, 'a> Fields<'v, 'a> {
    /// Reports every key not in `allowed` (and every non-string key) at once.
    pub(crate) fn new(ctx: Ctx<'a>, map: &'v Mapping, allowed: &[&str]) -> Self {
        for key in map.keys() {
            match key {
                Value::String(name) if allowed.contains(&name.as_str()) => {}
                Value::String(name) => ctx.field(name).error(format_args!(
                    "unknown key (expected one of: {})",
                    allowed.join(", ")
                )),
                other => ctx.error(format_args!(
                    "keys must be strings, found {}",
                    describe(other)
                )),
            }
        }
        Fields { ctx, map }
    }

    /// A mapping with no keys, for an omitted section.
    pub(crate) fn empty(ctx: Ctx<'a>) -> Fields<'static, 'a> {
        static EMPTY: std::sync::OnceLock<Mapping> = std::sync::OnceLock::new();
        Fields {
            ctx,
            map: EMPTY.get_or_init(Mapping::new),
        }
    }

    pub(crate) fn ctx(&self) -> &Ctx<'a> {
        &self.ctx
    }

    /// The value of `key` and its context, if the key is present.
    pub(crate) fn get(&self, key: &str) -> Option<(Ctx<'a>, &'v Value)> {
        self.map.get(key).map(|value| (self.ctx.field(key), value))
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Reads `key` with `read` if present; `None` if absent or bad.
    pub(crate) fn opt<T>(
        &self,
        key: &str,
        read: impl FnOnce(&Ctx<'a>, &Value) -> Option<T>,
    ) -> Option<T> {
        let (ctx, value) = self.get(key)?;
        read(&ctx, value)
    }

    /// Like `opt`, but an absent key is a problem.
    pub(crate) fn required<T>(
        &self,
        key: &str,
        read: impl FnOnce(&Ctx<'a>, &Value) -> Option<T>,
    ) -> Option<T> {
        match self.get(key) {
            Some((ctx, value)) => read(&ctx, value),
            None => {
                self.ctx.field(key).error("required");
                None
            }
        }
    }

    /// A nested section: absent or `null` reads as empty, so `store:` alone is fine.
    pub(crate) fn section(&self, key: &str, allowed: &'static [&'static str]) -> Fields<'v, 'a> {
        let ctx = self.ctx.field(key);
        match self.map.get(key) {
            None | Some(Value::Null) => Fields::empty(ctx),
            Some(value) => match ctx.mapping(value, allowed) {
                Some(fields) => fields,
                None => Fields::empty(ctx),
            },
        }
    }

    /// The allowed string keys in file order, for blocks whose order matters.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'v str, Ctx<'a>, &'v Value)> + '_ {
        self.map.iter().filter_map(|(key, value)| match key {
            Value::String(name) => Some((name.as_str(), self.ctx.field(name), value)),
            _ => None,
        })
    }
}

/// How a value looks in a message. Long strings are cut so one bad value cannot flood the
/// output.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(flag) => flag.to_string(),
        Value::Number(number) => number.to_string(),
        Value::String(text) if text.chars().count() > 60 => {
            let head: String = text.chars().take(60).collect();
            format!("{head:?}…")
        }
        Value::String(text) => format!("{text:?}"),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(tagged) => format!("a value tagged {}", tagged.tag),
    }
}

/// `1048576`, `100B`, `64KB` (decimal), `512KiB`, `1MiB`, `1GiB` (binary), up to TB/TiB.
/// A space between number and unit is allowed; anything else, or an overflow, is `None`.
pub(crate) fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let count: u64 = digits.parse().ok()?;
    let multiplier: u64 = match unit.trim_start() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    count.checked_mul(multiplier)
}

/// POSIX-ish variable names: a letter or `_`, then letters, digits and `_`.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn with_ctx<T>(env: &[(&str, &str)], run: impl FnOnce(&Ctx) -> T) -> (T, Vec<String>) {
        let problems = RefCell::new(Vec::new());
        let lookup = |name: &str| {
            env.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        };
        let result = run(&Ctx::root(&problems, &lookup).field("k"));
        (result, problems.into_inner())
    }

    fn substituted(env: &[(&str, &str)], text: &str) -> (Option<String>, Vec<String>) {
        with_ctx(env, |ctx| ctx.string(&Value::String(text.to_owned())))
    }

    #[test]
    fn sizes() {
        let cases = [
            ("0", Some(0)),
            ("100B", Some(100)),
            ("64KB", Some(64_000)),
            ("512KiB", Some(512 * 1024)),
            ("1MiB", Some(1 << 20)),
            ("1 GiB", Some(1 << 30)),
            ("2TB", Some(2_000_000_000_000)),
            (" 8MiB ", Some(8 << 20)),
            ("1.5MiB", None),
            ("MiB", None),
            ("1mib", None),
            ("-1", None),
            ("1MiBs", None),
            ("99999999999999999999", None),
            ("20000000TiB", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_size(text), expected, "{text:?}");
        }
    }

    #[test]
    fn size_reader_accepts_integers_and_reports_junk() {
        let (size, problems) = with_ctx(&[], |ctx| ctx.size(&Value::from(4096)));
        assert_eq!((size, problems), (Some(4096), vec![]));
        let (size, problems) = with_ctx(&[], |ctx| ctx.size(&Value::from("lots")));
        assert_eq!(size, None);
        assert_eq!(
            problems,
            ["k: expected a size like 512KiB, 1MiB or 1048576, found \"lots\""]
        );
        let (_, problems) = with_ctx(&[], |ctx| ctx.size(&Value::from(-3)));
        assert_eq!(
            problems,
            ["k: expected a size like 512KiB, 1MiB or 1048576, found -3"]
        );
    }

    #[test]
    fn substitution_set_default_and_missing() {
        let env = [("SECRET", "s3cr3t"), ("EMPTY", "")];
        assert_eq!(
            substituted(&env, "${SECRET}"),
            (Some("s3cr3t".into()), vec![])
        );
        assert_eq!(
            substituted(&env, "a-${SECRET}-b"),
            (Some("a-s3cr3t-b".into()), vec![])
        );
        assert_eq!(
            substituted(&env, "${NOPE:-fallback}"),
            (Some("fallback".into()), vec![])
        );
        assert_eq!(
            substituted(&env, "${NOPE:-}"),
            (Some(String::new()), vec![])
        );
        assert_eq!(substituted(&env, "${EMPTY:-x}"), (Some("x".into()), vec![]));
        assert_eq!(substituted(&env, "${EMPTY}"), (Some(String::new()), vec![]));
        assert_eq!(
            substituted(&env, "${SECRET:-x}"),
            (Some("s3cr3t".into()), vec![])
        );
        assert_eq!(
            substituted(&env, "cost $5 $${X}"),
            (Some("cost $5 ${X}".into()), vec![])
        );
        assert_eq!(
            substituted(&env, "${A}${B}"),
            (
                None,
                vec![
                    "k: environment variable A is not set".to_owned(),
                    "k: environment variable B is not set".to_owned()
                ]
            )
        );
        assert_eq!(
            substituted(&env, "${SECRET"),
            (
                None,
                vec!["k: unterminated ${ (expected ${NAME} or ${NAME:-default})".to_owned()]
            )
        );
        assert_eq!(
            substituted(&env, "${1X}"),
            (
                None,
                vec![
                    "k: invalid environment variable name \"1X\" (expected letters, digits and _)"
                        .to_owned()
                ]
            )
        );
    }

    #[test]
    fn substituted_values_are_not_rescanned() {
        let env = [("TRICKY", "${OTHER}")];
        assert_eq!(
            substituted(&env, "${TRICKY}"),
            (Some("${OTHER}".into()), vec![])
        );
    }

    #[test]
    fn integers_from_numbers_and_strings() {
        let env = [("N", "42")];
        let (n, problems) = with_ctx(&env, |ctx| ctx.uint(&Value::from("${N}")));
        assert_eq!((n, problems), (Some(42), vec![]));
        let (_, problems) = with_ctx(&env, |ctx| ctx.uint(&Value::from("abc")));
        assert_eq!(
            problems,
            ["k: expected a non-negative integer, found \"abc\""]
        );
        let (_, problems) = with_ctx(&env, |ctx| ctx.uint(&Value::from(-1)));
        assert_eq!(problems, ["k: expected a non-negative integer, found -1"]);
        let (_, problems) = with_ctx(&env, |ctx| ctx.uint(&Value::from(1.5)));
        assert_eq!(problems, ["k: expected a non-negative integer, found 1.5"]);
        let (_, problems) = with_ctx(&env, |ctx| ctx.uint(&Value::from("+7")));
        assert_eq!(
            problems,
            ["k: expected a non-negative integer, found \"+7\""]
        );
    }

    #[test]
    fn paths_compose() {
        let (_, problems) = with_ctx(&[], |ctx| ctx.field("a").index(2).field("b").error("bad"));
        assert_eq!(problems, ["k.a[2].b: bad"]);
    }
}
