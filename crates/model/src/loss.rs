//! Token log-probabilities and the next-token loss, differentiable.

use candle_core::{Tensor, D};

use crate::{Error, Result};

/// `log p(targets[b, i] | logits[b, i])`: logits (batch, seq, vocab),
/// targets (batch, seq) u32 or i64 → (batch, seq), in the logits' dtype.
///
/// Only the log-sum-exp and the picked logit are formed, never the full
/// log-softmax, which saves a pass and a (batch, seq, vocab) buffer.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    // The max only stabilises the exponentials; its gradient cancels
    // exactly, so it is detached rather than differentiated.
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let picked = shifted.gather(&targets.unsqueeze(D::Minus1)?.contiguous()?, D::Minus1)?;
    Ok((picked - lse)?.squeeze(D::Minus1)?)
}

/// Teacher-forced log-probabilities of each next token: for position `i`,
/// `log p(ids[i+1] | ids[..=i])`. logits (batch, seq, vocab), ids (batch,
/// seq) → (batch, seq − 1).
pub fn next_token_logprobs(logits: &Tensor, input_ids: &Tensor) -> Result<Tensor> {
    let s = input_ids.dim(1)?;
    if s < 2 {
        return Err(Error::Input(
            "next-token log-probabilities need at least two tokens".into(),
        ));
    }
    token_logprobs(
        &logits.narrow(1, 0, s - 1)?,
        &input_ids.narrow(1, 1, s - 1)?,
    )
}

/// Mean next-token cross-entropy over all (batch, seq − 1) predictions:
/// transformers' causal-LM loss with `labels = input_ids` and no ignored
/// positions.
pub fn next_token_cross_entropy(logits: &Tensor, input_ids: &Tensor) -> Result<Tensor> {
    Ok(next_token_logprobs(logits, input_ids)?.mean_all()?.neg()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn logprobs_of_uniform_logits() {
        let logits = Tensor::zeros((1, 3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let ids = Tensor::new(&[[0u32, 3, 1]], &Device::Cpu).unwrap();
        let lp = next_token_logprobs(&logits, &ids)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let expected = -(4f32.ln());
        assert!(lp[0].iter().all(|v| (v - expected).abs() < 1e-6), "{lp:?}");
        let ce = next_token_cross_entropy(&logits, &ids)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((ce + expected).abs() < 1e-6);
    }
}
