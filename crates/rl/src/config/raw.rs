//! The run configuration as written in the TOML file: every section and key
//! with its default (the built-in task's run), unknown keys refused. Turned
//! into the validated [`Config`](super::Config) once, by
//! [`RawConfig::validate`](super::validate).
//!
//! Names follow verl's where verl has one (`data.train_batch_size`,
//! `actor.ppo_mini_batch_size`, `algorithm.adv_estimator`, …); verl's longer
//! spellings are accepted as aliases where ours differ.

use std::path::PathBuf;

use colo_algo::{AdvEstimator, IsLevel, KlControlConfig, KlEstimator, LossAggMode, PolicyLossMode};
use serde::{Deserialize, Serialize};

use crate::reward::RewardSpec;
use crate::task::ArithmeticTask;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawConfig {
    pub data: RawData,
    pub model: RawModel,
    pub rollout: RawRollout,
    pub actor: RawActor,
    pub critic: RawCritic,
    pub algorithm: RawAlgorithm,
    pub reward: RewardSpec,
    pub memory: RawMemory,
    pub trainer: RawTrainer,
    pub cluster: RawCluster,
}

/// One path or a list of them (verl accepts both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Files {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

impl Default for Files {
    fn default() -> Self {
        Files::Many(Vec::new())
    }
}

impl Files {
    pub fn to_vec(&self) -> Vec<PathBuf> {
        match self {
            Files::One(p) => vec![p.clone()],
            Files::Many(v) => v.clone(),
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawData {
    /// JSONL files; none means the built-in task.
    pub train_files: Files,
    /// Held-out JSONL files for `eval/accuracy`…
    pub val_files: Files,
    /// …or this fraction of the training files held out.
    pub val_fraction: Option<f64>,
    pub prompt_key: String,
    /// The ground truth: a key, or a dotted path (`reward_model.ground_truth`).
    pub answer_key: String,
    /// Prompts per RL step.
    pub train_batch_size: usize,
    /// Prompts per generation batch with dynamic sampling
    /// (`algorithm.filter_groups`); absent means `train_batch_size`.
    pub gen_batch_size: Option<usize>,
    /// Longer prompts (in tokens) are an error when the data are read…
    pub max_prompt_length: usize,
    /// …or are left out.
    pub filter_overlong_prompts: bool,
    /// The shuffling seed; absent means `trainer.seed`.
    pub seed: Option<u64>,
    pub shuffle: bool,
    /// The built-in task (used when `train_files` is empty).
    pub builtin: ArithmeticTask,
}

impl Default for RawData {
    fn default() -> Self {
        RawData {
            train_files: Files::default(),
            val_files: Files::default(),
            val_fraction: None,
            prompt_key: "prompt".into(),
            answer_key: "answer".into(),
            train_batch_size: 32,
            gen_batch_size: None,
            max_prompt_length: 64,
            filter_overlong_prompts: false,
            seed: None,
            shuffle: true,
            builtin: ArithmeticTask::default(),
        }
    }
}

/// `[model]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawModel {
    /// A Hugging Face checkpoint directory; absent means the built-in model.
    pub path: Option<PathBuf>,
    /// Activation checkpointing in the actor's (and critic's) updates.
    pub enable_gradient_checkpointing: bool,
}

/// `[rollout]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRollout {
    /// Samples per prompt.
    pub n: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// `-1` or `0`: off (verl's `-1`).
    pub top_k: i64,
    #[serde(alias = "response_length", alias = "max_response_length")]
    pub max_new_tokens: usize,
    /// The share of the device's free memory for the KV cache (verl's
    /// `gpu_memory_utilization`); ignored when `max_kv_tokens` is set.
    #[serde(alias = "gpu_memory_utilization")]
    pub mem_fraction: f64,
    /// A KV-cache size in tokens, instead of `mem_fraction`.
    pub max_kv_tokens: Option<usize>,
    /// Most sequences generated at once (verl's and vLLM's name and
    /// default); fewer when the KV cache's blocks run short.
    pub max_num_seqs: usize,
    /// On the CPU, the threads prefill and decode steps split their rows
    /// over (each with one libtorch intra-op thread); 0: OMP_NUM_THREADS, else one per core.
    pub cpu_threads: usize,
    /// On CUDA, decode eagerly instead of replaying captured CUDA graphs
    /// (vLLM's and verl's name; default false: graphs).
    pub enforce_eager: bool,
    /// Sampling for evaluation.
    pub val_kwargs: RawValKwargs,
}

impl Default for RawRollout {
    fn default() -> Self {
        RawRollout {
            n: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            max_new_tokens: 6,
            mem_fraction: 0.5,
            max_kv_tokens: None,
            max_num_seqs: 1024,
            cpu_threads: 0,
            enforce_eager: false,
            val_kwargs: RawValKwargs::default(),
        }
    }
}

/// `[rollout.val_kwargs]`: greedy by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawValKwargs {
    pub n: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
}

impl Default for RawValKwargs {
    fn default() -> Self {
        RawValKwargs {
            n: 1,
            temperature: 0.0,
            top_p: 1.0,
            top_k: -1,
        }
    }
}

/// `[actor]`: optimiser, PPO batching and the actor loss.
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawActor {
    pub lr: f64,
    #[serde(alias = "warmup", alias = "lr_warmup_steps")]
    pub warmup_steps: usize,
    pub weight_decay: f64,
    pub grad_clip: f64,
    /// After warmup: `constant`, or `cosine` decay to `min_lr_ratio` × lr
    /// as the run ends.
    #[serde(alias = "lr_scheduler_type")]
    pub warmup_style: colo_train::ScheduleKind,
    pub min_lr_ratio: f64,
    /// AdamW's (β₁, β₂).
    pub betas: Vec<f64>,
    /// Prompts per optimiser step (verl's unit; × `rollout.n` samples);
    /// unset: [`DEFAULT_MINI_BATCH_PROMPTS`], or the largest divisor of
    /// `data.train_batch_size` below it.
    pub ppo_mini_batch_size: Option<usize>,
    /// Samples per forward/backward pass; unset:
    /// [`default_micro_batch_samples`], or the largest divisor of a
    /// mini-batch's samples below it.
    #[serde(alias = "ppo_micro_batch_size_per_gpu")]
    pub ppo_micro_batch_size: Option<usize>,
    /// Micro-batches by a token budget instead of `ppo_micro_batch_size`.
    pub use_dynamic_bsz: bool,
    /// The budget: padded tokens per forward/backward (per device).
    pub ppo_max_token_len_per_gpu: usize,
    pub ppo_epochs: usize,
    pub loss_mode: PolicyLossMode,
    pub clip_ratio: f64,
    pub clip_ratio_low: Option<f64>,
    pub clip_ratio_high: Option<f64>,
    pub clip_ratio_c: f64,
    pub loss_agg_mode: LossAggMode,
    /// KL-Cov's share of tokens and its coefficient (verl's
    /// `policy_loss.kl_cov_ratio`, `policy_loss.ppo_kl_coef`).
    pub kl_cov_ratio: f64,
    pub ppo_kl_coef: f64,
    /// Clip-Cov's share of tokens and covariance range (verl's
    /// `policy_loss.clip_cov_{ratio,lb,ub}`).
    pub clip_cov_ratio: f64,
    pub clip_cov_lb: f64,
    pub clip_cov_ub: f64,
    /// SAPO's gate temperatures (verl's `actor.tau_pos`, `actor.tau_neg`).
    pub tau_pos: f64,
    pub tau_neg: f64,
    pub entropy_coeff: f64,
    pub use_kl_loss: bool,
    pub kl_loss_coef: f64,
    pub kl_loss_type: KlEstimator,
}

impl Default for RawActor {
    fn default() -> Self {
        RawActor {
            lr: 1e-4,
            warmup_steps: 5,
            weight_decay: 0.01,
            grad_clip: 1.0,
            warmup_style: colo_train::ScheduleKind::Constant,
            min_lr_ratio: 0.0,
            betas: vec![0.9, 0.999],
            ppo_mini_batch_size: None,
            ppo_micro_batch_size: None,
            use_dynamic_bsz: false,
            ppo_max_token_len_per_gpu: 16384,
            ppo_epochs: 1,
            loss_mode: PolicyLossMode::Vanilla,
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: 3.0,
            loss_agg_mode: LossAggMode::TokenMean,
            kl_cov_ratio: 0.0002,
            ppo_kl_coef: 0.1,
            clip_cov_ratio: 0.0002,
            clip_cov_lb: 1.0,
            clip_cov_ub: 5.0,
            tau_pos: 1.0,
            tau_neg: 1.05,
            entropy_coeff: 0.0,
            use_kl_loss: true,
            kl_loss_coef: 0.001,
            kl_loss_type: KlEstimator::K3,
        }
    }
}

/// `[critic]`: PPO's value model (`algorithm.adv_estimator = "gae"`),
/// verl's `critic.*`. Unset optimizer keys are the actor's; the schedule's
/// shape and the betas are the actor's too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCritic {
    pub lr: Option<f64>,
    #[serde(alias = "lr_warmup_steps")]
    pub warmup_steps: Option<usize>,
    pub weight_decay: Option<f64>,
    pub grad_clip: Option<f64>,
    /// The clip of the value loss around the old values.
    pub cliprange_value: f64,
    pub loss_agg_mode: Option<LossAggMode>,
}

impl Default for RawCritic {
    /// verl's clip; the actor's optimizer settings.
    fn default() -> Self {
        RawCritic {
            lr: None,
            warmup_steps: None,
            weight_decay: None,
            grad_clip: None,
            cliprange_value: 0.5,
            loss_agg_mode: None,
        }
    }
}

/// `[algorithm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawAlgorithm {
    pub adv_estimator: AdvEstimator,
    pub gamma: f64,
    pub lam: f64,
    pub norm_adv_by_std_in_grpo: bool,
    pub use_kl_in_reward: bool,
    pub kl_penalty: KlEstimator,
    pub kl_ctrl: KlControlConfig,
    pub rollout_correction: RawRolloutCorrection,
    pub overlong_buffer: RawOverlongBuffer,
    pub filter_groups: RawFilterGroups,
}

impl Default for RawAlgorithm {
    fn default() -> Self {
        RawAlgorithm {
            adv_estimator: AdvEstimator::Grpo,
            gamma: 1.0,
            lam: 1.0,
            norm_adv_by_std_in_grpo: true,
            use_kl_in_reward: false,
            kl_penalty: KlEstimator::K1,
            kl_ctrl: KlControlConfig::default(),
            rollout_correction: RawRolloutCorrection::default(),
            overlong_buffer: RawOverlongBuffer::default(),
            filter_groups: RawFilterGroups::default(),
        }
    }
}

/// `[algorithm.overlong_buffer]`: DAPO's soft overlong punishment
/// (`colo_algo::overlong`), verl's `reward_model.overlong_buffer`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawOverlongBuffer {
    pub enable: bool,
    pub len: usize,
    pub penalty_factor: f64,
}

impl Default for RawOverlongBuffer {
    /// Off; DAPO's factor (verl's default is 0, which punishes nothing).
    fn default() -> Self {
        RawOverlongBuffer {
            enable: false,
            len: 0,
            penalty_factor: 1.0,
        }
    }
}

/// `[algorithm.filter_groups]`: DAPO's dynamic sampling
/// (`colo_algo::dynamic_sampling`), verl's names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawFilterGroups {
    pub enable: bool,
    /// What must vary within a group: `acc`, `score`, `seq_reward`,
    /// `seq_final_reward`, or a number the reward returns beside its score.
    pub metric: String,
    /// Generation batches a step may draw; ≤ 0 sets no limit (verl's).
    pub max_num_gen_batches: i64,
}

impl Default for RawFilterGroups {
    /// Off; DAPO's metric (verl has none by default).
    fn default() -> Self {
        RawFilterGroups {
            enable: false,
            metric: "acc".into(),
            max_num_gen_batches: 0,
        }
    }
}

/// `[algorithm.rollout_correction]`: truncated importance sampling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawRolloutCorrection {
    pub rollout_is: Option<IsLevel>,
    pub rollout_is_threshold: f64,
}

impl Default for RawRolloutCorrection {
    fn default() -> Self {
        RawRolloutCorrection {
            rollout_is: None,
            rollout_is_threshold: 2.0,
        }
    }
}

/// A device capacity: `"auto"`, a number of bytes, or a size such as
/// `"512MiB"` / `"2GB"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RawCapacity {
    Bytes(u64),
    Text(String),
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawMemory {
    pub capacity: RawCapacity,
    #[serde(alias = "mode")]
    pub colocation: Colocation,
    /// While generating: the trainer's parameters, gradients, optimiser
    /// state and the reference model go to host memory.
    pub offload_train_param: bool,
    pub offload_train_grad: bool,
    pub offload_train_optimizer: bool,
    pub offload_ref: bool,
    pub offload_policy: OffloadPolicy,
}

impl Default for RawMemory {
    fn default() -> Self {
        RawMemory {
            capacity: RawCapacity::Text("auto".into()),
            colocation: Colocation::Staged,
            offload_train_param: true,
            offload_train_grad: true,
            offload_train_optimizer: true,
            offload_ref: true,
            offload_policy: OffloadPolicy::AsNeeded,
        }
    }
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

/// `trainer.logger`: one backend or a list, as verl writes either.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Loggers {
    One(String),
    Many(Vec<String>),
}

/// `[trainer]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawTrainer {
    /// Wins over `total_epochs` when both are given (as in verl).
    #[serde(alias = "total_training_steps")]
    pub total_steps: Option<usize>,
    pub total_epochs: Option<usize>,
    /// Checkpoint every this many steps; `0` or `-1`: only at the end.
    pub save_freq: i64,
    /// Evaluate every this many steps; `0` or `-1`: only before and after.
    pub test_freq: i64,
    pub val_before_train: bool,
    /// Evaluate the starting model on the held-out prompts, and stop.
    pub val_only: bool,
    /// Continue from the latest checkpoint in `out_dir`.
    pub resume: bool,
    /// Unset: `runs/{project_name}/{experiment_name}` when either is set
    /// (verl's `checkpoints/${project_name}/${experiment_name}`), else
    /// `runs/colo`.
    #[serde(alias = "default_local_dir", skip_serializing_if = "Option::is_none")]
    pub out_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experiment_name: Option<String>,
    /// verl's `trainer.logger`: `"console"`, `"file"` or a list of them.
    /// colo always writes both (the console and `metrics.jsonl`); other
    /// backends (wandb, tensorboard, …) are an error, not ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logger: Option<Loggers>,
    /// Steps that train the critic only, before the actor's first update.
    pub critic_warmup: usize,
    /// Every step's generations as `{step}.jsonl` in this directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_data_dir: Option<PathBuf>,
    /// Every evaluation's generations as `{step}.jsonl` in this directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation_data_dir: Option<PathBuf>,
    pub seed: u64,
    pub device: Device,
    #[serde(alias = "model_dtype")]
    pub dtype: Dtype,
    /// On the CPU, the threads the trainer's passes split their rows over
    /// (each with one libtorch intra-op thread); 0: OMP_NUM_THREADS, else one per core.
    pub cpu_threads: usize,
}

impl Default for RawTrainer {
    fn default() -> Self {
        RawTrainer {
            total_steps: None,
            total_epochs: None,
            save_freq: 50,
            test_freq: 10,
            val_before_train: true,
            val_only: false,
            resume: false,
            out_dir: None,
            project_name: None,
            experiment_name: None,
            logger: None,
            critic_warmup: 0,
            rollout_data_dir: None,
            validation_data_dir: None,
            seed: 1,
            device: Device::Cpu,
            dtype: Dtype::Auto,
            cpu_threads: 0,
        }
    }
}

/// `[cluster]`: the devices of a data-parallel run (colo-py's controller on
/// Ray). Absent: the in-process single-device run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCluster {
    /// Devices, one worker each; unset: the layout's, else 1 (the
    /// in-process path).
    pub workers: Option<usize>,
    /// A layout from `colo plan map`, `"p-t-d"` (pipeline, tensor, data);
    /// colo train executes data-parallel layouts `"1-1-N"`.
    pub layout: Option<String>,
    /// A Ray cluster (`"auto"` or `host:port`); unset: a local one.
    pub address: Option<String>,
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
