//! A data-parallel run is planned per worker: with `[cluster] sharding =
//! "full"`, `colo plan --config` and `colo train`'s plan check hold 1/N of
//! the trainer's parameters, gradients and optimizer state on each of the
//! N workers, and a capacity that only the sharded plan fits refuses the
//! replicated run before anything starts (no Ray cluster is started).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn colo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(args)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The built-in run on `workers` workers, with a KV cache of fixed size
/// and activation checkpointing (so that only the sharding differs), at
/// `capacity` bytes if given.
fn config(dir: &Path, workers: usize, sharding: &str, capacity: Option<u64>) -> PathBuf {
    let capacity = capacity.map_or(String::new(), |c| format!("[memory]\ncapacity = {c}\n"));
    let file = dir.join(format!("{sharding}-{workers}.toml"));
    let toml = format!(
        "[model]\nenable_gradient_checkpointing = true\n[rollout]\nmax_kv_tokens = 4096\n\
         {capacity}[cluster]\nworkers = {workers}\nsharding = \"{sharding}\"\n"
    );
    std::fs::write(&file, toml).unwrap();
    file
}

/// `colo plan --config FILE --json`.
fn plan(file: &Path) -> Value {
    let o = colo(&["plan", "--json", "--config", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Bytes of `component` in `phase` of a plan.
fn bytes(plan: &Value, phase: &str, component: &str) -> u64 {
    let phases = plan["phases"].as_array().unwrap();
    let p = phases.iter().find(|p| p["name"] == phase).unwrap();
    p["components"][component].as_u64().unwrap_or(0)
}

/// What the device must hold: the peak and its margin.
fn need(plan: &Value) -> u64 {
    plan["peak_bytes"].as_u64().unwrap() + plan["margin_bytes"].as_u64().unwrap()
}

/// Each worker of a sharded run holds 1/N of the trainer's state (up to
/// each unit's padding) and the gathered root unit and layer; its
/// `peak_bytes` is that worker's, below a replica's; the text says whose.
#[test]
fn a_sharded_run_is_planned_per_worker() {
    let dir = common::tmp("plan-sharded", "per-worker");
    let none = plan(&config(&dir, 2, "none", None));
    let state = ["train_params", "train_grads", "optimizer"];
    let mut peaks = vec![none["peak_bytes"].as_u64().unwrap()];
    for n in [2u64, 4] {
        let full = plan(&config(&dir, n as usize, "full", None));
        for c in state {
            let (whole, part) = (bytes(&none, "training", c), bytes(&full, "training", c));
            assert!(whole > 0, "{c}");
            // A few elements of padding in each of the built-in model's units.
            assert!(
                whole <= part * n && part * n <= whole + whole / 100,
                "{c} over {n}: {part} × {n} against {whole}"
            );
        }
        assert_eq!(bytes(&none, "training", "fsdp_gathered"), 0);
        assert!(bytes(&full, "training", "fsdp_gathered") > 0);
        // The reference stays whole.
        assert_eq!(
            bytes(&full, "ref_logprob", "ref_params"),
            bytes(&none, "ref_logprob", "ref_params")
        );
        let peak = full["peak_bytes"].as_u64().unwrap();
        let phase = full["peak_phase"].as_str().unwrap();
        let mut phases = full["phases"].as_array().unwrap().iter();
        let at_peak = phases.find(|p| p["name"] == phase).unwrap();
        assert_eq!(at_peak["total_bytes"].as_u64(), Some(peak));
        peaks.push(peak);
    }
    assert!(peaks[0] > peaks[1] && peaks[1] > peaks[2], "{peaks:?}");
    let file = config(&dir, 2, "full", None);
    let o = colo(&["plan", "--config", file.to_str().unwrap()]);
    let said = text(&o.stdout);
    assert!(
        said.starts_with("colo train run, per worker (2 workers, sharding full): "),
        "{said}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A capacity between the sharded and the replicated per-worker plan: the
/// plan check refuses the replicated run before anything starts (naming
/// the sharding as a way out), and the sharded one fits it.
#[test]
fn a_capacity_only_the_sharded_plan_fits_refuses_the_replicated_run() {
    let dir = common::tmp("plan-sharded", "capacity");
    let none = need(&plan(&config(&dir, 2, "none", None)));
    let full = need(&plan(&config(&dir, 2, "full", None)));
    assert!(full < none, "{full} {none}");
    let capacity = (full + none) / 2;
    let sharded = plan(&config(&dir, 2, "full", Some(capacity)));
    assert_eq!(sharded["fits"], true);
    assert_eq!(
        plan(&config(&dir, 2, "none", Some(capacity)))["fits"],
        false
    );

    let out = dir.join("out");
    let file = config(&dir, 2, "none", Some(capacity));
    let o = colo(&[
        "train",
        "--config",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = text(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("the run cannot fit a worker's device")
            && stderr.contains("per worker (2 workers, sharding none)")
            && stderr.contains("[cluster] sharding = \"full\""),
        "{stderr}"
    );
    assert!(!out.exists(), "the run started");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `colo plan reshard --config`: a sharded run's reshard per worker and
/// switch, the built-in model's units padded to the workers; the
/// zero-redundancy ideal is colo's at `tg = 1`. A replicated run moves no
/// weights between workers and is refused, saying so.
#[test]
fn a_sharded_runs_reshard_is_planned_from_its_config() {
    let dir = common::tmp("plan-sharded", "reshard");
    let reshard = |file: &Path| {
        colo(&[
            "plan",
            "reshard",
            "--json",
            "--config",
            file.to_str().unwrap(),
        ])
    };
    for n in [2u64, 4] {
        let o = reshard(&config(&dir, n as usize, "full", None));
        assert!(o.status.success(), "{}", text(&o.stderr));
        let p: Value = serde_json::from_slice(&o.stdout).unwrap();
        let m = p["model_bytes"].as_u64().unwrap();
        assert_eq!(
            (p["workers"].as_u64(), p["gen_tp"].as_u64()),
            (Some(n), Some(1))
        );
        let got = p["executed"]["received_bytes"].as_u64().unwrap();
        let units = p["shard_elements"].as_array().unwrap().len() as u64;
        let elt = if p["dtype"] == "f32" { 4 } else { 2 };
        let floor = m * (n - 1) / n;
        assert!(
            floor <= got && got <= floor + units * (n - 1) * elt,
            "{n}: {got} against {floor}"
        );
        assert_eq!(p["executed"]["sent_bytes"].as_u64(), Some(got));
        assert_eq!(p["zero_redundancy"]["received_bytes"].as_u64(), Some(got));
    }
    let o = reshard(&config(&dir, 2, "none", None));
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("moves no weights"),
        "{}",
        text(&o.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}
