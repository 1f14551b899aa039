//! `Pool`: tagged allocations over one backend, with a device capacity and a
//! per-tag cache of freed blocks. Pausing and resuming live in
//! `transition.rs`; this file holds the state and the allocation path.
//!
//! Locking: one mutex guards the bookkeeping. It is held for lookups,
//! accounting and the map/unmap calls of single allocations, never across a
//! bulk copy: `pause`/`resume` move a tag into a transitional state, drop the
//! lock to copy, and take it again to finish (see `transition.rs`).

use crate::backend::{Backend, DevicePtr};
use crate::chunks::{self, Block, Work};
use crate::error::{TagBytes, TagState};
use crate::host::HostBackend;
use crate::timeline::{Event, EventKind};
use crate::va::AddressSpace;
use crate::{Error, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// What happens to a tag's contents across a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Contents are not kept: after `resume` the memory is fresh (zeros on
    /// the host backend, undefined on CUDA), and its pages come when they
    /// are first touched, so waking a large KV cache costs only the pages
    /// the next phase uses.
    #[default]
    Discard,
    /// Contents are not kept, and the caller writes all of them right after
    /// `resume` (the rollout engine's weights, rewritten by the weight
    /// update of every switch): `resume` populates the pages up front, on
    /// the copy threads, so the writer does not take a fault per page. On
    /// the host backend that is the switch's largest cost: a copy into
    /// faulted pages ran at 14.7 GB/s and into fresh ones at 1.5 GB/s
    /// (942 MiB, AVX-512 EPYC, 2026-11-29).
    Overwrite,
    /// Contents are copied to a host buffer on `pause` and restored
    /// bit-exactly on `resume`. The host buffer is kept and reused by later
    /// cycles, so steady-state pauses allocate nothing.
    Backup,
}

/// How a pool is set up.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Device capacity in bytes, enforced on every map (`u64::MAX`: none).
    pub capacity: u64,
    /// Address space reserved up front. Address space is cheap (nothing is
    /// behind it until mapped); it bounds the sum of live and cached
    /// allocations.
    pub address_space: u64,
    /// Allocations inside `region(tag)` of at least this many bytes go to
    /// the pool; smaller ones stay on the ordinary heap.
    pub region_threshold: usize,
    /// Threads used for bulk backup copies (on backends that allow it).
    pub copy_threads: usize,
    /// Most timeline events kept; older ones are dropped first. The
    /// default, 65,536, is ~47 MiB with seven tags (752 bytes an event,
    /// measured by RSS in `tests/timeline_bound.rs`; 2^20 held 752 MiB)
    /// and ~2,500 steps of a colo-rl run (~26 events a step).
    pub timeline_limit: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        PoolConfig {
            capacity: u64::MAX,
            address_space: 256 << 30,
            region_threshold: 16 << 10,
            copy_threads: cores.min(4),
            timeline_limit: 1 << 16,
        }
    }
}

impl PoolConfig {
    /// The default configuration with a device capacity.
    pub fn with_capacity(capacity: u64) -> Self {
        PoolConfig {
            capacity,
            ..Self::default()
        }
    }
}

/// Tagged, pausable device memory. See the crate docs.
pub struct Pool {
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) gran: u64,
    pub(crate) base: u64,
    pub(crate) span: u64,
    pub(crate) cfg: PoolConfig,
    pub(crate) epoch: Instant,
    pub(crate) state: Mutex<State>,
    /// Slot in the allocator's registry, once this pool has served a region.
    pub(crate) region_slot: OnceLock<usize>,
}

pub(crate) type TagId = usize;

/// One live allocation, as [`Pool::allocation`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub tag: String,
    /// Bytes asked for.
    pub requested: u64,
    /// Bytes mapped (a multiple of the granularity).
    pub mapped: u64,
}

pub(crate) struct State {
    pub(crate) tags: Vec<Tag>,
    /// Live allocations by address.
    pub(crate) allocs: BTreeMap<u64, Alloc>,
    pub(crate) va: AddressSpace,
    /// Bytes mapped: the tags' resident bytes plus `releasing` (including
    /// mappings a resume is making). The capacity is checked against it.
    pub(crate) resident: u64,
    /// Bytes no tag holds any more that a call is unmapping right now.
    pub(crate) releasing: u64,
    pub(crate) peak: u64,
    /// Highest mapped bytes outside the tags' caches (`resident` less the
    /// cached blocks): what was allocated, not what was held for reuse.
    pub(crate) peak_allocated: u64,
    pub(crate) phase: String,
    /// The caller's step number (`Pool::set_step`), recorded with events.
    pub(crate) step: u64,
    pub(crate) timeline: VecDeque<Event>,
    /// Events recorded over the pool's life (the ring keeps the newest).
    pub(crate) recorded: u64,
    /// Failures of region allocations, by guard id, for `RegionGuard::finish`.
    pub(crate) region_failures: Vec<(u64, Error)>,
    /// The first CUDA segment refused since `take_device_refusal` last
    /// looked (libtorch turns the refusal into its own generic OOM).
    pub(crate) device_refusal: Option<Error>,
}

impl State {
    /// Mapped bytes of live allocations: neither cached nor being released.
    pub(crate) fn allocated(&self) -> u64 {
        let cached: u64 = self.tags.iter().map(|t| t.cached_bytes).sum();
        self.resident.saturating_sub(cached + self.releasing)
    }

    /// Raises `peak_allocated` to the bytes allocated now.
    pub(crate) fn note_allocated_peak(&mut self) {
        self.peak_allocated = self.peak_allocated.max(self.allocated());
    }
}

pub(crate) struct Tag {
    pub(crate) name: String,
    pub(crate) policy: Policy,
    pub(crate) state: TagState,
    pub(crate) resident: u64,
    /// Freed blocks kept mapped: (size, address).
    pub(crate) cache: BTreeSet<(u64, u64)>,
    pub(crate) cached_bytes: u64,
    pub(crate) backup_bytes: u64,
    /// Frees that arrived while the tag was in a transition.
    pub(crate) deferred_frees: Vec<u64>,
    pub(crate) pauses: u64,
    pub(crate) resumes: u64,
    pub(crate) last_pause: Option<Duration>,
    pub(crate) last_resume: Option<Duration>,
    pub(crate) region_fallback_bytes: u64,
    /// Regions open on the tag, on any thread: a pause waits for none.
    pub(crate) open_regions: u32,
    /// Holders of libtorch's cached free CUDA blocks of the tag: while any,
    /// they stay in it at a pause or `empty_cache` ([`Pool::hold_cuda_cache`]).
    pub(crate) cuda_cache_holders: u32,
}

pub(crate) struct Alloc {
    pub(crate) tag: TagId,
    /// Mapped size (a multiple of the granularity).
    pub(crate) size: u64,
    pub(crate) requested: u64,
    pub(crate) backup: Option<Vec<u8>>,
}

impl Pool {
    /// A pool over the host backend.
    pub fn host(cfg: PoolConfig) -> Result<std::sync::Arc<Pool>> {
        Pool::new(Box::new(HostBackend::new()), cfg)
    }

    /// A pool over any backend; reserves `cfg.address_space` up front.
    pub fn new(backend: Box<dyn Backend>, cfg: PoolConfig) -> Result<std::sync::Arc<Pool>> {
        let gran = backend.granularity() as u64;
        if gran == 0 || !gran.is_power_of_two() {
            return Err(Error::Invalid(format!(
                "backend granularity {gran} is not a power of two"
            )));
        }
        if cfg.copy_threads == 0 {
            return Err(Error::Invalid("copy_threads must be at least 1".into()));
        }
        let span = cfg
            .address_space
            .div_ceil(gran)
            .checked_mul(gran)
            .filter(|&s| s > 0 && s <= isize::MAX as u64)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "address_space of {} bytes: expected 1 to {} bytes (whole {gran}-byte pages)",
                    cfg.address_space,
                    isize::MAX as u64 / gran * gran
                ))
            })?;
        let base = backend.reserve(span as usize)?;
        let state = State {
            tags: Vec::new(),
            allocs: BTreeMap::new(),
            va: AddressSpace::new(base, span),
            resident: 0,
            releasing: 0,
            peak: 0,
            peak_allocated: 0,
            phase: "init".into(),
            step: 0,
            timeline: VecDeque::new(),
            recorded: 0,
            region_failures: Vec::new(),
            device_refusal: None,
        };
        Ok(std::sync::Arc::new(Pool {
            backend,
            gran,
            base,
            span,
            cfg,
            epoch: Instant::now(),
            state: Mutex::new(state),
            region_slot: OnceLock::new(),
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held (a bug) leaves the bookkeeping as
        // it was at the panic; keep serving rather than poisoning every
        // later call, which would turn one bug into a crash of the process.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The CUDA device this pool's memory is on, if it is a CUDA pool.
    pub fn cuda_device(&self) -> Option<i32> {
        self.backend.cuda_device()
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub fn granularity(&self) -> usize {
        self.gran as usize
    }

    pub fn capacity(&self) -> u64 {
        self.cfg.capacity
    }

    /// The reserved address range: `(start, length)`.
    pub fn address_range(&self) -> (u64, u64) {
        (self.base, self.span)
    }

    /// Whether `addr` lies in this pool's reserved address range.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.span
    }

    /// Sets the content policy of `tag`, creating the tag if needed. Not
    /// allowed while the tag is paused or in a transition, because the
    /// backups a paused tag needs would appear or vanish under it.
    pub fn set_policy(&self, tag: &str, policy: Policy) -> Result<()> {
        let mut st = self.lock();
        let id = st.tag_id_or_create(tag);
        let t = &mut st.tags[id];
        if t.state != TagState::Active {
            return Err(Error::PolicyChange {
                tag: tag.into(),
                state: t.state,
            });
        }
        t.policy = policy;
        if policy != Policy::Backup {
            // Backups kept from earlier cycles are of no use any more.
            let State { allocs, tags, .. } = &mut *st;
            for a in allocs.values_mut().filter(|a| a.tag == id) {
                if let Some(b) = a.backup.take() {
                    tags[id].backup_bytes -= b.len() as u64;
                }
            }
        }
        Ok(())
    }

    /// Keeps libtorch's cached free CUDA blocks of `tag` (created if new)
    /// in the tag when it is paused or the cache emptied: they are paused
    /// and resumed with it, at the same addresses, instead of going back to
    /// the device. For the memory of captured CUDA graphs (see
    /// [`crate::graph`]), which address blocks that are free between
    /// replays. Counted: the cache is held until every holder has called
    /// [`Pool::release_cuda_cache`]. On the CPU it changes nothing.
    pub fn hold_cuda_cache(&self, tag: &str) {
        let mut st = self.lock();
        let id = st.tag_id_or_create(tag);
        let t = &mut st.tags[id];
        t.cuda_cache_holders = t.cuda_cache_holders.saturating_add(1);
    }

    /// Gives up one [`Pool::hold_cuda_cache`] of `tag` (its graphs are
    /// gone); with none left, the next pause or `empty_cache` returns the
    /// tag's cached blocks to the device. A tag never held: no change.
    pub fn release_cuda_cache(&self, tag: &str) {
        let mut st = self.lock();
        if let Some(id) = st.tag_id(tag) {
            let t = &mut st.tags[id];
            t.cuda_cache_holders = t.cuda_cache_holders.saturating_sub(1);
        }
    }

    /// Whether libtorch's cached free CUDA blocks of `tag` are held.
    pub fn holds_cuda_cache(&self, tag: &str) -> bool {
        let st = self.lock();
        st.tag_id(tag)
            .is_some_and(|id| st.tags[id].cuda_cache_holders > 0)
    }

    /// Allocates `bytes` under `tag` (created with `Policy::Discard` if
    /// new). The address stays the same for the allocation's whole life,
    /// across any number of pause/resume cycles.
    pub fn alloc(&self, tag: &str, bytes: usize) -> Result<DevicePtr> {
        let mut st = self.lock();
        let id = st.tag_id_or_create(tag);
        self.alloc_locked(&mut st, id, bytes).map(|(p, _)| p)
    }

    /// Allocation by tag id; returns the address and whether the memory is
    /// freshly mapped (zeroed on the host backend) rather than reused.
    pub(crate) fn alloc_locked(
        &self,
        st: &mut State,
        id: TagId,
        bytes: usize,
    ) -> Result<(DevicePtr, bool)> {
        let t = &st.tags[id];
        if t.state != TagState::Active {
            return Err(Error::TagState {
                op: "allocate in",
                tag: t.name.clone(),
                state: t.state,
            });
        }
        if bytes == 0 {
            return Err(Error::Invalid(format!(
                "zero-byte allocation in tag `{}`",
                t.name
            )));
        }
        let Some(size) = (bytes as u64)
            .div_ceil(self.gran)
            .checked_mul(self.gran)
            .filter(|&s| s <= self.span)
        else {
            return Err(Error::AddressSpace {
                requested: bytes as u64,
                reserved: self.span,
            });
        };
        // Reuse the smallest cached block that fits without wasting more
        // than half of it.
        let hit = t
            .cache
            .range((size, 0)..)
            .next()
            .copied()
            .filter(|&(s, _)| s <= 2 * size);
        let (addr, size, fresh) = match hit {
            Some((s, a)) => {
                let t = &mut st.tags[id];
                t.cache.remove(&(s, a));
                t.cached_bytes -= s;
                st.note_allocated_peak();
                (a, s, false)
            }
            None => (self.map_fresh(st, id, size, "allocation")?, size, true),
        };
        st.allocs.insert(
            addr,
            Alloc {
                tag: id,
                size,
                requested: bytes as u64,
                backup: None,
            },
        );
        Ok((addr, fresh))
    }

    /// Maps `size` fresh, populated bytes for tag `id` at a new address,
    /// charging the capacity.
    fn map_fresh(
        &self,
        st: &mut State,
        id: TagId,
        size: u64,
        op: &'static str,
    ) -> Result<DevicePtr> {
        // The address range first: a refused allocation must not have
        // raised the resident peak on its way out.
        let Some(addr) = st.va.take(size) else {
            return Err(Error::AddressSpace {
                requested: size,
                reserved: self.span,
            });
        };
        if let Err(e) = self.charge(st, id, size, op) {
            st.va.give(addr, size);
            return Err(e);
        }
        let mapped = self.map_at(addr, size).and_then(|()| {
            // SAFETY: mapped just now by `map_at`.
            unsafe { self.backend.populate(addr, size as usize) }.inspect_err(|_| {
                // SAFETY: mapped just now and not handed out yet.
                unsafe { self.unmap_block(addr, size) };
            })
        });
        match mapped {
            Ok(()) => Ok(addr),
            Err(e) => {
                st.va.give(addr, size);
                st.uncharge(id, size);
                Err(e)
            }
        }
    }

    /// Creates physical memory and maps it at `addr` (unpopulated).
    /// The mapping alone holds the memory afterwards: the pool keeps no
    /// handle or file descriptor per block.
    pub(crate) fn map_at(&self, addr: DevicePtr, size: u64) -> Result<()> {
        let handle = self.backend.create(size as usize)?;
        // SAFETY: `addr..addr+size` was taken from this pool's reserved range
        // (address space allocator, or a live allocation whose tag is being
        // resumed, i.e. currently unmapped), so nothing else is mapped there.
        unsafe { self.backend.map(addr, size as usize, handle) }
    }

    /// Unmaps a block, which gives its memory back. Failures are only
    /// logged (`log::warn!`): the range is ours either way and will be
    /// mapped over.
    ///
    /// # Safety
    /// The block must be mapped by this pool and no one may use it any more
    /// (a cached block, or one of a tag being paused or rolled back).
    pub(crate) unsafe fn unmap_block(&self, addr: DevicePtr, size: u64) {
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { self.backend.unmap(addr, size as usize) } {
            log::warn!("unmapping {} at {addr:#x}: {e}", crate::fmt_bytes(size));
        }
    }

    /// Adds `size` to the resident bytes of tag `id`, first dropping cached
    /// blocks if the capacity would be exceeded (like PyTorch's caching
    /// allocator on an out-of-memory).
    pub(crate) fn charge(
        &self,
        st: &mut State,
        id: TagId,
        size: u64,
        op: &'static str,
    ) -> Result<()> {
        if st.resident.saturating_add(size) > self.cfg.capacity {
            self.drop_caches(st, None);
        }
        if st.resident.saturating_add(size) > self.cfg.capacity {
            let err = Error::OutOfMemory {
                phase: st.phase.clone(),
                op,
                tag: st.tags[id].name.clone(),
                requested: size,
                capacity: self.cfg.capacity,
                resident: st.resident,
                per_tag: st.per_tag_bytes(),
            };
            let tags = vec![st.tags[id].name.clone()];
            self.record(st, EventKind::OutOfMemory, tags, Duration::ZERO);
            return Err(err);
        }
        st.resident += size;
        st.tags[id].resident += size;
        st.peak = st.peak.max(st.resident);
        st.note_allocated_peak();
        Ok(())
    }

    /// Unmaps the cached blocks of active tags (`only`: of one tag) and
    /// returns their addresses; returns the bytes released.
    pub(crate) fn drop_caches(&self, st: &mut State, only: Option<TagId>) -> u64 {
        let mut released = 0;
        for id in 0..st.tags.len() {
            if only.is_some_and(|o| o != id) || st.tags[id].state != TagState::Active {
                continue;
            }
            let blocks = std::mem::take(&mut st.tags[id].cache);
            for (size, addr) in blocks {
                // SAFETY: a cached block of an active tag is mapped, belongs
                // to no live allocation and is handed to nobody while cached.
                unsafe { self.unmap_block(addr, size) };
                st.va.give(addr, size);
                st.tags[id].cached_bytes -= size;
                st.uncharge(id, size);
                released += size;
            }
        }
        released
    }

    /// Frees an allocation. In an active tag its block stays mapped in the
    /// tag's cache for reuse; in a paused tag its address range is returned
    /// and its backup dropped. During another thread's pause or resume of
    /// the tag the free is carried out when that transition finishes.
    pub fn free(&self, addr: DevicePtr) -> Result<()> {
        let mut st = self.lock();
        let Some(a) = st.allocs.get(&addr) else {
            return Err(Error::UnknownAddress { op: "free", addr });
        };
        let id = a.tag;
        match st.tags[id].state {
            TagState::Pausing | TagState::Resuming => {
                // Freed once already: the allocation stays in `allocs`
                // until the transition ends, the free is remembered here.
                if st.tags[id].deferred_frees.contains(&addr) {
                    return Err(Error::UnknownAddress { op: "free", addr });
                }
                st.tags[id].deferred_frees.push(addr);
                Ok(())
            }
            _ => {
                st.free_now(addr);
                Ok(())
            }
        }
    }

    /// Returns every cached block of every active tag to the device.
    ///
    /// The cost is the kernel freeing the blocks' pages, so it is done
    /// outside the lock and spread over the copy threads like a pause's
    /// discards: the blocks are taken out of the caches first (no one can
    /// reach them then), their pages discarded in chunks, unmapped, and
    /// only then uncharged and their addresses given back. On CUDA the
    /// caching allocator's free segments of every tag without an open
    /// region come back to the pool first (`torch.cuda.empty_cache`).
    pub fn empty_cache(&self) -> u64 {
        let start = Instant::now();
        #[cfg(feature = "cuda")]
        {
            let names: Vec<String> = {
                let st = self.lock();
                st.tags
                    .iter()
                    .filter(|t| t.state == TagState::Active)
                    .map(|t| t.name.clone())
                    .collect()
            };
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            if let Err(e) = crate::cuda_region::empty_tags(self, &names) {
                log::warn!("emptying libtorch's CUDA cache: {e}");
            }
        }
        let taken: Vec<(TagId, u64, u64)> = {
            let mut st = self.lock();
            let mut taken = Vec::new();
            for (id, t) in st.tags.iter_mut().enumerate() {
                if t.state != TagState::Active {
                    continue;
                }
                for (size, addr) in std::mem::take(&mut t.cache) {
                    t.cached_bytes -= size;
                    taken.push((id, size, addr));
                }
            }
            // Out of their tags' books at once, into the pool's releasing
            // bytes until unmapped: a snapshot taken meanwhile shows no tag
            // holding them, and the capacity still counts them.
            for &(id, size, _) in &taken {
                st.start_release(id, size);
            }
            taken
        };
        let blocks: Vec<Block> = taken
            .iter()
            .map(|&(_, size, addr)| Block {
                dev: addr,
                len: size as usize,
                host: std::ptr::null_mut(),
                backup_len: 0,
                populate: false,
            })
            .collect();
        // SAFETY: each block is mapped (a cached block of an active tag)
        // and, taken out of its cache, reachable by no one else; there are
        // no host buffers (`backup_len` 0), so a pause's work is the
        // discard alone.
        let discarded = unsafe {
            chunks::run(
                self.backend.as_ref(),
                &blocks,
                Work::Pause,
                self.cfg.copy_threads,
            )
        };
        if let Err(e) = discarded {
            // The unmaps below free the pages anyway.
            log::warn!("discarding the pages of cached blocks: {e}");
        }
        for &(_, size, addr) in &taken {
            // SAFETY: as above; unmapped once, here.
            unsafe { self.unmap_block(addr, size) };
        }
        let mut st = self.lock();
        let mut released = 0;
        for (_, size, addr) in taken {
            st.va.give(addr, size);
            st.released(size);
            released += size;
        }
        self.record(&mut st, EventKind::EmptyCache, Vec::new(), start.elapsed());
        released
    }

    /// Copies `data` into allocation `addr` at `offset`. For small copies
    /// (tests, metadata): the pool lock is held during the copy so the tag
    /// cannot be paused under it.
    pub fn write(&self, addr: DevicePtr, offset: usize, data: &[u8]) -> Result<()> {
        let st = self.lock();
        st.check_access("write", addr, offset, data.len())?;
        // SAFETY: the range lies inside a live allocation of an active tag
        // (checked above) and the lock keeps it mapped during the copy.
        unsafe { self.backend.copy_from_host(addr + offset as u64, data) }
    }

    /// Copies from allocation `addr` at `offset` into `out`; see `write`.
    pub fn read(&self, addr: DevicePtr, offset: usize, out: &mut [u8]) -> Result<()> {
        let st = self.lock();
        st.check_access("read", addr, offset, out.len())?;
        // SAFETY: as in `write`.
        unsafe { self.backend.copy_to_host(addr + offset as u64, out) }
    }

    /// Forgets the peak so far (e.g. at the start of a training step).
    pub fn reset_peak(&self) {
        let mut st = self.lock();
        st.peak = st.resident;
        st.peak_allocated = st.allocated();
    }

    /// The state of `tag`, or `None` if the pool does not know it.
    pub fn tag_state(&self, tag: &str) -> Option<TagState> {
        let st = self.lock();
        st.tag_id(tag).map(|id| st.tags[id].state)
    }

    /// The live allocation that starts at `addr`: its tag, the bytes asked
    /// for and the bytes mapped for it (the request rounded up to the
    /// granularity, or a reused cached block of up to twice that).
    pub fn allocation(&self, addr: DevicePtr) -> Option<Allocation> {
        let st = self.lock();
        let a = st.allocs.get(&addr)?;
        Some(Allocation {
            tag: st.tags[a.tag].name.clone(),
            requested: a.requested,
            mapped: a.size,
        })
    }

    /// The tag of the live allocation that contains `addr`. On the host
    /// every c10 allocation is one pool allocation, so a tensor's address
    /// is an allocation's start; on CUDA a pool allocation is a whole
    /// caching-allocator segment and tensors lie inside it.
    pub fn tag_of(&self, addr: DevicePtr) -> Option<String> {
        let st = self.lock();
        let (&start, a) = st.allocs.range(..=addr).next_back()?;
        let end = start.checked_add(a.size)?;
        (addr < end).then(|| st.tags[a.tag].name.clone())
    }
}

impl State {
    pub(crate) fn tag_id(&self, tag: &str) -> Option<TagId> {
        self.tags.iter().position(|t| t.name == tag)
    }

    pub(crate) fn tag_id_or_create(&mut self, tag: &str) -> TagId {
        if let Some(id) = self.tag_id(tag) {
            return id;
        }
        self.tags.push(Tag {
            name: tag.to_string(),
            policy: Policy::Discard,
            state: TagState::Active,
            resident: 0,
            cache: BTreeSet::new(),
            cached_bytes: 0,
            backup_bytes: 0,
            deferred_frees: Vec::new(),
            pauses: 0,
            resumes: 0,
            last_pause: None,
            last_resume: None,
            region_fallback_bytes: 0,
            open_regions: 0,
            cuda_cache_holders: 0,
        });
        self.tags.len() - 1
    }

    /// The id of a known tag, or an error listing the known ones.
    pub(crate) fn known_tag(&self, op: &'static str, tag: &str) -> Result<TagId> {
        self.tag_id(tag).ok_or_else(|| Error::UnknownTag {
            op,
            tag: tag.to_string(),
            known: self
                .tags
                .iter()
                .map(|t| format!("`{}`", t.name))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    pub(crate) fn uncharge(&mut self, id: TagId, size: u64) {
        self.resident -= size;
        self.tags[id].resident -= size;
    }

    /// Moves `size` mapped bytes out of tag `id` into the bytes being
    /// released: a call is about to unmap them without the lock.
    pub(crate) fn start_release(&mut self, id: TagId, size: u64) {
        self.tags[id].resident -= size;
        self.releasing += size;
    }

    /// Undoes [`State::start_release`]: the bytes stay mapped in tag `id`.
    pub(crate) fn cancel_release(&mut self, id: TagId, size: u64) {
        self.releasing -= size;
        self.tags[id].resident += size;
    }

    /// `size` bytes being released are unmapped now.
    pub(crate) fn released(&mut self, size: u64) {
        self.releasing -= size;
        self.resident -= size;
    }

    pub(crate) fn per_tag_bytes(&self) -> Vec<TagBytes> {
        self.tags
            .iter()
            .map(|t| TagBytes {
                tag: t.name.clone(),
                bytes: t.resident,
            })
            .collect()
    }

    /// Frees a live allocation whose tag is active or paused.
    pub(crate) fn free_now(&mut self, addr: u64) {
        let Some(a) = self.allocs.remove(&addr) else {
            return;
        };
        let t = &mut self.tags[a.tag];
        if let Some(b) = &a.backup {
            t.backup_bytes -= b.len() as u64;
        }
        match t.state {
            TagState::Active => {
                t.cache.insert((a.size, addr));
                t.cached_bytes += a.size;
            }
            _ => self.va.give(addr, a.size),
        }
    }

    fn check_access(&self, op: &'static str, addr: u64, offset: usize, len: usize) -> Result<()> {
        let a = self
            .allocs
            .get(&addr)
            .ok_or(Error::UnknownAddress { op, addr })?;
        let t = &self.tags[a.tag];
        if t.state != TagState::Active {
            return Err(Error::TagState {
                op,
                tag: t.name.clone(),
                state: t.state,
            });
        }
        let end = (offset as u64).checked_add(len as u64);
        if end.is_none_or(|end| end > a.requested) {
            return Err(Error::Invalid(format!(
                "{op} of {len} bytes at offset {offset} overruns the allocation at {addr:#x} of {} bytes",
                a.requested
            )));
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // What is mapped: the live allocations and cached blocks of tags
        // that are not paused (no transition is under way: `&mut self`).
        let mapped: Vec<(u64, u64)> = st
            .allocs
            .iter()
            .filter(|(_, a)| st.tags[a.tag].state != TagState::Paused)
            .map(|(&addr, a)| (addr, a.size))
            .chain(
                st.tags
                    .iter()
                    .flat_map(|t| t.cache.iter().map(|&(size, addr)| (addr, size))),
            )
            .collect();
        for (addr, size) in mapped {
            // SAFETY: `&mut self`: no one else uses the pool. A pool that
            // served a region is held by the allocator's registry for the
            // life of the process and never dropped, so no Rust value points
            // into it.
            unsafe { self.unmap_block(addr, size) };
        }
        // SAFETY: as above; everything inside the range is unmapped now.
        let _ = unsafe { self.backend.free_reserved(self.base, self.span as usize) };
    }
}
