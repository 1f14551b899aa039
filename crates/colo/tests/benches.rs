//! `colo bench …` run as processes with the smallest settings. Colocate:
//! the four modes are measured and the capacity experiment tells the RFC's
//! story (sleep runs out of memory where staged fits). Train and rollout:
//! each side of the comparison really ran, and `--device` is checked;
//! rollout also on a model directory (`--model`, the tiny-qwen2 fixture).

use std::process::{Command, Output};

use serde_json::Value;

mod common;

fn colo_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_colo"))
        .arg("bench")
        .args(args)
        .output()
        .unwrap()
}

/// `colo bench <args> --json`, which must succeed.
fn bench_json(args: &[&str]) -> Value {
    let out = colo_bench(&[args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "colo bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn bench_colocate(args: &[&str]) -> Value {
    bench_json(&[&["colocate"], args].concat())
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

#[test]
fn bench_train_trains_in_both_dtypes_against_a_measured_matmul() {
    let r = bench_json(&[
        "train",
        "--batch",
        "2",
        "--seq",
        "16",
        "--micro-batch",
        "1",
        "--steps",
        "3",
        "--hidden",
        "64",
        "--layers",
        "1",
    ]);
    assert_eq!(r["device"], "cpu");
    // Embeddings 8192 × 64 (tied); one layer: q, k, v 64 × 64 with biases,
    // o 64 × 64, an MLP of 3 × 64 × 192, two norms; the final norm.
    let layer = 3 * (64 * 64 + 64) + 64 * 64 + 3 * 64 * 192 + 2 * 64;
    assert_eq!(r["parameters"], 8192 * 64 + layer + 64);
    let runs = r["runs"].as_array().unwrap();
    let dtypes: Vec<&str> = runs.iter().map(|x| x["dtype"].as_str().unwrap()).collect();
    assert_eq!(dtypes, ["f32", "bf16"]);
    for x in runs {
        assert!(x["step_s"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["matmul_gflop_s"].as_f64().unwrap() > 0.0, "{x}");
        // The same batch three times: the loss falls.
        assert!(x["loss_last"].as_f64() < x["loss_first"].as_f64(), "{x}");
        assert!(x["train_grads_bytes"].as_u64().unwrap() > 0, "{x}");
    }
    let (f, b) = (runs[0]["step_s"].as_f64(), runs[1]["step_s"].as_f64());
    let speedup = r["bf16_speedup"].as_f64().unwrap();
    assert!(
        (speedup - f.unwrap() / b.unwrap()).abs() < 1e-9,
        "{speedup}"
    );
}

#[test]
fn bench_rollout_runs_both_engines_on_the_same_load() {
    let r = bench_json(&[
        "rollout",
        "--prompts",
        "2",
        "--n",
        "2",
        "--max-new-tokens",
        "8",
        "--batch",
        "4",
    ]);
    assert_eq!(r["device"], "cpu");
    let colo = r["generated_tokens"].as_u64().unwrap();
    let base = r["baseline_generated_tokens"].as_u64().unwrap();
    // 4 samples of 1 to 8 tokens each, on both sides.
    for t in [colo, base] {
        assert!((4..=32).contains(&t), "{r}");
    }
    let speedup = r["speedup"].as_f64().unwrap();
    let ratio = r["tokens_per_s"].as_f64().unwrap() / r["baseline_tokens_per_s"].as_f64().unwrap();
    assert!((speedup - ratio).abs() < 1e-9, "{r}");
    // The baseline runs at libtorch's default thread count (this test
    // process's, which sets none), not at the one thread `colo` sets for
    // its own passes at start.
    assert_eq!(r["baseline_threads"], tch::get_num_threads(), "{r}");
}

/// `--model`: both engines load the fixture's weights and, drawing the
/// same uniforms on the same logits, generate the same tokens; prompts'
/// ids stay within its 384-id vocabulary (an id past it would fail the
/// embedding lookup).
#[test]
fn bench_rollout_loads_a_model_directory_into_both_engines() {
    let dir = common::fixture();
    let dir = dir.to_str().unwrap();
    let r = bench_json(&[
        "rollout",
        "--model",
        dir,
        "--prompts",
        "3",
        "--n",
        "2",
        "--max-new-tokens",
        "16",
        "--batch",
        "4",
    ]);
    assert_eq!(r["model"], dir, "{r}");
    assert_eq!(r["dtype"], "f32", "{r}");
    // tiny-qwen2: embeddings 384 × 64 (tied); two layers of q, k, v
    // (4 and 2 heads of 16) with biases, o, an MLP of 3 × 64 × 160, two
    // norms; the final norm.
    let layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 160 + 2 * 64;
    assert_eq!(r["model_parameters"], 384 * 64 + 2 * layer + 64, "{r}");
    let colo = r["generated_tokens"].as_u64().unwrap();
    assert!((6..=96).contains(&colo), "{r}");
    assert_eq!(r["baseline_generated_tokens"], colo, "{r}");

    let out = colo_bench(&["rollout", "--model", dir, "--prompts", "1", "--n", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("0.111168 M-parameter model {dir} (f32)")),
        "{text}"
    );
}

/// `--model` that is no model directory, or a config.json that is no
/// model's, is refused naming the path and what was expected.
#[test]
fn bench_rollout_refuses_a_directory_that_is_no_model() {
    let fixture = common::fixture();
    let empty = common::tmp("benches", "empty-model");
    let broken = common::tmp("benches", "broken-model");
    std::fs::write(broken.join("config.json"), r#"{"model_type": "qwen2"}"#).unwrap();
    let (empty, broken) = (empty.to_str().unwrap(), broken.to_str().unwrap());
    for (dir, expected) in [
        (
            "/no/such/model".to_owned(),
            "--model /no/such/model: no such directory: /no/such/model".to_owned(),
        ),
        (
            empty.to_owned(),
            format!(
                "--model {empty}: no config.json in it (expected a Hugging Face model directory"
            ),
        ),
        (
            broken.to_owned(),
            format!(
                "--model {broken}: cannot parse {broken}/config.json: missing field `vocab_size`"
            ),
        ),
    ] {
        refused(&["rollout", "--model", &dir], &expected);
    }
    refused(
        &[
            "rollout",
            "--model",
            fixture.to_str().unwrap(),
            "--stop-tokens",
            "384",
        ],
        "--stop-tokens 384: the model's vocabulary has 384 ids",
    );
    std::fs::remove_dir_all(empty).unwrap();
    std::fs::remove_dir_all(broken).unwrap();
}

/// `colo bench lora` on the tiny-qwen2 fixture: both sides measured at
/// every rank and load, the same tokens generated by each, and bad
/// `--loads` and `--targets` refused by name.
#[test]
fn bench_lora_measures_merging_against_adapters_at_decode() {
    let dir = common::fixture();
    let dir = dir.to_str().unwrap();
    let r = bench_json(&[
        "lora",
        "--model",
        dir,
        "--ranks",
        "2,4",
        "--loads",
        "1x2x3,2x1x5",
        "--repeats",
        "1",
        "--rollouts",
        "1",
        "--dtype",
        "f32",
    ]);
    assert_eq!(r["dtype"], "f32", "{r}");
    assert!(r["load_avg_start"].as_f64().is_some(), "{r}");
    let ranks = r["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2, "{r}");
    for (k, rank) in ranks.iter().zip([2, 4]) {
        assert_eq!(k["rank"], rank, "{k}");
        // A and B on the 7 projections of 2 layers: rank × (in + out).
        let per_layer = (64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 160) + (160 + 64);
        assert_eq!(k["adapter_parameters"], 2 * rank * per_layer, "{k}");
        for s in ["merged_switch", "copy_switch", "adapters_switch"] {
            assert!(k[s]["seconds"].as_f64().unwrap() > 0.0, "{s}: {k}");
        }
        let loads = k["loads"].as_array().unwrap();
        for (l, tokens) in loads.iter().zip([6, 10]) {
            assert_eq!(l["merged"]["tokens"], tokens, "{l}");
            assert_eq!(l["decode"]["tokens"], tokens, "{l}");
            assert!(l["decode"]["seconds"].as_f64().unwrap() > 0.0, "{l}");
            let even = &l["break_even_tokens"];
            assert!(even.is_null() || even.as_f64().unwrap() >= 0.0, "{l}");
        }
    }
    refused(
        &["lora", "--loads", "4x4"],
        "expected PROMPTSxNxTOKENS of positive whole numbers",
    );
    refused(
        &["lora", "--targets", "qkv"],
        "`qkv` is not one of all-linear",
    );
}

/// `colo bench <args>` fails and says `expected` on stderr.
fn refused(args: &[&str], expected: &str) {
    let out = colo_bench(args);
    assert!(!out.status.success(), "colo bench {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(expected), "colo bench {args:?}: {err}");
}

#[test]
fn a_bench_model_without_whole_heads_is_refused() {
    refused(
        &["train", "--hidden", "100"],
        "--hidden must be a positive multiple of 64",
    );
}

/// Shapes the bench's model or batch cannot take are refused by flag; one
/// too large for the machine is an error naming the flags (the baseline's
/// product panicked before).
#[test]
fn bench_train_shapes_are_refused_by_flag() {
    for (args, expected) in [
        (&["train", "--seq", "1"][..], "--seq 1: at least 2 tokens"),
        (&["train", "--seq", "8192"], "--seq 8192: the benchmark model has 4096 positions"),
        (&["train", "--batch", "2", "--micro-batch", "8"], "--micro-batch 8 is more rows than --batch 2 has"),
        (&["train", "--dtype", "f32,float32"], "--dtype: `f32` and `float32` are the same dtype"),
        (
            &["train", "--hidden", "64", "--layers", "1", "--batch", "65536", "--seq", "4096", "--dtype", "f32"],
            "the f32 run (--hidden 64 --layers 1, --batch 65536 × --seq 4096 = 268435456 tokens a step)",
        ),
    ] {
        refused(args, expected);
    }
}

/// Counts are refused by name outside their bounds: zero, and sizes that
/// aborted an allocation, panicked in an overflow or spawned 100,000
/// threads before they were bounded.
#[test]
fn counts_out_of_bounds_are_refused_by_name() {
    for (args, expected) in [
        (&["rollout", "--prompts", "0"][..], "'0' for '--prompts <PROMPTS>': must be in 1..=65536"),
        (&["rollout", "--prompts", "18446744073709551615"], "for '--prompts <PROMPTS>': must be in"),
        (&["rollout", "--baseline-threads", "100000"], "for '--baseline-threads <BASELINE_THREADS>': must be in 0..=1024"),
        (&["train", "--seq", "100000000000"], "for '--seq <SEQ>': must be in 1..=1048576"),
        (&["mem", "--size-mib", "18446744073709551615"], "for '--size-mib <SIZE_MIB>': must be in"),
        (&["mem", "--soak-size-mib", "0"], "for '--soak-size-mib <SOAK_SIZE_MIB>': must be in 1..="),
        (&["colocate", "--n", "1"], "'1' for '--n <N>': must be in 2..=4096"),
        (&["colocate", "--prompts", "x"], "'x' for '--prompts <PROMPTS>': invalid digit found in string (expected a whole number)"),
    ] {
        refused(args, expected);
    }
}

/// A capacity no mode fits in is an error (it printed a report of four
/// out-of-memory runs and exited 0).
#[test]
fn a_capacity_no_mode_fits_is_refused() {
    refused(
        &["colocate", "--capacity", "1 KiB"],
        "--capacity 1 KiB: no colocation mode fits",
    );
}

#[test]
fn a_device_other_than_cpu_or_cuda_is_refused_by_name() {
    for bench in ["train", "rollout"] {
        refused(
            &[bench, "--device", "tpu"],
            "--device must be cpu or cuda, got \"tpu\"",
        );
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_check_in_a_build_without_cuda_says_so() {
    let out = Command::new(env!("CARGO_BIN_EXE_colo"))
        .arg("gpu-check")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("FAIL  device   this colo was built without the `cuda` feature"),
        "{text}"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_in_a_build_without_it_says_how_to_build_it() {
    for bench in ["train", "rollout"] {
        refused(
            &[bench, "--device", "cuda"],
            "built without the `cuda` feature",
        );
    }
}
