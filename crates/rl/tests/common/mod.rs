//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use colo_rl::metrics::{read, Record};
use colo_rl::Config;

mod run_toml;
pub use run_toml::RunToml;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "colo-rl-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tiny random Qwen2 checkpoint of `testdata/`.
pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2")
}

/// A fresh directory `colo-{suite}-{pid}-{name}` under the system temp dir
/// (kept after the test, for inspecting a failure).
pub fn tmp(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colo-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `n` arithmetic prompts ("Question: what is i + i+1? Answer:") in
/// `dir/train.jsonl`.
pub fn write_arith_data(dir: &Path, n: usize) -> PathBuf {
    let data = dir.join("train.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"prompt": "Question: what is {i} + {}? Answer:", "answer": "{}"}}"#,
                i + 1,
                2 * i + 1
            )
        })
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    data
}

/// An external reward with variance on a random model (so GRPO has
/// non-zero advantages and the updates matter): 1 for completions of even
/// length. After `fail_after` answers the script exits with status 3.
pub fn write_parity_reward(dir: &Path, fail_after: Option<usize>) -> PathBuf {
    let script = dir.join("reward.py");
    let stop = match fail_after {
        Some(n) => format!("    if i >= {n}:\n        sys.exit(3)\n"),
        None => String::new(),
    };
    std::fs::write(
        &script,
        format!(
            "import json, sys\nfor i, line in enumerate(sys.stdin):\n{stop}    r = json.loads(line)\n    \
             print(json.dumps({{'id': r['id'], 'score': float(len(r['completion']) % 2 == 0)}}), flush=True)\n"
        ),
    )
    .unwrap();
    script
}

/// `[model]`, `[rollout]` and `[actor]` of the tests' small runs on the
/// fixture: 4 samples of at most 4 tokens a prompt, one prompt an
/// optimizer step, `micro` samples a micro-batch.
pub fn fixture_sections(micro: usize) -> String {
    format!(
        r#"
[model]
path = "{model}"

[rollout]
n = 4
max_new_tokens = 4
max_kv_tokens = 1024

[actor]
lr = 1e-3
warmup_steps = 0
ppo_mini_batch_size = 1
ppo_micro_batch_size = {micro}
"#,
        model = fixture().display()
    )
}

/// The tests' small run on the fixture: prompts from `data`, a quarter of
/// them held out, 2 prompts a step (data seed 3), `fixture_sections(micro)`,
/// 256 MiB of memory, trainer seed 11. No reward, no length: each test's
/// `with` says them.
pub fn fixture_run(data: &Path, micro: usize) -> RunToml {
    RunToml::default().with(&format!(
        r#"
[data]
train_files = ["{data}"]
val_fraction = 0.25
train_batch_size = 2
seed = 3
{sections}
[memory]
capacity = "256MiB"

[trainer]
seed = 11
"#,
        data = data.display(),
        sections = fixture_sections(micro),
    ))
}

impl RunToml {
    /// The config read as `dir/run.toml`.
    pub fn config(&self, dir: &Path) -> Config {
        Config::from_toml(&self.text(), &dir.join("run.toml")).unwrap()
    }
}

/// [`fixture_run`] over 16 arithmetic prompts in `dir`, micro-batches of
/// 2, scored by the parity reward (an external python3 script).
pub fn parity_run(dir: &Path) -> RunToml {
    let data = write_arith_data(dir, 16);
    let script = write_parity_reward(dir, None);
    fixture_run(&data, 2).with(&python_reward(&script))
}

/// `[reward]`: `script` run with python3 (an external reward).
pub fn python_reward(script: &Path) -> String {
    format!(
        "[reward]\nkind = \"external\"\ncommand = [\"python3\", \"{}\"]",
        script.display()
    )
}

/// `[reward]`: an external reward whose every answer is garbage, scored
/// `default_score` 0 (its script is written in `dir`).
pub fn garbage_reward(dir: &Path) -> String {
    let script = dir.join("garbage.sh");
    std::fs::write(&script, "while read line; do echo 'not json'; done\n").unwrap();
    format!(
        "[reward]\nkind = \"external\"\ncommand = [\"sh\", \"{}\"]\ndefault_score = 0.0",
        script.display()
    )
}

/// The step records of `run`'s `metrics.jsonl` (not its evaluations').
pub fn steps_of(run: &Path) -> Vec<colo_rl::StepMetrics> {
    (read(&run.join("metrics.jsonl")).unwrap().into_iter())
        .filter_map(|r| match r {
            Record::Step(s) => Some(*s),
            Record::Eval(_) => None,
        })
        .collect()
}

/// The evaluation records of `run`'s `metrics.jsonl`.
pub fn evals_of(run: &Path) -> Vec<colo_rl::EvalRecord> {
    (read(&run.join("metrics.jsonl")).unwrap().into_iter())
        .filter_map(|r| match r {
            Record::Eval(e) => Some(e),
            Record::Step(_) => None,
        })
        .collect()
}
