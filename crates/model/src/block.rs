//! One pre-norm decoder layer: `h = x + attn(norm(x)); out = h + mlp(norm(h))`.

use candle_core::Tensor;

use crate::attention::Attention;
use crate::config::ModelConfig;
use crate::layers::RmsNorm;
use crate::mlp::Mlp;
use crate::rope::RopeTables;
use crate::weights::Weights;
use crate::Result;

/// A decoder layer (`model.layers.N`). Its parts are public so an
/// incremental engine can run `input_layernorm → self_attn.qkv → (its own
/// cache) → self_attn.attend → residual → post_attention_layernorm → mlp →
/// residual` itself; [`Block::forward`] is that sequence without a cache.
#[derive(Debug, Clone)]
pub struct Block {
    pub input_layernorm: RmsNorm,
    pub self_attn: Attention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: Mlp,
}

impl Block {
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Block {
            input_layernorm: RmsNorm::load(w, &format!("{prefix}.input_layernorm"), h, eps)?,
            self_attn: Attention::load(w, &format!("{prefix}.self_attn"), cfg)?,
            post_attention_layernorm: RmsNorm::load(
                w,
                &format!("{prefix}.post_attention_layernorm"),
                h,
                eps,
            )?,
            mlp: Mlp::load(w, &format!("{prefix}.mlp"), cfg)?,
        })
    }

    /// `x`: (batch, seq, hidden) → same shape.
    pub fn forward(&self, x: &Tensor, rope: &RopeTables, mask: Option<&Tensor>) -> Result<Tensor> {
        let h = (x + self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, rope, mask)?)?;
        self.finish(&h)
    }

    /// The part after attention: `h + mlp(norm(h))`, where `h` already holds
    /// the attention residual.
    pub fn finish(&self, h: &Tensor) -> Result<Tensor> {
        Ok((h + self
            .mlp
            .forward(&self.post_attention_layernorm.forward(h)?)?)?)
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.input_layernorm
            .push_params(&format!("{prefix}.input_layernorm"), out);
        self.self_attn
            .push_params(&format!("{prefix}.self_attn"), out);
        self.post_attention_layernorm
            .push_params(&format!("{prefix}.post_attention_layernorm"), out);
        self.mlp.push_params(&format!("{prefix}.mlp"), out);
    }
}
