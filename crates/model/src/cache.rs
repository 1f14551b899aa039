//! A contiguous key/value cache: the reference for incremental decoding.
//!
//! Each step concatenates the new keys and values onto the old ones, which
//! copies the whole cache every step. That is fine for tests and short
//! generations; the rollout engine keeps a paged cache of its own and calls
//! [`crate::Attention::qkv`] / [`crate::Attention::attend`] directly.

use candle_core::Tensor;

use crate::Result;

/// Per-layer keys and values, each (batch, kv_heads, len, head_dim).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    pub fn new(num_layers: usize) -> Self {
        KvCache {
            layers: vec![None; num_layers],
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
        let kv = match self.layers[layer].take() {
            None => (k.clone(), v.clone()),
            Some((pk, pv)) => (Tensor::cat(&[&pk, k], 2)?, Tensor::cat(&[&pv, v], 2)?),
        };
        self.layers[layer] = Some(kv.clone());
        Ok(kv)
    }

    /// Records that `n` tokens were appended to every layer.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
