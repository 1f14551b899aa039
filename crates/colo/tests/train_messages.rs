//! What `colo train` says, run as a process on the tiny Qwen2 fixture:
//! failed rewards on the progress line and in the closing line, the last
//! progress line with the last evaluation, an error said once, a finished
//! run resumed writing nothing, and counts in the singular.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::RunToml;

fn tmp(name: &str) -> PathBuf {
    common::tmp("train-msg", name)
}

/// A run config on the fixture: 8 training rows, 4 held-out ones, 2
/// prompts × 2 samples a step; `reward` is its `[reward]` section, `more`
/// what the test changes.
fn run_toml(dir: &Path, reward: &str, more: &str) -> RunToml {
    let row = |i: usize| {
        format!(
            r#"{{"prompt": "Question: what is {i} + 1? Answer:", "answer": "{}"}}"#,
            i + 1
        )
    };
    let data = dir.join("train.jsonl");
    std::fs::write(&data, (0..8).map(row).collect::<Vec<_>>().join("\n")).unwrap();
    let val = dir.join("val.jsonl");
    std::fs::write(&val, (10..14).map(row).collect::<Vec<_>>().join("\n")).unwrap();
    common::fixture_run(&data)
        .with(&format!("[data]\nval_files = [\"{}\"]", val.display()))
        .with(reward)
        .with(more)
}

/// `run_toml(dir, reward, more)` written to `dir/run.toml`.
fn write_config(dir: &Path, reward: &str, more: &str) -> PathBuf {
    run_toml(dir, reward, more).write(&dir.join("run.toml"))
}

/// `colo train --config CONFIG --out OUT MORE…`.
fn train(config: &Path, out: &Path, more: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["train", "--config", config.to_str().unwrap()])
        .args(["--out", out.to_str().unwrap()])
        .args(more)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The progress bar's lines (stderr is not a terminal: plain lines).
fn progress_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with('[')).collect()
}

/// An external reward that answers garbage scores `default_score`, and
/// the run says how many samples it failed on: the progress line and the
/// closing line (the step's 2 × 2 samples, the final evaluation's 4), and
/// the closing "wrote" line names every file the run wrote, the samples'
/// directory (`trainer.rollout_data_dir`) included.
#[test]
fn failed_rewards_are_counted_on_the_progress_and_closing_lines() {
    let dir = tmp("failures");
    let script = dir.join("garbage.sh");
    std::fs::write(&script, "while read line; do echo 'not json'; done\n").unwrap();
    let reward = format!(
        "[reward]\nkind = \"external\"\ncommand = [\"sh\", \"{}\"]\ndefault_score = 0.0",
        script.display()
    );
    let config = write_config(
        &dir,
        &reward,
        "[trainer]\ntotal_steps = 1\nval_before_train = false\nrollout_data_dir = \"samples\"",
    );
    let out = dir.join("out");
    let o = train(&config, &out, &[]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stderr}");
    let last = *progress_lines(&stderr).last().expect("a progress line");
    assert!(
        last.contains("reward 0.000 (8 reward failures)"),
        "{stderr}"
    );
    let done = stdout.lines().find(|l| l.starts_with("done:")).unwrap();
    assert!(
        done.contains("; 8 reward failures (scored reward.default_score = 0);"),
        "{stdout}"
    );
    let wrote = stdout.lines().find(|l| l.starts_with("wrote ")).unwrap();
    let o = out.display();
    for f in [
        format!("{o}/metrics.jsonl"),
        format!("{o}/timeline.jsonl"),
        format!("{o}/memory_timeline.{{svg,png}}"),
        format!("{o}/memory_step.{{svg,png}}"),
        format!("{o}/reward_curve.{{svg,png}}"),
        format!("{o}/checkpoints/"),
        format!("{o}/config.toml"),
        format!("{o}/samples/ (every step's samples)"),
    ] {
        assert!(wrote.contains(&f), "{f} not in: {wrote}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The last progress line shows the evaluation at the end, as the closing
/// line does, not the one before it. The reward scores 0 for its first
/// 8 samples (the held-out 4 before training, the step's 4) and 1 after:
/// 0% before, 100% at the end.
#[test]
fn the_last_progress_line_has_the_last_evaluation() {
    let dir = tmp("last-eval");
    let script = dir.join("later.py");
    std::fs::write(
        &script,
        "import json, sys\nseen = 0\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
         seen += 1\n    print(json.dumps({'id': r['id'], 'score': float(seen > 8)}), flush=True)\n",
    )
    .unwrap();
    let reward = format!(
        "[reward]\nkind = \"external\"\ncommand = [\"python3\", \"{}\"]",
        script.display()
    );
    let config = write_config(&dir, &reward, "[trainer]\ntotal_steps = 1");
    let o = train(&config, &dir.join("out"), &[]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stderr}");
    let done = stdout.lines().find(|l| l.starts_with("done:")).unwrap();
    assert!(
        done.contains("held-out accuracy 0.0% -> 100.0%"),
        "{stdout}"
    );
    let lines = progress_lines(&stderr);
    let last = lines.last().expect("a progress line");
    assert!(
        last.contains("1/1") && last.contains("eval acc 100.0%"),
        "{stderr}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("1/1") && l.contains("eval acc 0.0%")),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A model that cannot be read is said once, as the run's error, not also
/// as a skipped plan check.
#[test]
fn an_unreadable_model_is_said_once() {
    let dir = tmp("no-model");
    let missing = dir.join("no-such-model");
    let config = run_toml(
        &dir,
        "[reward]\nkind = \"numeric\"",
        "[trainer]\ntotal_steps = 1",
    )
    .with(&format!("[model]\npath = \"{}\"", missing.display()))
    .write(&dir.join("run.toml"));
    let o = train(&config, &dir.join("out"), &[]);
    let stderr = text(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(!stderr.contains("plan check: skipped"), "{stderr}");
    assert_eq!(stderr.matches("no such directory").count(), 1, "{stderr}");
    assert!(
        !dir.join("out").exists(),
        "a run that never started left its directory"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--resume` of a finished run says there was nothing to do and names
/// no file written; a resume that drops one record says "1 record".
#[test]
fn resumes_say_what_they_did() {
    let dir = tmp("resume");
    let config = write_config(
        &dir,
        "[reward]\nkind = \"numeric\"",
        "[trainer]\ntotal_steps = 2\nsave_freq = 1\nval_before_train = false",
    );
    let out = dir.join("out");
    let o = train(&config, &out, &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("checkpoint every step"),
        "{}",
        text(&o.stderr)
    );

    let o = train(&config, &out, &["--resume"]);
    let stdout = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        stdout.contains(&format!(
            "done: nothing to do, the run in {} is complete (2 of 2 steps)",
            out.display()
        )) && !stdout.contains("wrote"),
        "{stdout}"
    );

    // Without step 2's checkpoint the resume starts from step 1 and drops
    // step 2's record (the evaluation at the end is recorded as step 2 too).
    std::fs::remove_dir_all(out.join("checkpoints/step-2")).unwrap();
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let kept: Vec<&str> = (metrics.lines())
        .filter(|l| !l.contains("\"eval/accuracy\""))
        .collect();
    std::fs::write(out.join("metrics.jsonl"), kept.join("\n") + "\n").unwrap();
    let o = train(&config, &out, &["--resume"]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("; removed 1 record after step 1 from metrics.jsonl"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
