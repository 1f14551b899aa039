//! The host backend: "device memory" is memory mapped through a memfd.
//!
//! - reserve: `mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`;
//! - create: `memfd_create` + `ftruncate` (no pages yet);
//! - map: `mmap(MAP_SHARED|MAP_FIXED)` of the memfd, read-write, then
//!   `close`: the mapping keeps the file alive, so the pool holds no file
//!   descriptor per allocation and the process's limits are left alone;
//! - populate: `madvise(MADV_POPULATE_WRITE)`, so the kernel provides a
//!   range's pages in one call instead of one fault per page; several
//!   threads can populate parts of one mapping at once;
//! - discard: `madvise(MADV_REMOVE)` on the mapped range, which punches a
//!   hole in the memfd behind it, freeing a part's pages at once, again in
//!   parallel over parts;
//! - unmap: an anonymous `PROT_NONE` mapping over the range, so the range
//!   stays reserved and touching it faults (SIGSEGV) instead of reading
//!   stale data; the memfd goes away with its last mapping, like memory
//!   `cuMemRelease`d while mapped.
//!
//! Physical memory of more than `SEGMENT` bytes is made of several memfds,
//! one per segment, each mapped at its place. A memfd's page operations
//! (hole punching in particular) are serialised by its inode lock; separate
//! segments let the copy threads free and provide pages of one large block
//! at the same time.
//!
//! Pausing therefore really lowers the process's resident set size, and every
//! claim about memory can be checked with `/proc/self/smaps` on a machine
//! without an accelerator.

use crate::backend::{Backend, DevicePtr, PhysHandle};
use crate::{Error, Result};

const NAME: &str = "host";

/// Bytes per memfd of a physical handle.
const SEGMENT: usize = 64 << 20;

/// The segments of `len` bytes at `offset` of a handle: (segment index,
/// offset inside it, length).
fn segments(offset: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let (i, inner) = (at / SEGMENT, at % SEGMENT);
            let n = (SEGMENT - inner).min(end - at);
            at += n;
            (i, inner, n)
        })
    })
}

/// Host memory through memfd mappings. See the module docs.
#[derive(Debug)]
pub struct HostBackend {
    page: usize,
}

impl HostBackend {
    pub fn new() -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        HostBackend {
            page: if page > 0 { page as usize } else { 4096 },
        }
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn granularity(&self) -> usize {
        self.page
    }

    fn parallel_copies(&self) -> bool {
        true
    }

    fn reserve(&self, size: usize) -> Result<DevicePtr> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing touches no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os(NAME, "mmap(PROT_NONE) reserve"));
        }
        Ok(p as DevicePtr)
    }

    unsafe fn free_reserved(&self, addr: DevicePtr, size: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range is ours and unused.
        if unsafe { libc::munmap(addr as *mut libc::c_void, size) } != 0 {
            return Err(Error::os(NAME, "munmap"));
        }
        Ok(())
    }

    fn create(&self, size: usize) -> Result<PhysHandle> {
        let mut handle = PhysHandle(Vec::with_capacity(size.div_ceil(SEGMENT)));
        for (_, _, len) in segments(0, size) {
            // SAFETY: the name is a valid NUL-terminated string.
            let fd = unsafe { libc::memfd_create(c"colo-mem".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                let err = Error::os(NAME, "memfd_create");
                let _ = self.release(handle);
                return Err(err);
            }
            handle.0.push(fd as u64);
            // SAFETY: fd is a memfd we own.
            if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
                let err = Error::os(NAME, "ftruncate(memfd)");
                let _ = self.release(handle);
                return Err(err);
            }
        }
        Ok(handle)
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        let mut result = Ok(());
        for fd in handle.0 {
            // SAFETY: the handle owns its fds; it is consumed here, so each
            // is closed exactly once.
            if unsafe { libc::close(fd as libc::c_int) } != 0 {
                result = Err(Error::os(NAME, "close(memfd)"));
            }
        }
        result
    }

    unsafe fn map(&self, addr: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        let mut failure = None;
        for (i, _, len) in segments(0, size) {
            let at = addr + (i * SEGMENT) as u64;
            // SAFETY: the caller guarantees the range is reserved by us and
            // unused, so MAP_FIXED replaces only our own PROT_NONE
            // placeholder.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    handle.0[i] as libc::c_int,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                failure = Some((i, Error::os(NAME, "mmap(MAP_FIXED|MAP_SHARED) map")));
                break;
            }
        }
        // The mappings keep their memfds alive; the descriptors can go.
        let released = self.release(handle);
        if let Some((i, err)) = failure {
            // SAFETY: the segments mapped so far are ours and unused.
            let _ = unsafe { self.unmap(addr, i * SEGMENT) };
            return Err(err);
        }
        released
    }

    unsafe fn unmap(&self, addr: DevicePtr, size: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range is our mapping and unused;
        // replacing it with PROT_NONE keeps the address range reserved.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os(NAME, "mmap(PROT_NONE) unmap"));
        }
        Ok(())
    }

    unsafe fn populate(&self, addr: DevicePtr, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range is inside our mapping;
        // populating only provides pages, it changes no contents.
        if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) } == 0
        {
            return Ok(());
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(Error::os(NAME, "madvise(MADV_POPULATE_WRITE)"));
        }
        // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch each page,
        // writing back what is there.
        for page in (0..len).step_by(self.page) {
            let p = (addr as usize + page) as *mut u8;
            // SAFETY: inside the caller's mapping, which no one else uses
            // during a populate.
            unsafe { p.write_volatile(p.read_volatile()) };
        }
        Ok(())
    }

    unsafe fn discard(&self, addr: DevicePtr, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range is inside our shared
        // mapping and that no one uses it any more; MADV_REMOVE frees the
        // pages and the memfd's backing store behind them.
        if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_REMOVE) } != 0 {
            return Err(Error::os(NAME, "madvise(MADV_REMOVE)"));
        }
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        // SAFETY: the caller guarantees the source range is mapped and
        // quiescent; `dst` is a distinct host buffer.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // SAFETY: as for `copy_to_host`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_a_range_exactly() {
        let s: Vec<_> = segments(SEGMENT - 10, SEGMENT + 30).collect();
        assert_eq!(s, vec![(0, SEGMENT - 10, 10), (1, 0, SEGMENT), (2, 0, 20)]);
        assert_eq!(segments(0, 0).count(), 0);
        assert_eq!(segments(5, 7).collect::<Vec<_>>(), vec![(0, 5, 7)]);
    }
}
