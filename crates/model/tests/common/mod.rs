//! Fixture helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use colo_model::{Model, ModelConfig, Weights};

/// Both fixture checkpoints: Qwen2 (tied, q/k/v bias) and Llama (untied,
/// explicit head_dim).
pub const MODELS: [&str; 2] = ["tiny-qwen2", "tiny-llama"];

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// A scratch directory unique to this process and test.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("colo-model-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// What transformers/PyTorch computed for a fixture.
pub struct Reference {
    /// (3, 10), u32.
    pub input_ids: Tensor,
    /// (3, 10, vocab).
    pub logits: Tensor,
    /// Parameter name → gradient of the mean next-token loss.
    pub grads: HashMap<String, Tensor>,
    pub loss: f64,
    /// Per prompt: prompt ids followed by 16 greedy tokens.
    pub greedy: Vec<Vec<u32>>,
}

pub fn reference(name: &str) -> Reference {
    let dir = fixture_dir(name);
    let mut t =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let grads = t
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("grad.").map(|n| (n.to_owned(), v.clone())))
        .collect();
    Reference {
        input_ids: t.remove("input_ids").unwrap().to_dtype(DType::U32).unwrap(),
        logits: t.remove("logits").unwrap(),
        grads,
        loss: json["loss"].as_f64().unwrap(),
        greedy: serde_json::from_value(json["greedy"].clone()).unwrap(),
    }
}

pub fn load(name: &str) -> Model {
    Model::from_dir(&fixture_dir(name), DType::F32, &Device::Cpu).unwrap()
}

pub fn load_trainable(name: &str) -> Model {
    let dir = fixture_dir(name);
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    Model::load_trainable(
        &cfg,
        &Weights::from_dir(&dir, DType::F32, &Device::Cpu).unwrap(),
    )
    .unwrap()
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

pub fn norm(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64)
        .unwrap()
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .sqrt()
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// One row of token ids as a (1, len) tensor.
pub fn ids_tensor(ids: &[u32]) -> Tensor {
    Tensor::new(ids, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap()
}

/// Index of the largest value of a 1-D f32 tensor (first on ties, as torch).
pub fn argmax(row: &Tensor) -> u32 {
    let v = row.to_vec1::<f32>().unwrap();
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
