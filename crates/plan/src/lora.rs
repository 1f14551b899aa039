//! LoRA in the plan (colo-train's `lora`, verl's `lora_rank` /
//! `target_modules`): the trainer holds its frozen weights and, for the
//! adapters alone, `A` (rank × in) and `B` (out × rank) per targeted
//! projection with their gradients and optimizer state; the reference is
//! the trainer's weights with the adapters off (no copy); the weight sync
//! merges the adapters into one decoder layer's targeted weights at a time.
//!
//! [`crate::memory::component_sizes`] applies it: `train_params` the
//! weights plus the adapters, `train_grads` and `optimizer` the adapters'
//! (bytes per parameter as the optimizer layout says), `ref_params` none,
//! the sync's transient one layer's merged weights beside what the sync
//! reads, and an eager backward's gradients the adapters' (no embedding
//! gradient). The adapters' own activations (`rank` values per token and
//! projection) are left out: below 1% of a layer's at ranks up to 64.

use serde::{Deserialize, Serialize};

use crate::error::{out_of_range, PlanError, Result};
use crate::model::ModelSpec;

/// The projections of a decoder layer, in colo-model's order (its
/// `lora::PROJECTIONS`: colo-plan depends on no colo crate, so the list is
/// written here too).
pub const PROJECTIONS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// PEFT's `target_modules` for every projection.
pub const ALL_LINEAR: &str = "all-linear";

/// What a user gives ([`crate::PlanInput::lora`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraInput {
    /// The adapters' rank.
    pub rank: u64,
    /// `["all-linear"]` or projection names.
    pub target_modules: Vec<String>,
}

/// A validated [`LoraInput`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Lora {
    pub rank: u64,
    /// Which of [`PROJECTIONS`] have adapters.
    pub targets: [bool; 7],
}

impl LoraInput {
    pub fn validate(&self) -> Result<Lora> {
        if self.rank == 0 {
            return Err(out_of_range("lora rank", 0, ">= 1"));
        }
        let mut targets = [false; 7];
        for name in &self.target_modules {
            if name == ALL_LINEAR {
                targets = [true; 7];
                continue;
            }
            let i = PROJECTIONS.iter().position(|p| p == name).ok_or_else(|| {
                PlanError::UnknownKeyword {
                    what: "LoRA target module",
                    value: name.clone(),
                    valid: format!("{ALL_LINEAR}, {}", PROJECTIONS.join(", ")),
                }
            })?;
            targets[i] = true;
        }
        if !targets.contains(&true) {
            return Err(out_of_range(
                "lora target_modules",
                "none",
                format!("{ALL_LINEAR} or some of {}", PROJECTIONS.join(", ")),
            ));
        }
        Ok(Lora {
            rank: self.rank,
            targets,
        })
    }
}

impl ModelSpec {
    /// Each projection's (in, out), in [`PROJECTIONS`] order.
    pub fn projection_shapes(&self) -> [(u64, u64); 7] {
        let (h, q, kv, i) = (self.hidden, self.q_dim(), self.kv_dim(), self.intermediate);
        [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
    }

    fn targeted(&self, l: &Lora) -> Vec<(u64, u64)> {
        let shapes = self.projection_shapes();
        (0..7)
            .filter(|&p| l.targets[p])
            .map(|p| shapes[p])
            .collect()
    }

    /// Adapter parameters of the whole model: `rank · (in + out)` per
    /// targeted projection and layer.
    pub fn lora_params(&self, l: &Lora) -> u64 {
        self.layers
            * self
                .targeted(l)
                .iter()
                .map(|(i, o)| l.rank * (i + o))
                .sum::<u64>()
    }

    /// One decoder layer's targeted weights (`in · out` each): what a
    /// layer's merge makes.
    pub fn lora_merged_layer_params(&self, l: &Lora) -> u64 {
        self.targeted(l).iter().map(|(i, o)| i * o).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::preset;

    fn all(rank: u64) -> Lora {
        LoraInput {
            rank,
            target_modules: vec![ALL_LINEAR.into()],
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn adapter_counts_match_peft_at_qwen25_05b() {
        // PEFT's print_trainable_parameters for Qwen2.5-0.5B with r = 8 on
        // all-linear: 4,399,104 (24 layers × (8 · (896 + 896) · 2 + 8 ·
        // (896 + 128) · 2 + 8 · (896 + 4864) · 3)).
        let m = preset("qwen2.5-0.5b").unwrap();
        assert_eq!(m.lora_params(&all(8)), 4_399_104);
        let qv = LoraInput {
            rank: 16,
            target_modules: vec!["q_proj".into(), "v_proj".into()],
        }
        .validate()
        .unwrap();
        assert_eq!(m.lora_params(&qv), 24 * 16 * ((896 + 896) + (896 + 128)));
        assert_eq!(
            m.lora_merged_layer_params(&all(8)),
            m.layer_params() - 2 * 896 - (896 + 2 * 128)
        );
    }

    #[test]
    fn bad_inputs_name_what_is_wrong() {
        let bad = |rank, t: &[&str]| {
            LoraInput {
                rank,
                target_modules: t.iter().map(|s| s.to_string()).collect(),
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        assert!(bad(0, &["all-linear"]).contains("lora rank"));
        let e = bad(8, &["qkv"]);
        assert!(e.contains("qkv") && e.contains("q_proj"), "{e}");
        assert!(bad(8, &[]).contains("target_modules"));
    }
}
