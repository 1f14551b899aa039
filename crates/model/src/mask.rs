//! Additive attention masks: 0 where a query may attend to a key, a large
//! negative number where it may not.
//!
//! The mask is a finite `f32::MIN` rather than `-inf` so that a row with no
//! visible key (a padding query in a left-padded batch) gives a uniform
//! softmax instead of NaN, as in transformers; such rows' outputs are
//! meaningless and must be ignored by the caller.

use candle_core::{DType, Device, Tensor};

use crate::rope::mask_rows;
use crate::{Error, Result};

/// The masked value.
pub const MASKED: f32 = f32::MIN;

/// The masked value representable in `dtype` (float16's range ends at
/// 65504; `f32::MIN` would become `-inf` there).
fn masked(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => -65504.0,
        _ => MASKED,
    }
}

/// Causal mask for `q_len` new queries after `k_len - q_len` cached keys:
/// query `i` sees keys `0..=k_len - q_len + i`. Shape (1, q_len, k_len).
pub fn causal(q_len: usize, k_len: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    check_lengths(q_len, k_len)?;
    let (past, fill) = (k_len - q_len, masked(dtype));
    let data: Vec<f32> = (0..q_len)
        .flat_map(|i| (0..k_len).map(move |j| if j <= past + i { 0.0 } else { fill }))
        .collect();
    Ok(Tensor::from_vec(data, (1, q_len, k_len), device)?.to_dtype(dtype)?)
}

/// Causal mask that also hides padding keys. `key_mask`: (batch, k_len) with
/// 1 for real tokens and 0 for padding (left or right), covering the cached
/// keys and the `q_len` new ones. Shape (batch, q_len, k_len).
pub fn causal_padded(key_mask: &Tensor, q_len: usize, dtype: DType) -> Result<Tensor> {
    let rows = mask_rows(key_mask)?;
    let k_len = rows.first().map_or(0, Vec::len);
    check_lengths(q_len, k_len)?;
    let (past, fill) = (k_len - q_len, masked(dtype));
    let mut data = Vec::with_capacity(rows.len() * q_len * k_len);
    for row in &rows {
        for i in 0..q_len {
            data.extend(row.iter().enumerate().map(
                |(j, &real)| {
                    if real && j <= past + i {
                        0.0
                    } else {
                        fill
                    }
                },
            ));
        }
    }
    Ok(Tensor::from_vec(data, (rows.len(), q_len, k_len), key_mask.device())?.to_dtype(dtype)?)
}

fn check_lengths(q_len: usize, k_len: usize) -> Result<()> {
    if q_len > k_len {
        return Err(Error::Input(format!(
            "mask: {q_len} queries but only {k_len} keys"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_with_past_and_padding() {
        let c = causal(2, 3, DType::F32, &Device::Cpu)
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        assert_eq!(c[0], vec![vec![0.0, 0.0, MASKED], vec![0.0, 0.0, 0.0]]);
        let keys = Tensor::new(&[[0u8, 1, 1]], &Device::Cpu).unwrap();
        let p = causal_padded(&keys, 3, DType::F32)
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        assert_eq!(p[0][2], vec![MASKED, 0.0, 0.0]);
        assert_eq!(p[0][0], vec![MASKED; 3]);
    }
}
