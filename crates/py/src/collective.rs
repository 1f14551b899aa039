//! The trainer's collective over the controller's Python communicator.

use colo_train::{Collective, ReduceOp};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use tch::{Device, Kind, Tensor};

/// The trainer's collective, calling the controller's communicator:
/// `all_reduce_buffers(list[memoryview])` sums float32 buffers in place
/// over the ranks; `all_reduce_values(list[float], op) -> list[float]`
/// with `op` "sum" or "max".
pub(crate) struct PyCollective {
    pub(crate) comm: Py<PyAny>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
}

/// The name of `obj`'s type, for messages ("?" if Python cannot say).
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".into(), |n| n.to_string())
}

/// The communicator's methods [`PyCollective`] calls.
const COMM_METHODS: [&str; 4] = [
    "all_reduce_buffers",
    "all_reduce_values",
    "all_gather_buffer",
    "reduce_scatter_buffer",
];

/// Refuses a communicator without [`COMM_METHODS`] when the worker is made,
/// rather than at its first update.
pub(crate) fn check_comm(comm: &Bound<'_, PyAny>) -> PyResult<()> {
    for method in COMM_METHODS {
        let callable = comm.getattr(method).is_ok_and(|m| m.is_callable());
        if !callable {
            let kind = type_name(comm);
            return Err(PyValueError::new_err(format!(
                "comm: a {kind} has no method {method}; the communicator needs \
                 all_reduce_buffers(list[memoryview]), all_reduce_values(list[float], op), \
                 all_gather_buffer(shard, full, dtype) and reduce_scatter_buffer(shard, full, dtype) \
                 (colo.comm.TorchComm over torch.distributed; one worker needs one too)"
            )));
        }
    }
    Ok(())
}

impl PyCollective {
    fn failed(&self, op: &'static str, e: PyErr) -> colo_train::Error {
        colo_train::Error::Collective {
            op,
            rank: self.rank,
            world: self.world,
            reason: e.to_string(),
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
            if t.kind() != Kind::Float || !t.is_contiguous() {
                return Err(colo_train::Error::Unsupported {
                    what: "collective",
                    found: format!(
                        "a {:?} gradient that is {}contiguous: the communicator takes \
                         contiguous float32 buffers",
                        t.kind(),
                        if t.is_contiguous() { "" } else { "not " }
                    ),
                });
            }
        }
        Python::attach(|py| {
            let buffers = tensors
                .iter()
                .map(|t| buffer(py, t))
                .collect::<PyResult<Vec<_>>>()?;
            let list = PyList::new(py, buffers)?;
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

    fn all_gather(&mut self, shard: &Tensor, full: &Tensor) -> colo_train::Result<()> {
        self.shards_call("all_gather_buffer", shard, full)
    }

    fn reduce_scatter(&mut self, full: &Tensor, shard: &Tensor) -> colo_train::Result<()> {
        self.shards_call("reduce_scatter_buffer", shard, full)
    }
}

impl PyCollective {
    /// `comm.<method>(shard, full, dtype)` over the two buffers' memory
    /// (`all_gather_buffer` fills `full` from every rank's `shard`;
    /// `reduce_scatter_buffer` sums `full` and leaves this rank's part in
    /// `shard`).
    fn shards_call(
        &mut self,
        method: &'static str,
        shard: &Tensor,
        full: &Tensor,
    ) -> colo_train::Result<()> {
        colo_train::collective::check_shards(method, shard, full, self.world)?;
        Python::attach(|py| {
            let dtype = dtype_name(shard.kind())?;
            let (s, f) = (buffer(py, shard)?, buffer(py, full)?);
            self.comm.call_method1(py, method, (s, f, dtype)).map(drop)
        })
        .map_err(|e| self.failed(method, e))
    }
}

/// A tensor's memory for the communicator, without a copy: a writable
/// `memoryview` on the CPU; on a GPU the tuple `("cuda", device, address,
/// elements)`, which the communicator wraps with
/// `__cuda_array_interface__` (what `torch.as_tensor` reads without
/// copying).
pub(crate) fn buffer<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    match t.device() {
        Device::Cpu => writable_view(py, t),
        Device::Cuda(i) => (
            "cuda",
            i,
            t.data_ptr() as usize,
            t.numel(),
            dtype_name(t.kind())?,
        )
            .into_pyobject(py)
            .map(Bound::into_any),
        other => Err(PyValueError::new_err(format!(
            "tensors on {other:?}: CPU or CUDA only"
        ))),
    }
}

/// torch's name of a dtype colo's tensors use.
pub(crate) fn dtype_name(kind: Kind) -> PyResult<&'static str> {
    match kind {
        Kind::Float => Ok("float32"),
        Kind::BFloat16 => Ok("bfloat16"),
        Kind::Half => Ok("float16"),
        Kind::Double => Ok("float64"),
        Kind::Int64 => Ok("int64"),
        other => Err(PyValueError::new_err(format!(
            "no view for {other:?} tensors"
        ))),
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
    // SAFETY: the tensor is contiguous (checked by the callers) on the CPU
    // (`buffer` calls this for CPU tensors only), so `data_ptr()..+len` is
    // its memory. The tensors viewed are the trainer's own (parameters,
    // gradient accumulators, moments, which live as long as the worker;
    // a sharded trainer's gather buffers, which live until its call
    // returns), and their memory stays mapped while a view is open: the
    // collective's views live for one call, inside the update; the
    // views of `Worker.open_views` until `close_views`, and the worker
    // refuses every phase switch meanwhile (`lib.rs`).
    unsafe {
        let p = pyo3::ffi::PyMemoryView_FromMemory(t.data_ptr().cast(), len, PYBUF_WRITE);
        Bound::from_owned_ptr_or_err(py, p)
    }
}
