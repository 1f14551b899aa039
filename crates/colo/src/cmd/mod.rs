//! One module per subcommand.

pub mod bench;
pub mod bench_mem;
pub mod plan;
pub mod score;
