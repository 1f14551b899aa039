//! # colo-mem: pausable, tagged device memory that keeps its addresses
//!
//! The memory layer of colo. Training and generation share one device by
//! releasing each other's memory in turn: the rollout engine's weights and
//! KV cache while the trainer runs, the trainer's parameters, gradients and
//! optimizer state while the engine generates. colo-mem makes that release
//! cheap and safe:
//!
//! - **Same address.** `pause(tags)` returns the physical memory of every
//!   allocation under those tags and keeps their virtual addresses reserved;
//!   `resume(tags)` maps fresh memory at the same addresses. Pointers held
//!   anywhere (a CUDA graph, a tensor) stay valid.
//! - **By tag, in stages.** Each tag is paused and resumed on its own, which
//!   is what multi-stage awake needs: weights first, then the trainer's copy
//!   freed, then the KV cache.
//! - **Content policy per tag.** `Policy::Discard` forgets contents;
//!   `Policy::Overwrite` forgets them too but populates the pages on resume,
//!   for memory the caller rewrites at once (the rollout engine's weights);
//!   `Policy::Backup` copies them to a host buffer that is kept and reused by
//!   later cycles, and restores them bit-exactly.
//! - **A capacity.** Every map is checked against the device capacity; an
//!   out-of-memory names the phase, the request and the resident bytes per
//!   tag, and a resume that fails part way undoes itself.
//! - **Accounted.** Statistics per tag and a timeline of every transition
//!   with the caller's phase label (`set_phase`), exportable as JSON lines.
//! - **Beneath libtorch.** `pool.region(tag)` routes the tensors libtorch
//!   allocates on the current thread into the tag: colo-mem's C++ shim is
//!   libtorch's CPU allocator. Tensor memory made outside any region is
//!   counted as untagged ([`untagged`]).
//!
//! ```
//! use colo_mem::{Pool, PoolConfig, Policy};
//!
//! let pool = Pool::host(PoolConfig::with_capacity(64 << 20))?;
//! pool.set_policy("weights", Policy::Backup)?;
//! let w = pool.alloc("weights", 1 << 20)?;
//! pool.write(w, 0, b"hello")?;
//! let kv = pool.alloc("kv_cache", 4 << 20)?;
//!
//! pool.pause(&["weights", "kv_cache"])?; // resident bytes drop to zero
//! assert_eq!(pool.stats().resident_bytes, 0);
//! pool.resume(&["weights"])?;            // stage 1: weights come back
//! pool.resume(&["kv_cache"])?;           // stage 2: the KV cache
//!
//! let mut buf = [0u8; 5];
//! pool.read(w, 0, &mut buf)?;
//! assert_eq!(&buf, b"hello");            // restored from the kept backup
//! # pool.free(kv)?;
//! # Ok::<(), colo_mem::Error>(())
//! ```
//!
//! ## Backends
//!
//! A pool drives a [`Backend`], a trait shaped like CUDA's virtual-memory
//! API. [`HostBackend`] (the default) maps anonymous memory (huge pages
//! where the kernel allows) into a `PROT_NONE` reservation, so pausing
//! really lowers the process's resident set size and touching paused
//! memory faults; every claim can be checked on a CPU-only
//! machine with [`os`]. The CUDA backend (feature `cuda`) drives
//! `cuMemCreate`/`cuMemMap` through a dynamically loaded driver.
//!
//! ## Design decisions
//!
//! - One address range is reserved per pool up front, so "is this pointer
//!   ours" is a range check and "which allocation" a map lookup.
//! - Physical handles are released right after mapping (the mapping keeps
//!   the memory alive), so a pool holds no handle or file descriptor per
//!   allocation and leaves the process's limits alone.
//! - Freed blocks stay mapped in a per-tag cache for reuse (a map costs page
//!   provisioning); `empty_cache`, `pause` and a capacity shortfall return
//!   them.
//! - No lock is held across bulk copies: transitions move tags through
//!   `Pausing`/`Resuming` states, which other threads see as errors.
//! - Misuse is an [`Error`] naming the tag and its state, never a panic or
//!   an exit. What cannot be returned (a failed unmap of memory being given
//!   back, a free inside libtorch's deallocator) is logged through `log`,
//!   never printed: the program decides where it goes.
//! - `unsafe` lives in this crate and colo-kernels (the compute kernels),
//!   the workspace's two FFI crates, each block with a `// SAFETY:` note.

mod backend;
mod chunks;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_region;
mod error;
pub mod graph;
mod host;
pub mod os;
mod pool;
mod region;
mod stats;
pub mod tags;
pub mod timeline;
pub mod torch;
mod transition;
mod va;

pub use backend::{Backend, DevicePtr, PhysHandle};
pub use error::{Error, Result, TagBytes, TagState};
pub use host::HostBackend;
pub use pool::{Allocation, Policy, Pool, PoolConfig};
pub use region::{RegionGuard, MAX_REGION_POOLS};
pub use stats::{PoolStats, TagStats};
pub use timeline::{read_jsonl as read_timeline, write_jsonl as timeline_jsonl, Event, EventKind};
pub use torch::{untagged, Untagged};

/// Bytes in human units, for messages: `1.5 GiB`, `12.0 MiB`, `512 B`
/// (binary units, one decimal; the `bytesize` crate's IEC format).
pub fn fmt_bytes(b: u64) -> String {
    bytesize::ByteSize::b(b).display().iec().to_string()
}

#[cfg(test)]
mod fmt_tests {
    use super::fmt_bytes;

    #[test]
    fn fmt_bytes_in_binary_units() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1024), "1.0 KiB");
        assert_eq!(fmt_bytes(12 << 20), "12.0 MiB");
        assert_eq!(fmt_bytes(3 << 29), "1.5 GiB");
        assert_eq!(fmt_bytes(u64::MAX), "16.0 EiB");
    }
}
