//! `colo gpu-check`: everything colo claims about a CUDA device, checked on
//! one, with one summary at the end. Built with `--features cuda` here and
//! run on the GPU machine (no Rust toolchain needed there):
//!
//! 1. the device as libtorch sees it;
//! 2. model parity on CUDA in float32 against the transformers fixtures
//!    (logits, loss, gradients), the same references as the CPU tests;
//! 3. colo-mem's CUDA pool under libtorch: tensors made in `region(tag)`
//!    (the autograd thread's gradients included) pause and resume at the
//!    same address, bit-exact, with the memory released as the driver
//!    reports it;
//!    and a region over the pool's capacity fails with colo-mem's reason
//!    (tag, capacity), not only libtorch's generic "CUDA out of memory";
//! 4. the rollout engine's CUDA graphs: the same greedy tokens as eager
//!    decoding, and valid again after their memory was released and
//!    resumed with the KV cache (`gpu_graphs.rs`);
//! 5. `colo bench colocate --device cuda` (its three targets and the
//!    capacity experiment, on the GPU's memory);
//! 6. the built-in `colo train` on CUDA (a few steps, or all with `--full`),
//!    and two steps with `offload_policy = "always"` whose every emptied
//!    activations cache must hold nothing (no cuBLAS workspace, no kept
//!    MemPool pinning a segment of it);
//! 7. the sharded trainer with one shard (`[cluster] sharding = "full"` on
//!    one device, `gpu_sharded.rs`): three steps whose collectives are
//!    counted and whose first matches the unsharded actor's.
//!
//! Each check prints its figures; the summary lists pass/fail and the exit
//! status is 1 if any failed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use colo_model::{loss, Model, ModelConfig, Weights};
use tch::{Device, Kind, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// Directory with the fixture checkpoints (tiny-qwen2, tiny-llama) and
    /// their reference outputs.
    #[arg(long, default_value = "testdata")]
    fixtures: PathBuf,
    /// Run the built-in `colo train` for all its steps, not just 5.
    #[arg(long)]
    full: bool,
    /// Where the training run writes (metrics, timeline, pictures).
    #[arg(long, default_value = "runs/gpu-check")]
    out: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let mut results: Vec<(&str, Result<String>)> = vec![];
    let device = device_info();
    let on_gpu = device.is_ok();
    results.push(("device", device));
    if on_gpu {
        for name in ["tiny-qwen2", "tiny-llama"] {
            let dir = a.fixtures.join(name);
            results.push((
                "parity",
                parity(&dir).with_context(|| dir.display().to_string()),
            ));
        }
        results.push(("memory", memory()));
        let fixture = a.fixtures.join("tiny-qwen2");
        results.push(("graphs", super::gpu_graphs::check(&fixture)));
        results.push(("oom", oom()));
        results.push((
            "colocate",
            super::bench_colocate::check_on(colo_rl::config::Device::Cuda),
        ));
        results.push(("train", train(&a)));
        results.push((
            "sharded",
            super::gpu_sharded::check(colo_rl::config::Device::Cuda, &a.out.join("sharded")),
        ));
    }
    println!("\n== colo gpu-check summary");
    let mut failed = 0;
    for (what, r) in &results {
        match r {
            Ok(s) => println!("PASS  {what:<8} {s}"),
            Err(e) => {
                failed += 1;
                println!("FAIL  {what:<8} {e:#}");
            }
        }
    }
    println!("{} passed, {failed} failed", results.len() - failed);
    if failed > 0 {
        bail!("{failed} GPU check(s) failed");
    }
    Ok(())
}

fn device_info() -> Result<String> {
    ensure!(
        cfg!(feature = "cuda"),
        "this colo was built without the `cuda` feature, so its memory layer has no CUDA pool \
         (./x cargo build --release -p colo --features cuda)"
    );
    ensure!(
        tch::Cuda::is_available(),
        "libtorch sees no CUDA device (is libtorch_cuda loaded? is a driver present?)"
    );
    Ok(format!(
        "{} CUDA device(s), cuDNN {}",
        tch::Cuda::device_count(),
        tch::Cuda::cudnn_is_available()
    ))
}

/// Largest |a − b|.
fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_device(Device::Cpu).to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The CPU tests' tolerances: logits 1e-4, loss 1e-5, gradients 1e-4
/// relative to the reference's largest entry.
fn parity(dir: &Path) -> Result<String> {
    let refs: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("reference.safetensors"))?
            .into_iter()
            .collect();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json"))?)?;
    let dev = Device::Cuda(0);
    let ids = refs
        .get("input_ids")
        .context("reference input_ids")?
        .to_device(dev);
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let model = Model::load_trainable(&cfg, &Weights::from_dir(dir, Kind::Float, dev)?)?;
    let logits = model.forward(&ids)?;
    let d_logits = max_abs(&logits, refs.get("logits").context("reference logits")?);
    let loss = loss::next_token_cross_entropy(&logits, &ids)?;
    let d_loss = (loss.double_value(&[]) - json["loss"].as_f64().context("loss")?).abs();
    loss.backward();
    let mut d_grad: f64 = 0.0;
    for (name, p) in model.trainable_parameters() {
        if let Some(g) = refs.get(&format!("grad.{name}")) {
            let scale = g.abs().max().double_value(&[]).max(1e-12);
            d_grad = d_grad.max(max_abs(&p.grad(), g) / scale);
        }
    }
    let s = format!(
        "{}: logits {d_logits:.1e}, loss {d_loss:.1e}, gradients {d_grad:.1e} (relative)",
        dir.file_name().unwrap_or_default().to_string_lossy()
    );
    ensure!(
        d_logits <= 1e-4 && d_loss <= 1e-5 && d_grad <= 1e-4,
        "{s}: over tolerance"
    );
    Ok(s)
}

#[cfg(feature = "cuda")]
fn memory() -> Result<String> {
    use colo_mem::cuda::{mem_get_info, CudaBackend};
    use colo_mem::{Policy, Pool, PoolConfig};
    let pool = Pool::new(Box::new(CudaBackend::new(0)?), PoolConfig::default())?;
    pool.set_policy("weights", Policy::Backup)?;
    let dev = Device::Cuda(0);
    let (w, grad_tag) = {
        let _g = pool.region("weights")?;
        let w = Tensor::randn([8192, 8192], (Kind::Float, dev)).set_requires_grad(true);
        (&w * 2.0).sum(Kind::Float).backward();
        let tag = pool.tag_of(w.grad().data_ptr() as u64);
        (w, tag)
    };
    ensure!(
        grad_tag.as_deref() == Some("weights"),
        "the autograd thread's gradient landed in {grad_tag:?}, not `weights`"
    );
    let addr = w.data_ptr() as u64;
    let before = w.to_device(Device::Cpu);
    tch::Cuda::synchronize(0);
    let free0 = mem_get_info()?.0;
    let t = Instant::now();
    pool.pause(&["weights"])?;
    let pause_s = t.elapsed().as_secs_f64();
    let free1 = mem_get_info()?.0;
    let t = Instant::now();
    pool.resume(&["weights"])?;
    let resume_s = t.elapsed().as_secs_f64();
    let released = free1.saturating_sub(free0);
    ensure!(
        w.data_ptr() as u64 == addr,
        "address changed across pause/resume"
    );
    ensure!(
        w.to_device(Device::Cpu).equal(&before),
        "contents changed across pause/resume"
    );
    ensure!(
        released >= 500 << 20,
        "driver reports only {released} bytes released"
    );
    Ok(format!(
        "512 MiB weights + grad: same address, bit-exact; driver free +{} on pause; pause {:.3} s, resume {:.3} s",
        colo_mem::fmt_bytes(released),
        pause_s,
        resume_s
    ))
}

/// A 256 MiB tensor in a region of a 64 MiB pool: libtorch fails with its
/// own OOM, and the pool has colo-mem's reason for it.
#[cfg(feature = "cuda")]
fn oom() -> Result<String> {
    use colo_mem::cuda::CudaBackend;
    use colo_mem::{Pool, PoolConfig};
    let config = PoolConfig {
        capacity: 64 << 20,
        ..PoolConfig::default()
    };
    let pool = Pool::new(Box::new(CudaBackend::new(0)?), config)?;
    let made = {
        let _g = pool.region("kv_cache")?;
        Tensor::f_zeros([64 << 20], (Kind::Float, Device::Cuda(0)))
    };
    let Err(libtorch) = made else {
        bail!("a 256 MiB tensor was made in a region of a 64 MiB pool");
    };
    let refusal = pool
        .take_device_refusal()
        .context("libtorch failed, but the pool recorded no refusal")?;
    let text = refusal.to_string();
    ensure!(
        text.contains("out of device memory") && text.contains("`kv_cache`"),
        "the refusal does not name the tag: {text}"
    );
    let libtorch = libtorch.to_string();
    Ok(format!(
        "libtorch: {}; colo-mem: {text}",
        libtorch.lines().next().unwrap_or("")
    ))
}

#[cfg(not(feature = "cuda"))]
fn memory() -> Result<String> {
    without_cuda()
}

#[cfg(not(feature = "cuda"))]
fn oom() -> Result<String> {
    without_cuda()
}

#[cfg(not(feature = "cuda"))]
fn without_cuda() -> Result<String> {
    bail!("this colo was built without the `cuda` feature (cargo build --features cuda)")
}

fn train(a: &Args) -> Result<String> {
    let mut config = colo_rl::Config::builtin();
    config.trainer.device = colo_rl::config::Device::Cuda;
    if !a.full {
        config.trainer.total_steps = Some(5);
    }
    let t = Instant::now();
    let s = colo_rl::step::run(&config, &a.out, false).context("colo train on CUDA")?;
    let secs = t.elapsed().as_secs_f64();
    // Two steps that give up everything at each switch: every emptied
    // activations cache must be empty (a cuBLAS workspace or a MemPool the
    // caching allocator kept would pin a segment of it).
    config.memory.offload_policy = colo_rl::config::OffloadPolicy::Always;
    config.trainer.total_steps = Some(2);
    let always = a.out.join("always");
    colo_rl::step::run(&config, &always, false).context("colo train on CUDA, always")?;
    let emptied = emptied_caches(&always.join("timeline.jsonl"))?;
    let pct = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.1}%", 100.0 * x));
    Ok(format!(
        "{} steps in {secs:.1} s; held-out accuracy {} → {}; peak device memory {}; run in {}; \
         `always`: the activations cache empty after each of {emptied} switches",
        s.steps,
        pct(s.first_accuracy),
        pct(s.last_accuracy),
        colo_mem::fmt_bytes(s.peak_device_bytes),
        s.run_dir.display()
    ))
}

/// The `release_cache` events of a run's timeline, each of which must
/// leave the `activations` tag holding nothing; returns how many there were.
fn emptied_caches(timeline: &Path) -> Result<usize> {
    let text = std::fs::read_to_string(timeline)
        .with_context(|| format!("reading {}", timeline.display()))?;
    let mut emptied = 0;
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line)?;
        if e["phase"] != "release_cache" || e["kind"] != "empty_cache" {
            continue;
        }
        let held = e["per_tag"]["activations"].as_u64().unwrap_or(0);
        ensure!(
            held == 0,
            "step {}: the activations tag holds {} after its cache was emptied",
            e["step"],
            colo_mem::fmt_bytes(held)
        );
        emptied += 1;
    }
    ensure!(
        emptied > 0,
        "no release_cache event in {}",
        timeline.display()
    );
    Ok(emptied)
}

#[cfg(test)]
mod tests {
    use super::emptied_caches;

    /// The check reads colo-rl's timeline lines: an emptied cache that
    /// still holds activations fails, naming the step; none at all fails.
    #[test]
    fn an_emptied_activations_cache_must_hold_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timeline.jsonl");
        let line = |step: u64, held: u64| {
            format!(
                r#"{{"t_s":1.0,"step":{step},"phase":"release_cache","kind":"empty_cache","tags":[],"duration_s":0.0,"resident_bytes":5,"per_tag":{{"activations":{held}}},"untagged_bytes":0}}"#
            )
        };
        let other = r#"{"t_s":0.5,"step":1,"phase":"train","kind":"phase","tags":[],"duration_s":0.0,"resident_bytes":5,"per_tag":{"activations":4096},"untagged_bytes":0}"#;
        std::fs::write(
            &path,
            [other.to_string(), line(1, 0), line(2, 0)].join("\n"),
        )
        .unwrap();
        assert_eq!(emptied_caches(&path).unwrap(), 2);
        std::fs::write(&path, [line(1, 0), line(2, 2 << 20)].join("\n")).unwrap();
        let e = emptied_caches(&path).unwrap_err().to_string();
        assert!(e.contains("step 2") && e.contains("2.0 MiB"), "{e}");
        std::fs::write(&path, other).unwrap();
        assert!(emptied_caches(&path).is_err());
    }
}
