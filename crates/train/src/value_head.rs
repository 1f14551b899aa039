//! The critic's value head: one linear map from the final-normalised hidden
//! state to a scalar per token (transformers' `…ForTokenClassification`
//! with one label, no bias, as verl builds its critic).

use std::sync::Arc;

use colo_algo::rng::SplitMix64;
use colo_mem::{tags, Pool};
use tch::{Device, Kind, Tensor};

use crate::buffers::copy_in;
use crate::trainer::ValueHeadConfig;
use crate::Result;

/// The head's parameter name in checkpoints and in [`crate::ColoTrainer::gradients`].
pub const VALUE_HEAD_WEIGHT: &str = "v_head.weight";

/// `value = hidden · wᵀ`, `w`: (1, hidden), a parameter of the engine.
#[derive(Debug)]
pub struct ValueHead {
    weight: Tensor,
}

impl Clone for ValueHead {
    /// Shares the weight.
    fn clone(&self) -> Self {
        ValueHead {
            weight: self.weight.shallow_clone(),
        }
    }
}

impl ValueHead {
    /// A head with weights drawn from N(0, std²) by a seeded generator, so
    /// two engines built alike start alike (whatever libtorch's global
    /// generator did). The weight is allocated in the `train_params` tag,
    /// in `kind` on `device`, and requires a gradient.
    pub(crate) fn new(
        pool: &Arc<Pool>,
        hidden: usize,
        cfg: &ValueHeadConfig,
        kind: Kind,
        device: Device,
    ) -> Result<Self> {
        let w = Tensor::f_from_slice(&normal(hidden, cfg.init_std, cfg.seed))?
            .f_view([1, hidden as i64])?;
        Ok(ValueHead {
            weight: copy_in(pool, tags::TRAIN_PARAMS, &w, kind, device, true)?,
        })
    }

    /// The weight (1, hidden): the engine's parameter itself.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// Values of hidden states: (batch, len, hidden) → (batch, len), in
    /// the head's kind; differentiable unless run under `tch::no_grad`.
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(hidden.f_matmul(&self.weight.f_tr()?)?.f_squeeze_dim(-1)?)
    }
}

/// `n` samples of N(0, std²): SplitMix64 feeding Box–Muller.
fn normal(n: usize, std: f64, seed: u64) -> Vec<f32> {
    let mut g = SplitMix64::new(seed);
    let mut uniform = move || ((g.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64; // in (0, 1)
    (0..n)
        .map(|_| {
            let (u1, u2) = (uniform(), uniform());
            (std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_normal_has_the_right_moments() {
        let x = normal(20_000, 0.5, 7);
        assert_eq!(x, normal(20_000, 0.5, 7));
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var.sqrt() - 0.5).abs() < 0.02,
            "{mean} {var}"
        );
    }
}
