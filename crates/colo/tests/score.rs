//! `colo score` run as a process on the fixture checkpoints, against the
//! numbers colo-model's library computes.

use std::path::PathBuf;
use std::process::Command;

use colo_model::{loss, Checkpoint};
use tch::{Device, Kind, Tensor};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

fn colo_score(args: &[&str]) -> Vec<f32> {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .arg("score")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "colo score failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(v["logprobs"].clone()).unwrap()
}

fn library_logprobs(ckpt: &Checkpoint, ids: &[u32]) -> Vec<f32> {
    // The binary's process settings (one intra-op thread: the sums add in
    // the binary's order), so the comparison can be exact.
    colo_rl::process::init();
    let ids: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
    let input = Tensor::from_slice(&ids).unsqueeze(0);
    let logits = ckpt.model.forward(&input).unwrap();
    let lp = loss::next_token_logprobs(&logits, &input).unwrap();
    Vec::<f32>::try_from(lp.squeeze_dim(0)).unwrap()
}

#[test]
fn score_ids_and_text_match_the_library() {
    for name in ["tiny-qwen2", "tiny-llama"] {
        let dir = fixture(name);
        let ckpt = Checkpoint::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
        let text = "Question: what is 12 + 7? Answer: 19";
        let ids = ckpt.tokenizer.as_ref().unwrap().encode(text, true).unwrap();
        let expected = library_logprobs(&ckpt, &ids);
        assert_eq!(expected.len(), ids.len() - 1);
        assert!(expected.iter().all(|v| v.is_finite() && *v <= 0.0));

        let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let dir_arg = dir.to_str().unwrap();
        // float32 survives the JSON round trip exactly, so equality is exact.
        assert_eq!(
            colo_score(&["--model", dir_arg, "--ids", &ids_arg]),
            expected,
            "{name} --ids"
        );
        assert_eq!(
            colo_score(&["--model", dir_arg, "--text", text]),
            expected,
            "{name} --text"
        );
    }
}

#[test]
fn score_refuses_bad_input() {
    let dir = fixture("tiny-qwen2");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_colo"))
            .arg("score")
            .args(args)
            .output()
            .unwrap()
    };
    let dir_arg = dir.to_str().unwrap();
    // Neither --ids nor --text.
    assert!(!run(&["--model", dir_arg]).status.success());
    let out = run(&["--model", dir_arg, "--ids", "5,99999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
    // Longer than the model's context (512 positions): refused, naming both.
    let long = vec!["5"; 1800].join(",");
    let out = run(&["--model", dir_arg, "--ids", &long]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "1,800 tokens were scored");
    assert!(err.contains("1800") && err.contains("512"), "{err}");
    let out = run(&["--model", "/nonexistent/colo-model", "--ids", "1,2"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such directory: /nonexistent/colo-model"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
