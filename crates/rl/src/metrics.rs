//! `metrics.jsonl`: one JSON object per training step and per evaluation,
//! with verl's metric names, written by [`MetricsWriter`].
//!
//! The records are typed structs ([`StepMetrics`], [`EvalRecord`]) whose
//! serde names are verl's keys, so a user's verl dashboards and scripts read
//! colo's files.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use colo_algo::MismatchMetrics;
use serde::{Deserialize, Serialize};

use crate::eval::{EvalResult, Tally};
use crate::{Error, Result};

/// One training step. Timings are seconds of wall time.
// No `deny_unknown_fields`: serde does not support it beside `flatten`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// 1-based, as verl's `training/global_step`.
    #[serde(rename = "training/global_step")]
    pub step: usize,
    #[serde(rename = "training/epoch")]
    pub epoch: usize,
    /// Generation batches the step drew, with dynamic sampling.
    #[serde(
        rename = "train/num_gen_batches",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub num_gen_batches: Option<usize>,

    #[serde(rename = "timing_s/step", deserialize_with = "null_is_nan")]
    pub timing_step: f64,
    /// Generation, including the memory transitions into and out of it.
    #[serde(rename = "timing_s/gen", deserialize_with = "null_is_nan")]
    pub timing_gen: f64,
    /// Trainer → rollout weight sync.
    #[serde(rename = "timing_s/update_weights", deserialize_with = "null_is_nan")]
    pub timing_update_weights: f64,
    /// The memory switch train → rollout (wake-ups, sync, offloads).
    #[serde(
        rename = "timing_s/switch_to_rollout",
        default,
        deserialize_with = "null_is_nan"
    )]
    pub timing_switch_to_rollout: f64,
    /// The memory switch rollout → train (releases, reloads).
    #[serde(
        rename = "timing_s/switch_to_train",
        default,
        deserialize_with = "null_is_nan"
    )]
    pub timing_switch_to_train: f64,
    #[serde(rename = "timing_s/reward", deserialize_with = "null_is_nan")]
    pub timing_reward: f64,
    #[serde(rename = "timing_s/old_log_prob", deserialize_with = "null_is_nan")]
    pub timing_old_log_prob: f64,
    #[serde(rename = "timing_s/ref", deserialize_with = "null_is_nan")]
    pub timing_ref: f64,
    #[serde(rename = "timing_s/adv", deserialize_with = "null_is_nan")]
    pub timing_adv: f64,
    #[serde(rename = "timing_s/update_actor", deserialize_with = "null_is_nan")]
    pub timing_update_actor: f64,

    #[serde(rename = "actor/pg_loss", deserialize_with = "null_is_nan")]
    pub pg_loss: f64,
    #[serde(rename = "actor/pg_clipfrac", deserialize_with = "null_is_nan")]
    pub pg_clipfrac: f64,
    #[serde(rename = "actor/ppo_kl", deserialize_with = "null_is_nan")]
    pub ppo_kl: f64,
    #[serde(rename = "actor/entropy", deserialize_with = "null_is_nan")]
    pub entropy: f64,
    #[serde(rename = "actor/grad_norm", deserialize_with = "null_is_nan")]
    pub grad_norm: f64,
    #[serde(rename = "actor/lr", deserialize_with = "null_is_nan")]
    pub lr: f64,
    /// The KL loss term, when `use_kl_loss`.
    #[serde(
        rename = "actor/kl_loss",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "null_is_nan_some"
    )]
    pub kl_loss: Option<f64>,

    #[serde(rename = "critic/score/mean", deserialize_with = "null_is_nan")]
    pub score_mean: f64,
    #[serde(rename = "critic/score/max", deserialize_with = "null_is_nan")]
    pub score_max: f64,
    #[serde(rename = "critic/score/min", deserialize_with = "null_is_nan")]
    pub score_min: f64,
    /// Rewards after any KL penalty.
    #[serde(rename = "critic/rewards/mean", deserialize_with = "null_is_nan")]
    pub rewards_mean: f64,
    #[serde(rename = "critic/advantages/mean", deserialize_with = "null_is_nan")]
    pub advantages_mean: f64,
    /// The critic's update (GAE runs only).
    #[serde(
        rename = "critic/vf_loss",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "null_is_nan_some"
    )]
    pub vf_loss: Option<f64>,
    #[serde(
        rename = "critic/vf_clipfrac",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "null_is_nan_some"
    )]
    pub vf_clipfrac: Option<f64>,
    #[serde(
        rename = "critic/vpred_mean",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "null_is_nan_some"
    )]
    pub vpred_mean: Option<f64>,

    #[serde(rename = "response_length/mean", deserialize_with = "null_is_nan")]
    pub response_length_mean: f64,
    #[serde(rename = "response_length/max", deserialize_with = "null_is_nan")]
    pub response_length_max: f64,
    /// The share of responses cut at `max_new_tokens`.
    #[serde(
        rename = "response_length/clip_ratio",
        deserialize_with = "null_is_nan"
    )]
    pub response_length_clip_ratio: f64,

    /// Tokens (prompt and response) processed per second of the step.
    #[serde(rename = "perf/throughput", deserialize_with = "null_is_nan")]
    pub throughput: f64,
    /// The step's peak of mapped device bytes, cached blocks included
    /// (PyTorch's `max_memory_reserved`).
    #[serde(rename = "memory/peak_device_bytes")]
    pub peak_device_bytes: u64,
    /// The step's peak of allocated device bytes, cached blocks not
    /// included (`max_memory_allocated`); 0 in records of earlier versions.
    #[serde(rename = "memory/peak_allocated_bytes", default)]
    pub peak_allocated_bytes: u64,
    /// The bytes a sharded actor's all-gathers on this worker sent to and
    /// received from the other workers in the step's trainer → rollout
    /// switch (the reshard: every unit gathered once, `(N − 1)/N` of the
    /// weights each way, each unit padded to a multiple of `N`), counted
    /// per call (colo-train's `Traffic`); what `colo plan reshard` plans.
    /// Absent unsharded. (Records of earlier versions had the received
    /// bytes alone, as a formula, under `perf/reshard_bytes`.)
    #[serde(
        rename = "perf/reshard_sent_bytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reshard_sent_bytes: Option<u64>,
    #[serde(
        rename = "perf/reshard_recv_bytes",
        alias = "perf/reshard_bytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub reshard_recv_bytes: Option<u64>,
    /// A sharded actor's seconds this step in its gathers and
    /// reduce-scatters as the trainer sees them: the transport's time
    /// (`timing_s/all_gather`, `timing_s/reduce_scatter` and their waits,
    /// measured inside Python) plus the route to it through colo-py.
    #[serde(
        rename = "timing_s/shard_collectives",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "null_is_nan_some"
    )]
    pub shard_collectives_s: Option<f64>,
    /// Samples whose reward failed and got the configured default.
    #[serde(rename = "reward/failures", default)]
    pub reward_failures: u64,
    /// The mean of each number the reward returned beside its score (a
    /// weighted reward's terms, a verl function's dict entries) over the
    /// step's samples that returned it; as `eval/reward_extra` for the
    /// held-out set.
    #[serde(
        rename = "reward/extra",
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_is_nan_map"
    )]
    pub reward_extra: BTreeMap<String, f64>,

    /// Rollout vs. training log-probabilities.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<MismatchRecord>,
}

/// A float that may be `null`: what serde_json writes for NaN and the
/// infinities (a skipped update's gradient norm, the actor's metrics in the
/// critic's warmup, a sum that overflowed), read back as NaN, so that a
/// run's own `metrics.jsonl` always reads (`--resume` truncates it). Every
/// float of a record reads this way; finite values read back as written.
fn null_is_nan<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// [`null_is_nan`] for a float that may be absent: a key written as `null`
/// is there, and reads back as `Some(NaN)`.
fn null_is_nan_some<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<f64>, D::Error> {
    null_is_nan(d).map(Some)
}

/// [`null_is_nan`] for each value of a map of named floats.
fn null_is_nan_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<BTreeMap<String, f64>, D::Error> {
    Ok(BTreeMap::<String, Option<f64>>::deserialize(d)?
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

/// [`MismatchMetrics`] under verl's `rollout_corr/` names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MismatchRecord {
    #[serde(
        rename = "rollout_corr/mean_abs_diff",
        deserialize_with = "null_is_nan"
    )]
    pub mean_abs_diff: f64,
    #[serde(rename = "rollout_corr/max_abs_diff", deserialize_with = "null_is_nan")]
    pub max_abs_diff: f64,
    #[serde(rename = "rollout_corr/kl", deserialize_with = "null_is_nan")]
    pub kl: f64,
    #[serde(rename = "rollout_corr/k3_kl", deserialize_with = "null_is_nan")]
    pub k3_kl: f64,
    #[serde(rename = "rollout_corr/training_ppl", deserialize_with = "null_is_nan")]
    pub training_ppl: f64,
    #[serde(rename = "rollout_corr/rollout_ppl", deserialize_with = "null_is_nan")]
    pub rollout_ppl: f64,
    #[serde(rename = "rollout_corr/ppl_ratio", deserialize_with = "null_is_nan")]
    pub ppl_ratio: f64,
    #[serde(rename = "rollout_corr/chi2_token", deserialize_with = "null_is_nan")]
    pub chi2_token: f64,
}

impl From<MismatchMetrics> for MismatchRecord {
    fn from(m: MismatchMetrics) -> Self {
        MismatchRecord {
            mean_abs_diff: m.mean_abs_diff,
            max_abs_diff: m.max_abs_diff,
            kl: m.kl_k1,
            k3_kl: m.kl_k3,
            training_ppl: m.training_ppl,
            rollout_ppl: m.rollout_ppl,
            ppl_ratio: m.ppl_ratio,
            chi2_token: m.chi2_token,
        }
    }
}

/// An evaluation on the held-out set, after `step` steps (0: the starting
/// checkpoint).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalRecord {
    #[serde(rename = "training/global_step")]
    pub step: usize,
    /// The fraction of held-out samples whose reward is at least 1 (a
    /// rule-based reward's "right").
    #[serde(rename = "eval/accuracy", deserialize_with = "null_is_nan")]
    pub accuracy: f64,
    #[serde(rename = "eval/score/mean", deserialize_with = "null_is_nan")]
    pub score_mean: f64,
    #[serde(rename = "eval/n_samples")]
    pub n_samples: usize,
    #[serde(rename = "timing_s/eval", deserialize_with = "null_is_nan")]
    pub timing: f64,
    /// The same per `data_source` of the held-out rows, when they name one
    /// (verl's `val-core/{data_source}/…`).
    #[serde(
        rename = "eval/by_data_source",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub by_source: BTreeMap<String, SourceEval>,
    /// The mean of each number a verl-style reward function returned
    /// beside its score (its dict's other entries, e.g. `acc`; verl's
    /// `val-aux/{data_source}/{name}/mean@1`), over the held-out
    /// completions that returned it.
    #[serde(
        rename = "eval/reward_extra",
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_is_nan_map"
    )]
    pub reward_extra: BTreeMap<String, f64>,
}

/// One `data_source`'s part of an evaluation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceEval {
    #[serde(deserialize_with = "null_is_nan")]
    pub accuracy: f64,
    #[serde(deserialize_with = "null_is_nan")]
    pub score_mean: f64,
    pub n_samples: usize,
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_is_nan_map"
    )]
    pub reward_extra: BTreeMap<String, f64>,
}

/// What one evaluation pass (or one worker's share of it) counted: the
/// whole set and each `data_source`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalTallies {
    pub all: Tally,
    #[serde(default)]
    pub by_source: BTreeMap<String, Tally>,
}

impl From<&EvalResult> for EvalTallies {
    fn from(r: &EvalResult) -> Self {
        EvalTallies {
            all: r.all.clone(),
            by_source: r.by_source.clone(),
        }
    }
}

impl EvalTallies {
    /// Why these tallies cannot be one evaluation's (see
    /// [`Tally::inconsistency`]), naming the `data_source` at fault.
    pub fn inconsistency(&self) -> Option<String> {
        self.all.inconsistency().or_else(|| {
            (self.by_source.iter()).find_map(|(source, t)| {
                Some(format!("data_source {source:?}: {}", t.inconsistency()?))
            })
        })
    }
}

impl EvalRecord {
    /// The record of `parts` (workers' shares of one evaluation) added up;
    /// `None` when they evaluated nothing (no held-out set).
    pub fn of_parts(step: usize, parts: &[EvalTallies], timing: f64) -> Option<EvalRecord> {
        let all = parts
            .iter()
            .fold(Tally::default(), |t, p| t + p.all.clone());
        let mut by_source: BTreeMap<String, Tally> = BTreeMap::new();
        for (source, t) in parts.iter().flat_map(|p| &p.by_source) {
            let sum = by_source.entry(source.clone()).or_default();
            *sum = std::mem::take(sum) + t.clone();
        }
        (all.n > 0).then(|| EvalRecord {
            step,
            accuracy: all.accuracy(),
            score_mean: all.score_mean(),
            n_samples: all.n,
            timing,
            reward_extra: all.extra_means(),
            by_source: by_source
                .into_iter()
                .map(|(source, t)| {
                    let e = SourceEval {
                        accuracy: t.accuracy(),
                        score_mean: t.score_mean(),
                        n_samples: t.n,
                        reward_extra: t.extra_means(),
                    };
                    (source, e)
                })
                .collect(),
        })
    }
}

/// A line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Record {
    Eval(EvalRecord),
    Step(Box<StepMetrics>),
}

/// Appends records to `metrics.jsonl`, one line each, flushed at once (a
/// crashed run keeps every finished step).
pub struct MetricsWriter {
    path: PathBuf,
    file: File,
}

impl MetricsWriter {
    /// Creates (truncates) the file.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(MetricsWriter {
            path: path.to_owned(),
            file,
        })
    }

    /// Opens the file for appending (a resumed run), creating it if needed.
    pub fn append(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        Ok(MetricsWriter {
            path: path.to_owned(),
            file,
        })
    }

    pub fn step(&mut self, m: &StepMetrics) -> Result<()> {
        self.line(m)
    }

    pub fn eval(&mut self, e: &EvalRecord) -> Result<()> {
        self.line(e)
    }

    fn line(&mut self, v: &impl Serialize) -> Result<()> {
        let mut text = serde_json::to_vec(v)?;
        text.push(b'\n');
        self.file
            .write_all(&text)
            .and_then(|()| self.file.flush())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Keeps the records of `path` up to step `step` — training steps up to
/// it and evaluations after at most `step` steps — and removes the rest:
/// what a run resumed from the checkpoint of step `step` writes again
/// (verl's and TensorBoard's purge on restart), so no step is there twice.
/// A last line cut short (a run killed while writing it) goes too; any
/// other unreadable line is an error naming it. The file is replaced
/// atomically; a missing one is left missing. Returns the lines removed.
pub fn truncate_after(path: &Path, step: usize) -> Result<usize> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(path, e)),
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = String::with_capacity(text.len());
    let mut removed = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| Error::Data {
            path: path.to_owned(),
            line: i + 1,
            field: None,
            message,
        };
        let record_step = match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => v
                .get("training/global_step")
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| bad("a metrics record without `training/global_step`".into()))?,
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {
                removed += 1; // cut short by a kill
                continue;
            }
            Err(e) => return Err(bad(format!("not a metrics record: {e}"))),
        };
        if record_step <= step as u64 {
            kept.push_str(line);
            kept.push('\n');
        } else {
            removed += 1;
        }
    }
    if removed > 0 {
        replace_file(path, kept.as_bytes())?;
    }
    Ok(removed)
}

/// Replaces `path` with `bytes` at once (a temporary file beside it,
/// synced, renamed over it): a kill leaves the old file or the new one.
/// The file keeps its permissions; a new one gets those `File::create`
/// gives (the umask's), not a temporary file's 0600.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = new_file_beside(dir)?;
    if let Ok(meta) = std::fs::metadata(path) {
        (tmp.as_file().set_permissions(meta.permissions()))
            .map_err(|e| Error::io(tmp.path(), e))?;
    }
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::io(tmp.path(), e))?;
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// A temporary file in `dir` to be renamed over a file of the run, made
/// with the permissions `File::create` gives (0666 less the umask).
pub(crate) fn new_file_beside(dir: &Path) -> Result<tempfile::NamedTempFile> {
    let mut b = tempfile::Builder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        b.permissions(std::fs::Permissions::from_mode(0o666));
    }
    b.tempfile_in(dir).map_err(|e| Error::io(dir, e))
}

/// Reads `metrics.jsonl` back (for the reward curve of a resumed run).
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(|e| Error::Data {
            path: path.to_owned(),
            line: i + 1,
            field: None,
            message: format!("not a metrics record: {e}"),
        })?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn evaluations_add_up_across_parts_and_by_data_source() {
        use crate::eval::Sum;
        use crate::eval::Tally;
        let t = |right, score_sum, n| Tally {
            right,
            score_sum,
            n,
            ..Tally::default()
        };
        // `acc` from every completion of both parts, `len` from three of
        // part one's only: each mean is over the completions that gave it.
        let with_extra = |t: Tally, extra: &[(&str, f64, usize)]| Tally {
            extra: (extra.iter())
                .map(|&(k, sum, n)| (k.to_owned(), Sum { sum, n }))
                .collect(),
            ..t
        };
        let parts = [
            EvalTallies {
                all: with_extra(t(3, 3.5, 4), &[("acc", 3.0, 4), ("len", 30.0, 3)]),
                by_source: [
                    ("gsm8k".to_owned(), t(1, 1.5, 2)),
                    ("math".to_owned(), t(2, 2.0, 2)),
                ]
                .into(),
            },
            EvalTallies {
                all: with_extra(t(1, 1.0, 4), &[("acc", 1.0, 4)]),
                by_source: [("gsm8k".to_owned(), t(1, 1.0, 4))].into(),
            },
        ];
        let r = EvalRecord::of_parts(10, &parts, 0.5).unwrap();
        assert_eq!(
            (r.step, r.accuracy, r.score_mean, r.n_samples),
            (10, 0.5, 0.5625, 8)
        );
        assert_eq!(
            r.reward_extra,
            [("acc".to_owned(), 0.5), ("len".to_owned(), 10.0)].into()
        );
        let g = &r.by_source["gsm8k"];
        assert_eq!(
            (g.accuracy, g.score_mean, g.n_samples),
            (2.0 / 6.0, 2.5 / 6.0, 6)
        );
        assert_eq!(r.by_source["math"].accuracy, 1.0);
        // Written and read back as an evaluation record.
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            line.contains("\"eval/by_data_source\":{\"gsm8k\":{\"accuracy\"")
                && line.contains("\"eval/reward_extra\":{\"acc\":0.5,\"len\":10.0}"),
            "{line}"
        );
        match serde_json::from_str::<Record>(&line).unwrap() {
            Record::Eval(back) => assert_eq!(back, r),
            Record::Step(_) => panic!("read back as a step"),
        }
        // No data sources: no key (files as before); nothing evaluated: no record.
        let plain = EvalRecord::of_parts(
            0,
            &[EvalTallies {
                all: t(1, 1.0, 2),
                ..Default::default()
            }],
            0.1,
        );
        let plain = serde_json::to_string(&plain.unwrap()).unwrap();
        assert!(
            !plain.contains("by_data_source") && !plain.contains("reward_extra"),
            "{plain}"
        );
        assert_eq!(
            EvalRecord::of_parts(0, &[EvalTallies::default()], 0.1),
            None
        );
        // Tallies no evaluation gives are named; every part above is sound.
        assert!(parts.iter().all(|p| p.inconsistency().is_none()));
        let why = |p: EvalTallies| p.inconsistency().unwrap();
        let one = |all| EvalTallies {
            all,
            ..Default::default()
        };
        assert_eq!(why(one(t(5, 1.0, 2))), "right = 5 of n = 2 prompts");
        assert_eq!(why(one(t(1, f64::NAN, 2))), "score_sum = NaN");
        assert_eq!(
            why(one(with_extra(t(1, 1.0, 2), &[("acc", 3.0, 3)]))),
            "extra \"acc\": sum 3 over 3 of n = 2"
        );
        let mut by = parts[1].clone();
        by.by_source.insert("math".into(), t(3, 1.0, 1));
        assert_eq!(why(by), "data_source \"math\": right = 3 of n = 1 prompts");
    }

    use super::*;

    #[test]
    fn keys_are_verls() {
        let m = StepMetrics {
            step: 3,
            pg_loss: -0.5,
            peak_device_bytes: 1 << 30,
            peak_allocated_bytes: 1 << 29,
            mismatch: Some(MismatchRecord {
                kl: 0.01,
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&m).unwrap();
        for key in [
            "timing_s/gen",
            "timing_s/update_actor",
            "actor/pg_loss",
            "actor/pg_clipfrac",
            "actor/ppo_kl",
            "actor/entropy",
            "actor/grad_norm",
            "critic/score/mean",
            "response_length/mean",
            "perf/throughput",
            "memory/peak_device_bytes",
            "rollout_corr/kl",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {v}");
        }
        assert_eq!(v["actor/pg_loss"], -0.5);
        assert_eq!(v["memory/peak_device_bytes"], 1u64 << 30);
        assert!(v.get("actor/kl_loss").is_none(), "absent when unused");
        let e = serde_json::to_value(EvalRecord {
            accuracy: 0.25,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(e["eval/accuracy"], 0.25);
    }

    #[test]
    fn truncate_after_keeps_the_records_up_to_a_step() {
        let dir = std::env::temp_dir().join(format!("colo-rl-truncate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let mut w = MetricsWriter::create(&path).unwrap();
        for step in 1..=3 {
            w.step(&StepMetrics {
                step,
                ..Default::default()
            })
            .unwrap();
            w.eval(&EvalRecord {
                step,
                ..Default::default()
            })
            .unwrap();
        }
        drop(w);
        // A line cut short by a kill.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"training/global_step\": 4, \"timing");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(truncate_after(&path, 2).unwrap(), 3);
        let steps: Vec<(usize, bool)> = read(&path)
            .unwrap()
            .into_iter()
            .map(|r| match r {
                Record::Step(s) => (s.step, true),
                Record::Eval(e) => (e.step, false),
            })
            .collect();
        assert_eq!(steps, vec![(1, true), (1, false), (2, true), (2, false)]);
        assert_eq!(
            truncate_after(&path, 2).unwrap(),
            0,
            "nothing more to remove"
        );
        // A bad line that is not the last is an error naming it.
        std::fs::write(&path, "garbage\n{\"training/global_step\": 1}\n").unwrap();
        let e = truncate_after(&path, 0).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl:1"), "{e}");
        assert_eq!(truncate_after(&dir.join("absent.jsonl"), 0).unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_records_read_back_in_order() {
        let dir = std::env::temp_dir().join(format!("colo-rl-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let mut w = MetricsWriter::create(&path).unwrap();
        let e0 = EvalRecord {
            step: 0,
            accuracy: 0.2,
            ..Default::default()
        };
        let s1 = StepMetrics {
            step: 1,
            score_mean: 0.3,
            ..Default::default()
        };
        w.eval(&e0).unwrap();
        w.step(&s1).unwrap();
        drop(w);
        let mut w = MetricsWriter::append(&path).unwrap();
        let s2 = StepMetrics {
            step: 2,
            mismatch: Some(MismatchRecord::default()),
            ..Default::default()
        };
        w.step(&s2).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(
            back,
            vec![
                Record::Eval(e0),
                Record::Step(Box::new(s1)),
                Record::Step(Box::new(s2))
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A diverged step's NaN losses are written as JSON's `null` and read
    /// back as NaN: the run's own file always reads (for `--resume`).
    #[test]
    fn a_diverged_steps_nan_reads_back() {
        let dir = std::env::temp_dir().join(format!("colo-rl-metrics-nan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let mut w = MetricsWriter::create(&path).unwrap();
        let nan = StepMetrics {
            step: 1,
            pg_loss: f64::NAN,
            grad_norm: f64::INFINITY,
            mismatch: Some(MismatchRecord {
                kl: f64::NAN,
                ..Default::default()
            }),
            ..Default::default()
        };
        w.step(&nan).unwrap();
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"actor/pg_loss\":null"), "{text}");
        let back = read(&path).unwrap();
        let Record::Step(s) = &back[0] else {
            panic!("{back:?}")
        };
        assert!(s.pg_loss.is_nan() && s.grad_norm.is_nan(), "{s:?}");
        assert!(s.mismatch.unwrap().kl.is_nan());
        assert_eq!(s.step, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
