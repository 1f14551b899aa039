//! A verl-style reward function written in Python: verl's
//! `custom_reward_function.path` / `.name` / `.reward_kwargs`, unchanged.
//!
//! The function runs in a child process (the `python` interpreter named in
//! the config) behind the external reward's JSON-lines protocol: a small
//! adapter ([`ADAPTER`], `python_function.py`) imports the file, calls
//! `name(data_source=…, solution_str=…, ground_truth=…, extra_info=…,
//! **kwargs)` for each sample as verl's reward managers do, and answers with
//! the score (a number, or a dict's `"score"`). colo stays free of an
//! embedded interpreter; the file, its imports and its prints behave as
//! they would under verl. The adapter answers `ready` once the file has
//! loaded, so a missing file, a syntax error or a missing function stops the
//! run before anything else starts.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::ExternalReward;
use crate::{Error, Result};

/// The adapter the interpreter runs (`python -c ADAPTER PATH NAME KWARGS`).
pub const ADAPTER: &str = include_str!("python_function.py");

/// Starts `python` serving `name` from the file at `path`.
pub fn start(
    python: &str,
    path: &Path,
    name: &str,
    kwargs: &Map<String, Value>,
    timeout: Duration,
    default_score: Option<f32>,
) -> Result<ExternalReward> {
    let label = format!("python `{name}` from {}", path.display());
    if !path.is_file() {
        return Err(Error::Setup {
            reward: label,
            reason: format!(
                "reward.path: no file {} (relative paths are read from the working directory)",
                path.display()
            ),
        });
    }
    let command = vec![
        python.to_owned(),
        "-c".to_owned(),
        ADAPTER.to_owned(),
        path.display().to_string(),
        name.to_owned(),
        Value::Object(kwargs.clone()).to_string(),
    ];
    ExternalReward::start_labelled(command, label, true, timeout, default_score)
}
