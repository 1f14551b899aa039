//! CUDA graphs: capture the kernels a piece of work queues once, launch
//! them all again with one call (`csrc/cuda_graph.cpp` has the shim and its
//! contract). The rollout engine replays its decode steps this way: a small
//! model's step on a GPU is bound by launching its few hundred kernels, not
//! by running them.
//!
//! A graph reads and writes the addresses it was captured with, so what it
//! touches must stay where it is: the inputs are copied into fixed buffers
//! before a replay, and memory allocated during the capture should be made
//! inside a region of a tag whose libtorch cache is held
//! ([`crate::Pool::hold_cuda_cache`]): pausing that tag then releases the
//! graph's memory and resuming it brings it back at the same addresses, so
//! the graph stays valid.
//!
//! Built without the `cuda` feature, capturing is an error and
//! [`available`] is false.

use crate::Result;

/// Whether this build can capture CUDA graphs.
pub fn available() -> bool {
    cfg!(feature = "cuda")
}

#[cfg(not(feature = "cuda"))]
fn unavailable() -> crate::Error {
    crate::Error::Backend {
        backend: "cuda",
        call: "CUDAGraph",
        msg: "colo was built without the cuda feature".into(),
    }
}

/// A captured CUDA graph, replayed on the thread's current stream.
pub struct CudaGraph {
    #[cfg(feature = "cuda")]
    raw: std::ptr::NonNull<std::ffi::c_void>,
}

#[cfg(feature = "cuda")]
mod sys {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub fn colo_cuda_side_stream(device: i32, enter: i32, err: *mut c_char, len: usize) -> i32;
        pub fn colo_cuda_graph_new(err: *mut c_char, len: usize) -> *mut c_void;
        pub fn colo_cuda_graph_free(graph: *mut c_void);
        pub fn colo_cuda_graph_begin(graph: *mut c_void, err: *mut c_char, len: usize) -> i32;
        pub fn colo_cuda_graph_end(graph: *mut c_void, err: *mut c_char, len: usize) -> i32;
        pub fn colo_cuda_graph_replay(graph: *mut c_void, err: *mut c_char, len: usize) -> i32;
    }
}

#[cfg(feature = "cuda")]
use crate::cuda_region::shim_call as call;

/// Runs `f` with `device`'s side stream (the one graphs are captured on)
/// current on this thread: the warm-up before a capture, whose cached
/// blocks the capture then reuses. The side stream first waits for the
/// work queued before, and the previous stream waits for `f`'s work after.
pub fn on_side_stream<T>(device: i32, f: impl FnOnce() -> T) -> Result<T> {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: `err` is the shim's writable buffer of `len` bytes; the
        // rest are plain integers.
        call("set stream", |err, len| unsafe {
            sys::colo_cuda_side_stream(device, 1, err, len)
        })?;
        let out = f();
        // SAFETY: as above; pairs with the enter just made on this thread.
        call("set stream", |err, len| unsafe {
            sys::colo_cuda_side_stream(device, 0, err, len)
        })?;
        Ok(out)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (device, f);
        Err(unavailable())
    }
}

impl CudaGraph {
    /// Captures the CUDA work `f` queues on this thread (on `device`'s side
    /// stream) into a graph, and returns it with `f`'s result. Whatever `f`
    /// returns, the capture is ended; a capture that CUDA refused (an
    /// operation that may not be captured, such as reading a tensor on the
    /// host) is an error.
    pub fn capture<T>(device: i32, f: impl FnOnce() -> T) -> Result<(CudaGraph, T)> {
        #[cfg(feature = "cuda")]
        {
            on_side_stream(device, || {
                let mut raw = std::ptr::null_mut();
                call("CUDAGraph", |err, len| {
                    // SAFETY: `err` is the shim's writable buffer; the graph
                    // is a fresh heap object owned by the returned value.
                    raw = unsafe { sys::colo_cuda_graph_new(err, len) };
                    i32::from(raw.is_null())
                })?;
                let graph = CudaGraph {
                    raw: std::ptr::NonNull::new(raw).expect("checked above"),
                };
                // SAFETY: `graph.raw` is a live CUDAGraph; `err` as above.
                call("capture_begin", |err, len| unsafe {
                    sys::colo_cuda_graph_begin(graph.raw.as_ptr(), err, len)
                })?;
                let out = f();
                // SAFETY: as above; ends the capture begun on this thread.
                call("capture_end", |err, len| unsafe {
                    sys::colo_cuda_graph_end(graph.raw.as_ptr(), err, len)
                })?;
                Ok((graph, out))
            })?
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (device, f);
            Err(unavailable())
        }
    }

    /// Launches the captured work on the current stream.
    pub fn replay(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            // SAFETY: `self.raw` is a live, captured CUDAGraph; `err` as
            // above.
            call("replay", |err, len| unsafe {
                sys::colo_cuda_graph_replay(self.raw.as_ptr(), err, len)
            })
        }
        #[cfg(not(feature = "cuda"))]
        Err(unavailable())
    }
}

#[cfg(feature = "cuda")]
impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `colo_cuda_graph_new` and is freed once.
        unsafe { sys::colo_cuda_graph_free(self.raw.as_ptr()) }
    }
}

// SAFETY: a CUDAGraph is a plain heap object with no thread affinity: it is
// replayed on whichever thread's current stream calls it, and `&self` only
// replays (the caller orders replays on its stream).
#[cfg(feature = "cuda")]
unsafe impl Send for CudaGraph {}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    /// Without the `cuda` feature, capturing and switching streams are
    /// errors that say why, and the closure never runs.
    #[test]
    fn without_cuda_graphs_are_refused_by_name() {
        assert!(!super::available());
        let mut ran = false;
        let err = super::CudaGraph::capture(0, || ran = true).err().unwrap();
        assert!(err.to_string().contains("cuda feature"), "{err}");
        assert!(super::on_side_stream(0, || ran = true).is_err());
        assert!(!ran);
    }
}
