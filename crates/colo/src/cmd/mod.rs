//! One module per subcommand.

pub mod bench;
pub mod bench_colocate;
pub mod bench_lora;
pub mod bench_mem;
pub mod bench_real;
pub mod bench_rollout;
pub mod bench_train;
pub mod cluster;
pub mod generate;
pub mod gpu_check;
mod gpu_graphs;
mod gpu_sharded;
pub mod init_model;
pub mod plan;
pub mod plan_config;
pub mod score;
pub mod sft;
pub mod train;

/// The 1-minute load average, printed beside every benchmark figure (these
/// machines are shared).
pub fn load_avg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
