//! The memory of generation alone (`colo generate`): the rollout engine's
//! weights, its KV cache, and the working set of its largest decode step.
//!
//! colo-rollout decodes a request's `n` samples together (its prompt is
//! prefilled once and forked, each sample into KV blocks of its own), so
//! the decode step's buffers grow with `n` as the KV cache does. Per row
//! the step holds vocabulary-sized float32 rows ([`DECODE_VOCAB_ROWS`]) and
//! the attention's gathered keys, values and scores, counted as
//! [`crate::memory::cuda_graph_bytes`] counts them.
//!
//! Checked against `colo generate` on the CPU (tiny-qwen2: vocabulary 384,
//! 512 KV bytes a token in float32; peak RSS less the 0.5 GB of a run with
//! `--n 1`): 437 MB measured for `--n 25000 --max-new-tokens 2` against
//! 479 MB estimated, 1.87 GB against 1.92 GB at `--n 100000`, 1.56 GB
//! against 1.69 GB at `--n 50000 --max-new-tokens 20`, 1.95 GB against
//! 2.45 GB at `--max-new-tokens 40`: at or above the measure, by 3–26%.

use serde::Serialize;

use crate::model::{DType, ModelSpec};

/// Float32 rows of the vocabulary's size that a decode step holds per
/// sequence while it samples: the logits, the scaled logits, the
/// probabilities, and the float64 cumulative sum drawn from (two).
/// The fit to the measures above.
pub const DECODE_VOCAB_ROWS: u64 = 6;

/// Bytes of one generation on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GenerationMemory {
    pub weights: u64,
    pub kv_cache: u64,
    /// The largest decode step's working set.
    pub decode: u64,
}

impl GenerationMemory {
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.kv_cache)
            .saturating_add(self.decode)
    }
}

/// The memory of decoding `rows` sequences of up to `keys` tokens at once
/// with weights and a KV cache of `kv_tokens` tokens in `dtype`. Saturates
/// rather than overflows: a request too large for any device stays too
/// large.
pub fn estimate(
    model: &ModelSpec,
    dtype: DType,
    kv_tokens: u64,
    rows: u64,
    keys: u64,
) -> GenerationMemory {
    let f32_bytes = DType::F32.bytes();
    // The attention's gathered keys and values with a quarter's headroom,
    // and its scores at 8 bytes (see `cuda_graph_bytes`).
    let gathered = 2 * keys.saturating_mul(model.kv_dim());
    let attention = (gathered + gathered / 4).saturating_mul(dtype.bytes())
        + 8u64.saturating_mul(model.heads).saturating_mul(keys);
    let per_row = (DECODE_VOCAB_ROWS * model.vocab * f32_bytes).saturating_add(attention);
    GenerationMemory {
        weights: model.weight_bytes(dtype),
        kv_cache: kv_tokens.saturating_mul(model.kv_bytes_per_token(dtype)),
        decode: rows.saturating_mul(per_row),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HfConfig;

    /// The dimensions of `testdata/tiny-qwen2`.
    fn tiny_qwen2() -> ModelSpec {
        HfConfig::from_json(
            r#"{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 160,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": 384, "tie_word_embeddings": true}"#,
        )
        .unwrap()
        .into_spec("tiny-qwen2")
        .unwrap()
    }

    /// `colo generate`'s cache: every sample in blocks of 16 of its own,
    /// and the padding block.
    fn kv_tokens(n: u64, seq: u64) -> u64 {
        (seq.div_ceil(16) * n + 1) * 16
    }

    #[test]
    fn follows_the_measured_peaks_from_above() {
        let m = tiny_qwen2();
        let mb = |b: u64| b as f64 / 1e6;
        // (n, max_new_tokens, measured MB) with a 3-token prompt.
        for (n, new, measured) in [
            (25_000, 2, 437.0),
            (100_000, 2, 1_868.0),
            (50_000, 20, 1_559.0),
        ] {
            let seq = 3 + new;
            let e = estimate(&m, DType::F32, kv_tokens(n, seq), n, seq);
            let ratio = mb(e.total()) / measured;
            assert!((1.0..1.15).contains(&ratio), "n {n}: {e:?}, {ratio}");
        }
        let e = estimate(&m, DType::F32, kv_tokens(100_000, 5), 100_000, 5);
        assert_eq!(e.kv_cache, (100_000 + 1) * 16 * 512);
        assert_eq!(
            e.decode,
            100_000 * (6 * 384 * 4 + 2 * 5 * 32 * 4 * 5 / 4 + 8 * 4 * 5)
        );
        assert_eq!(e.weights, m.params() * 4);
    }

    #[test]
    fn a_request_beyond_any_device_saturates() {
        let e = estimate(&tiny_qwen2(), DType::F32, u64::MAX, u64::MAX, 5);
        assert_eq!(e.total(), u64::MAX);
    }
}
