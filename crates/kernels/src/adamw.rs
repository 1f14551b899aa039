//! libtorch's fused AdamW (`csrc/fused_adamw.cpp`), which tch does not
//! expose: colo-train's optimizer step on the CPU.

use std::ffi::c_void;

use tch::Tensor;

use crate::{shim, Error, Result};

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        pub fn colo_torch_fused_adamw(
            params: *const *const c_void,
            grads: *const *const c_void,
            exp_avgs: *const *const c_void,
            exp_avg_sqs: *const *const c_void,
            n: usize,
            step: f64,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            grad_scale: f64,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

/// One AdamW update's numbers (PyTorch's `AdamW` hyper-parameters).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// The update's number, 1 for the first (bias correction).
    pub step: u64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// Decoupled: each parameter is first scaled by 1 − lr·weight_decay.
    pub weight_decay: f64,
    pub eps: f64,
    /// Multiplies the gradients first (the clipping coefficient); 1.0 for none.
    pub grad_coef: f64,
}

/// AdamW on `params` in place, with their gradients and moments, in one
/// fused pass per tensor (libtorch's `_fused_adamw_`, `csrc/fused_adamw.cpp`):
/// index i of each slice belongs together (same shape, kind and device,
/// contiguous: checked here, since libtorch's CPU kernel does not check
/// them; a mismatch is [`Error::Refused`], not a crash). The
/// gradients may be overwritten. Runs on the calling thread's libtorch
/// intra-op threads.
pub fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avgs: &[Tensor],
    exp_avg_sqs: &[Tensor],
    s: &AdamWStep,
) -> Result<()> {
    let refuse = |msg: String| {
        Err(Error::Refused {
            kernel: "fused_adamw",
            msg,
        })
    };
    let n = params.len();
    if [grads.len(), exp_avgs.len(), exp_avg_sqs.len()] != [n; 3] {
        return refuse(format!(
            "{n} parameters but {} gradients, {} first and {} second moments",
            grads.len(),
            exp_avgs.len(),
            exp_avg_sqs.len()
        ));
    }
    // libtorch's CPU kernel checks none of this: it walks each parameter's
    // elements through the other three tensors' data pointers, so a
    // smaller or strided gradient would be read and written out of bounds.
    for (i, p) in params.iter().enumerate() {
        for (what, t) in [
            ("gradient", &grads[i]),
            ("first moment", &exp_avgs[i]),
            ("second moment", &exp_avg_sqs[i]),
        ] {
            let same = t.size() == p.size() && t.kind() == p.kind() && t.device() == p.device();
            if !same || !t.is_contiguous() || !p.is_contiguous() {
                let strided = |t: &Tensor| match t.is_contiguous() {
                    true => "",
                    false => " (strided)",
                };
                return refuse(format!(
                    "parameter {i} is {:?} {:?} on {:?}{}, its {what} {:?} {:?} on {:?}{}: \
                     expected the same shape, kind and device, both contiguous",
                    p.size(),
                    p.kind(),
                    p.device(),
                    strided(p),
                    t.size(),
                    t.kind(),
                    t.device(),
                    strided(t),
                ));
            }
        }
    }
    if !(s.grad_coef.is_finite() && s.grad_coef > 0.0) {
        return refuse(format!(
            "gradient coefficient {} is not a finite number > 0",
            s.grad_coef
        ));
    }
    let ptrs = |ts: &[Tensor]| -> Vec<*const c_void> {
        ts.iter().map(|t| t.as_ptr().cast::<c_void>()).collect()
    };
    let (p, g, m, v) = (ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs));
    shim::call("fused_adamw", |err, len| {
        // SAFETY: four arrays of `n` pointers to live at::Tensor objects
        // (tch's tensors, borrowed for the call); the shim only reads the
        // arrays, catches every C++ exception, and writes at most `len`
        // bytes to `err`.
        unsafe {
            sys::colo_torch_fused_adamw(
                p.as_ptr(),
                g.as_ptr(),
                m.as_ptr(),
                v.as_ptr(),
                n,
                s.step as f64,
                s.lr,
                s.beta1,
                s.beta2,
                s.weight_decay,
                s.eps,
                1.0 / s.grad_coef,
                err,
                len,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::{fused_adamw, AdamWStep};
    use crate::Error;

    fn step(grad_coef: f64) -> AdamWStep {
        AdamWStep {
            step: 1,
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 0.0,
            eps: 1e-8,
            grad_coef,
        }
    }

    /// The first step of Adam moves each weight by lr against its
    /// gradient's sign (m̂ = g, v̂ = g²), whatever the clipping coefficient.
    #[test]
    fn fused_adamw_takes_adams_first_step() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]);
        let g = Tensor::from_slice(&[0.5f32, -4.0]);
        let (m, v) = (p.zeros_like(), p.zeros_like());
        let ts = |t: &Tensor| [t.shallow_clone()];
        fused_adamw(&ts(&p), &ts(&g), &ts(&m), &ts(&v), &step(0.5)).unwrap();
        let got = Vec::<f32>::try_from(&p).unwrap();
        assert!(
            (got[0] - 0.9).abs() < 1e-6 && (got[1] + 1.9).abs() < 1e-6,
            "{got:?}"
        );
        // The first moment saw the clipped gradient.
        let m = Vec::<f32>::try_from(&m).unwrap();
        assert!(
            (m[0] - 0.025).abs() < 1e-7 && (m[1] + 0.2).abs() < 1e-7,
            "{m:?}"
        );
    }

    /// Mismatched inputs are errors naming what was wrong, not crashes.
    #[test]
    fn fused_adamw_refuses_mismatched_inputs() {
        let p = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        let g3 = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        let one = |t: &Tensor| vec![t.shallow_clone()];
        let err = fused_adamw(&one(&p), &[], &one(&p), &one(&p), &step(1.0)).unwrap_err();
        assert!(
            matches!(&err, Error::Refused { kernel: "fused_adamw", msg }
                if msg == "1 parameters but 0 gradients, 1 first and 1 second moments"),
            "{err:?}"
        );
        let err = fused_adamw(&one(&p), &one(&g3), &one(&p), &one(&p), &step(1.0)).unwrap_err();
        assert!(err.to_string().contains("its gradient [3]"), "{err}");
        let strided = Tensor::zeros([4], (Kind::Float, Device::Cpu)).slice(0, 0, 4, 2);
        let err =
            fused_adamw(&one(&p), &one(&p), &one(&strided), &one(&p), &step(1.0)).unwrap_err();
        assert!(err.to_string().contains("(strided)"), "{err}");
        let err = fused_adamw(&one(&p), &one(&p), &one(&p), &one(&p), &step(0.0)).unwrap_err();
        assert!(err.to_string().contains("coefficient 0"), "{err}");
        let half = p.to_kind(Kind::BFloat16);
        let err = fused_adamw(&one(&half), &one(&p), &one(&p), &one(&p), &step(1.0)).unwrap_err();
        assert!(err.to_string().contains("BFloat16"), "{err}");
    }

    /// What libtorch itself refuses (integer parameters, which pass the
    /// checks here) comes back as its message, without its C++ backtrace.
    #[test]
    fn libtorchs_own_refusal_is_a_libtorch_error() {
        let p = Tensor::zeros([2], (Kind::Int64, Device::Cpu));
        let one = |t: &Tensor| vec![t.shallow_clone()];
        let err = fused_adamw(&one(&p), &one(&p), &one(&p), &one(&p), &step(1.0)).unwrap_err();
        let Error::Libtorch { kernel, msg } = &err else {
            panic!("expected a libtorch error, got {err:?}");
        };
        assert_eq!(*kernel, "fused_adamw");
        assert!(msg.contains("Long"), "{msg}");
        assert!(!msg.contains("Exception raised from"), "{msg}");
        assert!(
            err.to_string()
                .starts_with("fused_adamw kernel: libtorch failed: "),
            "{err}"
        );
    }
}
