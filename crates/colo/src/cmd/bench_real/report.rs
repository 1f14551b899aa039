//! What `colo bench real` reports, read from the run's `metrics.jsonl`,
//! and the table it prints.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use colo_mem::fmt_bytes;
use colo_rl::Config;
use serde::Serialize;
use serde_json::{Map, Value};

use super::trl::TrlRun;

/// Issue 36's targets, printed beside the figures.
const SWITCHES_MAX_SHARE: f64 = 0.05;
const SYNC_MIN_VS_MEMCPY: f64 = 0.5;
const PLAN_MAX_ERROR: f64 = 0.10;
const TRL_MIN_SPEEDUP: f64 = 3.0;

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) model: ModelInfo,
    pub(super) machine: Machine,
    pub(super) job: Job,
    pub(super) colo: ColoRun,
    pub(super) sync: SyncFigures,
    pub(super) memory: MemoryFigures,
    /// `None` without `--trl`.
    pub(super) trl: Option<TrlOutcome>,
    /// What the figures above are not, said with them.
    pub(super) not_measured: Vec<String>,
    /// The whole benchmark's wall time.
    pub(super) seconds: f64,
}

#[derive(Serialize)]
pub(super) struct ModelInfo {
    pub(super) name: String,
    pub(super) dir: PathBuf,
    /// Written by the benchmark into a temporary directory (removed at
    /// the end), not `--model`'s.
    pub(super) made_here: bool,
    pub(super) parameters: u64,
    /// The run's dtype (`trainer.dtype` resolved).
    pub(super) dtype: &'static str,
    /// parameters × the dtype's bytes.
    pub(super) weight_bytes: u64,
}

#[derive(Serialize)]
pub(super) struct Machine {
    pub(super) cpu: String,
    pub(super) cores: usize,
}

impl Machine {
    pub(super) fn this() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                let line = t.lines().find(|l| l.starts_with("model name"))?;
                Some(line.split_once(':')?.1.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Machine { cpu, cores }
    }
}

#[derive(Serialize)]
pub(super) struct Job {
    pub(super) prompts: usize,
    pub(super) n: usize,
    pub(super) max_new_tokens: usize,
    pub(super) steps: usize,
    /// The first timed step (1-based); the timed steps run to `steps`.
    pub(super) timed_from: usize,
    pub(super) device: &'static str,
    pub(super) colocation: &'static str,
    pub(super) offload_policy: &'static str,
}

impl Job {
    pub(super) fn of(config: &Config, steps: usize, timed_from: usize) -> Self {
        let (colocation, offload_policy) = super::memory_mode(config);
        Job {
            prompts: config.batch.prompts_per_step,
            n: config.rollout.n,
            max_new_tokens: config.rollout.max_new_tokens,
            steps,
            timed_from,
            device: config.trainer.device.name(),
            colocation,
            offload_policy,
        }
    }
}

#[derive(Serialize)]
pub(super) struct ColoRun {
    pub(super) load_avg_1m_start: Option<f64>,
    pub(super) load_avg_1m_end: Option<f64>,
    /// The whole run: setup, steps, the evaluation and checkpoint at the end.
    pub(super) run_s: f64,
    #[serde(flatten)]
    pub(super) figures: Figures,
}

/// A step's parts that do not overlap, in the order the table lists them:
/// (name, label). Their times add up to `timing_s/step` (`other` is the
/// rest).
const PHASES: [(&str, &str); 9] = [
    ("generation", "generation (without the switches)"),
    ("switch_to_rollout", "switch train -> rollout"),
    ("switch_to_train", "switch rollout -> train"),
    ("reward", "reward"),
    ("ref", "reference log-probs"),
    ("old_log_prob", "old log-probs"),
    ("adv", "advantages"),
    ("update_actor", "actor update"),
    ("other", "other (the step's rest)"),
];

/// The `timing_s/` keys the split reads; any other is listed apart.
const KNOWN: [&str; 10] = [
    "step",
    "gen",
    "update_weights",
    "switch_to_rollout",
    "switch_to_train",
    "reward",
    "ref",
    "old_log_prob",
    "adv",
    "update_actor",
];

#[derive(Serialize, Clone)]
pub(super) struct Phase {
    pub(super) name: &'static str,
    /// Mean over the timed steps.
    pub(super) seconds: f64,
    /// Of the mean step.
    pub(super) share: f64,
}

/// The timed steps' figures.
#[derive(Serialize)]
pub(super) struct Figures {
    /// `timing_s/step` of every step, the warm-up ones included.
    pub(super) steps_s: Vec<f64>,
    /// Mean, least and most `timing_s/step` of the timed steps.
    pub(super) step_s: f64,
    pub(super) step_min_s: f64,
    pub(super) step_max_s: f64,
    /// The step's parts: their shares add up to 1.
    pub(super) phases: Vec<Phase>,
    /// The two switches' share of the step.
    pub(super) switches_share: f64,
    /// `timing_s/update_weights` (within the train → rollout switch).
    pub(super) sync_s: f64,
    /// Mean seconds of `timing_s/*` keys the split does not know.
    pub(super) other_timing_s: BTreeMap<String, f64>,
}

/// The step records of `metrics.jsonl` (those with `timing_s/step`), in
/// order.
pub(super) fn step_records(path: &Path) -> Result<Vec<Map<String, Value>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Map<String, Value> = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a JSON object", path.display(), i + 1))?;
        if v.contains_key("timing_s/step") {
            out.push(v);
        }
    }
    Ok(out)
}

/// A record's `timing_s/{key}`: 0 where absent, NaN where null.
fn timing(r: &Map<String, Value>, key: &str) -> f64 {
    match r.get(&format!("timing_s/{key}")) {
        None => 0.0,
        Some(v) => v.as_f64().unwrap_or(f64::NAN),
    }
}

fn mean(v: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = v.into_iter().fold((0.0, 0), |(s, n), x| (s + x, n + 1));
    sum / n as f64
}

/// One step's parts, in [`PHASES`]' order.
fn parts(r: &Map<String, Value>) -> [f64; 9] {
    let t = |k| timing(r, k);
    let (to_rollout, to_train) = (t("switch_to_rollout"), t("switch_to_train"));
    let mut p = [
        t("gen") - to_rollout - to_train,
        to_rollout,
        to_train,
        t("reward"),
        t("ref"),
        t("old_log_prob"),
        t("adv"),
        t("update_actor"),
        0.0,
    ];
    p[8] = t("step") - p[..8].iter().sum::<f64>();
    p
}

impl Figures {
    /// The figures of `records`' steps `timed` (1-based).
    pub(super) fn of(records: &[Map<String, Value>], timed: RangeInclusive<usize>) -> Result<Self> {
        ensure!(
            records.len() >= *timed.end(),
            "the run recorded {} steps, not {}",
            records.len(),
            timed.end()
        );
        let steps_s: Vec<f64> = records.iter().map(|r| timing(r, "step")).collect();
        let rows = &records[timed.start() - 1..*timed.end()];
        let each: Vec<[f64; 9]> = rows.iter().map(parts).collect();
        let step_s = mean(rows.iter().map(|r| timing(r, "step")));
        let phases: Vec<Phase> = (PHASES.iter().enumerate())
            .map(|(i, (name, _))| {
                let seconds = mean(each.iter().map(|p| p[i]));
                Phase {
                    name,
                    seconds,
                    share: seconds / step_s,
                }
            })
            .collect();
        let mut other_timing_s = BTreeMap::new();
        for key in rows.iter().flat_map(|r| r.keys()) {
            let Some(k) = key.strip_prefix("timing_s/") else {
                continue;
            };
            if !KNOWN.contains(&k) && !other_timing_s.contains_key(key) {
                other_timing_s.insert(key.clone(), mean(rows.iter().map(|r| timing(r, k))));
            }
        }
        let timed_s = &steps_s[timed.start() - 1..*timed.end()];
        Ok(Figures {
            step_s,
            step_min_s: timed_s.iter().copied().fold(f64::INFINITY, f64::min),
            step_max_s: timed_s.iter().copied().fold(0.0, f64::max),
            switches_share: (phases[1].seconds + phases[2].seconds) / step_s,
            sync_s: mean(rows.iter().map(|r| timing(r, "update_weights"))),
            steps_s,
            phases,
            other_timing_s,
        })
    }
}

#[derive(Serialize)]
pub(super) struct SyncFigures {
    /// The model's parameters × the run's dtype bytes: what the sync
    /// copies, computed, not counted by the run.
    pub(super) bytes: u64,
    pub(super) seconds: f64,
    pub(super) gib_s: f64,
    /// One thread, pages present, a buffer of `bytes`, best of 3, in this
    /// process before the run.
    pub(super) memcpy_gib_s: f64,
    pub(super) vs_memcpy: f64,
}

impl SyncFigures {
    pub(super) fn of(bytes: u64, seconds: f64, memcpy_gib_s: f64) -> Self {
        let gib_s = bytes as f64 / (1u64 << 30) as f64 / seconds;
        SyncFigures {
            bytes,
            seconds,
            gib_s,
            memcpy_gib_s,
            vs_memcpy: gib_s / memcpy_gib_s,
        }
    }
}

#[derive(Serialize)]
pub(super) struct MemoryFigures {
    /// colo-plan's predicted peak and its phase; `None` with `plan_error`.
    pub(super) plan_peak_bytes: Option<u64>,
    pub(super) plan_peak_phase: Option<String>,
    pub(super) plan_error: Option<String>,
    /// The largest `memory/peak_allocated_bytes` and
    /// `memory/peak_device_bytes` (mapped) over all the run's steps.
    pub(super) peak_allocated_bytes: u64,
    pub(super) peak_mapped_bytes: u64,
    /// (measured − plan) / plan.
    pub(super) allocated_vs_plan: Option<f64>,
    pub(super) mapped_vs_plan: Option<f64>,
}

impl MemoryFigures {
    pub(super) fn of(
        records: &[Map<String, Value>],
        plan: std::result::Result<(u64, String), String>,
    ) -> Self {
        let peak = |key: &str| {
            (records.iter())
                .filter_map(|r| r.get(key)?.as_u64())
                .max()
                .unwrap_or(0)
        };
        let allocated = peak("memory/peak_allocated_bytes");
        let mapped = peak("memory/peak_device_bytes");
        let (bytes, phase, error) = match plan {
            Ok((b, p)) => (Some(b), Some(p), None),
            Err(e) => (None, None, Some(e)),
        };
        let vs = |m: u64| bytes.map(|b| (m as f64 - b as f64) / b as f64);
        MemoryFigures {
            plan_peak_bytes: bytes,
            plan_peak_phase: phase,
            plan_error: error,
            peak_allocated_bytes: allocated,
            peak_mapped_bytes: mapped,
            allocated_vs_plan: vs(allocated),
            mapped_vs_plan: vs(mapped),
        }
    }
}

/// The TRL run and colo's speed against it, or why it failed.
#[derive(Serialize)]
pub(super) struct TrlOutcome {
    #[serde(flatten)]
    pub(super) run: Option<TrlRun>,
    /// TRL's mean step over colo's.
    pub(super) colo_speedup: Option<f64>,
    pub(super) error: Option<String>,
}

impl Report {
    pub(super) fn set_trl(&mut self, result: Result<TrlRun>) {
        self.trl = Some(match result {
            Ok(run) => TrlOutcome {
                colo_speedup: Some(run.step_s / self.colo.figures.step_s),
                run: Some(run),
                error: None,
            },
            Err(e) => TrlOutcome {
                run: None,
                colo_speedup: None,
                error: Some(format!("{e:#}")),
            },
        });
    }

    /// Fills [`Report::not_measured`] from what ran.
    pub(super) fn say_what_was_not_measured(&mut self) {
        let mut not = vec![
            "the weight bytes synced are computed (parameters x dtype bytes), not counted by the \
             sync"
                .to_owned(),
            "training FLOP/s against matmul FLOP/s and decode against the memory-bandwidth bound \
             (issue 36, item 4): not here (colo bench train, colo bench rollout)"
                .to_owned(),
            "the memory peaks are over every step, warm-up included, not over the timed steps \
             alone"
                .to_owned(),
        ];
        if self.memory.plan_peak_bytes.is_none() {
            not.push("the plan's peak: no plan for this run".into());
        }
        match &self.trl {
            None => not.push("TRL's step: not run (--trl)".into()),
            Some(t) if t.run.is_none() => not.push("TRL's step: its run failed".into()),
            Some(_) => not.push(
                "TRL's peak memory against colo's: TRL keeps everything resident; its peak RSS \
                 is in the JSON, not compared"
                    .into(),
            ),
        }
        self.not_measured = not;
    }

    /// The report as the table `colo bench real` prints.
    pub(super) fn table(&self) -> String {
        let mut out = String::new();
        self.head(&mut out);
        self.phase_table(&mut out);
        self.sync_and_memory(&mut out);
        self.trl_lines(&mut out);
        out.push_str("\nnot measured here:\n");
        for line in &self.not_measured {
            let _ = writeln!(out, "- {line}");
        }
        out
    }

    fn head(&self, out: &mut String) {
        let (m, j, c) = (&self.model, &self.job, &self.colo);
        let load = |l: Option<f64>| l.map_or("-".into(), |l| format!("{l:.2}"));
        let _ = writeln!(
            out,
            "colo bench real: {} ({} parameters, {} weights {}) in {}{}\n\
             machine: {} ({} cores)\n\
             job: {} prompts x {} samples x {} new tokens, {}, colocation {} (offload_policy {}), \
             {} steps: 1-{} warm up, {}-{} timed\n\
             colo's run: {:.1} s in all (setup, the evaluation and checkpoint at the end \
             included); load average (1 min) {} at its start, {} at its end\n",
            m.name,
            crate::cmd::init_model::thousands(m.parameters),
            m.dtype,
            fmt_bytes(m.weight_bytes),
            m.dir.display(),
            match m.made_here {
                true => " (made here, removed at the end)",
                false => "",
            },
            self.machine.cpu,
            self.machine.cores,
            j.prompts,
            j.n,
            j.max_new_tokens,
            j.device,
            j.colocation,
            j.offload_policy,
            j.steps,
            j.timed_from - 1,
            j.timed_from,
            j.steps,
            c.run_s,
            load(c.load_avg_1m_start),
            load(c.load_avg_1m_end),
        );
    }

    fn phase_table(&self, out: &mut String) {
        let (f, j) = (&self.colo.figures, &self.job);
        let all: Vec<String> = f.steps_s.iter().map(|s| format!("{s:.2}")).collect();
        let _ = writeln!(
            out,
            "step (timing_s/step), steps {}-{}: mean {:.3} s (min {:.3}, max {:.3}); every step: {} s\n",
            j.timed_from,
            j.steps,
            f.step_s,
            f.step_min_s,
            f.step_max_s,
            all.join(", ")
        );
        let _ = writeln!(
            out,
            "{:<36} {:>9} {:>7}",
            "phase (mean)", "seconds", "share"
        );
        for (p, (_, label)) in f.phases.iter().zip(PHASES) {
            let _ = writeln!(
                out,
                "{label:<36} {:>9.3} {:>6.1}%",
                p.seconds,
                100.0 * p.share
            );
            if p.name == "switch_to_rollout" {
                let _ = writeln!(
                    out,
                    "{:<36} {:>9.3} {:>6.1}%",
                    "  of which the weight sync",
                    f.sync_s,
                    100.0 * f.sync_s / f.step_s
                );
            }
        }
        let _ = writeln!(
            out,
            "the two switches: {:.1}% of the step (issue 36: at most {:.0}%)",
            100.0 * f.switches_share,
            100.0 * SWITCHES_MAX_SHARE
        );
        for (key, s) in &f.other_timing_s {
            let _ = writeln!(out, "also recorded, not in the split: {key} {s:.3} s");
        }
        out.push('\n');
    }

    fn sync_and_memory(&self, out: &mut String) {
        let (s, m) = (&self.sync, &self.memory);
        let _ = writeln!(
            out,
            "weight sync: {} in {:.3} s = {:.2} GiB/s; memcpy {:.2} GiB/s: {:.2}x memcpy \
             (issue 36: at least {SYNC_MIN_VS_MEMCPY}x)\n  \
             bytes: parameters x {} bytes of {}, computed (the run does not count them); memcpy: \
             one thread, pages present, a buffer of that size, best of 3, before the run\n",
            fmt_bytes(s.bytes),
            s.seconds,
            s.gib_s,
            s.memcpy_gib_s,
            s.vs_memcpy,
            s.bytes / self.model.parameters.max(1),
            self.model.dtype,
        );
        let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:+.1}%", 100.0 * v));
        match (&m.plan_peak_bytes, &m.plan_peak_phase) {
            (Some(b), Some(phase)) => {
                let _ = writeln!(
                    out,
                    "memory: colo-plan's predicted peak {} (phase `{phase}`); measured over \
                     all {} steps: allocated {} ({} against the plan), mapped {} ({}) \
                     (issue 36: within {:.0}%)",
                    fmt_bytes(*b),
                    self.job.steps,
                    fmt_bytes(m.peak_allocated_bytes),
                    pct(m.allocated_vs_plan),
                    fmt_bytes(m.peak_mapped_bytes),
                    pct(m.mapped_vs_plan),
                    100.0 * PLAN_MAX_ERROR,
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "memory: no plan ({}); measured over all {} steps: allocated {}, mapped {}",
                    m.plan_error.as_deref().unwrap_or("none"),
                    self.job.steps,
                    fmt_bytes(m.peak_allocated_bytes),
                    fmt_bytes(m.peak_mapped_bytes),
                );
            }
        }
        if self.job.offload_policy == "as_needed" {
            let _ = writeln!(
                out,
                "  (the plan models offload_policy \"always\"; \"as_needed\" keeps more \
                 resident while there is room)"
            );
        }
        out.push('\n');
    }

    fn trl_lines(&self, out: &mut String) {
        let Some(t) = &self.trl else {
            let _ = writeln!(
                out,
                "TRL: not run (--trl runs TRL's GRPOTrainer on the same job)"
            );
            return;
        };
        match (&t.run, t.colo_speedup) {
            (Some(r), Some(x)) => {
                let _ = writeln!(
                    out,
                    "TRL GRPOTrainer ({}): mean step {:.3} s over steps {}-{} ({}); load average \
                     (1 min) {:.2} at its start, {:.2} at its end\n\
                     colo's step against TRL's: {x:.2}x faster (issue 36: at least {TRL_MIN_SPEEDUP}x)",
                    r.versions,
                    r.step_s,
                    self.job.timed_from,
                    self.job.steps,
                    r.phases_text(),
                    r.load_avg_1m_start,
                    r.load_avg_1m_end,
                );
            }
            _ => {
                let why = t.error.as_deref().unwrap_or("no result");
                let _ = writeln!(out, "TRL: failed: {why}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(
        step: f64,
        gen: f64,
        to_r: f64,
        sync: f64,
        to_t: f64,
        update: f64,
    ) -> Map<String, Value> {
        let v = json!({
            "timing_s/step": step, "timing_s/gen": gen, "timing_s/switch_to_rollout": to_r,
            "timing_s/update_weights": sync, "timing_s/switch_to_train": to_t,
            "timing_s/reward": 0.0, "timing_s/ref": 0.5, "timing_s/old_log_prob": 0.0,
            "timing_s/adv": 0.0, "timing_s/update_actor": update, "timing_s/new_key": 0.25,
            "memory/peak_allocated_bytes": 100, "memory/peak_device_bytes": 120,
        });
        v.as_object().unwrap().clone()
    }

    /// Generation is counted without the switches it includes, the rest of
    /// the step is `other`, and the shares add up to one.
    #[test]
    fn the_split_does_not_count_the_switches_twice() {
        let records = vec![
            record(20.0, 10.0, 1.0, 0.5, 1.0, 5.0),
            record(9.0, 4.0, 1.0, 0.5, 0.5, 3.0),
            record(11.0, 6.0, 2.0, 1.5, 1.0, 3.0),
        ];
        let f = Figures::of(&records, 2..=3).unwrap();
        assert_eq!(f.step_s, 10.0);
        assert_eq!((f.step_min_s, f.step_max_s), (9.0, 11.0));
        let get = |name| f.phases.iter().find(|p| p.name == name).unwrap().seconds;
        assert_eq!(get("generation"), 2.75); // (4 − 1.5 + 6 − 3) / 2
        assert_eq!(get("switch_to_rollout"), 1.5);
        assert_eq!(get("switch_to_train"), 0.75);
        assert_eq!(get("update_actor"), 3.0);
        assert_eq!(get("other"), 10.0 - 2.75 - 1.5 - 0.75 - 0.5 - 3.0);
        assert_eq!(f.sync_s, 1.0);
        assert_eq!(f.switches_share, 0.225);
        let sum: f64 = f.phases.iter().map(|p| p.share).sum();
        assert!((sum - 1.0).abs() < 1e-12, "{sum}");
        assert_eq!(f.other_timing_s["timing_s/new_key"], 0.25);
        assert!(Figures::of(&records, 3..=4).is_err());
        let m = MemoryFigures::of(&records, Ok((80, "train".into())));
        assert_eq!(m.allocated_vs_plan, Some(0.25));
        assert_eq!(m.mapped_vs_plan, Some(0.5));
        let none = MemoryFigures::of(&records, Err("no plan".into()));
        assert_eq!(
            (none.allocated_vs_plan, none.peak_mapped_bytes),
            (None, 120)
        );
    }
}
