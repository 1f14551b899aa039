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

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::masked::{check_all, masked_sum_rows, upcast, zero_padding};

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
/// (batch, response_len). Computed on the tensors' device in f64 (k3 of
/// log-ratios near 1e-4 is ~1e-9, below f32's resolution of r − 1), with one
/// transfer of the ten sums to the host; nothing is differentiated.
///
/// Token averages are sums over the unmasked tokens only (`masked_select`), so
/// padding cannot change them by a bit. Needs at least one unmasked token
/// (verl asserts the same). Departure from verl: sequences with no unmasked
/// token are left out of the per-sequence averages (verl counts them with
/// perplexity 1).
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
    let no_token = || Error::InvalidInput {
        arg: "response_mask",
        reason: "mismatch metrics need at least one unmasked token".into(),
    };
    if response_mask.numel() == 0 {
        return Err(no_token());
    }
    let f64_ = Kind::Double;
    let keep = response_mask.ne(0.0);
    let train = zero_padding(&train_log_prob.detach().to_kind(f64_), response_mask);
    let roll = zero_padding(&rollout_log_prob.detach().to_kind(f64_), response_mask);
    let log_rho = &train - &roll; // (batch, len), 0 on padding
    let lr = log_rho.masked_select(&keep); // (n_tokens,)
    let safe = lr.clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP);
    // Per sequence: token counts and mean log-probs.
    let n_row = keep.sum_dim_intlist(-1, false, f64_); // (batch,)
    let non_empty = n_row.gt(0.0);
    let n_safe = n_row.clamp_min(1.0);
    let t_mean = train.sum_dim_intlist(-1, false, f64_) / &n_safe;
    let r_mean = roll.sum_dim_intlist(-1, false, f64_) / &n_safe;
    let seq_sum = |x: Tensor| x.masked_select(&non_empty).sum(f64_);
    let sums = Tensor::stack(
        &[
            keep.sum(f64_),
            lr.abs().sum(f64_),
            log_rho.abs().max(),
            (-&lr).sum(f64_),
            (lr.exp() - 1.0 - &lr).sum(f64_),
            (safe * 2.0).exp().sum(f64_),
            non_empty.sum(f64_),
            seq_sum((-&t_mean).exp()),
            seq_sum((-&r_mean).exp()),
            seq_sum((r_mean - t_mean).exp()),
        ],
        0,
    );
    let [n_tok, abs, max_abs, k1, k3, rho2, n_seq, tppl, rppl, ratio] =
        <[f64; 10]>::try_from(Vec::<f64>::try_from(sums)?).expect("ten sums");
    if n_tok == 0.0 {
        return Err(no_token());
    }
    Ok(MismatchMetrics {
        n_tokens: n_tok as usize,
        mean_abs_diff: abs / n_tok,
        max_abs_diff: max_abs,
        kl_k1: k1 / n_tok,
        kl_k3: k3 / n_tok,
        training_ppl: tppl / n_seq,
        rollout_ppl: rppl / n_seq,
        ppl_ratio: ratio / n_seq,
        chi2_token: rho2 / n_tok - 1.0,
    })
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

/// verl's `algorithm.rollout_correction` subset, as written in the config
/// file: `rollout_is = "token"` enables TIS; absent (or `None`) disables it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, colo_keys::Keys)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "algorithm.rollout_correction")]
pub struct RolloutCorrectionConfig {
    /// truncated importance sampling between rollout and trainer probabilities
    #[key(unit = "\"token\" or \"sequence\"", unset = "off")]
    pub rollout_is: Option<IsLevel>,
    /// the importance-weight cap C
    #[key(range = "> 0")]
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
#[derive(Debug)]
pub struct IsWeights {
    /// (batch, response_len), detached, 0 on padding, of the inputs' kind; pass as
    /// [`crate::policy_loss::PolicyInputs::is_weights`].
    pub weights: Tensor,
    /// Statistics before truncation.
    pub metrics: IsMetrics,
}

/// A clone shares the weights' storage with the original (`shallow_clone`).
impl Clone for IsWeights {
    fn clone(&self) -> Self {
        IsWeights {
            weights: self.weights.shallow_clone(),
            metrics: self.metrics,
        }
    }
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
    let mask = upcast(response_mask);
    let log_ratio = zero_padding(
        &(upcast(&old_log_prob.detach()) - upcast(&rollout_log_prob.detach())),
        &mask,
    );
    let (raw, stats_mask) = match level {
        IsLevel::Token => (log_ratio, mask.shallow_clone()),
        IsLevel::Sequence => {
            let per_seq = masked_sum_rows(&log_ratio, &mask)?.unsqueeze(1); // (b, 1)
            let kind = mask.kind();
            let has_tokens = mask.sum_dim_intlist(-1, true, kind).gt(0.0).to_kind(kind); // (b, 1)
            (per_seq, has_tokens)
        }
    };
    let untruncated = raw.clamp(-IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP).exp();
    let metrics = is_metrics(&untruncated, &stats_mask, cap)?;
    let weights = (untruncated.clamp_max(cap) * mask).to_kind(old_log_prob.kind());
    Ok(IsWeights { weights, metrics })
}

/// Mean, max, min and truncated fraction of `w` over `mask`, in f64, read back
/// in one transfer; the sums run over the selected elements only.
fn is_metrics(w: &Tensor, mask: &Tensor, cap: f64) -> Result<IsMetrics> {
    if w.numel() == 0 {
        return Ok(IsMetrics::default());
    }
    let f64_ = Kind::Double;
    let keep = mask.ne(0.0);
    let w = w.to_kind(f64_);
    let sel = w.masked_select(&keep);
    let stats = Tensor::stack(
        &[
            keep.sum(f64_),
            sel.sum(f64_),
            w.where_scalarother(&keep, f64::NEG_INFINITY).max(),
            w.where_scalarother(&keep, f64::INFINITY).min(),
            sel.gt(cap).sum(f64_),
        ],
        0,
    );
    let [n, sum, max, min, above] =
        <[f64; 5]>::try_from(Vec::<f64>::try_from(stats)?).expect("five statistics");
    if n == 0.0 {
        return Ok(IsMetrics::default());
    }
    Ok(IsMetrics {
        mean: sum / n,
        max,
        min,
        frac_truncated: above / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::test_util::*;

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
        let got = rows(&w.weights);
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
        let got = rows(&w.weights);
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
