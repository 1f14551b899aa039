//! The pieces every layer of [`crate::model`] shares: linear projections,
//! RMSNorm, rotary position embedding (tables and position ids) and the
//! additive attention masks. Re-exported as [`crate::rope`] and
//! [`crate::mask`] under their former paths.
//!
//! Each is a thin layer over one libtorch op with its own backward
//! (`linear`, `rms_norm`), or a few element-wise ops (RoPE) — autograd
//! differentiates all of them. Where colo-kernels has a faster kernel for
//! the arguments (its `_fits` says so) the layer runs it instead: a
//! decode step's projections of a few rows ([`linear`]), RMSNorm, RoPE.

use tch::{Device, Kind, Tensor};

use crate::lora::{Adapter, StackedAdapter};
use crate::weights::Weights;
use crate::{Error, Result};

// ---------------------------------------------------------------- Linear

/// `x · wᵀ + b`: libtorch's `linear` (`addmm`), or for a few rows of
/// bfloat16 without autograd (a decode step's projections and LM head on
/// the CPU) colo-kernels' `skinny_linear`, which reads `w` once in its own
/// layout where libtorch's matmul repacks it on every call: 1.5–2.3× the
/// speed at 1–16 rows of Qwen2.5-0.5B's weights (`colo-kernels`' example
/// `skinny_linear`). The two differ by at most a bfloat16 rounding.
///
/// Inside a wide pass (`crate::lanes::run_wide`) the kernel's columns (rows
/// of `w`) are split over the pass's lanes, so that each weight is read
/// once by one core.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    if !colo_kernels::skinny_linear_fits(x, w, b) {
        return Ok(x.f_linear(w, b)?);
    }
    let out = usize::try_from(w.size()[0]).unwrap_or(0);
    // Fewer columns than this each are not worth a hand-off to a lane.
    const MIN_COLUMNS: usize = 256;
    let lanes = crate::lanes::wide().min(out / MIN_COLUMNS);
    if lanes <= 1 {
        return Ok(colo_kernels::skinny_linear(x, w, b)?);
    }
    let work: Vec<_> = crate::lanes::split(0, out, lanes)
        .into_iter()
        .map(|(start, len)| {
            let (start, len) = (start as i64, len as i64);
            let x = x.shallow_clone();
            let w = w.narrow(0, start, len);
            let b = b.map(|b| b.narrow(0, start, len));
            move || colo_kernels::skinny_linear(&x, &w, b.as_ref())
        })
        .collect();
    let parts = crate::lanes::run(work)
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(Tensor::f_cat(&parts, -1)?)
}

/// `y = x Wᵀ + b`, weight stored (out, in) as in PyTorch; with a LoRA
/// adapter ([`crate::lora`]) `+ (x Aᵀ) Bᵀ · scale`, and with an inference
/// engine's stacked adapters ([`StackedAdapter`]) their low-rank paths.
#[derive(Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    lora: Option<Adapter>,
    stacked: Option<StackedAdapter>,
}

impl Clone for Linear {
    /// Shares the parameters (shallow clones).
    fn clone(&self) -> Self {
        Linear {
            weight: self.weight.shallow_clone(),
            bias: self.bias.as_ref().map(Tensor::shallow_clone),
            lora: self.lora.clone(),
            stacked: self.stacked.clone(),
        }
    }
}

impl Linear {
    /// Loads `{prefix}.weight` (out, in) and, if `bias`, `{prefix}.bias` (out).
    pub fn load(
        w: &Weights,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = w.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias = match bias {
            true => Some(w.get(&format!("{prefix}.bias"), &[out_dim])?),
            false => None,
        };
        Ok(Linear {
            weight,
            bias,
            lora: None,
            stacked: None,
        })
    }

    /// A layer over these tensors (shared, not copied).
    pub(crate) fn from_parts(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear {
            weight,
            bias,
            lora: None,
            stacked: None,
        }
    }

    /// `x`: (..., in) → (..., out), one matrix product over the flattened
    /// rows ([`linear`]), plus the adapter's low-rank path if it has one.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = linear(x, &self.weight, self.bias.as_ref())?;
        let y = match &self.lora {
            None => y,
            Some(lora) => lora.add_to(x, y)?,
        };
        match &self.stacked {
            None => Ok(y),
            Some(s) => s.add_to(x, y),
        }
    }

    /// The stacked adapters an inference engine applies at decode, if any.
    pub fn stacked_adapter(&self) -> Option<&StackedAdapter> {
        self.stacked.as_ref()
    }

    pub(crate) fn set_stacked_adapter(&mut self, stacked: Option<StackedAdapter>) {
        self.stacked = stacked;
    }

    /// The LoRA adapter, if the layer has one.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.lora.as_ref()
    }

    pub(crate) fn set_adapter(&mut self, lora: Option<Adapter>) {
        self.lora = lora;
    }

    /// The weight, (out, in).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, (out), if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        out.push((format!("{prefix}.weight"), self.weight.shallow_clone()));
        if let Some(b) = &self.bias {
            out.push((format!("{prefix}.bias"), b.shallow_clone()));
        }
    }
}

// ---------------------------------------------------------------- RMSNorm

/// Root-mean-square normalisation with a learned scale, as transformers'
/// `LlamaRMSNorm` / `Qwen2RMSNorm`: normalised in float32, cast back to the
/// input's kind, then scaled (libtorch's `rms_norm` does exactly that).
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl Clone for RmsNorm {
    /// Shares the weight.
    fn clone(&self) -> Self {
        RmsNorm {
            weight: self.weight.shallow_clone(),
            eps: self.eps,
        }
    }
}

impl RmsNorm {
    /// Loads `{prefix}.weight` (dim).
    pub fn load(w: &Weights, prefix: &str, dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: w.get(&format!("{prefix}.weight"), &[dim])?,
            eps,
        })
    }

    /// `x`: (..., dim) → same shape. On the CPU in float32 or bfloat16,
    /// colo-kernels' fused kernel (the same formula, one pass each way where
    /// libtorch's composite takes ~8 forward and ~16 backward); otherwise
    /// libtorch's `rms_norm`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if colo_kernels::rms_norm_fits(x, &self.weight) {
            return Ok(colo_kernels::rms_norm(x, &self.weight, self.eps)?);
        }
        let dim = self.weight.size()[0];
        Ok(x.f_rms_norm([dim], Some(&self.weight), self.eps)?)
    }

    /// The scale, (dim).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub(crate) fn push_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        out.push((format!("{prefix}.weight"), self.weight.shallow_clone()));
    }
}

// ---------------------------------------------------------------- RoPE

/// RoPE frequencies for one head size and base (`rope_theta`).
#[derive(Debug)]
pub struct RotaryEmbedding {
    /// `1 / theta^(2i / head_dim)` for `i < head_dim / 2`, float32 as
    /// transformers computes it, on the model's device.
    inv_freq: Tensor,
}

impl Clone for RotaryEmbedding {
    fn clone(&self) -> Self {
        RotaryEmbedding {
            inv_freq: self.inv_freq.shallow_clone(),
        }
    }
}

/// The rotation's tables for every (row, position), full head width: each
/// (batch or 1, seq, head_dim), in the model's kind, built once per forward
/// and shared across layers.
///
/// `cos` is transformers' table, each frequency's cosine twice (`cat(cos,
/// cos)`); `sin` carries `rotate_half`'s sign, `cat(−sin, sin)`, so a
/// rotation is `x · cos + swap_halves(x) · sin`: four ops where the
/// half-split form takes seven, with the same rounding (a product with a
/// negated sine is the negated product, exactly).
#[derive(Debug)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Clone for RopeTables {
    fn clone(&self) -> Self {
        RopeTables {
            cos: self.cos.shallow_clone(),
            sin: self.sin.shallow_clone(),
        }
    }
}

impl RotaryEmbedding {
    pub fn new(
        head_dim: usize,
        theta: f64,
        llama3: Option<&crate::config::Llama3Rope>,
        device: Device,
    ) -> Self {
        let mut inv_freq: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        if let Some(s) = llama3 {
            s.scale(&mut inv_freq);
        }
        RotaryEmbedding {
            inv_freq: Tensor::from_slice(&inv_freq).to_device(device),
        }
    }

    /// Tables for position ids (rows, seq) of any integer kind, computed on
    /// the device: angles in float32, then cos/sin cast to `kind`.
    pub fn tables_for_positions(&self, positions: &Tensor, kind: Kind) -> Result<RopeTables> {
        if positions.dim() != 2 {
            return Err(Error::Input(format!(
                "position ids must be (batch, seq), got {:?}",
                positions.size()
            )));
        }
        let angles = positions
            .f_to_device(self.inv_freq.device())?
            .to_kind(Kind::Float)
            .unsqueeze(-1)
            * &self.inv_freq; // (rows, seq, half)
        let (cos, sin) = (angles.cos().to_kind(kind), angles.sin().to_kind(kind));
        Ok(RopeTables {
            cos: Tensor::cat(&[&cos, &cos], -1),
            sin: Tensor::cat(&[&-sin.shallow_clone(), &sin], -1),
        })
    }

    /// Tables for explicit positions, one row per sequence.
    pub fn tables(&self, positions: &[Vec<u32>], kind: Kind) -> Result<RopeTables> {
        let seq = positions.first().map_or(0, Vec::len);
        if positions.iter().any(|p| p.len() != seq) {
            return Err(Error::Input("position rows differ in length".into()));
        }
        let flat: Vec<i64> = positions.iter().flatten().map(|&p| p as i64).collect();
        let t = Tensor::from_slice(&flat).view([positions.len() as i64, seq as i64]);
        self.tables_for_positions(&t, kind)
    }

    /// Tables for positions `start..start + len`, shared by every row.
    pub fn tables_for_range(&self, start: usize, len: usize, kind: Kind) -> Result<RopeTables> {
        let p = Tensor::arange_start(
            start as i64,
            (start + len) as i64,
            (Kind::Int64, self.inv_freq.device()),
        );
        self.tables_for_positions(&p.unsqueeze(0), kind)
    }
}

impl RopeTables {
    /// (rows, seq, head_dim) of the tables.
    pub fn dims(&self) -> Vec<i64> {
        self.cos.size()
    }

    /// Rotates `x` (batch, seq, heads, head_dim) — a projection's output
    /// viewed per head — and returns it as (batch, heads, seq, head_dim):
    /// transformers' `x · cos + rotate_half(x) · sin`, the two halves of
    /// each head being the (real, imaginary) pairs.
    ///
    /// The result's memory is (batch, seq, heads, head_dim), what the
    /// attention kernel reads as well (its output then needs no transpose
    /// copy); `heads_major` makes it contiguous (batch, heads, seq,
    /// head_dim), a copy only when seq > 1.
    ///
    /// On the CPU in float32 or bfloat16, colo-kernels' fused kernel (the same
    /// arithmetic, one pass each way, written straight into either layout);
    /// otherwise libtorch's ops.
    pub(crate) fn apply(&self, x: &Tensor, heads_major: bool) -> Result<Tensor> {
        if colo_kernels::rope_fits(x, &self.cos, &self.sin) {
            return Ok(colo_kernels::rope(x, &self.cos, &self.sin, heads_major)?);
        }
        // `split`, not two `narrow`s: its backward is one `cat`, where a
        // narrow's fills a zero tensor of x's size and copies into it.
        let half = x.size()[3] / 2;
        let halves = x.f_split(half, -1)?;
        let swapped = Tensor::f_cat(&[&halves[1], &halves[0]], -1)?;
        let out = (x * self.cos.unsqueeze(2)).f_add(&(swapped * self.sin.unsqueeze(2)))?;
        let out = out.f_transpose(1, 2)?;
        Ok(match heads_major {
            true => out.f_contiguous()?,
            false => out,
        })
    }
}

/// Position ids (batch, seq), Int64, from an attention mask of 0/1 (any
/// kind), computed on the mask's device: the count of real tokens before
/// each one, as transformers' `generate` derives them, so a left-padded row
/// starts at 0 at its first real token. Padding positions get 0.
pub fn position_ids_from_mask(mask: &Tensor) -> Result<Tensor> {
    check_mask_rank(mask)?;
    let real = mask.f_ne(0)?.to_kind(Kind::Int64);
    Ok((real.cumsum(1, Kind::Int64) - 1) * real)
}

/// [`position_ids_from_mask`] as host rows.
pub fn positions_from_mask(mask: &Tensor) -> Result<Vec<Vec<u32>>> {
    let p = position_ids_from_mask(mask)?;
    let rows: Vec<Vec<i64>> = Vec::try_from(&p.to_device(Device::Cpu))?;
    Ok(rows
        .into_iter()
        .map(|r| r.into_iter().map(|v| v as u32).collect())
        .collect())
}

fn check_mask_rank(mask: &Tensor) -> Result<()> {
    if mask.dim() != 2 {
        return Err(Error::Input(format!(
            "attention mask must be (batch, seq), got {:?}",
            mask.size()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------- masks

/// The masked value of float32 masks. A finite minimum rather than `-inf`,
/// so that a query with no visible key (a padding query in a left-padded
/// batch) gets a uniform softmax instead of NaN, as in transformers; such
/// rows' outputs are meaningless and must be ignored by the caller.
pub const MASKED: f32 = f32::MIN;

/// The masked value of a kind: its most negative finite value (float32's
/// for float32 and float64), as transformers' `torch.finfo(dtype).min`.
/// `f32::MIN` would round to `-inf` in bfloat16 and float16.
pub fn masked_value(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.389_531_389_251_535_5e38,
        _ => MASKED as f64,
    }
}

/// Causal mask for `q_len` new queries after `k_len - q_len` cached keys:
/// query `i` sees keys `0..=k_len - q_len + i`. Additive, shape (1, q_len,
/// k_len): 0 where visible, [`masked_value`] where not.
pub fn causal(q_len: usize, k_len: usize, kind: Kind, device: Device) -> Result<Tensor> {
    check_lengths(q_len, k_len)?;
    let past = (k_len - q_len) as i64;
    let full = Tensor::f_full(
        [q_len as i64, k_len as i64],
        masked_value(kind),
        (kind, device),
    )?;
    Ok(full.triu(past + 1).unsqueeze(0))
}

/// Causal mask that also hides padding keys. `key_mask`: (batch, k_len) with
/// 1 for real tokens and 0 for padding (left or right), any kind, covering
/// the cached keys and the `q_len` new ones. Additive, shape (batch, q_len,
/// k_len), on the key mask's device.
pub fn causal_padded(key_mask: &Tensor, q_len: usize, kind: Kind) -> Result<Tensor> {
    check_mask_rank(key_mask)?;
    let k_len = key_mask.size()[1] as usize;
    let padding = key_mask.f_eq(0)?.unsqueeze(1); // (batch, 1, k_len)
    Ok(causal(q_len, k_len, kind, key_mask.device())?.masked_fill(&padding, masked_value(kind)))
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

    fn rows3(t: &Tensor) -> Vec<Vec<Vec<f32>>> {
        Vec::try_from(&t.to_kind(Kind::Float)).unwrap()
    }

    /// A decode step's projection: the kernel where it fits (bfloat16, a
    /// few rows, no autograd), split by columns over a wide pass's lanes
    /// with the same bits, and libtorch's `linear` (to a rounding) where
    /// it does not fit or a gradient is wanted.
    #[test]
    fn linear_of_a_few_rows_is_the_same_split_or_not() {
        tch::manual_seed(5);
        let bf16 = |s: &[i64]| Tensor::randn(s, (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16);
        let (x, w, b) = (bf16(&[6, 1, 96]), bf16(&[1000, 96]), bf16(&[1000]));
        let one = linear(&x, &w, Some(&b)).unwrap();
        let wide = crate::lanes::run_wide(3, || linear(&x, &w, Some(&b)).unwrap());
        assert_eq!(crate::lanes::wide(), 1, "the wide pass ended");
        assert!(one.equal(&wide), "the column split changed the result");
        assert_eq!(wide.size(), [6, 1, 1000]);
        let libtorch = x.linear(&w, Some(&b)).to_kind(Kind::Float);
        let diff = (one.to_kind(Kind::Float) - &libtorch)
            .abs()
            .max()
            .double_value(&[]);
        let scale = libtorch.abs().max().double_value(&[]);
        assert!(diff <= scale / 128.0, "{diff} against {scale}");
        // With a gradient wanted, libtorch's linear and its graph.
        let leaf = w.to_kind(Kind::Float).set_requires_grad(true);
        let y = linear(&x.to_kind(Kind::Float), &leaf, None).unwrap();
        assert!(y.requires_grad());
    }

    #[test]
    fn positions_skip_left_padding() {
        let mask = Tensor::from_slice2(&[[0i64, 0, 1, 1], [1, 1, 1, 0]]);
        assert_eq!(
            positions_from_mask(&mask).unwrap(),
            vec![vec![0, 0, 0, 1], vec![0, 1, 2, 0]]
        );
        let bool_mask = mask.ne(0);
        assert_eq!(
            positions_from_mask(&bool_mask).unwrap(),
            positions_from_mask(&mask).unwrap()
        );
    }

    #[test]
    fn position_zero_is_identity() {
        let t = RotaryEmbedding::new(8, 1e4, None, Device::Cpu)
            .tables_for_range(0, 2, Kind::Float)
            .unwrap();
        assert_eq!(t.dims(), [1, 2, 8]);
        assert_eq!(rows3(&t.cos)[0][0], vec![1.0; 8]);
        assert_eq!(rows3(&t.sin)[0][1][0], -(1f32.sin()));
        assert_eq!(rows3(&t.sin)[0][1][4], 1f32.sin());
    }

    /// The rotation is transformers' `q * cos + rotate_half(q) * sin` with
    /// its full-width tables (`cat(cos, cos)`, `cat(sin, sin)`), in both
    /// memory layouts.
    #[test]
    fn rope_matches_rotate_half_and_is_contiguous() {
        let (b, s, h, d) = (2, 5, 3, 8);
        let rope = RotaryEmbedding::new(d as usize, 1e4, None, Device::Cpu)
            .tables_for_range(3, s as usize, Kind::Float)
            .unwrap();
        let x = Tensor::randn([b, s, h, d], (Kind::Float, Device::Cpu));
        let got = rope.apply(&x, true).unwrap();
        assert_eq!(got.size(), [b, h, s, d]);
        assert!(got.is_contiguous());
        let seq_major = rope.apply(&x, false).unwrap();
        assert!(seq_major.transpose(1, 2).is_contiguous());
        assert!(seq_major.equal(&got));
        let xt = x.transpose(1, 2);
        let (cos, sin) = (
            rope.cos.narrow(-1, 0, d / 2),
            rope.sin.narrow(-1, d / 2, d / 2),
        );
        let cos = Tensor::cat(&[&cos, &cos], -1).unsqueeze(1);
        let sin = Tensor::cat(&[&sin, &sin], -1).unsqueeze(1);
        let rotated = Tensor::cat(&[-xt.narrow(-1, d / 2, d / 2), xt.narrow(-1, 0, d / 2)], -1);
        let want = &xt * cos + rotated * sin;
        assert!(
            got.equal(&want),
            "the same ops in the same order round alike"
        );
    }

    /// Tables for another length than x's: colo-kernels' error, naming
    /// the kernel and both shapes.
    #[test]
    fn rope_tables_that_do_not_fit_are_a_kernel_error() {
        let rope = RotaryEmbedding::new(8, 1e4, None, Device::Cpu)
            .tables_for_range(0, 4, Kind::Float)
            .unwrap();
        let x = Tensor::zeros([2, 5, 3, 8], (Kind::Float, Device::Cpu));
        let err = rope.apply(&x, true).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Kernel(colo_kernels::Error::Refused { kernel: "rope", .. })
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "rope kernel: tables [1, 4, 8] and [1, 4, 8] do not fit x [2, 5, 3, 8]"
        );
    }

    #[test]
    fn causal_with_past_and_padding() {
        let c = rows3(&causal(2, 3, Kind::Float, Device::Cpu).unwrap());
        assert_eq!(c[0], vec![vec![0.0, 0.0, MASKED], vec![0.0, 0.0, 0.0]]);
        let keys = Tensor::from_slice2(&[[0u8, 1, 1]]);
        let p = rows3(&causal_padded(&keys, 3, Kind::Float).unwrap());
        assert_eq!(p[0][2], vec![MASKED, 0.0, 0.0]);
        assert_eq!(p[0][0], vec![MASKED; 3]);
        assert!(causal(3, 2, Kind::Float, Device::Cpu).is_err());
    }

    /// bfloat16 masks stay finite (f32::MIN would round to -inf).
    #[test]
    fn low_precision_masks_are_finite() {
        for kind in [Kind::BFloat16, Kind::Half] {
            let m = causal(2, 2, kind, Device::Cpu).unwrap();
            assert_eq!(m.kind(), kind);
            let min = f64::try_from(m.to_kind(Kind::Float).min()).unwrap();
            assert!(min.is_finite() && min < -6e4, "{kind:?}: {min}");
        }
    }
}
