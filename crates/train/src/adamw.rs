//! AdamW with its state in the `optimizer` tag, updated in place by
//! libtorch's element-wise ops.
//!
//! Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"
//! (arXiv:1711.05101), in PyTorch's `torch.optim.AdamW` arithmetic
//! (single-tensor path), so a colo run and a PyTorch run with the same
//! gradients take the same steps:
//!
//! ```text
//! θ ← θ · (1 − lr·λ)                       decoupled weight decay
//! m ← m + (1 − β₁)(g − m)                  first moment
//! v ← v + (1 − β₂)(g² − v)                 second moment
//! θ ← θ − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//! ```
//!
//! `g` is the accumulated gradient times the clipping coefficient. Weight
//! decay applies to every parameter, as in verl's actor optimizer.
//!
//! **State in float32 whatever the parameters' kind.** Both moments are
//! float32. For bfloat16 parameters the optimizer also keeps a float32
//! master copy of each parameter (mixed-precision training's usual
//! layout): the update is applied to the master and the parameter is its
//! rounding. Without it, updates smaller than a bfloat16 ulp of the weight
//! (lr = 1e-6 against weights ≈ 1e-2: every update) would round away.
//!
//! **In place.** Every write is in place under `tch::no_grad`, so the
//! moments, masters and parameters keep their storage (their `colo-mem`
//! allocation). On the CPU the update is libtorch's fused AdamW kernel
//! (`_fused_adamw_`, what `torch.optim.AdamW(fused=True)` runs; tch does
//! not expose it, so colo-kernels' shim calls it): one vectorised pass per
//! tensor, the parameters split over the lanes, where the element-wise
//! ops below take eight passes and two temporaries on one thread (48 ms
//! against 21 ms with the bf16 copy of the masters, 14 ms for the fused
//! pass alone, 12.6 M parameters on one thread, BENCHMARKS.md). Like `clip_grad_norm_` in PyTorch, the fused
//! kernel leaves the clipped gradient in the accumulator (the GPU path
//! clips in place too). On a GPU, where the fused kernel has not been run
//! yet, the update is those element-wise ops (`lerp_`, `mul_`, `addcdiv_`,
//! `copy_`), with two parameter-sized temporaries (`g²` and the
//! denominator) that the caller allocates in its activations region.

use std::sync::Arc;

use colo_kernels::{fused_adamw, AdamWStep};
use colo_mem::{tags, Pool};
use tch::{Device, Kind, Tensor};

use crate::buffers::{copy_in, done, zeros_in};
use crate::{param_lanes, Result};

/// Validated AdamW hyper-parameters (see [`crate::OptimConfig`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// The float32 state of one parameter, shaped like it.
#[derive(Debug)]
pub(crate) struct Moments {
    pub(crate) exp_avg: Tensor,
    pub(crate) exp_avg_sq: Tensor,
    /// The float32 weights of a parameter of another kind.
    pub(crate) master: Option<Tensor>,
}

/// The optimizer state: moments per parameter (in the parameters' order)
/// and the number of updates taken.
#[derive(Debug)]
pub struct AdamW {
    pub(crate) hp: AdamWParams,
    pub(crate) moments: Vec<Moments>,
    /// Updates taken so far (PyTorch's `state["step"]`).
    pub(crate) t: u64,
}

impl AdamW {
    /// Zero moments for `params` (and float32 masters of the ones that
    /// are not float32), allocated in the `optimizer` tag.
    pub(crate) fn new(pool: &Arc<Pool>, hp: AdamWParams, params: &[Tensor]) -> Result<Self> {
        let moments = params
            .iter()
            .map(|p| {
                let (size, dev) = (p.size(), p.device());
                Ok(Moments {
                    exp_avg: zeros_in(pool, tags::OPTIMIZER, &size, Kind::Float, dev)?,
                    exp_avg_sq: zeros_in(pool, tags::OPTIMIZER, &size, Kind::Float, dev)?,
                    master: (p.kind() != Kind::Float)
                        .then(|| copy_in(pool, tags::OPTIMIZER, p, Kind::Float, dev, false))
                        .transpose()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(AdamW { hp, moments, t: 0 })
    }

    /// Updates taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.t
    }

    /// Bytes of the state (moments and masters).
    pub(crate) fn bytes(&self) -> u64 {
        let n = |t: &Tensor| (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        self.moments
            .iter()
            .map(|m| n(&m.exp_avg) + n(&m.exp_avg_sq) + m.master.as_ref().map_or(0, n))
            .sum()
    }

    /// One update of every parameter in place. `grads[i]` is parameter
    /// `i`'s accumulated gradient; the gradient used is
    /// `grad_scale · grads[i]` (the clipping coefficient).
    ///
    /// On the CPU: libtorch's fused AdamW, the parameters split over
    /// `lanes` threads ([`crate::param_lanes`]). Elsewhere: tensor ops on
    /// the calling thread (the fused kernel has not run on a GPU yet).
    pub(crate) fn step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        lr: f64,
        grad_scale: f64,
        lanes: usize,
    ) -> Result<()> {
        self.t += 1;
        if params.first().is_some_and(|p| p.device() == Device::Cpu) {
            return self.fused_step(params, grads, lr, grad_scale, lanes);
        }
        let hp = self.hp;
        let t = self.t as i32;
        let step_size = lr / (1.0 - hp.beta1.powi(t));
        let bc2_sqrt = (1.0 - hp.beta2.powi(t)).sqrt();
        let _no_grad = tch::no_grad_guard();
        for ((p, g), mo) in params.iter().zip(grads).zip(&self.moments) {
            // Clipped in place, as on the CPU (and as PyTorch's clip_grad_norm_).
            let g = g.shallow_clone();
            if grad_scale != 1.0 {
                done(g.shallow_clone().f_mul_scalar_(grad_scale))?;
            }
            let mut w = mo.master.as_ref().unwrap_or(p).shallow_clone();
            done(w.f_mul_scalar_(1.0 - lr * hp.weight_decay))?;
            done(mo.exp_avg.shallow_clone().f_lerp_(&g, 1.0 - hp.beta1))?;
            let mut v = mo.exp_avg_sq.shallow_clone();
            done(v.f_lerp_(&g.f_square()?, 1.0 - hp.beta2))?;
            // −(√v / √(1 − β₂ᵗ) + ε) / step_size, so that one addcdiv_
            // (which has no scale argument in tch) applies the step.
            let mut denom = v.f_sqrt()?;
            done(denom.f_mul_scalar_(-1.0 / (bc2_sqrt * step_size)))?;
            done(denom.f_add_scalar_(-hp.eps / step_size))?;
            done(w.f_addcdiv_(&mo.exp_avg, &denom))?;
            if mo.master.is_some() {
                p.shallow_clone().f_copy_(&w)?;
            }
        }
        Ok(())
    }

    /// [`AdamW::step`] on the CPU: each lane updates its parameters' f32
    /// copies (the masters, or the parameters themselves) in one fused
    /// pass, then copies masters into their bf16 parameters.
    fn fused_step(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        lr: f64,
        grad_coef: f64,
        lanes: usize,
    ) -> Result<()> {
        let s = AdamWStep {
            step: self.t,
            lr,
            beta1: self.hp.beta1,
            beta2: self.hp.beta2,
            weight_decay: self.hp.weight_decay,
            eps: self.hp.eps,
            grad_coef,
        };
        param_lanes::run(params, lanes, |idx| {
            let take = |ts: &mut Vec<Tensor>, t: &Tensor| ts.push(t.shallow_clone());
            let (mut w, mut g, mut m, mut v, mut copies) = (vec![], vec![], vec![], vec![], vec![]);
            for &i in idx {
                let mo = &self.moments[i];
                take(&mut w, mo.master.as_ref().unwrap_or(&params[i]));
                take(&mut g, &grads[i]);
                take(&mut m, &mo.exp_avg);
                take(&mut v, &mo.exp_avg_sq);
                if let Some(master) = &mo.master {
                    copies.push((params[i].shallow_clone(), master.shallow_clone()));
                }
            }
            Box::new(move || {
                fused_adamw(&w, &g, &m, &v, &s)?;
                for (mut p, master) in copies {
                    p.f_copy_(&master)?;
                }
                Ok(())
            })
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use colo_mem::PoolConfig;

    /// PyTorch's formulas in f64, one element.
    fn expected(x: f64, g: f64, t: i32, m: &mut f64, v: &mut f64) -> f64 {
        let x = x * (1.0 - 0.01 * 0.1);
        *m = 0.9 * *m + 0.1 * g;
        *v = 0.999 * *v + 0.001 * g * g;
        let denom = v.sqrt() / (1.0 - 0.999f64.powi(t)).sqrt() + 1e-8;
        x - 0.01 / (1.0 - 0.9f64.powi(t)) * *m / denom
    }

    /// Two steps against values computed by hand with PyTorch's formulas,
    /// for float32 parameters and for bfloat16 ones with a float32 master.
    #[test]
    fn matches_pytorch_adamw_arithmetic() {
        let pool = Pool::host(PoolConfig::default()).unwrap();
        let hp = AdamWParams {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        for kind in [Kind::Float, Kind::BFloat16] {
            let p = Tensor::from_slice(&[1.0f32, -2.0]).to_kind(kind);
            let addr = p.data_ptr();
            let g = Tensor::from_slice(&[0.5f32, 0.25]);
            let mut opt = AdamW::new(&pool, hp, std::slice::from_ref(&p)).unwrap();
            assert_eq!(opt.moments[0].master.is_some(), kind == Kind::BFloat16);
            let (mut m, mut v) = ([0.0; 2], [0.0; 2]);
            let mut want = [1.0f64, -2.0];
            let gs = [0.5, 0.25];
            // Step 1 (m̂ = g, v̂ = g², so the step is lr·sign(g) up to ε),
            // then step 2 with a clipping coefficient of one half.
            for (t, coef) in [(1, 1.0), (2, 0.5)] {
                opt.step(
                    std::slice::from_ref(&p),
                    std::slice::from_ref(&g),
                    0.01,
                    coef,
                    2,
                )
                .unwrap();
                for i in 0..2 {
                    want[i] = expected(want[i], gs[i] * coef, t, &mut m[i], &mut v[i]);
                }
                let w = opt.moments[0].master.as_ref().unwrap_or(&p);
                let got = Vec::<f32>::try_from(&w.to_kind(Kind::Float)).unwrap();
                for i in 0..2 {
                    assert!(
                        (got[i] as f64 - want[i]).abs() < 1e-6,
                        "{kind:?}: {got:?} vs {want:?}"
                    );
                }
                // The parameter is the master's rounding.
                let rounded = w.to_kind(kind);
                assert!(p.equal(&rounded), "{kind:?}");
            }
            assert_eq!(p.data_ptr(), addr, "the update moved the parameter");
            assert_eq!(opt.steps_taken(), 2);
        }
    }
}
