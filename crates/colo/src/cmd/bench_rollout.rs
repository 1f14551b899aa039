//! `colo bench rollout`: generated tokens per second of colo's rollout
//! engine on a GRPO-shaped load, against a naive baseline measured in the
//! same run: static batches with a contiguous per-sequence KV cache
//! (colo-model's `forward_with_cache`, which concatenates every step), every
//! sample prefilling its own copy of the prompt, and a batch that runs until
//! its longest sequence finishes.
//!
//! The model is a randomly initialised Qwen2-shaped model of ~4 M parameters
//! (the throughput of a rollout engine does not depend on the weights'
//! values), or with `--model DIR` a Hugging Face directory's (config.json
//! and safetensors, as `colo init-model` writes them; no tokenizer), which
//! both engines load in float32 as they do the built-in one; the synthetic
//! prompts then draw their ids from that model's vocabulary. To give
//! completions GRPO-like varied lengths, a fixed set of `--stop-tokens`
//! token ids ends a completion, as an end-of-sequence token would; both
//! engines see the same stop ids and count only real tokens (how often a
//! random model draws them depends on its weights: `--stop-tokens 0`
//! decodes every sample to `--max-new-tokens`).
//! Each engine is warmed up on one prompt before its clock starts.
//!
//! colo's engine computes each layer's q/k/v and gate/up projections with
//! one product each (its weights stored as vLLM stores them, colo-model's
//! `fuse_projections`); the baseline runs the model as transformers does,
//! one product per projection.
//!
//! `--device cuda` runs both on the GPU (colo's KV cache in colo-mem's CUDA
//! pool, the baseline's contiguous cache in libtorch's). There colo replays
//! its decode steps as CUDA graphs, captured for the load's shapes before
//! its clock starts, as vLLM and SGLang capture theirs when they start
//! (`--enforce-eager`: none); the baseline launches every kernel, as
//! Hugging Face's `generate` does by default.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use colo_model::{Arch, Model, ModelConfig, Weights};
use colo_rollout::{sampling, Engine, EngineConfig, Request, SamplingParams};
use tch::{Kind, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// Prompts in the batch.
    #[arg(long, default_value_t = 32, value_parser = super::bench::count::<1, 65536>)]
    prompts: usize,
    /// Samples per prompt.
    #[arg(long, default_value_t = 8, value_parser = super::bench::count::<1, 4096>)]
    n: usize,
    /// Most new tokens per sample.
    #[arg(long, default_value_t = 128, value_parser = super::bench::count::<1, 1048576>)]
    max_new_tokens: usize,
    /// Sequences per static batch of the baseline, and the engine's
    /// `max_batch`.
    #[arg(long, default_value_t = 256, value_parser = super::bench::count::<1, 65536>)]
    batch: usize,
    /// Token ids (the first K of the vocabulary) that end a completion.
    #[arg(long, default_value_t = 24)]
    stop_tokens: u32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A Hugging Face model directory (config.json and model.safetensors,
    /// as `colo init-model` writes them) whose weights both engines load,
    /// in float32, instead of the built-in random ~4 M-parameter model.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Threads of colo's engine, each a lane of rows with one intra-op
    /// thread (default: what `colo train` gives generation,
    /// `rollout.cpu_threads`; 0: `OMP_NUM_THREADS`, else one per core).
    #[arg(long, value_parser = super::bench::count::<0, 1024>)]
    threads: Option<usize>,
    /// Intra-op threads of the baseline (default 0: libtorch's default,
    /// all cores, the baseline's best on these machines).
    #[arg(long, default_value_t = 0, value_parser = super::bench::count::<0, 1024>)]
    baseline_threads: usize,
    /// Where both engines run: `cpu`, or `cuda` (a build with the `cuda`
    /// feature, on a machine with an NVIDIA GPU).
    #[arg(long, default_value = "cpu", value_parser = super::bench::parse_device)]
    device: colo_rl::config::Device,
    /// On CUDA, decode every step eagerly: no CUDA graphs (vLLM's
    /// `--enforce-eager`).
    #[arg(long)]
    enforce_eager: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Report {
    device: colo_rl::config::Device,
    /// `--model`'s directory, or `built-in` (random weights).
    model: String,
    /// The weights' dtype in both engines.
    dtype: &'static str,
    prompts: usize,
    n: usize,
    max_new_tokens: usize,
    batch: usize,
    model_parameters: usize,
    generated_tokens: u64,
    seconds: f64,
    tokens_per_s: f64,
    baseline_generated_tokens: u64,
    baseline_seconds: f64,
    baseline_tokens_per_s: f64,
    speedup: f64,
    kv_peak_bytes: usize,
    baseline_kv_peak_bytes: usize,
    /// Intra-op threads each engine ran with.
    threads: usize,
    baseline_threads: i32,
    preemptions: u64,
    /// CUDA graphs colo's engine captured (before the clock started).
    cuda_graphs: usize,
}

/// The default benchmark model: Qwen2-shaped, ~4 M parameters.
pub fn bench_model_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: 4096,
        hidden_size: 256,
        intermediate_size: 704,
        num_layers: 4,
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 1e4,
        rope_llama3: None,
        max_position_embeddings: 1024,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        pad_token_id: None,
    }
}

/// Prompt `i`: 24 to 87 tokens, none of them a stop token.
fn prompt(i: usize, vocab: u32, stop: u32) -> Vec<u32> {
    let len = 24 + (i * 37) % 64;
    (0..len)
        .map(|j| stop + ((i * 7919 + j * 104_729) as u32 % (vocab - stop)))
        .collect()
}

/// `--model`'s config and weights on `device`, or the built-in model's
/// (random, from `--seed`); float32 either way.
fn load_model(dir: Option<&Path>, device: tch::Device) -> anyhow::Result<(ModelConfig, Weights)> {
    let Some(dir) = dir else {
        let cfg = bench_model_config();
        let weights = Weights::random(&cfg, 0.1, Kind::Float, device)?;
        return Ok((cfg, weights));
    };
    let what = || format!("--model {}", dir.display());
    let config = dir.join("config.json");
    anyhow::ensure!(
        !dir.is_dir() || config.is_file(),
        "{}: no config.json in it (expected a Hugging Face model directory: config.json and \
         model.safetensors, as `colo init-model` writes)",
        what()
    );
    // colo-model's errors name a missing directory, a malformed
    // config.json's path and fault, and missing or mis-shaped weights.
    let cfg = ModelConfig::from_file(&config).with_context(what)?;
    let weights = Weights::from_dir(dir, Kind::Float, device).with_context(what)?;
    Ok((cfg, weights))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    tch::manual_seed(a.seed as i64);
    let (pool, device) = super::bench::pool_on(a.device)?;
    let (cfg, weights) = load_model(a.model.as_deref(), device)?;
    let (prompts, params) = job(&a, cfg.vocab_size)?;

    let (ecfg, longest) = engine_config(&a, &prompts);
    let colo_threads = ecfg.cpu_threads;
    let mut engine = Engine::new(&cfg, &weights, None, pool, &ecfg)?;
    let reqs: Vec<Request> = prompts
        .iter()
        .map(|p| Request::new(p.clone(), params.clone()))
        .collect();
    // Each engine with its own thread policy: colo's as `colo train`
    // generates (its rows split over lanes, each with one intra-op thread:
    // its decode steps are many small ops, where intra-op threads cost
    // more in wake-ups than they give), the baseline's at libtorch's
    // default (its best here).
    // The process's count (1: `colo_rl::process::init`), put back after
    // each engine's run.
    let all = tch::get_num_threads();
    let colo_lanes = colo_model::lanes::count(device, colo_threads);
    let base_threads = match a.baseline_threads {
        0 => colo_rl::process::default_intra_op_threads(),
        n => n.min(i32::MAX as usize) as i32,
    };
    // Both engines first run one prompt for a few tokens, untimed: the first
    // use of a kernel costs far more than the rest (on CUDA, loading its
    // module and compiling PTX where the library has no code for the GPU:
    // the engine run first took 0.58 s against 0.27 s when run again on an
    // H200; on the CPU, oneDNN's primitives and the KV cache's first-touch
    // pages), and whichever engine ran first paid it for both.
    let warm = SamplingParams {
        max_new_tokens: 4,
        ..params.clone()
    };
    tch::set_num_threads(1);
    for r in engine.generate(vec![Request::new(prompts[0].clone(), warm.clone())])? {
        r.map_err(|e| anyhow::anyhow!("warm-up: {e}"))?;
    }
    // On CUDA, the decode step's graphs for this load, as vLLM and SGLang
    // capture theirs at start (none on the CPU or with --enforce-eager).
    engine.capture_cuda_graphs(a.batch.min(a.prompts * a.n), longest)?;
    engine.reset_stats();
    let t = Instant::now();
    let out = engine.generate(reqs);
    let seconds = t.elapsed().as_secs_f64();
    tch::set_num_threads(all);
    let out = out?;
    for r in &out {
        r.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let stats = engine.stats();

    // The baseline, on a heap copy of the same weights.
    let model = Model::load(&cfg, &weights)?;
    let (base_tokens, base_kv, baseline_seconds) =
        timed_baseline(&model, &prompts, [&warm, &params], a.batch, base_threads)?;

    let tokens_per_s = stats.generated_tokens as f64 / seconds;
    let baseline_tokens_per_s = base_tokens as f64 / baseline_seconds;
    let r = Report {
        device: a.device,
        model: match &a.model {
            Some(dir) => dir.display().to_string(),
            None => "built-in".into(),
        },
        dtype: "f32",
        prompts: a.prompts,
        n: a.n,
        max_new_tokens: a.max_new_tokens,
        batch: a.batch,
        model_parameters: cfg.num_parameters(),
        generated_tokens: stats.generated_tokens,
        seconds,
        tokens_per_s,
        baseline_generated_tokens: base_tokens,
        baseline_seconds,
        baseline_tokens_per_s,
        speedup: tokens_per_s / baseline_tokens_per_s,
        kv_peak_bytes: stats.kv_peak_bytes(),
        baseline_kv_peak_bytes: base_kv,
        preemptions: stats.preemptions,
        threads: colo_lanes,
        baseline_threads: base_threads,
        cuda_graphs: engine.cuda_graphs(),
    };
    match a.json {
        true => println!("{}", serde_json::to_string(&r)?),
        false => print_table(&a, &r),
    }
    Ok(())
}

/// The job's prompts (ids past the stop tokens, as [`prompt`] makes them)
/// and its sampling: temperature 1, the first `--stop-tokens` ids stop.
fn job(a: &Args, vocab_size: usize) -> anyhow::Result<(Vec<Vec<u32>>, SamplingParams)> {
    let vocab = u32::try_from(vocab_size).unwrap_or(u32::MAX);
    anyhow::ensure!(
        a.stop_tokens < vocab,
        "--stop-tokens {}: the model's vocabulary has {vocab} ids, and prompts need some \
         that are not stop tokens (expected fewer than {vocab})",
        a.stop_tokens
    );
    let prompts: Vec<Vec<u32>> = (0..a.prompts)
        .map(|i| prompt(i, vocab, a.stop_tokens))
        .collect();
    let params = SamplingParams {
        n: a.n,
        max_new_tokens: a.max_new_tokens,
        temperature: 1.0,
        stop_token_ids: (0..a.stop_tokens).collect(),
        seed: a.seed,
        ..SamplingParams::default()
    };
    Ok((prompts, params))
}

/// The report as a few lines: the job, each engine's tokens/s and KV peak,
/// the speed-up.
fn print_table(a: &Args, r: &Report) {
    let named = match &a.model {
        Some(_) => format!(" {} ({})", r.model, r.dtype),
        None => String::new(),
    };
    println!(
        "{} prompts × n={} × ≤{} new tokens, {} M-parameter model{named}, batch {}",
        r.prompts,
        r.n,
        r.max_new_tokens,
        r.model_parameters as f64 / 1e6,
        r.batch
    );
    println!(
        "colo-rollout  {:>8} tokens in {:>7.2} s = {:>9.1} tokens/s, peak KV {}",
        r.generated_tokens,
        r.seconds,
        r.tokens_per_s,
        colo_mem::fmt_bytes(r.kv_peak_bytes as u64)
    );
    println!(
        "baseline      {:>8} tokens in {:>7.2} s = {:>9.1} tokens/s, peak KV {}",
        r.baseline_generated_tokens,
        r.baseline_seconds,
        r.baseline_tokens_per_s,
        colo_mem::fmt_bytes(r.baseline_kv_peak_bytes as u64)
    );
    match a.device {
        colo_rl::config::Device::Cpu => println!(
            "speedup {:.2}× (threads: colo {} lanes of one, baseline {} intra-op)",
            r.speedup, r.threads, r.baseline_threads
        ),
        colo_rl::config::Device::Cuda => println!(
            "speedup {:.2}× (both on CUDA; colo replays {} CUDA graphs)",
            r.speedup, r.cuda_graphs
        ),
    }
}

/// colo's engine for the job, and its longest sequence. The KV pool holds
/// every sequence at full length, so the run measures batching and
/// paging, not preemption.
fn engine_config(a: &Args, prompts: &[Vec<u32>]) -> (EngineConfig, usize) {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + a.max_new_tokens;
    let colo_threads = a
        .threads
        .unwrap_or(colo_rl::Config::builtin().rollout.cpu_threads);
    let ecfg = EngineConfig {
        max_batch: a.batch,
        cpu_threads: colo_threads,
        enforce_eager: a.enforce_eager,
        ..EngineConfig::with_kv_tokens(a.batch.max(a.n) * longest)
    };
    (ecfg, longest)
}

/// The baseline's warm-up (`sampling[0]` on the first prompt) and its
/// timed run (`sampling[1]` on all) with `threads` intra-op threads, the
/// process's count put back after: the real tokens, the contiguous cache's
/// peak bytes and the run's seconds.
fn timed_baseline(
    model: &Model,
    prompts: &[Vec<u32>],
    sampling: [&SamplingParams; 2],
    batch: usize,
    threads: i32,
) -> anyhow::Result<(u64, usize, f64)> {
    let all = tch::get_num_threads();
    tch::set_num_threads(threads);
    let run = || -> anyhow::Result<(u64, usize, f64)> {
        baseline(model, &prompts[..1], sampling[0], batch).context("baseline warm-up")?;
        let t = Instant::now();
        let (tokens, kv) = baseline(model, prompts, sampling[1], batch).context("baseline")?;
        Ok((tokens, kv, t.elapsed().as_secs_f64()))
    };
    let out = run();
    tch::set_num_threads(all);
    out
}

/// Static batches of `batch` sequences (each sample a row of its own, with
/// its own prefill), left-padded, decoded with the contiguous cache until
/// every row has stopped. Returns the real tokens generated and the peak
/// bytes of the contiguous cache.
fn baseline(
    model: &Model,
    prompts: &[Vec<u32>],
    p: &SamplingParams,
    batch: usize,
) -> anyhow::Result<(u64, usize)> {
    let cfg = model.config();
    let per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4;
    let rows: Vec<(usize, usize)> = (0..prompts.len())
        .flat_map(|i| (0..p.n).map(move |s| (i, s)))
        .collect();
    let (mut tokens, mut peak) = (0u64, 0usize);
    let _no_grad = tch::no_grad_guard();
    for chunk in rows.chunks(batch) {
        let b = chunk.len();
        let width = chunk
            .iter()
            .map(|&(i, _)| prompts[i].len())
            .max()
            .unwrap_or(0);
        let mut ids = vec![0i64; b * width];
        let mut mask = vec![0i64; b * width];
        for (r, &(i, _)) in chunk.iter().enumerate() {
            let off = width - prompts[i].len();
            for (dst, &t) in ids[r * width + off..(r + 1) * width]
                .iter_mut()
                .zip(&prompts[i])
            {
                *dst = t as i64;
            }
            mask[r * width + off..(r + 1) * width].fill(1);
        }
        let mut cache = model.new_cache();
        let shape = |cols: usize| [b as i64, cols as i64];
        let dev = model.device();
        let mut input = Tensor::from_slice(&ids).view(shape(width)).to_device(dev);
        let mut done = vec![false; b];
        for step in 0..p.max_new_tokens {
            let len = mask.len() / b;
            let m = Tensor::from_slice(&mask).view(shape(len)).to_device(dev);
            let logits = model.forward_with_cache(&input, &mut cache, Some(&m))?;
            let s = logits.size()[1];
            let last = logits.narrow(1, s - 1, 1).squeeze_dim(1); // (b, vocab)
            let draws: Vec<sampling::Draw<'_>> = chunk
                .iter()
                .map(|&(_, sample)| sampling::Draw {
                    params: p,
                    u: sampling::uniform(p.seed, sample, step),
                })
                .collect();
            let picked = sampling::sample(&last, &draws)?;
            let mut next = vec![0i64; b];
            for (r, &(tok, _)) in picked.iter().enumerate() {
                if done[r] {
                    continue;
                }
                next[r] = tok as i64;
                tokens += 1;
                done[r] = p.stop_token_ids.contains(&tok);
            }
            peak = peak.max(b * (len) * per_token);
            if done.iter().all(|&d| d) {
                break;
            }
            // Finished rows keep running (a static batch), fed padding.
            let mut grown = Vec::with_capacity(b * (len + 1));
            for r in 0..b {
                grown.extend_from_slice(&mask[r * len..(r + 1) * len]);
                grown.push(1);
            }
            mask = grown;
            input = Tensor::from_slice(&next).view(shape(1)).to_device(dev);
        }
    }
    Ok((tokens, peak))
}
