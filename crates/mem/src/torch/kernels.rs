//! Fused CPU kernels for colo's model that libtorch has only as composites
//! of element-wise ops (`csrc/rms_norm.cpp`, `csrc/token_logprobs.cpp`,
//! `csrc/rope.cpp`), and the rollout engine's decode attention over its
//! paged cache (`csrc/paged_attention.cpp`, no gradient):
//! each is one autograd function with a hand-written backward, returning
//! ordinary tensors.

use std::ffi::c_char;

use tch::{Device, Kind, Tensor};

use super::shim_call;
use crate::Result;

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        pub fn colo_torch_rms_norm(
            x: *const c_void,
            w: *const c_void,
            eps: f64,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
        pub fn colo_torch_token_logprobs(
            logits: *const c_void,
            targets: *const c_void,
            lp: *mut *mut c_void,
            entropy: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
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
        pub fn colo_torch_rope(
            x: *const c_void,
            cos: *const c_void,
            sin: *const c_void,
            heads_major: i32,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

/// Whether [`rms_norm`] runs `x` and `w`: both float32 or both bfloat16, on
/// the CPU. Anything else is libtorch's `rms_norm`'s (the caller's choice).
pub fn rms_norm_fits(x: &Tensor, w: &Tensor) -> bool {
    x.device() == Device::Cpu
        && w.device() == Device::Cpu
        && x.kind() == w.kind()
        && matches!(x.kind(), Kind::Float | Kind::BFloat16)
}

/// `x · rsqrt(mean(x², −1) + eps)` in float32, rounded to x's kind, times
/// `w`: libtorch's `rms_norm(x, [h], w, eps)` (transformers' RMSNorm), with
/// its backward, in one pass over the rows each way. `x` is (..., h), `w`
/// is (h); see [`rms_norm_fits`]. A mismatch is an error naming the shapes
/// or kinds.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    shim_call("libtorch", "rms_norm", |err: *mut c_char, len| {
        // SAFETY: `x` and `w` are live tensors (tch's tensors are
        // at::Tensor pointers) for the call; the shim checks kinds, device
        // and shapes before reading them, writes `out` only on success, and
        // writes at most `len` bytes of message into `err`.
        unsafe {
            sys::colo_torch_rms_norm(
                x.as_ptr().cast(),
                w.as_ptr().cast(),
                eps,
                &mut out,
                err,
                len,
            )
        }
    })?;
    // SAFETY: on success the shim stored a new at::Tensor made with `new`,
    // which this Tensor now owns and tch frees with `delete` (`at_free`).
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// Whether [`rope`] runs `x` with these tables: all float32 or all
/// bfloat16, on the CPU. Anything else is the caller's composite.
pub fn rope_fits(x: &Tensor, cos: &Tensor, sin: &Tensor) -> bool {
    [x, cos, sin]
        .iter()
        .all(|t| t.device() == Device::Cpu && t.kind() == x.kind())
        && matches!(x.kind(), Kind::Float | Kind::BFloat16)
}

/// Rotary position embedding of `x` (batch, seq, heads, head_dim):
/// `x · cos + swap_halves(x) · sin` per head, with rotate_half's sign in
/// `sin` (colo-model's tables, each (batch or 1, seq, head_dim)), returned
/// as (batch, heads, seq, head_dim) — contiguous in that order when
/// `heads_major`, else the transposed view of a contiguous (batch, seq,
/// heads, head_dim). One pass each way, rounding where libtorch's
/// concatenation, products and sum round; `x` may be a strided view (a
/// fused projection's heads). See [`rope_fits`]; shapes that do not fit
/// are an error naming them.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, heads_major: bool) -> Result<Tensor> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    shim_call("libtorch", "rope", |err: *mut c_char, len| {
        // SAFETY: the three tensors are live (tch's tensors are at::Tensor
        // pointers) for the call; the shim checks kinds, device and shapes
        // before reading them, writes `out` only on success, and writes at
        // most `len` bytes of message into `err`.
        unsafe {
            sys::colo_torch_rope(
                x.as_ptr().cast(),
                cos.as_ptr().cast(),
                sin.as_ptr().cast(),
                i32::from(heads_major),
                &mut out,
                err,
                len,
            )
        }
    })?;
    // SAFETY: on success the shim stored a new at::Tensor made with `new`,
    // which this Tensor now owns and tch frees with `delete` (`at_free`).
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
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
/// that do not fit are an error naming them; see [`paged_attention_fits`].
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &Tensor,
    lens: &Tensor,
    with_lse: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut lse: *mut std::ffi::c_void = std::ptr::null_mut();
    shim_call("libtorch", "paged_attention", |err: *mut c_char, len| {
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

/// Whether [`token_logprobs`] runs `logits`: float32 or bfloat16 on the
/// CPU. Anything else is the caller's composite.
pub fn token_logprobs_fits(logits: &Tensor) -> bool {
    logits.device() == Device::Cpu && matches!(logits.kind(), Kind::Float | Kind::BFloat16)
}

/// From `logits` (..., vocab) and integer `targets` (...): the float32
/// log-probability of each target, `log_softmax(logits)[target]`, and the
/// entropy of each distribution, `−Σ p log p`, both shaped like
/// `targets` and differentiable in `logits` (a gradient in the logits'
/// kind). What a PyTorch trainer computes as `log_softmax` in float32, a
/// gather and an entropy, without the float32 (…, vocab) tensors: only the
/// logits and two floats a row are kept for the backward. A target
/// outside the vocabulary, or logits that do not hold one row per target,
/// are an error naming them; see [`token_logprobs_fits`].
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let mut lp: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut entropy: *mut std::ffi::c_void = std::ptr::null_mut();
    shim_call("libtorch", "token_logprobs", |err: *mut c_char, len| {
        // SAFETY: both tensors are live for the call (tch's tensors are
        // at::Tensor pointers); the shim checks kinds, device, shapes and
        // the targets' range before reading them, writes `lp` and
        // `entropy` only on success, and at most `len` bytes into `err`.
        unsafe {
            sys::colo_torch_token_logprobs(
                logits.as_ptr().cast(),
                targets.as_ptr().cast(),
                &mut lp,
                &mut entropy,
                err,
                len,
            )
        }
    })?;
    // SAFETY: on success the shim stored two new at::Tensors made with
    // `new`, which these Tensors now own (tch frees them with `delete`).
    Ok(unsafe {
        (
            Tensor::from_ptr(lp.cast()),
            Tensor::from_ptr(entropy.cast()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtorch's composite, the reference.
    fn reference(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
        x.rms_norm([w.size()[0]], Some(w), eps)
    }

    fn leaf(t: &Tensor) -> Tensor {
        t.detach().copy().set_requires_grad(true)
    }

    fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
        let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
        let scale = b.abs().max().double_value(&[]).max(1e-30);
        (a - b).abs().max().double_value(&[]) / scale
    }

    /// Forward and both gradients against libtorch's `rms_norm` in
    /// float32 (to rounding) and bfloat16 (to bfloat16's rounding), over
    /// more rows than one block of the weight gradient's sums, with an h
    /// that is not a multiple of any vector width.
    #[test]
    fn matches_libtorchs_rms_norm_forward_and_backward() {
        tch::manual_seed(7);
        for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 1e-2)] {
            let x0 = (Tensor::randn([3, 70, 37], (Kind::Float, Device::Cpu)) * 3.0).to_kind(kind);
            let w0 = (Tensor::randn([37], (Kind::Float, Device::Cpu)) + 1.0).to_kind(kind);
            let g = Tensor::randn([3, 70, 37], (Kind::Float, Device::Cpu)).to_kind(kind);
            let run = |f: &dyn Fn(&Tensor, &Tensor) -> Tensor| {
                let (x, w) = (leaf(&x0), leaf(&w0));
                let y = f(&x, &w);
                // dy = g exactly: the float32 product's gradient, cast back.
                (y.to_kind(Kind::Float) * g.to_kind(Kind::Float))
                    .sum(Kind::Float)
                    .backward();
                (y, x.grad(), w.grad())
            };
            let (y, dx, dw) = run(&|x, w| rms_norm(x, w, 1e-6).unwrap());
            let (ry, rdx, rdw) = run(&|x, w| reference(x, w, 1e-6));
            assert_eq!((y.kind(), dx.kind(), dw.kind()), (kind, kind, kind));
            for (name, a, b) in [("y", &y, &ry), ("dx", &dx, &rdx), ("dw", &dw, &rdw)] {
                let err = max_rel(a, b);
                assert!(err < tol, "{kind:?} {name}: relative error {err}");
            }
        }
    }

    /// The weight gradient is summed over fixed blocks of rows: the same
    /// bits at any intra-op thread count.
    #[test]
    fn gradients_do_not_depend_on_the_thread_count() {
        tch::manual_seed(8);
        let x0 = Tensor::randn([300, 64], (Kind::Float, Device::Cpu));
        let w0 = Tensor::randn([64], (Kind::Float, Device::Cpu));
        let grads = |threads| {
            tch::set_num_threads(threads);
            let (x, w) = (leaf(&x0), leaf(&w0));
            rms_norm(&x, &w, 1e-5).unwrap().sum(Kind::Float).backward();
            (x.grad(), w.grad())
        };
        let (a, b) = (grads(1), grads(2));
        assert!(a.0.equal(&b.0) && a.1.equal(&b.1));
    }

    #[test]
    fn refuses_mismatched_inputs_with_the_shapes() {
        let x = Tensor::zeros([2, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::ones([7], (Kind::Float, Device::Cpu));
        let e = rms_norm(&x, &w, 1e-6).unwrap_err().to_string();
        assert!(e.contains("does not end in w's size"), "{e}");
        let e = rms_norm(&x, &w.to_kind(Kind::BFloat16), 1e-6)
            .unwrap_err()
            .to_string();
        assert!(e.contains("both float32 or both bfloat16"), "{e}");
        assert!(!rms_norm_fits(
            &x.to_kind(Kind::Double),
            &w.to_kind(Kind::Double)
        ));
    }

    /// Without gradients it is a plain forward (no graph, no saved inputs).
    #[test]
    fn runs_without_gradients() {
        let x = Tensor::randn([4, 16], (Kind::Float, Device::Cpu));
        let w = Tensor::ones([16], (Kind::Float, Device::Cpu));
        let y = tch::no_grad(|| rms_norm(&x, &w, 1e-6)).unwrap();
        assert!(!y.requires_grad());
        assert!(max_rel(&y, &reference(&x, &w, 1e-6)) < 1e-6);
    }

    /// libtorch's composition, as colo-train ran it: float32 log-softmax,
    /// gather, `−Σ exp(lsm) · lsm`.
    fn composite(logits: &Tensor, targets: &Tensor) -> (Tensor, Tensor) {
        let lsm = logits.log_softmax(-1, Kind::Float);
        let lp = lsm
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1);
        let h = -(lsm.exp() * &lsm).sum_dim_intlist(-1, false, Kind::Float);
        (lp, h)
    }

    /// Values and both gradients (through the log-probabilities and the
    /// entropy at once) against the composite, in float32 to rounding and
    /// in bfloat16 to bfloat16's, with a vocabulary that is not a multiple
    /// of any vector width and logits spread over ±30.
    #[test]
    fn token_logprobs_match_the_composite_in_value_and_gradient() {
        tch::manual_seed(9);
        for (kind, tol) in [(Kind::Float, 2e-5), (Kind::BFloat16, 1e-2)] {
            let x0 = (Tensor::randn([3, 5, 1001], (Kind::Float, Device::Cpu)) * 10.0).to_kind(kind);
            let tg = Tensor::randint(1001, [3, 5], (Kind::Int64, Device::Cpu));
            let (a, b) = (
                Tensor::randn([3, 5], (Kind::Float, Device::Cpu)),
                Tensor::randn([3, 5], (Kind::Float, Device::Cpu)),
            );
            let run = |f: &dyn Fn(&Tensor) -> (Tensor, Tensor)| {
                let x = leaf(&x0);
                let (lp, h) = f(&x);
                (&lp * &a + &h * &b).sum(Kind::Float).backward();
                (lp, h, x.grad())
            };
            let (lp, h, dx) = run(&|x| token_logprobs(x, &tg).unwrap());
            let (rlp, rh, rdx) = run(&|x| composite(x, &tg));
            assert_eq!(
                (lp.kind(), h.kind(), dx.kind()),
                (Kind::Float, Kind::Float, kind)
            );
            assert_eq!(lp.size(), [3, 5]);
            for (name, x, y) in [("lp", &lp, &rlp), ("entropy", &h, &rh), ("dx", &dx, &rdx)] {
                let err = max_rel(x, y);
                assert!(err < tol, "{kind:?} {name}: relative error {err}");
            }
        }
    }

    /// Only the log-probabilities in the loss (the entropy unused, its
    /// gradient undefined): the gradient is softmax's, to rounding.
    #[test]
    fn token_logprobs_alone_differentiate() {
        let x0 = Tensor::randn([4, 64], (Kind::Float, Device::Cpu));
        let tg = Tensor::from_slice(&[0i64, 63, 7, 7]);
        let x = leaf(&x0);
        token_logprobs(&x, &tg)
            .unwrap()
            .0
            .sum(Kind::Float)
            .backward();
        let want = tg.one_hot(64).to_kind(Kind::Float) - x0.softmax(-1, Kind::Float);
        assert!(max_rel(&x.grad(), &want) < 1e-5);
    }

    #[test]
    fn token_logprobs_refuse_bad_targets_and_shapes_by_name() {
        let x = Tensor::zeros([2, 8], (Kind::Float, Device::Cpu));
        let e = token_logprobs(&x, &Tensor::from_slice(&[0i64, 8]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("targets in [0, 8], outside the vocabulary of 8"),
            "{e}"
        );
        let e = token_logprobs(&x, &Tensor::from_slice(&[-1i64, 0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the vocabulary"), "{e}");
        let e = token_logprobs(&x, &Tensor::from_slice(&[0i64, 1, 2]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("do not hold one row per target"), "{e}");
        let e = token_logprobs(&x, &Tensor::from_slice(&[0.0f32, 1.0]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("targets must be integers"), "{e}");
        assert!(!token_logprobs_fits(&x.to_kind(Kind::Double)));
    }
    /// The composite colo-model ran: swapped halves, two products, a sum.
    fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
        let halves = x.split(x.size()[3] / 2, -1);
        let swapped = Tensor::cat(&[&halves[1], &halves[0]], -1);
        (x * cos.unsqueeze(2) + swapped * sin.unsqueeze(2)).transpose(1, 2)
    }

    /// Forward and gradient against the composite, in float32 to rounding
    /// and in bfloat16 to one bfloat16 rounding; with per-row and shared
    /// tables, both layouts, and `x` a strided view (the query and key
    /// heads of a fused projection).
    #[test]
    fn rope_matches_the_composite_forward_and_backward() {
        tch::manual_seed(11);
        for (kind, tol) in [(Kind::Float, 2e-6), (Kind::BFloat16, 8e-3)] {
            for (rows, heads_major) in [(3, true), (1, false), (3, false)] {
                let f = (Kind::Float, Device::Cpu);
                let y0 = Tensor::randn([3, 5, 7 * 16], f).to_kind(kind);
                let cos = Tensor::randn([rows, 5, 16], f).to_kind(kind);
                let sin = Tensor::randn([rows, 5, 16], f).to_kind(kind);
                let dy = Tensor::randn([3, 4, 5, 16], f).to_kind(kind);
                let run = |g: &dyn Fn(&Tensor) -> Tensor| {
                    let y = leaf(&y0);
                    // Heads 1..5 of 7: rows strided by the whole width.
                    let x = y.narrow(-1, 16, 4 * 16).view([3, 5, 4, 16]);
                    let out = g(&x);
                    (out.to_kind(Kind::Float) * dy.to_kind(Kind::Float))
                        .sum(Kind::Float)
                        .backward();
                    (out, y.grad())
                };
                let (out, dx) = run(&|x| rope(x, &cos, &sin, heads_major).unwrap());
                let (want, want_dx) = run(&|x| rope_composite(x, &cos, &sin));
                assert_eq!(out.size(), [3, 4, 5, 16]);
                assert_eq!(out.is_contiguous(), heads_major);
                for (name, a, b) in [("y", &out, &want), ("dx", &dx, &want_dx)] {
                    let err = max_rel(a, b);
                    assert!(
                        err < tol,
                        "{kind:?} rows {rows} {name}: relative error {err}"
                    );
                }
            }
        }
    }

    #[test]
    fn rope_refuses_tables_that_do_not_fit() {
        let f = (Kind::Float, Device::Cpu);
        let x = Tensor::zeros([2, 5, 3, 8], f);
        let t = Tensor::zeros([2, 4, 8], f);
        let e = rope(&x, &t, &t, true).unwrap_err().to_string();
        assert!(e.contains("do not fit x"), "{e}");
        let odd = Tensor::zeros([2, 5, 3, 7], f);
        let e = rope(&odd, &t, &t, true).unwrap_err().to_string();
        assert!(e.contains("even head_dim"), "{e}");
        let t = Tensor::zeros([1, 5, 8], (Kind::BFloat16, Device::Cpu));
        let e = rope(&x, &t, &t, true).unwrap_err().to_string();
        assert!(e.contains("all float32 or all bfloat16"), "{e}");
        assert!(!rope_fits(&x, &t, &t));
    }
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
        assert!(e.contains("lane 1 has 3 keys, outside [1, 2]"), "{e}");
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
