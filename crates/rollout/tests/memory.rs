//! The colocated contract: release/resume at fixed addresses, in-place
//! weight updates, and the errors of misuse.

mod common;

use colo_mem::{tags, Policy, Pool, PoolConfig};
use colo_rollout::{Engine, EngineConfig, Error, Request, SamplingParams};
use common::*;
use tch::{Kind, Tensor};

fn prompts() -> Vec<Vec<u32>> {
    greedy_reference("tiny-qwen2")
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// The fixture's weights, each scaled by `f` ("the trainer's update").
fn scaled_weights(e: &Engine, f: f64) -> Vec<(String, Tensor)> {
    e.model()
        .unwrap()
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t * f))
        .collect()
}

fn resident(pool: &Pool, tag: &str) -> u64 {
    pool.stats().tag(tag).map_or(0, |t| t.resident_bytes)
}

#[test]
fn release_resume_update_keeps_addresses_and_equals_a_fresh_engine() {
    let cfg = EngineConfig {
        block_size: 8,
        weight_bucket_bytes: 4 << 10,
        ..EngineConfig::with_kv_tokens(512)
    };
    let mut e = Engine::from_dir(&fixture("tiny-qwen2"), pool(), &cfg).unwrap();
    let pool = e.pool().clone();
    let (kv_addrs, w_addrs) = (e.kv_addresses(), e.weight_addresses());
    for &a in &kv_addrs {
        assert_eq!(pool.tag_of(a).as_deref(), Some(tags::KV_CACHE));
    }
    for (name, a) in &w_addrs {
        assert_eq!(pool.tag_of(*a).as_deref(), Some(tags::WEIGHTS), "{name}");
    }
    let (kv_bytes, w_bytes) = (
        resident(&pool, tags::KV_CACHE),
        resident(&pool, tags::WEIGHTS),
    );
    assert!(kv_bytes >= e.stats().kv_bytes as u64 && w_bytes >= e.stats().weights_bytes as u64);

    let params = sampled(2, 12, 9);
    let trained = scaled_weights(&e, 1.05);
    for cycle in 0..5 {
        e.release(&[tags::WEIGHTS, tags::KV_CACHE]).unwrap();
        assert_eq!(
            (
                resident(&pool, tags::WEIGHTS),
                resident(&pool, tags::KV_CACHE)
            ),
            (0, 0)
        );
        assert!(matches!(
            e.generate(requests(&prompts(), &params)),
            Err(Error::Released { .. })
        ));
        // Stage 1: weights back, but discarded: generation must refuse.
        e.resume(&[tags::WEIGHTS]).unwrap();
        assert_eq!(resident(&pool, tags::WEIGHTS), w_bytes);
        assert_eq!(resident(&pool, tags::KV_CACHE), 0);
        e.update_weights(&trained[..3]).unwrap();
        e.resume(&[tags::KV_CACHE]).unwrap();
        let err = e.generate(requests(&prompts(), &params)).unwrap_err();
        assert!(matches!(err, Error::StaleWeights { .. }), "{err}");
        // Stage 2: the rest of the update, in 4 KiB buckets.
        let bytes = e.weights_bytes();
        let report = e.update_weights(&trained[3..]).unwrap();
        assert!(
            report.buckets > 1 && report.bytes > 0,
            "{report:?} of {bytes}"
        );
        assert_eq!(e.kv_addresses(), kv_addrs, "cycle {cycle}");
        assert_eq!(e.weight_addresses(), w_addrs, "cycle {cycle}");
    }
    let got = ok(e.generate(requests(&prompts(), &params)).unwrap());

    // A fresh engine (same configuration) loaded with the trained weights,
    // same seed: bit-identical outputs.
    let model_cfg = e.model().unwrap().config().clone();
    let w = colo_model::Weights::from_tensors(trained.into_iter().collect());
    let mut fresh = Engine::new(&model_cfg, &w, None, pool, &cfg).unwrap();
    let expected = ok(fresh.generate(requests(&prompts(), &params)).unwrap());
    assert_eq!(got, expected);
}

#[test]
fn update_weights_names_the_bad_tensor_and_writes_nothing() {
    let mut e = engine("tiny-qwen2", 256, 8);
    let params = SamplingParams::greedy(8);
    let before = ok(e.generate(requests(&prompts(), &params)).unwrap());
    let mut w = scaled_weights(&e, 2.0);
    w.push((
        "model.layers.9.mlp.up_proj.weight".into(),
        w[1].1.shallow_clone(),
    ));
    let err = e.update_weights(&w).unwrap_err();
    assert!(
        err.to_string()
            .contains("`model.layers.9.mlp.up_proj.weight`"),
        "{err}"
    );
    w.pop();
    let name = w[2].0.clone();
    w[2].1 = w[2].1.flatten(0, -1);
    let err = e.update_weights(&w).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { name: n, .. } if *n == name),
        "{err}"
    );
    assert_eq!(
        ok(e.generate(requests(&prompts(), &params)).unwrap()),
        before
    );
    // The update itself, from f64 tensors: converted in buckets.
    let w64: Vec<_> = scaled_weights(&e, 1.0)
        .into_iter()
        .map(|(n, t)| (n, t.to_kind(Kind::Double)))
        .collect();
    e.update_weights(&w64).unwrap();
    assert_eq!(
        ok(e.generate(requests(&prompts(), &params)).unwrap()),
        before
    );
}

#[test]
fn lifecycle_misuse_is_an_error() {
    let mut e = engine("tiny-qwen2", 256, 8);
    let id = e
        .add_request(Request::new(vec![1, 2, 3], SamplingParams::greedy(4)))
        .unwrap();
    let err = e.release(&[tags::KV_CACHE]).unwrap_err();
    assert!(matches!(err, Error::InFlight { in_flight: 1, .. }), "{err}");
    assert!(e.flush_cache().is_err() && e.update_weights(&[]).is_err());
    while e.in_flight() > 0 {
        for out in e.step().unwrap() {
            assert_eq!(out.id, id);
        }
    }
    let err = e.release(&["optimizer"]).unwrap_err();
    assert!(err.to_string().contains("`optimizer`"), "{err}");
    let w = scaled_weights(&e, 1.0); // read before the memory goes away
    e.release(&[tags::WEIGHTS]).unwrap();
    let err = e.release(&[tags::WEIGHTS]).unwrap_err();
    assert!(err.to_string().contains("`weights`"), "{err}");
    let err = e.update_weights(&w).unwrap_err();
    assert!(matches!(err, Error::Released { .. }), "{err}");
    e.resume(&[tags::WEIGHTS]).unwrap();
    e.flush_cache().unwrap();
}

#[test]
fn backed_up_weights_need_no_update() {
    let cfg = EngineConfig {
        weights_policy: Policy::Backup,
        ..EngineConfig::with_kv_tokens(256)
    };
    let mut e = Engine::from_dir(&fixture("tiny-qwen2"), pool(), &cfg).unwrap();
    let params = sampled(2, 8, 4);
    let before = ok(e.generate(requests(&prompts(), &params)).unwrap());
    e.release(&[tags::WEIGHTS, tags::KV_CACHE]).unwrap();
    e.resume(&[tags::WEIGHTS, tags::KV_CACHE]).unwrap();
    assert_eq!(
        ok(e.generate(requests(&prompts(), &params)).unwrap()),
        before
    );
}

#[test]
fn mem_fraction_sizes_the_pool_after_weights() {
    let pool = Pool::host(PoolConfig::with_capacity(8 << 20)).unwrap();
    let cfg = EngineConfig {
        mem_fraction: Some(0.5),
        ..EngineConfig::default()
    };
    let e = Engine::from_dir(&fixture("tiny-qwen2"), pool.clone(), &cfg).unwrap();
    let s = e.stats();
    let free = (8u64 << 20) - resident(&pool, tags::WEIGHTS);
    let kv = s.kv_bytes as u64;
    assert!(
        kv <= free / 2 && kv + s.kv_bytes_per_block as u64 * 2 > free / 2 - (64 << 10),
        "{kv} of {free}"
    );
    // Without a capacity a fraction means nothing.
    let err = Engine::from_dir(&fixture("tiny-qwen2"), common::pool(), &cfg)
        .err()
        .unwrap();
    assert!(err.to_string().contains("max_kv_tokens"), "{err}");
}

#[test]
fn max_seq_len_caps_a_fraction_at_what_the_batch_can_use() {
    // A big device and a small run: the fraction alone would reserve
    // hundreds of blocks; 4 sequences of at most 20 tokens use 2 blocks each.
    let pool = Pool::host(PoolConfig::with_capacity(64 << 20)).unwrap();
    let capped = EngineConfig {
        mem_fraction: Some(0.5),
        max_batch: 4,
        max_seq_len: Some(20),
        ..EngineConfig::default()
    };
    let e = Engine::from_dir(&fixture("tiny-qwen2"), pool.clone(), &capped).unwrap();
    let s = e.stats();
    assert_eq!(s.kv_bytes, 4 * 2 * s.kv_bytes_per_block);
    assert!(resident(&pool, tags::KV_CACHE) <= s.kv_bytes as u64 + (64 << 10));
    drop(e);
    // Sized for 4 full-length sequences while 16 may run at once (as many
    // as fit the blocks): the cap follows `kv_seqs`.
    let wide = EngineConfig {
        max_batch: 16,
        kv_seqs: Some(4),
        ..capped.clone()
    };
    let e = Engine::from_dir(&fixture("tiny-qwen2"), pool.clone(), &wide).unwrap();
    assert_eq!(e.stats().kv_bytes, 4 * 2 * e.stats().kv_bytes_per_block);
    drop(e);
    // Where the fraction is the smaller, it wins.
    let tiny = Pool::host(PoolConfig::with_capacity(8 << 20)).unwrap();
    let big_run = EngineConfig {
        max_batch: 1 << 16,
        max_seq_len: Some(4096),
        ..capped
    };
    let e = Engine::from_dir(&fixture("tiny-qwen2"), tiny.clone(), &big_run).unwrap();
    let free = (8u64 << 20) - resident(&tiny, tags::WEIGHTS);
    assert!(e.stats().kv_bytes as u64 <= free / 2);
    // A zero length is a config error naming the key.
    let err = Engine::from_dir(
        &fixture("tiny-qwen2"),
        pool,
        &EngineConfig {
            max_seq_len: Some(0),
            ..EngineConfig::default()
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("max_seq_len"), "{err}");
}

/// Regression: `model()` used to hand out tensors over released weights,
/// and reading them faulted the process.
#[test]
fn the_model_is_not_handed_out_while_its_weights_are_released() {
    let mut e = Engine::from_dir(
        &fixture("tiny-qwen2"),
        pool(),
        &EngineConfig::with_kv_tokens(256),
    )
    .unwrap();
    assert!(e.model().is_ok());
    e.release(&[tags::WEIGHTS]).unwrap();
    let err = e.model().err().unwrap();
    assert!(matches!(err, Error::Released { .. }), "{err}");
    e.resume(&[tags::WEIGHTS]).unwrap();
    assert!(e.model().is_ok());
}

/// The engine runs its model's kind: a bfloat16 engine keeps bfloat16
/// weights and KV pages (half the bytes), generates log-probabilities close
/// to its own model's teacher-forced ones, and takes a float32 update,
/// converting it in place.
#[test]
fn a_bf16_engine_runs_in_bf16_and_takes_f32_updates() {
    let cfg = EngineConfig {
        block_size: 8,
        ..EngineConfig::with_kv_tokens(512)
    };
    let dir = fixture("tiny-qwen2");
    let f32_engine = Engine::from_dir(&dir, pool(), &cfg).unwrap();
    let mut e = Engine::from_dir_on(&dir, Kind::BFloat16, tch::Device::Cpu, pool(), &cfg).unwrap();
    assert_eq!(e.model().unwrap().dtype(), Kind::BFloat16);
    let (s16, s32) = (e.stats(), f32_engine.stats());
    assert_eq!(2 * s16.kv_bytes_per_block, s32.kv_bytes_per_block);
    assert_eq!(2 * s16.weights_bytes, s32.weights_bytes);

    let params = sampled(2, 12, 5);
    let before = ok(e.generate(requests(&prompts(), &params)).unwrap());
    let mut worst = 0f32;
    for (prompt, comps) in prompts().iter().zip(&before) {
        for c in comps {
            let expected = teacher_forced(e.model().unwrap(), prompt, &c.tokens, 1.0);
            for (a, b) in c.logprobs.iter().zip(&expected) {
                assert!(a.is_finite() && *a <= 0.0, "{a}");
                worst = worst.max((a - b).abs());
            }
        }
    }
    assert!(worst <= 0.1, "bf16: worst |Δ logprob| = {worst}");

    // The float32 engine's weights, converted into the bf16 buffers: the
    // same weights, so the same outputs, at the same addresses.
    let addrs = e.weight_addresses();
    let w32 = f32_engine.model().unwrap().named_parameters();
    assert!(w32.iter().all(|(_, t)| t.kind() == Kind::Float));
    e.update_weights(&w32).unwrap();
    assert_eq!(e.weight_addresses(), addrs);
    let after = ok(e.generate(requests(&prompts(), &params)).unwrap());
    assert_same(&before, &after, 0.0);
}
