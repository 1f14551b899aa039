//! Model dimensions: a Hugging Face `config.json` (raw) turned once into a
//! validated [`ModelSpec`], and the parameter / KV-cache / activation
//! arithmetic that everything else in the crate is built on.

use serde::{Deserialize, Serialize};

use crate::error::{PlanError, Result};

/// Element types the planner knows the size of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    F16,
    F32,
    /// 8-bit floats (an FP8 KV cache or FP8 rollout weights).
    Fp8,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
            DType::Fp8 => 1,
        }
    }

    /// Parse the spellings used by Hugging Face, PyTorch and SGLang.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "fp16" | "f16" | "float16" | "half" => Ok(DType::F16),
            "fp32" | "f32" | "float32" | "float" => Ok(DType::F32),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" | "float8_e4m3fn" => Ok(DType::Fp8),
            _ => Err(PlanError::UnknownKeyword {
                what: "dtype",
                value: s.to_string(),
                valid: "bf16, fp16, fp32, fp8".into(),
            }),
        }
    }
}

/// The fields of a Hugging Face `config.json` that the planner reads, as
/// written there. Unknown fields are ignored; the defaults are those of the
/// `transformers` Qwen2 / Llama configs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub model_type: Option<String>,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    /// Absent in pre-GQA configs: then every head has its own K/V.
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    /// Absent in most configs: then `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<u64>,
    pub vocab_size: u64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama's switch for biases on q, k, v and o. Qwen2 has biases on q, k
    /// and v (never o) and no such field; `model_type` says which.
    #[serde(default)]
    pub attention_bias: Option<bool>,
}

impl HfConfig {
    /// Read and parse a `config.json` file.
    pub fn from_file(path: &str) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| PlanError::ModelConfig {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
        Self::from_json(&text).map_err(|e| match e {
            PlanError::ModelConfig { reason, .. } => PlanError::ModelConfig {
                path: path.to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Parse the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| PlanError::ModelConfig {
            path: "<json>".into(),
            reason: e.to_string(),
        })
    }

    /// Validate into a [`ModelSpec`] named `name`.
    pub fn into_spec(self, name: &str) -> Result<ModelSpec> {
        let nonzero = |v: u64, field: &str| {
            if v == 0 {
                Err(PlanError::InvalidModel(format!("{field} must be > 0")))
            } else {
                Ok(v)
            }
        };
        let hidden = nonzero(self.hidden_size, "hidden_size")?;
        let heads = nonzero(self.num_attention_heads, "num_attention_heads")?;
        let kv_heads = nonzero(
            self.num_key_value_heads.unwrap_or(heads),
            "num_key_value_heads",
        )?;
        if heads % kv_heads != 0 {
            return Err(PlanError::InvalidModel(format!(
                "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = match self.head_dim {
            Some(d) => nonzero(d, "head_dim")?,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(PlanError::InvalidModel(format!(
                    "hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) and no head_dim is given"
                )))
            }
        };
        let qwen2 = matches!(self.model_type.as_deref(), Some("qwen2"));
        let qk_norm = matches!(self.model_type.as_deref(), Some("qwen3"));
        let (qkv_bias, o_bias) = match self.attention_bias {
            Some(b) => (b, b),
            None => (qwen2, false),
        };
        Ok(ModelSpec {
            name: name.to_string(),
            hidden,
            intermediate: nonzero(self.intermediate_size, "intermediate_size")?,
            layers: nonzero(self.num_hidden_layers, "num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            vocab: nonzero(self.vocab_size, "vocab_size")?,
            tie_embeddings: self.tie_word_embeddings,
            qkv_bias,
            o_bias,
            qk_norm,
        })
    }
}

/// A validated decoder-only transformer (Qwen2 / Llama family: RMSNorm,
/// grouped-query attention, SwiGLU MLP, tied or untied embeddings).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSpec {
    pub name: String,
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub tie_embeddings: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    /// Qwen3's RMSNorm over each head of q and k (`q_norm`, `k_norm`:
    /// `head_dim` weights each per layer).
    pub qk_norm: bool,
}

impl ModelSpec {
    /// Width of the query projection's output (`heads · head_dim`).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Width of one of the key / value projections' outputs.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Parameters of one decoder layer: attention (q, k, v, o with their
    /// biases, Qwen3's q/k norms), SwiGLU MLP (gate, up, down) and two
    /// RMSNorm weights.
    pub fn layer_params(&self) -> u64 {
        let (h, q, kv) = (self.hidden, self.q_dim(), self.kv_dim());
        let attn = h * q + 2 * h * kv + q * h;
        let bias = if self.qkv_bias { q + 2 * kv } else { 0 } + if self.o_bias { h } else { 0 };
        let qk_norm = if self.qk_norm { 2 * self.head_dim } else { 0 };
        let mlp = 3 * h * self.intermediate;
        attn + bias + qk_norm + mlp + 2 * h
    }

    /// Parameters outside the decoder layers: the embedding, the LM head
    /// (unless tied) and the final norm.
    pub fn non_layer_params(&self) -> u64 {
        let emb = self.vocab * self.hidden;
        emb + if self.tie_embeddings { 0 } else { emb } + self.hidden
    }

    /// Total parameter count.
    pub fn params(&self) -> u64 {
        self.layers * self.layer_params() + self.non_layer_params()
    }

    /// Parameters that take part in matrix products per token (everything
    /// but the embedding lookup), for FLOP counts.
    pub fn matmul_params(&self) -> u64 {
        self.layers * self.layer_params() + self.vocab * self.hidden
    }

    /// Bytes of the weights in `dtype`.
    pub fn weight_bytes(&self, dtype: DType) -> u64 {
        self.params() * dtype.bytes()
    }

    /// KV-cache bytes per token for the whole model: `2 (K and V) · layers ·
    /// kv_heads · head_dim · bytes`.
    pub fn kv_bytes_per_token(&self, dtype: DType) -> u64 {
        2 * self.layers * self.kv_dim() * dtype.bytes()
    }

    /// KV-cache bytes per token on one device of a generation layout with
    /// `pg` pipeline stages and `tg`-way tensor parallelism: layers split by
    /// `pg`, KV heads by `tg` (replicated when `tg` exceeds the KV heads, as
    /// SGLang and vLLM do).
    pub fn kv_bytes_per_token_sharded(&self, dtype: DType, pg: u64, tg: u64) -> u64 {
        let layers = self.layers.div_ceil(pg);
        let kv_heads = self.kv_heads.div_ceil(tg);
        2 * layers * kv_heads * self.head_dim * dtype.bytes()
    }

    /// Activation elements stored for backward per token by one decoder
    /// layer without recomputation, with FlashAttention (no `s × s` score
    /// matrix) and no dropout.
    ///
    /// Follows Korthikanti et al., *Reducing Activation Recomputation in
    /// Large Transformer Models* (2022), §4.1, redone for RMSNorm, GQA and
    /// SwiGLU: attention keeps its norm input and the QKV input (`2h`), Q, K,
    /// V (`q + 2kv`) and the output projection's input (`q`); the MLP keeps
    /// its norm input and its input (`2h`), gate and up outputs (`2i`), the
    /// SiLU output (`i`) and the down projection's input (`i`). For
    /// Qwen2.5-7B that is `6h + 2kv + 4i = 98,304` elements.
    pub fn activation_elems_per_token_layer(&self) -> u64 {
        4 * self.hidden + 2 * self.q_dim() + 2 * self.kv_dim() + 4 * self.intermediate
    }

    /// Elements one decoder layer keeps per token in an *eager* forward
    /// that records a graph for backward, with sequences of `seq` tokens:
    /// every saved op output lives until backward ends. This is colo's own
    /// trainer (colo-model on libtorch, no fused attention), counted from
    /// its forward: the two RMSNorm outputs, the output and down
    /// projections and the two residual sums (`6h`); Q's projection, RoPE,
    /// the probabilities' product with V and its transposed copy (`4q`);
    /// K's RoPE, V's projection and contiguous copy (`3kv`: K's projection
    /// and the biases' sums are consumed by RoPE's products with constant
    /// tables, which save only the tables, and freed); the softmax
    /// probabilities, `heads × seq` per token (libtorch's masked softmax
    /// keeps only its output for backward); and gate, SiLU, up and their
    /// product (`4i`). Checked within 10% against real runs by
    /// `crates/colo/tests/plan_vs_run.rs`.
    pub fn eager_elems_per_token_layer(&self, seq: u64) -> u64 {
        let (h, q, kv) = (self.hidden, self.q_dim(), self.kv_dim());
        6 * h + 4 * q + 3 * kv + self.heads * seq + 4 * self.intermediate
    }

    /// Forward FLOPs per token with `context` tokens of attention context:
    /// `2 · matmul params` plus the attention scores and weighted sum
    /// (`4 · layers · q_dim · context`), Kaplan et al. (2020) / Chinchilla's
    /// accounting.
    pub fn forward_flops_per_token(&self, context: u64) -> f64 {
        2.0 * self.matmul_params() as f64
            + 4.0 * (self.layers * self.q_dim()) as f64 * context as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen7b_json() -> &'static str {
        // The fields of Qwen/Qwen2.5-7B-Instruct's config.json (abridged).
        r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2",
            "hidden_size":3584,"intermediate_size":18944,"num_hidden_layers":28,
            "num_attention_heads":28,"num_key_value_heads":4,"vocab_size":152064,
            "tie_word_embeddings":false,"torch_dtype":"bfloat16","rope_theta":1000000.0}"#
    }

    #[test]
    fn qwen2_config_gets_qkv_bias_and_derived_head_dim() {
        let spec = HfConfig::from_json(qwen7b_json())
            .unwrap()
            .into_spec("q")
            .unwrap();
        assert_eq!(spec.head_dim, 128);
        assert!(spec.qkv_bias && !spec.o_bias);
        assert_eq!(spec.params(), 7_615_616_512);
    }

    #[test]
    fn llama_attention_bias_adds_four_biases() {
        let text = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "vocab_size":100,"attention_bias":true}"#;
        let with = HfConfig::from_json(text).unwrap().into_spec("a").unwrap();
        let without = HfConfig::from_json(&text.replace("true", "false"))
            .unwrap()
            .into_spec("b")
            .unwrap();
        // q (64) + k (32) + v (32) + o (64) biases per layer.
        assert_eq!(with.layer_params() - without.layer_params(), 192);
    }

    #[test]
    fn inconsistent_heads_are_rejected() {
        let text = r#"{"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
            "num_attention_heads":6,"num_key_value_heads":4,"vocab_size":100}"#;
        let err = HfConfig::from_json(text)
            .unwrap()
            .into_spec("x")
            .unwrap_err();
        assert!(
            err.to_string().contains("multiple of num_key_value_heads"),
            "{err}"
        );
    }

    #[test]
    fn kv_sharding_replicates_heads_beyond_tg() {
        let spec = HfConfig::from_json(qwen7b_json())
            .unwrap()
            .into_spec("q")
            .unwrap();
        let full = spec.kv_bytes_per_token(DType::Bf16);
        assert_eq!(spec.kv_bytes_per_token_sharded(DType::Bf16, 1, 2), full / 2);
        // 4 KV heads over 8 ranks: each rank still holds one head.
        assert_eq!(spec.kv_bytes_per_token_sharded(DType::Bf16, 1, 8), full / 4);
        assert_eq!(spec.kv_bytes_per_token_sharded(DType::Bf16, 2, 1), full / 2);
    }

    #[test]
    fn dtype_spellings() {
        assert_eq!(DType::parse("bfloat16").unwrap(), DType::Bf16);
        assert_eq!(DType::parse("FP8").unwrap().bytes(), 1);
        assert!(DType::parse("int3")
            .unwrap_err()
            .to_string()
            .contains("bf16"));
    }
}
