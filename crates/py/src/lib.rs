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
use std::sync::Mutex;

use colo_rl::data_parallel::Rank;
use colo_rl::Config;
use colo_train::{Collective, ReduceOp};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use tch::{Device, Kind, Tensor};

fn err(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// The trainer's collective, calling the controller's communicator:
/// `all_reduce_buffers(list[memoryview])` sums float32 buffers in place
/// over the ranks; `all_reduce_values(list[float], op) -> list[float]`
/// with `op` "sum" or "max".
struct PyCollective {
    comm: Py<PyAny>,
    rank: usize,
    world: usize,
}

impl PyCollective {
    fn failed(&self, what: &str, e: PyErr) -> colo_train::Error {
        colo_train::Error::Unsupported {
            what: "collective",
            found: format!("rank {} of {}: {what}: {e}", self.rank, self.world),
        }
    }
}

impl Collective for PyCollective {
    fn world_size(&self) -> usize {
        self.world
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn all_reduce_tensors(&mut self, tensors: &[Tensor]) -> colo_train::Result<()> {
        for t in tensors {
            if t.device() != Device::Cpu || t.kind() != Kind::Float || !t.is_contiguous() {
                return Err(colo_train::Error::Unsupported {
                    what: "collective",
                    found: format!(
                        "a {:?} {:?} gradient: the Python communicator takes contiguous \
                         float32 CPU buffers (CUDA tensors need DLPack, not yet done)",
                        t.kind(),
                        t.device()
                    ),
                });
            }
        }
        Python::attach(|py| {
            let views = tensors
                .iter()
                .map(|t| writable_view(py, t))
                .collect::<PyResult<Vec<_>>>()?;
            let list = PyList::new(py, views)?;
            self.comm
                .call_method1(py, "all_reduce_buffers", (list,))
                .map(drop)
        })
        .map_err(|e| self.failed("all_reduce_buffers", e))
    }

    fn all_reduce_values(&mut self, values: &mut [f64], op: ReduceOp) -> colo_train::Result<()> {
        let op = match op {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        };
        let out: Vec<f64> = Python::attach(|py| {
            self.comm
                .call_method1(py, "all_reduce_values", (values.to_vec(), op))?
                .extract(py)
        })
        .map_err(|e| self.failed("all_reduce_values", e))?;
        if out.len() != values.len() {
            return Err(colo_train::Error::Unsupported {
                what: "collective",
                found: format!(
                    "all_reduce_values returned {} values for {}",
                    out.len(),
                    values.len()
                ),
            });
        }
        values.copy_from_slice(&out);
        Ok(())
    }
}

/// `PyBUF_WRITE` of CPython's `object.h` (stable since 3.3; pyo3-ffi
/// exports it only for 3.11+ builds, not for abi3-py39).
const PYBUF_WRITE: std::os::raw::c_int = 0x200;

/// A writable memoryview of a contiguous CPU tensor's bytes.
fn writable_view<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let len = t
        .numel()
        .checked_mul(t.kind().elt_size_in_bytes())
        .and_then(|n| isize::try_from(n).ok())
        .ok_or_else(|| PyValueError::new_err("tensor too large for a memoryview"))?;
    // SAFETY: the tensor is contiguous on the CPU (checked by the caller),
    // so `data_ptr()..+len` is its memory; the accumulators it views live
    // as long as the trainer, which outlives this call, and nothing else
    // touches them while the communicator runs (the trainer is blocked in
    // `all_reduce_tensors`). The communicator drops its views before
    // returning.
    unsafe {
        let p = pyo3::ffi::PyMemoryView_FromMemory(t.data_ptr().cast(), len, PYBUF_WRITE);
        Bound::from_owned_ptr_or_err(py, p)
    }
}

/// One rank of a data-parallel colo run.
#[pyclass(module = "colo._colo")]
struct Worker {
    /// Python may call from any thread; the rank runs one call at a time.
    rank: Mutex<Rank>,
}

impl Worker {
    fn rank(&self) -> PyResult<std::sync::MutexGuard<'_, Rank>> {
        self.rank
            .lock()
            .map_err(|_| PyRuntimeError::new_err("an earlier call on this worker panicked"))
    }
}

#[pymethods]
impl Worker {
    /// `config`: a run config file (TOML), or `None` for the built-in job;
    /// `out`: the run directory (shared by all ranks); `comm`: the
    /// communicator (see the module docs).
    #[new]
    #[pyo3(signature = (config, out, rank, world, comm))]
    fn new(
        py: Python<'_>,
        config: Option<String>,
        out: String,
        rank: usize,
        world: usize,
        comm: Py<PyAny>,
    ) -> PyResult<Self> {
        let cfg = load_config(config.as_deref())?;
        let make = move || -> Box<dyn Collective> {
            Box::new(PyCollective {
                comm: Python::attach(|py| comm.clone_ref(py)),
                rank,
                world,
            })
        };
        let rank = py
            .detach(|| Rank::new(cfg, Path::new(&out), rank, world, make))
            .map_err(err)?;
        Ok(Worker {
            rank: Mutex::new(rank),
        })
    }

    fn total_steps(&self) -> PyResult<usize> {
        self.rank().map(|r| r.total_steps())
    }

    /// Runs step `step` (0-based); returns this rank's metrics as JSON
    /// (verl's names).
    fn step(&self, py: Python<'_>, step: usize) -> PyResult<String> {
        let m = py.detach(|| self.rank()?.step(step).map_err(err))?;
        serde_json::to_string(&m).map_err(err)
    }

    /// Greedy evaluation of this rank's share of the held-out prompts:
    /// (right, prompts).
    fn evaluate(&self, py: Python<'_>) -> PyResult<(usize, usize)> {
        py.detach(|| self.rank()?.evaluate().map_err(err))
    }

    fn save(&self, py: Python<'_>, step: usize) -> PyResult<()> {
        py.detach(|| self.rank()?.save(step).map_err(err))
    }

    fn load(&self, py: Python<'_>, step: usize) -> PyResult<()> {
        py.detach(|| self.rank()?.load(step).map_err(err))
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
    fn parameters(&self) -> PyResult<Vec<(String, Vec<f32>)>> {
        flat(self.rank()?.parameters())
    }

    /// The last update's gradients, summed over the ranks, like
    /// `parameters` (for tests).
    fn gradients(&self) -> PyResult<Vec<(String, Vec<f32>)>> {
        flat(self.rank()?.gradients())
    }

    /// The pool's statistics as JSON (resident, peak, per tag).
    fn memory(&self) -> PyResult<String> {
        serde_json::to_string(&self.rank()?.pool().stats()).map_err(err)
    }

    /// Writes this rank's timeline and pictures; returns their directory
    /// and the device's capacity in bytes.
    fn finish(&self, py: Python<'_>) -> PyResult<(String, u64)> {
        py.detach(|| {
            let r = self.rank()?;
            let dir = r.finish().map_err(err)?;
            Ok((dir.display().to_string(), r.capacity()))
        })
    }
}

fn flat(named: Vec<(String, Tensor)>) -> PyResult<Vec<(String, Vec<f32>)>> {
    named
        .into_iter()
        .map(|(n, t)| {
            let t = t
                .f_to_kind(Kind::Float)
                .and_then(|t| t.f_flatten(0, -1))
                .map_err(err)?;
            Ok((n, Vec::<f32>::try_from(&t).map_err(err)?))
        })
        .collect()
}

fn load_config(config: Option<&str>) -> PyResult<Config> {
    match config {
        Some(path) => Config::from_file(Path::new(path)).map_err(err),
        None => Ok(Config::builtin()),
    }
}

/// Checks, before any worker starts, that `config` (a TOML path, or `None`
/// for the built-in job) can be split over `workers` ranks; raises
/// `ValueError` naming the key otherwise.
#[pyfunction]
#[pyo3(signature = (config, workers))]
fn check_layout(config: Option<String>, workers: usize) -> PyResult<()> {
    let cfg = load_config(config.as_deref())?;
    colo_rl::data_parallel::rank_config(&cfg, workers)
        .map(drop)
        .map_err(|e| PyValueError::new_err(e.to_string()))
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

#[pymodule]
fn _colo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Worker>()?;
    m.add_function(wrap_pyfunction!(draw_workers, m)?)?;
    m.add_function(wrap_pyfunction!(check_layout, m)?)?;
    Ok(())
}
