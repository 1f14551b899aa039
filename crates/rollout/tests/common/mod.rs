//! Fixtures and references shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use colo_mem::{Pool, PoolConfig};
use colo_model::{loss, Model};
use colo_rollout::{Completion, Engine, EngineConfig, Request, RequestOutput, SamplingParams};
use tch::{Kind, Tensor};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

pub fn pool() -> Arc<Pool> {
    Pool::host(PoolConfig::default()).unwrap()
}

/// An engine over a fixture with a KV pool of `kv_tokens` and blocks of
/// `block_size`.
pub fn engine(name: &str, kv_tokens: usize, block_size: usize) -> Engine {
    let cfg = EngineConfig {
        block_size,
        ..EngineConfig::with_kv_tokens(kv_tokens)
    };
    Engine::from_dir(&fixture(name), pool(), &cfg).unwrap()
}

/// `(prompt, 16 greedy tokens from transformers)` for each fixture prompt.
pub fn greedy_reference(name: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let ids: Vec<u32> = serde_json::from_value(row.clone()).unwrap();
            let split = ids.len() - 16;
            (ids[..split].to_vec(), ids[split..].to_vec())
        })
        .collect()
}

/// Token ids as a (1, len) tensor on the model's device.
pub fn input(model: &Model, ids: &[u32]) -> Tensor {
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    Tensor::from_slice(&ids)
        .unsqueeze(0)
        .to_device(model.device())
}

/// Greedy decoding that reruns the whole sequence every step.
pub fn naive_greedy(model: &Model, prompt: &[u32], new_tokens: usize) -> Vec<u32> {
    let mut ids = prompt.to_vec();
    for _ in 0..new_tokens {
        let logits = model.forward(&input(model, &ids)).unwrap(); // (1, seq, vocab)
        let last = logits.get(0).get(ids.len() as i64 - 1);
        ids.push(last.argmax(-1, false).int64_value(&[]) as u32);
    }
    ids[prompt.len()..].to_vec()
}

/// Teacher-forced log-probabilities of `completion` after `prompt` at
/// `temperature`, as a trainer computes them with colo-model.
pub fn teacher_forced(
    model: &Model,
    prompt: &[u32],
    completion: &[u32],
    temperature: f64,
) -> Vec<f32> {
    let ids: Vec<u32> = prompt.iter().chain(completion).copied().collect();
    let input = input(model, &ids);
    let logits = model.forward(&input).unwrap().to_kind(Kind::Float) / temperature;
    let lp = loss::next_token_logprobs(&logits, &input).unwrap();
    let lp = Vec::<f32>::try_from(&lp.get(0).to_device(tch::Device::Cpu)).unwrap();
    lp[prompt.len() - 1..].to_vec()
}

pub fn sampled(n: usize, max_new_tokens: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        n,
        max_new_tokens,
        temperature: 1.0,
        seed,
        ..SamplingParams::default()
    }
}

/// Unwraps every request's output.
pub fn ok(out: Vec<colo_rollout::Result<RequestOutput>>) -> Vec<Vec<Completion>> {
    out.into_iter().map(|r| r.unwrap().completions).collect()
}

/// Tokens equal, log-probabilities within `tol`.
pub fn assert_same(a: &[Vec<Completion>], b: &[Vec<Completion>], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (ra, rb) in a.iter().zip(b) {
        assert_eq!(ra.len(), rb.len());
        for (ca, cb) in ra.iter().zip(rb) {
            assert_eq!(ca.tokens, cb.tokens);
            assert_eq!(ca.finish_reason, cb.finish_reason);
            for (x, y) in ca.logprobs.iter().zip(&cb.logprobs) {
                assert!((x - y).abs() <= tol, "logprob {x} vs {y}");
            }
        }
    }
}

pub fn requests(prompts: &[Vec<u32>], params: &SamplingParams) -> Vec<Request> {
    prompts
        .iter()
        .map(|p| Request::new(p.clone(), params.clone()))
        .collect()
}
