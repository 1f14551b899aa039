//! What a run says and leaves behind: failed rewards counted, the run
//! header in words, what a process stopped at once loses, a run refused
//! before its first step leaving its directory as it was, and the README's
//! chat example running on the test checkpoint.

mod common;

use std::path::{Path, PathBuf};

use colo_rl::Config;

fn tmp(name: &str) -> PathBuf {
    common::tmp("messages", name)
}

/// A run of `steps` steps on the fixture: 8 arithmetic prompts, 2 held out,
/// 2 a step of 4 samples each; `reward` is its `[reward]` section, `more`
/// what the test changes.
fn config(dir: &Path, steps: usize, reward: &str, more: &str) -> Config {
    common::fixture_run(&common::write_arith_data(dir, 8), 4)
        .with(reward)
        .with(&format!("[trainer]\ntotal_steps = {steps}"))
        .with(more)
        .config(dir)
}

/// Every sample whose reward failed and scored the default is in the
/// summary: the steps' (2 prompts × 4 samples) and the final evaluation's
/// (2 held-out prompts); a resumed run counts the steps before it too.
#[test]
fn reward_failures_reach_the_summary() {
    let dir = tmp("failures");
    let reward = common::garbage_reward(&dir);
    let run = dir.join("run");
    let c = config(&dir, 1, &reward, "[trainer]\nval_before_train = false");
    let s = colo_rl::step::run(&c, &run, false).unwrap();
    assert_eq!(s.reward_failures, 8 + 2, "{s:?}");
    let c = config(&dir, 2, &reward, "[trainer]\nval_before_train = false");
    let s = colo_rl::step::run(&c, &run, true).unwrap();
    assert_eq!(s.resumed_from, Some(1));
    assert_eq!(
        s.reward_failures,
        8 + 8 + 2,
        "step 1's, step 2's, the end's"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The run header names the reward in words, not as JSON, and says
/// "every step", not "every 1 steps".
#[test]
fn the_run_header_is_words() {
    let dir = tmp("header");
    let c = config(
        &dir,
        1,
        "[reward]\nkind = \"numeric\"\nafter = \"####\"",
        "[trainer]\nsave_freq = 1",
    );
    let s = c.summary();
    assert!(
        s.contains("reward     numeric after \"####\", tolerance 1e-6"),
        "{s}"
    );
    assert!(s.contains("checkpoint every step"), "{s}");
    assert!(!s.contains('{') && !s.contains("every 1 steps"), "{s}");
    let printed = c.to_toml().unwrap();
    assert!(!printed.contains("\"kind\":"), "{printed}");
    let weighted = config(
        &dir,
        1,
        "[reward]\nkind = \"weighted\"\n[[reward.terms]]\nweight = 0.9\nreward = { kind = \"boxed\" }\n\
         [[reward.terms]]\nweight = 0.1\nreward = { kind = \"format\", open = \"<a>\", close = \"</a>\" }",
        "",
    );
    assert!(
        (weighted.summary())
            .contains("reward     0.9 × boxed, tolerance 1e-6 + 0.1 × format <a>…</a>"),
        "{}",
        weighted.summary()
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// After a run stopped at the request, a process stopped at once loses
/// no step: the checkpoint of the last one is complete (a second Ctrl-C
/// while the pictures are drawn said "the step under way is lost").
#[test]
fn a_stop_says_what_stopping_at_once_would_lose() {
    let dir = tmp("stop");
    let c = config(
        &dir,
        3,
        "[reward]\nkind = \"numeric\"",
        "[trainer]\nval_before_train = false\nsave_freq = -1",
    );
    let stop = colo_rl::step::Stop::new();
    assert_eq!(stop.stopped_now(), "no checkpoint was written");
    stop.request();
    let run = dir.join("run");
    let s = colo_rl::step::run_until(&c, &run, false, &stop).unwrap();
    assert_eq!((s.steps, s.total_steps), (1, 3));
    assert_eq!(stop.stopped_now(), "the checkpoint of step 1 is complete");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Every entry of `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A run refused before its first step (a reward that cannot start, a
/// dataset row that cannot be read) leaves its directory as it was: a new
/// one is removed, an existing one keeps only what it held.
#[test]
fn a_run_refused_before_its_first_step_leaves_nothing() {
    let dir = tmp("refused");
    let reward = "[reward]\nkind = \"external\"\ncommand = [\"/nonexistent/reward\"]";
    let c = config(&dir, 1, reward, "");
    let fresh = dir.join("fresh");
    let e = colo_rl::step::run(&c, &fresh.join("deeper"), false).unwrap_err();
    assert!(e.to_string().contains("cannot start"), "{e}");
    assert!(!fresh.exists(), "left behind: {:?}", listing(&fresh));

    let existing = dir.join("existing");
    std::fs::create_dir_all(&existing).unwrap();
    std::fs::write(existing.join("notes.txt"), "mine").unwrap();
    colo_rl::step::run(&c, &existing, false).unwrap_err();
    assert_eq!(listing(&existing), ["notes.txt"]);

    // A row the reward cannot compare with, in the training data.
    let data = dir.join("train.jsonl");
    let mut text = std::fs::read_to_string(&data).unwrap();
    text.push_str("\n{\"prompt\": \"Question: what is 1 + 1? Answer:\", \"answer\": [2]}\n");
    std::fs::write(&data, text).unwrap();
    let c = common::fixture_run(&data, 4)
        .without("data", "val_fraction")
        .config(&dir);
    let e = colo_rl::step::run(&c, &fresh, false).unwrap_err();
    assert!(
        e.to_string()
            .contains("train.jsonl:9: field `answer`: is a list"),
        "{e}"
    );
    assert!(!fresh.exists(), "left behind: {:?}", listing(&fresh));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The README's data-schema example, a plain prompt and a chat, trains as
/// written on `configs/example.toml`'s checkpoint (which has a chat
/// template).
#[test]
fn the_readmes_chat_example_runs_on_the_test_checkpoint() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let schema = readme.split("### The data schema").nth(1).unwrap();
    let block = schema.split("```json\n").nth(1).unwrap();
    let lines = block.split("```").next().unwrap();
    assert!(lines.contains("\"role\": \"user\""), "no chat in {lines}");
    let dir = tmp("readme-chat");
    let data = dir.join("train.jsonl");
    std::fs::write(&data, lines).unwrap();
    let c = common::fixture_run(&data, 4)
        .without("data", "val_fraction")
        .with(
            r#"
[data]
answer_key = "reward_model.ground_truth"

[reward]
kind = "numeric"

[trainer]
total_steps = 1
"#,
        )
        .config(&dir);
    let s = colo_rl::step::run(&c, &dir.join("run"), false).unwrap();
    assert_eq!(s.steps, 1);
    std::fs::remove_dir_all(dir).unwrap();
}
