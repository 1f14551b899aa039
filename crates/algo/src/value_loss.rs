//! The critic's clipped value loss.

use serde::Serialize;
use tch::Tensor;

use crate::agg::{agg_loss, LossAgg};
use crate::error::{Error, Result};
use crate::masked::{check_all, host_means, upcast, zero_padding};

/// Diagnostics of one value-loss evaluation (verl's `critic/vf_clipfrac`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ValueLossMetrics {
    /// Fraction of response tokens where the clipped prediction gave the larger loss.
    pub vf_clipfrac: f64,
}

/// A scalar loss to differentiate, and its metrics.
#[derive(Debug)]
pub struct ValueLoss {
    /// Scalar tensor (f32 for bf16 inputs); gradients flow to `vpreds` only.
    pub loss: Tensor,
    /// Detached diagnostics.
    pub metrics: ValueLossMetrics,
}

/// A clone shares the loss tensor (and its graph) with the original (`shallow_clone`).
impl Clone for ValueLoss {
    fn clone(&self) -> Self {
        ValueLoss {
            loss: self.loss.shallow_clone(),
            metrics: self.metrics,
        }
    }
}

/// PPO's clipped value loss (verl `compute_value_loss`, from TRL; the clipping
/// is OpenAI baselines' `ppo2`, discussed in Engstrom et al. 2020,
/// "Implementation Matters in Deep Policy Gradients", arXiv:2005.12729):
///
/// ```text
/// v_clip = clip(vpreds, values − ε_v, values + ε_v)
/// l      = max((vpreds − returns)², (v_clip − returns)²)
/// loss   = ½ · agg(l)
/// ```
///
/// Shapes: `vpreds` (the critic's current predictions, differentiated),
/// `returns` (targets, e.g. [`crate::advantage::gae`]'s returns), `values` (the
/// critic's predictions when the batch was collected) and `response_mask`, all
/// (batch, response_len). `cliprange_value` is ε_v (verl `cliprange_value`), ≥ 0.
/// Padding positions are zeroed before the arithmetic (NaN there is harmless).
/// bf16 inputs are computed in f32 and give an f32 loss.
pub fn value_loss(
    vpreds: &Tensor,
    returns: &Tensor,
    values: &Tensor,
    response_mask: &Tensor,
    cliprange_value: f64,
    agg: LossAgg,
) -> Result<ValueLoss> {
    check_all(
        ("vpreds", vpreds),
        &[
            ("returns", returns),
            ("values", values),
            ("response_mask", response_mask),
        ],
    )?;
    if !(cliprange_value.is_finite() && cliprange_value >= 0.0) {
        return Err(Error::InvalidConfig {
            field: "cliprange_value",
            value: cliprange_value.to_string(),
            reason: "must be ≥ 0",
        });
    }
    let clean = |t: &Tensor| zero_padding(&upcast(t), response_mask);
    let vpreds = clean(vpreds);
    let returns = clean(&returns.detach());
    let values = clean(&values.detach());
    let mask = upcast(&response_mask.detach());

    let clipped = vpreds
        .maximum(&(&values - cliprange_value))
        .minimum(&(&values + cliprange_value));
    let l1 = (&vpreds - &returns).square();
    let l2 = (clipped - &returns).square();
    let loss = agg_loss(&l1.maximum(&l2), &mask, agg)? * 0.5;
    let clipfrac = l2.detach().gt_tensor(&l1.detach()).to_kind(mask.kind());
    let metrics = ValueLossMetrics {
        vf_clipfrac: host_means(&[(&clipfrac, &mask)])?[0],
    };
    Ok(ValueLoss { loss, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agg::LossAggMode;
    use crate::masked::test_util::*;

    // ε_v = 0.5, returns 1:
    //  t0: vpred 2.0, old 0 → clip 0.5: l1 = 1, l2 = 0.25 → l1; d l/dv = 2(2 − 1) = 2.
    //  t1: vpred −1,  old 0 → clip −0.5: l1 = 4, l2 = 2.25 → l1; d l/dv = 2(−1 − 1) = −4.
    //  t2: vpred 0.2, old 0 → in range: l1 = l2 = 0.64; d l/dv = 2(0.2 − 1) = −1.6.
    //  t3: masked out (would be in range).
    //  t4: vpred 1.2, old 3.0 → clip 2.5: l1 = 0.04, l2 = 2.25 → l2, constant in vpred
    //      (gradient 0): the clipped case, clipfrac = 1/4.
    #[test]
    fn hand_case() {
        let vp = t2(&[&[2.0, -1.0, 0.2, 3.0, 1.2]]);
        let ret = t2(&[&[1.0, 1.0, 1.0, 1.0, 1.0]]);
        let old = t2(&[&[0.0, 0.0, 0.0, 2.9, 3.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0, 0.0, 1.0]]);
        let v = var(&vp);
        let out = value_loss(&v, &ret, &old, &mask, 0.5, LossAggMode::TokenMean.into()).unwrap();
        // loss = ½ · (1 + 4 + 0.64 + 2.25) / 4 = 0.98625
        assert!((scalar(&out.loss) - 0.986_25).abs() < 1e-6);
        assert!((out.metrics.vf_clipfrac - 0.25).abs() < 1e-6);
        out.loss.backward();
        let g = rows(&v.grad());
        // d/dv = ½ · (d l) / 4
        let want = [2.0 / 8.0, -4.0 / 8.0, -1.6 / 8.0, 0.0, 0.0];
        for (a, b) in g[0].iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{g:?}");
        }
    }

    #[test]
    fn negative_cliprange_is_rejected() {
        let t = t2(&[&[1.0]]);
        let err = value_loss(&t, &t, &t, &t, -0.1, LossAggMode::TokenMean.into()).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidConfig {
                field: "cliprange_value",
                ..
            }
        ));
    }
}
