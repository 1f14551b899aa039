//! A fused, differentiable `log p(target | logits)`: the loss path's one
//! pass over the (batch, len, vocab) logits instead of a dozen.
//!
//! The composition in `colo_model::loss::token_logprobs` (max, subtract,
//! exp, sum, log, gather) is correct but costs about six passes over the
//! logits forward and, through candle's autograd, as many more backward,
//! each allocating a logits-sized buffer; at a vocabulary of a few thousand
//! and more, that is a visible share of a training step. Here the forward
//! reads each row twice (max, then Σ exp) and writes one float; the
//! backward writes the logits' gradient in one pass,
//! `∂logits[j] = g · (1[j = target] − exp(logits[j] − lse))`, recovering
//! the log-sum-exp from the forward's result (`lse = logits[target] − logp`)
//! instead of recomputing it.

use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor};

use crate::Result;

/// `log p(targets[b, t] | logits[b, t])`: logits (batch, len, vocab)
/// float32 on the CPU, targets (batch, len) u32 → (batch, len),
/// differentiable in `logits`. Other devices or dtypes use colo-model's
/// composition.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let fast =
        logits.device().is_cpu() && logits.dtype() == DType::F32 && targets.dtype() == DType::U32;
    if !fast {
        return Ok(colo_model::loss::token_logprobs(logits, targets)?);
    }
    Ok(logits
        .contiguous()?
        .apply_op2(&targets.contiguous()?, TokenLogprobs)?)
}

fn slice<'a, T: candle_core::WithDType>(
    s: &'a CpuStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => bail!("token_logprobs: {what} must be contiguous"),
    }
}

/// Runs `f(first_row, rows_out)` over chunks of `out` (one element per
/// row of `row_len` inputs), on scoped threads when the work is large.
fn par_rows<T: Send>(
    out: &mut [T],
    per_row: usize,
    row_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let rows = out.len() / per_row.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = if rows * row_len < (1 << 20) {
        1
    } else {
        threads.min(rows)
    };
    if threads <= 1 {
        return f(0, out);
    }
    let chunk = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (i, part) in out.chunks_mut(chunk * per_row).enumerate() {
            let f = &f;
            s.spawn(move || f(i * chunk, part));
        }
    });
}

struct TokenLogprobs;

fn check(l1: &Layout, l2: &Layout) -> candle_core::Result<(usize, usize, usize)> {
    let (b, t, v) = l1.shape().dims3()?;
    if l2.dims() != [b, t] {
        bail!(
            "token_logprobs: targets {:?} do not fit logits {:?}",
            l2.dims(),
            l1.dims()
        );
    }
    Ok((b, t, v))
}

impl CustomOp2 for TokenLogprobs {
    fn name(&self) -> &'static str {
        "colo-token-logprobs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, t, v) = check(l1, l2)?;
        let x = slice::<f32>(s1, l1, "logits")?;
        let tgt = slice::<u32>(s2, l2, "targets")?;
        if let Some(bad) = tgt.iter().find(|&&k| k as usize >= v) {
            bail!("token_logprobs: target {bad} is outside the vocabulary of {v}");
        }
        let mut out = vec![0f32; b * t];
        par_rows(&mut out, 1, v, |first, part| {
            for (i, o) in part.iter_mut().enumerate() {
                let r = first + i;
                let row = &x[r * v..(r + 1) * v];
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = row.iter().map(|&z| (z - m).exp()).sum();
                *o = row[tgt[r] as usize] - m - sum.ln();
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((b, t))))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        res: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let lse_in = Tensor::stack(&[res, &g.contiguous()?], 0)?; // (2, b, t)
        let gx = logits.apply_op3_no_bwd(targets, &lse_in, &TokenLogprobsBwd)?;
        Ok((Some(gx), None))
    }
}

/// `(logits, targets, [logp; g]) → ∂logits`.
struct TokenLogprobsBwd;

impl CustomOp3 for TokenLogprobsBwd {
    fn name(&self) -> &'static str {
        "colo-token-logprobs-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, t, v) = check(l1, l2)?;
        let x = slice::<f32>(s1, l1, "logits")?;
        let tgt = slice::<u32>(s2, l2, "targets")?;
        let lg = slice::<f32>(s3, l3, "gradient")?;
        let (logp, g) = lg.split_at(b * t);
        let mut out = vec![0f32; b * t * v];
        par_rows(&mut out, v, v, |first, part| {
            for (i, o) in part.chunks_exact_mut(v).enumerate() {
                let r = first + i;
                let row = &x[r * v..(r + 1) * v];
                let k = tgt[r] as usize;
                let lse = row[k] - logp[r];
                let gr = g[r];
                for (o, &z) in o.iter_mut().zip(row) {
                    *o = -gr * (z - lse).exp();
                }
                o[k] += gr;
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn matches_the_composition_in_value_and_gradient() {
        let dev = Device::Cpu;
        // Large enough to take the threaded path too.
        for (b, t, v) in [(2, 3, 7), (4, 64, 5000)] {
            let x = Var::randn(0f32, 3.0, (b, t, v), &dev).unwrap();
            let ids: Vec<u32> = (0..b * t).map(|i| (i * 7919 % v) as u32).collect();
            let tg = Tensor::from_vec(ids, (b, t), &dev).unwrap();
            let probe = Tensor::randn(0f32, 1.0, (b, t), &dev).unwrap();
            let fast = token_logprobs(x.as_tensor(), &tg).unwrap();
            let slow = colo_model::loss::token_logprobs(x.as_tensor(), &tg).unwrap();
            let diff = (&fast - &slow)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-4, "forward differs by {diff}");
            let gf = (fast * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let gs = (slow * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let (gf, gs) = (
                gf.get(x.as_tensor()).unwrap(),
                gs.get(x.as_tensor()).unwrap(),
            );
            let diff = (gf - gs)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            // The inputs are random (std 3, 5000 classes) and the two paths
            // sum in different orders: f32 rounding reaches ~1e-5 on some
            // draws, a wrong gradient is off by O(0.1) or more.
            assert!(diff < 1e-4, "gradient differs by {diff}");
        }
    }

    #[test]
    fn out_of_vocabulary_target_is_an_error() {
        let x = Tensor::zeros((1, 1, 4), DType::F32, &Device::Cpu).unwrap();
        let t = Tensor::new(&[[4u32]], &Device::Cpu).unwrap();
        assert!(token_logprobs(&x, &t)
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary"));
    }
}
