//! The trainer's lanes (see [`colo_model::lanes`]): each lane computes
//! its rows' share of the loss (losses are aggregated with whole-batch
//! denominators, so the shares add up), and the gradients are added in
//! lane order, so a run is deterministic for a given number of lanes;
//! different lane counts differ by the order of float additions only.
//! Each lane thread opens its own `region(activations)`.

use std::sync::Arc;

use colo_mem::{tags, Pool};
use colo_model::Model;
use tch::Tensor;

use crate::sharding::Shards;
use crate::value_head::ValueHead;
use crate::Result;

/// What a pass needs from the engine, owned by one lane.
pub(crate) struct Lane {
    pub(crate) pool: Arc<Pool>,
    pub(crate) model: Model,
    pub(crate) value_head: Option<ValueHead>,
    /// The parameters, in the engine's order (gradients are taken with
    /// respect to them).
    pub(crate) params: Vec<Tensor>,
    /// With activation checkpointing: the last layer's output as a leaf,
    /// which the forward's head starts from instead of running the layers
    /// (see `checkpointing.rs`).
    pub(crate) top: Option<Tensor>,
    /// A sharded trainer's shards: `params` are then empty between the
    /// gathers of their units (see [`crate::sharding`]).
    pub(crate) shards: Option<Shards>,
}

impl Clone for Lane {
    /// Shares every tensor.
    fn clone(&self) -> Self {
        Lane {
            shards: self.shards.clone(),
            ..Lane::of(
                &self.pool,
                &self.model,
                self.value_head.as_ref(),
                &self.params,
            )
        }
    }
}

impl Lane {
    /// A lane's own handles on `model`, `value_head` and `params` (shallow
    /// clones: the same storage and autograd leaves).
    pub(crate) fn of(
        pool: &Arc<Pool>,
        model: &Model,
        value_head: Option<&ValueHead>,
        params: &[Tensor],
    ) -> Self {
        Lane {
            pool: pool.clone(),
            model: model.clone(),
            value_head: value_head.cloned(),
            params: params.iter().map(Tensor::shallow_clone).collect(),
            top: None,
            shards: None,
        }
    }

    /// Runs `f` inside `region(activations)` on the current thread.
    pub(crate) fn in_activations<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let guard = self.pool.region(tags::ACTIVATIONS)?;
        let out = f();
        guard.finish()?;
        out
    }
}

/// Runs `make()(lane, part)` for every part, the first on the calling
/// thread and each other one on a thread of its own, all inside
/// `region(activations)` with one libtorch intra-op thread and grad mode
/// `grad`; returns the results in the parts' order. `make` is called on
/// the calling thread, once per part, so the work it returns may own
/// (shallow clones of) whatever it needs. With one part nothing is
/// spawned.
pub(crate) fn run<P, T, W>(
    lane: &Lane,
    grad: bool,
    parts: Vec<P>,
    mut make: impl FnMut() -> W,
) -> Result<Vec<T>>
where
    P: Send,
    T: Send,
    W: FnOnce(&Lane, P) -> Result<T> + Send,
{
    let work: Vec<_> = parts
        .into_iter()
        .map(|part| {
            let (lane, work) = (lane.clone(), make());
            move || {
                let _no_grad = (!grad).then(tch::no_grad_guard);
                lane.in_activations(|| work(&lane, part))
            }
        })
        .collect();
    colo_model::lanes::run(work).into_iter().collect()
}
