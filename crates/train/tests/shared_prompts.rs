//! Rows that share a prompt (a GRPO group's samples) run it once
//! (`colo_model::SharedPrompts`): scores and gradients are those of every
//! row run alone.

mod common;

use colo_train::{LossConfig, PolicyBatch, TrainEngine, TrainerConfig};
use common::*;

fn cfg(micro: usize) -> TrainerConfig {
    TrainerConfig {
        cpu_threads: 1,
        ..config(micro)
    }
}

#[test]
fn shared_prompts_score_and_train_as_rows_alone() {
    for name in MODELS {
        let seqs = grouped();
        // Six rows in one micro-batch share prompts; one row per
        // micro-batch shares nothing.
        let (mut shared, mut alone) = (engine_with(name, &cfg(6)), engine_with(name, &cfg(1)));
        let a = shared.score(&seqs, true).unwrap();
        let b = alone.score(&seqs, true).unwrap();
        let d = rel_diff(&a.log_probs, &b.log_probs);
        assert!(d < 1e-5, "{name}: log-probs differ by {d:e}");
        let d = rel_diff(&a.entropy.unwrap(), &b.entropy.unwrap());
        assert!(d < 1e-5, "{name}: entropy differs by {d:e}");

        let adv = advantages(&seqs);
        let reference = &b.log_probs - 0.05;
        let batch = PolicyBatch::new(seqs, &b.log_probs, &adv, Some(&reference), None).unwrap();
        let loss = LossConfig {
            entropy_coeff: 0.01,
            use_kl_loss: true,
            ..Default::default()
        };
        let m1 = shared.update_policy(&batch, &loss).unwrap();
        let m2 = alone.update_policy(&batch, &loss).unwrap();
        assert!(
            (m1.grad_norm - m2.grad_norm).abs() / m2.grad_norm < 1e-5,
            "{name}: grad norm"
        );
        for ((n, g1), (_, g2)) in shared.gradients().iter().zip(alone.gradients()) {
            let d = rel_diff(g1, &g2);
            assert!(d < 1e-4, "{name}: gradient of `{n}` differs by {d:e}");
        }
    }
}
