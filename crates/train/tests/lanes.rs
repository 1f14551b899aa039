//! Lanes (a micro-batch's rows split over threads on the CPU) change the
//! order of float additions only: scores, gradients and updated weights
//! agree with one lane, and a run with a given number of lanes is
//! bit-for-bit repeatable.

mod common;

use colo_train::{LossConfig, TrainEngine, TrainerConfig};
use common::*;

fn with_lanes(lanes: usize) -> TrainerConfig {
    // Four rows per micro-batch: three lanes get 2 + 1 + 1 rows.
    TrainerConfig {
        cpu_threads: lanes,
        ..config(4)
    }
}

fn loss() -> LossConfig {
    LossConfig {
        entropy_coeff: 0.01,
        use_kl_loss: true,
        ..Default::default()
    }
}

#[test]
fn lanes_agree_with_one_lane_in_scores_gradients_and_weights() {
    for name in MODELS {
        let mut one = engine_with(name, &with_lanes(1));
        for lanes in [2, 3] {
            let mut many = engine_with(name, &with_lanes(lanes));
            let (a, b) = (
                one.score(&seqs(), true).unwrap(),
                many.score(&seqs(), true).unwrap(),
            );
            let d = rel_diff(&b.log_probs, &a.log_probs);
            assert!(d < 1e-6, "{name}, {lanes} lanes: log-probs differ by {d:e}");
            let d = rel_diff(&b.entropy.unwrap(), &a.entropy.unwrap());
            assert!(d < 1e-6, "{name}, {lanes} lanes: entropy differs by {d:e}");
        }
        // π_old taken from the update itself: written by every lane.
        let mut many = engine_with(name, &with_lanes(3));
        let batch_one = policy_batch(&mut one).old_from_update();
        let batch_many = policy_batch(&mut many).old_from_update();
        let m1 = one.update_policy(&batch_one, &loss()).unwrap();
        let m3 = many.update_policy(&batch_many, &loss()).unwrap();
        let rel = (m3.grad_norm - m1.grad_norm).abs() / m1.grad_norm;
        assert!(
            rel < 1e-5,
            "{name}: grad norms {} vs {}",
            m1.grad_norm,
            m3.grad_norm
        );
        assert!((m3.pg_loss - m1.pg_loss).abs() < 1e-6, "{name}: pg_loss");
        for ((n, g1), (_, g3)) in one.gradients().iter().zip(many.gradients()) {
            let d = rel_diff(&g3, g1);
            assert!(d < 1e-5, "{name}: gradient of `{n}` differs by {d:e}");
        }
        // AdamW's first step moves each weight by about lr · g / |g|, so a
        // parameter whose gradient is rounding noise (the key biases: a
        // softmax ignores a shift shared by all scores) moves by noise:
        // compared as one vector, the weights agree.
        let flat = |e: &colo_train::ColoTrainer| {
            let ps: Vec<_> = e
                .parameters()
                .into_iter()
                .map(|(_, p)| p.flatten(0, -1))
                .collect();
            tch::Tensor::cat(&ps, 0)
        };
        let d = rel_diff(&flat(&many), &flat(&one));
        assert!(d < 1e-6, "{name}: weights after the update differ by {d:e}");
    }
}

#[test]
fn a_run_with_lanes_is_repeatable_bit_for_bit() {
    let run = || {
        let mut e = engine_with("tiny-qwen2", &with_lanes(3));
        for _ in 0..2 {
            let batch = policy_batch(&mut e);
            e.update_policy(&batch, &loss()).unwrap();
        }
        state_bits(&e)
    };
    assert!(run() == run(), "two runs with 3 lanes differ");
}
