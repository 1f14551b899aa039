//! Activation checkpointing (verl's `enable_gradient_checkpointing`,
//! PyTorch's `torch.utils.checkpoint` per decoder layer): a training
//! micro-batch keeps the layers' boundaries instead of every layer's saved
//! tensors, and recomputes one layer at a time for its backward.
//!
//! libtorch's C++ autograd has no checkpoint function that tch exposes, so
//! the backward is run in pieces, each with `run_backward` (what
//! `torch.autograd.grad` calls):
//!
//! 1. the forward's stages ([`colo_model::Stages`]) without a graph,
//!    keeping each layer's input and the last layer's output: `L + 1`
//!    tensors of (tokens, hidden);
//! 2. the head — final norm, LM head or value head, the loss — from the
//!    last output made a leaf; its backward gives the head's parameters'
//!    gradients and the gradient at that leaf;
//! 3. for each layer from the last: the layer again from its input made a
//!    leaf, with a graph; the backward of `Σ output · upstream` (whose
//!    gradient with respect to the output is exactly `upstream`) gives
//!    the layer's parameters' gradients and the next upstream;
//! 4. the embedding the same way.
//!
//! The pieces' gradients are added per parameter, so a tied embedding
//! gets its LM-head and embedding parts; the sums equal the one-piece
//! backward's up to the order of float additions. Costs one more forward
//! of the layers; saves all but one layer's saved tensors.

use tch::{Kind, Tensor};

use crate::batch::Micro;
use crate::lanes::Lane;
use crate::Result;

impl Lane {
    /// The gradients (in `self.params`' order; undefined for a parameter
    /// the loss does not reach) of the loss `loss_of` computes on `mb`,
    /// and its metrics; no gradients when there is no differentiable loss.
    pub(crate) fn checkpointed_grads<M: Default>(
        &self,
        mb: &Micro,
        loss_of: impl FnOnce(&Lane, &Micro) -> Result<Option<(Tensor, M)>>,
    ) -> Result<(Option<Vec<Tensor>>, M)> {
        if mb.window.is_none() {
            // No response token: nothing to differentiate.
            return Ok((None, loss_of(self, mb)?.map(|(_, m)| m).unwrap_or_default()));
        }
        let stages = self.stages(mb)?;
        // 1. The boundaries, without a graph.
        let mut inputs = tch::no_grad(|| -> Result<Vec<Tensor>> {
            let mut xs = vec![stages.embed()?];
            for l in 0..stages.layers() {
                let x = stages.layer(l, xs.last().expect("one at least"))?;
                xs.push(x);
            }
            Ok(xs)
        })?;
        // 2. The head, from the last layer's output.
        let top = inputs
            .pop()
            .expect("L + 1 boundaries")
            .set_requires_grad(true);
        let mut head = self.clone();
        head.top = Some(top.shallow_clone());
        let Some((loss, m)) = loss_of(&head, mb)? else {
            return Ok((None, M::default()));
        };
        if !loss.requires_grad() {
            return Ok((None, m));
        }
        let mut sums = self.backward_piece(&loss, Some(&top))?;
        let mut upstream = sums.pop().expect("the leaf's gradient");
        drop((loss, head, top));
        // 3. Each layer again, from the last, with a graph.
        for l in (0..stages.layers()).rev() {
            let x = inputs.pop().expect("one per layer").set_requires_grad(true);
            let y = stages.layer(l, &x)?;
            let mut g = self.backward_piece(&surrogate(&y, &upstream)?, Some(&x))?;
            upstream = g.pop().expect("the leaf's gradient");
            add_into(&mut sums, g)?;
        }
        // 4. The embedding, unless it is frozen (LoRA): then nothing
        // before the first layer has a gradient.
        let e = stages.embed()?;
        if e.requires_grad() {
            let g = self.backward_piece(&surrogate(&e, &upstream)?, None)?;
            add_into(&mut sums, g)?;
        }
        Ok((Some(sums), m))
    }

    /// The gradients of the scalar `root` with respect to the parameters
    /// and, when given, `leaf` (last).
    fn backward_piece(&self, root: &Tensor, leaf: Option<&Tensor>) -> Result<Vec<Tensor>> {
        let mut wrt: Vec<&Tensor> = self.params.iter().collect();
        wrt.extend(leaf);
        Ok(Tensor::f_run_backward(&[root], &wrt, false, false)?)
    }
}

/// `Σ y · upstream` in float32: its gradient with respect to `y` is
/// `upstream`, so its backward continues the chain rule through `y`.
pub(crate) fn surrogate(y: &Tensor, upstream: &Tensor) -> Result<Tensor> {
    Ok(y.f_mul(upstream)?.f_sum(Kind::Float)?)
}

/// Adds the defined gradients of `g` into `sums` (same order).
pub(crate) fn add_into(sums: &mut [Tensor], g: Vec<Tensor>) -> Result<()> {
    for (s, g) in sums.iter_mut().zip(g) {
        if !g.defined() {
            continue;
        }
        *s = match s.defined() {
            true => s.f_add(&g)?,
            false => g,
        };
    }
    Ok(())
}
