//! The checks of a deserialised [`Config`]: each section's values, then
//! the checks across sections (batch sizes against each other, the
//! schedule against the run's length, the dumps, the critic, an
//! evaluation-only run). What an unset key resolves to is written into
//! the config, so that it prints as it runs; [`BatchPlan`] is derived.
//! Errors are `(field path, message)`; the caller adds the file and line.

use colo_algo::AdvEstimator;

use super::num::Num;
use super::*;

type Check<T> = std::result::Result<T, (String, String)>;

fn bad<T>(field: &str, message: impl Into<String>) -> Check<T> {
    Err((field.to_owned(), message.into()))
}

/// `return bad(field, format!(…))`.
macro_rules! bail {
    ($field:expr, $($message:tt)+) => {
        return Err(($field.to_string(), format!($($message)+)))
    };
}

/// The first key outside the range its declaration gives
/// (`#[key(range = "> 0")]`, checked by colo-keys).
fn ranges(c: &Config) -> Check<()> {
    let Some(e) = colo_keys::Keys::out_of_range(c) else {
        return Ok(());
    };
    let (r, v) = (e.range.text, Num(e.value));
    let message = match r.strip_prefix('≥') {
        Some(lo) if e.integer => format!("must be at least{lo}, got {v}"),
        _ if r.starts_with(['>', '≥']) => format!("must be a finite number {r}, got {v}"),
        _ => format!("must be in {r}, got {v}"),
    };
    bad(&e.key, message)
}

/// SAPO's gate temperature: within [1e-6, 1e6], so that the gate
/// σ(τ(r − 1))·4/τ, computed in float32, stays finite and nonzero.
fn gate_temperature(field: &str, v: f64) -> Check<()> {
    if !(v.is_finite() && (1e-6..=1e6).contains(&v)) {
        bail!(
            field,
            "must be a number in [1e-6, 1e6] (SAPO's gate temperature; verl's are 1.0 \
             and 1.05), got {}",
            Num(v)
        );
    }
    Ok(())
}

/// `top_k`, a save or test frequency: `-1` / `0` is "off" or "never"
/// (verl's), a positive number a count or a period.
fn frequency(field: &str, v: i64) -> Check<()> {
    match v {
        v if v >= -1 => Ok(()),
        v => bail!(field, "must be -1 (off) or positive, got {v}"),
    }
}

/// Checks `c`, writes in what its unset keys resolve to, and derives its
/// batch plan; `written` says whether the file sets a key (`section.key`).
pub(crate) fn validate(mut c: Config, written: &dyn Fn(&str) -> bool) -> Check<Config> {
    ranges(&c)?;
    data_section(&c.data)?;
    c.data.seed = Some(c.data_seed());
    rollout_section(&c.rollout, c.algorithm.adv_estimator)?;
    let longest = c.data.max_prompt_length + c.rollout.max_new_tokens;
    c.batch = batch_plan(&c.data, c.rollout.n, longest, &c.actor)?;
    c.actor.ppo_mini_batch_size = Some(c.batch.mini_batch_prompts);
    c.actor.ppo_micro_batch_size = Some(c.batch.micro_batch_samples);
    actor_section(&c.actor)?;
    critic_section(&mut c);
    algorithm_section(&c.algorithm, c.rollout.max_new_tokens)?;
    c.batch.gen_batch_prompts = gen_batch(&c)?;
    if let Err((field, message)) = c.reward.validate() {
        return bad(&format!("reward.{field}"), message);
    }
    trainer_section(&mut c.trainer)?;
    cluster_section(&mut c.cluster, &c.batch)?;
    sharding_fits(&mut c, written)?;
    tensor_parallel_fits(&c)?;
    lora_fits(&c)?;
    schedule_fits(&c)?;
    dumps_fit(&c)?;
    critic_warmup_fits(&c)?;
    val_only_fits(&c)?;
    let s = c.rollout.sampling();
    if c.algorithm.filter_groups.enable && (s.temperature == 0.0 || s.top_k == Some(1)) {
        bail!(
            "algorithm.filter_groups.enable",
            "greedy sampling (rollout.temperature = 0 or rollout.top_k = 1) gives all of a \
             prompt's samples one completion, so no group varies and no step could finish"
        );
    }
    Ok(c)
}

/// A cosine schedule needs more optimizer steps than its warmup.
fn schedule_fits(c: &Config) -> Check<()> {
    let RunLength::Steps(steps) = c.trainer.length() else {
        return Ok(());
    };
    let optimizer_steps = steps.saturating_mul(c.batch.optimizer_steps_per_step);
    for (key, o) in [("actor", c.actor.optim()), ("critic", c.critic_optim())] {
        if let Some(why) = schedule_error(&o, key, optimizer_steps) {
            return bad(&format!("{key}.warmup_steps"), why);
        }
    }
    Ok(())
}

/// The generation dumps need two directories, and held-out prompts for
/// the evaluations'.
fn dumps_fit(c: &Config) -> Check<()> {
    let t = &c.trainer;
    if t.rollout_data_dir.is_some() && t.rollout_data_dir == t.validation_data_dir {
        bail!(
            "trainer.validation_data_dir",
            "is trainer.rollout_data_dir too, where a step's samples and an evaluation's \
             generations of the same step would overwrite each other's {{step}}.jsonl; name \
             another directory"
        );
    }
    if t.validation_data_dir.is_some() && !c.evaluates() {
        bail!(
            "trainer.validation_data_dir",
            "would hold the evaluations' generations, and the run has no held-out prompts \
             (data.val_files or data.val_fraction); set one, or leave the key out"
        );
    }
    Ok(())
}

/// Critic-only steps need a critic, and leave the actor some steps.
fn critic_warmup_fits(c: &Config) -> Check<()> {
    let warmup = c.trainer.critic_warmup;
    let gae = c.algorithm.adv_estimator == AdvEstimator::Gae;
    if let (true, RunLength::Steps(steps)) = (gae, c.trainer.length()) {
        if warmup >= steps {
            bail!(
                "trainer.critic_warmup",
                "{warmup} steps of critic-only updates leave the actor none of the run's \
                 {steps} (trainer.total_steps)"
            );
        }
    }
    if warmup > 0 && !gae {
        bail!(
            "trainer.critic_warmup",
            "{warmup} steps of critic-only updates need a critic, which only \
             algorithm.adv_estimator = \"gae\" trains"
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
    let why = match (c.evaluates(), c.trainer.resume, c.cluster.workers()) {
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
fn cluster_section(cluster: &mut ClusterConfig, batch: &BatchPlan) -> Check<()> {
    let from_layout = match &cluster.layout {
        None => None,
        Some(l) => Some(layout_devices(l)?),
    };
    let w = match (cluster.workers, from_layout) {
        (Some(w), Some(d)) if w != d => {
            bail!(
                "cluster.layout",
                "uses {d} devices, but cluster.workers = {w}"
            )
        }
        (Some(w), _) => w,
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
            bail!(field, "= {w} workers do not divide {key} = {prompts} prompts: each worker takes whole prompts of every step and mini-batch");
        }
    }
    if (cluster.address.as_deref()).is_some_and(|a| a != "auto" && !a.contains(':')) {
        bail!("cluster.address", "expected \"auto\" or host:port");
    }
    cluster.workers = Some(w);
    Ok(())
}

/// A sharded trainer (`cluster.sharding = "full"`) runs activation
/// checkpointing's staged backward, which lets a layer's gathered weights
/// go between its forward and its backward: checkpointing resolves to on,
/// and written off it is an error. `restart` mode is refused: colo plan
/// does not model it, so the per-worker memory sharding is for would go
/// unchecked, and it writes the whole actor to disk on every worker.
fn sharding_fits(c: &mut Config, written: &dyn Fn(&str) -> bool) -> Check<()> {
    if c.cluster.sharding != Sharding::Full {
        return Ok(());
    }
    let checkpointing = "model.enable_gradient_checkpointing";
    if !c.model.enable_gradient_checkpointing && written(checkpointing) {
        bail!(
            checkpointing,
            "is false, and cluster.sharding = \"full\" needs it true: a sharded trainer frees \
             each decoder layer's gathered weights after its forward and gathers them again to \
             recompute the layer for its backward; set it to true or leave it out"
        );
    }
    if c.memory.colocation == Colocation::Restart {
        bail!(
            "memory.colocation",
            "= \"restart\" cannot run with cluster.sharding = \"full\": it rebuilds each \
             worker's rollout engine from the whole actor written to disk every step, and colo \
             plan cannot check its per-worker memory; expected \"sleep\", \"staged\" or \"naive\""
        );
    }
    c.model.enable_gradient_checkpointing = true;
    Ok(())
}

/// The `[model]` LoRA keys: a rank for an adapter to start from, dropout
/// 0, known projections; and not with a sharded trainer, which trains
/// every weight.
fn lora_fits(c: &Config) -> Check<()> {
    let m = &c.model;
    if m.lora_rank == 0 {
        if m.lora_adapter_path.is_some() {
            bail!(
                "model.lora_adapter_path",
                "is set and model.lora_rank is 0 (no adapters): set model.lora_rank (and \
                 lora_alpha, target_modules) to the adapter's r, lora_alpha and target_modules"
            );
        }
        return Ok(());
    }
    if m.lora_dropout != 0.0 {
        bail!(
            "model.lora_dropout",
            "= {}: only 0 is implemented (no dropout on the adapters' input)",
            Num(m.lora_dropout)
        );
    }
    if let Err(why) = m.target_modules.resolve() {
        return bad("model.target_modules", why);
    }
    if c.cluster.sharding == Sharding::Full {
        bail!(
            "model.lora_rank",
            "= {} cannot run with cluster.sharding = \"full\": a sharded trainer trains \
             every weight; set model.lora_rank = 0 or cluster.sharding = \"none\"",
            m.lora_rank
        );
    }
    Ok(())
}

/// A tensor-parallel rollout (`rollout.tensor_model_parallel_size` > 1)
/// is built over its group once; `restart` mode rebuilds the engine whole
/// from disk every step, so it is refused. (Whether the workers and the
/// model's heads divide is checked where they are known: the rank's
/// config and the engine.)
fn tensor_parallel_fits(c: &Config) -> Check<()> {
    let tp = c.rollout.tensor_model_parallel_size;
    if tp > 1 && c.memory.colocation == Colocation::Restart {
        bail!(
            "memory.colocation",
            "= \"restart\" cannot run with rollout.tensor_model_parallel_size = {tp}: it \
             rebuilds the engine whole from disk every step; expected \"sleep\", \
             \"staged\" or \"naive\""
        );
    }
    Ok(())
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
        [p, t, _] => bail!("cluster.layout", "{layout:?} has pipeline × tensor parallelism {p} × {t}: colo plan plans it, colo train executes data-parallel layouts \"1-1-N\" only"),
        _ => unreachable!("three dimensions"),
    }
}

fn data_section(data: &DataConfig) -> Check<()> {
    let (train, val) = (!data.train_files.is_empty(), !data.val_files.is_empty());
    match (train, val, data.val_fraction) {
        (false, false, None) => {
            let t = &data.builtin;
            if t.train_size + t.val_size > t.space() {
                bail!(
                    "data.builtin.train_size",
                    "train_size + val_size exceed the task's {} distinct problems",
                    t.space()
                );
            }
            if t.ops.is_empty() {
                bail!("data.builtin.ops", "needs at least one of \"+\", \"-\"");
            }
        }
        (false, ..) => bail!(
            "data.train_files",
            "held-out data are given but no training files (leave both out for the built-in task)"
        ),
        (true, true, Some(_)) => {
            bail!(
                "data.val_fraction",
                "give val_files or val_fraction, not both"
            )
        }
        _ => {}
    }
    for (field, v) in [
        ("data.prompt_key", &data.prompt_key),
        ("data.answer_key", &data.answer_key),
    ] {
        if v.is_empty() {
            bail!(field, "must not be empty");
        }
    }
    Ok(())
}

fn rollout_section(rollout: &RolloutConfig, estimator: AdvEstimator) -> Check<()> {
    let n = rollout.n;
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
        bail!(
            "rollout.n",
            "adv_estimator `{}` compares samples of a prompt: n must be at least 2",
            estimator.name()
        );
    }
    frequency("rollout.top_k", rollout.top_k)?;
    frequency("rollout.val_kwargs.top_k", rollout.val_kwargs.top_k)
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
fn batch_plan(data: &DataConfig, n: usize, longest: usize, a: &ActorConfig) -> Check<BatchPlan> {
    let prompts = data.train_batch_size;
    let mini = match a.ppo_mini_batch_size {
        Some(m) => m,
        None => fitting(DEFAULT_MINI_BATCH_PROMPTS, prompts),
    };
    if !prompts.is_multiple_of(mini) {
        bail!(
            "actor.ppo_mini_batch_size",
            "{mini} prompts must divide data.train_batch_size ({prompts} prompts)"
        );
    }
    let micro = match a.ppo_micro_batch_size {
        Some(m) => m,
        None => fitting(
            default_micro_batch_samples(longest, a.ppo_max_token_len_per_gpu),
            mini * n,
        ),
    };
    let max_tokens = match a.use_dynamic_bsz {
        false => None,
        true if a.ppo_max_token_len_per_gpu < longest => {
            bail!("actor.ppo_max_token_len_per_gpu", "{} tokens cannot hold the longest sample: data.max_prompt_length + rollout.max_new_tokens = {longest} tokens", a.ppo_max_token_len_per_gpu)
        }
        true => Some(a.ppo_max_token_len_per_gpu),
    };
    // With a token budget the sample count is not used (as in verl).
    if max_tokens.is_none() && !(mini * n).is_multiple_of(micro) {
        bail!("actor.ppo_micro_batch_size", "{micro} samples must divide a mini-batch: ppo_mini_batch_size {mini} × rollout.n {n} = {} samples", mini * n);
    }
    let ppo_epochs = a.ppo_epochs;
    Ok(BatchPlan {
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
    })
}

/// Why `val_only` does not resume (said by the config and by `--resume`).
pub(crate) const VAL_ONLY_RESUME: &str = "evaluates model.path and does not resume; to evaluate a \
     run's checkpoint, set model.path to its directory (checkpoints/step-N is a Hugging Face \
     directory)";

/// `[critic]`: checks what it sets and writes in the actor's settings for
/// the rest.
fn critic_section(c: &mut Config) {
    let a = &c.actor;
    let critic = &mut c.critic;
    critic.lr = critic.lr.or(Some(a.lr));
    critic.warmup_steps = critic.warmup_steps.or(Some(a.warmup_steps));
    critic.weight_decay = critic.weight_decay.or(Some(a.weight_decay));
    critic.grad_clip = critic.grad_clip.or(Some(a.grad_clip));
    critic.loss_agg_mode = critic.loss_agg_mode.or(Some(a.loss_agg_mode));
}

fn actor_section(actor: &ActorConfig) -> Check<()> {
    let [b1, b2] = actor.betas[..] else {
        bail!(
            "actor.betas",
            "must be two numbers [β₁, β₂], got {:?}",
            actor.betas
        );
    };
    for b in [b1, b2] {
        if !(0.0..1.0).contains(&b) {
            bail!("actor.betas", "each must be in [0, 1), got {}", Num(b));
        }
    }
    gate_temperature("actor.tau_pos", actor.tau_pos)?;
    gate_temperature("actor.tau_neg", actor.tau_neg)?;
    covariance_settings(actor)?;
    clip_range(actor)
}

/// The clip ratios, as colo-algo checks them.
fn clip_range(actor: &ActorConfig) -> Check<()> {
    let Err(colo_algo::Error::InvalidConfig {
        field,
        value,
        reason,
    }) = actor.policy_loss().clip_range()
    else {
        return Ok(());
    };
    // An unset bound takes clip_ratio's value: name the key written.
    let field = match field {
        "clip_ratio_low" if actor.clip_ratio_low.is_none() => "clip_ratio",
        "clip_ratio_high" if actor.clip_ratio_high.is_none() => "clip_ratio",
        f => f,
    };
    // colo-algo writes the value with `{}`: every digit of 1e300.
    let value = value.parse().map_or(value, |v: f64| Num(v).to_string());
    bail!(&format!("actor.{field}"), "{reason}, got {value}")
}

/// Clip-Cov's covariance range.
fn covariance_settings(actor: &ActorConfig) -> Check<()> {
    let (lb, ub) = (actor.clip_cov_lb, actor.clip_cov_ub);
    if !lb.is_finite() {
        bail!(
            "actor.clip_cov_lb",
            "must be a finite number, got {}",
            Num(lb)
        );
    }
    if ub.is_finite() && ub <= lb && ub == ActorConfig::default().clip_cov_ub {
        // The file moved the lower bound past the default upper one.
        bail!(
            "actor.clip_cov_lb",
            "must be below actor.clip_cov_ub = {} (Clip-Cov draws tokens whose \
             covariance lies between them; set clip_cov_ub too), got {}",
            Num(ub),
            Num(lb)
        );
    }
    if !(ub.is_finite() && ub > lb) {
        bail!(
            "actor.clip_cov_ub",
            "must be a finite number above actor.clip_cov_lb = {} (Clip-Cov draws tokens \
             whose covariance lies between them), got {}",
            Num(lb),
            Num(ub)
        );
    }
    Ok(())
}

fn algorithm_section(algorithm: &AlgorithmConfig, max_new_tokens: usize) -> Check<()> {
    let ob = &algorithm.overlong_buffer;
    if ob.enable && (ob.len == 0 || ob.len > max_new_tokens) {
        bail!(
            "algorithm.overlong_buffer.len",
            "must be 1 to rollout.max_new_tokens = {max_new_tokens} (the tokens before \
             the limit over which the punishment grows), got {}",
            ob.len
        );
    }
    if algorithm.filter_groups.enable {
        match &algorithm.filter_groups.metric {
            FilterMetric::Extra(name) if name.trim().is_empty() => {
                bail!(
                    "algorithm.filter_groups.metric",
                    "must name what varies within a group: \"acc\", \"score\", \"seq_reward\", \
                     \"seq_final_reward\", or a number the reward returns beside its score"
                )
            }
            // verl filters after the KL penalty of the generation batch;
            // colo computes that penalty on the kept samples only.
            FilterMetric::SeqFinalReward if algorithm.use_kl_in_reward => {
                bail!(
                    "algorithm.filter_groups.metric",
                    "\"seq_final_reward\" with algorithm.use_kl_in_reward needs the KL penalty \
                     before the filter, and colo computes it on the kept samples: filter on \
                     \"seq_reward\" (the rewards before the penalty) or \"acc\""
                )
            }
            _ => {}
        }
    }
    Ok(())
}

/// `data.gen_batch_size`: prompts per generation batch, which only
/// dynamic sampling draws more than one of.
fn gen_batch(c: &Config) -> Check<usize> {
    let prompts = c.batch.prompts_per_step;
    match (c.data.gen_batch_size, c.algorithm.filter_groups.enable) {
        (None, _) => Ok(prompts),
        (Some(g), true) => Ok(g),
        (Some(g), false) if g == prompts => Ok(g),
        (Some(g), false) => bail!(
            "data.gen_batch_size",
            "= {g} prompts differs from data.train_batch_size = {prompts}, and only dynamic \
             sampling (algorithm.filter_groups.enable) generates more than it trains on; \
             enable it, or leave gen_batch_size out"
        ),
    }
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
            bail!(
                field,
                "{name:?} names the run directory runs/{{project_name}}/{{experiment_name}}: \
                 it must be one non-empty path component (or set trainer.out_dir)"
            );
        }
        dir.push(name);
    }
    if project.is_none() && experiment.is_none() {
        return Ok(PathBuf::from(DEFAULT_OUT_DIR));
    }
    Ok(dir)
}

/// verl's logger backends that colo has: `console` (its progress and
/// summary lines) and `file` (`metrics.jsonl`), both always written. A
/// backend colo does not have is an error: a run the user expects in wandb
/// must not go silently unrecorded there.
fn loggers(raw: &Loggers) -> Check<()> {
    for name in raw.iter() {
        if !matches!(name.as_str(), "console" | "file") {
            bail!(
                "trainer.logger",
                "{name:?} is not a logger colo has: it writes the console and metrics.jsonl \
                 in the run directory (verl's \"console\" and \"file\"), always; \
                 remove {name:?}, or read metrics.jsonl into {name} after the run"
            );
        }
    }
    Ok(())
}

fn trainer_section(t: &mut TrainerConfig) -> Check<()> {
    if (t.total_steps, t.total_epochs) == (None, None) {
        t.total_steps = Some(DEFAULT_TOTAL_STEPS);
    }
    frequency("trainer.save_freq", t.save_freq)?;
    frequency("trainer.test_freq", t.test_freq)?;
    if t.out_dir.is_none() {
        let names = (t.project_name.as_deref(), t.experiment_name.as_deref());
        t.out_dir = Some(default_out_dir(names.0, names.1)?);
    }
    if let Some(l) = &t.logger {
        loggers(l)?;
    }
    for (field, dir) in [
        ("trainer.rollout_data_dir", &t.rollout_data_dir),
        ("trainer.validation_data_dir", &t.validation_data_dir),
    ] {
        if dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
            bail!(field, "must name a directory, got \"\"");
        }
    }
    Ok(())
}
