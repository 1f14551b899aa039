//! LoRA training: only the adapters change and hold training state, the
//! base stays bit-identical and is the reference, the rollout engine and
//! checkpoints get merged weights, the adapter is saved in PEFT's format
//! and resumes exactly.

mod common;

use std::collections::HashMap;

use colo_mem::tags;
use colo_model::Model;
use colo_train::lora::{ADAPTER_CONFIG_FILE, ADAPTER_DIR, ADAPTER_WEIGHTS_FILE};
use colo_train::{
    ColoTrainer, LoraConfig, LossConfig, PolicyBatch, TargetModules, TrainEngine, TrainerConfig,
};
use common::*;
use tch::{Kind, Tensor};

fn lora_config(kind: Kind) -> TrainerConfig {
    TrainerConfig {
        kind,
        cpu_threads: 1,
        lora: Some(LoraConfig {
            rank: 4,
            alpha: 8.0,
            ..Default::default()
        }),
        ..config(2)
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    to_vec(t).iter().map(|x| x.to_bits()).collect()
}

/// The model's own weights (not the adapters), by name, as bits.
fn base_bits(e: &ColoTrainer) -> HashMap<String, Vec<u32>> {
    (e.model().unwrap().named_parameters().iter())
        .map(|(n, t)| (n.clone(), bits(t)))
        .collect()
}

fn update(e: &mut ColoTrainer) -> colo_train::PolicyMetrics {
    let batch = policy_batch(e);
    e.update_policy(&batch, &LossConfig::default()).unwrap()
}

#[test]
fn only_the_adapters_train_and_hold_state() {
    for kind in [Kind::Float, Kind::BFloat16] {
        let mut e = engine_with("tiny-qwen2", &lora_config(kind));
        let full = engine_with("tiny-qwen2", &TrainerConfig { kind, ..config(2) });
        let names: Vec<String> = e.parameters().into_iter().map(|(n, _)| n).collect();
        // 7 projections in each of 2 layers, A and B each.
        assert_eq!(names.len(), 28);
        assert_eq!(names[0], "model.layers.0.self_attn.q_proj.lora_A.weight");
        assert_eq!(names[1], "model.layers.0.self_attn.q_proj.lora_B.weight");
        let base = base_bits(&e);
        for (n, t) in e.model().unwrap().named_parameters() {
            assert!(!t.requires_grad(), "{n} is frozen");
        }
        let (p, g, o) = e.state_bytes();
        let (fp, fg, fo) = full.state_bytes();
        let adapter = e.num_parameters() as u64;
        assert_eq!(g, 4 * adapter, "accumulators for the adapters only");
        let masters = if kind == Kind::Float { 0 } else { 4 };
        assert_eq!(o, (8 + masters) * adapter, "moments (and masters) only");
        assert_eq!(p, fp + adapter * kind.elt_size_in_bytes() as u64);
        assert!(o * 10 < fo && g * 10 < fg, "{o} vs {fo}, {g} vs {fg}");
        // The pool's tags hold exactly that.
        let stats = e.pool().stats();
        assert!(stats.tag(tags::TRAIN_GRADS).unwrap().allocated_bytes >= g);
        assert!(stats.tag(tags::TRAIN_GRADS).unwrap().allocated_bytes < g + 4096 * 28);

        let lp0 = e.score(&seqs(), false).unwrap().log_probs;
        let fresh = full.clone_score(&seqs());
        assert!(
            lp0.equal(&fresh),
            "B = 0: the adapted model starts as the base"
        );
        let mut losses = Vec::new();
        for _ in 0..3 {
            let m = update(&mut e);
            assert!(m.grad_norm.is_finite() && m.grad_norm > 0.0);
            losses.push(m.pg_loss);
        }
        assert_eq!(base_bits(&e), base, "base weights bit-identical ({kind:?})");
        let lp = e.score(&seqs(), false).unwrap().log_probs;
        assert!(rel_diff(&lp, &lp0) > 1e-4, "the adapters moved the policy");
        // The base model (the reference) still scores as at the start.
        let reference = e.base_model().unwrap();
        let ids = seqs().input_ids().shallow_clone();
        let want = full.model().unwrap().forward(&ids).unwrap();
        assert!(reference.forward(&ids).unwrap().equal(&want));
        assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    }
}

trait CloneScore {
    fn clone_score(&self, s: &colo_train::SeqBatch) -> Tensor;
}

impl CloneScore for ColoTrainer {
    /// The model's teacher-forced log-probs, scored on a fresh engine of
    /// the same config.
    fn clone_score(&self, s: &colo_train::SeqBatch) -> Tensor {
        let cfg = TrainerConfig {
            kind: self.kind(),
            cpu_threads: 1,
            ..config(2)
        };
        let mut e = engine_with("tiny-qwen2", &cfg);
        e.score(s, false).unwrap().log_probs
    }
}

#[test]
fn the_rollout_engine_gets_merged_weights_one_layer_at_a_time() {
    let mut e = engine_with("tiny-qwen2", &lora_config(Kind::Float));
    update(&mut e);
    update(&mut e);
    let mut calls = Vec::new();
    let mut seen = HashMap::new();
    e.visit_parameters(&mut |params| {
        calls.push(params.len());
        for (n, t) in params {
            seen.insert(n.clone(), t.copy());
        }
        Ok(())
    })
    .unwrap();
    // The root (embedding, final norm; the head is tied), then 2 layers.
    assert_eq!(calls.len(), 3, "{calls:?}");
    let merged = e.model().unwrap().merged_parameters().unwrap();
    assert_eq!(seen.len(), merged.len());
    let base: HashMap<String, Tensor> = e.model().unwrap().named_parameters().into_iter().collect();
    for (n, t) in &merged {
        assert!(seen[n].equal(t), "{n}");
        let moved = !t.equal(&base[n]);
        let adapted = n.contains("_proj.weight");
        assert_eq!(moved, adapted, "{n}: merged iff adapted");
    }
    // A model built from the merged weights computes the adapted model.
    let model = Model::load(
        e.model().unwrap().config(),
        &colo_model::Weights::from_tensors(seen),
    )
    .unwrap();
    let ids = seqs().input_ids().shallow_clone();
    let want = e.model().unwrap().forward(&ids).unwrap();
    let got = model.forward(&ids).unwrap();
    let diff = (&got - &want).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "{diff}");
    // TrainEngine::named_parameters is the same merged set.
    for (n, t) in TrainEngine::named_parameters(&e) {
        assert!(t.equal(merged.iter().find(|(m, _)| *m == n).map(|x| &x.1).unwrap()));
    }
}

#[test]
fn a_checkpoint_holds_the_merged_model_and_a_peft_adapter_and_resumes_exactly() {
    let dir = scratch_dir("lora-resume").join("ckpt");
    for kind in [Kind::Float, Kind::BFloat16] {
        let cfg = lora_config(kind);
        let mut a = engine_with("tiny-qwen2", &cfg);
        update(&mut a);
        update(&mut a);
        a.save_checkpoint(&dir).unwrap();
        let adapter = dir.join(ADAPTER_DIR);
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(adapter.join(ADAPTER_CONFIG_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(json["peft_type"], "LORA");
        assert_eq!(json["task_type"], "CAUSAL_LM");
        assert_eq!(json["r"], 4);
        assert_eq!(json["lora_alpha"], 8.0);
        assert_eq!(json["target_modules"].as_array().unwrap().len(), 7);
        let base = json["base_model_name_or_path"].as_str().unwrap();
        assert!(base.ends_with("tiny-qwen2"), "{base}");
        let saved = Tensor::read_safetensors(adapter.join(ADAPTER_WEIGHTS_FILE)).unwrap();
        let names: Vec<&str> = saved.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 28);
        assert!(names.contains(&"base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
        // The model half is the merged model, loadable as it is.
        let merged = Model::from_dir(&dir, Kind::Float, tch::Device::Cpu).unwrap();
        let ids = seqs().input_ids().shallow_clone();
        let want = a
            .model()
            .unwrap()
            .forward(&ids)
            .unwrap()
            .to_kind(Kind::Float);
        let got = merged.forward(&ids).unwrap();
        let tol = if kind == Kind::Float { 1e-4 } else { 0.1 };
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(diff < tol, "{kind:?}: {diff}");

        // Resume on a fresh engine from the starting model.
        let mut b = engine_with("tiny-qwen2", &cfg);
        b.load_checkpoint(&dir).unwrap();
        assert_eq!(state_bits(&b), state_bits(&a), "{kind:?}");
        assert_eq!(b.step(), a.step());
        let (ma, mb) = (update(&mut a), update(&mut b));
        assert_eq!(ma.pg_loss.to_bits(), mb.pg_loss.to_bits());
        assert_eq!(state_bits(&b), state_bits(&a), "{kind:?} after a step");
    }
}

#[test]
fn an_engine_starts_from_a_saved_adapter_and_refuses_a_different_one() {
    let dir = scratch_dir("lora-start").join("ckpt");
    let cfg = lora_config(Kind::Float);
    let mut a = engine_with("tiny-qwen2", &cfg);
    update(&mut a);
    a.save_checkpoint(&dir).unwrap();
    let adapter = dir.join(ADAPTER_DIR);
    let mut start = cfg.clone();
    start.lora.as_mut().unwrap().adapter_path = Some(adapter.clone());
    let b = engine_with("tiny-qwen2", &start);
    for ((n, x), (m, y)) in a.parameters().iter().zip(b.parameters()) {
        assert_eq!(n, &m);
        assert!(x.equal(&y), "{n}");
    }
    // Another rank, alpha or targets than the adapter's: an error naming it.
    let pool = || colo_mem::Pool::host(colo_mem::PoolConfig::default()).unwrap();
    let err = |f: &dyn Fn(&mut LoraConfig)| {
        let mut c = start.clone();
        f(c.lora.as_mut().unwrap());
        ColoTrainer::from_dir(pool(), &fixture_dir("tiny-qwen2"), &c)
            .err()
            .expect("refused")
            .to_string()
    };
    assert!(err(&|l| l.rank = 8).contains("r = 4"));
    assert!(err(&|l| l.alpha = 16.0).contains("lora_alpha"));
    let e = err(&|l| l.target_modules = TargetModules::Many(vec!["q_proj".into()]));
    assert!(e.contains("target_modules"), "{e}");
}

#[test]
fn lora_with_sharded_state_and_bad_settings_are_errors() {
    let cfg = lora_config(Kind::Float);
    let pool = colo_mem::Pool::host(colo_mem::PoolConfig::default()).unwrap();
    let dir = fixture_dir("tiny-qwen2");
    let peers = common::in_process::InProcess::group(1).pop().unwrap();
    let e = ColoTrainer::from_dir_sharded(pool, &dir, &cfg, Box::new(peers))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("LoRA"), "{e}");
    let mut bad = cfg.clone();
    bad.lora.as_mut().unwrap().dropout = 0.1;
    let pool = colo_mem::Pool::host(colo_mem::PoolConfig::default()).unwrap();
    let e = ColoTrainer::from_dir(pool, &dir, &bad)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("lora.dropout"), "{e}");
}

#[test]
fn checkpointing_and_lanes_give_the_same_adapter_gradients() {
    let mut one = engine_with("tiny-llama", &lora_config(Kind::Float));
    let mut cfg = lora_config(Kind::Float);
    cfg.gradient_checkpointing = true;
    cfg.cpu_threads = 2;
    let mut two = engine_with("tiny-llama", &cfg);
    // Move B off zero first, so every adapter gets a gradient.
    update(&mut one);
    update(&mut two);
    let seqs = seqs();
    let old = one.score(&seqs, false).unwrap().log_probs;
    let batch = PolicyBatch::new(seqs, &old, &advantages(&common::seqs()), None, None).unwrap();
    one.update_policy(&batch, &LossConfig::default()).unwrap();
    two.update_policy(&batch, &LossConfig::default()).unwrap();
    for ((n, g1), (_, g2)) in one.gradients().iter().zip(two.gradients()) {
        assert!(g1.abs().sum(Kind::Double).double_value(&[]) > 0.0, "{n}");
        assert!(rel_diff(&g2, g1) < 1e-4, "{n}: {}", rel_diff(&g2, g1));
    }
}

/// colo against PEFT + transformers (float32, `testdata/lora-peft`, made by
/// `bench/lora/make_fixture.py`): an engine started from PEFT's saved
/// adapter scores the fixture's tokens with PEFT's log-probabilities and
/// gets PEFT's gradients of A and B for the mean next-token loss.
#[test]
fn log_probs_and_adapter_gradients_match_peft() {
    let cases = [
        (
            "tiny-qwen2",
            4,
            8.0,
            TargetModules::One("all-linear".into()),
        ),
        (
            "tiny-llama",
            2,
            6.0,
            TargetModules::Many(vec!["q_proj".into(), "v_proj".into(), "down_proj".into()]),
        ),
    ];
    for (name, rank, alpha, targets) in cases {
        let fx = fixture_dir("lora-peft").join(name);
        let reference: HashMap<String, Tensor> =
            Tensor::read_safetensors(fx.join("reference.safetensors"))
                .unwrap()
                .into_iter()
                .collect();
        let cfg = TrainerConfig {
            cpu_threads: 1,
            optim: colo_train::OptimConfig {
                grad_clip: None,
                ..config(1).optim
            },
            lora: Some(LoraConfig {
                rank,
                alpha,
                target_modules: targets,
                adapter_path: Some(fx.join("adapter")),
                ..Default::default()
            }),
            ..config(8)
        };
        let mut e = engine_with(name, &cfg);
        let ids = reference["input_ids"].shallow_clone();
        let (b, s) = ids.size2().unwrap();
        let attn = Tensor::ones([b, s], (Kind::Float, tch::Device::Cpu));
        let resp = attn.copy();
        let _ = resp.narrow(1, 0, 1).fill_(0.0);
        let seqs = colo_train::SeqBatch::new(&ids, &attn, &resp).unwrap();
        let lp = e.score(&seqs, false).unwrap().log_probs.narrow(1, 1, s - 1);
        let d = rel_diff(&lp, &reference["logprobs"]);
        assert!(d < 1e-4, "{name}: log-probs differ by {d:e}");
        let m = e.sft_step(&seqs).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fx.join("reference.json")).unwrap())
                .unwrap();
        let want = json["loss"].as_f64().unwrap();
        assert!(
            (m.loss - want).abs() < 1e-5 * want,
            "{name}: loss {} vs {want}",
            m.loss
        );
        let grads = e.gradients();
        assert_eq!(
            grads.len() + 2,
            reference.len(),
            "{name}: one gradient per adapter tensor"
        );
        let mut worst = 0f64;
        for (n, g) in grads {
            let d = rel_diff(&g, &reference[&format!("grad.{n}")]);
            assert!(d < 1e-4, "{name}: `{n}` differs by {d:e}");
            worst = worst.max(d);
        }
        eprintln!("{name}: log-probs {d:.1e}, worst adapter gradient {worst:.1e} (relative)");
    }
}

#[test]
fn a_lora_engine_and_a_full_one_refuse_each_others_checkpoints() {
    let root = scratch_dir("lora-cross");
    let (lora_dir, full_dir) = (root.join("lora"), root.join("full"));
    let mut l = engine_with("tiny-qwen2", &lora_config(Kind::Float));
    l.save_checkpoint(&lora_dir).unwrap();
    let full_cfg = TrainerConfig {
        cpu_threads: 1,
        ..config(2)
    };
    let mut f = engine_with("tiny-qwen2", &full_cfg);
    f.save_checkpoint(&full_dir).unwrap();
    let e = f.load_checkpoint(&lora_dir).unwrap_err().to_string();
    assert!(
        e.contains("lora_adapter/") && e.contains("every weight"),
        "{e}"
    );
    let e = l.load_checkpoint(&full_dir).unwrap_err().to_string();
    assert!(e.contains("no lora_adapter/"), "{e}");
}
