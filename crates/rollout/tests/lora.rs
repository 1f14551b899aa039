//! LoRA adapters applied at decode (`Engine::add_lora_adapters`) against
//! the same adapters merged into the weights.

mod common;

use std::collections::HashMap;

use colo_model::lora::{a_name, b_name, Adapter, PROJECTIONS};
use colo_model::{Model, ModelConfig, Weights};
use colo_rollout::{DecodeLora, Engine, EngineConfig, Request, SamplingParams};
use common::*;
use tch::{Device, Kind, Tensor};

const ALPHA: f64 = 16.0;

fn config(threads: usize) -> EngineConfig {
    EngineConfig {
        block_size: 4,
        cpu_threads: threads,
        ..EngineConfig::with_kv_tokens(1024)
    }
}

fn load(name: &str) -> (ModelConfig, Weights) {
    let dir = fixture(name);
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    (cfg, w)
}

/// Random adapters of `rank` on the `targets` of `model`, large enough to
/// change the greedy tokens, under PEFT's names; and as colo-model's
/// adapters by projection path.
fn random_adapters(
    model: &Model,
    targets: &[&str],
    rank: i64,
) -> (Vec<(String, Tensor)>, HashMap<String, Adapter>) {
    tch::manual_seed(11);
    let (mut named, mut by_path) = (Vec::new(), HashMap::new());
    for (path, (inp, out)) in model.projection_paths(targets) {
        let a = Tensor::randn([rank, inp], (Kind::Float, Device::Cpu)) * 0.3;
        let b = Tensor::randn([out, rank], (Kind::Float, Device::Cpu)) * 0.3;
        named.push((a_name(&path), a.shallow_clone()));
        named.push((b_name(&path), b.shallow_clone()));
        let scale = ALPHA / rank as f64;
        by_path.insert(path, Adapter::new(a, b, scale));
    }
    (named, by_path)
}

/// An engine over `name`'s merged model, one applying the same adapters at
/// decode, and one over the base model.
fn three_engines(name: &str, targets: &[&str], rank: i64, threads: usize) -> [Engine; 3] {
    let (cfg, w) = load(name);
    let base = Model::load(&cfg, &w).unwrap();
    let (named, by_path) = random_adapters(&base, targets, rank);
    let merged = base
        .with_adapters(by_path)
        .unwrap()
        .merged_parameters()
        .unwrap();
    let merged = Weights::from_tensors(merged.into_iter().collect());
    let merged = Engine::new(&cfg, &merged, None, pool(), &config(threads)).unwrap();
    let mut decode = Engine::new(&cfg, &w, None, pool(), &config(threads)).unwrap();
    let lora = DecodeLora {
        rank: rank as usize,
        alpha: ALPHA,
        targets: targets.iter().map(|t| t.to_string()).collect(),
    };
    let bytes = decode.add_lora_adapters(&lora).unwrap();
    let params: usize = named.iter().map(|(_, t)| t.numel()).sum();
    assert_eq!(bytes, params * 4, "{name}: the adapters' bytes in the tag");
    let up = decode.update_weights(&named).unwrap();
    assert_eq!(up.tensors, named.len());
    let base = Engine::new(&cfg, &w, None, pool(), &config(threads)).unwrap();
    [merged, decode, base]
}

fn prompts(name: &str) -> Vec<Vec<u32>> {
    greedy_reference(name).into_iter().map(|(p, _)| p).collect()
}

fn greedy(e: &mut Engine, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<f32>)> {
    let reqs = prompts
        .iter()
        .map(|p| Request::new(p.clone(), SamplingParams::greedy(16)))
        .collect();
    ok(e.generate(reqs).unwrap())
        .into_iter()
        .map(|c| (c[0].tokens.clone(), c[0].logprobs.clone()))
        .collect()
}

fn max_diff(a: &[(Vec<u32>, Vec<f32>)], b: &[(Vec<u32>, Vec<f32>)]) -> f32 {
    (a.iter().zip(b))
        .flat_map(|(x, y)| x.1.iter().zip(&y.1).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

#[test]
fn greedy_tokens_with_adapters_at_decode_equal_the_merged_engines() {
    let all: Vec<&str> = PROJECTIONS.to_vec();
    // All-linear on both fixtures (tiny-qwen2 has q/k/v biases), and a
    // subset whose parts sit at other offsets of the fused products; two
    // lanes split the rows over clones of the model.
    let cases: [(&str, &[&str], i64, usize); 4] = [
        ("tiny-qwen2", &all, 4, 1),
        ("tiny-llama", &all, 8, 1),
        (
            "tiny-qwen2",
            &["k_proj", "v_proj", "up_proj", "down_proj"],
            2,
            1,
        ),
        ("tiny-qwen2", &all, 4, 2),
    ];
    for (name, targets, rank, threads) in cases {
        let [mut merged, mut decode, mut base] = three_engines(name, targets, rank, threads);
        let p = prompts(name);
        let (m, d, b) = (
            greedy(&mut merged, &p),
            greedy(&mut decode, &p),
            greedy(&mut base, &p),
        );
        let what = format!("{name} {targets:?} rank {rank}, {threads} lanes");
        for (i, (mi, di)) in m.iter().zip(&d).enumerate() {
            assert_eq!(mi.0, di.0, "{what}: prompt {i}'s greedy tokens");
        }
        let diff = max_diff(&m, &d);
        assert!(diff < 1e-4, "{what}: log-probs differ by {diff}");
        assert_ne!(
            m.iter().map(|c| &c.0).collect::<Vec<_>>(),
            b.iter().map(|c| &c.0).collect::<Vec<_>>(),
            "{what}: the adapters change the tokens"
        );
    }
}

#[test]
fn a_switch_that_writes_only_the_adapters_changes_the_policy() {
    let (cfg, w) = load("tiny-qwen2");
    let model = Model::load(&cfg, &w).unwrap();
    let mut e = Engine::new(&cfg, &w, None, pool(), &config(1)).unwrap();
    let all: Vec<String> = PROJECTIONS.iter().map(|s| s.to_string()).collect();
    e.add_lora_adapters(&DecodeLora {
        rank: 4,
        alpha: ALPHA,
        targets: all,
    })
    .unwrap();
    let p = prompts("tiny-qwen2");
    // Zero adapters: the base model's outputs, exactly.
    let mut base = Engine::new(&cfg, &w, None, pool(), &config(1)).unwrap();
    let (zero, plain) = (greedy(&mut e, &p), greedy(&mut base, &p));
    assert_eq!(zero, plain, "zero adapters leave the base model");
    // A switch of the adapters alone (the base weights untouched), twice.
    let addresses = e.weight_addresses();
    for seed in [1, 2] {
        let (named, _) = random_adapters(&model, &PROJECTIONS, 4 + seed - 1);
        let named: Vec<_> = match seed {
            1 => named,
            // Rank 5 does not fit the engine's rank-4 adapters.
            _ => {
                let err = e.update_weights(&named).unwrap_err().to_string();
                assert!(err.contains("lora_A.weight"), "{err}");
                random_adapters(&model, &PROJECTIONS, 4).0
            }
        };
        e.update_weights(&named).unwrap();
        assert_eq!(e.weight_addresses(), addresses, "written in place");
        assert_ne!(greedy(&mut e, &p), plain, "the new adapters are used");
    }
}

#[test]
fn bad_adapter_settings_are_refused_naming_them() {
    let (cfg, w) = load("tiny-qwen2");
    let mut e = Engine::new(&cfg, &w, None, pool(), &config(1)).unwrap();
    let lora = |rank, targets: &[&str]| DecodeLora {
        rank,
        alpha: 8.0,
        targets: targets.iter().map(|t| t.to_string()).collect(),
    };
    let err = e.add_lora_adapters(&lora(4, &["qkv"])).unwrap_err();
    assert!(err.to_string().contains("`qkv`"), "{err}");
    let err = e.add_lora_adapters(&lora(0, &["q_proj"])).unwrap_err();
    assert!(err.to_string().contains("rank 0"), "{err}");
    e.add_lora_adapters(&lora(4, &["q_proj"])).unwrap();
    let count = e.weight_addresses().len();
    // A second set, the same targets or others (which would replace the
    // stacked q/k/v adapter and leave q's unused), is refused before
    // anything is added.
    for targets in [&["q_proj"][..], &["k_proj"], &["down_proj"]] {
        let err = e.add_lora_adapters(&lora(4, targets)).unwrap_err();
        assert!(
            err.to_string().contains("already has LoRA adapters"),
            "{targets:?}: {err}"
        );
        assert_eq!(
            e.weight_addresses().len(),
            count,
            "{targets:?}: nothing added"
        );
    }
}
