//! [`RawConfig`] → [`Config`]: each section's values, then the checks
//! across sections (batch sizes against each other, the schedule against
//! the run's length, the dumps, the critic, an evaluation-only run).
//! Errors are `(field path, message)`; the caller adds the file and line.

use colo_algo::{AdvEstimator, AdvantageConfig, PolicyLossConfig, RolloutCorrectionConfig};

use super::num::Num;
use super::raw::{
    default_micro_batch_samples, Loggers, RawActor, RawAlgorithm, RawCapacity, RawCluster,
    RawConfig, RawCritic, RawData, RawMemory, RawRollout, RawTrainer, DEFAULT_MINI_BATCH_PROMPTS,
};
use super::*;

type Check<T> = std::result::Result<T, (String, String)>;

fn bad<T>(field: &str, message: impl Into<String>) -> Check<T> {
    Err((field.to_owned(), message.into()))
}

fn positive(field: &str, v: usize) -> Check<usize> {
    if v == 0 {
        return bad(field, "must be at least 1");
    }
    Ok(v)
}

/// A finite `v > 0`.
fn above_zero(field: &str, v: f64) -> Check<f64> {
    if !(v.is_finite() && v > 0.0) {
        return bad(
            field,
            format!("must be a finite number > 0, got {}", Num(v)),
        );
    }
    Ok(v)
}

/// SAPO's gate temperature: within [1e-6, 1e6], so that the gate
/// σ(τ(r − 1))·4/τ, computed in float32, stays finite and nonzero.
fn gate_temperature(field: &str, v: f64) -> Check<f64> {
    if !(v.is_finite() && (1e-6..=1e6).contains(&v)) {
        return bad(
            field,
            format!(
                "must be a number in [1e-6, 1e6] (SAPO's gate temperature; verl's are 1.0 \
                 and 1.05), got {}",
                Num(v)
            ),
        );
    }
    Ok(v)
}

/// A finite `v ≥ 0`.
fn at_least_zero(field: &str, v: f64) -> Check<f64> {
    if !(v.is_finite() && v >= 0.0) {
        return bad(
            field,
            format!("must be a finite number ≥ 0, got {}", Num(v)),
        );
    }
    Ok(v)
}

fn in_range(field: &str, v: f64, lo: f64, hi: f64) -> Check<f64> {
    if !(v.is_finite() && v >= lo && v <= hi) {
        return bad(
            field,
            format!("must be in [{}, {}], got {}", Num(lo), Num(hi), Num(v)),
        );
    }
    Ok(v)
}

fn sampling(prefix: &str, temperature: f64, top_p: f64, top_k: i64) -> Check<Sampling> {
    let temperature = in_range(&format!("{prefix}temperature"), temperature, 0.0, 100.0)?;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return bad(
            &format!("{prefix}top_p"),
            format!("must be in (0, 1], got {top_p}"),
        );
    }
    let top_k = match top_k {
        -1 | 0 => None,
        k if k > 0 => Some(k as usize),
        k => {
            return bad(
                &format!("{prefix}top_k"),
                format!("must be -1 (off) or positive, got {k}"),
            )
        }
    };
    Ok(Sampling {
        temperature,
        top_p,
        top_k,
    })
}

/// `-1` / `0` → `None` (verl's "never" for frequencies).
fn frequency(field: &str, v: i64) -> Check<Option<usize>> {
    match v {
        -1 | 0 => Ok(None),
        v if v > 0 => Ok(Some(v as usize)),
        v => bad(field, format!("must be -1 (off) or positive, got {v}")),
    }
}

/// `"auto"`, bytes, or a size with a unit (`512MiB`, `2 GB`, `1.5GiB`):
/// the `bytesize` crate's parser (KB, MB, … decimal; KiB, MiB, … binary).
pub(crate) fn capacity(raw: &RawCapacity) -> Check<Capacity> {
    let text = match raw {
        RawCapacity::Bytes(0) => return bad("memory.capacity", "must be positive"),
        RawCapacity::Bytes(b) => return Ok(Capacity::Bytes(*b)),
        RawCapacity::Text(t) => t.trim(),
    };
    if text.eq_ignore_ascii_case("auto") {
        return Ok(Capacity::Auto);
    }
    match text.parse::<bytesize::ByteSize>().map(|b| b.as_u64()) {
        Ok(0) => bad("memory.capacity", format!("must be positive, got {text:?}")),
        // The parser saturates on overflow.
        Ok(u64::MAX) => bad("memory.capacity", format!("{text:?} is too large")),
        Ok(b) => Ok(Capacity::Bytes(b)),
        Err(_) => bad(
            "memory.capacity",
            format!(
                "expected \"auto\" or a size like \"512MiB\" (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), got {text:?}"
            ),
        ),
    }
}

pub(crate) fn validate(raw: RawConfig) -> Check<Config> {
    let RawConfig {
        data,
        model,
        rollout,
        actor,
        critic,
        algorithm,
        reward,
        memory,
        trainer,
        cluster,
    } = raw;
    let prompts = data.train_batch_size;
    let gen_batch_size = data.gen_batch_size;
    let mut data_cfg = data_section(data, trainer.seed)?;
    data_cfg.fields.structured_answers = reward.takes_structured_ground_truth();
    let rollout_cfg = rollout_section(&rollout, algorithm.adv_estimator)?;
    let longest = data_cfg.max_prompt_length + rollout_cfg.max_new_tokens;
    let mut batch = batch_plan(prompts, rollout_cfg.n, longest, &actor)?;
    let ppo_epochs = batch.optimizer_steps_per_step / batch.mini_batches_per_step;
    let mut actor_cfg = actor_section(actor, ppo_epochs)?;
    actor_cfg.gradient_checkpointing = model.enable_gradient_checkpointing;
    let critic_cfg = critic_section(critic, &actor_cfg)?;
    let algorithm_cfg = algorithm_section(algorithm, rollout_cfg.max_new_tokens)?;
    batch.gen_batch_prompts = gen_batch(gen_batch_size, prompts, &algorithm_cfg)?;
    if let Err((field, message)) = reward.validate() {
        return bad(&format!("reward.{field}"), message);
    }
    let config = Config {
        data: data_cfg,
        model: match model.path {
            Some(p) => ModelSource::Path(p),
            None => ModelSource::Builtin,
        },
        rollout: rollout_cfg,
        actor: actor_cfg,
        critic: critic_cfg,
        algorithm: algorithm_cfg,
        reward,
        memory: memory_section(&memory)?,
        trainer: trainer_section(trainer)?,
        cluster: cluster_section(cluster, &batch)?,
        batch,
    };
    schedule_fits(&config)?;
    dumps_fit(&config)?;
    critic_warmup_fits(&config)?;
    val_only_fits(&config)?;
    let s = &config.rollout.sampling;
    if config.algorithm.filter_groups.is_some() && (s.temperature == 0.0 || s.top_k == Some(1)) {
        return bad(
            "algorithm.filter_groups.enable",
            "greedy sampling (rollout.temperature = 0 or rollout.top_k = 1) gives all of a \
             prompt's samples one completion, so no group varies and no step could finish",
        );
    }
    Ok(config)
}

/// A cosine schedule needs more optimizer steps than its warmup.
fn schedule_fits(c: &Config) -> Check<()> {
    let RunLength::Steps(steps) = c.trainer.length else {
        return Ok(());
    };
    let optimizer_steps = steps.saturating_mul(c.batch.optimizer_steps_per_step);
    if let Some(why) = c.actor.optim.schedule_error(optimizer_steps) {
        return bad("actor.warmup_steps", why);
    }
    if let Some(why) = c.critic.optim.schedule_error(optimizer_steps) {
        return bad(
            "critic.warmup_steps",
            why.replace("actor.warmup_steps", "critic.warmup_steps"),
        );
    }
    Ok(())
}

/// The generation dumps need two directories, and held-out prompts for
/// the evaluations'.
fn dumps_fit(c: &Config) -> Check<()> {
    let t = &c.trainer;
    if t.rollout_data_dir.is_some() && t.rollout_data_dir == t.validation_data_dir {
        return bad(
            "trainer.validation_data_dir",
            "is trainer.rollout_data_dir too, where a step's samples and an evaluation's \
             generations of the same step would overwrite each other's {step}.jsonl; name \
             another directory",
        );
    }
    if t.validation_data_dir.is_some() && !c.evaluates() {
        return bad(
            "trainer.validation_data_dir",
            "would hold the evaluations' generations, and the run has no held-out prompts \
             (data.val_files or data.val_fraction); set one, or leave the key out",
        );
    }
    Ok(())
}

/// Critic-only steps need a critic, and leave the actor some steps.
fn critic_warmup_fits(c: &Config) -> Check<()> {
    let warmup = c.trainer.critic_warmup;
    let gae = c.algorithm.advantage.adv_estimator == AdvEstimator::Gae;
    if let (true, RunLength::Steps(steps)) = (gae, c.trainer.length) {
        if warmup >= steps {
            return bad(
                "trainer.critic_warmup",
                format!(
                    "{warmup} steps of critic-only updates leave the actor none of the run's \
                     {steps} (trainer.total_steps)"
                ),
            );
        }
    }
    if warmup > 0 && !gae {
        return bad(
            "trainer.critic_warmup",
            format!(
                "{warmup} steps of critic-only updates need a critic, which only \
                 algorithm.adv_estimator = \"gae\" trains"
            ),
        );
    }
    Ok(())
}

/// An evaluation-only run needs held-out prompts, and runs in one process
/// from `model.path`.
fn val_only_fits(c: &Config) -> Check<()> {
    if !c.trainer.val_only {
        return Ok(());
    }
    let why = match (c.evaluates(), c.trainer.resume, c.cluster.workers) {
        (false, ..) => "needs held-out prompts: data.val_files or data.val_fraction".to_owned(),
        (_, true, _) => VAL_ONLY_RESUME.to_owned(),
        (.., w) if w > 1 => format!(
            "evaluates in one process, and the run has {w} workers (cluster.workers or \
             cluster.layout)"
        ),
        _ => return Ok(()),
    };
    bad("trainer.val_only", why)
}

/// The workers (from `workers` or the layout, which must agree) must split
/// every step's prompts and every mini-batch into whole prompts (each
/// worker holds complete GRPO groups).
fn cluster_section(cluster: RawCluster, batch: &BatchPlan) -> Check<ClusterConfig> {
    let from_layout = match &cluster.layout {
        None => None,
        Some(l) => Some(layout_devices(l)?),
    };
    let w = match (cluster.workers, from_layout) {
        (Some(w), Some(d)) if w != d => {
            return bad(
                "cluster.layout",
                format!("uses {d} devices, but cluster.workers = {w}"),
            )
        }
        (Some(w), _) => positive("cluster.workers", w)?,
        (None, Some(d)) => d,
        (None, None) => 1,
    };
    for (key, prompts) in [
        ("data.train_batch_size", batch.prompts_per_step),
        ("actor.ppo_mini_batch_size", batch.mini_batch_prompts),
    ] {
        if prompts % w != 0 {
            let field = match cluster.workers {
                Some(_) => "cluster.workers",
                None => "cluster.layout",
            };
            return bad(
                field,
                format!("= {w} workers do not divide {key} = {prompts} prompts: each worker takes whole prompts of every step and mini-batch"),
            );
        }
    }
    if cluster
        .address
        .as_deref()
        .is_some_and(|a| a != "auto" && !a.contains(':'))
    {
        return bad("cluster.address", "expected \"auto\" or host:port");
    }
    Ok(ClusterConfig {
        workers: w,
        layout: cluster.layout,
        address: cluster.address,
    })
}

/// The devices of a `"p-t-d"` layout that colo train can execute: data
/// parallelism only (`p = t = 1`).
fn layout_devices(layout: &str) -> Check<usize> {
    let dims: Vec<usize> = layout
        .split('-')
        .map(|x| x.trim().parse::<usize>().ok().filter(|&v| v > 0))
        .collect::<Option<Vec<usize>>>()
        .filter(|v| v.len() == 3)
        .ok_or_else(|| {
            (
                "cluster.layout".to_string(),
                format!("{layout:?} is not a p-t-d layout (three positive numbers, as colo plan map prints them)"),
            )
        })?;
    match dims[..] {
        [1, 1, d] => Ok(d),
        [p, t, _] => bad(
            "cluster.layout",
            format!("{layout:?} has pipeline × tensor parallelism {p} × {t}: colo plan plans it, colo train executes data-parallel layouts \"1-1-N\" only"),
        ),
        _ => unreachable!("three dimensions"),
    }
}

fn data_section(data: RawData, default_seed: u64) -> Check<DataConfig> {
    let train = data.train_files.to_vec();
    let val = data.val_files.to_vec();
    let source = match (train.is_empty(), val.is_empty(), data.val_fraction) {
        (true, true, None) => DataSource::Builtin(data.builtin.clone()),
        (true, _, _) => return bad(
            "data.train_files",
            "held-out data are given but no training files (leave both out for the built-in task)",
        ),
        (false, false, Some(_)) => {
            return bad(
                "data.val_fraction",
                "give val_files or val_fraction, not both",
            )
        }
        (false, false, None) => DataSource::Files {
            train,
            val: ValSource::Files(val),
        },
        (false, true, Some(f)) if f > 0.0 && f < 1.0 => DataSource::Files {
            train,
            val: ValSource::Fraction(f),
        },
        (false, true, Some(f)) => {
            return bad("data.val_fraction", format!("must be in (0, 1), got {f}"))
        }
        (false, true, None) => DataSource::Files {
            train,
            val: ValSource::None,
        },
    };
    if let DataSource::Builtin(t) = &source {
        if t.train_size + t.val_size > t.space() {
            return bad(
                "data.builtin.train_size",
                format!(
                    "train_size + val_size exceed the task's {} distinct problems",
                    t.space()
                ),
            );
        }
        if t.ops.is_empty() {
            return bad("data.builtin.ops", "needs at least one of \"+\", \"-\"");
        }
    }
    for (field, v) in [
        ("data.prompt_key", &data.prompt_key),
        ("data.answer_key", &data.answer_key),
    ] {
        if v.is_empty() {
            return bad(field, "must not be empty");
        }
    }
    let data_cfg = DataConfig {
        source,
        fields: Fields {
            prompt_key: data.prompt_key,
            answer_key: data.answer_key,
            // The reward's (below).
            structured_answers: false,
        },
        max_prompt_length: positive("data.max_prompt_length", data.max_prompt_length)?,
        overlong: match data.filter_overlong_prompts {
            true => Overlong::Drop,
            false => Overlong::Error,
        },
        seed: data.seed.unwrap_or(default_seed),
        shuffle: data.shuffle,
    };

    Ok(data_cfg)
}

fn rollout_section(rollout: &RawRollout, estimator: AdvEstimator) -> Check<RolloutConfig> {
    let n = positive("rollout.n", rollout.n)?;
    let group = matches!(
        estimator,
        AdvEstimator::Grpo
            | AdvEstimator::Rloo
            | AdvEstimator::ReinforcePlusPlusBaseline
            | AdvEstimator::Opo
            | AdvEstimator::GrpoPassk
            | AdvEstimator::Gpg
    );
    if group && n < 2 {
        return bad(
            "rollout.n",
            format!(
                "adv_estimator `{}` compares samples of a prompt: n must be at least 2",
                estimator.name()
            ),
        );
    }
    let kv = match rollout.max_kv_tokens {
        Some(t) => KvBudget::Tokens(positive("rollout.max_kv_tokens", t)?),
        None if rollout.mem_fraction > 0.0 && rollout.mem_fraction <= 1.0 => {
            KvBudget::Fraction(rollout.mem_fraction)
        }
        None => {
            return bad(
                "rollout.mem_fraction",
                format!("must be in (0, 1], got {}", rollout.mem_fraction),
            )
        }
    };
    let v = &rollout.val_kwargs;
    let rollout_cfg = RolloutConfig {
        n,
        sampling: sampling(
            "rollout.",
            rollout.temperature,
            rollout.top_p,
            rollout.top_k,
        )?,
        max_new_tokens: positive("rollout.max_new_tokens", rollout.max_new_tokens)?,
        kv,
        max_num_seqs: positive("rollout.max_num_seqs", rollout.max_num_seqs)?,
        cpu_threads: (rollout.cpu_threads > 0).then_some(rollout.cpu_threads),
        enforce_eager: rollout.enforce_eager,
        val_n: positive("rollout.val_kwargs.n", v.n)?,
        val_sampling: sampling("rollout.val_kwargs.", v.temperature, v.top_p, v.top_k)?,
    };

    Ok(rollout_cfg)
}

/// The largest divisor of `whole` that is at most `limit`: an unset
/// mini- or micro-batch size follows its default down to what divides the
/// batch it cuts, as a user who shrinks the batch would expect (the
/// explicit value that does not divide is an error).
fn fitting(limit: usize, whole: usize) -> usize {
    (1..=limit.min(whole))
        .rev()
        .find(|d| whole.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Prompts per step → mini-batches (prompts) → micro-batches (samples, or
/// a token budget that must hold the `longest` sample).
fn batch_plan(prompts: usize, n: usize, longest: usize, actor: &RawActor) -> Check<BatchPlan> {
    let prompts = positive("data.train_batch_size", prompts)?;
    let mini = match actor.ppo_mini_batch_size {
        Some(m) => positive("actor.ppo_mini_batch_size", m)?,
        None => fitting(DEFAULT_MINI_BATCH_PROMPTS, prompts),
    };
    if prompts % mini != 0 {
        return bad(
            "actor.ppo_mini_batch_size",
            format!("{mini} prompts must divide data.train_batch_size ({prompts} prompts)"),
        );
    }
    let micro = match actor.ppo_micro_batch_size {
        Some(m) => positive("actor.ppo_micro_batch_size", m)?,
        None => fitting(
            default_micro_batch_samples(longest, actor.ppo_max_token_len_per_gpu),
            mini * n,
        ),
    };
    let max_tokens = match actor.use_dynamic_bsz {
        false => None,
        true if actor.ppo_max_token_len_per_gpu < longest => {
            return bad(
                "actor.ppo_max_token_len_per_gpu",
                format!(
                    "{} tokens cannot hold the longest sample: data.max_prompt_length + rollout.max_new_tokens = {longest} tokens",
                    actor.ppo_max_token_len_per_gpu
                ),
            )
        }
        true => Some(actor.ppo_max_token_len_per_gpu),
    };
    // With a token budget the sample count is not used (as in verl).
    if max_tokens.is_none() && !(mini * n).is_multiple_of(micro) {
        return bad(
            "actor.ppo_micro_batch_size",
            format!(
                "{micro} samples must divide a mini-batch: ppo_mini_batch_size {mini} × rollout.n {n} = {} samples",
                mini * n
            ),
        );
    }
    let ppo_epochs = positive("actor.ppo_epochs", actor.ppo_epochs)?;
    let batch = BatchPlan {
        prompts_per_step: prompts,
        n,
        samples_per_step: prompts * n,
        gen_batch_prompts: prompts,
        mini_batch_prompts: mini,
        mini_batch_samples: mini * n,
        mini_batches_per_step: prompts / mini,
        micro_batch_samples: micro,
        micro_batches_per_mini_batch: match max_tokens {
            Some(_) => mini * n,
            None => mini * n / micro,
        },
        micro_batch_max_tokens: max_tokens,
        optimizer_steps_per_step: prompts / mini * ppo_epochs,
    };

    Ok(batch)
}

/// An Adam β: in [0, 1).
fn beta(field: &str, b: f64) -> Check<f64> {
    match (0.0..1.0).contains(&b) {
        true => Ok(b),
        false => bad(field, format!("each must be in [0, 1), got {}", Num(b))),
    }
}

/// Why `val_only` does not resume (said by the config and by `--resume`).
pub(crate) const VAL_ONLY_RESUME: &str = "evaluates model.path and does not resume; to evaluate a \
     run's checkpoint, set model.path to its directory (checkpoints/step-N is a Hugging Face \
     directory)";

/// `[critic]`: the actor's optimizer but for what it sets.
fn critic_section(critic: RawCritic, actor: &ActorConfig) -> Check<CriticConfig> {
    let a = &actor.optim;
    let optim = OptimConfig {
        lr: match critic.lr {
            Some(lr) => above_zero("critic.lr", lr)?,
            None => a.lr,
        },
        warmup_steps: critic.warmup_steps.unwrap_or(a.warmup_steps),
        weight_decay: match critic.weight_decay {
            Some(w) => in_range("critic.weight_decay", w, 0.0, 1.0)?,
            None => a.weight_decay,
        },
        grad_clip: match critic.grad_clip {
            Some(c) => above_zero("critic.grad_clip", c)?,
            None => a.grad_clip,
        },
        ..*a
    };
    Ok(CriticConfig {
        optim,
        cliprange_value: above_zero("critic.cliprange_value", critic.cliprange_value)?,
        loss_agg_mode: critic
            .loss_agg_mode
            .unwrap_or(actor.policy_loss.loss_agg_mode),
    })
}

fn actor_section(actor: RawActor, ppo_epochs: usize) -> Check<ActorConfig> {
    Ok(ActorConfig {
        optim: OptimConfig {
            lr: above_zero("actor.lr", actor.lr)?,
            warmup_steps: actor.warmup_steps,
            weight_decay: in_range("actor.weight_decay", actor.weight_decay, 0.0, 1.0)?,
            grad_clip: above_zero("actor.grad_clip", actor.grad_clip)?,
            schedule: actor.warmup_style,
            min_lr_ratio: in_range("actor.min_lr_ratio", actor.min_lr_ratio, 0.0, 1.0)?,
            betas: match actor.betas[..] {
                [b1, b2] => (beta("actor.betas", b1)?, beta("actor.betas", b2)?),
                _ => {
                    return bad(
                        "actor.betas",
                        format!("must be two numbers [β₁, β₂], got {:?}", actor.betas),
                    )
                }
            },
        },
        ppo_epochs,
        policy_loss: policy_loss(&actor)?,
        entropy_coeff: in_range("actor.entropy_coeff", actor.entropy_coeff, -1.0, 1.0)?,
        kl_loss: match actor.use_kl_loss {
            true => Some(KlLoss {
                coef: at_least_zero("actor.kl_loss_coef", actor.kl_loss_coef)?,
                estimator: actor.kl_loss_type,
            }),
            false => None,
        },
        gradient_checkpointing: false,
    })
}

/// The policy loss's settings, each loss mode's within its range.
fn policy_loss(actor: &RawActor) -> Check<PolicyLossConfig> {
    let policy_loss = PolicyLossConfig {
        loss_mode: actor.loss_mode,
        clip_ratio: actor.clip_ratio,
        clip_ratio_low: actor.clip_ratio_low,
        clip_ratio_high: actor.clip_ratio_high,
        clip_ratio_c: actor.clip_ratio_c,
        loss_agg_mode: actor.loss_agg_mode,
        kl_cov_ratio: actor.kl_cov_ratio,
        ppo_kl_coef: actor.ppo_kl_coef,
        clip_cov_ratio: actor.clip_cov_ratio,
        clip_cov_lb: actor.clip_cov_lb,
        clip_cov_ub: actor.clip_cov_ub,
        tau_pos: gate_temperature("actor.tau_pos", actor.tau_pos)?,
        tau_neg: gate_temperature("actor.tau_neg", actor.tau_neg)?,
    };
    covariance_settings(actor)?;
    if let Err(colo_algo::Error::InvalidConfig {
        field,
        value,
        reason,
    }) = policy_loss.clip_range()
    {
        // An unset bound takes clip_ratio's value: name the key written.
        let field = match field {
            "clip_ratio_low" if actor.clip_ratio_low.is_none() => "clip_ratio",
            "clip_ratio_high" if actor.clip_ratio_high.is_none() => "clip_ratio",
            f => f,
        };
        // colo-algo writes the value with `{}`: every digit of 1e300.
        let value = value.parse().map_or(value, |v: f64| Num(v).to_string());
        return bad(&format!("actor.{field}"), format!("{reason}, got {value}"));
    }
    Ok(policy_loss)
}

/// Clip-Cov's and KL-Cov's shares of tokens and covariance range.
fn covariance_settings(actor: &RawActor) -> Check<()> {
    if !(actor.clip_cov_ratio > 0.0 && actor.clip_cov_ratio <= 1.0) {
        return bad(
            "actor.clip_cov_ratio",
            format!(
                "is the share of tokens Clip-Cov drops: in (0, 1], got {}",
                actor.clip_cov_ratio
            ),
        );
    }
    let (lb, ub) = (actor.clip_cov_lb, actor.clip_cov_ub);
    if !lb.is_finite() {
        return bad(
            "actor.clip_cov_lb",
            format!("must be a finite number, got {}", Num(lb)),
        );
    }
    if ub.is_finite() && ub <= lb && ub == RawActor::default().clip_cov_ub {
        // The file moved the lower bound past the default upper one.
        return bad(
            "actor.clip_cov_lb",
            format!(
                "must be below actor.clip_cov_ub = {} (Clip-Cov draws tokens whose \
                 covariance lies between them; set clip_cov_ub too), got {}",
                Num(ub),
                Num(lb)
            ),
        );
    }
    if !(ub.is_finite() && ub > lb) {
        return bad(
            "actor.clip_cov_ub",
            format!(
                "must be a finite number above actor.clip_cov_lb = {} (Clip-Cov draws tokens \
                 whose covariance lies between them), got {}",
                Num(lb),
                Num(ub)
            ),
        );
    }
    if !(actor.kl_cov_ratio > 0.0 && actor.kl_cov_ratio <= 1.0) {
        return bad(
            "actor.kl_cov_ratio",
            format!(
                "is the share of tokens KL-Cov penalises: in (0, 1], got {}",
                actor.kl_cov_ratio
            ),
        );
    }
    if !(actor.ppo_kl_coef.is_finite() && actor.ppo_kl_coef >= 0.0) {
        return bad(
            "actor.ppo_kl_coef",
            format!("must be a number ≥ 0, got {}", Num(actor.ppo_kl_coef)),
        );
    }
    Ok(())
}

fn algorithm_section(algorithm: RawAlgorithm, max_new_tokens: usize) -> Check<AlgorithmConfig> {
    let ob = &algorithm.overlong_buffer;
    let overlong_buffer = match ob.enable {
        false => None,
        true => {
            let field = "algorithm.overlong_buffer.len";
            if ob.len == 0 || ob.len > max_new_tokens {
                return bad(
                    field,
                    format!(
                        "must be 1 to rollout.max_new_tokens = {max_new_tokens} (the tokens before \
                         the limit over which the punishment grows), got {}",
                        ob.len
                    ),
                );
            }
            Some(colo_algo::OverlongBuffer {
                len: ob.len,
                penalty_factor: at_least_zero(
                    "algorithm.overlong_buffer.penalty_factor",
                    ob.penalty_factor,
                )?,
            })
        }
    };
    let fg = &algorithm.filter_groups;
    let filter_groups = match fg.enable {
        false => None,
        true => {
            let metric = FilterMetric::parse(fg.metric.trim());
            match &metric {
                FilterMetric::Extra(name) if name.is_empty() => return bad(
                    "algorithm.filter_groups.metric",
                    "must name what varies within a group: \"acc\", \"score\", \"seq_reward\", \
                         \"seq_final_reward\", or a number the reward returns beside its score",
                ),
                // verl filters after the KL penalty of the generation batch;
                // colo computes that penalty on the kept samples only.
                FilterMetric::SeqFinalReward if algorithm.use_kl_in_reward => return bad(
                    "algorithm.filter_groups.metric",
                    "\"seq_final_reward\" with algorithm.use_kl_in_reward needs the KL penalty \
                         before the filter, and colo computes it on the kept samples: filter on \
                         \"seq_reward\" (the rewards before the penalty) or \"acc\"",
                ),
                _ => {}
            }
            Some(FilterGroups {
                metric,
                max_gen_batches: usize::try_from(fg.max_num_gen_batches)
                    .ok()
                    .filter(|&m| m > 0),
            })
        }
    };
    let ctrl = &algorithm.kl_ctrl;
    if algorithm.use_kl_in_reward {
        at_least_zero("algorithm.kl_ctrl.kl_coef", ctrl.kl_coef)?;
    }
    let rc = &algorithm.rollout_correction;
    above_zero(
        "algorithm.rollout_correction.rollout_is_threshold",
        rc.rollout_is_threshold,
    )?;
    let algorithm_cfg = AlgorithmConfig {
        advantage: AdvantageConfig {
            adv_estimator: algorithm.adv_estimator,
            gamma: in_range("algorithm.gamma", algorithm.gamma, 0.0, 1.0)?,
            lam: in_range("algorithm.lam", algorithm.lam, 0.0, 1.0)?,
            norm_adv_by_std_in_grpo: algorithm.norm_adv_by_std_in_grpo,
            ..AdvantageConfig::default()
        },
        kl_in_reward: algorithm.use_kl_in_reward.then(|| KlInReward {
            estimator: algorithm.kl_penalty,
            ctrl: algorithm.kl_ctrl.clone(),
        }),
        rollout_correction: RolloutCorrectionConfig {
            rollout_is: rc.rollout_is,
            rollout_is_threshold: rc.rollout_is_threshold,
        },
        overlong_buffer,
        filter_groups,
    };

    Ok(algorithm_cfg)
}

/// `data.gen_batch_size`: prompts per generation batch, which only
/// dynamic sampling draws more than one of.
fn gen_batch(gen: Option<usize>, prompts: usize, algorithm: &AlgorithmConfig) -> Check<usize> {
    match (gen, &algorithm.filter_groups) {
        (None, _) => Ok(prompts),
        (Some(g), Some(_)) => positive("data.gen_batch_size", g),
        (Some(g), None) if g == prompts => Ok(g),
        (Some(g), None) => bad(
            "data.gen_batch_size",
            format!(
                "= {g} prompts differs from data.train_batch_size = {prompts}, and only dynamic \
                 sampling (algorithm.filter_groups.enable) generates more than it trains on; \
                 enable it, or leave gen_batch_size out"
            ),
        ),
    }
}

fn memory_section(memory: &RawMemory) -> Check<MemoryConfig> {
    let memory_cfg = MemoryConfig {
        capacity: capacity(&memory.capacity)?,
        colocation: memory.colocation,
        offload_train_param: memory.offload_train_param,
        offload_train_grad: memory.offload_train_grad,
        offload_train_optimizer: memory.offload_train_optimizer,
        offload_ref: memory.offload_ref,
        offload_policy: memory.offload_policy,
    };

    Ok(memory_cfg)
}

/// `runs/{project_name}/{experiment_name}` (either alone: `runs/{it}`), or
/// `runs/colo` without names; a name must be one path component.
fn default_out_dir(project: Option<&str>, experiment: Option<&str>) -> Check<PathBuf> {
    let mut dir = PathBuf::from("runs");
    for (field, name) in [
        ("trainer.project_name", project),
        ("trainer.experiment_name", experiment),
    ] {
        let Some(name) = name else { continue };
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
            return bad(
                field,
                format!(
                    "{name:?} names the run directory runs/{{project_name}}/{{experiment_name}}: \
                     it must be one non-empty path component (or set trainer.out_dir)"
                ),
            );
        }
        dir.push(name);
    }
    if project.is_none() && experiment.is_none() {
        return Ok(PathBuf::from(super::DEFAULT_OUT_DIR));
    }
    Ok(dir)
}

/// verl's logger backends that colo has: `console` (its progress and
/// summary lines) and `file` (`metrics.jsonl`), both always written. A
/// backend colo does not have is an error: a run the user expects in wandb
/// must not go silently unrecorded there.
fn loggers(raw: Loggers) -> Check<Vec<String>> {
    let names = match raw {
        Loggers::One(name) => vec![name],
        Loggers::Many(names) => names,
    };
    for name in &names {
        if !matches!(name.as_str(), "console" | "file") {
            return bad(
                "trainer.logger",
                format!(
                    "{name:?} is not a logger colo has: it writes the console and metrics.jsonl \
                     in the run directory (verl's \"console\" and \"file\"), always; \
                     remove {name:?}, or read metrics.jsonl into {name} after the run"
                ),
            );
        }
    }
    Ok(names)
}

/// A directory that is named, if any (`""` names none).
fn not_empty(field: &str, dir: Option<PathBuf>) -> Check<Option<PathBuf>> {
    match dir {
        Some(d) if d.as_os_str().is_empty() => bad(field, "must name a directory, got \"\""),
        d => Ok(d),
    }
}

fn trainer_section(trainer: RawTrainer) -> Check<TrainerConfig> {
    let length = match (trainer.total_steps, trainer.total_epochs) {
        (Some(s), _) => RunLength::Steps(positive("trainer.total_steps", s)?),
        (None, Some(e)) => RunLength::Epochs(positive("trainer.total_epochs", e)?),
        (None, None) => RunLength::Steps(DEFAULT_TOTAL_STEPS),
    };
    let trainer_cfg = TrainerConfig {
        length,
        save_freq: frequency("trainer.save_freq", trainer.save_freq)?,
        test_freq: frequency("trainer.test_freq", trainer.test_freq)?,
        val_before_train: trainer.val_before_train,
        val_only: trainer.val_only,
        resume: trainer.resume,
        out_dir: match trainer.out_dir {
            Some(dir) => dir,
            None => default_out_dir(
                trainer.project_name.as_deref(),
                trainer.experiment_name.as_deref(),
            )?,
        },
        project_name: trainer.project_name,
        experiment_name: trainer.experiment_name,
        logger: trainer.logger.map(loggers).transpose()?,
        critic_warmup: trainer.critic_warmup,
        rollout_data_dir: not_empty("trainer.rollout_data_dir", trainer.rollout_data_dir)?,
        validation_data_dir: not_empty("trainer.validation_data_dir", trainer.validation_data_dir)?,
        seed: trainer.seed,
        device: trainer.device,
        dtype: trainer.dtype,
        cpu_threads: (trainer.cpu_threads > 0).then_some(trainer.cpu_threads),
    };
    Ok(trainer_cfg)
}
