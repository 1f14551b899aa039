//! The forwards the losses are built on: per-token log-probabilities,
//! entropy and values of a micro-batch.
//!
//! Only the response window gets the LM head: the columns `t0..t1` holding
//! every response token of the micro-batch are predicted from the hidden
//! states at `t0 − 1..t1 − 1`, so a long prompt costs its transformer
//! layers but no (seq, vocab) logits. Results are padded back to the
//! micro-batch's full width and zeroed outside the response mask.

use candle_core::Tensor;

use crate::batch::SeqBatch;
use crate::ops::token_logprobs;
use crate::trainer::ColoTrainer;
use crate::{Error, Result};

/// Whether and how a forward computes the entropy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entropy {
    None,
    /// As a metric: from detached logits, no graph.
    Detached,
    /// As a loss term: differentiable.
    Differentiable,
}

impl ColoTrainer {
    /// Hidden states of the window that predicts the response tokens:
    /// `(hidden (b, w, h), t0, t1)`, or `None` if `mb` has no response token.
    fn window_hidden(&self, mb: &SeqBatch, grad: bool) -> Result<Option<(Tensor, usize, usize)>> {
        let Some((t0, t1)) = mb.response_window() else {
            return Ok(None);
        };
        let model = if grad { &self.model } else { &self.frozen };
        let hidden = model.hidden_states(mb.input_ids(), Some(mb.attention_mask()), None)?;
        Ok(Some((hidden.narrow(1, t0 - 1, t1 - t0)?, t0, t1)))
    }

    /// Log-probabilities (b, s) of the micro-batch's tokens, zero outside
    /// the response mask, with a graph if `grad`; and the entropy if asked.
    pub(crate) fn token_scores(
        &self,
        mb: &SeqBatch,
        grad: bool,
        entropy: Entropy,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let s = mb.seq_len();
        let Some((hidden, t0, t1)) = self.window_hidden(mb, grad)? else {
            let zeros = mb.response_mask().zeros_like()?;
            return Ok((zeros.clone(), (entropy != Entropy::None).then_some(zeros)));
        };
        let model = if grad { &self.model } else { &self.frozen };
        let logits = model.lm_head(&hidden)?; // (b, w, vocab)
        let targets = mb.input_ids().narrow(1, t0, t1 - t0)?;
        let lp = token_logprobs(&logits, &targets)?; // (b, w)
        let ent = match entropy {
            Entropy::None => None,
            Entropy::Detached => Some(colo_algo::entropy::entropy_from_logits(&logits.detach())?),
            Entropy::Differentiable => Some(colo_algo::entropy::entropy_from_logits(&logits)?),
        };
        let mask = mb.response_mask();
        let pad = |t: Tensor| -> Result<Tensor> { Ok((t.pad_with_zeros(1, t0, s - t1)? * mask)?) };
        Ok((pad(lp)?, ent.map(pad).transpose()?))
    }

    /// Values (b, s) of the micro-batch's tokens from the value head (the
    /// value of token `t` is read at the hidden state of `t − 1`, as verl's
    /// critic does), zero outside the response mask.
    pub(crate) fn token_values(&self, mb: &SeqBatch, grad: bool) -> Result<Tensor> {
        let head = self.value_head.as_ref().ok_or(Error::NoValueHead {
            op: "compute values",
        })?;
        let Some((hidden, t0, t1)) = self.window_hidden(mb, grad)? else {
            return Ok(mb.response_mask().zeros_like()?);
        };
        let v = head.forward(&hidden, grad)?; // (b, w)
        Ok((v.pad_with_zeros(1, t0, mb.seq_len() - t1)? * mb.response_mask())?)
    }
}
