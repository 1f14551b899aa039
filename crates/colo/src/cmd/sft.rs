//! `colo sft`: supervised fine-tuning of the built-in model on the built-in
//! arithmetic task, from a seeded random initialisation. Its defaults made
//! the starting checkpoint that `colo train` uses (`crates/rl/builtin/`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use colo_rl::sft::{self, SftConfig, SftEvent};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory to write (config.json, model.safetensors, tokenizer files).
    #[arg(long, default_value = "sft-out")]
    out: PathBuf,
    /// Optimizer steps.
    #[arg(long, default_value_t = sft::DEFAULT_STEPS)]
    steps: usize,
    /// Learning rate (constant after a 10-step warmup).
    #[arg(long, default_value_t = sft::DEFAULT_LR)]
    lr: f64,
    /// Problems per step.
    #[arg(long, default_value_t = sft::DEFAULT_BATCH_SIZE)]
    batch_size: usize,
    /// Seeds the initial weights, the batches and the pass@k samples.
    #[arg(long, default_value_t = sft::DEFAULT_SEED)]
    seed: u64,
    /// Evaluate greedy accuracy and pass@8 on the held-out problems every this many steps (0: only at the end).
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = SftConfig {
        steps: a.steps,
        lr: a.lr,
        batch_size: a.batch_size,
        seed: a.seed,
        eval_every: a.eval_every,
        ..SftConfig::default()
    };
    println!(
        "colo sft: {} steps × {} problems, lr {}, seed {} → {}",
        cfg.steps,
        cfg.batch_size,
        cfg.lr,
        cfg.seed,
        a.out.display()
    );
    let start = Instant::now();
    let mut window = Vec::new();
    let report = sft::run(&cfg, &a.out, |e| match e {
        &SftEvent::Step { step, loss, lr } => {
            window.push(loss);
            if step % 10 == 0 || step == cfg.steps {
                let mean = window.iter().sum::<f64>() / window.len() as f64;
                window.clear();
                println!(
                    "step {step:>5}  loss {mean:.4}  lr {lr:.2e}  {:.1}s",
                    start.elapsed().as_secs_f64()
                );
            }
        }
        SftEvent::Eval { step, result } => println!(
            "eval step {step:>5}  accuracy {:.1}%  pass@{} {}  mean length {:.2}  (n = {})",
            100.0 * result.accuracy(),
            result.k,
            result
                .pass_at_k
                .map_or("-".into(), |p| format!("{:.1}%", 100.0 * p)),
            result.mean_response_len,
            result.n()
        ),
    })
    .with_context(|| format!("SFT into {}", a.out.display()))?;
    println!(
        "wrote {} ({:.1}s)",
        report.out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
