//! A whole run: where it starts (from scratch, or resumed from the newest
//! complete checkpoint with `metrics.jsonl` cut back to it), the device
//! pool, the worker, the evaluations and checkpoints around the steps, and
//! the pictures however it ends. The step itself is `loop.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use colo_model::Tokenizer;

use crate::checkpoints::{self, DataState};
use crate::config::Config;
use crate::data::{Batches, Dataset};
use crate::metrics::{self, MetricsWriter, Record};
use crate::progress::{Progress, Status};
use crate::r#loop::Run;
use crate::run_config;
use crate::setup::{draw, load_data, open_model, uses_critic};
use crate::timeline_file::TimelineWriter;
use crate::{Error, Result};

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    /// Steps completed in total (including those before a resume).
    pub steps: usize,
    /// The run's total steps: more than `steps` when it was stopped early
    /// ([`Stop`]), with a checkpoint of `steps` to resume from.
    pub total_steps: usize,
    /// The checkpoint's step a `--resume` continued from (`None`: from
    /// scratch).
    pub resumed_from: Option<usize>,
    /// Held-out accuracy of the starting checkpoint and at the end (read
    /// back from `metrics.jsonl` for the steps before a resume).
    pub first_accuracy: Option<f64>,
    pub last_accuracy: Option<f64>,
    /// The last evaluation's accuracy per `data_source` (verl's
    /// `val-core/{data_source}/…`); empty when its rows name none, or when
    /// this run evaluated nothing (a resumed run with no step left).
    pub last_accuracy_by_source: BTreeMap<String, f64>,
    /// The largest `memory/peak_device_bytes` of the run's steps, those
    /// before a resume included.
    pub peak_device_bytes: u64,
    /// The same of `memory/peak_allocated_bytes` (cached blocks not
    /// counted).
    pub peak_allocated_bytes: u64,
    /// What the run said about where it started (also printed to stderr):
    /// checkpoints skipped, records removed, starting from scratch.
    pub notes: Vec<String>,
}

/// A request that a run stop early, which any thread may make (a Ctrl-C
/// handler): the run finishes the step under way, saves a checkpoint of
/// the steps done, writes its pictures and returns, so `--resume`
/// continues from there and nothing done is lost. Cloning shares the
/// request.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn new() -> Self {
        Stop::default()
    }

    /// Asks the run to stop after the step under way.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Where a run starts, decided before anything is loaded.
struct Start {
    /// RL steps already done (the checkpoint's N; 0 from scratch).
    first_step: usize,
    /// Generation batches already drawn from the training data.
    first_batch: usize,
    total: usize,
    /// From the kept records of a resumed run.
    before: Earlier,
    notes: Vec<String>,
}

impl Start {
    fn say(&mut self, note: String) {
        eprintln!("{note}");
        self.notes.push(note);
    }
}

/// Runs `config` into `out` (the run directory). With `resume`, continues
/// from the newest complete checkpoint in `out/checkpoints` (see
/// [`crate::checkpoints`]): refused when it is beyond the run's total
/// steps, nothing to do when it is the last, and `metrics.jsonl` keeps only
/// the records up to its step. Once the device pool exists, the memory
/// timeline and the pictures are written however the run ends.
pub fn run(config: &Config, out: &Path, resume: bool) -> Result<RunSummary> {
    run_until(config, out, resume, &Stop::new())
}

/// [`run`], stopping early when `stop` is requested: after the step under
/// way, with a checkpoint of the steps done (no end-of-run evaluation).
pub fn run_until(config: &Config, out: &Path, resume: bool, stop: &Stop) -> Result<RunSummary> {
    // ---- setup: files, model, data -----------------------------------------
    if out.exists() && !out.is_dir() {
        let why =
            "the run directory is a file; name a directory (--out, or trainer.experiment_name)";
        return Err(Error::io(out, std::io::Error::other(why)));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    // Held until the run returns: one run at a time in a directory.
    let _lock = crate::run_lock::lock(out)?;
    if config.trainer.val_only {
        return evaluate_only(config, out, resume);
    }
    let ckpt_dir = out.join(checkpoints::DIR);
    // Read only: nothing is written until the resume is known to make sense.
    let found = resume
        .then(|| checkpoints::latest_complete(&ckpt_dir, uses_critic(config)))
        .transpose()?;
    // Said now (a refusal below follows from them) and kept for the summary.
    let skipped: Vec<String> = (found.iter().flat_map(|f| &f.skipped))
        .map(|(dir, why)| {
            let note = format!(
                "--resume: {} is not a complete checkpoint ({why}); skipped",
                dir.display()
            );
            eprintln!("{note}");
            note
        })
        .collect();
    // Nor is an earlier run's work overwritten by a run from scratch.
    if found.as_ref().is_none_or(|f| f.latest.is_none()) {
        checkpoints::check_fresh_start(out, resume)?;
    }
    let leftovers = checkpoints::prepare_dir(&ckpt_dir, uses_critic(config))?;
    let (model_dir, tokenizer) = open_model(config, &out.join("base"))?;
    let (train, val) = load_data(config, out, &tokenizer)?;

    // ---- resume: which checkpoint, and the records after it go -------------
    let total = config.total_steps(train.len());
    // A run in epochs knows its optimizer steps only now.
    let optimizer_steps = total.saturating_mul(config.batch.optimizer_steps_per_step);
    if let Some(why) = config.actor.optim.schedule_error(optimizer_steps) {
        return Err(Error::Dataset(format!(
            "{} training prompts make {total} steps: {why}",
            train.len()
        )));
    }
    let metrics_path = out.join("metrics.jsonl");
    let mut start = Start {
        first_step: 0,
        first_batch: 0,
        total,
        before: Earlier::default(),
        notes: Vec::new(),
    };
    for note in leftovers {
        start.say(note);
    }
    start.notes.extend(skipped);
    let mut resumed_config = None;
    if let Some(found) = found {
        match found.latest {
            None => start.say(format!(
                "--resume: no complete checkpoint in {}; starting from scratch",
                ckpt_dir.display()
            )),
            Some((step, dir)) if step > total => {
                return Err(Error::Resume(format!(
                    "the newest checkpoint, {}, is at step {step}, beyond trainer.total_steps = {total}; \
                     continuing would overwrite newer checkpoints with older steps. \
                     Set trainer.total_steps to at least {step}, or use another run directory",
                    dir.display()
                )))
            }
            Some((step, dir)) => {
                let (c, note) = checkpoints::resume_dtype(config, &dir)?;
                resumed_config = Some(c);
                if let Some(note) = note {
                    start.say(note);
                }
                let removed = metrics::truncate_after(&metrics_path, step)?;
                let dynamic = config.algorithm.filter_groups.is_some();
                let (at, note) =
                    DataState::resume(&dir, step, config.batch.gen_batch_prompts, dynamic)?;
                if let Some(note) = note {
                    start.say(note);
                }
                (start.first_step, start.first_batch) = (step, at);
                start.before = earlier(&metrics_path)?;
                start.say(format!(
                    "--resume: continuing from {} (step {step} of {total}){}",
                    dir.display(),
                    match removed {
                        0 => String::new(),
                        n => format!("; removed {n} records after step {step} from metrics.jsonl"),
                    }
                ));
                if step == total {
                    start.say(format!(
                        "--resume: the run is already complete ({total} of {total} steps); nothing to do"
                    ));
                    return Ok(RunSummary {
                        run_dir: out.to_owned(),
                        steps: total,
                        total_steps: total,
                        resumed_from: Some(step),
                        first_accuracy: start.before.first,
                        last_accuracy: start.before.last,
                        last_accuracy_by_source: BTreeMap::new(),
                        peak_device_bytes: start.before.peak,
                        peak_allocated_bytes: start.before.peak_allocated,
                        notes: start.notes,
                    });
                }
            }
        }
    }
    let metrics = match start.first_step {
        0 => MetricsWriter::create(&metrics_path)?,
        _ => MetricsWriter::append(&metrics_path)?,
    };
    let timeline_path = out.join("timeline.jsonl");
    let mut timeline = match start.first_step {
        0 => TimelineWriter::create(&timeline_path)?,
        step => TimelineWriter::resume(&timeline_path, step)?,
    };

    // ---- device, worker, steps; the pictures however it ends ---------------
    // The record holds what the user asked for (`auto` stays `auto`): the
    // checkpoint's settling of it is said in its own note, not as a change.
    if start.first_step > 0 {
        if let Some(note) = run_config::changes(out, config)? {
            start.say(note);
        }
    }
    run_config::write(out, config)?;
    let config = resumed_config.as_ref().unwrap_or(config);
    make_dump_dirs(config)?;
    let pool = crate::setup::make_pool(config)?;
    // A resumed process's start-up belongs after its checkpoint's step.
    pool.set_step(start.first_step as u64);
    let setup = Setup {
        model_dir,
        tokenizer,
        train,
        val,
        metrics,
    };
    let result = train_steps(config, out, &pool, setup, start, &mut timeline, stop);
    match (result, draw(out, &pool, &mut timeline)) {
        (Ok(summary), drawn) => drawn.map(|()| summary),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(d)) => {
            eprintln!("could not write the run's pictures: {d}");
            Err(e)
        }
    }
}

/// The generation dumps' directories, made at the start: one that cannot
/// be is said before the first step, not after it.
fn make_dump_dirs(config: &Config) -> Result<()> {
    let t = &config.trainer;
    for (key, dir) in [
        ("trainer.rollout_data_dir", &t.rollout_data_dir),
        ("trainer.validation_data_dir", &t.validation_data_dir),
    ] {
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                let why = format!("{key} must name a directory colo can make or write: {e}");
                Error::io(dir, std::io::Error::new(e.kind(), why))
            })?;
        }
    }
    Ok(())
}

/// `trainer.val_only`: the starting model evaluated on the held-out
/// prompts, its record in `metrics.jsonl` (its generations in
/// `validation_data_dir`); nothing is trained, checkpointed or drawn.
fn evaluate_only(config: &Config, out: &Path, resume: bool) -> Result<RunSummary> {
    if resume {
        let why = crate::config::VAL_ONLY_RESUME;
        return Err(Error::Resume(format!("trainer.val_only {why}")));
    }
    // `--resume`, which the refusal suggests, is no way on for val_only.
    checkpoints::check_fresh_start(out, false).map_err(|e| match e {
        Error::RunExists { dir, what, .. } => Error::RunExists {
            dir,
            what,
            how: "trainer.val_only writes its evaluation into a directory of its own: name \
                  another with --out (model.path = \"DIR/checkpoints/step-N\" evaluates a \
                  checkpoint of it)",
        },
        e => e,
    })?;
    let (model_dir, tokenizer) = open_model(config, &out.join("base"))?;
    let (train, val) = load_data(config, out, &tokenizer)?;
    run_config::write(out, config)?;
    make_dump_dirs(config)?;
    let metrics = MetricsWriter::create(&out.join("metrics.jsonl"))?;
    let pool = crate::setup::make_pool(config)?;
    let total = config.total_steps(train.len());
    let model = (model_dir, tokenizer);
    let mut run = Run::new(config, out, &pool, model, val, metrics, total)?;
    let accuracy = run.evaluate(0)?;
    let stats = pool.stats();
    Ok(RunSummary {
        run_dir: out.to_owned(),
        steps: 0,
        total_steps: 0,
        resumed_from: None,
        first_accuracy: Some(accuracy),
        last_accuracy: Some(accuracy),
        last_accuracy_by_source: std::mem::take(&mut run.accuracy_by_source),
        peak_device_bytes: stats.peak_resident_bytes,
        peak_allocated_bytes: stats.peak_allocated_bytes,
        notes: Vec::new(),
    })
}

/// What the steps are set up from.
struct Setup {
    model_dir: PathBuf,
    tokenizer: Tokenizer,
    train: Dataset,
    val: Dataset,
    metrics: MetricsWriter,
}

/// What the records of a resumed run say.
#[derive(Default)]
struct Earlier {
    /// The accuracy before the first step, and the last one.
    first: Option<f64>,
    last: Option<f64>,
    /// Peak device bytes over the steps, and of them allocated.
    peak: u64,
    peak_allocated: u64,
    /// The last evaluation's step.
    evaluated_at: Option<usize>,
}

/// [`Earlier`] from the records in `metrics.jsonl`.
fn earlier(path: &Path) -> Result<Earlier> {
    let mut e = Earlier::default();
    if !path.is_file() {
        return Ok(e);
    }
    for r in metrics::read(path)? {
        match r {
            Record::Eval(r) => {
                if r.step == 0 {
                    e.first = Some(r.accuracy);
                }
                (e.last, e.evaluated_at) = (Some(r.accuracy), Some(r.step));
            }
            Record::Step(s) => {
                e.peak = e.peak.max(s.peak_device_bytes);
                e.peak_allocated = e.peak_allocated.max(s.peak_allocated_bytes);
            }
        }
    }
    Ok(e)
}

/// The worker, the evaluations and the steps from `start.first_step`.
fn train_steps(
    config: &Config,
    out: &Path,
    pool: &Arc<colo_mem::Pool>,
    setup: Setup,
    start: Start,
    timeline: &mut TimelineWriter,
    stop: &Stop,
) -> Result<RunSummary> {
    let Setup {
        model_dir,
        tokenizer,
        train,
        val,
        metrics,
    } = setup;
    let (first_step, total) = (start.first_step, start.total);
    let model = (model_dir, tokenizer);
    let mut run = Run::new(config, out, pool, model, val, metrics, total)?;
    run.stop_request = stop.clone();
    let ckpt_dir = out.join(checkpoints::DIR);
    if first_step > 0 {
        let dir = checkpoints::step_dir(&ckpt_dir, first_step);
        run.worker.load_checkpoint(&dir)?;
    }

    let batches = Batches::of_run(&train, config)?;
    let mut next_batch = start.first_batch;
    let data_state = |next_batch| DataState {
        gen_batches: next_batch,
        gen_batch_size: config.batch.gen_batch_prompts,
    };
    let mut progress = Progress::stderr(total);
    let Earlier {
        first: mut first_accuracy,
        last: mut last_accuracy,
        mut peak,
        mut peak_allocated,
        evaluated_at,
    } = start.before;
    // Evaluations during the run happen at the start of the next step's
    // rollout phase (the same weights, no switch of their own); the record
    // comes before that step's, as if evaluated in between. A resumed run
    // makes up an evaluation of its checkpoint's step that was due but not
    // logged (a run stopped between the checkpoint and the next step).
    let evaluates = config.evaluates();
    let test_step = |done: usize| {
        evaluates
            && config
                .trainer
                .test_freq
                .is_some_and(|f| done.is_multiple_of(f))
    };
    run.pending_eval = match first_step {
        0 => (evaluates && config.trainer.val_before_train).then_some(0),
        k => (test_step(k) && evaluated_at != Some(k)).then_some(k),
    };

    // ---- the steps ---------------------------------------------------------
    let mut last = total;
    for step in first_step..total {
        let batch_at_start = next_batch;
        let mut draw = || {
            let b = batches.batch(next_batch);
            next_batch = next_batch.saturating_add(1);
            b
        };
        let m = match run.step(step, &mut draw) {
            // Dynamic sampling still drawing batches when asked to stop:
            // the step under way is dropped, but the steps finished since
            // the last checkpoint are kept, as without dynamic sampling.
            Err(Error::StoppedMidStep(why)) => {
                let unsaved = step > first_step && !checkpoints::step_dir(&ckpt_dir, step).exists();
                if !unsaved {
                    return Err(Error::StoppedMidStep(why));
                }
                run.save(&ckpt_dir, step, &data_state(batch_at_start))?;
                return Err(Error::StoppedMidStep(format!(
                    "{why}; a checkpoint of step {step}, the last one finished, was written"
                )));
            }
            r => r.map_err(|e| e.explained_by(pool))?,
        };
        if let Some((at, accuracy)) = run.evaluated.take() {
            if at == 0 {
                first_accuracy = Some(accuracy);
            }
            last_accuracy = Some(accuracy);
        }
        peak = peak.max(m.peak_device_bytes);
        peak_allocated = peak_allocated.max(m.peak_allocated_bytes);
        run.metrics.step(&m)?;
        timeline.append_new(pool)?;
        let done = step + 1;
        let stopping = stop.requested() && done < total;
        let saves = config.trainer.save_freq.is_some_and(|f| done % f == 0);
        if (saves || stopping) && done < total {
            run.save(&ckpt_dir, done, &data_state(next_batch))?;
        }
        if test_step(done) && done < total {
            // Made up by `--resume` when stopping here.
            run.pending_eval = Some(done);
        }
        progress.update(
            done,
            Status {
                score: m.score_mean,
                accuracy: last_accuracy,
            },
        );
        if stopping {
            last = done;
            break;
        }
    }

    // ---- the end: one evaluation, the last checkpoint ----------------------
    // (`run` returns early when a resumed run has no step left, so this
    // evaluation is the only one at `total`.)
    if last == total {
        if evaluates {
            last_accuracy = Some(run.evaluate(total)?);
        }
        run.save(&ckpt_dir, total, &data_state(next_batch))?;
    }
    Ok(RunSummary {
        run_dir: out.to_owned(),
        steps: last,
        total_steps: total,
        resumed_from: (first_step > 0).then_some(first_step),
        first_accuracy,
        last_accuracy,
        last_accuracy_by_source: run.accuracy_by_source,
        peak_device_bytes: peak,
        peak_allocated_bytes: peak_allocated,
        notes: start.notes,
    })
}
