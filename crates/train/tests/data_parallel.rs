//! Data parallelism (issue 11): two trainers joined by a collective, each
//! with half of a batch, make the same update as one trainer with all of
//! it, and end with identical weights.
//!
//! The collective here passes values between two threads of this process
//! (a stand-in for torch.distributed, which colo-py's workers use and test
//! across processes); what is under test is the trainer's side: global
//! denominators, the gradient sum before clipping, reduced metrics.

mod common;

use colo_algo::LossAggMode;
use colo_train::{
    Collective, ColoTrainer, LossConfig, PolicyBatch, PolicyMetrics, SeqBatch, TrainEngine,
};
use common::in_process::InProcess;
use common::{config, engine, rel_diff, state_bits};
use tch::Tensor;

/// Six (prompt, response) rows of different lengths.
fn rows() -> Vec<(Vec<u32>, Vec<u32>)> {
    let tok = |i: usize, j: usize| ((i * 37 + j * 11) % 370 + 3) as u32;
    [(3, 5), (2, 7), (4, 2), (1, 6), (2, 3), (3, 8)]
        .iter()
        .enumerate()
        .map(|(i, &(p, r))| {
            (
                (0..p).map(|j| tok(i, j)).collect(),
                (p..p + r).map(|j| tok(i, j)).collect(),
            )
        })
        .collect()
}

/// A policy batch of rows `range`, scored by `e`: advantages depend on the
/// row's global index and the position, so any split sees the same ones.
fn batch_of(e: &mut ColoTrainer, range: std::ops::Range<usize>) -> PolicyBatch {
    let all = rows();
    let pairs: Vec<(&[u32], &[u32])> = all[range.clone()]
        .iter()
        .map(|(p, r)| (&p[..], &r[..]))
        .collect();
    let seqs = SeqBatch::from_prompt_response(&pairs, 0).unwrap();
    let (b, s) = (seqs.batch_size(), seqs.seq_len());
    let adv: Vec<f32> = (0..b * s)
        .map(|k| (((range.start + k / s) * 3 + (k % s) * 7) % 5) as f32 * 0.5 - 1.0)
        .collect();
    let adv = Tensor::from_slice(&adv).view([b as i64, s as i64]) * seqs.response_mask();
    let old = e.score(&seqs, false).unwrap().log_probs;
    let reference = &old - 0.1;
    PolicyBatch::new(seqs, &old, &adv, Some(&reference), None).unwrap()
}

fn loss(mode: LossAggMode) -> LossConfig {
    let mut cfg = LossConfig {
        use_kl_loss: true,
        ..Default::default()
    };
    cfg.policy.loss_agg_mode = mode;
    cfg
}

/// Equal up to the order of float sums: 1e-5 relative, or 1e-6 absolute
/// for values at rounding level (the on-policy ppo_kl is ~1e-7).
fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-5 * b.abs() + 1e-6,
        "{what}: two peers {a} vs one {b}"
    );
}

fn one_vs_two(mode: LossAggMode) {
    let cfg = loss(mode);
    let mut one = engine("tiny-qwen2", 2);
    let batch = batch_of(&mut one, 0..6);
    let m1 = one.update_policy(&batch, &cfg).unwrap();

    let peers = InProcess::group(2);
    let results: Vec<(PolicyMetrics, ColoTrainer)> = std::thread::scope(|s| {
        let handles: Vec<_> = peers
            .into_iter()
            .map(|c| {
                let cfg = &cfg;
                s.spawn(move || {
                    let mut e = common::engine_with("tiny-qwen2", &config(2));
                    let rows = match c.rank() {
                        0 => 0..3,
                        _ => 3..6,
                    };
                    let batch = batch_of(&mut e, rows);
                    e.set_collective(Some(Box::new(c))).unwrap();
                    let m = e.update_policy(&batch, cfg).unwrap();
                    (m, e)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (m2, a) = &results[0];
    let (m2b, b) = &results[1];
    assert_eq!(state_bits(a), state_bits(b), "the peers' weights differ");
    assert_eq!(m2.grad_norm.to_bits(), m2b.grad_norm.to_bits());
    close(m2.grad_norm, m1.grad_norm, "grad_norm");
    close(m2.pg_loss, m1.pg_loss, "pg_loss");
    close(m2.entropy, m1.entropy, "entropy");
    close(m2.ppo_kl, m1.ppo_kl, "ppo_kl");
    close(m2.kl_loss.unwrap(), m1.kl_loss.unwrap(), "kl_loss");
    // The summed gradients against one device's, measured against the
    // global gradient norm: a tensor whose gradient is rounding noise (the
    // k-projection bias, to which softmax is blind) is compared at the
    // scale of the others, not amplified by its own tiny norm.
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    let total: f64 = one
        .gradients()
        .iter()
        .map(|(_, g)| norm(g).powi(2))
        .sum::<f64>()
        .sqrt();
    for ((name, g2), (_, g1)) in a.gradients().iter().zip(one.gradients()) {
        let d = norm(&(g2 - &g1)) / total;
        assert!(
            d < 1e-5,
            "{name}: gradient differs by {d} of the global norm"
        );
    }
    // The update moved the weights (the comparison above is not vacuous).
    let fresh = engine("tiny-qwen2", 2);
    let moved = rel_diff(&a.parameters()[1].1, &fresh.parameters()[1].1);
    assert!(moved > 1e-5, "the update changed nothing ({moved})");
}

#[test]
fn two_peers_with_half_the_batch_each_update_like_one_with_all_of_it() {
    one_vs_two(LossAggMode::TokenMean);
}

#[test]
fn global_denominators_hold_for_every_aggregation_mode() {
    one_vs_two(LossAggMode::SeqMeanTokenMean);
    one_vs_two(LossAggMode::SeqMeanTokenSumNorm);
}

#[test]
fn a_solo_collective_changes_nothing() {
    let cfg = loss(LossAggMode::TokenMean);
    let mut plain = engine("tiny-llama", 4);
    let mut solo = engine("tiny-llama", 4);
    solo.set_collective(Some(Box::new(colo_train::Solo)))
        .unwrap();
    let b1 = batch_of(&mut plain, 0..6);
    let b2 = batch_of(&mut solo, 0..6);
    let m1 = plain.update_policy(&b1, &cfg).unwrap();
    let m2 = solo.update_policy(&b2, &cfg).unwrap();
    assert_eq!(m1.grad_norm.to_bits(), m2.grad_norm.to_bits());
    assert_eq!(state_bits(&plain), state_bits(&solo));
}
