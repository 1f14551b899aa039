//! The hybrid worker with a LoRA actor: no reference copy (the reference is
//! the actor's base, scoring as the starting model whatever the updates),
//! and the rollout engine generates with the adapters merged in, in the
//! modes that sync in memory and in the one that rebuilds from disk.

use colo_mem::{tags, Pool, PoolConfig};
use colo_rl::config::{Capacity, Colocation, MemoryConfig, OffloadPolicy};
use colo_rl::worker::{HybridWorker, WorkerSpec};
use colo_rollout::{Engine, EngineConfig, Request, SamplingParams};
use colo_train::{LoraConfig, SeqBatch, TrainEngine, TrainerConfig};
use tch::{Device, Kind};

mod common;

fn lora_worker(mode: Colocation, scratch: &str) -> HybridWorker {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let dir =
        std::env::temp_dir().join(format!("colo-lora-worker-{}-{scratch}", std::process::id()));
    let spec = WorkerSpec {
        model_dir: common::fixture(),
        actor: TrainerConfig {
            optim: colo_train::OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            lora: Some(LoraConfig {
                rank: 4,
                alpha: 8.0,
                ..Default::default()
            }),
            ..Default::default()
        },
        critic: None,
        engine: EngineConfig {
            max_kv_tokens: Some(512),
            ..EngineConfig::default()
        },
        memory: MemoryConfig {
            capacity: Capacity::Auto,
            colocation: mode,
            offload_train_param: true,
            offload_train_grad: true,
            offload_train_optimizer: true,
            offload_ref: true,
            offload_policy: OffloadPolicy::Always,
        },
        reference: true,
        scratch: dir,
    };
    HybridWorker::new(pool, &spec, Default::default()).unwrap()
}

fn greedy(prompts: &[Vec<u32>]) -> Vec<Request> {
    (prompts.iter())
        .map(|p| Request::new(p.clone(), SamplingParams::greedy(8)))
        .collect()
}

fn tokens(out: Vec<colo_rollout::Result<colo_rollout::RequestOutput>>) -> Vec<Vec<u32>> {
    (out.into_iter())
        .map(|o| o.unwrap().completions[0].tokens.clone())
        .collect()
}

/// What a fresh engine built from the actor's model as written for a
/// rollout engine (merged) generates.
fn merged_tokens(w: &HybridWorker, prompts: &[Vec<u32>], tag: &str) -> Vec<Vec<u32>> {
    let dir = std::env::temp_dir().join(format!("colo-lora-ref-{}-{tag}", std::process::id()));
    w.actor("save the model").unwrap().save_model(&dir).unwrap();
    let cfg = EngineConfig {
        max_kv_tokens: Some(512),
        ..EngineConfig::default()
    };
    let pool = Pool::host(PoolConfig::default()).unwrap();
    let mut e = Engine::from_dir_on(&dir, Kind::Float, Device::Cpu, pool, &cfg).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    tokens(e.generate(greedy(prompts)).unwrap())
}

#[test]
fn the_reference_is_the_actors_base_and_the_engine_generates_merged() {
    let prompts = vec![vec![278, 28, 274, 272, 337], vec![54, 74, 71, 223, 83, 87]];
    let seqs =
        SeqBatch::from_prompt_response(&[(&prompts[0][..], &[7, 7, 7, 7, 7, 7][..])], 0).unwrap();
    for mode in [Colocation::Staged, Colocation::Restart] {
        let mut w = lora_worker(mode, &format!("{mode:?}"));
        let pool = w.actor("read the pool").unwrap().pool().clone();
        let ref_bytes = |p: &Pool| p.stats().tag(tags::REF).map_or(0, |t| t.allocated_bytes);
        assert_eq!(ref_bytes(&pool), 0, "{mode:?}: no reference copy");
        let base = w.ref_log_probs(&seqs, 8).unwrap().unwrap();
        let start = w.score(&seqs, false).unwrap().log_probs;
        let d = (&base - &start).abs().max().double_value(&[]);
        assert!(
            d < 1e-5,
            "{mode:?}: B = 0, the actor starts as the base ({d})"
        );
        let before = merged_tokens(&w, &prompts, &format!("a{mode:?}"));
        for _ in 0..20 {
            w.actor_mut("take an SFT step")
                .unwrap()
                .sft_step(&seqs)
                .unwrap();
        }
        let after = merged_tokens(&w, &prompts, &format!("b{mode:?}"));
        assert_ne!(after, before, "{mode:?}: the adapters change greedy output");
        w.to_rollout().unwrap();
        assert_eq!(
            tokens(w.generate(greedy(&prompts)).unwrap()),
            after,
            "{mode:?}"
        );
        w.to_train().unwrap();
        // The reference still scores as the starting model, offloads and
        // reloads around it included.
        assert!(
            w.ref_log_probs(&seqs, 8).unwrap().unwrap().equal(&base),
            "{mode:?}"
        );
        let trained = w.score(&seqs, false).unwrap().log_probs;
        assert!((&trained - &base).abs().max().double_value(&[]) > 1e-2);
        assert_eq!(ref_bytes(&pool), 0, "{mode:?}");
        drop(w);
        let scratch = format!("colo-lora-worker-{}-{mode:?}", std::process::id());
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(scratch));
    }
}
