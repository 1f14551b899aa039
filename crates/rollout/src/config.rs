//! Engine configuration: the serde form users write, validated once into the
//! plain numbers the engine runs with.

use colo_mem::Policy;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How the engine is set up (`[rollout]` in a run's TOML file).
///
/// The KV pool is sized either like SGLang's `mem_fraction_static` — a
/// fraction of the device capacity left after the weights are loaded — or
/// by an explicit token count. Exactly one of the two must be set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Fraction of the pool's free capacity (after weights) given to the KV
    /// cache, in (0, 1].
    pub mem_fraction: Option<f64>,
    /// KV cache size in tokens (rounded up to whole blocks).
    pub max_kv_tokens: Option<usize>,
    /// Most sequences in one decode step (vLLM's `max_num_seqs`); fewer run
    /// when the KV cache's free blocks run short.
    pub max_batch: usize,
    /// The longest sequence (prompt + new tokens) the caller will ask for.
    /// With `mem_fraction`, the KV cache is capped at what `kv_seqs` such
    /// sequences can use, so a small run on a big device does not reserve
    /// (and wake, every step) a cache it never touches; `None`: no cap.
    pub max_seq_len: Option<usize>,
    /// The sequences that cap is sized for (`None`: `max_batch`). A caller
    /// whose full-length sequences are fewer than it lets run at once (an
    /// RL step's samples, against a held-out set of short greedy answers)
    /// sizes the cache for the former and lets the scheduler fit more of
    /// the latter in it.
    pub kv_seqs: Option<usize>,
    /// Bytes of weights converted and copied per bucket in `update_weights`.
    pub weight_bucket_bytes: usize,
    /// What `release(["weights"])` does with their contents: `overwrite`
    /// (the RL default: `update_weights` rewrites them all after the wake,
    /// so the wake populates their pages up front, off the copy's path),
    /// `discard`, or `backup`.
    pub weights_policy: Policy,
    /// On the CPU, the threads a prefill or decode step splits its rows
    /// over, each running libtorch with one intra-op thread (see
    /// `colo_model::lanes`); 0: the process's share (`colo_model::lanes::count`). Ignored off the CPU.
    pub cpu_threads: usize,
    /// On CUDA, run every decode step eagerly instead of replaying captured
    /// CUDA graphs (vLLM's `enforce_eager`; see `crate::graphs`). Ignored
    /// off CUDA, where there are no graphs.
    pub enforce_eager: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            mem_fraction: None,
            max_kv_tokens: None,
            max_batch: 256,
            max_seq_len: None,
            kv_seqs: None,
            weight_bucket_bytes: 64 << 20,
            weights_policy: Policy::Overwrite,
            cpu_threads: 0,
            enforce_eager: false,
        }
    }
}

/// How big the KV pool is, once validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    Fraction(f64),
    Tokens(usize),
}

/// The checked configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidConfig {
    pub block_size: usize,
    pub budget: KvBudget,
    pub max_batch: usize,
    pub max_seq_len: Option<usize>,
    /// Sequences of `max_seq_len` the KV cap holds.
    pub kv_seqs: usize,
    pub weight_bucket_bytes: usize,
    pub weights_policy: Policy,
    pub cpu_threads: usize,
    pub enforce_eager: bool,
}

impl ValidConfig {
    /// With `mem_fraction`, the most blocks the KV cache takes: `kv_seqs`
    /// sequences of `max_seq_len`, whole blocks each (`None` without a
    /// `max_seq_len`: the fraction alone). `colo plan` predicts the same.
    pub fn cap_blocks(&self) -> Option<usize> {
        let len = self.max_seq_len?;
        Some(crate::block_table::blocks_for(len, self.block_size).saturating_mul(self.kv_seqs))
    }
}

impl EngineConfig {
    /// A configuration with an explicit KV budget in tokens.
    pub fn with_kv_tokens(tokens: usize) -> Self {
        EngineConfig {
            max_kv_tokens: Some(tokens),
            ..Self::default()
        }
    }

    /// Checks every value once.
    pub fn validate(&self) -> Result<ValidConfig> {
        let bad = |m: String| Err(Error::Config(m));
        if self.block_size == 0 {
            return bad("block_size must be at least 1".into());
        }
        if self.max_batch == 0 {
            return bad("max_batch must be at least 1".into());
        }
        if self.max_seq_len == Some(0) {
            return bad("max_seq_len must be at least 1".into());
        }
        if self.kv_seqs == Some(0) {
            return bad("kv_seqs must be at least 1".into());
        }
        if self.weight_bucket_bytes == 0 {
            return bad("weight_bucket_bytes must be at least 1".into());
        }
        let budget = match (self.mem_fraction, self.max_kv_tokens) {
            (Some(f), None) if f > 0.0 && f <= 1.0 => KvBudget::Fraction(f),
            (Some(f), None) => return bad(format!("mem_fraction must be in (0, 1], got {f}")),
            (None, Some(0)) => return bad("max_kv_tokens must be at least 1".into()),
            (None, Some(t)) => KvBudget::Tokens(t),
            (Some(_), Some(_)) => {
                return bad("set one of mem_fraction and max_kv_tokens, not both".into())
            }
            (None, None) => return bad("set mem_fraction or max_kv_tokens".into()),
        };
        Ok(ValidConfig {
            block_size: self.block_size,
            budget,
            max_batch: self.max_batch,
            max_seq_len: self.max_seq_len,
            kv_seqs: self.kv_seqs.unwrap_or(self.max_batch),
            weight_bucket_bytes: self.weight_bucket_bytes,
            weights_policy: self.weights_policy,
            cpu_threads: self.cpu_threads,
            enforce_eager: self.enforce_eager,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_budget() {
        assert!(EngineConfig::default().validate().is_err());
        let both = EngineConfig {
            mem_fraction: Some(0.5),
            ..EngineConfig::with_kv_tokens(64)
        };
        assert!(both
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not both"));
        let frac = EngineConfig {
            mem_fraction: Some(1.5),
            ..EngineConfig::default()
        };
        assert!(frac.validate().unwrap_err().to_string().contains("(0, 1]"));
        let ok = EngineConfig::with_kv_tokens(64).validate().unwrap();
        assert_eq!(ok.budget, KvBudget::Tokens(64));
    }
}
