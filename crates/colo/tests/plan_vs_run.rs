//! `colo plan --config run.toml` against the run itself: a real short
//! `colo train` (colo_rl's loop, in process) per config, and the plan's
//! predicted peak against the peak the run measured — the largest
//! `resident_bytes` of its `timeline.jsonl` and the largest
//! `memory/peak_device_bytes` of its `metrics.jsonl`. Within 10%.
//!
//! The configs cover two models (the built-in one, and the tiny Qwen2
//! fixture with its BPE tokenizer and JSONL prompts), three colocation
//! modes, and both places the peak can be: generation (weights + KV
//! cache) and training (trainer state + eager activations).
//!
//! The real-vocabulary tests plan a run and run it at the capacity the
//! plan asks for (its peak plus its margin): it must not run out of
//! memory, and its allocated and mapped peaks are within 10% of the plan.
//! A model of Qwen2.5's vocabulary around tiny-qwen2's layers runs in CI;
//! issue 36's Qwen2.5-0.5B job is `#[ignore]`d (60 s, 13 GiB).
//!
//! The runs give up at every switch all the offload flags allow
//! (`offload_policy = "always"`), the choreography the planner models; with
//! the default `as_needed` a run keeps more where the capacity has room
//! for it (`crates/rl/tests/worker.rs`), never more than the capacity.

use std::path::{Path, PathBuf};
use std::process::Command;

use colo_rl::Config;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colo-plan-vs-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `colo plan --config FILE --json` → (peak bytes, peak phase).
fn plan(config: &Path) -> (u64, String) {
    let (peak, _, phase) = plan_with_margin(config);
    (peak, phase)
}

/// Runs the config and returns (timeline max resident, metrics max peak).
fn measure(config: &Path, out: &Path) -> (u64, u64) {
    let cfg = Config::from_file(config).unwrap();
    colo_rl::step::run(&cfg, out, false).unwrap();
    let max_of = |file: &str, key: &str| {
        std::fs::read_to_string(out.join(file))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?[key].as_u64())
            .max()
            .unwrap_or_else(|| panic!("no `{key}` in {file}"))
    };
    (
        max_of("timeline.jsonl", "resident_bytes"),
        max_of("metrics.jsonl", "memory/peak_device_bytes"),
    )
}

/// Plans and runs `toml` (written into a fresh directory as run.toml);
/// checks both measured peaks are within 10% of the plan's and that the
/// plan's peak is in `phase`.
///
/// The runs use one lane (`trainer.cpu_threads = 1`): with several, each
/// lane holds its part's gradients until all are added up, and how much
/// of that overlaps the other lanes' graphs depends on which finishes
/// first (the same config measured 8.8–11.8 MB over runs where one lane
/// measures 12.3 MB every time); the plan adds every other lane's
/// gradients (11.6 MB there).
fn check(name: &str, toml: &str, phase: &str) {
    let dir = tmp(name);
    write_prompts(&dir);
    let path = dir.join("run.toml");
    std::fs::write(&path, toml.replace("{dir}", &dir.display().to_string())).unwrap();
    let (predicted, peak_phase) = plan(&path);
    let (timeline, metrics) = measure(&path, &dir.join("run"));
    for (what, measured) in [("timeline", timeline), ("metrics", metrics)] {
        let err = predicted as f64 / measured as f64 - 1.0;
        eprintln!(
            "{name}: plan {predicted} B in `{peak_phase}`, {what} {measured} B: {:+.1}%",
            100.0 * err
        );
        assert!(
            err.abs() <= 0.10,
            "{name}: plan {predicted} vs {what} {measured} ({:+.1}%)",
            100.0 * err
        );
    }
    assert_eq!(peak_phase, phase, "{name}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The built-in model and task, 2 steps of 8 prompts × 8 samples.
fn builtin(mode: &str, micro: usize, kv: &str) -> String {
    builtin_in("f32", mode, micro, kv)
}

fn builtin_in(dtype: &str, mode: &str, micro: usize, kv: &str) -> String {
    format!(
        r#"
[data]
train_batch_size = 8
[rollout]
{kv}
[actor]
ppo_mini_batch_size = 8
ppo_micro_batch_size = {micro}
[memory]
colocation = "{mode}"
offload_policy = "always"
[trainer]
dtype = "{dtype}"
cpu_threads = 1
total_steps = 2
val_before_train = false
save_freq = -1
test_freq = -1
"#
    )
}

#[test]
fn builtin_generation_peak_staged_and_sleep() {
    // A KV cache of 30k tokens (~60 MiB, far more than the step's
    // sequences need, so set in tokens: a fraction is capped at what they
    // use): generation peaks.
    check(
        "builtin-staged",
        &builtin("staged", 16, "max_kv_tokens = 30000"),
        "wake_kv",
    );
    check(
        "builtin-sleep",
        &builtin("sleep", 16, "max_kv_tokens = 30000"),
        "sync",
    );
}

#[test]
fn builtin_training_peak() {
    // A small KV cache and big micro-batches: the actor update peaks.
    check(
        "builtin-train-staged",
        &builtin("staged", 32, "max_kv_tokens = 512"),
        "training",
    );
    check(
        "builtin-train-naive",
        &builtin("naive", 64, "max_kv_tokens = 512"),
        "training",
    );
    // Activation checkpointing: the layers' boundaries and one layer.
    check(
        "builtin-train-checkpointing",
        &(builtin("naive", 64, "max_kv_tokens = 512")
            + "[model]\nenable_gradient_checkpointing = true\n"),
        "training",
    );
}

/// The tiny Qwen2 fixture on JSONL prompts of ~30 BPE tokens.
fn tiny(mode: &str, micro: usize, kv: &str) -> String {
    tiny_in("f32", mode, micro, kv)
}

fn tiny_in(dtype: &str, mode: &str, micro: usize, kv: &str) -> String {
    format!(
        r#"
[data]
train_files = ["{{dir}}/train.jsonl"]
val_fraction = 0.25
train_batch_size = 4
[model]
path = "{fixture}"
[rollout]
n = 8
max_new_tokens = 16
{kv}
[actor]
ppo_mini_batch_size = 4
ppo_micro_batch_size = {micro}
[reward]
kind = "exact_match"
[memory]
capacity = "256MiB"
colocation = "{mode}"
offload_policy = "always"
[trainer]
dtype = "{dtype}"
cpu_threads = 1
total_steps = 1
val_before_train = false
save_freq = -1
test_freq = -1
"#,
        fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tiny-qwen2")
            .display()
    )
}

/// `train.jsonl` for the fixture's configs (the built-in task ignores it).
fn write_prompts(dir: &Path) {
    let lines: Vec<String> = (0..32)
        .map(|i| {
            format!(
                r#"{{"prompt": "Question: what is {i} + {}? Answer:", "answer": "{}"}}"#,
                i + 1,
                2 * i + 1
            )
        })
        .collect();
    std::fs::write(dir.join("train.jsonl"), lines.join("\n")).unwrap();
}

#[test]
fn tiny_fixture_generation_and_training_peaks() {
    check(
        "tiny-sleep",
        &tiny("sleep", 8, "max_kv_tokens = 150000"),
        "sync",
    );
    check(
        "tiny-train-staged",
        &tiny("staged", 32, "max_kv_tokens = 1024"),
        "training",
    );
}

/// bf16: parameters, weights, KV cache and most activations in bf16, some
/// activations float32 (the planner's reduced-precision terms, fitted on the
/// first two configs; the other two check them).
#[test]
fn bf16_training_peaks() {
    for (name, toml) in [
        (
            "builtin-train-naive-bf16",
            builtin_in("bf16", "naive", 64, "max_kv_tokens = 512"),
        ),
        (
            "tiny-train-staged-bf16",
            tiny_in("bf16", "staged", 32, "max_kv_tokens = 1024"),
        ),
        (
            "builtin-train-staged-bf16",
            builtin_in("bf16", "staged", 32, "max_kv_tokens = 512"),
        ),
        (
            "tiny-train-staged-16-bf16",
            tiny_in("bf16", "staged", 16, "max_kv_tokens = 1024"),
        ),
    ] {
        check(name, &toml, "training");
    }
}

// ---------------------------------------------------------------------------
// Real vocabulary: the plan at the capacity it asks for

/// `colo plan --config FILE --json` → (peak bytes, margin bytes, phase).
fn plan_with_margin(config: &Path) -> (u64, u64, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["plan", "--json", "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "colo plan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["peak_bytes"].as_u64().unwrap(),
        v["margin_bytes"].as_u64().unwrap(),
        v["peak_phase"].as_str().unwrap().to_string(),
    )
}

/// Runs `config` in process; the largest `memory/peak_allocated_bytes`
/// and `memory/peak_device_bytes` (mapped) of its steps. An out-of-memory
/// fails the test with the run's error (the phase and the tags' bytes).
fn allocated_and_mapped(config: &Path, out: &Path) -> (u64, u64) {
    let cfg = Config::from_file(config).unwrap();
    if let Err(e) = colo_rl::step::run(&cfg, out, false) {
        panic!("{}: the run failed: {e:#}", config.display());
    }
    let max_of = |key: &str| {
        std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?[key].as_u64())
            .max()
            .unwrap_or_else(|| panic!("no `{key}` in metrics.jsonl"))
    };
    (
        max_of("memory/peak_allocated_bytes"),
        max_of("memory/peak_device_bytes"),
    )
}

/// Plans `toml` (a run config without a `[memory]` section), then runs it
/// with the default policy at the capacity the plan asks for, its peak
/// plus its margin, and (`always`) first with `offload_policy = "always"`
/// at the config's capacity (the choreography the plan models). Neither
/// runs out of memory; the allocated peak of both and the mapped peak at
/// the plan's capacity are within 10% of the plan, and the plan peaks in
/// `phase`.
///
/// Mapped bytes with room to spare are printed, not checked: there the
/// caching allocator keeps the graph's freed blocks while the gradients
/// take fresh ones (up to 17% above the allocated peak at 0.5 B,
/// BENCHMARKS.md "Plan against run"), and gives them back when a map
/// would pass the capacity, which is what the second run checks.
fn check_at_capacity(name: &str, toml: &str, phase: &str, always: bool) {
    let dir = tmp(name);
    write_prompts(&dir);
    let toml = toml.replace("{dir}", &dir.display().to_string());
    let plain = dir.join("plan.toml");
    std::fs::write(&plain, &toml).unwrap();
    let (peak, margin, peak_phase) = plan_with_margin(&plain);
    assert_eq!(peak_phase, phase, "{name}");
    assert!(margin > 0, "{name}: a training peak has a margin");
    let runs = [
        ("always", "offload_policy = \"always\"".to_string()),
        ("at capacity", format!("capacity = {}", peak + margin)),
    ];
    for (what, memory) in runs.into_iter().skip(usize::from(!always)) {
        let path = dir.join(format!("{}.toml", what.replace(' ', "-")));
        std::fs::write(&path, format!("{toml}\n[memory]\n{memory}\n")).unwrap();
        let (allocated, mapped) = allocated_and_mapped(&path, &dir.join(what.replace(' ', "-")));
        let err = |m: u64| predicted_error(peak, m);
        eprintln!(
            "{name}, {what}: plan {peak} B + margin {margin} B in `{peak_phase}`; \
             allocated {allocated} B ({:+.1}%), mapped {mapped} B ({:+.1}%)",
            100.0 * err(allocated),
            100.0 * err(mapped)
        );
        assert!(
            err(allocated).abs() <= 0.10,
            "{name}, {what}: plan {peak} vs allocated {allocated} ({:+.1}%)",
            100.0 * err(allocated)
        );
        if what == "at capacity" {
            assert!(
                mapped <= peak + margin,
                "{name}: mapped {mapped} over the capacity"
            );
            assert!(
                err(mapped).abs() <= 0.10,
                "{name}, {what}: plan {peak} vs mapped {mapped} ({:+.1}%)",
                100.0 * err(mapped)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The plan's error against a measured peak.
fn predicted_error(predicted: u64, measured: u64) -> f64 {
    predicted as f64 / measured as f64 - 1.0
}

/// A model of Qwen2.5's vocabulary (151,936 tokens, untied embeddings)
/// around tiny-qwen2's two layers of width 64, written into `dir` with
/// random bf16 weights and the fixture's tokenizer (whose ids are all below
/// the vocabulary): the embedding's and the LM head's gradients at their
/// real size in a model that loads and steps in seconds.
fn real_vocab_model(dir: &Path) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2");
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixture.join(f), model.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    config["vocab_size"] = 151_936.into();
    config["tie_word_embeddings"] = false.into();
    config["dtype"] = "bfloat16".into();
    let path = model.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let cfg = colo_model::ModelConfig::from_file(&path).unwrap();
    tch::manual_seed(0);
    let tensors: Vec<(String, tch::Tensor)> = cfg
        .parameter_shapes()
        .into_iter()
        .map(|(name, shape)| {
            let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let t = match name.ends_with("norm.weight") {
                true => tch::Tensor::ones(&shape, tch::kind::FLOAT_CPU),
                false => tch::Tensor::randn(&shape, tch::kind::FLOAT_CPU) * 0.02,
            };
            (name, t.to_kind(tch::Kind::BFloat16))
        })
        .collect();
    colo_model::weights::save_safetensors(&tensors, &model.join("model.safetensors")).unwrap();
    model
}

/// A bf16 run of the real-vocabulary model on the fixture's prompts (~30
/// tokens): `prompts` × `n` samples of `new` tokens a step, one
/// micro-batch of them, on `lanes` lanes, 2 steps.
fn real_vocab_run(model: &Path, prompts: usize, n: usize, new: usize, lanes: usize) -> String {
    format!(
        r#"
[data]
train_files = ["{{dir}}/train.jsonl"]
val_fraction = 0.25
train_batch_size = {prompts}
[model]
path = "{model}"
[rollout]
n = {n}
max_new_tokens = {new}
max_kv_tokens = {kv}
[actor]
ppo_mini_batch_size = {prompts}
ppo_micro_batch_size = {rows}
[reward]
kind = "exact_match"
[trainer]
dtype = "bf16"
cpu_threads = {lanes}
total_steps = 2
val_before_train = false
save_freq = -1
test_freq = -1
"#,
        model = model.display(),
        rows = prompts * n,
        kv = prompts * n * (64 + new),
    )
}

/// Where the backward's end is the peak: 4 rows of 4 new tokens on two
/// lanes, each ending its backward with the gradients of every parameter
/// (39 MB in bf16 with untied embeddings, most of it the embedding and
/// the LM head) beside the float32 accumulators: the plan's `lanes ×
/// gradients`, against a graph of half that.
#[test]
fn real_vocab_gradients_of_every_lane_at_the_plans_capacity() {
    let dir = tmp("real-vocab-untied-model");
    let model = real_vocab_model(&dir);
    check_at_capacity(
        "real-vocab-lanes",
        &real_vocab_run(&model, 2, 2, 4, 2),
        "training",
        true,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 36's job on the Qwen2.5-0.5B-shaped model `colo init-model`
/// writes (4 prompts × 4 samples × 16 new tokens, bf16, two lanes, 2
/// steps) at the capacity the plan asks for: it runs without running out
/// of memory, and both peaks are within 10% of the plan (measured: 11.14
/// GiB allocated, 11.34 mapped, against 11.14 planned and a capacity of
/// 11.42; BENCHMARKS.md "Plan against run").
#[test]
#[ignore = "0.5 B parameters: about 60 s and 13 GiB of memory, and 1 GB of weights written; \
            run with `cargo test --release -p colo --test plan_vs_run -- --ignored`"]
fn qwen25_05b_issue_job_at_the_plans_capacity() {
    let dir = tmp("qwen2.5-0.5b-model");
    let model = dir.join("model");
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["init-model", "--preset", "qwen2.5-0.5b", "--out"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "colo init-model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The run config init-model writes, for 2 steps.
    let toml = std::fs::read_to_string(model.join("run.toml"))
        .unwrap()
        .replace("total_steps = 5", "total_steps = 2");
    assert!(toml.contains("total_steps = 2"), "{toml}");
    check_at_capacity("qwen2.5-0.5b", &toml, "training", false);
    let _ = std::fs::remove_dir_all(&dir);
}
