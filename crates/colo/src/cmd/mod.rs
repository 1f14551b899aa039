//! One module per subcommand.

pub mod bench;
pub mod bench_mem;
