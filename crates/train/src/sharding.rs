//! Sharded data parallelism, with FSDP's (ZeRO-3's) semantics: each of
//! `world` peers keeps `1/world` of every parameter, of its gradient
//! accumulator and of its AdamW state (moments, float32 masters); a unit's
//! full weights exist only while something computes with them.
//!
//! **Units** are FSDP's wrapping: one per decoder layer, and the root —
//! everything outside the layers (embedding, final norm, LM head, value
//! head). A unit's parameters are flattened in order into one vector
//! padded to a multiple of `world` (FSDP 1's `FlatParameter`); peer `r`
//! keeps elements `r·s .. (r+1)·s` of it, `s = padded / world`.
//!
//! **A training micro-batch** runs the staged backward of activation
//! checkpointing (`checkpointing.rs`), which is what lets a layer's weights
//! go between its forward and its backward:
//!
//! 1. the root is gathered for the whole micro-batch;
//! 2. the layers' forward without a graph: each layer gathered, run,
//!    released;
//! 3. the head's backward (root parameters);
//! 4. each layer from the last: gathered again, recomputed with a graph,
//!    its backward, its gradient reduce-scattered into this peer's
//!    accumulator, released;
//! 5. the embedding's backward, then the root's gradient reduce-scattered
//!    and the root released.
//!
//! Every peer makes the same collective calls in the same order: the
//! number of micro-batches is agreed (the maximum over the peers), and a
//! peer without rows in one, or whose rows have no response token, makes
//! its gathers and reduce-scatters with zero gradients (it still receives
//! its share of the others' sums). A scoring pass gathers the same way,
//! without a backward.
//!
//! **The update** runs on the shards: the gradient's global norm is the
//! square root of the peers' summed squares; clipping and AdamW are
//! element-wise, so each peer updates its own elements exactly as an
//! unsharded trainer would.
//!
//! **Memory**: shards in `train_params`, `train_grads` and `optimizer`, as
//! unsharded; gathered weights in `gathered_params`
//! ([`tags::GATHERED_PARAMS`]), whose blocks the pool caches for the next
//! gather; the flattened gradient of the unit being reduced in
//! `activations`. A parameter between passes is an empty tensor whose
//! storage a gather points at the gathered buffer
//! (`set_source_tensor_storage_offset_`, what FSDP's storage swap does).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use colo_mem::{tags, Pool};
use tch::{Device, Kind, Tensor};

use crate::buffers::done;
use crate::collective::{Collective, Traffic};
use crate::{Error, Result};

/// The peers of a trainer, shared by its passes and its update.
pub(crate) type Peers = Arc<Mutex<Box<dyn Collective>>>;

/// Locks the peers (a poisoned lock is a peer whose call panicked: an
/// error, not a second panic).
pub(crate) fn lock(peers: &Peers) -> Result<MutexGuard<'_, Box<dyn Collective>>> {
    peers.lock().map_err(|_| Error::Unsupported {
        what: "collective",
        found: "a previous collective call panicked; the trainer cannot continue".into(),
    })
}

/// One unit: its parameters (indices into the trainer's), their offsets
/// and shapes in the flat vector, its padded length.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub(crate) params: Vec<usize>,
    pub(crate) offsets: Vec<i64>,
    pub(crate) shapes: Vec<Vec<i64>>,
    pub(crate) padded: i64,
}

impl Unit {
    /// Elements of this unit one peer keeps.
    pub(crate) fn shard_len(&self, world: usize) -> i64 {
        self.padded / world as i64
    }
}

/// The units of parameters named `names` (Hugging Face names) with
/// `shapes`: the root (index 0), then one per decoder layer `0..layers`.
pub(crate) fn units(
    names: &[String],
    shapes: &[Vec<i64>],
    layers: usize,
    world: usize,
) -> Vec<Unit> {
    let unit_of = |name: &str| -> usize {
        name.strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|&l| l < layers)
            .map_or(0, |l| l + 1)
    };
    let mut out: Vec<Unit> = (0..=layers)
        .map(|_| Unit {
            params: Vec::new(),
            offsets: Vec::new(),
            shapes: Vec::new(),
            padded: 0,
        })
        .collect();
    for (i, (name, shape)) in names.iter().zip(shapes).enumerate() {
        let u = &mut out[unit_of(name)];
        u.params.push(i);
        u.offsets.push(u.padded);
        u.shapes.push(shape.clone());
        u.padded += shape.iter().product::<i64>();
    }
    let w = world.max(1) as i64;
    for u in &mut out {
        u.padded = (u.padded + w - 1) / w * w;
    }
    out
}

/// Contiguous strides of `shape`.
fn strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// `tensors` (one unit's, in order) flattened into one vector of `padded`
/// elements of `kind` (zeros after the last).
pub(crate) fn flatten(tensors: &[Tensor], padded: i64, kind: Kind) -> Result<Tensor> {
    let mut parts = Vec::with_capacity(tensors.len() + 1);
    let mut n = 0;
    for t in tensors {
        parts.push(t.f_reshape([-1])?.f_to_kind(kind)?);
        n += t.numel() as i64;
    }
    let device = tensors.first().map_or(Device::Cpu, Tensor::device);
    if padded > n {
        parts.push(Tensor::f_zeros([padded - n], (kind, device))?);
    }
    Ok(Tensor::f_cat(&parts, 0)?)
}

/// What a pass needs to gather and reduce a sharded trainer's units; a
/// clone shares every tensor.
pub(crate) struct Shards {
    pub(crate) pool: Arc<Pool>,
    pub(crate) peers: Peers,
    pub(crate) units: Arc<Vec<Unit>>,
    pub(crate) world: usize,
    pub(crate) rank: usize,
    /// Each unit's parameter shard (the engine's kind).
    pub(crate) params: Vec<Tensor>,
    /// Each unit's float32 gradient accumulator shard.
    pub(crate) grads: Vec<Tensor>,
    /// Accumulators not yet written this step (see `train_step`).
    pub(crate) fresh: Arc<Mutex<Vec<bool>>>,
    /// Nanoseconds spent in the collective's gathers and reduce-scatters,
    /// as this side sees them (the transport's own work and any layers
    /// between, such as colo-py's call into Python).
    pub(crate) spent_ns: Arc<AtomicU64>,
    /// Bytes sent and received in this peer's gathers (see [`Traffic`]).
    pub(crate) gathered: Arc<[AtomicU64; 2]>,
}

impl Clone for Shards {
    fn clone(&self) -> Self {
        let shallow = |ts: &[Tensor]| ts.iter().map(Tensor::shallow_clone).collect();
        Shards {
            pool: self.pool.clone(),
            peers: self.peers.clone(),
            units: self.units.clone(),
            world: self.world,
            rank: self.rank,
            params: shallow(&self.params),
            grads: shallow(&self.grads),
            fresh: self.fresh.clone(),
            spent_ns: self.spent_ns.clone(),
            gathered: self.gathered.clone(),
        }
    }
}

impl Shards {
    /// Gathers unit `u` and points its parameters (`full`, the trainer's
    /// parameter handles) at the gathered weights.
    pub(crate) fn gather(&self, u: usize, full: &[Tensor]) -> Result<()> {
        let unit = &self.units[u];
        let shard = &self.params[u];
        let guard = self.pool.region(tags::GATHERED_PARAMS)?;
        let buf = Tensor::f_empty([unit.padded], (shard.kind(), shard.device()));
        guard.finish()?;
        let buf = buf?;
        self.timed(|| lock(&self.peers)?.all_gather(shard, &buf))?;
        // Counted from the buffers the transport was handed: this peer's
        // shard went to each of the others, the rest of `buf` came in.
        let elt = shard.kind().elt_size_in_bytes() as u64;
        // (Counters: saturating, not checked, as they only report.)
        let bytes = |t: &Tensor| (t.numel() as u64).saturating_mul(elt);
        let (mine, all) = (bytes(shard), bytes(&buf));
        let [sent, received] = &*self.gathered;
        let others = (self.world as u64).saturating_sub(1);
        sent.fetch_add(mine.saturating_mul(others), Ordering::Relaxed);
        received.fetch_add(all.saturating_sub(mine), Ordering::Relaxed);
        let _no_grad = tch::no_grad_guard();
        for ((&i, &at), shape) in unit.params.iter().zip(&unit.offsets).zip(&unit.shapes) {
            let mut p = full[i].shallow_clone();
            done(p.f_set_source_tensor_storage_offset_(
                &buf,
                at,
                shape.as_slice(),
                strides(shape),
            ))?;
        }
        Ok(())
    }

    /// Runs a collective call, adding its time to `spent_ns`.
    fn timed(&self, call: impl FnOnce() -> Result<()>) -> Result<()> {
        let t = Instant::now();
        let out = call();
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.spent_ns.fetch_add(ns, Ordering::Relaxed);
        out
    }

    /// The bytes this peer's gathers have sent and received since the
    /// trainer was built.
    pub(crate) fn gathered(&self) -> Traffic {
        let [sent, received] = &*self.gathered;
        Traffic {
            sent: sent.load(Ordering::Relaxed),
            received: received.load(Ordering::Relaxed),
        }
    }

    /// Lets unit `u`'s gathered weights go: its parameters become empty.
    pub(crate) fn release(&self, u: usize, full: &[Tensor]) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        for &i in &self.units[u].params {
            done(full[i].shallow_clone().f_set_())?;
        }
        Ok(())
    }

    /// Reduce-scatters unit `u`'s gradients `grads` (in the unit's order;
    /// undefined: zero) and adds this peer's part into its accumulator.
    pub(crate) fn reduce(&self, u: usize, grads: &[Tensor]) -> Result<()> {
        let unit = &self.units[u];
        let acc = &self.grads[u];
        let full = {
            let _no_grad = tch::no_grad_guard();
            let parts: Vec<Tensor> = (grads.iter().zip(&unit.shapes))
                .map(|(g, shape)| match g.defined() {
                    true => g.shallow_clone(),
                    false => Tensor::zeros(shape.as_slice(), (Kind::Float, acc.device())),
                })
                .collect();
            flatten(&parts, unit.padded, Kind::Float)?
        };
        let mine = Tensor::f_empty([unit.shard_len(self.world)], (Kind::Float, acc.device()))?;
        self.timed(|| lock(&self.peers)?.reduce_scatter(&full, &mine))?;
        let mut fresh = self.fresh.lock().map_err(|_| Error::Unsupported {
            what: "sharded gradients",
            found: "a previous accumulation panicked".into(),
        })?;
        let _no_grad = tch::no_grad_guard();
        match std::mem::replace(&mut fresh[u], false) {
            true => Ok(acc.shallow_clone().f_copy_(&mine)?),
            false => done(acc.shallow_clone().f_add_(&mine)),
        }
    }

    /// Reduce-scatters zeros for unit `u`: a peer with nothing to add in
    /// a micro-batch still takes part, and keeps its share of the sum.
    pub(crate) fn reduce_nothing(&self, u: usize) -> Result<()> {
        let none: Vec<Tensor> = self.units[u].params.iter().map(|_| Tensor::new()).collect();
        self.reduce(u, &none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_split_root_and_layers_and_pad_to_the_world() {
        let names: Vec<String> = [
            "model.embed_tokens.weight",
            "model.layers.0.a",
            "model.layers.0.b",
            "model.layers.1.a",
            "model.norm.weight",
            "v_head.weight",
        ]
        .map(String::from)
        .to_vec();
        let shapes = vec![
            vec![5, 2],
            vec![3],
            vec![2, 2],
            vec![4],
            vec![2],
            vec![1, 2],
        ];
        let u = units(&names, &shapes, 2, 4);
        assert_eq!(u.len(), 3);
        assert_eq!(u[0].params, [0, 4, 5]);
        assert_eq!(u[0].offsets, [0, 10, 12]);
        assert_eq!(u[0].padded, 16); // 14 → a multiple of 4
        assert_eq!(u[1].params, [1, 2]);
        assert_eq!(u[1].offsets, [0, 3]);
        assert_eq!(u[1].padded, 8); // 7
        assert_eq!((u[2].padded, u[2].shard_len(4)), (4, 1));
        assert_eq!(strides(&[2, 3, 4]), [12, 4, 1]);
        let flat = flatten(
            &[
                Tensor::ones([2, 2], tch::kind::FLOAT_CPU),
                Tensor::ones([1], tch::kind::FLOAT_CPU),
            ],
            8,
            Kind::BFloat16,
        )
        .unwrap();
        assert_eq!(flat.size(), [8]);
        assert_eq!(flat.kind(), Kind::BFloat16);
        assert_eq!(flat.sum(Kind::Double).double_value(&[]), 5.0);
    }
}
