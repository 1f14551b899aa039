//! A whole run: where it starts (from scratch, or resumed from the newest
//! complete checkpoint with `metrics.jsonl` cut back to it), the run
//! directory's records, the device pool, a stop request, and the pictures
//! however it ends. The steps, and the loop over them with their
//! checkpoints and evaluations, are `step.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use colo_model::Tokenizer;

use crate::checkpoints::{self, DataState};
use crate::config::Config;
use crate::data::Dataset;
use crate::metrics::{self, MetricsWriter, Record};
use crate::run_config;
use crate::setup::{draw, load_data, open_model, uses_critic};
use crate::step::{train_steps, Run};
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
    /// Samples whose reward failed and scored the reward's `default_score`
    /// instead: those of the steps recorded in `metrics.jsonl` (before a
    /// resume too) and of this process's evaluations.
    pub reward_failures: u64,
    /// What the run said about where it started (also printed to stderr):
    /// checkpoints skipped, records removed, starting from scratch.
    pub notes: Vec<String>,
}

/// A request that a run stop early, which any thread may make (a Ctrl-C
/// handler): the run finishes the step under way, saves a checkpoint of
/// the steps done, writes its pictures and returns, so `--resume`
/// continues from there and nothing done is lost. Cloning shares the
/// request, and what the run says of its progress: a process that stops
/// at once says what is lost ([`Stop::stopped_now`]).
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<StopState>);

#[derive(Debug, Default)]
struct StopState {
    requested: AtomicBool,
    /// The step under way (1-based); 0 between steps.
    under_way: AtomicUsize,
    /// The step of the newest complete checkpoint; 0 for none.
    checkpoint: AtomicUsize,
    /// Whether the run's first step (or `val_only`'s evaluation) began:
    /// a run that fails before it leaves its directory as it was.
    began: AtomicBool,
}

impl Stop {
    pub fn new() -> Self {
        Stop::default()
    }

    /// Asks the run to stop after the step under way.
    pub fn request(&self) {
        self.0.requested.store(true, Ordering::SeqCst);
    }

    pub fn requested(&self) -> bool {
        self.0.requested.load(Ordering::SeqCst)
    }

    /// What stopping the process now loses and keeps, for the message of
    /// a second Ctrl-C: `step 24, under way, is lost; the checkpoint of
    /// step 23 is complete`. Between steps (loading, the last evaluation,
    /// the pictures) no step is lost.
    pub fn stopped_now(&self) -> String {
        let kept = match self.0.checkpoint.load(Ordering::SeqCst) {
            0 => "no checkpoint was written".to_owned(),
            n => format!("the checkpoint of step {n} is complete"),
        };
        match self.0.under_way.load(Ordering::SeqCst) {
            0 => kept,
            k => format!("step {k}, under way, is lost; {kept}"),
        }
    }

    pub(crate) fn step_began(&self, step: usize) {
        self.0.began.store(true, Ordering::SeqCst);
        self.0.under_way.store(step, Ordering::SeqCst);
    }

    pub(crate) fn step_ended(&self) {
        self.0.under_way.store(0, Ordering::SeqCst);
    }

    pub(crate) fn saved(&self, step: usize) {
        self.0.checkpoint.store(step, Ordering::SeqCst);
    }
}

/// Where a run starts, decided before anything is loaded.
pub(crate) struct Start {
    /// RL steps already done (the checkpoint's N; 0 from scratch).
    pub(crate) first_step: usize,
    /// Generation batches already drawn from the training data.
    pub(crate) first_batch: usize,
    pub(crate) total: usize,
    /// From the kept records of a resumed run.
    pub(crate) before: Earlier,
    pub(crate) notes: Vec<String>,
}

impl Start {
    fn say(&mut self, note: String) {
        crate::progress::say(&note);
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
    let before = Before::of(out)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    // Held until the run returns: one run at a time in a directory.
    let _lock = crate::run_lock::lock(out)?;
    stop.0.began.store(false, Ordering::SeqCst);
    let result = run_locked(config, out, resume, stop);
    if result.is_err() && !stop.0.began.load(Ordering::SeqCst) {
        before.restore(out);
    }
    result
}

/// What a run directory held before a run, so that a run that fails
/// before its first step (a refused dataset, model, reward or schedule)
/// leaves it as it was: its lock file, `checkpoints/`, `config.toml`,
/// `metrics.jsonl`, the pictures and the built-in task's `base/` and
/// `data/` are removed, and a rerun finds no earlier run there.
struct Before {
    existed: bool,
    entries: std::collections::HashSet<std::ffi::OsString>,
    /// The directories above `out` that making it makes, deepest first.
    parents: Vec<PathBuf>,
}

impl Before {
    fn of(out: &Path) -> Result<Before> {
        let mut entries = std::collections::HashSet::new();
        if out.is_dir() {
            for e in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
                entries.insert(e.map_err(|e| Error::io(out, e))?.file_name());
            }
        }
        let parents = (out.ancestors().skip(1))
            .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
            .map(Path::to_path_buf)
            .collect();
        Ok(Before {
            existed: out.is_dir(),
            entries,
            parents,
        })
    }

    /// Removes what the run made in `out` (the lock file last: the run
    /// holds it until it returns); what cannot be removed is said.
    fn restore(&self, out: &Path) {
        let left = |path: &Path, e: std::io::Error| {
            log::warn!(
                "the run failed before its first step, and {} could not be removed: {e}",
                path.display()
            )
        };
        if !self.existed {
            if let Err(e) = std::fs::remove_dir_all(out) {
                left(out, e);
            }
            // Only while empty: another run may be writing beside `out`.
            for dir in &self.parents {
                let _ = std::fs::remove_dir(dir);
            }
            return;
        }
        let Ok(read) = std::fs::read_dir(out) else {
            return;
        };
        let lock = std::ffi::OsStr::new(crate::run_lock::FILE);
        let mut made: Vec<_> = (read.flatten())
            .filter(|e| !self.entries.contains(&e.file_name()))
            .map(|e| e.path())
            .collect();
        made.sort_by_key(|p| p.file_name() == Some(lock));
        for path in made {
            let removed = match path.is_dir() {
                true => std::fs::remove_dir_all(&path),
                false => std::fs::remove_file(&path),
            };
            if let Err(e) = removed {
                left(&path, e);
            }
        }
    }
}

/// [`run_until`] once the run directory is locked: what `--resume` finds
/// (before anything is written), the model and the data, where the run
/// starts, its records, then the device pool, the steps and the pictures.
fn run_locked(asked: &Config, out: &Path, resume: bool, stop: &Stop) -> Result<RunSummary> {
    let config = &dumps_in_run_dir(asked, out);
    if config.trainer.val_only {
        return evaluate_only(config, asked, out, resume, stop);
    }
    let looked = look_for_checkpoint(config, out, resume)?;
    let ckpt_dir = out.join(checkpoints::DIR);
    let leftovers = checkpoints::prepare_dir(&ckpt_dir, uses_critic(config))?;
    let (model_dir, tokenizer) = open_model(config, &out.join("base"))?;
    let (train, val) = load_data(config, out, &tokenizer)?;

    // ---- resume: which checkpoint, and the records after it go -------------
    let mut start = Start {
        first_step: 0,
        first_batch: 0,
        total: total_steps(config, &train)?,
        before: Earlier::default(),
        notes: Vec::new(),
    };
    for note in leftovers {
        start.say(note);
    }
    start.notes.extend(looked.skipped);
    let resumed_config = match looked.found {
        None => None,
        Some(found) => match start.resume(config, out, found, looked.replaced, stop)? {
            Resumed::Steps(c) => c,
            Resumed::Complete(summary) => return Ok(summary),
        },
    };
    let (metrics, mut timeline) = open_records(out, start.first_step)?;

    // ---- device, worker, steps; the pictures however it ends ---------------
    // The record holds what the user asked for (`auto` stays `auto`): the
    // checkpoint's settling of it is said in its own note, not as a change.
    if start.first_step > 0 {
        if let Some(note) = run_config::changes(out, asked)? {
            start.say(note);
        }
    }
    run_config::write(out, asked)?;
    let config = resumed_config.as_deref().unwrap_or(config);
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
    with_pictures(result, out, &pool, &mut timeline)
}

/// The config the run uses: the generation dumps go where the run
/// directory says ([`crate::config::TrainerConfig::dumps_in`]);
/// `config.toml` records the paths as asked.
fn dumps_in_run_dir(asked: &Config, out: &Path) -> Config {
    let mut config = asked.clone();
    let t = &mut config.trainer;
    (t.rollout_data_dir, t.validation_data_dir) = asked.trainer.dumps_in(out);
    config
}

/// What `--resume` found in `out/checkpoints`.
struct Looked {
    /// The newest complete checkpoint and the directories skipped (`None`
    /// without `--resume`).
    found: Option<checkpoints::Found>,
    /// The notes said of the skipped directories, for the summary.
    skipped: Vec<String>,
    /// What `--resume` starts over where the run wrote no checkpoint.
    replaced: Option<String>,
}

/// With `resume`, the newest complete checkpoint (the directories skipped
/// said now: a refusal here follows from them); and the refusals due
/// before anything is written: an earlier run's work overwritten by a run
/// from scratch, a checkpoint of another model.
fn look_for_checkpoint(config: &Config, out: &Path, resume: bool) -> Result<Looked> {
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
            crate::progress::say(&note);
            note
        })
        .collect();
    // Nor is an earlier run's work overwritten by a run from scratch.
    if found.as_ref().is_none_or(|f| f.latest.is_none()) {
        checkpoints::check_fresh_start(out, resume)?;
    }
    // A checkpoint of another model (another run's configuration) is
    // refused before anything is written.
    if let Some((_, dir)) = found.as_ref().and_then(|f| f.latest.as_ref()) {
        checkpoints::check_same_model(config, dir)?;
    }
    // What `--resume` starts over where the run wrote no checkpoint.
    let replaced = match found.as_ref().is_some_and(|f| f.latest.is_none()) {
        true => checkpoints::earlier_run(out)?,
        false => None,
    };
    Ok(Looked {
        found,
        skipped,
        replaced,
    })
}

/// The run's total steps over `train`; refused when the actor's
/// learning-rate schedule does not fit their optimizer steps.
fn total_steps(config: &Config, train: &Dataset) -> Result<usize> {
    let total = config.total_steps(train.len());
    // A run in epochs knows its optimizer steps only now.
    let optimizer_steps = total.saturating_mul(config.batch.optimizer_steps_per_step);
    if let Some(why) =
        crate::config::schedule_error(&config.actor.optim(), "actor", optimizer_steps)
    {
        return Err(Error::Dataset(format!(
            "{} training prompts make {total} steps: {why}",
            train.len()
        )));
    }
    Ok(total)
}

/// What `--resume` leaves to do.
enum Resumed {
    /// The steps from [`Start::first_step`]; in the checkpoint's
    /// configuration (its dtype for `auto`) when there is one, `None` from
    /// scratch.
    Steps(Option<Box<Config>>),
    /// Nothing: the checkpoint is of the run's last step.
    Complete(RunSummary),
}

impl Start {
    /// Where `--resume` starts the run, from what it `found`: from scratch
    /// without a complete checkpoint (over what an earlier run that wrote
    /// none left: `replaced`); refused beyond the run's total steps; else
    /// after the checkpoint.
    fn resume(
        &mut self,
        config: &Config,
        out: &Path,
        found: checkpoints::Found,
        replaced: Option<String>,
        stop: &Stop,
    ) -> Result<Resumed> {
        let total = self.total;
        match found.latest {
            None => {
                self.say(match replaced {
                    None => format!(
                        "--resume: no complete checkpoint in {}; starting from scratch",
                        out.join(checkpoints::DIR).display()
                    ),
                    Some(what) => format!(
                        "--resume: {} holds no checkpoint (its run wrote none); starting from \
                         scratch, replacing its records ({what})",
                        out.display()
                    ),
                });
                Ok(Resumed::Steps(None))
            }
            Some((step, dir)) if step > total => Err(Error::Resume(format!(
                "the newest checkpoint, {}, is at step {step}, beyond trainer.total_steps = {total}; \
                 continuing would overwrite newer checkpoints with older steps. \
                 Set trainer.total_steps to at least {step}, or use another run directory",
                dir.display()
            ))),
            Some((step, dir)) => self.continue_from(config, out, step, &dir, stop),
        }
    }

    /// Starts after the checkpoint of `step` in `dir`: its dtype, its place
    /// in the data, `metrics.jsonl` cut back to it and what its records
    /// say; [`Resumed::Complete`] when it is of the last step.
    fn continue_from(
        &mut self,
        config: &Config,
        out: &Path,
        step: usize,
        dir: &Path,
        stop: &Stop,
    ) -> Result<Resumed> {
        let total = self.total;
        let metrics_path = out.join("metrics.jsonl");
        let (resumed_config, note) = checkpoints::resume_dtype(config, dir)?;
        if let Some(note) = note {
            self.say(note);
        }
        let dynamic = config.algorithm.filter_groups.enable;
        let (at, note) = DataState::resume(dir, step, config.batch.gen_batch_prompts, dynamic)?;
        // Only once the checkpoint is known to resume.
        let removed = metrics::truncate_after(&metrics_path, step)?;
        if let Some(note) = note {
            self.say(note);
        }
        (self.first_step, self.first_batch) = (step, at);
        self.before = earlier(&metrics_path)?;
        stop.saved(step);
        self.say(format!(
            "--resume: continuing from {} (step {step} of {total}){}",
            dir.display(),
            match removed {
                0 => String::new(),
                1 => format!("; removed 1 record after step {step} from metrics.jsonl"),
                n => format!("; removed {n} records after step {step} from metrics.jsonl"),
            }
        ));
        if step != total {
            return Ok(Resumed::Steps(Some(Box::new(resumed_config))));
        }
        self.say(format!(
            "--resume: the run is already complete ({total} of {total} steps); nothing to do"
        ));
        Ok(Resumed::Complete(self.complete(out)))
    }

    /// The summary of a resumed run with no step left, from its records.
    fn complete(&mut self, out: &Path) -> RunSummary {
        RunSummary {
            run_dir: out.to_owned(),
            steps: self.total,
            total_steps: self.total,
            resumed_from: Some(self.first_step),
            first_accuracy: self.before.first,
            last_accuracy: self.before.last,
            last_accuracy_by_source: BTreeMap::new(),
            peak_device_bytes: self.before.peak,
            peak_allocated_bytes: self.before.peak_allocated,
            reward_failures: self.before.reward_failures,
            notes: std::mem::take(&mut self.notes),
        }
    }
}

/// The run's records, `metrics.jsonl` and `timeline.jsonl`: new for a run
/// from scratch, appended to after the checkpoint of `first_step`.
fn open_records(out: &Path, first_step: usize) -> Result<(MetricsWriter, TimelineWriter)> {
    let metrics_path = out.join("metrics.jsonl");
    let metrics = match first_step {
        0 => MetricsWriter::create(&metrics_path)?,
        _ => MetricsWriter::append(&metrics_path)?,
    };
    let timeline_path = out.join("timeline.jsonl");
    let timeline = match first_step {
        0 => TimelineWriter::create(&timeline_path)?,
        step => TimelineWriter::resume(&timeline_path, step)?,
    };
    Ok((metrics, timeline))
}

/// The pictures, drawn after the steps however they ended: the steps'
/// error, if any, is the run's (a failure to draw is then logged).
fn with_pictures(
    result: Result<RunSummary>,
    out: &Path,
    pool: &colo_mem::Pool,
    timeline: &mut TimelineWriter,
) -> Result<RunSummary> {
    match (result, draw(out, pool, timeline)) {
        (Ok(summary), drawn) => drawn.map(|()| summary),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(d)) => {
            log::error!("could not write the run's pictures: {d}");
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
fn evaluate_only(
    config: &Config,
    asked: &Config,
    out: &Path,
    resume: bool,
    stop: &Stop,
) -> Result<RunSummary> {
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
    run_config::write(out, asked)?;
    make_dump_dirs(config)?;
    let metrics = MetricsWriter::create(&out.join("metrics.jsonl"))?;
    let pool = crate::setup::make_pool(config)?;
    let total = config.total_steps(train.len());
    let model = (model_dir, tokenizer);
    let mut run = Run::new(
        config,
        out,
        &pool,
        model,
        val,
        metrics,
        total,
        Default::default(),
    )?;
    stop.0.began.store(true, Ordering::SeqCst);
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
        reward_failures: run.reward.failures(),
        notes: Vec::new(),
    })
}

/// What the steps are set up from.
pub(crate) struct Setup {
    pub(crate) model_dir: PathBuf,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) train: Dataset,
    pub(crate) val: Dataset,
    pub(crate) metrics: MetricsWriter,
}

/// What the records of a resumed run say.
#[derive(Default)]
pub(crate) struct Earlier {
    /// The accuracy before the first step, and the last one.
    pub(crate) first: Option<f64>,
    pub(crate) last: Option<f64>,
    /// Peak device bytes over the steps, and of them allocated.
    pub(crate) peak: u64,
    pub(crate) peak_allocated: u64,
    /// Samples whose reward failed, over the steps.
    pub(crate) reward_failures: u64,
    /// The last evaluation's step.
    pub(crate) evaluated_at: Option<usize>,
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
                e.reward_failures += s.reward_failures;
            }
        }
    }
    Ok(e)
}
