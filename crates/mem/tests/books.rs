//! The pool's books under concurrency: several threads, each with tags of
//! its own (a `Backup` tag, a `Discard` tag and one whose policy flips), run
//! seeded random operations on one pool with no lock of their own around
//! them, and after every operation each thread checks its tags' statistics
//! against a model of what it did:
//!
//! - allocations, requested bytes and backup bytes equal the model's;
//! - a paused tag holds nothing (no resident or cached bytes) and its
//!   paused bytes are exactly what its allocations map;
//! - an active tag's resident bytes are exactly its allocations' mapped
//!   bytes plus its cached blocks, where the cached blocks are the ones the
//!   model freed since the tag's cache was last emptied (by anyone: another
//!   thread's `empty_cache`, or a full pool dropping caches, empties every
//!   active tag's cache at once);
//! - the pool's resident bytes are its tags' plus the bytes being released;
//! - no two live allocations of any thread overlap, and every buffer holds
//!   what was last written (or zeros after a `Discard` resume).
//!
//! At fixed points all threads meet and one checks that the kernel's
//! resident bytes in the pool's range never exceed the pool's count, and
//! the count never exceeds the capacity.
//!
//! The CI runs a few seeds in seconds; `COLO_SOAK_SECS=600 cargo test -p
//! colo-mem --test books -- --ignored` runs new seeds for that long.

use colo_mem::{os, Error, Policy, Pool, PoolConfig, PoolStats, TagState};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

const THREADS: usize = 4;
/// Operations between the points where all threads meet.
const ROUND: usize = 50;
/// Most live allocations a thread keeps.
const MAX_LIVE: usize = 24;

/// xorshift64*: enough randomness, no dependency, reproducible by seed.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
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

struct Live {
    requested: u64,
    mapped: u64,
    /// The byte every position holds.
    fill: u8,
    /// Whether the pool keeps a host backup of it (a `Backup` pause made
    /// one; it lives until the free or a switch to `Discard`).
    backed: bool,
}

struct TagModel {
    name: String,
    policy: Policy,
    /// Whether the policy flips between operations.
    flips: bool,
    paused: bool,
    live: BTreeMap<u64, Live>,
    /// Freed blocks (address, mapped bytes) in the order they were freed.
    /// The pool holds a suffix of them: anyone may empty the cache.
    cache: Vec<(u64, u64)>,
}

/// Every thread's live ranges, to check that none overlap.
type Ranges = Mutex<BTreeMap<u64, (u64, usize)>>;

struct Shared {
    pool: std::sync::Arc<Pool>,
    ranges: Ranges,
    barrier: Barrier,
    failed: AtomicBool,
    gran: u64,
}

struct Worker<'a> {
    sh: &'a Shared,
    id: usize,
    rng: Rng,
    tags: Vec<TagModel>,
    /// The last operations, for the failure message.
    log: Vec<String>,
}

impl Worker<'_> {
    fn rounded(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.sh.gran) * self.sh.gran
    }

    fn note(&mut self, s: String) {
        if self.log.len() == 12 {
            self.log.remove(0);
        }
        self.log.push(s);
    }

    fn size(&mut self) -> u64 {
        match self.rng.below(20) {
            0 => (4 << 20) + self.rng.below(12 << 20),
            1..=5 => (64 << 10) + self.rng.below(1 << 20),
            _ => 1 + self.rng.below(64 << 10),
        }
    }

    fn pick_live(&mut self, t: usize) -> Option<u64> {
        let n = self.tags[t].live.len() as u64;
        (n > 0).then(|| {
            let i = self.rng.below(n) as usize;
            *self.tags[t].live.keys().nth(i).unwrap()
        })
    }

    /// One random operation on one of this thread's tags.
    fn op(&mut self) -> Result<(), String> {
        let t = self.rng.below(self.tags.len() as u64) as usize;
        let pool = self.sh.pool.clone();
        let name = self.tags[t].name.clone();
        match self.rng.below(16) {
            0..=3 => {
                let live: usize = self.tags.iter().map(|m| m.live.len()).sum();
                if live >= MAX_LIVE {
                    return Ok(());
                }
                let bytes = self.size();
                self.note(format!("alloc {name} {bytes}"));
                match pool.alloc(&name, bytes as usize) {
                    Err(Error::TagState { .. }) if self.tags[t].paused => Ok(()),
                    Err(Error::OutOfMemory { .. }) if pool.capacity() != u64::MAX => Ok(()),
                    Err(e) => Err(format!("alloc of {bytes} in active {name}: {e}")),
                    Ok(_) if self.tags[t].paused => Err(format!("alloc in paused {name} worked")),
                    Ok(addr) => self.allocated(t, addr, bytes),
                }
            }
            4..=6 => {
                let Some(addr) = self.pick_live(t) else {
                    return Ok(());
                };
                self.note(format!("free {name} {addr:#x}"));
                let live = self.tags[t].live.remove(&addr).unwrap();
                self.sh.ranges.lock().unwrap().remove(&addr);
                pool.free(addr).map_err(|e| format!("free: {e}"))?;
                if self.tags[t].paused {
                    // The block goes back as address space, not to a cache.
                } else {
                    self.tags[t].cache.push((addr, live.mapped));
                }
                Ok(())
            }
            7..=8 => {
                let Some(addr) = self.pick_live(t) else {
                    return Ok(());
                };
                self.note(format!("read+write {name} {addr:#x}"));
                let len = self.tags[t].live[&addr].requested as usize;
                let mut buf = vec![0u8; len];
                let r = pool.read(addr, 0, &mut buf);
                if self.tags[t].paused {
                    return match r {
                        Err(Error::TagState { .. }) => Ok(()),
                        _ => Err(format!("read in paused {name}: {r:?}")),
                    };
                }
                r.map_err(|e| format!("read: {e}"))?;
                let want = self.tags[t].live[&addr].fill;
                if let Some(i) = buf.iter().position(|&b| b != want) {
                    return Err(format!(
                        "{name} {addr:#x}: byte {i} is {} where {want} was written",
                        buf[i]
                    ));
                }
                let fill = self.rng.next() as u8;
                pool.write(addr, 0, &vec![fill; len])
                    .map_err(|e| format!("write: {e}"))?;
                self.tags[t].live.get_mut(&addr).unwrap().fill = fill;
                Ok(())
            }
            9..=10 => {
                self.note(format!("pause {name}"));
                match (pool.pause(&[&name]), self.tags[t].paused) {
                    (Err(Error::TagState { .. }), true) => Ok(()),
                    (Ok(()), false) => {
                        let m = &mut self.tags[t];
                        m.paused = true;
                        m.cache.clear();
                        if m.policy == Policy::Backup {
                            m.live.values_mut().for_each(|l| l.backed = true);
                        }
                        Ok(())
                    }
                    (r, paused) => Err(format!("pause of {name} (paused: {paused}): {r:?}")),
                }
            }
            11..=12 => {
                self.note(format!("resume {name}"));
                match (pool.resume(&[&name]), self.tags[t].paused) {
                    (Err(Error::TagState { .. }), false) => Ok(()),
                    (Err(Error::OutOfMemory { .. }), true) if pool.capacity() != u64::MAX => Ok(()),
                    (Ok(()), true) => {
                        let m = &mut self.tags[t];
                        m.paused = false;
                        if m.policy != Policy::Backup {
                            m.live.values_mut().for_each(|l| l.fill = 0);
                        }
                        Ok(())
                    }
                    (r, paused) => Err(format!("resume of {name} (paused: {paused}): {r:?}")),
                }
            }
            13 if self.tags[t].flips => {
                let to = match self.tags[t].policy {
                    Policy::Backup => Policy::Discard,
                    Policy::Discard => Policy::Overwrite,
                    Policy::Overwrite => Policy::Backup,
                };
                self.note(format!("set_policy {name} {to:?}"));
                match (pool.set_policy(&name, to), self.tags[t].paused) {
                    (Err(Error::PolicyChange { .. }), true) => Ok(()),
                    (Ok(()), false) => {
                        let m = &mut self.tags[t];
                        m.policy = to;
                        if to != Policy::Backup {
                            m.live.values_mut().for_each(|l| l.backed = false);
                        }
                        Ok(())
                    }
                    (r, paused) => Err(format!("set_policy of {name} (paused: {paused}): {r:?}")),
                }
            }
            _ => {
                self.note("empty_cache".into());
                pool.empty_cache();
                for m in self.tags.iter_mut().filter(|m| !m.paused) {
                    m.cache.clear();
                }
                Ok(())
            }
        }
    }

    /// Books a new allocation: its mapped size is the rounded request, or a
    /// block of this tag's cache of up to twice that.
    fn allocated(&mut self, t: usize, addr: u64, bytes: u64) -> Result<(), String> {
        let pool = &self.sh.pool;
        let info = pool
            .allocation(addr)
            .ok_or_else(|| format!("allocation {addr:#x} unknown to the pool"))?;
        let want = self.rounded(bytes);
        let m = &mut self.tags[t];
        let cached = m.cache.iter().position(|&(a, _)| a == addr);
        let from_cache =
            cached.is_some_and(|i| m.cache[i].1 == info.mapped && info.mapped <= 2 * want);
        if (info.tag.as_str(), info.requested) != (m.name.as_str(), bytes)
            || (info.mapped != want && !from_cache)
        {
            return Err(format!(
                "allocation of {bytes} in {}: pool says {info:?}, expected {want} mapped \
                 or a cached block",
                m.name
            ));
        }
        // Fresh or reused, the address is live now: not in the cache.
        if let Some(i) = cached {
            m.cache.remove(i);
        }
        let fill = self.rng.next() as u8;
        pool.write(addr, 0, &vec![fill; bytes as usize])
            .map_err(|e| format!("write: {e}"))?;
        self.tags[t].live.insert(
            addr,
            Live {
                requested: bytes,
                mapped: info.mapped,
                fill,
                backed: false,
            },
        );
        let mut ranges = self.sh.ranges.lock().unwrap();
        let end = addr + info.mapped;
        if let Some((&a, &(e, who))) = ranges.range(..end).next_back() {
            if e > addr {
                return Err(format!(
                    "{addr:#x}..{end:#x} overlaps thread {who}'s live {a:#x}..{e:#x}"
                ));
            }
        }
        ranges.insert(addr, (end, self.id));
        Ok(())
    }

    /// Checks this thread's tags in one snapshot of the pool's statistics.
    fn check(&mut self) -> Result<(), String> {
        let s = self.sh.pool.stats();
        check_pool_sum(&s)?;
        for m in self.tags.iter_mut() {
            let t = s
                .tag(&m.name)
                .ok_or_else(|| format!("{} missing from stats", m.name))?;
            let requested: u64 = m.live.values().map(|l| l.requested).sum();
            let mapped: u64 = m.live.values().map(|l| l.mapped).sum();
            let backed: u64 = m
                .live
                .values()
                .filter(|l| l.backed)
                .map(|l| l.requested)
                .sum();
            let state = if m.paused {
                TagState::Paused
            } else {
                TagState::Active
            };
            let expect = |what: &str, got: u64, want: u64| {
                (got == want)
                    .then_some(())
                    .ok_or_else(|| format!("{}: {what} {got}, expected {want}", m.name))
            };
            if (t.state, t.policy) != (state, m.policy) {
                return Err(format!(
                    "{}: {:?} {:?}, expected {state:?} {:?}",
                    m.name, t.state, t.policy, m.policy
                ));
            }
            expect("allocations", t.allocations as u64, m.live.len() as u64)?;
            expect("allocated_bytes", t.allocated_bytes, requested)?;
            expect("backup_bytes", t.backup_bytes, backed)?;
            if m.paused {
                expect("resident_bytes (paused)", t.resident_bytes, 0)?;
                expect("cached_bytes (paused)", t.cached_bytes, 0)?;
                expect("paused_bytes", t.paused_bytes, mapped)?;
                continue;
            }
            expect("paused_bytes (active)", t.paused_bytes, 0)?;
            // The cache is what was freed since it was last emptied.
            let mut suffix: u64 = m.cache.iter().map(|c| c.1).sum();
            let mut from = 0;
            while suffix != t.cached_bytes && from < m.cache.len() {
                suffix -= m.cache[from].1;
                from += 1;
            }
            if suffix != t.cached_bytes {
                return Err(format!(
                    "{}: cached_bytes {}, not the bytes of any blocks freed since an emptying \
                     ({:?})",
                    m.name, t.cached_bytes, m.cache
                ));
            }
            m.cache.drain(..from);
            expect("resident_bytes", t.resident_bytes, mapped + t.cached_bytes)?;
        }
        Ok(())
    }
}

/// The pool's resident bytes are its tags' plus those being released.
fn check_pool_sum(s: &PoolStats) -> Result<(), String> {
    let tags: u64 = s.tags.iter().map(|t| t.resident_bytes).sum();
    if tags + s.releasing_bytes != s.resident_bytes {
        return Err(format!(
            "pool resident {} != tags' {tags} + releasing {}",
            s.resident_bytes, s.releasing_bytes
        ));
    }
    if s.resident_bytes > s.capacity_bytes {
        return Err(format!(
            "resident {} over the capacity {}",
            s.resident_bytes, s.capacity_bytes
        ));
    }
    Ok(())
}

/// At a meeting point (no thread inside the pool): the kernel's resident
/// bytes in the pool's range are at most the pool's count.
fn check_quiet(pool: &Pool) -> Result<(), String> {
    let s = pool.stats();
    check_pool_sum(&s)?;
    if s.releasing_bytes != 0 {
        return Err(format!("{} bytes releasing at rest", s.releasing_bytes));
    }
    let (base, len) = pool.address_range();
    let kernel = os::resident_in_range(base, len).map_err(|e| e.to_string())?;
    if kernel > s.resident_bytes {
        return Err(format!(
            "the kernel has {kernel} bytes resident in the pool's range, the pool counts {}",
            s.resident_bytes
        ));
    }
    Ok(())
}

/// Runs `rounds` rounds of `THREADS` threads from `seed`; returns the
/// first failure with its thread, operation and the operations before it.
fn run(seed: u64, capacity: u64, rounds: usize) -> Result<(), String> {
    let pool = Pool::host(PoolConfig {
        capacity,
        ..PoolConfig::default()
    })
    .unwrap();
    let sh = Shared {
        gran: pool.granularity() as u64,
        pool,
        ranges: Mutex::new(BTreeMap::new()),
        barrier: Barrier::new(THREADS),
        failed: AtomicBool::new(false),
    };
    let failure = Mutex::new(None);
    std::thread::scope(|s| {
        for id in 0..THREADS {
            let (sh, failure) = (&sh, &failure);
            s.spawn(move || {
                let mut w = Worker {
                    sh,
                    id,
                    rng: Rng::new(seed ^ ((id as u64 + 1) << 32)),
                    tags: [
                        ("backup", Policy::Backup, false),
                        ("discard", Policy::Discard, false),
                        ("overwrite", Policy::Overwrite, false),
                        ("flip", Policy::Backup, true),
                    ]
                    .into_iter()
                    .map(|(n, policy, flips)| {
                        let name = format!("t{id}.{n}");
                        sh.pool.set_policy(&name, policy).unwrap();
                        TagModel {
                            name,
                            policy,
                            flips,
                            paused: false,
                            live: BTreeMap::new(),
                            cache: Vec::new(),
                        }
                    })
                    .collect(),
                    log: Vec::new(),
                };
                let fail = |step: usize, w: &Worker, e: String| {
                    sh.failed.store(true, Ordering::SeqCst);
                    failure.lock().unwrap().get_or_insert_with(|| {
                        format!(
                            "seed {seed:#x}, capacity {capacity}, thread {} op {step}: {e}\n\
                             last operations: {:?}",
                            w.id, w.log
                        )
                    });
                };
                for round in 0..rounds {
                    for i in 0..ROUND {
                        if sh.failed.load(Ordering::SeqCst) {
                            break;
                        }
                        let step = round * ROUND + i;
                        if let Err(e) = w.op().and_then(|()| w.check()) {
                            fail(step, &w, e);
                        }
                    }
                    sh.barrier.wait();
                    if id == 0 && !sh.failed.load(Ordering::SeqCst) {
                        if let Err(e) = check_quiet(&sh.pool) {
                            fail(round * ROUND, &w, e);
                        }
                    }
                    sh.barrier.wait();
                }
            });
        }
    });
    failure.into_inner().unwrap().map_or(Ok(()), Err)
}

#[test]
fn books_stay_exact_under_concurrent_operations() {
    for seed in [1, 2, 3] {
        run(seed, u64::MAX, 30).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn books_stay_exact_under_concurrent_operations_with_a_capacity() {
    // Small enough that allocations and resumes run out now and then.
    for seed in [4, 5, 6] {
        run(seed, 48 << 20, 30).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
#[ignore = "soak: COLO_SOAK_SECS=600 cargo test -p colo-mem --test books -- --ignored"]
fn soak() {
    let secs: u64 = std::env::var("COLO_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let start = Instant::now();
    let mut seed = 1000 + std::process::id() as u64;
    let mut runs = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        for capacity in [u64::MAX, 48 << 20, 16 << 20] {
            run(seed, capacity, 100).unwrap_or_else(|e| panic!("{e}"));
        }
        seed += 1;
        runs += 3;
    }
    eprintln!(
        "soak: {runs} runs of {THREADS} threads, seeds from {}",
        seed - runs / 3
    );
}
