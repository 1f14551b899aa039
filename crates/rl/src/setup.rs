//! What a run is set up from: the data, the device capacity, the engines'
//! configurations translated from the run's config, checkpoints on disk,
//! and the pictures drawn at the end. Kept apart from `step.rs` so that the
//! loop reads as the step and nothing else.

use std::path::{Path, PathBuf};

use colo_algo::AdvEstimator;
use colo_mem::Pool;
use colo_model::Tokenizer;
use colo_rollout::EngineConfig;
use colo_train::LossConfig;

use crate::config::{Capacity, Config, DataSource, KvBudget, ValSource};
use crate::data::Dataset;
use crate::reward::{verl, RewardSpec};
use crate::timeline_file::TimelineWriter;
use crate::{plot, Error, Result};

/// The run's model directory (the built-in checkpoint written into
/// `scratch` first) and its tokenizer, once the run's longest sequence is
/// known to fit the model's context window.
///
/// verl refuses a run whose `prompt_length + response_length` exceeds the
/// model's `max_position_embeddings`; colo's engine would otherwise end
/// every long completion at the window, short of `max_new_tokens`, without
/// a word.
pub(crate) fn open_model(config: &Config, scratch: &Path) -> Result<(PathBuf, Tokenizer)> {
    let dir = config.model.resolve(scratch)?;
    let file = dir.join("config.json");
    let context = colo_model::ModelConfig::from_file(&file)?.max_position_embeddings;
    let (prompt, new) = (config.data.max_prompt_length, config.rollout.max_new_tokens);
    if prompt.saturating_add(new) > context {
        return Err(Error::ContextWindow {
            prompt,
            new,
            context,
            config: file,
        });
    }
    let tokenizer = Tokenizer::from_dir(&dir)?;
    Ok((dir, tokenizer))
}

/// Training and held-out prompts.
pub(crate) fn load_data(
    config: &Config,
    out: &Path,
    tokenizer: &Tokenizer,
) -> Result<(Dataset, Dataset)> {
    // Every prompt, training and held-out, is checked against
    // `max_prompt_length` here, when the data are read.
    let read = |files: &[PathBuf]| {
        let data = Dataset::from_files_max_len(
            files,
            &config.fields(),
            tokenizer,
            config.data.max_prompt_length,
            config.data.overlong(),
        )?;
        if data.dropped_overlong > 0 {
            crate::progress::say(&format!(
                "data: left out {} of {} prompts of {files:?}: longer than data.max_prompt_length = {} tokens (data.filter_overlong_prompts)",
                data.dropped_overlong,
                data.dropped_overlong + data.len(),
                config.data.max_prompt_length
            ));
        }
        Ok::<_, Error>(data)
    };
    let (train, val) = match &config.data.source() {
        DataSource::Builtin(task) => {
            let (train, val) = task.write_jsonl(&out.join("data"))?;
            (read(&[train])?, read(&[val])?)
        }
        DataSource::Files { train, val } => {
            let data = read(train)?;
            match val {
                ValSource::Files(v) => (data, read(v)?),
                ValSource::Fraction(f) => data.split(*f, config.data_seed())?,
                ValSource::None => (data, Dataset::default()),
            }
        }
    };
    if let Some(note) = reward_hint(&config.reward, &train) {
        crate::progress::say(&note);
    }
    Ok((train, val))
}

/// A note when the rows name a `data_source` verl scores with a rule of its
/// own while the run compares whole completions: verl's GSM8K data under
/// the default `exact_match` reward would score (almost) nothing.
pub(crate) fn reward_hint(reward: &RewardSpec, train: &Dataset) -> Option<String> {
    let source = train
        .prompts
        .first()?
        .extra
        .get(verl::DATA_SOURCE)?
        .as_str()?;
    (*reward == RewardSpec::ExactMatch {} && verl::rule_for(source).is_some()).then(|| {
        format!(
            "reward: the rows' data_source is {source:?}, which verl scores with a rule of its \
             own, while reward.kind = \"exact_match\" wants the whole completion to equal the \
             ground truth; reward.kind = \"verl\" scores them as verl does"
        )
    })
}

/// The device capacity of the built-in run in f32 when the config says
/// `auto`: its training phase peaks near 56 MiB (parameters, gradients,
/// AdamW state and activations) and its rollout phase holds the weights and
/// half of the rest as KV cache, so the two fit one after the other but not
/// together (`colocation = "naive"` would need ~80 MiB) — the colocation
/// choreography is what makes the run fit. (128 MiB until the
/// shared-prompt forward shrank the update's activations.)
pub const BUILTIN_CAPACITY: u64 = 72 << 20;

/// The same in bf16, where the staged run peaks near 30 MiB mapped (the plan
/// check predicts 30 MiB) and `naive` would need ~53 MiB (measured 54
/// MiB): a device of the f32 size
/// would hold the naive run, and the built-in job would no longer show
/// the choreography at work.
pub const BUILTIN_CAPACITY_BF16: u64 = 44 << 20;

/// The built-in run's "device" for the dtype the run computes in.
pub fn builtin_capacity(config: &Config) -> u64 {
    match config.trainer.dtype.resolve(config.trainer.device) {
        crate::config::Dtype::Bf16 => BUILTIN_CAPACITY_BF16,
        _ => BUILTIN_CAPACITY,
    }
}

/// The device capacity: the config's; on `auto`, [`builtin_capacity`] for
/// the built-in model on the CPU, and the device's memory otherwise (the
/// machine's on the CPU, the GPU's as the driver reports it: on CUDA every
/// tag's memory comes in caching-allocator segments of 2 MiB and more, so
/// the built-in model's tens of MiB would not hold its tags). `colo plan
/// --config` plans with the same number.
pub fn device_capacity(config: &Config) -> Result<u64> {
    let device = config.trainer.device;
    match (config.memory.capacity, &config.model.path) {
        (Capacity::Bytes(b), _) => Ok(b),
        (Capacity::Auto, None) if device == crate::config::Device::Cpu => {
            Ok(builtin_capacity(config))
        }
        (Capacity::Auto, _) => device_memory(device),
    }
}

/// All of a device's memory: the machine's on the CPU, the GPU's as the
/// driver reports it.
pub fn device_memory(device: crate::config::Device) -> Result<u64> {
    match device {
        crate::config::Device::Cpu => Ok(colo_mem::os::machine_memory_bytes()?),
        #[cfg(feature = "cuda")]
        crate::config::Device::Cuda => {
            let _context = colo_mem::cuda::CudaBackend::new(0)?;
            Ok(colo_mem::cuda::mem_get_info()?.1)
        }
        #[cfg(not(feature = "cuda"))]
        crate::config::Device::Cuda => Err(no_cuda()),
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda() -> crate::Error {
    crate::Error::Phase {
        op: "run on trainer.device = \"cuda\"",
        state: "this colo was built without the `cuda` feature \
                (./x cargo build --release --features cuda)"
            .into(),
    }
}

/// The actor's engine for a run of `total_steps` RL steps (the cosine
/// schedule decays over their optimizer steps).
pub(crate) fn trainer_config(config: &Config, total_steps: usize) -> colo_train::TrainerConfig {
    engine_for(config, config.actor.optim(), total_steps)
}

/// An engine with the optimizer `a` for a run of `total_steps` RL steps.
fn engine_for(
    config: &Config,
    optim: colo_train::OptimConfig,
    total_steps: usize,
) -> colo_train::TrainerConfig {
    let optimizer_steps = total_steps.saturating_mul(config.batch.optimizer_steps_per_step);
    colo_train::TrainerConfig {
        optim: colo_train::OptimConfig {
            total_steps: Some(optimizer_steps as u64),
            ..optim
        },
        micro_batch: colo_train::MicroBatchConfig {
            micro_batch_size: config.batch.micro_batch_samples,
            max_tokens: config.batch.micro_batch_max_tokens,
            ..Default::default()
        },
        value_head: None,
        kind: config.trainer.dtype.kind(config.trainer.device),
        device: config.trainer.device.torch(),
        cpu_threads: config.trainer.cpu_threads,
        gradient_checkpointing: config.model.enable_gradient_checkpointing,
        lora: config.model.lora(),
    }
}

/// The run's device memory: a host pool (anonymous "device" memory) on the CPU,
/// colo-mem's CUDA backend on a GPU, with the run's capacity.
pub fn make_pool(config: &Config) -> Result<std::sync::Arc<colo_mem::Pool>> {
    device_pool(config.trainer.device, device_capacity(config)?)
}

/// A pool of `capacity` bytes on `device` (what `make_pool` makes for a
/// run, and the benches for their models). On CUDA, cuBLAS's workspaces are
/// made first, outside every tag (`warm_up_cublas`).
pub fn device_pool(
    device: crate::config::Device,
    capacity: u64,
) -> Result<std::sync::Arc<colo_mem::Pool>> {
    let cfg = colo_mem::PoolConfig::with_capacity(capacity);
    match device {
        crate::config::Device::Cpu => Ok(colo_mem::Pool::host(cfg)?),
        #[cfg(feature = "cuda")]
        crate::config::Device::Cuda => {
            let backend = colo_mem::cuda::CudaBackend::new(0)?;
            let pool = colo_mem::Pool::new(Box::new(backend), cfg)?;
            warm_up_cublas(tch::Device::Cuda(0))?;
            // libtorch's cuDNN attention compiles a kernel for every new
            // shape at run time (1.1–1.8 s each in bf16 on an H200); a run's
            // passes meet new sequence lengths all along. The flash and
            // memory-efficient kernels take a millisecond.
            colo_kernels::set_cudnn_attention(false);
            Ok(pool)
        }
        #[cfg(not(feature = "cuda"))]
        crate::config::Device::Cuda => Err(no_cuda()),
    }
}

/// cuBLAS and cuBLASLt make a thread's workspaces on its first product,
/// through the caching allocator: inside a region they would land in that
/// region's tag (the MemPool routing is process-wide) and pin a segment of
/// it for the rest of the run. One small product with a bias and its
/// backward, in float32 and bf16, before any region makes them outside
/// every tag: the calling thread's, and the autograd device thread's
/// (where the backward's products run).
#[cfg(feature = "cuda")]
fn warm_up_cublas(device: tch::Device) -> Result<()> {
    for kind in [tch::Kind::Float, tch::Kind::BFloat16] {
        let x = tch::Tensor::f_ones([8, 8], (kind, device))?.f_set_requires_grad(true)?;
        let w = tch::Tensor::f_ones([8, 8], (kind, device))?.f_set_requires_grad(true)?;
        let b = tch::Tensor::f_zeros([8], (kind, device))?;
        x.f_linear(&w, Some(&b))?
            .f_sum(tch::Kind::Float)?
            .f_backward()?;
    }
    tch::Cuda::synchronize(0);
    Ok(())
}

/// The sequences the KV cache is sized for at full length (`colo plan`
/// caps its KV term by the same): one generation batch's samples (a step's,
/// unless dynamic sampling draws batches of another size), or
/// `rollout.max_num_seqs` if that is fewer.
pub(crate) fn kv_seqs(config: &Config) -> usize {
    let b = &config.batch;
    (b.gen_batch_prompts.saturating_mul(b.n))
        .min(config.rollout.max_num_seqs)
        .max(1)
}

/// The rollout engine's configuration for a run.
pub fn engine_config(config: &Config) -> EngineConfig {
    let (mem_fraction, max_kv_tokens) = match config.rollout.kv() {
        KvBudget::Fraction(f) => (Some(f), None),
        KvBudget::Tokens(t) => (None, Some(t)),
    };
    EngineConfig {
        mem_fraction,
        max_kv_tokens,
        max_batch: config.rollout.max_num_seqs,
        // SGLang sizes the cache by the fraction alone; a colocated run
        // wakes the cache every step, so colo caps it at what one step's
        // sequences can hold (prefix sharing only makes them need less).
        // Evaluation's held-out prompts may outnumber them: as many run at
        // once as `max_num_seqs` and the cache's blocks allow.
        max_seq_len: Some(config.data.max_prompt_length + config.rollout.max_new_tokens),
        kv_seqs: Some(kv_seqs(config)),
        cpu_threads: config.rollout.cpu_threads,
        enforce_eager: config.rollout.enforce_eager,
        ..EngineConfig::default()
    }
}

pub(crate) fn loss_config(config: &Config) -> LossConfig {
    let a = &config.actor;
    LossConfig {
        policy: a.policy_loss(),
        entropy_coeff: a.entropy_coeff,
        use_kl_loss: a.use_kl_loss,
        kl_loss_coef: if a.use_kl_loss { a.kl_loss_coef } else { 0.0 },
        kl_loss_type: match a.use_kl_loss {
            true => a.kl_loss_type,
            false => LossConfig::default().kl_loss_type,
        },
        rollout_correction: config.algorithm.rollout_correction.clone(),
        loss_scale_factor: None,
    }
}

/// The memory timeline (the rest of `pool`'s events appended to
/// `timeline.jsonl` first) and the reward curve, as SVG and PNG in the run
/// directory; the timeline picture is the whole file's (a resumed run's
/// earlier steps included).
pub(crate) fn draw(out: &Path, pool: &Pool, timeline: &mut TimelineWriter) -> Result<()> {
    timeline.append_new(pool)?;
    let events = timeline.read()?;
    let cap = Some(pool.capacity()).filter(|&c| c != u64::MAX);
    plot::memory_timeline(&events, cap, "colo: device memory per tag")?
        .write(out, "memory_timeline")?;
    if let Some(step) = one_step(&events) {
        plot::memory_transitions(step, cap, "colo: one step, transition by transition")?
            .write(out, "memory_step")?;
    }
    let records = crate::metrics::read(&out.join("metrics.jsonl"))?;
    let (mut scores, mut acc) = (Vec::new(), Vec::new());
    let mut by_source: std::collections::BTreeMap<String, Vec<(usize, f64)>> = Default::default();
    for r in records {
        match r {
            crate::metrics::Record::Step(s) => scores.push((s.step, s.score_mean)),
            crate::metrics::Record::Eval(e) => {
                acc.push((e.step, e.accuracy));
                for (source, s) in e.by_source {
                    by_source
                        .entry(source)
                        .or_default()
                        .push((e.step, s.accuracy));
                }
            }
        }
    }
    let by_source: Vec<_> = by_source.into_iter().collect();
    let title = match acc.is_empty() {
        true => "colo: reward",
        false => "colo: reward and held-out accuracy",
    };
    plot::reward_curve(&scores, &acc, &by_source, title)?.write(out, "reward_curve")
}

/// Whether the run trains a critic (GAE needs its values).
pub(crate) fn uses_critic(config: &Config) -> bool {
    config.algorithm.adv_estimator == AdvEstimator::Gae
}

/// The critic's engine: its optimizer (`[critic]`) plus a value head.
pub(crate) fn critic_config(config: &Config, total_steps: usize) -> colo_train::TrainerConfig {
    // LoRA is the actor's: the critic trains all its weights.
    colo_train::TrainerConfig {
        value_head: Some(Default::default()),
        lora: None,
        ..engine_for(config, config.critic_optim(), total_steps)
    }
}

/// The events of one whole step, from the start of one train → rollout
/// switch to the start of the next: the third such window when the run has
/// one (the first is often the evaluation before training), else the
/// first. Where the whole run's picture is too long to read, this one shows
/// the choreography (wake, sync, free, KV cache, generate, sleep, train).
/// Whether the last phase of `events` is a stage of a train → rollout
/// switch that comes before its sync.
fn after_a_switch_stage(events: &[colo_mem::Event]) -> bool {
    let last = events
        .iter()
        .rev()
        .find(|p| p.kind == colo_mem::EventKind::Phase);
    last.is_some_and(|p| {
        matches!(
            p.phase.as_str(),
            "wake_weights" | "wake_all" | "offload_optimizer" | "offload_ref" | "release_cache"
        )
    })
}

fn one_step(events: &[colo_mem::Event]) -> Option<&[colo_mem::Event]> {
    const SWITCH_STARTS: [&str; 3] = ["offload_optimizer", "sync_weights", "save_weights"];
    let starts: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            e.kind == colo_mem::EventKind::Phase
                && SWITCH_STARTS.contains(&e.phase.as_str())
                // `sync_weights` starts a switch only in naive mode, where
                // nothing comes before it (in the others a wake does, or,
                // with the engine's weights kept resident, the offloads).
                && (e.phase != "sync_weights" || !after_a_switch_stage(&events[..*i]))
        })
        .map(|(i, _)| i)
        .collect();
    let pick = if starts.len() >= 4 { 2 } else { 0 };
    Some(&events[*starts.get(pick)?..*starts.get(pick + 1)?])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::data::Prompt;

    fn rows(source: Option<&str>) -> Dataset {
        let mut extra = serde_json::Map::new();
        if let Some(s) = source {
            extra.insert("data_source".into(), json!(s));
        }
        Dataset {
            prompts: vec![Prompt {
                prompt_id: 0,
                text: "q".into(),
                chat: false,
                ground_truth: "1".into(),
                extra,
                origin: String::new(),
            }],
            ..Dataset::default()
        }
    }

    #[test]
    fn exact_match_on_rows_verl_scores_by_rule_gets_a_note() {
        let exact = RewardSpec::ExactMatch {};
        let note = reward_hint(&exact, &rows(Some("openai/gsm8k"))).unwrap();
        assert!(note.contains("reward.kind = \"verl\""), "{note}");
        assert!(reward_hint(&RewardSpec::Verl {}, &rows(Some("openai/gsm8k"))).is_none());
        assert!(
            reward_hint(&exact, &rows(Some("my/own"))).is_none(),
            "a source verl has no rule for"
        );
        assert!(reward_hint(&exact, &rows(None)).is_none());
        assert!(reward_hint(&exact, &Dataset::default()).is_none());
    }
}
