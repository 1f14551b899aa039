//! The resolved configuration in words, one topic a line: the run's
//! header on the console and the top of `--print-config`.

use colo_algo::AdvEstimator;

use super::num::Num;
use super::*;

/// `n` and the noun in its number: "1 mini-batch", "2 mini-batches".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What the summary says of the policy loss: the settings it uses.
fn loss_settings(p: &colo_algo::PolicyLossConfig) -> String {
    use colo_algo::PolicyLossMode as M;
    let clip = format!(
        "clip {}/{}",
        Num(p.clip_ratio_low.unwrap_or(p.clip_ratio)),
        Num(p.clip_ratio_high.unwrap_or(p.clip_ratio))
    );
    let agg = name(&p.loss_agg_mode);
    match p.loss_mode {
        M::Vanilla => format!("{clip}, dual clip {}, {agg}", Num(p.clip_ratio_c)),
        M::Gspo => format!("{clip} on the sequence ratio, seq-mean-token-mean"),
        M::Gpg => format!("no ratio, no clip, {agg}"),
        M::Cispo => format!("IS weight {clip}, {agg}"),
        M::KlCov => format!(
            "KL penalty on {} of the tokens, × {}, {agg}",
            Num(p.kl_cov_ratio),
            Num(p.ppo_kl_coef)
        ),
        M::ClipCov => format!(
            "{clip}, {} of the tokens of covariance in ({}, {}) dropped, {agg}",
            Num(p.clip_cov_ratio),
            Num(p.clip_cov_lb),
            Num(p.clip_cov_ub)
        ),
        M::GeoMean => format!("{clip} in log space, mean over sequences"),
        M::Sapo => format!(
            "soft gate τ {}/{}, seq-mean-token-mean",
            Num(p.tau_pos),
            Num(p.tau_neg)
        ),
    }
}

/// The algorithm line's tail: a cosine schedule, and PPO's critic.
fn schedule_text(c: &Config) -> String {
    let mut text = match c.actor.warmup_style {
        colo_train::ScheduleKind::Cosine => {
            format!(", then cosine to {} × lr", Num(c.actor.min_lr_ratio))
        }
        colo_train::ScheduleKind::Constant => String::new(),
    };
    if c.algorithm.adv_estimator == AdvEstimator::Gae {
        text += &format!(", critic lr {}", Num(c.critic_optim().lr));
        if c.trainer.critic_warmup > 0 {
            text += &match c.trainer.critic_warmup {
                1 => " (alone for the first step)".to_owned(),
                n => format!(" (alone for the first {n} steps)"),
            };
        }
    }
    text
}

/// The reward as a person reads it: `numeric after "####", tolerance
/// 1e-6`, `0.9 × numeric + 0.1 × format <answer>…</answer>`, `python
/// compute_score of my_reward.py (4 workers)`; never its JSON.
fn reward_text(r: &RewardSpec) -> String {
    let default = |d: &Option<f32>| match d {
        Some(d) => format!(", default_score {d}"),
        None => String::new(),
    };
    let workers = |w: usize| match w {
        1 => String::new(),
        w => format!(", {w} workers"),
    };
    match r {
        RewardSpec::ExactMatch {} => "exact_match".into(),
        RewardSpec::Numeric { tolerance, after } => format!(
            "numeric{}, tolerance {}",
            after
                .as_ref()
                .map_or(" (the last number)".to_owned(), |a| format!(" after {a:?}")),
            Num(*tolerance)
        ),
        RewardSpec::Boxed { tolerance } => format!("boxed, tolerance {}", Num(*tolerance)),
        RewardSpec::Format { open, close } => format!("format {open}…{close}"),
        RewardSpec::Weighted { terms } => (terms.iter())
            .map(|t| format!("{} × {}", t.weight, reward_text(&t.reward)))
            .collect::<Vec<_>>()
            .join(" + "),
        RewardSpec::Verl {} => "verl (the rule by each row's data_source)".into(),
        RewardSpec::Python {
            path,
            name,
            timeout_s,
            default_score,
            workers: w,
            ..
        } => format!(
            "python {name} of {} (timeout {} s{}{})",
            path.display(),
            Num(*timeout_s),
            default(default_score),
            workers(*w)
        ),
        RewardSpec::External {
            command,
            timeout_s,
            default_score,
            workers: w,
        } => format!(
            "external `{}` (timeout {} s{}{})",
            command.join(" "),
            Num(*timeout_s),
            default(default_score),
            workers(*w)
        ),
    }
}

/// A value's config name (its serde form), e.g. `token-mean` or `staged`.
fn name(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// `bf16 (auto: …)`: what the run computes in, and why when it was chosen.
fn dtype_text(dtype: Dtype, device: Device) -> String {
    let resolved = dtype.resolve(device);
    let why = match (dtype, resolved) {
        (Dtype::Auto, Dtype::Bf16) => " (auto: the device multiplies bf16 natively)",
        (Dtype::Auto, _) => " (auto: the device has no native bf16)",
        _ => "",
    };
    let mixed = if resolved == Dtype::Bf16 {
        ", mixed precision with f32 master weights"
    } else {
        ""
    };
    format!("{}{why}{mixed}", resolved.name())
}

fn sampling_text(s: &Sampling) -> String {
    if s.temperature == 0.0 {
        return "greedy".into();
    }
    let k = s.top_k.map_or("off".to_owned(), |k| k.to_string());
    format!(
        "temperature {}, top_p {}, top_k {k}",
        s.temperature, s.top_p
    )
}

pub(crate) fn summary(c: &Config) -> String {
    let model = match &c.model.path {
        None => "built-in (Qwen2, 0.8M parameters, character tokenizer)".to_owned(),
        Some(p) => p.display().to_string(),
    } + &lora_text(&c.model);
    let (a, alg) = (&c.actor, &c.algorithm);
    let kl = match (a.use_kl_loss, alg.use_kl_in_reward) {
        (true, _) => format!(
            "KL loss {} × {}",
            name(&a.kl_loss_type),
            Num(a.kl_loss_coef)
        ),
        (false, true) => format!(
            "KL in reward {}, β {}",
            name(&alg.kl_penalty),
            Num(alg.kl_ctrl.kl_coef)
        ),
        (false, false) => "no KL (no reference model)".into(),
    };
    [
        format!("data       {}", data_text(c)),
        format!("model      {model}"),
        step_line(c),
        update_line(c),
        format!(
            "algorithm  {} advantages, {} policy loss ({}), {kl}, lr {} (warmup {})",
            c.algorithm.adv_estimator.name(),
            name(&c.actor.loss_mode),
            loss_settings(&c.actor.policy_loss()),
            Num(c.actor.lr),
            c.actor.warmup_steps
        ) + &schedule_text(c),
        format!("reward     {}", reward_text(&c.reward)),
        format!(
            "compute    {}, {}",
            name(&c.trainer.device),
            dtype_text(c.trainer.dtype, c.trainer.device)
        ),
        memory_line(c),
        run_line(c),
    ]
    .into_iter()
    // An evaluation has no step, update or algorithm of its own.
    .filter(|line| {
        let training = ["step ", "update ", "algorithm "]
            .iter()
            .any(|t| line.starts_with(t));
        !(c.trainer.val_only && training)
    })
    .collect::<Vec<_>>()
    .join("\n")
}

/// The model line's LoRA part: empty without adapters.
fn lora_text(m: &ModelConfig) -> String {
    if m.lora_rank == 0 {
        return String::new();
    }
    let targets = match m.target_modules.resolve() {
        Ok(t) if t.len() == colo_model::lora::PROJECTIONS.len() => "all-linear".to_owned(),
        Ok(t) => t.join(", "),
        Err(_) => name(&m.target_modules),
    };
    let start = match &m.lora_adapter_path {
        Some(p) => format!(", from {}", p.display()),
        None => String::new(),
    };
    format!(
        "; LoRA rank {}, alpha {} on {targets}{start} (weights frozen, reference = base)",
        m.lora_rank,
        Num(m.lora_alpha)
    )
}

/// The `data` line of [`summary`]: where the prompts come from.
fn data_text(c: &Config) -> String {
    match &c.data.source() {
        DataSource::Builtin(t) => {
            format!(
        "built-in arithmetic task (ops {}, operands 0..={}): {} train / {} held-out prompts",
        name(&t.ops), t.max_operand, t.train_size, t.val_size
    )
        }
        DataSource::Files { train, val } => {
            let val = match val {
                ValSource::Files(v) => format!("held-out {v:?}"),
                ValSource::Fraction(f) => format!("{f} held out"),
                ValSource::None => "no held-out set".to_owned(),
            };
            format!(
                "{train:?}, {val}; prompt `{}`, answer `{}`",
                c.data.prompt_key, c.data.answer_key
            )
        }
    }
}

/// The `step` line of [`summary`]: the samples a step draws.
fn step_line(c: &Config) -> String {
    let b = &c.batch;
    format!(
        "step       {} prompts × n {} = {} samples, max {} new tokens, {}{}",
        b.prompts_per_step,
        b.n,
        b.samples_per_step,
        c.rollout.max_new_tokens,
        sampling_text(&c.rollout.sampling()),
        match &c.algorithm.filter_groups {
            f if !f.enable => String::new(),
            f => format!(
                "; dynamic sampling: batches of {} prompts until {} with varying {} ({})",
                b.gen_batch_prompts,
                b.prompts_per_step,
                f.metric.name(),
                match f.max_gen_batches() {
                    Some(m) => format!("at most {m} batches a step"),
                    None => "no limit".into(),
                }
            ),
        }
    )
}

/// The `update` line of [`summary`]: how a step's samples are split.
fn update_line(c: &Config) -> String {
    let b = &c.batch;
    format!(
        "update     {} of {} prompts ({} samples) × {} = {}; {}",
        count(b.mini_batches_per_step, "mini-batch", "mini-batches"),
        b.mini_batch_prompts,
        b.mini_batch_samples,
        count(c.actor.ppo_epochs, "ppo epoch", "ppo epochs"),
        count(
            b.optimizer_steps_per_step,
            "optimiser step",
            "optimiser steps"
        ),
        match b.micro_batch_max_tokens {
            Some(t) =>
                format!("micro-batches of consecutive samples within {t} padded tokens each"),
            None => format!(
                "{} of {} samples each",
                count(
                    b.micro_batches_per_mini_batch,
                    "micro-batch",
                    "micro-batches"
                ),
                b.micro_batch_samples
            ),
        }
    )
}

/// The `memory` line of [`summary`]: the colocation and the offloads.
fn memory_line(c: &Config) -> String {
    let m = &c.memory;
    let on = |b: bool, what: &'static str| b.then_some(what);
    let offload: Vec<&str> = [
        on(m.offload_train_param, "params"),
        on(m.offload_train_grad, "grads"),
        on(m.offload_train_optimizer, "optimizer"),
        on(m.offload_ref, "ref"),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(
        "memory     {} colocation, capacity {}, offload during generation: {} ({})",
        name(&m.colocation),
        match m.capacity {
            Capacity::Auto => "auto".to_owned(),
            Capacity::Bytes(b) => colo_mem::fmt_bytes(b),
        },
        if offload.is_empty() {
            "none".to_owned()
        } else {
            offload.join(", ")
        },
        match m.offload_policy {
            OffloadPolicy::AsNeeded => "as needed",
            OffloadPolicy::Always => "always",
        }
    )
}

/// The `run` line of [`summary`]: its length, evaluations and output.
fn run_line(c: &Config) -> String {
    let length = match c.trainer.length() {
        RunLength::Steps(s) => format!("{s} steps"),
        RunLength::Epochs(e) => format!("{e} epochs"),
    };
    let freq = |f: Option<usize>| match f {
        None => "end only".to_owned(),
        Some(1) => "every step".to_owned(),
        Some(f) => format!("every {f} steps"),
    };
    match c.trainer.val_only {
        true => format!(
            "run        evaluation only (trainer.val_only: nothing is trained), {}, seed {}, \
             out {}",
            sampling_text(&c.rollout.val_sampling()),
            c.trainer.seed,
            c.out_dir().display()
        ),
        false => format!(
            "run        {length}, {}, checkpoint {}, seed {}, out {}",
            match c.evaluates() {
                true => format!(
                    "eval {} ({})",
                    freq(c.trainer.test_every()),
                    sampling_text(&c.rollout.val_sampling())
                ),
                false => "no evaluation (no held-out set)".to_owned(),
            },
            freq(c.trainer.save_every()),
            c.trainer.seed,
            c.out_dir().display()
        ),
    }
}
