//! Qwen2 and Llama decoder-only transformers on libtorch (through
//! [`tch`]), with Hugging Face checkpoint loading and saving.
//!
//! This is the model that both of colo's engines run: the trainer (which
//! needs gradients for every parameter) and the rollout engine (which needs
//! an incremental forward over its own key/value cache).
//!
//! ```no_run
//! use colo_model::{loss, Checkpoint};
//! use tch::{Device, Kind, Tensor};
//!
//! let ckpt = Checkpoint::from_dir("testdata/tiny-qwen2".as_ref(), Kind::Float, Device::Cpu)?;
//! let ids = ckpt.tokenizer.as_ref().unwrap().encode("The quick brown fox", false)?;
//! let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
//! let ids = Tensor::from_slice(&ids).unsqueeze(0); // (1, seq)
//! let logits = ckpt.model.forward(&ids)?; // (1, seq, vocab)
//! let logprobs = loss::next_token_logprobs(&logits, &ids)?; // (1, seq - 1)
//! # Ok::<(), colo_model::Error>(())
//! ```
//!
//! # Layout
//!
//! In the style of candle-transformers' `llama.rs` and nanoGPT's
//! `model.py`: [`config`] (raw `config.json` → validated [`ModelConfig`]),
//! [`model`] (the architecture in one file, read top to bottom: cache →
//! attention → MLP → block → model), [`layers`] (the shared pieces: linear,
//! RMSNorm, RoPE, masks; also reachable as [`rope`] and [`mask`]),
//! [`weights`] (safetensors in and out), [`tokenizer`] (wraps
//! `tokenizers`), [`loss`] (log-probabilities and the next-token loss).
//!
//! # Design decisions
//!
//! - **libtorch does the numerics.** The engine moved from candle to
//!   libtorch 2.11 through `tch` 0.24: MKL/oneDNN matrix products (AMX or
//!   AVX-512 BF16 for bfloat16 on the CPU), CUDA, and fused ops that all
//!   have a backward — `rms_norm`, `scaled_dot_product_attention` (flash
//!   kernel, grouped-query attention without repeating K/V), `linear`,
//!   `logsumexp`. The hand-written float32 kernels and custom backwards
//!   candle needed (its fused ops had none) are gone; autograd
//!   differentiates everything. Parity tests check every parameter's
//!   gradient against PyTorch's. Two exceptions on the CPU, where
//!   libtorch is slow: RMSNorm is colo-kernels' fused kernel (libtorch's is a
//!   composite there), and bfloat16 attention is two batched products
//!   around a softmax (`product_attention`; the flash kernel does not use
//!   AMX). See the crate's README.
//! - **Kind and device are parameters.** float32 is the reference path;
//!   bfloat16 (`Kind::BFloat16`) and float64 work wherever a kind is taken,
//!   and nothing assumes the CPU. Asking for `Device::Cuda(_)` without a
//!   GPU is an [`Error::DeviceUnavailable`] naming the device.
//! - **Parameters are shared tensors.** [`Model::load`] uses the tensors it
//!   is given (shallow clones: same storage, same `requires_grad`), so a
//!   trainer or a rollout engine that owns the parameters (e.g. in a
//!   colo-mem pool) builds a model over them. [`Model::load_trainable`]
//!   makes fresh copies that require gradients; [`Model::trainable_parameters`]
//!   hands them out under their Hugging Face names, and updating them in
//!   place (under `tch::no_grad`) updates the model. Cloning a model is
//!   shallow.
//! - **One forward, built once.** The RoPE cos/sin tables and the attention
//!   mask are computed once per forward, on the device, and shared by all
//!   layers; an unpadded forward passes no mask at all (the attention
//!   kernel applies causality and skips masked blocks). Projections are one
//!   `addmm` each. In the cache-less forward Q, K and V stay in the
//!   projections' (batch, seq, heads, head_dim) memory (RoPE writes that
//!   layout, the attention kernel reads strided views and writes its
//!   output in it), so a layer makes no layout copies; [`Attention::qkv`]
//!   hands out contiguous (batch, heads, seq, head_dim) for cache writers,
//!   at the same cost for Q and K.
//! - **Pieces for a paged KV cache.** [`Model::embed`], per layer
//!   [`Attention::qkv`] (projection + RoPE) and [`Attention::attend`] (given
//!   any K/V, e.g. gathered from pages), [`Block::finish`] (MLP half),
//!   [`Model::final_norm`] and [`Model::lm_head`]. [`Model::forward_with_cache`]
//!   strings them together over the simple contiguous [`KvCache`].
//!   [`Attention::attend_heads`] (attention without `o_proj`) is for a
//!   tensor-parallel engine, which runs the output projection row-parallel
//!   over a model of its rank's heads.
//! - **Fused projections for inference engines.** [`Model::fuse_projections`]
//!   makes each layer compute q/k/v with one product and gate/up with
//!   another, over buffers whose row blocks are the parameters themselves
//!   ([`fused`]): names, shapes and in-place updates stay as they were. The
//!   rollout engine fuses its copy; the trainer never does.
//! - **Padding either side.** [`Model::forward_masked`] takes a 0/1
//!   attention mask and derives position ids from it as transformers'
//!   `generate` does, so right-padded (training) and left-padded (prompt)
//!   batches give the same logits at real tokens as unpadded sequences.
//!   Masks are additive with the kind's most negative finite value, not
//!   `-inf`, so a query with nothing to attend to gets a uniform row
//!   instead of NaN (as in transformers).
//! - **The checkpoint format is Hugging Face's.** Tensor names, tied heads
//!   left out of the file, `rope_theta` read from the top level or from
//!   transformers 5's `rope_parameters`, `format: pt` metadata on save.
//!   Loading converts to the requested kind and device, and every failure
//!   names the file (and the tensor).
//! - **Refuse rather than approximate.** Scaled RoPE variants (llama3, yarn,
//!   …), sliding-window attention, MLP biases and non-SiLU activations are
//!   config errors, not silently ignored.

pub mod chat_template;
pub mod config;
mod error;
pub mod fused;
pub mod lanes;
pub mod layers;
pub mod lora;
pub mod loss;
pub mod model;
mod product_attention;
mod shared_prompt;
mod stages;
mod tensor_parallel;
pub mod tokenizer;
pub mod weights;

/// Rotary position embedding: tables and position ids (defined in
/// [`layers`]).
pub mod rope {
    pub use crate::layers::{
        position_ids_from_mask, positions_from_mask, RopeTables, RotaryEmbedding,
    };
}

/// Additive attention masks: 0 where a query may attend to a key, the
/// kind's most negative finite value where it may not (defined in
/// [`layers`]).
pub mod mask {
    pub use crate::layers::{causal, causal_padded, masked_value, MASKED};
}

use std::path::Path;

use tch::{Device, Kind};

pub use config::{Arch, HfConfig, Llama3Rope, ModelConfig, SUPPORTED_MODEL_TYPES};
pub use error::{Error, Result};
pub use fused::{fused_groups, FusedGroup};
pub use layers::{Linear, RmsNorm, RopeTables};
pub use model::{Attention, Block, KvCache, Mlp, Model};
pub use shared_prompt::SharedPrompts;
pub use stages::Stages;
pub use tokenizer::{ChatMessage, SpecialToken, SpecialTokens, Tokenizer};
pub use weights::{check_device, Weights};

/// A Hugging Face checkpoint directory: the model and, when the directory
/// has a `tokenizer.json`, its tokenizer.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub model: Model,
    pub tokenizer: Option<Tokenizer>,
}

impl Checkpoint {
    /// Loads `config.json`, the safetensors weights (as `kind` on
    /// `device`), and the tokenizer if present.
    pub fn from_dir(dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        let model = Model::from_dir(dir, kind, device)?;
        let tokenizer = match dir.join("tokenizer.json").is_file() {
            true => Some(Tokenizer::from_dir(dir)?),
            false => None,
        };
        Ok(Checkpoint { model, tokenizer })
    }

    /// Writes the model to `dir` and copies the tokenizer files from
    /// `tokenizer_src` (typically the directory it was loaded from).
    pub fn save_dir(&self, dir: &Path, tokenizer_src: Option<&Path>) -> Result<()> {
        self.model.save_dir(dir)?;
        if let Some(src) = tokenizer_src {
            tokenizer::copy_tokenizer_files(src, dir)?;
        }
        Ok(())
    }
}
