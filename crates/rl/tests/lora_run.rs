//! A LoRA run end to end on the tiny fixture: the loss moves, only the
//! adapted projections change, each checkpoint holds the merged model and
//! a PEFT adapter, and `--resume` continues with the same metrics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use colo_rl::Config;
use tch::Tensor;

mod common;

use common::steps_of;

fn config(dir: &Path, steps: usize) -> Config {
    common::parity_run(dir)
        .with(&format!(
            r#"
[model]
lora_rank = 4
lora_alpha = 8
target_modules = "all-linear"

[actor]
lr = 1e-2

[trainer]
dtype = "f32"
total_steps = {steps}
save_freq = 1
test_freq = 2
"#
        ))
        .config(dir)
}

fn tensors(path: PathBuf) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn a_lora_run_trains_the_adapters_only_and_resumes_exactly() {
    let dir = common::tmp("lora-run", "run");
    let full = dir.join("full");
    colo_rl::step::run(&config(&dir, 3), &full, false).unwrap();
    let steps = steps_of(&full);
    assert_eq!(steps.len(), 3);
    assert!(steps
        .iter()
        .all(|s| s.pg_loss.is_finite() && s.grad_norm > 0.0));
    let kl: Vec<f64> = steps.iter().map(|s| s.kl_loss.unwrap()).collect();
    // The actor starts as its reference (B = 0) and drifts from it: the
    // first step's second mini-batch already follows an update.
    assert!(
        0.0 < kl[0] && kl[0] < kl[1] && kl[1] < kl[2],
        "KL to the base grows: {kl:?}"
    );

    let ckpt = full.join("checkpoints/step-3");
    let adapter = ckpt.join("lora_adapter");
    assert!(adapter.join("adapter_config.json").is_file());
    let a = tensors(adapter.join("adapter_model.safetensors"));
    assert_eq!(a.len(), 2 * 7 * 2, "A and B of 7 projections in 2 layers");
    let merged = tensors(ckpt.join("model.safetensors"));
    let base = tensors(common::fixture().join("model.safetensors"));
    for (name, t) in &base {
        let same = merged[name].equal(t);
        assert_eq!(
            same,
            !name.contains("_proj.weight"),
            "{name}: bit-identical unless adapted"
        );
    }

    let cut = dir.join("cut");
    colo_rl::step::run(&config(&dir, 2), &cut, false).unwrap();
    colo_rl::step::run(&config(&dir, 3), &cut, true).unwrap();
    let resumed = steps_of(&cut);
    assert_eq!(resumed.len(), 3);
    for (x, y) in steps.iter().zip(&resumed) {
        let m = |s: &colo_rl::StepMetrics| {
            [
                s.pg_loss,
                s.grad_norm,
                s.entropy,
                s.kl_loss.unwrap(),
                s.score_mean,
            ]
        };
        assert_eq!(m(x), m(y), "step {}", x.step);
    }
    std::fs::remove_dir_all(dir).unwrap();
}
