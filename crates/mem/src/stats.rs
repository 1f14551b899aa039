//! Statistics of a pool, per tag, as read from its bookkeeping.

use crate::error::TagState;
use crate::pool::Pool;
use crate::Policy;
use serde::Serialize;

/// What one tag holds right now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TagStats {
    pub tag: String,
    pub policy: Policy,
    pub state: TagState,
    /// Live allocations (not freed).
    pub allocations: usize,
    /// Bytes asked for by the live allocations.
    pub allocated_bytes: u64,
    /// Bytes mapped for this tag: live allocations (rounded up to the
    /// granularity) plus freed blocks kept in the cache.
    pub resident_bytes: u64,
    /// Bytes of live allocations that are not mapped (the tag is paused).
    pub paused_bytes: u64,
    /// Freed blocks kept mapped for reuse.
    pub cached_bytes: u64,
    /// Host bytes held as backups of this tag's allocations (kept across
    /// cycles).
    pub backup_bytes: u64,
    pub pauses: u64,
    pub resumes: u64,
    /// Duration of the last `pause` / `resume` call that covered this tag.
    pub last_pause_s: Option<f64>,
    pub last_resume_s: Option<f64>,
    /// Bytes of allocations made inside `region(tag)` that could not come
    /// from the pool (tag paused, out of memory) and went to the ordinary
    /// heap instead; see `RegionGuard::finish`.
    pub region_fallback_bytes: u64,
}

/// What a whole pool holds right now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolStats {
    pub backend: &'static str,
    /// The device capacity enforced on every map (`u64::MAX`: none).
    pub capacity_bytes: u64,
    /// Bytes mapped: the tags' resident bytes plus `releasing_bytes`.
    /// The capacity is checked against this.
    pub resident_bytes: u64,
    /// Bytes that have left their tags (cached blocks being returned by
    /// `empty_cache`, allocations of tags being paused) and are being
    /// unmapped by a call under way: still mapped, no tag's any more.
    pub releasing_bytes: u64,
    /// Highest `resident_bytes` since the pool was made or `reset_peak`.
    pub peak_resident_bytes: u64,
    /// Highest mapped bytes outside the tags' caches since the same moment:
    /// what was allocated (PyTorch's `max_memory_allocated`, where
    /// `peak_resident_bytes` is its `max_memory_reserved`).
    pub peak_allocated_bytes: u64,
    /// Tensor memory libtorch holds outside any region, process-wide (the
    /// CPU allocator shim counts it; worker-thread scratch such as bf16
    /// attention backward lands here): shown as "untagged", not lost.
    pub untagged: crate::Untagged,
    pub tags: Vec<TagStats>,
}

impl PoolStats {
    /// The statistics of `tag`, if the pool knows it.
    pub fn tag(&self, tag: &str) -> Option<&TagStats> {
        self.tags.iter().find(|t| t.tag == tag)
    }
}

impl Pool {
    /// What the pool holds now, per tag.
    pub fn stats(&self) -> PoolStats {
        let st = self.lock();
        let mut tags: Vec<TagStats> = st
            .tags
            .iter()
            .map(|t| TagStats {
                tag: t.name.clone(),
                policy: t.policy,
                state: t.state,
                allocations: 0,
                allocated_bytes: 0,
                resident_bytes: t.resident,
                paused_bytes: 0,
                cached_bytes: t.cached_bytes,
                backup_bytes: t.backup_bytes,
                pauses: t.pauses,
                resumes: t.resumes,
                last_pause_s: t.last_pause.map(|d| d.as_secs_f64()),
                last_resume_s: t.last_resume.map(|d| d.as_secs_f64()),
                region_fallback_bytes: t.region_fallback_bytes,
            })
            .collect();
        for a in st.allocs.values() {
            let ts = &mut tags[a.tag];
            ts.allocations += 1;
            ts.allocated_bytes += a.requested;
            if ts.state == TagState::Paused {
                ts.paused_bytes += a.size;
            }
        }
        PoolStats {
            backend: self.backend.name(),
            capacity_bytes: self.cfg.capacity,
            resident_bytes: st.resident,
            releasing_bytes: st.releasing,
            peak_resident_bytes: st.peak,
            peak_allocated_bytes: st.peak_allocated,
            untagged: crate::untagged(),
            tags,
        }
    }
}
