//! Every differentiated function's gradient, from libtorch's autograd
//! (`backward()`, then `.grad()` of the input), against
//! central finite differences in f64 on random (seeded) inputs with padding.
//! Random inputs make some tokens clipped and some not, so both branches of
//! each loss are exercised; the gradients on padding must be exactly zero.

mod common;

use colo_algo::entropy::{entropy_bonus, entropy_from_logits};
use colo_algo::kl::kl_loss;
use colo_algo::masked::masked_whiten;
use colo_algo::policy_loss::{gpg_loss, gspo_loss, ppo_clip_loss};
use colo_algo::policy_variants::{clip_cov_loss, geo_mean_loss, kl_cov_loss, sapo_loss};
use colo_algo::{
    value_loss, AggScale, ClipCov, ClipRange, KlEstimator, LossAgg, LossAggMode, PolicyInputs,
    SapoTemperatures,
};
use common::*;
use tch::Tensor;

const MODES: [LossAggMode; 4] = [
    LossAggMode::TokenMean,
    LossAggMode::SeqMeanTokenSum,
    LossAggMode::SeqMeanTokenMean,
    LossAggMode::SeqMeanTokenSumNorm,
];
const H: f64 = 1e-6;
const TOL: f64 = 1e-6;

struct Batch {
    old: Vec<Vec<f64>>,
    lp: Vec<Vec<f64>>,
    adv: Vec<Vec<f64>>,
    mask: Vec<Vec<f64>>,
}

/// 4 sequences of lengths 6, 3, 1, 0 (an empty one) in width 6.
fn batch(seed: u64, spread: f64, per_sequence_adv: bool) -> Batch {
    let mut rng = Lcg::new(seed);
    let old = rng.matrix(4, 6, -2.0, -0.1);
    let lp = old
        .iter()
        .map(|r| r.iter().map(|x| x + rng.uniform(-spread, spread)).collect())
        .collect();
    let mut adv = rng.matrix(4, 6, -1.5, 1.5);
    if per_sequence_adv {
        for r in adv.iter_mut() {
            let a = r[0];
            r.iter_mut().for_each(|x| *x = a);
        }
    }
    Batch {
        old,
        lp,
        adv,
        mask: mask(&[6, 3, 1, 0], 6),
    }
}

fn assert_zero_on_padding(g: &[Vec<f64>], mask: &[Vec<f64>], what: &str) {
    for (gr, mr) in g.iter().zip(mask) {
        for (x, m) in gr.iter().zip(mr) {
            if *m == 0.0 {
                assert_eq!(*x, 0.0, "{what}: gradient on padding");
            }
        }
    }
}

/// Checks the gradient in log π of the policy loss `loss` on batch `b`
/// (with IS weights `w`, if given): autograd's against finite
/// differences, and exactly zero on padding.
fn check_policy_gradient(
    b: &Batch,
    w: Option<&Tensor>,
    what: &str,
    loss: impl Fn(&PolicyInputs) -> Tensor,
) {
    let (old, adv, mask) = (t(&b.old), t(&b.adv), t(&b.mask));
    let f = |lp: &Tensor| {
        loss(&PolicyInputs {
            old_log_prob: &old,
            log_prob: lp,
            advantages: &adv,
            response_mask: &mask,
            is_weights: w,
        })
    };
    let a = autograd(f, &b.lp);
    assert_close_nonzero(&a, &numeric_grad(f, &b.lp, H), TOL, what);
    assert_zero_on_padding(&a, &b.mask, what);
}

#[test]
fn ppo_clip_gradient_all_modes() {
    let b = batch(1, 0.5, false);
    let clip = ClipRange::new(0.2, 0.28, 1.5).unwrap();
    for mode in MODES {
        let loss = |x: &PolicyInputs| ppo_clip_loss(x, &clip, mode.into()).unwrap().loss;
        check_policy_gradient(&b, None, &format!("ppo {mode:?}"), loss);
    }
    // The random case must exercise clipping, or the check above says little.
    let (old, adv, mask) = (t(&b.old), t(&b.adv), t(&b.mask));
    let x = PolicyInputs {
        old_log_prob: &old,
        log_prob: &t(&b.lp),
        advantages: &adv,
        response_mask: &mask,
        is_weights: None,
    };
    let m = ppo_clip_loss(&x, &clip, LossAggMode::TokenMean.into())
        .unwrap()
        .metrics;
    assert!(m.pg_clipfrac > 0.0 && m.pg_clipfrac < 1.0, "{m:?}");
}

#[test]
fn ppo_clip_gradient_with_is_weights() {
    let b = batch(2, 0.3, false);
    let w = t(&Lcg::new(3).matrix(4, 6, 0.5, 2.0));
    let clip = ClipRange::new(0.2, 0.2, 3.0).unwrap();
    let loss = |x: &PolicyInputs| {
        ppo_clip_loss(x, &clip, LossAggMode::TokenMean.into())
            .unwrap()
            .loss
    };
    check_policy_gradient(&b, Some(&w), "ppo+is", loss);
}

#[test]
fn gpg_gradient_all_modes_with_is_weights() {
    let b = batch(4, 0.5, false);
    let w = t(&Lcg::new(5).matrix(4, 6, 0.5, 2.0));
    for mode in MODES {
        let loss = |x: &PolicyInputs| gpg_loss(x, mode.into()).unwrap().loss;
        check_policy_gradient(&b, Some(&w), &format!("gpg {mode:?}"), loss);
    }
}

/// (CISPO is not here: its weight's gradient is stopped, so its gradient
/// is not the loss value's; its unit test checks it in closed form.)
#[test]
fn kl_cov_gradient_all_modes() {
    let b = batch(6, 0.5, false);
    for mode in MODES {
        // The penalised tokens do not change under a step of 1e-6.
        let loss = |x: &PolicyInputs| kl_cov_loss(x, 0.2, 0.5, mode.into()).unwrap().loss;
        check_policy_gradient(&b, None, &format!("kl_cov {mode:?}"), loss);
    }
}

#[test]
fn clip_cov_gradient_all_modes() {
    let b = batch(7, 0.5, false);
    let clip = ClipRange::new(0.2, 0.28, 3.0).unwrap();
    // Two of the ten tokens drawn from those of covariance in (0.05, 5);
    // neither the draw nor the candidates change under a step of 1e-6.
    let cc = ClipCov {
        ratio: 0.2,
        lb: 0.05,
        ub: 5.0,
    };
    let (old, lp, adv, mask) = (t(&b.old), t(&b.lp), t(&b.adv), t(&b.mask));
    let x = PolicyInputs {
        old_log_prob: &old,
        log_prob: &lp,
        advantages: &adv,
        response_mask: &mask,
        is_weights: None,
    };
    let drawn = clip_cov_loss(&x, &clip, &cc, 3, LossAggMode::TokenMean.into()).unwrap();
    let share = drawn.metrics.pg_clipfrac;
    assert!(
        (share - 0.2).abs() < 1e-6,
        "two of ten tokens drawn, not {share}"
    );
    for mode in MODES {
        let loss = |x: &PolicyInputs| clip_cov_loss(x, &clip, &cc, 3, mode.into()).unwrap().loss;
        check_policy_gradient(&b, None, &format!("clip_cov {mode:?}"), loss);
    }
}

#[test]
fn geo_mean_gradient_with_is_weights() {
    let b = batch(8, 0.5, true);
    let w = t(&Lcg::new(9).matrix(4, 6, 0.5, 2.0));
    let clip = ClipRange::new(0.4, 0.4, 3.0).unwrap();
    let loss = |x: &PolicyInputs| geo_mean_loss(x, &clip, AggScale::default()).unwrap().loss;
    check_policy_gradient(&b, Some(&w), "geo_mean", loss);
}

#[test]
fn sapo_gradient_with_is_weights() {
    let b = batch(10, 0.5, false);
    let w = t(&Lcg::new(11).matrix(4, 6, 0.5, 2.0));
    let tau = SapoTemperatures {
        pos: 1.0,
        neg: 1.05,
    };
    let loss = |x: &PolicyInputs| sapo_loss(x, &tau, AggScale::default()).unwrap().loss;
    check_policy_gradient(&b, Some(&w), "sapo", loss);
}

#[test]
fn gspo_token_gradient_equals_sequence_objective_gradient() {
    // With one advantage per sequence, GSPO-token's stop-gradient gradient is
    // the true gradient of the sequence objective, so finite differences agree.
    let b = batch(4, 0.15, true);
    let clip = ClipRange::new(0.05, 0.05, 3.0).unwrap();
    let loss = |x: &PolicyInputs| gspo_loss(x, &clip, AggScale::default()).unwrap().loss;
    check_policy_gradient(&b, None, "gspo", loss);
}

#[test]
fn value_loss_gradient() {
    let mut rng = Lcg::new(5);
    let (vp, ret, old) = (
        rng.matrix(4, 6, -1.0, 1.0),
        rng.matrix(4, 6, -1.0, 1.0),
        rng.matrix(4, 6, -1.0, 1.0),
    );
    let m = mask(&[6, 3, 1, 0], 6);
    let (ret, old, mt) = (t(&ret), t(&old), t(&m));
    for mode in MODES {
        let f = |v: &Tensor| {
            value_loss(v, &ret, &old, &mt, 0.3, mode.into())
                .unwrap()
                .loss
        };
        let a = autograd(f, &vp);
        assert_close_nonzero(&a, &numeric_grad(f, &vp, H), TOL, "value");
        assert_zero_on_padding(&a, &m, "value");
    }
}

#[test]
fn kl_loss_gradient_each_estimator() {
    let b = batch(6, 0.8, false);
    let (rf, mask) = (t(&b.old), t(&b.mask));
    for est in [
        KlEstimator::K1,
        KlEstimator::Abs,
        KlEstimator::K2,
        KlEstimator::K3,
    ] {
        let f = |lp: &Tensor| {
            kl_loss(lp, &rf, &mask, est, LossAggMode::SeqMeanTokenMean.into()).unwrap()
        };
        let a = autograd(f, &b.lp);
        assert_close_nonzero(&a, &numeric_grad(f, &b.lp, H), TOL, &format!("{est:?}"));
        assert_zero_on_padding(&a, &b.mask, "kl");
    }
}

#[test]
fn entropy_gradient() {
    // logits (2, 3, 5) flattened to (6, 5) for the finite-difference helper.
    let logits = Lcg::new(7).matrix(6, 5, -3.0, 3.0);
    let m = t(&mask(&[3, 1], 3));
    let f = |z: &Tensor| {
        let h = entropy_from_logits(&z.reshape([2, 3, 5])).unwrap();
        entropy_bonus(&h, &m, LossAggMode::TokenMean.into()).unwrap()
    };
    let a = autograd(f, &logits);
    assert_close_nonzero(&a, &numeric_grad(f, &logits, H), TOL, "entropy");
    // position (1, 1) and (1, 2) are padding: rows 4 and 5 of the flattened logits.
    assert!(a[4].iter().chain(&a[5]).all(|&x| x == 0.0));
}

#[test]
fn whitening_is_differentiable() {
    let x = Lcg::new(8).matrix(3, 4, -2.0, 2.0);
    let c = t(&Lcg::new(9).matrix(3, 4, -1.0, 1.0));
    let m = t(&mask(&[4, 2, 3], 4));
    let f = |v: &Tensor| (masked_whiten(v, &m, true).unwrap() * &c * &m).sum(tch::Kind::Double);
    assert_close_nonzero(&autograd(f, &x), &numeric_grad(f, &x, H), 1e-5, "whiten");
}

#[test]
fn global_scale_changes_only_the_denominator() {
    // agg with batch_num_tokens = 2·(own count) halves loss and gradient.
    let b = batch(10, 0.3, false);
    let (old, adv, mask) = (t(&b.old), t(&b.adv), t(&b.mask));
    let clip = ClipRange::new(0.2, 0.2, 3.0).unwrap();
    let n: f64 = b.mask.iter().flatten().sum();
    let g = |scale: AggScale| {
        autograd(
            |lp: &Tensor| {
                let x = PolicyInputs {
                    old_log_prob: &old,
                    log_prob: lp,
                    advantages: &adv,
                    response_mask: &mask,
                    is_weights: None,
                };
                let agg = LossAgg {
                    mode: LossAggMode::TokenMean,
                    scale,
                };
                ppo_clip_loss(&x, &clip, agg).unwrap().loss
            },
            &b.lp,
        )
    };
    let local = g(AggScale::default());
    let half = g(AggScale {
        batch_num_tokens: Some(2.0 * n),
        ..Default::default()
    });
    let doubled: Vec<Vec<f64>> = half
        .iter()
        .map(|r| r.iter().map(|x| 2.0 * x).collect())
        .collect();
    assert_close_nonzero(&local, &doubled, 1e-12, "scale");
}
