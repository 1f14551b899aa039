//! Memory claims checked against the operating system, not only against the
//! pool's own bookkeeping.

use colo_mem::{os, Policy, Pool, PoolConfig};
use std::process::Command;

const MIB: usize = 1 << 20;

/// Resident bytes inside the pool's reserved range, per `/proc/self/smaps`.
fn os_resident(p: &Pool) -> u64 {
    let (base, len) = p.address_range();
    os::resident_in_range(base, len).unwrap()
}

#[test]
fn pause_returns_pages_to_the_os_and_resume_brings_them_back() {
    let p = Pool::host(PoolConfig::default()).unwrap();
    p.set_policy("weights", Policy::Backup).unwrap();
    let mut addrs = Vec::new();
    for (tag, n) in [
        ("weights", 24 * MIB),
        ("kv_cache", 40 * MIB),
        ("weights", 8 * MIB),
    ] {
        let a = p.alloc(tag, n).unwrap();
        p.write(a, 0, &vec![0xAB; n]).unwrap();
        addrs.push(a);
    }
    let total = 72 * MIB as u64;
    assert_eq!(p.stats().resident_bytes, total);
    let before = os_resident(&p);
    assert!(before >= total, "os sees {before} of {total}");

    p.pause(&["weights", "kv_cache"]).unwrap();
    let during = os_resident(&p);
    assert_eq!(p.stats().resident_bytes, 0);
    let released = before - during;
    assert!(
        released as f64 >= 0.95 * total as f64,
        "released {released} of {total} by smaps"
    );

    p.resume(&["weights", "kv_cache"]).unwrap();
    let after = os_resident(&p);
    // The backed-up weights are restored; the KV cache (Discard) gets its
    // pages when it is touched.
    assert!(after >= 32 * MIB as u64, "os sees {after} after resume");
    p.write(addrs[1], 0, &vec![1; 40 * MIB]).unwrap();
    let touched = os_resident(&p);
    assert!(
        touched >= total,
        "os sees {touched} after the KV cache is written"
    );
    let mut b = vec![0u8; 8 * MIB];
    p.read(addrs[2], 0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0xAB));
}

#[test]
fn waking_a_discard_tag_costs_only_the_pages_then_touched() {
    let p = Pool::host(PoolConfig::default()).unwrap();
    let kv = p.alloc("kv_cache", 256 * MIB).unwrap();
    p.write(kv, 0, &vec![7; 256 * MIB]).unwrap();
    p.pause(&["kv_cache"]).unwrap();
    let paused = os_resident(&p);
    p.resume(&["kv_cache"]).unwrap();
    assert_eq!(
        p.stats().resident_bytes,
        256 * MIB as u64,
        "mapped and charged in full"
    );
    assert!(
        os_resident(&p) <= paused + MIB as u64,
        "no page provided before use: {} → {}",
        paused,
        os_resident(&p)
    );
    p.write(kv, 0, &vec![1; 8 * MIB]).unwrap();
    let used = os_resident(&p) - paused;
    assert!((8 * MIB as u64..=9 * MIB as u64).contains(&used), "{used}");
    let mut b = vec![9u8; MIB];
    p.read(kv, 200 * MIB, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "an untouched page reads as zero");
}

/// `Overwrite`: contents are forgotten as with `Discard`, but the wake
/// provides every page at once (the rollout engine's weights, rewritten
/// by the weight update right after), and a pause still returns them all.
#[test]
fn waking_an_overwrite_tag_provides_its_pages_up_front() {
    let p = Pool::host(PoolConfig::default()).unwrap();
    p.set_policy("weights", Policy::Overwrite).unwrap();
    let w = p.alloc("weights", 96 * MIB).unwrap();
    p.write(w, 0, &vec![7; 96 * MIB]).unwrap();
    p.pause(&["weights"]).unwrap();
    let paused = os_resident(&p);
    assert_eq!(
        p.stats().tag("weights").unwrap().backup_bytes,
        0,
        "no backup"
    );
    p.resume(&["weights"]).unwrap();
    let woken = os_resident(&p) - paused;
    assert!(
        woken >= 96 * MIB as u64,
        "{woken} bytes provided by the wake, before any write"
    );
    let mut b = vec![9u8; MIB];
    p.read(w, 50 * MIB, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "contents are not kept");
    p.pause(&["weights"]).unwrap();
    assert!(
        os_resident(&p) <= paused + MIB as u64,
        "a pause returns them"
    );
}

#[test]
fn freed_cache_is_resident_until_empty_cache() {
    let p = Pool::host(PoolConfig::default()).unwrap();
    let a = p.alloc("kv", 16 * MIB).unwrap();
    p.write(a, 0, &vec![1; 16 * MIB]).unwrap();
    p.free(a).unwrap();
    assert!(os_resident(&p) >= 16 * MIB as u64);
    p.empty_cache();
    assert!(os_resident(&p) < MIB as u64);
}

/// The body run in a child process: touches a paused buffer, which must
/// fault. Does nothing in the ordinary test run.
#[test]
fn child_touch_paused_buffer() {
    if std::env::var_os("COLO_MEM_TOUCH_PAUSED").is_none() {
        return;
    }
    let p = Pool::host(PoolConfig::default()).unwrap();
    p.set_policy("w", Policy::Backup).unwrap();
    let a = p.alloc("w", MIB).unwrap();
    p.write(a, 0, &[42; 64]).unwrap();
    p.pause(&["w"]).unwrap();
    // SAFETY: deliberately not: this read must be stopped by the kernel.
    let v = unsafe { std::ptr::read_volatile(a as *const u8) };
    println!("read {v} from paused memory without a fault");
    std::process::exit(0);
}

#[test]
fn touching_paused_memory_faults() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_touch_paused_buffer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("COLO_MEM_TOUCH_PAUSED", "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "child should die of SIGSEGV; status {:?}, stdout {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A block larger than the 64 MiB chunks a transition's threads split
/// their work into (and not a multiple of the page size) pauses and
/// restores as one.
#[test]
fn a_block_spanning_several_chunks_pauses_and_restores_as_one() {
    let p = Pool::host(PoolConfig::default()).unwrap();
    p.set_policy("w", Policy::Backup).unwrap();
    let n = 2 * (64 << 20) + 4096 + 5;
    let a = p.alloc("w", n).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i % 241) as u8 ^ (i >> 20) as u8).collect();
    p.write(a, 0, &data).unwrap();
    let before = os_resident(&p);
    p.pause(&["w"]).unwrap();
    assert!(before - os_resident(&p) >= n as u64 * 95 / 100);
    p.resume(&["w"]).unwrap();
    let mut out = vec![0u8; n];
    p.read(a, 0, &mut out).unwrap();
    assert!(out == data, "contents across chunk boundaries restored");
    assert!(os_resident(&p) >= n as u64);
}
