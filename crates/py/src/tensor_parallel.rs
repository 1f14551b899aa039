//! A tensor-parallel rollout group over the controller's Python
//! communicator: the engine's all-reduces (the attention output and down
//! projections' partial sums, and its few agreements in Int64 and
//! Float64) go to `comm.all_reduce_buffer(buffer, dtype)`, which sums one
//! buffer in place over the group's process group.

use colo_rollout::TensorParallel;
use pyo3::prelude::*;
use tch::Tensor;

use crate::collective::{buffer, dtype_name};

/// This rank's place in its tensor-parallel group, and the group's
/// communicator.
pub(crate) struct PyTensorParallel {
    pub(crate) comm: Py<PyAny>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
}

impl TensorParallel for PyTensorParallel {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&mut self, t: &Tensor) -> colo_rollout::Result<()> {
        // The communicator takes contiguous memory: a strided tensor is
        // summed through a contiguous copy.
        let flat = match t.is_contiguous() {
            true => t.shallow_clone(),
            false => t.contiguous(),
        };
        Python::attach(|py| {
            let dtype = dtype_name(flat.kind())?;
            let buf = buffer(py, &flat)?;
            self.comm
                .call_method1(py, "all_reduce_buffer", (buf, dtype))
                .map(drop)
        })
        .map_err(|e| {
            colo_rollout::Error::Unsupported(format!(
                "tensor-parallel rank {} of {}: all_reduce_buffer: {e}",
                self.rank, self.size
            ))
        })?;
        if !t.is_contiguous() {
            tch::no_grad(|| t.shallow_clone().copy_(&flat));
        }
        Ok(())
    }
}
