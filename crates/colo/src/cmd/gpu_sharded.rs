//! `colo gpu-check`'s sharded check: the built-in job with `[cluster]
//! sharding = "full"` on one device, so colo-train's sharded trainer runs
//! with one shard (its unit gathers and gradient reduce-scatters copies
//! through the Solo collective; `bench/gpu/run.sh` runs the same through
//! Ray with NCCL at world size 1): storage swaps into the
//! `gathered_params` tag, the staged checkpointed backward and AdamW on
//! the shards, on the device. Its first step must match the unsharded
//! actor's (the same data and seed) and every step must count its
//! collectives.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use colo_rl::config::{Device, OffloadPolicy, Sharding};

/// Steps each run takes.
const STEPS: usize = 3;

/// The built-in job for [`STEPS`] steps on `device`, `sharding` as given,
/// activation checkpointing on (what a sharded config resolves to: the
/// unsharded run then computes the same passes).
fn config(device: Device, sharding: Sharding) -> colo_rl::Config {
    let mut c = colo_rl::Config::builtin();
    c.trainer.device = device;
    c.trainer.total_steps = Some(STEPS);
    c.trainer.test_freq = -1;
    c.trainer.save_freq = -1;
    c.model.enable_gradient_checkpointing = true;
    c.memory.offload_policy = OffloadPolicy::Always;
    c.cluster.sharding = sharding;
    c
}

/// A step record's `actor/grad_norm`, `perf/reshard_sent_bytes` and
/// `timing_s/shard_collectives`.
type Step = (f64, Option<u64>, Option<f64>);

/// Each step record of the run in `run`.
fn steps(run: &Path) -> Result<Vec<Step>> {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut out = vec![];
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line)?;
        if let Some(g) = r["actor/grad_norm"].as_f64() {
            let sent = r["perf/reshard_sent_bytes"].as_u64();
            out.push((g, sent, r["timing_s/shard_collectives"].as_f64()));
        }
    }
    Ok(out)
}

/// Runs the sharded and the unsharded job into `out/{full,none}` and
/// compares them.
pub fn check(device: Device, out: &Path) -> Result<String> {
    let mut runs = vec![];
    for (name, sharding) in [("none", Sharding::None), ("full", Sharding::Full)] {
        let dir = out.join(name);
        colo_rl::step::run(&config(device, sharding), &dir, false)
            .with_context(|| format!("the built-in job with sharding = \"{name}\""))?;
        runs.push(steps(&dir)?);
    }
    let (whole, sharded) = (&runs[0], &runs[1]);
    ensure!(
        whole.len() == STEPS && sharded.len() == STEPS,
        "{} and {} step records, expected {STEPS} each",
        whole.len(),
        sharded.len()
    );
    for (step, (g, sent, spent)) in sharded.iter().enumerate() {
        ensure!(
            g.is_finite() && *g > 0.0,
            "step {}: grad norm {g}",
            step + 1
        );
        ensure!(
            *sent == Some(0) && spent.is_some_and(|s| s > 0.0),
            "step {}: the sharded actor's collectives were not counted (reshard {sent:?} \
             bytes, {spent:?} s)",
            step + 1
        );
    }
    let (a, b) = (whole[0].0, sharded[0].0);
    ensure!(
        (a - b).abs() <= 0.02 * a.abs(),
        "step 1: the sharded actor's grad norm {b} against the unsharded one's {a}"
    );
    let timeline = out.join("full").join("timeline.jsonl");
    let text =
        std::fs::read_to_string(&timeline).with_context(|| timeline.display().to_string())?;
    ensure!(
        text.contains("\"gathered_params\""),
        "no unit was gathered into the gathered_params tag ({})",
        timeline.display()
    );
    Ok(format!(
        "{STEPS} steps with one shard; step 1 grad norm {b:.5} against {a:.5} unsharded; \
         collectives counted every step; runs in {}",
        out.display()
    ))
}

#[cfg(test)]
mod tests {
    /// The check passes on the CPU, where the same sharded trainer runs.
    #[test]
    fn the_sharded_check_passes_on_the_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let said = super::check(colo_rl::config::Device::Cpu, dir.path()).unwrap();
        assert!(said.contains("3 steps with one shard"), "{said}");
    }
}
