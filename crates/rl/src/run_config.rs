//! `config.toml` in a run directory: the resolved configuration the run
//! used (every key, as `colo train --print-config` prints it), so that a
//! run's outputs say what made them; and, on `--resume`, which keys differ
//! from it (continuing under other settings is allowed: a longer
//! `total_steps` is the usual reason; the run says so).

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::Config;
use crate::{Error, Result};

/// The file's name in the run directory.
pub const FILE: &str = "config.toml";

/// Writes `config` as the run directory's `config.toml`.
pub fn write(out: &Path, config: &Config) -> Result<()> {
    let path = out.join(FILE);
    std::fs::write(&path, config.to_toml()?).map_err(|e| Error::io(&path, e))
}

/// The keys whose values differ between the run directory's `config.toml`
/// (what the run used so far) and `config`, as one note; `None` when they
/// agree or the directory has none (a run of an older colo). A
/// `config.toml` that does not read is said in the note, not an error.
pub fn changes(out: &Path, config: &Config) -> Result<Option<String>> {
    let path = out.join(FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    // A record that does not read (edited by hand) is no reason to stop.
    let saved: toml::Table = match toml::from_str(&text) {
        Ok(t) => t,
        Err(e) => {
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            return Ok(Some(format!(
                "--resume: {} does not read ({first}); the configuration was not compared",
                path.display()
            )));
        }
    };
    let now = toml::Table::try_from(config).map_err(|e| Error::Config {
        path: path.clone(),
        line: None,
        field: "<file>".into(),
        message: e.to_string(),
    })?;
    let (saved, now) = (flatten(&saved), flatten(&now));
    let keys: std::collections::BTreeSet<&String> = saved.keys().chain(now.keys()).collect();
    let shown = |v: Option<&String>| v.cloned().unwrap_or_else(|| "unset".into());
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| saved.get(*k) != now.get(*k))
        .map(|k| format!("{k}: {} → {}", shown(saved.get(k)), shown(now.get(k))))
        .collect();
    Ok((!diffs.is_empty()).then(|| {
        format!(
            "--resume: the configuration differs from the run's {FILE} in {}; \
             continuing with the new one ({FILE} now holds it)",
            diffs.join(", ")
        )
    }))
}

/// `section.key` → the value as TOML text, for every leaf of `t`.
fn flatten(t: &toml::Table) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in t {
        match v {
            toml::Value::Table(inner) => {
                for (ik, iv) in flatten(inner) {
                    out.insert(format!("{k}.{ik}"), iv);
                }
            }
            v => {
                out.insert(k.clone(), v.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_keys_are_named_and_a_broken_record_is_only_noted() {
        let dir = std::env::temp_dir().join(format!("colo-run-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = Config::builtin();
        assert_eq!(changes(&dir, &first).unwrap(), None, "no record yet");
        write(&dir, &first).unwrap();
        assert_eq!(changes(&dir, &first).unwrap(), None);
        let mut longer = first.clone();
        longer.trainer.total_steps = Some(200);
        let note = changes(&dir, &longer).unwrap().unwrap();
        assert!(
            note.contains("in trainer.total_steps: 100 → 200;"),
            "{note}"
        );
        std::fs::write(dir.join(FILE), "[trainer\n").unwrap();
        let note = changes(&dir, &longer).unwrap().unwrap();
        assert!(
            note.contains("does not read") && note.contains("not compared"),
            "{note}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
