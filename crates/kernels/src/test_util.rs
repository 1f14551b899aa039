//! What the kernels' tests share.

use tch::{Kind, Tensor};

/// A fresh leaf with `t`'s values that requires a gradient.
pub(crate) fn leaf(t: &Tensor) -> Tensor {
    t.detach().copy().set_requires_grad(true)
}

/// The largest absolute difference, relative to `b`'s largest magnitude.
pub(crate) fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    let scale = b.abs().max().double_value(&[]).max(1e-30);
    (a - b).abs().max().double_value(&[]) / scale
}
