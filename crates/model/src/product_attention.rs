//! Attention as two batched matrix products around a softmax, the way
//! transformers' eager attention computes it in bfloat16:
//! `softmax(q kᵀ · scale + mask)` (in float32, rounded to bfloat16), `· v`.
//!
//! On a CPU in bfloat16 this is faster than libtorch's flash kernel, whose
//! inner products do not reach the AMX units: at one training lane's shapes
//! (2 rows × 256 tokens, 6 heads of 64 over 2 KV heads) forward and
//! backward take 4.7 ms a layer against flash attention's 7.3
//! (`bench/cpu/bf16_step_parts.py`, one thread). In float32 it is slower
//! (7.1 against 6.3 ms), and on CUDA flash attention wins, so
//! [`Attention`](crate::model::Attention) takes this path only for bfloat16
//! on the CPU, and only while the scores it keeps for the backward stay
//! small ([`fits`]): flash attention keeps O(seq) per query, this keeps the
//! whole (heads, q_len, k_len) table.
//!
//! Grouped-query attention reads each key/value head once: the queries of
//! a group are stacked along the query axis, so K and V are never repeated.

use tch::{Device, Kind, Tensor};

use crate::Result;

/// The most scores (rows · heads · q_len · k_len) a call may form: 4 Mi,
/// ~24 MiB kept for the backward (the float32 softmax and its bfloat16
/// cast). A training lane of 2 × 256 tokens and 6 heads forms 0.75 Mi.
pub(crate) const MAX_SCORES: i64 = 1 << 22;

/// Whether `q` (batch, heads, q_len, head_dim) against `k_len` keys takes
/// this path: bfloat16 on the CPU, within [`MAX_SCORES`].
pub(crate) fn fits(q: &Tensor, k_len: i64) -> bool {
    let size = q.size();
    q.kind() == Kind::BFloat16
        && q.device() == Device::Cpu
        && size.len() == 4
        && size[0]
            .checked_mul(size[1])
            .and_then(|n| n.checked_mul(size[2]))
            .and_then(|n| n.checked_mul(k_len))
            .is_some_and(|n| n <= MAX_SCORES)
}

/// `q` (b, h, s, d) over `k`, `v` (b, kvh, t, d), h a multiple of kvh, →
/// (b, h, s, d). `mask`: additive, broadcastable to (b, 1, s, t), in any
/// float kind; `causal`: query `i` sees keys `0..=t − s + i`. The caller
/// has checked the shapes.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
) -> Result<Tensor> {
    let (b, h, s, d) = q.size4()?;
    let (_, kvh, t, _) = k.size4()?;
    let group = h / kvh;
    // q · scale, heads-major, so that the queries of each KV head's group
    // are one (group · s) block: K and V are read once per KV head. Scaling
    // q rather than the scores is a quarter of the work at 256 keys.
    let scores = q
        .f_mul_scalar((d as f64).powf(-0.5))?
        .f_reshape([b, kvh, group * s, d])?
        .f_matmul(&k.f_transpose(-1, -2)?)?
        .f_view([b, h, s, t])?;
    // Masked and normalised in the inputs' kind: adding 0 or the mask
    // value rounds nothing, and libtorch's softmax (and its backward) on
    // bfloat16 computes in float32 and rounds only its result, as
    // transformers' `softmax(…, dtype=float32).to(bfloat16)` does, without
    // a float32 copy of the scores each way.
    let scores = match (mask, causal) {
        (Some(m), _) => scores.f_add(m)?,
        (None, true) => {
            let hide = Tensor::f_full([s, t], f64::NEG_INFINITY, (q.kind(), q.device()))?
                .f_triu(t - s + 1)?;
            scores.f_add(&hide)?
        }
        (None, false) => scores,
    };
    let probs = scores
        .f_softmax(-1, q.kind())?
        .f_view([b, kvh, group * s, t])?;
    Ok(probs.f_matmul(v)?.f_view([b, h, s, d])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, causal: bool) -> Tensor {
        let gqa = q.size()[1] != k.size()[1];
        Tensor::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, None, gqa)
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
        let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
        let scale = b.abs().max().double_value(&[]).max(1e-6);
        (a - b).abs().max().double_value(&[]) / scale
    }

    /// Float64 through both paths: the products and libtorch's kernel are
    /// the same function (causal, additive mask with a padded key, none).
    #[test]
    fn equals_libtorchs_attention_in_float64() {
        tch::manual_seed(3);
        let opts = (Kind::Double, Device::Cpu);
        let (q, k, v) = (
            Tensor::randn([2, 6, 5, 8], opts),
            Tensor::randn([2, 2, 7, 8], opts),
            Tensor::randn([2, 2, 7, 8], opts),
        );
        let causal_q = q.narrow(2, 0, 5);
        let (kc, vc) = (k.narrow(2, 0, 5), v.narrow(2, 0, 5));
        let got = attention(&causal_q, &kc, &vc, None, true).unwrap();
        assert!(max_rel(&got, &sdpa(&causal_q, &kc, &vc, None, true)) < 1e-12);

        let key_mask = Tensor::from_slice2(&[[1i64, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]]);
        let mask = crate::mask::causal_padded(&key_mask, 5, Kind::Double)
            .unwrap()
            .unsqueeze(1);
        let got = attention(&q, &k, &v, Some(&mask), false).unwrap();
        let err = max_rel(&got, &sdpa(&q, &k, &v, Some(&mask), false));
        assert!(err < 1e-12, "{err}");

        let got = attention(&q, &k, &v, None, false).unwrap();
        assert!(max_rel(&got, &sdpa(&q, &k, &v, None, false)) < 1e-12);
    }

    /// In bfloat16, forward and gradients stay within bfloat16's rounding
    /// of the float64 result.
    #[test]
    fn bfloat16_forward_and_gradients_follow_float64() {
        tch::manual_seed(4);
        let make = |shape: &[i64]| Tensor::randn(shape, (Kind::Double, Device::Cpu));
        let (q, k, v) = (
            make(&[2, 6, 16, 64]),
            make(&[2, 2, 16, 64]),
            make(&[2, 2, 16, 64]),
        );
        let grads = |kind: Kind| {
            let leaf = |t: &Tensor| t.detach().to_kind(kind).set_requires_grad(true);
            let (q, k, v) = (leaf(&q), leaf(&k), leaf(&v));
            let out = attention(&q, &k, &v, None, true).unwrap();
            (out.to_kind(Kind::Double)
                * out
                    .ones_like()
                    .to_kind(Kind::Double)
                    .cumsum(-1, Kind::Double))
            .sum(Kind::Double)
            .backward();
            [out, q.grad(), k.grad(), v.grad()]
        };
        let (want, got) = (grads(Kind::Double), grads(Kind::BFloat16));
        for (name, (g, w)) in ["out", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
            let err = max_rel(g, w);
            assert!(err < 2e-2, "{name}: relative error {err}");
        }
    }

    #[test]
    fn takes_bfloat16_on_the_cpu_within_the_limit_only() {
        let q = |kind, s| Tensor::zeros([2, 6, s, 64], (kind, Device::Cpu));
        assert!(fits(&q(Kind::BFloat16, 256), 256));
        assert!(!fits(&q(Kind::Float, 256), 256));
        assert!(!fits(&q(Kind::BFloat16, 1024), 1024));
        assert!(!fits(&q(Kind::BFloat16, 1), i64::MAX));
    }
}
