//! `colo bench train`: training-step throughput of colo's engine against a
//! plain matrix product of the same dtype measured in the same run, in
//! float32 and bfloat16.
//!
//! A randomly initialised Qwen2-shaped model (~12.6 M parameters at the
//! defaults; `--hidden` and `--layers` make it larger) trains on
//! batches of token sequences of length 256 with
//! [`colo_train::ColoTrainer::sft_step`]: a full optimizer step — forward,
//! next-token loss on every token, backward, accumulation into the
//! `train_grads` tag, clipping and AdamW — with activations in the
//! `activations` tag of a host pool.
//!
//! Per dtype:
//! - `model_gflop_s` = 6 × parameters × tokens / step time (the usual
//!   forward + backward estimate, attention's own FLOPs not counted);
//! - `matmul_gflop_s`: a product of the size of the MLP's up projection over
//!   the whole batch, (batch·seq, hidden) × (hidden, intermediate), in the
//!   same dtype on the same threads, sampled between the training steps;
//! - `ratio` = model / matmul (target ≥ 0.6 in float32): how much of the
//!   machine's matrix-product speed the whole training step keeps.
//!
//! And `bf16_speedup` = f32 step time / bf16 step time (target ≥ 2): bf16 on
//! the CPU runs oneDNN's bf16 kernels (AMX or AVX-512 BF16).
//!
//! The dtypes' steps are interleaved (one of each in turn, each trainer in
//! its own pool), so that both see the same machine.
//!
//! `--device cuda` runs the same on the GPU, with the pool on colo-mem's CUDA
//! backend and the timers read after the device has finished its queued
//! kernels. The default batch (1,024 tokens) leaves a GPU launch-bound: a
//! GPU's figures are read at a larger `--batch`.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use colo_mem::tags;
use colo_model::{Arch, ModelConfig, Weights};
use colo_train::{
    ColoTrainer, MicroBatchConfig, OptimConfig, SeqBatch, TrainEngine, TrainerConfig,
};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

#[derive(clap::Args)]
pub struct Args {
    /// Sequences per optimizer step.
    #[arg(long, default_value_t = 4, value_parser = super::bench::count::<1, 65536>)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256, value_parser = super::bench::count::<1, 1048576>)]
    seq: usize,
    /// Rows per micro-batch (gradients accumulate over the step).
    #[arg(long, default_value_t = 4, value_parser = super::bench::count::<1, 65536>)]
    micro_batch: usize,
    /// Timed optimizer steps per dtype (after one warm-up step).
    #[arg(long, default_value_t = 5, value_parser = super::bench::count::<1, 1048576>)]
    steps: usize,
    /// Hidden size of the model (a multiple of 64: heads of 64 dims).
    #[arg(long, default_value_t = 384, value_parser = super::bench::count::<1, 65536>)]
    hidden: usize,
    /// Decoder layers of the model.
    #[arg(long, default_value_t = 6, value_parser = super::bench::count::<1, 1024>)]
    layers: usize,
    /// Dtypes to measure, comma separated (f32, bf16).
    #[arg(long, value_delimiter = ',', default_values_t = ["f32".to_string(), "bf16".to_string()])]
    dtype: Vec<String>,
    /// Where to train: `cpu`, or `cuda` (a build with the `cuda` feature,
    /// on a machine with an NVIDIA GPU).
    #[arg(long, default_value = "cpu", value_parser = super::bench::parse_device)]
    device: colo_rl::config::Device,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    device: colo_rl::config::Device,
    parameters: usize,
    batch: usize,
    seq: usize,
    micro_batch: usize,
    tokens_per_step: usize,
    runs: Vec<DtypeRun>,
    /// f32 step time / bf16 step time (target ≥ 2), when both ran.
    bf16_speedup: Option<f64>,
    /// The threads both sides use on the CPU (the trainer's lanes; the
    /// baseline's intra-op threads), and the 1-minute load average at the
    /// end (a shared machine's other work shows here).
    threads: i32,
    load_avg_1m: Option<f64>,
}

#[derive(Serialize)]
struct DtypeRun {
    dtype: String,
    /// Median seconds of one optimizer step.
    step_s: f64,
    tokens_per_s: f64,
    model_gflop_s: f64,
    matmul_gflop_s: f64,
    /// model_gflop_s / matmul_gflop_s (target ≥ 0.6 in f32).
    ratio: f64,
    /// The loss fell over the timed steps (the engine really trains).
    loss_first: f64,
    loss_last: f64,
    /// Device bytes per tag after the run and the peak of all tags.
    train_params_bytes: u64,
    train_grads_bytes: u64,
    optimizer_bytes: u64,
    activations_cached_bytes: u64,
    peak_resident_bytes: u64,
}

/// Positions of the benchmark model (and so the longest `--seq`).
const MAX_SEQ: usize = 4096;

/// The benchmark model: Qwen2-shaped, tied embeddings; at the defaults
/// (hidden 384, 6 layers) ~12.6 M parameters. Heads of 64 dims; KV heads
/// the largest divisor of the heads up to a third of them (at least one);
/// an MLP of 8/3 the hidden size rounded up to 64 (Llama's ratio).
fn model_config(hidden: usize, layers: usize) -> ModelConfig {
    let heads = hidden / 64;
    let kv_heads = (1..=(heads / 3).max(1))
        .rev()
        .find(|k| heads.is_multiple_of(*k))
        .unwrap_or(1);
    ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: 8192,
        hidden_size: hidden,
        intermediate_size: (hidden * 8 / 3).div_ceil(64) * 64,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 1e4,
        rope_llama3: None,
        max_position_embeddings: MAX_SEQ,
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
    let (b, s) = (b as i64, s as i64);
    let opts = (Kind::Float, Device::Cpu);
    // The fallible calls: a batch too large for the machine is an error.
    let ids = Tensor::f_randint(cfg.vocab_size as i64, [b, s], (Kind::Int64, Device::Cpu))?;
    let attn = Tensor::f_ones([b, s], opts)?;
    let resp = Tensor::f_cat(
        &[
            Tensor::f_zeros([b, 1], opts)?,
            Tensor::f_ones([b, s - 1], opts)?,
        ],
        1,
    )?;
    Ok(SeqBatch::new(&ids, &attn, &resp)?)
}

/// Seconds of one (m, k) × (k, n) product in `kind`, a few times: the
/// baseline is sampled between training steps so that both see the same
/// machine (other processes come and go on a shared one).
struct Matmul {
    a: Tensor,
    b: Tensor,
    flop: f64,
    times: Vec<f64>,
    threads: i32,
    device: Device,
}

impl Matmul {
    /// Fails (out of memory, say) as an error, not a panic.
    fn new(m: usize, k: usize, n: usize, kind: Kind, device: Device) -> Result<Self> {
        let a = Tensor::f_randn([m as i64, k as i64], (kind, device))?;
        let b = Tensor::f_randn([k as i64, n as i64], (kind, device))?;
        let _ = a.f_matmul(&b)?;
        Ok(Matmul {
            a,
            b,
            flop: 2.0 * (m * k * n) as f64,
            times: vec![],
            threads: baseline_threads(),
            device,
        })
    }

    /// The baseline at libtorch's default thread count (all cores, its
    /// best); the trainer's passes run in lanes of one intra-op thread,
    /// which sets libtorch's count to 1 (see `colo_model::lanes`).
    fn sample(&mut self, reps: usize) {
        tch::set_num_threads(self.threads);
        super::bench::sync(self.device);
        for _ in 0..reps {
            let t = Instant::now();
            let c = self.a.matmul(&self.b);
            super::bench::sync(self.device);
            std::hint::black_box(&c);
            self.times.push(t.elapsed().as_secs_f64());
        }
        tch::set_num_threads(1);
    }

    fn gflop_s(&self) -> f64 {
        self.flop / median(self.times.clone()) / 1e9
    }
}

/// libtorch's default intra-op thread count: `OMP_NUM_THREADS`, else the
/// cores.
fn baseline_threads() -> i32 {
    colo_model::lanes::count(Device::Cpu, 0).min(i32::MAX as usize) as i32
}

fn parse_dtype(s: &str) -> Result<Kind> {
    match s {
        "f32" | "float32" => Ok(Kind::Float),
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        other => anyhow::bail!("--dtype: `{other}` is not one of f32, bf16"),
    }
}

/// One dtype's measurement: its own pool, trainer, batch and matmul
/// baseline. [`run`] interleaves the dtypes' steps, so that a machine whose
/// speed drifts (other processes come and go on a shared one) weighs on
/// every dtype alike, and the speed-up compares steps taken side by side.
struct Measure {
    name: String,
    pool: std::sync::Arc<colo_mem::Pool>,
    device: Device,
    engine: ColoTrainer,
    data: SeqBatch,
    mm: Matmul,
    times: Vec<f64>,
    losses: Vec<f64>,
    tokens: usize,
}

impl Measure {
    /// A fresh pool and trainer, and one warm-up step.
    fn new(a: &Args, cfg: &ModelConfig, name: &str, kind: Kind) -> Result<Self> {
        let (pool, device) = super::bench::pool_on(a.device)?;
        tch::manual_seed(0);
        let weights = Weights::random(cfg, 0.02, kind, device)?;
        let trainer_cfg = TrainerConfig {
            optim: OptimConfig {
                lr: 1e-3,
                ..Default::default()
            },
            micro_batch: MicroBatchConfig {
                micro_batch_size: a.micro_batch,
                ..Default::default()
            },
            kind,
            device,
            ..Default::default()
        };
        let mut engine = ColoTrainer::new(pool.clone(), cfg, &weights, &trainer_cfg)?;
        drop(weights);
        let data = batch(cfg, a.batch, a.seq)?;
        let tokens = a.batch * a.seq;
        let mm = Matmul::new(tokens, cfg.hidden_size, cfg.intermediate_size, kind, device)
            .with_context(|| {
                format!(
                    "the baseline's ({tokens} × {}) · ({0} × {}) {name} product",
                    cfg.hidden_size, cfg.intermediate_size
                )
            })?;
        // Warm-up: first-touch pages, oneDNN primitives; on CUDA, the
        // caching allocator's segments and cuBLAS's algorithm choices.
        engine.sft_step(&data)?;
        Ok(Measure {
            name: name.to_string(),
            pool,
            device,
            engine,
            data,
            mm,
            times: vec![],
            losses: vec![],
            tokens,
        })
    }

    /// One timed optimizer step, after a few baseline samples.
    fn step(&mut self) -> Result<()> {
        self.mm.sample(4);
        let t = Instant::now();
        let m = self.engine.sft_step(&self.data)?;
        super::bench::sync(self.device);
        self.times.push(t.elapsed().as_secs_f64());
        self.losses.push(m.loss);
        Ok(())
    }

    fn finish(mut self) -> (DtypeRun, usize) {
        self.mm.sample(4);
        let step_s = median(self.times);
        let params = self.engine.num_parameters();
        let model = 6.0 * params as f64 * self.tokens as f64 / step_s / 1e9;
        let matmul = self.mm.gflop_s();
        let stats = self.pool.stats();
        let resident = |tag: &str| stats.tag(tag).map_or(0, |t| t.resident_bytes);
        let run = DtypeRun {
            dtype: self.name,
            step_s,
            tokens_per_s: self.tokens as f64 / step_s,
            model_gflop_s: model,
            matmul_gflop_s: matmul,
            ratio: model / matmul,
            loss_first: self.losses[0],
            loss_last: self.losses[self.losses.len() - 1],
            train_params_bytes: resident(tags::TRAIN_PARAMS),
            train_grads_bytes: resident(tags::TRAIN_GRADS),
            optimizer_bytes: resident(tags::OPTIMIZER),
            activations_cached_bytes: resident(tags::ACTIVATIONS),
            peak_resident_bytes: stats.peak_resident_bytes,
        };
        (run, params)
    }
}

pub fn run(a: Args) -> Result<()> {
    check_args(&a)?;
    let cfg = model_config(a.hidden, a.layers);
    let kinds = a
        .dtype
        .iter()
        .map(|d| Ok((d.clone(), parse_dtype(d)?)))
        .collect::<Result<Vec<_>>>()?;
    for (i, (name, kind)) in kinds.iter().enumerate() {
        if let Some((again, _)) = kinds[..i].iter().find(|(_, k)| k == kind) {
            anyhow::bail!("--dtype: `{again}` and `{name}` are the same dtype; name each once");
        }
    }
    let context = |name: &str| {
        format!(
            "colo bench train: the {name} run (--hidden {} --layers {}, --batch {} × --seq {} \
             = {} tokens a step)",
            a.hidden,
            a.layers,
            a.batch,
            a.seq,
            a.batch * a.seq
        )
    };
    let mut measures = kinds
        .iter()
        .map(|(name, kind)| Measure::new(&a, &cfg, name, *kind).with_context(|| context(name)))
        .collect::<Result<Vec<_>>>()?;
    for _ in 0..a.steps {
        for m in &mut measures {
            m.step().with_context(|| context(&m.name))?;
        }
    }
    let (runs, params): (Vec<_>, Vec<_>) = measures.into_iter().map(Measure::finish).unzip();
    let params = params.last().copied().unwrap_or(0);
    let step = |d: &str| runs.iter().find(|r| r.dtype == d).map(|r| r.step_s);
    let r = Report {
        device: a.device,
        parameters: params,
        batch: a.batch,
        seq: a.seq,
        micro_batch: a.micro_batch,
        tokens_per_step: a.batch * a.seq,
        bf16_speedup: step("f32").zip(step("bf16")).map(|(f, b)| f / b),
        runs,
        threads: baseline_threads(),
        load_avg_1m: crate::cmd::load_avg_1m(),
    };
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    print_table(&a, &r);
    Ok(())
}

/// The flags the benchmark's model and batch can be built from.
fn check_args(a: &Args) -> Result<()> {
    ensure!(
        a.seq >= 2,
        "--seq {}: at least 2 tokens (the loss predicts each token after the first)",
        a.seq
    );
    ensure!(
        a.seq <= MAX_SEQ,
        "--seq {}: the benchmark model has {MAX_SEQ} positions",
        a.seq
    );
    ensure!(
        a.micro_batch <= a.batch,
        "--micro-batch {} is more rows than --batch {} has",
        a.micro_batch,
        a.batch
    );
    ensure!(
        a.hidden >= 64 && a.hidden.is_multiple_of(64) && a.layers > 0,
        "--hidden must be a positive multiple of 64 (heads of 64 dims) and --layers positive, \
         got {} and {}",
        a.hidden,
        a.layers
    );
    Ok(())
}

/// The report as a table: per dtype the step, the FLOP/s against a
/// matmul's, the memory by tag; bf16's speed-up over f32.
fn print_table(a: &Args, r: &Report) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let threads = match a.device {
        colo_rl::config::Device::Cpu => format!("{} threads", r.threads),
        colo_rl::config::Device::Cuda => "on CUDA".to_string(),
    };
    println!(
        "model          {:.1} M parameters, {} × {} tokens per step (micro-batch {}), {threads}, load {:.2}",
        r.parameters as f64 / 1e6,
        a.batch,
        a.seq,
        a.micro_batch,
        r.load_avg_1m.unwrap_or(f64::NAN)
    );
    for x in &r.runs {
        println!(
            "{:<5} step {:.1} ms  {:.0} tokens/s  model {:.1} GFLOP/s  matmul {:.1} GFLOP/s  ratio {:.2}{}  loss {:.3} → {:.3}",
            x.dtype,
            x.step_s * 1e3,
            x.tokens_per_s,
            x.model_gflop_s,
            x.matmul_gflop_s,
            x.ratio,
            if x.dtype == "f32" { " (target ≥ 0.6)" } else { "" },
            x.loss_first,
            x.loss_last
        );
        println!(
            "      memory (MiB) params {:.1}  grads {:.1}  optimizer {:.1}  activations cache {:.1}  peak {:.1}",
            mib(x.train_params_bytes),
            mib(x.train_grads_bytes),
            mib(x.optimizer_bytes),
            mib(x.activations_cached_bytes),
            mib(x.peak_resident_bytes)
        );
    }
    if let Some(s) = r.bf16_speedup {
        println!("bf16 speed-up  {s:.2}× over f32 (target ≥ 2)");
        if colo_rl::config::Dtype::Auto.resolve(a.device) != colo_rl::config::Dtype::Bf16 {
            println!(
                "               this CPU has no bf16 matrix instructions (avx512_bf16, amx_bf16): \
                 its bf16 figures are libtorch's emulation, and runs choose f32 (dtype \"auto\")"
            );
        }
    }
}
