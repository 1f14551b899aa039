//! One module per subcommand.

pub mod bench;
pub mod bench_mem;
pub mod bench_rollout;
pub mod generate;
pub mod plan;
pub mod score;
