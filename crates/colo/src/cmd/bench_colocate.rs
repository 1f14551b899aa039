//! `colo bench colocate`: the seeds' story, measured. The same RL step runs
//! in each colocation mode (`naive`, `restart`, `sleep`, `staged`) and the
//! benchmark reports, per mode, what the multi-stage-awake RFC argues about:
//! the peak device memory, the **wake peak** (the train → rollout switch),
//! the switch times and whether the step fits the device.
//!
//! Why it is built this way:
//!
//! - **The real step.** Each mode is a whole [`colo_rl::step::run`] (GRPO
//!   with a KL loss to a reference, so the reference's offload is in the
//!   picture too) on a run directory of its own; the figures come from the
//!   run's own `metrics.jsonl` and `timeline.jsonl`, the files a user reads.
//!   The first steps are a warm-up (caches filling, first page faults) and
//!   are not reported.
//! - **A model whose memory matters.** A random-init Qwen2-shaped model of
//!   ~18 M parameters (flags change it) written as a Hugging Face checkpoint
//!   with the built-in character tokenizer, on the built-in arithmetic task.
//!   Nothing is learned in a few steps; only memory and time are measured.
//! - **A KV cache larger than the trainer's weights**, as in the RFC (there
//!   the KV cache is ~95 GB against a few GB of weights per device). It is
//!   fixed in tokens (`max_kv_tokens`), not as a fraction of free memory, so
//!   the same cache is compared across modes and capacities.
//! - **The wake peak** is the largest resident total over the timeline
//!   events of one train → rollout switch, after the event that opens it
//!   (that one is the state training left, i.e. the training phase's peak,
//!   not the wake's). In `sleep` it is trainer weights + rollout weights +
//!   KV cache; in `staged` the trainer's copy is gone before the KV cache
//!   comes back, so the difference is the trainer's weight bytes.
//! - **The choreography alone**: the runs give up everything the offload
//!   flags allow at every switch (`memory.offload_policy = "always"`), so
//!   the modes are compared by what each must hold, not by how much a roomy
//!   device lets them keep.
//! - **The capacity experiment**: a device size halfway between `staged`'s
//!   whole-step peak and `sleep`'s wake peak, both rerun there. The RFC's
//!   claim is that `sleep` runs out of memory and `staged` fits; an
//!   out-of-memory error is a result (`fits: false` with colo-mem's message,
//!   which names the phase and the bytes per tag), not a crash.
//!
//! Ratios are measured in the same run; on a shared machine the load
//! average is printed with them.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use colo_mem::fmt_bytes;
use colo_model::{Arch, Model, ModelConfig, Weights};
use colo_rl::config::{Colocation, Device as RunDevice};
use colo_rl::metrics::{self, Record};
use colo_rl::task::ArithmeticTask;
use colo_rl::{vocab, Config, StepMetrics};
use tch::{Device, Kind};

mod report;

use report::{
    find, print_table, targets, CapacityExperiment, Measured, ModeResult, ModelInfo, Oom, Report,
    Stage,
};

#[derive(clap::Args)]
pub struct Args {
    /// Hidden size of the benchmark model (a multiple of 64; heads of 64).
    #[arg(long, default_value_t = 512, value_parser = super::bench::count::<1, 65536>)]
    hidden: usize,
    /// Transformer layers of the benchmark model.
    #[arg(long, default_value_t = 6, value_parser = super::bench::count::<1, 1024>)]
    layers: usize,
    /// Prompts per RL step.
    #[arg(long, default_value_t = 4, value_parser = super::bench::count::<1, 65536>)]
    prompts: usize,
    /// Samples per prompt.
    #[arg(long, default_value_t = 4, value_parser = super::bench::count::<2, 4096>)]
    n: usize,
    /// Steps run before the measured ones (not reported).
    #[arg(long, default_value_t = 1, value_parser = super::bench::count::<0, 1048576>)]
    warmup: usize,
    /// Measured steps per mode (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = super::bench::count::<1, 1048576>)]
    steps: usize,
    /// The KV cache's bytes as a multiple of the trainer's weight bytes.
    #[arg(long, default_value_t = 6.0)]
    kv_over_weights: f64,
    /// Device capacity for the per-mode runs (`auto`: the machine's memory).
    #[arg(long, default_value = "auto")]
    capacity: String,
    /// Where the model, data and run directories go (default: a fresh
    /// directory under the system's temporary directory, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Where the runs train and generate: `cpu`, or `cuda` (a build with
    /// the `cuda` feature, on a machine with an NVIDIA GPU).
    #[arg(long, default_value = "cpu", value_parser = super::bench::parse_device)]
    device: RunDevice,
    /// The runs' `trainer.dtype`: `f32` (the default: the modes' memory
    /// story at its targets' proportions) or `bf16`, where the trainer's
    /// float32 state (gradients, moments, master weights: 16 bytes per
    /// 2-byte weight) outweighs the wake on small models.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

impl Args {
    /// The defaults, on `device` (what `colo gpu-check` runs).
    pub fn on(device: RunDevice) -> Self {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mut a = Cli::parse_from(["colocate"]).args;
        a.device = device;
        a
    }
}

/// Timeline phases of the train → rollout switch (see colo-rl's worker).
const SWITCH_PHASES: &[&str] = &[
    "release_cache",
    "offload_optimizer",
    "offload_ref",
    "wake_all",
    "wake_weights",
    "sync_weights",
    "free_trainer_weights",
    "wake_kv_cache",
    "save_weights",
    "restart_engine",
];

const MODES: [Colocation; 4] = [
    Colocation::Naive,
    Colocation::Restart,
    Colocation::Sleep,
    Colocation::Staged,
];

/// The mode's name in the config file and in the report.
fn mode_name(mode: Colocation) -> &'static str {
    match mode {
        Colocation::Naive => "naive",
        Colocation::Restart => "restart",
        Colocation::Sleep => "sleep",
        Colocation::Staged => "staged",
    }
}

pub fn run(a: Args) -> Result<()> {
    let report = measure_report(&a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// The three targets and the capacity experiment on `device`, in one line
/// (for `colo gpu-check`); an error if a target was missed.
///
/// On CUDA the medians are of 9 measured steps, not 3: a switch there takes
/// 20–30 ms, and with 3 steps the staged/sleep ratio read 0.99, 1.16 and
/// 1.37 on three fresh H100 machines (the eleventh session's runs).
pub fn check_on(device: RunDevice) -> Result<String> {
    let mut args = Args::on(device);
    if device == RunDevice::Cuda {
        args.steps = 9;
    }
    let report = measure_report(&args)?;
    print_table(&report);
    let t = report
        .targets
        .as_ref()
        .context("targets not computed: sleep or staged did not fit")?;
    let line = format!(
        "saving {:.2}× trainer weights, staged/sleep switch {:.2}, slowest switch {}, \
         sleep OOMs and staged fits: {}",
        t.saving_vs_trainer_weights,
        t.staged_over_sleep_switch,
        t.slowest_switch,
        report.capacity_experiment.sleep_oom_staged_fits
    );
    ensure!(
        t.saving_met && t.switch_met && t.restart_slowest,
        "a target was missed: {line}"
    );
    Ok(line)
}

fn measure_report(a: &Args) -> Result<Report> {
    let started = std::time::Instant::now();
    ensure!(
        ["f32", "bf16"].contains(&a.dtype.as_str()),
        "--dtype must be f32 or bf16, got {:?}",
        a.dtype
    );
    ensure!(a.steps > 0, "--steps must be at least 1");
    ensure!(
        a.kv_over_weights > 0.0,
        "--kv-over-weights must be positive"
    );
    let cfg = model_config(a.hidden, a.layers)?;
    let (work, owned) = match &a.work_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("colo-bench-colocate-{}", std::process::id())),
            true,
        ),
    };
    let setup = Setup::write(&work, &cfg, a)?;
    let result = measure(a, &setup);
    if owned {
        let _ = std::fs::remove_dir_all(&work);
    }
    let (modes, capacity_experiment) = result?;
    let report = Report {
        model: ModelInfo {
            parameters: cfg.num_parameters(),
            hidden: cfg.hidden_size,
            layers: cfg.num_layers,
            weight_bytes: setup.weight_bytes,
            dtype: a.dtype.clone(),
        },
        prompts: a.prompts,
        n: a.n,
        warmup_steps: a.warmup,
        measured_steps: a.steps,
        max_kv_tokens: setup.kv_tokens,
        kv_cache_bytes: (setup.kv_tokens * kv_bytes_per_token(&cfg, dtype_bytes(&a.dtype))) as u64,
        capacity: a.capacity.clone(),
        targets: targets(&modes),
        modes,
        capacity_experiment,
        load_avg_1m: crate::cmd::load_avg_1m(),
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(report)
}

/// The four modes at the configured capacity, then the capacity experiment.
fn measure(a: &Args, setup: &Setup) -> Result<(Vec<ModeResult>, CapacityExperiment)> {
    let total = a.warmup + a.steps;
    let mut modes = Vec::new();
    // A TOML string: Rust's quoting of plain text is TOML's.
    let capacity = format!("{:?}", a.capacity);
    for mode in MODES {
        eprintln!(
            "colo bench colocate: {} ({total} steps, capacity {})",
            mode_name(mode),
            a.capacity
        );
        modes.push(run_mode(setup, mode, &capacity, a.warmup, total)?);
    }
    // Nothing to compare, and no staged peak to place the experiment at.
    ensure!(
        modes.iter().any(|m| m.fits),
        "--capacity {}: no colocation mode fits (each ran out of memory); give it more",
        a.capacity
    );
    let exp = capacity_experiment(setup, &modes, a.warmup.min(1))?;
    Ok((modes, exp))
}

/// The model: Qwen2-shaped, heads of 64, GQA 4:1, SwiGLU 3× wide, the
/// built-in character vocabulary, tied embeddings.
fn model_config(hidden: usize, layers: usize) -> Result<ModelConfig> {
    ensure!(
        hidden >= 64 && hidden.is_multiple_of(64),
        "--hidden must be a positive multiple of 64, got {hidden}"
    );
    ensure!(layers > 0, "--layers must be at least 1");
    let heads = hidden / 64;
    let mut cfg = colo_rl::task::model_config();
    cfg.arch = Arch::Qwen2;
    cfg.hidden_size = hidden;
    cfg.intermediate_size = 3 * hidden;
    cfg.num_layers = layers;
    cfg.num_heads = heads;
    cfg.num_kv_heads = (heads / 4).max(1);
    cfg.head_dim = 64;
    Ok(cfg)
}

/// Bytes of one token's keys and values over all layers (f32, as the
/// rollout engine stores them).
fn kv_bytes_per_token(cfg: &ModelConfig, dtype_bytes: usize) -> usize {
    2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
}

fn dtype_bytes(dtype: &str) -> usize {
    if dtype == "bf16" {
        2
    } else {
        4
    }
}

/// The files every mode's run shares.
struct Setup {
    work: PathBuf,
    model: PathBuf,
    train: PathBuf,
    val: PathBuf,
    prompts: usize,
    n: usize,
    kv_tokens: usize,
    weight_bytes: u64,
    device: RunDevice,
    dtype: String,
}

impl Setup {
    /// Writes the random-init checkpoint, the tokenizer and the task data.
    fn write(work: &Path, cfg: &ModelConfig, a: &Args) -> Result<Setup> {
        let model = work.join("model");
        let weights = Weights::random(cfg, 0.02, Kind::Float, Device::Cpu)?;
        Model::load(cfg, &weights)?
            .save_dir(&model)
            .with_context(|| format!("writing the benchmark model into {}", model.display()))?;
        vocab::write_tokenizer(&model)?;
        let (train, val_all) = ArithmeticTask::default().write_jsonl(&work.join("data"))?;
        // The loop evaluates once at the end; a few held-out prompts keep
        // that out of the benchmark's time.
        let val = work.join("data/val_small.jsonl");
        let text = std::fs::read_to_string(&val_all)
            .with_context(|| format!("reading {}", val_all.display()))?;
        let head: String = text.lines().take(4).map(|l| format!("{l}\n")).collect();
        std::fs::write(&val, head).with_context(|| format!("writing {}", val.display()))?;
        let bytes = dtype_bytes(&a.dtype);
        let weight_bytes = (bytes * cfg.num_parameters()) as u64;
        let kv_tokens = (a.kv_over_weights * weight_bytes as f64
            / kv_bytes_per_token(cfg, bytes) as f64)
            .ceil() as usize;
        Ok(Setup {
            work: work.to_owned(),
            model,
            train,
            val,
            prompts: a.prompts,
            n: a.n,
            kv_tokens,
            weight_bytes,
            device: a.device,
            dtype: a.dtype.clone(),
        })
    }

    /// The run's TOML: one mini-batch of all samples per step, GRPO with a
    /// KL loss (so a reference is loaded and offloaded), everything the
    /// trainer holds offloaded during generation, no evaluation or
    /// checkpoint until the end.
    fn config(&self, mode: &str, capacity: &str, steps: usize) -> Result<Config> {
        let toml = format!(
            r#"
[data]
train_files = [{train:?}]
val_files = [{val:?}]
train_batch_size = {prompts}

[model]
path = {model:?}

[rollout]
n = {n}
max_new_tokens = 6
max_kv_tokens = {kv}

[actor]
ppo_mini_batch_size = {prompts}
ppo_micro_batch_size = {samples}
use_kl_loss = true

[memory]
capacity = {capacity}
colocation = "{mode}"
offload_policy = "always"

[trainer]
device = "{device}"
dtype = "{dtype}"
total_steps = {steps}
save_freq = 0
test_freq = 0
val_before_train = false
"#,
            train = self.train.display().to_string(),
            val = self.val.display().to_string(),
            model = self.model.display().to_string(),
            prompts = self.prompts,
            n = self.n,
            samples = self.prompts * self.n,
            kv = self.kv_tokens,
            device = self.device.name(),
            dtype = self.dtype,
        );
        Ok(Config::from_toml(
            &toml,
            &self.work.join(format!("{mode}.toml")),
        )?)
    }
}

/// Runs `mode` for `total` steps at `capacity` (a TOML value) and reads its
/// measurements, or reports it as not fitting if it ran out of memory.
fn run_mode(
    setup: &Setup,
    mode: Colocation,
    capacity: &str,
    warmup: usize,
    total: usize,
) -> Result<ModeResult> {
    let name = mode_name(mode);
    let config = setup.config(name, capacity, total)?;
    ensure!(
        config.memory.colocation == mode,
        "{name}: the config chose {:?}",
        config.memory.colocation
    );
    let dir = setup.work.join(format!("run-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    let outcome = colo_rl::step::run(&config, &dir, false);
    let result = match outcome {
        Ok(_) => read_run(&dir, name, warmup, total),
        Err(e) => {
            let text = format!("{e}");
            if !text.contains("out of device memory") {
                return Err(anyhow::Error::new(e)
                    .context(format!("colo bench colocate: the {name} run failed")));
            }
            let oom_phase = text
                .split("in phase `")
                .nth(1)
                .and_then(|t| t.split('`').next());
            let oom = Oom {
                oom_phase: oom_phase.map(str::to_owned),
                error: text,
            };
            Ok(ModeResult {
                mode: name,
                fits: false,
                oom: Some(oom),
                measured: None,
            })
        }
    };
    // Checkpoints of a few hundred MB per mode: gone once read.
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The measured steps' figures from `metrics.jsonl` and `timeline.jsonl`.
fn read_run(dir: &Path, name: &'static str, warmup: usize, total: usize) -> Result<ModeResult> {
    let steps: Vec<_> = metrics::read(&dir.join("metrics.jsonl"))?
        .into_iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some(s),
            Record::Eval(_) => None,
        })
        .skip(warmup)
        .collect();
    ensure!(
        !steps.is_empty(),
        "{name}: no measured step in {}",
        dir.display()
    );
    let (switches, trainer_weight_bytes) = read_switches(&dir.join("timeline.jsonl"))?;
    // One switch per step, then the final evaluation's.
    ensure!(
        switches.len() > total,
        "{name}: {} switches in the timeline for {total} steps",
        switches.len()
    );
    let measured = &switches[warmup..total];
    let wake_peak = measured.iter().map(|s| wake_peak(s)).max().unwrap_or(0);
    let last = measured.last().map(|s| stages(s)).unwrap_or_default();
    let median_of = |f: fn(&StepMetrics) -> f64| median(steps.iter().map(|s| f(s)).collect());
    let measured = Measured {
        trainer_weight_bytes,
        peak_device_bytes: steps.iter().map(|s| s.peak_device_bytes).max().unwrap_or(0),
        wake_peak_bytes: wake_peak,
        wake_stages: last,
        switch_to_rollout_s: median_of(|s| s.timing_switch_to_rollout),
        switch_to_train_s: median_of(|s| s.timing_switch_to_train),
        update_weights_s: median_of(|s| s.timing_update_weights),
        step_s: median_of(|s| s.timing_step),
    };
    Ok(ModeResult {
        mode: name,
        fits: true,
        oom: None,
        measured: Some(measured),
    })
}

/// One timeline event, as much of it as the benchmark reads.
#[derive(serde::Deserialize)]
struct Event {
    phase: String,
    resident_bytes: u64,
    per_tag: std::collections::BTreeMap<String, u64>,
}

/// The train → rollout switches in order: each is the run of consecutive
/// events in a switch phase, plus the event that ends it (the phase change
/// to `generate`, which shows what the last stage left resident). Also the
/// largest resident bytes of the trainer's parameters.
fn read_switches(path: &Path) -> Result<(Vec<Vec<Event>>, u64)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut switches: Vec<Vec<Event>> = Vec::new();
    let mut open = false;
    let mut params = 0;
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let e: Event =
            serde_json::from_str(line).with_context(|| format!("{}:{}", path.display(), i + 1))?;
        params = params.max(
            e.per_tag
                .get(colo_mem::tags::TRAIN_PARAMS)
                .copied()
                .unwrap_or(0),
        );
        let in_switch = SWITCH_PHASES.contains(&e.phase.as_str());
        match (open, in_switch) {
            (false, true) => {
                switches.push(vec![e]);
                open = true;
            }
            (true, true) => switches.last_mut().expect("open").push(e),
            (true, false) => {
                switches.last_mut().expect("open").push(e);
                open = false;
            }
            (false, false) => {}
        }
    }
    Ok((switches, params))
}

/// The largest resident total after the switch's opening event.
fn wake_peak(switch: &[Event]) -> u64 {
    switch
        .iter()
        .skip(1)
        .map(|e| e.resident_bytes)
        .max()
        .unwrap_or(0)
}

/// Resident bytes at the end of each stage: the opening state (labelled
/// `train`), then the last event of each phase.
fn stages(switch: &[Event]) -> Vec<Stage> {
    let mut out = vec![Stage {
        phase: "train".into(),
        resident_bytes: switch.first().map_or(0, |e| e.resident_bytes),
    }];
    for (i, e) in switch.iter().enumerate().skip(1) {
        let next_differs = switch.get(i + 1).is_none_or(|n| n.phase != e.phase);
        if next_differs && SWITCH_PHASES.contains(&e.phase.as_str()) {
            out.push(Stage {
                phase: e.phase.clone(),
                resident_bytes: e.resident_bytes,
            });
        }
    }
    if let Some(e) = switch.last() {
        out.push(Stage {
            phase: "rollout".into(),
            resident_bytes: e.resident_bytes,
        });
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// sleep and staged rerun at a capacity between staged's whole-step peak
/// and sleep's wake peak, for `warmup + 1` steps (the first wake decides).
fn capacity_experiment(
    setup: &Setup,
    modes: &[ModeResult],
    warmup: usize,
) -> Result<CapacityExperiment> {
    let mut exp = CapacityExperiment {
        capacity_bytes: None,
        skipped: None,
        max_kv_tokens: setup.kv_tokens,
        sleep: None,
        staged: None,
        sleep_oom_staged_fits: false,
    };
    let (Some(sleep), Some(staged)) = (find(modes, "sleep"), find(modes, "staged")) else {
        exp.skipped = Some("sleep or staged did not fit the configured capacity, so there are no peaks to choose between".into());
        return Ok(exp);
    };
    let (low, high) = (staged.peak_device_bytes, sleep.wake_peak_bytes);
    if low >= high {
        exp.skipped = Some(format!(
            "staged's whole-step peak ({}) is not below sleep's wake peak ({}): the training phase, not the wake, \
             sets the peak; a larger --kv-over-weights moves the peak into the wake",
            fmt_bytes(low),
            fmt_bytes(high)
        ));
        return Ok(exp);
    }
    let capacity = low + (high - low) / 2;
    exp.capacity_bytes = Some(capacity);
    let at = |mode| {
        eprintln!(
            "colo bench colocate: {} at capacity {}",
            mode_name(mode),
            fmt_bytes(capacity)
        );
        run_mode(setup, mode, &capacity.to_string(), warmup, warmup + 1)
    };
    exp.sleep = Some(at(Colocation::Sleep)?);
    exp.staged = Some(at(Colocation::Staged)?);
    exp.sleep_oom_staged_fits =
        exp.sleep.as_ref().is_some_and(|r| !r.fits) && exp.staged.as_ref().is_some_and(|r| r.fits);
    Ok(exp)
}
