//! `config.json`: the published config's keys with a preset's shape.

use colo_plan::model::ModelSpec;
use colo_plan::presets::{Family, Published};
use serde_json::{json, Value};

use super::tokenizer::SmallTokenizer;
use super::{WeightDtype, INITIALIZER_RANGE};

/// The published `config.json` of `published.repo` with the shape of
/// `spec`: the same keys, sorted as transformers writes them, and the
/// token ids of `tok`.
pub(super) fn config_json(
    spec: &ModelSpec,
    published: &Published,
    dtype: WeightDtype,
    tok: &SmallTokenizer,
) -> Value {
    let family = published.family;
    let mut c = json!({
        "architectures": [family.architecture()],
        "attention_dropout": 0.0,
        "bos_token_id": tok.id(tok.config_bos),
        "eos_token_id": tok.id(tok.config_eos),
        "hidden_act": "silu",
        "hidden_size": spec.hidden,
        "initializer_range": INITIALIZER_RANGE,
        "intermediate_size": spec.intermediate,
        "max_position_embeddings": published.max_position_embeddings,
        "model_type": family.model_type(),
        "num_attention_heads": spec.heads,
        "num_hidden_layers": spec.layers,
        "num_key_value_heads": spec.kv_heads,
        "rms_norm_eps": published.rms_norm_eps,
        "rope_theta": published.rope_theta,
        "tie_word_embeddings": spec.tie_embeddings,
        // transformers 4 reads `torch_dtype`, 5 writes `dtype`.
        "torch_dtype": dtype.torch_name(),
        "dtype": dtype.torch_name(),
        "use_cache": true,
        "vocab_size": spec.vocab,
    });
    let qwen_window = |c: &mut Value| {
        c["max_window_layers"] = json!(published.max_window_layers);
        c["sliding_window"] = json!(published.sliding_window);
        c["use_sliding_window"] = json!(false);
    };
    match family {
        Family::Qwen2 => {
            qwen_window(&mut c);
            c["use_mrope"] = json!(false);
        }
        Family::Qwen3 => {
            qwen_window(&mut c);
            c["attention_bias"] = json!(false);
            c["head_dim"] = json!(spec.head_dim);
            c["rope_scaling"] = Value::Null;
        }
        Family::Llama => {
            c["attention_bias"] = json!(false);
            c["head_dim"] = json!(spec.head_dim);
            c["mlp_bias"] = json!(false);
            c["pretraining_tp"] = json!(1);
            c["rope_scaling"] = json!(published.rope_llama3.map(|r| json!({
                "factor": r.factor,
                "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position_embeddings,
                "rope_type": "llama3",
            })));
        }
    }
    c
}
