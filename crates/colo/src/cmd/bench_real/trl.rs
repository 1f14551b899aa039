//! TRL's GRPOTrainer on the same model and job: `bench/trl/grpo_step.py`
//! in its own virtual environment (`bench/trl/setup.sh` makes it), its
//! last line of output read as JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use colo_rl::Config;
use serde::Serialize;
use serde_json::Value;

/// The job as `grpo_step.py`'s flags.
pub(super) struct Job {
    prompts: usize,
    n: usize,
    max_new_tokens: usize,
    steps: usize,
    timed_from: usize,
    lr: f64,
    warmup_steps: usize,
    beta: f64,
    /// The run's built-in training prompts; `None`: TRL's own arithmetic.
    data: Option<PathBuf>,
}

impl Job {
    /// `config`'s job for `steps` steps; the built-in task's prompts are
    /// written into `work`.
    pub(super) fn of(config: &Config, steps: usize, work: &Path) -> Result<Self> {
        Ok(Job {
            prompts: config.batch.prompts_per_step,
            n: config.rollout.n,
            max_new_tokens: config.rollout.max_new_tokens,
            steps,
            timed_from: super::WARMUP_STEPS + 1,
            lr: config.actor.lr,
            warmup_steps: config.actor.warmup_steps,
            beta: if config.actor.use_kl_loss {
                config.actor.kl_loss_coef
            } else {
                0.0
            },
            data: super::builtin_train_jsonl(config, &work.join("trl-data"))?,
        })
    }

    fn args(&self, model: &Path) -> Vec<String> {
        let mut a: Vec<String> = vec!["--model".into(), model.display().to_string()];
        for (flag, value) in [
            ("--prompts", self.prompts.to_string()),
            ("--n", self.n.to_string()),
            ("--max-new-tokens", self.max_new_tokens.to_string()),
            ("--steps", self.steps.to_string()),
            ("--timed-from", self.timed_from.to_string()),
            ("--lr", self.lr.to_string()),
            ("--warmup-steps", self.warmup_steps.to_string()),
            ("--beta", self.beta.to_string()),
        ] {
            a.extend([flag.into(), value]);
        }
        if let Some(data) = &self.data {
            a.extend(["--data".into(), data.display().to_string()]);
        }
        a
    }
}

/// What the TRL run measured.
#[derive(Serialize)]
pub(super) struct TrlRun {
    /// "trl 1.16.0, transformers …, torch …".
    pub(super) versions: String,
    /// The mean wall time of the timed steps (`mean.wall`).
    pub(super) step_s: f64,
    /// Each step's wall time, the warm-up ones included.
    pub(super) steps_s: Vec<f64>,
    /// The timed steps' mean phases (grpo_step.py's names).
    pub(super) phases: BTreeMap<String, f64>,
    pub(super) load_avg_1m_start: f64,
    pub(super) load_avg_1m_end: f64,
    pub(super) torch_threads: u64,
    pub(super) peak_rss_bytes: u64,
    /// The prompts: the run's built-in task's, or TRL's own arithmetic.
    pub(super) data: String,
}

impl TrlRun {
    /// "generate 4.10, ref_logps 0.60, …" in grpo_step.py's order.
    pub(super) fn phases_text(&self) -> String {
        const ORDER: [&str; 8] = [
            "generate",
            "ref_logps",
            "reward",
            "prepare_other",
            "forward",
            "backward",
            "optimizer",
            "other",
        ];
        (ORDER.iter())
            .filter_map(|k| Some(format!("{k} {:.2}", self.phases.get(*k)?)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `bench/trl` of the working directory, else of the repository this
/// binary was built in, where its environment is.
fn trl_dir() -> Result<PathBuf> {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/trl");
    let found = [PathBuf::from("bench/trl"), built]
        .into_iter()
        .find(|d| d.join(".venv/bin/python").is_file() && d.join("grpo_step.py").is_file());
    found.context(
        "--trl: bench/trl/.venv not found (bench/trl/setup.sh makes it, once; run from the \
         repository's root)",
    )
}

/// Runs `grpo_step.py` on `model` (its lines go to stderr) and reads its
/// last line.
pub(super) fn run(model: &Path, job: &Job) -> Result<TrlRun> {
    let dir = trl_dir()?;
    let model = std::path::absolute(model)?;
    eprintln!(
        "colo bench real: TRL's GRPOTrainer on the same job ({})",
        dir.join("grpo_step.py").display()
    );
    let out = Command::new(dir.join(".venv/bin/python"))
        .arg(dir.join("grpo_step.py"))
        .args(job.args(&model))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .context("starting bench/trl/.venv/bin/python")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    // Its table is shown; its last line, the JSON, is read.
    let last = match out.status.success() {
        true => lines.pop().unwrap_or(""),
        false => "",
    };
    for line in lines {
        eprintln!("{line}");
    }
    if !out.status.success() {
        bail!("grpo_step.py exited with {}", out.status);
    }
    let record: Value = serde_json::from_str(last)
        .with_context(|| format!("grpo_step.py's last line is not JSON: {last:?}"))?;
    parse(&record, job)
}

fn parse(r: &Value, job: &Job) -> Result<TrlRun> {
    let num = |v: &Value, what: &str| {
        v.as_f64()
            .with_context(|| format!("grpo_step.py: no {what}"))
    };
    let mean = r["mean"].as_object().context("grpo_step.py: no `mean`")?;
    let phases = (mean.iter())
        .filter(|(k, _)| *k != "wall")
        .map(|(k, v)| Ok((k.clone(), num(v, k)?)))
        .collect::<Result<_>>()?;
    let steps_s = (r["steps"].as_array().context("grpo_step.py: no `steps`")?)
        .iter()
        .map(|s| num(&s["wall"], "steps[].wall"))
        .collect::<Result<_>>()?;
    let v = &r["versions"];
    let versions = format!(
        "trl {}, transformers {}, torch {}",
        v["trl"].as_str().unwrap_or("?"),
        v["transformers"].as_str().unwrap_or("?"),
        v["torch"].as_str().unwrap_or("?")
    );
    Ok(TrlRun {
        versions,
        step_s: num(&mean["wall"], "mean.wall")?,
        steps_s,
        phases,
        load_avg_1m_start: num(&r["load_start"][0], "load_start")?,
        load_avg_1m_end: num(&r["load_end"][0], "load_end")?,
        torch_threads: r["torch_threads"].as_u64().unwrap_or(0),
        peak_rss_bytes: r["peak_rss_bytes"].as_u64().unwrap_or(0),
        data: match &job.data {
            Some(p) => format!("the run's built-in task ({})", p.display()),
            None => "TRL's own arithmetic prompts (the run's data are files)".into(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The flags name the run's job, and the final line's figures are read.
    #[test]
    fn the_job_is_the_runs_and_the_last_line_is_read() {
        let config = Config::builtin();
        let work = tempfile::tempdir().unwrap();
        let job = Job::of(&config, 4, work.path()).unwrap();
        let args = job.args(Path::new("/m"));
        let flag = |f: &str| {
            let i = args.iter().position(|a| a == f).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(flag("--model"), "/m");
        assert_eq!(flag("--n"), config.rollout.n.to_string());
        assert_eq!(flag("--steps"), "4");
        assert_eq!(flag("--timed-from"), "3");
        let data = PathBuf::from(flag("--data"));
        assert!(std::fs::read_to_string(data)
            .unwrap()
            .contains("\"answer\""));
        let line = json!({
            "versions": {"trl": "1.16.0", "transformers": "5.24.0", "torch": "2.11.0"},
            "steps": [{"wall": 40.0}, {"wall": 9.0}, {"wall": 10.0}, {"wall": 12.0}],
            "mean": {"wall": 11.0, "generate": 4.0, "backward": 3.5},
            "load_start": [0.5, 0.4, 0.3], "load_end": [1.5, 1.0, 0.5],
            "torch_threads": 2, "peak_rss_bytes": 123,
        });
        let run = parse(&line, &job).unwrap();
        assert_eq!((run.step_s, run.steps_s.len()), (11.0, 4));
        assert_eq!((run.load_avg_1m_start, run.load_avg_1m_end), (0.5, 1.5));
        assert_eq!(run.phases_text(), "generate 4.00, backward 3.50");
        assert!(run.versions.starts_with("trl 1.16.0"));
        assert!(parse(&json!({"mean": {}}), &job).is_err());
    }
}
