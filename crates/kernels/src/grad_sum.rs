//! The lanes' gradients summed into a float32 accumulator in one pass
//! (`csrc/grad_sum.cpp`): colo-train's optimizer step on the CPU.

use std::ffi::{c_char, c_void};

use tch::{Device, Kind, Tensor};

use crate::{shim, Result};

mod sys {
    use std::ffi::{c_char, c_void};

    extern "C" {
        pub fn colo_torch_grad_sum(
            acc: *const c_void,
            parts: *const *const c_void,
            n: usize,
            fresh: i32,
            err: *mut c_char,
            len: usize,
        ) -> i32;
    }
}

/// Whether [`grad_sum`] takes these: `acc` a contiguous float32 CPU
/// tensor, each part contiguous float32 or bfloat16 on the CPU with acc's
/// number of elements, at least one part.
pub fn grad_sum_fits(acc: &Tensor, parts: &[Tensor]) -> bool {
    let on_cpu = |t: &Tensor| t.device() == Device::Cpu && t.is_contiguous();
    on_cpu(acc)
        && acc.kind() == Kind::Float
        && !parts.is_empty()
        && parts.iter().all(|p| {
            on_cpu(p)
                && p.numel() == acc.numel()
                && matches!(p.kind(), Kind::Float | Kind::BFloat16)
        })
}

/// `acc = ((fresh ? 0 : acc) + parts[0]) + parts[1] + …` in float32, in one
/// pass over `acc`: bit for bit what `acc.copy_(parts[0])` (or `add_`)
/// then `acc.add_(parts[k])` give. See [`grad_sum_fits`]; a mismatch is
/// [`crate::Error::Refused`] naming it.
pub fn grad_sum(acc: &Tensor, parts: &[Tensor], fresh: bool) -> Result<()> {
    let ptrs: Vec<*const c_void> = parts.iter().map(|p| p.as_ptr().cast()).collect();
    shim::call("grad_sum", |err: *mut c_char, len| {
        // SAFETY: `acc` and every part are live tensors (tch's tensors are
        // at::Tensor pointers) for the call, `ptrs` holds `parts.len()`
        // of them; the shim checks kinds, device, layout and sizes before
        // touching their data, and writes at most `len` bytes into `err`.
        unsafe {
            sys::colo_torch_grad_sum(
                acc.as_ptr().cast(),
                ptrs.as_ptr(),
                ptrs.len(),
                i32::from(fresh),
                err,
                len,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// Bit for bit the copy-then-add of libtorch, for bfloat16 and float32
    /// parts, fresh or not, over more elements than a block.
    #[test]
    fn sums_as_copy_then_add_do() {
        tch::manual_seed(11);
        let f32s = |n: i64| Tensor::randn([n], (Kind::Float, Device::Cpu));
        for kind in [Kind::BFloat16, Kind::Float] {
            for fresh in [true, false] {
                let n = 3 * 16384 + 17;
                let parts: Vec<Tensor> = (0..3).map(|_| f32s(n).to_kind(kind)).collect();
                let start = f32s(n);
                let mut want = start.copy();
                for (k, p) in parts.iter().enumerate() {
                    match fresh && k == 0 {
                        true => want.copy_(p),
                        false => drop(want.f_add_(p).unwrap()),
                    }
                }
                let got = start.copy();
                assert!(grad_sum_fits(&got, &parts));
                grad_sum(&got, &parts, fresh).unwrap();
                assert!(got.equal(&want), "{kind:?} fresh {fresh}");
            }
        }
    }

    #[test]
    fn refuses_what_it_does_not_sum_naming_it() {
        let acc = Tensor::zeros([8], (Kind::Float, Device::Cpu));
        let short = Tensor::zeros([7], (Kind::BFloat16, Device::Cpu));
        assert!(!grad_sum_fits(&acc, &[]));
        assert!(!grad_sum_fits(&acc, &[short.shallow_clone()]));
        assert!(!grad_sum_fits(&acc.to_kind(Kind::BFloat16), &[acc.copy()]));
        match grad_sum(&acc, &[short], true) {
            Err(Error::Refused { kernel, msg }) => {
                assert_eq!(kernel, "grad_sum");
                assert!(
                    msg.contains("gradient 0 must be") && msg.contains("of 8 elements"),
                    "{msg}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
