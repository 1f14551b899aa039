//! Lines and field names for configuration errors.
//!
//! `toml`'s errors carry a byte span and (when it knows them) the key path;
//! validation errors carry a field path only, whose line is found by
//! scanning the file's table headers and keys — enough for the flat,
//! section-per-topic files a run config is.

use std::path::Path;

use super::print;
use crate::Error;

/// A `toml` error as [`Error::Config`], with the line and the field.
pub(crate) fn toml_error(e: &toml::de::Error, text: &str, path: &Path) -> Error {
    let mut line = e
        .span()
        .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    let mut field = keys_of(e)
        .or_else(|| line.and_then(|l| field_at_line(text, l)))
        .unwrap_or_else(|| "<file>".to_owned());
    // `toml` names the table of an unknown key; name the key itself, and
    // find its line (a buffered table, like `[reward]`, reports its header).
    let mut message = e.message().trim().to_owned();
    if let Some(unknown) = unknown_field(e.message()) {
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
        let doc = (print::DOCS.iter()).find(|d| d.key == field || aliases(d).contains(&name));
        if let Some(doc) = doc {
            message = format!("wanted a string: {}", doc.unit);
        }
    }
    // A key written under both its names.
    if let Some(name) = duplicate_field(e.message()) {
        let key = join(&field, name);
        if let Some(doc) = print::DOCS.iter().find(|d| d.key == key) {
            let other = aliases(doc).join("` or `");
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

/// `"numeric"` or `"external" or "python"`: the reward kinds whose setting
/// `field` (`reward.after`) is, as its documentation begins
/// ("numeric: read the first number…"); `None` for any other field.
fn setting_of_other_kinds(field: &str) -> Option<String> {
    if !field.starts_with("reward.") {
        return None;
    }
    let doc = print::DOCS.iter().find(|d| d.key == field)?;
    let (kinds, _) = doc.meaning.split_once(": ")?;
    let kinds: Vec<&str> = kinds.split(", ").collect();
    let kind = |k: &&str| k.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    if !kinds.iter().all(kind) {
        return None;
    }
    let quoted: Vec<String> = kinds.iter().map(|k| format!("{k:?}")).collect();
    Some(quoted.join(" or "))
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
        (d.verl
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')))
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let is_part = |path: &String| path.split('.').any(|part| part == name);
    let mut keys: Vec<&str> = (print::DOCS.iter())
        .filter(|d| d.key.rsplit('.').next() == Some(name) || verl_paths(d).iter().any(is_part))
        .map(|d| d.key)
        .collect();
    // Too many to list: those of verl's `parent.name` may be few
    // (`[actor.optim]` is the actor's optimizer, `[critic.optim]` the critic's).
    if let (Some(parent), true) = (parent, keys.len() > HINT_KEYS) {
        let within = format!("{parent}.{name}");
        let narrowed: Vec<&str> = (print::DOCS.iter())
            .filter(|d| verl_paths(d).iter().any(|p| p.contains(&within)))
            .map(|d| d.key)
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

/// The key path `toml` recorded. It is private, but printed as
/// "in `a.b`" when the error has no input to quote.
fn keys_of(e: &toml::de::Error) -> Option<String> {
    let mut bare = e.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    let keys = shown
        .lines()
        .last()?
        .strip_prefix("in `")?
        .strip_suffix('`')?;
    Some(keys.to_owned())
}

/// The other names a key is read under (its doc's "(alias: a, b)").
fn aliases(doc: &print::Doc) -> Vec<&str> {
    let Some((_, rest)) = doc.verl.split_once("alias: ") else {
        return Vec::new();
    };
    let list = rest.split(')').next().unwrap_or_default();
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect()
}

/// `X` of serde's "duplicate field `X`".
fn duplicate_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("duplicate field `")?;
    Some(&rest[..rest.find('`')?])
}

/// `X` of serde's "unknown field `X`, expected …".
fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(&rest[..rest.find('`')?])
}

/// `section.key` for a `key = …` line (1-based), or `section` for a header.
fn field_at_line(text: &str, line: usize) -> Option<String> {
    let mut section = String::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if let Some(h) = header(l) {
            section = h;
            if i + 1 == line {
                return Some(section);
            }
        } else if i + 1 == line {
            return Some(join(&section, &key(l)?));
        }
    }
    None
}

/// The 1-based line where `field` (`section.key`) is written, if it is.
/// A field inside an inline table is found at its table's line.
pub(crate) fn key_line(text: &str, field: &str) -> Option<usize> {
    let mut section = String::new();
    let mut best = None;
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        let (here, is_key) = match header(l) {
            Some(h) => {
                section = h;
                (section.clone(), false)
            }
            None => match key(l) {
                Some(k) => (join(&section, &k), true),
                None => continue,
            },
        };
        if here == field {
            return Some(i + 1);
        }
        // An inline table (`reward = { … }`) holds the fields under it.
        let inline = is_key && field.starts_with(&format!("{here}."));
        if inline && best.is_none_or(|(len, _)| here.len() > len) {
            best = Some((here.len(), i + 1));
        }
    }
    best.map(|(_, line)| line)
}

/// `[a.b]` or `[[a.b]]` → `a.b`.
fn header(l: &str) -> Option<String> {
    let inner = l.strip_prefix('[')?;
    let inner = inner.strip_prefix('[').unwrap_or(inner);
    let end = inner.find(']')?;
    Some(
        inner[..end]
            .split('.')
            .map(|p| p.trim().trim_matches('"'))
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// The (possibly dotted) key of a `key = value` line.
fn key(l: &str) -> Option<String> {
    if l.starts_with('#') {
        return None;
    }
    let (k, _) = l.split_once('=')?;
    let k: Vec<&str> = k.split('.').map(|p| p.trim().trim_matches('"')).collect();
    (!k.iter().any(|p| p.is_empty())).then(|| k.join("."))
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
    fn names_the_field_of_a_line() {
        assert_eq!(field_at_line(TEXT, 3).as_deref(), Some("actor.lr"));
        assert_eq!(field_at_line(TEXT, 10).as_deref(), Some("data.builtin"));
        assert_eq!(field_at_line(TEXT, 6), None);
    }
}
