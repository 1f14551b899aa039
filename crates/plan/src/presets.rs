//! Named models, so that a plan needs no download and `colo init-model`
//! can write a model of the same shape. Every number is copied from the
//! model's published `config.json` on the Hugging Face Hub (the base
//! model's repository, [`Published::repo`]).

use crate::error::{PlanError, Result};
use crate::model::{HfConfig, ModelSpec};

/// The architecture a preset's `config.json` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Qwen2 / Qwen2.5: biases on q, k and v.
    Qwen2,
    /// Qwen3 (dense): no biases, an RMSNorm over each head of q and k.
    Qwen3,
    /// Llama 3.x.
    Llama,
}

impl Family {
    /// `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
        }
    }

    /// `architectures[0]` in `config.json`: the transformers class.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Llama => "LlamaForCausalLM",
        }
    }
}

/// Llama 3.1's RoPE frequency scaling (`rope_scaling` with `rope_type =
/// "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: u64,
}

/// Llama 3.1's and 3.2's scaling: factor 8 (3.1) or 32 (3.2), the bands at
/// 1 and 4 of the original 8,192-token context.
const fn llama3(factor: f64) -> Option<Llama3Rope> {
    Some(Llama3Rope {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    })
}

/// What a preset's published `config.json` says beyond the dimensions the
/// planner counts with ([`ModelSpec`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// The Hugging Face repository whose `config.json` the numbers are.
    pub repo: &'static str,
    pub family: Family,
    pub rope_theta: f64,
    pub rope_llama3: Option<Llama3Rope>,
    pub max_position_embeddings: u64,
    pub rms_norm_eps: f64,
    /// Qwen's `max_window_layers` (its sliding window is off:
    /// `use_sliding_window = false`); `None` for Llama.
    pub max_window_layers: Option<u64>,
    /// Qwen's `sliding_window` (written, unused); `None`: `null` (Qwen3)
    /// or absent (Llama).
    pub sliding_window: Option<u64>,
}

/// One preset: its canonical name, accepted aliases, and its config.
struct Preset {
    name: &'static str,
    aliases: &'static [&'static str],
    /// hidden, intermediate, layers, heads, kv_heads, head_dim, vocab
    dims: [u64; 7],
    tie: bool,
    /// [`Published`] without the dimensions.
    published: Published,
}

/// A Qwen2.5 base model's `config.json`: RoPE base 10⁶, the window's
/// numbers as published.
const fn qwen2(
    repo: &'static str,
    max_position_embeddings: u64,
    rms_norm_eps: f64,
    max_window_layers: u64,
) -> Published {
    Published {
        repo,
        family: Family::Qwen2,
        rope_theta: 1_000_000.0,
        rope_llama3: None,
        max_position_embeddings,
        rms_norm_eps,
        max_window_layers: Some(max_window_layers),
        sliding_window: Some(max_position_embeddings),
    }
}

/// A Qwen3 dense model's `config.json`: RoPE base 10⁶, 40,960 positions,
/// `sliding_window: null`.
const fn qwen3(repo: &'static str, layers: u64) -> Published {
    Published {
        repo,
        family: Family::Qwen3,
        rope_theta: 1_000_000.0,
        rope_llama3: None,
        max_position_embeddings: 40_960,
        rms_norm_eps: 1e-6,
        max_window_layers: Some(layers),
        sliding_window: None,
    }
}

/// A Llama 3.x `config.json`: RoPE base 5·10⁵, RMSNorm ε 10⁻⁵.
const fn llama(
    repo: &'static str,
    max_position_embeddings: u64,
    rope_llama3: Option<Llama3Rope>,
) -> Published {
    Published {
        repo,
        family: Family::Llama,
        rope_theta: 500_000.0,
        rope_llama3,
        max_position_embeddings,
        rms_norm_eps: 1e-5,
        max_window_layers: None,
        sliding_window: None,
    }
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "qwen2.5-0.5b",
        aliases: &[],
        dims: [896, 4864, 24, 14, 2, 64, 151_936],
        tie: true,
        published: qwen2("Qwen/Qwen2.5-0.5B", 32_768, 1e-6, 24),
    },
    Preset {
        name: "qwen2.5-1.5b",
        aliases: &[],
        dims: [1536, 8960, 28, 12, 2, 128, 151_936],
        tie: true,
        published: qwen2("Qwen/Qwen2.5-1.5B", 131_072, 1e-6, 28),
    },
    Preset {
        name: "qwen2.5-3b",
        aliases: &[],
        dims: [2048, 11_008, 36, 16, 2, 128, 151_936],
        tie: true,
        published: qwen2("Qwen/Qwen2.5-3B", 32_768, 1e-6, 36),
    },
    Preset {
        name: "qwen2.5-7b",
        aliases: &["qwen-7b"],
        dims: [3584, 18_944, 28, 28, 4, 128, 152_064],
        tie: false,
        published: qwen2("Qwen/Qwen2.5-7B", 131_072, 1e-6, 28),
    },
    Preset {
        name: "qwen2.5-14b",
        aliases: &["qwen-14b"],
        dims: [5120, 13_824, 48, 40, 8, 128, 152_064],
        tie: false,
        published: qwen2("Qwen/Qwen2.5-14B", 131_072, 1e-5, 48),
    },
    Preset {
        name: "qwen2.5-32b",
        aliases: &["qwen-32b"],
        dims: [5120, 27_648, 64, 40, 8, 128, 152_064],
        tie: false,
        published: qwen2("Qwen/Qwen2.5-32B", 131_072, 1e-5, 64),
    },
    Preset {
        name: "qwen2.5-72b",
        aliases: &["qwen-72b"],
        dims: [8192, 29_568, 80, 64, 8, 128, 152_064],
        tie: false,
        published: qwen2("Qwen/Qwen2.5-72B", 131_072, 1e-5, 80),
    },
    Preset {
        name: "qwen3-0.6b",
        aliases: &[],
        dims: [1024, 3072, 28, 16, 8, 128, 151_936],
        tie: true,
        published: qwen3("Qwen/Qwen3-0.6B", 28),
    },
    Preset {
        name: "qwen3-8b",
        aliases: &[],
        dims: [4096, 12_288, 36, 32, 8, 128, 151_936],
        tie: false,
        published: qwen3("Qwen/Qwen3-8B", 36),
    },
    Preset {
        name: "llama-3.2-1b",
        aliases: &[],
        dims: [2048, 8192, 16, 32, 8, 64, 128_256],
        tie: true,
        published: llama("meta-llama/Llama-3.2-1B", 131_072, llama3(32.0)),
    },
    Preset {
        name: "llama-3-8b",
        aliases: &["llama-8b"],
        dims: [4096, 14_336, 32, 32, 8, 128, 128_256],
        tie: false,
        published: llama("meta-llama/Meta-Llama-3-8B", 8192, None),
    },
    Preset {
        name: "llama-3.1-8b",
        aliases: &[],
        dims: [4096, 14_336, 32, 32, 8, 128, 128_256],
        tie: false,
        published: llama("meta-llama/Llama-3.1-8B", 131_072, llama3(8.0)),
    },
    Preset {
        name: "llama-3-70b",
        aliases: &["llama-70b"],
        dims: [8192, 28_672, 80, 64, 8, 128, 128_256],
        tie: false,
        published: llama("meta-llama/Meta-Llama-3-70B", 8192, None),
    },
    Preset {
        name: "llama-3.1-70b",
        aliases: &[],
        dims: [8192, 28_672, 80, 64, 8, 128, 128_256],
        tie: false,
        published: llama("meta-llama/Llama-3.1-70B", 131_072, llama3(8.0)),
    },
];

/// The canonical preset names, in table order.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// The validated model for a preset name or alias (case-insensitive).
pub fn preset(name: &str) -> Result<ModelSpec> {
    published(name).map(|(spec, _)| spec)
}

/// The validated model for a preset name or alias (case-insensitive) and
/// the rest of its published `config.json`.
pub fn published(name: &str) -> Result<(ModelSpec, Published)> {
    let key = name.to_ascii_lowercase();
    let p = PRESETS
        .iter()
        .find(|p| p.name == key || p.aliases.contains(&key.as_str()))
        .ok_or_else(|| PlanError::UnknownPreset {
            name: name.to_string(),
            valid: PRESETS
                .iter()
                .map(|p| {
                    if p.aliases.is_empty() {
                        p.name.to_string()
                    } else {
                        format!("{} (or {})", p.name, p.aliases.join(", "))
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let [hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, kv, head_dim, vocab_size] =
        p.dims;
    let spec = HfConfig {
        model_type: Some(p.published.family.model_type().into()),
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: Some(kv),
        head_dim: Some(head_dim),
        vocab_size,
        tie_word_embeddings: p.tie,
        attention_bias: None,
    }
    .into_spec(p.name)?;
    Ok((spec, p.published.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Published parameter counts (from the model cards / safetensors
    /// indexes), to the parameter.
    #[test]
    fn parameter_counts_match_published_sizes() {
        for (name, params) in [
            ("qwen2.5-0.5b", 494_032_768u64),
            ("qwen2.5-1.5b", 1_543_714_304),
            ("qwen2.5-7b", 7_615_616_512),
            ("qwen2.5-32b", 32_763_876_352),
            // Qwen3's per-head q/k norms included.
            ("qwen3-0.6b", 596_049_920),
            ("qwen3-8b", 8_190_735_360),
            ("llama-3-8b", 8_030_261_248),
            ("llama-3.1-8b", 8_030_261_248),
            ("llama-3-70b", 70_553_706_496),
        ] {
            assert_eq!(preset(name).unwrap().params(), params, "{name}");
        }
    }

    #[test]
    fn aliases_and_case_resolve_to_the_canonical_name() {
        assert_eq!(preset("Qwen-32B").unwrap().name, "qwen2.5-32b");
        assert_eq!(preset("llama-8b").unwrap(), preset("llama-3-8b").unwrap());
    }

    /// Llama 3.1 is Llama 3's shape with a longer context through scaled
    /// RoPE: its own preset, not an alias.
    #[test]
    fn llama_3_1_differs_from_llama_3_in_its_context_only() {
        let (s3, p3) = published("llama-3-8b").unwrap();
        let (s31, p31) = published("Llama-3.1-8B").unwrap();
        assert_eq!(
            (s31.name.as_str(), s31.params()),
            ("llama-3.1-8b", s3.params())
        );
        assert_eq!((p3.max_position_embeddings, p3.rope_llama3), (8192, None));
        assert_eq!(p31.max_position_embeddings, 131_072);
        assert_eq!(p31.rope_llama3.unwrap().factor, 8.0);
    }

    #[test]
    fn families_set_biases_and_norms() {
        let q2 = preset("qwen2.5-0.5b").unwrap();
        assert!(q2.qkv_bias && !q2.o_bias && !q2.qk_norm);
        let q3 = preset("qwen3-0.6b").unwrap();
        assert!(!q3.qkv_bias && !q3.o_bias && q3.qk_norm);
        let l = preset("llama-3.1-8b").unwrap();
        assert!(!l.qkv_bias && !l.o_bias && !l.qk_norm);
    }

    #[test]
    fn unknown_preset_lists_the_valid_ones() {
        let err = preset("gpt-5").unwrap_err().to_string();
        for name in preset_names() {
            assert!(err.contains(name), "{err} lacks {name}");
        }
        assert!(err.contains("qwen-32b"));
    }
}
