//! The Qwen2 / Llama decoder, top to bottom: cache → attention → MLP →
//! block → model (the configuration is [`crate::config`]; linear, RMSNorm,
//! RoPE and masks are [`crate::layers`]).
//!
//! Every struct holds `tch::Tensor`s that share storage with whoever built
//! it (a checkpoint, a trainer's parameters, a rollout engine's pooled
//! copies); cloning is shallow. Forwards are plain libtorch calls, so
//! autograd differentiates all of them.

use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::layers::{self, Linear, RmsNorm, RopeTables, RotaryEmbedding};
use crate::weights::{self, Weights};
use crate::{Error, Result};

// ---------------------------------------------------------------- cache

/// A contiguous key/value cache: the reference for incremental decoding.
///
/// Each step concatenates the new keys and values onto the old ones, which
/// copies the whole cache every step. That is fine for tests and short
/// generations; the rollout engine keeps a paged cache of its own and calls
/// [`Attention::qkv`] / [`Attention::attend`] directly.
#[derive(Debug, Default)]
pub struct KvCache {
    /// Per layer: keys and values, each (batch, kv_heads, len, head_dim).
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl Clone for KvCache {
    /// Shares the cached tensors (appending never writes into them).
    fn clone(&self) -> Self {
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|kv| {
                    kv.as_ref()
                        .map(|(k, v)| (k.shallow_clone(), v.shallow_clone()))
                })
                .collect(),
            len: self.len,
        }
    }
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        KvCache {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
        }
    }

    /// Tokens cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a step's keys and values for `layer` and returns all of them.
    pub fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (k, v) = match self.layers[layer].take() {
            None => (k.shallow_clone(), v.shallow_clone()),
            Some((pk, pv)) => (Tensor::f_cat(&[&pk, k], 2)?, Tensor::f_cat(&[&pv, v], 2)?),
        };
        self.layers[layer] = Some((k.shallow_clone(), v.shallow_clone()));
        Ok((k, v))
    }

    /// Records that `n` tokens were appended to every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

// ---------------------------------------------------------------- attention

/// Which keys each query sees, as [`Attention::attend`] applies it.
#[derive(Clone, Copy)]
pub(crate) enum Visible<'a> {
    /// Every key (a single decode step).
    All,
    /// Query `i` sees keys `0..=i`; query and key lengths are equal. Lets
    /// libtorch's attention kernel skip the masked blocks, with no mask
    /// tensor at all.
    Causal,
    /// An additive mask (batch or 1, q_len, k_len) from [`crate::mask`].
    Mask(&'a Tensor),
}

/// Grouped-query self-attention with RoPE and optional q/k/v biases
/// (`model.layers.N.self_attn`).
///
/// Split in two so that a rollout engine can keep keys and values in its
/// own (paged) cache without copying this code: [`Attention::qkv`] projects
/// and rotates, [`Attention::attend`] takes whatever keys and values the
/// caller gathered and finishes the layer.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// `q_proj`, `k_proj` and `v_proj` as one product, when an engine fused
    /// them ([`Model::fuse_projections`]): their weights are row blocks of
    /// this one's.
    qkv_proj: Option<Linear>,
    /// Qwen3's per-head RMSNorms of q and k, applied before RoPE.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
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
            qkv_proj: None,
            qk_norm: match cfg.qk_norm() {
                true => Some((
                    RmsNorm::load(w, &format!("{prefix}.q_norm"), d, cfg.rms_norm_eps)?,
                    RmsNorm::load(w, &format!("{prefix}.k_norm"), d, cfg.rms_norm_eps)?,
                )),
                false => None,
            },
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: d,
        })
    }

    /// The output projection (`o_proj`), for engines that run attention
    /// themselves.
    pub fn o_proj(&self) -> &Linear {
        &self.o_proj
    }

    /// Projects `x` (batch, seq, hidden) and applies RoPE.
    ///
    /// Returns `q` (batch, heads, seq, head_dim), `k` and `v` (batch,
    /// kv_heads, seq, head_dim), all contiguous — unless the projections
    /// are fused ([`Model::fuse_projections`], an inference engine's
    /// model): then they are views of the one product's (batch, seq, ·)
    /// memory with unit stride along head_dim, which [`Attention::attend`],
    /// libtorch's attention and index copies read as they are (a copy each
    /// would cost back the kernels the fusion saves). `rope` covers the
    /// same (batch or 1, seq) positions as `x`.
    pub fn qkv(&self, x: &Tensor, rope: &RopeTables) -> Result<(Tensor, Tensor, Tensor)> {
        self.project(x, rope, true)
    }

    /// [`Attention::qkv`]; with `heads_major` false the three are
    /// transposed views of (batch, seq, heads, head_dim) memory instead of
    /// contiguous — no layout copy at all, for the cache-less forward.
    fn project(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        heads_major: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, s, _) = x.size3()?;
        if let Some(qkv) = &self.qkv_proj {
            return self.heads_of_fused(&qkv.forward(x)?, (b, s), rope);
        }
        self.heads_of(
            self.q_proj.forward(x)?,
            self.k_proj.forward(x)?,
            self.v_proj.forward(x)?,
            (b, s),
            rope,
            heads_major,
        )
    }

    /// [`Attention::project`] of several sequence batches at once: `x` is
    /// (tokens, hidden), the tokens of part `i` being `rows × seq` of
    /// `parts[i]` in order, each with its own RoPE tables. One matrix
    /// product per projection for all parts (fewer, larger ops);
    /// `heads_major` false, as in the cache-less forward.
    pub(crate) fn project_parts(
        &self,
        x: &Tensor,
        parts: &[(i64, i64, &RopeTables)],
    ) -> Result<Vec<(Tensor, Tensor, Tensor)>> {
        let (q, k, v) = (
            self.q_proj.forward(x)?,
            self.k_proj.forward(x)?,
            self.v_proj.forward(x)?,
        );
        // `split`, not `narrow`: the backward of a split is one `cat`,
        // where each narrow's fills a zero tensor of the whole and adds.
        let rows: Vec<i64> = parts.iter().map(|&(b, s, _)| b * s).collect();
        let (q, k, v) = (
            q.f_split_with_sizes(&rows, 0)?,
            k.f_split_with_sizes(&rows, 0)?,
            v.f_split_with_sizes(&rows, 0)?,
        );
        let mut out = Vec::with_capacity(parts.len());
        for (i, &(b, s, rope)) in parts.iter().enumerate() {
            let (q, k, v) = (
                q[i].shallow_clone(),
                k[i].shallow_clone(),
                v[i].shallow_clone(),
            );
            out.push(self.heads_of(q, k, v, (b, s), rope, false)?);
        }
        Ok(out)
    }

    /// Projections ((batch, seq) or batch · seq rows of heads · head_dim)
    /// to heads, with the q/k norms and RoPE.
    fn heads_of(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        (b, s): (i64, i64),
        rope: &RopeTables,
        heads_major: bool,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let d = self.head_dim as i64;
        check_rope(rope, (b, s), d)?;
        let heads = |t: Tensor, n: usize| t.view([b, s, n as i64, d]);
        let (mut q, mut k) = (heads(q, self.num_heads), heads(k, self.num_kv_heads));
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            (q, k) = (q_norm.forward(&q)?, k_norm.forward(&k)?);
        }
        let q = rope.apply(&q, heads_major)?;
        let k = rope.apply(&k, heads_major)?;
        let v = heads(v, self.num_kv_heads).transpose(1, 2);
        let v = if heads_major { v.contiguous() } else { v };
        Ok((q, k, v))
    }

    /// [`Attention::heads_of`] for the fused product `y` (batch, seq,
    /// (heads + 2 · kv_heads) · head_dim): views, no copies. Query and key
    /// heads are adjacent in `y`, so one rotation covers both (four
    /// kernels, not eight) unless Qwen3's per-head norms come first.
    fn heads_of_fused(
        &self,
        y: &Tensor,
        (b, s): (i64, i64),
        rope: &RopeTables,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (h, kvh, d) = (
            self.num_heads as i64,
            self.num_kv_heads as i64,
            self.head_dim as i64,
        );
        check_rope(rope, (b, s), d)?;
        let qk = y
            .f_narrow(-1, 0, (h + kvh) * d)?
            .f_view([b, s, h + kvh, d])?;
        let v = y
            .f_narrow(-1, (h + kvh) * d, kvh * d)?
            .f_view([b, s, kvh, d])?
            .f_transpose(1, 2)?;
        let (q, k) = match &self.qk_norm {
            None => {
                let r = rope.apply(&qk, false)?; // (b, h + kvh, s, d)
                (r.f_narrow(1, 0, h)?, r.f_narrow(1, h, kvh)?)
            }
            Some((q_norm, k_norm)) => (
                rope.apply(&q_norm.forward(&qk.f_narrow(2, 0, h)?)?, false)?,
                rope.apply(&k_norm.forward(&qk.f_narrow(2, h, kvh)?)?, false)?,
            ),
        };
        Ok((q, k, v))
    }

    /// Uses `qkv` (weight ((heads + 2 · kv_heads) · head_dim, hidden), and
    /// the bias if the projections have one) for the three projections.
    /// The caller ([`crate::fused`]) has checked that their parameters are
    /// its row blocks.
    pub(crate) fn set_fused(&mut self, qkv: Linear) {
        self.qkv_proj = Some(qkv);
    }

    /// Attention of `q` (batch, heads, q_len, head_dim) over `k`, `v`
    /// (batch, kv_heads, k_len, head_dim), then the output projection:
    /// returns (batch, q_len, hidden).
    ///
    /// `k` and `v` may be views (e.g. `narrow` on the sequence dimension of
    /// a preallocated cache) with unit stride along head_dim. `mask` is
    /// additive, (batch or 1, q_len, k_len), from [`crate::mask`], in any
    /// float kind (converted to `q`'s); `None` lets every query see every
    /// key (a single decode step).
    pub fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.attend_visible(q, k, v, mask.map_or(Visible::All, Visible::Mask))
    }

    pub(crate) fn attend_visible(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        vis: Visible,
    ) -> Result<Tensor> {
        self.o_proj.forward(&self.attention(q, k, v, vis)?)
    }

    /// [`Attention::attend`] without the output projection: (batch,
    /// q_len, heads · head_dim).
    pub(crate) fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        vis: Visible,
    ) -> Result<Tensor> {
        let (b, h, s, d) = q.size4()?;
        let (kb, kvh, t, kd) = k.size4()?;
        if h != self.num_heads as i64
            || kvh != self.num_kv_heads as i64
            || d != self.head_dim as i64
            || kb != b
            || kd != d
            || v.size() != k.size()
        {
            return Err(Error::Input(format!(
                "attend: q {:?}, k {:?}, v {:?} do not fit {} heads / {} kv heads of size {}",
                q.size(),
                k.size(),
                v.size(),
                self.num_heads,
                self.num_kv_heads,
                self.head_dim
            )));
        }
        let mask = match vis {
            Visible::Mask(m) => {
                let md = m.size();
                if md.len() != 3 || (md[0] != 1 && md[0] != b) || md[1] != s || md[2] != t {
                    return Err(Error::Input(format!(
                        "attend: mask {md:?} does not fit {b} rows, {s} queries, {t} keys"
                    )));
                }
                Some(m.unsqueeze(1).to_kind(q.kind())) // (batch or 1, 1, s, t)
            }
            _ => None,
        };
        if crate::product_attention::fits(q, t) {
            let causal = matches!(vis, Visible::Causal);
            let out = crate::product_attention::attention(q, k, v, mask.as_ref(), causal)?;
            return Ok(out.transpose(1, 2).reshape([b, s, h * d]));
        }
        // libtorch's fused attention (flash kernel on CPU and CUDA) with
        // grouped-query support: K/V are not repeated per query head. Its
        // output has q's memory layout, so when q is a view of (batch, s,
        // heads, d) memory (the cache-less forward) the reshape below is
        // free; otherwise it is one copy.
        let out = Tensor::f_scaled_dot_product_attention(
            q,
            k,
            v,
            mask.as_ref(),
            0.0,
            matches!(vis, Visible::Causal),
            None,
            h != kvh,
        )?; // (b, h, s, d)
        Ok(out.transpose(1, 2).reshape([b, s, h * d]))
    }

    /// `attend(qkv(x))` for a sequence without cache.
    pub fn forward(&self, x: &Tensor, rope: &RopeTables, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_visible(x, rope, mask.map_or(Visible::All, Visible::Mask))
    }

    fn forward_visible(&self, x: &Tensor, rope: &RopeTables, vis: Visible) -> Result<Tensor> {
        let (q, k, v) = self.project(x, rope, false)?;
        self.attend_visible(&q, &k, &v, vis)
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.q_proj.push_params(&format!("{prefix}.q_proj"), out);
        self.k_proj.push_params(&format!("{prefix}.k_proj"), out);
        self.v_proj.push_params(&format!("{prefix}.v_proj"), out);
        self.o_proj.push_params(&format!("{prefix}.o_proj"), out);
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            q_norm.push_params(&format!("{prefix}.q_norm"), out);
            k_norm.push_params(&format!("{prefix}.k_norm"), out);
        }
    }
}

// ---------------------------------------------------------------- MLP

/// The SwiGLU feed-forward layer `down(silu(gate(x)) ⊙ up(x))`
/// (`model.layers.N.mlp`).
#[derive(Debug, Clone)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    /// `gate_proj` and `up_proj` as one product, when an engine fused them
    /// ([`Model::fuse_projections`]).
    gate_up_proj: Option<Linear>,
}

impl Mlp {
    pub fn load(w: &Weights, prefix: &str, cfg: &ModelConfig) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Mlp {
            gate_proj: Linear::load(w, &format!("{prefix}.gate_proj"), h, i, false)?,
            up_proj: Linear::load(w, &format!("{prefix}.up_proj"), h, i, false)?,
            down_proj: Linear::load(w, &format!("{prefix}.down_proj"), i, h, false)?,
            gate_up_proj: None,
        })
    }

    /// `x`: (..., hidden) → (..., hidden).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(gate_up) = &self.gate_up_proj {
            let y = gate_up.forward(x)?;
            let i = self.down_proj.weight().size()[1];
            let gated = y.f_narrow(-1, 0, i)?.f_silu()? * y.f_narrow(-1, i, i)?;
            return self.down_proj.forward(&gated);
        }
        let gated = self.gate_proj.forward(x)?.silu() * self.up_proj.forward(x)?;
        self.down_proj.forward(&gated)
    }

    /// Uses `gate_up` (weight (2 · intermediate, hidden)) for the gate and
    /// up projections; see [`Attention::set_fused`].
    pub(crate) fn set_fused(&mut self, gate_up: Linear) {
        self.gate_up_proj = Some(gate_up);
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.gate_proj
            .push_params(&format!("{prefix}.gate_proj"), out);
        self.up_proj.push_params(&format!("{prefix}.up_proj"), out);
        self.down_proj
            .push_params(&format!("{prefix}.down_proj"), out);
    }
}

// ---------------------------------------------------------------- block

/// One pre-norm decoder layer (`model.layers.N`):
/// `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
///
/// Its parts are public so an incremental engine can run `input_layernorm
/// → self_attn.qkv → (its own cache) → self_attn.attend → residual →
/// finish` itself; [`Block::forward`] is that sequence without a cache.
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
        let norm = |name: &str| RmsNorm::load(w, &format!("{prefix}.{name}"), h, eps);
        Ok(Block {
            input_layernorm: norm("input_layernorm")?,
            self_attn: Attention::load(w, &format!("{prefix}.self_attn"), cfg)?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            mlp: Mlp::load(w, &format!("{prefix}.mlp"), cfg)?,
        })
    }

    /// `x`: (batch, seq, hidden) → same shape. `mask` as in
    /// [`Attention::attend`].
    pub fn forward(&self, x: &Tensor, rope: &RopeTables, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_visible(x, rope, mask.map_or(Visible::All, Visible::Mask))
    }

    pub(crate) fn forward_visible(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        vis: Visible,
    ) -> Result<Tensor> {
        let attn = self
            .self_attn
            .forward_visible(&self.input_layernorm.forward(x)?, rope, vis)?;
        self.finish(&(x + attn))
    }

    /// The part after attention: `h + mlp(norm(h))`, where `h` already holds
    /// the attention residual.
    pub fn finish(&self, h: &Tensor) -> Result<Tensor> {
        let mlp = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(h)?)?;
        Ok(h + mlp)
    }

    /// The layer's projections under their names in it
    /// ([`crate::lora::PROJECTIONS`] order), for LoRA adapters; the fused
    /// products of an inference engine's model are not among them.
    pub(crate) fn projections(&self) -> [(&'static str, &Linear); 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            ("self_attn.q_proj", &a.q_proj),
            ("self_attn.k_proj", &a.k_proj),
            ("self_attn.v_proj", &a.v_proj),
            ("self_attn.o_proj", &a.o_proj),
            ("mlp.gate_proj", &m.gate_proj),
            ("mlp.up_proj", &m.up_proj),
            ("mlp.down_proj", &m.down_proj),
        ]
    }

    /// [`Block::projections`], to set adapters; `None` when the layer's
    /// projections are fused ([`Model::fuse_projections`]), whose products
    /// would bypass them.
    pub(crate) fn projections_mut(&mut self) -> Option<[(&'static str, &mut Linear); 7]> {
        if self.self_attn.qkv_proj.is_some() || self.mlp.gate_up_proj.is_some() {
            return None;
        }
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        Some([
            ("self_attn.q_proj", &mut a.q_proj),
            ("self_attn.k_proj", &mut a.k_proj),
            ("self_attn.v_proj", &mut a.v_proj),
            ("self_attn.o_proj", &mut a.o_proj),
            ("mlp.gate_proj", &mut m.gate_proj),
            ("mlp.up_proj", &mut m.up_proj),
            ("mlp.down_proj", &mut m.down_proj),
        ])
    }

    /// The products the layer's forward computes, under their names in it:
    /// `self_attn.qkv_proj` and `mlp.gate_up_proj` when fused
    /// ([`Model::fuse_projections`]), else the separate projections; and
    /// `self_attn.o_proj`, `mlp.down_proj`.
    pub(crate) fn products_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let (a, m) = (&mut self.self_attn, &mut self.mlp);
        let mut out: Vec<(&'static str, &mut Linear)> = Vec::with_capacity(7);
        match &mut a.qkv_proj {
            Some(qkv) => out.push(("self_attn.qkv_proj", qkv)),
            None => out.extend([
                ("self_attn.q_proj", &mut a.q_proj),
                ("self_attn.k_proj", &mut a.k_proj),
                ("self_attn.v_proj", &mut a.v_proj),
            ]),
        }
        out.push(("self_attn.o_proj", &mut a.o_proj));
        match &mut m.gate_up_proj {
            Some(gate_up) => out.push(("mlp.gate_up_proj", gate_up)),
            None => out.extend([
                ("mlp.gate_proj", &mut m.gate_proj),
                ("mlp.up_proj", &mut m.up_proj),
            ]),
        }
        out.push(("mlp.down_proj", &mut m.down_proj));
        out
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

// ---------------------------------------------------------------- model

/// A Qwen2 / Llama causal language model: embedding → layers → final norm
/// → LM head.
///
/// Cloning is cheap and shares the weights (shallow clones).
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<Block>,
    norm: RmsNorm,
    /// `None` when the head is tied to `embed_tokens`.
    lm_head: Option<Tensor>,
    rotary: RotaryEmbedding,
}

impl Clone for Model {
    /// Shares the weights: an in-place update through one clone (an
    /// optimizer step) is seen by all.
    fn clone(&self) -> Self {
        Model {
            cfg: self.cfg.clone(),
            embed_tokens: self.embed_tokens.shallow_clone(),
            layers: self.layers.clone(),
            norm: self.norm.clone(),
            lm_head: self.lm_head.as_ref().map(Tensor::shallow_clone),
            rotary: self.rotary.clone(),
        }
    }
}

impl Model {
    /// Builds the model from Hugging Face-named weights, checking every
    /// tensor's shape against `cfg`. The tensors are shared, not copied
    /// (their kind, device and `requires_grad` are the model's).
    pub fn load(cfg: &ModelConfig, w: &Weights) -> Result<Self> {
        weights::warn_unused(cfg, w);
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed_tokens = w.get("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..cfg.num_layers)
            .map(|i| Block::load(w, &format!("model.layers.{i}"), cfg))
            .collect::<Result<Vec<_>>>()?;
        let lm_head = match cfg.tie_word_embeddings {
            true => None,
            false => Some(w.get("lm_head.weight", &[v, h])?),
        };
        let rotary = RotaryEmbedding::new(
            cfg.head_dim,
            cfg.rope_theta,
            cfg.rope_llama3.as_ref(),
            embed_tokens.device(),
        );
        Ok(Model {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm: RmsNorm::load(w, "model.norm", h, cfg.rms_norm_eps)?,
            lm_head,
            rotary,
        })
    }

    /// Like [`Model::load`], but every parameter becomes a fresh copy with
    /// `requires_grad` set, so a loss computed from this model's forward
    /// has gradients for all of them. Get them with
    /// [`Model::trainable_parameters`].
    pub fn load_trainable(cfg: &ModelConfig, w: &Weights) -> Result<Self> {
        let model = Model::load(cfg, w)?;
        let params = model
            .named_parameters()
            .into_iter()
            .map(|(name, t)| (name, t.detach().copy().set_requires_grad(true)))
            .collect();
        Model::load(cfg, &Weights::from_tensors(params))
    }

    /// Reads `config.json` and the safetensors weights of a Hugging Face
    /// checkpoint directory, as `kind` on `device` (an error naming the
    /// device if it is not available).
    pub fn from_dir(dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        weights::check_device(device)?;
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        Model::load(&cfg, &Weights::from_dir(dir, kind, device)?)
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if
    /// needed) in the layout transformers loads. A tied head is not written.
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        self.save_dir_with(dir, &self.named_parameters())
    }

    /// [`Model::save_dir`] with the weights given by name (a sharded
    /// trainer's, gathered to the host a unit at a time), this model's
    /// config.
    pub fn save_dir_with(&self, dir: &Path, named: &[(String, Tensor)]) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let cfg_path = dir.join("config.json");
        let json = serde_json::to_string_pretty(&self.cfg.to_hf_json(self.dtype()))
            .expect("a JSON value serialises");
        std::fs::write(&cfg_path, json + "\n").map_err(|e| Error::io(&cfg_path, e))?;
        weights::save_safetensors(named, &dir.join(weights::WEIGHTS_FILE))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The parameters' kind (`Kind::Float`, `Kind::BFloat16`, …).
    pub fn dtype(&self) -> Kind {
        self.embed_tokens.kind()
    }

    pub fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    /// The decoder layers, for engines that run them one by one.
    pub fn layers(&self) -> &[Block] {
        &self.layers
    }

    pub(crate) fn layers_mut(&mut self) -> &mut [Block] {
        &mut self.layers
    }

    /// Every parameter once, under its Hugging Face name, in a stable order
    /// (embedding, layers, final norm, untied head): shallow clones sharing
    /// storage (and gradients) with the model.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![(
            "model.embed_tokens.weight".to_owned(),
            self.embed_tokens.shallow_clone(),
        )];
        for (i, layer) in self.layers.iter().enumerate() {
            layer.push_params(&format!("model.layers.{i}"), &mut out);
        }
        self.norm.push_params("model.norm", &mut out);
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".to_owned(), head.shallow_clone()));
        }
        out
    }

    /// The parameters that require a gradient, named and ordered as in
    /// [`Model::named_parameters`]: all of them for a model from
    /// [`Model::load_trainable`] (or loaded from tensors that require
    /// gradients), none for an inference model. They share storage with the
    /// model: an in-place update under `tch::no_grad` (an optimizer step)
    /// updates the model.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        self.named_parameters()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect()
    }

    // ------------------------------------------------------------ pieces

    /// Token embeddings: `input_ids` (batch, seq) of an integer kind →
    /// (batch, seq, hidden). An id outside the vocabulary is an error.
    pub fn embed(&self, input_ids: &Tensor) -> Result<Tensor> {
        check_rank("input_ids", input_ids, 2)?;
        let ids = match input_ids.kind() {
            Kind::Int64 | Kind::Int => input_ids.f_to_device(self.device())?,
            _ => input_ids
                .f_to_device(self.device())?
                .f_to_kind(Kind::Int64)?,
        };
        Ok(Tensor::f_embedding(
            &self.embed_tokens,
            &ids,
            -1,
            false,
            false,
        )?)
    }

    /// RoPE tables for explicit positions, one row per sequence.
    pub fn rope_tables(&self, positions: &[Vec<u32>]) -> Result<RopeTables> {
        self.rotary.tables(positions, self.dtype())
    }

    /// RoPE tables for position ids (batch or 1, seq) of an integer kind,
    /// computed on the device (no host round trip).
    pub fn rope_tables_for_positions(&self, position_ids: &Tensor) -> Result<RopeTables> {
        self.rotary.tables_for_positions(position_ids, self.dtype())
    }

    /// RoPE tables for positions `start..start + len`, shared by all rows.
    pub fn rope_tables_for_range(&self, start: usize, len: usize) -> Result<RopeTables> {
        self.rotary.tables_for_range(start, len, self.dtype())
    }

    /// The final RMSNorm: (…, hidden) → same shape.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// The LM head on normalised hidden states: (batch, seq, hidden) →
    /// (batch, seq, vocab).
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        let w = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        crate::layers::linear(hidden, w, None)
    }

    // ------------------------------------------------------------ forwards

    /// Logits (batch, seq, vocab) of an unpadded batch: every row is a full
    /// sequence starting at position 0.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.lm_head(&self.hidden_states(input_ids, None, None)?)
    }

    /// Logits of a padded batch. `attention_mask` (batch, seq): 1 for real
    /// tokens, 0 for padding, on either side, any kind. `position_ids`
    /// (batch or 1, seq) default to the count of real tokens before each
    /// one (so a right-padded row is numbered 0, 1, 2, … like an unpadded
    /// one and a left-padded row starts at 0 at its first real token).
    /// Logits at padding positions are meaningless.
    pub fn forward_masked(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        position_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.lm_head(&self.hidden_states(input_ids, Some(attention_mask), position_ids)?)
    }

    /// Final-normalised hidden states (batch, seq, hidden) — the input of
    /// the LM head, and of a critic's value head. Arguments as in
    /// [`Model::forward_masked`], both optional.
    ///
    /// The RoPE tables and the mask are built once and shared by all
    /// layers; without a mask the attention kernel applies causality itself.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.stages(input_ids, attention_mask, position_ids)?.run()
    }

    /// Incremental forward: runs the new tokens `input_ids` (batch, seq)
    /// after the keys and values already in `cache`, appends theirs, and
    /// returns logits (batch, seq, vocab) for the new tokens.
    ///
    /// `attention_mask`, if given, covers the cached and the new tokens
    /// (batch, cached + seq); positions are derived from it as in
    /// [`Model::forward_masked`]. Without it positions continue from
    /// `cache.len()`.
    pub fn forward_with_cache(
        &self,
        input_ids: &Tensor,
        cache: &mut KvCache,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        check_rank("input_ids", input_ids, 2)?;
        let (b, s) = input_ids.size2()?;
        let past = cache.len() as i64;
        let (rope, mask) = match attention_mask {
            Some(m) => {
                check_dims("attention_mask", m, &[b, past + s])?;
                let m = m.f_to_device(self.device())?;
                let positions = layers::position_ids_from_mask(&m)?.narrow(1, past, s);
                (
                    self.rope_tables_for_positions(&positions)?,
                    Some(layers::causal_padded(&m, s as usize, self.dtype())?),
                )
            }
            None => {
                let causal = (s > 1)
                    .then(|| {
                        layers::causal(s as usize, (past + s) as usize, self.dtype(), self.device())
                    })
                    .transpose()?;
                (
                    self.rope_tables_for_range(past as usize, s as usize)?,
                    causal,
                )
            }
        };
        let mut x = self.embed(input_ids)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let (q, k, v) = layer
                .self_attn
                .qkv(&layer.input_layernorm.forward(&x)?, &rope)?;
            let (k, v) = cache.append(i, &k, &v)?;
            let h = &x + layer.self_attn.attend(&q, &k, &v, mask.as_ref())?;
            x = layer.finish(&h)?;
        }
        cache.advance(s as usize);
        self.lm_head(&self.final_norm(&x)?)
    }

    /// An empty contiguous cache sized for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.layers.len())
    }
}

/// RoPE tables must cover (batch or 1, seq) positions of `head_dim`.
fn check_rope(rope: &RopeTables, (b, s): (i64, i64), d: i64) -> Result<()> {
    let rd = rope.dims();
    if rd.len() != 3 || (rd[0] != 1 && rd[0] != b) || rd[1] != s || rd[2] != d {
        return Err(Error::Input(format!(
            "qkv: RoPE tables {rd:?} do not fit input [{b}, {s}, ·] (head_dim {d})"
        )));
    }
    Ok(())
}

pub(crate) fn check_rank(what: &str, t: &Tensor, rank: usize) -> Result<()> {
    if t.dim() != rank {
        return Err(Error::Input(format!(
            "{what} must have {rank} dimensions, got shape {:?}",
            t.size()
        )));
    }
    Ok(())
}

pub(crate) fn check_dims(what: &str, t: &Tensor, expected: &[i64]) -> Result<()> {
    if t.size() != expected {
        return Err(Error::Input(format!(
            "{what} has shape {:?}, expected {expected:?}",
            t.size()
        )));
    }
    Ok(())
}
