//! The sections of the run configuration as written in the TOML file: every
//! key with its doc comment and default (the built-in task's run), unknown
//! keys refused; and the methods that compute what the run reads in
//! another shape from a section's keys. Validated once, with the keys that
//! an unset value resolves to written in
//! ([`Config::from_toml`](super::Config::from_toml)).
//!
//! Names follow verl's where verl has one (`data.train_batch_size`,
//! `actor.ppo_mini_batch_size`, `algorithm.adv_estimator`, …); verl's longer
//! spellings are accepted as aliases where ours differ.

use std::path::{Path, PathBuf};

use colo_algo::{
    AdvEstimator, AdvantageConfig, KlControlConfig, KlEstimator, LossAggMode, OverlongBuffer,
    PolicyLossConfig, PolicyLossMode, RolloutCorrectionConfig,
};
use colo_keys::Keys;
use serde::{Deserialize, Serialize};
use smart_default::SmartDefault;

use super::{Capacity, DataSource, ValSource, DEFAULT_TOTAL_STEPS};
use super::{FilterMetric, KvBudget, RunLength, Sampling};
use crate::data::Overlong;
use crate::task::ArithmeticTask;

/// One value or a list of them, as verl writes either.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// Paths: `data.train_files`, `data.val_files`.
pub type Files = OneOrMany<PathBuf>;
/// `trainer.logger`'s backends.
pub type Loggers = OneOrMany<String>;

impl<T> Default for OneOrMany<T> {
    fn default() -> Self {
        OneOrMany::Many(Vec::new())
    }
}

/// The values, one or many.
impl<T> std::ops::Deref for OneOrMany<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            OneOrMany::One(v) => std::slice::from_ref(v),
            OneOrMany::Many(v) => v,
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "data")]
pub struct DataConfig {
    /// training prompts: JSONL files (one object per line) or parquet files
    /// (verl's, as they are; README: "The data schema"); none means the
    /// built-in arithmetic task
    #[key(unit = "paths (one or a list)")]
    pub train_files: Files,
    /// held-out prompts for eval/accuracy: JSONL or parquet files; with neither
    /// these nor val_fraction the run does not evaluate
    #[key(unit = "paths (one or a list)")]
    pub val_files: Files,
    /// instead of val_files: hold out this fraction of the training prompts
    /// (seeded split)
    #[key(
        range = "(0, 1)",
        unit = "fraction in (0, 1)",
        unset = "val_files are the held-out set (none: no evaluation)",
        no_verl
    )]
    pub val_fraction: Option<f64>,
    /// field holding the prompt: a string, or a chat (a list of {role, content}
    /// messages rendered with the tokenizer's chat template)
    #[key(unit = "JSON key")]
    #[default = "prompt"]
    pub prompt_key: String,
    /// field holding the ground truth the reward compares with; a dotted path
    /// reaches into objects
    #[key(
        unit = "JSON key or dotted path",
        verl = "reward_model.ground_truth (fixed in verl)"
    )]
    #[default = "answer"]
    pub answer_key: String,
    /// prompts per RL step (each sampled rollout.n times)
    #[key(range = "≥ 1", unit = "prompts")]
    #[default = 32]
    pub train_batch_size: usize,
    /// prompts per generation batch with dynamic sampling
    /// (algorithm.filter_groups); DAPO draws 3 × train_batch_size
    #[key(range = "≥ 1", unit = "prompts", unset = "data.train_batch_size")]
    pub gen_batch_size: Option<usize>,
    /// longest prompt, as the run encodes it (chat template and special tokens
    /// included); a longer one is an error when the data are read, or is left
    /// out with filter_overlong_prompts
    #[key(
        range = "≥ 1",
        unit = "tokens",
        verl = ".max_prompt_length (with truncation = \"error\")"
    )]
    #[default = 64]
    pub max_prompt_length: usize,
    /// leave out prompts longer than max_prompt_length (counted on stderr when
    /// the data are read) instead of stopping at the first
    pub filter_overlong_prompts: bool,
    /// seed of the epoch shuffles and of the held-out split
    #[key(unit = "integer", unset = "trainer.seed")]
    pub seed: Option<u64>,
    /// shuffle the prompts each epoch (else file order)
    #[default = true]
    pub shuffle: bool,
    /// The built-in task (used when `train_files` is empty).
    #[key(table)]
    pub builtin: ArithmeticTask,
}

impl DataConfig {
    /// Where the prompts come from: no files is the built-in task.
    pub fn source(&self) -> DataSource {
        if self.train_files.is_empty() {
            return DataSource::Builtin(self.builtin.clone());
        }
        let val = match (self.val_files.to_vec(), self.val_fraction) {
            (v, _) if !v.is_empty() => ValSource::Files(v),
            (_, Some(f)) => ValSource::Fraction(f),
            (_, None) => ValSource::None,
        };
        let train = self.train_files.to_vec();
        DataSource::Files { train, val }
    }

    /// What a longer prompt does when the data are read.
    pub fn overlong(&self) -> Overlong {
        match self.filter_overlong_prompts {
            true => Overlong::Drop,
            false => Overlong::Error,
        }
    }
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "actor_rollout_ref.model")]
pub struct ModelConfig {
    /// Hugging Face checkpoint directory (config.json, *.safetensors,
    /// tokenizer.json)
    #[key(
        unit = "path",
        unset = "the built-in 0.8M-parameter model and its committed SFT checkpoint"
    )]
    pub path: Option<PathBuf>,
    /// activation checkpointing in the actor's and critic's updates: keep each
    /// decoder layer's input, recompute the layer for the backward (less
    /// activation memory, one more forward); on with cluster.sharding = "full"
    pub enable_gradient_checkpointing: bool,
    /// rank of the LoRA adapters the actor trains instead of its weights: the
    /// weights stay frozen (no gradients, optimizer state or master copies), the
    /// reference is the model with the adapters off (no second copy), the rollout
    /// engine gets the adapters merged in; checkpoints hold the merged model and
    /// lora_adapter/ in PEFT's format. 0: no adapters, every weight trains. The
    /// critic (GAE) trains all its weights either way
    #[key(unit = "rank (0: off)")]
    pub lora_rank: usize,
    /// LoRA's alpha: the adapters' output is scaled by lora_alpha / lora_rank
    #[key(range = "> 0")]
    #[default = 16.0]
    pub lora_alpha: f64,
    /// the projections that get adapters: "all-linear" (every projection of the
    /// decoder layers, not the LM head) or a list of q_proj, k_proj, v_proj,
    /// o_proj, gate_proj, up_proj, down_proj
    #[key(unit = "\"all-linear\" or a list of projection names")]
    pub target_modules: colo_train::TargetModules,
    /// dropout on the adapters' input in training; only 0 is implemented
    #[key(unit = "fraction (0 only)", no_verl)]
    pub lora_dropout: f64,
    /// start the adapters from a saved PEFT adapter (a directory with
    /// adapter_config.json and adapter_model.safetensors, e.g. a checkpoint's
    /// lora_adapter/) instead of fresh ones; its r, lora_alpha and target_modules
    /// must be the keys above
    #[key(
        unit = "path",
        unset = "fresh adapters (PEFT's initialisation: B = 0, the model starts as the base)"
    )]
    pub lora_adapter_path: Option<PathBuf>,
}

impl ModelConfig {
    /// The actor's LoRA settings, when `lora_rank` is set.
    pub fn lora(&self) -> Option<colo_train::LoraConfig> {
        (self.lora_rank > 0).then(|| colo_train::LoraConfig {
            rank: self.lora_rank,
            alpha: self.lora_alpha,
            target_modules: self.target_modules.clone(),
            dropout: self.lora_dropout,
            adapter_path: self.lora_adapter_path.clone(),
            seed: 0,
        })
    }

    /// The checkpoint directory to load. The built-in model is written out
    /// into `scratch` (a directory of the run) by
    /// [`crate::task::builtin_checkpoint`], so both sources load the same way.
    pub fn resolve(&self, scratch: &Path) -> crate::Result<PathBuf> {
        match &self.path {
            None => crate::task::builtin_checkpoint(scratch),
            Some(p) => Ok(p.clone()),
        }
    }
}

/// `[rollout]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "actor_rollout_ref.rollout")]
pub struct RolloutConfig {
    /// samples generated per prompt
    #[key(range = "≥ 1", unit = "samples")]
    #[default = 8]
    pub n: usize,
    /// sampling temperature; 0 is greedy
    #[key(range = "[0, 100]", unit = "≥ 0")]
    #[default = 1.0]
    pub temperature: f64,
    /// nucleus sampling: keep the smallest set of tokens with this much
    /// probability
    #[key(range = "(0, 1]")]
    #[default = 1.0]
    pub top_p: f64,
    /// keep the k most likely tokens; -1 or 0: off
    #[key(unit = "tokens")]
    #[default(-1)]
    pub top_k: i64,
    /// longest response; with data.max_prompt_length at most the model's
    /// max_position_embeddings (a longer pair is refused, as verl refuses it)
    #[serde(alias = "response_length", alias = "max_response_length")]
    #[key(range = "≥ 1", unit = "tokens", verl = "data.max_response_length")]
    #[default = 6]
    pub max_new_tokens: usize,
    /// share of the device memory left after weights that the KV cache takes
    /// (ignored when max_kv_tokens is set)
    #[serde(alias = "gpu_memory_utilization")]
    #[key(
        range = "(0, 1]",
        unit = "fraction in (0, 1]",
        verl = ".gpu_memory_utilization"
    )]
    #[default = 0.5]
    pub mem_fraction: f64,
    /// KV-cache size in tokens, instead of mem_fraction
    #[key(
        range = "≥ 1",
        unit = "tokens",
        unset = "the cache is sized by mem_fraction",
        no_verl
    )]
    pub max_kv_tokens: Option<usize>,
    /// most sequences generated at once (fewer when the KV cache's blocks run
    /// short); the cache is sized for a step's samples at full length, and
    /// evaluation fits more of its short answers in it
    #[key(range = "≥ 1", unit = "sequences")]
    #[default = 1024]
    pub max_num_seqs: usize,
    /// on the CPU, threads each prefill and decode step splits its rows over,
    /// each running libtorch with one intra-op thread (decoding is many small
    /// ops: lanes beat intra-op threads); 0: OMP_NUM_THREADS if set, else one
    /// per core
    #[key(unit = "threads", no_verl)]
    pub cpu_threads: usize,
    /// on CUDA, run every decode step eagerly instead of replaying captured
    /// CUDA graphs (graphs: a small model's step is bound by launching its
    /// kernels; their memory is tag cuda_graph, released and resumed with the
    /// KV cache)
    pub enforce_eager: bool,
    /// workers whose rollout engines generate as one, Megatron-style: each keeps
    /// 1/tg of the attention heads (its KV cache too) and of the MLP, with an
    /// all-reduce after the output and down projections; the group's ranks are
    /// consecutive and generate their prompts together; must divide
    /// cluster.workers and the model's heads
    #[key(range = "≥ 1", unit = "workers")]
    #[default = 1]
    pub tensor_model_parallel_size: usize,
    /// Sampling for evaluation.
    #[key(table)]
    pub val_kwargs: ValKwargs,
}

impl RolloutConfig {
    /// The training samples' sampling.
    pub fn sampling(&self) -> Sampling {
        Sampling::new(self.temperature, self.top_p, self.top_k)
    }

    /// The evaluations' sampling.
    pub fn val_sampling(&self) -> Sampling {
        let v = &self.val_kwargs;
        Sampling::new(v.temperature, v.top_p, v.top_k)
    }

    /// The KV cache's size: `max_kv_tokens` when set, else `mem_fraction`.
    pub fn kv(&self) -> KvBudget {
        match self.max_kv_tokens {
            Some(t) => KvBudget::Tokens(t),
            None => KvBudget::Fraction(self.mem_fraction),
        }
    }

    /// Generation's CPU lanes (`None`: one per core).
    pub fn threads(&self) -> Option<usize> {
        (self.cpu_threads > 0).then_some(self.cpu_threads)
    }
}

impl Sampling {
    /// `top_k` -1 or 0 is off.
    fn new(temperature: f64, top_p: f64, top_k: i64) -> Self {
        Sampling {
            temperature,
            top_p,
            top_k: positive(top_k),
        }
    }
}

/// `[rollout.val_kwargs]`: greedy by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "actor_rollout_ref.rollout.val_kwargs")]
pub struct ValKwargs {
    /// evaluation: samples per held-out prompt (pass@n)
    #[key(range = "≥ 1", unit = "samples")]
    #[default = 1]
    pub n: usize,
    /// evaluation: temperature; 0 is greedy
    #[key(range = "[0, 100]", unit = "≥ 0")]
    #[default = 0.0]
    pub temperature: f64,
    /// evaluation: nucleus sampling
    #[key(range = "(0, 1]")]
    #[default = 1.0]
    pub top_p: f64,
    /// evaluation: top-k; -1 or 0: off
    #[key(unit = "tokens")]
    #[default(-1)]
    pub top_k: i64,
}

/// Prompts per optimiser step when `actor.ppo_mini_batch_size` is unset
/// (and it divides the step's prompts).
pub const DEFAULT_MINI_BATCH_PROMPTS: usize = 16;
/// Samples per forward/backward when `actor.ppo_micro_batch_size` is
/// unset: as many samples of the longest length the run allows
/// (`data.max_prompt_length + rollout.max_new_tokens`) as the token
/// budget `actor.ppo_max_token_len_per_gpu` holds — verl's budget, 16,384
/// tokens by default — at least one, then down to what divides a
/// mini-batch.
///
/// A micro-batch's memory and its op count go with its tokens, not its
/// samples: a fixed count (64 samples, before 2026-11-27) was
/// 98,304 tokens for a 1,536-token job and ~1,000 for the built-in one,
/// whose passes are then too small to keep two cores busy between ops
/// (64 → 128 samples: 125 → 103 ms a step, BENCHMARKS.md).
pub fn default_micro_batch_samples(longest: usize, token_budget: usize) -> usize {
    (token_budget / longest.max(1)).max(1)
}

/// `[actor]`: optimiser, PPO batching and the actor loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "actor_rollout_ref.actor")]
pub struct ActorConfig {
    /// AdamW learning rate
    #[key(range = "> 0", verl = ".optim.lr")]
    #[default = 1e-4]
    pub lr: f64,
    /// linear learning-rate warmup
    #[serde(alias = "warmup", alias = "lr_warmup_steps")]
    #[key(unit = "optimiser steps", verl = ".optim.lr_warmup_steps")]
    #[default = 5]
    pub warmup_steps: usize,
    /// AdamW weight decay
    #[key(range = "[0, 1]", verl = ".optim.weight_decay")]
    #[default = 0.01]
    pub weight_decay: f64,
    /// gradient-norm clip
    #[key(range = "> 0")]
    #[default = 1.0]
    pub grad_clip: f64,
    /// the learning rate after warmup: constant, or a half cosine that reaches
    /// min_lr_ratio × lr as the run ends
    #[serde(alias = "lr_scheduler_type")]
    #[key(unit = "\"constant\" or \"cosine\"", verl = ".optim.warmup_style")]
    pub warmup_style: colo_train::ScheduleKind,
    /// the cosine's floor as a fraction of lr
    #[key(range = "[0, 1]", verl = ".optim.min_lr_ratio")]
    #[default = 0.0]
    pub min_lr_ratio: f64,
    /// AdamW's (β₁, β₂)
    #[key(unit = "two numbers in [0, 1)", verl = ".optim.betas")]
    #[default(_code = "vec![0.9, 0.999]")]
    pub betas: Vec<f64>,
    /// prompts per optimiser step (× rollout.n samples); must divide
    /// data.train_batch_size
    #[key(
        range = "≥ 1",
        unit = "prompts",
        unset = "the largest divisor of data.train_batch_size up to 16"
    )]
    pub ppo_mini_batch_size: Option<usize>,
    /// samples per forward/backward pass (gradient accumulation); must divide
    /// ppo_mini_batch_size × rollout.n
    #[serde(alias = "ppo_micro_batch_size_per_gpu")]
    #[key(
        range = "≥ 1",
        unit = "samples",
        verl = ".ppo_micro_batch_size_per_gpu",
        unset = "the largest divisor of ppo_mini_batch_size × rollout.n up to ppo_max_token_len_per_gpu / (data.max_prompt_length + rollout.max_new_tokens)"
    )]
    pub ppo_micro_batch_size: Option<usize>,
    /// cut micro-batches by a token budget (ppo_max_token_len_per_gpu) instead
    /// of ppo_micro_batch_size: consecutive samples while samples × the longest
    /// stay within it; bounds activation memory as responses grow
    pub use_dynamic_bsz: bool,
    /// the budget of use_dynamic_bsz: padded tokens per forward/backward (the
    /// reference's too; the old-policy pass: twice it); at least
    /// max_prompt_length + max_new_tokens
    #[key(unit = "tokens")]
    #[default = 16384]
    pub ppo_max_token_len_per_gpu: usize,
    /// passes over each step's samples
    #[key(range = "≥ 1", unit = "epochs")]
    #[default = 1]
    pub ppo_epochs: usize,
    /// policy loss
    #[key(
        unit = "\"vanilla\" (PPO clip), \"gspo\", \"gpg\" (no ratio, no clip), \"cispo\" (clipped, stopped IS weight), \"kl_cov\" (no clip; a KL penalty on the tokens of largest covariance), \"clip_cov\" (PPO clip; a few tokens of large covariance lose their gradient), \"geo_mean\" (GMPO: the geometric mean of the token ratios, clipped in log space) or \"sapo\" (a soft gate of the ratio instead of the clip)",
        verl = ".policy_loss.loss_mode"
    )]
    #[default(PolicyLossMode::Vanilla)]
    pub loss_mode: PolicyLossMode,
    /// PPO clip ε (both sides unless clip_ratio_low/high are set)
    #[key(unit = "ratio")]
    #[default = 0.2]
    pub clip_ratio: f64,
    /// ε_low: the ratio floor is 1 − ε_low
    #[key(unit = "ratio", unset = "clip_ratio")]
    pub clip_ratio_low: Option<f64>,
    /// ε_high: the ratio ceiling is 1 + ε_high (DAPO: 0.28)
    #[key(unit = "ratio", unset = "clip_ratio")]
    pub clip_ratio_high: Option<f64>,
    /// dual-clip bound c: for negative advantages the loss is at most −c·A
    #[key(unit = "> 1")]
    #[default = 3.0]
    pub clip_ratio_c: f64,
    /// how per-token losses become a scalar (gspo and sapo always use
    /// seq-mean-token-mean, geo_mean a mean over sequences, as verl)
    #[key(
        unit = "\"token-mean\", \"seq-mean-token-sum\", \"seq-mean-token-mean\", \"seq-mean-token-sum-norm\""
    )]
    #[default(LossAggMode::TokenMean)]
    pub loss_agg_mode: LossAggMode,
    /// loss_mode = "kl_cov": the share of a micro-batch's response tokens,
    /// those of largest covariance between advantage and log-probability, that
    /// pay the KL penalty
    #[key(range = "(0, 1]", verl = ".policy_loss.kl_cov_ratio")]
    #[default = 0.0002]
    pub kl_cov_ratio: f64,
    /// loss_mode = "kl_cov": the penalty's coefficient on |log π_θ − log π_old|
    #[key(range = "≥ 0", verl = ".policy_loss.ppo_kl_coef")]
    #[default = 0.1]
    pub ppo_kl_coef: f64,
    /// loss_mode = "clip_cov": the share of a micro-batch's response tokens
    /// that lose their gradient (at least one per micro-batch, as in verl),
    /// drawn (seeded by the optimizer step) among those whose
    /// advantage/log-probability covariance lies in (clip_cov_lb, clip_cov_ub)
    #[key(range = "(0, 1]", verl = ".policy_loss.clip_cov_ratio")]
    #[default = 0.0002]
    pub clip_cov_ratio: f64,
    /// loss_mode = "clip_cov": the covariance range's lower end
    #[key(unit = "< clip_cov_ub", verl = ".policy_loss.clip_cov_lb")]
    #[default = 1.0]
    pub clip_cov_lb: f64,
    /// loss_mode = "clip_cov": the covariance range's upper end
    #[key(unit = "> clip_cov_lb", verl = ".policy_loss.clip_cov_ub")]
    #[default = 5.0]
    pub clip_cov_ub: f64,
    /// loss_mode = "sapo": the gate's temperature for tokens of positive
    /// advantage
    #[key(unit = "[1e-6, 1e6]")]
    #[default = 1.0]
    pub tau_pos: f64,
    /// loss_mode = "sapo": the gate's temperature for the others
    #[key(unit = "[1e-6, 1e6]")]
    #[default = 1.05]
    pub tau_neg: f64,
    /// entropy bonus coefficient
    #[key(range = "[-1, 1]")]
    #[default = 0.0]
    pub entropy_coeff: f64,
    /// add a KL(actor ‖ reference) term to the loss (loads the reference model)
    #[default = true]
    pub use_kl_loss: bool,
    /// coefficient of the KL loss
    #[key(range = "≥ 0")]
    #[default = 0.001]
    pub kl_loss_coef: f64,
    /// KL estimator of the loss
    #[key(unit = "\"k1\" (kl), \"abs\", \"k2\" (mse), \"k3\" (low_var_kl)")]
    #[default(KlEstimator::K3)]
    pub kl_loss_type: KlEstimator,
}

impl ActorConfig {
    /// The optimizer, for a run whose optimizer steps the engine is told.
    pub fn optim(&self) -> colo_train::OptimConfig {
        colo_train::OptimConfig {
            lr: self.lr,
            betas: (self.betas[0], self.betas[1]),
            weight_decay: self.weight_decay,
            warmup_steps: self.warmup_steps as u64,
            schedule: self.warmup_style,
            min_lr_ratio: self.min_lr_ratio,
            grad_clip: (self.grad_clip > 0.0).then_some(self.grad_clip),
            ..colo_train::OptimConfig::default()
        }
    }

    /// The policy loss's settings.
    pub fn policy_loss(&self) -> PolicyLossConfig {
        PolicyLossConfig {
            loss_mode: self.loss_mode,
            clip_ratio: self.clip_ratio,
            clip_ratio_low: self.clip_ratio_low,
            clip_ratio_high: self.clip_ratio_high,
            clip_ratio_c: self.clip_ratio_c,
            loss_agg_mode: self.loss_agg_mode,
            kl_cov_ratio: self.kl_cov_ratio,
            ppo_kl_coef: self.ppo_kl_coef,
            clip_cov_ratio: self.clip_cov_ratio,
            clip_cov_lb: self.clip_cov_lb,
            clip_cov_ub: self.clip_cov_ub,
            tau_pos: self.tau_pos,
            tau_neg: self.tau_neg,
        }
    }
}

/// `[critic]`: PPO's value model (`algorithm.adv_estimator = "gae"`),
/// verl's `critic.*`. Unset optimizer keys are the actor's; the schedule's
/// shape and the betas are the actor's too. The clip is verl's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "critic")]
pub struct CriticConfig {
    /// the value model's learning rate (PPO with algorithm.adv_estimator =
    /// "gae"; verl's default is 10× its actor's)
    #[key(range = "> 0", verl = ".optim.lr", unset = "actor.lr")]
    pub lr: Option<f64>,
    /// its linear warmup (the schedule's shape and the betas are the actor's)
    #[serde(alias = "lr_warmup_steps")]
    #[key(
        unit = "optimiser steps",
        verl = ".optim.lr_warmup_steps",
        unset = "actor.warmup_steps"
    )]
    pub warmup_steps: Option<usize>,
    /// its AdamW weight decay
    #[key(
        range = "[0, 1]",
        verl = ".optim.weight_decay",
        unset = "actor.weight_decay"
    )]
    pub weight_decay: Option<f64>,
    /// its gradient-norm clip
    #[key(range = "> 0", unset = "actor.grad_clip")]
    pub grad_clip: Option<f64>,
    /// the value loss's clip around the values the step started from
    #[key(range = "> 0")]
    #[default = 0.5]
    pub cliprange_value: f64,
    /// how the value loss is averaged over tokens
    #[key(unit = "as actor.loss_agg_mode", unset = "actor.loss_agg_mode")]
    pub loss_agg_mode: Option<LossAggMode>,
}

/// `[algorithm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "algorithm")]
pub struct AlgorithmConfig {
    /// advantage estimator
    #[key(
        unit = "\"grpo\", \"rloo\", \"reinforce_plus_plus\", \"reinforce_plus_plus_baseline\", \"remax\", \"opo\", \"grpo_passk\", \"gpg\", \"gae\" (trains a critic)"
    )]
    #[default(AdvEstimator::Grpo)]
    pub adv_estimator: AdvEstimator,
    /// discount (GAE, REINFORCE++)
    #[key(range = "[0, 1]")]
    #[default = 1.0]
    pub gamma: f64,
    /// GAE λ
    #[key(range = "[0, 1]")]
    #[default = 1.0]
    pub lam: f64,
    /// divide GRPO advantages by the group's std (false: Dr. GRPO)
    #[default = true]
    pub norm_adv_by_std_in_grpo: bool,
    /// subtract β·KL(actor ‖ reference) from the reward (loads the reference
    /// model)
    pub use_kl_in_reward: bool,
    /// KL estimator of the reward penalty
    #[key(unit = "\"k1\", \"abs\", \"k2\", \"k3\"")]
    #[default(KlEstimator::K1)]
    pub kl_penalty: KlEstimator,
    #[key(table)]
    pub kl_ctrl: KlControlConfig,
    #[key(table)]
    pub rollout_correction: RolloutCorrectionConfig,
    #[key(table)]
    pub overlong_buffer: OverlongBufferConfig,
    #[key(table)]
    pub filter_groups: FilterGroupsConfig,
}

impl AlgorithmConfig {
    pub fn advantage(&self) -> AdvantageConfig {
        AdvantageConfig {
            adv_estimator: self.adv_estimator,
            gamma: self.gamma,
            lam: self.lam,
            norm_adv_by_std_in_grpo: self.norm_adv_by_std_in_grpo,
            ..AdvantageConfig::default()
        }
    }

    /// DAPO's overlong punishment, when enabled.
    pub fn overlong_punishment(&self) -> Option<OverlongBuffer> {
        let b = &self.overlong_buffer;
        b.enable.then_some(OverlongBuffer {
            len: b.len,
            penalty_factor: b.penalty_factor,
        })
    }
}

/// `[algorithm.overlong_buffer]`: DAPO's soft overlong punishment
/// (`colo_algo::overlong`), verl's `reward_model.overlong_buffer`. Off by
/// default, with DAPO's factor (verl's default is 0, which punishes nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "reward_model.overlong_buffer")]
pub struct OverlongBufferConfig {
    /// DAPO's soft overlong punishment of the training rewards: a response in
    /// the last `len` tokens before rollout.max_new_tokens loses up to
    /// penalty_factor, linearly (evaluations are not punished)
    pub enable: bool,
    /// tokens before the limit over which the punishment grows
    #[key(unit = "1 to rollout.max_new_tokens")]
    pub len: usize,
    /// the punishment at the limit (DAPO: 1.0; verl's default 0 punishes
    /// nothing)
    #[key(range = "≥ 0")]
    #[default = 1.0]
    pub penalty_factor: f64,
}

/// `[algorithm.filter_groups]`: DAPO's dynamic sampling
/// (`colo_algo::dynamic_sampling`), verl's names. Off by default, with
/// DAPO's metric (verl has none by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "algorithm.filter_groups")]
pub struct FilterGroupsConfig {
    /// DAPO's dynamic sampling: a step trains only on prompts whose samples'
    /// metric varies (a group that all scored the same has no advantage),
    /// drawing generation batches of data.gen_batch_size prompts until it has
    /// data.train_batch_size of them
    pub enable: bool,
    /// what must vary within a group: acc (right or not: the reward's `acc`,
    /// else score ≥ 1), score (before the overlong punishment), seq_reward
    /// (after it), seq_final_reward (after the KL penalty; not with
    /// use_kl_in_reward), or a number the reward returns beside its score
    #[key(
        unit = "\"acc\", \"score\", \"seq_reward\", \"seq_final_reward\" or a reward extra's name"
    )]
    #[default(FilterMetric::Acc)]
    pub metric: FilterMetric,
    /// the most generation batches a step may draw before the run stops with an
    /// error (the data are too hard or too easy)
    #[key(unit = "batches; ≤ 0 no limit")]
    pub max_num_gen_batches: i64,
}

impl FilterGroupsConfig {
    /// The most generation batches a step may draw (`None`: no limit).
    pub fn max_gen_batches(&self) -> Option<usize> {
        positive(self.max_num_gen_batches)
    }
}

/// How trainer and rollout engine share the device (the four modes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Colocation {
    /// Everything stays resident.
    Naive,
    /// The trainer writes safetensors; the rollout engine is rebuilt from
    /// them each step.
    Restart,
    /// All rollout memory is resumed at once.
    Sleep,
    /// Multi-stage awake: weights, sync, free the trainer's copy, then the
    /// KV cache.
    #[default]
    Staged,
}

/// How much a train → rollout switch gives up: the training passes' cached
/// blocks and the parts the `offload_*` flags allow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffloadPolicy {
    /// As far as the rollout engine needs the room, cheapest first (the
    /// cache, then the optimizer state, the gradients, the parameters);
    /// what stays is not copied out and back, nor faulted in again.
    #[default]
    AsNeeded,
    /// All of it at every switch (verl offloads what its flags say and
    /// empties PyTorch's cache): the least memory at every moment, for a
    /// device shared with memory colo does not see.
    Always,
}

/// `[memory]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// device capacity the memory layer enforces; "auto": the device's memory
    /// (the built-in model on the CPU: 72 MiB in f32, 44 MiB in bf16; otherwise
    /// the machine's memory, or the GPU's)
    #[key(unit = "\"auto\", bytes, or \"512 MiB\" / \"2 GB\"")]
    pub capacity: Capacity,
    /// how trainer and rollout engine share the device
    #[serde(alias = "mode")]
    #[key(unit = "\"naive\", \"restart\", \"sleep\", \"staged\"")]
    pub colocation: Colocation,
    /// while generating, the trainer's parameters go to host memory
    #[key(verl = "actor_rollout_ref.actor.fsdp_config.param_offload")]
    #[default = true]
    pub offload_train_param: bool,
    /// while generating, the trainer's gradients go to host memory
    #[default = true]
    pub offload_train_grad: bool,
    /// while generating, the optimiser state goes to host memory
    #[key(verl = "actor_rollout_ref.actor.fsdp_config.optimizer_offload")]
    #[default = true]
    pub offload_train_optimizer: bool,
    /// the reference model may wait in host memory between uses: after every
    /// pass with offload_policy "always"; with "as_needed" only where no step
    /// as large has run yet or its peak left no room for it, and at a switch
    /// whose engine needs the room
    #[key(verl = "actor_rollout_ref.ref.fsdp_config.param_offload")]
    #[default = true]
    pub offload_ref: bool,
    /// how much a train → rollout switch gives up (sleep, staged): "as_needed":
    /// the training cache, a kept reference, then what the offload_* flags
    /// allow (optimizer, grads, params), only as far as the rollout engine
    /// needs the room; "always": all of it every switch
    #[key(unit = "\"as_needed\", \"always\"")]
    pub offload_policy: OffloadPolicy,
}

/// Where the run computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
}

impl Device {
    /// Its name in a config (`trainer.device`) and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }

    /// The libtorch device (CUDA: device 0 of the process).
    pub fn torch(self) -> tch::Device {
        match self {
            Device::Cpu => tch::Device::Cpu,
            Device::Cuda => tch::Device::Cuda(0),
        }
    }
}

/// The dtype of the models' weights and compute (`trainer.dtype`, verl's
/// `model_dtype`). bf16 is mixed precision: bf16 weights and passes, float32
/// gradient accumulators, optimizer moments and master weights; on the CPU
/// it runs oneDNN's bf16 kernels (AMX or AVX-512 BF16). `auto`, the
/// default, is bf16 where the device multiplies bf16 natively — a CUDA
/// device, a CPU with AVX512_BF16 or AMX-BF16 — and f32 elsewhere, as
/// verl's actor (bf16 parameters by default) and TRL's `bf16` default do on
/// hardware that has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dtype {
    #[default]
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "f32", alias = "float32", alias = "fp32")]
    F32,
    #[serde(rename = "bf16", alias = "bfloat16")]
    Bf16,
}

impl Dtype {
    /// The dtype a run on `device` computes in: `auto` decided, the others
    /// as they are.
    pub fn resolve(self, device: Device) -> Dtype {
        match self {
            Dtype::Auto if native_bf16(device) => Dtype::Bf16,
            Dtype::Auto => Dtype::F32,
            d => d,
        }
    }

    /// The libtorch kind of a run on `device`.
    pub fn kind(self, device: Device) -> tch::Kind {
        match self.resolve(device) {
            Dtype::Bf16 => tch::Kind::BFloat16,
            _ => tch::Kind::Float,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Auto => "auto",
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }
}

/// Whether `device` multiplies bf16 in hardware: every CUDA device colo is
/// built for (pre-Ampere GPUs emulate bf16 slowly: set `f32` there); a CPU
/// with a bf16 matrix instruction set ([`crate::process::cpu_has_bf16`],
/// read once for the process).
fn native_bf16(device: Device) -> bool {
    match device {
        Device::Cuda => true,
        Device::Cpu => crate::process::cpu_has_bf16(),
    }
}

/// `[trainer]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Keys, SmartDefault)]
#[serde(default, deny_unknown_fields)]
#[key(verl = "trainer")]
pub struct TrainerConfig {
    /// length of the run; wins over total_epochs
    #[serde(alias = "total_training_steps")]
    #[key(
        range = "≥ 1",
        unit = "RL steps",
        verl = ".total_training_steps",
        unset = "total_epochs, or 100 steps when neither is set"
    )]
    pub total_steps: Option<usize>,
    /// length of the run in passes over the training prompts (used when
    /// total_steps is unset)
    #[key(range = "≥ 1", unit = "epochs", unset = "total_steps decides")]
    pub total_epochs: Option<usize>,
    /// checkpoint every this many steps; -1 or 0: only at the end
    #[key(unit = "steps")]
    #[default = 50]
    pub save_freq: i64,
    /// evaluate every this many steps; -1 or 0: only before (val_before_train)
    /// and at the end
    #[key(unit = "steps")]
    #[default = 10]
    pub test_freq: i64,
    /// evaluate the starting checkpoint
    #[default = true]
    pub val_before_train: bool,
    /// evaluate model.path on the held-out prompts (an eval record in
    /// metrics.jsonl, the generations in validation_data_dir if set) and train
    /// nothing; to evaluate a run's checkpoint, set model.path to
    /// checkpoints/step-N
    #[key(verl = ".val_only (verl loads a resumed checkpoint; colo reads model.path)")]
    pub val_only: bool,
    /// continue from the latest checkpoint in out_dir (also: colo train
    /// --resume)
    #[key(verl = ".resume_mode = \"auto\"")]
    pub resume: bool,
    /// run directory: metrics.jsonl, pictures, checkpoints/ (colo train --out
    /// wins)
    #[serde(alias = "default_local_dir", skip_serializing_if = "Option::is_none")]
    #[key(
        unit = "path",
        verl = ".default_local_dir",
        unset = "runs/{project_name}/{experiment_name} when either is set, else runs/colo"
    )]
    pub out_dir: Option<PathBuf>,
    /// the project's name; names the run directory when out_dir is not written
    #[serde(skip_serializing_if = "Option::is_none")]
    #[key(unit = "path component", unset = "none")]
    pub project_name: Option<String>,
    /// the run's name; names the run directory when out_dir is not written
    #[serde(skip_serializing_if = "Option::is_none")]
    #[key(unit = "path component", unset = "none")]
    pub experiment_name: Option<String>,
    /// where metrics go: colo always writes the console and metrics.jsonl, so
    /// only these two are accepted (other backends are an error)
    #[serde(skip_serializing_if = "Option::is_none")]
    #[key(
        unit = "\"console\", \"file\" or a list of them",
        unset = "both, always"
    )]
    pub logger: Option<Loggers>,
    /// steps at the start that train only the critic, so the actor's first
    /// update has learnt values (GAE)
    #[key(
        unit = "RL steps",
        verl = ".critic_warmup (verl updates the actor from step critic_warmup; colo after critic_warmup steps)"
    )]
    pub critic_warmup: usize,
    /// every step's generations as {step}.jsonl in this directory (a relative
    /// path is in the run directory, --out), one line a sample: input (the
    /// prompt as the model saw it), output, gts, score (the training reward),
    /// step and the reward's other numbers
    #[serde(skip_serializing_if = "Option::is_none")]
    #[key(unit = "path", unset = "not written")]
    pub rollout_data_dir: Option<PathBuf>,
    /// every evaluation's greedy generations as {step}.jsonl in this directory
    /// (a relative path is in the run directory), as rollout_data_dir's
    #[serde(skip_serializing_if = "Option::is_none")]
    #[key(unit = "path", unset = "not written")]
    pub validation_data_dir: Option<PathBuf>,
    /// seed of sampling and initialisation; data.seed defaults to it
    #[key(unit = "integer", verl = "data.seed, actor_rollout_ref.rollout.seed")]
    #[default = 1]
    pub seed: u64,
    /// where the run computes
    #[key(unit = "\"cpu\" or \"cuda\"", no_verl)]
    pub device: Device,
    /// dtype of weights and compute; bf16 is mixed precision (gradients,
    /// optimiser moments and master weights stay f32); auto: bf16 where the
    /// device multiplies bf16 natively (CUDA; a CPU with AVX512_BF16 or
    /// AMX-BF16), else f32
    #[serde(alias = "model_dtype")]
    #[key(
        unit = "\"auto\", \"f32\" or \"bf16\"",
        verl = "actor_rollout_ref.model.dtype"
    )]
    pub dtype: Dtype,
    /// on the CPU, threads the trainer's passes split each micro-batch's rows
    /// over, each running libtorch with one intra-op thread (many small ops:
    /// lanes beat intra-op threads); 0: OMP_NUM_THREADS if set, else one per
    /// core
    #[key(unit = "threads", no_verl)]
    pub cpu_threads: usize,
}

/// `-1` / `0` (any `≤ 0`) → `None`: verl's "off" for `top_k`, "never"
/// for frequencies, "no limit" for `max_num_gen_batches`.
fn positive(v: i64) -> Option<usize> {
    usize::try_from(v).ok().filter(|&v| v > 0)
}

impl TrainerConfig {
    /// How long the run is: `total_steps`, else `total_epochs`, else 100
    /// steps.
    pub fn length(&self) -> RunLength {
        match (self.total_steps, self.total_epochs) {
            (Some(s), _) => RunLength::Steps(s),
            (None, Some(e)) => RunLength::Epochs(e),
            (None, None) => RunLength::Steps(DEFAULT_TOTAL_STEPS),
        }
    }

    /// Steps between checkpoints (`None`: only at the end).
    pub fn save_every(&self) -> Option<usize> {
        positive(self.save_freq)
    }

    /// Steps between evaluations (`None`: only before, if
    /// `val_before_train`, and at the end).
    pub fn test_every(&self) -> Option<usize> {
        positive(self.test_freq)
    }

    /// The trainer's CPU lanes (`None`: `OMP_NUM_THREADS`, else one per
    /// core).
    pub fn threads(&self) -> Option<usize> {
        (self.cpu_threads > 0).then_some(self.cpu_threads)
    }

    /// `rollout_data_dir` and `validation_data_dir` where a run into the
    /// run directory `out` writes them: a relative path is in `out`, so
    /// that two runs with other `--out` keep their dumps apart; an absolute
    /// one is kept.
    pub fn dumps_in(&self, out: &Path) -> (Option<PathBuf>, Option<PathBuf>) {
        let place = |d: &Option<PathBuf>| d.as_ref().map(|d| out.join(d));
        (
            place(&self.rollout_data_dir),
            place(&self.validation_data_dir),
        )
    }
}

/// `[cluster]`: the devices of a data-parallel run (colo-py's controller on
/// Ray). Absent: the in-process single-device run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Keys)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// data-parallel workers, one per device, on Ray (colo-py's controller); 1:
    /// this process alone
    #[key(
        range = "≥ 1",
        unit = "devices",
        verl = "trainer.n_gpus_per_node × trainer.nnodes",
        unset = "the layout's devices, else 1"
    )]
    pub workers: Option<usize>,
    /// a layout from `colo plan map` for the run to execute; data-parallel
    /// "1-1-N" only
    #[key(unit = "\"p-t-d\"", unset = "none")]
    pub layout: Option<String>,
    /// the trainer's state on the workers: "none", a whole copy of the parameters,
    /// gradients and optimizer state on each; "full", each split 1/N over them
    /// (FSDP / ZeRO-3: a decoder layer's weights gathered just before it computes
    /// and freed after, the embeddings, final norm and heads for a whole pass),
    /// which resolves model.enable_gradient_checkpointing to true (false is an
    /// error); the reference model and the rollout engine stay whole on every
    /// worker
    #[key(
        unit = "\"none\" or \"full\"",
        verl = "actor_rollout_ref.actor.strategy = \"fsdp\" with fsdp_config.fsdp_size = -1 (full) or 1 (none)"
    )]
    pub sharding: Sharding,
    /// the Ray cluster to join
    #[key(
        unit = "\"auto\" or host:port",
        verl = "ray_init / RAY_ADDRESS",
        unset = "a local Ray instance, started and stopped by the run"
    )]
    pub address: Option<String>,
}

impl ClusterConfig {
    /// Data-parallel workers, one per device; 1 runs in this process.
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or(1)
    }

    /// The parts the trainer's state is split into: the workers when
    /// sharded, else 1 (a whole copy on each).
    pub fn shards(&self) -> usize {
        match self.sharding {
            Sharding::Full => self.workers(),
            Sharding::None => 1,
        }
    }
}

/// How a data-parallel run keeps the trainer's state (`[cluster] sharding`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharding {
    /// Every worker holds a whole copy (replicas, gradients all-reduced).
    #[default]
    None,
    /// Parameters, gradients, AdamW state and masters split over the
    /// workers, each unit's weights gathered while it computes.
    Full,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_dtypes_are_kept_and_auto_is_bf16_on_cuda() {
        for d in [Device::Cpu, Device::Cuda] {
            assert_eq!(Dtype::F32.resolve(d), Dtype::F32);
            assert_eq!(Dtype::Bf16.resolve(d), Dtype::Bf16);
        }
        assert_eq!(Dtype::Auto.resolve(Device::Cuda), Dtype::Bf16);
        assert_eq!(Dtype::Auto.kind(Device::Cuda), tch::Kind::BFloat16);
    }
}
