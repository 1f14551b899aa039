//! What `colo bench real` reports: the model, the machine, the job, colo's
//! run and its figures, TRL's, and what was not measured.

use std::path::PathBuf;

use anyhow::Result;
use colo_rl::Config;
use serde::Serialize;

use super::figures::{Figures, MemoryFigures, SyncFigures};
use super::trl::TrlRun;
use super::yardsticks::{DecodeFigures, FlopFigures};

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) model: ModelInfo,
    pub(super) machine: Machine,
    pub(super) job: Job,
    pub(super) colo: ColoRun,
    pub(super) sync: SyncFigures,
    pub(super) memory: MemoryFigures,
    /// Training FLOP/s against matmul FLOP/s (issue 36, item 4).
    pub(super) flops: FlopFigures,
    /// Decode against the memory-bandwidth bound (issue 36, item 4).
    pub(super) decode: DecodeFigures,
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
    /// The process's resident bytes once the run has returned: what it
    /// left mapped (none of it is needed after the run).
    pub(super) rss_after_run_bytes: Option<u64>,
    #[serde(flatten)]
    pub(super) figures: Figures,
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
            "the FLOPs are model FLOPs (6N + 12LAS a token for the update, a third for the \
             reference), not counted by the run; colo's passes compute fewer (a shared prompt \
             once, the LM head over responses only)"
                .to_owned(),
            "the decode is timed on the rollout engine after the run, on synthetic prompts of \
             the run's mean prompt length, not inside the run's generation; its bound leaves \
             out the KV cache's reads"
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
}
