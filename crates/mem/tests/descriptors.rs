//! A pool holds no file descriptor per allocation and leaves the process's
//! limits alone (issue 10): tens of thousands of small live allocations,
//! paused and resumed, do not move `/proc/self/fd` or `RLIMIT_NOFILE`, and
//! every other `open()` in the process keeps working.
//!
//! One test in its own binary, so no other test opens files meanwhile.

use colo_mem::{os, Policy, Pool, PoolConfig};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn nofile_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-parameter.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    (lim.rlim_cur, lim.rlim_max)
}

#[test]
fn thirty_thousand_allocations_hold_no_descriptors() {
    const N: usize = 30_000;
    let limit = nofile_limit();
    let fds = open_fds();
    let p = Pool::host(PoolConfig::with_capacity(1 << 30)).unwrap();
    p.set_policy("small", Policy::Backup).unwrap();

    let addrs: Vec<u64> = (0..N)
        .map(|i| {
            let a = p
                .alloc("small", 4096)
                .unwrap_or_else(|e| panic!("alloc {i}: {e}"));
            p.write(a, 0, &(i as u64).to_le_bytes()).unwrap();
            a
        })
        .collect();
    assert_eq!(nofile_limit(), limit, "the pool changed RLIMIT_NOFILE");
    let held = open_fds().saturating_sub(fds);
    assert!(held <= 4, "{held} descriptors held for {N} allocations");
    // Other opens in the process still work.
    assert!(os::status_bytes("VmRSS").unwrap() > 0);

    let (base, span) = p.address_range();
    let mapped = os::resident_in_range(base, span).unwrap();
    assert!(mapped >= (N * 4096) as u64, "resident {mapped} B");
    p.pause(&["small"]).unwrap();
    assert_eq!(os::resident_in_range(base, span).unwrap(), 0);
    assert_eq!(p.stats().resident_bytes, 0);
    p.resume(&["small"]).unwrap();
    assert!(open_fds().saturating_sub(fds) <= 4);

    for (i, &a) in addrs.iter().enumerate() {
        let mut out = [0u8; 8];
        p.read(a, 0, &mut out).unwrap();
        assert_eq!(
            u64::from_le_bytes(out),
            i as u64,
            "allocation {i} after resume"
        );
    }
    for a in addrs {
        p.free(a).unwrap();
    }
    drop(p);
    assert!(open_fds().saturating_sub(fds) <= 4);
}
