//! RMSNorm (`csrc/rms_norm.cpp`): colo-model's `RmsNorm` on the CPU.

use std::ffi::{c_char, c_void};

use tch::{Device, Kind, Tensor};

use crate::{shim, Result};

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
/// is (h); see [`rms_norm_fits`]. A mismatch is [`crate::Error::Refused`]
/// naming the shapes or kinds.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    shim::call("rms_norm", |err: *mut c_char, len| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{leaf, max_rel};
    use crate::Error;

    /// libtorch's composite, the reference.
    fn reference(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
        x.rms_norm([w.size()[0]], Some(w), eps)
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
        let e = rms_norm(&x, &w, 1e-6).unwrap_err();
        assert_eq!(
            e,
            Error::Refused {
                kernel: "rms_norm",
                msg: "x [2, 8] does not end in w's size [7]".into()
            }
        );
        let e = rms_norm(&x, &w.to_kind(Kind::BFloat16), 1e-6)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rms_norm kernel: x and w both float32 or both bfloat16"),
            "{e}"
        );
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
}
