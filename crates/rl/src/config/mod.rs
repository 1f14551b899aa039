//! The run configuration: one TOML file, read once into a validated
//! [`Config`].
//!
//! ```toml
//! [data]
//! train_files = ["data/train.jsonl"]
//! train_batch_size = 32          # prompts per step
//!
//! [model]
//! path = "checkpoints/qwen2-0.5b"
//!
//! [rollout]
//! n = 8
//!
//! [actor]
//! lr = 1e-6
//! ppo_mini_batch_size = 16       # prompts; × n samples
//!
//! [reward]
//! kind = "numeric"
//! after = "####"
//! ```
//!
//! Every key has a default, and the defaults are the built-in task's run, so
//! an empty file (or none) is `colo train`'s default. The serde structs of
//! [`sections`] are the one source: their doc comments and `#[key(...)]`
//! notes document each key (colo-keys' derive), and the deserialised file,
//! validated, *is* the [`Config`]. Validation checks values and batch sizes
//! (prompts per step × n against the mini- and micro-batches), writes the
//! values an unset key resolves to into the structs (`data.seed`, the
//! batch sizes, the critic's optimizer, `trainer.out_dir`, …) and derives
//! [`BatchPlan`]; what the run reads in another shape (a [`KvBudget`], a
//! [`RunLength`], the optimizer) is a method computing it. So
//! `--print-config` ([`Config::to_toml`]) and a run directory's
//! `config.toml` are the structs serialised. Errors carry the file, the
//! line and the field ([`Error::Config`](crate::Error::Config)).

mod locate;
mod num;
mod print;
pub mod sections;
mod summary;
mod validate;

use std::path::{Path, PathBuf};

use colo_keys::Keys;
use serde::{Deserialize, Serialize};

pub use sections::*;
pub(crate) use validate::VAL_ONLY_RESUME;

use crate::data::Fields;
use crate::reward::RewardSpec;
use crate::task::ArithmeticTask;
use crate::{Error, Result};

/// The run directory of a run that names none (no `trainer.out_dir`, no
/// project or experiment name, no `--out`).
pub const DEFAULT_OUT_DIR: &str = "runs/colo";

/// Steps of the run when neither `total_steps` nor `total_epochs` is given.
pub const DEFAULT_TOTAL_STEPS: usize = 100;

/// The whole file, validated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Keys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    #[key(table)]
    pub data: DataConfig,
    #[key(table)]
    pub model: ModelConfig,
    #[key(table)]
    pub rollout: RolloutConfig,
    #[key(table)]
    pub actor: ActorConfig,
    #[key(table)]
    pub critic: CriticConfig,
    #[key(table)]
    pub algorithm: AlgorithmConfig,
    #[key(table)]
    pub reward: RewardSpec,
    #[key(table)]
    pub memory: MemoryConfig,
    #[key(table)]
    pub trainer: TrainerConfig,
    #[key(table)]
    pub cluster: ClusterConfig,
    /// Batch sizes resolved from `data`, `rollout` and `actor`.
    #[serde(skip)]
    pub batch: BatchPlan,
}

/// Where the prompts come from ([`DataConfig::source`]).
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

/// Token sampling settings ([`RolloutConfig::sampling`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 is greedy.
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: Option<usize>,
}

/// The KV cache's size ([`RolloutConfig::kv`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// A share of the device memory left after weights.
    Fraction(f64),
    Tokens(usize),
}

/// What must vary within a group for it to be trained on (verl's
/// `filter_groups.metric`), by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    #[serde(untagged)]
    Extra(String),
}

impl FilterMetric {
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

/// The device capacity the memory layer enforces: written `"auto"`, a
/// number of bytes, or a size with a unit (`512MiB`, `2 GB`, `1.5GiB`: the
/// `bytesize` crate's parser, KB, MB, … decimal; KiB, MiB, … binary);
/// printed in whole binary units where it is a whole number of one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "toml::Value", into = "toml::Value")]
pub enum Capacity {
    /// The device's memory (CUDA), or on the CPU a capacity chosen by the
    /// run to make the choreography matter.
    #[default]
    Auto,
    Bytes(u64),
}

impl TryFrom<toml::Value> for Capacity {
    type Error = String;
    fn try_from(v: toml::Value) -> std::result::Result<Self, String> {
        let text = match v {
            toml::Value::Integer(b) if b > 0 => return Ok(Capacity::Bytes(b as u64)),
            toml::Value::Integer(_) => return Err("must be positive".into()),
            toml::Value::String(t) => t.trim().to_owned(),
            other => {
                return Err(format!(
                    "expected \"auto\" or a size like \"512MiB\", got {other}"
                ))
            }
        };
        if text.eq_ignore_ascii_case("auto") {
            return Ok(Capacity::Auto);
        }
        match text.parse::<bytesize::ByteSize>().map(|b| b.as_u64()) {
            Ok(0) => Err(format!("must be positive, got {text:?}")),
            // The parser saturates on overflow.
            Ok(u64::MAX) => Err(format!("{text:?} is too large")),
            Ok(b) => Ok(Capacity::Bytes(b)),
            Err(_) => Err(format!(
                "expected \"auto\" or a size like \"512MiB\" (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got {text:?}"
            )),
        }
    }
}

impl From<Capacity> for toml::Value {
    /// `"24 GiB"` where the bytes are a whole number of a binary unit, else
    /// the number of bytes: either reads back to the same capacity.
    fn from(c: Capacity) -> toml::Value {
        let Capacity::Bytes(b) = c else {
            return toml::Value::String("auto".into());
        };
        for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if b >= 1 << shift && b.is_multiple_of(1 << shift) {
                return toml::Value::String(format!("{} {unit}", b >> shift));
            }
        }
        i64::try_from(b).map_or(toml::Value::String(format!("{b} B")), toml::Value::Integer)
    }
}

/// How long the run is ([`TrainerConfig::length`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    Steps(usize),
    Epochs(usize),
}

/// The batch sizes of one RL step, in prompts and samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

/// Why a run of `optimizer_steps` cannot take the optimizer `o`'s schedule
/// of `key` (`actor`, `critic`), if it cannot: a cosine decays after the
/// warmup, so it needs more steps.
pub fn schedule_error(
    o: &colo_train::OptimConfig,
    key: &str,
    optimizer_steps: usize,
) -> Option<String> {
    (o.schedule == colo_train::ScheduleKind::Cosine && optimizer_steps as u64 <= o.warmup_steps)
        .then(|| {
            format!(
                "{key}.warmup_style = \"cosine\" decays over the run's optimizer steps, \
                 {optimizer_steps}, which must be more than {key}.warmup_steps = {}",
                o.warmup_steps
            )
        })
}

/// The error of `field` in the file `text` read from `path`, at the key's
/// line; a key the file does not set is said to be the default.
fn key_error(text: &str, path: &Path, field: &str, message: impl Into<String>) -> Error {
    let line = locate::key_line(text, field);
    let message = match line {
        Some(_) => message.into(),
        None => format!("{} (not set in the file: the default)", message.into()),
    };
    Error::Config {
        path: path.to_owned(),
        line,
        field: field.into(),
        message,
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
        let message = "is \"cuda\", but libtorch sees no CUDA device on this machine \
                       (use \"cpu\"; `colo plan --config` plans such a run anywhere)";
        Err(key_error(text, path, "trainer.device", message))
    }

    /// Parses and validates TOML text, whatever this machine's devices.
    fn parse(text: &str, path: &Path) -> Result<Self> {
        let raw: Config = toml::from_str(text).map_err(|e| locate::toml_error(&e, text, path))?;
        let written = |field: &str| locate::key_line(text, field).is_some();
        validate::validate(raw, &written)
            .map_err(|(field, message)| key_error(text, path, &field, message))
    }

    /// The built-in task's run (an empty file).
    pub fn builtin() -> Self {
        validate::validate(Config::default(), &|_| false).expect("the defaults are valid")
    }

    /// Steps of the run for a training set of `train_prompts` prompts.
    pub fn total_steps(&self, train_prompts: usize) -> usize {
        match self.trainer.length() {
            RunLength::Steps(s) => s,
            // A pass over the prompts is this many generation batches
            // (verl's dataloader length, also with dynamic sampling).
            RunLength::Epochs(e) => e * (train_prompts / self.batch.gen_batch_prompts),
        }
    }

    /// Whether the run has held-out prompts to evaluate on.
    pub fn evaluates(&self) -> bool {
        let d = &self.data;
        d.train_files.is_empty() || !d.val_files.is_empty() || d.val_fraction.is_some()
    }

    /// How the data's rows are read: the keys, and whether the reward takes
    /// a structured ground truth.
    pub fn fields(&self) -> Fields {
        Fields {
            prompt_key: self.data.prompt_key.clone(),
            answer_key: self.data.answer_key.clone(),
            structured_answers: self.reward.takes_structured_ground_truth(),
        }
    }

    /// The seed of the epoch shuffles and the held-out split.
    pub fn data_seed(&self) -> u64 {
        self.data.seed.unwrap_or(self.trainer.seed)
    }

    /// The critic's optimizer: the actor's, but for what `[critic]` sets.
    pub fn critic_optim(&self) -> colo_train::OptimConfig {
        let (c, a) = (&self.critic, self.actor.optim());
        colo_train::OptimConfig {
            lr: c.lr.unwrap_or(a.lr),
            warmup_steps: c.warmup_steps.map_or(a.warmup_steps, |w| w as u64),
            weight_decay: c.weight_decay.unwrap_or(a.weight_decay),
            grad_clip: c.grad_clip.or(a.grad_clip),
            ..a
        }
    }

    /// How the value loss is averaged over tokens.
    pub fn critic_loss_agg_mode(&self) -> colo_algo::LossAggMode {
        (self.critic.loss_agg_mode).unwrap_or(self.actor.loss_agg_mode)
    }

    /// Whether the reference model's log-probabilities are needed.
    pub fn needs_ref(&self) -> bool {
        self.algorithm.use_kl_in_reward || self.actor.use_kl_loss
    }

    /// The run directory (`colo train --out` sets it).
    pub fn out_dir(&self) -> &Path {
        (self.trainer.out_dir.as_deref()).unwrap_or(Path::new(DEFAULT_OUT_DIR))
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
}
