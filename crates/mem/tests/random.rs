//! Thousands of random operations from several threads, checked after every
//! step against a model of what each live buffer must contain and what must
//! be resident (by the pool's statistics and, every few steps, by smaps).

use colo_mem::{os, Policy, Pool, PoolConfig, TagState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const TAGS: [(&str, Policy); 3] = [
    ("weights", Policy::Backup),
    ("kv_cache", Policy::Discard),
    ("optim", Policy::Backup),
];

/// xorshift64*: enough randomness, no dependency, reproducible by seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Model {
    /// addr → (tag index, size, the byte every position must hold).
    live: HashMap<u64, (usize, usize, u8)>,
    paused: [bool; 3],
}

fn check_step(pool: &Pool, m: &Model, step: usize) {
    let s = pool.stats();
    let g = pool.granularity() as u64;
    let mut total = 0;
    for (i, (tag, _)) in TAGS.iter().enumerate() {
        let Some(t) = s.tag(tag) else { continue };
        let mapped: u64 = m
            .live
            .values()
            .filter(|v| v.0 == i)
            .map(|v| (v.1 as u64).div_ceil(g) * g)
            .sum();
        let count = m.live.values().filter(|v| v.0 == i).count();
        let requested: u64 = m
            .live
            .values()
            .filter(|v| v.0 == i)
            .map(|v| v.1 as u64)
            .sum();
        assert_eq!(
            (t.allocations, t.allocated_bytes),
            (count, requested),
            "step {step}: allocations of {tag}"
        );
        if m.paused[i] {
            assert_eq!(t.state, TagState::Paused, "step {step}");
            assert_eq!(
                (t.resident_bytes, t.cached_bytes),
                (0, 0),
                "step {step}: {tag}"
            );
            // A reused cached block may be up to twice the rounded request.
            assert!(
                t.paused_bytes >= mapped && t.paused_bytes <= 2 * mapped,
                "step {step}: {tag}"
            );
        } else {
            assert_eq!(t.state, TagState::Active, "step {step}");
            assert!(
                t.resident_bytes >= mapped + t.cached_bytes,
                "step {step}: {tag}"
            );
            assert!(
                t.resident_bytes <= 2 * mapped + t.cached_bytes,
                "step {step}: {tag}"
            );
            assert_eq!(t.paused_bytes, 0);
        }
        total += t.resident_bytes;
    }
    assert_eq!(s.resident_bytes, total, "step {step}");
    if step.is_multiple_of(50) {
        let (base, len) = pool.address_range();
        // Backup tags are fully present (restored on resume); a Discard
        // tag's pages come back on first touch, so after a resume the OS
        // may count fewer than the pool has mapped, never more.
        let backed: u64 = s
            .tags
            .iter()
            .filter(|t| t.policy == Policy::Backup)
            .map(|t| t.resident_bytes)
            .sum();
        let os_bytes = os::resident_in_range(base, len).unwrap();
        assert!(
            (backed..=total).contains(&os_bytes),
            "step {step}: smaps {os_bytes} outside [{backed}, {total}]"
        );
    }
}

fn one_op(pool: &Pool, m: &mut Model, rng: &mut Rng, step: usize) {
    let tag_i = rng.below(3) as usize;
    let tag = TAGS[tag_i].0;
    match rng.below(10) {
        0..=2 => {
            let size = 1 + rng.below(96 << 10) as usize;
            let r = pool.alloc(tag, size);
            if m.paused[tag_i] {
                assert!(r.is_err(), "step {step}: alloc in paused tag must fail");
            } else {
                let a = r.unwrap();
                let fill = rng.next() as u8;
                pool.write(a, 0, &vec![fill; size]).unwrap();
                m.live.insert(a, (tag_i, size, fill));
            }
        }
        3 | 4 => {
            if let Some(&a) = m
                .live
                .keys()
                .nth(rng.below(m.live.len().max(1) as u64) as usize)
            {
                pool.free(a).unwrap();
                m.live.remove(&a);
            }
        }
        5 | 6 => {
            if let Some((&a, &(t, size, _))) = m
                .live
                .iter()
                .nth(rng.below(m.live.len().max(1) as u64) as usize)
            {
                let mut buf = vec![0u8; size];
                let r = pool.read(a, 0, &mut buf);
                if m.paused[t] {
                    assert!(r.is_err(), "step {step}: read of paused buffer must fail");
                } else {
                    r.unwrap();
                    let want = m.live[&a].2;
                    assert!(
                        buf.iter().all(|&b| b == want),
                        "step {step}: buffer {a:#x} of {} lost its contents",
                        TAGS[t].0
                    );
                    let fill = rng.next() as u8;
                    pool.write(a, 0, &vec![fill; size]).unwrap();
                    m.live.get_mut(&a).unwrap().2 = fill;
                }
            }
        }
        7 => {
            let r = pool.pause(&[tag]);
            if m.paused[tag_i] || pool.tag_state(tag).is_none() {
                assert!(r.is_err(), "step {step}");
            } else {
                r.unwrap();
                m.paused[tag_i] = true;
            }
        }
        8 => {
            let r = pool.resume(&[tag]);
            if !m.paused[tag_i] {
                assert!(r.is_err(), "step {step}");
            } else {
                r.unwrap();
                m.paused[tag_i] = false;
                if TAGS[tag_i].1 == Policy::Discard {
                    for v in m.live.values_mut().filter(|v| v.0 == tag_i) {
                        v.2 = 0; // fresh memory
                    }
                }
            }
        }
        _ => {
            pool.empty_cache();
        }
    }
}

#[test]
fn random_operations_from_several_threads_match_the_model() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    for (tag, policy) in TAGS {
        pool.set_policy(tag, policy).unwrap();
    }
    let model = Arc::new(Mutex::new(Model::default()));
    let steps_per_thread = 1000;
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (pool, model) = (&pool, Arc::clone(&model));
            s.spawn(move || {
                let mut rng = Rng(0x9E3779B97F4A7C15 ^ (t + 1));
                for i in 0..steps_per_thread {
                    // The model lock orders operations so the model knows the
                    // outcome; the pool is still entered from three threads.
                    let mut m = model.lock().unwrap();
                    one_op(pool, &mut m, &mut rng, i);
                    check_step(pool, &m, i);
                }
            });
        }
    });
}

#[test]
fn concurrent_alloc_free_while_another_tag_cycles() {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    pool.set_policy("cycling", Policy::Backup).unwrap();
    let n = 48 << 20; // big enough for the multi-threaded copy path
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 253) as u8).collect();
    let big = pool.alloc("cycling", n).unwrap();
    pool.write(big, 0, &data).unwrap();
    std::thread::scope(|s| {
        for (t, tag) in ["x", "y"].into_iter().enumerate() {
            let pool = &pool;
            s.spawn(move || {
                let mut rng = Rng(77 + t as u64);
                let mut mine: Vec<(u64, u8, usize)> = Vec::new();
                for _ in 0..600 {
                    if mine.len() < 16 && rng.below(2) == 0 {
                        let size = 1 + rng.below(200 << 10) as usize;
                        let a = pool.alloc(tag, size).unwrap();
                        let fill = rng.next() as u8;
                        pool.write(a, 0, &vec![fill; size]).unwrap();
                        mine.push((a, fill, size));
                    } else if let Some((a, fill, size)) = mine.pop() {
                        let mut b = vec![0u8; size];
                        pool.read(a, 0, &mut b).unwrap();
                        assert!(b.iter().all(|&x| x == fill));
                        pool.free(a).unwrap();
                    }
                }
                for (a, _, _) in mine {
                    pool.free(a).unwrap();
                }
            });
        }
        for _ in 0..10 {
            pool.pause(&["cycling"]).unwrap();
            pool.resume(&["cycling"]).unwrap();
        }
    });
    let mut out = vec![0u8; n];
    pool.read(big, 0, &mut out).unwrap();
    assert!(out == data);
    let s = pool.stats();
    assert_eq!(
        s.tag("x").unwrap().allocations + s.tag("y").unwrap().allocations,
        0
    );
}
