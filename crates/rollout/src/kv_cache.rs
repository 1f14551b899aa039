//! The paged KV cache's storage: per layer, one key and one value buffer of
//! `num_blocks` fixed-size blocks, allocated once in the `kv_cache` tag and
//! written in place, so their addresses never change (across any number of
//! release/resume cycles — what CUDA graphs need).
//!
//! Layout of each buffer: `[block][kv_head][slot][head_dim]`, so the keys of
//! one head in one block are one contiguous `(block_size, head_dim)` matrix.

use std::sync::Arc;

use colo_mem::{tags::KV_CACHE, Pool};

use crate::block_table::BlockId;
use crate::weights::pooled_zeros;
use crate::Result;

/// Shape of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvLayout {
    /// f32 elements of one block of one layer's keys (or values).
    pub fn block_elems(&self) -> usize {
        self.kv_heads * self.block_size * self.head_dim
    }

    /// Bytes of one block over all layers, keys and values.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_elems() * std::mem::size_of::<f32>()
    }

    /// Bytes of one token's keys and values over all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_block() / self.block_size
    }

    /// Offset of `(block, head, slot)` in a layer buffer.
    #[inline]
    pub fn offset(&self, block: BlockId, head: usize, slot: usize) -> usize {
        ((block as usize * self.kv_heads + head) * self.block_size + slot) * self.head_dim
    }
}

/// Keys and values of every layer, in pool memory.
pub struct PagedKv {
    pub layout: KvLayout,
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl PagedKv {
    /// Allocates the whole cache in tag `kv_cache` of `pool`.
    pub fn new(pool: &Arc<Pool>, layout: KvLayout) -> Result<Self> {
        let len = layout.num_blocks * layout.block_elems();
        let mut k = Vec::with_capacity(layout.num_layers);
        let mut v = Vec::with_capacity(layout.num_layers);
        for _ in 0..layout.num_layers {
            k.push(pooled_zeros(pool, KV_CACHE, len)?);
            v.push(pooled_zeros(pool, KV_CACHE, len)?);
        }
        Ok(PagedKv { layout, k, v })
    }

    /// Total bytes of the buffers.
    pub fn bytes(&self) -> usize {
        self.layout.num_blocks * self.layout.bytes_per_block()
    }

    /// The start address of every buffer (keys then values, per layer).
    pub fn addresses(&self) -> Vec<u64> {
        self.k
            .iter()
            .zip(&self.v)
            .flat_map(|(k, v)| [k.as_ptr() as u64, v.as_ptr() as u64])
            .collect()
    }

    /// Writes the key and value of one head at one position.
    #[inline]
    pub fn write(&mut self, layer: usize, at: (BlockId, usize), head: usize, k: &[f32], v: &[f32]) {
        let o = self.layout.offset(at.0, head, at.1);
        let d = self.layout.head_dim;
        self.k[layer][o..o + d].copy_from_slice(k);
        self.v[layer][o..o + d].copy_from_slice(v);
    }

    /// Copy on write: the first `slots` positions of block `src` into `dst`,
    /// every layer and head.
    pub fn copy_prefix(&mut self, src: BlockId, dst: BlockId, slots: usize) {
        let l = self.layout;
        let n = slots * l.head_dim;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            for h in 0..l.kv_heads {
                let (s, d) = (l.offset(src, h, 0), l.offset(dst, h, 0));
                buf.copy_within(s..s + n, d);
            }
        }
    }
}
