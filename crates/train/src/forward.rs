//! The forwards the losses are built on: per-token log-probabilities,
//! entropy and values of a micro-batch.
//!
//! Only the response window gets the LM head: the columns `t0..t1` holding
//! every response token of the micro-batch are predicted from the hidden
//! states at `t0 − 1..t1 − 1`, so a long prompt costs its transformer
//! layers but no (seq, vocab) logits. Results are (rows, t1 − t0), the
//! window's columns, zero outside the response mask.
//!
//! Whether a graph is built is libtorch's grad mode: scoring runs under
//! `tch::no_grad`, training steps with gradients on.

use tch::{Kind, Tensor};

use crate::batch::Micro;
use crate::lanes::Lane;

use crate::ops::{entropy_from_log_softmax, log_softmax_f32, pick};
use crate::{Error, Result};

/// Whether and how a forward computes the entropy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entropy {
    None,
    /// As a metric: from the detached log-probabilities, no graph.
    Detached,
    /// As a loss term: differentiable.
    Differentiable,
}

impl Lane {
    /// Hidden states (rows, t1 − t0, hidden) of the window that predicts
    /// the response tokens, or `None` if `mb` has no response token.
    ///
    /// Rows that share prompts (a GRPO group's samples) run each prompt
    /// once ([`colo_model::Model::hidden_states_shared_prompts`]); columns of a row
    /// outside its response are then zero (they are masked out anyway).
    /// Otherwise one forward of the right-padded rows: a real position
    /// only sees real positions before it, so the causal mask alone is
    /// exact there.
    fn window_hidden(&self, mb: &Micro) -> Result<Option<Tensor>> {
        let Some((t0, t1)) = mb.window else {
            return Ok(None);
        };
        let stages = self.stages(mb)?;
        let hidden = match &self.top {
            Some(top) => stages.finish(top)?,
            None => stages.run()?,
        };
        let Some((shared, prompt_lens)) = &mb.shared else {
            return Ok(Some(hidden.f_narrow(1, t0 as i64 - 1, (t1 - t0) as i64)?));
        };
        // (rows, 1 + R, h)
        let (rows, cols, h) = hidden.size3()?;
        // Window column c of row r predicts token t0 + c from position
        // t0 + c − 1, which is column t0 + c − P of the row's states.
        let zero = rows * cols;
        let w = t1 - t0;
        let mut idx = Vec::with_capacity(rows as usize * w);
        for (r, ((_, resp), &p)) in shared.rows.iter().zip(prompt_lens).enumerate() {
            for c in 0..w {
                let j = (t0 + c) as i64 - p as i64;
                let inside = j >= 0 && (j as usize) < resp.len();
                idx.push(if inside { r as i64 * cols + j } else { zero });
            }
        }
        let flat = Tensor::f_cat(
            &[
                hidden.f_reshape([zero, h])?,
                hidden.f_new_zeros([1, h], (hidden.kind(), hidden.device()))?,
            ],
            0,
        )?;
        let idx = Tensor::from_slice(&idx).f_to_device(hidden.device())?;
        Ok(Some(
            flat.f_index_select(0, &idx)?.f_view([rows, w as i64, h])?,
        ))
    }

    /// The model's forward of `mb` in stages: the rows, or each shared
    /// prompt once ([`Lane::window_hidden`]).
    pub(crate) fn stages(&self, mb: &Micro) -> Result<colo_model::Stages<'_>> {
        Ok(match &mb.shared {
            None => self.model.stages(mb.seqs.input_ids(), None, None)?,
            Some((shared, _)) => self.model.stages_shared_prompts(shared)?,
        })
    }

    /// Log-probabilities (rows, t1 − t0) of the window's tokens in float32,
    /// zero outside the response mask; and the entropy if asked.
    pub(crate) fn token_scores(
        &self,
        mb: &Micro,
        entropy: Entropy,
    ) -> Result<Option<(Tensor, Option<Tensor>)>> {
        let Some(hidden) = self.window_hidden(mb)? else {
            return Ok(None);
        };
        let (t0, t1) = mb.window.expect("checked above");
        let mask = mb.mask.as_ref().expect("set with the window");
        let targets = mb
            .seqs
            .input_ids()
            .f_narrow(1, t0 as i64, (t1 - t0) as i64)?;
        let logits = self.model.lm_head(&hidden)?;
        // On the CPU, colo-kernels' fused loss head: the log-probabilities
        // and the entropy in float32 from the logits, which are all it
        // keeps for the backward (libtorch's composition keeps a float32
        // log-softmax and makes two more (rows, window, vocab) tensors in
        // the backward).
        let (lp, ent) = if colo_kernels::token_logprobs_fits(&logits) {
            let (lp, h) = colo_kernels::token_logprobs(&logits, &targets)?;
            let ent = match entropy {
                Entropy::None => None,
                Entropy::Detached => Some(h.detach()),
                Entropy::Differentiable => Some(h),
            };
            (lp, ent)
        } else {
            // The logits are dropped as soon as their log-softmax exists:
            // only one (rows, window, vocab) tensor is kept for the backward.
            let lsm = log_softmax_f32(&logits)?;
            drop(logits);
            let ent = match entropy {
                Entropy::None => None,
                Entropy::Detached => {
                    Some(tch::no_grad(|| entropy_from_log_softmax(&lsm.detach()))?)
                }
                Entropy::Differentiable => Some(entropy_from_log_softmax(&lsm)?),
            };
            (pick(&lsm, &targets)?, ent)
        };
        Ok(Some((
            lp.f_mul(mask)?,
            ent.map(|e| e.f_mul(mask)).transpose()?,
        )))
    }

    /// Values (rows, t1 − t0) of the window's tokens from the value head
    /// in float32 (the value of token `t` is read at the hidden state of
    /// `t − 1`, as verl's critic does), zero outside the response mask.
    pub(crate) fn token_values(&self, mb: &Micro) -> Result<Option<Tensor>> {
        let head = self.value_head.as_ref().ok_or(Error::NoValueHead {
            op: "compute values",
        })?;
        let Some(hidden) = self.window_hidden(mb)? else {
            return Ok(None);
        };
        let mask = mb.mask.as_ref().expect("set with the window");
        let v = head.forward(&hidden)?.f_to_kind(Kind::Float)?;
        Ok(Some(v.f_mul(mask)?))
    }
}
