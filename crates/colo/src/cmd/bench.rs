//! `colo bench …`: one subcommand per measured component.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Bench {
    /// The built-in job's step on 1, 2 and 4 data-parallel workers on Ray: step split, all-reduce bytes and bandwidth against memcpy, the controller's share; with `--sharding none,full`, replicated against sharded workers (per-worker peak against the plan, gathers and reduce-scatters, the weight sync's bytes).
    #[command(disable_help_flag = true)]
    Cluster {
        /// Passed to `python -m colo.bench` (--config, --workers 1,2,4, --steps, --json).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The same RL step in each colocation mode: peak and wake-peak memory, switch times, and a capacity where sleep runs out and staged fits.
    Colocate(super::bench_colocate::Args),
    /// LoRA adapters merged into the rollout engine's weights at each switch against applied at decode: the switch's cost, the rollout's, and the rollout tokens per switch above which merging wins.
    Lora(super::bench_lora::Args),
    /// Pause/resume bandwidth of the memory layer against plain copies.
    Mem(super::bench_mem::Args),
    /// Issue 36's job at a real size (Qwen2.5-0.5B by default): each phase's time and share of the step, the weight sync against memcpy, the plan against the measured peak; `--trl` against TRL's GRPOTrainer.
    Real(super::bench_real::Args),
    /// Rollout tokens/s on a GRPO-shaped load against a static-batch, contiguous-cache baseline.
    Rollout(super::bench_rollout::Args),
    /// Training-step throughput (6·N·tokens/s) against a float32 matrix product.
    Train(super::bench_train::Args),
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Cluster { args } => super::cluster::python_module("colo.bench", &args),
        Bench::Colocate(a) => super::bench_colocate::run(a),
        Bench::Lora(a) => super::bench_lora::run(a),
        Bench::Mem(a) => super::bench_mem::run(a),
        Bench::Real(a) => super::bench_real::run(a),
        Bench::Rollout(a) => super::bench_rollout::run(a),
        Bench::Train(a) => super::bench_train::run(a),
    }
}

/// A bench's count flag within `MIN..=MAX`: bounds far above any useful
/// run, so that a typo is refused by name, not an allocation that aborts
/// or an overflow that panics.
pub fn count<const MIN: usize, const MAX: usize>(s: &str) -> Result<usize, String> {
    let v: usize = s
        .parse()
        .map_err(|e| format!("{e} (expected a whole number)"))?;
    match (MIN..=MAX).contains(&v) {
        true => Ok(v),
        false => Err(format!("must be in {MIN}..={MAX}")),
    }
}

/// `--device` of the benches: `cpu`, or `cuda` (a build with the `cuda`
/// feature, on a machine with an NVIDIA GPU).
pub fn parse_device(s: &str) -> anyhow::Result<colo_rl::config::Device> {
    match s {
        "cpu" => Ok(colo_rl::config::Device::Cpu),
        "cuda" => Ok(colo_rl::config::Device::Cuda),
        other => anyhow::bail!("--device must be cpu or cuda, got {other:?}"),
    }
}

/// A bench's pool with all of `device`'s memory (as a run's `capacity =
/// "auto"` for a model of its own), and libtorch's name for the device.
pub fn pool_on(
    device: colo_rl::config::Device,
) -> anyhow::Result<(std::sync::Arc<colo_mem::Pool>, tch::Device)> {
    #[cfg(not(feature = "cuda"))]
    anyhow::ensure!(
        device == colo_rl::config::Device::Cpu,
        "--device cuda: this colo was built without the `cuda` feature \
         (./x cargo build --release -p colo --features cuda)"
    );
    let capacity = colo_rl::step::device_memory(device)?;
    let pool = colo_rl::step::device_pool(device, capacity)?;
    Ok((pool, device.torch()))
}

/// Waits for the device's queued work before a timer is read: CUDA runs
/// kernels asynchronously, and a timer read at once measures their launches.
pub fn sync(device: tch::Device) {
    if let tch::Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}
