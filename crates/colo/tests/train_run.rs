//! `colo train` run as a process on the tiny Qwen2 fixture: the summary
//! names the `--out` directory, a checkpoint is a model `colo generate`
//! loads, and a config that colo-plan predicts cannot fit is refused before
//! anything is loaded, with the plan's phase table.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

use common::RunToml;

fn tmp(name: &str) -> PathBuf {
    common::tmp("train-run", name)
}

/// A one-step run config on the fixture with `capacity`; its four
/// held-out rows name two data sources.
fn run_toml(dir: &Path, capacity: &str) -> RunToml {
    let row = |i: usize, source: &str| {
        format!(
            r#"{{"prompt": "Question: what is {i} + 1? Answer:", "answer": "{}", "data_source": "{source}"}}"#,
            i + 1
        )
    };
    let data = dir.join("train.jsonl");
    let lines: Vec<String> = (0..8).map(|i| row(i, "train")).collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let val = dir.join("val.jsonl");
    let lines: Vec<String> = (10..14)
        .map(|i| row(i, if i < 12 { "small" } else { "large" }))
        .collect();
    std::fs::write(&val, lines.join("\n")).unwrap();
    common::fixture_run(&data).with(&format!(
        r#"
[data]
val_files = ["{val}"]

[memory]
capacity = "{capacity}"

[trainer]
total_steps = 1
val_before_train = false
"#,
        val = val.display(),
    ))
}

/// `run_toml(dir, capacity)` written to `dir/run.toml`.
fn write_config(dir: &Path, capacity: &str) -> PathBuf {
    run_toml(dir, capacity).write(&dir.join("run.toml"))
}

fn colo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(args)
        .output()
        .unwrap()
}

/// `colo train --config CONFIG --out OUT MORE…`.
fn train(config: &Path, out: &Path, more: &[&str]) -> Output {
    let (config, out) = (config.to_str().unwrap(), out.to_str().unwrap());
    colo(&[&["train", "--config", config, "--out", out], more].concat())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_summary_names_out_and_checkpoints_load_in_colo_generate() {
    let dir = tmp("generate");
    let config = write_config(&dir, "256MiB");
    let out = dir.join("out1");
    let o = train(&config, &out, &[]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "colo train failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("out {}", out.display())) && !stderr.contains("runs/colo"),
        "the summary names another directory:\n{stderr}"
    );
    assert!(stderr.contains("plan check: predicted peak"), "{stderr}");
    assert!(
        stdout.contains(&format!("wrote {}/metrics.jsonl", out.display())),
        "{stdout}"
    );
    // The held-out rows name two sources: the closing line gives each its
    // accuracy (0 or 50 or 100% of two rows), in name order.
    let line = stdout.lines().find(|l| l.starts_with("done:")).unwrap();
    let after = line
        .split_once("(by data_source: large ")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no per-source accuracy: {line}"));
    assert!(
        ["0.0%, small ", "50.0%, small ", "100.0%, small "]
            .iter()
            .any(|p| after.starts_with(p)),
        "{line}"
    );

    let ckpt = out.join("checkpoints/step-1");
    let o = colo(&[
        "generate",
        "--model",
        ckpt.to_str().unwrap(),
        "--prompt",
        "Question: what is 2 + 1? Answer:",
        "--greedy",
        "--max-new-tokens",
        "4",
        "--json",
    ]);
    assert!(
        o.status.success(),
        "colo generate on {}:\n{}",
        ckpt.display(),
        text(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tokens = v["completions"][0]["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty() && tokens.len() <= 4, "{v}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Run again, a run without a named directory writes a numbered one
/// (`runs/colo-2`); one into a named directory that holds a run is refused,
/// and that run is left as it was.
#[test]
fn a_second_run_never_overwrites_the_first() {
    let dir = tmp("again");
    let config = write_config(&dir, "256MiB");
    let in_dir = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_colo"))
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let args = ["train", "--config", config.to_str().unwrap()];
    for _ in 0..2 {
        let out = in_dir(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stderr = String::from_utf8_lossy(&in_dir(&args).stderr).into_owned();
    assert!(
        stderr.contains("runs/colo holds an earlier run: this one writes into runs/colo-3"),
        "{stderr}"
    );
    for run in ["runs/colo", "runs/colo-2", "runs/colo-3"] {
        assert!(dir.join(run).join("config.toml").is_file(), "{run}");
        assert!(dir.join(run).join("checkpoints/step-1").is_dir(), "{run}");
    }
    let metrics = std::fs::read(dir.join("runs/colo/metrics.jsonl")).unwrap();
    let named = in_dir(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        "runs/colo",
    ]);
    let stderr = String::from_utf8_lossy(&named.stderr);
    assert!(
        !named.status.success()
            && stderr.contains("runs/colo already holds a run (checkpoints/step-1; 1 step and 1 evaluation in metrics.jsonl): --resume continues it"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(dir.join("runs/colo/metrics.jsonl")).unwrap(),
        metrics
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_the_plan_says_cannot_fit_is_refused_before_loading() {
    let dir = tmp("refuse");
    let config = write_config(&dir, "1MiB");
    let out = dir.join("out");
    let o = train(&config, &out, &[]);
    let stderr = text(&o.stderr);
    assert!(
        !o.status.success(),
        "a run that cannot fit was not refused:\n{stderr}"
    );
    for want in [
        "phase",
        "training",
        "<- peak",
        "memory.capacity",
        "--no-plan-check",
    ] {
        assert!(stderr.contains(want), "`{want}` missing:\n{stderr}");
    }
    assert!(
        !out.join("metrics.jsonl").exists(),
        "it ran before refusing"
    );
    // A capacity too small for the engine's weights and one KV block is
    // refused in the run's own keys (the planner's is `kv_free_fraction`).
    let config = run_toml(&dir, "1KiB")
        .without("rollout", "max_kv_tokens")
        .with("[rollout]\nmem_fraction = 0.5")
        .write(&dir.join("run.toml"));
    let o = train(&config, &out, &[]);
    let stderr = text(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("with memory.capacity = 1.0 KiB, colo-plan: invalid rollout.mem_fraction"),
        "{stderr}"
    );
    assert!(config.is_file() && !out.join("metrics.jsonl").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every file under `dir` with its bytes, sorted.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            match p.is_dir() {
                true => stack.push(p),
                false => out.push((p.clone(), std::fs::read(&p).unwrap())),
            }
        }
    }
    out.sort();
    out
}

/// `--resume` without `--config` continues the run as its directory
/// recorded it (it ran the built-in job's config, which replaced
/// `config.toml`, wrote `base/` and `data/` and failed on the checkpoint's
/// shapes), and leaves the record as it was. A resume under another
/// model's config (`--config` of the built-in job) is refused naming the
/// mismatch, and changes nothing.
#[test]
fn resume_without_config_continues_the_recorded_run() {
    let dir = tmp("resume-record");
    let config = run_toml(&dir, "256MiB")
        .with("[trainer]\ntotal_steps = 3\nsave_freq = 1")
        .write(&dir.join("run.toml"));
    let out = dir.join("out");
    let o = train(&config, &out, &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Killed while saving its last checkpoint: step 3 is recorded, its
    // checkpoint is not.
    std::fs::remove_dir_all(out.join("checkpoints/step-3")).unwrap();
    let record = std::fs::read(out.join("config.toml")).unwrap();

    let o = colo(&["train", "--out", out.to_str().unwrap(), "--resume"]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let recorded = format!(
        "configuration: {}/config.toml (the run's record)",
        out.display()
    );
    assert!(
        stderr.contains(&recorded) && stderr.contains("(step 2 of 3)"),
        "{stderr}"
    );
    assert!(!stderr.contains("differs"), "{stderr}");
    assert_eq!(metrics_steps(&out), vec![1, 2, 3]);
    assert!(out.join("checkpoints/step-3/model.safetensors").is_file());
    assert!(
        std::fs::read(out.join("config.toml")).unwrap() == record,
        "config.toml changed"
    );
    for made in ["base", "data"] {
        assert!(!out.join(made).exists(), "{made}/ was written");
    }

    std::fs::remove_dir_all(out.join("checkpoints/step-3")).unwrap();
    let before = snapshot(&out);
    let builtin = dir.join("builtin.toml");
    std::fs::write(&builtin, "").unwrap();
    let o = train(&builtin, &out, &["--resume"]);
    let stderr = text(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("step-2 holds another model than the built-in model (no model.path)")
            && stderr.contains("hidden_size (64, not 128)")
            && stderr.contains(&format!("reads {}/config.toml", out.display())),
        "{stderr}"
    );
    assert!(snapshot(&out) == before, "a refused resume changed files");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A `rollout.n` or a sequence that the KV cache cannot hold is refused
/// by the plan check, before anything starts (n = 100000 passed it, ran
/// the step-0 evaluation, and failed in the engine).
#[test]
fn a_kv_cache_too_small_for_the_rollouts_is_refused_before_anything_starts() {
    let dir = tmp("kv-fit");
    let toml = run_toml(&dir, "256MiB");
    let out = dir.join("out");
    let cases = [
        (
            "[rollout]\nn = 100000",
            "rollout.n = 100000 samples of a prompt need a KV block each at least, and the KV \
             cache holds 16 blocks of 16 tokens (rollout.max_kv_tokens = 256)",
        ),
        (
            "[rollout]\nmax_kv_tokens = 32\nmax_new_tokens = 64",
            "KV blocks, and the KV cache holds 2 blocks of 16 tokens (rollout.max_kv_tokens = 32)",
        ),
    ];
    for (change, want) in cases {
        let config = toml.with(change).write(&dir.join("run.toml"));
        let o = train(&config, &out, &[]);
        let stderr = text(&o.stderr);
        assert!(!o.status.success(), "{stderr}");
        assert!(
            stderr.contains("the KV cache cannot serve the run's rollouts")
                && stderr.contains(want),
            "{stderr}"
        );
        assert!(!out.exists(), "{change:?}: the run started");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The steps of `metrics.jsonl`'s step records (not its evaluations').
fn metrics_steps(out: &Path) -> Vec<u64> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("timing_s/step").is_some())
        .filter_map(|v| v["training/global_step"].as_u64())
        .collect()
}

/// `colo train --config config --out out` started, once it has logged a
/// step.
fn start_and_wait_for_a_step(config: &Path, out: &Path) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["train", "--config", config.to_str().unwrap()])
        .args(["--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while metrics_steps(out).is_empty() {
        assert!(start.elapsed().as_secs() < 300, "no step in 300 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}

/// Sends `child` the signal `sig` (`-INT`, `-TERM`) with kill(1).
fn signal(child: &std::process::Child, sig: &str) {
    let kill = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// Ctrl-C (SIGINT) stops a run after the step under way, with a checkpoint
/// of it and status 130, naming the command that resumes; `--resume` then
/// continues from it without repeating or skipping a step.
#[test]
fn an_interrupted_run_saves_its_steps_and_resumes() {
    let dir = tmp("interrupt");
    let toml = run_toml(&dir, "256MiB");
    let config = (toml.with("[trainer]\ntotal_steps = 100000")).write(&dir.join("run.toml"));
    let out = dir.join("out");
    let child = start_and_wait_for_a_step(&config, &out);
    signal(&child, "-INT");
    let o = child.wait_with_output().unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{stderr}");
    let done = metrics_steps(&out);
    let k = done.len();
    assert_eq!(done, (1..=k as u64).collect::<Vec<_>>());
    assert!(
        stderr.contains(&format!("stopped at your request after step {k} of 100000"))
            && stderr.contains("--resume"),
        "{stderr}"
    );
    let ckpt = out.join(format!("checkpoints/step-{k}"));
    assert!(
        ckpt.join("model.safetensors").is_file(),
        "{}",
        ckpt.display()
    );

    toml.with(&format!("[trainer]\ntotal_steps = {}", k + 1))
        .write(&config);
    let o = train(&config, &out, &["--resume"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(metrics_steps(&out), (1..=k as u64 + 1).collect::<Vec<_>>());
    std::fs::remove_dir_all(dir).unwrap();
}

/// Ctrl-C during a dynamic sampling step that is still drawing batches
/// (none of its groups varies: the random model never answers right)
/// ends the run there, with status 130 and a message saying that no
/// checkpoint of that step was written.
#[test]
fn ctrl_c_ends_a_step_still_drawing_generation_batches() {
    use std::io::BufRead;
    let dir = tmp("interrupt-ds");
    let config = run_toml(&dir, "256MiB")
        .with("[algorithm.filter_groups]\nenable = true\nmax_num_gen_batches = 0")
        .write(&dir.join("run.toml"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["train", "--config", config.to_str().unwrap()])
        .args(["--out", dir.join("out").to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            tx.send(line.unwrap()).unwrap();
        }
    });
    let mut said = String::new();
    while !said.contains("generating more") {
        let line = rx.recv_timeout(std::time::Duration::from_secs(300));
        said += &line.expect("no tenth generation batch in 300 s");
        said.push('\n');
    }
    signal(&child, "-INT");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed().as_secs() > 120 {
            child.kill().unwrap();
            panic!("still drawing batches 120 s after the interrupt: {said}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    reader.join().unwrap();
    said.extend(rx.try_iter().map(|l| l + "\n"));
    assert_eq!(status.code(), Some(130), "{said}");
    assert!(
        said.contains("stopped at your request before the step could finish")
            && said.contains("no checkpoint of it was written"),
        "{said}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A second signal stops the run at once, with status 130 and without a
/// panic or a crash (libtorch's threads are not torn down under it), and
/// the checkpoints already written stay complete.
#[test]
fn a_second_interrupt_stops_at_once_and_cleanly() {
    let dir = tmp("interrupt-twice");
    let config = run_toml(&dir, "256MiB")
        .with("[trainer]\ntotal_steps = 100000")
        .write(&dir.join("run.toml"));
    let out = dir.join("out");
    let child = start_and_wait_for_a_step(&config, &out);
    for _ in 0..2 {
        signal(&child, "-TERM");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let o = child.wait_with_output().unwrap();
    let stderr = text(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{stderr}");
    // (The step under way may end between the two signals: then the run
    // stops as after one.)
    assert!(
        (stderr.contains("stopped now") || stderr.contains("stopped at your request"))
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
