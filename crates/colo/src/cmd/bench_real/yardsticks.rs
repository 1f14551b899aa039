//! Issue 36's speed yardsticks (item 4), computed from the run's
//! `metrics.jsonl`, the model's shape and what [`super::probes`] measured
//! in the same process:
//!
//! - **Training FLOP/s against matmul FLOP/s.** The FLOPs are model FLOPs
//!   as PaLM's appendix B counts them (verl's and TRL's FLOP counters
//!   count the same): per token, 6·N for the forward and backward of the
//!   N parameters that multiply (every weight but the embedding table,
//!   the LM head once whether tied or not) plus 12·L·A·S for attention
//!   (L layers, A = heads × head_dim, S the mean tokens of a sample: the
//!   full S×S score and value products, as PaLM counts them, twice what a
//!   causal kernel needs). The reference pass is a forward: 2·N + 4·L·A·S
//!   a token. T, the tokens a step, is every sample's prompt and response
//!   (`perf/throughput` × `timing_s/step`, which the run computes from
//!   those lengths), mean over the timed steps; the update counts them
//!   `actor.ppo_epochs` times. colo's own passes compute fewer than these
//!   FLOPs (a GRPO group's shared prompt once per micro-batch where its
//!   rows share it, the LM head over the response columns only), so the
//!   FLOP/s are model-FLOPs utilisation, comparable across frameworks,
//!   not the hardware's count. Each pass's FLOPs are over its mean time
//!   (`timing_s/update_actor`, `timing_s/ref`) and held against a bf16
//!   (the run's dtype) matrix product on the run's device.
//! - **Decode against the memory-bandwidth bound.** A decode step reads
//!   every weight that multiplies once: N × the dtype's bytes (the KV
//!   cache's reads come on top and are not in the bound). The bound is
//!   those bytes over the best copy bandwidth measured in this process;
//!   a copy reads and writes each byte, counted once, so the bound is the
//!   time to copy the weights, about twice the time to only read them.
//!
//! Issue 36's targets: update FLOP/s at least half the matmul's, decode
//! within 1.5× its bound.

use std::ops::RangeInclusive;

use colo_model::ModelConfig;
use serde::Serialize;
use serde_json::{Map, Value};

const GIB: f64 = (1u64 << 30) as f64;

/// What the FLOP count needs of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Shape {
    /// N: the parameters that multiply.
    pub(super) matmul_params: u64,
    pub(super) layers: u64,
    /// heads × head_dim.
    pub(super) attention_width: u64,
}

impl Shape {
    pub(super) fn of(cfg: &ModelConfig) -> Self {
        let embedding = (cfg.vocab_size * cfg.hidden_size) as u64;
        let all = cfg.num_parameters() as u64;
        // A tied head is the embedding table, counted once by
        // `num_parameters`: it multiplies as the head. An untied table
        // is only gathered from.
        let matmul_params = match cfg.tie_word_embeddings {
            true => all,
            false => all - embedding,
        };
        Shape {
            matmul_params,
            layers: cfg.num_layers as u64,
            attention_width: (cfg.num_heads * cfg.head_dim) as u64,
        }
    }

    /// FLOPs of one forward over `tokens` tokens in samples of `per_sample`.
    pub(super) fn forward_flops(&self, tokens: f64, per_sample: f64) -> f64 {
        let attention = 4.0 * (self.layers * self.attention_width) as f64 * per_sample;
        (2.0 * self.matmul_params as f64 + attention) * tokens
    }
}

/// The tokens of a step, from the run's records where it gave them.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(super) struct Tokens {
    /// T: prompt and response tokens of every sample of a step, mean over
    /// the timed steps.
    pub(super) per_step: f64,
    /// S = T / samples.
    pub(super) per_sample: f64,
    /// The response tokens of a sample (`response_length/mean`).
    pub(super) response_per_sample: f64,
    /// `metrics`: `perf/throughput` × `timing_s/step`; `job`: the most the
    /// job allows (`data.max_prompt_length + rollout.max_new_tokens` a
    /// sample), where the records have no throughput.
    pub(super) source: &'static str,
}

impl Tokens {
    /// From `records`' timed steps; `samples` a step; the job's longest
    /// sample and most new tokens where the records lack them.
    pub(super) fn of(
        records: &[Map<String, Value>],
        timed: RangeInclusive<usize>,
        samples: usize,
        (longest, max_new): (usize, usize),
    ) -> Self {
        let rows = &records[timed.start() - 1..*timed.end()];
        let each = |key: &str| -> Option<Vec<f64>> {
            rows.iter()
                .map(|r| r.get(key)?.as_f64().filter(|v| v.is_finite()))
                .collect()
        };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let samples = samples.max(1) as f64;
        let response = each("response_length/mean").map_or(max_new as f64, |v| mean(&v));
        match (each("perf/throughput"), each("timing_s/step")) {
            (Some(tp), Some(step)) if !rows.is_empty() => {
                let t: Vec<f64> = tp.iter().zip(&step).map(|(a, b)| a * b).collect();
                let per_step = mean(&t);
                Tokens {
                    per_step,
                    per_sample: per_step / samples,
                    response_per_sample: response,
                    source: "metrics",
                }
            }
            _ => Tokens {
                per_step: longest as f64 * samples,
                per_sample: longest as f64,
                response_per_sample: response,
                source: "job",
            },
        }
    }

    /// The prompt tokens of a sample: S less its response.
    pub(super) fn prompt_per_sample(&self) -> f64 {
        (self.per_sample - self.response_per_sample).max(1.0)
    }
}

/// The matrix product measured beside the run.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(super) struct Matmul {
    /// [m × k] @ [k × n]: a micro-batch's tokens × hidden, hidden ×
    /// intermediate (the MLP's up projection).
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) dtype: &'static str,
    /// On the CPU, the rows split over this many lanes of one thread, as
    /// the run's training passes split theirs; 1 on CUDA.
    pub(super) lanes: usize,
    /// Products per timing; the best timing of `timings` counts.
    pub(super) products: usize,
    pub(super) timings: usize,
    pub(super) flop_s: f64,
}

/// Training FLOP/s against matmul FLOP/s.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(super) struct FlopFigures {
    /// N.
    pub(super) matmul_parameters: u64,
    pub(super) tokens: Tokens,
    pub(super) ppo_epochs: usize,
    /// ppo_epochs × (6·N + 12·L·A·S) × T.
    pub(super) update_flops: f64,
    pub(super) update_s: f64,
    pub(super) update_flop_s: f64,
    /// (2·N + 4·L·A·S) × T; `None` where the run skipped the reference
    /// pass (its time under a millisecond).
    pub(super) ref_flops: Option<f64>,
    pub(super) ref_s: f64,
    pub(super) ref_flop_s: Option<f64>,
    pub(super) matmul: Matmul,
    /// update_flop_s / matmul.flop_s (issue 36: at least 0.5).
    pub(super) update_vs_matmul: f64,
    pub(super) ref_vs_matmul: Option<f64>,
}

impl FlopFigures {
    pub(super) fn of(
        shape: Shape,
        tokens: Tokens,
        ppo_epochs: usize,
        (update_s, ref_s): (f64, f64),
        matmul: Matmul,
    ) -> Self {
        let forward = shape.forward_flops(tokens.per_step, tokens.per_sample);
        let update_flops = 3.0 * forward * ppo_epochs as f64;
        let update_flop_s = update_flops / update_s;
        let ref_flops = (ref_s >= 1e-3).then_some(forward);
        let ref_flop_s = ref_flops.map(|f| f / ref_s);
        FlopFigures {
            matmul_parameters: shape.matmul_params,
            update_vs_matmul: update_flop_s / matmul.flop_s,
            ref_vs_matmul: ref_flop_s.map(|f| f / matmul.flop_s),
            tokens,
            ppo_epochs,
            update_flops,
            update_s,
            update_flop_s,
            ref_flops,
            ref_s,
            ref_flop_s,
            matmul,
        }
    }
}

/// A copy's bandwidth, measured in this process.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(super) struct Copy {
    /// What was copied how: "single-thread memcpy", "2-thread copy",
    /// "device-to-device copy".
    pub(super) what: String,
    pub(super) bytes: u64,
    pub(super) gib_s: f64,
}

/// What [`super::probes::decode`] timed.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(super) struct DecodeRun {
    /// Sequences decoded together: the job's samples of a step (at most
    /// `rollout.max_num_seqs`).
    pub(super) rows: usize,
    /// Their prompts' tokens (synthetic ids, as long as the run's mean
    /// prompt).
    pub(super) prompt_tokens: usize,
    /// Engine steps that only decoded (no prefill in them) with every row
    /// running: the ones timed.
    pub(super) steps: usize,
    pub(super) step_s: f64,
    pub(super) step_min_s: f64,
    pub(super) cuda_graphs: usize,
    pub(super) preemptions: u64,
}

/// Decode against the memory-bandwidth bound.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub(super) struct DecodeFigures {
    #[serde(flatten)]
    pub(super) run: DecodeRun,
    /// N × the dtype's bytes: the weights a decode step reads.
    pub(super) weight_bytes_read: u64,
    /// The copies measured; the bound uses the fastest.
    pub(super) copies: Vec<Copy>,
    pub(super) bandwidth_gib_s: f64,
    pub(super) bound_s: f64,
    /// step_s / bound_s (issue 36: at most 1.5).
    pub(super) vs_bound: f64,
}

impl DecodeFigures {
    pub(super) fn of(run: DecodeRun, weight_bytes_read: u64, copies: Vec<Copy>) -> Self {
        let bandwidth_gib_s = copies.iter().map(|c| c.gib_s).fold(0.0, f64::max);
        let bound_s = weight_bytes_read as f64 / GIB / bandwidth_gib_s;
        DecodeFigures {
            vs_bound: run.step_s / bound_s,
            run,
            weight_bytes_read,
            copies,
            bandwidth_gib_s,
            bound_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen05() -> ModelConfig {
        ModelConfig {
            arch: colo_model::Arch::Qwen2,
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_layers: 24,
            num_heads: 14,
            num_kv_heads: 2,
            head_dim: 64,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            rope_llama3: None,
            max_position_embeddings: 32_768,
            tie_word_embeddings: true,
            qkv_bias: true,
            o_bias: false,
            bos_token_id: None,
            eos_token_ids: vec![],
            pad_token_id: None,
        }
    }

    /// A tied head multiplies as the head and is counted once; an untied
    /// embedding table is only gathered from and is not counted.
    #[test]
    fn the_multiplying_parameters_count_the_head_once() {
        let tied = qwen05();
        assert_eq!(Shape::of(&tied).matmul_params, 494_032_768);
        let untied = ModelConfig {
            tie_word_embeddings: false,
            ..qwen05()
        };
        assert_eq!(
            Shape::of(&untied).matmul_params,
            494_032_768,
            "the untied head adds what the table no longer counts"
        );
        let s = Shape::of(&tied);
        assert_eq!((s.layers, s.attention_width), (24, 896));
        // 2·N·T + 4·L·A·S·T at T = 10, S = 5.
        let f = s.forward_flops(10.0, 5.0);
        assert_eq!(f, (2.0 * 494_032_768.0 + 4.0 * 24.0 * 896.0 * 5.0) * 10.0);
    }

    fn record(throughput: f64, step: f64, response: f64) -> Map<String, Value> {
        json!({"perf/throughput": throughput, "timing_s/step": step,
               "response_length/mean": response})
        .as_object()
        .unwrap()
        .clone()
    }

    /// T is the throughput times the step over the timed steps only, and
    /// the job's longest sample stands in where the records have none.
    #[test]
    fn tokens_come_from_the_timed_steps_records() {
        let records = [
            record(1.0, 1.0, 9.0),
            record(100.0, 8.0, 16.0),
            record(50.0, 20.0, 14.0),
        ];
        let t = Tokens::of(&records, 2..=3, 16, (80, 16));
        assert_eq!((t.per_step, t.per_sample), (900.0, 56.25));
        assert_eq!(t.response_per_sample, 15.0);
        assert_eq!(t.prompt_per_sample(), 41.25);
        assert_eq!(t.source, "metrics");
        let bare = [Map::new(), Map::new(), Map::new()];
        let t = Tokens::of(&bare, 3..=3, 16, (80, 16));
        assert_eq!((t.per_step, t.per_sample, t.source), (1280.0, 80.0, "job"));
    }

    fn matmul(flop_s: f64) -> Matmul {
        Matmul {
            m: 256,
            k: 896,
            n: 4864,
            dtype: "bf16",
            lanes: 2,
            products: 10,
            timings: 5,
            flop_s,
        }
    }

    /// The update is three forwards a PPO epoch; a skipped reference has
    /// no FLOP/s; the ratios are their parts'.
    #[test]
    fn the_update_is_three_forwards_an_epoch() {
        let shape = Shape {
            matmul_params: 1000,
            layers: 2,
            attention_width: 10,
        };
        let tokens = Tokens {
            per_step: 100.0,
            per_sample: 25.0,
            response_per_sample: 10.0,
            source: "metrics",
        };
        let f = FlopFigures::of(shape, tokens.clone(), 2, (4.0, 0.5), matmul(1e6));
        let forward = (2.0 * 1000.0 + 4.0 * 2.0 * 10.0 * 25.0) * 100.0;
        assert_eq!(f.update_flops, 6.0 * forward);
        assert_eq!(f.update_flop_s, 6.0 * forward / 4.0);
        assert_eq!(f.update_vs_matmul, f.update_flop_s / 1e6);
        assert_eq!(f.ref_flop_s, Some(forward / 0.5));
        assert_eq!(f.ref_vs_matmul, Some(forward / 0.5 / 1e6));
        let skipped = FlopFigures::of(shape, tokens, 1, (4.0, 1e-5), matmul(1e6));
        assert_eq!((skipped.ref_flops, skipped.ref_vs_matmul), (None, None));
    }

    /// The bound is the bytes over the fastest copy.
    #[test]
    fn the_bound_uses_the_fastest_copy() {
        let run = DecodeRun {
            rows: 16,
            prompt_tokens: 40,
            steps: 10,
            step_s: 0.3,
            step_min_s: 0.25,
            cuda_graphs: 0,
            preemptions: 0,
        };
        let copy = |gib_s| Copy {
            what: "copy".into(),
            bytes: 1 << 30,
            gib_s,
        };
        let d = DecodeFigures::of(run, 2 << 30, vec![copy(10.0), copy(20.0)]);
        assert_eq!(d.bandwidth_gib_s, 20.0);
        assert_eq!(d.bound_s, 0.1);
        assert!((d.vs_bound - 3.0).abs() < 1e-12, "{}", d.vs_bound);
    }
}
