//! The host backend: "device memory" is anonymous memory mapped at fixed
//! addresses inside a reserved range.
//!
//! - reserve: `mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`;
//! - create: nothing to make (anonymous memory has no handle; it comes
//!   into being when it is mapped), so the handle is empty;
//! - map: `mmap(MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED)` read-write over the
//!   placeholder, and `madvise(MADV_HUGEPAGE)` on blocks of 2 MiB or more,
//!   so that the kernel backs them with transparent huge pages where the
//!   machine allows (`enabled` = `always` or `madvise`);
//! - populate: `madvise(MADV_POPULATE_WRITE)`, so the kernel provides a
//!   range's pages in one call instead of one fault per page; several
//!   threads can populate parts of one mapping at once;
//! - discard: `madvise(MADV_DONTNEED)`, which frees a private anonymous
//!   range's pages at once (a later touch would read zeros), again in
//!   parallel over parts;
//! - unmap: an anonymous `PROT_NONE` mapping over the range, so the range
//!   stays reserved and touching it faults (SIGSEGV) instead of reading
//!   stale data.
//!
//! The backend holds no file descriptor at all. It used a memfd per 64 MiB
//! (the design's letter): freeing a memfd's pages (`MADV_REMOVE`, a hole
//! punched in the file) cost more than copying them out, and shared memory
//! gets no huge pages on these kernels (`shmem_enabled = never`). Measured
//! on the 2-core AMX Xeon, 1 GiB copied out and freed on two threads: memfd
//! 0.66-0.68x a memcpy, anonymous 4 KiB pages 0.86x, anonymous huge pages
//! 1.09-1.18x (and populating 1 GiB 120 ms against 240-330).
//!
//! Pausing therefore really lowers the process's resident set size, and every
//! claim about memory can be checked with `/proc/self/smaps` on a machine
//! without an accelerator.

use crate::backend::{Backend, DevicePtr, PhysHandle};
use crate::{Error, Result};

const NAME: &str = "host";

/// Blocks at least this large get `MADV_HUGEPAGE`.
const HUGE_PAGE: usize = 2 << 20;

/// Host memory through anonymous mappings. See the module docs.
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

    fn create(&self, _size: usize) -> Result<PhysHandle> {
        // Anonymous memory is made by `map`; there is nothing to hold.
        Ok(PhysHandle(Vec::new()))
    }

    fn release(&self, _handle: PhysHandle) -> Result<()> {
        Ok(())
    }

    unsafe fn map(&self, addr: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        self.release(handle)?;
        // SAFETY: the caller guarantees the range is reserved by us and
        // unused, so MAP_FIXED replaces only our own PROT_NONE placeholder.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os(NAME, "mmap(MAP_FIXED|MAP_ANONYMOUS) map"));
        }
        if size >= HUGE_PAGE {
            // SAFETY: advice on our own fresh mapping; it changes no
            // contents. A kernel without transparent huge pages refuses
            // it, which leaves 4 KiB pages: nothing to report.
            unsafe { libc::madvise(p, size, libc::MADV_HUGEPAGE) };
        }
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

    unsafe fn discard(&self, addr: DevicePtr, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range is inside our private
        // anonymous mapping and that no one uses it any more; MADV_DONTNEED
        // frees its pages (splitting a huge page it covers only in part).
        if unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
            return Err(Error::os(NAME, "madvise(MADV_DONTNEED)"));
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

/// Asks for transparent huge pages behind the 2 MiB-aligned interior of a
/// fresh host buffer (a pause's backup), before its first write: a GiB
/// then takes 512 page faults instead of 262,144, and the first pause of a
/// tag copies out at the speed of later ones. Advice only: on a kernel
/// without huge pages nothing changes.
pub(crate) fn advise_huge_pages(buf: &[u8]) {
    let start = (buf.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
    let end = (buf.as_ptr() as usize).saturating_add(buf.len()) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: the range lies inside `buf`, memory this process owns;
        // MADV_HUGEPAGE changes how future faults are served, never the
        // contents or the mapping's permissions.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}
