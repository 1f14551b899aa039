//! The table `colo bench real` prints.

use std::fmt::Write;

use colo_mem::fmt_bytes;

use super::figures::PHASES;
use super::report::Report;

/// Issue 36's targets, printed beside the figures.
const SWITCHES_MAX_SHARE: f64 = 0.05;
const SYNC_MIN_VS_MEMCPY: f64 = 0.5;
const PLAN_MAX_ERROR: f64 = 0.10;
const TRL_MIN_SPEEDUP: f64 = 3.0;
const UPDATE_MIN_VS_MATMUL: f64 = 0.5;
const DECODE_MAX_VS_BOUND: f64 = 1.5;

impl Report {
    /// The report as the table `colo bench real` prints.
    pub(super) fn table(&self) -> String {
        let mut out = String::new();
        self.head(&mut out);
        self.phase_table(&mut out);
        self.sync_and_memory(&mut out);
        self.flop_lines(&mut out);
        self.decode_lines(&mut out);
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
             included); load average (1 min) {} at its start, {} at its end; the process's \
             resident memory after it: {}\n",
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
            c.rss_after_run_bytes.map_or("-".into(), fmt_bytes),
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
             bytes: parameters x {} bytes of {}, computed (the run does not count them); against a \
             {}, a buffer of that size, best of 3, {} the run\n",
            fmt_bytes(s.bytes),
            s.seconds,
            s.gib_s,
            s.memcpy_gib_s,
            s.vs_memcpy,
            s.bytes / self.model.parameters.max(1),
            self.model.dtype,
            s.memcpy,
            match self.job.device {
                "cpu" => "pages present, before",
                _ => "after",
            },
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

    fn flop_lines(&self, out: &mut String) {
        let f = &self.flops;
        let (t, m) = (&f.tokens, &f.matmul);
        let tf = |v: f64| format!("{}FLOP/s", si(v));
        let _ = writeln!(
            out,
            "training FLOP/s (model FLOPs: (6N + 12LAS) x T an update epoch, (2N + 4LAS) x T the \
             reference; N = {} multiplying parameters, T = {:.0} tokens a step ({}), S = {:.1} a \
             sample):",
            crate::cmd::init_model::thousands(f.matmul_parameters),
            t.per_step,
            match t.source {
                "metrics" => "perf/throughput x timing_s/step",
                _ => "the job's longest samples: no throughput in metrics.jsonl",
            },
            t.per_sample,
        );
        let _ = writeln!(
            out,
            "  actor update: {}FLOP ({} epoch(s)) in {:.3} s = {}",
            si(f.update_flops),
            f.ppo_epochs,
            f.update_s,
            tf(f.update_flop_s)
        );
        match (f.ref_flops, f.ref_flop_s) {
            (Some(flops), Some(rate)) => {
                let _ = writeln!(
                    out,
                    "  reference:    {}FLOP in {:.3} s = {}",
                    si(flops),
                    f.ref_s,
                    tf(rate)
                );
            }
            _ => out.push_str(
                "  reference:    skipped by the run
",
            ),
        }
        let _ = writeln!(
            out,
            "  {} matmul [{} x {}] @ [{} x {}] on {} lane(s): {} (best of {} timings of {} \
             products, after the run)",
            m.dtype,
            m.m,
            m.k,
            m.k,
            m.n,
            m.lanes,
            tf(m.flop_s),
            m.timings,
            m.products,
        );
        let _ = writeln!(
            out,
            "  update / matmul: {:.2} (issue 36: at least {UPDATE_MIN_VS_MATMUL}){}\n",
            f.update_vs_matmul,
            f.ref_vs_matmul
                .map_or(String::new(), |r| format!("; reference / matmul: {r:.2}")),
        );
    }

    fn decode_lines(&self, out: &mut String) {
        let d = &self.decode;
        let copies: Vec<String> = (d.copies.iter())
            .map(|c| format!("{} {:.2} GiB/s", c.what, c.gib_s))
            .collect();
        let _ = writeln!(
            out,
            "decode: {} rows after a prefill of {}-token prompts, {} decode-only steps timed \
             (Engine::step: forward, sampling, scheduling{}): mean {:.3} ms (min {:.3}){}\n  \
             bound: {} of {} weights read a step / {:.2} GiB/s (the fastest of: {}) = {:.3} ms\n  \
             decode / bound: {:.2} (issue 36: at most {DECODE_MAX_VS_BOUND})\n",
            d.run.rows,
            d.run.prompt_tokens,
            d.run.steps,
            match d.run.cuda_graphs {
                0 => String::new(),
                g => format!("; {g} CUDA graphs"),
            },
            1e3 * d.run.step_s,
            1e3 * d.run.step_min_s,
            match d.run.preemptions {
                0 => String::new(),
                p => format!(" ({p} preemptions)"),
            },
            fmt_bytes(d.weight_bytes_read),
            self.model.dtype,
            d.bandwidth_gib_s,
            copies.join(", "),
            1e3 * d.bound_s,
            d.vs_bound,
        );
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

/// `v` with an SI prefix and a space: "1.23 T", "45.6 G".
fn si(v: f64) -> String {
    let (scale, prefix) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|&(s, _)| v.abs() >= s)
        .unwrap_or((1.0, ""));
    format!("{:.3} {prefix}", v / scale)
}

#[cfg(test)]
mod tests {
    #[test]
    fn flops_are_printed_with_their_prefix() {
        assert_eq!(super::si(1.234e12), "1.234 T");
        assert_eq!(super::si(45.6e9), "45.600 G");
        assert_eq!(super::si(12.0), "12.000 ");
    }
}
