//! The loss head (`csrc/token_logprobs.cpp`): colo-train's log-probability
//! and entropy of each target on the CPU.

use std::ffi::{c_char, c_void};

use tch::{Device, Kind, Tensor};

use crate::{shim, Result};

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        pub fn colo_torch_token_logprobs(
            logits: *const c_void,
            targets: *const c_void,
            lp: *mut *mut c_void,
            entropy: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
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
/// are [`crate::Error::Refused`] naming them; see [`token_logprobs_fits`].
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let mut lp: *mut c_void = std::ptr::null_mut();
    let mut entropy: *mut c_void = std::ptr::null_mut();
    shim::call("token_logprobs", |err: *mut c_char, len| {
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
    use crate::test_util::{leaf, max_rel};

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
        assert_eq!(
            e,
            "token_logprobs kernel: targets in [0, 8], outside the vocabulary of 8"
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
}
