//! `colo`: colocated reinforcement-learning post-training on one device.
//!
//! Each subcommand lives in its own module under `cmd/`; this file only
//! parses the command line and dispatches.

mod cmd;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Write a Hugging Face model directory with a preset's published shape (Qwen2.5, Qwen3, Llama 3.x): random weights, a small tokenizer and a run config.
    InitModel(cmd::init_model::Args),
}

/// Errors are printed as one message with their causes (`a: b: c`), never
/// as a panic or a backtrace, and the exit status is 1.
///
/// Before anything else, the process-wide state colo relies on is set, in
/// one place ([`colo_rl::process`] says what and why), and the crates'
/// diagnostics go to stderr: warnings and errors by default, `COLO_LOG`
/// takes env_logger's filters (`COLO_LOG=debug`, `COLO_LOG=off`).
fn main() -> std::process::ExitCode {
    colo_rl::process::init_logging();
    colo_rl::process::init();
    let matches = command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(cli, &matches) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.is::<cmd::train::Stopped>() => {
            let said = e.to_string();
            if !said.is_empty() {
                eprintln!("{said}");
            }
            std::process::ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {}", message(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The command line's grammar: [`Cli`]'s, where a number's leading `-` is
/// a value, not a flag, in every subcommand, so `--devices -1` is refused
/// by the flag's own parser, naming the flag, instead of as an unknown
/// argument `-1`.
fn command() -> clap::Command {
    fn negative_numbers(cmd: clap::Command) -> clap::Command {
        let subs: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_owned())
            .collect();
        subs.iter()
            .fold(cmd.allow_negative_numbers(true), |cmd, name| {
                cmd.mut_subcommand(name, negative_numbers)
            })
    }
    negative_numbers(Cli::command())
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

/// `matches`: what clap parsed, for the flags a subcommand must know were
/// given rather than defaulted.
fn run(cli: Cli, matches: &clap::ArgMatches) -> anyhow::Result<()> {
    match cli.command {
        Command::Train(a) => cmd::train::run(a),
        Command::Bench(b) => cmd::bench::run(b),
        Command::Score(a) => cmd::score::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Plan(a) => cmd::plan::run(*a, matches.subcommand_matches("plan")),
        Command::Sft(a) => cmd::sft::run(a),
        Command::GpuCheck(a) => cmd::gpu_check::run(a),
        Command::InitModel(a) => cmd::init_model::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A negative number is a value: the flag's parser refuses it by name,
    /// in every subcommand, where clap called it an unknown argument.
    #[test]
    fn negative_numbers_are_refused_by_their_flag() {
        for argv in [
            &["colo", "plan", "--devices", "-1"][..],
            &["colo", "plan", "map", "--devices", "-3"],
            &["colo", "bench", "rollout", "--prompts", "-5"],
            &["colo", "generate", "--n", "-2"],
        ] {
            let e = command().try_get_matches_from(argv).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{argv:?}"
            );
            assert!(
                e.to_string()
                    .contains(&format!("'{}", argv[argv.len() - 2])),
                "{e}"
            );
        }
    }

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
