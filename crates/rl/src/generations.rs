//! verl's generation dumps (`trainer.rollout_data_dir`,
//! `trainer.validation_data_dir`): what the policy wrote, every step and
//! every evaluation, as `{dir}/{step}.jsonl`, one JSON object a sample with
//! the keys of verl's `RayPPOTrainer._dump_generations`: `input` (the
//! prompt as the model saw it, special tokens left out), `output`, `gts`
//! (the ground truth), `score`, `step`, and each number the reward
//! returned beside its score, by name.
//!
//! A file is written whole beside its name and renamed into place, so a run
//! killed while writing leaves no half file; a resumed run writes the steps
//! after its checkpoint again.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{Error, Result};

/// One sample of a dump.
#[derive(Debug, Clone, Serialize)]
pub struct Generation<'a> {
    pub input: &'a str,
    pub output: &'a str,
    pub gts: &'a str,
    /// A step's: the training reward (the score with any overlong
    /// punishment); an evaluation's: the reward's score.
    pub score: f64,
    pub step: usize,
    /// The reward's other numbers (and `overlong_reward` when punished);
    /// one named like a key above is left out.
    #[serde(flatten)]
    pub extra: BTreeMap<&'a str, f64>,
}

/// Keys a reward's extra number may not take.
const KEYS: [&str; 5] = ["input", "output", "gts", "score", "step"];

impl<'a> Generation<'a> {
    /// `extra` without the names of [`Generation`]'s own keys.
    pub fn extras(extra: impl IntoIterator<Item = (&'a str, f64)>) -> BTreeMap<&'a str, f64> {
        (extra.into_iter())
            .filter(|(k, _)| !KEYS.contains(k))
            .collect()
    }
}

/// Writes `dir/{step}.jsonl` (creating `dir`) and returns its path.
pub fn write(dir: &Path, step: usize, rows: &[Generation<'_>]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(format!("{step}.jsonl"));
    let mut text = Vec::new();
    for row in rows {
        serde_json::to_writer(&mut text, row)?;
        text.push(b'\n');
    }
    let mut tmp = crate::metrics::new_file_beside(dir)?;
    tmp.write_all(&text).map_err(|e| Error::io(tmp.path(), e))?;
    tmp.persist(&path).map_err(|e| Error::io(&path, e.error))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_sample_with_verls_keys() {
        let dir = tempfile::tempdir().unwrap();
        let extra = [("acc", 1.0), ("score", 9.0), ("overlong_reward", -0.5)];
        let rows = [
            Generation {
                input: "1+1=",
                output: "2",
                gts: "2",
                score: 0.5,
                step: 3,
                extra: Generation::extras(extra),
            },
            Generation {
                input: "2+2=",
                output: "5 \"quoted\"\n",
                gts: "4",
                score: -1.0,
                step: 3,
                extra: BTreeMap::new(),
            },
        ];
        let out = dir.path().join("dumps");
        let path = write(&out, 3, &rows).unwrap();
        assert_eq!(path, out.join("3.jsonl"));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = (text.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            serde_json::json!({"input": "1+1=", "output": "2", "gts": "2", "score": 0.5,
                "step": 3, "acc": 1.0, "overlong_reward": -0.5})
        );
        assert_eq!(lines[1]["output"], "5 \"quoted\"\n");
        assert_eq!(lines.len(), 2);
        // Nothing but the file is left in the directory.
        assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);
    }
}
