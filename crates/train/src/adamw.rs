//! AdamW written for colo: float32 moments in the `optimizer` tag, updated
//! in place together with the parameters in one pass per tensor.
//!
//! Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"
//! (arXiv:1711.05101), in PyTorch's `torch.optim.AdamW` arithmetic
//! (single-tensor path), so a colo run and a PyTorch run with the same
//! gradients take the same steps:
//!
//! ```text
//! θ ← θ · (1 − lr·λ)                       decoupled weight decay
//! m ← m + (1 − β₁)(g − m)                  first moment
//! v ← β₂·v + (1 − β₂)·g²                   second moment
//! θ ← θ − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//! ```
//!
//! `g` is the accumulated gradient times the clipping coefficient, which is
//! folded into this pass instead of rescaling the gradients first.
//! Weight decay applies to every parameter, as in verl's actor optimizer.

use std::sync::Arc;

use candle_core::Tensor;
use colo_mem::{tags, Pool};

use crate::buffers::{read_f32, write_f32, zeros_in};
use crate::Result;

/// Validated AdamW hyper-parameters (see [`crate::OptimConfig`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// First and second moments of one parameter, shaped like it.
#[derive(Debug)]
pub(crate) struct Moments {
    pub(crate) exp_avg: Tensor,
    pub(crate) exp_avg_sq: Tensor,
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
    /// Zero moments for `params`, allocated in the `optimizer` tag.
    pub(crate) fn new(pool: &Arc<Pool>, hp: AdamWParams, params: &[Tensor]) -> Result<Self> {
        let moments = params
            .iter()
            .map(|p| {
                Ok(Moments {
                    exp_avg: zeros_in(pool, tags::OPTIMIZER, p.shape())?,
                    exp_avg_sq: zeros_in(pool, tags::OPTIMIZER, p.shape())?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(AdamW { hp, moments, t: 0 })
    }

    /// Updates taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.t
    }

    /// One update of every parameter in place. `grads[i]` is parameter
    /// `i`'s accumulated gradient; the gradient used is
    /// `grad_scale · grads[i]` (the clipping coefficient).
    pub(crate) fn step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        lr: f64,
        grad_scale: f64,
    ) -> Result<()> {
        self.t += 1;
        let k = Kernel::new(&self.hp, lr, self.t, grad_scale);
        for ((p, g), mo) in params.iter().zip(grads).zip(&self.moments) {
            write_f32(p, |p| {
                write_f32(&mo.exp_avg, |m| {
                    write_f32(&mo.exp_avg_sq, |v| read_f32(g, |g| k.apply(p, m, v, g)))
                })
            })????;
        }
        Ok(())
    }
}

/// The per-element update with its constants resolved.
struct Kernel {
    decay: f32,
    b2: f32,
    one_minus_b1: f32,
    one_minus_b2: f32,
    step_size: f32,
    bc2_sqrt: f32,
    eps: f32,
    grad_scale: f32,
}

impl Kernel {
    fn new(hp: &AdamWParams, lr: f64, t: u64, grad_scale: f64) -> Self {
        let bc1 = 1.0 - hp.beta1.powi(t as i32);
        let bc2 = 1.0 - hp.beta2.powi(t as i32);
        Kernel {
            decay: (1.0 - lr * hp.weight_decay) as f32,
            b2: hp.beta2 as f32,
            one_minus_b1: (1.0 - hp.beta1) as f32,
            one_minus_b2: (1.0 - hp.beta2) as f32,
            step_size: (lr / bc1) as f32,
            bc2_sqrt: bc2.sqrt() as f32,
            eps: hp.eps as f32,
            grad_scale: grad_scale as f32,
        }
    }

    fn apply(&self, p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
        debug_assert!(p.len() == m.len() && m.len() == v.len() && v.len() == g.len());
        for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
            let g = g * self.grad_scale;
            *p *= self.decay;
            *m += self.one_minus_b1 * (g - *m);
            *v = self.b2 * *v + self.one_minus_b2 * g * g;
            let denom = v.sqrt() / self.bc2_sqrt + self.eps;
            *p -= self.step_size * (*m / denom);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use colo_mem::PoolConfig;

    /// Two steps against values computed by hand with PyTorch's formulas.
    #[test]
    fn matches_pytorch_adamw_arithmetic() {
        let pool = Pool::host(PoolConfig::default()).unwrap();
        let hp = AdamWParams {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let p = Tensor::new(&[1.0f32, -2.0], &Device::Cpu).unwrap();
        let g = Tensor::new(&[0.5f32, 0.25], &Device::Cpu).unwrap();
        let mut opt = AdamW::new(&pool, hp, std::slice::from_ref(&p)).unwrap();
        opt.step(
            std::slice::from_ref(&p),
            std::slice::from_ref(&g),
            0.01,
            1.0,
        )
        .unwrap();
        // Step 1: m̂ = g, v̂ = g², so the step is lr·sign(g) (up to ε).
        let expected = |x: f64, g: f64, t: i32, m: &mut f64, v: &mut f64| {
            let x = x * (1.0 - 0.01 * 0.1);
            *m = 0.9 * *m + 0.1 * g;
            *v = 0.999 * *v + 0.001 * g * g;
            let denom = v.sqrt() / (1.0 - 0.999f64.powi(t)).sqrt() + 1e-8;
            x - 0.01 / (1.0 - 0.9f64.powi(t)) * *m / denom
        };
        let (mut m, mut v) = ([0.0; 2], [0.0; 2]);
        let mut want = [1.0f64, -2.0];
        let gs = [0.5, 0.25];
        for i in 0..2 {
            want[i] = expected(want[i], gs[i], 1, &mut m[i], &mut v[i]);
        }
        let got = p.to_vec1::<f32>().unwrap();
        for i in 0..2 {
            assert!(
                (got[i] as f64 - want[i]).abs() < 1e-6,
                "{got:?} vs {want:?}"
            );
        }
        // Step 2 with a clipping coefficient of one half.
        opt.step(
            std::slice::from_ref(&p),
            std::slice::from_ref(&g),
            0.01,
            0.5,
        )
        .unwrap();
        for i in 0..2 {
            want[i] = expected(want[i], gs[i] * 0.5, 2, &mut m[i], &mut v[i]);
        }
        let got = p.to_vec1::<f32>().unwrap();
        for i in 0..2 {
            assert!(
                (got[i] as f64 - want[i]).abs() < 1e-6,
                "{got:?} vs {want:?}"
            );
        }
        assert_eq!(opt.steps_taken(), 2);
    }
}
