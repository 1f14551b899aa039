//! Log-probabilities and entropy from logits, differentiable by autograd.
//!
//! The composition below is what PyTorch trainers run (verl's
//! `logprobs_from_logits`): `log_softmax` in float32, then a `gather`.
//! Under autograd it keeps one (batch, len, vocab) tensor for the backward
//! — the log-softmax's output, which the gather and the entropy reuse —
//! and the logits can be freed as soon as it exists. It is the CUDA path
//! and the reference: on the CPU the trainer's loss head is colo-mem's
//! fused `token_logprobs` (`forward.rs`; 8.5 against 22 ms in float32,
//! 5.8 against 40 in bfloat16 at 512 tokens × 8,192, forward and
//! backward), which keeps only the logits.

use tch::{Kind, Tensor};

use crate::Result;

/// `log_softmax` over the vocabulary in float32, whatever the logits' kind
/// (bf16 logits are upcast: log-probability ratios need the precision).
/// (batch, len, vocab) → same shape.
pub fn log_softmax_f32(logits: &Tensor) -> Result<Tensor> {
    Ok(logits.f_log_softmax(-1, Kind::Float)?)
}

/// `log p(targets[b, t])` from log-probabilities (batch, len, vocab) and
/// integer targets (batch, len) → (batch, len).
pub fn pick(log_probs: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let idx = targets.f_to_kind(Kind::Int64)?.f_unsqueeze(-1)?;
    Ok(log_probs.f_gather(-1, &idx, false)?.f_squeeze_dim(-1)?)
}

/// `log p(targets[b, t] | logits[b, t])`: logits (batch, len, vocab),
/// targets (batch, len) → (batch, len) float32, differentiable in
/// `logits`.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    pick(&log_softmax_f32(logits)?, targets)
}

/// Entropy `−Σ p log p` of each distribution from its log-probabilities
/// (batch, len, vocab) → (batch, len); differentiable.
pub fn entropy_from_log_softmax(log_probs: &Tensor) -> Result<Tensor> {
    let plogp = log_probs.f_exp()?.f_mul(log_probs)?;
    Ok(plogp.f_sum_dim_intlist(-1, false, Kind::Float)?.f_neg()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// The same values and gradients as the max-shifted composition of
    /// colo-model's `loss::token_logprobs`, and the entropy of colo-algo.
    #[test]
    fn match_the_reference_compositions_in_value_and_gradient() {
        tch::manual_seed(0);
        for (b, t, v) in [(2, 3, 7), (4, 64, 5000)] {
            let x = (Tensor::randn([b, t, v], (Kind::Float, Device::Cpu)) * 3.0)
                .set_requires_grad(true);
            let ids: Vec<i64> = (0..b * t).map(|i| i * 7919 % v).collect();
            let tg = Tensor::from_slice(&ids).view([b, t]);
            let probe = Tensor::randn([b, t], (Kind::Float, Device::Cpu));
            let fast = token_logprobs(&x, &tg).unwrap();
            let slow = colo_model::loss::token_logprobs(&x, &tg).unwrap();
            assert_eq!(fast.size(), [b, t]);
            let diff = max_diff(&fast, &slow);
            assert!(diff < 1e-4, "forward differs by {diff}");
            let grad = |y: &Tensor| {
                Tensor::run_backward(&[(y * &probe).sum(Kind::Float)], &[&x], false, false)
                    .pop()
                    .unwrap()
            };
            let diff = max_diff(&grad(&fast), &grad(&slow));
            // Random inputs (std 3, 5000 classes) summed in different
            // orders: f32 rounding reaches ~1e-5, a wrong gradient O(0.1).
            assert!(diff < 1e-4, "gradient differs by {diff}");

            let h = entropy_from_log_softmax(&log_softmax_f32(&x).unwrap()).unwrap();
            let want = colo_algo::entropy::entropy_from_logits(&x).unwrap();
            let diff = max_diff(&h, &want);
            assert!(diff < 1e-4, "entropy differs by {diff}");
            let diff = max_diff(&grad(&h), &grad(&want));
            assert!(diff < 1e-4, "entropy gradient differs by {diff}");
        }
    }

    #[test]
    fn bf16_logits_give_float32_log_probs() {
        let x = Tensor::zeros([1, 2, 4], (Kind::BFloat16, Device::Cpu));
        let t = Tensor::from_slice(&[0i64, 3]).view([1, 2]);
        let lp = token_logprobs(&x, &t).unwrap();
        assert_eq!(lp.kind(), Kind::Float);
        assert!((lp.double_value(&[0, 1]) + 4f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn out_of_vocabulary_target_is_an_error() {
        let x = Tensor::zeros([1, 1, 4], (Kind::Float, Device::Cpu));
        let t = Tensor::from_slice(&[4i64]).view([1, 1]);
        assert!(token_logprobs(&x, &t).is_err());
    }
}
