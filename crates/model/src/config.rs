//! Model configuration: the raw `config.json` ([`HfConfig`]) and the validated
//! form the model is built from ([`ModelConfig`]).
//!
//! Hugging Face configs drift between transformers versions (transformers 5
//! moved `rope_theta` into `rope_parameters`) and between families (Qwen2
//! always has q/k/v biases, Llama has an `attention_bias` switch). All of that
//! is resolved once, in [`HfConfig::into_config`]; the model code only sees
//! plain numbers.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tch::Kind;

use crate::{Error, Result};

/// The architectures this crate implements, as `config.json` names them.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["qwen2", "qwen3", "llama"];

/// A model family. Both are the same pre-norm decoder; they differ in
/// defaults, which [`HfConfig::into_config`] resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: biases on q, k and v projections.
    Qwen2,
    /// Qwen3 (dense): no projection biases; an RMSNorm over each head of q
    /// and k (`q_norm`, `k_norm`) before RoPE.
    Qwen3,
    /// Llama 2/3 style (also Mistral-like checkpoints saved as `llama`).
    Llama,
}

impl Arch {
    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }

    /// The transformers class that loads this family.
    pub fn hf_architecture(self) -> &'static str {
        match self {
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
        }
    }
}

/// `rope_parameters` as transformers 5 writes it (older `rope_scaling` has
/// the same shape).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct RopeParameters {
    pub rope_theta: Option<f64>,
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    /// `llama3` only.
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
}

/// Llama 3.1's RoPE frequency scaling (`rope_type = "llama3"`): long
/// wavelengths are divided by `factor`, short ones kept, the band between
/// interpolated (transformers' `_compute_llama3_parameters`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

impl Llama3Rope {
    /// Scales the default inverse frequencies, in float32 like transformers.
    pub fn scale(&self, inv_freq: &mut [f32]) {
        let factor = self.factor as f32;
        let (low, high) = (self.low_freq_factor as f32, self.high_freq_factor as f32);
        let old = self.original_max_position_embeddings as f32;
        let (low_wavelen, high_wavelen) = (old / low, old / high);
        for f in inv_freq {
            let wavelen = 2.0 * std::f32::consts::PI / *f;
            *f = if wavelen > low_wavelen {
                *f / factor
            } else if wavelen < high_wavelen {
                *f
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * *f / factor + smooth * *f
            };
        }
    }
}

/// A token id field that is either one id or a list (`eos_token_id`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// `config.json` as Hugging Face writes it, fields optional where some
/// versions or families omit them. Turn it into a [`ModelConfig`] with
/// [`HfConfig::into_config`].
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    pub rope_theta: Option<f64>,
    pub rope_parameters: Option<RopeParameters>,
    pub rope_scaling: Option<RopeParameters>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub hidden_act: Option<String>,
    pub use_sliding_window: Option<bool>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
    pub pad_token_id: Option<u32>,
}

/// The validated configuration the model is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// Llama 3.1-style frequency scaling; `None`: plain RoPE.
    pub rope_llama3: Option<Llama3Rope>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (always for Qwen2; Llama's
    /// `attention_bias`, which also puts one on the output projection).
    pub qkv_bias: bool,
    /// A bias on the attention output projection (Llama `attention_bias`).
    pub o_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}

impl HfConfig {
    /// Parses `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_str(&text).map_err(|reason| Error::Json {
            path: path.to_owned(),
            reason,
        })
    }

    /// Resolves family defaults and version differences, and checks that the
    /// numbers fit together.
    pub fn into_config(self) -> Result<ModelConfig> {
        let model_type = self.model_type.as_deref().unwrap_or("<absent>");
        let arch = match model_type {
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "llama" => Arch::Llama,
            other => {
                return Err(Error::UnsupportedModelType {
                    found: other.to_owned(),
                    supported: SUPPORTED_MODEL_TYPES,
                })
            }
        };
        if let Some(act) = self.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(invalid(format!(
                "hidden_act `{act}` is not supported (only silu)"
            )));
        }
        if self.mlp_bias == Some(true) {
            return Err(invalid("mlp_bias = true is not supported"));
        }
        if self.use_sliding_window == Some(true) {
            return Err(invalid("use_sliding_window = true is not supported"));
        }
        let (rope_theta, rope_llama3) = self.resolve_rope()?;
        let num_heads = self.num_attention_heads;
        let num_kv_heads = self.num_key_value_heads.unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(invalid(format!(
                "num_attention_heads ({num_heads}) must be a positive multiple of num_key_value_heads ({num_kv_heads})"
            )));
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.hidden_size.is_multiple_of(num_heads) => self.hidden_size / num_heads,
            None => {
                return Err(invalid(format!(
                    "hidden_size ({}) is not divisible by num_attention_heads ({num_heads}) and head_dim is absent",
                    self.hidden_size
                )))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(invalid(format!(
                "head_dim ({head_dim}) must be even and positive"
            )));
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            (
                "max_position_embeddings",
                self.max_position_embeddings.unwrap_or(1),
            ),
        ] {
            if v == 0 {
                return Err(invalid(format!("{name} must be positive")));
            }
        }
        // transformers adds eps to a mean of squares: a negative one can
        // make the root NaN.
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(invalid(format!(
                "rms_norm_eps ({}) must be a finite number ≥ 0",
                self.rms_norm_eps
            )));
        }
        let attention_bias = self.attention_bias.unwrap_or(false);
        Ok(ModelConfig {
            arch,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps,
            rope_theta,
            rope_llama3,
            max_position_embeddings: self.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || attention_bias,
            o_bias: arch != Arch::Qwen2 && attention_bias,
            bos_token_id: self.bos_token_id,
            eos_token_ids: self
                .eos_token_id
                .as_ref()
                .map(TokenIds::to_vec)
                .unwrap_or_default(),
            pad_token_id: self.pad_token_id,
        })
    }

    /// `rope_theta` lives at the top level before transformers 5 and in
    /// `rope_parameters` from 5 on; `llama3` scaling in either
    /// `rope_parameters` (5) or `rope_scaling` (4). Other scaled variants
    /// (yarn, linear, dynamic, …) change the frequencies differently and are
    /// refused rather than silently ignored.
    fn resolve_rope(&self) -> Result<(f64, Option<Llama3Rope>)> {
        let mut llama3 = None;
        for p in [&self.rope_parameters, &self.rope_scaling]
            .into_iter()
            .flatten()
        {
            match p.rope_type.as_deref() {
                None | Some("default") => {}
                Some("llama3") => llama3 = Some(Self::llama3(p)?),
                Some(t) => {
                    return Err(invalid(format!(
                        "rope type `{t}` is not supported (default and llama3 are)"
                    )))
                }
            }
        }
        let nested = self.rope_parameters.as_ref().and_then(|p| p.rope_theta);
        let theta = nested.or(self.rope_theta).unwrap_or(10_000.0);
        if theta <= 0.0 {
            return Err(invalid(format!("rope_theta ({theta}) must be positive")));
        }
        Ok((theta, llama3))
    }

    fn llama3(p: &RopeParameters) -> Result<Llama3Rope> {
        let field = |name: &str, v: Option<f64>| {
            v.filter(|v| v.is_finite() && *v > 0.0).ok_or_else(|| {
                invalid(format!(
                    "rope type `llama3` needs a positive `{name}`, got {v:?}"
                ))
            })
        };
        let r = Llama3Rope {
            factor: field("factor", p.factor)?,
            low_freq_factor: field("low_freq_factor", p.low_freq_factor)?,
            high_freq_factor: field("high_freq_factor", p.high_freq_factor)?,
            original_max_position_embeddings: field(
                "original_max_position_embeddings",
                p.original_max_position_embeddings,
            )?,
        };
        if r.high_freq_factor <= r.low_freq_factor {
            return Err(invalid(format!(
                "rope type `llama3` needs high_freq_factor ({}) above low_freq_factor ({})",
                r.high_freq_factor, r.low_freq_factor
            )));
        }
        Ok(r)
    }
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        HfConfig::from_file(path)?.into_config()
    }

    /// Whether q and k are RMS-normalised per head before RoPE (Qwen3).
    pub fn qk_norm(&self) -> bool {
        self.arch == Arch::Qwen3
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// The number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        self.parameter_shapes()
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum()
    }

    /// Every parameter's Hugging Face name and shape, in the order of
    /// [`crate::Model::named_parameters`] (a tied head is not listed).
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let (q, kv) = (
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        );
        let mut out = vec![(
            "model.embed_tokens.weight".to_owned(),
            vec![self.vocab_size, h],
        )];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), vec![h]));
            for (name, rows, cols, bias) in [
                ("q_proj", q, h, self.qkv_bias),
                ("k_proj", kv, h, self.qkv_bias),
                ("v_proj", kv, h, self.qkv_bias),
                ("o_proj", h, q, self.o_bias),
            ] {
                out.push((format!("{p}.self_attn.{name}.weight"), vec![rows, cols]));
                if bias {
                    out.push((format!("{p}.self_attn.{name}.bias"), vec![rows]));
                }
            }
            if self.qk_norm() {
                let d = self.head_dim;
                out.push((format!("{p}.self_attn.q_norm.weight"), vec![d]));
                out.push((format!("{p}.self_attn.k_norm.weight"), vec![d]));
            }
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
            {
                out.push((format!("{p}.mlp.{name}.weight"), vec![rows, cols]));
            }
        }
        out.push(("model.norm.weight".to_owned(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_owned(), vec![self.vocab_size, h]));
        }
        out
    }

    /// `config.json` content that transformers (4.x and 5.x) loads: the RoPE
    /// base is written both at the top level and in `rope_parameters`.
    pub fn to_hf_json(&self, kind: Kind) -> Value {
        let eos: Value = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let mut v = json!({
            "architectures": [self.arch.hf_architecture()],
            "model_type": self.arch.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": match self.rope_llama3 {
                None => json!({"rope_theta": self.rope_theta, "rope_type": "default"}),
                Some(r) => json!({
                    "rope_theta": self.rope_theta,
                    "rope_type": "llama3",
                    "factor": r.factor,
                    "low_freq_factor": r.low_freq_factor,
                    "high_freq_factor": r.high_freq_factor,
                    "original_max_position_embeddings": r.original_max_position_embeddings,
                }),
            },
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": kind_name(kind),
            "dtype": kind_name(kind),
        });
        if self.arch != Arch::Qwen2 {
            v["attention_bias"] = json!(self.qkv_bias);
            v["mlp_bias"] = json!(false);
        } else {
            v["use_sliding_window"] = json!(false);
        }
        v
    }
}

/// The `torch_dtype` name of a kind (float32 for anything without one).
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => "float32",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "rms_norm_eps": 1e-5
        })
    }

    fn parse(v: Value) -> Result<ModelConfig> {
        serde_json::from_value::<HfConfig>(v).unwrap().into_config()
    }

    #[test]
    fn rope_theta_top_level_and_nested() {
        let mut v = base();
        v["rope_theta"] = json!(123.0);
        assert_eq!(parse(v.clone()).unwrap().rope_theta, 123.0);
        v["rope_parameters"] = json!({"rope_theta": 456.0, "rope_type": "default"});
        assert_eq!(parse(v).unwrap().rope_theta, 456.0);
    }

    #[test]
    fn defaults_resolve() {
        let c = parse(base()).unwrap();
        assert_eq!(
            (
                c.num_kv_heads,
                c.head_dim,
                c.qkv_bias,
                c.tie_word_embeddings
            ),
            (2, 4, false, false)
        );
    }

    #[test]
    fn unsupported_model_type_lists_supported() {
        let mut v = base();
        v["model_type"] = json!("gpt2");
        let e = parse(v).unwrap_err();
        assert!(matches!(e, Error::UnsupportedModelType { ref found, .. } if found == "gpt2"));
        assert!(e.to_string().contains("qwen2, qwen3, llama"), "{e}");
    }

    #[test]
    fn inconsistent_heads_and_scaled_rope_are_refused() {
        let mut v = base();
        v["num_key_value_heads"] = json!(3);
        assert!(matches!(parse(v), Err(Error::Config(_))));
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "llama3"});
        assert!(parse(v).unwrap_err().to_string().contains("factor"));
        let mut v = base();
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        assert!(parse(v).unwrap_err().to_string().contains("yarn"));
        let mut v = base();
        v["rms_norm_eps"] = json!(-1.0);
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("rms_norm_eps (-1) must be a finite number ≥ 0"),
            "{e}"
        );
        let mut v = base();
        v["max_position_embeddings"] = json!(0);
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("max_position_embeddings must be positive"),
            "{e}"
        );
    }

    #[test]
    fn hf_json_round_trips() {
        let mut v = base();
        v["model_type"] = json!("qwen2");
        v["eos_token_id"] = json!([2, 3]);
        let c = parse(v).unwrap();
        let back = parse(c.to_hf_json(Kind::Float)).unwrap();
        assert_eq!(c, back);
    }
}
