//! The bulk work of a transition, in chunks spread over a few threads: a
//! pause copies each chunk to its backup and then discards its pages; a
//! resume populates each chunk and then restores its backup. Doing the
//! kernel's page work (freeing, zeroing) per chunk on the same threads as
//! the copies spreads both over the cores, and a chunk is still in cache
//! when its pages are freed.

use crate::backend::{Backend, DevicePtr};
use crate::Result;

/// Below this many bytes one thread does all the work.
const PARALLEL_MIN: usize = 32 << 20;
/// Bytes per backend call.
const CHUNK: usize = 64 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Copy device → host (if there is a backup), then discard the pages.
    Pause,
    /// Populate the pages, then copy host → device (if there is a backup).
    Resume,
}

/// One mapped block and, for `Backup` tags, the host buffer of its first
/// `backup_len` bytes.
pub(crate) struct Block {
    pub dev: DevicePtr,
    pub len: usize,
    pub host: *mut u8,
    pub backup_len: usize,
    /// Populate on resume even without a backup (`Overwrite` policy).
    pub populate: bool,
}

/// A piece of a block: bytes `offset..offset+len`, of which the first
/// `copy_len` are copied.
struct Chunk<'a> {
    block: &'a Block,
    offset: usize,
    len: usize,
    copy_len: usize,
}

// SAFETY: a chunk is a part of a block that only the thread holding the
// chunk touches during `run`; the host pointer is into a buffer that the
// caller keeps alive and unaliased until `run` returns.
unsafe impl Send for Chunk<'_> {}

/// Does `work` over every block.
///
/// # Safety
/// Every block must be mapped by `backend` and used by no one else during
/// the call; every host buffer must be valid for `backup_len` bytes and not
/// aliased. Blocks must not overlap.
pub(crate) unsafe fn run(
    backend: &dyn Backend,
    blocks: &[Block],
    work: Work,
    threads: usize,
) -> Result<()> {
    let total: usize = blocks.iter().map(|b| b.len).sum();
    let threads = if backend.parallel_copies() && total >= PARALLEL_MIN {
        threads.max(1)
    } else {
        1
    };
    let chunks = split(blocks);
    if threads == 1 {
        // SAFETY: forwarded from the caller.
        return chunks
            .iter()
            .try_for_each(|c| unsafe { do_chunk(backend, c, work) });
    }
    // Contiguous runs of roughly equal bytes per thread.
    let per_thread = total.div_ceil(threads);
    let mut groups: Vec<Vec<Chunk>> = (0..threads).map(|_| Vec::new()).collect();
    let mut acc = 0usize;
    for c in chunks {
        let g = (acc / per_thread).min(threads - 1);
        acc += c.len;
        groups[g].push(c);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            // SAFETY: the groups partition disjoint chunks; see the caller's
            // contract.
            .map(|g| {
                s.spawn(move || {
                    g.iter()
                        .try_for_each(|c| unsafe { do_chunk(backend, c, work) })
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// # Safety
/// As for `run`.
unsafe fn do_chunk(backend: &dyn Backend, c: &Chunk<'_>, work: Work) -> Result<()> {
    let dev = c.block.dev + c.offset as u64;
    let host = c.block.host.wrapping_add(c.offset);
    // SAFETY: the caller guarantees the block is mapped and exclusive to
    // this call, and the host buffer valid for `backup_len` bytes, which
    // bounds `offset + copy_len`.
    unsafe {
        match work {
            Work::Pause => {
                if c.copy_len > 0 {
                    backend.copy_to_host(dev, std::slice::from_raw_parts_mut(host, c.copy_len))?;
                }
                backend.discard(dev, c.len)
            }
            // Only memory about to be written is populated up front: restored
            // from its backup, or overwritten by the caller (`Overwrite`). A
            // `Discard` chunk (the KV cache) gets its pages when it is first
            // touched, so waking a large budget costs only the pages the
            // next phase uses.
            Work::Resume if c.copy_len > 0 || c.block.populate => {
                backend.populate(dev, c.len)?;
                if c.copy_len == 0 {
                    return Ok(());
                }
                backend.copy_from_host(dev, std::slice::from_raw_parts(host, c.copy_len))
            }
            Work::Resume => Ok(()),
        }
    }
}

fn split(blocks: &[Block]) -> Vec<Chunk<'_>> {
    let mut out = Vec::new();
    for block in blocks {
        let mut offset = 0;
        while offset < block.len {
            let len = CHUNK.min(block.len - offset);
            let copy_len = block.backup_len.saturating_sub(offset).min(len);
            out.push(Chunk {
                block,
                offset,
                len,
                copy_len,
            });
            offset += len;
        }
    }
    out
}
