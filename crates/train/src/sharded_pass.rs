//! A sharded trainer's passes (see [`crate::sharding`]): the staged
//! backward of activation checkpointing with each unit gathered around its
//! piece and its gradient reduce-scattered after, and the no-grad forward
//! of scoring with the same gathers.

use colo_model::Stages;
use tch::Tensor;

use crate::batch::Micro;
use crate::checkpointing::{add_into, surrogate};
use crate::lanes::Lane;
use crate::sharding::Shards;
use crate::Result;

/// A micro-batch's layers run forward: the micro-batch, its stages, the
/// last layer's output and every layer's input.
pub(crate) type Forwarded<'a, 's> = (&'a Micro, Stages<'s>, Tensor, Vec<Tensor>);

impl Lane {
    fn shards(&self) -> &Shards {
        self.shards.as_ref().expect("a sharded trainer's lane")
    }

    /// The trainer's parameter handles of unit `u`, in the unit's order.
    fn unit_params(&self, u: usize) -> Vec<&Tensor> {
        self.shards().units[u]
            .params
            .iter()
            .map(|&i| &self.params[i])
            .collect()
    }

    /// Runs `f` with unit `u` gathered, releasing it after, also on error.
    pub(crate) fn with_unit<T>(&self, u: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let sh = self.shards();
        sh.gather(u, &self.params)?;
        let out = f();
        sh.release(u, &self.params)?;
        out
    }

    /// Gradients of `root` with respect to unit `u`'s parameters and, when
    /// given, `leaf` (last).
    fn unit_backward(&self, root: &Tensor, u: usize, leaf: Option<&Tensor>) -> Result<Vec<Tensor>> {
        let mut wrt = self.unit_params(u);
        wrt.extend(leaf);
        Ok(Tensor::f_run_backward(&[root], &wrt, false, false)?)
    }

    /// One training micro-batch of a sharded trainer (the root gathered by
    /// the caller): its gradients reduce-scattered into the accumulators,
    /// its metrics returned. `mb` is `None` for a micro-batch this peer has
    /// no rows in; it, and one without a differentiable loss, take part in
    /// every gather and reduce-scatter with zero gradients.
    pub(crate) fn sharded_grads<M: Default>(
        &self,
        mb: Option<&Micro>,
        loss_of: impl FnOnce(&Lane, &Micro) -> Result<Option<(Tensor, M)>>,
    ) -> Result<M> {
        let sh = self.shards();
        let layers = sh.units.len() - 1;
        let Some((mb, stages, top, mut inputs)) = self.sharded_forward(mb)? else {
            for l in (0..layers).rev() {
                self.with_unit(l + 1, || sh.reduce_nothing(l + 1))?;
            }
            sh.reduce_nothing(0)?;
            return Ok(M::default());
        };
        let top = top.set_requires_grad(true);
        let mut head = self.clone();
        head.top = Some(top.shallow_clone());
        let (mut root, mut upstream, m) = match loss_of(&head, mb)? {
            Some((loss, m)) if loss.requires_grad() => {
                let mut g = self.unit_backward(&loss, 0, Some(&top))?;
                let up = g.pop().expect("the leaf's gradient");
                (g, Some(up), m)
            }
            Some((_, m)) => (Vec::new(), None, m),
            None => (Vec::new(), None, M::default()),
        };
        drop((head, top));
        for l in (0..layers).rev() {
            let x = inputs.pop().expect("one per layer");
            self.with_unit(l + 1, || {
                let Some(up) = &upstream else {
                    return sh.reduce_nothing(l + 1);
                };
                let x = x.set_requires_grad(true);
                let y = stages.layer(l, &x)?;
                let mut g = self.unit_backward(&surrogate(&y, up)?, l + 1, Some(&x))?;
                upstream = Some(g.pop().expect("the leaf's gradient"));
                sh.reduce(l + 1, &g)
            })?;
        }
        if let Some(up) = &upstream {
            let e = stages.embed()?;
            let g = self.unit_backward(&surrogate(&e, up)?, 0, None)?;
            match root.is_empty() {
                true => root = g,
                false => add_into(&mut root, g)?,
            }
        }
        match root.is_empty() {
            true => sh.reduce_nothing(0)?,
            false => sh.reduce(0, &root)?,
        }
        Ok(m)
    }

    /// The layers' forward without a graph, each layer gathered around its
    /// run: `mb`, its stages (for the backward's recomputation), the last
    /// layer's output and every layer's input; `None` (after the same
    /// gathers) when `mb` is `None` or has no response token.
    pub(crate) fn sharded_forward<'a>(
        &self,
        mb: Option<&'a Micro>,
    ) -> Result<Option<Forwarded<'a, '_>>> {
        let layers = self.shards().units.len() - 1;
        let Some(mb) = mb.filter(|mb| mb.window.is_some()) else {
            for l in 0..layers {
                self.with_unit(l + 1, || Ok(()))?;
            }
            return Ok(None);
        };
        let stages = self.stages(mb)?;
        let mut xs = tch::no_grad(|| stages.embed())?;
        let mut inputs = Vec::with_capacity(layers);
        for l in 0..layers {
            let y = self.with_unit(l + 1, || tch::no_grad(|| Ok(stages.layer(l, &xs)?)))?;
            inputs.push(std::mem::replace(&mut xs, y));
        }
        Ok(Some((mb, stages, xs, inputs)))
    }
}
