//! Tensor-parallel rollout: ranks as threads of this process, joined by
//! the in-process group, against the same engine without a group.

mod common;

use std::sync::Arc;

use colo_mem::{Pool, PoolConfig};
use colo_model::{ModelConfig, Weights};
use colo_rollout::tensor_parallel::KEY;
use colo_rollout::{
    Completion, Engine, EngineConfig, Error, LocalGroup, Request, SamplingParams, TensorParallel,
};
use common::*;
use tch::{Device, Kind, Tensor};

/// Runs `f` on each of `tg` ranks (one thread each) with its group handle;
/// the ranks' results in rank order.
fn ranks<T: Send>(tg: usize, f: impl Fn(Box<dyn TensorParallel>) -> T + Sync) -> Vec<T> {
    let groups = LocalGroup::new(tg);
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| {
                let f = &f;
                s.spawn(move || f(Box::new(g)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn parallel_engine(name: &str, cfg: &EngineConfig, group: Box<dyn TensorParallel>) -> Engine {
    let dir = fixture(name);
    Engine::from_dir_parallel(&dir, Kind::Float, Device::Cpu, pool(), cfg, group).unwrap()
}

/// Prompts of 10, 4, 20 and 29 tokens from the fixture's three.
fn prompts(name: &str) -> Vec<Vec<u32>> {
    let p: Vec<Vec<u32>> = greedy_reference(name).into_iter().map(|(p, _)| p).collect();
    vec![
        p[0].clone(),
        p[1][..4].to_vec(),
        [p[1].clone(), p[2].clone()].concat(),
        [p[2].clone(), p[0].clone(), p[1][..9].to_vec()].concat(),
    ]
}

/// Greedy requests of different lengths (so sequences finish at different
/// steps and later ones take their places) and one sampled request of
/// three samples.
fn load(name: &str) -> Vec<Request> {
    let mut out: Vec<Request> = prompts(name)
        .into_iter()
        .zip([24, 9, 17, 30])
        .map(|(p, n)| Request::new(p, SamplingParams::greedy(n)))
        .collect();
    out.push(Request::new(prompts(name)[1].clone(), sampled(3, 16, 7)));
    out
}

fn generate(e: &mut Engine, reqs: Vec<Request>) -> Vec<Vec<Completion>> {
    ok(e.generate(reqs).unwrap())
}

/// Two sequences at once in blocks of 4: the requests are admitted as
/// others finish (continuous batching).
fn batching() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        max_batch: 2,
        ..EngineConfig::with_kv_tokens(512)
    }
}

#[test]
fn ranks_generate_what_one_engine_generates() {
    for (name, tg) in [
        ("tiny-qwen2", 2),
        ("tiny-qwen2", 4), // four ranks over two KV heads: each held twice
        ("tiny-llama", 2),
        ("tiny-llama3", 2),
        ("tiny-qwen3", 2),
    ] {
        let cfg = batching();
        let one = generate(
            &mut Engine::from_dir(&fixture(name), pool(), &cfg).unwrap(),
            load(name),
        );
        let outs = ranks(tg, |g| {
            let mut e = parallel_engine(name, &cfg, g);
            let out = generate(&mut e, load(name));
            (out, e.stats())
        });
        for (rank, (out, stats)) in outs.iter().enumerate() {
            assert_eq!(stats.tensor_parallel_size, tg);
            assert_eq!(stats.tensor_parallel_rank, rank);
            assert!(stats.decode_steps > 30, "{name}: batched, not all at once");
            assert_eq!(out, &outs[0].0, "{name} tg {tg}: rank {rank} = rank 0");
            assert_same(out, &one, 1e-4);
        }
        // The ranks' tokens are the same as one engine's; the sampled
        // request's samples differ from each other.
        let sampled = &outs[0].0[4];
        assert!(sampled.iter().any(|c| c.tokens != sampled[0].tokens));
    }
}

/// A KV cache too small for the load: the ranks preempt and recompute as
/// one engine does, and still generate the same.
#[test]
fn ranks_preempt_together() {
    let cfg = EngineConfig {
        block_size: 4,
        max_batch: 8,
        ..EngineConfig::with_kv_tokens(96)
    };
    let name = "tiny-qwen2";
    let mut e = Engine::from_dir(&fixture(name), pool(), &cfg).unwrap();
    let one = generate(&mut e, load(name));
    let preempted = e.stats().preemptions;
    assert!(preempted > 0, "the pool is small enough to preempt");
    let outs = ranks(2, |g| {
        let mut e = parallel_engine(name, &cfg, g);
        (generate(&mut e, load(name)), e.stats().preemptions)
    });
    for (out, preemptions) in &outs {
        assert_eq!(*preemptions, preempted);
        assert_same(out, &one, 1e-4);
    }
}

/// Every parameter changed: rows reversed and averaged with the original
/// (q's head rows, the MLP's rows and the norms all move), as full tensors.
fn changed(name: &str) -> Vec<(String, Tensor)> {
    let dir = fixture(name);
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let model = colo_model::Model::load(&cfg, &w).unwrap();
    model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| {
            let mixed = (&t + t.flip([0])) * 0.5 + 0.01;
            (n, mixed)
        })
        .collect()
}

#[test]
fn full_tensors_update_every_rank_in_place() {
    let name = "tiny-llama";
    let cfg = batching();
    let greedy = || {
        prompts(name)
            .into_iter()
            .map(|p| Request::new(p, SamplingParams::greedy(12)))
            .collect::<Vec<_>>()
    };
    let update = |e: &mut Engine| {
        let before = e.weight_addresses();
        let new = changed(name);
        let (a, b) = new.split_at(new.len() / 2); // any subset of names per call
        e.release(&["weights", "kv_cache"]).unwrap();
        e.resume(&["weights"]).unwrap();
        e.update_weights(a).unwrap();
        assert!(matches!(
            e.generate(greedy()),
            Err(Error::Released { .. } | Error::StaleWeights { .. })
        ));
        e.update_weights(b).unwrap();
        e.resume(&["kv_cache"]).unwrap();
        assert_eq!(e.weight_addresses(), before, "written in place");
    };
    let mut e = Engine::from_dir(&fixture(name), pool(), &cfg).unwrap();
    let old = generate(&mut e, greedy());
    update(&mut e);
    let one = generate(&mut e, greedy());
    assert_ne!(old, one, "the update changes what the model generates");
    let outs = ranks(2, |g| {
        let mut e = parallel_engine(name, &cfg, g);
        update(&mut e);
        let out = generate(&mut e, greedy());
        // Each rank's buffers hold its slices of the new full tensors.
        let new: std::collections::HashMap<String, Tensor> = changed(name).into_iter().collect();
        let shard = e.shard().clone();
        for (n, local) in e.model().unwrap().named_parameters() {
            let expected = shard.take(&n, &new[&n]).unwrap();
            assert!(local.equal(&expected), "rank {}: {n}", shard.rank);
        }
        let (d, r) = (shard.full.head_dim as i64, shard.rank as i64);
        let k = e.model().unwrap().named_parameters();
        let k = &k
            .iter()
            .find(|(n, _)| n == "model.layers.1.self_attn.k_proj.weight");
        let full_k = &new["model.layers.1.self_attn.k_proj.weight"];
        assert!(
            k.unwrap().1.equal(&full_k.narrow(0, r * d, d)),
            "KV head {r}"
        );
        out
    });
    for out in &outs {
        assert_same(out, &one, 1e-4);
    }
    // A full tensor of the wrong shape is refused by every rank, naming it
    // and the full shape.
    let errors = ranks(2, |g| {
        let mut e = parallel_engine(name, &cfg, g);
        let bad = vec![(
            "model.layers.0.mlp.down_proj.weight".to_owned(),
            Tensor::zeros([96, 128], (Kind::Float, Device::Cpu)),
        )];
        e.update_weights(&bad).unwrap_err().to_string()
    });
    for msg in errors {
        assert!(
            msg.contains("down_proj") && msg.contains("[96, 256]"),
            "{msg}"
        );
    }
}

/// tiny-llama with Llama's `attention_bias`: biases on q, k, v (split
/// with their heads) and on `o_proj` (whole, added once after the sum).
fn with_biases() -> (ModelConfig, Weights) {
    let dir = fixture("tiny-llama");
    let cfg = ModelConfig {
        qkv_bias: true,
        o_bias: true,
        ..ModelConfig::from_file(&dir.join("config.json")).unwrap()
    };
    let w = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let mut tensors: std::collections::HashMap<String, Tensor> = cfg
        .parameter_shapes()
        .into_iter()
        .filter(|(n, _)| !n.ends_with(".bias"))
        .map(|(n, shape)| {
            let t = w.get(&n, &shape).unwrap();
            (n, t)
        })
        .collect();
    for (n, shape) in cfg.parameter_shapes() {
        if n.ends_with(".bias") {
            let i = Tensor::arange(shape[0] as i64, (Kind::Float, Device::Cpu));
            tensors.insert(n, (i * 0.7).sin() * 0.5);
        }
    }
    (cfg, Weights::from_tensors(tensors))
}

#[test]
fn projection_biases_follow_their_heads_and_o_proj_adds_its_once() {
    let cfg = batching();
    let greedy = || {
        prompts("tiny-llama")
            .into_iter()
            .map(|p| Request::new(p, SamplingParams::greedy(16)))
            .collect::<Vec<_>>()
    };
    let (model, w) = with_biases();
    let mut e = Engine::new(&model, &w, None, pool(), &cfg).unwrap();
    let one = generate(&mut e, greedy());
    let plain = generate(
        &mut Engine::from_dir(&fixture("tiny-llama"), pool(), &cfg).unwrap(),
        greedy(),
    );
    assert_ne!(one, plain, "the biases change the tokens");
    let outs = ranks(2, |g| {
        let (model, w) = with_biases();
        let mut e = Engine::new_parallel(&model, &w, None, pool(), &cfg, g).unwrap();
        generate(&mut e, greedy())
    });
    for out in &outs {
        assert_same(out, &one, 1e-4);
    }
}

/// Bytes per rank: the replicated parameters whole, the rest split.
#[test]
fn each_rank_holds_the_replicated_weights_and_its_slice() {
    let cfg = EngineConfig::with_kv_tokens(64);
    for (name, tg) in [("tiny-llama", 2), ("tiny-qwen2", 2), ("tiny-qwen2", 4)] {
        let model = ModelConfig::from_file(&fixture(name).join("config.json")).unwrap();
        let one = Engine::from_dir(&fixture(name), pool(), &cfg)
            .unwrap()
            .stats();
        let (v, h, l) = (model.vocab_size, model.hidden_size, model.num_layers);
        // Embedding, untied head, two norms a layer and the final norm.
        let heads = if model.tie_word_embeddings { 1 } else { 2 };
        let replicated = 4 * (heads * v * h + (2 * l + 1) * h);
        assert_eq!(one.weights_replicated_bytes, one.weights_bytes);
        // K/V projections (with biases) are held by tg / kv_heads ranks
        // each when the group outnumbers the KV heads.
        let kv_rows = 2 * model.num_kv_heads * model.head_dim;
        let kv = 4 * l * kv_rows * (h + usize::from(model.qkv_bias));
        let kv_copies = (tg / model.num_kv_heads).max(1);
        let stats = ranks(tg, |g| parallel_engine(name, &cfg, g).stats());
        for s in &stats {
            assert_eq!(s.weights_replicated_bytes, replicated, "{name}");
            let split = one.weights_bytes - replicated - kv;
            assert_eq!(
                s.weights_bytes,
                replicated + split / tg + kv * kv_copies / tg,
                "{name} tg {tg}"
            );
            assert_eq!(s.kv_blocks_total, one.kv_blocks_total, "the same tokens");
            assert_eq!(
                s.kv_bytes_per_block * model.num_kv_heads.min(tg),
                one.kv_bytes_per_block,
                "{name} tg {tg}: this rank's KV heads"
            );
            // What `colo plan` computes without building an engine.
            let shard = colo_rollout::Shard::new(&model, 0, tg).unwrap();
            assert_eq!(shard.weight_bytes(4).total(), s.weights_bytes);
            assert_eq!(shard.weight_bytes(4).replicated, replicated);
            assert_eq!(
                shard.kv_bytes_per_token(4) * s.block_size,
                s.kv_bytes_per_block
            );
        }
    }
}

/// With `mem_fraction` each rank's budget is its own pool's, and the ranks
/// agree on the fewest blocks any of them can hold.
#[test]
fn ranks_agree_on_the_kv_blocks() {
    let cfg = EngineConfig {
        mem_fraction: Some(0.5),
        ..EngineConfig::default()
    };
    let blocks = ranks(2, |g| {
        let capacity = (1 + g.rank() as u64) << 23; // 8 and 16 MiB
        let pool = Pool::host(PoolConfig::with_capacity(capacity)).unwrap();
        let e = Engine::from_dir_parallel(
            &fixture("tiny-qwen2"),
            Kind::Float,
            Device::Cpu,
            Arc::clone(&pool),
            &cfg,
            g,
        )
        .unwrap();
        e.stats().kv_blocks_total
    });
    assert_eq!(blocks[0], blocks[1]);
    let alone = Engine::from_dir(
        &fixture("tiny-qwen2"),
        Pool::host(PoolConfig::with_capacity(8 << 20)).unwrap(),
        &cfg,
    )
    .unwrap()
    .stats();
    // Half the bytes a token: about twice the blocks of the smaller pool.
    let ratio = blocks[0] as f64 / alone.kv_blocks_total as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "{} against {}",
        blocks[0],
        alone.kv_blocks_total
    );
}

#[test]
fn a_size_that_does_not_split_the_model_is_an_error_naming_the_key() {
    // tiny-llama: 6 heads, 2 KV heads, intermediate 256.
    for (tg, what) in [(4, "6 attention heads"), (3, "2 KV heads")] {
        let g = LocalGroup::new(tg).into_iter().next().unwrap();
        let e = Engine::from_dir_parallel(
            &fixture("tiny-llama"),
            Kind::Float,
            Device::Cpu,
            pool(),
            &batching(),
            Box::new(g),
        );
        let msg = e.err().expect("refused").to_string();
        assert!(msg.contains(KEY) && msg.contains(what), "{msg}");
    }
}

#[test]
fn ranks_given_different_requests_refuse_to_generate() {
    let errors = ranks(2, |g| {
        let rank = g.rank();
        let mut e = parallel_engine("tiny-qwen2", &batching(), g);
        let reqs = vec![Request::new(
            vec![5, 6, 7 + rank as u32],
            SamplingParams::greedy(4),
        )];
        e.generate(reqs).unwrap_err().to_string()
    });
    for msg in errors {
        assert!(msg.contains("rank 1 was given other requests"), "{msg}");
    }
}
