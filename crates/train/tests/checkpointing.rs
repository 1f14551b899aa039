//! Activation checkpointing (`TrainerConfig::gradient_checkpointing`):
//! the same gradients as the one-piece backward — rows alone and rows that
//! share prompts, the policy loss, a critic and SFT — and a lower peak.

mod common;

use colo_train::{
    ColoTrainer, CriticBatch, CriticLossConfig, LossConfig, PolicyBatch, TrainEngine,
    TrainerConfig, ValueHeadConfig,
};
use common::*;

fn with_checkpointing(mut cfg: TrainerConfig) -> TrainerConfig {
    cfg.gradient_checkpointing = true;
    cfg
}

fn same_gradients(what: &str, a: &ColoTrainer, b: &ColoTrainer) {
    let (ga, gb) = (a.gradients(), b.gradients());
    assert_eq!(ga.len(), gb.len());
    for ((n, x), (_, y)) in ga.iter().zip(&gb) {
        let d = rel_diff(x, y);
        assert!(d < 1e-5, "{what}: gradient of `{n}` differs by {d:e}");
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
}

/// The policy loss with entropy and KL terms, on rows alone (`seqs`) and on
/// GRPO groups run as shared prompts (`grouped`, one micro-batch), in
/// micro-batches of two rows over the lanes.
#[test]
fn the_policy_gradient_is_the_same_with_checkpointing() {
    let loss = LossConfig {
        entropy_coeff: 0.01,
        use_kl_loss: true,
        ..Default::default()
    };
    for name in MODELS {
        for (batch_name, seqs, micro) in [("rows", seqs(), 2), ("shared prompts", grouped(), 6)] {
            let mut plain = engine_with(name, &config(micro));
            let mut ckpt = engine_with(name, &with_checkpointing(config(micro)));
            let old = plain.score(&seqs, false).unwrap().log_probs;
            let reference = &old - 0.05;
            let adv = advantages(&seqs);
            let batch =
                PolicyBatch::new(seqs, &(&old + 0.2), &adv, Some(&reference), None).unwrap();
            let a = plain.update_policy(&batch, &loss).unwrap();
            let b = ckpt.update_policy(&batch, &loss).unwrap();
            let what = format!("{name}, {batch_name}");
            assert!(
                close(a.pg_loss, b.pg_loss) && close(a.grad_norm, b.grad_norm),
                "{what}: {a:?} vs {b:?}"
            );
            assert!(
                close(a.entropy, b.entropy) && close(a.kl_loss.unwrap(), b.kl_loss.unwrap()),
                "{what}"
            );
            assert!(a.grad_norm > 0.0);
            same_gradients(&what, &plain, &ckpt);
        }
    }
}

/// A critic (value head on the last hidden states) and an SFT step.
#[test]
fn critic_and_sft_gradients_are_the_same_with_checkpointing() {
    let mut cfg = config(2);
    cfg.value_head = Some(ValueHeadConfig::default());
    let (mut plain, mut ckpt) = (
        engine_with("tiny-qwen2", &cfg),
        engine_with("tiny-qwen2", &with_checkpointing(cfg.clone())),
    );
    let seqs = seqs();
    let values = plain.values(&seqs).unwrap();
    let returns = seqs.response_mask() * 0.7;
    let batch = CriticBatch::new(seqs.clone(), &values, &returns).unwrap();
    let a = plain
        .update_critic(&batch, &CriticLossConfig::default())
        .unwrap();
    let b = ckpt
        .update_critic(&batch, &CriticLossConfig::default())
        .unwrap();
    assert!(
        close(a.vf_loss, b.vf_loss) && close(a.grad_norm, b.grad_norm),
        "{a:?} vs {b:?}"
    );
    same_gradients("critic", &plain, &ckpt);

    let (mut plain, mut ckpt) = (
        engine_with("tiny-llama", &config(2)),
        engine_with("tiny-llama", &with_checkpointing(config(2))),
    );
    let a = plain.sft_step(&seqs).unwrap();
    let b = ckpt.sft_step(&seqs).unwrap();
    assert!(
        close(a.loss, b.loss) && close(a.grad_norm, b.grad_norm),
        "{a:?} vs {b:?}"
    );
    same_gradients("sft", &plain, &ckpt);
}

/// What it saves: the update's peak of allocated bytes above the training
/// state, 16 rows of 60 tokens in one micro-batch on one lane.
#[test]
fn checkpointing_lowers_the_updates_peak() {
    let seqs = sixteen_rows_of_sixty_tokens();
    let peak_of = |checkpointing: bool| {
        let mut cfg = config(16);
        cfg.gradient_checkpointing = checkpointing;
        update_peak_above_state(cfg, &seqs)
    };
    let (plain, ckpt) = (peak_of(false), peak_of(true));
    eprintln!("above the state at the peak: {plain} bytes, with checkpointing {ckpt}");
    assert!(ckpt * 3 < plain, "{ckpt} vs {plain}");
}
