//! The engine's configuration: raw serde structs as a run's TOML file
//! writes them, each turned once into a validated plain struct.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tch::{Device, Kind};

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

/// How a batch is cut into micro-batches: a number of rows, or — with
/// `max_tokens` — as many consecutive rows as fit a token budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MicroBatchConfig {
    /// Rows per forward/backward of a training step (gradients accumulate
    /// over the micro-batches of one step).
    pub micro_batch_size: usize,
    /// Rows per forward of a no-grad scoring pass; `None`: twice
    /// `micro_batch_size` (no activations are kept for a backward).
    pub score_micro_batch_size: Option<usize>,
    /// Instead of `micro_batch_size`: each micro-batch takes consecutive
    /// rows while its padded tokens — rows × its longest row, what a pass
    /// computes and holds activations for — stay within this budget
    /// (verl's `use_dynamic_bsz` with `ppo_max_token_len_per_gpu`). A row
    /// longer than the budget is a micro-batch of its own.
    pub max_tokens: Option<usize>,
    /// The same for scoring passes; `None`: twice `max_tokens`.
    pub score_max_tokens: Option<usize>,
}

impl Default for MicroBatchConfig {
    fn default() -> Self {
        MicroBatchConfig {
            micro_batch_size: 4,
            score_micro_batch_size: None,
            max_tokens: None,
            score_max_tokens: None,
        }
    }
}

/// How a pass cuts a batch: see [`MicroBatchConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// This many rows a micro-batch (the last may have fewer).
    Rows(usize),
    /// Consecutive rows within this many padded tokens a micro-batch.
    Tokens(usize),
}

impl From<usize> for Split {
    /// `rows` rows a micro-batch (at least one).
    fn from(rows: usize) -> Self {
        Split::Rows(rows.max(1))
    }
}

/// Validated micro-batch splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroBatches {
    pub train: Split,
    pub score: Split,
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
        let positive = |key: &'static str, v: Option<usize>| match v {
            Some(0) => Err(Error::config(key, 0, "must be at least 1 token")),
            v => Ok(v),
        };
        let max_tokens = positive("max_tokens", self.max_tokens)?;
        let score_max_tokens = positive("score_max_tokens", self.score_max_tokens)?;
        let (train, score) = match max_tokens {
            None => (Split::Rows(self.micro_batch_size), Split::Rows(score)),
            Some(t) => (
                Split::Tokens(t),
                Split::Tokens(score_max_tokens.unwrap_or(t.saturating_mul(2))),
            ),
        };
        Ok(MicroBatches { train, score })
    }
}

/// The parameters' kind as a config names it: `"f32"` or `"bf16"`
/// (`"float32"`, `"bfloat16"` also read).
pub fn parse_kind(name: &str) -> Result<Kind> {
    match name {
        "f32" | "float32" => Ok(Kind::Float),
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        other => Err(Error::config("kind", other, "must be \"f32\" or \"bf16\"")),
    }
}

/// The config name of a kind the engine trains in.
pub fn kind_name(kind: Kind) -> Result<&'static str> {
    match kind {
        Kind::Float => Ok("f32"),
        Kind::BFloat16 => Ok("bf16"),
        other => Err(Error::Unsupported {
            what: "parameter kind",
            found: format!("{other:?} (colo-train trains in f32 or bf16)"),
        }),
    }
}

/// A device as a config names it: `"cpu"`, `"cuda"` (GPU 0) or
/// `"cuda:N"`.
pub fn parse_device(name: &str) -> Result<Device> {
    let bad = || Error::config("device", name, "must be \"cpu\", \"cuda\" or \"cuda:N\"");
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Ok(Device::Cuda(0)),
        _ => match name.strip_prefix("cuda:") {
            Some(i) => i.parse().map(Device::Cuda).map_err(|_| bad()),
            None => Err(bad()),
        },
    }
}

/// The config name of a device.
pub fn device_name(device: Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Checks that the engine can run in `kind` on `device`: f32 or bf16, on
/// the CPU or on a CUDA GPU that exists.
pub fn check_target(kind: Kind, device: Device) -> Result<()> {
    kind_name(kind)?;
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(i) => {
            let n = tch::Cuda::device_count();
            match (i as i64) < n {
                true => Ok(()),
                false if n == 0 => Err(Error::Unsupported {
                    what: "device",
                    found: format!(
                        "cuda:{i} was asked for, but CUDA is not available here (no NVIDIA GPU or driver visible to libtorch)"
                    ),
                }),
                false => Err(Error::Unsupported {
                    what: "device",
                    found: format!("cuda:{i} was asked for, but libtorch sees {n} GPU(s)"),
                }),
            }
        }
        other => Err(Error::Unsupported {
            what: "device",
            found: format!("{other:?} (colo-train runs on the CPU or CUDA)"),
        }),
    }
}

/// serde for a [`Kind`] field (`"f32"` | `"bf16"`).
pub(crate) mod kind_serde {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        kind: &Kind,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        kind_name(*kind)
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Kind, D::Error> {
        parse_kind(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// serde for a [`Device`] field (`"cpu"` | `"cuda"` | `"cuda:N"`).
pub(crate) mod device_serde {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        device: &Device,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        device_name(*device).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Device, D::Error> {
        parse_device(&String::deserialize(d)?).map_err(serde::de::Error::custom)
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
        let msg = MicroBatchConfig {
            max_tokens: Some(0),
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(msg.contains("max_tokens"), "{msg}");
    }

    #[test]
    fn a_token_budget_replaces_the_row_counts() {
        let rows = MicroBatchConfig::default().validate().unwrap();
        assert_eq!((rows.train, rows.score), (Split::Rows(4), Split::Rows(8)));
        let tokens = MicroBatchConfig {
            max_tokens: Some(1000),
            ..Default::default()
        };
        let t = tokens.validate().unwrap();
        assert_eq!(
            (t.train, t.score),
            (Split::Tokens(1000), Split::Tokens(2000))
        );
        let t = MicroBatchConfig {
            score_max_tokens: Some(300),
            ..tokens
        }
        .validate()
        .unwrap();
        assert_eq!(t.score, Split::Tokens(300));
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

    #[test]
    fn kinds_and_devices_by_name() {
        assert_eq!(parse_kind("bf16").unwrap(), Kind::BFloat16);
        assert_eq!(kind_name(Kind::Float).unwrap(), "f32");
        assert!(parse_kind("f16").unwrap_err().to_string().contains("kind"));
        assert!(kind_name(Kind::Half).is_err());
        assert_eq!(parse_device("cuda:1").unwrap(), Device::Cuda(1));
        assert_eq!(parse_device("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(device_name(Device::Cuda(2)), "cuda:2");
        assert!(parse_device("gpu")
            .unwrap_err()
            .to_string()
            .contains("device"));
        assert!(check_target(Kind::BFloat16, Device::Cpu).is_ok());
        assert!(check_target(Kind::Half, Device::Cpu).is_err());
        let n = tch::Cuda::device_count();
        let msg = check_target(Kind::Float, Device::Cuda(n as usize))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("cuda:"), "{msg}");
        if n == 0 {
            assert!(msg.contains("CUDA is not available"), "{msg}");
        }
    }
}
