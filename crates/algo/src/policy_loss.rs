//! Policy-gradient losses: PPO's clipped surrogate (with DAPO's decoupled clip
//! ranges and dual clip), GSPO's sequence-level variant, GPG's and CISPO's,
//! and the dispatch to the others ([`crate::policy_variants`]).
//!
//! All inputs are (batch, response_len) tensors of one float kind on one device:
//! `log_prob` (the current policy, the one differentiated), `old_log_prob` (the
//! policy that the advantages refer to, computed by the trainer before the
//! update), `advantages`, `response_mask` (1.0 on response tokens, 0.0 on
//! padding) and optional truncated-IS weights from [`crate::mismatch`]. Only
//! `log_prob` receives gradient: the others are detached here, so a caller
//! cannot accidentally differentiate through advantages or weights.
//!
//! Padding positions are replaced by zeros before any arithmetic, so NaN or
//! ±inf there (e.g. a rollout engine's −inf log-prob for padding) changes
//! neither the loss nor any gradient.
//!
//! bf16 (or f16) inputs are computed in f32: the ratio exp(log π_θ − log π_old)
//! of two nearby log-probs is meaningless at bf16's 8-bit precision. The loss
//! is then an f32 scalar; its gradient reaches `log_prob` in `log_prob`'s kind.
//! The metrics are read back to the host in one transfer per call.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::agg::{agg_loss, AggScale, LossAgg, LossAggMode};
use crate::error::{Error, Result};
use crate::masked::{check_all, host_means, masked_sum_rows, upcast, zero_padding};
use crate::policy_variants::{
    clip_cov_loss, geo_mean_loss, kl_cov_loss, sapo_loss, ClipCov, SapoTemperatures,
};

/// Bound on log(π/π_old) before the exponential in PPO (verl's value).
pub const LOG_RATIO_CLAMP: f64 = 20.0;
/// Upper bound on GSPO's log sequence ratio before the exponential (verl's value).
pub const GSPO_LOG_RATIO_MAX: f64 = 10.0;

/// Which policy loss. Config name: verl's `policy_loss.loss_mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyLossMode {
    /// PPO clip with clip-higher and dual clip: [`ppo_clip_loss`].
    #[default]
    Vanilla,
    /// Group Sequence Policy Optimization: [`gspo_loss`].
    Gspo,
    /// GPG's plain policy gradient, no ratio and no clip: [`gpg_loss`].
    Gpg,
    /// MiniMax-M1's clipped IS-weight policy gradient: [`cispo_loss`].
    Cispo,
    /// The unclipped ratio, with a KL penalty on the tokens of largest
    /// covariance: [`kl_cov_loss`].
    KlCov,
    /// PPO's clip, with the gradient dropped on a few tokens drawn among
    /// those of large covariance: [`clip_cov_loss`].
    ClipCov,
    /// GMPO's geometric mean of the token ratios: [`geo_mean_loss`].
    GeoMean,
    /// SAPO's soft gate of the ratio in place of the clip: [`sapo_loss`].
    Sapo,
}

/// The actor's policy-loss settings as written in the config (verl's names).
///
/// Unknown keys are not rejected here, so that the run's config can
/// `#[serde(flatten)]` this into its actor section; that section owns the check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyLossConfig {
    /// Which loss.
    pub loss_mode: PolicyLossMode,
    /// ε of PPO; the default for both clip ranges.
    pub clip_ratio: f64,
    /// ε_low (ratio floor 1 − ε_low); `None` means `clip_ratio`.
    pub clip_ratio_low: Option<f64>,
    /// ε_high (ratio ceiling 1 + ε_high); `None` means `clip_ratio`. DAPO uses 0.28 with ε_low 0.2.
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip bound c (> 1): for A < 0 the loss is at most −c·A.
    pub clip_ratio_c: f64,
    /// How per-token losses become a scalar (ignored by GSPO, see [`gspo_loss`]).
    pub loss_agg_mode: LossAggMode,
    /// KL-Cov: the fraction of a micro-batch's tokens that get the penalty.
    pub kl_cov_ratio: f64,
    /// KL-Cov: the penalty's coefficient on |log π_θ − log π_old|.
    pub ppo_kl_coef: f64,
    /// Clip-Cov: the fraction of a micro-batch's tokens that lose their gradient.
    pub clip_cov_ratio: f64,
    /// Clip-Cov: the covariance range (lb, ub) those tokens are drawn from.
    pub clip_cov_lb: f64,
    pub clip_cov_ub: f64,
    /// SAPO: the gate's temperature for positive advantages.
    pub tau_pos: f64,
    /// SAPO: the gate's temperature for the others.
    pub tau_neg: f64,
}

impl Default for PolicyLossConfig {
    /// verl's defaults: vanilla PPO, ε = 0.2, c = 3, token-mean.
    fn default() -> Self {
        PolicyLossConfig {
            loss_mode: PolicyLossMode::Vanilla,
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: 3.0,
            loss_agg_mode: LossAggMode::TokenMean,
            kl_cov_ratio: 0.0002,
            ppo_kl_coef: 0.1,
            clip_cov_ratio: 0.0002,
            clip_cov_lb: 1.0,
            clip_cov_ub: 5.0,
            tau_pos: 1.0,
            tau_neg: 1.05,
        }
    }
}

/// Validated clip ranges: the ratio is clipped to [1 − low, 1 + high], and for
/// negative advantages the PPO loss is capped at −c·A.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipRange {
    /// ε_low, in [0, 1).
    pub low: f64,
    /// ε_high, ≥ 0.
    pub high: f64,
    /// Dual-clip c, > 1.
    pub dual_clip_c: f64,
}

impl ClipRange {
    /// Checks the ranges (ε_low in [0, 1), ε_high ≥ 0, c > 1, all finite).
    pub fn new(low: f64, high: f64, dual_clip_c: f64) -> Result<Self> {
        let bad = |field, value: f64, reason| Error::InvalidConfig {
            field,
            value: value.to_string(),
            reason,
        };
        if !(0.0..1.0).contains(&low) {
            return Err(bad("clip_ratio_low", low, "must be in [0, 1)"));
        }
        if !(high.is_finite() && high >= 0.0) {
            return Err(bad("clip_ratio_high", high, "must be ≥ 0"));
        }
        if !(dual_clip_c.is_finite() && dual_clip_c > 1.0) {
            return Err(bad(
                "clip_ratio_c",
                dual_clip_c,
                "must be > 1 (dual-clip PPO)",
            ));
        }
        Ok(ClipRange {
            low,
            high,
            dual_clip_c,
        })
    }
}

impl PolicyLossConfig {
    /// The validated clip ranges, with `clip_ratio` filling unset bounds.
    pub fn clip_range(&self) -> Result<ClipRange> {
        ClipRange::new(
            self.clip_ratio_low.unwrap_or(self.clip_ratio),
            self.clip_ratio_high.unwrap_or(self.clip_ratio),
            self.clip_ratio_c,
        )
    }
}

/// Inputs of a policy loss; every tensor is (batch, response_len).
#[derive(Clone, Copy, Debug)]
pub struct PolicyInputs<'a> {
    /// log π_old(y_t), constant.
    pub old_log_prob: &'a Tensor,
    /// log π_θ(y_t), differentiated.
    pub log_prob: &'a Tensor,
    /// Â_t, constant.
    pub advantages: &'a Tensor,
    /// 1.0 for response tokens, 0.0 for padding.
    pub response_mask: &'a Tensor,
    /// Truncated importance-sampling weights for the rollout/train mismatch
    /// ([`crate::mismatch::truncated_is_weights`]), multiplied into the per-token loss.
    pub is_weights: Option<&'a Tensor>,
}

/// Diagnostics of one policy-loss evaluation (verl's `actor/…` metric names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PolicyLossMetrics {
    /// Fraction of response tokens where the clipped term was the larger loss.
    pub pg_clipfrac: f64,
    /// Fraction of response tokens where the dual clip (A < 0) was active.
    pub pg_clipfrac_lower: f64,
    /// Masked mean of log π_old − log π_θ (k1 estimate of KL(π_old‖π_θ)).
    pub ppo_kl: f64,
}

/// A scalar loss to differentiate, and its metrics.
#[derive(Debug)]
pub struct PolicyLoss {
    /// Scalar tensor (f32 for bf16 inputs); gradients flow to `log_prob` only.
    pub loss: Tensor,
    /// Detached diagnostics.
    pub metrics: PolicyLossMetrics,
}

/// A clone shares the loss tensor (and its graph) with the original (`shallow_clone`).
impl Clone for PolicyLoss {
    fn clone(&self) -> Self {
        PolicyLoss {
            loss: self.loss.shallow_clone(),
            metrics: self.metrics,
        }
    }
}

/// The checked, padding-sanitised, detached-where-needed inputs, in the
/// accumulation kind.
pub(crate) struct Prepared {
    pub(crate) log_prob: Tensor,
    pub(crate) old_log_prob: Tensor,
    pub(crate) advantages: Tensor,
    pub(crate) mask: Tensor,
    pub(crate) is_weights: Option<Tensor>,
}

pub(crate) fn prepare(x: &PolicyInputs) -> Result<Prepared> {
    let mut others = vec![
        ("old_log_prob", x.old_log_prob),
        ("advantages", x.advantages),
        ("response_mask", x.response_mask),
    ];
    if let Some(w) = x.is_weights {
        others.push(("is_weights", w));
    }
    check_all(("log_prob", x.log_prob), &others)?;
    let mask = x.response_mask;
    let clean = |t: &Tensor| zero_padding(&upcast(t), mask);
    Ok(Prepared {
        log_prob: clean(x.log_prob),
        old_log_prob: clean(&x.old_log_prob.detach()),
        advantages: clean(&x.advantages.detach()),
        mask: upcast(&mask.detach()),
        is_weights: x.is_weights.map(|w| clean(&w.detach())),
    })
}

/// Per-token losses times the IS weights, if any. (Not `*=`: an in-place
/// product would overwrite a tensor that autograd may have saved.)
pub(crate) fn with_is_weights(pg: Tensor, is_weights: &Option<Tensor>) -> Tensor {
    match is_weights {
        Some(w) => pg * w,
        None => pg,
    }
}

/// PPO's clipped surrogate with decoupled clip ranges and dual clip; verl's
/// `compute_policy_loss_vanilla`.
///
/// Papers: PPO, Schulman et al. 2017, arXiv:1707.06347 (the clip);
/// DAPO, Yu et al. 2025, arXiv:2503.14476 ("clip-higher": ε_high > ε_low);
/// dual-clip PPO, Ye et al. 2020, arXiv:1912.09729 (the bound c for A < 0).
///
/// Per token, with r = exp(clamp(log π_θ − log π_old, ±20)):
///
/// ```text
/// l_clip = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
/// l      = min(l_clip, −c·A)   if A < 0
///          l_clip              otherwise
/// ```
///
/// times the IS weight if given, then aggregated with `agg`.
/// Metrics: `pg_clipfrac` = frac(−A·clip(r) > −A·r), `pg_clipfrac_lower` =
/// frac(l_clip > −c·A and A < 0), `ppo_kl` = mean(log π_old − log π_θ), all over
/// the response mask.
pub fn ppo_clip_loss(x: &PolicyInputs, clip: &ClipRange, agg: LossAgg) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = (&p.log_prob - &p.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = neg_kl.exp();
    let neg_adv = -&p.advantages;
    let l1 = &neg_adv * &ratio;
    let l2 = &neg_adv * ratio.clamp(1.0 - clip.low, 1.0 + clip.high);
    let clipped = l1.maximum(&l2);
    let l3 = &neg_adv * clip.dual_clip_c;
    let negative = p.advantages.lt(0.0);
    let pg = clipped.minimum(&l3).where_self(&negative, &clipped);
    let pg = with_is_weights(pg, &p.is_weights);
    let loss = agg_loss(&pg, &p.mask, agg)?;

    let kind = p.mask.kind();
    let (l1, l2, l3, clipped) = (l1.detach(), l2.detach(), l3.detach(), clipped.detach());
    let clipfrac = l2.gt_tensor(&l1).to_kind(kind);
    let lower = clipped.gt_tensor(&l3).logical_and(&negative).to_kind(kind);
    let kl = -neg_kl.detach();
    let m = host_means(&[(&clipfrac, &p.mask), (&lower, &p.mask), (&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: m[0],
        pg_clipfrac_lower: m[1],
        ppo_kl: m[2],
    };
    Ok(PolicyLoss { loss, metrics })
}

/// GSPO's clipped objective with a sequence-level ratio; verl's `compute_policy_loss_gspo`.
///
/// Paper: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071.
/// The sequence ratio is the geometric mean of the token ratios,
/// s_i = exp((1/|y_i|) Σ_t (log π_θ − log π_old)), and the loss uses the paper's
/// "GSPO-token" form so that per-token advantages are allowed:
///
/// ```text
/// log s_it = sg[log s_i] + log π_θ(y_it) − sg[log π_θ(y_it)]     (clamped ≤ 10)
/// l_it     = max(−A_it·s_it, −A_it·clip(s_it, 1 − ε_low, 1 + ε_high))
/// ```
///
/// s_it equals s_i in value, but its gradient is s_i·∇log π_θ(y_it), which,
/// averaged over the sequence, is the gradient of s_i itself when the
/// advantage is constant over the sequence (the outcome-reward case).
///
/// As in verl the loss is always aggregated with seq-mean-token-mean (the
/// paper's objective is a mean over sequences; any `loss_agg_mode` in the
/// config is ignored), using `scale.global_batch_size` if set. There is no dual
/// clip; `pg_clipfrac_lower` is 0. The clip ranges the paper uses are far
/// smaller than PPO's (3e-4 / 4e-4), since they bound a per-token geometric mean.
pub fn gspo_loss(x: &PolicyInputs, clip: &ClipRange, scale: AggScale) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = &p.log_prob - &p.old_log_prob;
    let seq_len = p
        .mask
        .sum_dim_intlist(-1, false, p.mask.kind())
        .clamp_min(1.0); // (batch,)
    let seq_log_ratio = masked_sum_rows(&neg_kl, &p.mask)? / seq_len; // (batch,)
    let log_s = (&p.log_prob - p.log_prob.detach() + seq_log_ratio.detach().unsqueeze(1))
        .clamp_max(GSPO_LOG_RATIO_MAX);
    let s = log_s.exp();
    let neg_adv = -&p.advantages;
    let l1 = &neg_adv * &s;
    let l2 = &neg_adv * s.clamp(1.0 - clip.low, 1.0 + clip.high);
    let pg = with_is_weights(l1.maximum(&l2), &p.is_weights);
    let agg = LossAgg {
        mode: LossAggMode::SeqMeanTokenMean,
        scale,
    };
    let loss = agg_loss(&pg, &p.mask, agg)?;
    let clipfrac = l2.detach().gt_tensor(&l1.detach()).to_kind(p.mask.kind());
    let kl = -neg_kl.detach();
    let m = host_means(&[(&clipfrac, &p.mask), (&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: m[0],
        pg_clipfrac_lower: 0.0,
        ppo_kl: m[1],
    };
    Ok(PolicyLoss { loss, metrics })
}

/// GPG's policy gradient (Chu et al. 2025, "GPG: A Simple and Strong
/// Reinforcement Learning Baseline for Model Reasoning", arXiv:2504.02546);
/// verl's `compute_policy_loss_gpg`: l_t = −A_t·log π_θ(y_t), times the IS
/// weight if given, aggregated with `agg`. No ratio, so no clip: the
/// update is REINFORCE's with GPG's advantages
/// ([`crate::group::gpg`]). `ppo_kl` is reported as for PPO (verl reports
/// none); the clip fractions are 0.
pub fn gpg_loss(x: &PolicyInputs, agg: LossAgg) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let pg = with_is_weights(-&p.advantages * &p.log_prob, &p.is_weights);
    let loss = agg_loss(&pg, &p.mask, agg)?;
    let kl = (&p.old_log_prob - p.log_prob.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let m = host_means(&[(&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        ppo_kl: m[0],
        ..PolicyLossMetrics::default()
    };
    Ok(PolicyLoss { loss, metrics })
}

/// CISPO (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585); verl's
/// `compute_policy_loss_cispo`: the importance weight is clipped and its
/// gradient stopped, so every token keeps a gradient (PPO's clip drops
/// those whose ratio left the range):
///
/// ```text
/// l_t = −sg[clip(r_t, 1 − ε_low, 1 + ε_high)]·A_t·log π_θ(y_t)
/// ```
///
/// with r = exp(clamp(log π_θ − log π_old, ±20)), times the IS weight if
/// given, aggregated with `agg`. `pg_clipfrac` is the fraction of tokens
/// whose ratio was clipped; `pg_clipfrac_lower` is 0.
pub fn cispo_loss(x: &PolicyInputs, clip: &ClipRange, agg: LossAgg) -> Result<PolicyLoss> {
    let p = prepare(x)?;
    let neg_kl = (&p.log_prob - &p.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
    let ratio = neg_kl.detach().exp();
    let clipped = ratio.clamp(1.0 - clip.low, 1.0 + clip.high);
    let pg = with_is_weights(-(&clipped * &p.advantages) * &p.log_prob, &p.is_weights);
    let loss = agg_loss(&pg, &p.mask, agg)?;
    let kind = p.mask.kind();
    let was_clipped = ratio.ne_tensor(&clipped).to_kind(kind);
    let kl = -neg_kl.detach();
    let m = host_means(&[(&was_clipped, &p.mask), (&kl, &p.mask)])?;
    let metrics = PolicyLossMetrics {
        pg_clipfrac: m[0],
        pg_clipfrac_lower: 0.0,
        ppo_kl: m[1],
    };
    Ok(PolicyLoss { loss, metrics })
}

/// The configured policy loss: validates the clip ranges and dispatches on
/// `cfg.loss_mode`. `scale` carries global denominators for micro-batching;
/// `seed` picks Clip-Cov's tokens (the other losses draw nothing), so give
/// each micro-batch of a run its own, reproducible one.
pub fn policy_loss(
    cfg: &PolicyLossConfig,
    x: &PolicyInputs,
    scale: AggScale,
    seed: u64,
) -> Result<PolicyLoss> {
    let clip = cfg.clip_range()?;
    let agg = LossAgg {
        mode: cfg.loss_agg_mode,
        scale,
    };
    match cfg.loss_mode {
        PolicyLossMode::Vanilla => ppo_clip_loss(x, &clip, agg),
        PolicyLossMode::Gspo => gspo_loss(x, &clip, scale),
        PolicyLossMode::Gpg => gpg_loss(x, agg),
        PolicyLossMode::Cispo => cispo_loss(x, &clip, agg),
        PolicyLossMode::KlCov => kl_cov_loss(x, cfg.kl_cov_ratio, cfg.ppo_kl_coef, agg),
        PolicyLossMode::ClipCov => {
            let cc = ClipCov {
                ratio: cfg.clip_cov_ratio,
                lb: cfg.clip_cov_lb,
                ub: cfg.clip_cov_ub,
            };
            clip_cov_loss(x, &clip, &cc, seed, agg)
        }
        PolicyLossMode::GeoMean => geo_mean_loss(x, &clip, scale),
        PolicyLossMode::Sapo => {
            let tau = SapoTemperatures {
                pos: cfg.tau_pos,
                neg: cfg.tau_neg,
            };
            sapo_loss(x, &tau, scale)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::masked::test_util::*;

    /// Loss value, d loss / d log_prob, metrics.
    pub(crate) fn run(
        f: impl Fn(&PolicyInputs) -> Result<PolicyLoss>,
        old: &Tensor,
        lp: &Tensor,
        adv: &Tensor,
        mask: &Tensor,
    ) -> (f64, Vec<Vec<f32>>, PolicyLossMetrics) {
        let v = var(lp);
        let out = f(&PolicyInputs {
            old_log_prob: old,
            log_prob: &v,
            advantages: adv,
            response_mask: mask,
            is_weights: None,
        })
        .unwrap();
        out.loss.backward();
        (scalar(&out.loss), rows(&v.grad()), out.metrics)
    }

    // Four tokens, old log-prob 0, ε_low 0.2, ε_high 0.28, c 3, token-mean over 4:
    //  t0: log r = ln 1.5, A = +1 → r clipped at 1.28: l = −1.28, no gradient, clipped.
    //  t1: log r = ln 0.5, A = +1 → l = max(−0.5, −0.8) = −0.5, grad −A·r = −0.5.
    //  t2: log r = ln 5,   A = −1 → l_clip = max(5, 1.28) = 5 > c·1 = 3 → l = 3, no grad, dual.
    //  t3: log r = ln 0.5, A = −1 → l_clip = max(0.5, 0.8) = 0.8 (clipped), no grad.
    // loss = (−1.28 − 0.5 + 3 + 0.8) / 4 = 0.505; d/d lp_1 = −0.5 / 4 = −0.125.
    // clipfrac: t0, t3 (and t2: 1.28 > 5? no) → 2/4; clipfrac_lower: t2 → 1/4;
    // ppo_kl = −mean(ln 1.5 + ln 0.5 + ln 5 + ln 0.5) = −ln(1.875)/4 = −0.157152.
    #[test]
    fn ppo_clip_hand_case() {
        let old = t2(&[&[0.0, 0.0, 0.0, 0.0]]);
        let lp = t2(&[&[1.5f32.ln(), 0.5f32.ln(), 5f32.ln(), 0.5f32.ln()]]);
        let adv = t2(&[&[1.0, 1.0, -1.0, -1.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0, 1.0]]);
        let clip = ClipRange::new(0.2, 0.28, 3.0).unwrap();
        let f = |x: &PolicyInputs| ppo_clip_loss(x, &clip, LossAggMode::TokenMean.into());
        let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
        assert!((loss - 0.505).abs() < 1e-6, "{loss}");
        assert!((g[0][1] + 0.125).abs() < 1e-6, "{g:?}");
        assert_eq!([g[0][0], g[0][2], g[0][3]], [0.0, 0.0, 0.0], "{g:?}");
        assert!((m.pg_clipfrac - 0.5).abs() < 1e-6, "{m:?}");
        assert!((m.pg_clipfrac_lower - 0.25).abs() < 1e-6, "{m:?}");
        assert!((m.ppo_kl + 0.157_152).abs() < 1e-5, "{m:?}");
    }

    #[test]
    fn on_policy_gradient_is_minus_advantage() {
        // r = 1 everywhere: l = −A·r, so d loss / d lp_t = −A_t / n (token-mean over n = 2).
        let old = t2(&[&[-1.0, -2.0, -3.0]]);
        let adv = t2(&[&[2.0, -0.5, 7.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0]]);
        let clip = ClipRange::new(0.2, 0.2, 3.0).unwrap();
        let f = |x: &PolicyInputs| ppo_clip_loss(x, &clip, LossAggMode::TokenMean.into());
        let (loss, g, m) = run(f, &old, &old.copy(), &adv, &mask);
        assert!((loss + 0.75).abs() < 1e-6, "{loss}"); // −(2 − 0.5)/2
        assert!(
            (g[0][0] + 1.0).abs() < 1e-6 && (g[0][1] - 0.25).abs() < 1e-6,
            "{g:?}"
        );
        assert_eq!(g[0][2], 0.0);
        assert_eq!(m, PolicyLossMetrics::default());
    }

    // GPG, token-mean over 3 tokens: l = −A·log π = −(2·(−1) + (−0.5)·(−2) + 1·(−0.5)) / 3
    // = −(−2 + 1 − 0.5) / 3 = 0.5; d loss / d lp_t = −A_t / 3, whatever the ratio.
    #[test]
    fn gpg_is_the_plain_policy_gradient() {
        let old = t2(&[&[0.0, 0.0, 0.0, 0.0]]);
        let lp = t2(&[&[-1.0, -2.0, -0.5, 9.0]]);
        let adv = t2(&[&[2.0, -0.5, 1.0, 4.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0, 0.0]]);
        let f = |x: &PolicyInputs| gpg_loss(x, LossAggMode::TokenMean.into());
        let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
        assert!((loss - 0.5).abs() < 1e-6, "{loss}");
        let want = [-2.0 / 3.0, 0.5 / 3.0, -1.0 / 3.0, 0.0];
        for (x, w) in g[0].iter().zip(want) {
            assert!((x - w).abs() < 1e-6, "{g:?}");
        }
        assert_eq!((m.pg_clipfrac, m.pg_clipfrac_lower), (0.0, 0.0));
        assert!((m.ppo_kl - 3.5 / 3.0).abs() < 1e-6, "{m:?}");
    }

    // CISPO, ε_low 0.2, ε_high 0.28, old log-prob 0, token-mean over 2:
    //  t0: r = 1.5 → 1.28, A = +1: l = −1.28·ln 1.5 = −0.518995, grad −1.28/2 = −0.64
    //  t1: r = 0.5 → 0.8,  A = −1: l = 0.8·ln 0.5 = −0.554518, grad +0.8/2 = 0.4
    // loss −0.536757; both clipped; ppo_kl = −(ln 1.5 + ln 0.5)/2 = 0.143841.
    #[test]
    fn cispo_keeps_a_gradient_on_clipped_tokens() {
        let old = t2(&[&[0.0, 0.0]]);
        let lp = t2(&[&[1.5f32.ln(), 0.5f32.ln()]]);
        let adv = t2(&[&[1.0, -1.0]]);
        let mask = t2(&[&[1.0, 1.0]]);
        let clip = ClipRange::new(0.2, 0.28, 3.0).unwrap();
        let f = |x: &PolicyInputs| cispo_loss(x, &clip, LossAggMode::TokenMean.into());
        let (loss, g, m) = run(f, &old, &lp, &adv, &mask);
        assert!((loss + 0.536_757).abs() < 1e-5, "{loss}");
        assert!(
            (g[0][0] + 0.64).abs() < 1e-6 && (g[0][1] - 0.4).abs() < 1e-6,
            "{g:?}"
        );
        assert!((m.pg_clipfrac - 1.0).abs() < 1e-6, "{m:?}");
        assert!((m.ppo_kl - 0.143_841).abs() < 1e-5, "{m:?}");
    }

    // GSPO, one sequence of 2 tokens + padding, A = 1, ε = 0.2:
    // log-ratios 0.1 and 0.3 → log s = 0.2, s = e^0.2 = 1.221403 > 1.2 → clipped: l = −1.2,
    // no gradient, clipfrac 1. With A = −1 the max picks −A·s = 1.221403 (unclipped), and
    // d loss / d lp_t = −A·s / (n·N) = 1.221403 / 2 = 0.610701 for both tokens.
    #[test]
    fn gspo_hand_case() {
        let old = t2(&[&[-1.0, -1.0, 0.0]]);
        let lp = t2(&[&[-0.9, -0.7, 5.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0]]);
        let clip = ClipRange::new(0.2, 0.2, 3.0).unwrap();
        let f = |x: &PolicyInputs| gspo_loss(x, &clip, AggScale::default());
        let (loss, g, m) = run(f, &old, &lp, &t2(&[&[1.0, 1.0, 1.0]]), &mask);
        assert!((loss + 1.2).abs() < 1e-6, "{loss}");
        assert_eq!(g[0], vec![0.0; 3]);
        assert!((m.pg_clipfrac - 1.0).abs() < 1e-6);
        assert!((m.ppo_kl + 0.2).abs() < 1e-6, "{m:?}");
        let (loss, g, m) = run(f, &old, &lp, &t2(&[&[-1.0, -1.0, -1.0]]), &mask);
        assert!((loss - 1.221_403).abs() < 1e-5, "{loss}");
        assert!((g[0][0] - 0.610_701).abs() < 1e-5 && (g[0][1] - 0.610_701).abs() < 1e-5);
        assert_eq!(g[0][2], 0.0);
        assert_eq!(m.pg_clipfrac, 0.0);
    }

    #[test]
    fn is_weights_scale_the_loss_and_are_not_differentiated() {
        let old = t2(&[&[0.0, 0.0]]);
        let adv = t2(&[&[1.0, 1.0]]);
        let mask = t2(&[&[1.0, 1.0]]);
        let w = var(&t2(&[&[0.5, 2.0]]));
        let lp = var(&old);
        let clip = ClipRange::new(0.2, 0.2, 3.0).unwrap();
        let out = ppo_clip_loss(
            &PolicyInputs {
                old_log_prob: &old,
                log_prob: &lp,
                advantages: &adv,
                response_mask: &mask,
                is_weights: Some(&w),
            },
            &clip,
            LossAggMode::TokenMean.into(),
        )
        .unwrap();
        // loss = −(0.5 + 2)/2 = −1.25; d/d lp = −w/2
        assert!((scalar(&out.loss) + 1.25).abs() < 1e-6);
        out.loss.backward();
        assert!(!w.grad().defined());
        let glp = rows(&lp.grad());
        assert!((glp[0][0] + 0.25).abs() < 1e-6 && (glp[0][1] + 1.0).abs() < 1e-6);
    }

    #[test]
    fn bf16_inputs_are_computed_in_f32() {
        // The hand case in bf16: the loss is an f32 computed from the
        // bf16 values, identical to the f32 loss on the same (rounded) values.
        let bf = |t: &Tensor| t.to_kind(tch::Kind::BFloat16);
        let old = bf(&t2(&[&[-1.0, -1.0, -2.0, -0.5]]));
        let lp = bf(&t2(&[&[-0.6, -1.7, -0.4, -1.2]]));
        let adv = bf(&t2(&[&[1.0, 1.0, -1.0, -1.0]]));
        let mask = bf(&t2(&[&[1.0, 1.0, 1.0, 0.0]]));
        let clip = ClipRange::new(0.2, 0.28, 3.0).unwrap();
        let f = |x: &PolicyInputs| ppo_clip_loss(x, &clip, LossAggMode::TokenMean.into());
        let f32_ = |t: &Tensor| t.to_kind(tch::Kind::Float);
        let (want, g_want, m_want) = run(f, &f32_(&old), &f32_(&lp), &f32_(&adv), &f32_(&mask));
        let v = var(&lp);
        let out = f(&PolicyInputs {
            old_log_prob: &old,
            log_prob: &v,
            advantages: &adv,
            response_mask: &mask,
            is_weights: None,
        })
        .unwrap();
        assert_eq!(out.loss.kind(), tch::Kind::Float);
        assert_eq!(scalar(&out.loss), want);
        assert_eq!(out.metrics, m_want);
        out.loss.backward();
        assert_eq!(v.grad().kind(), tch::Kind::BFloat16);
        for (a, b) in rows(&v.grad())[0].iter().zip(&g_want[0]) {
            assert!((a - b).abs() <= b.abs() / 128.0, "{a} vs {b}"); // bf16 rounding of the gradient
        }
    }

    #[test]
    fn config_validation_and_names() {
        let cfg: PolicyLossConfig = serde_json::from_str(
            r#"{"loss_mode": "gspo", "clip_ratio_high": 0.28, "loss_agg_mode": "seq-mean-token-mean"}"#,
        )
        .unwrap();
        assert_eq!(cfg.loss_mode, PolicyLossMode::Gspo);
        let c = cfg.clip_range().unwrap();
        assert_eq!((c.low, c.high, c.dual_clip_c), (0.2, 0.28, 3.0));
        let bad = PolicyLossConfig {
            clip_ratio_c: 1.0,
            ..Default::default()
        };
        let err = bad.clip_range().unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidConfig {
                    field: "clip_ratio_c",
                    ..
                }
            ),
            "{err}"
        );
        assert!(serde_json::from_str::<PolicyLossConfig>(r#"{"loss_mode": "ppo"}"#).is_err());
    }
}
