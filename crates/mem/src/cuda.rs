//! The CUDA backend (feature `cuda`): the driver's virtual-memory API,
//! through `cudarc`'s raw bindings with the driver loaded at run time, so
//! this builds (and CI checks it) on machines without CUDA.
//!
//! Layers, as in cudarc: `cudarc::driver::sys` holds the raw calls; `check`
//! turns each call's status into a `Result`; `CudaBackend` is the safe type,
//! which retains the device's primary context and makes it current on
//! whichever thread calls in (pool operations may run on any thread).
//!
//! | Backend       | driver call                                              |
//! |---------------|----------------------------------------------------------|
//! | `granularity` | `cuMemGetAllocationGranularity` (minimum)                |
//! | `reserve`     | `cuMemAddressReserve`                                    |
//! | `create`      | `cuMemCreate` (pinned device memory)                     |
//! | `map`         | `cuMemMap` + `cuMemSetAccess` (read-write, this device)  |
//! | `unmap`       | `cuMemUnmap`                                             |
//! | `release`     | `cuMemRelease`                                           |
//! | copies        | `cuMemcpyDtoH_v2` / `cuMemcpyHtoD_v2` (synchronous)      |

use crate::backend::{Backend, DevicePtr, PhysHandle};
use crate::{Error, Result};
use cudarc::driver::sys;

const NAME: &str = "cuda";

/// Turns a driver status into a `Result` naming the call.
fn check(call: &'static str, status: sys::CUresult) -> Result<()> {
    if status == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or
    // leaves it null; both are handled.
    let msg = unsafe {
        if sys::cuGetErrorString(status, &mut text) == sys::CUresult::CUDA_SUCCESS
            && !text.is_null()
        {
            std::ffi::CStr::from_ptr(text)
                .to_string_lossy()
                .into_owned()
        } else {
            format!("{status:?}")
        }
    };
    Err(Error::Backend {
        backend: NAME,
        call,
        msg,
    })
}

/// Free and total memory of the current context's device, as the driver
/// reports them (`cuMemGetInfo`): what the GPU checks compare before and
/// after a pause.
pub fn mem_get_info() -> Result<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two valid out-parameters; a context is current on this thread
    // once any CudaBackend or libtorch has used the device.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free as u64, total as u64))
}

/// Why the CUDA backend cannot run here, or `None` if a driver and a device
/// are present. Tests use this to print why they were skipped.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { sys::is_culib_present() } {
        return Some("no CUDA driver library (libcuda.so) could be loaded".into());
    }
    // SAFETY: the library is present; cuInit and cuDeviceGetCount only
    // write to the out-parameter.
    let count = unsafe {
        if let Err(e) = check("cuInit", sys::cuInit(0)) {
            return Some(e.to_string());
        }
        let mut n = 0;
        if let Err(e) = check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n)) {
            return Some(e.to_string());
        }
        n
    };
    (count == 0).then(|| "the CUDA driver reports no device".into())
}

/// Device memory of one CUDA device through the virtual-memory API.
pub struct CudaBackend {
    ordinal: i32,
    ctx: sys::CUcontext,
    gran: usize,
}

// SAFETY: a CUcontext handle may be used from any thread once made current
// there, which every method does first.
unsafe impl Send for CudaBackend {}
// SAFETY: as above; the driver API is thread-safe.
unsafe impl Sync for CudaBackend {}

impl CudaBackend {
    /// Opens device `ordinal` (retaining its primary context).
    pub fn new(ordinal: i32) -> Result<Self> {
        if let Some(reason) = unavailable_reason() {
            return Err(Error::Backend {
                backend: NAME,
                call: "load driver",
                msg: reason,
            });
        }
        let mut dev = 0;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: out-parameters are valid; the driver is initialised by
        // `unavailable_reason`.
        unsafe {
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
        }
        let mut backend = CudaBackend {
            ordinal,
            ctx,
            gran: 0,
        };
        backend.make_current()?;
        let prop = backend.prop();
        let mut gran = 0usize;
        // SAFETY: `prop` is a valid property struct and `gran` a valid out
        // parameter.
        unsafe {
            check(
                "cuMemGetAllocationGranularity",
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
            )?;
        }
        backend.gran = gran;
        Ok(backend)
    }

    fn make_current(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    fn location(&self) -> sys::CUmemLocation {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ordinal,
        }
    }

    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is the documented
        // default of every field we do not set.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = self.location();
        prop
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let mut dev = 0;
        // SAFETY: releases the primary context retained in `new`.
        unsafe {
            if sys::cuDeviceGet(&mut dev, self.ordinal) == sys::CUresult::CUDA_SUCCESS {
                let _ = sys::cuDevicePrimaryCtxRelease_v2(dev);
            }
        }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cuda_device(&self) -> Option<i32> {
        Some(self.ordinal)
    }

    fn granularity(&self) -> usize {
        self.gran
    }

    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        self.make_current()?;
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-parameter; no address hint.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, size, self.gran, 0, 0)
        })?;
        Ok(ptr)
    }

    unsafe fn free_reserved(&self, addr: DevicePtr, size: usize) -> Result<()> {
        self.make_current()?;
        // SAFETY: the caller guarantees the range came from `reserve` and
        // holds no mapping.
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(addr, size)
        })
    }

    fn create(&self, size: usize) -> Result<PhysHandle> {
        self.make_current()?;
        let prop = self.prop();
        let mut handle = 0;
        // SAFETY: valid property struct and out-parameter.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        Ok(PhysHandle(vec![handle]))
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: the handle came from `cuMemCreate` and is consumed here.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle.0[0]) })
    }

    unsafe fn map(&self, addr: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        self.make_current()?;
        let access = sys::CUmemAccessDesc {
            location: self.location(),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the caller guarantees the range is reserved by us and
        // free; the handle is live and at least `size` bytes.
        let mapped = unsafe {
            check("cuMemMap", sys::cuMemMap(addr, size, 0, handle.0[0], 0)).and_then(|()| {
                check(
                    "cuMemSetAccess",
                    sys::cuMemSetAccess(addr, size, &access, 1),
                )
                .inspect_err(|_| {
                    let _ = sys::cuMemUnmap(addr, size);
                })
            })
        };
        // The mapping keeps the memory alive; `cuMemUnmap` gives it back.
        let released = self.release(handle);
        mapped.and(released)
    }

    unsafe fn unmap(&self, addr: DevicePtr, size: usize) -> Result<()> {
        self.make_current()?;
        // Work queued on a stream may still read the range: libtorch's
        // pluggable free does not synchronise as cudaFree does, and
        // torch_memory_saver synchronises before its unmaps too.
        // SAFETY: no arguments; waits for the current context's work.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })?;
        // SAFETY: the caller guarantees the range is our mapping and unused.
        check("cuMemUnmap", unsafe { sys::cuMemUnmap(addr, size) })
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        self.make_current()?;
        // SAFETY: the caller guarantees the device range is mapped; `dst`
        // is a valid host buffer of that length.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    unsafe fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        self.make_current()?;
        // SAFETY: as above, in the other direction.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, Pool, PoolConfig};

    /// Skips (with the reason printed) where no CUDA device is present.
    fn backend() -> Option<CudaBackend> {
        if let Some(reason) = unavailable_reason() {
            // Written to the process's stderr directly: libtest captures
            // `eprintln!` of passing tests, and a skip must be visible.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "skipped: CUDA backend test needs a CUDA device: {reason}"
            );
            return None;
        }
        Some(CudaBackend::new(0).expect("CUDA device 0"))
    }

    #[test]
    fn cuda_pause_resume_keeps_address_and_backup() {
        let Some(b) = backend() else { return };
        let pool = Pool::new(Box::new(b), PoolConfig::default()).unwrap();
        pool.set_policy("weights", Policy::Backup).unwrap();
        let n = 64 << 20;
        let w = pool.alloc("weights", n).unwrap();
        let kv = pool.alloc("kv_cache", n).unwrap();
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        pool.write(w, 0, &data).unwrap();
        for _ in 0..3 {
            pool.pause(&["weights", "kv_cache"]).unwrap();
            assert_eq!(pool.stats().resident_bytes, 0);
            pool.resume(&["weights"]).unwrap();
            pool.resume(&["kv_cache"]).unwrap();
        }
        let mut out = vec![0u8; n];
        pool.read(w, 0, &mut out).unwrap();
        assert!(out == data);
        assert_eq!(pool.tag_of(w).as_deref(), Some("weights"));
        pool.free(kv).unwrap();
    }

    #[test]
    fn cuda_capacity_is_enforced() {
        let Some(b) = backend() else { return };
        let g = b.granularity() as u64;
        let pool = Pool::new(Box::new(b), PoolConfig::with_capacity(4 * g)).unwrap();
        pool.alloc("a", 3 * g as usize).unwrap();
        assert!(matches!(
            pool.alloc("b", 2 * g as usize),
            Err(Error::OutOfMemory { .. })
        ));
    }
}
