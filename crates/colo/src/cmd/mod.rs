//! One module per subcommand.

pub mod bench;
pub mod bench_colocate;
pub mod bench_mem;
pub mod bench_rollout;
pub mod bench_train;
pub mod generate;
pub mod plan;
pub mod plan_config;
pub mod score;
pub mod sft;
pub mod train;
