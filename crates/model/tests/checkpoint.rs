//! Loading and saving Hugging Face directories, the tokenizer, and the
//! errors that name what is wrong.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use colo_model::{Checkpoint, Error, Model, ModelConfig, Weights};
use common::*;
use tch::{Device, Kind, Tensor};

/// Names, shapes and kinds of the tensors in a safetensors file.
fn tensor_shapes(path: &Path) -> BTreeMap<String, (Vec<i64>, Kind)> {
    read_tensors(path)
        .into_iter()
        .map(|(k, v)| (k, (v.size(), v.kind())))
        .collect()
}

#[test]
fn save_then_reload_gives_identical_logits_and_hf_layout() {
    for name in MODELS {
        let src = fixture_dir(name);
        let ckpt = Checkpoint::from_dir(&src, Kind::Float, Device::Cpu).unwrap();
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
        let reloaded = Checkpoint::from_dir(&dst, Kind::Float, Device::Cpu).unwrap();
        assert_eq!(reloaded.model.config(), ckpt.model.config());
        let ids = reference(name).input_ids;
        let (a, b) = (
            ckpt.model.forward(&ids).unwrap(),
            reloaded.model.forward(&ids).unwrap(),
        );
        assert!(a.equal(&b), "{name}: logits changed");
        // The file says `format: pt`, as transformers expects.
        let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(
            meta.metadata()
                .as_ref()
                .and_then(|m| m.get("format"))
                .map(String::as_str),
            Some("pt")
        );
        // The weights are as readable as the config (not the 0600 of the
        // safetensors crate's temporary file): another user may load them.
        use std::os::unix::fs::PermissionsExt;
        let mode = |f: &str| std::fs::metadata(dst.join(f)).unwrap().permissions().mode();
        assert_eq!(mode("model.safetensors"), mode("config.json"));
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
    let tensors = read_tensors(&src.join("model.safetensors"));
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in names.chunks(names.len().div_ceil(2)).enumerate() {
        let file = format!("model-{:05}-of-00002.safetensors", i + 1);
        let shard: Vec<(&str, &Tensor)> =
            chunk.iter().map(|n| (n.as_str(), &tensors[*n])).collect();
        Tensor::write_safetensors(&shard, dst.join(&file)).unwrap();
        for n in chunk {
            weight_map.insert((*n).clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(dst.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let ids = reference("tiny-llama").input_ids;
    let sharded = Model::from_dir(&dst, Kind::Float, Device::Cpu)
        .unwrap()
        .forward(&ids)
        .unwrap();
    let single = load("tiny-llama").forward(&ids).unwrap();
    assert_eq!(max_abs_diff(&sharded, &single), 0.0);
    // A tensor in two shards is ambiguous: an error naming it.
    let first = names[0].as_str();
    let file = dst.join("model-00002-of-00002.safetensors");
    let mut second = read_tensors(&file);
    second.insert(first.to_owned(), tensors[first].shallow_clone());
    let second: Vec<(&str, &Tensor)> = second.iter().map(|(n, t)| (n.as_str(), t)).collect();
    Tensor::write_safetensors(&second, &file).unwrap();
    let e = Weights::from_dir(&dst, Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("tensor `{first}`: is also in another shard")),
        "{e}"
    );
    std::fs::remove_dir_all(dst).unwrap();
}

#[test]
fn tokenizer_reproduces_fixture_ids_and_special_tokens() {
    let dir = fixture_dir("tiny-qwen2");
    let tok = Checkpoint::from_dir(&dir, Kind::Float, Device::Cpu)
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
    let m = Model::from_dir(&dst, Kind::Float, Device::Cpu).unwrap();
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

/// A field of the wrong type is named once, with the file, however the
/// error is printed (its `{:#}` chain used to repeat the parser's message).
#[test]
fn a_bad_config_field_is_named_once_with_the_file() {
    let dst = with_config("tiny-qwen2", "badfield", |c| {
        c["hidden_size"] = "sixty-four".into()
    });
    let err = Model::from_dir(&dst, Kind::Float, Device::Cpu)
        .err()
        .unwrap();
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        chain += &format!(": {s}");
        source = s.source();
    }
    assert_eq!(chain.matches("sixty-four").count(), 1, "{chain}");
    assert!(
        chain.contains(&dst.join("config.json").display().to_string()),
        "{chain}"
    );
    std::fs::remove_dir_all(dst).unwrap();
}

#[test]
fn unsupported_model_type_is_named() {
    let dst = with_config("tiny-qwen2", "gpt2", |c| c["model_type"] = "gpt2".into());
    match Model::from_dir(&dst, Kind::Float, Device::Cpu) {
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
    (cfg, read_tensors(&dir.join("model.safetensors")))
}

#[test]
fn missing_tensor_is_named() {
    let (cfg, mut tensors) = fixture_weights("tiny-llama");
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    match Model::load(&cfg, &Weights::from_tensors(tensors)) {
        Err(Error::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.layers.1.mlp.up_proj.weight")
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    // An untied model needs its head.
    let (cfg, mut tensors) = fixture_weights("tiny-llama");
    tensors.remove("lm_head.weight");
    assert!(
        matches!(Model::load(&cfg, &Weights::from_tensors(tensors)), Err(Error::MissingTensor { name, .. }) if name == "lm_head.weight")
    );
}

/// A config.json with fewer layers than its weights loads (as in
/// transformers), and the tensors left unused are listed (what the load's
/// warning names); a checkpoint that matches its config leaves none.
#[test]
fn tensors_the_config_leaves_unused_are_listed() {
    let dir = fixture_dir("tiny-llama");
    let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let mut cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    assert_eq!(colo_model::weights::unused(&cfg, &w), Vec::<String>::new());
    cfg.num_layers -= 1;
    let last = cfg.num_layers;
    let unused = colo_model::weights::unused(&cfg, &w);
    assert!(
        !unused.is_empty()
            && unused
                .iter()
                .all(|n| n.starts_with(&format!("model.layers.{last}."))),
        "{unused:?}"
    );
    assert!(Model::load(&cfg, &w).is_ok());
}

/// Weights whose config.json was edited (a user's mix-up of two
/// checkpoints): the error names the directory, the tensor and both
/// shapes, and says where the expected one comes from.
#[test]
fn a_config_that_does_not_match_the_weights_names_the_checkpoint() {
    let dir = scratch_dir("mismatched-config");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir("tiny-qwen2").join(f), dir.join(f)).unwrap();
    }
    let edit = |key: &str, by: i64| {
        let path = dir.join("config.json");
        let mut c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        c[key] = (c[key].as_i64().unwrap() + by).into();
        std::fs::write(&path, c.to_string()).unwrap();
    };
    edit("intermediate_size", 2);
    let e = Model::from_dir(&dir, Kind::Float, Device::Cpu).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::ShapeMismatch { .. })
            && msg.starts_with(&format!("checkpoint {}: ", dir.display()))
            && msg.contains("`model.layers.0.mlp.gate_proj.weight` has shape")
            && msg.contains("config.json implies"),
        "{msg}"
    );
    edit("intermediate_size", -2);
    edit("num_hidden_layers", 1);
    let msg = Model::from_dir(&dir, Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&dir.display().to_string()) && msg.contains("missing tensor `model.layers.2."),
        "{msg}"
    );
}

#[test]
fn mis_shaped_tensor_is_named_with_both_shapes() {
    let (cfg, mut tensors) = fixture_weights("tiny-qwen2");
    let name = "model.layers.0.self_attn.k_proj.bias";
    tensors.insert(name.into(), Tensor::zeros([7], (Kind::Float, Device::Cpu)));
    match Model::load(&cfg, &Weights::from_tensors(tensors)) {
        Err(e @ Error::ShapeMismatch { .. }) => {
            let Error::ShapeMismatch {
                name: n,
                expected,
                found,
                ..
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
    match Model::from_dir(&dst, Kind::Float, Device::Cpu) {
        Err(Error::MissingFile { path }) => assert_eq!(path, dst.join("config.json")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    std::fs::copy(
        fixture_dir("tiny-qwen2").join("config.json"),
        dst.join("config.json"),
    )
    .unwrap();
    match Model::from_dir(&dst, Kind::Float, Device::Cpu) {
        Err(Error::MissingFile { path }) => assert_eq!(path, dst.join("model.safetensors")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    match colo_model::Tokenizer::from_dir(&dst) {
        Err(Error::MissingFile { path }) => assert_eq!(path, dst.join("tokenizer.json")),
        other => panic!("expected MissingFile, got {other:?}"),
    }
    // What a user may have instead: PyTorch's .bin weights, a sentencepiece
    // tokenizer.model; or no directory at all, or a file.
    std::fs::write(dst.join("pytorch_model.bin"), b"x").unwrap();
    let e = Model::from_dir(&dst, Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pytorch_model.bin, which colo does not read")
            && e.contains("safe_serialization=True"),
        "{e}"
    );
    std::fs::write(dst.join("tokenizer.model"), b"x").unwrap();
    let e = colo_model::Tokenizer::from_dir(&dst)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer.model but no tokenizer.json"), "{e}");
    let gone = dst.join("no-such-model");
    match Model::from_dir(&gone, Kind::Float, Device::Cpu) {
        Err(Error::MissingDirectory { path }) => assert_eq!(path, gone),
        other => panic!("expected MissingDirectory, got {other:?}"),
    }
    let file = dst.join("config.json");
    match Model::from_dir(&file, Kind::Float, Device::Cpu) {
        Err(e @ Error::NotADirectory { .. }) => assert!(
            e.to_string()
                .contains("is a file; a model is a Hugging Face directory"),
            "{e}"
        ),
        other => panic!("expected NotADirectory, got {other:?}"),
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
            .map(|(k, v)| (k.clone(), v.size().iter().map(|&d| d as usize).collect()))
            .collect();
        assert_eq!(listed, found, "{name}");
        let count: usize = tensors.values().map(|t| t.numel()).sum();
        assert_eq!(cfg.num_parameters(), count, "{name}");
        // A randomly initialised model of the same config loads and runs.
        let model = Model::load(
            &cfg,
            &Weights::random(&cfg, 0.02, Kind::Float, Device::Cpu).unwrap(),
        )
        .unwrap();
        let logits = model.forward(&reference(name).input_ids).unwrap();
        assert_eq!(logits.size(), [3, 10, cfg.vocab_size as i64]);
    }
}

/// bfloat16 is saved as bfloat16 (config `torch_dtype` too) and loads back
/// bit-identically; loading converts to the requested kind.
#[test]
fn bfloat16_saves_as_bfloat16_and_converts_on_load() {
    let src = fixture_dir("tiny-llama");
    let model = Model::from_dir(&src, Kind::BFloat16, Device::Cpu).unwrap();
    assert!(model
        .named_parameters()
        .iter()
        .all(|(_, t)| t.kind() == Kind::BFloat16));
    let dst = scratch_dir("bf16");
    model.save_dir(&dst).unwrap();
    let shapes = tensor_shapes(&dst.join("model.safetensors"));
    assert!(shapes.values().all(|(_, k)| *k == Kind::BFloat16));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(v["torch_dtype"], "bfloat16");
    let back = Model::from_dir(&dst, Kind::Float, Device::Cpu).unwrap();
    for ((n, a), (_, b)) in model.named_parameters().iter().zip(back.named_parameters()) {
        assert_eq!(b.kind(), Kind::Float);
        assert!(a.to_kind(Kind::Float).equal(&b), "{n} changed");
    }
    std::fs::remove_dir_all(dst).unwrap();
}

/// A safetensors file with one valid header and `tensors` (name, dtype,
/// shape, data bytes).
fn write_raw_safetensors(path: &Path, tensors: &[(&str, &str, &[usize], &[u8])]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

#[test]
fn load_failures_name_the_file_and_tensor() {
    let dst = scratch_dir("bad-safetensors");
    let file = dst.join("model.safetensors");
    // Not a safetensors file at all.
    std::fs::write(&file, b"not a safetensors file").unwrap();
    match Weights::from_dir(&dst, Kind::Float, Device::Cpu) {
        Err(e @ Error::Safetensors { .. }) => {
            let Error::Safetensors { path, tensor, .. } = &e else {
                unreachable!()
            };
            assert_eq!((path, tensor), (&file, &None));
            assert!(e.to_string().contains("model.safetensors"), "{e}");
        }
        other => panic!("expected Safetensors, got {other:?}"),
    }
    // Integer tensors are no weights: asking for one names its dtype (an
    // unused one does no harm).
    write_raw_safetensors(
        &file,
        &[
            ("fine", "F32", &[1], &1f32.to_le_bytes()),
            ("odd", "U32", &[1], &7u32.to_le_bytes()),
            ("ints", "I32", &[1], &7i32.to_le_bytes()),
        ],
    );
    let w = Weights::from_dir(&dst, Kind::Float, Device::Cpu).unwrap();
    assert!(w.get("fine", &[1]).is_ok());
    for (name, dtype) in [("odd", "U32"), ("ints", "I32")] {
        let e = w.get(name, &[1]).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::NotFloat { .. })
                && msg.contains(&format!("`{name}` is stored as {dtype}"))
                && msg.contains("floating-point"),
            "{msg}"
        );
    }
    // NaN or infinite weights are refused when read, naming the tensor.
    write_raw_safetensors(
        &file,
        &[(
            "nan",
            "F32",
            &[2],
            &[1f32.to_le_bytes(), f32::NAN.to_le_bytes()].concat(),
        )],
    );
    let e = Weights::from_dir(&dst, Kind::Float, Device::Cpu).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("`nan`") && msg.contains("NaN or infinite"),
        "{msg}"
    );
    // 1e39 is finite in F64 but not as float32.
    write_raw_safetensors(&file, &[("big", "F64", &[1], &1e39f64.to_le_bytes())]);
    let msg = Weights::from_dir(&dst, Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`big`") && msg.contains("(as Float)"), "{msg}");
    // Finite values whose float32 sum overflows are kept.
    let near_max = [3e38f32; 4].map(f32::to_le_bytes).concat();
    write_raw_safetensors(&file, &[("large", "F32", &[4], &near_max)]);
    let w = Weights::from_dir(&dst, Kind::Float, Device::Cpu).unwrap();
    assert_eq!(
        Vec::<f32>::try_from(w.get("large", &[4]).unwrap()).unwrap(),
        [3e38f32; 4]
    );
    // A truncated file, and a tensor whose bytes do not match its shape.
    write_raw_safetensors(&file, &[("w", "F32", &[4], &[0u8; 16])]);
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(&file, &whole[..whole.len() - 6]).unwrap();
    let msg = Weights::from_dir(&dst, Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("the file is truncated: its header describes 16 bytes of tensor data, the file holds 10"),
        "{msg}"
    );
    write_raw_safetensors(&file, &[("w", "F32", &[5], &[0u8; 16])]);
    let msg = Weights::from_dir(&dst, Kind::Float, Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("tensor `w`") && msg.contains("need 20 bytes") && msg.contains("hold 16"),
        "{msg}"
    );
    // A shard the index names but the directory lacks.
    std::fs::remove_file(&file).unwrap();
    let index = serde_json::json!({"weight_map": {"a": "model-00001-of-00002.safetensors"}});
    std::fs::write(dst.join("model.safetensors.index.json"), index.to_string()).unwrap();
    match Weights::from_dir(&dst, Kind::Float, Device::Cpu) {
        Err(Error::MissingFile { path }) => {
            assert_eq!(path, dst.join("model-00001-of-00002.safetensors"))
        }
        other => panic!("expected MissingFile, got {other:?}"),
    }
    std::fs::remove_dir_all(dst).unwrap();
}

/// Asking for a GPU that is not there is an error naming the device, not a
/// panic inside libtorch. With a GPU, the model runs there with the same
/// logits.
#[test]
fn cuda_device_is_checked() {
    let dir = fixture_dir("tiny-qwen2");
    let cuda = Device::Cuda(0);
    if !tch::Cuda::is_available() {
        for result in [
            Checkpoint::from_dir(&dir, Kind::Float, cuda).map(|_| ()),
            Model::from_dir(&dir, Kind::Float, cuda).map(|_| ()),
            Weights::from_dir(&dir, Kind::Float, cuda).map(|_| ()),
        ] {
            match result {
                Err(e @ Error::DeviceUnavailable { .. }) => {
                    assert!(e.to_string().contains("Cuda(0)"), "{e}")
                }
                other => panic!("expected DeviceUnavailable, got {other:?}"),
            }
        }
        eprintln!("no CUDA device: checked the error only");
        return;
    }
    let r = reference("tiny-qwen2");
    let model = Model::from_dir(&dir, Kind::Float, cuda).unwrap();
    assert_eq!(model.device(), cuda);
    let logits = model.forward(&r.input_ids).unwrap();
    assert_eq!(logits.device(), cuda);
    let diff = max_abs_diff(&logits.to_device(Device::Cpu), &r.logits);
    eprintln!("tiny-qwen2 on CUDA: max |logits - reference| = {diff:.3e}");
    assert!(diff <= 1e-4, "CUDA logits differ by {diff}");
    let past = tch::Cuda::device_count() as usize;
    assert!(matches!(
        Model::from_dir(&dir, Kind::Float, Device::Cuda(past)),
        Err(Error::DeviceUnavailable { .. })
    ));
}
