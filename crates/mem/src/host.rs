//! The host backend: "device memory" is memory mapped through a memfd.
//!
//! - reserve: `mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`;
//! - create: `memfd_create` + `ftruncate` (+ `fallocate`, so the kernel
//!   provides all pages in one call instead of one fault per page);
//! - map: `mmap(MAP_SHARED|MAP_FIXED|MAP_POPULATE)` of the memfd, read-write;
//! - unmap: an anonymous `PROT_NONE` mapping over the range, so the range
//!   stays reserved and touching it faults (SIGSEGV) instead of reading
//!   stale data;
//! - release: `close`. The pages go back to the kernel once the fd is closed
//!   *and* the range is unmapped, exactly like `cuMemRelease`.
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
        let ok = unsafe { libc::ftruncate(fd, size as libc::off_t) } == 0
            // SAFETY: as above; fallocate provides the pages up front, which
            // is several times faster than faulting them in one by one.
            && unsafe { libc::fallocate(fd, 0, 0, size as libc::off_t) } == 0;
        if !ok {
            let err = Error::os(NAME, "ftruncate/fallocate of memfd");
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
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
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
