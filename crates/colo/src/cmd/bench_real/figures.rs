//! The figures `colo bench real` reads from the run's `metrics.jsonl`:
//! the step split into parts that do not overlap, the weight sync's
//! bandwidth, the measured peaks against the plan.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use serde::Serialize;
use serde_json::{Map, Value};

/// A step's parts that do not overlap, in the order the table lists them:
/// (name, label). Their times add up to `timing_s/step` (`other` is the
/// rest).
pub(super) const PHASES: [(&str, &str); 9] = [
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
    /// The mean seconds of phase `name` (one of [`PHASES`]).
    pub(super) fn phase(&self, name: &str) -> f64 {
        (self.phases.iter())
            .find(|p| p.name == name)
            .map_or(0.0, |p| p.seconds)
    }

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
    /// The copy the sync is held against, of a buffer of `bytes` in this
    /// process: on the CPU a single-thread memcpy, pages present, best of
    /// 3, before the run; on CUDA a device-to-device copy, best of 3, after
    /// it.
    pub(super) memcpy: String,
    pub(super) memcpy_gib_s: f64,
    pub(super) vs_memcpy: f64,
}

impl SyncFigures {
    pub(super) fn of(bytes: u64, seconds: f64, memcpy: &super::yardsticks::Copy) -> Self {
        let gib_s = bytes as f64 / (1u64 << 30) as f64 / seconds;
        SyncFigures {
            bytes,
            seconds,
            gib_s,
            memcpy: memcpy.what.clone(),
            memcpy_gib_s: memcpy.gib_s,
            vs_memcpy: gib_s / memcpy.gib_s,
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
        assert_eq!((f.phase("ref"), f.phase("no such phase")), (0.5, 0.0));
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
