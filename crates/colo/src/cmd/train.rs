//! `colo train`: colocated GRPO/PPO. With no arguments it runs the built-in
//! task (arithmetic, a 0.8M-parameter model from its committed SFT
//! checkpoint, exact-match reward); `--config run.toml` runs a user's.

use std::path::PathBuf;

use anyhow::{Context, Result};
use colo_rl::Config;

#[derive(clap::Args)]
pub struct Args {
    /// The run's TOML file (verl-like names; every key has a default, and
    /// the defaults are the built-in run).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The run directory (default: the config's `trainer.out_dir`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the latest checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
}

pub fn run(a: Args) -> Result<()> {
    let config = match &a.config {
        Some(path) => Config::from_file(path)?,
        None => Config::builtin(),
    };
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| config.trainer.out_dir.clone());
    let resume = a.resume || config.trainer.resume;
    eprintln!("{}", config.summary());
    eprintln!("run directory: {}", out.display());
    let s = colo_rl::r#loop::run(&config, &out, resume).context("colo train")?;
    let pct = |a: Option<f64>| a.map_or("-".to_string(), |a| format!("{:.1}%", 100.0 * a));
    println!(
        "done: {} steps; held-out accuracy {} -> {}; peak device memory {}",
        s.steps,
        pct(s.first_accuracy),
        pct(s.last_accuracy),
        colo_mem::fmt_bytes(s.peak_device_bytes)
    );
    println!(
        "wrote {0}/metrics.jsonl, {0}/memory_timeline.svg, {0}/reward_curve.svg, {0}/checkpoints/",
        s.run_dir.display()
    );
    Ok(())
}
