//! What the memory planner is asked: a raw, serde-friendly [`PlanInput`]
//! (what a user types as flags, or a future `colo train` TOML run config
//! deserialises into) turned once by [`PlanInput::validate`] into a [`Plan`]
//! whose numbers are known to be consistent.

use serde::{Deserialize, Serialize};

use crate::error::{num, out_of_range, PlanError, Result};
use crate::lora::{Lora, LoraInput};
use crate::model::{DType, HfConfig, ModelSpec};
use crate::presets::preset;

/// 2^30 bytes.
pub const GIB: u64 = 1 << 30;
/// 10^9 bytes.
pub const GB: u64 = 1_000_000_000;

/// The largest inputs a plan takes (a job far beyond these is not one the
/// formulas were checked on, and their byte counts would overflow).
pub const MAX_DEVICES: u64 = 1 << 20;
/// Per device: 1 PiB.
pub const MAX_DEVICE_GIB: f64 = (1u64 << 20) as f64;
pub const MAX_MICRO_BATCH_TOKENS: u64 = 1 << 24;
pub const MAX_KV_TOKENS: u64 = 1 << 32;
pub const MAX_SEQ_LEN: u64 = 1 << 20;

/// Where the model's dimensions come from.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelSource {
    /// A name from [`crate::presets`].
    Preset(String),
    /// A path to a Hugging Face `config.json`.
    ConfigPath(String),
    /// The config itself (e.g. embedded in a run config).
    Config(HfConfig),
}

/// Colocation mode: what happens to the rollout engine's memory while the
/// trainer runs, and in what order it comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The engine's weights and KV cache stay resident the whole step.
    Naive,
    /// Weights and KV cache are released together after generation and
    /// woken together before the weight sync (single-stage awake).
    Sleep,
    /// Released together, woken in stages: weights, sync, free the
    /// trainer's copy, then the KV cache (SGLang's multi-stage awake).
    Staged,
}

impl Mode {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "naive" => Ok(Mode::Naive),
            "sleep" | "single" | "single-stage" => Ok(Mode::Sleep),
            "staged" | "multi-stage" => Ok(Mode::Staged),
            _ => Err(PlanError::UnknownKeyword {
                what: "colocation mode",
                value: s.into(),
                valid: "naive, sleep, staged".into(),
            }),
        }
    }
}

/// Optimizer state layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// Mixed-precision AdamW: parameters and gradients in the parameter
    /// dtype, fp32 master weights and both moments (2 + 2 + 12 bytes per
    /// parameter in bf16).
    AdamwMixed,
    /// Mixed precision with float32 gradient accumulators (colo-train's
    /// bf16, PyTorch AMP's): 2 + 4 + 12 bytes per parameter in bf16.
    AdamwMixedFp32Grads,
    /// Everything in fp32: 4 + 4 + 8 bytes per parameter.
    AdamwFp32,
}

impl Optimizer {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "adamw-mixed" | "mixed" => Ok(Optimizer::AdamwMixed),
            "adamw-mixed-fp32-grads" => Ok(Optimizer::AdamwMixedFp32Grads),
            "adamw-fp32" | "fp32" => Ok(Optimizer::AdamwFp32),
            _ => Err(PlanError::UnknownKeyword {
                what: "optimizer",
                value: s.into(),
                valid: "adamw-mixed, adamw-mixed-fp32-grads, adamw-fp32".into(),
            }),
        }
    }
}

/// How the trainer's weights reach the rollout engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightSync {
    /// The trainer materialises the full model in the parameter dtype on
    /// every device and the engine copies its slice from it (verl's FSDP →
    /// SGLang path, whose "unsharded training copy" the RFC measures; also
    /// the peak `M` of DeepSpeed-Chat and HybridFlow-V in HybridFlow's
    /// Table 2).
    Full,
    /// The all-gather writes straight into the engine's weights; nothing
    /// extra is resident (HybridFlow's zero-redundancy 3D-HybridEngine, and
    /// colo's single-device in-memory hand-over).
    InPlace,
    /// The full model is streamed through a staging bucket of this many
    /// bytes.
    Bucket(u64),
    /// FSDP's shards gathered unit by unit into a buffer of the root unit
    /// and `fsdp_gathered_layers` layers, each copied into the engine's
    /// weights; the trainer's shards are on the device for it (streamed
    /// in when offloaded). Unsharded: `full` with the parameters
    /// offloaded, `in-place` without.
    Gather,
}

/// What is moved to host memory while the engine runs (MindSpeed-RL's
/// `offload_train_*` switches), plus the reference model's parameters
/// outside their log-prob pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offload {
    pub train_param: bool,
    pub train_grad: bool,
    pub optimizer: bool,
    pub ref_param: bool,
}

impl Default for Offload {
    fn default() -> Self {
        Offload {
            train_param: true,
            train_grad: true,
            optimizer: true,
            ref_param: true,
        }
    }
}

/// The user-facing input, every field optional where a default makes sense.
/// It derives `Deserialize` so that a `[plan]` table of a run config, or a
/// run config's own sections mapped onto it, can be read without a second
/// type.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanInput {
    pub model: ModelSource,
    /// Weights' dtype (trainer's parameters under mixed precision, the
    /// engine's weights and the sync copy).
    pub param_dtype: String,
    pub kv_dtype: String,
    pub devices: u64,
    pub device_memory_gib: f64,
    /// Resident on every device whatever the phase: CUDA context, NCCL
    /// buffers, CUDA graphs, allocator slack. See the crate docs for the
    /// 6 GiB default.
    pub runtime_overhead_gib: f64,
    /// FSDP shard count (full sharding over this many ranks, replicated
    /// over the rest). Exclusive with `tp`/`pp`.
    pub fsdp: Option<u64>,
    /// FSDP: decoder layers whose full weights are gathered at once beside
    /// the root unit's: 2 is PyTorch FSDP's (the next layer prefetched),
    /// 1 colo-train's sharded trainer (each layer gathered, run, freed).
    pub fsdp_gathered_layers: u64,
    /// FSDP: whether the reference model is sharded like the trainer
    /// (verl's FSDP reference); `false` keeps it whole on every rank
    /// (colo's sharded runs).
    pub fsdp_shard_reference: bool,
    /// Megatron-style training layout; `dp` defaults to what fills `devices`.
    pub pp: Option<u64>,
    pub tp: Option<u64>,
    pub dp: Option<u64>,
    /// Megatron's distributed optimizer (ZeRO-1 over `dp`).
    pub distributed_optimizer: bool,
    pub optimizer: String,
    pub activation_checkpointing: bool,
    /// Tokens per training micro-batch on one data-parallel rank.
    pub tokens_per_micro_batch: u64,
    /// Tokens per log-prob micro-batch; defaults to the training one.
    pub logprob_tokens_per_micro_batch: Option<u64>,
    /// Generation layout.
    pub gen_pp: u64,
    pub gen_tp: u64,
    /// Whether a tensor-parallel engine keeps the embedding, LM head and
    /// final norm whole on every rank (colo-rollout's) instead of splitting
    /// them with the rest (vLLM's vocabulary-parallel layers).
    pub gen_replicated_embeddings: bool,
    /// SGLang's `mem_fraction_static`. Exclusive with `kv_tokens`; 0.9 if
    /// neither is given.
    pub mem_fraction: Option<f64>,
    /// An explicit KV-cache budget in tokens per generation replica.
    pub kv_tokens: Option<u64>,
    /// The KV cache takes this share of the memory left after the
    /// runtime and the engine's weights (colo-rollout's `mem_fraction`,
    /// vLLM-style). Exclusive with `mem_fraction` and `kv_tokens`.
    pub kv_free_fraction: Option<f64>,
    /// The KV cache is allocated in blocks of this many tokens (a paged
    /// cache: 16 in colo-rollout); budgets round to whole blocks.
    pub kv_block_tokens: u64,
    /// With `kv_free_fraction`: the cache never exceeds this many tokens
    /// (colo-rollout's `kv_seqs` sequences of `max_seq_len`, rounded to
    /// whole blocks per sequence by the caller). `None`: no cap.
    pub kv_tokens_cap: Option<u64>,
    /// `flash` (fused attention, Korthikanti et al.; the default) or
    /// `eager` (every op's output kept for backward, the `seq × seq`
    /// scores materialised: colo's own CPU trainer). `eager` needs
    /// `seq_len`.
    pub activation_model: String,
    /// Tokens per sequence (prompt + response), for `eager` activations.
    pub seq_len: Option<u64>,
    /// Response tokens per sequence: the window that gets the LM head in
    /// `eager`; defaults to `seq_len`.
    pub response_len: Option<u64>,
    /// `eager`: rows of a micro-batch that share one prompt, which the
    /// trainer runs once for all of them (GRPO's `n`; colo-model's
    /// `SharedPrompts`). `None` or 1: every row runs its whole sequence.
    pub shared_prompt_rows: Option<u64>,
    /// `eager`: threads a micro-batch is split over (colo-train's lanes on
    /// the CPU); each lane holds its part's parameter gradients until they
    /// are added up. `None`: 1.
    pub train_lanes: Option<u64>,
    /// `eager`: the LM head is colo-kernels' fused log-probability kernel
    /// (colo-train on the CPU), which keeps only the logits, rather than
    /// a float32 log-softmax (libtorch's composition, colo-train on
    /// CUDA). `None`: fused.
    pub fused_loss_head: Option<bool>,
    pub mode: String,
    pub offload: Offload,
    pub weight_sync: WeightSync,
    /// Whether a reference model (for a KL term) is colocated.
    pub reference: bool,
    /// The largest decode step the rollout engine captures as CUDA graphs
    /// (colo-rollout's buckets; `None`: no graphs — the CPU, or
    /// `enforce_eager`). Their memory sleeps and wakes with the KV cache.
    #[serde(default)]
    pub cuda_graphs: Option<GraphCapture>,
    /// The trainer trains LoRA adapters on frozen weights
    /// ([`crate::lora`]); `None`: every weight trains.
    #[serde(default)]
    pub lora: Option<LoraInput>,
}

/// The shape of the largest captured decode step: rows (sequences) and
/// keys (positions attended to), each a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphCapture {
    pub rows: u64,
    pub keys: u64,
}

impl Default for PlanInput {
    fn default() -> Self {
        PlanInput {
            model: ModelSource::Preset("qwen2.5-7b".into()),
            param_dtype: "bf16".into(),
            kv_dtype: "bf16".into(),
            devices: 8,
            device_memory_gib: 80.0,
            runtime_overhead_gib: 6.0,
            fsdp: None,
            fsdp_gathered_layers: 2,
            fsdp_shard_reference: true,
            pp: None,
            tp: None,
            dp: None,
            distributed_optimizer: true,
            optimizer: "adamw-mixed".into(),
            activation_checkpointing: true,
            tokens_per_micro_batch: 8192,
            logprob_tokens_per_micro_batch: None,
            gen_pp: 1,
            gen_tp: 1,
            gen_replicated_embeddings: false,
            mem_fraction: None,
            kv_tokens: None,
            kv_free_fraction: None,
            kv_block_tokens: 1,
            kv_tokens_cap: None,
            activation_model: "flash".into(),
            seq_len: None,
            response_len: None,
            shared_prompt_rows: None,
            train_lanes: None,
            fused_loss_head: None,
            mode: "staged".into(),
            offload: Offload::default(),
            weight_sync: WeightSync::Full,
            reference: false,
            cuda_graphs: None,
            lora: None,
        }
    }
}

/// The training layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TrainLayout {
    /// Parameters, gradients and optimizer states fully sharded over
    /// `shards` ranks.
    Fsdp { shards: u64 },
    /// Pipeline × tensor × data parallel (Megatron-LM).
    Megatron {
        p: u64,
        t: u64,
        d: u64,
        distributed_optimizer: bool,
    },
}

/// How big the engine's KV cache is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum KvBudget {
    /// SGLang `mem_fraction_static`: the engine takes `fraction × device
    /// memory` for its weights and KV cache; the KV cache is what is left.
    Fraction(f64),
    /// Tokens per generation replica.
    Tokens(u64),
    /// This share of what the runtime and the engine's weights leave
    /// (colo-rollout's `mem_fraction`).
    FreeFraction(f64),
}

/// How activations are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ActivationModel {
    /// Fused attention, selective recomputation optional (Korthikanti et
    /// al., 2022): what GPU frameworks run.
    Flash,
    /// Every op's output kept for backward (colo's CPU trainer); see
    /// [`crate::model::ModelSpec::eager_elems_per_token_layer`].
    Eager {
        seq_len: u64,
        response_len: u64,
        /// Rows per shared prompt (1: none shared).
        prompt_rows: u64,
        /// Lanes a micro-batch is split over.
        lanes: u64,
        /// The LM head is the fused kernel ([`PlanInput::fused_loss_head`]).
        fused_head: bool,
    },
}

/// A validated plan request. Built only by [`PlanInput::validate`].
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub model: ModelSpec,
    pub param_dtype: DType,
    pub kv_dtype: DType,
    pub devices: u64,
    pub device_bytes: u64,
    pub runtime_overhead_bytes: u64,
    pub train: TrainLayout,
    /// [`PlanInput::fsdp_gathered_layers`], at most the model's layers.
    pub fsdp_gathered_layers: u64,
    pub fsdp_shard_reference: bool,
    pub optimizer: Optimizer,
    pub activation_checkpointing: bool,
    pub tokens_per_micro_batch: u64,
    pub logprob_tokens_per_micro_batch: u64,
    pub gen_pp: u64,
    pub gen_tp: u64,
    pub gen_replicated_embeddings: bool,
    pub kv_budget: KvBudget,
    /// Tokens per KV-cache block (budgets round to whole blocks).
    pub kv_block_tokens: u64,
    pub kv_tokens_cap: Option<u64>,
    pub activations: ActivationModel,
    pub mode: Mode,
    pub offload: Offload,
    pub weight_sync: WeightSync,
    pub reference: bool,
    pub cuda_graphs: Option<GraphCapture>,
    pub lora: Option<Lora>,
}

impl Plan {
    /// The ranks FSDP shards the training state over (1 for Megatron's
    /// layouts, which this crate counts apart).
    pub fn fsdp_shards(&self) -> u64 {
        match self.train {
            TrainLayout::Fsdp { shards } => shards,
            TrainLayout::Megatron { .. } => 1,
        }
    }
}

fn layout_err(layout: String, devices: u64, reason: String) -> PlanError {
    PlanError::InvalidLayout {
        layout,
        devices,
        reason,
    }
}

/// The divisors of `n`, ascending: what a layout factor may be.
pub fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|k| n.is_multiple_of(*k)).collect()
}

impl PlanInput {
    /// Resolve the model source into a [`ModelSpec`].
    pub fn model_spec(&self) -> Result<ModelSpec> {
        match &self.model {
            ModelSource::Preset(name) => preset(name),
            ModelSource::ConfigPath(path) => {
                let name = std::path::Path::new(path)
                    .parent()
                    .and_then(|p| p.file_name())
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| path.clone());
                HfConfig::from_file(path)?.into_spec(&name)
            }
            ModelSource::Config(c) => c.clone().into_spec("inline"),
        }
    }

    /// The training layout from the `fsdp` / `pp` / `tp` / `dp` fields.
    fn train_layout(&self, model: &ModelSpec, n: u64) -> Result<TrainLayout> {
        let divs = || format!("{:?}", divisors(n));
        let train = match (self.fsdp, self.pp, self.tp) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(layout_err(
                    "fsdp + pp/tp".into(),
                    n,
                    "give either an FSDP shard count or a pp × tp × dp layout, not both".into(),
                ))
            }
            (Some(s), None, None) => {
                if s == 0 || !n.is_multiple_of(s) {
                    return Err(layout_err(
                        format!("fsdp={s}"),
                        n,
                        format!(
                            "the shard count must divide the device count: one of {}",
                            divs()
                        ),
                    ));
                }
                TrainLayout::Fsdp { shards: s }
            }
            (None, None, None) if self.dp.is_none() => TrainLayout::Fsdp { shards: n },
            (None, p, t) => {
                let (p, t) = (p.unwrap_or(1), t.unwrap_or(1));
                let name = format!(
                    "p{p}-t{t}-d{}",
                    self.dp.map_or("?".into(), |d| d.to_string())
                );
                if p == 0 || t == 0 || !n.is_multiple_of(p * t) {
                    return Err(layout_err(
                        name,
                        n,
                        format!("pp × tp must divide the device count: one of {}", divs()),
                    ));
                }
                let d = self.dp.unwrap_or(n / (p * t));
                if p * t * d != n {
                    return Err(layout_err(
                        name,
                        n,
                        format!(
                            "pp × tp × dp = {} but there are {n} devices; dp = {}",
                            p * t * d,
                            n / (p * t)
                        ),
                    ));
                }
                if !model.heads.is_multiple_of(t) {
                    return Err(layout_err(
                        name,
                        n,
                        format!("tp must divide the {} attention heads", model.heads),
                    ));
                }
                if p > model.layers {
                    return Err(layout_err(
                        name,
                        n,
                        format!("pp exceeds the {} layers", model.layers),
                    ));
                }
                TrainLayout::Megatron {
                    p,
                    t,
                    d,
                    distributed_optimizer: self.distributed_optimizer,
                }
            }
        };
        Ok(train)
    }

    /// The engine's KV budget: one of `mem_fraction`, `kv_tokens` and
    /// `kv_free_fraction` (0.9 of the device when none is given).
    fn kv_budget(&self) -> Result<KvBudget> {
        let given = [
            self.mem_fraction.is_some(),
            self.kv_tokens.is_some(),
            self.kv_free_fraction.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(out_of_range(
                "mem_fraction / kv_tokens / kv_free_fraction",
                "more than one given",
                "one of them: a fraction of the device, a KV token budget, or a fraction of the free memory",
            ));
        }
        let fraction = |name, f: f64| {
            if f > 0.0 && f <= 1.0 {
                Ok(f)
            } else {
                Err(out_of_range(name, f, "in (0, 1]"))
            }
        };
        Ok(
            match (self.mem_fraction, self.kv_tokens, self.kv_free_fraction) {
                (Some(f), _, _) => KvBudget::Fraction(fraction("mem_fraction", f)?),
                (_, Some(0), _) => return Err(out_of_range("kv_tokens", 0, ">= 1")),
                (_, Some(t), _) => KvBudget::Tokens(t),
                (_, _, Some(f)) => KvBudget::FreeFraction(fraction("kv_free_fraction", f)?),
                (None, None, None) => KvBudget::Fraction(0.9),
            },
        )
    }

    fn activation_model(&self) -> Result<ActivationModel> {
        match self.activation_model.to_ascii_lowercase().as_str() {
            "flash" => Ok(ActivationModel::Flash),
            "eager" => {
                let seq_len = match self.seq_len {
                    Some(s) if s > 0 => s,
                    other => {
                        return Err(out_of_range(
                            "seq_len",
                            other.map_or("absent".into(), |s| s.to_string()),
                            ">= 1 (eager activations hold seq × seq attention scores)",
                        ))
                    }
                };
                let response_len = self.response_len.unwrap_or(seq_len);
                if response_len == 0 || response_len > seq_len {
                    return Err(out_of_range(
                        "response_len",
                        response_len,
                        format!("in [1, {seq_len}] (the sequence length)"),
                    ));
                }
                Ok(ActivationModel::Eager {
                    seq_len,
                    response_len,
                    prompt_rows: self.shared_prompt_rows.unwrap_or(1).max(1),
                    lanes: self.train_lanes.unwrap_or(1).max(1),
                    fused_head: self.fused_loss_head.unwrap_or(true),
                })
            }
            other => Err(PlanError::UnknownKeyword {
                what: "activation model",
                value: other.into(),
                valid: "flash, eager".into(),
            }),
        }
    }

    /// Check every number once and resolve defaults.
    pub fn validate(&self) -> Result<Plan> {
        let model = self.model_spec()?;
        let n = self.devices;
        // Bounds far beyond any real job, within which the model's byte
        // counts cannot overflow.
        let within = |name: &'static str, value: u64, max: u64| match (1..=max).contains(&value) {
            true => Ok(()),
            false => Err(out_of_range(name, value, format!("in 1..={max}"))),
        };
        within("devices", n, MAX_DEVICES)?;
        if !(self.device_memory_gib > 0.0 && self.device_memory_gib <= MAX_DEVICE_GIB) {
            return Err(out_of_range(
                "device_memory_gib",
                num(self.device_memory_gib),
                format!("in (0, {MAX_DEVICE_GIB}]"),
            ));
        }
        within(
            "tokens_per_micro_batch",
            self.tokens_per_micro_batch,
            MAX_MICRO_BATCH_TOKENS,
        )?;
        if let Some(t) = self.logprob_tokens_per_micro_batch {
            within("logprob_tokens_per_micro_batch", t, MAX_MICRO_BATCH_TOKENS)?;
        }
        for (name, value) in [
            ("kv_tokens", self.kv_tokens),
            ("kv_tokens_cap", self.kv_tokens_cap),
            ("kv_block_tokens", Some(self.kv_block_tokens)),
        ] {
            if let Some(v) = value {
                within(name, v, MAX_KV_TOKENS)?;
            }
        }
        for (name, value) in [
            ("seq_len", self.seq_len),
            ("response_len", self.response_len),
        ] {
            if let Some(v) = value {
                within(name, v, MAX_SEQ_LEN)?;
            }
        }
        if let Some(g) = self.cuda_graphs {
            within("cuda_graphs rows", g.rows, MAX_SEQ_LEN)?;
            within("cuda_graphs keys", g.keys, MAX_SEQ_LEN)?;
        }
        if !(self.runtime_overhead_gib >= 0.0 && self.runtime_overhead_gib < self.device_memory_gib)
        {
            return Err(out_of_range(
                "runtime_overhead_gib",
                num(self.runtime_overhead_gib),
                format!(
                    "in [0, {}) (the device memory)",
                    num(self.device_memory_gib)
                ),
            ));
        }
        let train = self.train_layout(&model, n)?;
        if !(1..=model.layers).contains(&self.fsdp_gathered_layers) {
            return Err(out_of_range(
                "fsdp_gathered_layers",
                self.fsdp_gathered_layers,
                format!("in 1..={} (the model's layers)", model.layers),
            ));
        }
        let divs = || format!("{:?}", divisors(n));
        let (pg, tg) = (self.gen_pp, self.gen_tp);
        if pg == 0 || tg == 0 || pg.checked_mul(tg).is_none_or(|g| !n.is_multiple_of(g)) {
            return Err(layout_err(
                format!("gen pp{pg}-tp{tg}"),
                n,
                format!(
                    "gen_pp × gen_tp must divide the device count: one of {}",
                    divs()
                ),
            ));
        }
        if model.heads % tg != 0 || pg > model.layers {
            return Err(layout_err(
                format!("gen pp{pg}-tp{tg}"),
                n,
                format!(
                    "gen_tp must divide the {} attention heads and gen_pp be at most the {} layers",
                    model.heads, model.layers
                ),
            ));
        }
        let kv_budget = self.kv_budget()?;
        let activations = self.activation_model()?;
        if let WeightSync::Bucket(0) = self.weight_sync {
            return Err(out_of_range("weight_sync bucket bytes", 0, ">= 1"));
        }
        Ok(Plan {
            param_dtype: DType::parse(&self.param_dtype)?,
            kv_dtype: DType::parse(&self.kv_dtype)?,
            devices: n,
            device_bytes: (self.device_memory_gib * GIB as f64).round() as u64,
            runtime_overhead_bytes: (self.runtime_overhead_gib * GIB as f64).round() as u64,
            train,
            fsdp_gathered_layers: self.fsdp_gathered_layers,
            fsdp_shard_reference: self.fsdp_shard_reference,
            optimizer: Optimizer::parse(&self.optimizer)?,
            activation_checkpointing: self.activation_checkpointing,
            tokens_per_micro_batch: self.tokens_per_micro_batch,
            logprob_tokens_per_micro_batch: self
                .logprob_tokens_per_micro_batch
                .unwrap_or(self.tokens_per_micro_batch)
                .max(1),
            gen_pp: pg,
            gen_tp: tg,
            gen_replicated_embeddings: self.gen_replicated_embeddings,
            kv_budget,
            kv_block_tokens: self.kv_block_tokens,
            kv_tokens_cap: self.kv_tokens_cap,
            activations,
            mode: Mode::parse(&self.mode)?,
            offload: self.offload,
            weight_sync: self.weight_sync,
            reference: self.reference,
            cuda_graphs: self.cuda_graphs,
            lora: self.lora.as_ref().map(LoraInput::validate).transpose()?,
            model,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_to_fsdp_over_all_devices() {
        let plan = PlanInput::default().validate().unwrap();
        assert_eq!(plan.train, TrainLayout::Fsdp { shards: 8 });
        assert_eq!(plan.kv_budget, KvBudget::Fraction(0.9));
        assert_eq!(plan.mode, Mode::Staged);
    }

    #[test]
    fn layout_not_dividing_devices_lists_the_divisors() {
        let input = PlanInput {
            tp: Some(3),
            ..Default::default()
        };
        let err = input.validate().unwrap_err().to_string();
        assert!(err.contains("[1, 2, 4, 8]"), "{err}");
        let input = PlanInput {
            fsdp: Some(5),
            ..Default::default()
        };
        assert!(input
            .validate()
            .unwrap_err()
            .to_string()
            .contains("[1, 2, 4, 8]"));
        let input = PlanInput {
            gen_tp: 16,
            ..Default::default()
        };
        assert!(input
            .validate()
            .unwrap_err()
            .to_string()
            .contains("gen_pp × gen_tp"));
    }

    #[test]
    fn dp_is_inferred_and_checked() {
        let input = PlanInput {
            tp: Some(4),
            ..Default::default()
        };
        let plan = input.validate().unwrap();
        assert!(matches!(
            plan.train,
            TrainLayout::Megatron {
                p: 1,
                t: 4,
                d: 2,
                ..
            }
        ));
        let input = PlanInput {
            tp: Some(4),
            dp: Some(4),
            ..Default::default()
        };
        assert!(input.validate().unwrap_err().to_string().contains("dp = 2"));
    }

    /// Zero or absurd sizes are refused by name, before any arithmetic
    /// could overflow (a wrapped total once read "fits").
    #[test]
    fn sizes_out_of_range_are_named() {
        let refused = |f: fn(&mut PlanInput), name: &str| {
            let mut input = PlanInput::default();
            f(&mut input);
            let e = input.validate().unwrap_err().to_string();
            assert!(e.starts_with(&format!("invalid {name} = ")), "{e}");
        };
        refused(|i| i.devices = 0, "devices");
        refused(|i| i.devices = MAX_DEVICES + 1, "devices");
        refused(|i| i.fsdp_gathered_layers = 0, "fsdp_gathered_layers");
        refused(|i| i.fsdp_gathered_layers = 29, "fsdp_gathered_layers");
        refused(|i| i.device_memory_gib = 1e300, "device_memory_gib");
        // The value as written: `-5`, not `-5e0`; `1e300`, not 301 digits.
        let said = |gib: f64| {
            let input = PlanInput {
                device_memory_gib: gib,
                ..PlanInput::default()
            };
            input.validate().unwrap_err().to_string()
        };
        assert!(
            said(-5.0).starts_with("invalid device_memory_gib = -5: "),
            "{}",
            said(-5.0)
        );
        assert!(said(1e300).starts_with("invalid device_memory_gib = 1e300: "));
        assert!(said(0.0).starts_with("invalid device_memory_gib = 0: "));
        refused(
            |i| i.tokens_per_micro_batch = u64::MAX,
            "tokens_per_micro_batch",
        );
        refused(
            |i| i.logprob_tokens_per_micro_batch = Some(0),
            "logprob_tokens_per_micro_batch",
        );
        refused(|i| i.kv_tokens = Some(u64::MAX), "kv_tokens");
        refused(|i| i.kv_tokens_cap = Some(0), "kv_tokens_cap");
        refused(|i| i.kv_block_tokens = 0, "kv_block_tokens");
        refused(
            |i| {
                i.activation_model = "eager".into();
                i.seq_len = Some(u64::MAX);
            },
            "seq_len",
        );
        refused(
            |i| i.cuda_graphs = Some(GraphCapture { rows: 0, keys: 64 }),
            "cuda_graphs rows",
        );
        let mut huge_gen = PlanInput {
            gen_pp: u64::MAX,
            gen_tp: u64::MAX,
            ..Default::default()
        };
        assert!(
            huge_gen.validate().is_err(),
            "gen_pp × gen_tp overflows: refused"
        );
        huge_gen.gen_pp = 1;
        huge_gen.gen_tp = 1;
        assert!(huge_gen.validate().is_ok());
    }

    #[test]
    fn fraction_must_lie_in_zero_one() {
        for f in [0.0, -0.1, 1.01, f64::NAN] {
            let input = PlanInput {
                mem_fraction: Some(f),
                ..Default::default()
            };
            let err = input.validate().unwrap_err().to_string();
            assert!(err.contains("(0, 1]"), "{f}: {err}");
        }
        let input = PlanInput {
            mem_fraction: Some(1.0),
            ..Default::default()
        };
        assert!(input.validate().is_ok());
    }

    #[test]
    fn input_round_trips_through_json_with_defaults() {
        let input: PlanInput =
            serde_json::from_str(r#"{"model":{"preset":"llama-3-8b"},"gen_tp":2,"mode":"sleep"}"#)
                .unwrap();
        let plan = input.validate().unwrap();
        assert_eq!(plan.model.name, "llama-3-8b");
        assert_eq!((plan.gen_tp, plan.mode), (2, Mode::Sleep));
    }
}
