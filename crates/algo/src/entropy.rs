//! Entropy of the policy, and its aggregation as a bonus term.
//!
//! The entropy bonus (Williams & Peng 1991; Mnih et al. 2016, "Asynchronous
//! Methods for Deep RL", arXiv:1602.01783; PPO's objective, Schulman et al.
//! 2017, eq. 9) keeps the policy from collapsing early. The caller subtracts
//! `entropy_coeff · entropy_bonus(..)` from the loss (verl `actor.entropy_coeff`).

use candle_core::{Tensor, D};

use crate::agg::{agg_loss, LossAgg};
use crate::error::{Error, Result};
use crate::masked::check_all;

/// Categorical entropy per position, H = logsumexp(z) − Σ softmax(z)·z.
///
/// Shapes: `logits` (batch, response_len, vocab) → (batch, response_len).
/// Differentiable in `logits`; the max subtracted for stability is detached,
/// which does not change the value or the gradient (H is shift-invariant).
/// (verl `entropy_from_logits`.)
pub fn entropy_from_logits(logits: &Tensor) -> Result<Tensor> {
    if logits.rank() != 3 {
        return Err(Error::InvalidInput {
            arg: "logits",
            reason: format!(
                "expected (batch, response_len, vocab), got shape {:?}",
                logits.dims()
            ),
        });
    }
    let z = logits.broadcast_sub(&logits.max_keepdim(D::Minus1)?.detach())?;
    let lse = z.exp()?.sum_keepdim(D::Minus1)?.log()?; // (b, l, 1)
    let p = z.broadcast_sub(&lse)?.exp()?;
    let h = lse.squeeze(D::Minus1)?.sub(&p.mul(&z)?.sum(D::Minus1)?)?;
    Ok(h)
}

/// The entropy term: `agg_loss(entropy, response_mask, agg)`, a scalar tensor.
///
/// Shapes: `entropy` and `response_mask` (batch, response_len). The sign is the
/// entropy's (positive); the caller applies −entropy_coeff.
pub fn entropy_bonus(entropy: &Tensor, response_mask: &Tensor, agg: LossAgg) -> Result<Tensor> {
    check_all(("entropy", entropy), &[("response_mask", response_mask)])?;
    agg_loss(entropy, response_mask, agg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agg::LossAggMode;
    use crate::masked::{rows, scalar};
    use candle_core::{Device, Var};

    #[test]
    fn uniform_and_peaked_logits() {
        // Uniform over 4 → ln 4 = 1.386294. Logits [0, ln 3] → p = [1/4, 3/4]:
        // H = −(¼ ln ¼ + ¾ ln ¾) = 0.562335. Large logits must not overflow.
        let l = Tensor::new(
            &[
                [[0f32, 0., 0., 0.], [1000., 1000., 1000., 1000.]],
                [[0., 3f32.ln(), -1e30, -1e30], [0., 0., 0., 0.]],
            ],
            &Device::Cpu,
        )
        .unwrap();
        let h = rows(&entropy_from_logits(&l).unwrap()).unwrap();
        assert!((h[0][0] - 1.386_294).abs() < 1e-5, "{h:?}");
        assert!((h[0][1] - 1.386_294).abs() < 1e-5, "{h:?}");
        assert!((h[1][0] - 0.562_335).abs() < 1e-5, "{h:?}");
    }

    #[test]
    fn gradient_matches_closed_form() {
        // dH/dz_k = −p_k (log p_k + H). For p = [¼, ¾], H = 0.562335:
        // dH/dz_0 = −¼ (ln ¼ + H) = 0.205990, dH/dz_1 = −0.205990.
        let z =
            Var::from_tensor(&Tensor::new(&[[[0f32, 3f32.ln()]]], &Device::Cpu).unwrap()).unwrap();
        let h = entropy_from_logits(z.as_tensor()).unwrap();
        let mask = Tensor::new(&[[1f32]], &Device::Cpu).unwrap();
        let bonus = entropy_bonus(&h, &mask, LossAggMode::TokenMean.into()).unwrap();
        assert!((scalar(&bonus).unwrap() - 0.562_335).abs() < 1e-5);
        let g = bonus.backward().unwrap();
        let g = g.get(z.as_tensor()).unwrap().flatten_all().unwrap();
        let g = g.to_vec1::<f32>().unwrap();
        assert!(
            (g[0] - 0.205_990).abs() < 1e-5 && (g[1] + 0.205_990).abs() < 1e-5,
            "{g:?}"
        );
    }

    #[test]
    fn rejects_2d_logits() {
        let l = Tensor::new(&[[0f32, 1.]], &Device::Cpu).unwrap();
        assert!(matches!(
            entropy_from_logits(&l).unwrap_err(),
            Error::InvalidInput { arg: "logits", .. }
        ));
    }
}
