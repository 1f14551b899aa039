//! `colo bench mem`: pause/resume bandwidth of the memory layer, against
//! the two copies that bound it, measured in the same run on the same size:
//!
//! - `memcpy_gib_s`: a single-thread copy between two buffers whose pages
//!   are present — the limit for pausing into a kept backup;
//! - `fresh_copy_gib_s`: a copy into freshly allocated memory, single
//!   thread, the plainest way (`vec![0; n]` then `copy_from_slice`), so the
//!   kernel provides each page at its first touch — the limit for resuming,
//!   which must also get new physical pages.
//!
//! Then pause/resume cycles of one buffer under a `Backup` and a `Discard`
//! tag (first cycle separately: its backup buffer is new), the resident
//! bytes released as the OS counts them (`/proc/self/smaps`), and a soak of
//! many cycles checking that resident memory and the number of mappings do
//! not grow.
//!
//! `--device cuda` measures colo-mem's CUDA backend instead ([`cuda`]).

use anyhow::{ensure, Context, Result};
use colo_mem::{os, Policy, Pool, PoolConfig};
use serde::Serialize;
use std::time::Instant;

#[cfg(feature = "cuda")]
mod cuda;

#[derive(clap::Args)]
pub struct Args {
    /// Size of the buffer moved by each measurement, in MiB.
    #[arg(long, default_value_t = 1024, value_parser = super::bench::count::<1, 1048576>)]
    size_mib: usize,
    /// Pause/resume cycles per policy (the first is reported separately).
    #[arg(long, default_value_t = 5, value_parser = super::bench::count::<1, 1048576>)]
    cycles: usize,
    /// Cycles of the soak (0: skip it).
    #[arg(long, default_value_t = 1000, value_parser = super::bench::count::<0, 16777216>)]
    soak_cycles: usize,
    /// Size of the soak's buffers, in MiB.
    #[arg(long, default_value_t = 16, value_parser = super::bench::count::<1, 65536>)]
    soak_size_mib: usize,
    /// Where the pool is: `cpu` (anonymous host memory), or `cuda`
    /// (colo-mem's CUDA backend, its backups in host memory; a build with
    /// the `cuda` feature; no soak).
    #[arg(long, default_value = "cpu", value_parser = super::bench::parse_device)]
    device: colo_rl::config::Device,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    size_mib: usize,
    copy_threads: usize,
    memcpy_gib_s: f64,
    fresh_copy_gib_s: f64,
    pause_backup_gib_s: f64,
    resume_backup_gib_s: f64,
    first_pause_backup_gib_s: f64,
    first_resume_backup_gib_s: f64,
    pause_discard_ms_per_gib: f64,
    resume_discard_ms_per_gib: f64,
    /// pause_backup / memcpy (target ≥ 0.8).
    pause_vs_memcpy: f64,
    /// resume_backup / fresh_copy (target ≥ 0.8).
    resume_vs_fresh_copy: f64,
    rss_released_fraction: f64,
    same_address: bool,
    restored_bit_exact: bool,
    soak_cycles: usize,
    soak_rss_growth_bytes: i64,
    soak_mapping_growth: i64,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Best of `reps` timings of `f`, in seconds.
fn best_of(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A single-thread copy of `n` bytes between two buffers whose pages are
/// present, best of 3, in GiB/s: the memcpy every colo-mem figure is held
/// against (and `colo bench real`'s weight sync).
pub(super) fn memcpy_gib_s(n: usize) -> f64 {
    let n = n.max(1);
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let mut dst = vec![1u8; n];
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    n as f64 / GIB / best
}

fn baselines(n: usize) -> Result<(f64, f64)> {
    let memcpy_gib_s = memcpy_gib_s(n);
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let fresh = best_of(3, || {
        let mut d = vec![0u8; n];
        d.copy_from_slice(&src);
        std::hint::black_box(&d);
        Ok(())
    })?;
    Ok((memcpy_gib_s, n as f64 / GIB / fresh))
}

/// Per-cycle pause and resume seconds of one `n`-byte buffer under `policy`,
/// with the OS-measured released fraction of the first pause and whether the
/// address and (for `Backup`) the contents survived.
struct Cycles {
    pause_s: Vec<f64>,
    resume_s: Vec<f64>,
    released_fraction: f64,
    same_address: bool,
    bit_exact: bool,
}

fn cycles(n: usize, policy: Policy, count: usize) -> Result<Cycles> {
    let resident = |pool: &Pool| {
        let (base, span) = pool.address_range();
        Ok(os::resident_in_range(base, span)?)
    };
    cycles_on(
        Pool::host(PoolConfig::default())?,
        n,
        policy,
        count,
        resident,
    )
}

/// [`cycles`] on `pool` (host or device), the released fraction from
/// `held`: the bytes the buffer's memory holds as the OS or the driver
/// counts them, read before and after the first pause.
fn cycles_on(
    pool: std::sync::Arc<Pool>,
    n: usize,
    policy: Policy,
    count: usize,
    held: impl Fn(&Pool) -> Result<u64>,
) -> Result<Cycles> {
    pool.set_policy("t", policy)?;
    let addr = pool.alloc("t", n)?;
    let pattern: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
    pool.write(addr, 0, &pattern)?;
    let mut c = Cycles {
        pause_s: vec![],
        resume_s: vec![],
        released_fraction: 0.0,
        same_address: true,
        bit_exact: true,
    };
    for i in 0..count {
        let before = held(&pool)?;
        let t = Instant::now();
        pool.pause(&["t"])?;
        c.pause_s.push(t.elapsed().as_secs_f64());
        if i == 0 {
            let after = held(&pool)?;
            c.released_fraction = before.saturating_sub(after) as f64 / n as f64;
        }
        let t = Instant::now();
        pool.resume(&["t"])?;
        c.resume_s.push(t.elapsed().as_secs_f64());
        c.same_address &= pool.tag_of(addr).as_deref() == Some("t");
    }
    if policy == Policy::Backup {
        let mut out = vec![0u8; n];
        pool.read(addr, 0, &mut out)?;
        c.bit_exact = out == pattern;
    }
    Ok(c)
}

/// Resident-set and mapping-count growth over `count` cycles of two tags,
/// measured after a warm-up so first-cycle allocations do not count.
fn soak(n: usize, count: usize) -> Result<(i64, i64)> {
    // The timeline is bounded so that its (intended) growth does not hide
    // or fake a leak.
    let pool = Pool::host(PoolConfig {
        timeline_limit: 64,
        ..PoolConfig::default()
    })?;
    pool.set_policy("weights", Policy::Backup)?;
    let w = pool.alloc("weights", n)?;
    pool.write(w, 0, &vec![3u8; n])?;
    pool.alloc("kv_cache", n)?;
    let cycle = || -> Result<()> {
        pool.pause(&["weights", "kv_cache"])?;
        pool.resume(&["weights"])?;
        pool.resume(&["kv_cache"])?;
        Ok(())
    };
    for _ in 0..10 {
        cycle()?;
    }
    let (rss0, maps0) = (os::resident_bytes()?, os::mapping_count()?);
    for _ in 0..count {
        cycle()?;
    }
    let (rss1, maps1) = (os::resident_bytes()?, os::mapping_count()?);
    let mut b = [0u8; 16];
    pool.read(w, 0, &mut b)?;
    ensure!(b == [3u8; 16], "soak: weights lost their contents");
    Ok((rss1 as i64 - rss0 as i64, maps1 as i64 - maps0 as i64))
}

pub fn run(a: Args) -> Result<()> {
    ensure!(
        a.size_mib > 0 && a.cycles >= 2,
        "--size-mib must be positive and --cycles at least 2"
    );
    if a.device == colo_rl::config::Device::Cuda {
        #[cfg(feature = "cuda")]
        return cuda::run(&a);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!(
            "--device cuda: this colo was built without the `cuda` feature \
             (./x cargo build --release -p colo --features cuda)"
        );
    }
    let n = a.size_mib << 20;
    let gib = n as f64 / GIB;
    let (memcpy, fresh) = baselines(n).context("baseline copies")?;
    let b = cycles(n, Policy::Backup, a.cycles).context("backup cycles")?;
    let d = cycles(n, Policy::Discard, a.cycles).context("discard cycles")?;
    let (rss_growth, map_growth) = if a.soak_cycles > 0 {
        soak(a.soak_size_mib << 20, a.soak_cycles).context("soak")?
    } else {
        (0, 0)
    };
    let steady = |v: &[f64]| median(v[1..].to_vec());
    let r = Report {
        size_mib: a.size_mib,
        copy_threads: PoolConfig::default().copy_threads,
        memcpy_gib_s: memcpy,
        fresh_copy_gib_s: fresh,
        pause_backup_gib_s: gib / steady(&b.pause_s),
        resume_backup_gib_s: gib / steady(&b.resume_s),
        first_pause_backup_gib_s: gib / b.pause_s[0],
        first_resume_backup_gib_s: gib / b.resume_s[0],
        pause_discard_ms_per_gib: steady(&d.pause_s) * 1e3 / gib,
        resume_discard_ms_per_gib: steady(&d.resume_s) * 1e3 / gib,
        pause_vs_memcpy: (gib / steady(&b.pause_s)) / memcpy,
        resume_vs_fresh_copy: (gib / steady(&b.resume_s)) / fresh,
        rss_released_fraction: b.released_fraction.min(d.released_fraction),
        same_address: b.same_address && d.same_address,
        restored_bit_exact: b.bit_exact,
        soak_cycles: a.soak_cycles,
        soak_rss_growth_bytes: rss_growth,
        soak_mapping_growth: map_growth,
    };
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_table(&r);
    }
    Ok(())
}

fn print_table(r: &Report) {
    println!(
        "colo bench mem: {} MiB, {} copy threads",
        r.size_mib, r.copy_threads
    );
    println!(
        "  memcpy (pages present)        {:8.2} GiB/s",
        r.memcpy_gib_s
    );
    println!(
        "  copy into fresh memory        {:8.2} GiB/s",
        r.fresh_copy_gib_s
    );
    println!(
        "  pause, backup (steady)        {:8.2} GiB/s  {:.2}x memcpy      (first cycle {:.2} GiB/s)",
        r.pause_backup_gib_s, r.pause_vs_memcpy, r.first_pause_backup_gib_s
    );
    println!(
        "  resume, backup (steady)       {:8.2} GiB/s  {:.2}x fresh copy  (first cycle {:.2} GiB/s)",
        r.resume_backup_gib_s, r.resume_vs_fresh_copy, r.first_resume_backup_gib_s
    );
    println!(
        "  pause, discard                {:8.1} ms/GiB",
        r.pause_discard_ms_per_gib
    );
    println!(
        "  resume, discard               {:8.1} ms/GiB",
        r.resume_discard_ms_per_gib
    );
    println!(
        "  resident released (smaps)     {:8.3}",
        r.rss_released_fraction
    );
    println!(
        "  same address / bit-exact      {} / {}",
        r.same_address, r.restored_bit_exact
    );
    println!(
        "  soak: {} cycles, rss growth {} B, mapping growth {}",
        r.soak_cycles, r.soak_rss_growth_bytes, r.soak_mapping_growth
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// `--device` is parsed, and a build without CUDA says what it lacks
    /// before measuring anything.
    #[test]
    fn the_device_is_parsed_and_cuda_needs_its_feature() {
        let a = Cli::try_parse_from(["mem", "--device", "cuda", "--size-mib", "1"])
            .unwrap()
            .args;
        assert_eq!(a.device, colo_rl::config::Device::Cuda);
        assert!(Cli::try_parse_from(["mem", "--device", "tpu"]).is_err());
        if cfg!(not(feature = "cuda")) {
            let e = run(a).unwrap_err().to_string();
            assert!(e.contains("`cuda` feature"), "{e}");
        }
    }
}
