//! `colo generate` run as a process on the fixture checkpoints, against the
//! fixture's greedy continuations and colo-model's teacher-forced
//! log-probabilities.

use std::path::PathBuf;
use std::process::Command;

use colo_model::{loss, Checkpoint};
use tch::{Device, Kind, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

fn colo_generate(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .arg("generate")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "colo generate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn greedy_ids_reproduce_the_fixture_and_logprobs_the_model() {
    let dir = fixture("tiny-qwen2");
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let reference: serde_json::Value = serde_json::from_str(&text).unwrap();
    let full: Vec<u32> = serde_json::from_value(reference["greedy"][0].clone()).unwrap();
    let (prompt, expected) = full.split_at(full.len() - 16);
    let ids = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let v = colo_generate(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &ids,
        "--greedy",
        "--ignore-eos",
        "--max-new-tokens",
        "16",
    ]);
    let c = &v["completions"][0];
    let tokens: Vec<u32> = serde_json::from_value(c["tokens"].clone()).unwrap();
    assert_eq!(
        tokens, expected,
        "generated tokens only, as transformers' greedy"
    );
    assert_eq!(c["finish_reason"], "length");

    let ckpt = Checkpoint::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let full: Vec<i64> = full.iter().map(|&t| t as i64).collect();
    let input = Tensor::from_slice(&full).unsqueeze(0);
    let lp = loss::next_token_logprobs(&ckpt.model.forward(&input).unwrap(), &input).unwrap();
    let lp = Vec::<f32>::try_from(lp.squeeze_dim(0)).unwrap();
    let got: Vec<f32> = serde_json::from_value(c["logprobs"].clone()).unwrap();
    for (a, b) in got.iter().zip(&lp[prompt.len() - 1..]) {
        assert!((a - b).abs() <= 1e-4, "{a} vs {b}");
    }
}

#[test]
fn sampled_text_prompt_gives_n_seeded_completions() {
    let dir = fixture("tiny-llama");
    let args = [
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "The quick brown fox",
        "--n",
        "3",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "5",
    ];
    let a = colo_generate(&args);
    let comps = a["completions"].as_array().unwrap();
    assert_eq!(comps.len(), 3);
    for c in comps {
        let n = c["tokens"].as_array().unwrap().len();
        assert_eq!(n, c["logprobs"].as_array().unwrap().len());
        assert!((1..=8).contains(&n));
    }
    assert_eq!(a, colo_generate(&args), "same seed, same output");
    // Short samples, many of them: each gets KV blocks of its own.
    let qwen = fixture("tiny-qwen2");
    for (n, new) in [("4", "4"), ("8", "1")] {
        let args = [
            "--model",
            qwen.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "--n",
            n,
        ];
        let a = colo_generate(&[&args[..], &["--max-new-tokens", new]].concat());
        assert_eq!(
            a["completions"].as_array().unwrap().len(),
            n.parse::<usize>().unwrap()
        );
    }
}

/// A checkpoint whose weights are finite but overflow in the forward pass
/// (a final norm near float32's limit and tied embeddings of 1e13: logits
/// infinite of both signs, so the log-softmax is NaN) is refused by
/// `generate` and `score`, not printed.
#[test]
fn outputs_that_are_not_numbers_are_an_error() {
    let src = fixture("tiny-qwen2");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut tensors = Tensor::read_safetensors(src.join("model.safetensors")).unwrap();
    for (name, t) in &mut tensors {
        match name.as_str() {
            "model.norm.weight" => *t = t.full_like(3e38),
            "model.embed_tokens.weight" => *t = &*t * 1e15,
            _ => {}
        }
    }
    Tensor::write_safetensors(&tensors, dir.path().join("model.safetensors")).unwrap();
    for cmd in [
        &["generate", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"][..],
        &["score", "--ids", "1,2,3"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_colo"))
            .args(cmd)
            .arg("--model")
            .arg(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd:?}: {err}");
        assert!(
            err.contains("log-probabilities are not numbers (NaN)"),
            "{cmd:?}: {err}"
        );
    }
}

/// `--stop` matches text, so it needs the tokenizer: a checkpoint without
/// `tokenizer.json` is named.
#[test]
fn stop_strings_without_a_tokenizer_name_the_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("tiny-qwen2").join(f), dir.path().join(f)).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["generate", "--prompt-ids", "1,2", "--stop", "x", "--model"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--stop needs the checkpoint's tokenizer.json"),
        "{err}"
    );
}

#[test]
fn a_bad_request_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["generate", "--model"])
        .arg(fixture("tiny-qwen2"))
        .args([
            "--prompt-ids",
            "1,2",
            "--temperature",
            "0.5",
            "--top-p",
            "1.5",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("top_p"), "{err}");
}

/// `--chat` sends the prompt through the checkpoint's chat template (here
/// Qwen2.5-Instruct's, which adds its default system message): the same
/// completion as the ids of transformers' rendering, encoded without the
/// tokenizer's own special tokens.
#[test]
fn chat_prompts_go_through_the_template() {
    let src = fixture("tiny-qwen2");
    let dir = std::env::temp_dir().join(format!("colo-generate-{}-chat", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let template =
        std::fs::read_to_string(fixture("chat-templates/qwen2.5-instruct.jinja")).unwrap();
    let config = dir.join("tokenizer_config.json");
    let mut tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    tc["chat_template"] = template.into();
    std::fs::write(&config, tc.to_string()).unwrap();

    let tok = colo_model::Tokenizer::from_dir(&dir).unwrap();
    let rendered = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n";
    let ids = tok.encode(rendered, false).unwrap();
    let ids = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let model = dir.to_str().unwrap();
    let common = [
        "--model",
        model,
        "--greedy",
        "--ignore-eos",
        "--max-new-tokens",
        "8",
    ];
    let chat = colo_generate(&[&common[..], &["--chat", "--prompt", "hello"]].concat());
    let by_ids = colo_generate(&[&common[..], &["--prompt-ids", &ids]].concat());
    let plain = colo_generate(&[&common[..], &["--prompt", "hello"]].concat());
    assert_eq!(
        chat["completions"][0]["tokens"],
        by_ids["completions"][0]["tokens"]
    );
    assert_ne!(
        chat["completions"][0]["logprobs"], plain["completions"][0]["logprobs"],
        "without --chat the bare text is the prompt"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `--max-new-tokens` beyond what the model's context leaves after the
/// prompt is said, with the number of tokens that are generated; one that
/// fits is not.
#[test]
fn max_new_tokens_cut_to_the_context_is_said() {
    let dir = fixture("tiny-qwen2"); // a context of 512 tokens
    let model = dir.to_str().unwrap();
    let run = |max_new: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_colo"))
            .args([
                "generate",
                "--model",
                model,
                "--prompt-ids",
                "1,2,3",
                "--greedy",
            ])
            .args(["--ignore-eos", "--max-new-tokens", max_new, "--json"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let n = v["completions"][0]["tokens"].as_array().unwrap().len();
        (n, stderr)
    };
    let (n, stderr) = run("600");
    assert_eq!(n, 509, "the context's 512 tokens, less the prompt's 3");
    assert!(
        stderr.contains(
            "--max-new-tokens 600 does not fit: the model's context is 512 tokens and the \
             prompt has 3, so at most 509 new tokens are generated"
        ),
        "{stderr}"
    );
    let (n, stderr) = run("4");
    assert_eq!(n, 4);
    assert!(!stderr.contains("does not fit"), "{stderr}");
}

/// `--n` whose samples cannot fit the machine is refused before anything
/// is allocated, naming `--n` and colo-plan's bytes (a billion samples of
/// 5 tokens: ~17 TB, beyond any machine). It used to size a KV cache for
/// all of them and run until the machine's memory ran out.
#[test]
fn samples_beyond_the_machines_memory_are_refused_up_front() {
    use colo_plan::generate::estimate;
    use colo_plan::model::{DType, HfConfig};
    let dir = fixture("tiny-qwen2");
    let t = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args([
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
        ])
        .args(["--n", "1000000000", "--max-new-tokens", "2", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        t.elapsed().as_secs() < 30,
        "not up front: {:?}",
        t.elapsed()
    );
    // One 16-token KV block a sample, and the engine's padding block.
    let spec = HfConfig::from_file(dir.join("config.json").to_str().unwrap())
        .and_then(|c| c.into_spec("model"))
        .unwrap();
    let n = 1_000_000_000u64;
    let need = estimate(&spec, DType::F32, (n + 1) * 16, n, 5);
    let fmt = colo_mem::fmt_bytes;
    assert!(
        stderr.contains(&format!(
            "--n 1000000000: the engine decodes a prompt's samples at once, and 1000000000 \
             samples of up to 5 tokens need about {} ({} of KV cache, {} of decode buffers",
            fmt(need.total()),
            fmt(need.kv_cache),
            fmt(need.decode)
        )) && stderr.contains("more than the machine's")
            && stderr.contains("At most about"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing generated");
}
