//! Masked reductions over (batch, response_len) tensors, the input checks
//! every other module uses, and the kind rules they share.
//!
//! All reductions are libtorch ops with a backward (`where`, `mul`, `sum`,
//! `div`, `rsqrt`), so they can sit inside a differentiated loss. Positions
//! where the mask is zero are replaced by zero *before* multiplying by the
//! mask (verl's `masked_sum` does the same, and `where`'s backward sends
//! exactly zero to the unselected side): a NaN or infinity in a padded
//! position therefore cannot leak into a sum, nor into its gradient.
//!
//! Kinds: reductions accumulate in [`acc_kind`] — f32 for bf16/f16 inputs,
//! the input's kind otherwise — and return that kind; results with the
//! input's shape (whitening) are cast back to the input's kind.

use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// Added to token counts before dividing, as verl does (`mask.sum() + 1e-8`),
/// so that an all-zero mask gives 0 instead of NaN.
pub const MASK_EPS: f64 = 1e-8;

/// Added to the variance before the reciprocal square root in whitening (verl's value).
pub const WHITEN_EPS: f64 = 1e-8;

/// The kind a computation on `kind` inputs accumulates in: f32 for the
/// half-precision kinds (bf16, f16), whose 8 or 11 bits of mantissa cannot
/// hold a sum over thousands of tokens or a ratio of nearby log-probs; the
/// input's own kind otherwise (f32 stays f32, f64 stays f64).
pub fn acc_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Half | Kind::BFloat16 => Kind::Float,
        k => k,
    }
}

/// `t` in its [`acc_kind`] (no copy when it already is); differentiable.
pub(crate) fn upcast(t: &Tensor) -> Tensor {
    t.to_kind(acc_kind(t.kind()))
}

/// [`Error::InvalidInput`] naming `arg` unless `t` is f16, bf16, f32 or f64.
fn check_float(arg: &'static str, t: &Tensor) -> Result<()> {
    match t.kind() {
        Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double => Ok(()),
        other => Err(Error::InvalidInput {
            arg,
            reason: format!("must be a floating-point tensor (f32, f64, bf16, f16), got {other:?}"),
        }),
    }
}

fn dims(t: &Tensor) -> Vec<usize> {
    t.size().iter().map(|&d| d as usize).collect()
}

/// `(batch, response_len)` of `t`, or [`Error::NotMatrix`] naming `arg`.
pub(crate) fn dims2(arg: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match t.size()[..] {
        [b, l] => Ok((b as usize, l as usize)),
        _ => Err(Error::NotMatrix { arg, got: dims(t) }),
    }
}

/// Checks that `t` (named `arg`) has the shape, kind and device of
/// `reference` (named `ref_name`), and that the kind is a float kind.
pub(crate) fn check_like(
    ref_name: &'static str,
    reference: &Tensor,
    arg: &'static str,
    t: &Tensor,
) -> Result<()> {
    if t.size() != reference.size() {
        return Err(Error::ShapeMismatch {
            arg,
            got: dims(t),
            reference: ref_name,
            expected: dims(reference),
        });
    }
    check_float(ref_name, reference)?;
    if t.kind() != reference.kind() {
        return Err(Error::DTypeMismatch {
            arg,
            got: t.kind(),
            reference: ref_name,
            expected: reference.kind(),
        });
    }
    if t.device() != reference.device() {
        return Err(Error::DeviceMismatch {
            arg,
            got: t.device(),
            reference: ref_name,
            expected: reference.device(),
        });
    }
    Ok(())
}

/// Checks that `reference` is (batch, response_len) and every other named
/// tensor matches it; returns `(batch, response_len)`.
pub(crate) fn check_all(
    reference: (&'static str, &Tensor),
    others: &[(&'static str, &Tensor)],
) -> Result<(usize, usize)> {
    let dims = dims2(reference.0, reference.1)?;
    check_float(reference.0, reference.1)?;
    for (name, t) in others {
        check_like(reference.0, reference.1, name, t)?;
    }
    Ok(dims)
}

/// `t` with masked-out positions set to exactly zero (NaN-safe); any kind.
pub(crate) fn zero_padding(t: &Tensor, mask: &Tensor) -> Tensor {
    t.where_scalarother(&mask.ne(0.0), 0.0)
}

/// `values` with masked-out positions zeroed, times the mask, in the accumulation kind.
fn masked(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check_like("values", values, "mask", mask)?;
    Ok(zero_padding(&upcast(values), mask) * upcast(mask))
}

/// Σ values·mask over all elements; a scalar (rank-0) tensor. Shapes: any, equal.
pub fn masked_sum(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let m = masked(values, mask)?;
    Ok(m.sum(m.kind()))
}

/// Σ over the last axis of values·mask: shape (batch,) for (batch, response_len) inputs.
pub fn masked_sum_rows(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let m = masked(values, mask)?;
    Ok(m.sum_dim_intlist(-1, false, m.kind()))
}

/// Mean of `values` over unmasked elements: Σ values·mask / (Σ mask + 1e-8).
/// A scalar tensor; 0 when the mask is all zero. (verl `masked_mean`, `axis=None`.)
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let sum = masked_sum(values, mask)?;
    Ok(sum / (mask.sum(acc_kind(mask.kind())) + MASK_EPS))
}

/// Per-row mean over unmasked tokens: shape (batch,). (verl `masked_mean`, `axis=-1`.)
pub fn masked_mean_rows(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let sum = masked_sum_rows(values, mask)?;
    let count = mask.sum_dim_intlist(-1, false, acc_kind(mask.kind()));
    Ok(sum / (count + MASK_EPS))
}

/// Variance of `values` over unmasked elements, a scalar tensor.
///
/// With `unbiased` the population variance is multiplied by n/(n−1) (Bessel's
/// correction, as verl's `masked_var`), which needs at least two unmasked
/// elements: fewer is an [`Error::InvalidInput`], as verl raises. Checking
/// that reads n, one scalar, back to the host.
pub fn masked_var(values: &Tensor, mask: &Tensor, unbiased: bool) -> Result<Tensor> {
    let mean = masked_mean(values, mask)?;
    let centered = upcast(values) - mean;
    let var = masked_mean(&centered.square(), &upcast(mask))?;
    if !unbiased {
        return Ok(var);
    }
    let n = f64::try_from(mask.sum(Kind::Double))?;
    if n < 2.0 {
        return Err(Error::InvalidInput {
            arg: "mask",
            reason: format!(
                "an unbiased variance needs at least two unmasked elements, the mask sums to {n}"
            ),
        });
    }
    Ok(var * (n / (n - 1.0)))
}

/// Whitens `values`: (values − mean) / sqrt(var + 1e-8), with mean and
/// unbiased variance taken over the unmasked elements (verl `masked_whiten`).
///
/// With `shift_mean = false` the mean is added back, so only the scale changes.
/// Masked-out positions are transformed too (they are not zeroed): callers that
/// need zeros there multiply by the mask, as verl's estimators do. The
/// statistics are accumulated in [`acc_kind`]; the result has `values`' kind.
pub fn masked_whiten(values: &Tensor, mask: &Tensor, shift_mean: bool) -> Result<Tensor> {
    let mean = masked_mean(values, mask)?;
    let var = masked_var(values, mask, true)?;
    let inv_std = (var + WHITEN_EPS).rsqrt();
    let whitened = (upcast(values) - &mean) * inv_std;
    let out = if shift_mean {
        whitened
    } else {
        whitened + mean
    };
    Ok(out.to_kind(values.kind()))
}

/// Masked means for metrics, read back to the host in one transfer: for each
/// `(values, mask)` pair, Σ values·mask / (Σ mask + 1e-8) in f64, as [`masked_mean`].
///
/// The sums run over the unmasked elements only (`masked_select`), so the
/// result does not depend on how much padding surrounds them, to the last bit.
/// Nothing is differentiated.
pub(crate) fn host_means(pairs: &[(&Tensor, &Tensor)]) -> Result<Vec<f64>> {
    let means: Vec<Tensor> = pairs
        .iter()
        .map(|&(v, m)| {
            let keep = m.ne(0.0);
            let m = m.detach().to_kind(Kind::Double).masked_select(&keep);
            let v = v.detach().to_kind(Kind::Double).masked_select(&keep);
            (v * &m).sum(Kind::Double) / (m.sum(Kind::Double) + MASK_EPS)
        })
        .collect();
    Ok(Vec::<f64>::try_from(Tensor::stack(&means, 0))?)
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Small tensors for the unit tests.
    use tch::{Kind, Tensor};

    /// An f32 (rows, cols) tensor on the CPU.
    pub fn t2(data: &[&[f32]]) -> Tensor {
        Tensor::from_slice2(data)
    }

    /// A tensor's rows as f32.
    pub fn rows(t: &Tensor) -> Vec<Vec<f32>> {
        Vec::<Vec<f32>>::try_from(t.to_kind(Kind::Float)).unwrap()
    }

    /// A one-element tensor as f64.
    pub fn scalar(t: &Tensor) -> f64 {
        f64::try_from(t).unwrap()
    }

    /// `t` as a fresh leaf tensor that records gradients.
    pub fn var(t: &Tensor) -> Tensor {
        t.detach().copy().set_requires_grad(true)
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;

    #[test]
    fn mean_ignores_masked_values_even_nan() {
        let v = t2(&[&[1.0, 2.0, f32::NAN], &[4.0, f32::INFINITY, 6.0]]);
        let m = t2(&[&[1.0, 1.0, 0.0], &[1.0, 0.0, 1.0]]);
        // (1 + 2 + 4 + 6) / 4 = 3.25
        let mean = scalar(&masked_mean(&v, &m).unwrap());
        assert!((mean - 3.25).abs() < 1e-6, "{mean}");
        // rows: (1+2)/2 = 1.5, (4+6)/2 = 5
        let r = Vec::<f32>::try_from(masked_mean_rows(&v, &m).unwrap()).unwrap();
        assert!(
            (r[0] - 1.5).abs() < 1e-6 && (r[1] - 5.0).abs() < 1e-6,
            "{r:?}"
        );
    }

    #[test]
    fn mean_of_empty_mask_is_zero() {
        let v = t2(&[&[1.0, 2.0]]);
        let m = t2(&[&[0.0, 0.0]]);
        assert_eq!(scalar(&masked_mean(&v, &m).unwrap()), 0.0);
    }

    #[test]
    fn var_and_whiten_match_hand_values() {
        // Unmasked values 1, 2, 3, 6: mean 3, squared deviations 4, 1, 0, 9 → 14;
        // unbiased var = 14 / 3 = 4.6667; population var = 3.5.
        let v = t2(&[&[1.0, 2.0, 100.0], &[3.0, 6.0, -7.0]]);
        let m = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 0.0]]);
        let var = scalar(&masked_var(&v, &m, true).unwrap());
        assert!((var - 14.0 / 3.0).abs() < 1e-5, "{var}");
        let pop = scalar(&masked_var(&v, &m, false).unwrap());
        assert!((pop - 3.5).abs() < 1e-5, "{pop}");
        // whitened 1 → (1 − 3) / sqrt(4.6667) = −0.92582
        let w = rows(&masked_whiten(&v, &m, true).unwrap());
        assert!((w[0][0] + 0.925_82).abs() < 1e-4, "{w:?}");
        assert!((w[1][1] - 3.0 / (14.0f32 / 3.0).sqrt()).abs() < 1e-4);
        // shift_mean = false adds the mean back: −0.92582 + 3
        let w = rows(&masked_whiten(&v, &m, false).unwrap());
        assert!((w[0][0] - 2.074_18).abs() < 1e-4, "{w:?}");
    }

    #[test]
    fn bf16_accumulates_in_f32() {
        // 4095 ones: bf16 (8 significant bits) would round the sum to 4096.
        let opts = (Kind::BFloat16, tch::Device::Cpu);
        let (v, m) = (Tensor::ones([1, 4095], opts), Tensor::ones([1, 4095], opts));
        let s = masked_sum(&v, &m).unwrap();
        assert_eq!(s.kind(), Kind::Float);
        assert_eq!(scalar(&s), 4095.0);
        assert_eq!(masked_whiten(&v, &m, false).unwrap().kind(), Kind::BFloat16);
    }

    #[test]
    fn unbiased_var_needs_two_elements() {
        let v = t2(&[&[1.0, 2.0]]);
        let m = t2(&[&[1.0, 0.0]]);
        let err = masked_var(&v, &m, true).unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput { arg: "mask", .. }),
            "{err}"
        );
    }

    #[test]
    fn shape_mismatch_names_the_mask() {
        let v = t2(&[&[1.0, 2.0]]);
        let m = t2(&[&[1.0, 0.0, 1.0]]);
        let err = masked_sum(&v, &m).unwrap_err();
        assert!(
            matches!(err, Error::ShapeMismatch { arg: "mask", .. }),
            "{err}"
        );
    }

    #[test]
    fn kind_mismatch_and_integer_inputs_are_errors() {
        let v = t2(&[&[1.0, 2.0]]);
        let err = masked_sum(&v, &v.to_kind(Kind::Double)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::DTypeMismatch {
                    arg: "mask",
                    got: Kind::Double,
                    expected: Kind::Float,
                    ..
                }
            ),
            "{err}"
        );
        let i = v.to_kind(Kind::Int64);
        let err = masked_sum(&i, &i).unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput { arg: "values", .. }),
            "{err}"
        );
    }

    #[test]
    fn gradient_of_masked_mean_is_mask_over_count() {
        let v = var(&t2(&[&[1.0, f32::NAN, 3.0]]));
        let m = t2(&[&[1.0, 0.0, 1.0]]);
        let loss = masked_mean(&v, &m).unwrap();
        loss.backward();
        let g = rows(&v.grad());
        // d/dv_i = m_i / 2; the NaN position gets exactly zero.
        assert_eq!(g[0][1], 0.0);
        assert!(
            (g[0][0] - 0.5).abs() < 1e-6 && (g[0][2] - 0.5).abs() < 1e-6,
            "{g:?}"
        );
    }
}
