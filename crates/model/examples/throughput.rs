//! Rough training-step throughput of a ~12M-parameter model on the CPU,
//! against a plain float32 matrix product measured in the same run.
//!
//! `cargo run --release -p colo-model --example throughput` (the real
//! benchmark is `colo bench train`; this is a quick look while working on
//! the model).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use colo_model::{loss, Arch, Model, ModelConfig, Weights};

fn main() -> colo_model::Result<()> {
    let cfg = ModelConfig {
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
        max_position_embeddings: 1024,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        bos_token_id: None,
        eos_token_ids: vec![],
        pad_token_id: None,
    };
    let dev = Device::Cpu;
    let model = Model::load_trainable(&cfg, &Weights::random(&cfg, 0.02, DType::F32, &dev)?)?;
    let (batch, seq) = (4, 256);
    let ids =
        Tensor::rand(0f32, cfg.vocab_size as f32, (batch, seq), &dev)?.to_dtype(DType::U32)?;
    let n = cfg.num_parameters() as f64;
    let tokens = (batch * seq) as f64;

    let step = || -> colo_model::Result<()> {
        let logits = model.forward(&ids)?;
        let l = loss::next_token_cross_entropy(&logits, &ids)?;
        l.backward()?;
        Ok(())
    };
    step()?;
    let reps = 3;
    let t = Instant::now();
    for _ in 0..reps {
        step()?;
    }
    let step_s = t.elapsed().as_secs_f64() / reps as f64;
    let fwd = Instant::now();
    for _ in 0..reps {
        model.forward(&ids)?;
    }
    let fwd_s = fwd.elapsed().as_secs_f64() / reps as f64;

    // A product the size of the MLP's up projection over the whole batch.
    let a = Tensor::randn(0f32, 1.0, (batch * seq, cfg.hidden_size), &dev)?;
    let b = Tensor::randn(0f32, 1.0, (cfg.hidden_size, cfg.intermediate_size), &dev)?;
    a.matmul(&b)?;
    let mm_reps = 20;
    let t = Instant::now();
    for _ in 0..mm_reps {
        a.matmul(&b)?;
    }
    let mm_s = t.elapsed().as_secs_f64() / mm_reps as f64;
    let mm_flops = 2.0 * (batch * seq * cfg.hidden_size * cfg.intermediate_size) as f64;

    let model_gflops = 6.0 * n * tokens / step_s / 1e9;
    let mm_gflops = mm_flops / mm_s / 1e9;
    println!("params {:.1}M, tokens/step {tokens}", n / 1e6);
    println!(
        "forward {:.1} ms, forward+backward {:.1} ms",
        fwd_s * 1e3,
        step_s * 1e3
    );
    println!(
        "model {model_gflops:.1} GFLOP/s, matmul {mm_gflops:.1} GFLOP/s, ratio {:.2}",
        model_gflops / mm_gflops
    );
    Ok(())
}
