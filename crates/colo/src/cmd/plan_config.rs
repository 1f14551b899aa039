//! `colo plan --config run.toml`: a `colo train` run config turned into
//! colo-plan's input, so that the planner predicts what that run's memory
//! timeline will measure.
//!
//! colo-plan stays arithmetic-only; everything that needs colo's own
//! crates (the run config, the built-in model, the tokenizer that says how
//! long the prompts are) happens here. The translation follows what the
//! run does (`colo_rl::worker`, `colo_rl::loop`):
//!
//! - one device of the run's capacity (`auto`: 72 MiB in f32, 44 MiB in bf16 for the built-in
//!   model, the machine's memory otherwise), no runtime overhead (the host
//!   backend has no CUDA context);
//! - a data-parallel run (`[cluster] workers = N`) is planned per worker:
//!   its share of the batch (`colo_rl::data_parallel::rank_config`) and,
//!   with `sharding = "full"`, FSDP over the N workers with colo-train's
//!   units — 1/N of the parameters, gradients, AdamW state and masters
//!   (each unit padded), the root unit and one decoder layer gathered
//!   while computing, activation checkpointing on, the weight sync
//!   gathering unit by unit — while the reference model and the rollout
//!   engine stay whole;
//! - the run's dtype (`trainer.dtype`, `auto` decided for its device): in
//!   f32 parameters, gradients and both AdamW moments in float32
//!   (`adamw-fp32`, 4 + 4 + 8 bytes per parameter); in bf16 parameters,
//!   the engine's weights, activations and KV cache in bf16, float32
//!   gradient accumulators, moments and master weights
//!   (`adamw-mixed-fp32-grads`, 2 + 4 + 12);
//! - the rollout engine is built first, so `rollout.mem_fraction` is a
//!   share of the capacity left after its weights, in blocks of 16 tokens
//!   (`max_kv_tokens` rounds up to whole blocks);
//! - the weight sync copies the trainer's parameters into the engine's
//!   weights in place; with `offload_train_param` the trainer's copy stays
//!   until the sync is done and is freed after it (the plan's `full` sync),
//!   otherwise it simply stays (`in-place`);
//! - `naive` keeps everything resident whatever the offload switches say;
//! - activations are the eager model (every op's output kept for
//!   backward) over micro-batches of `ppo_micro_batch_size` sequences as
//!   long as the longest prompt of the training data plus
//!   `max_new_tokens` — the longest a micro-batch can be padded to — split
//!   over the trainer's lanes (`trainer.cpu_threads`), each of which ends
//!   its backward holding a full set of gradients in the parameters' kind;
//! - with `[model] lora_rank` the trainer's gradients and optimizer state
//!   are the adapters' only, its weights frozen, and the reference is its
//!   own weights (colo-plan's `lora`);
//! - the plan check adds colo-plan's margin (a tenth of the activations)
//!   to the peak: the capacity must hold both.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use colo_model::{ModelConfig, Tokenizer};
use colo_plan::config::{GraphCapture, ModelSource, Offload, PlanInput, WeightSync, GIB};
use colo_plan::lora::LoraInput;
use colo_plan::model::HfConfig;
use colo_rl::config::{Colocation, Config, DataSource, Device, Dtype, KvBudget, ValSource};

/// The planner's input for a run, and what was read to build it.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub input: PlanInput,
    /// The device capacity the run enforces.
    pub capacity: u64,
    /// The longest training prompt in tokens (special tokens included).
    pub max_prompt_tokens: u64,
    /// Data-parallel workers; the plan is one worker's.
    pub workers: usize,
    /// Whether the trainer's state is sharded over the workers.
    pub sharded: bool,
}

impl RunPlan {
    /// What the plan's bytes are: "per worker (4 workers, sharding full)",
    /// or "per device" for a run in one process.
    pub fn scope(&self) -> String {
        match (self.workers, self.sharded) {
            (1, false) => "per device".into(),
            (1, true) => "per device (sharding full: one shard)".into(),
            (w, true) => format!("per worker ({w} workers, sharding full)"),
            (w, false) => format!("per worker ({w} workers, sharding none)"),
        }
    }
}

/// Reads a run config file (as `colo train --config` does).
pub fn from_file(path: &Path) -> Result<RunPlan> {
    // A CUDA run is planned on any machine, with its capacity set.
    let (config, _) = Config::from_file_to_plan(path)?;
    from_config(&config)
}

/// Translates a validated run config: one worker's share of it when it
/// has several.
pub fn from_config(config: &Config) -> Result<RunPlan> {
    let workers = config.cluster.workers();
    let config = &colo_rl::data_parallel::rank_config(config, workers)?;
    let shards = config.cluster.shards() as u64;
    // A sharded actor, on one worker too (its gathers are copies).
    let sharded = config.cluster.sharding == colo_rl::config::Sharding::Full;
    let tg = config.rollout.tensor_model_parallel_size.max(1) as u64;
    let mode = match config.memory.colocation {
        Colocation::Naive => "naive",
        Colocation::Sleep => "sleep",
        Colocation::Staged => "staged",
        Colocation::Restart => bail!(
            "colocation `restart` is not modelled by colo plan (the engine is rebuilt from disk each step); \
             plan the run as naive, sleep or staged"
        ),
    };
    let (model_cfg, model_dir) = model(config)?;
    let prompts = prompts(config, model_dir.as_deref())?;
    // A longer prompt stops the run or is left out (filter_overlong_prompts).
    let max_prompt_tokens = prompts.longest.min(config.data.max_prompt_length as u64);
    let seq_len = max_prompt_tokens + config.rollout.max_new_tokens as u64;
    let capacity = capacity(config)?;
    let offload = offload(&config.memory);
    let (kv_free_fraction, kv_tokens) = match config.rollout.kv() {
        KvBudget::Fraction(f) => (Some(f), None),
        KvBudget::Tokens(t) => (None, Some(t as u64)),
    };
    let micro_tokens = micro_batch_tokens(config, seq_len);
    let dtype = config.trainer.dtype.resolve(config.trainer.device);
    let engine = colo_rl::step::engine_config(config).validate()?;
    let input = PlanInput {
        model: ModelSource::Config(hf_config(&model_cfg)),
        param_dtype: dtype.name().into(),
        kv_dtype: dtype.name().into(),
        // A worker's device; sharded, one of the FSDP group's `shards`; a
        // tensor-parallel rollout's group at least (replicas in FSDP's
        // terms when not sharded).
        devices: shards.max(tg),
        gen_tp: tg,
        gen_replicated_embeddings: true,
        fsdp: Some(shards),
        fsdp_gathered_layers: 1,
        fsdp_shard_reference: false,
        device_memory_gib: capacity as f64 / GIB as f64,
        runtime_overhead_gib: 0.0,
        optimizer: match dtype {
            Dtype::Bf16 => "adamw-mixed-fp32-grads",
            _ => "adamw-fp32",
        }
        .into(),
        // (A sharded config has it on: validation resolves it so.)
        activation_checkpointing: config.model.enable_gradient_checkpointing || sharded,
        tokens_per_micro_batch: micro_tokens,
        logprob_tokens_per_micro_batch: Some(micro_tokens),
        kv_free_fraction,
        kv_tokens,
        kv_block_tokens: engine.block_size as u64,
        // The engine's own cap (one step's sequences, at most
        // max_num_seqs, of max_prompt_length + max_new_tokens); a
        // tensor-parallel group's engines hold its `tg` ranks' sequences,
        // each its share of the KV heads.
        kv_tokens_cap: engine
            .cap_blocks()
            .map(|blocks| (blocks * engine.block_size) as u64 * tg),
        activation_model: "eager".into(),
        seq_len: Some(seq_len),
        response_len: Some(config.rollout.max_new_tokens as u64),
        // colo-train runs a GRPO group's prompt once per micro-batch part
        // when its rows share prompts two to one or more.
        shared_prompt_rows: (config.rollout.n >= 2).then_some(config.rollout.n as u64),
        train_lanes: Some(
            colo_model::lanes::count(tch::Device::Cpu, config.trainer.cpu_threads) as u64,
        ),
        // colo-train's loss head is colo-kernels' fused kernel on the CPU.
        fused_loss_head: Some(config.trainer.device == Device::Cpu),
        mode: mode.into(),
        offload,
        weight_sync: match (sharded, offload.train_param) {
            (true, _) => WeightSync::Gather,
            (false, true) => WeightSync::Full,
            (false, false) => WeightSync::InPlace,
        },
        reference: config.needs_ref(),
        cuda_graphs: cuda_graphs(config, &engine, prompts.held_out),
        lora: lora(config)?,
        ..PlanInput::default()
    };
    Ok(RunPlan {
        input,
        capacity,
        max_prompt_tokens,
        workers,
        sharded,
    })
}

/// What a switch offloads: the `offload_*` flags, none in naive mode
/// (colo-rl's worker keeps the reference resident in naive too).
fn offload(mem: &colo_rl::config::MemoryConfig) -> Offload {
    let naive = mem.colocation == Colocation::Naive;
    Offload {
        train_param: !naive && mem.offload_train_param,
        train_grad: !naive && mem.offload_train_grad,
        optimizer: !naive && mem.offload_train_optimizer,
        ref_param: !naive && mem.offload_ref,
    }
}

/// A micro-batch's padded tokens at sequences of `seq_len`. A token budget
/// (`actor.use_dynamic_bsz`) bounds them whatever the samples' lengths;
/// either way a micro-batch is cut from a mini-batch, which on a worker of
/// a cluster run is its share (colo-train's micro-batch is the smaller of
/// the two).
fn micro_batch_tokens(config: &Config, seq_len: u64) -> u64 {
    let mini_tokens = config.batch.mini_batch_samples as u64 * seq_len;
    match config.batch.micro_batch_max_tokens {
        Some(t) => t as u64,
        None => config.batch.micro_batch_samples as u64 * seq_len,
    }
    .min(mini_tokens)
}

/// The actor's LoRA adapters (`[model] lora_rank`), which colo-plan counts
/// as colo-train keeps them: state for the adapters only, the reference
/// the actor's own weights.
fn lora(config: &Config) -> Result<Option<LoraInput>> {
    let m = &config.model;
    if m.lora_rank == 0 {
        return Ok(None);
    }
    let targets = (m.target_modules.resolve())
        .map_err(|why| anyhow::anyhow!("model.target_modules {why}"))?;
    Ok(Some(LoraInput {
        rank: m.lora_rank as u64,
        target_modules: targets.into_iter().map(str::to_owned).collect(),
    }))
}

/// Why a KV cache of `kv_tokens` (colo-plan's prediction for `run`)
/// cannot serve the run's rollouts, if it cannot: the rollout engine
/// refuses a prompt whose `rollout.n` samples outnumber the cache's blocks
/// (each sample writes into blocks of its own) or whose longest sequence
/// needs more blocks than there are, and that refusal came only in the
/// first step, after the step-0 evaluation.
pub fn kv_shortfall(config: &Config, run: &RunPlan, kv_tokens: u64) -> Option<String> {
    let block = run.input.kv_block_tokens.max(1);
    let blocks = kv_tokens / block;
    let budget = match config.rollout.kv() {
        KvBudget::Tokens(t) => format!("rollout.max_kv_tokens = {t}"),
        KvBudget::Fraction(f) => format!(
            "rollout.mem_fraction = {f} of memory.capacity = {}",
            colo_mem::fmt_bytes(run.capacity)
        ),
    };
    let cache = format!("the KV cache holds {blocks} blocks of {block} tokens ({budget})");
    let n = config.rollout.n as u64;
    if n > blocks {
        return Some(format!(
            "rollout.n = {n} samples of a prompt need a KV block each at least, and {cache}; \
             lower rollout.n or give the KV cache more room"
        ));
    }
    // The K/V of every token of the longest sequence but the last one.
    let longest = (run.max_prompt_tokens + config.rollout.max_new_tokens as u64).saturating_sub(1);
    let need = longest.div_ceil(block);
    (need > blocks).then(|| {
        format!(
            "a sequence of up to {longest} cached tokens (the longest prompt and \
             rollout.max_new_tokens) needs {need} KV blocks, and {cache}; lower \
             rollout.max_new_tokens or give the KV cache more room"
        )
    })
}

/// The model's config, and its directory (none for the built-in model).
fn model(config: &Config) -> Result<(ModelConfig, Option<PathBuf>)> {
    match &config.model.path {
        None => Ok((colo_rl::task::model_config(), None)),
        Some(dir) => {
            let file = dir.join("config.json");
            let cfg = ModelConfig::from_file(&file).with_context(|| {
                format!(
                    "model.path `{}`: cannot read the model's config.json",
                    dir.display()
                )
            })?;
            Ok((cfg, Some(dir.clone())))
        }
    }
}

/// colo-model's config in the fields of a Hugging Face `config.json`.
fn hf_config(m: &ModelConfig) -> HfConfig {
    // Qwen2's q/k/v biases without an o bias are what `model_type: qwen2`
    // means to colo-plan; anything else is Llama's `attention_bias`.
    let qwen2 = m.qkv_bias && !m.o_bias;
    // Qwen3's q/k norms are what `model_type: qwen3` adds.
    let model_type = match (qwen2, m.qk_norm()) {
        (true, _) => Some("qwen2"),
        (false, true) => Some("qwen3"),
        (false, false) => None,
    };
    HfConfig {
        model_type: model_type.map(Into::into),
        hidden_size: m.hidden_size as u64,
        intermediate_size: m.intermediate_size as u64,
        num_hidden_layers: m.num_layers as u64,
        num_attention_heads: m.num_heads as u64,
        num_key_value_heads: Some(m.num_kv_heads as u64),
        head_dim: Some(m.head_dim as u64),
        vocab_size: m.vocab_size as u64,
        tie_word_embeddings: m.tie_word_embeddings,
        attention_bias: (!qwen2).then_some(m.qkv_bias),
    }
}

/// The largest decode step a CUDA run's engine captures as a graph (none on
/// the CPU or with `rollout.enforce_eager`): a step's samples (the engine's
/// `kv_seqs`), or a greedy evaluation's prompts where they are more (as
/// many as `rollout.max_num_seqs` at once), at the longest sequence.
fn cuda_graphs(
    config: &Config,
    engine: &colo_rollout::ValidConfig,
    held_out: usize,
) -> Option<GraphCapture> {
    if config.trainer.device != Device::Cuda || config.rollout.enforce_eager {
        return None;
    }
    let steps = engine.kv_seqs.max(held_out.min(engine.max_batch));
    let keys = engine
        .max_seq_len
        .unwrap_or(colo_rollout::graphs::MAX_GRAPH_KEYS);
    let (rows, keys) = colo_rollout::graphs::largest_graph(steps, keys);
    Some(GraphCapture {
        rows: rows as u64,
        keys: keys as u64,
    })
}

/// The prompts that size the run's memory.
struct Prompts {
    /// The longest training prompt in tokens (special tokens included).
    longest: u64,
    /// Held-out prompts (evaluated all at once, up to the engine's batch).
    held_out: usize,
}

/// The run's prompts, encoded as the run encodes them.
fn prompts(config: &Config, model_dir: Option<&Path>) -> Result<Prompts> {
    let tokenizer = match model_dir {
        Some(dir) => Tokenizer::from_dir(dir).with_context(|| {
            format!("model.path `{}`: cannot load its tokenizer", dir.display())
        })?,
        None => {
            // A directory of its own for each call: two plans at once (the
            // tests' threads) must not remove each other's.
            let dir = tempfile::Builder::new()
                .prefix("colo-plan-")
                .tempdir()
                .context("cannot create a temporary directory for the built-in tokenizer")?;
            colo_rl::task::write_model_files(dir.path())?;
            Tokenizer::from_dir(dir.path())?
        }
    };
    let read =
        |files: &[PathBuf]| colo_rl::Dataset::from_files(files, &config.fields(), Some(&tokenizer));
    let (lengths, held_out): (Vec<usize>, usize) = match &config.data.source() {
        DataSource::Builtin(task) => {
            let (train, val) = task.generate()?;
            let lengths = (train.iter())
                .map(|p| tokenizer.encode(&p.prompt, true).map(|ids| ids.len()))
                .collect::<std::result::Result<_, _>>()?;
            (lengths, val.len())
        }
        DataSource::Files { train, val } => {
            let train = read(train)?;
            let lengths = (train.prompts.iter())
                .map(|p| p.encode(&tokenizer).map(|ids| ids.len()))
                .collect::<std::result::Result<_, _>>()?;
            let held_out = match val {
                ValSource::Files(files) => read(files)?.len(),
                ValSource::Fraction(f) => colo_rl::data::held_out_count(train.len(), *f),
                ValSource::None => 0,
            };
            (lengths, held_out)
        }
    };
    let longest = lengths.into_iter().max().unwrap_or(0) as u64;
    if longest == 0 {
        bail!("the run's training data have no prompts");
    }
    Ok(Prompts { longest, held_out })
}

/// The capacity the run's memory layer enforces (the run's own rule).
fn capacity(config: &Config) -> Result<u64> {
    colo_rl::step::device_capacity(config)
        .context("memory.capacity = \"auto\": cannot read the machine's memory; set a capacity")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The planner counts the parameters colo-model builds for every
    /// family: Qwen2's biases, Llama's none, Qwen3's q/k norms.
    #[test]
    fn the_planner_counts_each_fixtures_parameters() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
        for name in ["tiny-qwen2", "tiny-llama", "tiny-llama3", "tiny-qwen3"] {
            let m = ModelConfig::from_file(&root.join(name).join("config.json")).unwrap();
            let spec = hf_config(&m).into_spec(name).unwrap();
            assert_eq!(spec.params(), m.num_parameters() as u64, "{name}");
        }
    }

    /// A sharded run's worker: FSDP over the workers with colo-train's
    /// units (one layer gathered), the reference whole, the sync gathering
    /// unit by unit, checkpointing on; its share of the batch, as a
    /// replica's. One worker, or replicas, plan as one device.
    #[test]
    fn a_sharded_run_maps_onto_fsdp_over_its_workers() {
        let parse = |text: &str| Config::from_toml(text, Path::new("run.toml")).unwrap();
        let full = parse("[cluster]\nworkers = 4\nsharding = \"full\"\n");
        let run = from_config(&full).unwrap();
        let i = &run.input;
        assert_eq!((i.devices, i.fsdp, i.fsdp_gathered_layers), (4, Some(4), 1));
        assert!(!i.fsdp_shard_reference && i.activation_checkpointing);
        assert_eq!(i.weight_sync, WeightSync::Gather);
        assert_eq!(run.scope(), "per worker (4 workers, sharding full)");
        let replicas = from_config(&parse("[cluster]\nworkers = 4\n")).unwrap();
        assert_eq!((replicas.input.devices, replicas.input.fsdp), (1, Some(1)));
        assert_eq!(
            replicas.input.tokens_per_micro_batch,
            i.tokens_per_micro_batch
        );
        assert_eq!(replicas.scope(), "per worker (4 workers, sharding none)");
        // A worker's share of the step: a quarter of the KV cap's samples,
        // and of the micro-batch's tokens (the built-in micro-batch is a
        // whole mini-batch, of which a worker has a quarter).
        let one = from_config(&Config::builtin()).unwrap();
        assert_eq!(one.scope(), "per device");
        let cap = |r: &RunPlan| r.input.kv_tokens_cap.unwrap();
        assert_eq!(cap(&replicas) * 4, cap(&one));
        let micro = |r: &RunPlan| r.input.tokens_per_micro_batch;
        assert_eq!(micro(&replicas) * 4, micro(&one));
    }

    /// A tensor-parallel rollout's worker holds its share of the layers'
    /// weights and of the KV heads of its group's sequences, and the
    /// embedding whole (colo-rollout's layout).
    #[test]
    fn a_tensor_parallel_rollout_is_planned_per_rank() {
        let parse = |text: &str| Config::from_toml(text, Path::new("run.toml")).unwrap();
        let base = "[rollout]\nmax_kv_tokens = 4096\n[cluster]\nworkers = 2\n";
        let one = from_config(&parse(base)).unwrap();
        let tp = base.replace("[rollout]\n", "[rollout]\ntensor_model_parallel_size = 2\n");
        let two = from_config(&parse(&tp)).unwrap();
        assert_eq!(
            (two.input.devices, two.input.gen_tp, two.input.fsdp),
            (2, 2, Some(1))
        );
        assert!(two.input.gen_replicated_embeddings);
        let sizes = |r: &RunPlan| {
            let plan = r.input.validate().unwrap();
            colo_plan::memory::component_sizes(&plan)
        };
        let (a, b) = (sizes(&one), sizes(&two));
        let plan = two.input.validate().unwrap();
        let whole = plan.model.non_layer_params() * plan.param_dtype.bytes();
        assert_eq!(
            b.rollout_weights,
            (a.rollout_weights - whole).div_ceil(2) + whole
        );
        assert_eq!(2 * b.kv_bytes_per_token, a.kv_bytes_per_token);
        assert_eq!(
            two.input.kv_tokens_cap,
            one.input.kv_tokens_cap.map(|c| 2 * c)
        );
    }

    /// The KV term is capped at a step's samples at full length, or at
    /// `rollout.max_num_seqs` of them where that is fewer (as the run's
    /// engine is).
    /// `[model] lora_rank` reaches the plan: the built-in job's optimizer
    /// state shrinks to the adapters' and its reference copy goes.
    #[test]
    fn a_lora_run_plans_the_adapters_state_and_no_reference_copy() {
        let parse = |text: &str| Config::from_toml(text, Path::new("run.toml")).unwrap();
        let full = from_config(&Config::builtin()).unwrap();
        let run = from_config(&parse(
            "[model]\nlora_rank = 8\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
        ))
        .unwrap();
        let lora = run.input.lora.clone().expect("planned with LoRA");
        assert_eq!(
            (lora.rank, lora.target_modules),
            (8, vec!["q_proj".into(), "v_proj".into()])
        );
        let sizes = |r: &RunPlan| colo_plan::memory::component_sizes(&r.input.validate().unwrap());
        let (f, l) = (sizes(&full), sizes(&run));
        assert!(
            l.optimizer * 10 < f.optimizer,
            "{} vs {}",
            l.optimizer,
            f.optimizer
        );
        assert_eq!(l.ref_params, 0);
        assert!(f.ref_params > 0);
    }

    #[test]
    fn the_kv_cap_follows_max_num_seqs_below_a_steps_samples() {
        let mut config = Config::builtin();
        let cap = |c: &Config| from_config(c).unwrap().input.kv_tokens_cap.unwrap();
        let full = cap(&config);
        config.rollout.max_num_seqs = config.batch.samples_per_step / 4;
        assert_eq!(cap(&config) * 4, full);
        config.rollout.max_num_seqs = 4 * config.batch.samples_per_step;
        assert_eq!(cap(&config), full);
    }

    /// A CUDA run's plan holds the largest captured decode step: the
    /// built-in job's 500 held-out prompts at once (above a step's 256
    /// samples), at its longest sequence; none on the CPU or when eager.
    #[test]
    fn a_cuda_run_plans_its_largest_graph() {
        let mut config = Config::builtin();
        let graphs = |c: &Config| from_config(c).unwrap().input.cuda_graphs;
        assert_eq!(graphs(&config), None, "the CPU has no graphs");
        config.trainer.device = Device::Cuda;
        config.memory.capacity = colo_rl::config::Capacity::Bytes(80 << 30);
        let engine = colo_rl::step::engine_config(&config).validate().unwrap();
        assert_eq!(engine.kv_seqs, 256);
        let keys = engine.max_seq_len.unwrap().max(64).next_power_of_two() as u64;
        assert_eq!(graphs(&config), Some(GraphCapture { rows: 512, keys }));
        // Evaluations and steps at most max_num_seqs at once.
        config.rollout.max_num_seqs = 128;
        assert_eq!(graphs(&config), Some(GraphCapture { rows: 128, keys }));
        config.rollout.enforce_eager = true;
        assert_eq!(graphs(&config), None);
    }
}
