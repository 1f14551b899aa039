//! `colo train --print-config` and the example config `configs/example.toml`
//! run as processes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use colo_rl::Config;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colo-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `colo train ARGS` from the repository root (the example's paths are
/// relative to it).
fn colo_train(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .current_dir(repo())
        .arg("train")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "colo train {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The printed config of `args`, written to a file and read back.
fn printed(args: &[&str], dir: &Path) -> Config {
    let out = colo_train(&[args, &["--print-config"]].concat());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\n[trainer]\n"), "{text}");
    let file = dir.join("printed.toml");
    std::fs::write(&file, &text).unwrap();
    // Read back from the repository root, as the original.
    let back = Command::new(env!("CARGO_BIN_EXE_colo"))
        .current_dir(repo())
        .args(["train", "--print-config", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(back.status.success());
    assert_eq!(
        String::from_utf8(back.stdout).unwrap(),
        text,
        "printing the printed config changes nothing"
    );
    Config::from_file(&file).unwrap()
}

#[test]
fn print_config_reads_back_to_the_same_config() {
    let dir = tmp("print");
    assert_eq!(printed(&[], &dir), Config::builtin());
    let example = repo().join("configs/example.toml");
    assert_eq!(
        printed(&["--config", "configs/example.toml"], &dir),
        Config::from_file(&example).unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_example_config_runs_on_the_fixtures() {
    let dir = tmp("example");
    let run = dir.join("run");
    let t = Instant::now();
    let out = colo_train(&[
        "--config",
        "configs/example.toml",
        "--out",
        run.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done: 3 steps"), "{stdout}");
    eprintln!("example run: {:?}", t.elapsed());
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(
        metrics
            .lines()
            .filter(|l| l.contains("\"actor/pg_loss\""))
            .count(),
        3,
        "{metrics}"
    );
    for picture in ["memory_timeline", "memory_step", "reward_curve"] {
        let png = std::fs::read(run.join(format!("{picture}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{picture}.png");
        let svg = std::fs::read_to_string(run.join(format!("{picture}.svg"))).unwrap();
        assert!(svg.contains("<svg"), "{picture}.svg");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// verl's data as they are: chat prompts in a parquet file (written by
/// pyarrow, `crates/rl/tests/data`), on a checkpoint whose tokenizer has a
/// chat template. The plan check renders the chats as the run does (it
/// used to read them without a tokenizer and skip itself).
/// A one-step `colo train` of verl's GSM8K parquet fixture on a copy of the
/// tiny checkpoint given a chat template, with `extra` appended to its
/// config; returns the directory, the run directory in it and the output.
fn verl_gsm8k_run(name: &str, extra: &str) -> (PathBuf, PathBuf, Output) {
    let dir = tmp(name);
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for f in std::fs::read_dir(repo().join("testdata/tiny-qwen2")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, model.join(f.file_name().unwrap())).unwrap();
    }
    let tc = model.join("tokenizer_config.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tc).unwrap()).unwrap();
    tok["chat_template"] = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into();
    std::fs::write(&tc, tok.to_string()).unwrap();
    let data = repo().join("crates/rl/tests/data/gsm8k-verl.parquet");
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[data]\ntrain_files = {data:?}\nval_files = {data:?}\n\
             answer_key = \"reward_model.ground_truth\"\ntrain_batch_size = 2\n\
             max_prompt_length = 500\n\
             [model]\npath = {model:?}\n\
             [rollout]\nn = 2\nmax_new_tokens = 4\nmax_kv_tokens = 4096\n\
             [trainer]\ntotal_steps = 1\nval_before_train = false\n{extra}"
        ),
    )
    .unwrap();
    let run = dir.join("run");
    let out = colo_train(&[
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    (dir, run, out)
}

#[test]
fn verl_parquet_chats_are_planned_and_run() {
    let (dir, _, out) = verl_gsm8k_run("verl-parquet", "");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stderr.contains("plan check: predicted peak"), "{stderr}");
    assert!(
        stderr.contains("data_source is \"openai/gsm8k\"")
            && stderr.contains("reward.kind = \"verl\" scores them as verl does"),
        "the default exact_match on verl's GSM8K rows gets a note: {stderr}"
    );
    assert!(stdout.contains("done: 1 step;"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// verl's `custom_reward_function`, as `reward.kind = "python"`: the user's
/// function is called for every training and held-out sample, with the
/// row's data_source, ground truth and extra_info and the configured
/// keyword arguments (it logs each call to the file named by one).
#[test]
fn a_verl_reward_function_scores_the_run() {
    let dir0 = tmp("verl-python-reward-files");
    let log = dir0.join("calls.jsonl");
    let reward = dir0.join("reward.py");
    std::fs::write(
        &reward,
        "import json\n\
         def compute_score(data_source, solution_str, ground_truth, extra_info=None, log=None):\n\
         \x20   print('debug print', solution_str)\n\
         \x20   with open(log, 'a') as f:\n\
         \x20       f.write(json.dumps([data_source, ground_truth, extra_info['index']]) + '\\n')\n\
         \x20   return {'score': 1.0, 'acc': True, 'extra': 'ignored'}\n",
    )
    .unwrap();
    let (dir, run, out) = verl_gsm8k_run(
        "verl-python-reward",
        &format!("[reward]\nkind = \"python\"\npath = {reward:?}\nkwargs = {{ log = {log:?} }}\n"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done: 1 step;"), "{stdout}");
    let calls: Vec<(String, String, u64)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // 2 prompts × n = 2 training samples, then one greedy sample for each
    // held-out row.
    let truths: Vec<String> =
        std::fs::read_to_string(repo().join("crates/rl/tests/data/gsm8k-verl.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["reward_model"]["ground_truth"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
    assert_eq!(calls.len(), 4 + truths.len(), "{calls:?}");
    for (source, truth, index) in &calls {
        assert_eq!(source, "openai/gsm8k");
        assert_eq!(truth, &truths[*index as usize], "{calls:?}");
    }
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("\"critic/score/mean\":1.0"), "{metrics}");
    // The held-out rows name their data_source: the evaluation is also
    // reported per source (one here), with the mean of the function's
    // numeric extra (`acc`; the text entry is left out), as verl reports
    // its reward_extra_info.
    let n = truths.len();
    assert!(
        metrics.contains(&format!(
            "\"eval/by_data_source\":{{\"openai/gsm8k\":{{\"accuracy\":1.0,\"score_mean\":1.0,\"n_samples\":{n},\"reward_extra\":{{\"acc\":1.0}}}}}}"
        )) && metrics.contains("\"eval/reward_extra\":{\"acc\":1.0}"),
        "{metrics}"
    );
    // So is each training step (TRL logs its reward functions' means every
    // step).
    let step = metrics
        .lines()
        .find(|l| l.contains("\"timing_s/step\""))
        .expect("a step record");
    assert!(step.contains("\"reward/extra\":{\"acc\":1.0}"), "{step}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir0);
}
