//! What `colo bench colocate` reports, and the table it prints: kept
//! apart from the measuring so that each reads on its own.

use colo_mem::fmt_bytes;
use serde::Serialize;

/// What one mode's run measured: the figures if it completed, colo-mem's
/// out-of-memory message if it did not.
#[derive(Serialize, Clone)]
pub(super) struct ModeResult {
    pub(super) mode: &'static str,
    /// The run completed within the capacity.
    pub(super) fits: bool,
    #[serde(flatten)]
    pub(super) oom: Option<Oom>,
    #[serde(flatten)]
    pub(super) measured: Option<Measured>,
}

#[derive(Serialize, Clone)]
pub(super) struct Oom {
    pub(super) error: String,
    /// The phase the error names (`wake_all`; `init_*` if the worker could
    /// not even be built).
    pub(super) oom_phase: Option<String>,
}

#[derive(Serialize, Clone)]
pub(super) struct Measured {
    /// Resident bytes of the trainer's parameters (the `train_params` tag,
    /// page-rounded): what multi-stage awake should save.
    pub(super) trainer_weight_bytes: u64,
    /// Largest resident bytes over a whole measured step.
    pub(super) peak_device_bytes: u64,
    /// Largest resident bytes over the train → rollout switch (measured steps).
    pub(super) wake_peak_bytes: u64,
    /// Resident bytes at the end of each stage of the last measured switch,
    /// from the state training left (the RFC's "5.8 → 36.6 → … GB").
    pub(super) wake_stages: Vec<Stage>,
    /// Medians over the measured steps, in seconds.
    pub(super) switch_to_rollout_s: f64,
    pub(super) switch_to_train_s: f64,
    pub(super) update_weights_s: f64,
    pub(super) step_s: f64,
}

#[derive(Serialize, Clone)]
pub(super) struct Stage {
    pub(super) phase: String,
    pub(super) resident_bytes: u64,
}

#[derive(Serialize)]
pub(super) struct ModelInfo {
    pub(super) parameters: usize,
    pub(super) hidden: usize,
    pub(super) layers: usize,
    /// The trainer's weights as allocated: 4 bytes per parameter in f32,
    /// 2 in bf16.
    pub(super) weight_bytes: u64,
    pub(super) dtype: String,
}

/// The three targets, as ratios of this run's measurements.
#[derive(Serialize)]
pub(super) struct Targets {
    /// sleep's wake peak − staged's wake peak.
    pub(super) saving_bytes: i64,
    /// staged's resident `train_params` bytes.
    pub(super) trainer_weight_bytes: u64,
    /// saving_bytes / trainer_weight_bytes (target ≥ 0.9).
    pub(super) saving_vs_trainer_weights: f64,
    pub(super) saving_met: bool,
    /// staged's / sleep's train → rollout switch time (target ≤ 1.2).
    pub(super) staged_over_sleep_switch: f64,
    pub(super) switch_met: bool,
    /// The mode with the slowest train → rollout switch (target: restart).
    pub(super) slowest_switch: String,
    pub(super) restart_slowest: bool,
}

#[derive(Serialize)]
pub(super) struct CapacityExperiment {
    /// Halfway between staged's whole-step peak and sleep's wake peak.
    pub(super) capacity_bytes: Option<u64>,
    /// Why no capacity was tried, if none was.
    pub(super) skipped: Option<String>,
    pub(super) max_kv_tokens: usize,
    pub(super) sleep: Option<ModeResult>,
    pub(super) staged: Option<ModeResult>,
    /// sleep ran out of memory and staged fitted: the RFC's story.
    pub(super) sleep_oom_staged_fits: bool,
}

#[derive(Serialize)]
pub(super) struct Report {
    pub(super) model: ModelInfo,
    pub(super) prompts: usize,
    pub(super) n: usize,
    pub(super) warmup_steps: usize,
    pub(super) measured_steps: usize,
    pub(super) max_kv_tokens: usize,
    pub(super) kv_cache_bytes: u64,
    pub(super) capacity: String,
    pub(super) modes: Vec<ModeResult>,
    pub(super) targets: Option<Targets>,
    pub(super) capacity_experiment: CapacityExperiment,
    pub(super) load_avg_1m: Option<f64>,
    pub(super) seconds: f64,
}

/// The figures of mode `name`, if it fitted.
pub(super) fn find<'a>(modes: &'a [ModeResult], name: &str) -> Option<&'a Measured> {
    modes.iter().find(|m| m.mode == name)?.measured.as_ref()
}

/// The targets, when all the modes they compare fitted.
pub(super) fn targets(modes: &[ModeResult]) -> Option<Targets> {
    let (sleep, staged) = (find(modes, "sleep")?, find(modes, "staged")?);
    let saving = sleep.wake_peak_bytes as i64 - staged.wake_peak_bytes as i64;
    let switch_ratio = staged.switch_to_rollout_s / sleep.switch_to_rollout_s;
    let slowest = modes
        .iter()
        .filter_map(|m| Some((m.measured.as_ref()?.switch_to_rollout_s, m.mode)))
        .max_by(|a, b| a.0.total_cmp(&b.0))?
        .1;
    let weight_bytes = staged.trainer_weight_bytes;
    let saving_vs = saving as f64 / weight_bytes as f64;
    Some(Targets {
        saving_bytes: saving,
        trainer_weight_bytes: weight_bytes,
        saving_vs_trainer_weights: saving_vs,
        saving_met: saving_vs >= 0.9,
        staged_over_sleep_switch: switch_ratio,
        switch_met: switch_ratio <= 1.2,
        slowest_switch: slowest.to_owned(),
        restart_slowest: slowest == "restart",
    })
}

/// The report as a Markdown table (the form BENCHMARKS.md records).
pub(super) fn print_table(r: &Report) {
    let m = &r.model;
    println!(
        "model {:.1}M parameters (hidden {}, {} layers, {} of {} weights); KV cache {} tokens = {}; \
         {} prompts × {} samples; {} warm-up + {} measured steps; capacity {}\n",
        m.parameters as f64 / 1e6,
        m.hidden,
        m.layers,
        fmt_bytes(m.weight_bytes),
        m.dtype,
        r.max_kv_tokens,
        fmt_bytes(r.kv_cache_bytes),
        r.prompts,
        r.n,
        r.warmup_steps,
        r.measured_steps,
        r.capacity
    );
    println!("| mode | fits | peak (step) | wake peak | train→rollout s | rollout→train s | step s | wake stages |");
    println!("|---|---|---|---|---|---|---|---|");
    for x in &r.modes {
        println!("| {} | {} | {} |", x.mode, x.fits, row(x));
    }
    for (x, o) in r.modes.iter().filter_map(|x| Some((x, x.oom.as_ref()?))) {
        println!("\n{}: {}", x.mode, o.error);
    }
    match &r.targets {
        Some(t) => println!(
            "\nsaving_vs_trainer_weights {:.3} ({} of {}; target ≥ 0.9: {}); staged/sleep train→rollout \
             {:.3} (target ≤ 1.2: {}); slowest switch {} (target restart: {})",
            t.saving_vs_trainer_weights,
            fmt_bytes(t.saving_bytes.max(0) as u64),
            fmt_bytes(t.trainer_weight_bytes),
            met(t.saving_met),
            t.staged_over_sleep_switch,
            met(t.switch_met),
            t.slowest_switch,
            met(t.restart_slowest)
        ),
        None => println!("\ntargets: not computed (sleep or staged did not fit)"),
    }
    let e = &r.capacity_experiment;
    if let Some(why) = &e.skipped {
        println!("capacity experiment skipped: {why}");
    }
    if let Some(c) = e.capacity_bytes {
        println!(
            "capacity experiment at {} (KV cache {} tokens):",
            fmt_bytes(c),
            e.max_kv_tokens
        );
        for x in [&e.sleep, &e.staged].into_iter().flatten() {
            let what = match (&x.oom, &x.measured) {
                (Some(o), _) => o.error.clone(),
                (None, Some(m)) => format!("peak {}", fmt_bytes(m.peak_device_bytes)),
                (None, None) => String::new(),
            };
            println!("  {}: fits {}: {what}", x.mode, x.fits);
        }
        println!(
            "  sleep runs out of memory and staged fits: {}",
            e.sleep_oom_staged_fits
        );
    }
    if let Some(l) = r.load_avg_1m {
        println!("load average (1 min) {l:.2}; {:.0} s in all", r.seconds);
    }
}

/// A mode's figures as table cells (dashes when it did not fit).
fn row(x: &ModeResult) -> String {
    let Some(m) = &x.measured else {
        return "- | - | - | - | - | -".into();
    };
    let stages: Vec<String> = m
        .wake_stages
        .iter()
        .map(|s| format!("{} {}", s.phase, fmt_bytes(s.resident_bytes)))
        .collect();
    format!(
        "{} | {} | {:.3} | {:.3} | {:.3} | {}",
        fmt_bytes(m.peak_device_bytes),
        fmt_bytes(m.wake_peak_bytes),
        m.switch_to_rollout_s,
        m.switch_to_train_s,
        m.step_s,
        stages.join(" → ")
    )
}

fn met(b: bool) -> &'static str {
    if b {
        "met"
    } else {
        "MISSED"
    }
}
