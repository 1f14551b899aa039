//! Masked reductions over (batch, response_len) tensors, and the input checks
//! every other module uses.
//!
//! All reductions are built from candle ops that have a backward (`where_cond`,
//! `mul`, `sum`, `div`, `sqrt`), so they can sit inside a differentiated loss.
//! Positions where the mask is zero are replaced by zero *before* multiplying
//! by the mask (verl's `masked_sum` does the same): a NaN or infinity in a
//! padded position therefore cannot leak into a sum, nor into its gradient.

use candle_core::{DType, Tensor, D};

use crate::error::{Error, Result};

/// Added to token counts before dividing, as verl does (`mask.sum() + 1e-8`),
/// so that an all-zero mask gives 0 instead of NaN.
pub const MASK_EPS: f64 = 1e-8;

/// Added to the variance before the reciprocal square root in whitening (verl's value).
pub const WHITEN_EPS: f64 = 1e-8;

/// `(batch, response_len)` of `t`, or [`Error::NotMatrix`] naming `arg`.
pub(crate) fn dims2(arg: &'static str, t: &Tensor) -> Result<(usize, usize)> {
    match t.dims() {
        &[b, l] => Ok((b, l)),
        other => Err(Error::NotMatrix {
            arg,
            got: other.to_vec(),
        }),
    }
}

/// Checks that `t` (named `arg`) has the shape and dtype of `reference` (named `ref_name`).
pub(crate) fn check_like(
    ref_name: &'static str,
    reference: &Tensor,
    arg: &'static str,
    t: &Tensor,
) -> Result<()> {
    if t.dims() != reference.dims() {
        return Err(Error::ShapeMismatch {
            arg,
            got: t.dims().to_vec(),
            reference: ref_name,
            expected: reference.dims().to_vec(),
        });
    }
    if t.dtype() != reference.dtype() {
        return Err(Error::DTypeMismatch {
            arg,
            got: t.dtype(),
            reference: ref_name,
            expected: reference.dtype(),
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
    for (name, t) in others {
        check_like(reference.0, reference.1, name, t)?;
    }
    Ok(dims)
}

/// `values` with masked-out positions set to exactly zero (NaN-safe), times the mask.
fn masked(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check_like("values", values, "mask", mask)?;
    let keep = mask.ne(0.0)?;
    let zeros = values.zeros_like()?;
    Ok(keep.where_cond(values, &zeros)?.mul(mask)?)
}

/// Σ values·mask over all elements; a scalar (rank-0) tensor. Shapes: any, equal.
pub fn masked_sum(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked(values, mask)?.sum_all()?)
}

/// Σ over the last axis of values·mask: shape (batch,) for (batch, response_len) inputs.
pub fn masked_sum_rows(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    Ok(masked(values, mask)?.sum(D::Minus1)?)
}

/// Mean of `values` over unmasked elements: Σ values·mask / (Σ mask + 1e-8).
/// A scalar tensor; 0 when the mask is all zero. (verl `masked_mean`, `axis=None`.)
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let count = mask.sum_all()?.affine(1.0, MASK_EPS)?;
    Ok(masked_sum(values, mask)?.div(&count)?)
}

/// Per-row mean over unmasked tokens: shape (batch,). (verl `masked_mean`, `axis=-1`.)
pub fn masked_mean_rows(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let count = mask.sum(D::Minus1)?.affine(1.0, MASK_EPS)?;
    Ok(masked_sum_rows(values, mask)?.div(&count)?)
}

/// Variance of `values` over unmasked elements, a scalar tensor.
///
/// With `unbiased` the population variance is multiplied by n/(n−1) (Bessel's
/// correction, as verl's `masked_var`), which needs at least two unmasked
/// elements: fewer is an [`Error::InvalidInput`], as verl raises.
pub fn masked_var(values: &Tensor, mask: &Tensor, unbiased: bool) -> Result<Tensor> {
    let mean = masked_mean(values, mask)?;
    let centered = values.broadcast_sub(&mean)?;
    let var = masked_mean(&centered.sqr()?, mask)?;
    if !unbiased {
        return Ok(var);
    }
    let n = mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
    if n < 2.0 {
        return Err(Error::InvalidInput {
            arg: "mask",
            reason: format!(
                "an unbiased variance needs at least two unmasked elements, the mask sums to {n}"
            ),
        });
    }
    Ok(var.affine(n / (n - 1.0), 0.0)?)
}

/// Whitens `values`: (values − mean) / sqrt(var + 1e-8), with mean and
/// unbiased variance taken over the unmasked elements (verl `masked_whiten`).
///
/// With `shift_mean = false` the mean is added back, so only the scale changes.
/// Masked-out positions are transformed too (they are not zeroed): callers that
/// need zeros there multiply by the mask, as verl's estimators do.
pub fn masked_whiten(values: &Tensor, mask: &Tensor, shift_mean: bool) -> Result<Tensor> {
    let mean = masked_mean(values, mask)?;
    let var = masked_var(values, mask, true)?;
    let inv_std = var.affine(1.0, WHITEN_EPS)?.sqrt()?.recip()?;
    let whitened = values.broadcast_sub(&mean)?.broadcast_mul(&inv_std)?;
    if shift_mean {
        Ok(whitened)
    } else {
        Ok(whitened.broadcast_add(&mean)?)
    }
}

/// A (batch, response_len) tensor copied to the host as f32 rows.
pub(crate) fn rows(t: &Tensor) -> Result<Vec<Vec<f32>>> {
    Ok(t.to_dtype(DType::F32)?.to_vec2::<f32>()?)
}

/// The inverse of [`rows`]: a (batch, response_len) tensor of `dtype` on `like`'s device.
pub(crate) fn from_rows(data: Vec<Vec<f32>>, like: &Tensor) -> Result<Tensor> {
    let (b, l) = (data.len(), data.first().map_or(0, Vec::len));
    let flat: Vec<f32> = data.into_iter().flatten().collect();
    Ok(Tensor::from_vec(flat, (b, l), like.device())?.to_dtype(like.dtype())?)
}

/// A scalar tensor read back as f64 (for metrics).
pub(crate) fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t2(data: &[&[f32]]) -> Tensor {
        let rows: Vec<Vec<f32>> = data.iter().map(|r| r.to_vec()).collect();
        Tensor::new(rows, &Device::Cpu).unwrap()
    }

    #[test]
    fn mean_ignores_masked_values_even_nan() {
        let v = t2(&[&[1.0, 2.0, f32::NAN], &[4.0, f32::INFINITY, 6.0]]);
        let m = t2(&[&[1.0, 1.0, 0.0], &[1.0, 0.0, 1.0]]);
        // (1 + 2 + 4 + 6) / 4 = 3.25
        let mean = scalar(&masked_mean(&v, &m).unwrap()).unwrap();
        assert!((mean - 3.25).abs() < 1e-6, "{mean}");
        // rows: (1+2)/2 = 1.5, (4+6)/2 = 5
        let r = masked_mean_rows(&v, &m).unwrap().to_vec1::<f32>().unwrap();
        assert!(
            (r[0] - 1.5).abs() < 1e-6 && (r[1] - 5.0).abs() < 1e-6,
            "{r:?}"
        );
    }

    #[test]
    fn mean_of_empty_mask_is_zero() {
        let v = t2(&[&[1.0, 2.0]]);
        let m = t2(&[&[0.0, 0.0]]);
        assert_eq!(scalar(&masked_mean(&v, &m).unwrap()).unwrap(), 0.0);
    }

    #[test]
    fn var_and_whiten_match_hand_values() {
        // Unmasked values 1, 2, 3, 6: mean 3, squared deviations 4, 1, 0, 9 → 14;
        // unbiased var = 14 / 3 = 4.6667; population var = 3.5.
        let v = t2(&[&[1.0, 2.0, 100.0], &[3.0, 6.0, -7.0]]);
        let m = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 0.0]]);
        let var = scalar(&masked_var(&v, &m, true).unwrap()).unwrap();
        assert!((var - 14.0 / 3.0).abs() < 1e-5, "{var}");
        let pop = scalar(&masked_var(&v, &m, false).unwrap()).unwrap();
        assert!((pop - 3.5).abs() < 1e-5, "{pop}");
        // whitened 1 → (1 − 3) / sqrt(4.6667) = −0.92582
        let w = rows(&masked_whiten(&v, &m, true).unwrap()).unwrap();
        assert!((w[0][0] + 0.925_82).abs() < 1e-4, "{w:?}");
        assert!((w[1][1] - 3.0 / (14.0f32 / 3.0).sqrt()).abs() < 1e-4);
        // shift_mean = false adds the mean back: −0.92582 + 3
        let w = rows(&masked_whiten(&v, &m, false).unwrap()).unwrap();
        assert!((w[0][0] - 2.074_18).abs() < 1e-4, "{w:?}");
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
    fn gradient_of_masked_mean_is_mask_over_count() {
        let v = Var::from_tensor(&t2(&[&[1.0, f32::NAN, 3.0]])).unwrap();
        let m = t2(&[&[1.0, 0.0, 1.0]]);
        let loss = masked_mean(v.as_tensor(), &m).unwrap();
        let g = loss.backward().unwrap();
        let g = rows(g.get(v.as_tensor()).unwrap()).unwrap();
        // d/dv_i = m_i / 2; the NaN position gets exactly zero.
        assert_eq!(g[0][1], 0.0);
        assert!(
            (g[0][0] - 0.5).abs() < 1e-6 && (g[0][2] - 0.5).abs() < 1e-6,
            "{g:?}"
        );
    }
}
