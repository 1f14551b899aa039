//! The library crates' diagnostics reach stderr through `colo`'s logger:
//! warnings and errors by default, filtered by `COLO_LOG`; the run's own
//! report and error stay at every level.

use std::path::Path;
use std::process::{Command, Output};

mod common;

/// A copy of the tiny Qwen2 checkpoint whose config.json has one layer
/// fewer than its weights: it loads, with a warning naming the tensors
/// the model leaves unused.
fn checkpoint_with_unused_tensors(dir: &Path) {
    for entry in std::fs::read_dir(common::fixture()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["num_hidden_layers"] = 1.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

fn score(dir: &Path, colo_log: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_colo"));
    cmd.args(["score", "--model", dir.to_str().unwrap(), "--ids", "1,2,3"]);
    cmd.env_remove("COLO_LOG");
    if let Some(filter) = colo_log {
        cmd.env("COLO_LOG", filter);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "colo score failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_library_warning_reaches_stderr_unless_filtered() {
    let tmp = tempfile::tempdir().unwrap();
    checkpoint_with_unused_tensors(tmp.path());
    let stderr = String::from_utf8(score(tmp.path(), None).stderr).unwrap();
    let dir_name = tmp.path().file_name().unwrap().to_str().unwrap();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("tensors of the checkpoint are not used"))
        .collect();
    assert!(
        matches!(&lines[..], [line] if line.starts_with("colo: warning: ")
            && line.contains(dir_name)
            && line.contains("model.layers.1.")),
        "{stderr}"
    );
    let quiet = score(tmp.path(), Some("error")).stderr;
    assert!(
        !String::from_utf8_lossy(&quiet).contains("not used"),
        "{}",
        String::from_utf8_lossy(&quiet)
    );
}

/// A run on the fixture whose reward always fails (the run ends in an
/// error at step 1) and whose memory picture cannot be written (a
/// directory has its name): colo-rl reports the picture it could not write
/// as a diagnostic, beside the run's error. One of its prompts is too long,
/// which the run reports as it reads its data.
fn train_with_unwritable_pictures(dir: &Path, colo_log: Option<&str>) -> Output {
    let rows: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#"{{"prompt": "Question: what is {i} + 1? Answer:", "answer": "{}"}}"#,
                i + 1
            )
        })
        .collect();
    let long = r#"{"prompt": "1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1? Answer:", "answer": "21"}"#;
    let data = dir.join("train.jsonl");
    std::fs::write(&data, format!("{}\n{long}", rows.join("\n"))).unwrap();
    let config = common::fixture_run(&data)
        .with(
            r#"
[data]
val_fraction = 0.25
max_prompt_length = 32
filter_overlong_prompts = true

[reward]
kind = "external"
command = ["python3", "-c", "import sys; sys.exit(3)"]

[trainer]
total_steps = 1
val_before_train = false
"#,
        )
        .write(&dir.join("run.toml"));
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(out.join("memory_timeline.svg")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_colo"));
    cmd.args(["train", "--config", config.to_str().unwrap()]);
    cmd.args(["--out", out.to_str().unwrap()]);
    cmd.env_remove("COLO_LOG");
    if let Some(filter) = colo_log {
        cmd.env("COLO_LOG", filter);
    }
    cmd.output().unwrap()
}

#[test]
fn a_run_diagnostic_reaches_stderr_unless_filtered() {
    let tmp = tempfile::tempdir().unwrap();
    let out = train_with_unwritable_pictures(tmp.path(), None);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("could not write the run's pictures"))
        .collect();
    assert!(
        matches!(&lines[..], [line] if line.starts_with("colo: error: ")
            && line.contains("memory_timeline.svg")),
        "{stderr}"
    );
    // The run's own error and report are not diagnostics: they stay, as
    // they were.
    let report = "\ndata: left out 1 of 9 prompts of ";
    assert!(stderr.contains("\nerror: colo train: step 1: "), "{stderr}");
    assert!(stderr.contains(report), "{stderr}");
    let quiet = train_with_unwritable_pictures(tmp.path(), Some("off"));
    let quiet = String::from_utf8(quiet.stderr).unwrap();
    assert!(!quiet.contains("pictures"), "{quiet}");
    assert!(quiet.contains("\nerror: colo train: step 1: "), "{quiet}");
    assert!(quiet.contains(report), "{quiet}");
}
