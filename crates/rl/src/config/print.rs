//! `colo train --print-config`: the resolved configuration as a TOML file,
//! every key with a comment (meaning, unit, default, verl's name).
//!
//! The validated [`Config`] (the serde structs, unset keys resolved) is
//! serialised by `toml` and written section by section, each key under a
//! comment made from its declaration in the structs (its doc comment and
//! `#[key(...)]` notes, listed by colo-keys' derive: [`docs`]). Reading
//! the printed text back gives the same `Config` (a test checks the round
//! trip).

use std::fmt::Write;

use toml::{Table, Value};

use super::*;

/// One key of the file: its dotted path (`actor.ppo_mini_batch_size`) and
/// what its declaration says of it ([`colo_keys::Key`]).
pub(crate) struct Doc {
    pub key: String,
    pub k: colo_keys::Key,
}

impl Doc {
    /// The meaning as printed: a reward key's kinds first (`numeric:
    /// read the first number…`).
    pub(crate) fn meaning(&self) -> String {
        match self.k.kinds {
            [] => self.k.doc.to_owned(),
            kinds => format!("{}: {}", kinds.join(", "), self.k.doc),
        }
    }
}

/// Every key of the file, in the order printed: the structs' fields in
/// declaration order, tables flattened.
pub(crate) fn docs() -> &'static [Doc] {
    static DOCS: std::sync::OnceLock<Vec<Doc>> = std::sync::OnceLock::new();
    DOCS.get_or_init(|| {
        let mut out = Vec::new();
        flatten("", <Config as colo_keys::Keys>::keys(), &mut out);
        out
    })
}

fn flatten(prefix: &str, keys: Vec<colo_keys::Key>, out: &mut Vec<Doc>) {
    for k in keys {
        let key = match prefix {
            "" => k.name.to_owned(),
            p => format!("{p}.{}", k.name),
        };
        match k.table {
            Some(table) => flatten(&key, table(), out),
            None => out.push(Doc { key, k }),
        }
    }
}

/// The documented TOML text of `c` (see the module doc).
pub(crate) fn print(c: &Config) -> std::result::Result<String, String> {
    let table = |c: &Config| Table::try_from(c).map_err(|e| e.to_string());
    let values = table(c)?;
    let defaults = table(&Config::default())?;
    let mut out = String::from(
        "# colo train: the resolved run configuration. Every key is shown with\n\
         # its meaning, unit, default and verl's name; a file needs only the keys\n\
         # it changes. Run it with `colo train --config FILE`.\n#\n",
    );
    for line in c.summary().lines() {
        let _ = writeln!(out, "#   {line}");
    }
    // The sections in the order of the file's documentation.
    let mut sections: Vec<&String> = values.keys().collect();
    sections.sort_by_key(|s| {
        docs()
            .iter()
            .position(|d| d.key.starts_with(&format!("{s}.")))
    });
    for section in sections {
        let Some(Value::Table(t)) = values.get(section) else {
            return Err(format!("`{section}` is not a table"));
        };
        write_table(&mut out, section, t, &defaults)?;
    }
    Ok(out)
}

/// `[path]`, its keys in [`docs`] order (unset optional keys as comments),
/// then its sub-tables.
fn write_table(
    out: &mut String,
    path: &str,
    t: &Table,
    defaults: &Table,
) -> std::result::Result<(), String> {
    let _ = writeln!(out, "\n[{path}]");
    let prefix = format!("{path}.");
    let mut leaves = t.iter().filter(|(_, v)| !v.is_table());
    if free_form(path) {
        for (k, v) in leaves {
            let _ = writeln!(out, "{k} = {}", value_text(v));
        }
    } else if let Some((k, _)) = leaves.find(|(k, _)| {
        !docs()
            .iter()
            .any(|d| d.key.strip_prefix(&prefix) == Some(k))
    }) {
        return Err(format!(
            "`{prefix}{k}` is not a key of the config's structs"
        ));
    }
    for d in docs() {
        let Some(k) = d.key.strip_prefix(&prefix).filter(|k| !k.contains('.')) else {
            continue;
        };
        let line = match t.get(k) {
            Some(Value::Table(_)) => continue,
            Some(v) => format!("{k} = {}", value_text(v)),
            // An optional key that is unset (for a reward key: of this kind).
            None if !d.k.unset.is_empty() && relevant(d, t) => format!("# {k} = …  (unset)"),
            None => continue,
        };
        let default = lookup(defaults, &d.key)
            .map(value_text)
            .or_else(|| reward_default(&d.key));
        let _ = writeln!(out, "# {}\n{line}", comment(d, default.as_deref()));
    }
    for (k, v) in t {
        if let Value::Table(sub) = v {
            write_table(out, &format!("{path}.{k}"), sub, defaults)?;
        }
    }
    Ok(())
}

/// A value as TOML, a float far from 1 in exponent form (`1e300`, not a
/// 1 and 300 zeros; see [`super::num::Num`]); the rest as the toml crate
/// writes it (`0.0` stays a float).
fn value_text(v: &Value) -> String {
    match v {
        Value::Float(f) if super::num::Num::far_from_one(*f) => super::num::Num(*f).to_string(),
        _ => v.to_string(),
    }
}

/// A table whose keys are the user's (the python reward's `kwargs`),
/// documented as a whole.
fn free_form(path: &str) -> bool {
    path == "reward.kwargs"
}

/// Unset reward keys are shown only for the reward kinds that have them.
fn relevant(d: &Doc, t: &Table) -> bool {
    let kind = t.get("kind").and_then(Value::as_str);
    d.k.kinds.is_empty() || kind.is_some_and(|kind| d.k.kinds.contains(&kind))
}

/// The default of a reward key that the default reward (`exact_match`)
/// does not have: serde's, read from the smallest spec of a kind with it
/// (`timeout_s` = 30, `workers` = 1 for `external` and `python`).
fn reward_default(key: &str) -> Option<String> {
    let name = key.strip_prefix("reward.")?;
    const SMALLEST: [&str; 3] = [
        "kind = \"numeric\"",
        "kind = \"external\"\ncommand = [\"x\"]",
        "kind = \"python\"\npath = \"x.py\"",
    ];
    SMALLEST.iter().find_map(|text| {
        let spec: crate::reward::RewardSpec = toml::from_str(text).ok()?;
        let table = Table::try_from(&spec).ok()?;
        table.get(name).map(value_text)
    })
}

/// `meaning [unit]. Default: …. verl: …`
fn comment(d: &Doc, default: Option<&str>) -> String {
    let mut s = d.meaning();
    if !d.k.unit.is_empty() {
        let _ = write!(s, " [{}]", d.k.unit);
    }
    match (default, d.k.unset.is_empty()) {
        (Some(v), _) => {
            let _ = write!(s, ". Default: {v}");
        }
        (None, false) => {
            let _ = write!(s, ". Default: unset ({})", d.k.unset);
        }
        (None, true) => {}
    }
    if !d.k.verl.is_empty() {
        let _ = write!(s, ". verl: {}", d.k.verl);
    }
    if !d.k.aliases.is_empty() {
        let _ = write!(s, ". Also read as: {}", d.k.aliases.join(", "));
    }
    s
}

/// The value at a dotted path.
fn lookup<'a>(t: &'a Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = t.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_key_is_a_key_and_none_twice() {
        let mut seen = std::collections::HashSet::new();
        for d in docs() {
            assert!(seen.insert(&d.key), "{} twice", d.key);
            assert!(!d.k.doc.is_empty(), "{} has no doc comment", d.key);
        }
        // Each key, set alone, is accepted (or refused for its value, not
        // as an unknown field).
        for d in docs() {
            let (section, key) = d.key.rsplit_once('.').unwrap();
            let text = format!("[{section}]\n{key} = \"?\"\n");
            let e = Config::from_toml(&text, std::path::Path::new("t.toml"));
            if let Err(e) = e {
                assert!(!e.to_string().contains("unknown field"), "{}: {e}", d.key);
            }
        }
    }

    #[test]
    fn capacities_print_in_whole_units_or_bytes() {
        let text = |b: u64| toml::Value::from(Capacity::Bytes(b)).to_string();
        assert_eq!(text(24 << 30), "\"24 GiB\"");
        assert_eq!(text(1536 << 20), "\"1536 MiB\"");
        assert_eq!(text(1000), "1000");
    }
}
