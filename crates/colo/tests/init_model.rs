//! `colo init-model` run as a process on the smallest issue-36 preset,
//! Qwen2.5-0.5B (494 M parameters, ~1 GB in bf16: written once, in
//! shards, and shared by the tests), and its directory read back by
//! colo-model and `colo plan`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use colo_model::{ChatMessage, Checkpoint};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

fn colo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "colo failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned() + &stderr
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Qwen2.5-0.5B's published parameter count.
const PARAMS: u64 = 494_032_768;

/// The model, written once: shards of at most 400 MB (three), so that the
/// index is what colo-model loads it through.
fn model() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, dir) = DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("qwen2.5-0.5b");
        let said = ok(colo(&[
            "init-model",
            "--preset",
            "Qwen2.5-0.5B",
            "--out",
            dir.to_str().unwrap(),
            "--max-shard-size",
            "400MB",
        ]));
        assert!(said.contains("494,032,768 parameters"), "{said}");
        (tmp, dir)
    });
    dir
}

/// The numbers of Qwen/Qwen2.5-0.5B's config.json.
#[test]
fn config_json_has_the_published_numbers() {
    let c = read_json(&model().join("config.json"));
    for (key, want) in [
        ("architectures", serde_json::json!(["Qwen2ForCausalLM"])),
        ("model_type", "qwen2".into()),
        ("hidden_size", 896.into()),
        ("intermediate_size", 4864.into()),
        ("num_hidden_layers", 24.into()),
        ("num_attention_heads", 14.into()),
        ("num_key_value_heads", 2.into()),
        ("vocab_size", 151_936.into()),
        ("tie_word_embeddings", true.into()),
        ("rope_theta", 1e6.into()),
        ("max_position_embeddings", 32_768.into()),
        ("rms_norm_eps", 1e-6.into()),
        ("torch_dtype", "bfloat16".into()),
        ("use_sliding_window", false.into()),
        ("initializer_range", 0.02.into()),
    ] {
        assert_eq!(c[key], want, "{key}");
    }
    // The ids of the small tokenizer's <|endoftext|>, as the published
    // config names Qwen's.
    let tok = colo_model::Tokenizer::from_dir(model()).unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(
        (c["bos_token_id"].as_u64(), c["eos_token_id"].as_u64()),
        (Some(eot.into()), Some(eot.into()))
    );
    let index = read_json(&model().join("model.safetensors.index.json"));
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(2 * PARAMS));
    let shards: std::collections::BTreeSet<&str> = (index["weight_map"].as_object().unwrap())
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        shards.into_iter().collect::<Vec<_>>(),
        (1..=3)
            .map(|i| format!("model-0000{i}-of-00003.safetensors"))
            .collect::<Vec<_>>()
    );
}

/// colo-model loads the sharded directory through its index: every
/// parameter of the config under its Hugging Face name and shape, drawn
/// as transformers initialises them, and a forward gives finite logits.
#[test]
fn colo_model_loads_it_with_transformers_initialisation() {
    let ckpt = Checkpoint::from_dir(model(), Kind::BFloat16, Device::Cpu).unwrap();
    let cfg = ckpt.model.config();
    assert_eq!(cfg.num_parameters() as u64, PARAMS);
    let named = ckpt.model.named_parameters();
    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    let expected: Vec<String> = cfg.parameter_shapes().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, expected);
    assert!(
        !names.contains(&"lm_head.weight"),
        "tied: no head of its own"
    );
    let get = |name: &str| -> Tensor {
        let t = &named.iter().find(|(n, _)| n == name).unwrap().1;
        t.to_kind(Kind::Float)
    };
    for name in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.23.mlp.down_proj.weight",
        "model.embed_tokens.weight",
    ] {
        let w = get(name);
        let (mean, std) = (
            w.mean(None).double_value(&[]),
            w.std(true).double_value(&[]),
        );
        assert!(mean.abs() < 1e-4, "{name}: mean {mean}");
        assert!((std - 0.02).abs() < 2e-4, "{name}: std {std}");
    }
    // Different tensors draw different numbers.
    let (a, b) = (
        get("model.layers.0.mlp.up_proj.weight"),
        get("model.layers.1.mlp.up_proj.weight"),
    );
    assert!(!a.equal(&b));
    for name in ["model.layers.5.input_layernorm.weight", "model.norm.weight"] {
        let w = get(name);
        assert_eq!(
            (w.min().double_value(&[]), w.max().double_value(&[])),
            (1.0, 1.0),
            "{name}"
        );
    }
    let bias = get("model.layers.0.self_attn.k_proj.bias");
    assert_eq!(
        (bias.size(), bias.abs().max().double_value(&[])),
        (vec![128], 0.0)
    );

    let tok = ckpt.tokenizer.as_ref().unwrap();
    let ids: Vec<i64> = tok
        .encode("12+7=", true)
        .unwrap()
        .into_iter()
        .map(i64::from)
        .collect();
    let _no_grad = tch::no_grad_guard();
    let logits = ckpt
        .model
        .forward(&Tensor::from_slice(&ids).unsqueeze(0))
        .unwrap();
    assert_eq!(logits.size(), [1, ids.len() as i64, 151_936]);
    assert!(colo_model::weights::all_finite(&logits).unwrap());
}

/// The tokenizer round-trips a chat prompt rendered with the Qwen2.5
/// template, with ids far below the model's vocabulary.
#[test]
fn the_tokenizer_round_trips_a_chat_prompt() {
    let tok = colo_model::Tokenizer::from_dir(model()).unwrap();
    assert!(tok.vocab_size() < 300, "{}", tok.vocab_size());
    let chat = [ChatMessage {
        role: "user".into(),
        content: "What is 12 + 7? Answer with a number.".into(),
    }];
    let text = tok.render_chat(&chat, true).unwrap();
    assert!(text.starts_with("<|im_start|>system\n"), "{text}");
    assert!(
        text.ends_with("<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    let ids = tok.encode(&text, true).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == im_start).count(), 3);
    // Chat rollouts stop at the end of a turn and at the end of text.
    let stop = colo_model::tokenizer::stop_token_ids(model(), &tok).unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert!(stop.contains(&im_end), "{stop:?}");
}

/// The run config it writes passes the plan check (issue 36's job fits
/// this machine's memory).
#[test]
fn its_run_config_passes_the_plan() {
    let run = model().join("run.toml");
    let said = ok(colo(&["plan", "--config", run.to_str().unwrap()]));
    assert!(said.contains("494.03M params (bf16)"), "{said}");
    assert!(said.contains(": fits"), "{said}");
    let text = std::fs::read_to_string(&run).unwrap();
    for line in [
        "train_batch_size = 4",
        "n = 4",
        "max_new_tokens = 16",
        "dtype = \"auto\"",
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
}

#[test]
fn unknown_presets_and_occupied_directories_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m");
    let e = colo(&[
        "init-model",
        "--preset",
        "gpt-5",
        "--out",
        out.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success());
    for name in [
        "qwen2.5-0.5b",
        "qwen2.5-7b",
        "qwen3-0.6b",
        "qwen3-8b",
        "llama-3.1-8b",
    ] {
        assert!(said.contains(name), "{name}: {said}");
    }
    // The list gives each preset's parameters.
    assert!(
        said.contains("494,032,768") && said.contains("8,190,735,360"),
        "{said}"
    );
    assert!(!out.exists(), "nothing is written for an unknown preset");

    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let e = colo(&[
        "init-model",
        "--preset",
        "qwen2.5-0.5b",
        "--out",
        out.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success());
    assert!(
        said.contains("exists and is not empty") && said.contains("--force"),
        "{said}"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);

    let listed = ok(colo(&["init-model", "--list"]));
    assert!(
        listed.contains("qwen2.5-7b") && listed.contains("7,615,616,512"),
        "{listed}"
    );
}
