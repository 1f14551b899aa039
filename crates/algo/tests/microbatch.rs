//! Gradient accumulation: a mini-batch split into micro-batches, each
//! aggregated with the mini-batch's denominators ([`AggScale`]), gives losses
//! that sum to the mini-batch loss and gradients that equal its gradient —
//! for every aggregation mode, for the PPO, GSPO and value losses.

mod common;

use colo_algo::policy_loss::{gspo_loss, ppo_clip_loss};
use colo_algo::{value_loss, AggScale, ClipRange, LossAgg, LossAggMode, PolicyInputs};
use common::*;
use tch::Tensor;

const LENS: [usize; 4] = [6, 3, 1, 0];
const W: usize = 6;

/// The global denominators of the whole batch: 10 tokens, 3 non-empty sequences, width 6.
fn global() -> AggScale {
    AggScale {
        batch_num_tokens: Some(LENS.iter().sum::<usize>() as f64),
        global_batch_size: Some(LENS.iter().filter(|&&n| n > 0).count() as f64),
        loss_scale_factor: Some(W as f64),
    }
}

#[derive(Clone, Copy)]
enum Loss {
    Ppo(LossAggMode),
    Gspo,
    Value(LossAggMode),
}

/// Loss and gradient w.r.t. `x` (log-probs or value predictions) on rows `r`.
fn run(
    loss: Loss,
    x: &[Vec<f64>],
    other: &[Vec<f64>],
    adv: &[Vec<f64>],
    r: std::ops::Range<usize>,
    scale: AggScale,
) -> (f64, Vec<Vec<f64>>) {
    let m = t(&mask(&LENS[r.clone()], W));
    let (other, adv) = (t(&other[r.clone()]), t(&adv[r.clone()]));
    let clip = ClipRange::new(0.2, 0.28, 3.0).unwrap();
    let mut value = 0.0;
    let g = autograd(
        |x: &Tensor| {
            let pi = PolicyInputs {
                old_log_prob: &other,
                log_prob: x,
                advantages: &adv,
                response_mask: &m,
                is_weights: None,
            };
            let l = match loss {
                Loss::Ppo(mode) => {
                    ppo_clip_loss(&pi, &clip, LossAgg { mode, scale })
                        .unwrap()
                        .loss
                }
                Loss::Gspo => gspo_loss(&pi, &clip, scale).unwrap().loss,
                Loss::Value(mode) => {
                    value_loss(x, &adv, &other, &m, 0.2, LossAgg { mode, scale })
                        .unwrap()
                        .loss
                }
            };
            value = scalar(&l);
            l
        },
        &x[r],
    );
    (value, g)
}

#[test]
fn micro_batches_sum_to_the_mini_batch() {
    let mut rng = Lcg::new(11);
    let other = rng.matrix(4, W, -2.0, -0.2);
    let x: Vec<Vec<f64>> = other
        .iter()
        .map(|r| r.iter().map(|v| v + rng.uniform(-0.3, 0.3)).collect())
        .collect();
    let mut adv = rng.matrix(4, W, -1.0, 1.0);
    for r in adv.iter_mut() {
        let a = r[0];
        r.iter_mut().for_each(|v| *v = a); // one advantage per sequence (GSPO's case)
    }
    let modes = [
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean,
        LossAggMode::SeqMeanTokenSumNorm,
    ];
    let mut cases: Vec<Loss> = modes.iter().map(|&m| Loss::Ppo(m)).collect();
    cases.extend(modes.iter().map(|&m| Loss::Value(m)));
    cases.push(Loss::Gspo);
    for loss in cases {
        // The whole batch with its own counts (which equal the global ones).
        let (full, g_full) = run(loss, &x, &other, &adv, 0..4, AggScale::default());
        let (a, g_a) = run(loss, &x, &other, &adv, 0..2, global());
        let (b, g_b) = run(loss, &x, &other, &adv, 2..4, global());
        assert!((full - (a + b)).abs() < 1e-12, "{full} vs {a} + {b}");
        let joined: Vec<Vec<f64>> = g_a.into_iter().chain(g_b).collect();
        assert_close_nonzero(&g_full, &joined, 1e-12, "accumulated gradient");
        // Without the global denominators the sum is wrong (this test can fail).
        let (a_local, _) = run(loss, &x, &other, &adv, 0..2, AggScale::default());
        let (b_local, _) = run(loss, &x, &other, &adv, 2..4, AggScale::default());
        if !matches!(
            loss,
            Loss::Ppo(LossAggMode::SeqMeanTokenSumNorm)
                | Loss::Value(LossAggMode::SeqMeanTokenSumNorm)
        ) {
            assert!((full - (a_local + b_local)).abs() > 1e-6);
        }
    }
}
