//! `colo train`: colocated GRPO/PPO. With no arguments it runs the built-in
//! task (arithmetic, a 0.8M-parameter model from its committed SFT
//! checkpoint, exact-match reward); `--config run.toml` runs a user's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use colo_rl::config::OffloadPolicy;
use colo_rl::Config;

#[derive(clap::Args)]
pub struct Args {
    /// The run's TOML file (verl-like names; every key has a default, and
    /// the defaults are the built-in run). With `--resume` and no
    /// `--config`, the run directory's `config.toml`: the run as recorded.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The run directory (default: the config's `trainer.out_dir`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the newest complete checkpoint in the run directory.
    #[arg(long)]
    resume: bool,
    /// Run even when colo-plan predicts that the run's peak device memory
    /// exceeds `memory.capacity` (by default such a run is refused before
    /// anything is loaded, with the plan's phase table).
    #[arg(long)]
    no_plan_check: bool,
    /// Print the resolved configuration (the defaults, or `--config`'s file
    /// with the defaults filled in) as TOML with a comment per key, and exit.
    #[arg(long)]
    print_config: bool,
}

pub fn run(a: Args) -> Result<()> {
    let (mut config, config_path, recorded) = read_config(&a)?;
    if a.print_config {
        print!("{}", config.to_toml()?);
        return Ok(());
    }
    let resume = a.resume || config.trainer.resume;
    let out = run_dir(&a, &config, resume)?;
    // The summary names the directory the run writes to, `--out` included.
    config.trainer.out_dir = Some(out.clone());
    eprintln!("{}", config.summary());
    eprintln!("run directory: {}", out.display());
    if let Some(path) = &recorded {
        eprintln!("configuration: {} (the run's record)", path.display());
    }
    if a.no_plan_check {
        eprintln!("plan check: off (--no-plan-check)");
    } else if config.trainer.val_only {
        eprintln!("plan check: none (trainer.val_only: nothing is trained)");
    } else {
        plan_check(&config)?;
    }
    if config.cluster.workers() > 1 {
        let path = config_path
            .as_deref()
            .expect("[cluster] comes from a config file");
        return match super::cluster::run(path, &config, &out, resume)? {
            // The controller said after which step, and how to resume.
            true => Err(Stopped(String::new()).into()),
            false => Ok(()),
        };
    }
    let stop = colo_rl::step::Stop::new();
    stop_on_signals(&stop)?;
    let s = match colo_rl::step::run_until(&config, &out, resume, &stop) {
        // A run that could not stop cleanly at the request (a dynamic
        // sampling step still drawing batches) still ends as interrupted.
        Err(e) if stop.requested() => return Err(Stopped(format!("colo train: {e}")).into()),
        r => r.context("colo train")?,
    };
    report(&a, &config, &s)
}

/// The run's config, the file it came from, and that file when it is the
/// run directory's record (`--resume` without `--config`).
fn read_config(a: &Args) -> Result<(Config, Option<PathBuf>, Option<PathBuf>)> {
    // `--resume` without `--config` continues the run as its directory
    // recorded it, not the built-in job (whose config replaced the record
    // and then failed to load the run's checkpoint).
    let recorded = match (&a.config, a.resume) {
        (None, true) => {
            let dir = (a.out.clone()).unwrap_or_else(|| colo_rl::config::DEFAULT_OUT_DIR.into());
            Some(dir.join(colo_rl::run_config::FILE)).filter(|p| p.is_file())
        }
        _ => None,
    };
    let config_path = a.config.clone().or(recorded.clone());
    let config = match (&config_path, &recorded) {
        (Some(path), Some(_)) => Config::from_file(path).with_context(|| {
            format!(
                "colo train --resume: {} is the run's recorded configuration, which --resume \
                 without --config continues; it does not read (--config names the run's \
                 configuration instead)",
                path.display()
            )
        })?,
        (Some(path), None) => Config::from_file(path)?,
        (None, _) => Config::builtin(),
    };
    Ok((config, config_path, recorded))
}

/// The run directory: `--out`, else the config's. A run into a directory
/// the user named refuses to overwrite an earlier run there (colo-rl); the
/// default directory is numbered instead, so that `colo train` run again
/// runs again.
fn run_dir(a: &Args, config: &Config, resume: bool) -> Result<PathBuf> {
    let out = a.out.clone().unwrap_or_else(|| config.out_dir().to_owned());
    if a.out.is_some() || out != Path::new(colo_rl::config::DEFAULT_OUT_DIR) || resume {
        return Ok(out);
    }
    let free = colo_rl::checkpoints::next_free_dir(&out)?;
    if free != out {
        eprintln!(
            "{} holds an earlier run: this one writes into {} (--resume continues {0}; --out names the directory)",
            out.display(),
            free.display()
        );
    }
    Ok(free)
}

/// What the run did, on stdout; a run stopped before its last step is an
/// error that says how to continue it.
fn report(a: &Args, config: &Config, s: &colo_rl::step::RunSummary) -> Result<()> {
    if s.steps < s.total_steps {
        let again = match &a.config {
            Some(path) => format!("--config {} ", path.display()),
            None => String::new(),
        };
        return Err(Stopped(format!(
            "colo train: stopped at your request after step {} of {}; the run directory {} has a \
             checkpoint of that step, and `colo train {again}--out {2} --resume` continues from it",
            s.steps,
            s.total_steps,
            s.run_dir.display(),
        ))
        .into());
    }
    let pct = |a: Option<f64>| a.map_or("-".to_string(), |a| format!("{:.1}%", 100.0 * a));
    let failures = failures_text(s.reward_failures, &config.reward);
    if config.trainer.val_only {
        println!(
            "done: evaluated the starting model, nothing trained (trainer.val_only); held-out \
             accuracy {}{}{failures}",
            pct(s.last_accuracy),
            by_source(&s.last_accuracy_by_source)
        );
        println!("wrote {}/metrics.jsonl", s.run_dir.display());
        return Ok(());
    }
    if s.resumed_from == Some(s.total_steps) {
        // (The notes on stderr said so; nothing was written.)
        println!(
            "done: nothing to do, the run in {} is complete ({} of {} steps)",
            s.run_dir.display(),
            s.steps,
            s.total_steps
        );
        return Ok(());
    }
    let accuracy = match config.evaluates() {
        true => format!(
            "held-out accuracy {} -> {}{}",
            pct(s.first_accuracy),
            pct(s.last_accuracy),
            by_source(&s.last_accuracy_by_source)
        ),
        false => "no held-out set".to_owned(),
    };
    println!(
        "done: {} step{}; {accuracy}{failures}; peak device memory {}",
        s.steps,
        if s.steps == 1 { "" } else { "s" },
        peak_text(s.peak_device_bytes, s.peak_allocated_bytes)
    );
    println!("wrote {}", wrote(&s.run_dir, config).join(", "));
    Ok(())
}

/// "; 16 reward failures (scored reward.default_score = 0)" when any
/// sample's reward failed and got the default, else nothing.
fn failures_text(n: u64, reward: &colo_rl::RewardSpec) -> String {
    use colo_rl::RewardSpec::{External, Python};
    let default = match reward {
        External { default_score, .. } | Python { default_score, .. } => *default_score,
        _ => None,
    };
    let scored = match default {
        Some(d) => format!(" (scored reward.default_score = {d})"),
        None => " (scored their default_score)".to_owned(),
    };
    match n {
        0 => String::new(),
        1 => format!("; 1 reward failure{scored}"),
        n => format!("; {n} reward failures{scored}"),
    }
}

/// "37.2 MiB (30.1 MiB allocated, the rest cached blocks)", or the peak
/// alone when no cached block was mapped at it (or records of an earlier
/// version did not count the allocated bytes).
fn peak_text(device: u64, allocated: u64) -> String {
    let fmt = colo_mem::fmt_bytes;
    match allocated {
        a if a == 0 || a >= device => fmt(device),
        a => format!(
            "{} ({} allocated, the rest cached blocks)",
            fmt(device),
            fmt(a)
        ),
    }
}

/// What the run wrote into `dir`, as the closing line names it: the
/// records, the pictures (each as `name.{svg,png}`), the checkpoints, the
/// resolved configuration and the generation dumps, those that are there.
fn wrote(dir: &Path, config: &Config) -> Vec<String> {
    let d = dir.display();
    let mut files = Vec::new();
    for name in ["metrics.jsonl", "timeline.jsonl"] {
        if dir.join(name).is_file() {
            files.push(format!("{d}/{name}"));
        }
    }
    for picture in ["memory_timeline", "memory_step", "reward_curve"] {
        if dir.join(format!("{picture}.svg")).is_file() {
            files.push(format!("{d}/{picture}.{{svg,png}}"));
        }
    }
    for (name, shown) in [
        ("checkpoints", "checkpoints/"),
        ("config.toml", "config.toml"),
    ] {
        if dir.join(name).exists() {
            files.push(format!("{d}/{shown}"));
        }
    }
    // A relative dump directory is in the run directory.
    let t = &config.trainer;
    for (dump, what) in [
        (&t.rollout_data_dir, "every step's samples"),
        (&t.validation_data_dir, "every evaluation's"),
    ] {
        if let Some(path) = dump.as_ref().map(|p| dir.join(p)).filter(|p| p.is_dir()) {
            files.push(format!("{}/ ({what})", path.display()));
        }
    }
    files
}

/// A run stopped early at the user's request (Ctrl-C, SIGTERM), with a
/// checkpoint to resume from: `colo` says so and exits with status 130, as
/// a shell reports an interrupted command. Empty when the distributed
/// run's controller has said it.
#[derive(Debug)]
pub struct Stopped(String);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stopped {}

/// On the first Ctrl-C (or SIGTERM, SIGHUP: a scheduler's notice) the run
/// stops after the step under way and saves a checkpoint of it; on the
/// second, at once, losing that step (the checkpoints already written are
/// complete: each is written aside and renamed into place).
fn stop_on_signals(stop: &colo_rl::step::Stop) -> Result<()> {
    let stop = stop.clone();
    ctrlc::set_handler(move || {
        if stop.requested() {
            eprintln!("\ncolo train: stopped now; {}", stop.stopped_now());
            colo_mem::os::exit_now(130);
        }
        stop.request();
        eprintln!(
            "\ncolo train: stopping after the step under way, with a checkpoint \
             (interrupt again to stop at once)"
        );
    })
    .context("colo train: installing the Ctrl-C handler")
}

/// " (by data_source: a 40.0%, b 12.5%)" where the held-out rows name more
/// than one source (verl's `val-core/{data_source}/…`), else nothing.
fn by_source(accuracy: &std::collections::BTreeMap<String, f64>) -> String {
    if accuracy.len() < 2 {
        return String::new();
    }
    let parts: Vec<String> = (accuracy.iter())
        .map(|(source, a)| format!("{source} {:.1}%", 100.0 * a))
        .collect();
    format!(" (by data_source: {})", parts.join(", "))
}

/// Predicts the run's peak device memory with colo-plan, as `colo plan
/// --config` does (within 10% of what runs measure; a data-parallel run's
/// per worker, its trainer sharded or not), and refuses a run that
/// cannot fit `memory.capacity` with the plan's margin (a tenth of the
/// activations, the terms fitted to runs), before anything is loaded: the
/// phase table says which phase overflows and by what. A capacity it
/// accepts is one the run does not run out of (`plan_vs_run` runs issue 36's
/// job at exactly the peak plus the margin).
fn plan_check(config: &Config) -> Result<()> {
    use colo_plan::memory::estimate;
    use colo_plan::PlanError;
    let fmt = colo_mem::fmt_bytes;
    // A run the planner does not model (restart mode) is not checked.
    if config.memory.colocation == colo_rl::config::Colocation::Restart {
        eprintln!(
            "plan check: skipped (colocation `restart` is not modelled by colo plan: the \
             engine is rebuilt from disk each step)"
        );
        return Ok(());
    }
    // What the planner cannot read (the model's config, its tokenizer, the
    // data) the run cannot either: the error is said once, here.
    let run = super::plan_config::from_config(config).context("colo train")?;
    let capacity = run.capacity;
    let device = match run.workers {
        1 => "its device",
        _ => "a worker's device",
    };
    let shard = match (run.workers, run.sharded) {
        (1, _) | (_, true) => "",
        _ => ", shard the trainer over the workers ([cluster] sharding = \"full\")",
    };
    let refuse = |why: String| {
        anyhow::anyhow!(
            "colo train: the run cannot fit {device}: {why}. Lower the batch or KV-cache \
             sizes, offload more{shard}, or raise memory.capacity; `--no-plan-check` runs it anyway"
        )
    };
    let report = run
        .input
        .validate()
        .and_then(|plan| estimate(&plan))
        .map_err(|e| {
            // The run's key for the planner's name of it.
            let e = match e {
                PlanError::OutOfRange {
                    name: "kv_free_fraction",
                    value,
                    valid,
                } => PlanError::OutOfRange {
                    name: "rollout.mem_fraction",
                    value,
                    valid,
                },
                e => e,
            };
            refuse(format!(
                "with memory.capacity = {}, colo-plan: {e}",
                fmt(capacity)
            ))
        })?;
    // The engine's own refusal, said before anything starts.
    if let Some(why) = super::plan_config::kv_shortfall(config, &run, report.kv_tokens) {
        return Err(anyhow::anyhow!(
            "colo train: the KV cache cannot serve the run's rollouts: {why}; \
             `--no-plan-check` runs it anyway"
        ));
    }
    if report.fits {
        // The planner models the `always` choreography: the least the run
        // needs. `as_needed` keeps state and cached blocks resident while
        // there is room, so its measured peak is higher by design.
        let keeps_more = match config.memory.offload_policy {
            OffloadPolicy::AsNeeded => {
                "; offload_policy \"as_needed\" keeps more resident while there is room"
            }
            OffloadPolicy::Always => "",
        };
        eprintln!(
            "plan check: predicted peak {} {} ({}){} within the capacity {}{keeps_more}",
            fmt(report.peak_bytes),
            run.scope(),
            report.peak_phase,
            margin_text(report.margin_bytes),
            fmt(capacity)
        );
        return Ok(());
    }
    eprintln!(
        "colo-plan's prediction for this run, {} (longest prompt {} tokens, {} KV tokens):\n\n{}",
        run.scope(),
        run.max_prompt_tokens,
        report.kv_tokens,
        report.table()
    );
    Err(refuse(format!(
        "colo-plan predicts a peak of {} {} in phase `{}`{}, above memory.capacity = {}",
        fmt(report.peak_bytes),
        run.scope(),
        report.peak_phase,
        margin_text(report.margin_bytes),
        fmt(capacity)
    )))
}

/// " + margin M" where the plan has one.
fn margin_text(margin: u64) -> String {
    match margin {
        0 => String::new(),
        m => format!(" + margin {}", colo_mem::fmt_bytes(m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "the rest cached blocks" only when there is a rest.
    #[test]
    fn the_peak_names_cached_blocks_only_when_there_are_some() {
        let mib = 1 << 20;
        assert_eq!(
            peak_text(40 * mib, 30 * mib),
            "40.0 MiB (30.0 MiB allocated, the rest cached blocks)"
        );
        assert_eq!(peak_text(37 * mib, 37 * mib), "37.0 MiB");
        assert_eq!(
            peak_text(37 * mib, 0),
            "37.0 MiB",
            "records without the count"
        );
    }

    /// A capacity between the sharded and the replicated per-worker plan
    /// of a 2-worker run: the plan check refuses `sharding = "none"`
    /// (saying what sharding would do) and accepts `"full"`.
    #[test]
    fn the_plan_check_accepts_a_sharded_run_that_a_replica_cannot_fit() {
        let config = |sharding: &str, capacity: u64| {
            let text = format!(
                "[model]\nenable_gradient_checkpointing = true\n[rollout]\nmax_kv_tokens = 4096\n\
                 [memory]\ncapacity = {capacity}\n[cluster]\nworkers = 2\nsharding = \"{sharding}\"\n"
            );
            Config::from_toml(&text, Path::new("run.toml")).unwrap()
        };
        let need = |c: &Config| {
            let run = super::super::plan_config::from_config(c).unwrap();
            let r = colo_plan::memory::estimate(&run.input.validate().unwrap()).unwrap();
            r.peak_bytes + r.margin_bytes
        };
        let none = need(&config("none", 1 << 30));
        let full = need(&config("full", 1 << 30));
        assert!(full < none, "{full} {none}");
        let capacity = (full + none) / 2;
        let e = plan_check(&config("none", capacity))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot fit a worker's device") && e.contains("sharding = \"full\""),
            "{e}"
        );
        plan_check(&config("full", capacity)).unwrap();
    }

    /// Reward failures are said, with the score they got, only when there
    /// were any.
    #[test]
    fn reward_failures_are_said_when_there_are_some() {
        let spec = |text: &str| serde_json::from_str::<colo_rl::RewardSpec>(text).unwrap();
        let external = spec(r#"{"kind": "external", "command": ["x"], "default_score": -1.0}"#);
        assert_eq!(failures_text(0, &external), "");
        assert_eq!(
            failures_text(1, &external),
            "; 1 reward failure (scored reward.default_score = -1)"
        );
        assert_eq!(
            failures_text(16, &spec(r#"{"kind": "exact_match"}"#)),
            "; 16 reward failures (scored their default_score)"
        );
    }
}
