//! The run configuration: one TOML file, read once into a validated
//! [`Config`].
//!
//! ```toml
//! [data]
//! train_files = ["data/train.jsonl"]
//! val_files = ["data/val.jsonl"]
//! train_batch_size = 32          # prompts per step
//!
//! [model]
//! path = "checkpoints/qwen2-0.5b"
//!
//! [rollout]
//! n = 8
//! temperature = 1.0
//!
//! [actor]
//! lr = 1e-6
//! ppo_mini_batch_size = 16       # prompts; × n samples
//! ppo_micro_batch_size = 32      # samples
//!
//! [algorithm]
//! adv_estimator = "grpo"
//!
//! [reward]
//! kind = "numeric"
//! after = "####"
//! ```
//!
//! Every key has a default, and the defaults are the built-in task's run, so
//! an empty file (or none) is `colo train`'s default. The raw file
//! ([`RawConfig`], unknown keys refused) is turned once into [`Config`],
//! which checks values and batch sizes (prompts per step × n against the
//! mini- and micro-batches) and resolves derived numbers ([`BatchPlan`]);
//! [`Config::summary`] prints them, and [`Config::to_toml`] prints the
//! whole resolved file with a comment per key (`colo train --print-config`).
//! Errors carry the file, the line and the field
//! ([`Error::Config`](crate::Error::Config)).

mod locate;
mod num;
mod print;
pub mod raw;
mod summary;
mod validate;

use std::path::{Path, PathBuf};

use colo_algo::{
    AdvantageConfig, KlControlConfig, KlEstimator, LossAggMode, PolicyLossConfig,
    RolloutCorrectionConfig,
};

pub use raw::{Colocation, Device, Dtype, OffloadPolicy, RawConfig};
pub(crate) use validate::VAL_ONLY_RESUME;

use crate::data::{Fields, Overlong};
use crate::reward::RewardSpec;
use crate::task::ArithmeticTask;
use crate::{Error, Result};

/// The run directory of a run that names none (no `trainer.out_dir`, no
/// project or experiment name, no `--out`).
pub const DEFAULT_OUT_DIR: &str = "runs/colo";

/// Steps of the run when neither `total_steps` nor `total_epochs` is given.
pub const DEFAULT_TOTAL_STEPS: usize = 100;

/// A validated run configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub data: DataConfig,
    pub model: ModelSource,
    pub rollout: RolloutConfig,
    pub actor: ActorConfig,
    pub critic: CriticConfig,
    pub algorithm: AlgorithmConfig,
    pub reward: RewardSpec,
    pub memory: MemoryConfig,
    pub trainer: TrainerConfig,
    pub cluster: ClusterConfig,
    /// Batch sizes resolved from `data`, `rollout` and `actor`.
    pub batch: BatchPlan,
}

/// `[cluster]`: how many devices, through which Ray cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Data-parallel workers, one per device; 1 runs in this process.
    pub workers: usize,
    /// The `colo plan map` layout the run executes (`"1-1-N"`), if given.
    pub layout: Option<String>,
    /// A Ray cluster to join (`"auto"` or `host:port`); `None` starts a
    /// local one for the run.
    pub address: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DataSource {
    /// The built-in arithmetic task, generated into the run directory.
    Builtin(ArithmeticTask),
    Files {
        train: Vec<PathBuf>,
        val: ValSource,
    },
}

/// Where the held-out prompts come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ValSource {
    Files(Vec<PathBuf>),
    /// This fraction of the training prompts, held out by a seeded split.
    Fraction(f64),
    /// None: the run does not evaluate (OpenRLHF's and TRL's runs without an
    /// eval set).
    None,
}

impl Config {
    /// Whether the run has held-out prompts to evaluate on.
    pub fn evaluates(&self) -> bool {
        !matches!(
            self.data.source,
            DataSource::Files {
                val: ValSource::None,
                ..
            }
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DataConfig {
    pub source: DataSource,
    pub fields: Fields,
    pub max_prompt_length: usize,
    /// What a longer prompt does when the data are read.
    pub overlong: Overlong,
    pub seed: u64,
    pub shuffle: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// The built-in model ([`crate::task::model_config`]) from its committed
    /// SFT checkpoint.
    Builtin,
    Path(PathBuf),
}

impl ModelSource {
    /// The checkpoint directory to load. The built-in model is written out
    /// into `scratch` (a directory of the run) by
    /// [`crate::task::builtin_checkpoint`], so both sources load the same way.
    pub fn resolve(&self, scratch: &Path) -> Result<PathBuf> {
        match self {
            ModelSource::Builtin => crate::task::builtin_checkpoint(scratch),
            ModelSource::Path(p) => Ok(p.clone()),
        }
    }
}

/// Token sampling settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 is greedy.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
}

/// The KV cache's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// A share of the device memory left after weights.
    Fraction(f64),
    Tokens(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RolloutConfig {
    pub n: usize,
    pub sampling: Sampling,
    pub max_new_tokens: usize,
    pub kv: KvBudget,
    /// Most sequences generated at once (`rollout.max_num_seqs`).
    pub max_num_seqs: usize,
    /// Threads generation splits its rows over on the CPU (`None`: one
    /// per core), each with one intra-op thread (`colo_model::lanes`).
    pub cpu_threads: Option<usize>,
    /// On CUDA, decode eagerly: no CUDA graphs (`rollout.enforce_eager`).
    pub enforce_eager: bool,
    /// Evaluation: samples per prompt and their sampling.
    pub val_n: usize,
    pub val_sampling: Sampling,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimConfig {
    pub lr: f64,
    /// Optimizer steps of linear warmup.
    pub warmup_steps: usize,
    pub weight_decay: f64,
    pub grad_clip: f64,
    /// What follows the warmup (verl's `warmup_style`).
    pub schedule: colo_train::ScheduleKind,
    /// The cosine's floor as a fraction of `lr`.
    pub min_lr_ratio: f64,
    pub betas: (f64, f64),
}

impl OptimConfig {
    /// Why a run of `optimizer_steps` cannot take this schedule, if it
    /// cannot: a cosine decays after the warmup, so it needs more steps.
    pub fn schedule_error(&self, optimizer_steps: usize) -> Option<String> {
        (self.schedule == colo_train::ScheduleKind::Cosine && optimizer_steps <= self.warmup_steps)
            .then(|| {
                format!(
                    "actor.warmup_style = \"cosine\" decays over the run's optimizer steps, \
                     {optimizer_steps}, which must be more than actor.warmup_steps = {}",
                    self.warmup_steps
                )
            })
    }
}

/// The KL term of the actor loss (verl's `use_kl_loss`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KlLoss {
    pub coef: f64,
    pub estimator: KlEstimator,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ActorConfig {
    pub optim: OptimConfig,
    pub ppo_epochs: usize,
    pub policy_loss: PolicyLossConfig,
    pub entropy_coeff: f64,
    pub kl_loss: Option<KlLoss>,
    /// `model.enable_gradient_checkpointing`: the actor's and the
    /// critic's training passes keep each layer's input and recompute the
    /// layer for the backward (colo-train's `checkpointing.rs`).
    pub gradient_checkpointing: bool,
}

/// `[critic]`: the value model's training (GAE runs only).
#[derive(Debug, Clone, PartialEq)]
pub struct CriticConfig {
    /// The actor's, but for what `[critic]` sets.
    pub optim: OptimConfig,
    pub cliprange_value: f64,
    pub loss_agg_mode: LossAggMode,
}

/// KL as a reward penalty (verl's `use_kl_in_reward`).
#[derive(Debug, Clone, PartialEq)]
pub struct KlInReward {
    pub estimator: KlEstimator,
    pub ctrl: KlControlConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AlgorithmConfig {
    pub advantage: AdvantageConfig,
    pub kl_in_reward: Option<KlInReward>,
    pub rollout_correction: RolloutCorrectionConfig,
    /// DAPO's soft overlong punishment of the training rewards (not the
    /// evaluations').
    pub overlong_buffer: Option<colo_algo::OverlongBuffer>,
    /// DAPO's dynamic sampling, when enabled.
    pub filter_groups: Option<FilterGroups>,
}

/// `[algorithm.filter_groups]`: a step trains on `data.train_batch_size`
/// prompts whose samples' `metric` varies, drawing generation batches of
/// `data.gen_batch_size` prompts until it has them
/// (`colo_algo::dynamic_sampling`).
#[derive(Debug, Clone, PartialEq)]
pub struct FilterGroups {
    pub metric: FilterMetric,
    /// The most generation batches a step may draw (`None`: no limit).
    pub max_gen_batches: Option<usize>,
}

/// What must vary within a group for it to be trained on (verl's
/// `filter_groups.metric`).
#[derive(Debug, Clone, PartialEq)]
pub enum FilterMetric {
    /// Whether the sample is right: the number the reward returns as
    /// `acc` beside its score when it returns one (a verl function's
    /// dict), else whether it scored at least 1, as colo's accuracy counts.
    Acc,
    /// The reward's score, before any overlong punishment.
    Score,
    /// The training reward: the score with the overlong punishment (verl's
    /// summed `token_level_scores`).
    SeqReward,
    /// That and the KL penalty (verl's summed `token_level_rewards`); only
    /// without `use_kl_in_reward`, where it is `SeqReward`.
    SeqFinalReward,
    /// A number the reward returns beside its score, by name.
    Extra(String),
}

impl FilterMetric {
    pub fn parse(name: &str) -> Self {
        match name {
            "acc" => FilterMetric::Acc,
            "score" => FilterMetric::Score,
            "seq_reward" => FilterMetric::SeqReward,
            "seq_final_reward" => FilterMetric::SeqFinalReward,
            other => FilterMetric::Extra(other.to_owned()),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            FilterMetric::Acc => "acc",
            FilterMetric::Score => "score",
            FilterMetric::SeqReward => "seq_reward",
            FilterMetric::SeqFinalReward => "seq_final_reward",
            FilterMetric::Extra(name) => name,
        }
    }
}

impl AlgorithmConfig {
    /// Whether the reference model's log-probabilities are needed.
    pub fn needs_ref(&self, actor: &ActorConfig) -> bool {
        self.kl_in_reward.is_some() || actor.kl_loss.is_some()
    }
}

/// The device capacity the memory layer enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    /// The device's memory (CUDA), or on the CPU a capacity chosen by the
    /// run to make the choreography matter.
    Auto,
    Bytes(u64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct MemoryConfig {
    pub capacity: Capacity,
    pub colocation: Colocation,
    pub offload_train_param: bool,
    pub offload_train_grad: bool,
    pub offload_train_optimizer: bool,
    pub offload_ref: bool,
    pub offload_policy: OffloadPolicy,
}

/// How long the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    Steps(usize),
    Epochs(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrainerConfig {
    pub length: RunLength,
    /// `None`: checkpoint only at the end.
    pub save_freq: Option<usize>,
    /// `None`: evaluate only before (if `val_before_train`) and at the end.
    pub test_freq: Option<usize>,
    pub val_before_train: bool,
    /// Evaluate the starting model only (`colo train` trains nothing).
    pub val_only: bool,
    pub resume: bool,
    pub out_dir: PathBuf,
    /// verl's run names; with no `out_dir` written they name it.
    pub project_name: Option<String>,
    pub experiment_name: Option<String>,
    /// verl's `trainer.logger` as written (`"console"`, `"file"`): what
    /// colo writes anyway, kept so `--print-config` shows it.
    pub logger: Option<Vec<String>>,
    /// Steps at the start that update the critic only (GAE runs).
    pub critic_warmup: usize,
    /// verl's dumps of the generations, `{step}.jsonl` in these directories
    /// (see [`crate::generations`]): every step's, every evaluation's. As
    /// written: a relative path is in the run directory
    /// ([`TrainerConfig::dumps_in`]).
    pub rollout_data_dir: Option<PathBuf>,
    pub validation_data_dir: Option<PathBuf>,
    pub seed: u64,
    pub device: Device,
    pub dtype: Dtype,
    /// `None`: `OMP_NUM_THREADS`, else one per core.
    pub cpu_threads: Option<usize>,
}

impl TrainerConfig {
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

/// The batch sizes of one RL step, in prompts and samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPlan {
    /// `data.train_batch_size`.
    pub prompts_per_step: usize,
    /// `rollout.n`.
    pub n: usize,
    /// prompts_per_step × n: the sequences generated and trained on per step.
    pub samples_per_step: usize,
    /// `data.gen_batch_size`: prompts drawn per generation batch, more
    /// than one of which a step may take with dynamic sampling
    /// (`algorithm.filter_groups`); without it, `prompts_per_step`.
    pub gen_batch_prompts: usize,
    /// `actor.ppo_mini_batch_size` (prompts), and × n in samples.
    pub mini_batch_prompts: usize,
    pub mini_batch_samples: usize,
    /// Optimiser steps per PPO epoch.
    pub mini_batches_per_step: usize,
    /// `actor.ppo_micro_batch_size` (samples per forward/backward).
    pub micro_batch_samples: usize,
    /// Gradient accumulation steps per optimiser step (with
    /// `micro_batch_max_tokens`, the most there can be: one per sample).
    pub micro_batches_per_mini_batch: usize,
    /// `actor.ppo_max_token_len_per_gpu` when `actor.use_dynamic_bsz`:
    /// micro-batches of consecutive samples within this many padded tokens
    /// replace `micro_batch_samples` (the reference scores within it too;
    /// the old-policy pass within twice it, as colo-train's default).
    pub micro_batch_max_tokens: Option<usize>,
    /// mini_batches_per_step × ppo_epochs.
    pub optimizer_steps_per_step: usize,
}

impl BatchPlan {
    /// How a forward/backward cuts its samples: `micro_batch_samples`
    /// rows, or the token budget.
    pub fn micro_split(&self) -> colo_train::Split {
        match self.micro_batch_max_tokens {
            Some(t) => colo_train::Split::Tokens(t),
            None => colo_train::Split::Rows(self.micro_batch_samples),
        }
    }
}

impl Config {
    /// Reads and validates a TOML file for a run on this machine: a CUDA
    /// device must be present if the file asks for one.
    pub fn from_file(path: &Path) -> Result<Self> {
        let (config, text) = Self::from_file_to_plan(path)?;
        config.check_device(&text, path)?;
        Ok(config)
    }

    /// Reads and validates a TOML file to plan its run (`colo plan
    /// --config`), on a machine that need not have its device; also returns
    /// the file's text.
    pub fn from_file_to_plan(path: &Path) -> Result<(Self, String)> {
        if path.is_dir() {
            let e = std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "a directory, not a config file (TOML)",
            );
            return Err(Error::io(path, e));
        }
        if !path.is_file() {
            return Err(Error::MissingFile {
                what: "config file",
                path: path.to_owned(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Ok((Self::parse(&text, path)?, text))
    }

    /// Parses and validates TOML text for a run on this machine (see
    /// [`Config::from_file`]); `path` is only for messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self> {
        let config = Self::parse(text, path)?;
        config.check_device(text, path)?;
        Ok(config)
    }

    /// A CUDA run on a machine where libtorch sees no CUDA device is
    /// refused, naming the key's line of `text`.
    fn check_device(&self, text: &str, path: &Path) -> Result<()> {
        if self.trainer.device != Device::Cuda || tch::Cuda::is_available() {
            return Ok(());
        }
        let field = "trainer.device";
        Err(Error::Config {
            path: path.to_owned(),
            line: locate::key_line(text, field),
            field: field.into(),
            message: "is \"cuda\", but libtorch sees no CUDA device on this machine (use \"cpu\"; \
                      `colo plan --config` plans such a run anywhere)"
                .into(),
        })
    }

    /// Parses and validates TOML text, whatever this machine's devices.
    fn parse(text: &str, path: &Path) -> Result<Self> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| locate::toml_error(&e, text, path))?;
        validate::validate(raw).map_err(|(field, message)| {
            let line = locate::key_line(text, &field);
            let message = match line {
                Some(_) => message,
                None => format!("{message} (not set in the file: the default)"),
            };
            Error::Config {
                path: path.to_owned(),
                line,
                field,
                message,
            }
        })
    }

    /// The built-in task's run (an empty file).
    pub fn builtin() -> Self {
        validate::validate(RawConfig::default()).expect("the defaults are valid")
    }

    /// Steps of the run for a training set of `train_prompts` prompts.
    pub fn total_steps(&self, train_prompts: usize) -> usize {
        match self.trainer.length {
            RunLength::Steps(s) => s,
            // A pass over the prompts is this many generation batches
            // (verl's dataloader length, also with dynamic sampling).
            RunLength::Epochs(e) => e * (train_prompts / self.batch.gen_batch_prompts),
        }
    }

    /// The resolved settings, one topic a line, for the console.
    pub fn summary(&self) -> String {
        summary::summary(self)
    }

    /// The whole resolved configuration as a TOML file with a comment per
    /// key (meaning, unit, default, verl's name): `colo train
    /// --print-config`. [`Config::from_toml`] reads it back to `self`.
    pub fn to_toml(&self) -> Result<String> {
        print::print(self).map_err(|message| Error::Config {
            path: PathBuf::from("<printed config>"),
            line: None,
            field: "<file>".into(),
            message,
        })
    }

    /// The raw form of this configuration: every value explicit, as
    /// [`Config::to_toml`] prints it.
    pub fn to_raw(&self) -> RawConfig {
        print::to_raw(self)
    }
}
