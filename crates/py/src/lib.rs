//! `colo._colo`: one data-parallel rank of a colo run, for Python.
//!
//! [`Worker`] wraps colo-rl's [`Rank`]: the hybrid worker (actor, rollout
//! engine, reference on one device) with its share of each step. The Ray
//! controller (`python/colo/controller.py`) makes one per device and calls
//! the same methods on all of them. Long calls release the GIL.
//!
//! The ranks' updates meet in a communicator object the controller passes
//! in (torch.distributed in practice): the trainer's
//! [`Collective`] calls back into Python with the gradient accumulators as
//! writable `memoryview`s of their memory (no copy between Rust and
//! Python; `torch.frombuffer` makes tensors of them), and with host values
//! as lists of floats.
//!
//! This crate is a foreign-function boundary like colo-mem, so it holds
//! the one `unsafe` block it needs (the memoryview over tensor memory),
//! with its `// SAFETY:` note.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use colo_rl::data_parallel::{NamedWeights, Rank};
use colo_rl::worker::Phase;
use colo_rl::Config;
use colo_rollout::SamplingParams;
use colo_train::Collective;

mod collective;
mod rows;
mod tensor_parallel;
use collective::PyCollective;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A worker's lock after a call panicked while holding it.
fn poisoned() -> PyErr {
    PyRuntimeError::new_err("an earlier call on this worker panicked")
}

fn err(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

// Named `colo._colo.StepInterrupted`, so that Ray can unpickle it in the
// controller from a worker's failure.
pyo3::create_exception!(
    colo._colo,
    StepInterrupted,
    PyRuntimeError,
    "A step that could not finish because the run was asked to stop (dynamic sampling still \
     drawing batches): nothing of it trained, the checkpoints written before it are complete."
);

/// [`err`], with a step the run's stop request cut short as [`StepInterrupted`].
fn step_err(e: colo_rl::Error) -> PyErr {
    match e {
        colo_rl::Error::StoppedMidStep(_) => StepInterrupted::new_err(e.to_string()),
        e => err(e),
    }
}

/// A completion as Python sees it: (token ids, log-probabilities, finish
/// reason).
type Sample = (Vec<u32>, Vec<f32>, String);

/// A view of one tensor: (name, shape, dtype, buffer).
type View = (String, Vec<i64>, &'static str, Py<PyAny>);

/// One rank of a data-parallel colo run.
#[pyclass(module = "colo._colo")]
struct Worker {
    /// Python may call from any thread; the rank runs one call at a time.
    rank: Mutex<Rank>,
    /// Zero-copy views of the training state handed out and not yet
    /// closed, one list of buffers per `open_views`: while any is open, the
    /// worker refuses to switch phase (the switch would release the memory
    /// they point at), and closing one releases its memoryviews, which
    /// fails while a tensor made from one still holds it.
    views: Mutex<Vec<Vec<Py<PyAny>>>>,
    /// `finish` has written the rank's timeline and pictures: calls that
    /// would change the run are refused after it (reading is not).
    finished: AtomicBool,
}

impl Worker {
    /// How many `open_views` are not closed.
    fn views_open(&self) -> usize {
        self.views.lock().map_or(0, |v| v.len())
    }

    fn rank(&self) -> PyResult<std::sync::MutexGuard<'_, Rank>> {
        self.rank.lock().map_err(|_| poisoned())
    }

    /// The rank, for a call that changes the run: refused after `finish`.
    fn live(&self, op: &str) -> PyResult<std::sync::MutexGuard<'_, Rank>> {
        if self.finished.load(Ordering::Acquire) {
            return Err(PyRuntimeError::new_err(format!(
                "{op}: the worker has finished (finish() wrote its timeline); make a new Worker \
                 to go on (with resume_from to continue from a checkpoint)"
            )));
        }
        self.rank()
    }

    /// The rank, for a call that may release or replace the training
    /// state's memory: refused while views of it are open.
    fn rank_unviewed(&self, op: &str) -> PyResult<std::sync::MutexGuard<'_, Rank>> {
        match self.views_open() {
            0 => self.live(op),
            n => Err(PyRuntimeError::new_err(format!(
                "{op}: {n} view(s) of the worker's training state are open; leave the \
                 `with colo.views(...)` block (or drop the tensors and call close_views()) first"
            ))),
        }
    }
}

#[pymethods]
impl Worker {
    /// `config`: a run config file (TOML), or `None` for the built-in job;
    /// `out`: the run directory (shared by all ranks); `comm`: the
    /// communicator (see the module docs); `resume_from`: the checkpoint
    /// step a resumed run continues from (this rank's own records are cut
    /// back to it; the controller loads the checkpoint); `tp_comm`: the
    /// communicator of this rank's tensor-parallel rollout group
    /// (`rollout.tensor_model_parallel_size` > 1), whose
    /// `all_reduce_buffer(buffer, dtype)` sums one buffer over the group.
    #[new]
    #[pyo3(signature = (config, out, rank, world, comm, resume_from=None, tp_comm=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        config: Option<String>,
        out: String,
        rank: usize,
        world: usize,
        comm: Py<PyAny>,
        resume_from: Option<usize>,
        tp_comm: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        collective::check_comm(comm.bind(py))?;
        // A rank's worker process runs colo's passes: the process-wide
        // state they rely on is set once, here, before its engines exist
        // (not at import: a driver that only reads checkpoints keeps
        // libtorch's thread count).
        colo_rl::process::init();
        let cfg = load_config(config.as_deref())?;
        let make = move || -> Box<dyn Collective> {
            Box::new(PyCollective {
                comm: Python::attach(|py| comm.clone_ref(py)),
                rank,
                world,
            })
        };
        let tp = cfg.rollout.tensor_model_parallel_size.max(1);
        let group = tp_comm.map(|comm| -> Box<dyn colo_rollout::TensorParallel> {
            Box::new(tensor_parallel::PyTensorParallel {
                comm,
                rank: rank % tp,
                size: tp,
            })
        });
        let rank = py
            .detach(|| Rank::new(cfg, Path::new(&out), rank, world, resume_from, make, group))
            .map_err(err)?;
        Ok(Worker {
            rank: Mutex::new(rank),
            views: Default::default(),
            finished: AtomicBool::new(false),
        })
    }

    /// While `path` exists, a step still drawing generation batches
    /// (dynamic sampling) stops, on every rank at once, with an error
    /// saying it was stopped at the user's request.
    fn set_stop_file(&self, path: String) -> PyResult<()> {
        self.rank().map(|mut r| r.set_stop_file(path.into()))
    }

    fn total_steps(&self) -> PyResult<usize> {
        self.rank().map(|r| r.total_steps())
    }

    /// Runs step `step` (0-based); returns this rank's metrics as JSON
    /// (verl's names).
    fn step(&self, py: Python<'_>, step: usize) -> PyResult<String> {
        let m = py.detach(|| self.rank_unviewed("step")?.step(step).map_err(step_err))?;
        serde_json::to_string(&m).map_err(err)
    }

    /// Greedy evaluation of this rank's share of the held-out prompts: its
    /// tallies as JSON, for [`eval_record`].
    fn evaluate(&self, py: Python<'_>) -> PyResult<String> {
        let t = py.detach(|| self.rank_unviewed("evaluate")?.evaluate().map_err(err))?;
        serde_json::to_string(&t).map_err(err)
    }

    fn save(&self, py: Python<'_>, step: usize) -> PyResult<()> {
        py.detach(|| self.live("save")?.save(step).map_err(err))
    }

    fn load(&self, py: Python<'_>, step: usize) -> PyResult<()> {
        py.detach(|| self.rank_unviewed("load")?.load(step).map_err(err))
    }

    /// A digest of the actor's weights, equal on every rank while they agree.
    fn weights_digest(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.rank()?.weights_digest().map_err(err))
    }

    /// (total steps, save_freq, test_freq, val_before_train) of the config.
    fn schedule(&self) -> PyResult<(usize, Option<usize>, Option<usize>, bool)> {
        Ok(self.rank()?.schedule())
    }

    /// The actor's weights as [(name, flat float32 list)] (for tests).
    fn parameters(&self, py: Python<'_>) -> PyResult<Vec<(String, Vec<f32>)>> {
        let named = py.detach(|| self.rank()?.weights().map_err(err))?;
        Ok(named.into_iter().map(|(n, _, v)| (n, v)).collect())
    }

    // ---- the hybrid worker's operations, one by one --------------------

    /// "train" or "rollout": which engine holds the device.
    fn phase(&self) -> PyResult<&'static str> {
        Ok(match self.rank()?.phase() {
            Phase::Train => "train",
            Phase::Rollout => "rollout",
        })
    }

    /// Starts RL step `step` (1-based) of a loop composed op by op: the
    /// timeline's step number, a new peak window, and what `as_needed`
    /// learns of each step (whether the reference may stay resident
    /// through the update). `step()` does it itself.
    fn begin_step(&self, step: u64) -> PyResult<()> {
        self.live("begin_step")?.begin_step(step).map_err(err)
    }

    /// Train → rollout in the config's colocation mode; returns (seconds,
    /// of which weight sync).
    fn to_rollout(&self, py: Python<'_>) -> PyResult<(f64, f64)> {
        let t = py.detach(|| self.rank_unviewed("to_rollout")?.to_rollout().map_err(err))?;
        Ok((t.total_s, t.sync_s))
    }

    /// Rollout → train; returns (seconds, 0).
    fn to_train(&self, py: Python<'_>) -> PyResult<(f64, f64)> {
        let t = py.detach(|| self.rank_unviewed("to_train")?.to_train().map_err(err))?;
        Ok((t.total_s, t.sync_s))
    }

    /// (end-of-sequence id, padding id) of the tokenizer.
    fn special_ids(&self) -> PyResult<(u32, u32)> {
        Ok(self.rank()?.special_ids())
    }

    /// `n` completions of every prompt (token id lists), rollout phase:
    /// [[(tokens, logprobs, finish_reason)]] in prompt order. Stops at the
    /// end-of-sequence token; `seed` makes sampling reproducible.
    #[pyo3(signature = (prompts, n=1, max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=None, seed=0))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompts: Bound<'_, PyAny>,
        n: usize,
        max_new_tokens: usize,
        temperature: f64,
        top_p: f64,
        top_k: Option<usize>,
        seed: u64,
    ) -> PyResult<Vec<Vec<Sample>>> {
        let params = SamplingParams {
            n,
            max_new_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            ..Default::default()
        };
        let prompts = rows::token_rows(&prompts, "prompts")?;
        let out = py.detach(|| {
            self.live("generate")?
                .generate(prompts, params)
                .map_err(err)
        })?;
        Ok(out
            .into_iter()
            .map(|cs| {
                cs.into_iter()
                    .map(|c| {
                        (
                            c.tokens,
                            c.logprobs,
                            format!("{:?}", c.finish_reason).to_lowercase(),
                        )
                    })
                    .collect()
            })
            .collect())
    }

    /// The actor's log-probability of each response token (train phase).
    fn log_probs(
        &self,
        py: Python<'_>,
        prompts: Bound<'_, PyAny>,
        responses: Bound<'_, PyAny>,
    ) -> PyResult<Vec<Vec<f32>>> {
        let prompts = rows::token_rows(&prompts, "prompts")?;
        let responses = rows::token_rows(&responses, "responses")?;
        py.detach(|| {
            self.live("log_probs")?
                .log_probs(prompts, responses)
                .map_err(err)
        })
    }

    /// The reference model's, or `None` without one (train phase).
    fn ref_log_probs(
        &self,
        py: Python<'_>,
        prompts: Bound<'_, PyAny>,
        responses: Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<Vec<f32>>>> {
        let prompts = rows::token_rows(&prompts, "prompts")?;
        let responses = rows::token_rows(&responses, "responses")?;
        py.detach(|| {
            (self.live("ref_log_probs")?)
                .ref_log_probs(prompts, responses)
                .map_err(err)
        })
    }

    /// One optimizer step of the actor on these samples (train phase),
    /// joint with the other ranks; returns its metrics as JSON.
    #[pyo3(signature = (prompts, responses, advantages, old_log_probs, ref_log_probs=None))]
    fn update_policy(
        &self,
        py: Python<'_>,
        prompts: Bound<'_, PyAny>,
        responses: Bound<'_, PyAny>,
        advantages: Bound<'_, PyAny>,
        old_log_probs: Bound<'_, PyAny>,
        ref_log_probs: Option<Bound<'_, PyAny>>,
    ) -> PyResult<String> {
        let prompts = rows::token_rows(&prompts, "prompts")?;
        let responses = rows::token_rows(&responses, "responses")?;
        let advantages = rows::number_rows(&advantages, "advantages")?;
        let old_log_probs = rows::number_rows(&old_log_probs, "old_log_probs")?;
        let ref_log_probs = match ref_log_probs.filter(|r| !r.is_none()) {
            Some(r) => Some(rows::number_rows(&r, "ref_log_probs")?),
            None => None,
        };
        let m = py.detach(|| {
            self.live("update_policy")?
                .update_policy(prompts, responses, advantages, old_log_probs, ref_log_probs)
                .map_err(err)
        })?;
        serde_json::to_string(&m).map_err(err)
    }

    /// The actor's weights, copied out: [(name, shape, float32 values)]
    /// (train phase).
    fn weights(&self, py: Python<'_>) -> PyResult<NamedWeights> {
        py.detach(|| self.rank()?.weights().map_err(err))
    }

    /// Copies [(name, float32 values)], or [(name, shape, float32 values)]
    /// as `weights()` gives them, into the actor in place (train phase);
    /// every name, shape and value is checked before anything is written.
    fn load_weights(&self, py: Python<'_>, weights: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let weights = weights
            .iter()
            .enumerate()
            .map(|(i, item)| {
                if let Ok((name, values)) = item.extract::<(String, Vec<f32>)>() {
                    return Ok((name, None, values));
                }
                let (name, shape, values) = item
                    .extract::<(String, Vec<i64>, Vec<f32>)>()
                    .map_err(|_| {
                        PyValueError::new_err(format!(
                        "load_weights: item {i} is {}; expected (name, values) or (name, shape, \
                         values) with float values, as weights() gives them",
                        collective::type_name(item)
                    ))
                    })?;
                Ok((name, Some(shape), values))
            })
            .collect::<PyResult<Vec<_>>>()?;
        py.detach(|| {
            self.live("load_weights")?
                .load_weights(weights)
                .map_err(err)
        })
    }

    /// Zero-copy views of the training state (train phase): `what` is
    /// "weights", "grads" or "optimizer"; returns [(name, shape, dtype,
    /// buffer)], each buffer a writable memoryview of the tensor's memory
    /// (CPU) or a CUDA descriptor. Use `colo.views(worker, what)`, which
    /// makes torch tensors of them and closes them: until `close_views`,
    /// the worker refuses to switch phase.
    fn open_views(&self, py: Python<'_>, what: &str) -> PyResult<Vec<View>> {
        let tensors = self.live("open_views")?.shared_tensors(what).map_err(err)?;
        let mut out = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            if !t.is_contiguous() {
                return Err(PyValueError::new_err(format!("{name} is not contiguous")));
            }
            let kind = collective::dtype_name(t.kind())?;
            out.push((name, t.size(), kind, collective::buffer(py, &t)?.unbind()));
        }
        let handed = out.iter().map(|v| v.3.clone_ref(py)).collect();
        self.views.lock().map_err(|_| poisoned())?.push(handed);
        Ok(out)
    }

    /// Closes the last `open_views`. Refused, and the views stay open (no
    /// phase switch), while anything but the worker still references one
    /// of its memoryviews: the list `open_views` returned, or a tensor made
    /// from one (torch's `frombuffer` keeps a reference, not a buffer
    /// export), since the memory behind them may be released once they
    /// close. On a GPU the views are addresses, which cannot be counted:
    /// `colo.views` counts their holders instead.
    fn close_views(&self, py: Python<'_>) -> PyResult<()> {
        let mut views = self.views.lock().map_err(|_| poisoned())?;
        let Some(last) = views.last() else {
            return Err(PyRuntimeError::new_err("close_views: no views are open"));
        };
        // pyo3 deprecates `get_refcnt` for `ffi::Py_REFCNT`, an `unsafe`
        // call; the safe one says the same (unsafe code stays in colo-mem
        // and the one memoryview block).
        #[allow(deprecated)]
        let referenced = |b: &Bound<'_, PyAny>| b.get_refcnt() > 1;
        let in_use = (last.iter().map(|b| b.bind(py)))
            .filter(|b| b.is_instance_of::<pyo3::types::PyMemoryView>() && referenced(b))
            .count();
        if in_use > 0 {
            return Err(PyRuntimeError::new_err(format!(
                "close_views: {in_use} of the views are still referenced (the list open_views \
                 returned, or tensors made from them): drop them first; the views stay open \
                 (no phase switch) until then"
            )));
        }
        views.pop();
        Ok(())
    }

    /// The pool's statistics as JSON (resident, peak, per tag).
    fn memory(&self) -> PyResult<String> {
        serde_json::to_string(&self.rank()?.pool().stats()).map_err(err)
    }

    /// The memory timeline so far, as JSON lines (one event per line: time,
    /// phase, kind, tags, resident bytes per tag; colo-mem's `Event`).
    fn timeline(&self) -> PyResult<String> {
        let events = self.rank()?.pool().timeline();
        let mut out = Vec::new();
        colo_mem::timeline_jsonl(&events, &mut out).map_err(err)?;
        String::from_utf8(out).map_err(err)
    }

    /// Writes this rank's timeline and pictures; returns their directory
    /// and the device's capacity in bytes.
    fn finish(&self, py: Python<'_>) -> PyResult<(String, u64)> {
        py.detach(|| {
            let mut r = self.live("finish")?;
            let dir = r.finish().map_err(err)?;
            self.finished.store(true, Ordering::Release);
            Ok((dir.display().to_string(), r.capacity()))
        })
    }
}

fn load_config(config: Option<&str>) -> PyResult<Config> {
    match config {
        Some(path) => Config::from_file(Path::new(path)).map_err(err),
        None => Ok(Config::builtin()),
    }
}

/// Checks, before any worker starts, that `config` (a TOML path, or `None`
/// for the built-in job) can be split over `workers` ranks (raises
/// `ValueError` naming the key otherwise); returns the run's device,
/// `"cpu"` or `"cuda"`.
#[pyfunction]
#[pyo3(signature = (config, workers))]
fn check_layout(config: Option<String>, workers: usize) -> PyResult<&'static str> {
    let cfg = load_config(config.as_deref())?;
    colo_rl::data_parallel::rank_config(&cfg, workers)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(cfg.trainer.device.name())
}

/// The size of the run's tensor-parallel rollout groups
/// (`rollout.tensor_model_parallel_size`; 1: none): the controller makes
/// one process group per `tg` consecutive ranks.
#[pyfunction]
#[pyo3(signature = (config))]
fn rollout_tensor_parallel(config: Option<String>) -> PyResult<usize> {
    Ok(load_config(config.as_deref())?
        .rollout
        .tensor_model_parallel_size)
}

/// `n` bytes as colo prints them elsewhere, in binary units ("1.5 MiB").
#[pyfunction]
fn fmt_bytes(n: u64) -> String {
    colo_mem::fmt_bytes(n)
}

/// The newest complete checkpoint of the run `config` writes into `out`,
/// as colo-rl judges it: (its step or `None`, the newer directories it
/// skipped, each with the reason).
#[pyfunction]
#[pyo3(signature = (config, out))]
fn latest_checkpoint(
    config: Option<String>,
    out: String,
) -> PyResult<(Option<usize>, Vec<String>)> {
    let cfg = load_config(config.as_deref())?;
    let found = colo_rl::data_parallel::latest_checkpoint(&cfg, Path::new(&out)).map_err(err)?;
    let skipped = found
        .skipped
        .iter()
        .map(|(dir, why)| format!("{} ({why})", dir.display()))
        .collect();
    Ok((found.latest.map(|(step, _)| step), skipped))
}

/// What a run resumed from the checkpoint of `step` in `out` says before
/// it starts, as `colo train --resume` says it: the keys of `config` that
/// differ from the run's `config.toml`, and the dtype `"auto"` continues
/// in. Call it before the workers start (rank 0 then records `config`).
#[pyfunction]
#[pyo3(signature = (config, out, step))]
fn resume_notes(config: Option<String>, out: String, step: usize) -> PyResult<Vec<String>> {
    let cfg = load_config(config.as_deref())?;
    let out = Path::new(&out);
    let dir = colo_rl::checkpoints::step_dir(&out.join(colo_rl::checkpoints::DIR), step);
    let (_, dtype) = colo_rl::checkpoints::resume_dtype(&cfg, &dir).map_err(err)?;
    let changes = colo_rl::run_config::changes(out, &cfg).map_err(err)?;
    Ok(dtype.into_iter().chain(changes).collect())
}

/// Raises if a run from scratch into `out` would overwrite an earlier
/// run's checkpoints or steps (`resume`: `--resume` found no complete
/// checkpoint), as `colo train` refuses it.
#[pyfunction]
#[pyo3(signature = (out, resume))]
fn check_fresh_start(out: String, resume: bool) -> PyResult<()> {
    colo_rl::checkpoints::check_fresh_start(Path::new(&out), resume).map_err(err)
}

/// Keeps the records of `metrics.jsonl` at `path` up to `step` (what a
/// resumed run does to its records); returns how many were removed.
#[pyfunction]
fn truncate_metrics(path: String, step: usize) -> PyResult<usize> {
    colo_rl::metrics::truncate_after(Path::new(&path), step).map_err(err)
}

/// Draws `out/memory_workers.{svg,png}` from the workers' directories
/// (their `timeline.jsonl`), with one device's `capacity` in bytes.
#[pyfunction]
#[pyo3(signature = (out, dirs, capacity=None))]
fn draw_workers(
    py: Python<'_>,
    out: String,
    dirs: Vec<String>,
    capacity: Option<u64>,
) -> PyResult<()> {
    let dirs: Vec<std::path::PathBuf> = dirs.into_iter().map(Into::into).collect();
    py.detach(|| colo_rl::data_parallel::draw_workers(Path::new(&out), &dirs, capacity))
        .map_err(err)
}

/// The `metrics.jsonl` record of one evaluation from the workers' tallies
/// (JSON, from `Worker.evaluate`); `None` when nothing was evaluated.
#[pyfunction]
fn eval_record(step: usize, parts: Vec<String>, timing: f64) -> PyResult<Option<String>> {
    let parts = parts
        .iter()
        .map(|p| serde_json::from_str(p).map_err(err))
        .collect::<PyResult<Vec<colo_rl::metrics::EvalTallies>>>()?;
    for (i, p) in parts.iter().enumerate() {
        if let Some(why) = p.inconsistency() {
            return Err(PyValueError::new_err(format!(
                "eval_record: part {i}: {why}"
            )));
        }
    }
    colo_rl::metrics::EvalRecord::of_parts(step, &parts, timing)
        .map(|r| serde_json::to_string(&r).map_err(err))
        .transpose()
}

#[pymodule]
fn _colo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // colo's diagnostics (a checkpoint's unused tensors, a gradient that
    // was not finite) reach the Python process's stderr as they reach
    // `colo`'s, filtered by COLO_LOG; a logger already installed stays.
    colo_rl::process::init_logging();
    m.add_class::<Worker>()?;
    m.add("StepInterrupted", m.py().get_type::<StepInterrupted>())?;
    m.add_function(wrap_pyfunction!(draw_workers, m)?)?;
    m.add_function(wrap_pyfunction!(latest_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(resume_notes, m)?)?;
    m.add_function(wrap_pyfunction!(check_fresh_start, m)?)?;
    m.add_function(wrap_pyfunction!(truncate_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(check_layout, m)?)?;
    m.add_function(wrap_pyfunction!(rollout_tensor_parallel, m)?)?;
    m.add_function(wrap_pyfunction!(eval_record, m)?)?;
    m.add_function(wrap_pyfunction!(fmt_bytes, m)?)?;
    Ok(())
}
