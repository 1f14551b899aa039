//! Every record a run writes and reads back (`metrics.jsonl`, the memory
//! timeline, the generation dumps, a checkpoint's `data_state.json` and
//! `trainer_state.json`) reads back whatever numbers it holds: the largest
//! and smallest floats, subnormals, both zeros. JSON has no NaN nor
//! infinity: serde_json writes them as `null`, and a metrics record reads
//! `null` back as NaN (a skipped update's gradient norm, the actor's
//! metrics in the critic's warmup). The other records hold no float that
//! can be either (times, counts, a learning rate, scores that the loop
//! checks are finite).

use std::collections::BTreeMap;

use colo_rl::checkpoints::DataState;
use colo_rl::generations::{self, Generation};
use colo_rl::metrics::{self, EvalRecord, MismatchRecord, Record, SourceEval, StepMetrics};
use colo_rl::{MetricsWriter, TimelineWriter};

mod common;

use common::TempDir;

/// Finite floats at the edges of f64 (and of f32, where scores live).
const EXTREMES: [f64; 14] = [
    1e300,
    -1e300,
    -1e-300,
    0.0,
    -0.0,
    f64::MAX,
    f64::MIN,
    f64::MIN_POSITIVE,
    5e-324,                     // the smallest subnormal
    2.225_073_858_507_201e-308, // the largest subnormal
    f64::EPSILON,
    f32::MAX as f64,
    f32::MIN_POSITIVE as f64,
    0.1,
];

const NON_FINITE: [f64; 3] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// A step record with every float set to `v`.
fn step_with(step: usize, v: f64) -> StepMetrics {
    StepMetrics {
        step,
        epoch: 1,
        num_gen_batches: Some(2),
        timing_step: v,
        timing_gen: v,
        timing_update_weights: v,
        timing_switch_to_rollout: v,
        timing_switch_to_train: v,
        timing_reward: v,
        timing_old_log_prob: v,
        timing_ref: v,
        timing_adv: v,
        timing_update_actor: v,
        pg_loss: v,
        pg_clipfrac: v,
        ppo_kl: v,
        entropy: v,
        grad_norm: v,
        lr: v,
        kl_loss: Some(v),
        score_mean: v,
        score_max: v,
        score_min: v,
        rewards_mean: v,
        advantages_mean: v,
        vf_loss: Some(v),
        vf_clipfrac: Some(v),
        vpred_mean: Some(v),
        response_length_mean: v,
        response_length_max: v,
        response_length_clip_ratio: v,
        throughput: v,
        peak_device_bytes: u64::MAX,
        peak_allocated_bytes: 1,
        reshard_sent_bytes: Some(u64::MAX),
        reshard_recv_bytes: Some(u64::MAX - 1),
        shard_collectives_s: Some(v),
        reward_failures: 3,
        reward_extra: [("acc".to_owned(), v), ("len".to_owned(), v)].into(),
        mismatch: Some(MismatchRecord {
            mean_abs_diff: v,
            max_abs_diff: v,
            kl: v,
            k3_kl: v,
            training_ppl: v,
            rollout_ppl: v,
            ppl_ratio: v,
            chi2_token: v,
        }),
    }
}

/// An evaluation record with every float set to `v`.
fn eval_with(step: usize, v: f64) -> EvalRecord {
    let extra: BTreeMap<String, f64> = [("acc".to_owned(), v)].into();
    EvalRecord {
        step,
        accuracy: v,
        score_mean: v,
        n_samples: 7,
        timing: v,
        by_source: [(
            "gsm8k".to_owned(),
            SourceEval {
                accuracy: v,
                score_mean: v,
                n_samples: 7,
                reward_extra: extra.clone(),
            },
        )]
        .into(),
        reward_extra: extra,
    }
}

/// The record as JSON text: the same text for the same bits (ryu's
/// shortest form tells -0.0 from 0.0), `null` for NaN and the infinities.
fn text(r: &Record) -> String {
    serde_json::to_string(r).unwrap()
}

#[test]
fn metrics_records_read_back_whatever_floats_they_hold() {
    let dir = TempDir::new("records-metrics");
    let path = dir.0.join("metrics.jsonl");
    let values: Vec<f64> = EXTREMES.iter().chain(&NON_FINITE).copied().collect();
    let mut written = Vec::new();
    let mut w = MetricsWriter::create(&path).unwrap();
    for (i, &v) in values.iter().enumerate() {
        let (s, e) = (step_with(i + 1, v), eval_with(i + 1, v));
        w.step(&s).unwrap();
        w.eval(&e).unwrap();
        written.push(Record::Step(Box::new(s)));
        written.push(Record::Eval(e));
    }
    drop(w);

    let back = metrics::read(&path).unwrap();
    assert_eq!(back.len(), written.len());
    for (w, b) in written.iter().zip(&back) {
        assert_eq!(text(w), text(b), "a record changed on the way back");
    }
    // Finite values come back bit for bit; the others as NaN.
    for (i, &v) in values.iter().enumerate() {
        let Record::Step(s) = &back[2 * i] else {
            panic!("record {} is not a step: {:?}", 2 * i, back[2 * i])
        };
        let Record::Eval(e) = &back[2 * i + 1] else {
            panic!("record {} is not an evaluation", 2 * i + 1)
        };
        let got = [
            s.timing_step,
            s.lr,
            s.grad_norm,
            s.kl_loss.expect("a key written as null is there"),
            s.vf_loss.expect("a key written as null is there"),
            s.reward_extra["acc"],
            s.mismatch.unwrap().chi2_token,
            s.throughput,
            e.accuracy,
            e.timing,
            e.reward_extra["acc"],
            e.by_source["gsm8k"].score_mean,
            e.by_source["gsm8k"].reward_extra["acc"],
        ];
        for g in got {
            match v.is_finite() {
                true => assert_eq!(g.to_bits(), v.to_bits(), "{v:e} read back as {g:e}"),
                false => assert!(g.is_nan(), "{v} read back as {g}"),
            }
        }
        assert_eq!(s.peak_device_bytes, u64::MAX);
    }

    // `--resume` reads every line too, and keeps the records up to a step.
    assert_eq!(metrics::truncate_after(&path, values.len()).unwrap(), 0);
    let keep = EXTREMES.len();
    assert_eq!(
        metrics::truncate_after(&path, keep).unwrap(),
        2 * NON_FINITE.len()
    );
    let kept = metrics::read(&path).unwrap();
    assert_eq!(kept.len(), 2 * keep);
    for (w, b) in written.iter().zip(&kept) {
        assert_eq!(text(w), text(b));
    }
}

#[test]
fn timeline_events_read_back_at_the_edges_of_f64() {
    let dir = TempDir::new("records-timeline");
    let path = dir.0.join("timeline.jsonl");
    // Times are never NaN nor infinite (they are measured durations).
    let events: Vec<colo_mem::Event> = (EXTREMES.iter().enumerate())
        .map(|(i, &v)| colo_mem::Event {
            t_s: v,
            step: i as u64,
            phase: "rollout".into(),
            kind: colo_mem::EventKind::Pause,
            tags: vec!["kv_cache".into()],
            duration_s: v,
            resident_bytes: u64::MAX,
            per_tag: [("kv_cache".to_owned(), u64::MAX)].into(),
            untagged_bytes: 0,
        })
        .collect();
    let mut bytes = Vec::new();
    colo_mem::timeline_jsonl(&events, &mut bytes).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let back = colo_mem::read_timeline(&path).unwrap();
    assert_eq!(back.len(), events.len());
    for (w, b) in events.iter().zip(&back) {
        assert_eq!(
            w.t_s.to_bits(),
            b.t_s.to_bits(),
            "{:e} → {:e}",
            w.t_s,
            b.t_s
        );
        assert_eq!(w.duration_s.to_bits(), b.duration_s.to_bits());
        assert_eq!((w.step, &w.per_tag), (b.step, &b.per_tag));
    }
    // A resume reads the file and keeps the events up to its step.
    let w = TimelineWriter::resume(&path, 3).unwrap();
    assert_eq!(w.read().unwrap(), events[..4].to_vec());
}

#[test]
fn generation_dumps_hold_the_scores_as_written() {
    let dir = TempDir::new("records-generations");
    let rows: Vec<Generation> = (EXTREMES.iter())
        .map(|&v| Generation {
            input: "q",
            output: "a",
            gts: "1",
            score: v,
            step: 1,
            extra: Generation::extras([("acc", v)]),
        })
        .collect();
    let path = generations::write(&dir.0, 1, &rows).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = (text.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), EXTREMES.len());
    for (v, line) in EXTREMES.iter().zip(&lines) {
        for key in ["score", "acc"] {
            let got = line[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{key} in {line}"));
            assert_eq!(got.to_bits(), v.to_bits(), "{key}: {v:e} → {got:e}");
        }
    }
}

#[test]
fn checkpoint_states_read_back() {
    let dir = TempDir::new("records-states");
    for gen_batches in [0, 1, usize::MAX] {
        let s = DataState {
            gen_batches,
            gen_batch_size: 1,
        };
        s.write(&dir.0).unwrap();
        assert_eq!(DataState::read(&dir.0).unwrap(), Some(s));
    }
    // `trainer_state.json` as colo-train writes it (pretty JSON); its
    // learning rate is a finite number (the config's range, scheduled).
    for v in EXTREMES {
        let state = colo_train::checkpoint::TrainerState {
            format: "colo-train/1".into(),
            optimizer_steps: u64::MAX,
            global_step: Some(3),
            next_lr: v,
        };
        let path = dir.0.join("trainer_state.json");
        std::fs::write(&path, serde_json::to_string_pretty(&state).unwrap()).unwrap();
        let back = colo_train::checkpoint::read_state(&dir.0).unwrap();
        assert_eq!(back.next_lr.to_bits(), v.to_bits(), "{v:e}");
        assert_eq!(back, state);
    }
}
