//! `region(tag)`: allocations made by any Rust code on the current thread go
//! to a pool under a tag — colo's equivalent of torch_memory_saver's
//! `with region(tag)`. This is how candle's CPU tensors (plain `Vec`s) end
//! up in tagged, pausable memory.
//!
//! How it works: colo-mem installs a global allocator (`ColoAlloc`, feature
//! `global-allocator`, on by default). While a `RegionGuard` is alive on a
//! thread, that thread's allocations of at least the pool's
//! `region_threshold` bytes (and alignment at most the granularity) are made
//! by `Pool::alloc` under the guard's tag. Frees are routed by address, on
//! any thread: an address inside a registered pool's reserved range goes
//! back to that pool, anything else to the system allocator. The check is a
//! range comparison per registered pool, with no lock and no syscall.
//!
//! What stays on the ordinary heap:
//! - allocations smaller than the threshold (a `Vec`'s header lives wherever
//!   its owner is; its buffer is what matters);
//! - allocations of other threads, including worker threads a library
//!   spawns (candle's matmul threads, rayon): only the thread that holds the
//!   guard is redirected;
//! - allocations made by the pool itself (its bookkeeping and host backups);
//! - allocations a pool refuses (tag paused, out of memory). These fall back
//!   to the heap so that the program keeps running; the failure is recorded
//!   and returned by `RegionGuard::finish`, and counted in the tag's
//!   `region_fallback_bytes`.
//!
//! A pool that has served a region stays alive for the rest of the process
//! (the registry holds it), because buffers from it may be freed at any
//! later time by any code.

use crate::pool::{Pool, TagId};
use crate::{Error, Result};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
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
}

thread_local! {
    static ACTIVE: Cell<Option<Active>> = const { Cell::new(None) };
    /// Nonzero while pool code runs on this thread: its own allocations must
    /// go to the heap (and must not re-enter the pool).
    static HEAP_ONLY: Cell<u32> = const { Cell::new(0) };
}

/// While alive, this thread's allocations go to the ordinary heap.
pub(crate) struct HeapOnly(());

pub(crate) fn heap_only() -> HeapOnly {
    let _ = HEAP_ONLY.try_with(|c| c.set(c.get() + 1));
    HeapOnly(())
}

impl Drop for HeapOnly {
    fn drop(&mut self) {
        let _ = HEAP_ONLY.try_with(|c| c.set(c.get() - 1));
    }
}

fn registered(slot: usize) -> &'static Pool {
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
        let _h = heap_only();
        if !cfg!(feature = "global-allocator") {
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
            id
        };
        let slot = register(self)?;
        let guard = NEXT_GUARD.fetch_add(1, Ordering::Relaxed);
        let active = Active {
            slot,
            tag: tag_id,
            threshold: threshold.max(1),
            guard,
        };
        let prev = ACTIVE.with(|a| a.replace(Some(active)));
        Ok(RegionGuard {
            pool: Arc::clone(self),
            prev,
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
    prev: Option<Active>,
    guard: u64,
    /// A region belongs to the thread that opened it.
    _not_send: PhantomData<*const ()>,
}

impl RegionGuard {
    /// Closes the region and reports the first allocation the pool refused
    /// while it was open (the allocation itself was served from the heap).
    pub fn finish(self) -> Result<()> {
        let _h = heap_only();
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
        ACTIVE.with(|a| a.set(self.prev));
    }
}

/// colo's global allocator; see the module docs. Installed by colo-mem
/// itself when the `global-allocator` feature is on.
pub struct ColoAlloc;

impl ColoAlloc {
    /// The pool allocation for `layout` if a region applies to it.
    fn try_pool(&self, layout: Layout) -> Option<(*mut u8, bool)> {
        let active = ACTIVE.try_with(|a| a.get()).ok().flatten()?;
        if layout.size() < active.threshold || HEAP_ONLY.try_with(|c| c.get()).unwrap_or(1) != 0 {
            return None;
        }
        let pool = registered(active.slot);
        if layout.align() > pool.granularity() {
            return None;
        }
        let _h = heap_only();
        let result = pool.alloc_locked(&mut pool.lock(), active.tag, layout.size());
        match result {
            Ok((addr, fresh)) => Some((addr as *mut u8, fresh)),
            Err(e) => {
                pool.note_region_failure(active.tag, layout.size(), active.guard, e);
                None
            }
        }
    }
}

// SAFETY: every block is either from `System` (and returned to it) or from a
// registered pool (and returned to it, found by address range); a pool
// block is a whole live allocation, granularity-aligned, at least
// `layout.size()` bytes.
unsafe impl GlobalAlloc for ColoAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.try_pool(layout) {
            Some((p, _)) => p,
            // SAFETY: forwarded contract.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.try_pool(layout) {
            Some((p, fresh)) => {
                if !fresh {
                    // SAFETY: `p` is a live block of at least `layout.size()`
                    // bytes that we own.
                    unsafe { std::ptr::write_bytes(p, 0, layout.size()) };
                }
                p
            }
            // SAFETY: forwarded contract.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match owner(ptr as u64) {
            Some(pool) => {
                if let Err(e) = pool.free(ptr as u64) {
                    // Unreachable for a correct program; leaking beats
                    // crashing in a deallocation.
                    let _h = heap_only();
                    eprintln!("colo-mem: {e}");
                }
            }
            // SAFETY: not a pool address, so it came from `System`.
            None => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let into_region = ACTIVE
            .try_with(|a| a.get())
            .ok()
            .flatten()
            .is_some_and(|a| new_size >= a.threshold);
        if owner(ptr as u64).is_none() && !into_region {
            // SAFETY: forwarded contract; the block is from `System`.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: `layout` with `new_size` is valid per the caller's contract.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: forwarded contract.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

#[cfg(feature = "global-allocator")]
#[global_allocator]
static GLOBAL: ColoAlloc = ColoAlloc;
