//! Entropy of the policy, and its aggregation as a bonus term.
//!
//! The entropy bonus (Williams & Peng 1991; Mnih et al. 2016, "Asynchronous
//! Methods for Deep RL", arXiv:1602.01783; PPO's objective, Schulman et al.
//! 2017, eq. 9) keeps the policy from collapsing early. The caller subtracts
//! `entropy_coeff · entropy_bonus(..)` from the loss (verl `actor.entropy_coeff`).

use tch::Tensor;

use crate::agg::{agg_loss, LossAgg};
use crate::error::{Error, Result};
use crate::masked::{acc_kind, check_all};

/// Categorical entropy per position, H = −Σ_k p_k log p_k with log p = log_softmax(z).
///
/// Shapes: `logits` (batch, response_len, vocab) → (batch, response_len), of
/// the logits' kind. Differentiable in `logits`. `log_softmax` subtracts the
/// maximum internally, so large logits do not overflow; for bf16 logits it
/// runs in f32 (one f32 copy of the logits), since a sum over a vocabulary of
/// 150k terms is beyond bf16's precision. (verl `entropy_from_logits`.)
pub fn entropy_from_logits(logits: &Tensor) -> Result<Tensor> {
    if logits.dim() != 3 || !logits.is_floating_point() {
        return Err(Error::InvalidInput {
            arg: "logits",
            reason: format!(
                "expected a floating-point (batch, response_len, vocab) tensor, got shape {:?} of {:?}",
                logits.size(),
                logits.kind()
            ),
        });
    }
    let kind = acc_kind(logits.kind());
    let log_p = logits.log_softmax(-1, kind);
    let h = -(log_p.exp() * &log_p).sum_dim_intlist(-1, false, kind);
    Ok(h.to_kind(logits.kind()))
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
    use crate::masked::test_util::*;
    use tch::Kind;

    #[test]
    fn uniform_and_peaked_logits() {
        // Uniform over 4 → ln 4 = 1.386294. Logits [0, ln 3] → p = [1/4, 3/4]:
        // H = −(¼ ln ¼ + ¾ ln ¾) = 0.562335. Large logits must not overflow.
        let l = Tensor::from_slice2(&[
            [0f32, 0., 0., 0.],
            [1000., 1000., 1000., 1000.],
            [0., 3f32.ln(), -1e30, -1e30],
            [0., 0., 0., 0.],
        ])
        .reshape([2, 2, 4]);
        let h = rows(&entropy_from_logits(&l).unwrap());
        assert!((h[0][0] - 1.386_294).abs() < 1e-5, "{h:?}");
        assert!((h[0][1] - 1.386_294).abs() < 1e-5, "{h:?}");
        assert!((h[1][0] - 0.562_335).abs() < 1e-5, "{h:?}");
    }

    #[test]
    fn gradient_matches_closed_form() {
        // dH/dz_k = −p_k (log p_k + H). For p = [¼, ¾], H = 0.562335:
        // dH/dz_0 = −¼ (ln ¼ + H) = 0.205990, dH/dz_1 = −0.205990.
        let z = var(&Tensor::from_slice(&[0f32, 3f32.ln()]).reshape([1, 1, 2]));
        let h = entropy_from_logits(&z).unwrap();
        let mask = t2(&[&[1.0]]);
        let bonus = entropy_bonus(&h, &mask, LossAggMode::TokenMean.into()).unwrap();
        assert!((scalar(&bonus) - 0.562_335).abs() < 1e-5);
        bonus.backward();
        let g = Vec::<f32>::try_from(z.grad().flatten(0, -1)).unwrap();
        assert!(
            (g[0] - 0.205_990).abs() < 1e-5 && (g[1] + 0.205_990).abs() < 1e-5,
            "{g:?}"
        );
    }

    #[test]
    fn rejects_2d_and_integer_logits() {
        for l in [
            t2(&[&[0.0, 1.0]]),
            Tensor::zeros([1, 1, 2], (Kind::Int64, tch::Device::Cpu)),
        ] {
            assert!(matches!(
                entropy_from_logits(&l).unwrap_err(),
                Error::InvalidInput { arg: "logits", .. }
            ));
        }
    }

    #[test]
    fn bf16_logits_give_bf16_entropy_computed_in_f32() {
        // Uniform over 50k: ln 50000 = 10.819778; bf16 keeps ~3 significant digits.
        let l = Tensor::zeros([1, 1, 50_000], (Kind::BFloat16, tch::Device::Cpu));
        let h = entropy_from_logits(&l).unwrap();
        assert_eq!(h.kind(), Kind::BFloat16);
        assert!((scalar(&h) - 10.819_778).abs() < 0.05, "{h:?}");
    }
}
