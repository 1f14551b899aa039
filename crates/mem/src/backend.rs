//! The `Backend` trait: the shape of CUDA's virtual-memory API.
//!
//! A pool drives a backend through these steps, for each allocation:
//! reserve an address range (once per pool), create physical memory and map
//! it at an address inside the range (the mapping takes the handle: the
//! pool keeps no handle or file descriptor per allocation), populate it,
//! and, when the pool pauses, discard its pages and unmap it (the range
//! stays reserved; the memory goes back with its last mapping).
//!
//! `populate` and `discard` work on parts of a mapping and may run on
//! several threads at once: that is how a pause or resume spreads the
//! kernel's page work (zeroing fresh pages, freeing old ones) over cores
//! together with the copies. Backends whose memory is provided by
//! `create` itself (CUDA) leave both as no-ops.

use crate::Result;

/// An address in a backend's address space (a device pointer for CUDA, a
/// process address for the host backend).
pub type DevicePtr = u64;

/// An opaque handle to physical memory between `create` and `map`: a
/// `CUmemGenericAllocationHandle`; empty on the host backend, whose
/// anonymous memory comes into being when it is mapped.
#[derive(Debug, PartialEq, Eq)]
pub struct PhysHandle(pub(crate) Vec<u64>);

/// Device memory through a virtual-memory API.
///
/// Methods that take addresses are `unsafe`: the backend cannot tell whether
/// an address range belongs to the caller, and mapping over or copying from
/// a range it does not own corrupts memory.
pub trait Backend: Send + Sync {
    /// Short name for messages: `"host"`, `"cuda"`.
    fn name(&self) -> &'static str;

    /// The size and alignment unit of reservations, physical memory and
    /// mappings (`cuMemGetAllocationGranularity`; the page size on the host).
    fn granularity(&self) -> usize;

    /// The CUDA device ordinal whose memory this backend maps, if any:
    /// regions on such a pool route libtorch's CUDA caching allocator
    /// (feature `cuda`) instead of its CPU allocator.
    fn cuda_device(&self) -> Option<i32> {
        None
    }

    /// Whether `copy_to_host`/`copy_from_host` may run on several threads
    /// at once over disjoint ranges (true for the host backend).
    fn parallel_copies(&self) -> bool {
        false
    }

    /// Reserves `size` bytes of address space with nothing behind it
    /// (`cuMemAddressReserve`; `mmap(PROT_NONE)`).
    fn reserve(&self, size: usize) -> Result<DevicePtr>;

    /// Returns a reserved range (`cuMemAddressFree`; `munmap`).
    ///
    /// # Safety
    /// `addr..addr+size` must be a whole range returned by `reserve` of this
    /// backend, with nothing mapped in it that anyone still uses.
    unsafe fn free_reserved(&self, addr: DevicePtr, size: usize) -> Result<()>;

    /// Creates `size` bytes of physical memory (`cuMemCreate`; nothing on the
    /// host, where `map` makes anonymous memory).
    fn create(&self, size: usize) -> Result<PhysHandle>;

    /// Releases a handle that was never mapped (`cuMemRelease`; nothing on
    /// the host).
    fn release(&self, handle: PhysHandle) -> Result<()>;

    /// Maps `handle` read-write at `addr` (`cuMemMap` + `cuMemSetAccess`;
    /// `mmap(MAP_FIXED|MAP_ANONYMOUS)`) and releases the handle: from then on
    /// the mapping alone keeps the memory alive, as CUDA allows
    /// (`cuMemRelease` after `cuMemMap`). On error the handle is released
    /// and nothing stays mapped.
    ///
    /// # Safety
    /// `addr..addr+size` must lie inside a range reserved by this backend,
    /// be granularity-aligned, and hold no mapping anyone still uses.
    unsafe fn map(&self, addr: DevicePtr, size: usize, handle: PhysHandle) -> Result<()>;

    /// Unmaps `addr..addr+size`, leaving it reserved and inaccessible
    /// (`cuMemUnmap`; `mmap(PROT_NONE)` over it), which gives the memory
    /// back. Touching it afterwards faults.
    ///
    /// # Safety
    /// The range must be mapped by `map` of this backend and no one may use
    /// it any more.
    unsafe fn unmap(&self, addr: DevicePtr, size: usize) -> Result<()>;

    /// Provides physical pages for `addr..addr+len` of a mapping now rather
    /// than at first touch (`MADV_POPULATE_WRITE` on the host).
    ///
    /// # Safety
    /// The range must lie inside a mapping made by `map` of this backend.
    unsafe fn populate(&self, _addr: DevicePtr, _len: usize) -> Result<()> {
        Ok(())
    }

    /// Gives the pages behind `addr..addr+len` of a mapping back now, ahead
    /// of `unmap` (`MADV_DONTNEED` on the host's anonymous memory). The
    /// contents of that part are lost.
    ///
    /// # Safety
    /// The range must lie inside a mapping made by `map` of this backend,
    /// and no one may use it any more.
    unsafe fn discard(&self, _addr: DevicePtr, _len: usize) -> Result<()> {
        Ok(())
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`.
    ///
    /// # Safety
    /// `src..src+dst.len()` must be mapped and not written concurrently.
    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;

    /// Copies `src` to device address `dst`.
    ///
    /// # Safety
    /// `dst..dst+src.len()` must be mapped and not accessed concurrently.
    unsafe fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;
}
