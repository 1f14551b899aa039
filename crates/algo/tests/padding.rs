//! Padding changes nothing: every function gives the same results on a batch
//! and on the same batch widened by one padded column and lengthened by one
//! all-padding row, with NaN, ±inf or huge values in every padded position.
//! Gradients on real tokens are unchanged and exactly zero on padding.

mod common;

use colo_algo::entropy::entropy_bonus;
use colo_algo::kl::{apply_kl_penalty, kl_loss};
use colo_algo::mismatch::{mismatch_metrics, truncated_is_weights};
use colo_algo::policy_loss::{gspo_loss, ppo_clip_loss};
use colo_algo::{
    compute_advantage, value_loss, AdvEstimator, AdvantageConfig, AdvantageInputs, AggScale,
    ClipRange, IsLevel, KlEstimator, LossAgg, LossAggMode, PolicyInputs,
};
use common::*;
use tch::Tensor;

const B: usize = 3;
const L: usize = 4;
const LENS: [usize; B] = [4, 2, 3];

/// `base` plus a column and a row filled with `garbage`.
fn widen(base: &[Vec<f64>], garbage: f64) -> Vec<Vec<f64>> {
    let mut out: Vec<Vec<f64>> = base
        .iter()
        .map(|r| r.iter().copied().chain([garbage]).collect())
        .collect();
    out.push(vec![garbage; L + 1]);
    out
}

/// The base batch's part of a widened result.
fn crop(x: &[Vec<f64>]) -> Vec<Vec<f64>> {
    x[..B].iter().map(|r| r[..L].to_vec()).collect()
}

fn base_mask() -> Vec<Vec<f64>> {
    mask(&LENS, L)
}

fn wide_mask() -> Vec<Vec<f64>> {
    let mut m = mask(&LENS, L + 1);
    m.push(vec![0.0; L + 1]);
    m
}

/// Also garbage *inside* the base batch's own padding, so the base case is not trivially clean.
fn dirty(x: &[Vec<f64>], garbage: f64) -> Vec<Vec<f64>> {
    x.iter()
        .zip(base_mask())
        .map(|(r, m)| {
            r.iter()
                .zip(m)
                .map(|(v, w)| if w == 0.0 { garbage } else { *v })
                .collect()
        })
        .collect()
}

fn assert_padding_zero(g: &[Vec<f64>], m: &[Vec<f64>], what: &str) {
    for (gr, mr) in g.iter().zip(m) {
        for (x, w) in gr.iter().zip(mr) {
            if *w == 0.0 {
                assert_eq!(*x, 0.0, "{what}: nonzero on padding: {g:?}");
            }
        }
    }
}

struct Data {
    old: Vec<Vec<f64>>,
    lp: Vec<Vec<f64>>,
    adv: Vec<Vec<f64>>,
}

fn data() -> Data {
    let mut rng = Lcg::new(42);
    let old = dirty(&rng.matrix(B, L, -2.0, -0.1), f64::NAN);
    let lp = old
        .iter()
        .map(|r| r.iter().map(|x| x + rng.uniform(-0.4, 0.4)).collect())
        .collect();
    let adv = dirty(&rng.matrix(B, L, -1.0, 1.0), f64::INFINITY);
    Data { old, lp, adv }
}

#[test]
fn policy_losses_ignore_padding() {
    let d = data();
    let clip = ClipRange::new(0.2, 0.28, 3.0).unwrap();
    // seq-mean-token-sum-norm divides by the padded length unless told a constant.
    let scale = AggScale {
        loss_scale_factor: Some(L as f64),
        ..Default::default()
    };
    for mode in [
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenMean,
        LossAggMode::SeqMeanTokenSumNorm,
    ] {
        let run = |old: &[Vec<f64>], lp: &[Vec<f64>], adv: &[Vec<f64>], m: &[Vec<f64>], gspo| {
            let (old, adv, m) = (t(old), t(adv), t(m));
            let mut metrics = None;
            let mut value = 0.0;
            let g = autograd(
                |lp: &Tensor| {
                    let x = PolicyInputs {
                        old_log_prob: &old,
                        log_prob: lp,
                        advantages: &adv,
                        response_mask: &m,
                        is_weights: None,
                    };
                    let out = if gspo {
                        gspo_loss(&x, &clip, scale).unwrap()
                    } else {
                        ppo_clip_loss(&x, &clip, LossAgg { mode, scale }).unwrap()
                    };
                    metrics = Some(out.metrics);
                    value = scalar(&out.loss);
                    out.loss
                },
                lp,
            );
            (value, g, metrics.unwrap())
        };
        for gspo in [false, true] {
            let (v0, g0, m0) = run(&d.old, &d.lp, &d.adv, &base_mask(), gspo);
            let (v1, g1, m1) = run(
                &widen(&d.old, f64::NAN),
                &widen(&d.lp, f64::NEG_INFINITY),
                &widen(&d.adv, 1e30),
                &wide_mask(),
                gspo,
            );
            assert!(
                v0.is_finite() && (v0 - v1).abs() < 1e-12,
                "{mode:?} gspo={gspo}: {v0} vs {v1}"
            );
            assert_eq!(m0, m1);
            assert_close_nonzero(&g0, &crop(&g1), 1e-12, "policy gradient");
            assert_padding_zero(&g1, &wide_mask(), "policy gradient");
        }
    }
}

#[test]
fn value_kl_entropy_ignore_padding() {
    let d = data();
    let run = |vp: &[Vec<f64>], other: &[Vec<f64>], m: &[Vec<f64>]| {
        let (other, m) = (t(other), t(m));
        let agg: LossAgg = LossAggMode::SeqMeanTokenMean.into();
        let v = value_loss(&t(vp), &other, &other, &m, 0.2, agg).unwrap();
        let k = kl_loss(&t(vp), &other, &m, KlEstimator::K3, agg).unwrap();
        let e = entropy_bonus(&t(vp), &m, agg).unwrap();
        let p = apply_kl_penalty(&other, &t(vp), &other, &m, KlEstimator::K1, 0.1).unwrap();
        (
            [
                scalar(&v.loss),
                v.metrics.vf_clipfrac,
                scalar(&k),
                scalar(&e),
                p.kl,
            ],
            rows(&p.token_level_rewards),
        )
    };
    let (a, ra) = run(&d.lp, &d.old, &base_mask());
    let (b, rb) = run(
        &widen(&d.lp, f64::INFINITY),
        &widen(&d.old, f64::NAN),
        &wide_mask(),
    );
    for (x, y) in a.iter().zip(&b) {
        assert!(x.is_finite() && (x - y).abs() < 1e-12, "{a:?} vs {b:?}");
    }
    // Rewards on real tokens agree; on padding the KL term is zero (rewards keep
    // whatever score was there: the penalty does not invent rewards).
    let real = |r: &[Vec<f64>]| -> Vec<Vec<f64>> {
        r.iter()
            .zip(base_mask())
            .map(|(row, m)| {
                row.iter()
                    .zip(m)
                    .map(|(x, w)| if w == 0.0 { 0.0 } else { *x })
                    .collect()
            })
            .collect()
    };
    assert_close(&real(&ra), &real(&crop(&rb)), 1e-12, "kl rewards");
}

#[test]
fn advantages_ignore_padding() {
    let mut rng = Lcg::new(7);
    let rewards = dirty(&rng.matrix(B, L, -1.0, 1.0), f64::NAN);
    let values = dirty(&rng.matrix(B, L, -1.0, 1.0), f64::INFINITY);
    for est in [
        AdvEstimator::Gae,
        AdvEstimator::Grpo,
        AdvEstimator::Rloo,
        AdvEstimator::ReinforcePlusPlus,
        AdvEstimator::ReinforcePlusPlusBaseline,
        AdvEstimator::Remax,
        // (Not GRPO for pass@k, which refuses the groups of one here, nor
        // GPG, whose scale counts the batch's rows: the wide batch adds one.)
        AdvEstimator::Opo,
    ] {
        let cfg = AdvantageConfig {
            adv_estimator: est,
            gamma: 0.9,
            lam: 0.95,
            norm_adv_by_std_in_grpo: true,
            whiten_gae: true,
            epsilon: 1e-6,
        };
        let run = |r: &[Vec<f64>], v: &[Vec<f64>], m: &[Vec<f64>], idx: &[u64], base: &[f32]| {
            let (r, v, m) = (t(r), t(v), t(m));
            let out = compute_advantage(
                &cfg,
                &AdvantageInputs {
                    token_level_rewards: &r,
                    response_mask: &m,
                    values: Some(&v),
                    index: Some(idx),
                    reward_baselines: Some(base),
                },
            )
            .unwrap();
            (rows(&out.advantages), rows(&out.returns))
        };
        let (a0, r0) = run(
            &rewards,
            &values,
            &base_mask(),
            &[1, 1, 2],
            &[0.1, 0.2, 0.3],
        );
        let (a1, r1) = run(
            &widen(&rewards, f64::NAN),
            &widen(&values, f64::NAN),
            &wide_mask(),
            &[1, 1, 2, 3],
            &[0.1, 0.2, 0.3, 0.4],
        );
        let what = format!("{est:?}");
        // Advantages are computed in f32 on the host.
        assert_close_nonzero(&a0, &crop(&a1), 1e-6, &what);
        assert_close(&r0, &crop(&r1), 1e-6, &what);
        assert_padding_zero(&a1, &wide_mask(), &what);
        assert_padding_zero(&r1, &wide_mask(), &what);
    }
}

#[test]
fn mismatch_ignores_padding() {
    let d = data();
    let m0 = mismatch_metrics(&t(&d.lp), &t(&d.old), &t(&base_mask())).unwrap();
    let m1 = mismatch_metrics(
        &t(&widen(&d.lp, f64::INFINITY)),
        &t(&widen(&d.old, f64::NAN)),
        &t(&wide_mask()),
    )
    .unwrap();
    assert_eq!(m0, m1);
    for level in [IsLevel::Token, IsLevel::Sequence] {
        let w0 = truncated_is_weights(&t(&d.lp), &t(&d.old), &t(&base_mask()), level, 1.2).unwrap();
        let w1 = truncated_is_weights(
            &t(&widen(&d.lp, f64::INFINITY)),
            &t(&widen(&d.old, f64::NAN)),
            &t(&wide_mask()),
            level,
            1.2,
        )
        .unwrap();
        assert_eq!(w0.metrics, w1.metrics);
        let (a, b) = (rows(&w0.weights), rows(&w1.weights));
        assert_close_nonzero(&a, &crop(&b), 1e-12, "is weights");
        assert_padding_zero(&b, &wide_mask(), "is weights");
    }
}
