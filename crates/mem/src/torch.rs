//! The link to libtorch: install the allocator shim, read its counters;
//! the attention switch; the fused AdamW update tch does not expose; and
//! fused CPU kernels for the model ([`kernels`]).
//!
//! Raw calls (`sys`), then safe functions; each shim's contract is at the
//! top of its file in `csrc/`.

use std::ffi::{c_char, c_void, CStr};

use tch::Tensor;

use crate::{Error, Result};

pub mod kernels;

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        pub fn colo_torch_install() -> bool;
        pub fn colo_torch_untagged(live: *mut i64, peak: *mut i64, allocs: *mut u64);
        pub fn colo_torch_reset_untagged_peak();
        pub fn colo_torch_set_cudnn_sdp(on: bool);
        pub fn colo_torch_cudnn_sdp() -> bool;
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

/// Runs a shim call that reports failure as nonzero with a message written
/// into the buffer it is given, and turns its status into a `Result`.
pub(crate) fn shim_call(
    backend: &'static str,
    what: &'static str,
    f: impl FnOnce(*mut c_char, usize) -> i32,
) -> Result<()> {
    let mut err = [0 as c_char; 512];
    if f(err.as_mut_ptr(), err.len()) == 0 {
        return Ok(());
    }
    // SAFETY: NUL-terminated by the shim on failure.
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(Error::Backend {
        backend,
        call: what,
        msg,
    })
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
/// them; a mismatch is an error, not a crash). The
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
        Err(Error::Backend {
            backend: "libtorch",
            call: "fused AdamW",
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
    shim_call("libtorch", "fused AdamW", |err, len| {
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

/// Makes colo-mem libtorch's CPU allocator (idempotent; it is done when the
/// binary loads already). False if libtorch kept another allocator, in
/// which case regions cannot work.
pub fn install() -> bool {
    // SAFETY: the shim's install takes no arguments and only swaps a c10
    // registry pointer to a static allocator object that lives forever.
    unsafe { sys::colo_torch_install() }
}

/// Tensor memory made outside any region (libtorch's default allocator,
/// through colo's shim): what colo's accounting shows as untagged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Untagged {
    /// Bytes held now.
    pub live_bytes: u64,
    /// Highest `live_bytes` since the process started or the last
    /// [`reset_untagged_peak`].
    pub peak_bytes: u64,
    /// Allocations made so far.
    pub allocations: u64,
}

/// The untagged counters now.
pub fn untagged() -> Untagged {
    let (mut live, mut peak, mut allocs) = (0i64, 0i64, 0u64);
    // SAFETY: three valid, exclusive out-pointers to plain integers.
    unsafe { sys::colo_torch_untagged(&mut live, &mut peak, &mut allocs) };
    Untagged {
        live_bytes: live.max(0) as u64,
        peak_bytes: peak.max(0) as u64,
        allocations: allocs,
    }
}

/// Starts a new peak of untagged bytes from the current live bytes.
pub fn reset_untagged_peak() {
    // SAFETY: no arguments; stores to the shim's atomics.
    unsafe { sys::colo_torch_reset_untagged_peak() }
}

/// Turns libtorch's cuDNN backend of `scaled_dot_product_attention` on or
/// off for the process (`csrc/sdp_backend.cpp` says why colo turns it off
/// on CUDA: a kernel compiled at run time for every new shape).
pub fn set_cudnn_attention(on: bool) {
    // SAFETY: sets a plain flag in libtorch's global context; no pointers.
    unsafe { sys::colo_torch_set_cudnn_sdp(on) }
}

/// Whether libtorch may pick its cuDNN attention backend.
pub fn cudnn_attention() -> bool {
    // SAFETY: reads a plain flag in libtorch's global context.
    unsafe { sys::colo_torch_cudnn_sdp() }
}

#[cfg(test)]
mod tests {
    use tch::{Kind, Tensor};

    use super::{fused_adamw, AdamWStep};

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
        let p = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
        let g3 = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        let one = |t: &Tensor| vec![t.shallow_clone()];
        let err = fused_adamw(&one(&p), &[], &one(&p), &one(&p), &step(1.0)).unwrap_err();
        assert!(
            err.to_string().contains("1 parameters but 0 gradients"),
            "{err}"
        );
        let err = fused_adamw(&one(&p), &one(&g3), &one(&p), &one(&p), &step(1.0)).unwrap_err();
        assert!(err.to_string().contains("its gradient [3]"), "{err}");
        let strided = Tensor::zeros([4], (Kind::Float, tch::Device::Cpu)).slice(0, 0, 4, 2);
        let err =
            fused_adamw(&one(&p), &one(&p), &one(&strided), &one(&p), &step(1.0)).unwrap_err();
        assert!(err.to_string().contains("(strided)"), "{err}");
        let err = fused_adamw(&one(&p), &one(&p), &one(&p), &one(&p), &step(0.0)).unwrap_err();
        assert!(err.to_string().contains("coefficient 0"), "{err}");
        let half = p.to_kind(Kind::BFloat16);
        let err = fused_adamw(&one(&half), &one(&p), &one(&p), &one(&p), &step(1.0)).unwrap_err();
        assert!(err.to_string().contains("BFloat16"), "{err}");
    }

    #[test]
    fn the_cudnn_attention_switch_reaches_libtorch() {
        let before = super::cudnn_attention();
        for on in [false, true, false] {
            super::set_cudnn_attention(on);
            assert_eq!(super::cudnn_attention(), on);
        }
        super::set_cudnn_attention(before);
    }
}
