//! Attention over the paged cache, the libtorch way: gather each
//! sequence's keys and values from its blocks with one `index_select` per
//! buffer, padded to the batch's longest sequence, and attend with two
//! batched matrix products (`bmm`) and a softmax, under an additive mask
//! that hides the padding.
//!
//! The cache is head-major (`(kv_heads, slots, head_dim)`, see
//! [`crate::kv_cache`]), so the gathered keys are `(kv_heads · rows, keys,
//! head_dim)` with no layout copy, and grouped-query attention needs no
//! repeated K/V: the `heads / kv_heads` query heads that share a KV head are
//! the rows of one small matrix product against it. (libtorch's fused
//! `scaled_dot_product_attention` runs one matrix–vector product per row
//! and head for a single query; the batched products do the same work in a
//! few large calls, which was the difference on the CPU.)
//!
//! Rows that share leading blocks (a prompt's samples) attend to the
//! shared prefix together and to the rest alone, merged exactly through
//! log-sum-exps ([`PagedBatch`]), so a prompt's keys are read once per
//! step, not once per sample. On CUDA only where that saves enough reads to
//! pay for its extra kernels ([`CUDA_MIN_SHARED_BYTES`]).
//!
//! On the CPU, in float32 and bfloat16, a lane's attention is colo-mem's
//! paged kernel instead (`colo_kernels::paged_attention`): it
//! reads the keys and values in place through the slot table, one pass
//! over each, rounding where the products and the softmax round — no
//! gather, no mask, and none of the six calls a layer into oneDNN and
//! TensorIterator for matrices of a few rows, about a third of a small
//! model's decode step (the 3 M job's generation 109 → 90 ms a step,
//! BENCHMARKS.md, "Issue 9's 3 M-parameter job"). The shared-prefix split and its merge are
//! unchanged. CUDA keeps the gather and products (libtorch has no paged
//! kernel there, and a CUDA graph captures them).

use std::collections::HashMap;
use std::ops::Range;

use tch::{Device, Kind, Tensor};

use crate::block_table::BlockId;
use crate::kv_cache::KvLayout;
use crate::Result;

/// Runs of cached positions ("lanes": a row's positions, or a group's
/// shared prefix), gathered together: padded to the longest and masked.
struct Lanes {
    /// (lanes · keys,) slot of each key position; padding points at slot 0.
    slots: Tensor,
    lanes: i64,
    keys: i64,
    /// Additive mask (1, lanes, 1, keys) in the model's kind: 0 for real
    /// positions, the kind's most negative value for padding.
    mask: Tensor,
    /// (lanes,) Int64 on the CPU: each lane's real keys, for colo-mem's
    /// paged kernel (which reads the pages in place instead of gathering
    /// and masking); `None` where the kernel does not run (CUDA).
    lens: Option<Tensor>,
}

impl Lanes {
    fn new(
        layout: &KvLayout,
        runs: &[(&[BlockId], Range<usize>)],
        kind: Kind,
        device: Device,
    ) -> Self {
        let keys = runs.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        let mut slots = vec![0i64; runs.len() * keys];
        let mut padding = vec![false; runs.len() * keys];
        for (lane, (blocks, range)) in runs.iter().enumerate() {
            let at = lane * keys;
            for (i, pos) in range.clone().enumerate() {
                slots[at + i] = layout.slot(blocks, pos);
            }
            padding[at + range.len()..at + keys].fill(true);
        }
        let (lanes, keys) = (runs.len() as i64, keys as i64);
        let padding = Tensor::from_slice(&padding)
            .view([1, lanes, 1, keys])
            .to_device(device);
        let mask = Tensor::zeros([1, lanes, 1, keys], (kind, device))
            .masked_fill(&padding, colo_model::mask::masked_value(kind));
        let lens: Vec<i64> = runs.iter().map(|(_, r)| r.len() as i64).collect();
        Lanes {
            slots: Tensor::from_slice(&slots).to_device(device),
            lanes,
            keys,
            mask,
            lens: (device == Device::Cpu).then(|| Tensor::from_slice(&lens)),
        }
    }

    /// One layer's keys and values of every lane, gathered from the pages
    /// `k_cache`, `v_cache` (kv_heads, slots, head_dim) into `scratch`:
    /// each (kv_heads · lanes, keys, head_dim), KV-head-major.
    fn gather(
        &self,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scratch: &mut Scratch,
    ) -> Result<(Tensor, Tensor)> {
        let (kvh, _, d) = k_cache.size3()?;
        let n = self.lanes * self.keys;
        let [kb, vb] = scratch.get(2 * kvh * n * d, k_cache.kind(), k_cache.device());
        let take = |c: &Tensor, out: Tensor| -> Result<Tensor> {
            let out = out.f_view([kvh, n, d])?;
            let _ = c.f_index_select_out(&out, 1, &self.slots)?;
            Ok(out.f_view([kvh * self.lanes, self.keys, d])?)
        };
        Ok((take(k_cache, kb)?, take(v_cache, vb)?))
    }

    /// Attention of `q` (kv_heads · lanes, queries, head_dim), already
    /// scaled, over each lane's keys: the output (same shape) and, with
    /// `lse`, the log-sum-exp of each query's scores (kv_heads · lanes,
    /// queries, 1), both float32 when `lse` (for merging), else `q`'s kind.
    fn attend(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scratch: &mut Scratch,
        lse: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if let Some(lens) =
            (self.lens.as_ref()).filter(|_| colo_kernels::paged_attention_fits(q, k_cache, v_cache))
        {
            return Ok(colo_kernels::paged_attention(
                q,
                k_cache,
                v_cache,
                &self.slots,
                lens,
                lse,
            )?);
        }
        let (k, v) = self.gather(k_cache, v_cache, scratch)?;
        let (kvh, m) = (k_cache.size3()?.0, q.size3()?.1);
        let scores = q.f_bmm(&k.f_transpose(1, 2)?)?; // (kvh · lanes, m, keys)
        let _ = scores
            .f_view([kvh, self.lanes, m, self.keys])?
            .f_add_(&self.mask)?;
        if !lse {
            let probs = scores.f_softmax(-1, Kind::Float)?.f_to_kind(q.kind())?;
            return Ok((probs.f_bmm(&v)?, None));
        }
        // The log-sum-exp from the softmax's largest probability, `max −
        // log p_max`: no second pass of `exp` over the scores (libtorch's
        // `exp` takes a slow path on the masked scores' underflow).
        let scores = scores.f_to_kind(Kind::Float)?;
        let probs = scores.f_softmax(-1, Kind::Float)?;
        let lse = scores.f_amax([-1], true)? - probs.f_amax([-1], true)?.f_log()?;
        let probs = probs.f_to_kind(q.kind())?;
        Ok((probs.f_bmm(&v)?.f_to_kind(Kind::Float)?, Some(lse)))
    }
}

/// The shared prefixes of a decode step: one lane per group of rows that
/// share leading blocks (the `n` samples of a request share their prompt's
/// full blocks).
struct Prefixes {
    lanes: Lanes,
    /// Most rows in one group.
    members: i64,
    /// (groups · members,) the row of each member place; `rows` (a row of
    /// zeros) where a group has fewer members.
    rows_of_places: Tensor,
    /// (rows,) each row's member place.
    places_of_rows: Tensor,
    /// (1, rows, 1, 1): true for the rows in no group (their prefix part
    /// gets weight zero); `None` when every row is in one.
    lonely: Option<Tensor>,
}

/// Which cached positions every row of a decode step attends to, built
/// once per step and shared by every layer.
///
/// Attention is split in two, as in cascade inference: rows that share
/// leading blocks (the samples of one prompt) attend to the shared prefix
/// together — its keys and values are gathered and read once per group,
/// not once per sample — and each row attends to the rest of its sequence
/// alone; the two partial results are merged exactly through their
/// log-sum-exps. Without sharing it is one plain attention per row.
pub struct PagedBatch {
    /// Each row's positions after its group's shared prefix (all of them
    /// for a row that shares nothing); never empty (the query's own
    /// position is in its private block).
    suffix: Lanes,
    prefix: Option<Prefixes>,
}

/// On CUDA, the least bytes of keys and values a layer's shared prefixes
/// must save before a decode step attends to them apart.
///
/// The split costs about 30 more kernels a layer (the prefix's gather,
/// products and softmax, and the merge). On the CPU that is cheap and the
/// saved reads are not, so the CPU always splits. A small model's decode
/// step on a GPU is bound by kernel launches (5–10 µs each), not by memory:
/// with `colo bench rollout`'s load (32 prompts × 8 samples) the split
/// saved about 6 MiB of reads a layer, about a microsecond of HBM time,
/// while the extra launches cost over 150 µs a layer (H200, 2026-11-26,
/// BENCHMARKS.md). 256 MiB read once to gather and once to multiply is
/// about that much HBM time (3.35–4.8 TB/s): long prompts with many
/// samples (512 rows of 2 k-token prompts, say) pass it.
pub const CUDA_MIN_SHARED_BYTES: usize = 256 << 20;

impl PagedBatch {
    /// A decode step: row `i` has one query at position `lens[i] - 1` and
    /// sees its `lens[i]` cached positions (the query's own included).
    /// Rows sharing a prefix attend to it together on the CPU always, on
    /// CUDA when that saves [`CUDA_MIN_SHARED_BYTES`] a layer.
    pub fn decode(
        layout: &KvLayout,
        tables: &[&[BlockId]],
        lens: &[usize],
        kind: Kind,
        device: Device,
    ) -> Self {
        let min_shared = match device {
            Device::Cpu => 0,
            _ => CUDA_MIN_SHARED_BYTES,
        };
        Self::decode_sharing(layout, tables, lens, kind, device, min_shared)
    }

    /// [`Self::decode`], splitting off shared prefixes only when they save
    /// at least `min_shared` bytes of one layer's keys and values.
    fn decode_sharing(
        layout: &KvLayout,
        tables: &[&[BlockId]],
        lens: &[usize],
        kind: Kind,
        device: Device,
        min_shared: usize,
    ) -> Self {
        // Rows whose first block is the same share a prefix: the blocks all
        // of them have in common. A block being written is never shared
        // (it was copied on write), so every row keeps at least its own
        // position for the suffix; `min_len - 1` makes sure of it.
        let mut by_first: HashMap<BlockId, usize> = HashMap::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (row, blocks) in tables.iter().enumerate() {
            match blocks.first().and_then(|b| by_first.get(b)) {
                Some(&g) => groups[g].push(row),
                None => {
                    if let Some(&b) = blocks.first() {
                        by_first.insert(b, groups.len());
                    }
                    groups.push(vec![row]);
                }
            }
        }
        let mut shared = vec![0usize; tables.len()];
        let mut prefix_runs = Vec::new();
        let mut prefix_groups = Vec::new();
        for members in groups.iter().filter(|m| m.len() > 1) {
            let first = tables[members[0]];
            let common = members[1..].iter().fold(first.len(), |n, &r| {
                n.min(
                    first
                        .iter()
                        .zip(tables[r])
                        .take_while(|(a, b)| a == b)
                        .count(),
                )
            });
            let min_len = members.iter().map(|&r| lens[r]).min().unwrap_or(0);
            let len = (common * layout.block_size).min(min_len.saturating_sub(1));
            if len == 0 {
                continue;
            }
            for &r in members {
                shared[r] = len;
            }
            prefix_runs.push((first, 0..len));
            prefix_groups.push(members);
        }
        // Keys and values of one layer read once per group instead of once
        // per member.
        let per_position = 2 * layout.kv_heads * layout.head_dim * layout.elem_bytes;
        let saved: usize = prefix_groups
            .iter()
            .zip(&prefix_runs)
            .map(|(m, (_, r))| (m.len() - 1) * r.len() * per_position)
            .sum();
        if saved < min_shared {
            prefix_runs.clear();
            prefix_groups.clear();
            shared.fill(0);
        }
        let suffix_runs: Vec<(&[BlockId], Range<usize>)> = tables
            .iter()
            .zip(lens)
            .zip(&shared)
            .map(|((blocks, &len), &from)| (*blocks, from..len))
            .collect();
        let suffix = Lanes::new(layout, &suffix_runs, kind, device);
        let rows = tables.len() as i64;
        let prefix = (!prefix_runs.is_empty()).then(|| {
            let members = prefix_groups.iter().map(|m| m.len()).max().unwrap_or(0);
            let mut rows_of_places = vec![rows; prefix_groups.len() * members];
            // Rows outside every group read a place whose result is
            // weighted zero: their prefix is empty.
            let mut places_of_rows = vec![0i64; tables.len()];
            for (g, group) in prefix_groups.iter().enumerate() {
                for (i, &r) in group.iter().enumerate() {
                    rows_of_places[g * members + i] = r as i64;
                    places_of_rows[r] = (g * members + i) as i64;
                }
            }
            let lonely: Vec<bool> = shared.iter().map(|&s| s == 0).collect();
            Prefixes {
                lanes: Lanes::new(layout, &prefix_runs, kind, device),
                members: members as i64,
                rows_of_places: Tensor::from_slice(&rows_of_places).to_device(device),
                places_of_rows: Tensor::from_slice(&places_of_rows).to_device(device),
                lonely: lonely.contains(&true).then(|| {
                    Tensor::from_slice(&lonely)
                        .view([1, rows, 1, 1])
                        .to_device(device)
                }),
            }
        });
        PagedBatch { suffix, prefix }
    }

    /// A decode step whose gather indices and padding mask are already on
    /// the device (a CUDA graph's fixed inputs, see `crate::graphs`): row
    /// `i` attends to the slots `slots[i · keys..(i + 1) · keys]` (rows ·
    /// keys,) under the additive `mask` (1, rows, 1, keys) in the model's
    /// kind. No shared prefixes.
    pub(crate) fn from_device(slots: Tensor, mask: Tensor, rows: i64, keys: i64) -> Self {
        PagedBatch {
            suffix: Lanes {
                slots,
                lanes: rows,
                keys,
                mask,
                lens: None,
            },
            prefix: None,
        }
    }

    /// Attention of one query per row, `q` (rows, heads, 1, head_dim), over
    /// the rows' cached keys and values; returns (rows, 1, heads ·
    /// head_dim), the input of the output projection.
    pub fn attend(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        scratch: &mut Scratch,
    ) -> Result<Tensor> {
        let (b, heads, _, d) = q.size4()?;
        let kvh = k_cache.size3()?.0;
        let g = heads / kvh;
        // Query head h reads KV head h / g.
        let q = q.f_view([b, kvh, g, d])? * (1.0 / (d as f64).sqrt()); // (b, kvh, g, d)
        let qs = q.f_transpose(0, 1)?.f_reshape([kvh * b, g, d])?;
        let merged = match &self.prefix {
            None => self.suffix.attend(&qs, k_cache, v_cache, scratch, false)?.0,
            Some(p) => {
                let (os, ls) = self.suffix.attend(&qs, k_cache, v_cache, scratch, true)?;
                let ls = ls.expect("asked for");
                // Queries by group: (kvh · groups, members · g, d).
                let places = p.rows_of_places.size()[0];
                let q_ext = Tensor::f_cat(&[&q, &q.f_zeros_like()?.f_narrow(0, 0, 1)?], 0)?;
                let qp = q_ext
                    .f_index_select(0, &p.rows_of_places)?
                    .f_transpose(0, 1)?
                    .f_reshape([kvh * p.lanes.lanes, p.members * g, d])?;
                let (op, lp) = p.lanes.attend(&qp, k_cache, v_cache, scratch, true)?;
                // Back to rows: (kvh · rows, g, ·).
                let to_rows = |t: &Tensor, last: i64| -> Result<Tensor> {
                    Ok(t.f_view([kvh, places, g, last])?
                        .f_index_select(1, &p.places_of_rows)?
                        .f_reshape([kvh * b, g, last])?)
                };
                let (op, lp) = (to_rows(&op, d)?, to_rows(&lp.expect("asked for"), 1)?);
                if let Some(lonely) = &p.lonely {
                    let _ = lp
                        .f_view([kvh, b, g, 1])?
                        .f_masked_fill_(lonely, f64::NEG_INFINITY)?;
                }
                let l = lp.f_logaddexp(&ls)?;
                (op * (lp - &l).f_exp()? + os * (ls - l).f_exp()?).f_to_kind(q.kind())?
            }
        };
        Ok(merged
            .f_view([kvh, b, g, d])?
            .f_transpose(0, 1)?
            .f_reshape([b, 1, heads * d])?)
    }
}

/// Reusable memory for the gathered keys and values, kept between decode
/// steps (grown when a step needs more, dropped with [`Scratch::clear`]).
///
/// A fresh gather buffer every layer and step is a large allocation that
/// the C allocator maps and unmaps each time: the page faults cost more
/// than the attention itself on the CPU. Outside the pool (it holds
/// nothing between steps); the engine clears it when it releases the KV
/// cache.
#[derive(Default)]
pub struct Scratch {
    buf: Option<Tensor>,
}

impl Scratch {
    /// Two buffers of `elems / 2` elements each, views of one allocation
    /// of `kind` on `device` of at least `elems` elements.
    fn get(&mut self, elems: i64, kind: Kind, device: Device) -> [Tensor; 2] {
        let fits =
            |t: &Tensor| t.kind() == kind && t.device() == device && t.numel() as i64 >= elems;
        if !self.buf.as_ref().is_some_and(fits) {
            // Some headroom, so that a batch growing by a key or a row does
            // not reallocate every step.
            self.buf = Some(Tensor::empty([elems + elems / 4], (kind, device)));
        }
        let buf = self.buf.as_ref().expect("allocated above");
        let half = elems / 2;
        [buf.narrow(0, 0, half), buf.narrow(0, half, half)]
    }

    /// Frees the memory.
    pub fn clear(&mut self) {
        self.buf = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gathered attention equals attention over a contiguous copy, with
    /// block tables out of order, partial last blocks, rows of different
    /// lengths padded and masked, two rows sharing a prefix (attended
    /// together and merged), a row sharing nothing, and two query heads per
    /// KV head.
    #[test]
    fn gathered_attention_matches_dense_attention() {
        let layout = KvLayout {
            num_layers: 1,
            num_blocks: 5,
            block_size: 3,
            kv_heads: 2,
            head_dim: 4,
            elem_bytes: 4,
        };
        let (heads, kvh, d) = (4i64, 2i64, 4i64);
        let slots = layout.slots() as i64;
        let opts = (Kind::Float, Device::Cpu);
        let k = Tensor::arange(kvh * slots * d, opts)
            .view([kvh, slots, d])
            .sin();
        let v = Tensor::arange(kvh * slots * d, opts)
            .view([kvh, slots, d])
            .cos();
        // Rows 0 and 1 share blocks 2 and 0 (one group: a prefix of 6
        // positions); row 2 shares nothing. Then rows 0 and 2 alone: no
        // sharing, plain attention per row.
        let tables: [&[BlockId]; 3] = [&[2, 0, 3], &[2, 0, 1], &[4]];
        let lens = [8, 7, 2];
        let q = Tensor::arange(3 * heads * d, opts)
            .view([3, heads, 1, d])
            .cos();
        // The shared prefix of rows 0 and 1 saves 6 positions × 2 heads ×
        // 4 dims × 4 bytes × 2 (keys and values) = 384 bytes: attended apart
        // with a threshold up to that, with the rest above it.
        let cases = [
            (vec![0, 1, 2], 0, true),
            (vec![0, 1, 2], 384, true),
            (vec![0, 1, 2], 385, false),
            (vec![0, 2], 0, false),
        ];
        for (rows, min_shared, shares) in cases {
            let t: Vec<&[BlockId]> = rows.iter().map(|&r| tables[r]).collect();
            let l: Vec<usize> = rows.iter().map(|&r| lens[r]).collect();
            let (kind, dev) = (Kind::Float, Device::Cpu);
            let batch = PagedBatch::decode_sharing(&layout, &t, &l, kind, dev, min_shared);
            assert_eq!(batch.prefix.is_some(), shares);
            let idx = Tensor::from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>());
            let out = batch
                .attend(&q.index_select(0, &idx), &k, &v, &mut Scratch::default())
                .unwrap(); // (rows, 1, heads · d)
            for (i, &r) in rows.iter().enumerate() {
                let idx: Vec<i64> = (0..lens[r]).map(|p| layout.slot(tables[r], p)).collect();
                let idx = Tensor::from_slice(&idx);
                // (kvh, len, d) → (heads, len, d): each KV head repeated
                // for its group of query heads.
                let dense = |c: &Tensor| {
                    c.index_select(1, &idx)
                        .repeat_interleave_self_int(heads / kvh, 0, None)
                };
                let qr = q.get(r as i64); // (heads, 1, d)
                let scores = qr.matmul(&dense(&k).transpose(-1, -2)) / (d as f64).sqrt();
                let expected = scores
                    .softmax(-1, Kind::Float)
                    .matmul(&dense(&v))
                    .reshape([1, heads * d]);
                let diff = (out.get(i as i64) - expected).abs().max().double_value(&[]);
                assert!(diff < 1e-6, "rows {rows:?}, row {r}: {diff}");
            }
        }
    }
}
