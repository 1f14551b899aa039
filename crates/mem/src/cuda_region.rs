//! `region(tag)` on a CUDA pool (feature `cuda`): libtorch's CUDA caching
//! allocator draws the tag's segments from the pool, through one `MemPool`
//! per tag whose pluggable allocator calls back here (`csrc/cuda_alloc.cpp`
//! has the shim and its contract).
//!
//! Differences from the CPU route, all forced by the caching allocator:
//! - the routing is process-wide while a region is open (every thread's
//!   CUDA allocations on the device, so the autograd device thread's
//!   gradients land in the tag), not per thread;
//! - the pool sees segments (2 MiB and more), which the caching allocator
//!   sub-allocates; a pause first returns the tag's cached free segments
//!   (`emptyCache` of its MemPool), so only live tensors' segments are
//!   paused and come back at the same addresses.

use std::ffi::{c_char, c_void, CStr};

use crate::pool::Pool;
use crate::{Error, Result};

mod sys {
    use std::ffi::c_char;
    extern "C" {
        pub fn colo_cuda_region_begin(
            slot: u32,
            tag: u32,
            device: i32,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        pub fn colo_cuda_region_end(
            slot: u32,
            tag: u32,
            device: i32,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        pub fn colo_cuda_empty_tag(
            slot: u32,
            tag: u32,
            device: i32,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

type ShimCall = unsafe extern "C" fn(u32, u32, i32, *mut c_char, usize) -> i32;

/// Calls one of the region shim's entry points.
fn call(what: &'static str, f: ShimCall, slot: usize, tag: usize, device: i32) -> Result<()> {
    // SAFETY: `err` is the writable buffer of `len` bytes `shim_call`
    // passes; the other arguments are plain integers.
    shim_call(what, |err, len| unsafe {
        f(slot as u32, tag as u32, device, err, len)
    })
}

/// Runs a call of the CUDA shim (`csrc/cuda_*.cpp`) that reports failure
/// as nonzero with a message written into the buffer it is given
/// (`csrc/shim_error.h`), and turns its status into a `Result`.
pub(crate) fn shim_call(
    what: &'static str,
    f: impl FnOnce(*mut c_char, usize) -> i32,
) -> Result<()> {
    let mut err = [0 as c_char; 512];
    if f(err.as_mut_ptr(), err.len()) == 0 {
        return Ok(());
    }
    // SAFETY: NUL-terminated by the shim on failure.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(Error::Backend {
        backend: "cuda",
        call: what,
        msg,
    })
}

pub(crate) fn begin(slot: usize, tag: usize, device: i32) -> Result<()> {
    call(
        "beginAllocateToPool",
        sys::colo_cuda_region_begin,
        slot,
        tag,
        device,
    )
}

pub(crate) fn end(slot: usize, tag: usize, device: i32) -> Result<()> {
    call(
        "endAllocateToPool",
        sys::colo_cuda_region_end,
        slot,
        tag,
        device,
    )
}

/// Returns the cached free segments of `tags` to the pool before a pause,
/// except those of tags that hold them (`Pool::hold_cuda_cache`).
pub(crate) fn empty_tags(pool: &Pool, tags: &[&str]) -> Result<()> {
    let (Some(device), Some(&slot)) = (pool.cuda_device(), pool.region_slot.get()) else {
        return Ok(());
    };
    for tag in tags {
        let id = {
            let st = pool.lock();
            st.tag_id(tag)
                .filter(|&id| st.tags[id].cuda_cache_holders == 0)
        };
        if let Some(id) = id {
            call("emptyCache", sys::colo_cuda_empty_tag, slot, id, device)?;
        }
    }
    Ok(())
}

/// Called by the shim when the caching allocator needs a new segment for
/// the MemPool of `tag` in the pool registered at `slot`.
#[no_mangle]
pub extern "C" fn colo_mem_cuda_segment_alloc(slot: u32, tag: u32, bytes: usize) -> *mut c_void {
    std::panic::catch_unwind(|| {
        let pool = crate::region::registered(slot as usize);
        let mut st = pool.lock();
        match pool.alloc_locked(&mut st, tag as usize, bytes) {
            Ok((addr, _)) => Some(addr),
            Err(e) => {
                // libtorch raises its own "CUDA out of memory" for the null
                // below; the reason waits for `Pool::take_device_refusal`.
                if st.device_refusal.is_none() {
                    log::warn!("a CUDA segment refused to libtorch: {e}");
                    st.device_refusal = Some(e);
                }
                None
            }
        }
    })
    .ok()
    .flatten()
    .map_or(std::ptr::null_mut(), |a| a as *mut c_void)
}

/// Called by the shim when the caching allocator returns a segment.
#[no_mangle]
pub extern "C" fn colo_mem_cuda_segment_free(ptr: *mut c_void) {
    if !crate::region::colo_mem_region_free(ptr) {
        log::error!("a CUDA segment at {ptr:?} is not in any pool; not freed");
    }
}
