//! Grouped-query self-attention with RoPE and optional q/k/v biases.
//!
//! Split in two so that a rollout engine can keep keys and values in its own
//! (paged) cache without copying this code: [`Attention::qkv`] projects and
//! rotates, [`Attention::attend`] takes whatever keys and values the caller
//! gathered and finishes the layer.

use candle_core::Tensor;

use crate::config::ModelConfig;
use crate::layers::Linear;
use crate::ops;
use crate::rope::RopeTables;
use crate::weights::Weights;
use crate::{Error, Result};

/// One attention layer (`model.layers.N.self_attn`).
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (q_dim, kv_dim) = (cfg.num_heads * d, cfg.num_kv_heads * d);
        Ok(Attention {
            q_proj: Linear::load(w, &format!("{prefix}.q_proj"), h, q_dim, cfg.qkv_bias)?,
            k_proj: Linear::load(w, &format!("{prefix}.k_proj"), h, kv_dim, cfg.qkv_bias)?,
            v_proj: Linear::load(w, &format!("{prefix}.v_proj"), h, kv_dim, cfg.qkv_bias)?,
            o_proj: Linear::load(w, &format!("{prefix}.o_proj"), q_dim, h, cfg.o_bias)?,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: d,
        })
    }

    /// Projects `x` (batch, seq, hidden) and applies RoPE.
    ///
    /// Returns `q` (batch, heads, seq, head_dim), `k` and `v` (batch,
    /// kv_heads, seq, head_dim), all contiguous. `rope` covers the same
    /// (batch or 1, seq) positions as `x`.
    pub fn qkv(&self, x: &Tensor, rope: &RopeTables) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, s, _) = x.dims3()?;
        let heads = |t: Tensor, n: usize| t.reshape((b, s, n, self.head_dim))?.transpose(1, 2);
        // The RoPE kernel reads the transposed views and writes contiguous
        // (batch, heads, seq, head_dim): the transpose costs no extra pass.
        let q = ops::rope(
            &heads(self.q_proj.forward(x)?, self.num_heads)?,
            &rope.cos,
            &rope.sin,
        )?;
        let k = ops::rope(
            &heads(self.k_proj.forward(x)?, self.num_kv_heads)?,
            &rope.cos,
            &rope.sin,
        )?;
        let v = heads(self.v_proj.forward(x)?, self.num_kv_heads)?.contiguous()?;
        Ok((q, k, v))
    }

    /// Attention of `q` (batch, heads, q_len, head_dim) over `k`, `v`
    /// (batch, kv_heads, k_len, head_dim), then the output projection:
    /// returns (batch, q_len, hidden).
    ///
    /// `k` and `v` may be views into a larger buffer (e.g. `narrow` on the
    /// sequence dimension of a preallocated cache) as long as each
    /// (k_len, head_dim) matrix has unit stride along head_dim. `mask` is
    /// additive, (batch or 1, q_len, k_len), from [`crate::mask`]; `None`
    /// lets every query see every key (a single decode step).
    pub fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, h, s, d) = q.dims4()?;
        let (_, kvh, t, _) = k.dims4()?;
        if h != self.num_heads
            || kvh != self.num_kv_heads
            || d != self.head_dim
            || v.dims() != k.dims()
        {
            return Err(Error::Input(format!(
                "attend: q {:?}, k {:?}, v {:?} do not fit {} heads / {} kv heads of size {}",
                q.dims(),
                k.dims(),
                v.dims(),
                self.num_heads,
                self.num_kv_heads,
                self.head_dim
            )));
        }
        let g = h / kvh;
        // Grouped-query attention without repeating K/V: the `g` query heads
        // that share a KV head are stacked along the row dimension, so one
        // batched matmul per KV head does the work of `g`.
        let q = q.contiguous()?.reshape((b, kvh, g * s, d))?;
        let scores = q.matmul(&k.t()?)?; // (b, kvh, g*s, t)
        let scores = match mask {
            Some(m) => {
                let mb = m.dim(0)?;
                let m = m.reshape((mb, 1, 1, s, t))?;
                scores
                    .reshape((b, kvh, g, s, t))?
                    .broadcast_add(&m)?
                    .reshape((b, kvh, g * s, t))?
            }
            None => scores,
        };
        let probs = ops::scaled_softmax(&scores, 1.0 / (d as f64).sqrt())?;
        let out = probs.matmul(v)?; // (b, kvh, g*s, d) = (b, h, s, d)
        let out = out
            .reshape((b, h, s, d))?
            .transpose(1, 2)?
            .reshape((b, s, h * d))?;
        self.o_proj.forward(&out)
    }

    /// `attend(qkv(x))` for a sequence without cache.
    pub fn forward(&self, x: &Tensor, rope: &RopeTables, mask: Option<&Tensor>) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x, rope)?;
        self.attend(&q, &k, &v, mask)
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.q_proj.push_params(&format!("{prefix}.q_proj"), out);
        self.k_proj.push_params(&format!("{prefix}.k_proj"), out);
        self.v_proj.push_params(&format!("{prefix}.v_proj"), out);
        self.o_proj.push_params(&format!("{prefix}.o_proj"), out);
    }
}
