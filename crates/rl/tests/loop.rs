//! The RL loop end to end on a tiny checkpoint with a user's JSONL data:
//! the run directory's files, and `--resume` giving the same metrics as an
//! uninterrupted run.

use std::path::{Path, PathBuf};

use colo_rl::metrics::{read, Record};
use colo_rl::Config;

mod common;

use common::{evals_of, steps_of, RunToml};

fn tmp(name: &str) -> PathBuf {
    common::tmp("loop", name)
}

/// A config for `steps` steps on a few arithmetic prompts.
fn config(dir: &Path, steps: usize, mode: &str) -> Config {
    run_toml(dir, steps, mode, "grpo").config(dir)
}

/// 16 arithmetic prompts, a quarter held out, 2 a step; the parity
/// reward; a checkpoint every step, an evaluation every 2.
fn run_toml(dir: &Path, steps: usize, mode: &str, estimator: &str) -> RunToml {
    common::parity_run(dir).with(&format!(
        r#"
[algorithm]
adv_estimator = "{estimator}"

[memory]
colocation = "{mode}"

[trainer]
# The tolerances below are float32's (`auto` is bf16 on some CPUs).
dtype = "f32"
total_steps = {steps}
save_freq = 1
test_freq = 2
"#
    ))
}

/// The metrics that must not depend on wall time.
fn deterministic(m: &colo_rl::StepMetrics) -> Vec<f64> {
    vec![
        m.step as f64,
        m.pg_loss,
        m.pg_clipfrac,
        m.ppo_kl,
        m.entropy,
        m.grad_norm,
        m.lr,
        m.score_mean,
        m.response_length_mean,
        m.kl_loss.unwrap_or(-1.0),
        m.mismatch.map_or(-1.0, |x| x.max_abs_diff),
    ]
}

#[test]
fn a_run_writes_metrics_pictures_and_checkpoints() {
    let dir = tmp("files");
    let s = colo_rl::step::run(&config(&dir, 2, "staged"), &dir.join("run"), false).unwrap();
    let run = dir.join("run");
    assert_eq!(s.steps, 2);
    let evals: Vec<usize> = evals_of(&run).iter().map(|e| e.step).collect();
    assert_eq!(
        evals,
        vec![0, 2],
        "evaluated before the first step and at the end"
    );
    let steps = steps_of(&run);
    assert_eq!(steps.len(), 2);
    for m in &steps {
        assert!(
            m.peak_device_bytes > 0 && m.grad_norm > 0.0 && m.timing_gen > 0.0,
            "{m:?}"
        );
        assert!(
            m.peak_allocated_bytes > 0 && m.peak_allocated_bytes <= m.peak_device_bytes,
            "allocated {} of {} mapped",
            m.peak_allocated_bytes,
            m.peak_device_bytes
        );
        let mm = m.mismatch.unwrap();
        assert!(
            mm.max_abs_diff < 1e-3,
            "rollout and trainer log-probs agree: {}",
            mm.max_abs_diff
        );
    }
    for f in [
        "memory_timeline.svg",
        "reward_curve.svg",
        "timeline.jsonl",
        "checkpoints/step-1",
        "checkpoints/step-2",
    ] {
        assert!(run.join(f).exists(), "{f} missing");
    }
    let svg = std::fs::read_to_string(run.join("memory_timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg") || svg.starts_with("<?xml"));
    // The one-step picture shows the staged choreography, stage by stage
    // (no `wake_weights` once a step has measured room for the engine's
    // weights beside the update: `as_needed` keeps them resident then).
    let step = std::fs::read_to_string(run.join("memory_step.svg")).unwrap();
    for stage in [
        "sync_weights",
        "free_trainer_weights",
        "wake_kv_cache",
        "generate",
        "sleep_engine",
    ] {
        assert!(step.contains(stage), "memory_step.svg lacks {stage}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn resume_continues_with_the_same_metrics_as_an_uninterrupted_run() {
    let dir = tmp("resume");
    let full = dir.join("full");
    colo_rl::step::run(&config(&dir, 3, "staged"), &full, false).unwrap();

    let cut = dir.join("cut");
    colo_rl::step::run(&config(&dir, 2, "staged"), &cut, false).unwrap();
    colo_rl::step::run(&config(&dir, 3, "staged"), &cut, true).unwrap();

    let (a, b) = (steps_of(&full), steps_of(&cut));
    assert_eq!(b.len(), 3, "two steps, then one more after resuming");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(deterministic(x), deterministic(y), "step {}", x.step);
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn every_colocation_mode_runs_a_step() {
    for mode in ["naive", "restart", "sleep"] {
        let dir = tmp(mode);
        let s = colo_rl::step::run(&config(&dir, 1, mode), &dir.join("run"), false).unwrap();
        assert_eq!(s.steps, 1, "{mode}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn gae_trains_a_critic_and_remax_uses_greedy_baselines() {
    // (estimator, loss_mode): verl's GPG recipe pairs the estimator with
    // its loss; the other losses go with any estimator.
    let runs = [
        ("gae", "vanilla"),
        ("remax", "sapo"),
        ("rloo", "cispo"),
        ("reinforce_plus_plus", "kl_cov"),
        ("opo", "clip_cov"),
        ("grpo_passk", "geo_mean"),
        ("gpg", "gpg"),
    ];
    for (estimator, loss) in runs {
        let dir = tmp(estimator);
        let config = run_toml(&dir, 2, "staged", estimator)
            .with(&format!("[actor]\nloss_mode = \"{loss}\""))
            .config(&dir);
        colo_rl::step::run(&config, &dir.join("run"), false).unwrap();
        let steps = steps_of(&dir.join("run"));
        assert_eq!(steps.len(), 2, "{estimator}");
        assert!(steps.iter().all(|s| s.pg_loss.is_finite()), "{estimator}");
        let critic = steps[1].vf_loss;
        if estimator == "gae" {
            assert!(
                critic.is_some_and(|l| l.is_finite() && l > 0.0),
                "{estimator}: {critic:?}"
            );
            assert!(steps[1].vpred_mean.is_some());
        } else {
            assert!(critic.is_none(), "{estimator} trains no critic");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// Without val_files or val_fraction the run does not evaluate (as
/// OpenRLHF's and TRL's runs without an eval set): no evaluation records,
/// no accuracy in the summary, a reward curve without it.
#[test]
fn a_run_without_a_held_out_set_does_not_evaluate() {
    let dir = tmp("no-val");
    let cfg = run_toml(&dir, 2, "staged", "grpo")
        .without("data", "val_fraction")
        .config(&dir);
    assert!(!cfg.evaluates());
    assert!(
        cfg.summary().contains("no evaluation (no held-out set)"),
        "{}",
        cfg.summary()
    );
    let run = dir.join("run");
    let s = colo_rl::step::run(&cfg, &run, false).unwrap();
    assert_eq!(
        (s.steps, s.first_accuracy, s.last_accuracy),
        (2, None, None)
    );
    let records = read(&run.join("metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 2, "two steps and no evaluation: {records:?}");
    assert!(records.iter().all(|r| matches!(r, Record::Step(_))));
    let svg = std::fs::read_to_string(run.join("reward_curve.svg")).unwrap();
    assert!(
        svg.contains("colo: reward") && !svg.contains("held-out"),
        "{svg}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_prompt_longer_than_max_prompt_length_is_an_error_naming_it() {
    let dir = tmp("long");
    let mut cfg = config(&dir, 1, "staged");
    cfg.data.max_prompt_length = 3;
    let err = colo_rl::step::run(&cfg, &dir.join("run"), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_prompt_length = 3") && err.contains("prompt "),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A ground truth the reward's rule cannot read stops the run naming the
/// data file and line of its prompt.
#[test]
fn a_reward_error_names_the_line_of_its_prompt() {
    let dir = tmp("reward-origin");
    let toml = run_toml(&dir, 1, "staged", "grpo");
    // Every answer of the arithmetic data made unreadable to `numeric`.
    let data = dir.join("train.jsonl");
    let words: Vec<String> = (std::fs::read_to_string(&data).unwrap().lines())
        .map(|l| format!("{}\"seven\"}}", &l[..l.find("\"answer\": ").unwrap() + 10]))
        .collect();
    std::fs::write(&data, words.join("\n")).unwrap();
    let cfg = (toml.without("reward", "command"))
        .with("[reward]\nkind = \"numeric\"")
        .config(&dir);
    let err = colo_rl::step::run(&cfg, &dir.join("run"), false)
        .unwrap_err()
        .to_string();
    let origin = format!("the prompt of {}:", data.display());
    assert!(
        err.contains(&origin)
            && err.contains("reward `numeric` failed")
            && err.contains("has no number"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run whose prompts and completions together exceed the model's
/// context window is refused before anything runs, as verl refuses it
/// (the fixture's `max_position_embeddings` is 512).
#[test]
fn sequences_longer_than_the_context_window_are_refused() {
    let dir = tmp("context");
    let mut cfg = config(&dir, 1, "staged");
    cfg.data.max_prompt_length = 500;
    cfg.rollout.max_new_tokens = 13;
    let run = dir.join("run");
    let err = colo_rl::step::run(&cfg, &run, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("max_prompt_length (500) + rollout.max_new_tokens (13) = 513 tokens")
            && err.contains("max_position_embeddings = 512")
            && err.contains("config.json"),
        "{err}"
    );
    assert!(!run.join("metrics.jsonl").exists(), "nothing ran");
    // At the window exactly, it runs.
    cfg.rollout.max_new_tokens = 12;
    colo_rl::step::run(&cfg, &run, false).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// `actor.use_dynamic_bsz`: micro-batches cut by a token budget train the
/// same policy as those cut by sample count (the micro-batches' gradients
/// add up to the same sum; float rounding apart). (What it saves is
/// measured where activations dominate: colo-train's `tests/memory.rs`.)
#[test]
fn a_token_budget_trains_the_same_policy() {
    let dir = tmp("dynamic");
    // 2 prompts × 4 samples a mini-batch, all 8 in one micro-batch …
    let toml = run_toml(&dir, 1, "staged", "grpo").with(
        r#"
[data]
max_prompt_length = 24

[actor]
ppo_mini_batch_size = 2
ppo_micro_batch_size = 8
"#,
    );
    let rows = toml.config(&dir);
    // … or one at a time: 28 tokens hold one sample of up to 24 + 4.
    let tokens = toml
        .with("[actor]\nuse_dynamic_bsz = true\nppo_max_token_len_per_gpu = 28")
        .config(&dir);
    assert_eq!(tokens.batch.micro_batch_max_tokens, Some(28));
    colo_rl::step::run(&rows, &dir.join("rows"), false).unwrap();
    colo_rl::step::run(&tokens, &dir.join("tokens"), false).unwrap();
    let (x, y) = (
        &steps_of(&dir.join("rows"))[0],
        &steps_of(&dir.join("tokens"))[0],
    );
    let close = |p: f64, q: f64| (p - q).abs() <= 1e-4 * (1.0 + p.abs());
    assert_eq!(x.score_mean, y.score_mean, "the same samples");
    assert!(
        close(x.pg_loss, y.pg_loss) && close(x.grad_norm, y.grad_norm),
        "{x:?}\n{y:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// DAPO's overlong punishment lowers each training reward by its share of
/// the buffer: with a buffer as long as the limit (4 tokens), a response of
/// L tokens loses L / 4 · 0.5. The same first step without it (the same
/// samples: nothing has been trained yet) differs by exactly that.
#[test]
fn the_overlong_buffer_lowers_the_rewards_of_long_responses() {
    let dir = tmp("overlong");
    let plain = run_toml(&dir, 1, "staged", "grpo");
    let shaped =
        plain.with("[algorithm.overlong_buffer]\nenable = true\nlen = 4\npenalty_factor = 0.5");
    let mut firsts = Vec::new();
    for (name, toml) in [("plain", &plain), ("shaped", &shaped)] {
        let cfg = toml.config(&dir);
        colo_rl::step::run(&cfg, &dir.join(name), false).unwrap();
        firsts.push(steps_of(&dir.join(name)).remove(0));
    }
    let (plain, shaped) = (&firsts[0], &firsts[1]);
    assert!(!plain.reward_extra.contains_key("overlong_reward"));
    assert_eq!(plain.response_length_mean, shaped.response_length_mean);
    let penalty = shaped.reward_extra["overlong_reward"];
    let expected = -shaped.response_length_mean / 4.0 * 0.5;
    assert!((penalty - expected).abs() < 1e-9, "{penalty} vs {expected}");
    assert_eq!(shaped.reward_extra["overlong"], 1.0);
    let shift = shaped.score_mean - plain.score_mean;
    assert!(
        (shift - penalty).abs() < 1e-5,
        "scores moved by {shift}, not {penalty}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run directory in use by another run is refused before anything is
/// written, and the default directory's numbering skips it; once the
/// other run is over, the directory runs.
#[test]
fn a_run_directory_in_use_is_refused() {
    let dir = tmp("in-use");
    let out = dir.join("run");
    std::fs::create_dir_all(&out).unwrap();
    let held = colo_rl::run_lock::lock(&out).unwrap();
    assert!(colo_rl::run_lock::in_use(&out));
    let err = colo_rl::step::run(&config(&dir, 1, "staged"), &out, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("{} is in use by another run", out.display())),
        "{err}"
    );
    assert!(!out.join("config.toml").exists() && !out.join("metrics.jsonl").exists());
    assert_eq!(
        colo_rl::checkpoints::next_free_dir(&out).unwrap(),
        PathBuf::from(format!("{}-2", out.display()))
    );
    drop(held);
    assert!(!colo_rl::run_lock::in_use(&out));
    assert_eq!(colo_rl::checkpoints::next_free_dir(&out).unwrap(), out);
    colo_rl::step::run(&config(&dir, 1, "staged"), &out, false).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// verl's `rollout_data_dir` and `validation_data_dir`: each step's samples
/// and each evaluation's greedy completions as `{step}.jsonl`, whose scores
/// are the ones the metrics report.
#[test]
fn generations_are_dumped_as_verl_dumps_them() {
    let dir = tmp("dumps");
    let cfg = run_toml(&dir, 2, "staged", "grpo")
        .with(&format!(
            "[trainer]\nrollout_data_dir = {:?}\nvalidation_data_dir = {:?}",
            dir.join("rollouts").display().to_string(),
            dir.join("val").display().to_string()
        ))
        .config(&dir);
    colo_rl::step::run(&cfg, &dir.join("run"), false).unwrap();
    let lines = |path: PathBuf| -> Vec<serde_json::Value> {
        (std::fs::read_to_string(&path).unwrap().lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let mean = |rows: &[serde_json::Value]| {
        rows.iter()
            .map(|r| r["score"].as_f64().unwrap())
            .sum::<f64>()
            / rows.len() as f64
    };
    for m in steps_of(&dir.join("run")) {
        let rows = lines(dir.join(format!("rollouts/{}.jsonl", m.step)));
        assert_eq!(rows.len(), 2 * 4, "2 prompts × 4 samples");
        assert!((mean(&rows) - m.score_mean).abs() < 1e-6, "step {}", m.step);
        for r in &rows {
            assert_eq!(r["step"], m.step);
            assert!(
                r["input"]
                    .as_str()
                    .unwrap()
                    .starts_with("Question: what is"),
                "{r}"
            );
            let (gts, output) = (r["gts"].as_str().unwrap(), r["output"].as_str().unwrap());
            assert!(gts.parse::<u32>().is_ok(), "{r}");
            // The parity reward: 1 for an output of even length (Python counts characters).
            let parity = f64::from(u8::from(output.chars().count() % 2 == 0));
            assert_eq!(r["score"].as_f64().unwrap(), parity, "{r}");
        }
    }
    let evals = evals_of(&dir.join("run"));
    assert_eq!(evals.len(), 2, "before the first step and at the end");
    for e in evals {
        let rows = lines(dir.join(format!("val/{}.jsonl", e.step)));
        assert_eq!(rows.len(), e.n_samples);
        assert!((mean(&rows) - e.score_mean).abs() < 1e-9, "step {}", e.step);
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `warmup_style = "cosine"` decays over the run's optimizer steps: 3 steps
/// of 2 mini-batches are 6, and the last update of step k is optimizer
/// step 2k − 1 (0-based), whose rate `actor/lr` reports.
#[test]
fn a_cosine_schedule_decays_over_the_runs_optimizer_steps() {
    let dir = tmp("cosine");
    let toml = run_toml(&dir, 3, "staged", "grpo")
        .with("[actor]\nwarmup_style = \"cosine\"\nmin_lr_ratio = 0.1");
    let cfg = toml.config(&dir);
    colo_rl::step::run(&cfg, &dir.join("run"), false).unwrap();
    for m in steps_of(&dir.join("run")) {
        let progress = (2 * m.step - 1) as f64 / 6.0;
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        let want = 1e-3 * (0.1 + 0.9 * cos);
        assert!(
            (m.lr - want).abs() < 1e-12,
            "step {}: {} vs {want}",
            m.step,
            m.lr
        );
    }
    // A run in epochs learns its length from the data: a warmup longer than
    // it is refused before anything runs.
    let cfg = (toml.without("trainer", "total_steps"))
        .with("[trainer]\ntotal_epochs = 1\n[actor]\nwarmup_steps = 40")
        .config(&dir);
    let e = colo_rl::step::run(&cfg, &dir.join("epochs"), false).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("12 training prompts make 6 steps")
            && msg.contains("12, which must be more than actor.warmup_steps = 40"),
        "{msg}"
    );
    assert!(!dir.join("epochs/checkpoints/step-1").exists());
    std::fs::remove_dir_all(dir).unwrap();
}

/// PPO's `[critic]` trains with its own optimizer settings, and
/// `trainer.critic_warmup` steps update the critic alone: their actor
/// metrics are not numbers, and the checkpoint's optimizer step counts say
/// which model was updated how often.
#[test]
fn the_critic_has_its_own_learning_rate_and_warms_up_alone() {
    let dir = tmp("critic");
    let cfg = run_toml(&dir, 3, "staged", "gae")
        .with(
            r#"
[trainer]
critic_warmup = 2

[critic]
lr = 3e-3
warmup_steps = 0
cliprange_value = 0.2
"#,
        )
        .config(&dir);
    colo_rl::step::run(&cfg, &dir.join("run"), false).unwrap();
    let steps = steps_of(&dir.join("run"));
    for m in &steps {
        assert!(m.vf_loss.is_some_and(f64::is_finite), "step {}", m.step);
        let warming = m.step <= 2;
        assert_eq!(
            m.pg_loss.is_nan(),
            warming,
            "step {}: {}",
            m.step,
            m.pg_loss
        );
        assert_eq!(m.grad_norm.is_nan(), warming, "step {}", m.step);
    }
    let state = |sub: &str| -> serde_json::Value {
        let path = dir
            .join("run/checkpoints/step-3")
            .join(sub)
            .join("trainer_state.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let (actor, critic) = (state(""), state("critic"));
    // Two mini-batches a step: the actor's only in step 3.
    assert_eq!(actor["optimizer_steps"], 2);
    assert_eq!(critic["optimizer_steps"], 6);
    assert_eq!(actor["next_lr"], 1e-3);
    assert_eq!(critic["next_lr"], 3e-3);
    std::fs::remove_dir_all(dir).unwrap();
}

/// `trainer.val_only` evaluates `model.path` and trains nothing: on a
/// run's last checkpoint it measures what the run's last evaluation did.
#[test]
fn val_only_evaluates_a_checkpoint_and_trains_nothing() {
    let dir = tmp("val-only");
    let toml = run_toml(&dir, 1, "staged", "grpo");
    let trained = colo_rl::step::run(&toml.config(&dir), &dir.join("run"), false).unwrap();
    let step = dir.join("run/checkpoints/step-1");
    let cfg = toml
        .with(&format!(
            "[model]\npath = \"{}\"\n[trainer]\nval_only = true",
            step.display()
        ))
        .config(&dir);
    let s = colo_rl::step::run(&cfg, &dir.join("eval"), false).unwrap();
    assert_eq!(s.steps, 0);
    assert_eq!(s.last_accuracy, trained.last_accuracy);
    let records = read(&dir.join("eval/metrics.jsonl")).unwrap();
    assert!(
        matches!(&records[..], [Record::Eval(e)] if e.step == 0),
        "{records:?}"
    );
    assert!(!dir.join("eval/checkpoints/step-1").exists());
    // Its record is work too: a second evaluation into it is refused.
    let e = colo_rl::step::run(&cfg, &dir.join("eval"), false).unwrap_err();
    // (Naming a way on that val_only takes: not --resume.)
    assert!(
        e.to_string().contains("(1 evaluation in metrics.jsonl)")
            && e.to_string().contains("name another with --out")
            && !e.to_string().contains("--resume continues"),
        "{e}"
    );
    // --resume has nothing to continue: it is refused, naming what to do.
    let e = colo_rl::step::run(&cfg, &dir.join("eval2"), true).unwrap_err();
    assert!(
        e.to_string().contains("set model.path to its directory"),
        "{e}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
