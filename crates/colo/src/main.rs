//! `colo`: colocated reinforcement-learning post-training on one device.
//!
//! Each subcommand lives in its own module under `cmd/`; this file only
//! parses the command line and dispatches.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "colo",
    version,
    about = "Colocated RL post-training: trainer and rollout engine on one device"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Colocated RL training (GRPO/PPO); with no arguments, the built-in task from its SFT checkpoint.
    Train(cmd::train::Args),
    /// Measure colo's building blocks and print ratios against baselines measured in the same run.
    #[command(subcommand)]
    Bench(cmd::bench::Bench),
    /// Log-probability of each next token of a sequence under a checkpoint (teacher forcing).
    Score(cmd::score::Args),
    /// Sample completions of a prompt with colo's rollout engine (paged KV cache, n samples sharing the prompt).
    Generate(cmd::generate::Args),
    /// Plan memory per phase, device mapping and resharding (arithmetic only, no devices needed).
    Plan(Box<cmd::plan::Args>),
    /// Check colo on a CUDA device: model parity, colo-mem's CUDA pool under libtorch, `colo train`; one summary.
    GpuCheck(cmd::gpu_check::Args),
    /// Supervised fine-tuning of the built-in model on the built-in task (made `colo train`'s starting checkpoint).
    Sft(cmd::sft::Args),
}

/// Errors are printed as one message with their causes (`a: b: c`), never
/// as a panic or a backtrace, and the exit status is 1.
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `e` and its causes as `a: b: c`, leaving out a cause whose text the
/// message already ends with (an error that prints its source, such as
/// an i/o error naming its path, is followed in the chain by that source).
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = without_cpp_trace(&cause.to_string());
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// libtorch's error text without the C++ stack trace c10 appends to it
/// ("Exception raised from … (most recent call first):" and a `frame #N`
/// line per frame): the first line says what failed.
fn without_cpp_trace(text: &str) -> String {
    let cut = ["Exception raised from ", "\nframe #"]
        .iter()
        .filter_map(|marker| text.find(marker))
        .min();
    match cut {
        Some(at) => text[..at].trim_end().to_owned(),
        None => text.to_owned(),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Train(a) => cmd::train::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Score(a) => cmd::score::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Plan(a) => cmd::plan::run(*a),
        Command::Sft(a) => cmd::sft::run(a),
        Command::GpuCheck(a) => cmd::gpu_check::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its source, as the crates' i/o errors do.
    #[derive(Debug)]
    struct Io {
        source: std::io::Error,
    }

    impl std::fmt::Display for Io {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "i/o error on x: {}", self.source)
        }
    }

    impl std::error::Error for Io {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_printed_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = anyhow::Error::new(Io { source: io }).context("colo train");
        assert_eq!(message(&e), "colo train: i/o error on x: gone");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(message(&e), "outer: inner");
        let torch = "Internal torch error: [enforce fail at alloc_cpu.cpp:127] can't allocate memory\n\
                     Exception raised from alloc_cpu at alloc_cpu.cpp:127 (most recent call first):\n\
                     frame #0: c10::ThrowEnforceNotMet(...) + 0x3e";
        assert_eq!(
            message(&anyhow::anyhow!(torch).context("colo bench train")),
            "colo bench train: Internal torch error: [enforce fail at alloc_cpu.cpp:127] can't allocate memory"
        );
        let frames_only = "Internal torch error: out of memory\nframe #0: c10::alloc_cpu + 0x365";
        assert_eq!(
            message(&anyhow::anyhow!(frames_only)),
            "Internal torch error: out of memory"
        );
    }
}
