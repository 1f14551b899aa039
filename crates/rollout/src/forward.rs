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
//! only token ids, positions and slot indices to the device. With a
//! tensor-parallel group the model is this rank's slice, and each layer's
//! `o_proj` and MLP outputs are summed over the group
//! ([`crate::tensor_parallel`]).

use colo_model::Model;
use tch::Tensor;

use crate::attention::{PagedBatch, Scratch};
use crate::block_table::BlockId;
use crate::kv_cache::PagedKv;
use crate::tensor_parallel::{self as tp, TensorParallel};
use crate::Result;

/// Token ids or positions as an Int64 tensor (rows, cols) on the model's
/// device.
fn ids(model: &Model, v: &[i64], rows: usize) -> Tensor {
    Tensor::from_slice(v)
        .view([rows as i64, -1])
        .to_device(model.device())
}

/// One sequence of a prefill: its tokens from position 0, and the blocks
/// they go into.
pub(crate) struct PrefillRow<'a> {
    pub tokens: &'a [u32],
    pub blocks: &'a [BlockId],
}

/// Prefill of several sequences in one right-padded (rows, longest)
/// forward; returns the logits (rows, vocab) of each one's last position.
///
/// Right padding needs no mask beyond the causal one: a real position only
/// sees positions before it, all real. The padding's keys and values are
/// not written, and its outputs are not read.
pub(crate) fn prefill(
    model: &Model,
    kv: &mut PagedKv,
    rows: &[PrefillRow<'_>],
    mut group: Option<&mut dyn TensorParallel>,
) -> Result<Tensor> {
    let _no_grad = tch::no_grad_guard();
    let (b, len) = (
        rows.len(),
        rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0),
    );
    let mut tok = vec![0i64; b * len];
    let (mut real, mut slots, mut last) = (Vec::new(), Vec::new(), Vec::with_capacity(b));
    for (i, r) in rows.iter().enumerate() {
        let at = i * len;
        for (p, &t) in r.tokens.iter().enumerate() {
            tok[at + p] = t as i64;
            real.push((at + p) as i64);
            slots.push(kv.layout.slot(r.blocks, p));
        }
        last.push((at + r.tokens.len().max(1) - 1) as i64);
    }
    let (real, slots) = (
        ids(model, &real, 1).view([-1]),
        ids(model, &slots, 1).view([-1]),
    );
    let rope = model.rope_tables_for_range(0, len)?;
    let causal = colo_model::mask::causal(len, len, model.dtype(), model.device())?;
    let mut x = model.embed(&ids(model, &tok, b))?; // (b, len, hidden)
    for (l, layer) in model.layers().iter().enumerate() {
        let attn = &layer.self_attn;
        let (q, k, v) = attn.qkv(&layer.input_layernorm.forward(&x)?, &rope)?; // k, v (b, kvh, len, d)
        kv.write(l, &slots, &k, &v, Some(&real))?;
        x = match group.as_deref_mut() {
            None => layer.finish(&(&x + attn.attend(&q, &k, &v, Some(&causal))?))?,
            Some(g) => {
                let heads = attn.attend_heads(&q, &k, &v, Some(&causal))?;
                let h = &x + tp::row_parallel(attn.o_proj(), &heads, g)?;
                tp::finish(layer, &h, g)?
            }
        };
    }
    let hidden = x.size()[2];
    let last = x
        .reshape([-1, hidden])
        .index_select(0, &ids(model, &last, 1).view([-1]))
        .unsqueeze(1); // (b, 1, hidden)
    let logits = model.lm_head(&model.final_norm(&last)?)?; // (b, 1, vocab)
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
    group: Option<&mut dyn TensorParallel>,
) -> Result<Tensor> {
    let _no_grad = tch::no_grad_guard();
    let b = rows.len();
    let layout = kv.layout;
    let tok: Vec<i64> = rows.iter().map(|r| r.token as i64).collect();
    let pos: Vec<i64> = rows.iter().map(|r| r.pos as i64).collect();
    let slots: Vec<i64> = rows.iter().map(|r| layout.slot(r.blocks, r.pos)).collect();
    let tables: Vec<&[BlockId]> = rows.iter().map(|r| r.blocks).collect();
    let lens: Vec<usize> = rows.iter().map(|r| r.pos + 1).collect();
    let paged = PagedBatch::decode(&layout, &tables, &lens, model.dtype(), model.device());
    let step = DecodeInputs {
        tokens: &ids(model, &tok, b),
        positions: &ids(model, &pos, b),
        slots: &ids(model, &slots, b).view([-1]),
        paged: &paged,
    };
    let x = decode_hidden(model, kv, &step, scratch, group)?;
    Ok(model.lm_head(&x)?.squeeze_dim(1))
}

/// A decode step's inputs on the device: `tokens` and `positions` (rows,
/// 1), the slot each row's new keys and values go to (rows,), and what
/// each row attends to.
pub(crate) struct DecodeInputs<'a> {
    pub tokens: &'a Tensor,
    pub positions: &'a Tensor,
    pub slots: &'a Tensor,
    pub paged: &'a PagedBatch,
}

/// The layers of a decode step and the final norm: writes every row's keys
/// and values into the pages and returns the normalised hidden states
/// (rows, 1, hidden), the LM head's input. Only device work, no transfer
/// from or to the host: a CUDA graph captures it (`crate::graphs`;
/// without a group — a tensor-parallel engine runs eagerly).
pub(crate) fn decode_hidden(
    model: &Model,
    kv: &mut PagedKv,
    step: &DecodeInputs<'_>,
    scratch: &mut Scratch,
    mut group: Option<&mut dyn TensorParallel>,
) -> Result<Tensor> {
    let _no_grad = tch::no_grad_guard();
    let rope = model.rope_tables_for_positions(step.positions)?; // (b, 1)
    let mut x = model.embed(step.tokens)?; // (b, 1, hidden)
    for (l, layer) in model.layers().iter().enumerate() {
        let attn = &layer.self_attn;
        let (q, k, v) = attn.qkv(&layer.input_layernorm.forward(&x)?, &rope)?; // q (b, heads, 1, d); k, v (b, kvh, 1, d)
        kv.write(l, step.slots, &k, &v, None)?;
        let (k_cache, v_cache) = kv.layer(l);
        let a = step.paged.attend(&q, k_cache, v_cache, scratch)?; // (b, 1, heads · d)
        x = match group.as_deref_mut() {
            None => layer.finish(&(&x + attn.o_proj().forward(&a)?))?,
            Some(g) => {
                let h = &x + tp::row_parallel(attn.o_proj(), &a, g)?;
                tp::finish(layer, &h, g)?
            }
        };
    }
    Ok(model.final_norm(&x)?)
}
