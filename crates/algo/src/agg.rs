//! Loss aggregation: how a (batch, response_len) matrix of per-token losses
//! becomes the scalar that is differentiated.
//!
//! The choice matters more than it looks. Token-mean weights every token
//! equally, so long responses dominate; seq-mean-token-mean (the original GRPO
//! objective) weights every sequence equally, so each token of a long response
//! counts less, which Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
//! Training", arXiv:2503.20783) identifies as a length bias and removes with a
//! constant normaliser (seq-mean-token-sum-norm). DAPO (Yu et al. 2025,
//! arXiv:2503.14476) argues for token-mean. The definitions are verl's
//! `agg_loss`, including which denominators can be replaced by global counts.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::error::{Error, Result};
use crate::masked::{check_like, dims2, masked_sum, masked_sum_rows, upcast, MASK_EPS};

/// How per-token losses are reduced to a scalar. Config names are verl's
/// (`loss_agg_mode = "seq-mean-token-mean"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossAggMode {
    /// Σ loss·mask / Σ mask: every unmasked token in the batch weighs the same.
    #[default]
    #[serde(rename = "token-mean")]
    TokenMean,
    /// Mean over non-empty sequences of the per-sequence token *sum*.
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// Mean over non-empty sequences of the per-sequence token *mean* (original GRPO).
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
    /// Σ over all sequences of the per-sequence token sum, divided by a constant
    /// (by default response_len, the padded length), as Dr. GRPO.
    #[serde(rename = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm,
}

/// Denominators that replace the micro-batch's own counts.
///
/// With gradient accumulation over micro-batches the loss of a mini-batch is
/// the *sum* of the micro-batch losses only if each micro-batch divides by the
/// mini-batch's count: set `batch_num_tokens` (token-mean) or
/// `global_batch_size` (seq-mean-*) to the mini-batch's number of unmasked
/// tokens or non-empty sequences. `None` uses this call's own counts (verl's
/// defaults). `loss_scale_factor` is seq-mean-token-sum-norm's constant; set it
/// to a fixed number (e.g. the configured maximum response length) so the
/// normaliser does not change with padding.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AggScale {
    /// token-mean's denominator.
    pub batch_num_tokens: Option<f64>,
    /// seq-mean-token-sum's and seq-mean-token-mean's denominator.
    pub global_batch_size: Option<f64>,
    /// seq-mean-token-sum-norm's denominator.
    pub loss_scale_factor: Option<f64>,
}

/// A mode with its denominators; `LossAggMode::TokenMean.into()` for local counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossAgg {
    /// The reduction.
    pub mode: LossAggMode,
    /// Global denominators, if any.
    pub scale: AggScale,
}

impl From<LossAggMode> for LossAgg {
    fn from(mode: LossAggMode) -> Self {
        LossAgg {
            mode,
            scale: AggScale::default(),
        }
    }
}

fn positive(field: &'static str, v: Option<f64>) -> Result<Option<f64>> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(Error::InvalidConfig {
            field,
            value: x.to_string(),
            reason: "must be a positive finite number",
        }),
        _ => Ok(v),
    }
}

/// Aggregates `loss_mat` (batch, response_len) under `response_mask` (same
/// shape and kind, 1.0 for response tokens, 0.0 for padding) into a scalar
/// tensor, differentiably in `loss_mat`. (verl `agg_loss`.)
///
/// With B the batch, L = response_len, n_i = Σ_t mask_it, S_i = Σ_t loss_it·mask_it,
/// and N_seq the number of rows with n_i > 0:
///
/// | mode | value |
/// |---|---|
/// | token-mean | Σ_i S_i / (`batch_num_tokens` or Σ_i n_i) |
/// | seq-mean-token-sum | Σ_{i: n_i>0} S_i / (`global_batch_size` or N_seq) |
/// | seq-mean-token-mean | Σ_{i: n_i>0} (S_i / n_i) / (`global_batch_size` or N_seq) |
/// | seq-mean-token-sum-norm | Σ_i S_i / (`loss_scale_factor` or L) |
///
/// The sums are accumulated, and the scalar returned, in
/// [`acc_kind`](crate::masked::acc_kind) (f32 for bf16 inputs). Counts stay on
/// the device: nothing is read back to the host.
///
/// Departure from verl: where verl would divide 0 by 0 (an all-padding batch
/// under token-mean or the seq-mean modes) the result here is 0, with zero
/// gradient, instead of NaN.
pub fn agg_loss(loss_mat: &Tensor, response_mask: &Tensor, agg: LossAgg) -> Result<Tensor> {
    let (_, len) = dims2("loss_mat", loss_mat)?;
    check_like("loss_mat", loss_mat, "response_mask", response_mask)?;
    let (loss_mat, mask) = (upcast(loss_mat), upcast(response_mask));
    let kind = mask.kind();
    let scale = agg.scale;
    // `total` divided by the configured denominator, or else by `count` (a
    // tensor). A zero count only occurs with a zero total; dividing by 1 gives 0.
    let divide = |total: Tensor, configured: Option<f64>, count: Tensor| match configured {
        Some(n) => total / n,
        None => total / count.where_scalarother(&count.gt(0.0), 1.0),
    };
    match agg.mode {
        LossAggMode::TokenMean => {
            let n = positive("batch_num_tokens", scale.batch_num_tokens)?;
            Ok(divide(masked_sum(&loss_mat, &mask)?, n, mask.sum(kind)))
        }
        LossAggMode::SeqMeanTokenSum | LossAggMode::SeqMeanTokenMean => {
            let n = positive("global_batch_size", scale.global_batch_size)?;
            let counts = mask.sum_dim_intlist(-1, false, kind); // (batch,)
            let seq_mask = counts.gt(0.0).to_kind(kind); // (batch,)
            let seq_sums = masked_sum_rows(&loss_mat, &mask)?; // (batch,)
            let seq_losses = match agg.mode {
                LossAggMode::SeqMeanTokenMean => seq_sums / (counts + MASK_EPS),
                _ => seq_sums,
            };
            let total = masked_sum(&seq_losses, &seq_mask)?;
            Ok(divide(total, n, seq_mask.sum(kind)))
        }
        LossAggMode::SeqMeanTokenSumNorm => {
            let norm = positive("loss_scale_factor", scale.loss_scale_factor)?
                .unwrap_or(if len > 0 { len as f64 } else { 1.0 });
            Ok(masked_sum(&loss_mat, &mask)? / norm)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::test_util::*;

    // loss = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    // mask = [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    // S = [6, 5, 0], n = [3, 1, 0], N_seq = 2, L = 4.
    fn case() -> (Tensor, Tensor) {
        (
            t2(&[&[1., 2., 3., 4.], &[5., 6., 7., 8.], &[9., 9., 9., 9.]]),
            t2(&[&[1., 1., 1., 0.], &[1., 0., 0., 0.], &[0., 0., 0., 0.]]),
        )
    }

    fn agg(mode: LossAggMode, scale: AggScale) -> f64 {
        let (l, m) = case();
        scalar(&agg_loss(&l, &m, LossAgg { mode, scale }).unwrap())
    }

    #[test]
    fn modes_match_hand_values() {
        let d = AggScale::default();
        // token-mean: (6 + 5) / 4 = 2.75
        assert!((agg(LossAggMode::TokenMean, d) - 2.75).abs() < 1e-6);
        // seq-mean-token-sum: (6 + 5) / 2 = 5.5 (the empty third row is not counted)
        assert!((agg(LossAggMode::SeqMeanTokenSum, d) - 5.5).abs() < 1e-6);
        // seq-mean-token-mean: (6/3 + 5/1) / 2 = 3.5
        assert!((agg(LossAggMode::SeqMeanTokenMean, d) - 3.5).abs() < 1e-6);
        // seq-mean-token-sum-norm: (6 + 5) / L = 11 / 4 = 2.75
        assert!((agg(LossAggMode::SeqMeanTokenSumNorm, d) - 2.75).abs() < 1e-6);
    }

    #[test]
    fn global_denominators_replace_local_counts() {
        let s = AggScale {
            batch_num_tokens: Some(11.0),
            global_batch_size: Some(4.0),
            loss_scale_factor: Some(2.0),
        };
        assert!((agg(LossAggMode::TokenMean, s) - 1.0).abs() < 1e-6); // 11 / 11
        assert!((agg(LossAggMode::SeqMeanTokenSum, s) - 2.75).abs() < 1e-6); // 11 / 4
        assert!((agg(LossAggMode::SeqMeanTokenMean, s) - 1.75).abs() < 1e-6); // 7 / 4
        assert!((agg(LossAggMode::SeqMeanTokenSumNorm, s) - 5.5).abs() < 1e-6); // 11 / 2
    }

    #[test]
    fn bad_denominator_is_a_config_error() {
        let (l, m) = case();
        let s = AggScale {
            batch_num_tokens: Some(0.0),
            ..Default::default()
        };
        let err = agg_loss(
            &l,
            &m,
            LossAgg {
                mode: LossAggMode::TokenMean,
                scale: s,
            },
        )
        .unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidConfig {
                field: "batch_num_tokens",
                ..
            }
        ));
    }

    #[test]
    fn all_padding_gives_zero_not_nan() {
        let l = t2(&[&[1., 2.]]);
        let m = t2(&[&[0., 0.]]);
        for mode in [
            LossAggMode::TokenMean,
            LossAggMode::SeqMeanTokenSum,
            LossAggMode::SeqMeanTokenMean,
            LossAggMode::SeqMeanTokenSumNorm,
        ] {
            assert_eq!(scalar(&agg_loss(&l, &m, mode.into()).unwrap()), 0.0);
        }
    }

    #[test]
    fn gradient_of_seq_mean_token_mean() {
        // d/dloss_it = mask_it / (n_i · N_seq): row 0 → 1/(3·2) = 1/6, row 1 → 1/(1·2) = 1/2.
        let (l, m) = case();
        let v = var(&l);
        let loss = agg_loss(&v, &m, LossAggMode::SeqMeanTokenMean.into()).unwrap();
        loss.backward();
        let g = rows(&v.grad());
        assert!((g[0][0] - 1.0 / 6.0).abs() < 1e-6, "{g:?}");
        assert!((g[1][0] - 0.5).abs() < 1e-6, "{g:?}");
        assert_eq!(g[0][3], 0.0);
        assert_eq!(g[2], vec![0.0; 4]);
    }

    #[test]
    fn config_names_are_verls() {
        let m: LossAggMode = serde_json::from_str("\"seq-mean-token-sum-norm\"").unwrap();
        assert_eq!(m, LossAggMode::SeqMeanTokenSumNorm);
        assert!(serde_json::from_str::<LossAggMode>("\"token_mean\"").is_err());
    }
}
