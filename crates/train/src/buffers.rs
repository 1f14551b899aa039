//! float32 buffers in tagged memory, and direct access to a tensor's
//! storage for the in-place updates of the optimizer.
//!
//! Parameters, gradient accumulators and optimizer moments are `Vec<f32>`s
//! allocated inside `pool.region_with_threshold(tag, 1)` with nothing else
//! allocated while the region is open, so each buffer is exactly one pool
//! allocation of its tag and no tensor header or other bookkeeping ends up
//! in memory that a pause unmaps. The vector is then moved (not copied)
//! into a candle tensor.
//!
//! Updates go through [`write_f32`], which mutates the tensor's own storage
//! (a candle in-place op), so a buffer never moves to another allocation
//! and never leaves its tag.

use std::cell::RefCell;
use std::sync::Arc;

use candle_core::{CpuStorage, InplaceOp1, Layout, Shape, Storage, Tensor, Var};
use colo_mem::Pool;

use crate::{Error, Result};

/// A buffer holding a copy of `data` (or zeros), allocated in `tag`.
pub(crate) fn alloc_in(
    pool: &Arc<Pool>,
    tag: &str,
    n: usize,
    data: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let guard = pool.region_with_threshold(tag, 1)?;
    let buf = match data {
        Some(d) => {
            let mut v = Vec::with_capacity(n);
            v.extend_from_slice(d);
            v
        }
        None => vec![0f32; n],
    };
    guard.finish()?;
    Ok(buf)
}

/// A zero tensor of `shape` whose storage is one allocation in `tag`.
pub(crate) fn zeros_in(pool: &Arc<Pool>, tag: &str, shape: &Shape) -> Result<Tensor> {
    let buf = alloc_in(pool, tag, shape.elem_count(), None)?;
    Ok(Tensor::from_vec(buf, shape, &candle_core::Device::Cpu)?)
}

/// A trainable copy of `t` whose storage is one allocation in `tag`.
pub(crate) fn var_in(pool: &Arc<Pool>, tag: &str, t: &Tensor) -> Result<Var> {
    check_cpu_f32("parameter", t)?;
    let data = t.flatten_all()?.to_vec1::<f32>()?;
    let buf = alloc_in(pool, tag, data.len(), Some(&data))?;
    Ok(Var::from_vec(buf, t.shape(), &candle_core::Device::Cpu)?)
}

pub(crate) fn check_cpu_f32(what: &'static str, t: &Tensor) -> Result<()> {
    if !t.device().is_cpu() {
        return Err(Error::Unsupported {
            what,
            found: format!("device {:?}", t.device().location()),
        });
    }
    if t.dtype() != candle_core::DType::F32 {
        return Err(Error::Unsupported {
            what,
            found: format!("dtype {:?}", t.dtype()),
        });
    }
    Ok(())
}

/// The slice a contiguous float32 CPU layout covers.
fn span(l: &Layout, op: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: tensor must be contiguous")))
}

/// Calls `f` with the float32 contents of a contiguous CPU tensor, without
/// copying.
pub(crate) fn read_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let (start, end) = span(layout, "read_f32")?;
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => Ok(f(&v[start..end])),
        _ => Err(Error::Unsupported {
            what: "tensor",
            found: format!("{:?} on {:?}", t.dtype(), t.device().location()),
        }),
    }
}

/// The address of a CPU tensor's storage (the allocation's start), for
/// checking which pool tag holds it.
pub fn storage_addr(t: &Tensor) -> Result<u64> {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => Ok(v.as_ptr() as u64),
        _ => Err(Error::Unsupported {
            what: "tensor",
            found: format!("{:?} on {:?}", t.dtype(), t.device().location()),
        }),
    }
}

/// An in-place op that hands the destination slice to a closure.
struct WithMut<F, R> {
    f: RefCell<Option<F>>,
    out: RefCell<Option<R>>,
}

impl<F: FnOnce(&mut [f32]) -> R, R> InplaceOp1 for WithMut<F, R> {
    fn name(&self) -> &'static str {
        "colo-train-write"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (start, end) = span(layout, "write_f32")?;
        let CpuStorage::F32(v) = storage else {
            candle_core::bail!("write_f32: tensor is not float32");
        };
        let f = self.f.borrow_mut().take().expect("called once");
        *self.out.borrow_mut() = Some(f(&mut v[start..end]));
        Ok(())
    }
}

/// Calls `f` with the float32 contents of a contiguous CPU tensor, mutably
/// and in place: the storage (and so its allocation and tag) is unchanged.
/// Any tensor sharing the storage (a model's view of a `Var`) sees the
/// writes.
pub(crate) fn write_f32<R>(t: &Tensor, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
    let op = WithMut {
        f: RefCell::new(Some(f)),
        out: RefCell::new(None),
    };
    t.inplace_op1(&op)?;
    let out = op.out.into_inner();
    out.ok_or_else(|| Error::Unsupported {
        what: "tensor",
        found: format!("{:?} on {:?}", t.dtype(), t.device().location()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use colo_mem::PoolConfig;

    #[test]
    fn buffers_are_single_allocations_of_their_tag_and_writes_stay_put() {
        let pool = Pool::host(PoolConfig::default()).unwrap();
        let src = Tensor::arange(0f32, 8.0, &candle_core::Device::Cpu)
            .unwrap()
            .reshape((2, 4))
            .unwrap();
        let v = var_in(&pool, "p", &src).unwrap();
        let addr = storage_addr(v.as_tensor()).unwrap();
        assert_eq!(pool.tag_of(addr).as_deref(), Some("p"));
        assert_eq!(pool.stats().tag("p").unwrap().allocations, 1);
        let view = v.as_tensor().clone();
        write_f32(v.as_tensor(), |s| s.iter_mut().for_each(|x| *x *= 2.0)).unwrap();
        assert_eq!(storage_addr(v.as_tensor()).unwrap(), addr);
        assert_eq!(
            view.to_vec2::<f32>().unwrap()[1],
            vec![8.0, 10.0, 12.0, 14.0]
        );
        let sum = read_f32(&view, |s| s.iter().sum::<f32>()).unwrap();
        assert_eq!(sum, 56.0);
        let z = zeros_in(&pool, "g", src.shape()).unwrap();
        assert_eq!(pool.tag_of(storage_addr(&z).unwrap()).as_deref(), Some("g"));
    }
}
