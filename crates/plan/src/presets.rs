//! Named models, so that a plan needs no download. Dimensions are copied
//! from each model's published `config.json`.

use crate::error::{PlanError, Result};
use crate::model::{HfConfig, ModelSpec};

/// One preset: its canonical name, accepted aliases, and its config.
struct Preset {
    name: &'static str,
    aliases: &'static [&'static str],
    /// hidden, intermediate, layers, heads, kv_heads, head_dim, vocab
    dims: [u64; 7],
    tie: bool,
    qwen2: bool,
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "qwen2.5-0.5b",
        aliases: &[],
        dims: [896, 4864, 24, 14, 2, 64, 151_936],
        tie: true,
        qwen2: true,
    },
    Preset {
        name: "qwen2.5-1.5b",
        aliases: &[],
        dims: [1536, 8960, 28, 12, 2, 128, 151_936],
        tie: true,
        qwen2: true,
    },
    Preset {
        name: "qwen2.5-3b",
        aliases: &[],
        dims: [2048, 11_008, 36, 16, 2, 128, 151_936],
        tie: true,
        qwen2: true,
    },
    Preset {
        name: "qwen2.5-7b",
        aliases: &["qwen-7b"],
        dims: [3584, 18_944, 28, 28, 4, 128, 152_064],
        tie: false,
        qwen2: true,
    },
    Preset {
        name: "qwen2.5-14b",
        aliases: &["qwen-14b"],
        dims: [5120, 13_824, 48, 40, 8, 128, 152_064],
        tie: false,
        qwen2: true,
    },
    Preset {
        name: "qwen2.5-32b",
        aliases: &["qwen-32b"],
        dims: [5120, 27_648, 64, 40, 8, 128, 152_064],
        tie: false,
        qwen2: true,
    },
    Preset {
        name: "qwen2.5-72b",
        aliases: &["qwen-72b"],
        dims: [8192, 29_568, 80, 64, 8, 128, 152_064],
        tie: false,
        qwen2: true,
    },
    Preset {
        name: "llama-3.2-1b",
        aliases: &[],
        dims: [2048, 8192, 16, 32, 8, 64, 128_256],
        tie: true,
        qwen2: false,
    },
    Preset {
        name: "llama-3-8b",
        aliases: &["llama-8b", "llama-3.1-8b"],
        dims: [4096, 14_336, 32, 32, 8, 128, 128_256],
        tie: false,
        qwen2: false,
    },
    Preset {
        name: "llama-3-70b",
        aliases: &["llama-70b", "llama-3.1-70b"],
        dims: [8192, 28_672, 80, 64, 8, 128, 128_256],
        tie: false,
        qwen2: false,
    },
];

/// The canonical preset names, in table order.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// The validated model for a preset name or alias (case-insensitive).
pub fn preset(name: &str) -> Result<ModelSpec> {
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
    HfConfig {
        model_type: Some(if p.qwen2 { "qwen2" } else { "llama" }.into()),
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
    .into_spec(p.name)
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
            ("qwen2.5-7b", 7_615_616_512),
            ("qwen2.5-32b", 32_763_876_352),
            ("llama-3-8b", 8_030_261_248),
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

    #[test]
    fn unknown_preset_lists_the_valid_ones() {
        let err = preset("gpt-5").unwrap_err().to_string();
        for name in preset_names() {
            assert!(err.contains(name), "{err} lacks {name}");
        }
        assert!(err.contains("qwen-32b"));
    }
}
