//! The SwiGLU feed-forward layer: `down(silu(gate(x)) ⊙ up(x))`.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::layers::Linear;
use crate::weights::Weights;
use crate::Result;

/// One feed-forward layer (`model.layers.N.mlp`).
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"), h, i, false)?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"), h, i, false)?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), i, h, false)?,
        })
    }

    /// `x`: (..., hidden) → (..., hidden).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // candle's `silu` is a unary op with a backward (unlike candle-nn's
        // fused kernels).
        let gated = (self.gate_proj.forward(x)?.silu()? * self.up_proj.forward(x)?)?;
        self.down_proj.forward(&gated)
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.gate_proj
            .push_params(&format!("{prefix}.gate_proj"), out);
        self.up_proj.push_params(&format!("{prefix}.up_proj"), out);
        self.down_proj
            .push_params(&format!("{prefix}.down_proj"), out);
    }
}
