//! The engine's weights in the `weights` tag, and `update_weights`.
//!
//! Every parameter's buffer is allocated once inside a `region` of the
//! `weights` tag and then only ever written in place (`copy_` under
//! `no_grad`), so its address is the same for the engine's whole life.
//! A layer's q/k/v and gate/up parameters are row blocks of one buffer
//! each, which the model's fused projections read
//! ([`colo_model::fused`]).
//!
//! With tensor parallelism the buffers hold this rank's slices
//! ([`Shard`]); loading and updates still take full tensors by name and
//! copy the rank's part.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use colo_mem::{tags::WEIGHTS, Pool};
use colo_model::{Model, Weights};
use serde::Serialize;
use tch::{TchError, Tensor};

use crate::tensor_parallel::{Shard, Slice};
use crate::{Error, Result};

/// Makes one tensor with `make` inside a region of `tag` of `pool` and
/// checks that it landed there.
///
/// The region has a threshold of one byte and is open for exactly this one
/// allocation, so even small tensors (norm weights) land in the tag and
/// nothing else does.
pub(crate) fn pooled(
    pool: &Arc<Pool>,
    tag: &str,
    make: impl FnOnce() -> std::result::Result<Tensor, TchError>,
) -> Result<Tensor> {
    let guard = pool.region_with_threshold(tag, 1)?;
    let made = make();
    guard.finish()?;
    let t = made?;
    match pool.tag_of(data_address(&t)) {
        Some(found) if found == tag => Ok(t),
        other => Err(Error::Unsupported(format!(
            "a tensor {:?} of {:?} on {:?} meant for tag `{tag}` was allocated outside it \
             (in {other:?}): colo-mem routes this device's allocations only where its \
             allocator is installed",
            t.size(),
            t.kind(),
            t.device()
        ))),
    }
}

/// Address of a tensor's first element.
pub fn data_address(t: &Tensor) -> u64 {
    t.data_ptr() as u64
}

/// What one `update_weights` call did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightUpdate {
    pub tensors: usize,
    pub bytes: usize,
    pub buckets: usize,
}

/// The parameters in pool memory (this rank's slices), by Hugging Face
/// name.
pub(crate) struct PooledWeights {
    /// In `Model::named_parameters` order.
    names: Vec<String>,
    by_name: HashMap<String, Tensor>,
    /// Each parameter's full shape, what `update` takes.
    full_shapes: HashMap<String, Vec<i64>>,
    /// Which slice of each full tensor this rank holds.
    pub shard: Shard,
    /// Names not written since the weights were released without a backup.
    pub stale: BTreeSet<String>,
    pub bytes: usize,
    /// Of `bytes`, the parameters held whole on every rank.
    pub replicated_bytes: usize,
    /// LoRA `B`s applied at decode ([`crate::lora`]), by name, with the
    /// scale an update multiplies them by after the copy.
    scaled: HashMap<String, f64>,
}

fn bytes_of(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

fn dims(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

impl PooledWeights {
    /// Copies `shard`'s part of `w` (the full model's weights) into the
    /// `weights` tag (same kind and device) and builds the model of
    /// `shard.local` over the copies, its projections fused
    /// ([`Model::fuse_projections`]): each layer's q/k/v and gate/up
    /// parameters are row blocks of one buffer each, allocated once like
    /// every other parameter.
    pub fn load(pool: &Arc<Pool>, shard: Shard, w: &Weights) -> Result<(Model, Self)> {
        let heap = Model::load(&shard.full, w)?;
        let _no_grad = tch::no_grad_guard();
        let full = heap.named_parameters();
        let full_shapes = full.iter().map(|(n, t)| (n.clone(), t.size())).collect();
        let params = full
            .iter()
            .map(|(n, t)| Ok((n.clone(), shard.take(n, t)?)))
            .collect::<Result<Vec<_>>>()?;
        if let Some((name, t)) = params.iter().find(|(_, t)| !t.is_floating_point()) {
            return Err(Error::Unsupported(format!(
                "parameter `{name}` is {:?}; the rollout engine runs a floating-point model",
                t.kind()
            )));
        }
        let source: HashMap<&str, &Tensor> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let empty = |shape: &[i64], like: &Tensor| {
            pooled(pool, WEIGHTS, || {
                Tensor::f_empty(shape, (like.kind(), like.device()))
            })
        };
        let mut by_name = HashMap::new();
        let mut buffers = HashMap::new();
        for g in colo_model::fused_groups(&shard.local) {
            let buffer = empty(&g.shape(), source[g.parts[0].0.as_str()])?;
            for (name, mut view) in g.views(&buffer)? {
                view.f_copy_(source[name.as_str()])?;
                by_name.insert(name, view);
            }
            buffers.insert(g.name, buffer);
        }
        let mut names = Vec::with_capacity(params.len());
        let (mut bytes, mut replicated_bytes) = (0, 0);
        for (name, t) in &params {
            if !by_name.contains_key(name) {
                let mut dst = empty(&t.size(), t)?;
                dst.f_copy_(t)?;
                by_name.insert(name.clone(), dst);
            }
            let b = bytes_of(&by_name[name]);
            bytes += b;
            if shard.slice_of(name) == Slice::Whole {
                replicated_bytes += b;
            }
            names.push(name.clone());
        }
        drop(source);
        drop((params, full, heap));
        let shared = by_name
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        let mut model = Model::load(&shard.local, &Weights::from_tensors(shared))?;
        model.fuse_projections(&buffers)?;
        // The model must run on the pooled storage itself, or updates would
        // not reach it.
        for (name, t) in model.named_parameters() {
            if data_address(&t) != data_address(&by_name[&name]) {
                return Err(Error::Unsupported(format!(
                    "colo-model copied parameter `{name}` when loading; the engine needs it \
                     to use the pooled tensor"
                )));
            }
        }
        let pooled = PooledWeights {
            names,
            by_name,
            full_shapes,
            shard,
            stale: BTreeSet::new(),
            bytes,
            replicated_bytes,
            scaled: HashMap::new(),
        };
        Ok((model, pooled))
    }

    /// Every parameter's data address, in model order.
    pub fn addresses(&self) -> Vec<(String, u64)> {
        self.names
            .iter()
            .map(|n| (n.clone(), data_address(&self.by_name[n])))
            .collect()
    }

    /// Adds `t` (already in the `weights` tag, held whole) under `name`,
    /// e.g. a LoRA adapter's tensor; updates then write it by that name,
    /// and multiply it by `scale` after the copy when there is one.
    pub fn add(&mut self, name: String, t: Tensor, scale: Option<f64>) {
        let b = bytes_of(&t);
        self.bytes += b;
        self.replicated_bytes += b;
        self.full_shapes.insert(name.clone(), t.size());
        if let Some(s) = scale {
            self.scaled.insert(name.clone(), s);
        }
        self.by_name.insert(name.clone(), t);
        self.names.push(name);
    }

    /// Every weight's name, in the order they were added.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.names.iter()
    }

    pub fn mark_all_stale(&mut self) {
        self.stale = self.names.iter().cloned().collect();
    }

    /// Checks every tensor first (so a bad call changes nothing), then
    /// converts and copies in buckets of at most `bucket_bytes` (bytes of
    /// the engine's kind; a bucket bounds the converted temporaries alive
    /// at once, and a tensor larger than a bucket is a bucket of its own).
    /// The tensors are full ones; each rank converts and copies its slice.
    pub fn update(
        &mut self,
        tensors: &[(String, Tensor)],
        bucket_bytes: usize,
    ) -> Result<WeightUpdate> {
        let mut seen = BTreeSet::new();
        for (name, t) in tensors {
            let full = self
                .full_shapes
                .get(name)
                .ok_or_else(|| Error::UnknownTensor { name: name.clone() })?;
            if &t.size() != full {
                return Err(Error::ShapeMismatch {
                    name: name.clone(),
                    expected: full.iter().map(|&d| d as usize).collect(),
                    found: dims(t),
                });
            }
            if !seen.insert(name.as_str()) {
                return Err(Error::Unsupported(format!(
                    "update_weights: tensor `{name}` is given twice"
                )));
            }
        }
        let _no_grad = tch::no_grad_guard();
        let mut report = WeightUpdate {
            tensors: 0,
            bytes: 0,
            buckets: 0,
        };
        let size = |i: usize| bytes_of(&self.by_name[&tensors[i].0]);
        let mut start = 0;
        while start < tensors.len() {
            let (mut end, mut bucket) = (start, 0);
            while end < tensors.len() && (end == start || bucket + size(end) <= bucket_bytes) {
                bucket += size(end);
                end += 1;
            }
            // Converted to the engine's kind and device first (a no-op when
            // they match), then copied in place.
            let staged = tensors[start..end]
                .iter()
                .map(|(name, t)| {
                    let dst = &self.by_name[name];
                    let part = self.shard.take(name, t)?;
                    Ok((name, part.f_to_device(dst.device())?.f_to_kind(dst.kind())?))
                })
                .collect::<Result<Vec<_>>>()?;
            for (name, src) in staged {
                let mut dst = self.by_name[name].shallow_clone();
                // The trainer may hand over the engine's own buffers: they
                // hold the value already (a scaled one included), so they
                // are neither copied nor scaled again.
                if data_address(&src) != data_address(&dst) {
                    dst.f_copy_(&src)?;
                    if let Some(&scale) = self.scaled.get(name.as_str()) {
                        drop(dst.f_mul_scalar_(scale)?);
                    }
                }
                self.stale.remove(name);
            }
            report.buckets += 1;
            report.tensors += end - start;
            report.bytes += bucket;
            start = end;
        }
        Ok(report)
    }
}
