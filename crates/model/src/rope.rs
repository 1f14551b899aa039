//! Rotary position embedding tables and position ids.

use candle_core::{DType, Device, Tensor};

use crate::{Error, Result};

/// RoPE frequencies for one head size and base (`rope_theta`).
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    /// `1 / theta^(2i / head_dim)` for `i < head_dim / 2`, in float32 as
    /// transformers computes it.
    inv_freq: Vec<f32>,
}

/// cos and sin of every (row, position, frequency): each (batch or 1, seq,
/// head_dim / 2), float32. Build once per forward and share across layers.
#[derive(Debug, Clone)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl RotaryEmbedding {
    pub fn new(head_dim: usize, theta: f64) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        RotaryEmbedding { inv_freq }
    }

    /// Tables for explicit positions, one row per sequence.
    pub fn tables(
        &self,
        positions: &[Vec<u32>],
        dtype: DType,
        device: &Device,
    ) -> Result<RopeTables> {
        let rows = positions.len();
        let seq = positions.first().map_or(0, Vec::len);
        if positions.iter().any(|p| p.len() != seq) {
            return Err(Error::Input("position rows differ in length".into()));
        }
        let half = self.inv_freq.len();
        let (mut cos, mut sin) = (
            Vec::with_capacity(rows * seq * half),
            Vec::with_capacity(rows * seq * half),
        );
        for &p in positions.iter().flatten() {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let shape = (rows, seq, half);
        Ok(RopeTables {
            cos: Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            sin: Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        })
    }

    /// Tables for positions `start..start + len`, shared by every row.
    pub fn tables_for_range(
        &self,
        start: usize,
        len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<RopeTables> {
        let positions: Vec<u32> = (start..start + len).map(|p| p as u32).collect();
        self.tables(&[positions], dtype, device)
    }
}

/// Position ids from an attention mask (batch, seq) of 0/1, the way
/// transformers' `generate` derives them: the count of real tokens before
/// each one, so a left-padded row starts at 0 at its first real token.
/// Padding positions get 0 (their outputs are not used).
pub fn positions_from_mask(mask: &Tensor) -> Result<Vec<Vec<u32>>> {
    let rows = mask_rows(mask)?;
    Ok(rows
        .iter()
        .map(|row| {
            let mut seen = 0u32;
            row.iter()
                .map(|&m| {
                    if m {
                        seen += 1;
                        seen - 1
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect())
}

/// A (batch, seq) mask of any numeric dtype as booleans on the host.
pub(crate) fn mask_rows(mask: &Tensor) -> Result<Vec<Vec<bool>>> {
    if mask.rank() != 2 {
        return Err(Error::Input(format!(
            "attention mask must be (batch, seq), got {:?}",
            mask.dims()
        )));
    }
    let rows = mask.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    Ok(rows
        .into_iter()
        .map(|r| r.into_iter().map(|v| v != 0.0).collect())
        .collect())
}

/// Position ids `(batch, seq)` of an integer dtype as host rows.
pub(crate) fn position_rows(positions: &Tensor) -> Result<Vec<Vec<u32>>> {
    if positions.rank() != 2 {
        return Err(Error::Input(format!(
            "position ids must be (batch, seq), got {:?}",
            positions.dims()
        )));
    }
    Ok(positions.to_dtype(DType::U32)?.to_vec2::<u32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_skip_left_padding() {
        let mask = Tensor::new(&[[0u32, 0, 1, 1], [1, 1, 1, 0]], &Device::Cpu).unwrap();
        assert_eq!(
            positions_from_mask(&mask).unwrap(),
            vec![vec![0, 0, 0, 1], vec![0, 1, 2, 0]]
        );
    }

    #[test]
    fn position_zero_is_identity() {
        let t = RotaryEmbedding::new(8, 1e4)
            .tables_for_range(0, 2, DType::F32, &Device::Cpu)
            .unwrap();
        let cos = t.cos.to_vec3::<f32>().unwrap();
        assert_eq!(cos[0][0], vec![1.0; 4]);
        assert_eq!(t.sin.to_vec3::<f32>().unwrap()[0][1][0], 1f32.sin());
    }
}
