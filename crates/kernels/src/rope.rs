//! Rotary position embedding (`csrc/rope.cpp`): colo-model's
//! `RopeTables::apply` on the CPU.

use std::ffi::{c_char, c_void};

use tch::{Device, Kind, Tensor};

use crate::{shim, Result};

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
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
/// are [`crate::Error::Refused`] naming them.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, heads_major: bool) -> Result<Tensor> {
    let mut out: *mut c_void = std::ptr::null_mut();
    shim::call("rope", |err: *mut c_char, len| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{leaf, max_rel};
    use crate::Error;

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

    /// A shape error is this crate's, naming the kernel and the shapes.
    #[test]
    fn rope_refuses_tables_that_do_not_fit() {
        let f = (Kind::Float, Device::Cpu);
        let x = Tensor::zeros([2, 5, 3, 8], f);
        let t = Tensor::zeros([2, 4, 8], f);
        let e = rope(&x, &t, &t, true).unwrap_err();
        assert_eq!(
            e,
            Error::Refused {
                kernel: "rope",
                msg: "tables [2, 4, 8] and [2, 4, 8] do not fit x [2, 5, 3, 8]".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "rope kernel: tables [2, 4, 8] and [2, 4, 8] do not fit x [2, 5, 3, 8]"
        );
        let odd = Tensor::zeros([2, 5, 3, 7], f);
        let e = rope(&odd, &t, &t, true).unwrap_err().to_string();
        assert!(e.contains("even head_dim"), "{e}");
        let t = Tensor::zeros([1, 5, 8], (Kind::BFloat16, Device::Cpu));
        let e = rope(&x, &t, &t, true).unwrap_err().to_string();
        assert!(e.contains("all float32 or all bfloat16"), "{e}");
        assert!(!rope_fits(&x, &t, &t));
    }
}
