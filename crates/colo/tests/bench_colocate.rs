//! `colo bench colocate --json` run as a process with the smallest settings:
//! the four modes are measured and the capacity experiment tells the RFC's
//! story (sleep runs out of memory where staged fits).

use std::process::Command;

use serde_json::Value;

fn bench_colocate(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .args(["bench", "colocate", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "colo bench colocate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn four_modes_and_sleep_runs_out_where_staged_fits() {
    let r = bench_colocate(&[
        "--hidden",
        "64",
        "--layers",
        "2",
        "--prompts",
        "2",
        "--n",
        "2",
        "--warmup",
        "1",
        "--steps",
        "1",
    ]);
    let modes: Vec<&str> = r["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["naive", "restart", "sleep", "staged"]);
    for m in r["modes"].as_array().unwrap() {
        assert_eq!(m["fits"], true, "{m}");
        assert!(m["wake_peak_bytes"].as_u64().unwrap() > 0, "{m}");
        assert!(m["switch_to_rollout_s"].as_f64().unwrap() > 0.0, "{m}");
    }
    // Multi-stage awake saves about the trainer's weight bytes at the wake.
    let saving = r["targets"]["saving_vs_trainer_weights"].as_f64().unwrap();
    assert!(saving >= 0.9, "saving {saving} × trainer weights");

    let exp = &r["capacity_experiment"];
    assert!(
        exp["capacity_bytes"].as_u64().is_some(),
        "no capacity tried: {exp}"
    );
    assert_eq!(exp["sleep"]["fits"], false, "sleep should run out: {exp}");
    let error = exp["sleep"]["error"].as_str().unwrap();
    assert!(error.contains("out of device memory"), "{error}");
    assert_eq!(exp["staged"]["fits"], true, "staged should fit: {exp}");
    assert_eq!(exp["sleep_oom_staged_fits"], true);
}
