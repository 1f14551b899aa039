//! The two forward passes the engine runs, built from colo-model's pieces
//! over the paged cache:
//!
//! - **prefill** of one sequence (prompt, or prompt + generated tokens when
//!   a preempted sequence is recomputed): one `(1, len)` forward whose keys
//!   and values are written into the sequence's blocks; attention over the
//!   fresh K/V with colo-model's own `attend` and a causal mask.
//! - **decode** of every running sequence at once: one `(batch, 1)`
//!   forward, so the projections and the MLP are matrix products over the
//!   batch; each layer writes the new K/V rows into the pages and attends
//!   over the rows gathered from them ([`crate::attention`]).
//!
//! Both run under `no_grad` (the engine never differentiates) and send
//! only token ids, positions and slot indices to the device.

use colo_model::Model;
use tch::Tensor;

use crate::attention::{PagedBatch, Scratch};
use crate::block_table::BlockId;
use crate::kv_cache::PagedKv;
use crate::Result;

/// Token ids or positions as an Int64 tensor (rows, cols) on the model's
/// device.
fn ids(model: &Model, v: &[i64], rows: usize) -> Tensor {
    Tensor::from_slice(v)
        .view([rows as i64, -1])
        .to_device(model.device())
}

/// Prefill of `tokens` (all positions from 0) into `blocks`; returns the
/// logits (1, vocab) of the last position.
pub(crate) fn prefill(
    model: &Model,
    kv: &mut PagedKv,
    tokens: &[u32],
    blocks: &[BlockId],
) -> Result<Tensor> {
    let _no_grad = tch::no_grad_guard();
    let len = tokens.len();
    let tok: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let slots: Vec<i64> = (0..len).map(|p| kv.layout.slot(blocks, p)).collect();
    let slots = ids(model, &slots, 1).view([-1]);
    let rope = model.rope_tables_for_range(0, len)?;
    let causal = colo_model::mask::causal(len, len, model.dtype(), model.device())?;
    let mut x = model.embed(&ids(model, &tok, 1))?; // (1, len, hidden)
    for (l, layer) in model.layers().iter().enumerate() {
        let attn = &layer.self_attn;
        let (q, k, v) = attn.qkv(&layer.input_layernorm.forward(&x)?, &rope)?; // k, v (1, kvh, len, d)
        kv.write(l, &slots, &k, &v)?;
        let h = &x + attn.attend(&q, &k, &v, Some(&causal))?;
        x = layer.finish(&h)?;
    }
    let last = x.narrow(1, len as i64 - 1, 1);
    let logits = model.lm_head(&model.final_norm(&last)?)?; // (1, 1, vocab)
    Ok(logits.squeeze_dim(1))
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
    kv: &mut PagedKv,
    rows: &[DecodeRow<'_>],
    scratch: &mut Scratch,
) -> Result<Tensor> {
    let _no_grad = tch::no_grad_guard();
    let b = rows.len();
    let layout = kv.layout;
    let tok: Vec<i64> = rows.iter().map(|r| r.token as i64).collect();
    let pos: Vec<i64> = rows.iter().map(|r| r.pos as i64).collect();
    let slots: Vec<i64> = rows.iter().map(|r| layout.slot(r.blocks, r.pos)).collect();
    let slots = ids(model, &slots, b).view([-1]);
    let rope = model.rope_tables_for_positions(&ids(model, &pos, b))?; // (b, 1)
    let tables: Vec<&[BlockId]> = rows.iter().map(|r| r.blocks).collect();
    let lens: Vec<usize> = rows.iter().map(|r| r.pos + 1).collect();
    let paged = PagedBatch::decode(&layout, &tables, &lens, model.dtype(), model.device());
    let mut x = model.embed(&ids(model, &tok, b))?; // (b, 1, hidden)
    for (l, layer) in model.layers().iter().enumerate() {
        let attn = &layer.self_attn;
        let (q, k, v) = attn.qkv(&layer.input_layernorm.forward(&x)?, &rope)?; // q (b, heads, 1, d); k, v (b, kvh, 1, d)
        kv.write(l, &slots, &k, &v)?;
        let (k_cache, v_cache) = kv.layer(l);
        let a = paged.attend(&q, k_cache, v_cache, scratch)?; // (b, 1, heads · d)
        let h = &x + attn.o_proj().forward(&a)?;
        x = layer.finish(&h)?;
    }
    let logits = model.lm_head(&model.final_norm(&x)?)?; // (b, 1, vocab)
    Ok(logits.squeeze_dim(1))
}
