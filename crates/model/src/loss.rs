//! Token log-probabilities and the next-token loss, differentiable.

use tch::{Kind, Tensor};

use crate::{Error, Result};

/// `log p(targets[b, i] | logits[b, i])`: logits (batch, seq, vocab),
/// targets (batch, seq) of an integer kind → (batch, seq), in the logits'
/// kind.
///
/// Only the log-sum-exp (one fused libtorch op with its own backward) and
/// the picked logit are formed, never the full log-softmax.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let targets = targets
        .f_to_device(logits.device())?
        .f_to_kind(Kind::Int64)?
        .f_unsqueeze(-1)?;
    let picked = logits.f_gather(-1, &targets, false)?;
    let lse = logits.f_logsumexp([-1], true)?;
    Ok((picked - lse).squeeze_dim(-1))
}

/// Teacher-forced log-probabilities of each next token: for position `i`,
/// `log p(ids[i+1] | ids[..=i])`. logits (batch, seq, vocab), ids (batch,
/// seq) → (batch, seq − 1).
pub fn next_token_logprobs(logits: &Tensor, input_ids: &Tensor) -> Result<Tensor> {
    let s = input_ids.size2()?.1;
    if s < 2 {
        return Err(Error::Input(
            "next-token log-probabilities need at least two tokens".into(),
        ));
    }
    token_logprobs(
        &logits.f_narrow(1, 0, s - 1)?,
        &input_ids.f_narrow(1, 1, s - 1)?,
    )
}

/// Mean next-token cross-entropy over all (batch, seq − 1) predictions:
/// transformers' causal-LM loss with `labels = input_ids` and no ignored
/// positions. A scalar tensor in the logits' kind.
pub fn next_token_cross_entropy(logits: &Tensor, input_ids: &Tensor) -> Result<Tensor> {
    Ok(-next_token_logprobs(logits, input_ids)?.mean(None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn logprobs_of_uniform_logits() {
        let logits = Tensor::zeros([1, 3, 4], (Kind::Float, Device::Cpu));
        let ids = Tensor::from_slice2(&[[0i64, 3, 1]]);
        let lp: Vec<Vec<f32>> =
            Vec::try_from(&next_token_logprobs(&logits, &ids).unwrap()).unwrap();
        let expected = -(4f32.ln());
        assert!(lp[0].iter().all(|v| (v - expected).abs() < 1e-6), "{lp:?}");
        let ce = f32::try_from(next_token_cross_entropy(&logits, &ids).unwrap()).unwrap();
        assert!((ce + expected).abs() < 1e-6);
    }

    #[test]
    fn logprobs_pick_the_target_and_differentiate() {
        let logits = Tensor::from_slice(&[1.0f32, 2.0, 3.0])
            .view([1, 1, 3])
            .set_requires_grad(true);
        let lp = token_logprobs(&logits, &Tensor::from_slice2(&[[2i64]])).unwrap();
        let want = 3.0 - (1f32.exp() + 2f32.exp() + 3f32.exp()).ln();
        assert!((f32::try_from(&lp.view([-1])).unwrap() - want).abs() < 1e-6);
        lp.sum(None).backward();
        // d/dx log softmax(x)[2] = onehot(2) - softmax(x).
        let g: Vec<f32> = Vec::try_from(&logits.grad().view([-1])).unwrap();
        assert!((g.iter().sum::<f32>()).abs() < 1e-6 && g[2] > 0.0, "{g:?}");
    }
}
