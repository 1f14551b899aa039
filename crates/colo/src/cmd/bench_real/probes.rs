//! What `colo bench real` measures in its own process beside the run, for
//! [`super::yardsticks`]: a matrix product, copies, and the rollout
//! engine's decode steps.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use colo_rl::config::Device;
use colo_rl::Config;
use colo_rollout::{Engine, Request, SamplingParams};
use tch::{Kind, Tensor};

use super::yardsticks::{Copy, DecodeRun, Matmul};
use crate::cmd::bench::sync;

const GIB: f64 = (1u64 << 30) as f64;

/// Timings of the matrix product; the best counts.
const TIMINGS: usize = 5;
/// Products in each timing.
const PRODUCTS: usize = 10;

/// FLOP/s of `[m × k] @ [k × n]` in `kind` on `device`: on the CPU its
/// rows split over `lanes` lanes of one libtorch thread (as the run's
/// training passes split a micro-batch's rows, `colo_model::lanes`); on
/// CUDA one product. Random operands; one timing's worth of products
/// first, untimed (oneDNN's and cuBLAS's first use of a shape); then the
/// best of [`TIMINGS`] timings of [`PRODUCTS`] products each.
pub(super) fn matmul(
    (m, k, n): (usize, usize, usize),
    kind: Kind,
    device: Device,
    lanes: usize,
) -> Result<Matmul> {
    ensure!(m > 0 && k > 0 && n > 0, "matmul [{m} x {k}] @ [{k} x {n}]");
    let dev = device.torch();
    let _no_grad = tch::no_grad_guard();
    let parts = colo_model::lanes::split(0, m, lanes);
    let a = Tensor::f_randn([m as i64, k as i64], (kind, dev))?;
    let b = Tensor::f_randn([k as i64, n as i64], (kind, dev))?;
    let timing = || -> Result<f64> {
        sync(dev);
        let t = Instant::now();
        for _ in 0..PRODUCTS {
            let work: Vec<_> = parts
                .iter()
                .map(|&(start, len)| {
                    let (a, b) = (a.shallow_clone(), b.shallow_clone());
                    move || -> Result<Tensor> {
                        Ok(a.f_narrow(0, start as i64, len as i64)?.f_matmul(&b)?)
                    }
                })
                .collect();
            for out in colo_model::lanes::run(work) {
                drop(out?);
            }
        }
        sync(dev);
        Ok(t.elapsed().as_secs_f64())
    };
    timing()?;
    let mut best = f64::INFINITY;
    for _ in 0..TIMINGS {
        best = best.min(timing()?);
    }
    let flops = 2.0 * (m * k * n) as f64 * PRODUCTS as f64;
    Ok(Matmul {
        m,
        k,
        n,
        dtype: kind_name(kind),
        lanes: parts.len(),
        products: PRODUCTS,
        timings: TIMINGS,
        flop_s: flops / best,
    })
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bf16",
        Kind::Half => "f16",
        _ => "f32",
    }
}

/// A copy of `bytes` split over `threads` threads (each its own contiguous
/// part), pages present, best of 3: what the machine copies when more than
/// one core copies. `None` for fewer than two threads.
pub(super) fn threaded_copy(bytes: u64, threads: usize) -> Option<Copy> {
    if threads < 2 {
        return None;
    }
    let n = (bytes as usize).max(threads);
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let mut dst = vec![1u8; n];
    let chunk = n.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        });
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Some(Copy {
        what: format!("{threads}-thread copy"),
        bytes: n as u64,
        gib_s: n as f64 / GIB / best,
    })
}

/// A device-to-device copy of `bytes` on `device` (libtorch's `copy_`
/// between two buffers already allocated), best of 3 after one untimed.
pub(super) fn device_copy(bytes: u64, device: Device) -> Result<Copy> {
    let dev = device.torch();
    let n = bytes.max(1) as i64;
    let src = Tensor::f_ones([n], (Kind::Uint8, dev))?;
    let mut dst = Tensor::f_zeros([n], (Kind::Uint8, dev))?;
    let mut best = f64::INFINITY;
    for i in 0..4 {
        sync(dev);
        let t = Instant::now();
        dst.f_copy_(&src)?;
        sync(dev);
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    Ok(Copy {
        what: "device-to-device copy".into(),
        bytes: n as u64,
        gib_s: n as f64 / GIB / best,
    })
}

/// The rollout engine on the model, as the run builds it
/// (`colo_rl::step::engine_config`, the run's dtype and device, on a
/// pool of its own; on CUDA the decode step's graphs captured for the
/// rows first, as the run's worker captures them): after one untimed
/// request of four tokens, `rows` sequences (the job's samples of a step,
/// `rollout.n` to a prompt) with synthetic prompts of `prompt_tokens`
/// ids are generated to `rollout.max_new_tokens` with no stop token,
/// one `Engine::step` at a time. The steps timed are those that only
/// decoded (no prefill) with every row running; each is the whole step:
/// the forward, the sampling, the scheduler's work.
pub(super) fn decode(config: &Config, model: &Path, prompt_tokens: usize) -> Result<DecodeRun> {
    let device = config.trainer.device;
    let (pool, dev) = crate::cmd::bench::pool_on(device)?;
    let kind = config.trainer.dtype.kind(device);
    let ecfg = colo_rl::step::engine_config(config);
    let mut engine = Engine::from_dir_on(model, kind, dev, pool, &ecfg)
        .with_context(|| format!("the rollout engine on {}", model.display()))?;
    let vocab = colo_model::ModelConfig::from_file(&model.join("config.json"))?.vocab_size;
    let n = config.rollout.n.max(1);
    let prompts = (config
        .batch
        .samples_per_step
        .min(config.rollout.max_num_seqs)
        / n)
        .max(1);
    let rows = prompts * n;
    let max_new = config.rollout.max_new_tokens;
    let prompt_tokens = prompt_tokens.max(1);
    let prompt = |i: usize| -> Vec<u32> {
        (0..prompt_tokens)
            .map(|j| ((i * 7919 + j * 104_729) % vocab) as u32)
            .collect()
    };
    let params = SamplingParams {
        n,
        max_new_tokens: max_new,
        temperature: 1.0,
        stop_token_ids: Vec::new(),
        seed: config.trainer.seed,
        ..SamplingParams::default()
    };
    let warm = SamplingParams {
        n: 1,
        max_new_tokens: 4,
        ..params.clone()
    };
    for r in engine.generate(vec![Request::new(prompt(0), warm)])? {
        r.map_err(|e| anyhow::anyhow!("the decode's warm-up: {e}"))?;
    }
    let cuda_graphs = engine.capture_cuda_graphs(rows, prompt_tokens + max_new)?;
    engine.reset_stats();
    for i in 0..prompts {
        engine.add_request(Request::new(prompt(i + 1), params.clone()))?;
    }
    let mut times = Vec::new();
    while engine.in_flight() > 0 {
        let before = engine.stats();
        sync(dev);
        let t = Instant::now();
        engine.step()?;
        sync(dev);
        let seconds = t.elapsed().as_secs_f64();
        let after = engine.stats();
        let decoded_only =
            after.prefills == before.prefills && after.decode_steps == before.decode_steps + 1;
        if decoded_only && after.generated_tokens - before.generated_tokens == rows as u64 {
            times.push(seconds);
        }
    }
    ensure!(
        !times.is_empty(),
        "the decode: no step decoded all {rows} rows alone ({max_new} new tokens a row)"
    );
    Ok(DecodeRun {
        rows,
        prompt_tokens,
        steps: times.len(),
        step_s: times.iter().sum::<f64>() / times.len() as f64,
        step_min_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        cuda_graphs,
        preemptions: engine.stats().preemptions,
    })
}
