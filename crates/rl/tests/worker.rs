//! The hybrid worker on a real (tiny) checkpoint: every colocation mode
//! generates with the actor's current weights, tags are where each phase
//! needs them, and multi-stage awake lowers the peak by the trainer's
//! weight bytes.

use std::sync::Arc;

use colo_mem::{tags, Pool, PoolConfig, TagState};
use colo_rl::config::{Capacity, Colocation, MemoryConfig, OffloadPolicy};
use colo_rl::worker::{HybridWorker, Phase, WorkerSpec};
use colo_rollout::{Engine, EngineConfig, Request, SamplingParams};
use colo_train::{SeqBatch, TrainEngine, TrainerConfig};
use tch::{Device, Kind};

mod common;

use common::fixture;

fn memory(mode: Colocation, policy: OffloadPolicy) -> MemoryConfig {
    MemoryConfig {
        capacity: Capacity::Auto,
        colocation: mode,
        offload_train_param: true,
        offload_train_grad: true,
        offload_train_optimizer: true,
        offload_ref: true,
        offload_policy: policy,
    }
}

fn worker(mode: Colocation, scratch: &str) -> HybridWorker {
    worker_kv(mode, scratch, 512)
}

fn worker_kv(mode: Colocation, scratch: &str, kv_tokens: usize) -> HybridWorker {
    worker_in(mode, scratch, kv_tokens, Kind::Float)
}

/// The choreography tests run with `always`: every switch gives up all the
/// flags allow, whatever the room.
fn worker_in(mode: Colocation, scratch: &str, kv_tokens: usize, kind: Kind) -> HybridWorker {
    worker_on(
        u64::MAX,
        mode,
        scratch,
        kv_tokens,
        kind,
        OffloadPolicy::Always,
    )
}

fn worker_on(
    capacity: u64,
    mode: Colocation,
    scratch: &str,
    kv_tokens: usize,
    kind: Kind,
    policy: OffloadPolicy,
) -> HybridWorker {
    let pool = Pool::host(PoolConfig {
        capacity,
        ..PoolConfig::default()
    })
    .unwrap();
    let engine = EngineConfig {
        max_kv_tokens: Some(kv_tokens),
        ..EngineConfig::default()
    };
    let dir = std::env::temp_dir().join(format!("colo-worker-{}-{scratch}", std::process::id()));
    let trainer = TrainerConfig {
        optim: colo_train::OptimConfig {
            lr: 1e-2,
            ..Default::default()
        },
        kind,
        ..Default::default()
    };
    let spec = WorkerSpec {
        model_dir: fixture(),
        actor: trainer,
        critic: None,
        engine,
        memory: memory(mode, policy),
        reference: true,
        scratch: dir,
    };
    HybridWorker::new(pool, &spec, Default::default()).unwrap()
}

/// A staged worker with `as_needed` switches on the CPU in float32.
fn staged_as_needed(capacity: u64, name: &str, kv_tokens: usize) -> HybridWorker {
    worker_on(
        capacity,
        Colocation::Staged,
        name,
        kv_tokens,
        Kind::Float,
        OffloadPolicy::AsNeeded,
    )
}

/// The scratch directory a worker named `scratch` wrote (restart mode).
fn remove_scratch(scratch: &str) {
    let dir = std::env::temp_dir().join(format!("colo-worker-{}-{scratch}", std::process::id()));
    let _ = std::fs::remove_dir_all(dir);
}

fn greedy(prompts: &[Vec<u32>]) -> Vec<Request> {
    prompts
        .iter()
        .map(|p| Request::new(p.clone(), SamplingParams::greedy(8)))
        .collect()
}

fn tokens(out: Vec<colo_rollout::Result<colo_rollout::RequestOutput>>) -> Vec<Vec<u32>> {
    out.into_iter()
        .map(|o| o.unwrap().completions[0].tokens.clone())
        .collect()
}

/// What a fresh engine built from the actor's current weights generates.
fn reference_tokens(w: &HybridWorker, prompts: &[Vec<u32>], tag: &str) -> Vec<Vec<u32>> {
    let dir = std::env::temp_dir().join(format!("colo-worker-ref-{}-{tag}", std::process::id()));
    let actor = w.actor("save the model").unwrap();
    actor.model().unwrap().save_dir(&dir).unwrap();
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let cfg = EngineConfig {
        max_kv_tokens: Some(512),
        ..EngineConfig::default()
    };
    let kind = actor.model().unwrap().dtype();
    let mut e = Engine::from_dir_on(&dir, kind, Device::Cpu, pool, &cfg).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    tokens(e.generate(greedy(prompts)).unwrap())
}

#[test]
fn every_mode_generates_with_the_actors_current_weights() {
    let prompts = vec![vec![278, 28, 274, 272, 337], vec![54, 74, 71, 223, 83, 87]];
    for (i, mode) in [
        Colocation::Naive,
        Colocation::Restart,
        Colocation::Sleep,
        Colocation::Staged,
    ]
    .into_iter()
    .enumerate()
    {
        let mut w = worker(mode, &format!("gen{i}"));
        let before = reference_tokens(&w, &prompts, &format!("a{i}"));
        w.to_rollout().unwrap();
        assert_eq!(
            tokens(w.generate(greedy(&prompts)).unwrap()),
            before,
            "{mode:?}: first sync"
        );
        w.to_train().unwrap();

        // Train the actor hard on one sequence so its greedy output changes.
        let seqs = SeqBatch::from_prompt_response(&[(&prompts[0][..], &[7, 7, 7, 7, 7, 7][..])], 0)
            .unwrap();
        for _ in 0..20 {
            w.actor_mut("take an SFT step")
                .unwrap()
                .sft_step(&seqs)
                .unwrap();
        }
        let after = reference_tokens(&w, &prompts, &format!("b{i}"));
        assert_ne!(after, before, "the update should change greedy output");
        w.to_rollout().unwrap();
        assert_eq!(
            tokens(w.generate(greedy(&prompts)).unwrap()),
            after,
            "{mode:?}: sync after training"
        );
        w.to_train().unwrap();
        remove_scratch(&format!("gen{i}"));
    }
}

/// A bf16 actor's engine runs in bf16 (it once loaded the checkpoint in
/// float32 whatever the actor's kind), in the modes that keep it and in the
/// one that rebuilds it every step, and generates what a bf16 engine built
/// from the actor's weights does.
#[test]
fn a_bf16_actor_generates_in_bf16() {
    let prompts = vec![vec![278, 28, 274, 272, 337], vec![54, 74, 71, 223, 83, 87]];
    for (i, mode) in [Colocation::Staged, Colocation::Restart]
        .into_iter()
        .enumerate()
    {
        let mut w = worker_in(mode, &format!("bf16-{i}"), 512, Kind::BFloat16);
        let expected = reference_tokens(&w, &prompts, &format!("bf16-{i}"));
        w.to_rollout().unwrap();
        let engine = w.engine("read the model").unwrap();
        assert_eq!(engine.model().unwrap().dtype(), Kind::BFloat16, "{mode:?}");
        assert_eq!(
            tokens(w.generate(greedy(&prompts)).unwrap()),
            expected,
            "{mode:?}"
        );
        w.to_train().unwrap();
        remove_scratch(&format!("bf16-{i}"));
    }
}

/// `as_needed`: a switch gives up only what the engine needs the room for,
/// cheapest first, and the next `to_train` brings back exactly that. On a
/// roomy device nothing goes; a little tighter, only the training cache;
/// tighter still, the cache and the optimizer state, while the gradients
/// and the parameters stay.
#[test]
fn a_switch_gives_up_only_what_the_engine_needs_the_room_for() {
    let seqs =
        SeqBatch::from_prompt_response(&[(&[278, 28, 274][..], &[272, 337, 7][..])], 0).unwrap();
    let prompts = vec![vec![278, 28, 274, 272, 337]];
    let kv = 16384;
    let cached = |w: &HybridWorker| {
        let s = w.pool().stats();
        s.tags.iter().map(|t| t.cached_bytes).sum::<u64>()
    };
    let phases = |w: &HybridWorker| -> Vec<String> {
        w.pool().timeline().into_iter().map(|e| e.phase).collect()
    };
    let active = |w: &HybridWorker, t: &str| w.pool().tag_state(t) == Some(TagState::Active);
    // A step's worth of training state: the reference's pass, cached
    // activation blocks.
    let trained = |capacity: u64, name: &str| {
        let mut w = staged_as_needed(capacity, name, kv);
        w.ref_log_probs(&seqs, 4).unwrap();
        w.actor_mut("take an SFT step")
            .unwrap()
            .sft_step(&seqs)
            .unwrap();
        w
    };

    let mut w = trained(u64::MAX, "plan-roomy");
    assert!(
        !active(&w, tags::REF),
        "before a whole step has run, the reference goes after its pass whatever the room"
    );
    let stats = w.pool().stats();
    let (resident, kept) = (stats.resident_bytes, cached(&w));
    let opt = stats.tag(tags::OPTIMIZER).unwrap().resident_bytes;
    let engine: u64 = [tags::WEIGHTS, tags::KV_CACHE]
        .iter()
        .map(|t| stats.tag(t).unwrap().paused_bytes)
        .sum();
    assert!(kept > 0 && opt > 0, "cache {kept}, optimizer {opt}");
    w.to_rollout().unwrap();
    assert_eq!(cached(&w), kept);
    for t in [tags::TRAIN_PARAMS, tags::TRAIN_GRADS, tags::OPTIMIZER] {
        assert!(active(&w, t), "{t} went on a roomy device");
    }
    assert!(!phases(&w).iter().any(|p| p == "release_cache"));
    assert_eq!(tokens(w.generate(greedy(&prompts)).unwrap()).len(), 1);
    w.to_train().unwrap();
    assert!(!phases(&w).iter().any(|p| p == "reload_trainer"));

    // The engine fits once the cache is gone.
    let capacity = resident + engine - kept / 2;
    let mut w = trained(capacity, "plan-cache");
    w.to_rollout().unwrap();
    assert_eq!(cached(&w), 0);
    assert!(phases(&w).iter().any(|p| p == "release_cache"));
    assert!(active(&w, tags::OPTIMIZER) && active(&w, tags::TRAIN_PARAMS));
    assert_eq!(tokens(w.generate(greedy(&prompts)).unwrap()).len(), 1);
    w.to_train().unwrap();
    assert!(w.pool().stats().peak_resident_bytes <= capacity);

    // ... once the cache and the optimizer state are gone (the capacity
    // still above the training peak, which the roomy run's resident bytes
    // bound).
    assert!(
        engine >= kept + opt / 2,
        "engine {engine}, cache {kept}, optimizer {opt}"
    );
    let capacity = resident + engine - kept - opt / 2;
    let mut w = trained(capacity, "plan-optimizer");
    w.to_rollout().unwrap();
    assert_eq!(w.pool().tag_state(tags::OPTIMIZER), Some(TagState::Paused));
    for t in [tags::TRAIN_PARAMS, tags::TRAIN_GRADS] {
        assert!(
            active(&w, t),
            "{t} went, and only the optimizer state had to"
        );
    }
    assert_eq!(tokens(w.generate(greedy(&prompts)).unwrap()).len(), 1);
    w.to_train().unwrap();
    assert!(active(&w, tags::OPTIMIZER), "to_train brings it back");
    w.actor_mut("take an SFT step")
        .unwrap()
        .sft_step(&seqs)
        .unwrap();
    assert!(w.pool().stats().peak_resident_bytes <= capacity);
    for name in ["plan-roomy", "plan-cache", "plan-optimizer"] {
        remove_scratch(name);
    }
}

/// `as_needed` and the reference: it stays resident through the update
/// when a step at least as large has run and its allocated peak plus the
/// reference fits the capacity (no copy out and back every step: verl does
/// not offload its reference unless told); a larger batch than any so far,
/// or a peak without that room, sends it away after its pass as before;
/// and a kept reference is the first thing after the cache that a switch
/// gives up when the engine needs the room.
#[test]
fn an_as_needed_reference_stays_while_a_step_as_large_had_room_for_it() {
    let seqs =
        SeqBatch::from_prompt_response(&[(&[278, 28, 274][..], &[272, 337, 7][..])], 0).unwrap();
    let longer = SeqBatch::from_prompt_response(
        &[(&[278, 28, 274][..], &[272, 337, 7, 272, 337, 7][..])],
        0,
    )
    .unwrap();
    let state = |w: &HybridWorker, t: &str| w.pool().tag_state(t).unwrap();
    let tag = |w: &HybridWorker, t: &str| w.pool().stats().tag(t).unwrap().clone();
    // A step without generation: the reference's pass, then an update.
    let step = |w: &mut HybridWorker, n: u64| {
        w.begin_step(n);
        w.ref_log_probs(&seqs, 4).unwrap();
        w.actor_mut("take an SFT step")
            .unwrap()
            .sft_step(&seqs)
            .unwrap();
    };
    let make = staged_as_needed;

    // Roomy: offloaded after the first step's pass, kept from the second.
    let mut w = make(u64::MAX, "ref-roomy", 512);
    step(&mut w, 1);
    assert_eq!(
        state(&w, tags::REF),
        TagState::Paused,
        "no step's peak known yet"
    );
    let step1_peak = w.pool().stats().peak_allocated_bytes;
    let reference = tag(&w, tags::REF).paused_bytes;
    step(&mut w, 2);
    assert_eq!(state(&w, tags::REF), TagState::Active);
    let (pauses, resumes) = (tag(&w, tags::REF).pauses, tag(&w, tags::REF).resumes);
    step(&mut w, 3);
    assert_eq!(
        (tag(&w, tags::REF).pauses, tag(&w, tags::REF).resumes),
        (pauses, resumes),
        "a kept reference is neither copied out nor back"
    );
    w.to_rollout().unwrap();
    assert_eq!(
        state(&w, tags::REF),
        TagState::Active,
        "the roomy switch keeps it"
    );
    w.to_train().unwrap();
    w.begin_step(4);
    w.ref_log_probs(&longer, 4).unwrap();
    assert_eq!(
        state(&w, tags::REF),
        TagState::Paused,
        "a batch longer than any measured step may need more than its peak"
    );
    w.actor_mut("take an SFT step")
        .unwrap()
        .sft_step(&longer)
        .unwrap();
    step(&mut w, 5);
    assert_eq!(
        state(&w, tags::REF),
        TagState::Active,
        "the longer step is measured now"
    );
    remove_scratch("ref-roomy");

    // No room beside the largest step's peak: it goes after every pass.
    let capacity = step1_peak + reference / 2;
    let mut w = make(capacity, "ref-tight", 512);
    step(&mut w, 1);
    step(&mut w, 2);
    assert_eq!(state(&w, tags::REF), TagState::Paused);
    assert!(w.pool().stats().peak_resident_bytes <= capacity);
    remove_scratch("ref-tight");

    // Room for it beside the update, not beside the engine (a KV cache
    // larger than the update's activations): kept after the pass, given up
    // by the switch (the training cache gone already).
    let kv = 65536;
    let mut w = make(u64::MAX, "ref-sizes", kv);
    step(&mut w, 1);
    let step1_peak = w.pool().stats().peak_allocated_bytes;
    let stats = w.pool().stats();
    let held = |t: &str| {
        let s = stats.tag(t).unwrap();
        s.resident_bytes + s.paused_bytes - s.cached_bytes
    };
    let trainer = held(tags::TRAIN_PARAMS) + held(tags::TRAIN_GRADS) + held(tags::OPTIMIZER);
    let engine = held(tags::WEIGHTS) + held(tags::KV_CACHE);
    remove_scratch("ref-sizes");
    let capacity = trainer + engine + reference / 2;
    assert!(
        step1_peak + reference <= capacity,
        "trainer {trainer}, engine {engine}, reference {reference}, step peak {step1_peak}"
    );
    let mut w = make(capacity, "ref-switch", kv);
    step(&mut w, 1);
    step(&mut w, 2);
    assert_eq!(state(&w, tags::REF), TagState::Active);
    w.actor_mut("release the cache").unwrap().release_cache();
    w.to_rollout().unwrap();
    assert_eq!(state(&w, tags::REF), TagState::Paused);
    let phases: Vec<String> = w.pool().timeline().into_iter().map(|e| e.phase).collect();
    assert!(phases.iter().any(|p| p == "offload_ref"), "{phases:?}");
    w.to_train().unwrap();
    w.begin_step(3);
    w.ref_log_probs(&seqs, 4).unwrap();
    assert!(w.pool().stats().peak_resident_bytes <= capacity);
    remove_scratch("ref-switch");
}

#[test]
fn staged_mode_holds_each_tag_only_where_its_phase_needs_it() {
    let mut w = worker(Colocation::Staged, "tags");
    let state = |w: &HybridWorker, t: &str| w.pool().tag_state(t);
    assert_eq!(w.phase(), Phase::Train);
    for t in [tags::WEIGHTS, tags::KV_CACHE, tags::REF] {
        assert_eq!(state(&w, t), Some(TagState::Paused), "{t} while training");
    }
    assert_eq!(state(&w, tags::TRAIN_PARAMS), Some(TagState::Active));
    w.to_rollout().unwrap();
    for t in [
        tags::TRAIN_PARAMS,
        tags::TRAIN_GRADS,
        tags::OPTIMIZER,
        tags::REF,
    ] {
        assert_eq!(state(&w, t), Some(TagState::Paused), "{t} while generating");
    }
    assert_eq!(state(&w, tags::WEIGHTS), Some(TagState::Active));
    assert_eq!(state(&w, tags::KV_CACHE), Some(TagState::Active));
    // Phase misuse is an error, not a silent no-op.
    assert!(w.to_rollout().is_err());
    w.to_train().unwrap();
    assert!(w.to_train().is_err());
    assert_eq!(state(&w, tags::TRAIN_PARAMS), Some(TagState::Active));
    // The timeline shows the stages in order.
    let phases: Vec<String> = w.pool().timeline().into_iter().map(|e| e.phase).collect();
    let pos = |p: &str| {
        phases
            .iter()
            .position(|x| x == p)
            .unwrap_or_else(|| panic!("no phase {p}"))
    };
    assert!(pos("wake_weights") < pos("sync_weights"));
    assert!(pos("sync_weights") < pos("free_trainer_weights"));
    assert!(pos("free_trainer_weights") < pos("wake_kv_cache"));
}

#[test]
fn staged_peak_is_below_sleep_peak_by_the_trainers_weight_bytes() {
    let mut peaks = Vec::new();
    let mut param_bytes = 0;
    for (i, mode) in [Colocation::Sleep, Colocation::Staged]
        .into_iter()
        .enumerate()
    {
        // A KV cache larger than the trainer's weights, as in the RFC (there
        // the staged peak is weights + KV cache, after the trainer's copy
        // is gone; with a smaller cache it would be the sync stage).
        let mut w = worker_kv(mode, &format!("peak{i}"), 4096);
        param_bytes = w
            .pool()
            .stats()
            .tag(tags::TRAIN_PARAMS)
            .unwrap()
            .resident_bytes;
        let seen = w.pool().timeline().len();
        w.to_rollout().unwrap();
        // The peak of the wake-up: resident bytes after each transition,
        // once the optimizer state is gone (the RFC's "update weight" stage).
        let events = w.pool().timeline();
        let wake = events[seen..]
            .iter()
            .skip_while(|e| e.phase == "offload_optimizer");
        peaks.push(wake.map(|e| e.resident_bytes).max().unwrap());
        w.to_train().unwrap();
    }
    let saved = peaks[0] as i64 - peaks[1] as i64;
    assert!(
        saved as f64 >= 0.9 * param_bytes as f64,
        "sleep {} staged {} params {}",
        peaks[0],
        peaks[1],
        param_bytes
    );
}

#[test]
fn reference_scores_only_while_resident_and_offloads_after() {
    let mut w = worker(Colocation::Staged, "ref");
    let seqs =
        SeqBatch::from_prompt_response(&[(&[278, 28, 274][..], &[272, 337][..])], 0).unwrap();
    let lp = w.ref_log_probs(&seqs, 4).unwrap().unwrap();
    let actor = w.score(&seqs, false).unwrap().log_probs;
    // Before any update the reference is the actor.
    let diff = (lp - actor).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "{diff}");
    assert_eq!(w.pool().tag_state(tags::REF), Some(TagState::Paused));
    let _ = Arc::clone(w.pool());
}

/// Regression: start-up built the trainer while the engine's weights and KV
/// cache were still resident, a peak no step reaches.
#[test]
fn start_up_never_holds_the_engine_and_the_trainer_together() {
    let mut w = worker_kv(Colocation::Staged, "startup", 4096);
    let startup_peak = w.pool().stats().peak_resident_bytes;
    let bytes = |w: &HybridWorker, tags: &[&str]| -> u64 {
        let s = w.pool().stats();
        tags.iter()
            .map(|t| s.tag(t).map_or(0, |x| x.resident_bytes + x.paused_bytes))
            .sum()
    };
    let trainer = bytes(
        &w,
        &[
            tags::TRAIN_PARAMS,
            tags::TRAIN_GRADS,
            tags::OPTIMIZER,
            tags::REF,
        ],
    );
    w.to_rollout().unwrap();
    let engine = bytes(&w, &[tags::WEIGHTS, tags::KV_CACHE]);
    // Loading a model briefly holds its file's bytes beside its tensors.
    let loading = bytes(&w, &[tags::WEIGHTS]);
    assert!(
        startup_peak <= engine.max(trainer) + loading,
        "start-up peak {startup_peak} > max(engine {engine}, trainer {trainer}) + {loading}"
    );
}

/// `as_needed` and the rollout engine's weights: once a step at least as
/// large has run and its allocated peak plus the weights fits, the weights
/// stay resident through the update (only the KV cache sleeps), so the
/// next switch neither wakes nor populates them; the engine still
/// generates with the actor's current weights (the sync rewrites them in
/// place). A longer batch than any so far, or no room, sends them to sleep
/// as before.
#[test]
fn as_needed_engine_weights_stay_resident_while_a_step_as_large_had_room() {
    let prompts = vec![vec![278, 28, 274, 272, 337], vec![54, 74, 71, 223, 83, 87]];
    let seqs =
        SeqBatch::from_prompt_response(&[(&prompts[0][..], &[7, 7, 7, 7, 7, 7][..])], 0).unwrap();
    let tokens_of = |s: &SeqBatch| (s.batch_size() * s.seq_len()) as u64;
    let state = |w: &HybridWorker| w.pool().tag_state(tags::WEIGHTS).unwrap();
    let resumes = |w: &HybridWorker| w.pool().stats().tag(tags::WEIGHTS).unwrap().resumes;
    // A step: the rollout phase, then an update of `seqs` (SFT steps that
    // change the greedy output).
    let step = |w: &mut HybridWorker, n: u64, tokens: u64| {
        w.begin_step(n);
        w.to_rollout().unwrap();
        let generated = self::tokens(w.generate(greedy(&prompts)).unwrap());
        w.to_train_for_update(tokens).unwrap();
        w.ref_log_probs(&seqs, 4).unwrap();
        for _ in 0..10 {
            w.actor_mut("take an SFT step")
                .unwrap()
                .sft_step(&seqs)
                .unwrap();
        }
        generated
    };

    let mut w = staged_as_needed(u64::MAX, "weights-roomy", 512);
    step(&mut w, 1, tokens_of(&seqs));
    assert_eq!(state(&w), TagState::Paused, "no step's peak known yet");
    step(&mut w, 2, tokens_of(&seqs));
    assert_eq!(state(&w), TagState::Active, "kept through the update");
    let woken = resumes(&w);
    let current = reference_tokens(&w, &prompts, "weights-roomy");
    let generated = step(&mut w, 3, tokens_of(&seqs));
    assert_eq!(resumes(&w), woken, "a kept tag is not woken again");
    assert_eq!(generated, current, "generation with the synced weights");
    step(&mut w, 4, 10 * tokens_of(&seqs));
    assert_eq!(
        state(&w),
        TagState::Paused,
        "a batch longer than any measured step may need more than its peak"
    );
    let current = reference_tokens(&w, &prompts, "weights-roomy-2");
    let generated = step(&mut w, 5, tokens_of(&seqs));
    assert_eq!(generated, current, "woken and synced again");
    remove_scratch("weights-roomy");

    // No room for the weights beside the peak: they sleep every update.
    let mut probe = staged_as_needed(u64::MAX, "weights-probe", 512);
    step(&mut probe, 1, tokens_of(&seqs));
    let peak = probe.pool().stats().peak_allocated_bytes;
    let weights = probe
        .pool()
        .stats()
        .tag(tags::WEIGHTS)
        .unwrap()
        .paused_bytes;
    remove_scratch("weights-probe");
    let mut w = staged_as_needed(peak + weights / 2, "weights-tight", 512);
    for n in 1..=3 {
        step(&mut w, n, tokens_of(&seqs));
        assert_eq!(state(&w), TagState::Paused, "step {n}");
    }
    remove_scratch("weights-tight");
}
