//! DAPO's dynamic sampling end to end on a tiny checkpoint: a step trains
//! only on the groups whose metric varies, draws as many generation batches
//! as that takes, says so in `train/num_gen_batches`, resumes where the
//! uninterrupted run would be in the data, and stops with a clear error at
//! `max_num_gen_batches`.

use std::path::{Path, PathBuf};

use colo_rl::checkpoints::DataState;
use colo_rl::{Config, Error, StepMetrics};

mod common;

use common::steps_of;

fn tmp(name: &str) -> PathBuf {
    common::tmp("dynamic-sampling", name)
}

/// A verl-style reward function whose groups vary only for the prompts of
/// even `i` ("what is i + i+1?", answer 2i+1 ≡ 1 mod 4): their samples
/// score the parity of their characters' sum, the others' 1.0 whatever they
/// say. `varies` (beside the score) marks the rows of varying prompts.
const REWARD: &str = r#"
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    varies = int(ground_truth) % 4 == 1
    score = float(sum(map(ord, solution_str)) % 2) if varies else 1.0
    return {"score": score, "varies": float(varies)}
"#;

/// `steps` steps of 2 prompts × 4 samples on 16 prompts, generation batches
/// of `gen` prompts, with `[algorithm.filter_groups]` as `filter` says.
fn config(dir: &Path, steps: usize, gen: usize, filter: &str) -> Config {
    let data = common::write_arith_data(dir, 16);
    let reward = dir.join("reward.py");
    std::fs::write(&reward, REWARD).unwrap();
    common::fixture_run(&data, 2)
        .without("data", "val_fraction")
        .with(&format!(
            r#"
[data]
gen_batch_size = {gen}

[reward]
kind = "python"
path = "{reward}"
timeout_s = 30

[trainer]
dtype = "f32"
total_steps = {steps}
save_freq = 1

[algorithm.filter_groups]
{filter}
"#,
            reward = reward.display(),
        ))
        .config(dir)
}

fn data_state(run: &Path, step: usize) -> DataState {
    let dir = run.join(format!("checkpoints/step-{step}"));
    DataState::read(&dir).unwrap().unwrap()
}

/// Without the filter half the groups (those of odd `i`) score 1.0 in
/// every sample and are trained on; with it, none is, and each step draws
/// generation batches until it has two prompts that vary.
#[test]
fn only_groups_that_vary_are_trained_and_the_batches_drawn_are_counted() {
    let dir = tmp("filter");
    let plain = dir.join("plain");
    colo_rl::step::run(&config(&dir, 3, 2, "enable = false"), &plain, false).unwrap();
    let steps = steps_of(&plain);
    assert!(steps.iter().all(|m| m.num_gen_batches.is_none()));
    let varying: f64 = steps.iter().map(|m| m.reward_extra["varies"]).sum();
    assert!(varying < 3.0, "some step trained on a group of odd i");

    let filtered = dir.join("filtered");
    let cfg = config(&dir, 3, 2, "enable = true\nmetric = \"score\"");
    colo_rl::step::run(&cfg, &filtered, false).unwrap();
    let steps = steps_of(&filtered);
    let mut drawn = 0;
    for m in &steps {
        assert_eq!(m.reward_extra["varies"], 1.0, "step {}", m.step);
        assert!(m.score_min < m.score_max, "step {}", m.step);
        let batches = m.num_gen_batches.unwrap();
        assert!(batches >= 1, "step {}", m.step);
        drawn += batches;
        // The checkpoint says where the run is in its data.
        let state = data_state(&filtered, m.step);
        assert_eq!((state.gen_batches, state.gen_batch_size), (drawn, 2));
    }
    // Half the prompts vary, so two in a batch of two is not the rule.
    assert!(drawn > 3, "{drawn} generation batches for 3 steps");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run resumed from its checkpoint draws the same generation batches as
/// the uninterrupted one, so it trains on the same samples.
#[test]
fn a_resumed_run_continues_in_the_data_where_it_stopped() {
    let dir = tmp("resume");
    let filter = "enable = true\nmetric = \"score\"";
    let full = dir.join("full");
    colo_rl::step::run(&config(&dir, 3, 3, filter), &full, false).unwrap();
    // Decisive only when the first two steps drew more than a batch each.
    assert!(data_state(&full, 2).gen_batches > 2);
    let cut = dir.join("cut");
    colo_rl::step::run(&config(&dir, 2, 3, filter), &cut, false).unwrap();
    colo_rl::step::run(&config(&dir, 3, 3, filter), &cut, true).unwrap();
    let (a, b) = (steps_of(&full), steps_of(&cut));
    assert_eq!(b.len(), 3);
    for (x, y) in a.iter().zip(&b) {
        let key = |m: &StepMetrics| {
            (
                m.num_gen_batches,
                m.score_mean.to_bits(),
                m.pg_loss.to_bits(),
                m.response_length_mean.to_bits(),
            )
        };
        assert_eq!(key(x), key(y), "step {}", x.step);
    }
    assert_eq!(data_state(&full, 3), data_state(&cut, 3));
    std::fs::remove_dir_all(dir).unwrap();
}

/// "varies" does not vary within a group (a prompt's samples all have the
/// same): nothing is ever kept, and the step stops at the limit, naming it.
#[test]
fn too_few_groups_that_vary_stop_at_the_limit_with_the_reason() {
    let dir = tmp("limit");
    let cfg = config(
        &dir,
        2,
        2,
        "enable = true\nmetric = \"varies\"\nmax_num_gen_batches = 3",
    );
    let e = colo_rl::step::run(&cfg, &dir.join("run"), false).unwrap_err();
    assert!(matches!(e, Error::DynamicSampling(_)), "{e}");
    let msg = e.to_string();
    for want in [
        "step 1: 0 of the 2 prompts",
        "after 3 generation batches of 2 prompts",
        "max_num_gen_batches = 3",
    ] {
        assert!(msg.contains(want), "{msg}");
    }
    // A metric the reward does not return is named with what it does.
    let cfg = config(&dir, 1, 2, "enable = true\nmetric = \"nope\"");
    let e = colo_rl::step::run(&cfg, &dir.join("other"), false).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("metric = \"nope\"") && msg.contains("it returned varies"),
        "{msg}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
