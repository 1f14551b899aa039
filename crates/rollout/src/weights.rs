//! The engine's weights in the `weights` tag, and `update_weights`.
//!
//! Every parameter's buffer is allocated once inside a `region` of the
//! `weights` tag and then only ever written in place (candle's
//! `slice_set`), so its address is the same for the engine's whole life.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use colo_mem::{tags::WEIGHTS, Pool};
use colo_model::{Model, ModelConfig, Weights};
use serde::Serialize;

use crate::{Error, Result};

/// A zeroed f32 buffer of `len` elements allocated in `tag` of `pool`.
///
/// The region is opened with a threshold of one byte for exactly this one
/// allocation, so even small buffers (norm weights) land in the tag; nothing
/// else is allocated while it is open.
pub(crate) fn pooled_zeros(pool: &Arc<Pool>, tag: &str, len: usize) -> Result<Vec<f32>> {
    let len = len.max(1);
    let guard = pool.region_with_threshold(tag, 1)?;
    let buf = vec![0f32; len];
    guard.finish()?;
    match pool.tag_of(buf.as_ptr() as u64) {
        Some(t) if t == tag => Ok(buf),
        other => Err(Error::Unsupported(format!(
            "a {len}-element buffer meant for tag `{tag}` landed in {other:?}; \
             is colo-mem's global allocator installed?"
        ))),
    }
}

/// Address of the first element of a CPU tensor's data.
pub fn data_address(t: &Tensor) -> Option<u64> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(CpuStorage::F32(v)) => Some(v.as_ptr() as u64 + 4 * l.start_offset() as u64),
        _ => None,
    }
}

/// What one `update_weights` call did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightUpdate {
    pub tensors: usize,
    pub bytes: usize,
    pub buckets: usize,
}

/// The parameters in pool memory, by Hugging Face name.
pub(crate) struct PooledWeights {
    /// In `Model::named_parameters` order.
    names: Vec<String>,
    by_name: HashMap<String, Tensor>,
    /// Names not written since the weights were released without a backup.
    pub stale: BTreeSet<String>,
    pub bytes: usize,
}

impl PooledWeights {
    /// Copies `w` into the `weights` tag and builds the model over the
    /// copies. float32 on the CPU only (the engine's attention kernel).
    pub fn load(pool: &Arc<Pool>, cfg: &ModelConfig, w: &Weights) -> Result<(Model, Self)> {
        let heap = Model::load(cfg, w)?;
        let mut names = Vec::new();
        let mut by_name = HashMap::new();
        let mut bytes = 0;
        for (name, t) in heap.named_parameters() {
            if t.dtype() != DType::F32 || !t.device().is_cpu() {
                return Err(Error::Unsupported(format!(
                    "parameter `{name}` is {:?} on {:?}; the rollout engine runs float32 on the CPU",
                    t.dtype(),
                    t.device()
                )));
            }
            let buf = pooled_zeros(pool, WEIGHTS, t.elem_count())?;
            let dst = Tensor::from_vec(buf, t.shape(), &Device::Cpu)?;
            dst.slice_set(&t.contiguous()?, 0, 0)?;
            bytes += 4 * t.elem_count();
            names.push(name.clone());
            by_name.insert(name, dst);
        }
        let model = Model::load(cfg, &Weights::from_tensors(by_name.clone()))?;
        let pooled = PooledWeights {
            names,
            by_name,
            stale: BTreeSet::new(),
            bytes,
        };
        Ok((model, pooled))
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name)
    }

    /// Every parameter's data address, in model order.
    pub fn addresses(&self) -> Vec<(String, u64)> {
        self.names
            .iter()
            .map(|n| (n.clone(), data_address(&self.by_name[n]).unwrap_or(0)))
            .collect()
    }

    pub fn mark_all_stale(&mut self) {
        self.stale = self.names.iter().cloned().collect();
    }

    /// Checks every tensor first (so a bad call changes nothing), then
    /// converts and copies in buckets of at most `bucket_bytes` (a bucket
    /// bounds the converted temporaries alive at once; a tensor larger than
    /// a bucket is a bucket of its own).
    pub fn update(
        &mut self,
        tensors: &[(String, Tensor)],
        bucket_bytes: usize,
    ) -> Result<WeightUpdate> {
        let mut seen = BTreeSet::new();
        for (name, t) in tensors {
            let dst = self
                .by_name
                .get(name)
                .ok_or_else(|| Error::UnknownTensor { name: name.clone() })?;
            if t.dims() != dst.dims() {
                return Err(Error::ShapeMismatch {
                    name: name.clone(),
                    expected: dst.dims().to_vec(),
                    found: t.dims().to_vec(),
                });
            }
            if !seen.insert(name.as_str()) {
                return Err(Error::Unsupported(format!(
                    "update_weights: tensor `{name}` is given twice"
                )));
            }
        }
        let mut report = WeightUpdate {
            tensors: 0,
            bytes: 0,
            buckets: 0,
        };
        let mut start = 0;
        while start < tensors.len() {
            let mut end = start;
            let mut bucket = 0;
            while end < tensors.len()
                && (end == start || bucket + 4 * tensors[end].1.elem_count() <= bucket_bytes)
            {
                bucket += 4 * tensors[end].1.elem_count();
                end += 1;
            }
            let staged = tensors[start..end]
                .iter()
                .map(|(name, t)| Ok((name, stage(t)?)))
                .collect::<Result<Vec<_>>>()?;
            for (name, src) in staged {
                let dst = &self.by_name[name];
                // The trainer may hand over the engine's own buffers.
                if data_address(&src) != data_address(dst) {
                    dst.slice_set(&src, 0, 0)?;
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

/// The tensor as contiguous float32 on the CPU (a copy only if needed).
fn stage(t: &Tensor) -> Result<Tensor> {
    let t = if t.device().is_cpu() {
        t.clone()
    } else {
        t.to_device(&Device::Cpu)?
    };
    let t = if t.dtype() == DType::F32 {
        t
    } else {
        t.to_dtype(DType::F32)?
    };
    Ok(t.contiguous()?)
}
