//! `colo bench lora`: merge LoRA adapters into the rollout engine's weights
//! at each switch, or apply them at decode? Measures both sides in one run.
//!
//! - **The switch.** What the sync does with adapters now: each decoder
//!   layer's parameters with its adapters merged (`W + scale · B A`, one
//!   `addmm` a projection, colo-model's `merged_layer_parameters`, as
//!   colo-train's `visit_merged` hands them over) and copied into the
//!   engine, plus the weights outside the layers; against the same copy
//!   without merging, and against copying only the adapters into an engine
//!   that applies them at decode (colo-rollout's `add_lora_adapters`; its
//!   base weights stay, the best case for that side). The three
//!   alternate, `--repeats` times after a warm-up; the fastest of each
//!   counts.
//! - **Generation.** The same load on an engine with merged weights and on
//!   one applying the adapters at decode, alternated `--rollouts` times
//!   (the fastest rollout of each counts): the whole rollout and its
//!   median decode step (every step after the first, which also
//!   prefills), at each `--loads` shape; no stop tokens, so every sample
//!   decodes to its length.
//!
//! Break-even: the merge's extra cost per switch over the adapters-only
//! switch, divided by the extra cost per generated token of decoding with
//! the adapters: above that many rollout tokens per switch, merging wins.
//!
//! The model is the built-in ~4 M-parameter one (`colo bench rollout`'s) or
//! `--model DIR`'s, with random adapters on `--targets` (the values do not
//! change the time) in `--dtype`, the engine's and the trainer's kind.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use colo_model::lora::{a_name, b_name, Adapter, PROJECTIONS};
use colo_model::{Model, ModelConfig, Weights};
use colo_rollout::{DecodeLora, Engine, EngineConfig, Request, SamplingParams};
use tch::{Kind, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory (config.json and model.safetensors,
    /// as `colo init-model` writes them) instead of the built-in random
    /// ~4 M-parameter model.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Adapter ranks to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,64")]
    ranks: Vec<usize>,
    /// `lora_alpha` (the scale is alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    alpha: f64,
    /// Target modules, comma-separated, or `all-linear`.
    #[arg(long, default_value = "all-linear")]
    targets: String,
    /// Generation loads, comma-separated `PROMPTSxNxTOKENS`: the built-in
    /// job's rollout (4 prompts × 4 samples × 16 new tokens) and a 64-row
    /// decode batch of 128 tokens.
    #[arg(long, value_delimiter = ',', default_value = "4x4x16,16x4x128", value_parser = parse_load)]
    loads: Vec<Load>,
    /// The weights' kind: `bf16` (what `trainer.dtype = "auto"` gives on
    /// these machines, and the 0.5 B job's) or `f32`.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Switches timed per variant, alternated (the fastest is reported).
    #[arg(long, default_value_t = 3, value_parser = super::bench::count::<1, 1000>)]
    repeats: usize,
    /// Rollouts per load and engine, alternated between the two (the
    /// fastest of each is reported).
    #[arg(long, default_value_t = 2, value_parser = super::bench::count::<1, 1000>)]
    rollouts: usize,
    /// Threads of the engines (default: `rollout.cpu_threads`, as `colo
    /// train` generates; 0: one per core).
    #[arg(long, value_parser = super::bench::count::<0, 1024>)]
    threads: Option<usize>,
    /// Where both run: `cpu`, or `cuda` (a build with the `cuda` feature).
    #[arg(long, default_value = "cpu", value_parser = super::bench::parse_device)]
    device: colo_rl::config::Device,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// One generation load.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Load {
    prompts: usize,
    n: usize,
    max_new_tokens: usize,
}

fn parse_load(s: &str) -> Result<Load, String> {
    let v: Vec<usize> = (s.split('x'))
        .map(|p| p.trim().parse::<usize>().unwrap_or(0))
        .collect();
    if v.len() != 3 || v.contains(&0) {
        return Err(format!(
            "{s:?}: expected PROMPTSxNxTOKENS of positive whole numbers, e.g. 4x4x16"
        ));
    }
    Ok(Load {
        prompts: v[0],
        n: v[1],
        max_new_tokens: v[2],
    })
}

/// A rollout's figures on one engine.
#[derive(Debug, Clone, serde::Serialize)]
struct Rollout {
    seconds: f64,
    /// CPU seconds of the process's threads over the rollout.
    cpu_seconds: f64,
    tokens: u64,
    /// Median of the steps after the first (which prefills too).
    decode_step_s: f64,
    decode_steps: usize,
}

#[derive(Debug, serde::Serialize)]
struct RankReport {
    rank: usize,
    adapter_parameters: usize,
    /// Merge every layer and copy everything into the engine (what the
    /// sync does with adapters now): the fastest of `--repeats`, and the
    /// least CPU time.
    merged_switch: Switch,
    /// Copy everything without merging.
    copy_switch: Switch,
    /// Copy only the adapters into an engine that applies them.
    adapters_switch: Switch,
    /// Per load: the adapters-at-decode engine's rollout, and the
    /// break-even in rollout tokens per switch.
    loads: Vec<LoadReport>,
}

/// A switch's least wall and least CPU seconds over its repeats.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Switch {
    seconds: f64,
    cpu_seconds: f64,
}

impl Switch {
    fn least(v: &[(f64, f64)]) -> Switch {
        Switch {
            seconds: least(v.iter().map(|x| x.0).collect()),
            cpu_seconds: least(v.iter().map(|x| x.1).collect()),
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct LoadReport {
    load: Load,
    /// The merged engine's rollout (alternated with the other, the fastest
    /// of `--rollouts`).
    merged: Rollout,
    decode: Rollout,
    /// Extra seconds per generated token with the adapters at decode.
    extra_per_token_s: f64,
    /// Rollout tokens per switch above which merging wins (infinite, or
    /// `null` in JSON, when the adapters cost nothing at decode).
    break_even_tokens: f64,
    /// The same two in CPU seconds; the break-even `None` for a merged
    /// switch under [`CPU_RESOLUTION_S`] of CPU time.
    extra_cpu_per_token_s: f64,
    break_even_cpu_tokens: Option<f64>,
}

/// How stale a running thread's CPU time in `schedstat` may be: the kernel
/// adds a thread's current slice at its next tick (4 ms at 250 Hz).
const CPU_RESOLUTION_S: f64 = 0.01;

#[derive(Debug, serde::Serialize)]
struct Report {
    device: colo_rl::config::Device,
    model: String,
    dtype: &'static str,
    model_parameters: usize,
    targets: Vec<String>,
    threads: usize,
    load_avg_start: Option<f64>,
    load_avg_end: Option<f64>,
    ranks: Vec<RankReport>,
}

fn load_model(
    dir: Option<&std::path::Path>,
    kind: Kind,
    device: tch::Device,
) -> anyhow::Result<(ModelConfig, Weights)> {
    let Some(dir) = dir else {
        let cfg = super::bench_rollout::bench_model_config();
        let weights = Weights::random(&cfg, 0.1, kind, device)?;
        return Ok((cfg, weights));
    };
    let what = || format!("--model {}", dir.display());
    let cfg = ModelConfig::from_file(&dir.join("config.json")).with_context(what)?;
    let weights = Weights::from_dir(dir, kind, device).with_context(what)?;
    Ok((cfg, weights))
}

fn targets_of(s: &str) -> anyhow::Result<Vec<String>> {
    if s == "all-linear" {
        return Ok(PROJECTIONS.iter().map(|p| p.to_string()).collect());
    }
    let t: Vec<String> = s.split(',').map(|p| p.trim().to_string()).collect();
    if let Some(bad) = t.iter().find(|p| !PROJECTIONS.contains(&p.as_str())) {
        anyhow::bail!("--targets: `{bad}` is not one of all-linear, {PROJECTIONS:?}");
    }
    Ok(t)
}

/// Random adapters of `rank` on `targets`: under PEFT's names, and on a
/// clone of `base` (as the trainer holds them).
fn adapters(
    base: &Model,
    targets: &[String],
    rank: usize,
    alpha: f64,
) -> anyhow::Result<(Vec<(String, Tensor)>, Model)> {
    let (kind, device) = (base.dtype(), base.device());
    let t: Vec<&str> = targets.iter().map(String::as_str).collect();
    let (mut named, mut by_path) = (Vec::new(), std::collections::HashMap::new());
    for (path, (inp, out)) in base.projection_paths(&t) {
        let r = rank as i64;
        let a = (Tensor::randn([r, inp], (kind, device)) * 0.01).to_kind(kind);
        let b = (Tensor::randn([out, r], (kind, device)) * 0.01).to_kind(kind);
        named.push((a_name(&path), a.shallow_clone()));
        named.push((b_name(&path), b.shallow_clone()));
        by_path.insert(path, Adapter::new(a, b, alpha / rank as f64));
    }
    Ok((named, base.with_adapters(by_path)?))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn least(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

/// The rollout that took the least time.
fn fastest(v: Vec<Rollout>) -> Rollout {
    (v.into_iter())
        .min_by(|x, y| x.seconds.total_cmp(&y.seconds))
        .expect("at least one rollout")
}

/// CPU seconds of this process's threads so far (the first field of each
/// one's `/proc/self/task/*/schedstat`, nanoseconds on a CPU): on a
/// machine others load, the time-slicing inflates wall time but not
/// this. 0 where the file cannot be read.
fn cpu_s() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = (tasks.flatten())
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// Wall and CPU seconds of `f`, after the device's queued work.
fn timed(
    device: tch::Device,
    f: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    super::bench::sync(device);
    let (t, c) = (Instant::now(), cpu_s());
    f()?;
    super::bench::sync(device);
    Ok((t.elapsed().as_secs_f64(), cpu_s() - c))
}

/// The sync into `engine`: the weights outside the layers, then each
/// layer's, merged when `merge` (in a region of the `activations` tag of
/// `engine`'s pool, as colo-train's `visit_merged` makes them in its
/// pool's: the pool's pages are reused where the heap's large allocations
/// would be mapped and faulted in afresh).
fn switch(engine: &mut Engine, adapted: &Model, merge: bool) -> anyhow::Result<()> {
    let _no_grad = tch::no_grad_guard();
    let pool = engine.pool().clone();
    engine.update_weights(&adapted.non_layer_parameters())?;
    let plain = match merge {
        true => Vec::new(),
        false => adapted.without_adapters().named_parameters(),
    };
    for i in 0..adapted.layers().len() {
        let layer = match merge {
            true => {
                let guard = pool.region(colo_mem::tags::ACTIVATIONS)?;
                let merged = adapted.merged_layer_parameters(i);
                guard.finish()?;
                merged?
            }
            false => {
                let prefix = format!("model.layers.{i}.");
                (plain.iter())
                    .filter(|(n, _)| n.starts_with(&prefix))
                    .map(|(n, t)| (n.clone(), t.shallow_clone()))
                    .collect()
            }
        };
        engine.update_weights(&layer)?;
    }
    Ok(())
}

/// Prompt `i`: 24 to 87 token ids of the vocabulary.
fn prompt(i: usize, vocab: usize) -> Vec<u32> {
    let len = 24 + (i * 37) % 64;
    (0..len)
        .map(|j| ((i * 7919 + j * 104_729) % vocab) as u32)
        .collect()
}

/// One rollout of `load` on `engine`, step by step.
fn rollout(engine: &mut Engine, load: Load, vocab: usize, seed: u64) -> anyhow::Result<Rollout> {
    let params = SamplingParams {
        n: load.n,
        max_new_tokens: load.max_new_tokens,
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let device = engine.model()?.device();
    engine.reset_stats();
    let mut steps = Vec::new();
    let (start, cpu) = (Instant::now(), cpu_s());
    for i in 0..load.prompts {
        engine.add_request(Request::new(prompt(i, vocab), params.clone()))?;
    }
    while engine.in_flight() > 0 {
        steps.push(timed(device, || engine.step().map(|_| ()).map_err(Into::into))?.0);
    }
    let (seconds, cpu_seconds) = (start.elapsed().as_secs_f64(), cpu_s() - cpu);
    let decode = steps.split_off(1.min(steps.len()));
    Ok(Rollout {
        seconds,
        cpu_seconds,
        tokens: engine.stats().generated_tokens,
        decode_steps: decode.len(),
        decode_step_s: if decode.is_empty() {
            0.0
        } else {
            median(decode)
        },
    })
}

fn engine_config(loads: &[Load], threads: usize, ctx: usize) -> EngineConfig {
    let rows = loads.iter().map(|l| l.prompts * l.n).max().unwrap_or(1);
    let longest = loads
        .iter()
        .map(|l| 88 + l.max_new_tokens)
        .max()
        .unwrap_or(1);
    EngineConfig {
        max_batch: rows,
        cpu_threads: threads,
        enforce_eager: false,
        ..EngineConfig::with_kv_tokens(rows * longest.min(ctx))
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let load_avg_start = super::load_avg_1m();
    tch::manual_seed(a.seed as i64);
    let kind = match a.dtype.as_str() {
        "bf16" => Kind::BFloat16,
        "f32" => Kind::Float,
        other => anyhow::bail!("--dtype {other:?}: expected bf16 or f32"),
    };
    let targets = targets_of(&a.targets)?;
    let loads = a.loads.clone();
    anyhow::ensure!(
        !a.ranks.is_empty() && a.ranks.iter().all(|&r| r > 0),
        "--ranks: expected positive ranks"
    );
    let (pool, device) = super::bench::pool_on(a.device)?;
    let (cfg, weights) = load_model(a.model.as_deref(), kind, device)?;
    let base = Model::load(&cfg, &weights)?;
    let threads = a
        .threads
        .unwrap_or(colo_rl::Config::builtin().rollout.cpu_threads);
    let ecfg = engine_config(&loads, threads, cfg.max_position_embeddings);
    let all = tch::get_num_threads();
    tch::set_num_threads(1);
    let measured = measure(&a, &cfg, &weights, &base, &targets, &loads, pool, &ecfg);
    tch::set_num_threads(all);
    let ranks = measured?;
    let r = Report {
        device: a.device,
        model: a
            .model
            .as_ref()
            .map_or("built-in".into(), |d| d.display().to_string()),
        dtype: if kind == Kind::Float { "f32" } else { "bf16" },
        model_parameters: cfg.num_parameters(),
        targets,
        threads: colo_model::lanes::count(device, threads),
        load_avg_start,
        load_avg_end: super::load_avg_1m(),
        ranks,
    };
    match a.json {
        true => println!("{}", serde_json::to_string(&r)?),
        false => print_report(&r),
    }
    Ok(())
}

/// Per rank the switches, and per load a rollout on the merged engine
/// then one on the adapters-at-decode engine.
#[allow(clippy::too_many_arguments)]
fn measure(
    a: &Args,
    cfg: &ModelConfig,
    weights: &Weights,
    base: &Model,
    targets: &[String],
    loads: &[Load],
    pool: std::sync::Arc<colo_mem::Pool>,
    ecfg: &EngineConfig,
) -> anyhow::Result<Vec<RankReport>> {
    let vocab = cfg.vocab_size;
    let device = base.device();
    let warm = Load {
        prompts: 1,
        n: 1,
        max_new_tokens: 4,
    };
    let mut merged_engine = Engine::new(cfg, weights, None, pool.clone(), ecfg)?;
    rollout(&mut merged_engine, warm, vocab, a.seed)?;
    let mut ranks = Vec::new();
    for &rank in &a.ranks {
        let (named, adapted) = adapters(base, targets, rank, a.alpha)?;
        let mut decode = Engine::new(cfg, weights, None, pool.clone(), ecfg)?;
        decode.add_lora_adapters(&DecodeLora {
            rank,
            alpha: a.alpha,
            targets: targets.to_vec(),
        })?;
        let (mut m, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.repeats + 1 {
            m.push(timed(device, || {
                switch(&mut merged_engine, &adapted, true)
            })?);
            c.push(timed(device, || {
                switch(&mut merged_engine, &adapted, false)
            })?);
            d.push(timed(device, || {
                decode.update_weights(&named)?;
                Ok(())
            })?);
        }
        // The first of each is a warm-up.
        let (m, c, d) = (
            Switch::least(&m[1..]),
            Switch::least(&c[1..]),
            Switch::least(&d[1..]),
        );
        rollout(&mut decode, warm, vocab, a.seed)?;
        let mut per_load = Vec::new();
        for &l in loads {
            // Alternated, the fastest of each: the least disturbed by
            // other work on a shared machine.
            let (mut on_merged, mut r) = (Vec::new(), Vec::new());
            for _ in 0..a.rollouts {
                on_merged.push(rollout(&mut merged_engine, l, vocab, a.seed)?);
                r.push(rollout(&mut decode, l, vocab, a.seed)?);
            }
            let (on_merged, r) = (fastest(on_merged), fastest(r));
            let tokens = r.tokens.max(1) as f64;
            let extra = (r.seconds - on_merged.seconds) / tokens;
            let extra_cpu = (r.cpu_seconds - on_merged.cpu_seconds) / tokens;
            let even = |switch: f64, per_token: f64| match per_token > 0.0 {
                true => switch.max(0.0) / per_token,
                false => f64::INFINITY,
            };
            per_load.push(LoadReport {
                load: l,
                merged: on_merged,
                extra_per_token_s: extra,
                break_even_tokens: even(m.seconds - d.seconds, extra),
                extra_cpu_per_token_s: extra_cpu,
                break_even_cpu_tokens: (m.cpu_seconds >= CPU_RESOLUTION_S)
                    .then(|| even(m.cpu_seconds - d.cpu_seconds, extra_cpu)),
                decode: r,
            });
        }
        ranks.push(RankReport {
            rank,
            adapter_parameters: named.iter().map(|(_, t)| t.numel()).sum(),
            merged_switch: m,
            copy_switch: c,
            adapters_switch: d,
            loads: per_load,
        });
    }
    Ok(ranks)
}

fn print_report(r: &Report) {
    println!(
        "{} ({:.1} M parameters, {}) on {:?}, {} lanes, targets {}; load {} → {}",
        r.model,
        r.model_parameters as f64 / 1e6,
        r.dtype,
        r.device,
        r.threads,
        r.targets.join(","),
        r.load_avg_start.map_or("?".into(), |l| format!("{l:.2}")),
        r.load_avg_end.map_or("?".into(), |l| format!("{l:.2}")),
    );
    let shape = |l: &Load| format!("{}×{}×{}", l.prompts, l.n, l.max_new_tokens);
    let sw = |s: &Switch| format!("{:.3} s ({:.3} CPU s)", s.seconds, s.cpu_seconds);
    for k in &r.ranks {
        println!(
            "rank {} ({:.2} M adapter parameters): switch merged {}, copied unmerged {}, adapters only {}",
            k.rank,
            k.adapter_parameters as f64 / 1e6,
            sw(&k.merged_switch),
            sw(&k.copy_switch),
            sw(&k.adapters_switch)
        );
        for lr in &k.loads {
            let (m, d) = (&lr.merged, &lr.decode);
            println!(
                "  {:>10} merged:    rollout {:>8.3} s ({:>8.3} CPU s), {} tokens, decode step {:>7.2} ms",
                shape(&lr.load),
                m.seconds,
                m.cpu_seconds,
                m.tokens,
                m.decode_step_s * 1e3
            );
            println!(
                "  {:>10} at decode: rollout {:>8.3} s ({:>8.3} CPU s, {:+.1}%), decode step {:>7.2} ms ({:+.1}%)",
                shape(&lr.load),
                d.seconds,
                d.cpu_seconds,
                100.0 * (d.cpu_seconds / m.cpu_seconds - 1.0),
                d.decode_step_s * 1e3,
                100.0 * (d.decode_step_s / m.decode_step_s - 1.0),
            );
            let by_cpu = match lr.break_even_cpu_tokens {
                Some(t) => format!("{t:.0} by CPU time"),
                None => "the switch's CPU time is below the counters' resolution".into(),
            };
            println!(
                "  {:>10} merging wins above {:.0} rollout tokens per switch ({by_cpu})",
                shape(&lr.load),
                lr.break_even_tokens,
            );
        }
    }
}
