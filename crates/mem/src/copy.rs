//! Bulk copies between mapped device ranges and host backups, in large
//! chunks, split over a few threads where the backend allows it (a single
//! core cannot saturate memory bandwidth on most machines).

use crate::backend::{Backend, DevicePtr};
use crate::Result;

/// Below this many bytes one thread does the whole copy.
const PARALLEL_MIN: usize = 32 << 20;
/// Pieces copied per backend call.
const CHUNK: usize = 8 << 20;

#[derive(Clone, Copy)]
pub(crate) enum Dir {
    ToHost,
    FromHost,
}

/// One contiguous copy between a device range and a host buffer.
pub(crate) struct Piece {
    pub dev: DevicePtr,
    pub host: *mut u8,
    pub len: usize,
}

// SAFETY: a piece is a pair of disjoint ranges that only the thread holding
// the piece touches during the copy; the caller keeps both alive until
// `copy_pieces` returns.
unsafe impl Send for Piece {}

/// Copies every piece. Pieces must not overlap each other.
///
/// # Safety
/// Every device range must be mapped and not accessed by anyone else during
/// the call; every host range must be valid for the direction's access and
/// not aliased elsewhere.
pub(crate) unsafe fn copy_pieces(
    backend: &dyn Backend,
    pieces: Vec<Piece>,
    dir: Dir,
    threads: usize,
) -> Result<()> {
    let total: usize = pieces.iter().map(|p| p.len).sum();
    let threads = if backend.parallel_copies() && total >= PARALLEL_MIN {
        threads.max(1)
    } else {
        1
    };
    let chunks = split(pieces, CHUNK);
    if threads == 1 {
        // SAFETY: forwarded from the caller.
        return unsafe { copy_serial(backend, &chunks, dir) };
    }
    let per_thread = total.div_ceil(threads);
    let mut groups: Vec<Vec<Piece>> = (0..threads).map(|_| Vec::new()).collect();
    let mut acc = 0usize;
    for c in chunks {
        let g = (acc / per_thread).min(threads - 1);
        acc += c.len;
        groups[g].push(c);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            // SAFETY: the groups partition disjoint pieces; see the caller's
            // contract.
            .map(|g| s.spawn(move || unsafe { copy_serial(backend, &g, dir) }))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })
}

/// # Safety
/// As for `copy_pieces`.
unsafe fn copy_serial(backend: &dyn Backend, pieces: &[Piece], dir: Dir) -> Result<()> {
    for p in pieces {
        // SAFETY: the caller guarantees both ranges are valid and exclusive.
        unsafe {
            match dir {
                Dir::ToHost => {
                    backend.copy_to_host(p.dev, std::slice::from_raw_parts_mut(p.host, p.len))?
                }
                Dir::FromHost => {
                    backend.copy_from_host(p.dev, std::slice::from_raw_parts(p.host, p.len))?
                }
            }
        }
    }
    Ok(())
}

fn split(pieces: Vec<Piece>, chunk: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        let mut off = 0;
        while off < p.len {
            let len = chunk.min(p.len - off);
            out.push(Piece {
                dev: p.dev + off as u64,
                host: p.host.wrapping_add(off),
                len,
            });
            off += len;
        }
    }
    out
}
