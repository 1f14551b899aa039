//! A run config's TOML text as a base and the changes a test makes to it.
//! Shared by colo-rl's and colo's integration tests (colo's
//! `tests/common/mod.rs` includes this file by its path).
//!
//! TOML refuses a key given twice, so a test cannot append its own value
//! of a key the base sets; `with` replaces it instead. The text is read a
//! line at a time: a `[section]` or `[[array]]` header, or one
//! `key = value` (a value on one line).

use std::path::{Path, PathBuf};

/// Sections of `key = value` lines, in the order they were first named.
#[derive(Clone, Debug, Default)]
pub struct RunToml {
    sections: Vec<Section>,
}

#[derive(Clone, Debug)]
struct Section {
    /// `[data]`, `[algorithm.filter_groups]`, `[[reward.terms]]`.
    header: String,
    lines: Vec<String>,
}

/// The key of a `key = value` line.
fn key_of(line: &str) -> &str {
    line.split('=').next().unwrap_or(line).trim()
}

impl RunToml {
    /// This config with `text`'s sections merged in: a key's line replaces
    /// the section's line of that key, or is added at the section's end; a
    /// section not here yet is added at the end, and an `[[array]]` header
    /// always adds one (another element of the array). Blank lines and
    /// comments are dropped.
    pub fn with(&self, text: &str) -> Self {
        let mut out = self.clone();
        let mut at = None;
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with('[') {
                let known = (out.sections.iter()).position(|s| s.header == line);
                at = Some(match known {
                    Some(i) if !line.starts_with("[[") => i,
                    _ => {
                        let header = line.to_owned();
                        out.sections.push(Section {
                            header,
                            lines: Vec::new(),
                        });
                        out.sections.len() - 1
                    }
                });
                continue;
            }
            let i = at.unwrap_or_else(|| panic!("`{line}` is under no [section] in:\n{text}"));
            let lines = &mut out.sections[i].lines;
            match lines.iter_mut().find(|l| key_of(l) == key_of(line)) {
                Some(old) => *old = line.to_owned(),
                None => lines.push(line.to_owned()),
            }
        }
        out
    }

    /// This config without `key` of `[section]`, which it must have (a
    /// test that removes a key the base never set checks nothing).
    pub fn without(&self, section: &str, key: &str) -> Self {
        let mut out = self.clone();
        let header = format!("[{section}]");
        let lines = (out.sections.iter_mut())
            .find(|s| s.header == header)
            .map(|s| &mut s.lines)
            .unwrap_or_else(|| panic!("no {header} in:\n{}", self.text()));
        let before = lines.len();
        lines.retain(|l| key_of(l) != key);
        assert!(
            lines.len() < before,
            "no {key} in {header}:\n{}",
            self.text()
        );
        out
    }

    /// The TOML text.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for s in &self.sections {
            text += &format!("{}\n", s.header);
            for line in &s.lines {
                text += &format!("{line}\n");
            }
            text.push('\n');
        }
        text
    }

    /// The text written to `path`, which is returned.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.text()).unwrap();
        path.to_owned()
    }
}
