//! Fused operations with a backward pass: RMSNorm, scaled softmax over the
//! last dimension, and rotary position embedding.
//!
//! candle-nn has fused versions of these, but they define no backward and so
//! silently cut the gradient. Each op here has a float32 CPU kernel (one pass
//! over memory instead of the five or six of a composition of tensor ops) and
//! a `bwd` written with ordinary tensor ops. On other devices or dtypes each
//! function falls back to its `*_reference` composition, which has a backward
//! through candle's autograd and is also what the kernels are tested against.

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D,
};

/// The slice a contiguous layout covers.
fn contiguous_f32<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&s.as_slice::<f32>()?[start..end]),
        None => bail!("{op}: input must be contiguous"),
    }
}

fn fast_path(xs: &[&Tensor]) -> bool {
    xs.iter()
        .all(|x| x.device().is_cpu() && x.dtype() == DType::F32)
}

// ---------------------------------------------------------------- RMSNorm

/// `weight * x / sqrt(mean(x², last dim) + eps)`, as transformers'
/// `LlamaRMSNorm` / `Qwen2RMSNorm` compute it. `x`: (..., hidden),
/// `weight`: (hidden).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if fast_path(&[x, weight]) {
        x.contiguous()?
            .apply_op2(&weight.contiguous()?, RmsNorm { eps: eps as f32 })
    } else {
        rms_norm_reference(x, weight, eps)
    }
}

/// [`rms_norm`] composed of candle tensor ops.
pub fn rms_norm_reference(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let r = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(weight)
}

struct RmsNorm {
    eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "colo-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s1, l1, "rms_norm")?;
        let w = contiguous_f32(s2, l2, "rms_norm")?;
        let d = l1.dims().last().copied().unwrap_or(1);
        if w.len() != d {
            bail!(
                "rms_norm: weight has {} elements, hidden size is {d}",
                w.len()
            );
        }
        let mut out = vec![0f32; x.len()];
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ss: f32 = xr.iter().map(|v| v * v).sum();
            let r = 1.0 / (ss / d as f32 + self.eps).sqrt();
            for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
                *o = wv * (xv * r);
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    /// With `r = 1/rms(x)` and `x̂ = x·r`: `∂x = r·(g⊙w − x̂·mean(g⊙w⊙x̂))`,
    /// `∂w = Σ_rows g⊙x̂`.
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let d = x.dim(D::Minus1)?;
        let r = (x.sqr()?.mean_keepdim(D::Minus1)? + self.eps as f64)?
            .sqrt()?
            .recip()?;
        let xhat = x.broadcast_mul(&r)?;
        let gw = g.broadcast_mul(w)?;
        let dot = (&gw * &xhat)?.mean_keepdim(D::Minus1)?;
        let gx = (gw - xhat.broadcast_mul(&dot)?)?.broadcast_mul(&r)?;
        let g_weight = (g * xhat)?.reshape(((), d))?.sum(0)?;
        Ok((Some(gx), Some(g_weight)))
    }
}

// ---------------------------------------------------------------- softmax

/// `softmax(scale · x)` over the last dimension. Attention folds its
/// `1/sqrt(head_dim)` in here instead of spending a pass over the scores.
pub fn scaled_softmax(x: &Tensor, scale: f64) -> Result<Tensor> {
    if fast_path(&[x]) {
        x.contiguous()?.apply_op1(ScaledSoftmax {
            scale: scale as f32,
        })
    } else {
        scaled_softmax_reference(x, scale)
    }
}

/// [`scaled_softmax`] composed of candle tensor ops.
pub fn scaled_softmax_reference(x: &Tensor, scale: f64) -> Result<Tensor> {
    let x = (x * scale)?;
    let e = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

struct ScaledSoftmax {
    scale: f32,
}

impl CustomOp1 for ScaledSoftmax {
    fn name(&self) -> &'static str {
        "colo-scaled-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "scaled_softmax")?;
        let d = l.dims().last().copied().unwrap_or(1);
        let mut out = vec![0f32; x.len()];
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let m = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (o, &v) in or.iter_mut().zip(xr) {
                *o = ((v - m) * self.scale).exp();
                sum += *o;
            }
            let inv = 1.0 / sum;
            or.iter_mut().for_each(|o| *o *= inv);
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    /// `∂x = scale · y ⊙ (g − Σ g⊙y)`.
    fn bwd(&self, _x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let dot = (g * y)?.sum_keepdim(D::Minus1)?;
        Ok(Some(
            (g.broadcast_sub(&dot)? * y)?.affine(self.scale as f64, 0.0)?,
        ))
    }
}

// ---------------------------------------------------------------- RoPE

/// Rotary position embedding in the "rotate half" layout transformers uses:
/// `x·cos + rotate_half(x)·sin`.
///
/// `x`: (batch, heads, seq, head_dim), any strides with a unit last stride —
/// in particular the transposed view of a (batch, seq, heads, head_dim)
/// projection, so the transpose copy is fused into this pass. `cos`, `sin`:
/// (batch or 1, seq, head_dim / 2). The result is contiguous.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if fast_path(&[x, cos, sin]) {
        let x = if x.stride().last() == Some(&1) {
            x.clone()
        } else {
            x.contiguous()?
        };
        x.apply_op3(&cos.contiguous()?, &sin.contiguous()?, Rope)
    } else {
        rope_reference(x, cos, sin)
    }
}

/// [`rope`] composed of candle tensor ops.
pub fn rope_reference(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let cos = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
    let sin = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
}

struct Rope;

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "colo-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h, s, d) = l1.shape().dims4()?;
        let st = l1.stride();
        let (cb, cs, half) = l2.shape().dims3()?;
        if st[3] != 1
            || cs != s
            || 2 * half != d
            || (cb != 1 && cb != b)
            || l3.shape() != l2.shape()
        {
            bail!(
                "rope: x {:?} (strides {st:?}) does not fit cos/sin {:?}",
                l1.dims(),
                l2.dims()
            );
        }
        let x = s1.as_slice::<f32>()?;
        let cos = contiguous_f32(s2, l2, "rope")?;
        let sin = contiguous_f32(s3, l3, "rope")?;
        let mut out = vec![0f32; b * h * s * d];
        for (row, o) in out.chunks_exact_mut(d).enumerate() {
            let (si, hi, bi) = (row % s, (row / s) % h, row / (s * h));
            let xi = l1.start_offset() + bi * st[0] + hi * st[1] + si * st[2];
            let (x1, x2) = x[xi..xi + d].split_at(half);
            let ci = ((if cb == 1 { 0 } else { bi }) * s + si) * half;
            let (c, sn) = (&cos[ci..ci + half], &sin[ci..ci + half]);
            let (o1, o2) = o.split_at_mut(half);
            for j in 0..half {
                o1[j] = x1[j] * c[j] - x2[j] * sn[j];
                o2[j] = x2[j] * c[j] + x1[j] * sn[j];
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((b, h, s, d))))
    }

    /// RoPE is a rotation per pair; its transpose is the rotation by the
    /// opposite angle: `∂x = rope(g, cos, −sin)`. The tables are constants.
    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = g.contiguous()?;
        let gx = g.apply_op3_no_bwd(cos, &sin.neg()?, &Rope)?;
        Ok((Some(gx), None, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    fn randn(shape: &[usize]) -> Var {
        Var::randn(0f32, 1f32, shape, &Device::Cpu).unwrap()
    }

    /// Forward values and the gradients of `sum(out * probe)` agree between
    /// the kernel and the reference composition.
    fn check(
        inputs: &[&Var],
        fast: impl Fn(&[&Tensor]) -> Result<Tensor>,
        reference: impl Fn(&[&Tensor]) -> Result<Tensor>,
    ) {
        let ts: Vec<&Tensor> = inputs.iter().map(|v| v.as_tensor()).collect();
        let (a, b) = (fast(&ts).unwrap(), reference(&ts).unwrap());
        assert!(
            max_diff(&a, &b) < 1e-5,
            "forward differs by {}",
            max_diff(&a, &b)
        );
        let probe = Tensor::randn(0f32, 1f32, a.shape(), &Device::Cpu).unwrap();
        let ga = (a * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (b * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for v in inputs {
            let (x, y) = (ga.get(v.as_tensor()), gb.get(v.as_tensor()));
            let (x, y) = (
                x.expect("kernel gave no gradient"),
                y.expect("reference gave no gradient"),
            );
            assert!(
                max_diff(x, y) < 1e-4,
                "gradient differs by {}",
                max_diff(x, y)
            );
        }
    }

    #[test]
    fn rms_norm_matches_reference() {
        let (x, w) = (randn(&[2, 3, 8]), randn(&[8]));
        check(
            &[&x, &w],
            |t| rms_norm(t[0], t[1], 1e-6),
            |t| rms_norm_reference(t[0], t[1], 1e-6),
        );
    }

    #[test]
    fn scaled_softmax_matches_reference() {
        let x = randn(&[2, 3, 5, 7]);
        check(
            &[&x],
            |t| scaled_softmax(t[0], 0.3),
            |t| scaled_softmax_reference(t[0], 0.3),
        );
    }

    #[test]
    fn rope_matches_reference_on_transposed_view() {
        // (batch, seq, heads, head_dim) viewed as (batch, heads, seq, head_dim).
        let x = randn(&[2, 5, 3, 8]);
        let angles = Tensor::randn(0f32, 1f32, (2, 5, 4), &Device::Cpu).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        check(
            &[&x],
            |t| rope(&t[0].transpose(1, 2)?, &cos, &sin),
            |t| rope_reference(&t[0].transpose(1, 2)?, &cos, &sin),
        );
    }

    #[test]
    fn fully_masked_softmax_row_is_finite() {
        let x = Tensor::new(&[[f32::MIN, f32::MIN], [0.0, f32::MIN]], &Device::Cpu).unwrap();
        let y = scaled_softmax(&x, 0.5).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(y, vec![vec![0.5, 0.5], vec![1.0, 0.0]]);
    }
}
