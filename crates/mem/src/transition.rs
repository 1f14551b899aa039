//! `pause` and `resume`: the transitions of tags between mapped and
//! released physical memory, at unchanged addresses.
//!
//! Both follow the same pattern so that no lock is held across bulk work:
//! under the lock, check every tag's state and move all of them to a
//! transitional state (`Pausing`/`Resuming`; other threads' calls on these
//! tags now fail, and their frees are deferred), and take the work list;
//! without the lock, copy and map/unmap; under the lock again, finish the
//! bookkeeping. A failure undoes the call's own work and leaves every tag
//! as it was.

use crate::chunks::{self, Block, Work};
use crate::error::TagState;
use crate::pool::{Pool, State, TagId};
use crate::timeline::EventKind;
use crate::{Error, Policy, Result};
use std::time::Instant;

/// One block moving through a transition: a live allocation, or (pause
/// only) a cached free block.
struct Job {
    addr: u64,
    size: u64,
    requested: u64,
    tag: TagId,
    /// The allocation's kept host backup, taken out of the bookkeeping for
    /// the duration of the transition (`Backup` policy only).
    backup: Option<Vec<u8>>,
    /// Whether the block is mapped (pause: from the start; resume: once
    /// this call has mapped it).
    mapped: bool,
    /// Whether a resume populates it up front (`Overwrite` policy).
    populate: bool,
    cached: bool,
}

impl Pool {
    /// Releases the physical memory of every allocation under `tags`,
    /// keeping their addresses reserved. `Backup` tags first copy their
    /// contents to host buffers, which are kept for later cycles. Freed
    /// blocks cached under these tags are returned too.
    ///
    /// Errors (nothing changed): a tag unknown, not active, or named twice.
    pub fn pause(&self, tags: &[&str]) -> Result<()> {
        let start = Instant::now();
        // libtorch's CUDA caching allocator keeps freed segments of a tag;
        // they go back to the pool first, so only live tensors are paused.
        #[cfg(feature = "cuda")]
        crate::cuda_region::empty_tags(self, tags)?;
        let (ids, mut jobs) = {
            let mut st = self.lock();
            let ids = begin(&mut st, "pause", tags, TagState::Active, TagState::Pausing)?;
            let mut jobs = take_jobs(&mut st, &ids);
            for &id in &ids {
                let t = &mut st.tags[id];
                t.cached_bytes = 0;
                for (size, addr) in std::mem::take(&mut t.cache) {
                    jobs.push(Job {
                        addr,
                        size,
                        requested: 0,
                        tag: id,
                        backup: None,
                        mapped: true,
                        populate: false,
                        cached: true,
                    });
                }
            }
            // Every block leaves its tag's books now: a snapshot taken while
            // the copies run shows the tags holding nothing and the pool
            // releasing the blocks, which the capacity still counts.
            for j in jobs.iter_mut() {
                j.mapped = true;
                st.start_release(j.tag, j.size);
            }
            (ids, jobs)
        };

        // Backups are sized to what was asked for, not the padded mapping.
        for j in jobs.iter_mut() {
            if let Some(b) = &mut j.backup {
                if b.len() as u64 != j.requested {
                    *b = vec![0u8; j.requested as usize];
                    crate::host::advise_huge_pages(b);
                }
            }
        }
        if let Err(e) = self.bulk(&mut jobs, Work::Pause) {
            // Copies failed before any page was given up (the backend's
            // copy comes before its discard for each chunk, and a failed
            // copy stops the work): the tags stay active.
            let mut st = self.lock();
            for j in jobs.iter() {
                st.cancel_release(j.tag, j.size);
                if j.cached {
                    let t = &mut st.tags[j.tag];
                    t.cache.insert((j.size, j.addr));
                    t.cached_bytes += j.size;
                }
            }
            finish(&mut st, &ids, jobs, TagState::Active);
            return Err(e);
        }

        for j in jobs.iter_mut() {
            // SAFETY: the block is mapped and its tag is `Pausing` (or the
            // block was taken out of the cache): no one uses it.
            unsafe { self.unmap_block(j.addr, j.size) };
            j.mapped = false;
        }

        let mut st = self.lock();
        for j in &jobs {
            st.released(j.size);
            if j.cached {
                st.va.give(j.addr, j.size);
            }
        }
        let took = start.elapsed();
        for &id in &ids {
            st.tags[id].pauses += 1;
            st.tags[id].last_pause = Some(took);
        }
        finish(&mut st, &ids, jobs, TagState::Paused);
        let tags = names(&st, &ids);
        self.record(&mut st, EventKind::Pause, tags, took);
        Ok(())
    }

    /// Maps fresh physical memory at the addresses of every allocation under
    /// `tags` and restores `Backup` contents bit-exactly.
    ///
    /// The capacity is checked on every map. If memory runs out (or the
    /// backend fails) part way, everything this call mapped is unmapped
    /// again, the tags stay paused with their backups, and the error names
    /// the request and the resident bytes per tag.
    pub fn resume(&self, tags: &[&str]) -> Result<()> {
        let start = Instant::now();
        let (ids, mut jobs) = {
            let mut st = self.lock();
            let ids = begin(
                &mut st,
                "resume",
                tags,
                TagState::Paused,
                TagState::Resuming,
            )?;
            let jobs = take_jobs(&mut st, &ids);
            (ids, jobs)
        };

        let mut failure = None;
        for j in jobs.iter_mut() {
            if let Err(e) = self.charge(&mut self.lock(), j.tag, j.size, "resume") {
                failure = Some(e);
                break;
            }
            match self.map_at(j.addr, j.size) {
                Ok(()) => j.mapped = true,
                Err(e) => {
                    self.lock().uncharge(j.tag, j.size);
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() {
            failure = self.bulk(&mut jobs, Work::Resume).err();
        }
        if let Some(e) = failure {
            // What this call mapped leaves the tags' books before it is
            // unmapped (as in a pause), so the tags hold nothing meanwhile.
            let mut st = self.lock();
            let mut undone = 0;
            for j in jobs.iter().filter(|j| j.mapped) {
                st.start_release(j.tag, j.size);
                undone += j.size;
            }
            drop(st);
            for j in jobs.iter_mut() {
                if std::mem::take(&mut j.mapped) {
                    // SAFETY: mapped by this call; the tag is `Resuming`, so
                    // nobody else has used it.
                    unsafe { self.unmap_block(j.addr, j.size) };
                }
            }
            let mut st = self.lock();
            st.released(undone);
            finish(&mut st, &ids, jobs, TagState::Paused);
            let tags = names(&st, &ids);
            self.record(&mut st, EventKind::ResumeFailed, tags, start.elapsed());
            return Err(e);
        }

        let mut st = self.lock();
        let took = start.elapsed();
        for &id in &ids {
            st.tags[id].resumes += 1;
            st.tags[id].last_resume = Some(took);
        }
        finish(&mut st, &ids, jobs, TagState::Active);
        let tags = names(&st, &ids);
        self.record(&mut st, EventKind::Resume, tags, took);
        Ok(())
    }

    /// The bulk work of a transition over every mapped job, on several
    /// threads where the backend allows.
    fn bulk(&self, jobs: &mut [Job], work: Work) -> Result<()> {
        let blocks: Vec<Block> = jobs
            .iter_mut()
            .filter(|j| j.mapped)
            .map(|j| {
                let (host, backup_len) = match &mut j.backup {
                    Some(b) => (b.as_mut_ptr(), b.len()),
                    None => (std::ptr::null_mut(), 0),
                };
                Block {
                    dev: j.addr,
                    len: j.size as usize,
                    host,
                    backup_len,
                    populate: j.populate,
                }
            })
            .collect();
        // SAFETY: every block is mapped (pause: the tag was active; resume:
        // mapped just before) and reserved to this call by its tag's
        // transitional state (cached blocks: taken out of the cache); each
        // backup is a distinct host buffer owned by its job, as long as the
        // requested size, which lies within the block.
        unsafe { chunks::run(self.backend.as_ref(), &blocks, work, self.cfg.copy_threads) }
    }
}

/// Checks that every tag is known, named once and in state `from`, then
/// moves them all to `to`. On error nothing changes.
fn begin(
    st: &mut State,
    op: &'static str,
    tags: &[&str],
    from: TagState,
    to: TagState,
) -> Result<Vec<TagId>> {
    let mut ids = Vec::with_capacity(tags.len());
    for &tag in tags {
        let id = st.known_tag(op, tag)?;
        if ids.contains(&id) {
            return Err(Error::DuplicateTag {
                op,
                tag: tag.to_string(),
            });
        }
        let state = st.tags[id].state;
        if state != from {
            return Err(Error::TagState {
                op,
                tag: tag.to_string(),
                state,
            });
        }
        // Tensors being made in an open region would land in memory that
        // is going away (on CUDA the caching allocator would hand out
        // blocks of unmapped segments without asking the pool).
        let regions = st.tags[id].open_regions;
        if to == TagState::Pausing && regions > 0 {
            return Err(Error::RegionOpen {
                op,
                tag: tag.to_string(),
                regions,
            });
        }
        ids.push(id);
    }
    for &id in &ids {
        st.tags[id].state = to;
    }
    Ok(ids)
}

/// The live allocations of `ids`, in address order, with their backups
/// taken out for the transition.
fn take_jobs(st: &mut State, ids: &[TagId]) -> Vec<Job> {
    let mut jobs = Vec::new();
    let State { allocs, tags, .. } = st;
    for (&addr, a) in allocs.iter_mut() {
        if !ids.contains(&a.tag) {
            continue;
        }
        let backup = match tags[a.tag].policy {
            Policy::Backup => {
                let b = a.backup.take().unwrap_or_default();
                tags[a.tag].backup_bytes -= b.len() as u64;
                Some(b)
            }
            Policy::Discard | Policy::Overwrite => None,
        };
        jobs.push(Job {
            addr,
            size: a.size,
            requested: a.requested,
            tag: a.tag,
            backup,
            mapped: false,
            populate: tags[a.tag].policy == Policy::Overwrite,
            cached: false,
        });
    }
    jobs
}

/// Puts the backups back, sets the final state and carries out the frees
/// that arrived during the transition.
fn finish(st: &mut State, ids: &[TagId], jobs: Vec<Job>, state: TagState) {
    for j in jobs.into_iter().filter(|j| !j.cached) {
        if let (Some(b), Some(a)) = (j.backup, st.allocs.get_mut(&j.addr)) {
            st.tags[j.tag].backup_bytes += b.len() as u64;
            a.backup = Some(b);
        }
    }
    for &id in ids {
        st.tags[id].state = state;
        for addr in std::mem::take(&mut st.tags[id].deferred_frees) {
            st.free_now(addr);
        }
    }
}

fn names(st: &State, ids: &[TagId]) -> Vec<String> {
    ids.iter().map(|&id| st.tags[id].name.clone()).collect()
}
