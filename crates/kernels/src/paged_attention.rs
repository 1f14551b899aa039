//! Decode attention over a paged KV cache (`csrc/paged_attention.cpp`):
//! colo-rollout's decode on the CPU. No gradient.

use std::ffi::{c_char, c_void};

use tch::{Device, Kind, Tensor};

use crate::{shim, Result};

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn colo_torch_paged_attention(
            q: *const c_void,
            k_cache: *const c_void,
            v_cache: *const c_void,
            slots: *const c_void,
            lens: *const c_void,
            with_lse: i32,
            out: *mut *mut c_void,
            lse: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

/// Whether [`paged_attention`] runs these: `q` and the caches all
/// float32 or all bfloat16 on the CPU, the caches contiguous. Anything
/// else is the caller's composite.
pub fn paged_attention_fits(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> bool {
    [q, k_cache, v_cache]
        .iter()
        .all(|t| t.device() == Device::Cpu && t.kind() == q.kind())
        && matches!(q.kind(), Kind::Float | Kind::BFloat16)
        && k_cache.is_contiguous()
        && v_cache.is_contiguous()
}

/// Decode attention over a paged cache, reading keys and values in place:
/// `q` (kv_heads · lanes, m, head_dim), already scaled, attends per lane
/// to the cache slots `slots[l · keys .. l · keys + lens[l]]` of
/// `k_cache` and `v_cache` (kv_heads, slots, head_dim); int64 `slots`
/// (lanes · keys,) and `lens` (lanes,). Returns the output like `q` — in
/// float32 with, when `with_lse`, each query's log-sum-exp (kv_heads ·
/// lanes, m, 1) — rounding where a gather, two batched products and a
/// float32 softmax round. No gradient. Shapes, kinds, lengths or slots
/// that do not fit are [`crate::Error::Refused`] naming them; see
/// [`paged_attention_fits`].
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &Tensor,
    lens: &Tensor,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let mut out: *mut c_void = std::ptr::null_mut();
    let mut lse: *mut c_void = std::ptr::null_mut();
    shim::call("paged_attention", |err: *mut c_char, len| {
        // SAFETY: the five tensors are live (tch's tensors are at::Tensor
        // pointers) for the call; the shim checks kinds, device, shapes,
        // every lane's length and every slot it will read before reading
        // them, writes `out` (and `lse` when asked) only on success, and at
        // most `len` bytes of message into `err`.
        unsafe {
            sys::colo_torch_paged_attention(
                q.as_ptr().cast(),
                k_cache.as_ptr().cast(),
                v_cache.as_ptr().cast(),
                slots.as_ptr().cast(),
                lens.as_ptr().cast(),
                i32::from(with_lse),
                &mut out,
                &mut lse,
                err,
                len,
            )
        }
    })?;
    // SAFETY: on success the shim stored new at::Tensors made with `new`
    // (`lse` only when asked), which these Tensors now own (tch frees them
    // with `delete`).
    Ok(unsafe {
        (
            Tensor::from_ptr(out.cast()),
            with_lse.then(|| Tensor::from_ptr(lse.cast())),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::max_rel;

    /// The composite the engine ran: gather, scores, masked float32
    /// softmax, probabilities in the storage kind, product.
    fn paged_composite(
        q: &Tensor,
        kc: &Tensor,
        vc: &Tensor,
        slots: &Tensor,
        lens: &[i64],
    ) -> (Tensor, Tensor) {
        let (kvh, _, d) = kc.size3().unwrap();
        let lanes = lens.len() as i64;
        let keys = slots.size()[0] / lanes;
        let take = |c: &Tensor| c.index_select(1, slots).view([kvh * lanes, keys, d]);
        let (k, v) = (take(kc), take(vc));
        let pad: Vec<bool> = lens
            .iter()
            .flat_map(|&n| (0..keys).map(move |j| j >= n))
            .collect();
        let pad = Tensor::from_slice(&pad).view([1, lanes, 1, keys]);
        let m = q.size()[1];
        let scores = q
            .bmm(&k.transpose(1, 2))
            .view([kvh, lanes, m, keys])
            .masked_fill(&pad, f64::NEG_INFINITY)
            .view([kvh * lanes, m, keys]);
        let f = scores.to_kind(Kind::Float);
        let probs = f.softmax(-1, Kind::Float);
        let lse = f.logsumexp([-1], true);
        (probs.to_kind(q.kind()).bmm(&v), lse)
    }

    /// Against the composite, in float32 to rounding and bfloat16 to one
    /// rounding; lanes of different lengths over scattered slots, two KV
    /// heads, three queries a lane, with and without the log-sum-exp.
    #[test]
    fn paged_attention_matches_gather_and_products() {
        tch::manual_seed(12);
        for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 1e-2)] {
            let f = (Kind::Float, Device::Cpu);
            let (kvh, lanes, m, d, keys) = (2i64, 3i64, 3i64, 40i64, 7i64);
            let kc = Tensor::randn([kvh, 50, d], f).to_kind(kind);
            let vc = Tensor::randn([kvh, 50, d], f).to_kind(kind);
            let q = (Tensor::randn([kvh * lanes, m, d], f) * 0.3).to_kind(kind);
            let lens = [7i64, 1, 4];
            let slots: Vec<i64> = (0..lanes * keys).map(|i| (i * 17 + 3) % 50).collect();
            let slots = Tensor::from_slice(&slots);
            let (want, want_lse) = paged_composite(&q, &kc, &vc, &slots, &lens);
            let lens_t = Tensor::from_slice(&lens);
            let (out, none) = paged_attention(&q, &kc, &vc, &slots, &lens_t, false).unwrap();
            assert!(none.is_none());
            assert_eq!((out.kind(), out.size()), (kind, want.size()));
            let err = max_rel(&out, &want);
            assert!(err < tol, "{kind:?} out: relative error {err}");
            let (out, lse) = paged_attention(&q, &kc, &vc, &slots, &lens_t, true).unwrap();
            assert_eq!(out.kind(), Kind::Float);
            assert!(max_rel(&out, &want) < tol);
            let lse = lse.unwrap();
            assert_eq!(lse.size(), [kvh * lanes, m, 1]);
            let err = max_rel(&lse, &want_lse);
            assert!(err < tol, "{kind:?} lse: relative error {err}");
        }
    }

    #[test]
    fn paged_attention_refuses_bad_lengths_and_slots_by_name() {
        let f = (Kind::Float, Device::Cpu);
        let kc = Tensor::zeros([2, 10, 8], f);
        let q = Tensor::zeros([4, 1, 8], f);
        let slots = Tensor::from_slice(&[0i64, 1, 2, 3]);
        let run = |slots: &Tensor, lens: &[i64]| {
            paged_attention(&q, &kc, &kc, slots, &Tensor::from_slice(lens), false)
                .unwrap_err()
                .to_string()
        };
        let e = run(&slots, &[2, 3]);
        assert_eq!(
            e,
            "paged_attention kernel: lane 1 has 3 keys, outside [1, 2]"
        );
        let e = run(&slots, &[0, 1]);
        assert!(e.contains("lane 0 has 0 keys"), "{e}");
        let e = run(&Tensor::from_slice(&[0i64, 10, 2, 3]), &[2, 2]);
        assert!(
            e.contains("slot 10 of lane 0 is outside the cache's 10 slots"),
            "{e}"
        );
        let e = run(&slots, &[1, 1, 1, 1]);
        assert!(e.contains("must be (kv_heads · lanes, queries, 8)"), "{e}");
        assert!(!paged_attention_fits(&q.to_kind(Kind::Double), &kc, &kc));
    }
}
