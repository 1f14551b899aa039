//! Fixture helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use colo_model::{Model, ModelConfig, Weights};
use tch::{Device, Kind, Tensor};

/// Both fixture checkpoints: Qwen2 (tied, q/k/v bias) and Llama (untied,
/// explicit head_dim).
pub const MODELS: [&str; 4] = ["tiny-qwen2", "tiny-llama", "tiny-llama3", "tiny-qwen3"];

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

/// All tensors of a safetensors file, by name (tch's reader, independent
/// of the crate's own).
pub fn read_tensors(path: &std::path::Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

/// What transformers/PyTorch computed for a fixture.
pub struct Reference {
    /// (3, 10), int64.
    pub input_ids: Tensor,
    /// (3, 10, vocab), float32.
    pub logits: Tensor,
    /// Parameter name → gradient of the mean next-token loss.
    pub grads: HashMap<String, Tensor>,
    pub loss: f64,
    /// Per prompt: prompt ids followed by 16 greedy tokens.
    pub greedy: Vec<Vec<u32>>,
}

pub fn reference(name: &str) -> Reference {
    let dir = fixture_dir(name);
    let mut t = read_tensors(&dir.join("reference.safetensors"));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let grads = t
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("grad.")
                .map(|n| (n.to_owned(), v.shallow_clone()))
        })
        .collect();
    Reference {
        input_ids: t.remove("input_ids").unwrap(),
        logits: t.remove("logits").unwrap(),
        grads,
        loss: json["loss"].as_f64().unwrap(),
        greedy: serde_json::from_value(json["greedy"].clone()).unwrap(),
    }
}

pub fn load_as(name: &str, kind: Kind) -> Model {
    Model::from_dir(&fixture_dir(name), kind, Device::Cpu).unwrap()
}

pub fn load(name: &str) -> Model {
    load_as(name, Kind::Float)
}

pub fn load_trainable_as(name: &str, kind: Kind) -> Model {
    let dir = fixture_dir(name);
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    Model::load_trainable(&cfg, &Weights::from_dir(&dir, kind, Device::Cpu).unwrap()).unwrap()
}

pub fn load_trainable(name: &str) -> Model {
    load_trainable_as(name, Kind::Float)
}

/// max |a - b|, compared in float32 (shapes must match).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.size(), b.size());
    let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float))
        .abs()
        .max();
    f32::try_from(d).unwrap()
}

/// The Euclidean norm, in float64.
pub fn norm(t: &Tensor) -> f64 {
    f64::try_from(t.to_kind(Kind::Double).square().sum(None).sqrt()).unwrap()
}

/// One row of token ids as a (1, len) int64 tensor.
pub fn ids_tensor(ids: &[u32]) -> Tensor {
    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    Tensor::from_slice(&ids).unsqueeze(0)
}

/// Index of the largest value of a 1-D tensor (first on ties, as torch).
pub fn argmax(row: &Tensor) -> u32 {
    let v: Vec<f32> = Vec::try_from(&row.to_kind(Kind::Float)).unwrap();
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
