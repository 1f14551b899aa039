//! Qwen2 and Llama decoder-only transformers on [candle](candle_core), with
//! Hugging Face checkpoint loading and saving.
//!
//! This is the model that both of colo's engines run: the trainer (which
//! needs gradients for every parameter) and the rollout engine (which needs
//! an incremental forward over its own key/value cache).
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use colo_model::{loss, Checkpoint};
//!
//! let ckpt = Checkpoint::from_dir("testdata/tiny-qwen2".as_ref(), DType::F32, &Device::Cpu)?;
//! let ids = ckpt.tokenizer.as_ref().unwrap().encode("The quick brown fox", false)?;
//! let ids = Tensor::new(ids.as_slice(), &Device::Cpu)?.unsqueeze(0)?; // (1, seq)
//! let logits = ckpt.model.forward(&ids)?; // (1, seq, vocab)
//! let logprobs = loss::next_token_logprobs(&logits, &ids)?; // (1, seq - 1)
//! # Ok::<(), colo_model::Error>(())
//! ```
//!
//! # Layout
//!
//! One file per concern, read top to bottom in the style of
//! candle-transformers' `llama.rs`: [`config`] (raw `config.json` →
//! validated [`ModelConfig`]) → [`layers`] (linear, RMSNorm) → [`rope`] →
//! [`mask`] → [`attention`] → [`mlp`] → [`block`] → [`model`]; [`cache`] is
//! the reference KV cache, [`weights`] reads and writes safetensors,
//! [`tokenizer`] wraps `tokenizers`, [`loss`] has log-probabilities and the
//! next-token loss.
//!
//! # Design decisions
//!
//! - **Every op has a backward.** candle-nn's fused `rms_norm`,
//!   `softmax_last_dim`, `rope` and `sdpa` define no backward and silently
//!   drop gradients. [`ops`] has fused float32 CPU kernels for the same
//!   three operations *with* a backward, and falls back to compositions of
//!   differentiable tensor ops on other devices and dtypes. A test checks
//!   that every parameter gets a non-zero gradient and that the gradients
//!   match PyTorch's.
//! - **Parameters are shared tensors, optionally `Var`s.** [`Model::load`]
//!   builds an inference model; [`Model::load_trainable`] makes every
//!   parameter a [`candle_core::Var`] and [`Model::vars`] hands them to an
//!   optimizer under their Hugging Face names. Updating a var updates the
//!   model in place.
//! - **Pieces for a paged KV cache.** [`Model::embed`], per layer
//!   [`Attention::qkv`] (projection + RoPE) and [`Attention::attend`] (given
//!   any K/V, e.g. gathered from pages), [`Block::finish`] (MLP half),
//!   [`Model::final_norm`] and [`Model::lm_head`]. [`Model::forward_with_cache`]
//!   strings them together over the simple contiguous [`KvCache`].
//! - **Grouped-query attention without repeating K/V.** The query heads that
//!   share a KV head are stacked along the row dimension so one batched
//!   matmul serves the group; the attention scale is folded into the softmax
//!   kernel and the (seq, heads) transpose into the RoPE kernel.
//! - **Padding either side.** [`Model::forward_masked`] takes a 0/1
//!   attention mask and derives position ids from it as transformers'
//!   `generate` does, so right-padded (training) and left-padded (prompt)
//!   batches give the same logits at real tokens as unpadded sequences.
//! - **The checkpoint format is Hugging Face's.** Tensor names, tied heads
//!   left out of the file, `rope_theta` read from the top level or from
//!   transformers 5's `rope_parameters`, `format: pt` metadata on save.

pub mod attention;
pub mod block;
pub mod cache;
pub mod config;
mod error;
pub mod layers;
pub mod loss;
pub mod mask;
pub mod mlp;
pub mod model;
pub mod ops;
pub mod rope;
pub mod tokenizer;
pub mod weights;

use std::path::Path;

use candle_core::{DType, Device};

pub use attention::Attention;
pub use block::Block;
pub use cache::KvCache;
pub use config::{Arch, HfConfig, ModelConfig, SUPPORTED_MODEL_TYPES};
pub use error::{Error, Result};
pub use model::Model;
pub use rope::RopeTables;
pub use tokenizer::{ChatMessage, SpecialToken, SpecialTokens, Tokenizer};
pub use weights::Weights;

/// A Hugging Face checkpoint directory: the model and, when the directory
/// has a `tokenizer.json`, its tokenizer.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub model: Model,
    pub tokenizer: Option<Tokenizer>,
}

impl Checkpoint {
    /// Loads `config.json`, the safetensors weights, and the tokenizer if
    /// present.
    pub fn from_dir(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let model = Model::from_dir(dir, dtype, device)?;
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
