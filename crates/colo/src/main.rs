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

/// libtorch's OpenMP runtime (libgomp) reads its wait policy once, when it
/// is loaded — before `main`. Between parallel regions its workers spin for
/// `GOMP_SPINCOUNT` iterations (~100,000 per millisecond) before they
/// sleep: 3 ms by default, 5 minutes with `OMP_WAIT_POLICY=active`, none
/// with `passive`. colo runs thousands of small regions per step, and the
/// choice was measured on the built-in job (BENCHMARKS.md, "Thread
/// policy"): with the two cores to itself, a spinning worker is ~1.7×
/// faster (0.48–0.64 s per step against 0.85–1.3 s passive: a sleeping
/// worker is woken by a cross-CPU interrupt, costly on a virtual machine);
/// with one other busy process, spinning is 2–6× slower than passive
/// (1.5–5.6 s against 0.88 s: the spinning worker steals the core the next
/// op needs — the prototype's 0.3 s → 5.8 s). RL jobs share machines and
/// CI runs several colo processes at once, so the default is the robust
/// one: colo runs with `OMP_WAIT_POLICY=passive` unless the user set
/// `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT` (on a dedicated machine,
/// `GOMP_SPINCOUNT=100000` is the fast choice); if neither is set, the
/// process re-executes itself once with it set (about 0.3 s, the cost of
/// loading libtorch again).
fn set_thread_policy() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("OMP_WAIT_POLICY").is_some() || std::env::var_os("GOMP_SPINCOUNT").is_some()
    {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("OMP_WAIT_POLICY", "passive")
        .exec();
    // Only reached if the exec failed: go on with libgomp's default.
    eprintln!("colo: could not re-execute with OMP_WAIT_POLICY=passive: {err}");
}

/// Errors are printed as one message with their causes (`a: b: c`), never
/// as a panic or a backtrace, and the exit status is 1.
fn main() -> std::process::ExitCode {
    set_thread_policy();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
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
