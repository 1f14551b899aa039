//! The pool's contract: addresses, states, capacity and misuse errors.

use colo_mem::{Error, Policy, Pool, PoolConfig, TagState};

const MIB: u64 = 1 << 20;

fn pool(capacity: u64) -> std::sync::Arc<Pool> {
    Pool::host(PoolConfig::with_capacity(capacity)).unwrap()
}

/// `tag_of` names the allocation an address lies in (on CUDA tensors sit
/// inside a segment-sized allocation), and nothing outside every one.
#[test]
fn tag_of_finds_the_allocation_containing_an_address() {
    let p = pool(u64::MAX);
    let a = p.alloc("weights", 3 * 4096).unwrap();
    assert_eq!(p.tag_of(a).as_deref(), Some("weights"));
    assert_eq!(p.tag_of(a + 4096 + 17).as_deref(), Some("weights"));
    assert_eq!(p.tag_of(a + 3 * 4096 - 1).as_deref(), Some("weights"));
    assert_eq!(p.tag_of(a - 1), None);
    p.free(a).unwrap();
    assert_eq!(p.tag_of(a + 17), None);
}

/// The hold on a tag's libtorch CUDA cache (CUDA graphs' memory) is
/// counted: it lasts until every holder has given it up; giving up a hold
/// nobody took (or on an unknown tag) changes nothing.
#[test]
fn cuda_cache_holds_are_counted() {
    let p = pool(u64::MAX);
    p.release_cuda_cache("cuda_graph");
    assert!(!p.holds_cuda_cache("cuda_graph"));
    p.hold_cuda_cache("cuda_graph");
    p.hold_cuda_cache("cuda_graph");
    p.release_cuda_cache("cuda_graph");
    assert!(p.holds_cuda_cache("cuda_graph"), "one holder left");
    p.release_cuda_cache("cuda_graph");
    assert!(!p.holds_cuda_cache("cuda_graph"));
    p.release_cuda_cache("cuda_graph");
    p.hold_cuda_cache("cuda_graph");
    assert!(p.holds_cuda_cache("cuda_graph"), "not driven below zero");
    assert!(!p.holds_cuda_cache("kv_cache"));
}

#[test]
fn addresses_survive_many_cycles_for_many_buffers_and_tags() {
    let p = pool(u64::MAX);
    p.set_policy("weights", Policy::Backup).unwrap();
    let tags = ["weights", "kv_cache", "train_params"];
    let mut bufs = Vec::new();
    for i in 0..60 {
        let tag = tags[i % 3];
        let size = 4096 * (1 + i % 7) + i; // odd sizes too
        let addr = p.alloc(tag, size).unwrap();
        assert!(p.contains(addr));
        bufs.push((tag, addr, size));
    }
    let addrs: Vec<u64> = bufs.iter().map(|b| b.1).collect();
    for cycle in 0..5 {
        p.pause(&["weights", "kv_cache"]).unwrap();
        p.pause(&["train_params"]).unwrap();
        p.resume(&["train_params", "weights"]).unwrap();
        p.resume(&["kv_cache"]).unwrap();
        for &(tag, addr, _) in &bufs {
            assert_eq!(p.tag_of(addr).as_deref(), Some(tag), "cycle {cycle}");
        }
    }
    assert_eq!(addrs, bufs.iter().map(|b| b.1).collect::<Vec<_>>());
    let s = p.stats();
    assert_eq!(s.tag("kv_cache").unwrap().pauses, 5);
    assert_eq!(s.tag("weights").unwrap().resumes, 5);
}

#[test]
fn stats_follow_alloc_pause_resume_free() {
    let p = pool(u64::MAX);
    let g = p.granularity() as u64;
    p.set_policy("w", Policy::Backup).unwrap();
    let a = p.alloc("w", 3 * g as usize + 1).unwrap();
    let s = p.stats();
    let w = s.tag("w").unwrap();
    assert_eq!(
        (w.allocations, w.allocated_bytes, w.resident_bytes),
        (1, 3 * g + 1, 4 * g)
    );
    assert_eq!(w.state, TagState::Active);

    p.pause(&["w"]).unwrap();
    let w = p.stats().tag("w").unwrap().clone();
    assert_eq!(
        (w.resident_bytes, w.paused_bytes, w.backup_bytes),
        (0, 4 * g, 3 * g + 1)
    );
    assert_eq!(w.state, TagState::Paused);
    assert!(w.last_pause_s.is_some());

    p.resume(&["w"]).unwrap();
    let w = p.stats().tag("w").unwrap().clone();
    assert_eq!(
        (w.resident_bytes, w.paused_bytes, w.backup_bytes),
        (4 * g, 0, 3 * g + 1)
    );

    p.free(a).unwrap();
    let w = p.stats().tag("w").unwrap().clone();
    // The freed block stays mapped in the cache; its backup is gone.
    assert_eq!(
        (
            w.allocations,
            w.resident_bytes,
            w.cached_bytes,
            w.backup_bytes
        ),
        (0, 4 * g, 4 * g, 0)
    );
    assert_eq!(p.empty_cache(), 4 * g);
    assert_eq!(p.stats().resident_bytes, 0);
}

#[test]
fn cache_reuses_freed_blocks_and_pause_returns_them() {
    let p = pool(u64::MAX);
    let a = p.alloc("kv", 1 << 20).unwrap();
    p.free(a).unwrap();
    let b = p.alloc("kv", 1 << 20).unwrap();
    assert_eq!(a, b, "a freed block of the same size is reused");
    // A much smaller request does not take a big cached block.
    p.free(b).unwrap();
    let c = p.alloc("kv", 4096).unwrap();
    assert_ne!(c, b);
    assert_eq!(p.stats().tag("kv").unwrap().cached_bytes, 1 << 20);
    p.pause(&["kv"]).unwrap();
    let kv = p.stats().tag("kv").unwrap().clone();
    assert_eq!((kv.cached_bytes, kv.resident_bytes), (0, 0));
}

/// The resident peak counts cached blocks (PyTorch's reserved bytes); the
/// allocated peak does not: a block freed into the cache and taken again
/// raises neither, a second live block raises both, and `reset_peak`
/// starts both from now.
#[test]
fn peaks_of_resident_and_of_allocated_bytes() {
    let p = pool(u64::MAX);
    let a = p.alloc("act", 4 * MIB as usize).unwrap();
    p.free(a).unwrap();
    // Too small to take the cached 4 MiB block (more than half wasted).
    let small = p.alloc("act", MIB as usize).unwrap();
    let s = p.stats();
    assert_eq!(s.peak_resident_bytes, 5 * MIB);
    assert_eq!(
        s.peak_allocated_bytes,
        4 * MIB,
        "never 5 MiB allocated at once"
    );
    p.free(small).unwrap();
    p.reset_peak();
    let s = p.stats();
    assert_eq!(
        (s.peak_resident_bytes, s.peak_allocated_bytes),
        (5 * MIB, 0)
    );
    let b = p.alloc("act", 4 * MIB as usize).unwrap(); // from the cache
    assert_eq!(b, a);
    let s = p.stats();
    assert_eq!(
        (s.peak_resident_bytes, s.peak_allocated_bytes),
        (5 * MIB, 4 * MIB)
    );
    let _c = p.alloc("act", MIB as usize).unwrap(); // from the cache too
    let s = p.stats();
    assert_eq!(
        (s.peak_resident_bytes, s.peak_allocated_bytes),
        (5 * MIB, 5 * MIB)
    );
}

#[test]
fn discard_gives_fresh_zeroed_memory_and_backup_restores() {
    let p = pool(u64::MAX);
    p.set_policy("keep", Policy::Backup).unwrap();
    let n = 3 * MIB as usize + 123;
    let keep = p.alloc("keep", n).unwrap();
    let lose = p.alloc("lose", n).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    p.write(keep, 0, &data).unwrap();
    p.write(lose, 0, &data).unwrap();
    p.pause(&["keep", "lose"]).unwrap();
    p.resume(&["keep", "lose"]).unwrap();
    let mut out = vec![0u8; n];
    p.read(keep, 0, &mut out).unwrap();
    assert!(out == data, "backup must restore bit-exactly");
    p.read(lose, 0, &mut out).unwrap();
    assert!(
        out.iter().all(|&b| b == 0),
        "discarded memory comes back fresh"
    );
}

#[test]
fn backup_buffer_is_reused_across_cycles() {
    let p = pool(u64::MAX);
    p.set_policy("w", Policy::Backup).unwrap();
    let a = p.alloc("w", 2 << 20).unwrap();
    p.write(a, 0, &[7; 16]).unwrap();
    for i in 0..4u8 {
        p.pause(&["w"]).unwrap();
        assert_eq!(p.stats().tag("w").unwrap().backup_bytes, 2 << 20);
        p.resume(&["w"]).unwrap();
        let mut b = [0u8; 16];
        p.read(a, 0, &mut b).unwrap();
        assert_eq!(b, [7 + i; 16]);
        p.write(a, 0, &[8 + i; 16]).unwrap();
    }
}

#[test]
fn misuse_is_an_error_naming_tag_and_state() {
    let p = pool(u64::MAX);
    let a = p.alloc("kv_cache", 4096).unwrap();
    p.pause(&["kv_cache"]).unwrap();

    let e = p.pause(&["kv_cache"]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TagState {
                state: TagState::Paused,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.to_string(), "cannot pause tag `kv_cache`: it is paused");

    let e = p.alloc("kv_cache", 4096).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot allocate in tag `kv_cache`: it is paused"
    );

    let e = p.write(a, 0, &[1]).unwrap_err();
    assert_eq!(e.to_string(), "cannot write tag `kv_cache`: it is paused");

    let e = p.set_policy("kv_cache", Policy::Backup).unwrap_err();
    assert!(
        e.to_string().contains("`kv_cache`") && e.to_string().contains("paused"),
        "{e}"
    );

    p.resume(&["kv_cache"]).unwrap();
    let e = p.resume(&["kv_cache"]).unwrap_err();
    assert_eq!(e.to_string(), "cannot resume tag `kv_cache`: it is active");

    let e = p.pause(&["nope"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot pause tag `nope`: no such tag in this pool (known tags: `kv_cache`)"
    );

    let e = p.pause(&["kv_cache", "kv_cache"]).unwrap_err();
    assert!(matches!(e, Error::DuplicateTag { .. }), "{e}");
    assert_eq!(
        p.tag_state("kv_cache"),
        Some(TagState::Active),
        "a failed call changes nothing"
    );

    p.free(a).unwrap();
    let e = p.free(a).unwrap_err();
    assert!(
        e.to_string().contains(&format!("{a:#x}"))
            && e.to_string().contains("not a live allocation"),
        "{e}"
    );
    assert!(matches!(
        p.free(12345).unwrap_err(),
        Error::UnknownAddress { .. }
    ));
    assert!(matches!(p.alloc("x", 0).unwrap_err(), Error::Invalid(_)));
}

#[test]
fn a_failed_multi_tag_pause_changes_nothing() {
    let p = pool(u64::MAX);
    p.alloc("a", 4096).unwrap();
    p.alloc("b", 4096).unwrap();
    p.pause(&["b"]).unwrap();
    assert!(p.pause(&["a", "b"]).is_err());
    assert_eq!(p.tag_state("a"), Some(TagState::Active));
    assert_eq!(p.stats().tag("a").unwrap().resident_bytes, 4096);
}

#[test]
fn free_in_a_paused_tag_returns_the_address_range() {
    let p = pool(u64::MAX);
    p.set_policy("w", Policy::Backup).unwrap();
    let a = p.alloc("w", 8192).unwrap();
    p.pause(&["w"]).unwrap();
    p.free(a).unwrap();
    let w = p.stats().tag("w").unwrap().clone();
    assert_eq!(
        (
            w.allocations,
            w.paused_bytes,
            w.backup_bytes,
            w.resident_bytes
        ),
        (0, 0, 0, 0)
    );
    p.resume(&["w"]).unwrap();
    assert_eq!(p.stats().resident_bytes, 0);
}

#[test]
fn out_of_memory_on_map_names_the_request_and_resident_bytes() {
    let p = pool(8 * MIB);
    p.set_phase("rollout");
    p.alloc("weights", 5 * MIB as usize).unwrap();
    let e = p.alloc("kv_cache", 4 * MIB as usize).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::OutOfMemory { requested, .. } if requested == 4 * MIB),
        "{msg}"
    );
    assert!(msg.contains("phase `rollout`"), "{msg}");
    assert!(msg.contains("4.0 MiB for tag `kv_cache`"), "{msg}");
    assert!(msg.contains("capacity of 8.0 MiB"), "{msg}");
    assert!(msg.contains("weights: 5.0 MiB"), "{msg}");
    // Nothing was charged for the refused request.
    assert_eq!(p.stats().resident_bytes, 5 * MIB);
    assert!(p.alloc("kv_cache", 3 * MIB as usize).is_ok());
    assert!(p
        .timeline()
        .iter()
        .any(|e| e.kind == colo_mem::EventKind::OutOfMemory));
}

#[test]
fn capacity_shortfall_first_drops_cached_blocks() {
    let p = pool(8 * MIB);
    let a = p.alloc("old", 6 * MIB as usize).unwrap();
    p.free(a).unwrap();
    assert_eq!(p.stats().resident_bytes, 6 * MIB);
    p.alloc("new", 6 * MIB as usize)
        .expect("the cached block is returned to make room");
    assert_eq!(p.stats().tag("old").unwrap().cached_bytes, 0);
}

#[test]
fn resume_out_of_memory_half_way_rolls_back() {
    let p = pool(10 * MIB);
    p.set_policy("weights", Policy::Backup).unwrap();
    let w1 = p.alloc("weights", 3 * MIB as usize).unwrap();
    let w2 = p.alloc("weights", 3 * MIB as usize).unwrap();
    p.write(w1, 0, b"first").unwrap();
    p.write(w2, 0, b"second").unwrap();
    p.pause(&["weights"]).unwrap();
    // Something else takes memory while the weights are paused: only one of
    // the two weight buffers fits back.
    let other = p.alloc("train", 5 * MIB as usize).unwrap();
    let e = p.resume(&["weights"]).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { op: "resume", .. }), "{e}");
    assert!(e.to_string().contains("train: 5.0 MiB"), "{e}");

    // The pool is as it was before the call.
    let s = p.stats();
    assert_eq!(s.resident_bytes, 5 * MIB);
    let w = s.tag("weights").unwrap();
    assert_eq!(
        (w.state, w.resident_bytes, w.paused_bytes),
        (TagState::Paused, 0, 6 * MIB)
    );
    assert!(p
        .timeline()
        .iter()
        .any(|e| e.kind == colo_mem::EventKind::ResumeFailed));

    // After making room the resume succeeds and the backups are intact.
    p.free(other).unwrap();
    p.empty_cache();
    p.resume(&["weights"]).unwrap();
    let mut b = [0u8; 6];
    p.read(w2, 0, &mut b).unwrap();
    assert_eq!(&b, b"second");
    p.read(w1, 0, &mut b[..5]).unwrap();
    assert_eq!(&b[..5], b"first");
}

/// A writer takes the events as they come (`timeline_since`), each with
/// the caller's step; events the ring dropped before they were taken are
/// skipped, never repeated.
#[test]
fn timeline_since_gives_each_event_once_with_its_step() {
    let p = Pool::host(PoolConfig {
        timeline_limit: 4,
        ..PoolConfig::default()
    })
    .unwrap();
    p.set_step(1);
    p.mark();
    p.mark();
    let (first, seen) = p.timeline_since(0);
    assert_eq!((first.len(), seen), (2, 2));
    assert!(first.iter().all(|e| e.step == 1));
    p.set_step(2);
    for _ in 0..6 {
        p.mark();
    }
    let (next, seen) = p.timeline_since(seen);
    assert_eq!(seen, 8);
    assert_eq!(next.len(), 4, "the ring kept the last 4 of the 6");
    assert!(next.iter().all(|e| e.step == 2));
    assert!(p.timeline_since(seen).0.is_empty());
}

#[test]
fn timeline_records_every_transition_with_phase_and_per_tag_bytes() {
    let p = pool(u64::MAX);
    p.set_phase("load");
    let _w = p.alloc("weights", 1 << 20).unwrap();
    let _k = p.alloc("kv_cache", 2 << 20).unwrap();
    p.set_phase("train");
    p.pause(&["weights", "kv_cache"]).unwrap();
    p.set_phase("wake");
    p.resume(&["weights"]).unwrap();
    p.resume(&["kv_cache"]).unwrap();
    let t = p.timeline();
    let kinds: Vec<_> = t
        .iter()
        .map(|e| (e.kind, e.phase.as_str(), e.resident_bytes))
        .collect();
    use colo_mem::EventKind::*;
    assert_eq!(
        kinds,
        vec![
            (Phase, "load", 0),
            (Phase, "train", 3 << 20),
            (Pause, "train", 0),
            (Phase, "wake", 0),
            (Resume, "wake", 1 << 20),
            (Resume, "wake", 3 << 20)
        ]
    );
    assert_eq!(t[4].per_tag["weights"], 1 << 20);
    assert_eq!(t[4].per_tag["kv_cache"], 0);
    assert!(t.windows(2).all(|w| w[0].t_s <= w[1].t_s));

    let dir = std::env::temp_dir().join(format!("colo-mem-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("timeline.jsonl");
    p.write_timeline(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(lines[2]["kind"], "pause");
    assert_eq!(lines[5]["per_tag"]["kv_cache"], 2 << 20);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn peak_is_tracked_and_resettable() {
    let p = pool(u64::MAX);
    let a = p.alloc("a", 4 << 20).unwrap();
    p.pause(&["a"]).unwrap();
    assert_eq!(p.stats().peak_resident_bytes, 4 << 20);
    p.reset_peak();
    assert_eq!(p.stats().peak_resident_bytes, 0);
    p.resume(&["a"]).unwrap();
    assert_eq!(p.stats().peak_resident_bytes, 4 << 20);
    p.free(a).unwrap();
}

#[test]
fn the_timeline_keeps_the_most_recent_events_up_to_its_limit() {
    let p = Pool::host(PoolConfig {
        timeline_limit: 4,
        ..PoolConfig::default()
    })
    .unwrap();
    for i in 0..10 {
        p.set_phase(&format!("p{i}"));
    }
    let phases: Vec<String> = p.timeline().into_iter().map(|e| e.phase).collect();
    assert_eq!(phases, ["p6", "p7", "p8", "p9"]);
}
