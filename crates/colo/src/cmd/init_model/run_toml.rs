//! `run.toml`: issue 36's job as a `colo train` run of the model written.

use std::path::Path;

use anyhow::{Context, Result};

/// A `colo train` run of the model in `dir`: issue 36's job (4 prompts × 4
/// samples × 16 new tokens, one optimiser step a step) on the built-in
/// arithmetic task, whose prompts the byte-level tokenizer encodes.
pub(crate) fn run_toml(dir: &Path, name: &str) -> Result<String> {
    let abs = std::path::absolute(dir)
        .with_context(|| format!("the absolute path of {}", dir.display()))?;
    let path = toml_string(&abs.to_string_lossy());
    Ok(format!(
        r#"# `colo train --config {run}`: GRPO on the {name}-shaped model in this
# directory (random weights: it learns nothing, it measures), written by
# `colo init-model`. The job of issue 36: 4 prompts x 4 samples x 16 new
# tokens a step, one optimiser step a step, 5 steps, on the built-in
# arithmetic task. The run ends with a checkpoint (weights and AdamW's
# state: about 8 bytes a parameter more than the weights).

[data]
train_batch_size = 4          # prompts per step

[data.builtin]
val_size = 16                 # held-out prompts, evaluated once, at the end

[model]
path = {path}

[rollout]
n = 4                         # samples per prompt
max_new_tokens = 16
max_kv_tokens = 2048          # 16 samples x (64 prompt + 16 new) tokens, rounded up

[actor]
ppo_mini_batch_size = 4       # one optimiser step per RL step

[trainer]
total_steps = 5
val_before_train = false
test_freq = -1
save_freq = -1
dtype = "auto"
"#,
        run = dir.join("run.toml").display(),
    ))
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
