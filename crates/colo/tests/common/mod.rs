//! Helpers shared by `colo`'s integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

// colo-rl's tests build their configs with it too.
#[path = "../../../rl/tests/common/run_toml.rs"]
mod run_toml;
pub use run_toml::RunToml;

/// The tiny random Qwen2 checkpoint of `testdata/`.
pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2")
}

/// A fresh directory `colo-{suite}-{pid}-{name}` under the system temp dir.
pub fn tmp(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colo-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tests' small `colo train` run on the fixture: prompts from `train`,
/// 2 a step of 2 samples each (of at most 4 tokens, in a KV cache of 256),
/// one mini-batch a step, 256 MiB of memory. No held-out set, reward or
/// length: each test's `with` says them.
pub fn fixture_run(train: &Path) -> RunToml {
    RunToml::default().with(&format!(
        r#"
[data]
train_files = ["{train}"]
train_batch_size = 2

[model]
path = "{model}"

[rollout]
n = 2
max_new_tokens = 4
max_kv_tokens = 256

[actor]
ppo_mini_batch_size = 2
ppo_micro_batch_size = 4

[memory]
capacity = "256MiB"
"#,
        train = train.display(),
        model = fixture().display(),
    ))
}
