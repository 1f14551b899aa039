//! `colo bench mem --device cuda`: pause/resume bandwidth of colo-mem's
//! CUDA backend, against the copies that bound it, measured in the same
//! run on the same size (libtorch's `copy_` between a device buffer and a
//! host one, best of 3 after one untimed):
//!
//! - `d2h_pageable_gib_s` / `h2d_pageable_gib_s`: to and from ordinary
//!   (pageable) host memory, which the driver stages through a pinned
//!   buffer of its own — what colo-mem's backups are (`Vec<u8>`, copied
//!   with `cuMemcpyDtoH_v2` / `cuMemcpyHtoD_v2`);
//! - `d2h_pinned_gib_s` / `h2d_pinned_gib_s`: to and from page-locked host
//!   memory (`pin_memory`), the copy engines' own speed, what pinned
//!   backups would reach.
//!
//! Then pause/resume cycles of one buffer under a `Backup` tag and a
//! `Discard` tag (the first cycle apart: its backup buffer is new), the
//! device memory a pause gives back as the driver counts it
//! (`cuMemGetInfo`), whether the address survives and the contents come
//! back. No soak: its figures are the host's resident set.

use anyhow::{ensure, Context, Result};
use colo_mem::cuda::{mem_get_info, CudaBackend};
use colo_mem::{Policy, Pool, PoolConfig};
use serde::Serialize;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

use super::{cycles_on, median, Args, Cycles, GIB};

#[derive(Serialize)]
struct Report {
    device: &'static str,
    size_mib: usize,
    copy_threads: usize,
    d2h_pageable_gib_s: f64,
    h2d_pageable_gib_s: f64,
    d2h_pinned_gib_s: f64,
    h2d_pinned_gib_s: f64,
    pause_backup_gib_s: f64,
    resume_backup_gib_s: f64,
    first_pause_backup_gib_s: f64,
    first_resume_backup_gib_s: f64,
    pause_discard_ms_per_gib: f64,
    resume_discard_ms_per_gib: f64,
    /// pause_backup / d2h_pinned, resume_backup / h2d_pinned.
    pause_vs_pinned: f64,
    resume_vs_pinned: f64,
    /// Device memory the first Backup pause gave back (driver's free
    /// memory after − before) over the buffer's size.
    released_fraction: f64,
    same_address: bool,
    restored_bit_exact: bool,
}

/// Best of 3 `dst.copy_(src)` after one untimed, in GiB/s.
fn copy_gib_s(dst: &mut Tensor, src: &Tensor, n: usize) -> Result<f64> {
    let mut best = f64::INFINITY;
    for i in 0..4 {
        tch::Cuda::synchronize(0);
        let t = Instant::now();
        dst.f_copy_(src)?;
        tch::Cuda::synchronize(0);
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    Ok(n as f64 / GIB / best)
}

/// (d2h, h2d) GiB/s with pageable host memory, then with pinned.
fn baselines(n: usize) -> Result<[f64; 4]> {
    let dev = Device::Cuda(0);
    let mut d = Tensor::f_ones([n as i64], (Kind::Uint8, dev))?;
    let mut host = Tensor::f_zeros([n as i64], (Kind::Uint8, Device::Cpu))?;
    let d2h = copy_gib_s(&mut host, &d, n)?;
    let h2d = copy_gib_s(&mut d, &host, n)?;
    let mut pinned = host.pin_memory(dev);
    ensure!(pinned.is_pinned(dev), "pin_memory gave an unpinned tensor");
    let d2h_pinned = copy_gib_s(&mut pinned, &d, n)?;
    let h2d_pinned = copy_gib_s(&mut d, &pinned, n)?;
    Ok([d2h, h2d, d2h_pinned, h2d_pinned])
}

/// `bench mem`'s pause/resume cycles on a CUDA pool; the released
/// fraction from the driver's free memory (`cuMemGetInfo`).
fn cycles(n: usize, policy: Policy, count: usize) -> Result<Cycles> {
    let pool = Pool::new(Box::new(CudaBackend::new(0)?), PoolConfig::default())?;
    let in_use = |_: &Pool| {
        let (free, total) = mem_get_info()?;
        Ok(total.saturating_sub(free))
    };
    cycles_on(pool, n, policy, count, in_use)
}

pub(super) fn run(a: &Args) -> Result<()> {
    let n = a.size_mib << 20;
    let gib = n as f64 / GIB;
    let [d2h, h2d, d2h_pinned, h2d_pinned] = baselines(n).context("baseline copies")?;
    let b = cycles(n, Policy::Backup, a.cycles).context("backup cycles")?;
    let d = cycles(n, Policy::Discard, a.cycles).context("discard cycles")?;
    let steady = |v: &[f64]| median(v[1..].to_vec());
    let r = Report {
        device: "cuda",
        size_mib: a.size_mib,
        copy_threads: PoolConfig::default().copy_threads,
        d2h_pageable_gib_s: d2h,
        h2d_pageable_gib_s: h2d,
        d2h_pinned_gib_s: d2h_pinned,
        h2d_pinned_gib_s: h2d_pinned,
        pause_backup_gib_s: gib / steady(&b.pause_s),
        resume_backup_gib_s: gib / steady(&b.resume_s),
        first_pause_backup_gib_s: gib / b.pause_s[0],
        first_resume_backup_gib_s: gib / b.resume_s[0],
        pause_discard_ms_per_gib: steady(&d.pause_s) * 1e3 / gib,
        resume_discard_ms_per_gib: steady(&d.resume_s) * 1e3 / gib,
        pause_vs_pinned: gib / steady(&b.pause_s) / d2h_pinned,
        resume_vs_pinned: gib / steady(&b.resume_s) / h2d_pinned,
        released_fraction: b.released_fraction,
        same_address: b.same_address && d.same_address,
        restored_bit_exact: b.bit_exact,
    };
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!(
        "colo bench mem --device cuda: {} MiB, {} copy threads",
        r.size_mib, r.copy_threads
    );
    println!(
        "  device -> host, pageable / pinned   {:8.2} / {:8.2} GiB/s",
        r.d2h_pageable_gib_s, r.d2h_pinned_gib_s
    );
    println!(
        "  host -> device, pageable / pinned   {:8.2} / {:8.2} GiB/s",
        r.h2d_pageable_gib_s, r.h2d_pinned_gib_s
    );
    println!(
        "  pause, backup (steady)              {:8.2} GiB/s  {:.2}x pinned  (first cycle {:.2} GiB/s; issue 36: at least 20)",
        r.pause_backup_gib_s, r.pause_vs_pinned, r.first_pause_backup_gib_s
    );
    println!(
        "  resume, backup (steady)             {:8.2} GiB/s  {:.2}x pinned  (first cycle {:.2} GiB/s; issue 36: at least 20)",
        r.resume_backup_gib_s, r.resume_vs_pinned, r.first_resume_backup_gib_s
    );
    println!(
        "  pause / resume, discard             {:8.1} / {:.1} ms/GiB",
        r.pause_discard_ms_per_gib, r.resume_discard_ms_per_gib
    );
    println!(
        "  device memory released (driver)     {:8.3}",
        r.released_fraction
    );
    println!(
        "  same address / bit-exact            {} / {}",
        r.same_address, r.restored_bit_exact
    );
    Ok(())
}
