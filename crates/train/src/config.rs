//! The engine's configuration: raw serde structs as a run's TOML file
//! writes them, each turned once into a validated plain struct.

use serde::{Deserialize, Serialize};

use crate::adamw::AdamWParams;
use crate::schedule::{LrSchedule, ScheduleKind};
use crate::{Error, Result};

/// Optimizer and learning-rate schedule, as written in a config file
/// (verl's `actor.optim` names where they exist).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// AdamW's (β₁, β₂).
    pub betas: (f64, f64),
    pub eps: f64,
    /// Decoupled weight decay λ (the update subtracts `lr · λ · θ`).
    pub weight_decay: f64,
    pub warmup_steps: u64,
    pub schedule: ScheduleKind,
    /// Optimizer steps of the whole run; required by `cosine`.
    pub total_steps: Option<u64>,
    /// Floor of the cosine schedule as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Largest global L2 norm of the gradient; `None` disables clipping.
    pub grad_clip: Option<f64>,
}

impl Default for OptimConfig {
    /// verl's actor defaults: lr 1e-6, betas (0.9, 0.999), weight decay
    /// 0.01, clip 1.0, constant schedule without warmup.
    fn default() -> Self {
        OptimConfig {
            lr: 1e-6,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            warmup_steps: 0,
            schedule: ScheduleKind::Constant,
            total_steps: None,
            min_lr_ratio: 0.0,
            grad_clip: Some(1.0),
        }
    }
}

/// The validated optimizer settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Optim {
    pub adamw: AdamWParams,
    pub schedule: LrSchedule,
    pub grad_clip: Option<f64>,
}

fn positive(field: &'static str, v: f64) -> Result<f64> {
    match v.is_finite() && v > 0.0 {
        true => Ok(v),
        false => Err(Error::config(field, v, "must be a positive finite number")),
    }
}

impl OptimConfig {
    /// Checks every field and resolves the schedule.
    pub fn validate(&self) -> Result<Optim> {
        let lr = positive("lr", self.lr)?;
        let (b1, b2) = self.betas;
        for (field, b) in [("betas.0", b1), ("betas.1", b2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::config(field, b, "must be in [0, 1)"));
            }
        }
        let eps = positive("eps", self.eps)?;
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(Error::config(
                "weight_decay",
                self.weight_decay,
                "must be ≥ 0",
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(Error::config(
                "min_lr_ratio",
                self.min_lr_ratio,
                "must be in [0, 1]",
            ));
        }
        let total_steps = match (self.schedule, self.total_steps) {
            (ScheduleKind::Cosine, None) => {
                return Err(Error::config(
                    "total_steps",
                    "none",
                    "the cosine schedule needs the run's number of optimizer steps",
                ))
            }
            (ScheduleKind::Cosine, Some(t)) if t <= self.warmup_steps => {
                return Err(Error::config(
                    "total_steps",
                    t,
                    &format!("must exceed warmup_steps = {}", self.warmup_steps),
                ))
            }
            (_, t) => t.unwrap_or(0),
        };
        let grad_clip = self
            .grad_clip
            .map(|c| positive("grad_clip", c))
            .transpose()?;
        Ok(Optim {
            adamw: AdamWParams {
                beta1: b1,
                beta2: b2,
                eps,
                weight_decay: self.weight_decay,
            },
            schedule: LrSchedule {
                peak_lr: lr,
                warmup_steps: self.warmup_steps,
                kind: self.schedule,
                total_steps,
                min_lr_ratio: self.min_lr_ratio,
            },
            grad_clip,
        })
    }
}

/// How a batch is cut into micro-batches (rows).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MicroBatchConfig {
    /// Rows per forward/backward of a training step (gradients accumulate
    /// over the micro-batches of one step).
    pub micro_batch_size: usize,
    /// Rows per forward of a no-grad scoring pass; `None`: twice
    /// `micro_batch_size` (no activations are kept for a backward).
    pub score_micro_batch_size: Option<usize>,
}

impl Default for MicroBatchConfig {
    fn default() -> Self {
        MicroBatchConfig {
            micro_batch_size: 4,
            score_micro_batch_size: None,
        }
    }
}

/// Validated micro-batch sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroBatches {
    pub train: usize,
    pub score: usize,
}

impl MicroBatchConfig {
    pub fn validate(&self) -> Result<MicroBatches> {
        if self.micro_batch_size == 0 {
            return Err(Error::config("micro_batch_size", 0, "must be at least 1"));
        }
        let score = self
            .score_micro_batch_size
            .unwrap_or(2 * self.micro_batch_size);
        if score == 0 {
            return Err(Error::config(
                "score_micro_batch_size",
                0,
                "must be at least 1",
            ));
        }
        Ok(MicroBatches {
            train: self.micro_batch_size,
            score,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        let o = OptimConfig::default().validate().unwrap();
        assert_eq!(o.grad_clip, Some(1.0));
        assert_eq!(o.schedule.lr_at(0), 1e-6);
    }

    #[test]
    fn errors_name_the_field() {
        let bad = OptimConfig {
            betas: (0.9, 1.0),
            ..Default::default()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("betas.1"), "{msg}");
        let cosine = OptimConfig {
            schedule: ScheduleKind::Cosine,
            ..Default::default()
        };
        let msg = cosine.validate().unwrap_err().to_string();
        assert!(msg.contains("total_steps"), "{msg}");
        let msg = MicroBatchConfig {
            micro_batch_size: 0,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(msg.contains("micro_batch_size"), "{msg}");
    }

    #[test]
    fn parses_from_json_with_config_names() {
        let c: OptimConfig = serde_json::from_str(
            r#"{"lr": 3e-4, "schedule": "cosine", "total_steps": 100, "warmup_steps": 10}"#,
        )
        .unwrap();
        let o = c.validate().unwrap();
        assert_eq!(o.schedule.kind, ScheduleKind::Cosine);
        assert!(serde_json::from_str::<OptimConfig>(r#"{"learning_rate": 1}"#).is_err());
    }
}
