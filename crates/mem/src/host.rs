//! The host backend: "device memory" is memory mapped through a memfd.
//!
//! - reserve: `mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`;
//! - create: `memfd_create` + `ftruncate` (no pages yet);
//! - map: `mmap(MAP_SHARED|MAP_FIXED)` of the memfd, read-write;
//! - populate: `madvise(MADV_POPULATE_WRITE)`, so the kernel provides a
//!   range's pages in one call instead of one fault per page; several
//!   threads can populate parts of one mapping at once;
//! - discard: `fallocate(FALLOC_FL_PUNCH_HOLE)`, freeing a part's pages at
//!   once, again in parallel over parts;
//! - unmap: an anonymous `PROT_NONE` mapping over the range, so the range
//!   stays reserved and touching it faults (SIGSEGV) instead of reading
//!   stale data;
//! - release: `close`. Any pages not yet discarded go back to the kernel
//!   once the fd is closed *and* the range is unmapped, like `cuMemRelease`.
//!
//! The pool keeps one memfd open per mapped block, so `new` raises the
//! process's soft limit on open files to its hard limit.
//!
//! Pausing therefore really lowers the process's resident set size, and every
//! claim about memory can be checked with `/proc/self/smaps` on a machine
//! without an accelerator.

use crate::backend::{Backend, DevicePtr, PhysHandle};
use crate::{Error, Result};

const NAME: &str = "host";

/// Host memory through memfd mappings. See the module docs.
#[derive(Debug)]
pub struct HostBackend {
    page: usize,
}

impl HostBackend {
    pub fn new() -> Self {
        raise_fd_limit();
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

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (best effort).
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-parameter / in-parameter.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn fd_of(h: &PhysHandle) -> libc::c_int {
    h.0 as libc::c_int
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
        // SAFETY: the name is a valid NUL-terminated string.
        let fd = unsafe { libc::memfd_create(c"colo-mem".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::os(NAME, "memfd_create"));
        }
        let handle = PhysHandle(fd as u64);
        // SAFETY: fd is a memfd we own.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            let err = Error::os(NAME, "ftruncate(memfd)");
            let _ = self.release(handle);
            return Err(err);
        }
        Ok(handle)
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        // SAFETY: the handle owns its fd; it is consumed here, so the fd is
        // closed exactly once.
        if unsafe { libc::close(fd_of(&handle)) } != 0 {
            return Err(Error::os(NAME, "close(memfd)"));
        }
        Ok(())
    }

    unsafe fn map(&self, addr: DevicePtr, size: usize, handle: &PhysHandle) -> Result<()> {
        // SAFETY: the caller guarantees the range is reserved by us and
        // unused, so MAP_FIXED replaces only our own PROT_NONE placeholder.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd_of(handle),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os(NAME, "mmap(MAP_FIXED|MAP_SHARED) map"));
        }
        debug_assert_eq!(p as DevicePtr, addr);
        Ok(())
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

    unsafe fn discard(&self, handle: &PhysHandle, offset: usize, len: usize) -> Result<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: the caller guarantees no one uses this part any more.
        if unsafe {
            libc::fallocate(
                fd_of(handle),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        } != 0
        {
            return Err(Error::os(NAME, "fallocate(PUNCH_HOLE)"));
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
