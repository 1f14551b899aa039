//! `colo bench …`: one subcommand per measured component.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Bench {
    /// The same RL step in each colocation mode: peak and wake-peak memory, switch times, and a capacity where sleep runs out and staged fits.
    Colocate(super::bench_colocate::Args),
    /// Pause/resume bandwidth of the memory layer against plain copies.
    Mem(super::bench_mem::Args),
    /// Rollout tokens/s on a GRPO-shaped load against a static-batch, contiguous-cache baseline.
    Rollout(super::bench_rollout::Args),
    /// Training-step throughput (6·N·tokens/s) against a float32 matrix product.
    Train(super::bench_train::Args),
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Colocate(a) => super::bench_colocate::run(a),
        Bench::Mem(a) => super::bench_mem::run(a),
        Bench::Rollout(a) => super::bench_rollout::run(a),
        Bench::Train(a) => super::bench_train::run(a),
    }
}
