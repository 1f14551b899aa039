//! Lines and field names for configuration errors, from the spans of
//! the file's keys as `toml`'s parser reads them ([`written`]): a `toml`
//! error's span names the key it is in, and a validation error's field
//! path finds the line where the key is written.

use std::ops::Range;
use std::path::Path;

use super::print;
use crate::Error;

/// A `toml` error as [`Error::Config`], with the line and the field.
pub(crate) fn toml_error(e: &toml::de::Error, text: &str, path: &Path) -> Error {
    let mut line = e.span().map(|s| line_of(text, s.start));
    let mut field = e
        .span()
        .and_then(|span| field_at(text, span.start))
        .unwrap_or_else(|| "<file>".to_owned());
    // `toml` names the table of an unknown key; name the key itself, and
    // find its line (a buffered table, like `[reward]`, reports its header).
    let mut message = e.message().trim().to_owned();
    if let Some(unknown) = quoted(e.message(), "unknown field `") {
        // The field may be a header's path that holds the unknown key as
        // one of its parts (`[foo.bar]`: unknown top-level `foo`): cut it
        // there, rather than append the key again (`foo.bar.foo`).
        let parts: Vec<&str> = field.split('.').collect();
        match parts.iter().position(|p| *p == unknown) {
            Some(i) => field = parts[..=i].join("."),
            None => field = join(&field, unknown),
        }
        line = key_line(text, &field).or(line);
        match setting_of_other_kinds(&field) {
            // `after` with `kind = "exact_match"`: the key is colo's, for
            // other kinds (serde says "there are no fields" of a kind that
            // has none).
            Some(kinds) => {
                message = format!(
                "unknown field `{unknown}`: `{field}` is a setting of reward.kind = {kinds} only"
            )
            }
            None => {
                message = message.replace(", there are no fields", ", expected no other key");
                message.push_str(&where_colo_keeps(&field));
            }
        }
    }
    // `toml`'s word for a choice written as a number or a list: say the
    // choices (of the key an alias, like `lr_scheduler_type`, stands for).
    if message == "wanted string or table" {
        let name = field.rsplit('.').next().unwrap_or(&field);
        let doc = (print::docs().iter()).find(|d| d.key == field || d.k.aliases.contains(&name));
        if let Some(doc) = doc {
            message = format!("wanted a string: {}", doc.k.unit);
        }
    }
    // A key written under both its names.
    if let Some(name) = quoted(e.message(), "duplicate field `") {
        let key = join(&field, name);
        if let Some(doc) = print::docs().iter().find(|d| d.key == key) {
            let other = doc.k.aliases.join("` or `");
            if !other.is_empty() {
                message.push_str(&format!(
                    ": the file sets it twice, also as `{other}` (another name for it); keep one"
                ));
            }
        }
    }
    // serde names Rust's types: say what they mean.
    for (rust, plain) in [
        ("expected usize", "expected a whole number ≥ 0"),
        ("expected u64", "expected a whole number ≥ 0"),
        ("expected u32", "expected a whole number ≥ 0"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
    ] {
        message = message.replace(rust, plain);
    }
    Error::Config {
        path: path.to_owned(),
        line,
        field,
        message,
    }
}

/// `"numeric"` or `"external" or "python"`: the reward kinds that have the
/// setting `field` (`reward.after`); `None` for any other field.
fn setting_of_other_kinds(field: &str) -> Option<String> {
    let doc = print::docs().iter().find(|d| d.key == field)?;
    let mut quoted: Vec<String> = doc.k.kinds.iter().map(|k| format!("{k:?}")).collect();
    quoted.sort();
    (!quoted.is_empty()).then(|| quoted.join(" or "))
}

/// Most keys a hint lists before it sends the reader to `--print-config`.
const HINT_KEYS: usize = 6;

/// A hint for an unknown key `name`: the keys of colo's file that hold it
/// — those named `name` in another section, and those whose verl spelling
/// has `name` as one of its dotted parts (verl's `data.max_response_length`
/// is colo's `rollout.max_new_tokens`; verl's `optim` settings are in
/// `[actor]`) — and where to see them all.
fn where_colo_keeps(field: &str) -> String {
    let (parent, name) = match field.rsplit_once('.') {
        Some((parent, name)) => (parent.rsplit('.').next(), name),
        None => (None, field),
    };
    let verl_paths = |d: &print::Doc| {
        (d.k.verl
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')))
        .chain(d.k.aliases.iter().copied())
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let is_part = |path: &String| path.split('.').any(|part| part == name);
    let mut keys: Vec<&str> = (print::docs().iter())
        .filter(|d| d.key.rsplit('.').next() == Some(name) || verl_paths(d).iter().any(is_part))
        .map(|d| d.key.as_str())
        .collect();
    // Too many to list: those of verl's `parent.name` may be few
    // (`[actor.optim]` is the actor's optimizer, `[critic.optim]` the critic's).
    if let (Some(parent), true) = (parent, keys.len() > HINT_KEYS) {
        let within = format!("{parent}.{name}");
        let narrowed: Vec<&str> = (print::docs().iter())
            .filter(|d| verl_paths(d).iter().any(|p| p.contains(&within)))
            .map(|d| d.key.as_str())
            .collect();
        if !narrowed.is_empty() {
            keys = narrowed;
        }
    }
    let all = "`colo train --print-config` writes every key with verl's name beside it";
    match keys.len() {
        0 => format!(" ({all})"),
        n if n <= HINT_KEYS => format!(
            ". colo keeps it as {} ({all})",
            keys.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => format!(". {all}"),
    }
}

/// `X` of serde's "unknown field `X`, expected …" (`start` "unknown
/// field `") or "duplicate field `X`".
fn quoted<'a>(message: &'a str, start: &str) -> Option<&'a str> {
    let rest = message.strip_prefix(start)?;
    Some(&rest[..rest.find('`')?])
}

/// A key written in the file: its dotted path (`reward.terms.weight` for
/// every term of an array of tables), the byte range of the key, and of
/// its value (for a table under a `[header]`, the header).
struct Written {
    path: String,
    key: Range<usize>,
    value: Range<usize>,
    inline_table: bool,
}

/// Every key of `text`, as far as it parses.
fn written(text: &str) -> Vec<Written> {
    fn walk(text: &str, prefix: &str, t: &toml::de::DeTable, out: &mut Vec<Written>) {
        for (k, v) in t {
            let path = join(prefix, k.get_ref());
            let value = v.span();
            let inline_table = matches!(v.get_ref(), toml::de::DeValue::Table(_))
                && text.get(value.clone()).is_some_and(|s| s.starts_with('{'));
            out.push(Written {
                path: path.clone(),
                key: k.span(),
                value,
                inline_table,
            });
            let tables = match v.get_ref() {
                toml::de::DeValue::Table(t) => vec![t],
                toml::de::DeValue::Array(a) => (a.iter())
                    .filter_map(|v| match v.get_ref() {
                        toml::de::DeValue::Table(t) => Some(t),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            for t in tables {
                walk(text, &path, t, out);
            }
        }
    }
    let (doc, _) = toml::de::DeTable::parse_recoverable(text);
    let mut out = Vec::new();
    walk(text, "", doc.get_ref(), &mut out);
    out
}

/// The 1-based line of byte `at`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// The field whose key or value holds byte `at`: the deepest one.
fn field_at(text: &str, at: usize) -> Option<String> {
    let holds = |r: &Range<usize>| r.start <= at && (at < r.end || r.is_empty() && at == r.start);
    (written(text).into_iter())
        .filter(|w| holds(&w.key) || holds(&w.value))
        .max_by_key(|w| w.path.len())
        .map(|w| w.path)
}

/// The 1-based line where `field` (`section.key`) is written, if it is.
/// A field inside an inline table (`reward = { kind = "format" }`) is
/// found at its table's line.
pub(crate) fn key_line(text: &str, field: &str) -> Option<usize> {
    let written = written(text);
    if let Some(w) = written.iter().find(|w| w.path == field) {
        return Some(line_of(text, w.key.start));
    }
    (written.iter())
        .filter(|w| w.inline_table && field.starts_with(&format!("{}.", w.path)))
        .max_by_key(|w| w.path.len())
        .map(|w| line_of(text, w.key.start))
}

fn join(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_owned()
    } else {
        format!("{section}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "seed = 1\n[actor]\nlr = 1\n# lr = 2\nppo_epochs = 2\n\n[[reward.terms]]\nweight = 1\nreward = { kind = \"format\" }\n[data.builtin]\nmax_operand = 9\n";

    #[test]
    fn finds_keys_under_their_headers() {
        assert_eq!(key_line(TEXT, "seed"), Some(1));
        assert_eq!(key_line(TEXT, "actor.lr"), Some(3));
        assert_eq!(key_line(TEXT, "actor.ppo_epochs"), Some(5));
        assert_eq!(key_line(TEXT, "reward.terms.weight"), Some(8));
        assert_eq!(key_line(TEXT, "reward.terms.reward.open"), Some(9));
        assert_eq!(key_line(TEXT, "data.builtin.max_operand"), Some(11));
        assert_eq!(
            key_line(TEXT, "actor.clip_ratio"),
            None,
            "absent (a default)"
        );
        assert_eq!(key_line(TEXT, "trainer.seed"), None);
    }

    #[test]
    fn names_the_field_at_a_byte() {
        let at = |s: &str| TEXT.find(s).unwrap();
        assert_eq!(field_at(TEXT, at("lr = 1")).as_deref(), Some("actor.lr"));
        assert_eq!(field_at(TEXT, at("1\n# lr")).as_deref(), Some("actor.lr"));
        assert_eq!(
            field_at(TEXT, at("max_operand")).as_deref(),
            Some("data.builtin.max_operand")
        );
        assert_eq!(field_at(TEXT, at("# lr = 2")), None);
    }
}
