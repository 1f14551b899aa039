//! `colo bench real`: issue 36's job at a real size, as a user would run
//! it, measured phase by phase.
//!
//! - **The model** is made by `colo init-model`'s code (the planner's
//!   preset, Qwen2.5-0.5B by default: published shape, random bf16
//!   weights, the small tokenizer, `run.toml`) in a temporary directory,
//!   or `--model DIR` names one (its `run.toml`, else init-model's job for
//!   it). `--preset tiny` is a 2-layer, hidden-64 model of the same
//!   files, for a check in seconds.
//! - **The run** is `colo train`'s, in this process ([`colo_rl::step::run`]
//!   on the run config, `trainer.total_steps` = `--steps`), into a
//!   temporary run directory; the figures come from its `metrics.jsonl`.
//!   Steps 1–2 warm up (first touch of the weights and the optimizer
//!   state); steps 3..=N are timed, and each phase is their mean.
//! - **The phases** split `timing_s/step` into parts that do not overlap:
//!   generation without the switches (`timing_s/gen` includes them), the
//!   train → rollout switch (the weight sync, `timing_s/update_weights`,
//!   is part of it and shown beneath it), the rollout → train switch,
//!   reward, reference, old log-probs, advantages, actor update, and the
//!   rest of the step. A `timing_s/*` key the split does not know is
//!   listed apart, not counted.
//! - **The sync's bandwidth** is the weight bytes (parameters × bytes of
//!   the run's dtype: what the sync copies, computed from the model's
//!   config) over `timing_s/update_weights`, against a single-thread
//!   memcpy of a buffer of that size measured in this process before the
//!   run (pages present, best of 3).
//! - **The plan** is colo-plan's predicted peak for the run config (as
//!   `colo plan --config` and `colo train`'s plan check compute it),
//!   against the largest `memory/peak_allocated_bytes` and
//!   `memory/peak_device_bytes` (mapped) over all the run's steps.
//! - **`--trl`** runs TRL's GRPOTrainer on the same model and job
//!   (`bench/trl/grpo_step.py` in `bench/trl/.venv`) before colo's run,
//!   never beside it, and compares the mean steps.
//!
//! The load average (1 minute) is read at the start and end of each run:
//! these machines are shared.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use colo_plan::model::ModelSpec;
use colo_plan::presets::Published;
use colo_rl::config::{Colocation, DataSource, Device, Dtype, OffloadPolicy};
use colo_rl::Config;

mod figures;
mod probes;
mod report;
mod table;
mod trl;
mod yardsticks;

use figures::{Figures, MemoryFigures, SyncFigures};
use report::{ColoRun, Job, Machine, ModelInfo, Report};
use yardsticks::{Copy, DecodeFigures, FlopFigures, Shape, Tokens};

#[derive(clap::Args)]
pub struct Args {
    /// The model to make (`colo init-model --list` shows the presets), or
    /// `tiny` (2 layers, hidden 64: a check in seconds).
    #[arg(long, default_value = "qwen2.5-0.5b", conflicts_with = "model")]
    preset: String,
    /// An existing model directory instead (one `colo init-model` wrote:
    /// its run.toml is the job; without one, init-model's job for it).
    #[arg(long)]
    model: Option<PathBuf>,
    /// RL steps run; 1–2 warm up, 3..=N are timed.
    #[arg(long, default_value_t = 5, value_parser = super::bench::count::<3, 100000>)]
    steps: usize,
    /// Then run TRL's GRPOTrainer on the same model and job
    /// (bench/trl/.venv, made by bench/trl/setup.sh) and compare.
    #[arg(long)]
    trl: bool,
    /// Where the run goes: `cpu`, or `cuda` (a build with the `cuda`
    /// feature, on a machine with an NVIDIA GPU); default: the run
    /// config's `trainer.device`.
    #[arg(long, value_parser = super::bench::parse_device)]
    device: Option<Device>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// The steps before the timed ones.
const WARMUP_STEPS: usize = 2;

pub fn run(a: Args) -> Result<()> {
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("colo-bench-real-")
        .tempdir()
        .context("colo bench real: a temporary directory")?;
    let (model_dir, name) = model_dir(&a, work.path())?;
    let mut config = run_config(&model_dir, &name, work.path(), a.steps)?;
    if let Some(device) = a.device {
        config.trainer.device = device;
    }
    // TRL first, in a process of its own that has exited (and freed its
    // memory) before colo's run starts: colo's process keeps what its run
    // mapped (see `rss_after_run_bytes`), and a 0.5 B model's two runs do
    // not fit a 23 GiB machine side by side.
    let trl = match a.trl {
        true => Some(trl::run(
            &model_dir,
            &trl::Job::of(&config, a.steps, work.path())?,
        )),
        false => None,
    };
    let mut report = measure(&config, &model_dir, &name, &a)?;
    let trl_failed = trl.map(|result| {
        let failed = result.as_ref().err().map(|e| format!("{e:#}"));
        report.set_trl(result);
        failed
    });
    let trl_failed = trl_failed.flatten();
    report.say_what_was_not_measured();
    report.seconds = started.elapsed().as_secs_f64();
    match a.json {
        true => println!("{}", serde_json::to_string_pretty(&report)?),
        false => print!("{}", report.table()),
    }
    match trl_failed {
        Some(e) => bail!("colo bench real: the TRL run failed: {e}"),
        None => Ok(()),
    }
}

/// The model's directory and name: `--model`, or the preset written into
/// `work` with init-model's code.
fn model_dir(a: &Args, work: &Path) -> Result<(PathBuf, String)> {
    if let Some(dir) = &a.model {
        ensure!(
            dir.join("config.json").is_file(),
            "--model {}: no config.json there (colo init-model --preset NAME --out DIR makes one)",
            dir.display()
        );
        let name = dir
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned());
        return Ok((dir.clone(), name));
    }
    let (spec, published) = preset(&a.preset)?;
    let dir = work.join("model");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let t = Instant::now();
    let written = super::init_model::write_model(
        &dir,
        &spec,
        &published,
        super::init_model::WeightDtype::Bf16,
        0,
        u64::MAX,
    )?;
    eprintln!(
        "colo bench real: wrote the {} model ({} parameters, {} of bf16 weights) in {:.1} s",
        spec.name,
        super::init_model::thousands(written.params),
        colo_mem::fmt_bytes(written.bytes),
        t.elapsed().as_secs_f64()
    );
    Ok((dir, spec.name))
}

/// A planner preset's shape, or `tiny`: Qwen2.5-0.5B's family and files
/// at 2 layers of hidden 64 (0.1 M parameters).
fn preset(name: &str) -> Result<(ModelSpec, Published)> {
    if name != "tiny" {
        return colo_plan::presets::published(name)
            .map_err(|e| anyhow::anyhow!("colo bench real --preset: {e} (or `tiny`)"));
    }
    let (mut spec, mut published) = colo_plan::presets::published("qwen2.5-0.5b")?;
    spec.name = "tiny".into();
    (spec.hidden, spec.intermediate, spec.layers) = (64, 128, 2);
    (spec.heads, spec.kv_heads, spec.head_dim, spec.vocab) = (4, 2, 16, 512);
    published.max_position_embeddings = 4096;
    published.max_window_layers = Some(2);
    Ok((spec, published))
}

/// The run config: the model's `run.toml` (init-model's job for it where
/// there is none), `steps` steps, into `work/run`.
fn run_config(model: &Path, name: &str, work: &Path, steps: usize) -> Result<Config> {
    let path = model.join("run.toml");
    let mut config = match path.is_file() {
        true => Config::from_file(&path)?,
        false => {
            let text = super::init_model::run_toml(model, name)?;
            Config::from_toml(&text, &work.join("run.toml"))?
        }
    };
    config.trainer.total_steps = Some(steps);
    let optimizer_steps = steps.saturating_mul(config.batch.optimizer_steps_per_step);
    let optim = config.actor.optim();
    if let Some(why) = colo_rl::config::schedule_error(&optim, "actor", optimizer_steps) {
        bail!("--steps {steps}: {why}");
    }
    ensure!(
        config.cluster.workers() == 1,
        "{}: a run on {} workers; colo bench real measures one",
        path.display(),
        config.cluster.workers()
    );
    config.trainer.out_dir = Some(work.join("run"));
    config.trainer.resume = false;
    Ok(config)
}

/// The memcpy baseline, the plan, colo's run and its figures, then the
/// yardsticks measured after it.
fn measure(config: &Config, model: &Path, name: &str, a: &Args) -> Result<Report> {
    let steps = a.steps;
    let model_cfg = colo_model::ModelConfig::from_file(&model.join("config.json"))?;
    let params = model_cfg.num_parameters();
    let device = config.trainer.device;
    let dtype = config.trainer.dtype.resolve(device);
    let weight_bytes = params as u64 * dtype_bytes(dtype);
    // On the CPU the copies run before the run, while the machine's memory
    // is free (their buffers are unmapped when dropped); on CUDA after it,
    // so that libtorch's cache does not hold their buffers through it.
    let host_copies = match device {
        Device::Cpu => host_copies(config, weight_bytes),
        Device::Cuda => Vec::new(),
    };
    let plan = plan(config);
    let load_start = super::load_avg_1m();
    let out = config.out_dir().to_owned();
    eprintln!(
        "colo bench real: colo's run, {steps} steps on {}, into {}",
        device.name(),
        out.display()
    );
    let t = Instant::now();
    colo_rl::step::run(config, &out, false).context("colo bench real: colo's run")?;
    let run_s = t.elapsed().as_secs_f64();
    let rss_after_run_bytes = colo_mem::os::resident_bytes().ok();
    let load_end = super::load_avg_1m();
    let records = figures::step_records(&out.join("metrics.jsonl"))?;
    let timed = WARMUP_STEPS + 1..=steps;
    let figures = Figures::of(&records, timed.clone())?;
    let memory = MemoryFigures::of(&records, plan);
    let copies = match device {
        Device::Cpu => host_copies,
        Device::Cuda => vec![probes::device_copy(weight_bytes, device)?],
    };
    let sync = SyncFigures::of(weight_bytes, figures.sync_s, &copies[0]);
    let tokens = Tokens::of(&records, timed.clone(), config.batch.samples_per_step, {
        let new = config.rollout.max_new_tokens;
        (config.data.max_prompt_length + new, new)
    });
    let (flops, decode) = yardsticks(config, model, &model_cfg, tokens, &figures, copies)?;
    Ok(Report {
        model: ModelInfo {
            name: name.to_owned(),
            dir: model.to_owned(),
            made_here: a.model.is_none(),
            parameters: params as u64,
            dtype: dtype.name(),
            weight_bytes,
        },
        machine: Machine::this(),
        job: Job::of(config, steps, *timed.start()),
        colo: ColoRun {
            load_avg_1m_start: load_start,
            load_avg_1m_end: load_end,
            run_s,
            rss_after_run_bytes,
            figures,
        },
        sync,
        memory,
        flops,
        decode,
        trl: None,
        not_measured: Vec::new(),
        seconds: 0.0,
    })
}

/// On the CPU: a single-thread memcpy of `bytes` (bench mem's, the weight
/// sync's yardstick) and, where generation runs on more than one lane, a
/// copy on that many threads.
fn host_copies(config: &Config, bytes: u64) -> Vec<Copy> {
    let threads = colo_model::lanes::count(tch::Device::Cpu, config.rollout.cpu_threads);
    let one = Copy {
        what: "single-thread memcpy".into(),
        bytes,
        gib_s: super::bench_mem::memcpy_gib_s(bytes as usize),
    };
    std::iter::once(one)
        .chain(probes::threaded_copy(bytes, threads))
        .collect()
}

/// Training FLOP/s against a matrix product and decode against its bound,
/// measured after the run: the product at a micro-batch's tokens (the
/// run's mean sample), the decode on prompts of the run's mean prompt.
fn yardsticks(
    config: &Config,
    model: &Path,
    cfg: &colo_model::ModelConfig,
    tokens: Tokens,
    figures: &Figures,
    copies: Vec<Copy>,
) -> Result<(FlopFigures, DecodeFigures)> {
    let device = config.trainer.device;
    let kind = config.trainer.dtype.kind(device);
    let micro_tokens = match config.batch.micro_batch_max_tokens {
        Some(t) => t,
        None => (config.batch.micro_batch_samples as f64 * tokens.per_sample).round() as usize,
    };
    let lanes = colo_model::lanes::count(device.torch(), config.trainer.cpu_threads);
    let shape = (micro_tokens.max(1), cfg.hidden_size, cfg.intermediate_size);
    let matmul = probes::matmul(shape, kind, device, lanes).context("the matmul")?;
    let prompt = tokens.prompt_per_sample().round() as usize;
    let flops = FlopFigures::of(
        Shape::of(cfg),
        tokens,
        config.actor.ppo_epochs,
        (figures.phase("update_actor"), figures.phase("ref")),
        matmul,
    );
    eprintln!("colo bench real: decode steps of the rollout engine, after the run");
    let run = probes::decode(config, model, prompt).context("the decode")?;
    let read = Shape::of(cfg).matmul_params * dtype_bytes(config.trainer.dtype.resolve(device));
    Ok((flops, DecodeFigures::of(run, read, copies)))
}

fn dtype_bytes(dtype: Dtype) -> u64 {
    match dtype {
        Dtype::Bf16 => 2,
        _ => 4,
    }
}

/// colo-plan's predicted peak for the run and its phase, as `colo train`'s
/// plan check computes it, or why there is none.
fn plan(config: &Config) -> std::result::Result<(u64, String), String> {
    if config.memory.colocation == Colocation::Restart {
        return Err("colocation `restart` is not modelled by colo plan".into());
    }
    let run = super::plan_config::from_config(config).map_err(|e| format!("{e:#}"))?;
    let report = run
        .input
        .validate()
        .and_then(|p| colo_plan::memory::estimate(&p))
        .map_err(|e| format!("colo-plan: {e}"))?;
    Ok((report.peak_bytes, report.peak_phase))
}

/// The run's colocation mode and offload policy, as the config names them.
fn memory_mode(config: &Config) -> (&'static str, &'static str) {
    let mode = match config.memory.colocation {
        Colocation::Naive => "naive",
        Colocation::Restart => "restart",
        Colocation::Sleep => "sleep",
        Colocation::Staged => "staged",
    };
    let policy = match config.memory.offload_policy {
        OffloadPolicy::AsNeeded => "as_needed",
        OffloadPolicy::Always => "always",
    };
    (mode, policy)
}

/// The built-in task's training prompts as JSONL (`prompt`, `answer`), for
/// TRL to draw from the same problems; `None` for a run on files.
fn builtin_train_jsonl(config: &Config, dir: &Path) -> Result<Option<PathBuf>> {
    match &config.data.source() {
        DataSource::Builtin(task) => Ok(Some(task.write_jsonl(dir)?.0)),
        DataSource::Files { .. } => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny preset is a Qwen2 of its own shape, loadable by colo-model,
    /// and its job is init-model's.
    #[test]
    fn the_tiny_preset_writes_a_small_qwen2_with_the_job() {
        let work = tempfile::tempdir().unwrap();
        let (spec, _) = preset("tiny").unwrap();
        assert!(spec.params() < 200_000, "{}", spec.params());
        let args = Args {
            preset: "tiny".into(),
            model: None,
            steps: 3,
            trl: false,
            device: None,
            json: true,
        };
        let (dir, name) = model_dir(&args, work.path()).unwrap();
        assert_eq!(name, "tiny");
        let cfg = colo_model::ModelConfig::from_file(&dir.join("config.json")).unwrap();
        assert_eq!(cfg.num_parameters() as u64, spec.params());
        let config = run_config(&dir, &name, work.path(), 3).unwrap();
        assert_eq!(config.total_steps(0), 3);
        assert_eq!((config.batch.prompts_per_step, config.rollout.n), (4, 4));
        assert_eq!(config.out_dir(), work.path().join("run"));
        assert!(preset("gpt-5").unwrap_err().to_string().contains("tiny"));
    }

    #[test]
    fn memcpy_is_timed_over_the_buffer() {
        let gib_s = super::super::bench_mem::memcpy_gib_s(1 << 20);
        assert!(gib_s.is_finite() && gib_s > 0.1, "{gib_s}");
    }
}
