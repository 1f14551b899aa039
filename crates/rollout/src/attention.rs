//! Decode-step attention over paged keys and values, in plain Rust over f32
//! slices: each query reads its sequence's blocks where they lie, with no
//! gather into a contiguous tensor and no padding to the longest sequence.
//!
//! Sequences run in parallel (rayon); within one, each query head walks the
//! blocks of its KV head (grouped-query attention: query head `h` uses KV
//! head `h / (heads / kv_heads)`, as colo-model stacks them).

use rayon::prelude::*;

use crate::block_table::BlockId;
use crate::kv_cache::KvLayout;

/// One sequence of a decode step: its block table and how many positions
/// (including the one just written) it attends to.
#[derive(Debug, Clone, Copy)]
pub struct PagedRow<'a> {
    pub blocks: &'a [BlockId],
    pub len: usize,
}

/// `out[b, h] = softmax(q[b, h] · K_bᵀ / √d) V_b` for every sequence `b` and
/// query head `h`. `q` and `out` are `(batch, heads, head_dim)`.
pub fn paged_decode(
    layout: &KvLayout,
    k: &[f32],
    v: &[f32],
    heads: usize,
    q: &[f32],
    rows: &[PagedRow<'_>],
    out: &mut [f32],
) {
    let d = layout.head_dim;
    let group = heads / layout.kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let stride = heads * d;
    out.par_chunks_mut(stride)
        .zip(q.par_chunks(stride))
        .zip(rows.par_iter())
        .for_each_init(Vec::<f32>::new, |scores, ((out, q), row)| {
            scores.clear();
            scores.resize(row.len, 0.0);
            for h in 0..heads {
                let kvh = h / group;
                let qh = &q[h * d..(h + 1) * d];
                let oh = &mut out[h * d..(h + 1) * d];
                attend_one(layout, k, v, kvh, qh, row, scale, scores, oh);
            }
        });
}

#[allow(clippy::too_many_arguments)]
#[inline]
fn attend_one(
    layout: &KvLayout,
    k: &[f32],
    v: &[f32],
    kvh: usize,
    q: &[f32],
    row: &PagedRow<'_>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (bs, d) = (layout.block_size, layout.head_dim);
    let mut max = f32::NEG_INFINITY;
    for (bi, &blk) in row.blocks.iter().enumerate() {
        let start = bi * bs;
        if start >= row.len {
            break;
        }
        let n = bs.min(row.len - start);
        let base = layout.offset(blk, kvh, 0);
        let keys = &k[base..base + n * d];
        for (j, key) in keys.chunks_exact(d).enumerate() {
            let s = dot(q, key) * scale;
            scores[start + j] = s;
            max = max.max(s);
        }
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (bi, &blk) in row.blocks.iter().enumerate() {
        let start = bi * bs;
        if start >= row.len {
            break;
        }
        let n = bs.min(row.len - start);
        let base = layout.offset(blk, kvh, 0);
        let vals = &v[base..base + n * d];
        for (j, val) in vals.chunks_exact(d).enumerate() {
            let p = scores[start + j] * inv;
            for (o, &x) in out.iter_mut().zip(val) {
                *o += p * x;
            }
        }
    }
}

/// Dot product with four accumulators, which the compiler vectorises.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a direct computation over a contiguous copy, with a block
    /// table out of order and a partial last block.
    #[test]
    fn matches_dense_attention() {
        let layout = KvLayout {
            num_layers: 1,
            num_blocks: 4,
            block_size: 3,
            kv_heads: 2,
            head_dim: 4,
        };
        let n = layout.num_blocks * layout.block_elems();
        let k: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1).collect();
        let v: Vec<f32> = (0..n).map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.1).collect();
        let heads = 4;
        let q: Vec<f32> = (0..heads * 4).map(|i| (i as f32 - 7.0) * 0.05).collect();
        let blocks = [2, 0, 3];
        let len = 8;
        let mut out = vec![0.0; heads * 4];
        paged_decode(
            &layout,
            &k,
            &v,
            heads,
            &q,
            &[PagedRow {
                blocks: &blocks,
                len,
            }],
            &mut out,
        );
        for h in 0..heads {
            let kvh = h / 2;
            let at = |t: usize| layout.offset(blocks[t / 3], kvh, t % 3);
            let s: Vec<f32> = (0..len)
                .map(|t| (0..4).map(|i| q[h * 4 + i] * k[at(t) + i]).sum::<f32>() / 2.0)
                .collect();
            let m = s.iter().copied().fold(f32::MIN, f32::max);
            let z: f32 = s.iter().map(|x| (x - m).exp()).sum();
            for i in 0..4 {
                let e: f32 = (0..len).map(|t| (s[t] - m).exp() / z * v[at(t) + i]).sum();
                assert!((out[h * 4 + i] - e).abs() < 1e-6, "head {h} dim {i}");
            }
        }
    }
}
