//! The two forward passes the engine runs, built from colo-model's pieces
//! over the paged cache:
//!
//! - **prefill** of one sequence (prompt, or prompt + generated tokens when
//!   a preempted sequence is recomputed): one `(1, len)` forward whose keys
//!   and values are written into the sequence's blocks; attention over the
//!   fresh contiguous K/V with colo-model's own `attend`.
//! - **decode** of every running sequence at once: one `(batch, 1)`
//!   forward, so the projections and the MLP are matrix products over the
//!   batch; attention reads the blocks in place ([`crate::attention`]).

use candle_core::{CpuStorage, Device, Storage, Tensor};
use colo_model::{mask, Model};

use crate::attention::{paged_decode, PagedRow};
use crate::block_table::BlockId;
use crate::kv_cache::PagedKv;
use crate::weights::PooledWeights;
use crate::{Error, Result};

/// The output projection of each layer (colo-model's `attend` fuses it with
/// attention; the decode path needs it separately).
pub(crate) struct OutProj {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl OutProj {
    pub fn all(model: &Model, w: &PooledWeights) -> Result<Vec<OutProj>> {
        (0..model.layers().len())
            .map(|i| {
                let name = format!("model.layers.{i}.self_attn.o_proj");
                let weight = w
                    .get(&format!("{name}.weight"))
                    .ok_or_else(|| Error::Unsupported(format!("model has no `{name}.weight`")))?
                    .clone();
                let bias = w.get(&format!("{name}.bias")).cloned();
                Ok(OutProj { weight, bias })
            })
            .collect()
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.t()?)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

/// Runs `f` over a contiguous f32 CPU tensor's data.
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match (&*s, l.is_contiguous()) {
        (Storage::Cpu(CpuStorage::F32(v)), true) => {
            Ok(f(&v[l.start_offset()..l.start_offset() + t.elem_count()]))
        }
        _ => Err(Error::Unsupported(format!(
            "expected a contiguous float32 CPU tensor, got {:?} {:?}",
            t.dtype(),
            t.dims()
        ))),
    }
}

/// Slot of position `pos` in a block table.
#[inline]
fn slot(blocks: &[BlockId], pos: usize, block_size: usize) -> (BlockId, usize) {
    (blocks[pos / block_size], pos % block_size)
}

/// Prefill of `tokens` (all positions from 0) into `blocks`; returns the
/// logits (vocab) of the last position.
pub(crate) fn prefill(
    model: &Model,
    kv: &mut PagedKv,
    tokens: &[u32],
    blocks: &[BlockId],
) -> Result<Vec<f32>> {
    let len = tokens.len();
    let (bs, kvh, d) = (kv.layout.block_size, kv.layout.kv_heads, kv.layout.head_dim);
    let ids = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?; // (1, len)
    let rope = model.rope_tables_for_range(0, len)?;
    let causal = (len > 1)
        .then(|| mask::causal(len, len, model.dtype(), model.device()))
        .transpose()?;
    let mut x = model.embed(&ids)?; // (1, len, hidden)
    for (l, layer) in model.layers().iter().enumerate() {
        let attn = &layer.self_attn;
        let (q, k, v) = attn.qkv(&layer.input_layernorm.forward(&x)?, &rope)?; // k, v (1, kvh, len, d)
        with_f32(&k, |k| {
            with_f32(&v, |v| {
                for h in 0..kvh {
                    for t in 0..len {
                        let o = (h * len + t) * d;
                        kv.write(l, slot(blocks, t, bs), h, &k[o..o + d], &v[o..o + d]);
                    }
                }
            })
        })??;
        let h = (&x + attn.attend(&q, &k, &v, causal.as_ref())?)?;
        x = layer.finish(&h)?;
    }
    let last = x.narrow(1, len - 1, 1)?;
    let logits = model.lm_head(&model.final_norm(&last)?)?; // (1, 1, vocab)
    Ok(logits.flatten_all()?.to_vec1()?)
}

/// One sequence of a decode step: the token to feed, its position (where
/// its K/V go), and the block table (with a slot for that position).
pub(crate) struct DecodeRow<'a> {
    pub token: u32,
    pub pos: usize,
    pub blocks: &'a [BlockId],
}

/// One decode step of every row; returns logits (batch, vocab).
pub(crate) fn decode(
    model: &Model,
    o_proj: &[OutProj],
    kv: &mut PagedKv,
    rows: &[DecodeRow<'_>],
) -> Result<Tensor> {
    let b = rows.len();
    let cfg = model.config();
    let (heads, d) = (cfg.num_heads, cfg.head_dim);
    let (bs, kvh) = (kv.layout.block_size, kv.layout.kv_heads);
    let ids: Vec<u32> = rows.iter().map(|r| r.token).collect();
    let ids = Tensor::from_vec(ids, (b, 1), &Device::Cpu)?;
    let positions: Vec<Vec<u32>> = rows.iter().map(|r| vec![r.pos as u32]).collect();
    let rope = model.rope_tables(&positions)?;
    let paged: Vec<PagedRow<'_>> = rows
        .iter()
        .map(|r| PagedRow {
            blocks: r.blocks,
            len: r.pos + 1,
        })
        .collect();
    let mut x = model.embed(&ids)?; // (b, 1, hidden)
    for (l, layer) in model.layers().iter().enumerate() {
        let (q, k, v) = layer
            .self_attn
            .qkv(&layer.input_layernorm.forward(&x)?, &rope)?; // q (b, heads, 1, d); k, v (b, kvh, 1, d)
        with_f32(&k, |k| {
            with_f32(&v, |v| {
                for (i, r) in rows.iter().enumerate() {
                    for h in 0..kvh {
                        let o = (i * kvh + h) * d;
                        kv.write(l, slot(r.blocks, r.pos, bs), h, &k[o..o + d], &v[o..o + d]);
                    }
                }
            })
        })??;
        let mut out = vec![0f32; b * heads * d];
        with_f32(&q, |q| {
            paged_decode(&kv.layout, &kv.k[l], &kv.v[l], heads, q, &paged, &mut out)
        })?;
        let attn = Tensor::from_vec(out, (b, heads * d), &Device::Cpu)?;
        let o = o_proj[l].forward(&attn)?.unsqueeze(1)?; // (b, 1, hidden)
        x = layer.finish(&(&x + o)?)?;
    }
    let logits = model.lm_head(&model.final_norm(&x)?)?; // (b, 1, vocab)
    Ok(logits.squeeze(1)?.contiguous()?)
}
