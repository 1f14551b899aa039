//! Decode's matrix products (`csrc/skinny_linear.cpp`): `x · wᵀ + b` in
//! bfloat16 for a few rows of `x` against a large weight, reading the
//! weight once in its own layout with AVX512-BF16's dot products. No
//! gradient.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use tch::{Device, Kind, Tensor};

use crate::{shim, Result};

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        pub fn colo_torch_skinny_linear_supported() -> i32;
        pub fn colo_torch_skinny_linear_max_rows() -> i64;
        pub fn colo_torch_skinny_linear(
            x: *const c_void,
            w: *const c_void,
            b: *const c_void,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

/// Whether this CPU runs [`skinny_linear`] (it has AVX512-BF16).
pub fn skinny_linear_supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    // SAFETY: a query of the CPU's features, no arguments.
    *SUPPORTED.get_or_init(|| unsafe { sys::colo_torch_skinny_linear_supported() } == 1)
}

/// The most rows of `x` (the product of its leading sizes) the kernel takes.
pub fn skinny_linear_max_rows() -> usize {
    // SAFETY: returns a constant.
    let rows = unsafe { sys::colo_torch_skinny_linear_max_rows() };
    usize::try_from(rows).unwrap_or(0)
}

/// Whether [`skinny_linear`] runs these: a CPU with AVX512-BF16; `x`
/// (..., in) with at most [`skinny_linear_max_rows`] rows, `w` a
/// contiguous (out, in) matrix and `b` (out), all bfloat16 on the CPU and
/// none requiring a gradient. Anything else is libtorch's `linear` (the
/// caller's choice).
pub fn skinny_linear_fits(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> bool {
    let cpu_bf16 = |t: &Tensor| t.device() == Device::Cpu && t.kind() == Kind::BFloat16;
    let in_dim = w.size().get(1).copied().unwrap_or(0);
    let rows = usize::try_from(in_dim)
        .ok()
        .filter(|&k| k > 0)
        .map(|k| x.numel() / k);
    skinny_linear_supported()
        && cpu_bf16(x)
        && cpu_bf16(w)
        && b.is_none_or(|b| cpu_bf16(b) && !b.requires_grad())
        && w.dim() == 2
        && w.is_contiguous()
        && x.size().last() == Some(&in_dim)
        && rows.is_some_and(|r| r <= skinny_linear_max_rows())
        && !x.requires_grad()
        && !w.requires_grad()
}

/// `x · wᵀ + b`, rounded to bfloat16 once as libtorch's `linear` rounds,
/// for decode's few rows: `x` (..., in) → (..., out); see
/// [`skinny_linear_fits`]. The sums run in another order than libtorch's,
/// so the two differ by at most a rounding. A mismatch is
/// [`crate::Error::Refused`] naming the shapes or kinds.
pub fn skinny_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    let b_ptr = b.map_or(std::ptr::null(), |b| b.as_ptr().cast());
    shim::call("skinny_linear", |err: *mut c_char, len| {
        // SAFETY: `x`, `w` and `b` (or null) are live tensors (tch's
        // tensors are at::Tensor pointers) for the call; the shim checks
        // the CPU, kinds, device, shapes and row count before reading
        // them, writes `out` only on success, and writes at most `len`
        // bytes of message into `err`.
        unsafe {
            sys::colo_torch_skinny_linear(
                x.as_ptr().cast(),
                w.as_ptr().cast(),
                b_ptr,
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
    use crate::Error;

    fn bf16(shape: &[i64]) -> Tensor {
        Tensor::randn(shape, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16)
    }

    /// The product in float32 of the bfloat16 values, rounded once.
    fn reference(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
        let f = |t: &Tensor| t.to_kind(Kind::Float);
        x.to_kind(Kind::Float)
            .linear(&f(w), b.map(f).as_ref())
            .to_kind(Kind::BFloat16)
    }

    /// Largest difference from `want` in units of the rounding this
    /// comparison allows: one bfloat16 unit in the last place of `want`
    /// (the two round sums made in another order) plus twice float32's
    /// worst-case error of summing `in` products, in·2⁻²⁴·Σ|x||w| (for a
    /// sum that cancels, the two orders differ by more than its ulp). At
    /// most 1 when the results agree to those roundings.
    fn misfit(got: &Tensor, want: &Tensor, x: &Tensor, w: &Tensor) -> f64 {
        let f = |t: &Tensor| t.to_kind(Kind::Float);
        let (g, want) = (f(got), f(want));
        let k = w.size()[1] as f64;
        let abs_sum = f(x).abs().linear(&f(w).abs(), None::<&Tensor>);
        let ulp = (want.abs().clamp_min(1e-30).log2().floor() - 7.0).exp2();
        let allowed = ulp + abs_sum * (2.0 * k * f64::powi(2.0, -24));
        ((g - want).abs() / allowed).max().double_value(&[])
    }

    /// Against float32 arithmetic on the same bfloat16 values, rounded
    /// once: every row count up to the largest, `in` a multiple of 32 and
    /// not (the masked tail), `out` not a multiple of the tile, with and
    /// without a bias, and one thread against two (the same bits).
    #[test]
    fn matches_float32_products_rounded_once() {
        if !skinny_linear_supported() {
            let (x, w) = (bf16(&[2, 64]), bf16(&[8, 64]));
            assert!(!skinny_linear_fits(&x, &w, None));
            let err = skinny_linear(&x, &w, None).unwrap_err();
            assert!(err.to_string().contains("no AVX512-BF16"), "{err}");
            eprintln!("skinny_linear: this CPU has no AVX512-BF16; checked the refusal only");
            return;
        }
        tch::manual_seed(3);
        for (rows, k, n) in [
            (1, 64, 7),
            (3, 896, 133),
            (8, 100, 64),
            (16, 37, 9),
            (32, 4864, 70),
        ] {
            let (x, w, b) = (bf16(&[rows, 1, k]), bf16(&[n, k]), bf16(&[n]));
            for bias in [None, Some(&b)] {
                assert!(skinny_linear_fits(&x, &w, bias));
                let got = skinny_linear(&x, &w, bias).unwrap();
                assert_eq!(got.size(), [rows, 1, n]);
                assert_eq!(got.kind(), Kind::BFloat16);
                let d = misfit(&got, &reference(&x, &w, bias), &x, &w);
                assert!(d <= 1.0, "rows {rows} in {k} out {n}: {d} of the rounding");
                let libtorch = misfit(&got, &x.linear(&w, bias), &x, &w);
                assert!(
                    libtorch <= 1.0,
                    "rows {rows} in {k} out {n}: {libtorch} of the rounding from linear"
                );
            }
        }
        let (x, w) = (bf16(&[5, 896]), bf16(&[4 * 64 * 3 + 1, 896]));
        let threads = tch::get_num_threads();
        tch::set_num_threads(1);
        let one = skinny_linear(&x, &w, None).unwrap();
        tch::set_num_threads(2);
        let two = skinny_linear(&x, &w, None).unwrap();
        tch::set_num_threads(threads);
        assert!(one.equal(&two), "the thread count changed the result");
    }

    #[test]
    fn refuses_what_it_does_not_run_naming_it() {
        let (x, w) = (bf16(&[2, 64]), bf16(&[8, 64]));
        assert!(!skinny_linear_fits(&x.to_kind(Kind::Float), &w, None));
        assert!(!skinny_linear_fits(&bf16(&[33, 64]), &w, None));
        assert!(!skinny_linear_fits(&bf16(&[2, 63]), &w, None));
        assert!(!skinny_linear_fits(&x, &w.transpose(0, 1), None));
        assert!(!skinny_linear_fits(&x, &w.set_requires_grad(true), None));
        let cases: [(Tensor, Tensor, Option<Tensor>, &str); 4] = [
            (x.to_kind(Kind::Float), w.copy(), None, "must be bfloat16"),
            (
                bf16(&[2, 63]),
                w.copy(),
                None,
                "w must be a contiguous (out, in) matrix",
            ),
            (
                bf16(&[33, 64]),
                w.copy(),
                None,
                "33 rows, more than the kernel's 32",
            ),
            (
                x.copy(),
                w.copy(),
                Some(bf16(&[7])),
                "b must be (8), got [7]",
            ),
        ];
        for (x, w, b, want) in cases {
            match skinny_linear(&x, &w, b.as_ref()) {
                Err(Error::Refused { kernel, msg }) => {
                    assert_eq!(kernel, "skinny_linear");
                    if skinny_linear_supported() {
                        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
                    }
                }
                other => panic!("expected a refusal for {want:?}, got {other:?}"),
            }
        }
    }
}
