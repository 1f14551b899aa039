//! Backend failures part way through a resume: the call undoes its own work.
//! A wrapper around the real host backend injects the failure (the host
//! backend itself is tested everywhere else).

use colo_mem::{
    Backend, DevicePtr, Error, HostBackend, PhysHandle, Policy, Pool, PoolConfig, TagState,
};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

struct Flaky {
    inner: HostBackend,
    /// Creates that succeed before one fails; negative: never fail.
    creates_left: Arc<AtomicI64>,
}

impl Backend for Flaky {
    fn name(&self) -> &'static str {
        "flaky-host"
    }
    fn granularity(&self) -> usize {
        self.inner.granularity()
    }
    fn reserve(&self, size: usize) -> colo_mem::Result<DevicePtr> {
        self.inner.reserve(size)
    }
    unsafe fn free_reserved(&self, addr: DevicePtr, size: usize) -> colo_mem::Result<()> {
        unsafe { self.inner.free_reserved(addr, size) }
    }
    fn create(&self, size: usize) -> colo_mem::Result<PhysHandle> {
        if self.creates_left.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err(Error::Backend {
                backend: "flaky-host",
                call: "create",
                msg: "injected failure".into(),
            });
        }
        self.inner.create(size)
    }
    fn release(&self, h: PhysHandle) -> colo_mem::Result<()> {
        self.inner.release(h)
    }
    unsafe fn map(&self, addr: DevicePtr, size: usize, h: PhysHandle) -> colo_mem::Result<()> {
        unsafe { self.inner.map(addr, size, h) }
    }
    unsafe fn unmap(&self, addr: DevicePtr, size: usize) -> colo_mem::Result<()> {
        unsafe { self.inner.unmap(addr, size) }
    }
    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> colo_mem::Result<()> {
        unsafe { self.inner.copy_to_host(src, dst) }
    }
    unsafe fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> colo_mem::Result<()> {
        unsafe { self.inner.copy_from_host(dst, src) }
    }
}

#[test]
fn backend_failure_half_way_through_resume_is_undone() {
    let creates_left = Arc::new(AtomicI64::new(-1));
    let backend = Flaky {
        inner: HostBackend::new(),
        creates_left: Arc::clone(&creates_left),
    };
    let pool = Pool::new(Box::new(backend), PoolConfig::default()).unwrap();
    pool.set_policy("w", Policy::Backup).unwrap();
    let bufs: Vec<u64> = (0..4u8)
        .map(|i| {
            let a = pool.alloc("w", 1 << 20).unwrap();
            pool.write(a, 0, &[i + 1; 100]).unwrap();
            a
        })
        .collect();
    pool.pause(&["w"]).unwrap();

    creates_left.store(2, Ordering::SeqCst); // the third map fails
    let e = pool.resume(&["w"]).unwrap_err();
    assert!(e.to_string().contains("injected failure"), "{e}");
    let s = pool.stats();
    assert_eq!(
        s.resident_bytes, 0,
        "the two mapped buffers were unmapped again"
    );
    assert_eq!(s.tag("w").unwrap().state, TagState::Paused);
    assert_eq!(
        s.tag("w").unwrap().backup_bytes,
        4 << 20,
        "backups are kept"
    );
    let (base, len) = pool.address_range();
    assert_eq!(colo_mem::os::resident_in_range(base, len).unwrap(), 0);

    creates_left.store(-1, Ordering::SeqCst);
    pool.resume(&["w"]).unwrap();
    for (i, &a) in bufs.iter().enumerate() {
        let mut b = [0u8; 100];
        pool.read(a, 0, &mut b).unwrap();
        assert_eq!(b, [i as u8 + 1; 100]);
    }
}

#[test]
fn backend_failure_on_alloc_charges_nothing() {
    let creates_left = Arc::new(AtomicI64::new(0));
    let backend = Flaky {
        inner: HostBackend::new(),
        creates_left,
    };
    let pool = Pool::new(Box::new(backend), PoolConfig::with_capacity(1 << 30)).unwrap();
    assert!(pool.alloc("a", 4096).is_err());
    assert_eq!(pool.stats().resident_bytes, 0);
    assert!(pool.alloc("a", 4096).is_ok());
}
