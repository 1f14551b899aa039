//! The library crates' diagnostics reach stderr through `colo`'s logger:
//! warnings by default, filtered by `COLO_LOG`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A copy of the tiny Qwen2 checkpoint whose config.json has one layer
/// fewer than its weights: it loads, with a warning naming the tensors
/// the model leaves unused.
fn checkpoint_with_unused_tensors(dir: &Path) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tiny-qwen2");
    for entry in std::fs::read_dir(&src).unwrap() {
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
