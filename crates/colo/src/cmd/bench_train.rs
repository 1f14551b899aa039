//! `colo bench train`: training-step throughput of colo's engine against a
//! plain float32 matrix product measured in the same run.
//!
//! A randomly initialised Qwen2-shaped model of ~12.6 M parameters (the
//! issue asks for 10–30 M) trains on batches of token sequences of length
//! 256 with [`colo_train::ColoTrainer::sft_step`]: a full optimizer step —
//! forward, next-token loss on every token, backward, accumulation into the
//! `train_grads` tag, clipping and AdamW — with activations in the
//! `activations` tag of a host pool.
//!
//! - `model_gflop_s` = 6 × parameters × tokens / step time (the usual
//!   forward + backward estimate, attention's own FLOPs not counted);
//! - `matmul_gflop_s`: a float32 product of the size of the MLP's up
//!   projection over the whole batch, (batch·seq, hidden) × (hidden,
//!   intermediate), on the same threads;
//! - `ratio` = model / matmul (target ≥ 0.5): how much of the machine's
//!   matrix-product speed the whole training step keeps.

use std::time::Instant;

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};
use colo_mem::{tags, Pool, PoolConfig};
use colo_model::{Arch, ModelConfig, Weights};
use colo_train::{
    ColoTrainer, MicroBatchConfig, OptimConfig, SeqBatch, TrainEngine, TrainerConfig,
};
use serde::Serialize;

#[derive(clap::Args)]
pub struct Args {
    /// Sequences per optimizer step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    seq: usize,
    /// Rows per micro-batch (gradients accumulate over the step).
    #[arg(long, default_value_t = 4)]
    micro_batch: usize,
    /// Timed optimizer steps (after one warm-up step).
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    parameters: usize,
    batch: usize,
    seq: usize,
    micro_batch: usize,
    tokens_per_step: usize,
    /// Median seconds of one optimizer step.
    step_s: f64,
    tokens_per_s: f64,
    model_gflop_s: f64,
    matmul_gflop_s: f64,
    /// model_gflop_s / matmul_gflop_s (target ≥ 0.5).
    ratio: f64,
    /// The loss fell over the timed steps (the engine really trains).
    loss_first: f64,
    loss_last: f64,
    /// Device bytes per tag after the run (parameters, gradients, optimizer
    /// state) and the peak of all tags together.
    train_params_bytes: u64,
    train_grads_bytes: u64,
    optimizer_bytes: u64,
    activations_cached_bytes: u64,
    peak_resident_bytes: u64,
    /// `CANDLE_NUM_THREADS` (candle's element-wise thread pool; unset: one
    /// thread per core) and the 1-minute load average during the run: on a
    /// shared machine the pool's spinning barriers lose much of a step to
    /// other processes.
    candle_num_threads: Option<String>,
    load_avg_1m: Option<f64>,
}

/// The benchmark model: Qwen2-shaped, tied embeddings, ~12.6 M parameters.
fn model_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: 8192,
        hidden_size: 384,
        intermediate_size: 1024,
        num_layers: 6,
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 1e4,
        max_position_embeddings: 4096,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        pad_token_id: None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A batch of pseudo-random tokens; every token after the first is trained.
fn batch(cfg: &ModelConfig, b: usize, s: usize) -> Result<SeqBatch> {
    let dev = Device::Cpu;
    let ids = Tensor::rand(0f32, cfg.vocab_size as f32, (b, s), &dev)?.to_dtype(DType::U32)?;
    let attn = Tensor::ones((b, s), DType::F32, &dev)?;
    let first = Tensor::zeros((b, 1), DType::F32, &dev)?;
    let resp = Tensor::cat(&[&first, &attn.narrow(1, 1, s - 1)?], 1)?;
    Ok(SeqBatch::new(&ids, &attn, &resp)?)
}

/// Seconds of one (m, k) × (k, n) float32 product, a few times: the
/// baseline is sampled between training steps so that both see the same
/// machine (other processes come and go on a shared one).
struct Matmul {
    a: Tensor,
    b: Tensor,
    flop: f64,
    times: Vec<f64>,
}

impl Matmul {
    fn new(m: usize, k: usize, n: usize) -> Result<Self> {
        let a = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
        let b = Tensor::randn(0f32, 1.0, (k, n), &Device::Cpu)?;
        a.matmul(&b)?;
        Ok(Matmul {
            a,
            b,
            flop: 2.0 * (m * k * n) as f64,
            times: vec![],
        })
    }

    fn sample(&mut self, reps: usize) -> Result<()> {
        for _ in 0..reps {
            let t = Instant::now();
            let c = self.a.matmul(&self.b)?;
            std::hint::black_box(&c);
            self.times.push(t.elapsed().as_secs_f64());
        }
        Ok(())
    }

    fn gflop_s(&self) -> f64 {
        self.flop / median(self.times.clone()) / 1e9
    }
}

pub fn run(a: Args) -> Result<()> {
    ensure!(
        a.batch > 0 && a.seq >= 2 && a.steps > 0,
        "batch, seq ≥ 2 and steps must be positive"
    );
    let cfg = model_config();
    let pool = Pool::host(PoolConfig::default())?;
    let weights = Weights::random(&cfg, 0.02, DType::F32, &Device::Cpu)?;
    let trainer_cfg = TrainerConfig {
        optim: OptimConfig {
            lr: 1e-3,
            ..Default::default()
        },
        micro_batch: MicroBatchConfig {
            micro_batch_size: a.micro_batch,
            score_micro_batch_size: None,
        },
        value_head: None,
    };
    let mut engine = ColoTrainer::new(pool.clone(), &cfg, &weights, &trainer_cfg)?;
    drop(weights);
    let data = batch(&cfg, a.batch, a.seq)?;

    let tokens = a.batch * a.seq;
    let mut mm = Matmul::new(tokens, cfg.hidden_size, cfg.intermediate_size)?;
    engine.sft_step(&data)?; // warm-up: first-touch pages, gemm buffers
    let mut times = vec![];
    let mut losses = vec![];
    for _ in 0..a.steps {
        mm.sample(4)?;
        let t = Instant::now();
        let m = engine.sft_step(&data)?;
        times.push(t.elapsed().as_secs_f64());
        losses.push(m.loss);
    }
    mm.sample(4)?;
    let step_s = median(times);
    let params = engine.num_parameters();
    let model = 6.0 * params as f64 * tokens as f64 / step_s / 1e9;
    let matmul = mm.gflop_s();

    let stats = pool.stats();
    let resident = |tag: &str| stats.tag(tag).map_or(0, |t| t.resident_bytes);
    let r = Report {
        parameters: params,
        batch: a.batch,
        seq: a.seq,
        micro_batch: a.micro_batch,
        tokens_per_step: tokens,
        step_s,
        tokens_per_s: tokens as f64 / step_s,
        model_gflop_s: model,
        matmul_gflop_s: matmul,
        ratio: model / matmul,
        loss_first: losses[0],
        loss_last: losses[losses.len() - 1],
        train_params_bytes: resident(tags::TRAIN_PARAMS),
        train_grads_bytes: resident(tags::TRAIN_GRADS),
        optimizer_bytes: resident(tags::OPTIMIZER),
        activations_cached_bytes: resident(tags::ACTIVATIONS),
        peak_resident_bytes: stats.peak_resident_bytes,
        candle_num_threads: std::env::var("CANDLE_NUM_THREADS").ok(),
        load_avg_1m: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok()),
    };
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        println!(
            "model          {:.1} M parameters, {} × {} tokens per step (micro-batch {})",
            params as f64 / 1e6,
            a.batch,
            a.seq,
            a.micro_batch
        );
        println!(
            "step           {:.1} ms   {:.0} tokens/s",
            step_s * 1e3,
            r.tokens_per_s
        );
        println!("model          {model:.1} GFLOP/s (6·N·tokens / step)");
        println!(
            "matmul         {matmul:.1} GFLOP/s ({tokens}×{} · {}×{})",
            cfg.hidden_size, cfg.hidden_size, cfg.intermediate_size
        );
        println!("ratio          {:.2} (target ≥ 0.5)", r.ratio);
        println!("loss           {:.3} → {:.3}", r.loss_first, r.loss_last);
        println!(
            "memory (MiB)   params {:.1}  grads {:.1}  optimizer {:.1}  activations cache {:.1}  peak {:.1}",
            mib(r.train_params_bytes),
            mib(r.train_grads_bytes),
            mib(r.optimizer_bytes),
            mib(r.activations_cached_bytes),
            mib(r.peak_resident_bytes)
        );
    }
    Ok(())
}
