//! The paged KV cache's storage: per layer one key and one value tensor,
//! allocated once in the `kv_cache` tag and written in place, so their
//! addresses never change (across any number of release/resume cycles —
//! what CUDA graphs need).
//!
//! Each buffer is `(kv_heads, slots, head_dim)`, where slot
//! `block · block_size + i` is position `i` of block `block`. Head-major, so
//! that gathering a batch's keys (one `index_select` along the slots) gives
//! `(kv_heads, rows, keys, head_dim)` whose leading two dimensions are one
//! batch dimension for the attention's batched matrix products — no layout
//! copy after the gather. Writing a step is one `index_copy_` per buffer.

use std::sync::Arc;

use colo_mem::{tags::KV_CACHE, Pool};
use tch::{Device, Kind, Tensor};

use crate::block_table::BlockId;
use crate::weights::pooled;
use crate::Result;

/// Shape of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Bytes of one element (4 for float32, 2 for bfloat16).
    pub elem_bytes: usize,
}

impl KvLayout {
    /// Elements of one block of one layer's keys (or values).
    pub fn block_elems(&self) -> usize {
        self.kv_heads * self.block_size * self.head_dim
    }

    /// Bytes of one block over all layers, keys and values.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_elems() * self.elem_bytes
    }

    /// Bytes of one token's keys and values over all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_block() / self.block_size
    }

    /// Slots (token positions) in the cache.
    pub fn slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// The slot of position `pos` of a sequence with block table `blocks`.
    #[inline]
    pub fn slot(&self, blocks: &[BlockId], pos: usize) -> i64 {
        (blocks[pos / self.block_size] as usize * self.block_size + pos % self.block_size) as i64
    }
}

/// Keys and values of every layer, in pool memory.
pub struct PagedKv {
    pub layout: KvLayout,
    /// Per layer, keys and values: each (kv_heads, slots, head_dim).
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl PagedKv {
    /// Allocates the whole cache (zeroed) in tag `kv_cache` of `pool`: one
    /// key and one value buffer per layer.
    pub fn new(pool: &Arc<Pool>, layout: KvLayout, kind: Kind, device: Device) -> Result<Self> {
        let shape = [
            layout.kv_heads as i64,
            layout.slots() as i64,
            layout.head_dim as i64,
        ];
        let buffer = || pooled(pool, KV_CACHE, || Tensor::f_zeros(shape, (kind, device)));
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for _ in 0..layout.num_layers {
            k.push(buffer()?);
            v.push(buffer()?);
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
            .flat_map(|(k, v)| [k.data_ptr() as u64, v.data_ptr() as u64])
            .collect()
    }

    /// Keys and values of `layer`, each (kv_heads, slots, head_dim).
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        (&self.k[layer], &self.v[layer])
    }

    /// Another handle on the same buffers, for a lane of a pass that
    /// writes other slots (see `colo_model::lanes`).
    pub(crate) fn share(&self) -> PagedKv {
        PagedKv {
            layout: self.layout,
            k: self.k.iter().map(Tensor::shallow_clone).collect(),
            v: self.v.iter().map(Tensor::shallow_clone).collect(),
        }
    }

    /// Writes `k`, `v` ((batch, kv_heads, seq, head_dim), as colo-model's
    /// `qkv` returns them) at `slots`: all their positions in the order
    /// (batch, seq), or only those at the indices `select` into that order
    /// (`slots` then has one entry per selected position).
    pub fn write(
        &mut self,
        layer: usize,
        slots: &Tensor,
        k: &Tensor,
        v: &Tensor,
        select: Option<&Tensor>,
    ) -> Result<()> {
        let (kvh, d) = (self.layout.kv_heads as i64, self.layout.head_dim as i64);
        for (dst, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
            // (batch, kv_heads, seq, d) → (kv_heads, batch · seq, d).
            let mut rows = src.f_transpose(0, 1)?.f_reshape([kvh, -1, d])?;
            if let Some(select) = select {
                rows = rows.f_index_select(1, select)?;
            }
            let _ = dst.f_index_copy_(1, slots, &rows)?;
        }
        Ok(())
    }

    /// Copies on write: for each `(src, dst, slots)`, the first `slots`
    /// positions of block `src` into block `dst`, every layer, keys and
    /// values — one gather and one scatter per buffer for all of them.
    /// The destinations must be distinct blocks that no source is.
    pub fn copy_prefixes(&mut self, copies: &[(BlockId, BlockId, usize)]) {
        let bs = self.layout.block_size as i64;
        let (mut from, mut to) = (Vec::new(), Vec::new());
        for &(src, dst, slots) in copies {
            for i in 0..slots as i64 {
                from.push(src as i64 * bs + i);
                to.push(dst as i64 * bs + i);
            }
        }
        if from.is_empty() {
            return;
        }
        let device = self.k[0].device();
        let (from, to) = (
            Tensor::from_slice(&from).to_device(device),
            Tensor::from_slice(&to).to_device(device),
        );
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            let rows = buf.index_select(1, &from);
            let _ = buf.index_copy_(1, &to, &rows);
        }
    }
}
