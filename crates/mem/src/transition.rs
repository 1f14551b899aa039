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

use crate::copy::{copy_pieces, Dir, Piece};
use crate::error::TagState;
use crate::pool::{Pool, State, TagId};
use crate::region::heap_only;
use crate::timeline::EventKind;
use crate::{Error, Policy, Result};
use std::time::Instant;

/// One allocation moving through a transition.
struct Job {
    addr: u64,
    size: u64,
    requested: u64,
    tag: TagId,
    /// The allocation's kept host backup, taken out of the bookkeeping for
    /// the duration of the transition (`Backup` policy only).
    backup: Option<Vec<u8>>,
}

impl Pool {
    /// Releases the physical memory of every allocation under `tags`,
    /// keeping their addresses reserved. `Backup` tags first copy their
    /// contents to host buffers, which are kept for later cycles. Freed
    /// blocks cached under these tags are returned too.
    ///
    /// Errors (nothing changed): a tag unknown, not active, or named twice.
    pub fn pause(&self, tags: &[&str]) -> Result<()> {
        let _h = heap_only();
        let start = Instant::now();
        let (ids, mut jobs, cached) = {
            let mut st = self.lock();
            let ids = begin(&mut st, "pause", tags, TagState::Active, TagState::Pausing)?;
            let jobs = take_jobs(&mut st, &ids);
            let mut cached = Vec::new();
            for &id in &ids {
                cached.extend(
                    std::mem::take(&mut st.tags[id].cache)
                        .into_iter()
                        .map(|(s, a)| (id, a, s)),
                );
            }
            (ids, jobs, cached)
        };

        // Backups are sized to what was asked for, not the padded mapping.
        for j in jobs.iter_mut() {
            if let Some(b) = &mut j.backup {
                if b.len() as u64 != j.requested {
                    *b = vec![0u8; j.requested as usize];
                }
            }
        }
        if let Err(e) = self.copy_backups(&mut jobs, Dir::ToHost) {
            let mut st = self.lock();
            for &(id, addr, size) in &cached {
                st.tags[id].cache.insert((size, addr));
            }
            finish(&mut st, &ids, jobs, TagState::Active);
            return Err(e);
        }

        let mut unmap_error = None;
        let mut unmapped: Vec<(TagId, u64, u64, bool)> = Vec::new();
        for (tag, addr, size, is_cached) in jobs
            .iter()
            .map(|j| (j.tag, j.addr, j.size, false))
            .chain(cached.iter().map(|&(t, a, s)| (t, a, s, true)))
        {
            // SAFETY: the range is mapped (the tag was active) and no one
            // uses it: the tag is `Pausing`, so the pool hands it to nobody,
            // and its owner asked for the pause.
            match unsafe { self.backend.unmap(addr, size as usize) } {
                Ok(()) => unmapped.push((tag, addr, size, is_cached)),
                Err(e) => unmap_error = unmap_error.or(Some(e)),
            }
        }

        let mut st = self.lock();
        for &(tag, addr, size, is_cached) in &unmapped {
            st.uncharge(tag, size);
            if is_cached {
                st.tags[tag].cached_bytes -= size;
                st.va.give(addr, size);
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
        unmap_error.map_or(Ok(()), Err)
    }

    /// Maps fresh physical memory at the addresses of every allocation under
    /// `tags` and restores `Backup` contents bit-exactly.
    ///
    /// The capacity is checked on every map. If memory runs out (or the
    /// backend fails) part way, everything this call mapped is unmapped
    /// again, the tags stay paused with their backups, and the error names
    /// the request and the resident bytes per tag.
    pub fn resume(&self, tags: &[&str]) -> Result<()> {
        let _h = heap_only();
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

        let mut mapped = 0;
        let mut failure = None;
        for j in &jobs {
            if let Err(e) = self.charge(&mut self.lock(), j.tag, j.size, "resume") {
                failure = Some(e);
                break;
            }
            if let Err(e) = self.map_at(j.addr, j.size) {
                self.lock().uncharge(j.tag, j.size);
                failure = Some(e);
                break;
            }
            mapped += 1;
        }
        if failure.is_none() {
            failure = self.copy_backups(&mut jobs, Dir::FromHost).err();
        }
        if let Some(e) = failure {
            for j in &jobs[..mapped] {
                // SAFETY: mapped by this call a moment ago; the tag is
                // `Resuming`, so nobody else has used it.
                let _ = unsafe { self.backend.unmap(j.addr, j.size as usize) };
            }
            let mut st = self.lock();
            for j in &jobs[..mapped] {
                st.uncharge(j.tag, j.size);
            }
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

    /// Copies every job's backup in the given direction, over several
    /// threads where the backend allows.
    fn copy_backups(&self, jobs: &mut [Job], dir: Dir) -> Result<()> {
        let pieces: Vec<Piece> = jobs
            .iter_mut()
            .filter_map(|j| {
                j.backup.as_mut().map(|b| Piece {
                    dev: j.addr,
                    host: b.as_mut_ptr(),
                    len: b.len(),
                })
            })
            .collect();
        // SAFETY: every job's range is mapped (pause: the tag was active;
        // resume: mapped just before) and reserved to this call by the tag's
        // transitional state; each backup is a distinct host buffer owned by
        // its job, as long as the allocation's requested size, which lies
        // within the mapping.
        unsafe { copy_pieces(self.backend.as_ref(), pieces, dir, self.cfg.copy_threads) }
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
            Policy::Discard => None,
        };
        jobs.push(Job {
            addr,
            size: a.size,
            requested: a.requested,
            tag: a.tag,
            backup,
        });
    }
    jobs
}

/// Puts the backups back, sets the final state and carries out the frees
/// that arrived during the transition.
fn finish(st: &mut State, ids: &[TagId], jobs: Vec<Job>, state: TagState) {
    for j in jobs {
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
