//! The engine's long-lived tensors: each one allocation in its `colo-mem`
//! tag, made once, then only ever written in place.
//!
//! A buffer is allocated by libtorch inside
//! `pool.region_with_threshold(tag, 1)` with nothing else allocated while
//! the region is open, so its storage is exactly one pool allocation of
//! the tag (the tensor's header is C++ heap memory, not c10's, so nothing
//! that a pause unmaps is bookkeeping). Contents are written afterwards,
//! outside the region, by in-place ops (`copy_`, `zero_`, the optimizer's
//! arithmetic) that keep the storage, so a buffer never moves to another
//! allocation and never leaves its tag.
//!
//! On a CUDA pool the region routes libtorch's caching allocator to the
//! tag's `MemPool`, whose segments are the pool's allocations; a buffer is
//! then a block inside one of the tag's segments (same address and tag for
//! good, but not necessarily an allocation's start).

use std::sync::Arc;

use colo_mem::Pool;
use tch::{Device, Kind, TchError, Tensor};

use crate::Result;

/// The result of an in-place tch op (which returns a second handle to the
/// tensor it wrote), handle dropped.
pub(crate) fn done(r: std::result::Result<Tensor, TchError>) -> Result<()> {
    drop(r?);
    Ok(())
}

/// A zero tensor of `shape` whose storage is one allocation in `tag`.
pub(crate) fn zeros_in(
    pool: &Arc<Pool>,
    tag: &str,
    shape: &[i64],
    kind: Kind,
    device: Device,
) -> Result<Tensor> {
    let guard = pool.region_with_threshold(tag, 1)?;
    let t = Tensor::f_zeros(shape, (kind, device));
    guard.finish()?;
    Ok(t?)
}

/// A copy of `src` (converted to `kind`) whose storage is one allocation
/// in `tag`; a leaf that requires a gradient if `trainable`.
pub(crate) fn copy_in(
    pool: &Arc<Pool>,
    tag: &str,
    src: &Tensor,
    kind: Kind,
    device: Device,
    trainable: bool,
) -> Result<Tensor> {
    let guard = pool.region_with_threshold(tag, 1)?;
    let t = Tensor::f_empty(src.size(), (kind, device));
    guard.finish()?;
    let mut t = t?;
    tch::no_grad(|| t.f_copy_(src))?;
    Ok(match trainable {
        true => t.f_set_requires_grad(true)?,
        false => t,
    })
}

/// The address of a tensor's first element (for a buffer of this module:
/// its allocation's start), for checking which pool tag holds it with
/// `Pool::tag_of`.
pub fn storage_addr(t: &Tensor) -> u64 {
    t.data_ptr() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use colo_mem::PoolConfig;

    #[test]
    fn buffers_are_single_allocations_of_their_tag_and_writes_stay_put() {
        let pool = Pool::host(PoolConfig::default()).unwrap();
        let src = Tensor::arange(8, (Kind::Float, Device::Cpu)).view([2, 4]);
        let v = copy_in(&pool, "p", &src, Kind::Float, Device::Cpu, true).unwrap();
        assert!(v.requires_grad());
        let addr = storage_addr(&v);
        assert_eq!(pool.tag_of(addr).as_deref(), Some("p"));
        assert_eq!(pool.stats().tag("p").unwrap().allocations, 1);
        let view = v.detach();
        done(tch::no_grad(|| v.shallow_clone().f_mul_scalar_(2.0))).unwrap();
        assert_eq!(storage_addr(&v), addr);
        let row = Vec::<f32>::try_from(&view.get(1)).unwrap();
        assert_eq!(row, vec![8.0, 10.0, 12.0, 14.0]);
        assert_eq!(pool.stats().tag("p").unwrap().allocations, 1);
        let z = zeros_in(&pool, "g", &[2, 4], Kind::Float, Device::Cpu).unwrap();
        assert_eq!(pool.tag_of(storage_addr(&z)).as_deref(), Some("g"));
        assert_eq!(z.sum(Kind::Double).double_value(&[]), 0.0);
        let bf = copy_in(&pool, "b", &src, Kind::BFloat16, Device::Cpu, false).unwrap();
        assert_eq!(bf.kind(), Kind::BFloat16);
        assert_eq!(pool.tag_of(storage_addr(&bf)).as_deref(), Some("b"));
    }
}
