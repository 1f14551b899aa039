//! # colo-kernels: fused compute kernels on libtorch tensors
//!
//! What colo's model, trainer and rollout engine need from libtorch that
//! libtorch has only as slow composites on the CPU, or that tch does not
//! expose:
//!
//! | kernel | caller | `csrc/` |
//! |---|---|---|
//! | [`rms_norm`] | colo-model's `RmsNorm` | `rms_norm.cpp` |
//! | [`rope`] | colo-model's rotary embedding | `rope.cpp` |
//! | [`token_logprobs`] | colo-train's loss head | `token_logprobs.cpp` |
//! | [`paged_attention`] | colo-rollout's decode attention | `paged_attention.cpp` |
//! | [`skinny_linear`] | colo-model's projections for a few rows (decode) | `skinny_linear.cpp` |
//! | [`fused_adamw`] | colo-train's AdamW | `fused_adamw.cpp` |
//! | [`grad_sum`] | colo-train's sum of the lanes' gradients | `grad_sum.cpp` |
//! | [`set_cudnn_attention`] | colo-rl's CUDA runs | `sdp_backend.cpp` |
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//!
//! let x = Tensor::randn([2, 5, 3, 8], (Kind::Float, Device::Cpu)); // (batch, seq, heads, head_dim)
//! let cos = Tensor::ones([1, 5, 8], (Kind::Float, Device::Cpu));
//! let sin = Tensor::zeros([1, 5, 8], (Kind::Float, Device::Cpu));
//! assert!(colo_kernels::rope_fits(&x, &cos, &sin));
//! let y = colo_kernels::rope(&x, &cos, &sin, true)?; // (batch, heads, seq, head_dim)
//! assert!(y.equal(&x.transpose(1, 2)));
//!
//! let short = Tensor::ones([1, 4, 8], (Kind::Float, Device::Cpu));
//! let err = colo_kernels::rope(&x, &short, &short, true).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "rope kernel: tables [1, 4, 8] and [1, 4, 8] do not fit x [2, 5, 3, 8]"
//! );
//! # Ok::<(), colo_kernels::Error>(())
//! ```
//!
//! ## Design decisions
//!
//! - **Raw call → `Result` → owned tensor.** Each kernel is one C++
//!   function behind `extern "C"` that takes `at::Tensor` pointers (tch's
//!   tensors are such pointers), catches every C++ exception, and hands
//!   back new `at::Tensor`s that the Rust side wraps as tch tensors and
//!   owns. Nothing throws across the boundary.
//! - **One autograd function each.** The differentiable kernels
//!   (`rms_norm`, `rope`, `token_logprobs`) are `torch::autograd::Function`s
//!   with hand-written backwards, so their outputs are ordinary tensors in
//!   libtorch's graph; `paged_attention` serves decoding only and has no
//!   gradient.
//! - **The caller picks.** Every kernel has a `_fits` check (kinds and
//!   device, the kernels being float32 and bfloat16 on the CPU); where it
//!   says no, the caller runs libtorch's composite. The kernels check
//!   their arguments again before reading them.
//! - **Arithmetic as libtorch rounds it.** Each kernel rounds where
//!   libtorch's separate ops round (no fused multiply-add contraction), so
//!   switching between a kernel and its composite moves results by at most
//!   a rounding (RoPE in float32 is bit-identical).
//! - **Errors name the kernel.** A refused argument is
//!   [`Error::Refused`] naming the shapes, kinds or indices; an exception
//!   of libtorch's while a kernel runs is [`Error::Libtorch`] with its
//!   message.
//! - **Apart from the memory layer.** These kernels compute; colo-mem
//!   decides where memory lives. Both are FFI against libtorch's headers,
//!   and `unsafe` lives in these two crates only, each block with a
//!   `// SAFETY:` note. A kernel's tensors are allocated by libtorch's
//!   allocator, which inside a colo-mem region is colo-mem's.

mod adamw;
mod attention_backend;
mod error;
mod grad_sum;
mod paged_attention;
mod rms_norm;
mod rope;
mod shim;
mod skinny_linear;
#[cfg(test)]
mod test_util;
mod token_logprobs;

pub use adamw::{fused_adamw, AdamWStep};
pub use attention_backend::{cudnn_attention, set_cudnn_attention};
pub use error::{Error, Result};
pub use grad_sum::{grad_sum, grad_sum_fits};
pub use paged_attention::{paged_attention, paged_attention_fits};
pub use rms_norm::{rms_norm, rms_norm_fits};
pub use rope::{rope, rope_fits};
pub use skinny_linear::{
    skinny_linear, skinny_linear_fits, skinny_linear_max_rows, skinny_linear_supported,
};
pub use token_logprobs::{token_logprobs, token_logprobs_fits};
