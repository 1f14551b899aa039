//! The two parameterised building blocks every other module uses: a linear
//! projection and RMSNorm.

use candle_core::{Tensor, D};

use crate::ops;
use crate::weights::Weights;
use crate::Result;

/// `y = x Wᵀ + b`, weight stored (out, in) as in PyTorch.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// Loads `{prefix}.weight` (out, in) and, if `bias`, `{prefix}.bias` (out).
    pub fn load(
        w: &Weights,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = w.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias = match bias {
            true => Some(w.get(&format!("{prefix}.bias"), &[out_dim])?),
            false => None,
        };
        Ok(Linear { weight, bias })
    }

    /// `x`: (..., in) → (..., out). Leading dimensions are flattened so the
    /// product is a single matrix multiplication against the transposed view
    /// of the weight (no copy of either).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let in_dim = dims[dims.len() - 1];
        let rows = x.elem_count() / in_dim.max(1);
        let y = x.reshape((rows, in_dim))?.matmul(&self.weight.t()?)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("rank ≥ 1") = self.weight.dim(0)?;
        Ok(y.reshape(out_dims)?)
    }

    /// The weight, (out, in).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        out.push((format!("{prefix}.weight"), self.weight.clone()));
        if let Some(b) = &self.bias {
            out.push((format!("{prefix}.bias"), b.clone()));
        }
    }
}

/// Root-mean-square normalisation with a learned scale.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Loads `{prefix}.weight` (dim).
    pub fn load(w: &Weights, prefix: &str, dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: w.get(&format!("{prefix}.weight"), &[dim])?,
            eps,
        })
    }

    /// `x`: (..., dim) → same shape.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        debug_assert_eq!(x.dim(D::Minus1).ok(), Some(self.weight.elem_count()));
        Ok(ops::rms_norm(x, &self.weight, self.eps)?)
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        out.push((format!("{prefix}.weight"), self.weight.clone()));
    }
}
