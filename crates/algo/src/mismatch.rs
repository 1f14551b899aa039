//! Rollout/train mismatch: how far the rollout engine's log-probabilities are
//! from the trainer's for the same tokens, and the truncated importance-
//! sampling (TIS) weights that correct the policy gradient for it.
//!
//! The rollout engine and the trainer compute π(y) with different kernels,
//! batch shapes and often precisions, so even with identical weights the
//! samples come from π_rollout, not from the π_old the PPO ratio assumes. Yao et
//! al. 2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
//! Training", <https://fengyao.notion.site/off-policy-rl>) correct this with
//! the per-token weight min(π_old/π_rollout, C), detached and multiplied into
//! the policy loss; verl implements it as `rollout_correction` (`rollout_is`,
//! `rollout_is_threshold`) and reports the mismatch metrics computed here.

use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::masked::{check_all, masked_sum_rows, rows};

/// Bound on log-ratios before exponentiating (verl's `SAFETY_BOUND`).
pub const IS_LOG_RATIO_CLAMP: f64 = 20.0;

/// How far rollout log-probs are from training log-probs, over the response
/// mask. All averages are over unmasked tokens unless they say "per sequence",
/// in which case they are over sequences with at least one unmasked token.
/// Serialises with verl-like field names for `metrics.jsonl`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MismatchMetrics {
    /// Number of unmasked tokens compared.
    pub n_tokens: usize,
    /// mean |train_lp − rollout_lp|.
    pub mean_abs_diff: f64,
    /// max |train_lp − rollout_lp|.
    pub max_abs_diff: f64,
    /// k1 estimate of KL(π_rollout‖π_train): mean(rollout_lp − train_lp) (verl `kl`).
    pub kl_k1: f64,
    /// k3 estimate of KL(π_rollout‖π_train): mean(ρ − 1 − log ρ), ρ = π_train/π_rollout (verl `k3_kl`).
    pub kl_k3: f64,
    /// Per-sequence exp(−mean train_lp), averaged (verl `training_ppl`).
    pub training_ppl: f64,
    /// Per-sequence exp(−mean rollout_lp), averaged (verl `rollout_ppl`).
    pub rollout_ppl: f64,
    /// Per-sequence training_ppl/rollout_ppl, averaged (verl `ppl_ratio`).
    pub ppl_ratio: f64,
    /// mean(ρ²) − 1, the token-level χ² divergence (verl `chi2_token`; ρ clamped to e^±20).
    pub chi2_token: f64,
}

/// Compares `train_log_prob` with `rollout_log_prob` over `response_mask`, all
/// (batch, response_len). Computed on the host in f64; nothing is differentiated.
///
/// Needs at least one unmasked token (verl asserts the same). Departure from
/// verl: sequences with no unmasked token are left out of the per-sequence
/// averages (verl counts them with perplexity 1).
pub fn mismatch_metrics(
    train_log_prob: &Tensor,
    rollout_log_prob: &Tensor,
    response_mask: &Tensor,
) -> Result<MismatchMetrics> {
    check_all(
        ("train_log_prob", train_log_prob),
        &[
            ("rollout_log_prob", rollout_log_prob),
            ("response_mask", response_mask),
        ],
    )?;
    let (train, roll, mask) = (
        rows(train_log_prob)?,
        rows(rollout_log_prob)?,
        rows(response_mask)?,
    );
    let mut m = MismatchMetrics::default();
    let (mut sum_abs, mut sum_k1, mut sum_k3, mut sum_rho2) = (0.0, 0.0, 0.0, 0.0);
    let (mut n_seq, mut sum_tppl, mut sum_rppl, mut sum_ratio) = (0usize, 0.0, 0.0, 0.0);
    for ((t_row, r_row), m_row) in train.iter().zip(&roll).zip(&mask) {
        let (mut n, mut t_sum, mut r_sum) = (0usize, 0.0f64, 0.0f64);
        for ((&t, &r), &w) in t_row.iter().zip(r_row).zip(m_row) {
            if w == 0.0 {
                continue;
            }
            let (t, r) = (f64::from(t), f64::from(r));
            let log_rho = t - r;
            sum_abs += log_rho.abs();
            m.max_abs_diff = m.max_abs_diff.max(log_rho.abs());
            sum_k1 += -log_rho;
            sum_k3 += log_rho.exp() - 1.0 - log_rho;
            let safe = log_rho.clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP);
            sum_rho2 += (2.0 * safe).exp();
            n += 1;
            t_sum += t;
            r_sum += r;
        }
        if n > 0 {
            let (t_mean, r_mean) = (t_sum / n as f64, r_sum / n as f64);
            sum_tppl += (-t_mean).exp();
            sum_rppl += (-r_mean).exp();
            sum_ratio += (r_mean - t_mean).exp();
            n_seq += 1;
            m.n_tokens += n;
        }
    }
    if m.n_tokens == 0 {
        return Err(Error::InvalidInput {
            arg: "response_mask",
            reason: "mismatch metrics need at least one unmasked token".into(),
        });
    }
    let (nt, ns) = (m.n_tokens as f64, n_seq as f64);
    m.mean_abs_diff = sum_abs / nt;
    m.kl_k1 = sum_k1 / nt;
    m.kl_k3 = sum_k3 / nt;
    m.chi2_token = sum_rho2 / nt - 1.0;
    m.training_ppl = sum_tppl / ns;
    m.rollout_ppl = sum_rppl / ns;
    m.ppl_ratio = sum_ratio / ns;
    Ok(m)
}

/// At which granularity the importance ratio is taken. Config names are verl's
/// `rollout_is` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    /// Per token: w_t = min(π_old(y_t)/π_rollout(y_t), C). Biased, low variance.
    #[default]
    Token,
    /// Per sequence: w = min(Π_t π_old/π_rollout, C), the same for every token of
    /// the sequence. Unbiased before truncation, high variance.
    Sequence,
}

/// verl's `algorithm.rollout_correction` subset: `rollout_is = "token"` enables
/// TIS; absent (or `None`) disables it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RolloutCorrectionConfig {
    /// Granularity, or `None` for no correction.
    pub rollout_is: Option<IsLevel>,
    /// The cap C (verl's default 2.0).
    pub rollout_is_threshold: f64,
}

impl Default for RolloutCorrectionConfig {
    fn default() -> Self {
        RolloutCorrectionConfig {
            rollout_is: None,
            rollout_is_threshold: 2.0,
        }
    }
}

/// Statistics of the weights *before* truncation, over unmasked tokens (token
/// level) or non-empty sequences (sequence level).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct IsMetrics {
    /// Mean weight (verl `rollout_is_mean`).
    pub mean: f64,
    /// Largest weight.
    pub max: f64,
    /// Smallest weight.
    pub min: f64,
    /// Fraction of weights above the cap, i.e. truncated.
    pub frac_truncated: f64,
}

/// Truncated importance-sampling weights and their statistics.
#[derive(Clone, Debug)]
pub struct IsWeights {
    /// (batch, response_len), detached, 0 on padding; pass as
    /// [`crate::policy_loss::PolicyInputs::is_weights`].
    pub weights: Tensor,
    /// Statistics before truncation.
    pub metrics: IsMetrics,
}

/// TIS weights min(exp(old_log_prob − rollout_log_prob), cap), at token or
/// sequence level (see [`IsLevel`]); verl `compute_rollout_correction_weights`
/// without batch normalisation.
///
/// `old_log_prob` is the trainer's log-prob of the sampled tokens under the
/// weights the rollout used (π_old); shapes: all (batch, response_len).
/// Log-ratios are clamped to ±20 before the exponential. The result is
/// detached and zero on padding.
pub fn truncated_is_weights(
    old_log_prob: &Tensor,
    rollout_log_prob: &Tensor,
    response_mask: &Tensor,
    level: IsLevel,
    cap: f64,
) -> Result<IsWeights> {
    check_all(
        ("old_log_prob", old_log_prob),
        &[
            ("rollout_log_prob", rollout_log_prob),
            ("response_mask", response_mask),
        ],
    )?;
    if !(cap.is_finite() && cap > 0.0) {
        return Err(Error::InvalidConfig {
            field: "rollout_is_threshold",
            value: cap.to_string(),
            reason: "must be a positive finite number",
        });
    }
    let keep = response_mask.ne(0.0)?;
    let zeros = old_log_prob.zeros_like()?;
    let log_ratio = keep.where_cond(
        &old_log_prob.detach().sub(&rollout_log_prob.detach())?,
        &zeros,
    )?;
    let (raw, stats_mask) = match level {
        IsLevel::Token => (log_ratio, response_mask.clone()),
        IsLevel::Sequence => {
            let per_seq = masked_sum_rows(&log_ratio, response_mask)?.unsqueeze(1)?; // (b, 1)
            let has_tokens = response_mask
                .sum_keepdim(D::Minus1)?
                .gt(0.0)?
                .to_dtype(response_mask.dtype())?; // (b, 1)
            (per_seq, has_tokens)
        }
    };
    let untruncated = raw.clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)?.exp()?;
    let metrics = is_metrics(&untruncated, &stats_mask, cap)?;
    let weights = untruncated
        .minimum(cap)?
        .broadcast_mul(response_mask)?
        .detach();
    Ok(IsWeights { weights, metrics })
}

fn is_metrics(w: &Tensor, mask: &Tensor, cap: f64) -> Result<IsMetrics> {
    let (w, mask) = (rows(w)?, rows(mask)?);
    let (mut n, mut sum, mut above) = (0usize, 0.0f64, 0usize);
    let (mut max, mut min) = (f64::NEG_INFINITY, f64::INFINITY);
    for (w_row, m_row) in w.iter().zip(&mask) {
        for (&x, &keep) in w_row.iter().zip(m_row) {
            if keep == 0.0 {
                continue;
            }
            let x = f64::from(x);
            n += 1;
            sum += x;
            max = max.max(x);
            min = min.min(x);
            above += usize::from(x > cap);
        }
    }
    if n == 0 {
        return Ok(IsMetrics::default());
    }
    Ok(IsMetrics {
        mean: sum / n as f64,
        max,
        min,
        frac_truncated: above as f64 / n as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t2(data: &[&[f32]]) -> Tensor {
        let rows: Vec<Vec<f32>> = data.iter().map(|r| r.to_vec()).collect();
        Tensor::new(rows, &Device::Cpu).unwrap()
    }

    // train − rollout (log ρ) on unmasked tokens: row 0: [0.1, −0.2], row 1: [ln 3].
    #[test]
    fn metrics_match_hand_values() {
        let train = t2(&[&[-1.0, -2.0, 7.0], &[-0.5, 0.0, 0.0]]);
        let roll = t2(&[&[-1.1, -1.8, f32::NAN], &[-0.5 - 3f32.ln(), 0.0, 0.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 0.0, 0.0]]);
        let m = mismatch_metrics(&train, &roll, &mask).unwrap();
        let ln3 = 3f64.ln();
        assert_eq!(m.n_tokens, 3);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-5;
        assert!(close(m.mean_abs_diff, (0.1 + 0.2 + ln3) / 3.0), "{m:?}");
        assert!(close(m.max_abs_diff, ln3), "{m:?}");
        assert!(close(m.kl_k1, -(0.1 - 0.2 + ln3) / 3.0), "{m:?}");
        // k3 = ρ − 1 − log ρ: e^0.1 − 1.1 = 0.005171, e^−0.2 − 0.8 = 0.018731, 3 − 1 − ln 3 = 0.901388
        assert!(
            close(m.kl_k3, (0.005_171 + 0.018_731 + 0.901_388) / 3.0),
            "{m:?}"
        );
        // χ²: (e^0.2 + e^−0.4 + 9) / 3 − 1 = (1.221403 + 0.670320 + 9)/3 − 1 = 2.630574
        assert!(close(m.chi2_token, 2.630_574), "{m:?}");
        // per-sequence mean lps: train [−1.5, −0.5], rollout [−1.45, −0.5 − ln 3]
        // training_ppl = (e^1.5 + e^0.5)/2 = 3.065205; rollout_ppl = (e^1.45 + 3e^0.5)/2 = 4.604639
        // ppl_ratio = (e^{−1.45+1.5} + e^{−ln 3})/2 = (1.051271 + 0.333333)/2 = 0.692302
        assert!(close(m.training_ppl, 3.065_205), "{m:?}");
        assert!(close(m.rollout_ppl, 4.604_639), "{m:?}");
        assert!(close(m.ppl_ratio, 0.692_302), "{m:?}");
    }

    #[test]
    fn metrics_need_a_token() {
        let t = t2(&[&[0.0]]);
        let z = t2(&[&[0.0]]);
        assert!(matches!(
            mismatch_metrics(&t, &t, &z).unwrap_err(),
            Error::InvalidInput {
                arg: "response_mask",
                ..
            }
        ));
    }

    #[test]
    fn token_and_sequence_weights() {
        // log ρ = [ln 0.5, ln 3, (pad)], [ln 1.5, ln 1.2, ln 1.0]; cap 2.
        let old = t2(&[
            &[0.5f32.ln(), 3f32.ln(), 9.0],
            &[1.5f32.ln(), 1.2f32.ln(), 0.0],
        ]);
        let roll = t2(&[&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0]]);
        let w = truncated_is_weights(&old, &roll, &mask, IsLevel::Token, 2.0).unwrap();
        let got = rows(&w.weights).unwrap();
        let want = [[0.5, 2.0, 0.0], [1.5, 1.2, 1.0]];
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
        // before truncation: mean (0.5 + 3 + 1.5 + 1.2 + 1)/5 = 1.44, max 3, min 0.5, 1/5 above
        let m = w.metrics;
        assert!(
            (m.mean - 1.44).abs() < 1e-5 && (m.max - 3.0).abs() < 1e-5,
            "{m:?}"
        );
        assert!((m.min - 0.5).abs() < 1e-6 && (m.frac_truncated - 0.2).abs() < 1e-9);
        // sequence level: Π ρ = 1.5 for row 0, 1.8 for row 1 (both under the cap).
        let w = truncated_is_weights(&old, &roll, &mask, IsLevel::Sequence, 1.6).unwrap();
        let got = rows(&w.weights).unwrap();
        let want = [[1.5, 1.5, 0.0], [1.6, 1.6, 1.6]];
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
        assert!(
            (w.metrics.mean - 1.65).abs() < 1e-5 && (w.metrics.frac_truncated - 0.5).abs() < 1e-9
        );
    }

    #[test]
    fn bad_cap_and_config_names() {
        let t = t2(&[&[0.0]]);
        let err = truncated_is_weights(&t, &t, &t, IsLevel::Token, 0.0).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidConfig {
                field: "rollout_is_threshold",
                ..
            }
        ));
        let c: RolloutCorrectionConfig =
            serde_json::from_str(r#"{"rollout_is": "sequence"}"#).unwrap();
        assert_eq!(c.rollout_is, Some(IsLevel::Sequence));
        assert_eq!(c.rollout_is_threshold, 2.0);
    }
}
