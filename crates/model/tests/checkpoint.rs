//! Loading and saving Hugging Face directories, the tokenizer, and the
//! errors that name what is wrong.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use colo_model::{Checkpoint, Error, Model, ModelConfig, Weights};
use common::*;

/// Names and shapes of the tensors in a safetensors file.
fn tensor_shapes(path: &Path) -> BTreeMap<String, Vec<usize>> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.dims().to_vec()))
        .collect()
}

#[test]
fn save_then_reload_gives_identical_logits_and_hf_layout() {
    for name in MODELS {
        let src = fixture_dir(name);
        let ckpt = Checkpoint::from_dir(&src, DType::F32, &Device::Cpu).unwrap();
        let dst = scratch_dir(&format!("save-{name}"));
        ckpt.save_dir(&dst, Some(&src)).unwrap();
        for f in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            assert!(dst.join(f).is_file(), "{name}: {f} not written");
        }
        // Same tensor names and shapes as transformers wrote (so a tied head
        // is not duplicated and every name is the one transformers expects).
        assert_eq!(
            tensor_shapes(&dst.join("model.safetensors")),
            tensor_shapes(&src.join("model.safetensors"))
        );
        let reloaded = Checkpoint::from_dir(&dst, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(reloaded.model.config(), ckpt.model.config());
        let ids = reference(name).input_ids;
        let (a, b) = (
            ckpt.model.forward(&ids).unwrap(),
            reloaded.model.forward(&ids).unwrap(),
        );
        assert_eq!(
            a.to_vec3::<f32>().unwrap(),
            b.to_vec3::<f32>().unwrap(),
            "{name}: logits changed"
        );
        std::fs::remove_dir_all(dst).unwrap();
    }
}

#[test]
fn saved_config_keeps_what_transformers_needs() {
    let dst = scratch_dir("config");
    load("tiny-qwen2").save_dir(&dst).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(v["architectures"][0], "Qwen2ForCausalLM");
    assert_eq!(v["tie_word_embeddings"], true);
    assert_eq!(v["rope_theta"], 10000.0);
    assert_eq!(v["rope_parameters"]["rope_theta"], 10000.0);
    std::fs::remove_dir_all(dst).unwrap();
}

#[test]
fn sharded_checkpoint_loads() {
    let src = fixture_dir("tiny-llama");
    let dst = scratch_dir("sharded");
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let shard: HashMap<&str, Tensor> = chunk
            .iter()
            .map(|n| (n.as_str(), tensors[*n].clone()))
            .collect();
        candle_core::safetensors::save(&shard, dst.join(&file)).unwrap();
        for n in chunk {
            weight_map.insert((*n).clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dst.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let ids = reference("tiny-llama").input_ids;
    let sharded = Model::from_dir(&dst, DType::F32, &Device::Cpu)
        .unwrap()
        .forward(&ids)
        .unwrap();
    let single = load("tiny-llama").forward(&ids).unwrap();
    assert_eq!(max_abs_diff(&sharded, &single), 0.0);
    std::fs::remove_dir_all(dst).unwrap();
}

#[test]
fn tokenizer_reproduces_fixture_ids_and_special_tokens() {
    let dir = fixture_dir("tiny-qwen2");
    let tok = Checkpoint::from_dir(&dir, DType::F32, &Device::Cpu)
        .unwrap()
        .tokenizer
        .unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let r = reference("tiny-qwen2");
    for (prompt, greedy) in json["prompts"].as_array().unwrap().iter().zip(&r.greedy) {
        let ids = tok.encode(prompt.as_str().unwrap(), true).unwrap();
        assert_eq!(ids, greedy[..greedy.len() - 16]);
        assert_eq!(tok.decode(&ids, false).unwrap(), prompt.as_str().unwrap());
    }
    let id = |t: &Option<colo_model::SpecialToken>| t.as_ref().map(|t| t.id);
    assert_eq!(
        (
            id(&tok.special.bos),
            id(&tok.special.eos),
            id(&tok.special.pad)
        ),
        (Some(1), Some(2), Some(0))
    );
    assert_eq!(tok.vocab_size(), 384);
}

/// A copy of a fixture directory whose `config.json` is edited by `edit`.
fn with_config(
    name: &str,
    tag: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> std::path::PathBuf {
    let src = fixture_dir(name);
    let dst = scratch_dir(tag);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dst.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dst.join("model.safetensors")).unwrap();
    dst
}

#[test]
fn top_level_rope_theta_is_read() {
    let dst = with_config("tiny-llama", "rope", |c| {
        c["rope_theta"] = c["rope_parameters"]["rope_theta"].clone();
        c.as_object_mut().unwrap().remove("rope_parameters");
    });
    let m = Model::from_dir(&dst, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(m.config().rope_theta, 500000.0);
    let ids = reference("tiny-llama").input_ids;
    assert_eq!(
        max_abs_diff(
            &m.forward(&ids).unwrap(),
            &load("tiny-llama").forward(&ids).unwrap()
        ),
        0.0
    );
    std::fs::remove_dir_all(dst).unwrap();
}

#[test]
fn unsupported_model_type_is_named() {
    let dst = with_config("tiny-qwen2", "gpt2", |c| c["model_type"] = "gpt2".into());
    match Model::from_dir(&dst, DType::F32, &Device::Cpu) {
        Err(e @ Error::UnsupportedModelType { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("gpt2") && msg.contains("qwen2") && msg.contains("llama"),
                "{msg}"
            );
        }
        other => panic!("expected UnsupportedModelType, got {other:?}"),
    }
    std::fs::remove_dir_all(dst).unwrap();
}

fn fixture_weights(name: &str) -> (ModelConfig, HashMap<String, Tensor>) {
    let dir = fixture_dir(name);
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let tensors =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    (cfg, tensors)
}

#[test]
fn missing_tensor_is_named() {
    let (cfg, mut tensors) = fixture_weights("tiny-llama");
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    match Model::load(&cfg, &Weights::from_tensors(tensors)) {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "model.layers.1.mlp.up_proj.weight"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    // An untied model needs its head.
    let (cfg, mut tensors) = fixture_weights("tiny-llama");
    tensors.remove("lm_head.weight");
    assert!(
        matches!(Model::load(&cfg, &Weights::from_tensors(tensors)), Err(Error::MissingTensor { name }) if name == "lm_head.weight")
    );
}

#[test]
fn mis_shaped_tensor_is_named_with_both_shapes() {
    let (cfg, mut tensors) = fixture_weights("tiny-qwen2");
    let name = "model.layers.0.self_attn.k_proj.bias";
    tensors.insert(
        name.into(),
        Tensor::zeros(7, DType::F32, &Device::Cpu).unwrap(),
    );
    match Model::load(&cfg, &Weights::from_tensors(tensors)) {
        Err(e @ Error::ShapeMismatch { .. }) => {
            let Error::ShapeMismatch {
                name: n,
                expected,
                found,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(
                (n.as_str(), expected.as_slice(), found.as_slice()),
                (name, &[32][..], &[7][..])
            );
            assert!(
                e.to_string().contains("[32]") && e.to_string().contains("[7]"),
                "{e}"
            );
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
}

#[test]
fn missing_files_are_named() {
    let dst = scratch_dir("missing");
    match Model::from_dir(&dst, DType::F32, &Device::Cpu) {
        Err(Error::MissingFile { path }) => assert_eq!(path, dst.join("config.json")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    std::fs::copy(
        fixture_dir("tiny-qwen2").join("config.json"),
        dst.join("config.json"),
    )
    .unwrap();
    match Model::from_dir(&dst, DType::F32, &Device::Cpu) {
        Err(Error::MissingFile { path }) => assert_eq!(path, dst.join("model.safetensors")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    match colo_model::Tokenizer::from_dir(&dst) {
        Err(Error::MissingFile { path }) => assert_eq!(path, dst.join("tokenizer.json")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    std::fs::remove_dir_all(dst).unwrap();
}

#[test]
fn parameter_shapes_describe_the_checkpoint() {
    for name in MODELS {
        let (cfg, tensors) = fixture_weights(name);
        let listed: BTreeMap<String, Vec<usize>> = cfg.parameter_shapes().into_iter().collect();
        let found: BTreeMap<String, Vec<usize>> = tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.dims().to_vec()))
            .collect();
        assert_eq!(listed, found, "{name}");
        let count: usize = tensors.values().map(|t| t.elem_count()).sum();
        assert_eq!(cfg.num_parameters(), count, "{name}");
        // A randomly initialised model of the same config loads and runs.
        let model = Model::load(
            &cfg,
            &Weights::random(&cfg, 0.02, DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap();
        let logits = model.forward(&reference(name).input_ids).unwrap();
        assert_eq!(logits.dims(), &[3, 10, cfg.vocab_size]);
    }
}
