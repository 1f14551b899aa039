//! `colo train --print-config`: the resolved configuration as a TOML file,
//! every key with a comment (meaning, unit, default, verl's name).
//!
//! The validated [`Config`] is turned back into a [`RawConfig`]
//! ([`to_raw`]), serialised by `toml`, and written section by section, each
//! key under a comment made from its declaration in the raw structs (its
//! doc comment and `#[key(...)]` notes, listed by colo-keys' derive:
//! [`docs`]). Reading the printed text back gives the same `Config` (a test
//! checks the round trip).

use std::fmt::Write;

use colo_algo::{KlControlConfig, KlEstimator};
use toml::{Table, Value};

use super::raw::{
    Files, Loggers, RawActor, RawAlgorithm, RawCapacity, RawCluster, RawCritic, RawData,
    RawFilterGroups, RawMemory, RawModel, RawOverlongBuffer, RawRollout, RawRolloutCorrection,
    RawTrainer, RawValKwargs,
};
use super::*;

/// One key of the file: its dotted path (`actor.ppo_mini_batch_size`) and
/// what its declaration says of it ([`colo_keys::Key`]).
pub(crate) struct Doc {
    pub key: String,
    pub k: colo_keys::Key,
}

impl Doc {
    /// The meaning as printed: a reward key's kinds first (`numeric:
    /// read the first number…`).
    pub(crate) fn meaning(&self) -> String {
        match self.k.kinds {
            [] => self.k.doc.to_owned(),
            kinds => format!("{}: {}", kinds.join(", "), self.k.doc),
        }
    }
}

/// Every key of the file, in the order printed: the raw structs' fields in
/// declaration order, tables flattened.
pub(crate) fn docs() -> &'static [Doc] {
    static DOCS: std::sync::OnceLock<Vec<Doc>> = std::sync::OnceLock::new();
    DOCS.get_or_init(|| {
        let mut out = Vec::new();
        flatten("", <RawConfig as colo_keys::Keys>::keys(), &mut out);
        out
    })
}

fn flatten(prefix: &str, keys: Vec<colo_keys::Key>, out: &mut Vec<Doc>) {
    for k in keys {
        let key = match prefix {
            "" => k.name.to_owned(),
            p => format!("{p}.{}", k.name),
        };
        match k.table {
            Some(table) => flatten(&key, table(), out),
            None => out.push(Doc { key, k }),
        }
    }
}

/// The raw form of a validated config: every value as written, derived
/// values (`data.seed`, the run length) explicit. One function a section.
pub(crate) fn to_raw(c: &Config) -> RawConfig {
    RawConfig {
        data: raw_data(c),
        model: RawModel {
            path: match &c.model {
                ModelSource::Builtin => None,
                ModelSource::Path(p) => Some(p.clone()),
            },
            enable_gradient_checkpointing: c.actor.gradient_checkpointing,
        },
        rollout: raw_rollout(c),
        actor: raw_actor(c),
        critic: RawCritic {
            lr: Some(c.critic.optim.lr),
            warmup_steps: Some(c.critic.optim.warmup_steps),
            weight_decay: Some(c.critic.optim.weight_decay),
            grad_clip: Some(c.critic.optim.grad_clip),
            cliprange_value: c.critic.cliprange_value,
            loss_agg_mode: Some(c.critic.loss_agg_mode),
        },
        algorithm: raw_algorithm(c),
        reward: c.reward.clone(),
        memory: raw_memory(c),
        trainer: raw_trainer(c),
        cluster: RawCluster {
            workers: Some(c.cluster.workers),
            layout: c.cluster.layout.clone(),
            address: c.cluster.address.clone(),
        },
    }
}

/// `[data]` of [`to_raw`].
fn raw_data(c: &Config) -> RawData {
    let b = &c.batch;
    let defaults = RawConfig::default();
    let paths = |v: &[std::path::PathBuf]| Files::Many(v.to_vec());
    let (train_files, val_files, val_fraction, builtin) = match &c.data.source {
        DataSource::Builtin(t) => (Files::default(), Files::default(), None, t.clone()),
        DataSource::Files { train, val } => {
            let builtin = defaults.data.builtin.clone();
            match val {
                ValSource::Files(v) => (paths(train), paths(v), None, builtin),
                ValSource::Fraction(f) => (paths(train), Files::default(), Some(*f), builtin),
                ValSource::None => (paths(train), Files::default(), None, builtin),
            }
        }
    };
    RawData {
        train_files,
        val_files,
        val_fraction,
        prompt_key: c.data.fields.prompt_key.clone(),
        answer_key: c.data.fields.answer_key.clone(),
        train_batch_size: b.prompts_per_step,
        gen_batch_size: (b.gen_batch_prompts != b.prompts_per_step).then_some(b.gen_batch_prompts),
        max_prompt_length: c.data.max_prompt_length,
        filter_overlong_prompts: c.data.overlong == Overlong::Drop,
        seed: Some(c.data.seed),
        shuffle: c.data.shuffle,
        builtin,
    }
}

/// `[rollout]` of [`to_raw`].
fn raw_rollout(c: &Config) -> RawRollout {
    let (b, defaults) = (&c.batch, RawConfig::default());
    let top_k = |k: Option<usize>| k.map_or(-1, |k| k as i64);
    let (mem_fraction, max_kv_tokens) = match c.rollout.kv {
        KvBudget::Fraction(f) => (f, None),
        KvBudget::Tokens(t) => (defaults.rollout.mem_fraction, Some(t)),
    };
    let (s, vs) = (&c.rollout.sampling, &c.rollout.val_sampling);
    RawRollout {
        n: b.n,
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: top_k(s.top_k),
        max_new_tokens: c.rollout.max_new_tokens,
        mem_fraction,
        max_kv_tokens,
        max_num_seqs: c.rollout.max_num_seqs,
        cpu_threads: c.rollout.cpu_threads.unwrap_or(0),
        enforce_eager: c.rollout.enforce_eager,
        val_kwargs: RawValKwargs {
            n: c.rollout.val_n,
            temperature: vs.temperature,
            top_p: vs.top_p,
            top_k: top_k(vs.top_k),
        },
    }
}

/// `[actor]` of [`to_raw`].
fn raw_actor(c: &Config) -> RawActor {
    let (b, defaults) = (&c.batch, RawConfig::default());
    let p = &c.actor.policy_loss;
    let kl = c.actor.kl_loss.unwrap_or(KlLoss {
        coef: defaults.actor.kl_loss_coef,
        estimator: defaults.actor.kl_loss_type,
    });
    RawActor {
        lr: c.actor.optim.lr,
        warmup_steps: c.actor.optim.warmup_steps,
        weight_decay: c.actor.optim.weight_decay,
        grad_clip: c.actor.optim.grad_clip,
        warmup_style: c.actor.optim.schedule,
        min_lr_ratio: c.actor.optim.min_lr_ratio,
        betas: vec![c.actor.optim.betas.0, c.actor.optim.betas.1],
        ppo_mini_batch_size: Some(b.mini_batch_prompts),
        ppo_micro_batch_size: Some(b.micro_batch_samples),
        use_dynamic_bsz: b.micro_batch_max_tokens.is_some(),
        ppo_max_token_len_per_gpu: b
            .micro_batch_max_tokens
            .unwrap_or(RawActor::default().ppo_max_token_len_per_gpu),
        ppo_epochs: c.actor.ppo_epochs,
        loss_mode: p.loss_mode,
        clip_ratio: p.clip_ratio,
        clip_ratio_low: p.clip_ratio_low,
        clip_ratio_high: p.clip_ratio_high,
        clip_ratio_c: p.clip_ratio_c,
        loss_agg_mode: p.loss_agg_mode,
        kl_cov_ratio: p.kl_cov_ratio,
        ppo_kl_coef: p.ppo_kl_coef,
        clip_cov_ratio: p.clip_cov_ratio,
        clip_cov_lb: p.clip_cov_lb,
        clip_cov_ub: p.clip_cov_ub,
        tau_pos: p.tau_pos,
        tau_neg: p.tau_neg,
        entropy_coeff: c.actor.entropy_coeff,
        use_kl_loss: c.actor.kl_loss.is_some(),
        kl_loss_coef: kl.coef,
        kl_loss_type: kl.estimator,
    }
}

/// `[algorithm]` of [`to_raw`].
fn raw_algorithm(c: &Config) -> RawAlgorithm {
    let defaults = RawConfig::default();
    let (kl_penalty, kl_ctrl): (KlEstimator, KlControlConfig) = match &c.algorithm.kl_in_reward {
        Some(k) => (k.estimator, k.ctrl.clone()),
        None => (defaults.algorithm.kl_penalty, defaults.algorithm.kl_ctrl),
    };
    let adv = &c.algorithm.advantage;
    RawAlgorithm {
        adv_estimator: adv.adv_estimator,
        gamma: adv.gamma,
        lam: adv.lam,
        norm_adv_by_std_in_grpo: adv.norm_adv_by_std_in_grpo,
        use_kl_in_reward: c.algorithm.kl_in_reward.is_some(),
        kl_penalty,
        kl_ctrl,
        rollout_correction: RawRolloutCorrection {
            rollout_is: c.algorithm.rollout_correction.rollout_is,
            rollout_is_threshold: c.algorithm.rollout_correction.rollout_is_threshold,
        },
        overlong_buffer: match c.algorithm.overlong_buffer {
            Some(b) => RawOverlongBuffer {
                enable: true,
                len: b.len,
                penalty_factor: b.penalty_factor,
            },
            None => RawOverlongBuffer::default(),
        },
        filter_groups: match &c.algorithm.filter_groups {
            Some(f) => RawFilterGroups {
                enable: true,
                metric: f.metric.name().to_owned(),
                max_num_gen_batches: f.max_gen_batches.map_or(0, |m| m as i64),
            },
            None => RawFilterGroups::default(),
        },
    }
}

/// `[memory]` of [`to_raw`].
fn raw_memory(c: &Config) -> RawMemory {
    RawMemory {
        capacity: match c.memory.capacity {
            Capacity::Auto => RawCapacity::Text("auto".into()),
            Capacity::Bytes(b) => capacity_text(b),
        },
        colocation: c.memory.colocation,
        offload_train_param: c.memory.offload_train_param,
        offload_train_grad: c.memory.offload_train_grad,
        offload_train_optimizer: c.memory.offload_train_optimizer,
        offload_ref: c.memory.offload_ref,
        offload_policy: c.memory.offload_policy,
    }
}

/// `[trainer]` of [`to_raw`].
fn raw_trainer(c: &Config) -> RawTrainer {
    let freq = |f: Option<usize>| f.map_or(-1, |f| f as i64);
    let (total_steps, total_epochs) = match c.trainer.length {
        RunLength::Steps(s) => (Some(s), None),
        RunLength::Epochs(e) => (None, Some(e)),
    };
    RawTrainer {
        total_steps,
        total_epochs,
        save_freq: freq(c.trainer.save_freq),
        test_freq: freq(c.trainer.test_freq),
        val_before_train: c.trainer.val_before_train,
        val_only: c.trainer.val_only,
        resume: c.trainer.resume,
        out_dir: Some(c.trainer.out_dir.clone()),
        project_name: c.trainer.project_name.clone(),
        experiment_name: c.trainer.experiment_name.clone(),
        logger: c.trainer.logger.clone().map(Loggers::Many),
        critic_warmup: c.trainer.critic_warmup,
        rollout_data_dir: c.trainer.rollout_data_dir.clone(),
        validation_data_dir: c.trainer.validation_data_dir.clone(),
        seed: c.trainer.seed,
        device: c.trainer.device,
        dtype: c.trainer.dtype,
        cpu_threads: c.trainer.cpu_threads.unwrap_or(0),
    }
}

/// `"24 GiB"` where the bytes are a whole number of a binary unit, else the
/// number of bytes: either reads back to the same capacity.
fn capacity_text(b: u64) -> RawCapacity {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return RawCapacity::Text(format!("{} {unit}", b >> shift));
        }
    }
    RawCapacity::Bytes(b)
}

/// The documented TOML text of `c` (see the module doc).
pub(crate) fn print(c: &Config) -> std::result::Result<String, String> {
    let table = |raw: &RawConfig| Table::try_from(raw).map_err(|e| e.to_string());
    let values = table(&to_raw(c))?;
    let defaults = table(&RawConfig::default())?;
    let mut out = String::from(
        "# colo train: the resolved run configuration. Every key is shown with\n\
         # its meaning, unit, default and verl's name; a file needs only the keys\n\
         # it changes. Run it with `colo train --config FILE`.\n#\n",
    );
    for line in c.summary().lines() {
        let _ = writeln!(out, "#   {line}");
    }
    // The sections in the order of the file's documentation.
    let mut sections: Vec<&String> = values.keys().collect();
    sections.sort_by_key(|s| {
        docs()
            .iter()
            .position(|d| d.key.starts_with(&format!("{s}.")))
    });
    for section in sections {
        let Some(Value::Table(t)) = values.get(section) else {
            return Err(format!("`{section}` is not a table"));
        };
        write_table(&mut out, section, t, &defaults)?;
    }
    Ok(out)
}

/// `[path]`, its keys in [`docs`] order (unset optional keys as comments),
/// then its sub-tables.
fn write_table(
    out: &mut String,
    path: &str,
    t: &Table,
    defaults: &Table,
) -> std::result::Result<(), String> {
    let _ = writeln!(out, "\n[{path}]");
    let prefix = format!("{path}.");
    // `(index in docs(), the line "key = value")`; `None` for an unset key.
    let mut rows: Vec<(usize, Option<String>)> = Vec::new();
    for (k, v) in t {
        if matches!(v, Value::Table(_)) {
            continue;
        }
        let full = format!("{prefix}{k}");
        if free_form(path) {
            rows.push((usize::MAX, Some(format!("{k} = {}", value_text(v)))));
            continue;
        }
        let i = (docs().iter())
            .position(|d| d.key == full)
            .ok_or_else(|| format!("`{full}` is not a key of the raw structs"))?;
        rows.push((i, Some(format!("{k} = {}", value_text(v)))));
    }
    // Optional keys that are unset, at their place in docs() order.
    rows.extend(
        (docs().iter())
            .enumerate()
            .filter(|(_, d)| {
                d.key
                    .strip_prefix(&prefix)
                    .is_some_and(|k| !k.contains('.') && !t.contains_key(k))
                    && !d.k.unset.is_empty()
                    && relevant(d, t)
            })
            .map(|(i, _)| (i, None)),
    );
    rows.sort_by_key(|r| r.0);
    for (i, line) in rows {
        let Some(d) = docs().get(i) else {
            let _ = writeln!(out, "{}", line.unwrap_or_default());
            continue;
        };
        let default = lookup(defaults, &d.key)
            .map(value_text)
            .or_else(|| reward_default(&d.key));
        let _ = writeln!(out, "# {}", comment(d, default.as_deref()));
        match line {
            Some(line) => {
                let _ = writeln!(out, "{line}");
            }
            None => {
                let k = &d.key[prefix.len()..];
                let _ = writeln!(out, "# {k} = …  (unset)");
            }
        }
    }
    for (k, v) in t {
        if let Value::Table(sub) = v {
            write_table(out, &format!("{path}.{k}"), sub, defaults)?;
        }
    }
    Ok(())
}

/// A value as TOML, a float far from 1 in exponent form (`1e300`, not a
/// 1 and 300 zeros; see [`super::num::Num`]); the rest as the toml crate
/// writes it (`0.0` stays a float).
fn value_text(v: &Value) -> String {
    match v {
        Value::Float(f) if super::num::Num::far_from_one(*f) => super::num::Num(*f).to_string(),
        _ => v.to_string(),
    }
}

/// A table whose keys are the user's (the python reward's `kwargs`),
/// documented as a whole.
fn free_form(path: &str) -> bool {
    path == "reward.kwargs"
}

/// Unset reward keys are shown only for the reward kinds that have them.
fn relevant(d: &Doc, t: &Table) -> bool {
    let kind = t.get("kind").and_then(Value::as_str);
    d.k.kinds.is_empty() || kind.is_some_and(|kind| d.k.kinds.contains(&kind))
}

/// The default of a reward key that the default reward (`exact_match`)
/// does not have: serde's, read from the smallest spec of a kind with it
/// (`timeout_s` = 30, `workers` = 1 for `external` and `python`).
fn reward_default(key: &str) -> Option<String> {
    let name = key.strip_prefix("reward.")?;
    const SMALLEST: [&str; 3] = [
        "kind = \"numeric\"",
        "kind = \"external\"\ncommand = [\"x\"]",
        "kind = \"python\"\npath = \"x.py\"",
    ];
    SMALLEST.iter().find_map(|text| {
        let spec: crate::reward::RewardSpec = toml::from_str(text).ok()?;
        let table = Table::try_from(&spec).ok()?;
        table.get(name).map(value_text)
    })
}

/// `meaning [unit]. Default: …. verl: …`
fn comment(d: &Doc, default: Option<&str>) -> String {
    let mut s = d.meaning();
    if !d.k.unit.is_empty() {
        let _ = write!(s, " [{}]", d.k.unit);
    }
    match (default, d.k.unset.is_empty()) {
        (Some(v), _) => {
            let _ = write!(s, ". Default: {v}");
        }
        (None, false) => {
            let _ = write!(s, ". Default: unset ({})", d.k.unset);
        }
        (None, true) => {}
    }
    if !d.k.verl.is_empty() {
        let _ = write!(s, ". verl: {}", d.k.verl);
    }
    if !d.k.aliases.is_empty() {
        let _ = write!(s, ". Also read as: {}", d.k.aliases.join(", "));
    }
    s
}

/// The value at a dotted path.
fn lookup<'a>(t: &'a Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = t.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_key_is_a_key_and_none_twice() {
        let mut seen = std::collections::HashSet::new();
        for d in docs() {
            assert!(seen.insert(&d.key), "{} twice", d.key);
            assert!(!d.k.doc.is_empty(), "{} has no doc comment", d.key);
        }
        // Each key, set alone, is accepted (or refused for its value, not
        // as an unknown field).
        for d in docs() {
            let (section, key) = d.key.rsplit_once('.').unwrap();
            let text = format!("[{section}]\n{key} = \"?\"\n");
            let e = Config::from_toml(&text, std::path::Path::new("t.toml"));
            if let Err(e) = e {
                assert!(!e.to_string().contains("unknown field"), "{}: {e}", d.key);
            }
        }
    }

    #[test]
    fn capacities_print_in_whole_units_or_bytes() {
        assert_eq!(capacity_text(24 << 30), RawCapacity::Text("24 GiB".into()));
        assert_eq!(
            capacity_text(1536 << 20),
            RawCapacity::Text("1536 MiB".into())
        );
        assert_eq!(capacity_text(1000), RawCapacity::Bytes(1000));
    }
}
