//! Numbers that are not finite stop a run with an error naming where they
//! start, and leave its directory readable and resumable: a reward beyond
//! float32's range, and weights whose backward pass overflows so that
//! every optimizer step is skipped.

use std::path::{Path, PathBuf};

use colo_rl::Config;

mod common;

use common::steps_of;

fn tmp(name: &str) -> PathBuf {
    common::tmp("not-finite", name)
}

/// A run of `steps` steps on the fixture (2 prompts of 4 samples a step,
/// one prompt an optimizer step), scored by `dir/reward.py`, checkpointed
/// every step, evaluated at the end only.
fn config(dir: &Path, steps: usize) -> Config {
    common::fixture_run(&common::write_arith_data(dir, 8), 4)
        .with(&common::python_reward(&dir.join("reward.py")))
        .with(&format!(
            r#"
[trainer]
total_steps = {steps}
save_freq = 1
val_before_train = false
dtype = "f32"
"#
        ))
        .config(dir)
}

/// `dir/reward.py`: each sample's score is `score` (a Python expression of
/// `i`, the answer's number in the run, and `r`, the request).
fn write_reward(dir: &Path, score: &str) {
    std::fs::write(
        dir.join("reward.py"),
        format!(
            "import json, sys\nfor i, line in enumerate(sys.stdin):\n    r = json.loads(line)\n    \
             print(json.dumps({{'id': r['id'], 'score': {score}}}), flush=True)\n"
        ),
    )
    .unwrap();
}

/// An external reward's 1e300 is finite, but infinite as the float32 that
/// scores are kept in: it used to make every update NaN (each skipped with
/// a warning) and the run end "done". It is an error naming the sample and
/// the step; the step before it stays checkpointed and its records read
/// back, and `--resume` with the reward fixed continues the run.
#[test]
fn a_reward_beyond_float32_stops_the_run_naming_the_sample_and_the_step() {
    let dir = tmp("reward-1e300");
    let run = dir.join("run");
    // Step 1 answers 0–7; sample 5 of step 2 is answer 13.
    write_reward(
        &dir,
        "1e300 if i == 13 else float(len(r['completion']) % 2)",
    );
    let cfg = config(&dir, 3);
    let err = colo_rl::step::run(&cfg, &run, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("step 2: ")
            && err.contains("failed on sample 5 (prompt")
            && err.contains("score 1e300 is beyond float32's range"),
        "{err}"
    );
    assert_eq!(steps_of(&run).len(), 1, "step 1 finished");
    assert!(run.join("checkpoints/step-1/trainer_state.json").is_file());

    // The run directory resumes with the reward fixed.
    write_reward(&dir, "float(len(r['completion']) % 2)");
    let s = colo_rl::step::run(&cfg, &run, true).unwrap();
    assert_eq!((s.steps, s.resumed_from), (3, Some(1)));
    let steps: Vec<usize> = steps_of(&run).iter().map(|m| m.step).collect();
    assert_eq!(steps, vec![1, 2, 3]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The fixture with weights whose forward pass is finite and whose
/// backward pass overflows (as a few flipped exponent bits can make
/// them): hidden dimension 0 of every token embedding is 0, and layer 0
/// scales it by 1e30 twice (its input norm and its query projection), so
/// the forward pass multiplies 1e30 by 0 while the gradient that flows
/// back into that dimension is 1e30 · 1e30 · (the query's gradient).
fn overflowing_checkpoint(dir: &Path) -> PathBuf {
    let out = dir.join("overflowing");
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(common::fixture()).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, out.join(p.file_name().unwrap())).unwrap();
    }
    let path = out.join("model.safetensors");
    let mut tensors = tch::Tensor::read_safetensors(&path).unwrap();
    for (name, t) in &mut tensors {
        *t = t.copy();
        let _ = match name.as_str() {
            "model.embed_tokens.weight" => t.narrow(1, 0, 1).fill_(0.0),
            "model.layers.0.input_layernorm.weight" => t.narrow(0, 0, 1).fill_(1e30),
            "model.layers.0.self_attn.q_proj.weight" => t.narrow(1, 0, 1).fill_(1e30),
            _ => continue,
        };
    }
    tch::Tensor::write_safetensors(&tensors, &path).unwrap();
    out
}

/// Weights whose gradient is never finite used to give a run whose every
/// optimizer step was skipped, each with a warning, and which ended
/// "done". Three skipped in a row stop it with an error at the end of the
/// step that reached them (the second: two optimizer steps a step); the
/// finished step's records read back.
#[test]
fn optimizer_steps_skipped_three_times_in_a_row_stop_the_run() {
    let dir = tmp("skipped");
    let run = dir.join("run");
    // Every group varies (ids 0–7 of a batch, in groups of 4), so every
    // mini-batch has a gradient.
    write_reward(&dir, "float(r['id'] % 2)");
    let mut cfg = config(&dir, 4);
    cfg.model.path = Some(overflowing_checkpoint(&dir));
    let err = colo_rl::step::run(&cfg, &run, false)
        .unwrap_err()
        .to_string();
    assert_eq!(colo_rl::step::MAX_SKIPPED_IN_A_ROW, 3);
    assert!(
        err.starts_with(
            "step 2: the gradient norm was not finite in 4 optimizer steps in a row, which were \
             skipped"
        ) && err.contains("Its losses are finite"),
        "{err}"
    );
    let steps = steps_of(&run);
    assert_eq!(steps.len(), 1, "step 1 finished");
    assert!(steps[0].grad_norm.is_nan() && steps[0].pg_loss.is_finite());
    std::fs::remove_dir_all(dir).unwrap();
}
