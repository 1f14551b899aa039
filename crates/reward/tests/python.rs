//! `reward.kind = "python"`: a verl-style reward function
//! (`tests/data/verl_reward.py`) run by a real python3, fed the rows of the
//! verl GSM8K fixture (colo-rl's `tests/data/gsm8k-verl.jsonl`) as colo
//! keeps them.

mod common;

use std::path::PathBuf;

use colo_reward::{self as reward, Error, RewardInput, RewardSpec};
use common::TempDir;
use serde_json::{json, Map, Value};

fn reward_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/verl_reward.py")
}

fn spec(extra: &str) -> RewardSpec {
    toml::from_str(&format!(
        "kind = \"python\"\npath = {:?}\ntimeout_s = 20\n{extra}",
        reward_file().display().to_string()
    ))
    .unwrap()
}

fn row(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn input<'a>(
    sample: u64,
    completion: &'a str,
    truth: &'a str,
    extra: &'a Map<String, Value>,
) -> RewardInput<'a> {
    RewardInput {
        sample,
        prompt_id: sample / 4,
        prompt: "q",
        completion,
        ground_truth: truth,
        extra: Some(extra),
    }
}

#[test]
fn verl_rows_are_scored_by_the_users_function_as_verl_calls_it() {
    // The fixture's first row as colo keeps it: the fields other than the
    // prompt, the ground truth read at `reward_model.ground_truth`.
    let first = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rl/tests/data/gsm8k-verl.jsonl"),
    )
    .unwrap();
    let mut extra = row(serde_json::from_str(first.lines().next().unwrap()).unwrap());
    extra.remove("prompt");
    let truth = extra["reward_model"]["ground_truth"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut r = reward::build(&spec("[kwargs]\nbonus = 0.25")).unwrap();
    assert_eq!(
        r.name(),
        format!("python `compute_score` from {}", reward_file().display())
    );
    let right = format!("12 × 3 = 36, 36 − 9 = 27\n#### {truth}");
    let inputs = [
        input(0, &right, &truth, &extra),
        input(1, "#### 26", &truth, &extra),
        input(2, "no marker", &truth, &extra),
    ];
    // The dict result's "score", plus the keyword argument.
    assert_eq!(r.score_batch(&inputs).unwrap(), vec![1.25, 0.25, 0.25]);
    // Its other numbers come back beside the score (the bool `acc` as 0/1);
    // its text `pred` does not. A plain number has nothing beside it.
    let scored = r.score_batch_extra(&inputs).unwrap();
    let acc: Vec<_> = scored.iter().map(|s| s.extra.clone()).collect();
    let one = |v: f64| [("acc".to_owned(), v)].into();
    assert_eq!(acc, vec![one(1.0), one(0.0), one(0.0)]);
    let lists = row(json!({"data_source": "lists", "reward_model": {"ground_truth": ["4"]}}));
    let plain = r
        .score_batch_extra(&[input(0, "4", "[\"4\"]", &lists)])
        .unwrap();
    assert_eq!(plain, vec![reward::Scored::plain(1.0)]);
}

#[test]
fn the_row_reaches_the_function_raw() {
    let mut r = reward::build(&spec("")).unwrap();
    // A ground truth that is a list (verl keeps it as the parquet has it),
    // and extra_info read by the function.
    let lists =
        row(json!({"data_source": "lists", "reward_model": {"ground_truth": ["4", "four"]}}));
    let index = row(json!({"data_source": "index", "extra_info": {"index": 7}}));
    let none = row(json!({}));
    let scores = r
        .score_batch(&[
            input(0, "four", "[\"4\",\"four\"]", &lists),
            input(1, "five", "[\"4\",\"four\"]", &lists),
            input(2, "", "x", &index),
            input(3, "", "x", &none), // no data_source: the function's fallback, 0
        ])
        .unwrap();
    assert_eq!(scores, vec![1.0, 0.0, 7.0, 0.0]);
}

#[test]
fn another_function_of_the_file_by_name() {
    let mut r = reward::build(&spec("name = \"other_name\"")).unwrap();
    let none = Map::new();
    assert_eq!(r.score(&input(0, "x", "y", &none)).unwrap(), 0.5);
}

fn setup_error(spec: &RewardSpec) -> String {
    match reward::build(spec) {
        Err(e @ Error::Setup { .. }) => e.to_string(),
        Err(e) => panic!("expected a set-up error, got {e}"),
        Ok(_) => panic!("expected a set-up error"),
    }
}

#[test]
fn a_reward_that_cannot_load_is_an_error_before_any_sample() {
    // No such file.
    let e =
        setup_error(&toml::from_str("kind = \"python\"\npath = \"no/such/reward.py\"").unwrap());
    assert!(e.contains("reward.path: no file no/such/reward.py"), "{e}");
    // No such function.
    let e = setup_error(&spec("name = \"compute_scores\""));
    assert!(e.contains("has no function 'compute_scores'"), "{e}");
    // A file that does not import: Python's traceback is quoted.
    let dir = TempDir::new("py-reward-syntax");
    let bad = dir.write("bad.py", "def compute_score(:\n");
    let e = setup_error(
        &toml::from_str(&format!(
            "kind = \"python\"\npath = {:?}",
            bad.display().to_string()
        ))
        .unwrap(),
    );
    assert!(e.contains("SyntaxError") && e.contains("importing"), "{e}");
    // No such interpreter.
    let e = setup_error(&spec("python = \"no-such-python3\""));
    assert!(e.contains("cannot start `no-such-python3`"), "{e}");
    // Settings serde cannot check.
    let e = setup_error(&spec("name = \"\""));
    assert!(e.contains("name: must name a function"), "{e}");
}

#[test]
fn a_function_that_raises_or_returns_text_names_the_sample() {
    let mut r = reward::build(&spec("")).unwrap();
    let raise = row(json!({"data_source": "raise"}));
    let e = r
        .score_batch(&[input(5, "x", "y", &raise)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("sample 5"), "{e}");
    assert!(e.contains("ValueError: cannot score this one"), "{e}");
    // The child is restarted for the next batch.
    let none = Map::new();
    assert_eq!(r.score(&input(6, "x", "y", &none)).unwrap(), 0.0);
    let text = row(json!({"data_source": "text"}));
    let e = r.score(&input(7, "x", "y", &text)).unwrap_err().to_string();
    assert!(
        e.contains("sample 7") && e.contains("returned 'high'"),
        "{e}"
    );
}

#[test]
fn default_score_covers_a_failing_function() {
    let mut r = reward::build(&spec("default_score = -1.0")).unwrap();
    let raise = row(json!({"data_source": "raise"}));
    let none = Map::new();
    let scores = r
        .score_batch(&[input(0, "x", "y", &none), input(1, "x", "y", &raise)])
        .unwrap();
    assert_eq!(scores, vec![0.0, -1.0]);
    assert_eq!(r.failures(), 1);
}

/// `workers = 2`: two interpreters score contiguous halves of a batch at
/// once (each answers with its process id), the scores in the batch's
/// order; a failure in either part is the batch's error.
#[test]
fn workers_split_a_batch_over_processes() {
    let dir = TempDir::new("py-reward-workers");
    let file = dir.write(
        "pid.py",
        "import os\n\
         def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n\
         \x20   if solution_str == 'raise':\n\
         \x20       raise RuntimeError('bad sample')\n\
         \x20   return os.getpid()\n",
    );
    let spec: RewardSpec = toml::from_str(&format!(
        "kind = \"python\"\npath = {:?}\nworkers = 2\ntimeout_s = 20",
        file.display().to_string()
    ))
    .unwrap();
    let mut r = reward::build(&spec).unwrap();
    assert!(r.name().ends_with("× 2 processes"), "{}", r.name());
    let none = Map::new();
    let batch: Vec<RewardInput<'_>> = (0..5).map(|i| input(i, "x", "y", &none)).collect();
    let pids = r.score_batch(&batch).unwrap();
    assert_eq!(pids.len(), 5);
    assert!(
        pids[..3].iter().all(|&p| p == pids[0]),
        "first part: {pids:?}"
    );
    assert!(
        pids[3..].iter().all(|&p| p == pids[3]),
        "second part: {pids:?}"
    );
    assert_ne!(pids[0], pids[3], "two processes: {pids:?}");
    assert_ne!(pids[0], std::process::id() as f32);
    let mut bad = batch.clone();
    bad[4] = input(4, "raise", "y", &none);
    let e = r.score_batch(&bad).unwrap_err().to_string();
    assert!(
        e.contains("sample 4") && e.contains("RuntimeError: bad sample"),
        "{e}"
    );
    let e = setup_error(
        &toml::from_str(&format!(
            "kind = \"python\"\npath = {:?}\nworkers = 0",
            file.display().to_string()
        ))
        .unwrap(),
    );
    assert!(e.contains("workers: must be at least 1"), "{e}");
}
