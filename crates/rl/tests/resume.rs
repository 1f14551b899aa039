//! `--resume`, checkpoints and the run's records on a tiny checkpoint: a
//! resume that would go backwards is refused, a killed run resumes from its
//! newest complete checkpoint without duplicate records (its memory
//! timeline too), a finished run is
//! not evaluated twice, checkpoints are Hugging Face directories that runs
//! start from, reward failures are counted, prompts are checked when read,
//! and a failed run still writes its timeline and pictures.

use std::path::{Path, PathBuf};

use colo_rl::Config;

mod common;

use common::{fixture, steps_of, write_parity_reward as write_reward, RunToml};

fn tmp(name: &str) -> PathBuf {
    common::tmp("resume", name)
}

/// A run of `steps` steps on the fixture scored by `reward` (its
/// `[reward]` section), checkpointed and evaluated every 2 steps.
fn run_toml(dir: &Path, steps: usize, reward: &str) -> RunToml {
    common::fixture_run(&common::write_arith_data(dir, 8), 4)
        .with(reward)
        .with(&format!(
            "[trainer]\ntotal_steps = {steps}\nsave_freq = 2\ntest_freq = 2"
        ))
}

/// `[reward]`: the parity reward, its script written in `dir`.
fn parity_reward(dir: &Path) -> String {
    common::python_reward(&write_reward(dir, None))
}

fn config(dir: &Path, steps: usize) -> Config {
    run_toml(dir, steps, &parity_reward(dir)).config(dir)
}

/// The steps of `run`'s evaluations.
fn eval_steps(run: &Path) -> Vec<usize> {
    common::evals_of(run).iter().map(|e| e.step).collect()
}

fn timeline_of(run: &Path) -> Vec<colo_mem::Event> {
    colo_mem::read_timeline(&run.join("timeline.jsonl")).unwrap()
}

/// The metrics that do not depend on wall time.
fn deterministic(m: &colo_rl::StepMetrics) -> Vec<f64> {
    vec![
        m.step as f64,
        m.pg_loss,
        m.grad_norm,
        m.lr,
        m.score_mean,
        m.response_length_mean,
    ]
}

/// Every file under `dir` with its bytes, sorted.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

fn state(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("trainer_state.json")).unwrap()).unwrap()
}

/// Items: a resume beyond `total_steps` is refused naming both numbers and
/// changes nothing; resuming a finished run evaluates nothing again;
/// `trainer_state.json` names both counts; a checkpoint is a Hugging Face
/// directory a run starts from (`model.path = …/step-N`).
#[test]
fn resume_never_goes_backwards_or_repeats_and_checkpoints_are_models() {
    let dir = tmp("backwards");
    let run = dir.join("run");
    colo_rl::step::run(&config(&dir, 2), &run, false).unwrap();
    let ckpt = run.join("checkpoints/step-2");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "optimizer.safetensors",
    ] {
        assert!(ckpt.join(f).is_file(), "step-2 lacks {f}");
    }
    // 2 prompts per step in mini-batches of 1 prompt: 2 optimizer steps per RL step.
    let s = state(&ckpt);
    assert_eq!(
        (s["global_step"].as_u64(), s["optimizer_steps"].as_u64()),
        (Some(2), Some(4)),
        "{s}"
    );
    assert!(s.get("step").is_none(), "an ambiguous `step`: {s}");
    let before = snapshot(&run);

    // total_steps below the checkpoint: refused, nothing written.
    let err = colo_rl::step::run(&config(&dir, 1), &run, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("step 2") && err.contains("total_steps = 1"),
        "{err}"
    );
    assert!(snapshot(&run) == before, "a refused resume changed files");

    // A run from scratch into it: refused, nothing written.
    let err = colo_rl::step::run(&config(&dir, 2), &run, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "already holds a run (checkpoints/step-2; 2 steps and 2 evaluations in metrics.jsonl)"
        ) && err.contains("--resume continues it"),
        "{err}"
    );
    assert!(snapshot(&run) == before, "a refused run changed files");

    // Resuming the finished run: nothing to do, the last evaluation once.
    let s = colo_rl::step::run(&config(&dir, 2), &run, true).unwrap();
    assert_eq!(
        eval_steps(&run),
        vec![0, 2],
        "one evaluation at the last step"
    );
    assert!(snapshot(&run) == before, "a finished run was changed");
    assert_eq!((s.steps, s.resumed_from), (2, Some(2)));
    assert!(
        s.last_accuracy.is_some() && s.peak_device_bytes > 0,
        "{s:?}"
    );
    assert!(
        s.notes.iter().any(|n| n.contains("already complete")),
        "{:?}",
        s.notes
    );

    // A run from the checkpoint as its model.
    let mut cfg = config(&dir, 1);
    cfg.model.path = Some(ckpt);
    let s = colo_rl::step::run(&cfg, &dir.join("from-ckpt"), false).unwrap();
    assert_eq!(s.steps, 1);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run killed after step 3's records but before its checkpoint (here: a
/// partial `step-3`, and an empty `step-4` made by hand) resumes from
/// `step-2`, says so, and ends with each record once — the same as the
/// uninterrupted run's.
#[test]
fn a_killed_run_resumes_from_its_newest_complete_checkpoint_without_duplicates() {
    let dir = tmp("killed");
    let run = dir.join("run");
    colo_rl::step::run(&config(&dir, 3), &run, false).unwrap();
    let want: Vec<Vec<f64>> = steps_of(&run).iter().map(deterministic).collect();
    assert_eq!(eval_steps(&run), vec![0, 2, 3]);
    let first = timeline_of(&run);
    let ckpts = run.join("checkpoints");
    std::fs::remove_file(ckpts.join("step-3/model.safetensors")).unwrap();
    std::fs::create_dir_all(ckpts.join("step-4")).unwrap();
    // What a crash inside a save leaves: beside a complete step-2 it goes,
    // beside the incomplete step-3 it may be its only copy and stays.
    for left in [".step-2.tmp-abc123", ".step-3.old-xyz789"] {
        std::fs::create_dir_all(ckpts.join(left)).unwrap();
        std::fs::write(ckpts.join(left).join("model.safetensors"), b"x").unwrap();
    }

    let s = colo_rl::step::run(&config(&dir, 3), &run, true).unwrap();
    assert_eq!(s.resumed_from, Some(2));
    assert!(!ckpts.join(".step-2.tmp-abc123").exists());
    assert!(ckpts.join(".step-3.old-xyz789").exists());
    // The timeline: the first process's events up to step 2 as they were,
    // then the resumed process's start-up (step 2) and step 3, in time.
    let after = timeline_of(&run);
    let kept: Vec<_> = first.iter().filter(|e| e.step <= 2).cloned().collect();
    assert!(kept.iter().any(|e| e.step == 2) && first.iter().any(|e| e.step == 3));
    assert_eq!(
        &after[..kept.len()],
        &kept[..],
        "steps 0-2 kept as they were"
    );
    let resumed = &after[kept.len()..];
    assert!(
        resumed.iter().all(|e| e.step >= 2),
        "nothing of the lost step 3"
    );
    assert!(
        after.windows(2).all(|w| w[0].t_s <= w[1].t_s),
        "one run in time"
    );
    let phases = |events: &[colo_mem::Event]| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.step == 3)
            .map(|e| e.phase.clone())
            .collect()
    };
    assert_eq!(
        phases(resumed),
        phases(&first),
        "step 3 once, as uninterrupted"
    );
    let notes = s.notes.join("\n");
    assert!(
        notes.contains("step-4") && notes.contains("step-3") && notes.contains("skipped"),
        "{notes}"
    );
    assert!(
        notes.contains("continuing from") && notes.contains("removed 2 records"),
        "{notes}"
    );
    assert!(
        notes.contains(".step-2.tmp-abc123, left by an interrupted save of step-2")
            && notes.contains(".step-3.old-xyz789 was left by an interrupted save of step-3"),
        "{notes}"
    );
    let got: Vec<Vec<f64>> = steps_of(&run).iter().map(deterministic).collect();
    assert_eq!(got, want, "steps 1, 2, 3 once each, as uninterrupted");
    assert_eq!(eval_steps(&run), vec![0, 2, 3]);
    assert!(
        colo_rl::checkpoints::incomplete(&ckpts.join("step-3"), 3, false).is_none(),
        "step-3 written again, complete"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The evaluation after step 2 runs at the start of step 3's rollout
/// phase; a run stopped after checkpoint 2 but before that evaluation was
/// logged makes it up when resumed, once.
#[test]
fn a_resumed_run_makes_up_the_evaluation_its_checkpoint_was_due() {
    let dir = tmp("due");
    let run = dir.join("run");
    colo_rl::step::run(&config(&dir, 3), &run, false).unwrap();
    let want: Vec<Vec<f64>> = steps_of(&run).iter().map(deterministic).collect();
    let ckpts = run.join("checkpoints");
    std::fs::remove_dir_all(ckpts.join("step-3")).unwrap();
    // What a run stopped right after checkpoint 2 leaves: steps 1 and 2,
    // the evaluation before step 1, nothing of step 3's.
    let metrics = run.join("metrics.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .take_while(|l| {
            !l.contains("\"eval/accuracy\"") || l.contains("\"training/global_step\":0")
        })
        .filter(|l| !l.contains("\"training/global_step\":3"))
        .map(str::to_owned)
        .collect();
    std::fs::write(&metrics, kept.join("\n") + "\n").unwrap();
    assert_eq!(eval_steps(&run), vec![0]);

    let s = colo_rl::step::run(&config(&dir, 3), &run, true).unwrap();
    assert_eq!(s.resumed_from, Some(2));
    assert_eq!(
        eval_steps(&run),
        vec![0, 2, 3],
        "the due evaluation made up, once"
    );
    let got: Vec<Vec<f64>> = steps_of(&run).iter().map(deterministic).collect();
    assert_eq!(got, want, "steps 1, 2, 3 once each, as uninterrupted");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--resume` with no checkpoint says it starts from scratch; an external
/// reward that answers garbage with `default_score` is counted in
/// `reward/failures` (every sample of the step).
#[test]
fn resume_from_nothing_starts_from_scratch_and_reward_failures_are_counted() {
    let dir = tmp("failures");
    let cfg = run_toml(&dir, 1, &common::garbage_reward(&dir))
        .with("[trainer]\nval_before_train = false")
        .config(&dir);
    let run = dir.join("run");
    let s = colo_rl::step::run(&cfg, &run, true).unwrap();
    assert_eq!(s.resumed_from, None);
    assert!(
        s.notes.iter().any(|n| n.contains("starting from scratch")),
        "{:?}",
        s.notes
    );
    let steps = steps_of(&run);
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].reward_failures, 8, "2 prompts × 4 samples failed");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `--resume` where no checkpoint is complete does not start from scratch
/// over them: it is refused with each one's reason, and nothing changes.
/// A rerun without `--resume` says the same, not that `--resume`
/// continues the run (it said so, and `--resume` then refused).
#[test]
fn resume_over_only_incomplete_checkpoints_is_refused() {
    let dir = tmp("incomplete-only");
    let run = dir.join("run");
    colo_rl::step::run(&config(&dir, 1), &run, false).unwrap();
    std::fs::remove_file(run.join("checkpoints/step-1/model.safetensors")).unwrap();
    let before = snapshot(&run);
    for resume in [true, false] {
        let err = colo_rl::step::run(&config(&dir, 2), &run, resume)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "already holds a run (checkpoints/step-1; 1 step and 2 evaluations in \
                 metrics.jsonl): no checkpoint of it is complete, so --resume cannot continue it"
            ),
            "resume {resume}: {err}"
        );
        assert!(snapshot(&run) == before, "a refused run changed files");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run that fails after its first evaluation and before any checkpoint
/// (its reward dies in step 1) leaves a directory both commands agree on:
/// a rerun is refused, saying that `--resume` starts it again from step
/// 0, and `--resume` does so, replacing the failed attempt's records. (A
/// rerun said "--resume continues it", and `--resume` that "no checkpoint
/// of it is complete".)
#[test]
fn a_run_that_wrote_no_checkpoint_is_started_again_by_resume() {
    let dir = tmp("no-checkpoint");
    let run = dir.join("run");
    let dies = dir.join("dies");
    std::fs::create_dir_all(&dies).unwrap();
    // The step-0 evaluation scores 2 held-out prompts; step 1's first
    // sample finds the reward gone.
    let reward = common::python_reward(&write_reward(&dies, Some(2)));
    let failing = run_toml(&dir, 2, &reward).config(&dir);
    let err = colo_rl::step::run(&failing, &run, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("reward"), "{err}");
    assert_eq!(
        eval_steps(&run),
        vec![0],
        "the step-0 evaluation was logged"
    );
    assert!(steps_of(&run).is_empty());
    assert!(colo_rl::checkpoints::step_dirs(&run.join("checkpoints"))
        .unwrap()
        .is_empty());

    let before = snapshot(&run);
    let err = colo_rl::step::run(&config(&dir, 2), &run, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "already holds a run (1 evaluation in metrics.jsonl): it wrote no checkpoint; \
             --resume starts it again from step 0"
        ),
        "{err}"
    );
    assert!(snapshot(&run) == before, "a refused run changed files");

    let s = colo_rl::step::run(&config(&dir, 2), &run, true).unwrap();
    assert_eq!((s.steps, s.resumed_from), (2, None));
    let notes = s.notes.join("\n");
    assert!(
        notes.contains(
            "holds no checkpoint (its run wrote none); starting from scratch, replacing its \
             records (1 evaluation in metrics.jsonl)"
        ),
        "{notes}"
    );
    let steps: Vec<usize> = steps_of(&run).iter().map(|m| m.step).collect();
    assert_eq!(steps, vec![1, 2]);
    assert_eq!(eval_steps(&run), vec![0, 2], "each evaluation once");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The permissions a file made with `File::create` in `dir` gets (0644
/// under the usual umask).
fn created_mode(dir: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    let probe = dir.join("mode-probe");
    std::fs::File::create(&probe).unwrap();
    let mode = std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777;
    std::fs::remove_file(probe).unwrap();
    mode
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `metrics.jsonl` and `timeline.jsonl`, cut back by a resume, keep their
/// permissions (they were replaced by temporary files of mode 0600).
#[test]
fn records_keep_their_permissions_after_a_resume() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp("modes");
    let run = dir.join("run");
    colo_rl::step::run(&config(&dir, 3), &run, false).unwrap();
    let (metrics, timeline) = (run.join("metrics.jsonl"), run.join("timeline.jsonl"));
    let created = created_mode(&run);
    assert_eq!((mode_of(&metrics), mode_of(&timeline)), (created, created));
    // Killed before its last checkpoint: the resume removes step 3's
    // records and events, and writes them again.
    std::fs::remove_dir_all(run.join("checkpoints/step-3")).unwrap();
    colo_rl::step::run(&config(&dir, 3), &run, true).unwrap();
    assert_eq!((mode_of(&metrics), mode_of(&timeline)), (created, created));
    // A mode the user set is kept too.
    for (path, mode) in [(&metrics, 0o640), (&timeline, 0o604)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::remove_dir_all(run.join("checkpoints/step-3")).unwrap();
    let s = colo_rl::step::run(&config(&dir, 3), &run, true).unwrap();
    assert!(
        s.notes.iter().any(|n| n.contains("removed")),
        "{:?}",
        s.notes
    );
    assert_eq!((mode_of(&metrics), mode_of(&timeline)), (0o640, 0o604));
    std::fs::remove_dir_all(dir).unwrap();
}

/// A relative `rollout_data_dir` or `validation_data_dir` is in the run
/// directory: two runs with other directories and the same config keep
/// their dumps apart (both wrote into the working directory, the second
/// over the first), and `config.toml` records the path as written.
#[test]
fn relative_dump_directories_are_in_the_run_directory() {
    let dir = tmp("dumps");
    // Unique, so that a dump into the working directory is seen.
    let name = format!("colo-dumps-{}", std::process::id());
    let cfg = run_toml(&dir, 1, &parity_reward(&dir))
        .with(&format!(
            "[trainer]\nrollout_data_dir = \"{name}/train\"\nvalidation_data_dir = \"{name}/val\""
        ))
        .config(&dir);
    let runs = [dir.join("a"), dir.join("b")];
    for run in &runs {
        colo_rl::step::run(&cfg, run, false).unwrap();
    }
    let here = Path::new(&name);
    let stray = here.exists();
    let _ = std::fs::remove_dir_all(here);
    assert!(!stray, "the dumps went into the working directory");
    for run in &runs {
        for f in ["train/1.jsonl", "val/0.jsonl", "val/1.jsonl"] {
            let path = run.join(&name).join(f);
            assert!(path.is_file(), "{} missing", path.display());
            assert_eq!(mode_of(&path), created_mode(run), "{}", path.display());
        }
        let record = std::fs::read_to_string(run.join("config.toml")).unwrap();
        assert!(
            record.contains(&format!("rollout_data_dir = \"{name}/train\"")),
            "{record}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run directory that is a file is named as such, before anything runs.
#[test]
fn a_run_directory_that_is_a_file_is_refused() {
    let dir = tmp("out-file");
    let file = dir.join("run");
    std::fs::write(&file, b"notes").unwrap();
    let err = colo_rl::step::run(&config(&dir, 1), &file, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("run: the run directory is a file"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"notes");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A reward command that dies in step 2 fails the run; its timeline and
/// pictures are written all the same.
#[test]
fn a_failed_run_still_writes_its_timeline_and_pictures() {
    let dir = tmp("failed");
    let reward = common::python_reward(&write_reward(&dir, Some(8)));
    let cfg = run_toml(&dir, 3, &reward)
        .with("[trainer]\nval_before_train = false")
        .config(&dir);
    let run = dir.join("run");
    let err = colo_rl::step::run(&cfg, &run, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("reward"), "{err}");
    assert_eq!(steps_of(&run).len(), 1, "step 1 finished");
    for f in ["timeline.jsonl", "memory_timeline.svg", "reward_curve.svg"] {
        assert!(run.join(f).is_file(), "{f} missing after a failed run");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// `data.max_prompt_length` is checked for every prompt when the data are
/// read — held-out ones too — naming the file, the line and both lengths.
#[test]
fn prompts_longer_than_max_prompt_length_are_refused_when_read() {
    let dir = tmp("long");
    let val = dir.join("val.jsonl");
    let long = "word ".repeat(200);
    std::fs::write(
        &val,
        format!(
            "{{\"prompt\": \"Question: 1 + 1? Answer:\", \"answer\": \"2\"}}\n{{\"prompt\": \"{long}\", \"answer\": \"2\"}}\n"
        ),
    )
    .unwrap();
    let mut cfg = config(&dir, 1);
    cfg.data.val_files = colo_rl::config::Files::Many(vec![val.clone()]);
    let started = std::time::Instant::now();
    let err = colo_rl::step::run(&cfg, &dir.join("run"), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("{}:2", val.display()))
            && err.contains("max_prompt_length = 64")
            && err.contains("tokens"),
        "{err}"
    );
    assert!(
        !dir.join("run/metrics.jsonl").exists(),
        "refused before anything ran ({:?})",
        started.elapsed()
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// With `data.filter_overlong_prompts` (verl's), the long prompt is left
/// out and counted instead, and the run goes on with the rest.
#[test]
fn filtered_overlong_prompts_are_left_out_and_counted() {
    let dir = tmp("long-filtered");
    let val = dir.join("val.jsonl");
    let long = "word ".repeat(200);
    std::fs::write(
        &val,
        format!(
            "{{\"prompt\": \"{long}\", \"answer\": \"2\"}}\n{{\"prompt\": \"Question: 1 + 1? Answer:\", \"answer\": \"2\"}}\n"
        ),
    )
    .unwrap();
    let read = |overlong| {
        let tok = colo_model::Tokenizer::from_dir(&fixture()).unwrap();
        colo_rl::Dataset::from_files_max_len(
            std::slice::from_ref(&val),
            &colo_rl::Fields::default(),
            &tok,
            64,
            overlong,
        )
    };
    let kept = read(colo_rl::Overlong::Drop).unwrap();
    assert_eq!((kept.len(), kept.dropped_overlong), (1, 1));
    assert_eq!(kept.prompts[0].text, "Question: 1 + 1? Answer:");
    assert_eq!(kept.prompts[0].prompt_id, 0, "ids count the prompts kept");
    let err = read(colo_rl::Overlong::Error).unwrap_err().to_string();
    assert!(
        err.contains("data.filter_overlong_prompts = true"),
        "the error says how to drop them: {err}"
    );

    let mut cfg = config(&dir, 1);
    cfg.data.filter_overlong_prompts = true;
    cfg.data.val_files = colo_rl::config::Files::Many(vec![val.clone()]);
    let summary = colo_rl::step::run(&cfg, &dir.join("run"), false).unwrap();
    assert_eq!(summary.steps, 1);
    let evals = common::evals_of(&dir.join("run"));
    assert!(
        !evals.is_empty() && evals.iter().all(|e| e.n_samples == 1),
        "evaluated on the one prompt kept: {evals:?}"
    );

    let only_long = dir.join("long.jsonl");
    std::fs::write(
        &only_long,
        format!("{{\"prompt\": \"{long}\", \"answer\": \"2\"}}\n"),
    )
    .unwrap();
    let tok = colo_model::Tokenizer::from_dir(&fixture()).unwrap();
    let err = colo_rl::Dataset::from_files_max_len(
        &[only_long],
        &colo_rl::Fields::default(),
        &tok,
        64,
        colo_rl::Overlong::Drop,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("1 left out as longer than data.max_prompt_length = 64"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A GAE run's checkpoint holds its critic, so a resumed run's critic
/// continues where it was: step 2 after a resume is step 2 of an
/// uninterrupted run, the value loss included.
#[test]
fn a_gae_checkpoint_holds_the_critic() {
    let dir = tmp("gae");
    let reward = parity_reward(&dir);
    let gae = |steps: usize| {
        let more = "[trainer]\nval_before_train = false\n[algorithm]\nadv_estimator = \"gae\"";
        let mut cfg = run_toml(&dir, steps, &reward).with(more).config(&dir);
        cfg.trainer.save_freq = 1;
        cfg
    };
    let (full, cut) = (dir.join("full"), dir.join("cut"));
    colo_rl::step::run(&gae(2), &full, false).unwrap();
    colo_rl::step::run(&gae(1), &cut, false).unwrap();
    assert!(cut
        .join("checkpoints/step-1/critic/value_head.safetensors")
        .is_file());
    colo_rl::step::run(&gae(2), &cut, true).unwrap();
    let (a, b) = (steps_of(&full), steps_of(&cut));
    assert_eq!(b.len(), 2);
    assert_eq!(deterministic(&a[1]), deterministic(&b[1]));
    assert!(a[1].vf_loss.is_some());
    assert_eq!(a[1].vf_loss, b[1].vf_loss, "the critic was restored");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Resuming a GRPO run's directory with `adv_estimator = "gae"` is refused
/// naming the mismatch, and nothing changes: the newest checkpoint has no
/// critic, and skipping it for an older one would rewind the run and drop
/// the steps after that one from metrics.jsonl (it did).
#[test]
fn resuming_a_run_without_a_critic_as_gae_is_refused() {
    let dir = tmp("estimator-switch");
    let run = dir.join("run");
    colo_rl::step::run(&config(&dir, 2), &run, false).unwrap();
    let before = snapshot(&run);
    let mut gae = config(&dir, 3);
    gae.algorithm.adv_estimator = colo_algo::AdvEstimator::Gae;
    let err = colo_rl::step::run(&gae, &run, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("step-2 holds no critic (`critic/`)")
            && err.contains("`algorithm.adv_estimator = \"gae\"` needs one"),
        "{err}"
    );
    assert!(snapshot(&run) == before, "a refused resume changed files");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A run checkpointed in f32 and resumed with `trainer.dtype = "auto"`
/// continues in f32 whatever this machine's `auto` would be (bf16 here on
/// a CPU with AVX512_BF16); an explicit dtype is the user's choice, but
/// f32 for a bf16 checkpoint is refused.
#[test]
fn auto_resumes_in_the_checkpoints_dtype() {
    let dir = tmp("dtype");
    let run = dir.join("run");
    let reward = parity_reward(&dir);
    let parse = |steps: usize, dtype: &str| {
        let more = match dtype {
            "" => String::new(),
            _ => format!("[trainer]\ndtype = \"{dtype}\""),
        };
        run_toml(&dir, steps, &reward).with(&more).config(&dir)
    };
    colo_rl::step::run(&parse(2, "f32"), &run, false).unwrap();
    let saved = run.join("checkpoints/step-2");

    let (kept, _) = colo_rl::checkpoints::resume_dtype(&parse(4, "bf16"), &saved).unwrap();
    assert_eq!(kept.trainer.dtype, colo_rl::config::Dtype::Bf16);
    let (settled, _) = colo_rl::checkpoints::resume_dtype(&parse(4, ""), &saved).unwrap();
    assert_eq!(settled.trainer.dtype, colo_rl::config::Dtype::F32);

    // A bf16 run resumed with an explicit f32 is refused, naming both,
    // before anything is written (it failed on a tensor's name, after
    // config.toml had been rewritten).
    let bf16_run = dir.join("bf16");
    colo_rl::step::run(&parse(2, "bf16"), &bf16_run, false).unwrap();
    let before = snapshot(&bf16_run);
    let err = colo_rl::step::run(&parse(4, "f32"), &bf16_run, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("step-2 was saved in bf16, and this config's trainer.dtype = \"f32\" cannot continue it"),
        "{err}"
    );
    assert!(
        snapshot(&bf16_run) == before,
        "a refused resume changed files"
    );

    // The run directory records the resolved configuration it ran with.
    let first = parse(2, "f32");
    let saved_text = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let read_back = Config::from_toml(&saved_text, &run.join("config.toml")).unwrap();
    assert_eq!(read_back, first);

    let s = colo_rl::step::run(&parse(4, ""), &run, true).unwrap();
    // Continuing under other settings is said: the user's keys are
    // compared, `auto` as written.
    let notes = s.notes.join("\n");
    assert!(
        notes.contains(
            "the configuration differs from the run's config.toml in \
             trainer.dtype: \"f32\" → \"auto\", trainer.total_steps: 2 → 4;"
        ),
        "{notes}"
    );
    // A run that asks `auto` again is not told of a change its checkpoint
    // settled (the record says `auto`, not what it resolved to).
    // (Where `auto` would be bf16, another note says the checkpoint's f32
    // is kept; that one names trainer.dtype, the change note must not.)
    let s = colo_rl::step::run(&parse(6, ""), &run, true).unwrap();
    let notes = s.notes.join("\n");
    let changes = (s.notes.iter())
        .find(|n| n.contains("the configuration differs"))
        .unwrap_or_else(|| panic!("no note of the changes: {notes}"));
    assert!(
        changes.contains("in trainer.total_steps: 4 → 6;") && !changes.contains("trainer.dtype"),
        "{notes}"
    );
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("checkpoints/step-6/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["torch_dtype"], "float32", "{config}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reward that scores the samples 0, 1, 0, 1, … (every group varies)
/// for its first `varied` lines and 0 after (no group varies).
fn write_fading_reward(dir: &Path, varied: usize) -> PathBuf {
    let script = dir.join(format!("fading-{varied}.py"));
    std::fs::write(
        &script,
        format!(
            "import json, sys\nfor i, line in enumerate(sys.stdin):\n    r = json.loads(line)\n    \
             s = float(i % 2) if i < {varied} else 0.0\n    \
             print(json.dumps({{'id': r['id'], 'score': s}}), flush=True)\n"
        ),
    )
    .unwrap();
    script
}

/// Asked to stop while dynamic sampling still draws batches for step 3
/// (its reward stopped varying), the run drops that step but writes a
/// checkpoint of step 2, the last one finished (the configured save_freq
/// would not have), and `--resume` continues from it.
#[test]
fn a_stop_during_dynamic_sampling_keeps_the_finished_steps() {
    let dir = tmp("ds-stop");
    let run = dir.join("run");
    let filtered = |steps: usize, script: &Path| {
        common::fixture_run(&common::write_arith_data(&dir, 8), 4)
            .without("data", "val_fraction")
            .with(&common::python_reward(script))
            .with(&format!(
                r#"
[algorithm.filter_groups]
enable = true
max_num_gen_batches = 0

[trainer]
total_steps = {steps}
save_freq = 100
"#
            ))
            .config(&dir)
    };
    // Two steps of one generation batch each (2 prompts × 4 samples).
    let fading = write_fading_reward(&dir, 16);
    let config = filtered(10, &fading);
    let stop = colo_rl::step::Stop::new();
    let asker = {
        let (stop, run) = (stop.clone(), run.clone());
        std::thread::spawn(move || {
            let start = std::time::Instant::now();
            while start.elapsed().as_secs() < 120 {
                let two = run.join("metrics.jsonl").is_file() && steps_of(&run).len() >= 2;
                if two {
                    // Let step 3 draw a few batches first.
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            stop.request();
        })
    };
    let err = colo_rl::step::run_until(&config, &run, false, &stop).unwrap_err();
    asker.join().unwrap();
    let said = err.to_string();
    assert!(
        matches!(err, colo_rl::Error::StoppedMidStep(_))
            && said.contains("a checkpoint of step 2, the last one finished, was written"),
        "{said}"
    );
    assert!(run.join("checkpoints/step-2/model.safetensors").is_file());
    assert_eq!(steps_of(&run).len(), 2);
    // Resumed with a reward that varies again, the run goes on from step 2.
    let varied = write_fading_reward(&dir, 1_000_000);
    let config = filtered(3, &varied);
    let s = colo_rl::step::run(&config, &run, true).unwrap();
    assert_eq!((s.resumed_from, s.steps), (Some(2), 3));
    assert_eq!(steps_of(&run).len(), 3);
    std::fs::remove_dir_all(dir).unwrap();
}
