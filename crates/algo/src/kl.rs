//! KL divergence to the reference policy, estimated per token from the
//! log-probabilities of the sampled tokens, used either as a loss term or as a
//! penalty subtracted from the rewards.
//!
//! The estimators are J. Schulman's, "Approximating KL divergence" (2020,
//! <http://joschu.net/blog/kl-approx.html>). With r = π_ref(y)/π(y) for a token
//! y sampled from π, and log r = ref_log_prob − log_prob:
//!
//! - k1 = −log r = log_prob − ref_log_prob: unbiased for KL(π‖π_ref), high variance, can be negative;
//! - k2 = ½ (log r)²: biased, low variance, always ≥ 0; its gradient is the KL's gradient;
//! - k3 = r − 1 − log r: unbiased, low variance, always ≥ 0 (verl's `low_var_kl`,
//!   as used by GRPO, Shao et al. 2024, arXiv:2402.03300). Like verl, log r is clamped
//!   to [−20, 20] and the result to [−10, 10] for numerical stability.
//! - abs = |log_prob − ref_log_prob| (verl's `abs`).
//!
//! The penalty's coefficient is fixed or follows the adaptive controller of
//! Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences",
//! arXiv:1909.08593), as verl's `kl_ctrl`.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::agg::{agg_loss, LossAgg};
use crate::error::{Error, Result};
use crate::masked::{check_all, host_means, masked_mean_rows, upcast, zero_padding};

/// Bound on log r before the exponential in k3 (verl's value).
pub const K3_LOG_RATIO_CLAMP: f64 = 20.0;
/// Bound on the k3 estimate itself (verl's `low_var_kl` clamp).
pub const K3_CLAMP: f64 = 10.0;

/// Which per-token KL estimator. Config names: `k1` (alias verl's `kl`),
/// `abs`, `k2` (alias `mse`), `k3` (alias `low_var_kl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// log_prob − ref_log_prob.
    #[serde(alias = "kl")]
    K1,
    /// |log_prob − ref_log_prob|.
    Abs,
    /// ½ (log_prob − ref_log_prob)².
    #[serde(alias = "mse")]
    K2,
    /// exp(ref − lp) − (ref − lp) − 1, clamped (see the module doc).
    #[serde(alias = "low_var_kl")]
    K3,
}

/// Per-token KL estimate, shape (batch, response_len) like both inputs, and
/// of their kind (computed in f32 for bf16 inputs, where k3's r − 1 − log r
/// would cancel to nothing).
///
/// Differentiable in `log_prob` (and `ref_log_prob`, though the reference is
/// normally a constant). Padding positions are *not* zeroed: aggregate with a
/// mask, or use [`kl_loss`]. (verl `kl_penalty_forward`.)
pub fn kl_estimate(log_prob: &Tensor, ref_log_prob: &Tensor, est: KlEstimator) -> Result<Tensor> {
    check_all(("log_prob", log_prob), &[("ref_log_prob", ref_log_prob)])?;
    Ok(estimate(&upcast(log_prob), &upcast(ref_log_prob), est).to_kind(log_prob.kind()))
}

/// [`kl_estimate`] without checks, in the inputs' kind.
fn estimate(log_prob: &Tensor, ref_log_prob: &Tensor, est: KlEstimator) -> Tensor {
    let diff = log_prob - ref_log_prob;
    match est {
        KlEstimator::K1 => diff,
        KlEstimator::Abs => diff.abs(),
        KlEstimator::K2 => diff.square() * 0.5,
        KlEstimator::K3 => {
            let log_r = (-diff).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP);
            (log_r.exp() - &log_r - 1.0).clamp(-K3_CLAMP, K3_CLAMP)
        }
    }
}

/// The KL term of the actor loss: `agg_loss(kl_estimate(..), response_mask, agg)`,
/// a scalar tensor (f32 for bf16 inputs); the caller multiplies it by
/// `kl_loss_coef` and adds it to the policy loss (GRPO's formulation, verl's
/// `use_kl_loss`).
///
/// Shapes: all three inputs (batch, response_len).
pub fn kl_loss(
    log_prob: &Tensor,
    ref_log_prob: &Tensor,
    response_mask: &Tensor,
    est: KlEstimator,
    agg: LossAgg,
) -> Result<Tensor> {
    check_all(
        ("log_prob", log_prob),
        &[
            ("ref_log_prob", ref_log_prob),
            ("response_mask", response_mask),
        ],
    )?;
    let kl = estimate(&upcast(log_prob), &upcast(ref_log_prob), est);
    agg_loss(&kl, &upcast(response_mask), agg)
}

/// Rewards with the KL penalty applied, and the KL that was measured.
#[derive(Debug)]
pub struct KlPenalty {
    /// token_level_scores − β · kl · mask, shape (batch, response_len), detached.
    pub token_level_rewards: Tensor,
    /// Mean over non-empty sequences of the per-sequence masked-mean KL
    /// (verl's `actor/reward_kl_penalty`; verl also counts empty rows, as 0,
    /// so padding rows would dilute it); feed it to [`KlController::update`].
    pub kl: f64,
    /// The β that was applied (verl's `actor/reward_kl_penalty_coeff`).
    pub beta: f64,
}

/// A clone shares the rewards tensor's storage with the original (`shallow_clone`).
impl Clone for KlPenalty {
    fn clone(&self) -> Self {
        KlPenalty {
            token_level_rewards: self.token_level_rewards.shallow_clone(),
            kl: self.kl,
            beta: self.beta,
        }
    }
}

/// KL as a reward penalty (InstructGPT-style PPO, Ouyang et al. 2022,
/// arXiv:2203.02155; verl's `use_kl_in_reward` / `apply_kl_penalty`):
/// rewards_it = scores_it − β · kl_it · mask_it.
///
/// Shapes: all four tensors (batch, response_len). The result is detached
/// (rewards are data, not part of the graph) and of the scores' kind; the
/// measured KL is the one value read back to the host.
pub fn apply_kl_penalty(
    token_level_scores: &Tensor,
    old_log_prob: &Tensor,
    ref_log_prob: &Tensor,
    response_mask: &Tensor,
    est: KlEstimator,
    beta: f64,
) -> Result<KlPenalty> {
    check_all(
        ("token_level_scores", token_level_scores),
        &[
            ("old_log_prob", old_log_prob),
            ("ref_log_prob", ref_log_prob),
            ("response_mask", response_mask),
        ],
    )?;
    let mask = upcast(response_mask);
    let kl = estimate(
        &upcast(&old_log_prob.detach()),
        &upcast(&ref_log_prob.detach()),
        est,
    );
    // Zero the padding through the mask in a NaN-safe way (as masked_mean does).
    let kl = zero_padding(&kl, &mask) * &mask;
    let token_level_rewards =
        (upcast(&token_level_scores.detach()) - &kl * beta).to_kind(token_level_scores.kind());
    let per_seq = masked_mean_rows(&kl, &mask)?; // (batch,)
    let kind = mask.kind();
    let non_empty = mask.sum_dim_intlist(-1, false, kind).gt(0.0).to_kind(kind);
    let current = host_means(&[(&per_seq, &non_empty)])?[0];
    Ok(KlPenalty {
        token_level_rewards,
        kl: current,
        beta,
    })
}

/// How the KL-penalty coefficient evolves. Config name: `type = "fixed" | "adaptive"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlControlType {
    /// β stays `kl_coef`.
    #[default]
    Fixed,
    /// β is steered towards `target_kl` (Ziegler et al. 2019).
    Adaptive,
}

/// verl's `algorithm.kl_ctrl` section, as written in the config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, colo_keys::Keys)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "algorithm.kl_ctrl")]
pub struct KlControlConfig {
    /// β controller of the reward penalty
    #[serde(rename = "type")]
    #[key(unit = "\"fixed\" or \"adaptive\"")]
    pub kind: KlControlType,
    /// β, or its initial value when adaptive
    #[key(range = "≥ 0")]
    pub kl_coef: f64,
    /// adaptive controller: the KL it aims for
    #[key(unit = "nats")]
    pub target_kl: f64,
    /// adaptive controller: its horizon
    #[key(unit = "samples")]
    pub horizon: f64,
}

impl Default for KlControlConfig {
    /// verl's defaults.
    fn default() -> Self {
        KlControlConfig {
            kind: KlControlType::Fixed,
            kl_coef: 0.001,
            target_kl: 0.1,
            horizon: 10000.0,
        }
    }
}

/// The KL-penalty coefficient β and its update rule.
#[derive(Clone, Debug, PartialEq)]
pub enum KlController {
    /// β constant.
    Fixed {
        /// β.
        value: f64,
    },
    /// Ziegler et al. 2019, eq. (2): e = clip(KL/target − 1, −0.2, 0.2),
    /// β ← β · (1 + e · n_steps / horizon).
    Adaptive {
        /// Current β.
        value: f64,
        /// Target KL.
        target: f64,
        /// Horizon in samples.
        horizon: f64,
    },
}

impl KlController {
    /// Validates `cfg` (β ≥ 0; for adaptive, target > 0 and horizon > 0).
    pub fn new(cfg: &KlControlConfig) -> Result<Self> {
        let bad = |field, value: f64, reason| Error::InvalidConfig {
            field,
            value: value.to_string(),
            reason,
        };
        if !(cfg.kl_coef.is_finite() && cfg.kl_coef >= 0.0) {
            return Err(bad("kl_ctrl.kl_coef", cfg.kl_coef, "must be ≥ 0"));
        }
        Ok(match cfg.kind {
            KlControlType::Fixed => KlController::Fixed { value: cfg.kl_coef },
            KlControlType::Adaptive => {
                if !(cfg.target_kl.is_finite() && cfg.target_kl > 0.0) {
                    return Err(bad("kl_ctrl.target_kl", cfg.target_kl, "must be > 0"));
                }
                if !(cfg.horizon.is_finite() && cfg.horizon > 0.0) {
                    return Err(bad("kl_ctrl.horizon", cfg.horizon, "must be > 0"));
                }
                KlController::Adaptive {
                    value: cfg.kl_coef,
                    target: cfg.target_kl,
                    horizon: cfg.horizon,
                }
            }
        })
    }

    /// The current β.
    pub fn value(&self) -> f64 {
        match *self {
            KlController::Fixed { value } | KlController::Adaptive { value, .. } => value,
        }
    }

    /// Updates β after a batch of `n_steps` samples whose measured KL was
    /// `current_kl` ([`KlPenalty::kl`]). A no-op for the fixed controller.
    pub fn update(&mut self, current_kl: f64, n_steps: usize) {
        if let KlController::Adaptive {
            value,
            target,
            horizon,
        } = self
        {
            let err = (current_kl / *target - 1.0).clamp(-0.2, 0.2);
            *value *= 1.0 + err * n_steps as f64 / *horizon;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agg::LossAggMode;
    use crate::masked::test_util::*;

    #[test]
    fn estimators_match_hand_values() {
        // d = lp − ref = [0.5, −1.0, 30.0]
        let lp = t2(&[&[-1.0, -2.0, 0.0]]);
        let rf = t2(&[&[-1.5, -1.0, -30.0]]);
        let k = |e| rows(&kl_estimate(&lp, &rf, e).unwrap())[0].clone();
        assert_eq!(k(KlEstimator::K1), vec![0.5, -1.0, 30.0]);
        assert_eq!(k(KlEstimator::Abs), vec![0.5, 1.0, 30.0]);
        assert_eq!(k(KlEstimator::K2), vec![0.125, 0.5, 450.0]);
        // k3 with log r = −d: exp(−0.5) + 0.5 − 1 = 0.106531; exp(1) − 1 − 1 = 0.718282;
        // log r = −30 clamps to −20: exp(−20) + 20 − 1 = 19.0 → clamped to 10.
        let k3 = k(KlEstimator::K3);
        assert!((k3[0] - 0.106_531).abs() < 1e-5, "{k3:?}");
        assert!((k3[1] - 0.718_282).abs() < 1e-5, "{k3:?}");
        assert_eq!(k3[2], 10.0);
    }

    #[test]
    fn k3_loss_gradient() {
        // d k3 / d lp = 1 − exp(ref − lp). lp = −1, ref = −1.5: 1 − e^{−0.5} = 0.393469.
        // token-mean over two unmasked tokens halves it; the masked token gets 0.
        let lp = var(&t2(&[&[-1.0, -2.0, -3.0]]));
        let rf = t2(&[&[-1.5, -2.0, 0.0]]);
        let m = t2(&[&[1.0, 1.0, 0.0]]);
        let loss = kl_loss(&lp, &rf, &m, KlEstimator::K3, LossAggMode::TokenMean.into()).unwrap();
        loss.backward();
        let g = rows(&lp.grad());
        assert!((g[0][0] - 0.393_469 / 2.0).abs() < 1e-6, "{g:?}");
        assert_eq!(g[0][1], 0.0); // lp == ref: 1 − e^0
        assert_eq!(g[0][2], 0.0);
    }

    #[test]
    fn penalty_subtracts_beta_kl_on_response_tokens_only() {
        let scores = t2(&[&[0.0, 0.0, 1.0], &[0.0, 2.0, 0.0]]);
        let old = t2(&[&[-1.0, -1.0, -1.0], &[-0.5, -0.5, f32::NAN]]);
        let rf = t2(&[&[-1.2, -0.9, -1.0], &[-1.5, -0.5, -1.0]]);
        let m = t2(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        let p = apply_kl_penalty(&scores, &old, &rf, &m, KlEstimator::K1, 0.5).unwrap();
        // k1 = [[0.2, −0.1, 0], [1.0, 0, (masked)]]; rewards = scores − 0.5·k1.
        let r = rows(&p.token_level_rewards);
        let want = [[-0.1, 0.05, 1.0], [-0.5, 2.0, 0.0]];
        for (i, row) in want.iter().enumerate() {
            for (j, w) in row.iter().enumerate() {
                assert!((r[i][j] - w).abs() < 1e-6, "{r:?}");
            }
        }
        // per-sequence means: 0.1/3 = 0.033333 and 1.0/2 = 0.5 → batch mean 0.266667
        assert!((p.kl - 0.266_667).abs() < 1e-5, "{}", p.kl);
        assert_eq!(p.beta, 0.5);
    }

    #[test]
    fn adaptive_controller_follows_ziegler() {
        let cfg = KlControlConfig {
            kind: KlControlType::Adaptive,
            kl_coef: 0.1,
            target_kl: 0.1,
            horizon: 100.0,
        };
        let mut c = KlController::new(&cfg).unwrap();
        // KL 3× the target: error clipped to 0.2; β = 0.1 · (1 + 0.2 · 10/100) = 0.102
        c.update(0.3, 10);
        assert!((c.value() - 0.102).abs() < 1e-12);
        // KL 0.09: error −0.1; β = 0.102 · (1 − 0.1 · 50/100) = 0.0969
        c.update(0.09, 50);
        assert!((c.value() - 0.0969).abs() < 1e-12);
        let mut f = KlController::new(&KlControlConfig::default()).unwrap();
        f.update(5.0, 1000);
        assert_eq!(f.value(), 0.001);
    }

    #[test]
    fn controller_config_is_validated_and_named_like_verl() {
        let cfg: KlControlConfig =
            serde_json::from_str(r#"{"type": "adaptive", "kl_coef": 0.2, "horizon": 0}"#).unwrap();
        let err = KlController::new(&cfg).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidConfig {
                    field: "kl_ctrl.horizon",
                    ..
                }
            ),
            "{err}"
        );
        let e: KlEstimator = serde_json::from_str("\"low_var_kl\"").unwrap();
        assert_eq!(e, KlEstimator::K3);
        let e: KlEstimator = serde_json::from_str("\"k2\"").unwrap();
        assert_eq!(e, KlEstimator::K2);
    }
}
