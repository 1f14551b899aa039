//! `region(tag)`: tensors libtorch allocates on the current thread go to a
//! pool under a tag — colo's equivalent of torch_memory_saver's
//! `with region(tag)`.
//!
//! How it works: colo-mem's C++ shim (`csrc/cpu_alloc.cpp`) is libtorch's
//! CPU allocator, installed when the binary loads and never removed. Every
//! c10 allocation asks [`colo_mem_region_alloc`] first: while a
//! `RegionGuard` is alive on the thread, allocations of at least the pool's
//! `region_threshold` bytes are made by `Pool::alloc` under the guard's tag;
//! otherwise (null) the shim uses libtorch's default allocator and counts
//! the bytes as untagged ([`untagged`]). Frees are routed by address, on any
//! thread: an address inside a registered pool's reserved range goes back to
//! that pool, anything else to libtorch's default. The check is a range
//! comparison per registered pool, with no lock and no syscall.
//!
//! What stays outside the pool:
//! - tensors smaller than the threshold;
//! - allocations of other threads, including the worker threads libtorch
//!   runs kernels on (OpenMP; e.g. bf16 attention backward makes scratch
//!   buffers there): only the thread that holds the guard is redirected.
//!   They are counted as untagged, not lost from the accounting;
//! - memory libraries below libtorch keep for themselves (MKL and oneDNN
//!   scratch, OpenMP stacks), which never passes through c10;
//! - allocations a pool refuses (tag paused, out of memory). These fall back
//!   to libtorch's default so that the program keeps running; the failure is
//!   recorded and returned by `RegionGuard::finish`, and counted in the
//!   tag's `region_fallback_bytes`.
//!
//! Guards nest and the innermost live one wins, whatever order they are
//! dropped in. A pool that has served a region stays alive for the rest of
//! the process (the registry holds it), because tensors from it may be
//! freed at any later time by any code.

use crate::pool::{Pool, TagId};
use crate::{Error, Result};
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Most pools that can serve regions in one process.
pub const MAX_REGION_POOLS: usize = 64;

static SLOTS: [Slot; MAX_REGION_POOLS] = [const { Slot::EMPTY }; MAX_REGION_POOLS];
static SLOT_COUNT: AtomicUsize = AtomicUsize::new(0);
static REGISTER: Mutex<()> = Mutex::new(());
static NEXT_GUARD: AtomicU64 = AtomicU64::new(1);

struct Slot {
    base: AtomicU64,
    end: AtomicU64,
    pool: AtomicPtr<Pool>,
}

impl Slot {
    // Only used to initialise the static array, where a fresh copy per
    // element is exactly what is wanted.
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        base: AtomicU64::new(0),
        end: AtomicU64::new(0),
        pool: AtomicPtr::new(std::ptr::null_mut()),
    };
}

/// The region active on this thread.
#[derive(Clone, Copy)]
struct Active {
    slot: usize,
    tag: TagId,
    threshold: usize,
    guard: u64,
    /// A host pool's region takes the thread's c10 CPU allocations; a
    /// CUDA pool's takes only CUDA ones (through its MemPool), never the
    /// CPU tensors made inside it (a checkpoint read on the host, a mask
    /// built from a slice), which a device address would crash.
    routes_cpu: bool,
}

thread_local! {
    /// The innermost live region of this thread (the top of `OPEN`), read
    /// on every allocation.
    static ACTIVE: Cell<Option<Active>> = const { Cell::new(None) };
    /// Every live region of this thread, oldest first.
    static OPEN: RefCell<Vec<Active>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn registered(slot: usize) -> &'static Pool {
    // SAFETY: slots below SLOT_COUNT hold a pointer from `Arc::into_raw`
    // that is never released, so the pool lives for the rest of the process.
    unsafe { &*SLOTS[slot].pool.load(Ordering::Acquire) }
}

/// The registered pool whose reserved range holds `addr`.
fn owner(addr: u64) -> Option<&'static Pool> {
    let n = SLOT_COUNT.load(Ordering::Acquire);
    (0..n)
        .find(|&i| {
            addr >= SLOTS[i].base.load(Ordering::Relaxed)
                && addr < SLOTS[i].end.load(Ordering::Relaxed)
        })
        .map(registered)
}

fn register(pool: &Arc<Pool>) -> Result<usize> {
    if let Some(&slot) = pool.region_slot.get() {
        return Ok(slot);
    }
    let _g = REGISTER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&slot) = pool.region_slot.get() {
        return Ok(slot);
    }
    let slot = SLOT_COUNT.load(Ordering::Acquire);
    if slot == MAX_REGION_POOLS {
        return Err(Error::TooManyRegionPools(MAX_REGION_POOLS));
    }
    let s = &SLOTS[slot];
    s.base.store(pool.base, Ordering::Relaxed);
    s.end.store(pool.base + pool.span, Ordering::Relaxed);
    s.pool.store(
        Arc::into_raw(Arc::clone(pool)) as *mut Pool,
        Ordering::Release,
    );
    SLOT_COUNT.store(slot + 1, Ordering::Release);
    let _ = pool.region_slot.set(slot);
    Ok(slot)
}

impl Pool {
    /// Routes this thread's allocations of at least the pool's
    /// `region_threshold` bytes into `tag` until the guard is dropped.
    /// Guards nest; the innermost wins.
    pub fn region(self: &Arc<Self>, tag: &str) -> Result<RegionGuard> {
        self.region_with_threshold(tag, self.cfg.region_threshold)
    }

    /// As `region`, with an explicit size threshold.
    pub fn region_with_threshold(
        self: &Arc<Self>,
        tag: &str,
        threshold: usize,
    ) -> Result<RegionGuard> {
        if !crate::torch::install() {
            return Err(Error::AllocatorNotInstalled);
        }
        let tag_id = {
            let mut st = self.lock();
            let id = st.tag_id_or_create(tag);
            let state = st.tags[id].state;
            if state != crate::TagState::Active {
                return Err(Error::TagState {
                    op: "open a region in",
                    tag: tag.into(),
                    state,
                });
            }
            let open = &mut st.tags[id].open_regions;
            *open = open
                .checked_add(1)
                .ok_or_else(|| Error::Invalid(format!("too many regions open on tag `{tag}`")))?;
            id
        };
        let opened = (|| {
            let slot = register(self)?;
            let cuda = self.cuda_device().map(|device| (slot, tag_id, device));
            if let Some((slot, tag, device)) = cuda {
                cuda_begin(slot, tag, device)?;
            }
            Ok((slot, cuda))
        })();
        let (slot, cuda) = match opened {
            Ok(o) => o,
            Err(e) => {
                self.close_region(tag_id);
                return Err(e);
            }
        };
        let guard = NEXT_GUARD.fetch_add(1, Ordering::Relaxed);
        let active = Active {
            slot,
            tag: tag_id,
            threshold: threshold.max(1),
            guard,
            routes_cpu: cuda.is_none(),
        };
        OPEN.with(|o| o.borrow_mut().push(active));
        ACTIVE.with(|a| a.set(Some(active)));
        Ok(RegionGuard {
            pool: Arc::clone(self),
            cuda,
            tag: tag_id,
            guard,
            _not_send: PhantomData,
        })
    }

    fn note_region_failure(&self, tag: TagId, bytes: usize, guard: u64, err: Error) {
        let mut st = self.lock();
        st.tags[tag].region_fallback_bytes += bytes as u64;
        // Keep the first failure of each guard; the count is in the stats.
        if st.region_failures.len() < 1024 && !st.region_failures.iter().any(|(g, _)| *g == guard) {
            st.region_failures.push((guard, err));
        }
    }
}

/// Keeps a region open on the current thread; see `Pool::region`.
#[must_use = "the region closes when the guard is dropped"]
pub struct RegionGuard {
    pool: Arc<Pool>,
    /// On a CUDA pool: (slot, tag, device) of the MemPool routing to end.
    cuda: Option<(usize, TagId, i32)>,
    tag: TagId,
    guard: u64,
    /// A region belongs to the thread that opened it.
    _not_send: PhantomData<*const ()>,
}

impl RegionGuard {
    /// Closes the region and reports the first allocation the pool refused
    /// while it was open (the allocation itself was served from the heap).
    pub fn finish(self) -> Result<()> {
        let mut st = self.pool.lock();
        match st
            .region_failures
            .iter()
            .position(|(g, _)| *g == self.guard)
        {
            Some(i) => Err(st.region_failures.swap_remove(i).1),
            None => Ok(()),
        }
    }
}

impl Drop for RegionGuard {
    fn drop(&mut self) {
        if let Some((slot, tag, device)) = self.cuda {
            if let Err(e) = cuda_end(slot, tag, device) {
                // A drop cannot return it; the next region or pause of the
                // tag meets the allocator in whatever state this left.
                log::warn!("closing a CUDA region: {e}");
            }
        }
        let _ = OPEN.try_with(|o| {
            let mut open = o.borrow_mut();
            open.retain(|a| a.guard != self.guard);
            let _ = ACTIVE.try_with(|a| a.set(open.last().copied()));
        });
        self.pool.close_region(self.tag);
    }
}

impl Pool {
    /// The first CUDA segment this pool refused a region (out of memory,
    /// a paused tag) since the last call, taken; always `None` on a host
    /// pool, whose refusals fall back to the heap and are reported by
    /// [`RegionGuard::finish`]. libtorch turns a refused segment into its
    /// own generic "CUDA out of memory" error, which does not say which
    /// tag, capacity or phase: a caller that gets a libtorch error asks
    /// here for colo-mem's reason.
    pub fn take_device_refusal(&self) -> Option<Error> {
        self.lock().device_refusal.take()
    }

    /// One region of `tag` fewer open.
    fn close_region(&self, tag: TagId) {
        let mut st = self.lock();
        let open = &mut st.tags[tag].open_regions;
        *open = open.saturating_sub(1);
    }
}

#[cfg(feature = "cuda")]
use crate::cuda_region::{begin as cuda_begin, end as cuda_end};

#[cfg(not(feature = "cuda"))]
fn cuda_begin(_: usize, _: TagId, _: i32) -> Result<()> {
    unreachable!("a CUDA pool exists only with the cuda feature")
}

#[cfg(not(feature = "cuda"))]
fn cuda_end(_: usize, _: TagId, _: i32) -> Result<()> {
    Ok(())
}

/// The pool block for a c10 allocation of `bytes` on this thread, if a
/// region applies to it.
fn region_alloc(bytes: usize) -> Option<u64> {
    let active = ACTIVE.try_with(|a| a.get()).ok().flatten()?;
    if !active.routes_cpu || bytes < active.threshold {
        return None;
    }
    let pool = registered(active.slot);
    let result = pool.alloc_locked(&mut pool.lock(), active.tag, bytes);
    match result {
        Ok((addr, _fresh)) => Some(addr),
        Err(e) => {
            pool.note_region_failure(active.tag, bytes, active.guard, e);
            None
        }
    }
}

/// Called by the C++ shim for every c10 CPU allocation: a pool block, or
/// null for libtorch's default allocator.
#[no_mangle]
pub extern "C" fn colo_mem_region_alloc(bytes: usize) -> *mut c_void {
    // A panic must not unwind into C++; a failure means "not ours".
    std::panic::catch_unwind(|| region_alloc(bytes))
        .ok()
        .flatten()
        .map_or(std::ptr::null_mut(), |a| a as *mut c_void)
}

/// Called by the C++ shim for every free: true if `ptr` was a pool block
/// (and is freed now), false if it belongs to libtorch's default allocator.
#[no_mangle]
pub extern "C" fn colo_mem_region_free(ptr: *mut c_void) -> bool {
    let Some(pool) = owner(ptr as u64) else {
        return false;
    };
    if let Err(e) = pool.free(ptr as u64) {
        // Unreachable for a correct program; leaking beats crashing in a
        // deallocation.
        log::error!("a tensor's memory could not be freed and is leaked: {e}");
    }
    true
}
