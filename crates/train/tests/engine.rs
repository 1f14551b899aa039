//! The engine's numbers: scoring, gradients, accumulation, clipping,
//! schedules, and the errors of misuse.

mod common;

use colo_algo::{LossAggMode, PolicyLossMode};
use colo_model::loss;
use colo_train::{
    CriticBatch, CriticLossConfig, Error, LossConfig, PolicyBatch, ScheduleKind, SeqBatch,
    TrainEngine, ValueHeadConfig,
};
use common::*;
use tch::{Device, Kind, Tensor};

/// The scoring pass equals the model's own teacher-forced log-probs of
/// each row run alone, whatever the micro-batch size.
#[test]
fn score_matches_unpadded_rows_and_ignores_micro_batching() {
    for name in MODELS {
        let seqs = seqs();
        let mut one = engine(name, 1);
        let mut many = engine(name, 4);
        let a = one.score(&seqs, true).unwrap();
        let b = many.score(&seqs, true).unwrap();
        assert_eq!(a.log_probs.size(), [4, seqs.seq_len() as i64]);
        assert_eq!(a.log_probs.kind(), Kind::Float);
        assert_eq!(a.log_probs.device(), Device::Cpu);
        let d = rel_diff(&a.log_probs, &b.log_probs);
        assert!(
            d < 1e-5,
            "{name}: micro-batch sizes 1 and 4 differ by {d:e}"
        );

        let ids = Vec::<Vec<i64>>::try_from(seqs.input_ids()).unwrap();
        let attn = rows(seqs.attention_mask());
        let resp = rows(seqs.response_mask());
        let lp = rows(&a.log_probs);
        let ent = rows(&a.entropy.unwrap());
        let max_entropy = (384f32).ln();
        for r in 0..4 {
            let n = attn[r].iter().filter(|&&m| m == 1.0).count();
            let row = Tensor::from_slice(&ids[r][..n]).unsqueeze(0);
            let logits = tch::no_grad(|| one.model().unwrap().forward(&row).unwrap());
            let want = rows(&loss::next_token_logprobs(&logits, &row).unwrap());
            for t in 0..seqs.seq_len() {
                if resp[r][t] == 1.0 {
                    assert!(
                        (lp[r][t] - want[0][t - 1]).abs() < 1e-5,
                        "{name} row {r} t {t}"
                    );
                    assert!(ent[r][t] > 0.0 && ent[r][t] <= max_entropy + 1e-4);
                } else {
                    assert_eq!((lp[r][t], ent[r][t]), (0.0, 0.0));
                }
            }
        }
    }
}

/// Through the full actor loss (PPO + entropy bonus + KL loss) every
/// parameter gets a non-zero gradient; for a critic the value head too.
#[test]
fn every_parameter_gets_a_nonzero_gradient() {
    let cfg = LossConfig {
        entropy_coeff: 0.01,
        use_kl_loss: true,
        ..Default::default()
    };
    for name in MODELS {
        let mut e = engine(name, 2);
        let batch = policy_batch(&mut e);
        let m = e.update_policy(&batch, &cfg).unwrap();
        assert!(m.grad_norm > 0.0 && m.kl_loss.is_some());
        for (n, g) in e.gradients() {
            let norm: f32 = to_vec(&g).iter().map(|x| x * x).sum();
            assert!(norm > 0.0, "{name}: `{n}` got no gradient");
        }
    }
    // A critic on the tied model: every body parameter and the head.
    let mut cfg = config(2);
    cfg.value_head = Some(ValueHeadConfig::default());
    let mut critic = engine_with("tiny-qwen2", &cfg);
    let seqs = seqs();
    let values = critic.values(&seqs).unwrap();
    let returns = seqs.response_mask() * 0.7;
    let batch = CriticBatch::new(seqs, &values, &returns).unwrap();
    let m = critic
        .update_critic(&batch, &CriticLossConfig::default())
        .unwrap();
    assert!(m.vf_loss > 0.0 && m.grad_norm > 0.0);
    let names: Vec<String> = critic.gradients().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"v_head.weight".to_owned()));
    for (n, g) in critic.gradients() {
        assert!(
            to_vec(&g).iter().any(|&x| x != 0.0),
            "critic: `{n}` got no gradient"
        );
    }
}

/// The supervised loss over whole sequences is transformers' causal-LM
/// loss, and its gradient accumulated over micro-batches of one row is the
/// fixture's PyTorch gradient (colo-model checks the model's own gradient;
/// this checks the engine's loss and accumulation path against the same
/// reference).
#[test]
fn sft_gradient_over_micro_batches_matches_pytorch() {
    for name in MODELS {
        let dir = fixture_dir(name);
        let reference: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(dir.join("reference.safetensors"))
                .unwrap()
                .into_iter()
                .collect();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let ids = reference["input_ids"].to_kind(Kind::Int64);
        let (b, s) = ids.size2().unwrap();
        let attn = Tensor::ones([b, s], (Kind::Float, Device::Cpu));
        let resp = attn.copy();
        let _ = resp.narrow(1, 0, 1).fill_(0.0);
        let seqs = SeqBatch::new(&ids, &attn, &resp).unwrap();
        let mut e = engine(name, 1);
        let m = e.sft_step(&seqs).unwrap();
        let want = json["loss"].as_f64().unwrap();
        assert!(
            (m.loss - want).abs() < 1e-5,
            "{name}: loss {} vs {want}",
            m.loss
        );
        // The accumulators hold the gradient as the update clipped it.
        let coef = (1.0 / (m.grad_norm + 1e-6)).min(1.0);
        for (n, g) in e.gradients() {
            let r = &reference[&format!("grad.{n}")] * coef;
            let d = rel_diff(&g, &r);
            assert!(d < 1e-4, "{name}: `{n}` differs by {d:e}");
        }
    }
}

/// Gradient accumulation: micro-batches of 1, 3 and 4 rows, and of token
/// budgets that cut the rows (lengths 8, 9, 6, 7) as 1+1+2 and 2+2, give
/// the full-batch gradient and metrics, for each aggregation and for GSPO, GMPO and SAPO.
#[test]
fn accumulated_gradient_equals_full_batch_gradient() {
    let modes = [
        (PolicyLossMode::Vanilla, LossAggMode::TokenMean),
        (PolicyLossMode::Vanilla, LossAggMode::SeqMeanTokenMean),
        (PolicyLossMode::Vanilla, LossAggMode::SeqMeanTokenSumNorm),
        (PolicyLossMode::Gspo, LossAggMode::TokenMean),
        (PolicyLossMode::GeoMean, LossAggMode::TokenMean),
        (PolicyLossMode::Sapo, LossAggMode::TokenMean),
    ];
    for (mode, agg) in modes {
        let mut cfg = LossConfig {
            use_kl_loss: true,
            entropy_coeff: 0.01,
            ..Default::default()
        };
        cfg.policy.loss_mode = mode;
        cfg.policy.loss_agg_mode = agg;
        let mut full = engine("tiny-llama", 4);
        // Off-policy so that clipping is active somewhere.
        let on = policy_batch(&mut full);
        let old = &on.old_log_probs + 0.3;
        let batch = PolicyBatch::new(
            on.seqs.clone(),
            &old,
            &on.advantages,
            on.ref_log_probs.as_ref(),
            None,
        )
        .unwrap();
        let want = full.update_policy(&batch, &cfg).unwrap();
        let engines = [
            ("1 row", engine("tiny-llama", 1)),
            ("3 rows", engine("tiny-llama", 3)),
            ("16 tokens", engine_by_tokens("tiny-llama", 16)),
            ("18 tokens", engine_by_tokens("tiny-llama", 18)),
        ];
        for (mb, mut e) in engines {
            let got = e.update_policy(&batch, &cfg).unwrap();
            for ((n, g), (_, r)) in e.gradients().iter().zip(full.gradients()) {
                let d = rel_diff(g, &r);
                assert!(d < 1e-5, "{mode:?}/{agg:?} mb {mb}: `{n}` differs by {d:e}");
            }
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(close(got.pg_loss, want.pg_loss), "{got:?} vs {want:?}");
            assert!(close(got.pg_clipfrac, want.pg_clipfrac) && close(got.ppo_kl, want.ppo_kl));
            assert!(close(got.entropy, want.entropy) && close(got.grad_norm, want.grad_norm));
            assert!(close(got.kl_loss.unwrap(), want.kl_loss.unwrap()));
        }
        if mode != PolicyLossMode::Sapo {
            // (SAPO has no clip: a soft gate everywhere.)
            assert!(want.pg_clipfrac > 0.0, "{mode:?}: no clipping exercised");
        }
    }
}

/// An on-policy batch may leave π_old to the update: the gradient, the
/// metrics and the state after the step match a batch scored beforehand,
/// and the update writes the log-probs it used into `old_log_probs`.
#[test]
fn old_log_probs_from_the_update_match_a_scored_batch() {
    let cfg = LossConfig {
        use_kl_loss: true,
        entropy_coeff: 0.01,
        ..Default::default()
    };
    let mut scored = engine("tiny-llama", 2);
    let batch = policy_batch(&mut scored);
    let want = scored.update_policy(&batch, &cfg).unwrap();
    let mut e = engine("tiny-llama", 3);
    let garbage = batch.old_log_probs.full_like(7.0);
    let on = PolicyBatch::new(
        batch.seqs.clone(),
        &garbage,
        &batch.advantages,
        batch.ref_log_probs.as_ref(),
        None,
    )
    .unwrap()
    .old_from_update();
    let got = e.update_policy(&on, &cfg).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
    assert!(close(got.pg_loss, want.pg_loss), "{got:?} vs {want:?}");
    assert!(close(got.grad_norm, want.grad_norm) && close(got.entropy, want.entropy));
    assert_eq!((got.pg_clipfrac, got.ppo_kl.abs() < 1e-7), (0.0, true));
    for ((n, g), (_, r)) in e.gradients().iter().zip(scored.gradients()) {
        let d = rel_diff(g, &r);
        assert!(d < 1e-5, "`{n}` differs by {d:e}");
    }
    // The response tokens of `garbage` now hold the scores.
    let mask = batch.seqs.response_mask().shallow_clone();
    assert!(rel_diff(&(&garbage * &mask), &(&batch.old_log_probs * &mask)) < 1e-5);
}

/// The reported norm is the pre-clip norm of the accumulated gradient (an
/// engine without clipping measures it), and the update uses the clipped
/// gradient, which the accumulators keep (visible in AdamW's first moment).
#[test]
fn clipping_reports_the_pre_clip_norm_and_clips_the_update() {
    let norm_of = |e: &colo_train::ColoTrainer| {
        e.gradients()
            .iter()
            .flat_map(|(_, g)| to_vec(g))
            .map(|x| (x as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let mut cfg = config(2);
    cfg.optim.grad_clip = None;
    let mut free = engine_with("tiny-qwen2", &cfg);
    free.sft_step(&seqs()).unwrap();
    let norm = norm_of(&free);
    cfg.optim.grad_clip = Some(0.05);
    let mut e = engine_with("tiny-qwen2", &cfg);
    let m = e.sft_step(&seqs()).unwrap();
    assert!(
        (m.grad_norm - norm).abs() < 1e-6 * norm,
        "{} vs {norm}",
        m.grad_norm
    );
    assert!(m.grad_norm > 0.05, "the test needs clipping to be active");
    let clipped = norm_of(&e);
    assert!((clipped - 0.05).abs() < 1e-5, "clipped to {clipped}");
    for ((n, g), (_, exp_avg, _)) in e.gradients().iter().zip(e.optimizer_state()) {
        // After one step m = (1 − β₁)·g, g clipped.
        assert!(rel_diff(&exp_avg, &(g * 0.1)) < 1e-5, "`{n}`");
    }
}

/// Learning rates follow warmup then cosine, step by step; a few steps of
/// supervised training lower the loss.
#[test]
fn schedule_drives_the_steps_and_training_learns() {
    let mut cfg = config(4);
    cfg.optim.lr = 3e-3;
    cfg.optim.warmup_steps = 2;
    cfg.optim.schedule = ScheduleKind::Cosine;
    cfg.optim.total_steps = Some(6);
    let mut e = engine_with("tiny-qwen2", &cfg);
    let seqs = seqs();
    let ms: Vec<_> = (0..6).map(|_| e.sft_step(&seqs).unwrap()).collect();
    let lrs: Vec<f64> = ms.iter().map(|m| m.lr).collect();
    let sched = cfg.optim.validate().unwrap().schedule;
    assert_eq!(lrs, (0..6).map(|i| sched.lr_at(i)).collect::<Vec<_>>());
    assert_eq!(lrs[0], 1.5e-3);
    assert_eq!(e.step(), 6);
    assert!(
        ms[5].loss < ms[0].loss - 0.1,
        "{:?}",
        ms.iter().map(|m| m.loss).collect::<Vec<_>>()
    );
}

#[test]
fn misuse_is_an_error_naming_the_thing() {
    let mut e = engine("tiny-qwen2", 2);
    let seqs = seqs();
    let err = e.values(&seqs).unwrap_err();
    assert!(matches!(err, Error::NoValueHead { .. }), "{err}");
    let batch = policy_batch(&mut e);
    let no_ref = PolicyBatch::new(
        batch.seqs.clone(),
        &batch.old_log_probs,
        &batch.advantages,
        None,
        None,
    )
    .unwrap();
    let cfg = LossConfig {
        use_kl_loss: true,
        ..Default::default()
    };
    let msg = e.update_policy(&no_ref, &cfg).unwrap_err().to_string();
    assert!(msg.contains("ref_log_probs"), "{msg}");
    let short = Tensor::zeros([4, 3], (Kind::Float, Device::Cpu));
    let msg = PolicyBatch::new(seqs, &short, &short, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("old_log_probs") && msg.contains("(batch, seq)"),
        "{msg}"
    );
}

/// bf16 parameters: scoring stays close to the f32 engine's, the float32
/// master weights round to the parameters after every step, and training
/// learns as in f32.
#[test]
fn bf16_engine_scores_close_to_f32_and_learns() {
    let mut cfg = config(2);
    cfg.optim.lr = 3e-3;
    let mut f32_engine = engine_with("tiny-qwen2", &cfg);
    cfg.kind = Kind::BFloat16;
    let mut e = engine_with("tiny-qwen2", &cfg);
    assert!(e
        .parameters()
        .iter()
        .all(|(_, p)| p.kind() == Kind::BFloat16));
    assert_eq!(e.master_weights().len(), e.parameters().len());
    let seqs = seqs();
    let a = f32_engine.score(&seqs, true).unwrap();
    let b = e.score(&seqs, true).unwrap();
    // Results are float32 on the CPU whatever the engine's kind.
    assert_eq!(b.log_probs.kind(), Kind::Float);
    let ent = b.entropy.as_ref().unwrap();
    assert_eq!((ent.kind(), ent.device()), (Kind::Float, Device::Cpu));
    // bf16 weights and activations: about three significant digits.
    let d = rel_diff(&b.log_probs, &a.log_probs);
    assert!(d < 0.05, "bf16 log-probs differ from f32 by {d:e}");
    let ms: Vec<f64> = (0..6).map(|_| e.sft_step(&seqs).unwrap().loss).collect();
    assert!(ms[5] < ms[0] - 0.1, "{ms:?}");
    for ((n, p), (_, w)) in e.parameters().iter().zip(e.master_weights()) {
        assert!(p.equal(&w.to_kind(Kind::BFloat16)), "`{n}`");
    }
    let (p, g, o) = e.state_bytes();
    let n = e.num_parameters() as u64;
    assert_eq!((p, g, o), (2 * n, 4 * n, 12 * n));
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() {
    if tch::Cuda::is_available() {
        return; // the device path itself is exercised where a GPU exists
    }
    let mut cfg = config(2);
    cfg.device = Device::Cuda(0);
    let pool = colo_mem::Pool::host(colo_mem::PoolConfig::default()).unwrap();
    let err = colo_train::ColoTrainer::from_dir(pool, &fixture_dir("tiny-qwen2"), &cfg)
        .err()
        .unwrap();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("CUDA is not available"), "{err}");
}

#[test]
fn trainer_config_reads_kind_and_device_by_name() {
    let cfg: colo_train::TrainerConfig =
        serde_json::from_str(r#"{"kind": "bf16", "device": "cuda:1"}"#).unwrap();
    assert_eq!((cfg.kind, cfg.device), (Kind::BFloat16, Device::Cuda(1)));
    let default: colo_train::TrainerConfig = serde_json::from_str("{}").unwrap();
    assert_eq!((default.kind, default.device), (Kind::Float, Device::Cpu));
    let json = serde_json::to_value(&cfg).unwrap();
    assert_eq!(
        (&json["kind"], &json["device"]),
        (&"bf16".into(), &"cuda:1".into())
    );
    let msg = serde_json::from_str::<colo_train::TrainerConfig>(r#"{"kind": "f16"}"#)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("kind"), "{msg}");
}

/// On a GPU (`--features cuda`): an engine on CUDA over a CUDA pool takes
/// batches built on the CPU, keeps its state in the pool's tags, gives
/// float32 CPU results close to the CPU engine's, and learns; a host pool
/// for a CUDA engine is an error. Without a GPU there is nothing to run.
#[cfg(feature = "cuda")]
#[test]
fn cuda_engine_takes_cpu_batches_and_gives_cpu_results() {
    use colo_mem::{cuda::CudaBackend, tags, Pool, PoolConfig};
    if !tch::Cuda::is_available() {
        return;
    }
    let mut cfg = config(2);
    let mut cpu = engine_with("tiny-qwen2", &cfg);
    cfg.device = Device::Cuda(0);
    let host = Pool::host(PoolConfig::default()).unwrap();
    let err = colo_train::ColoTrainer::from_dir(host, &fixture_dir("tiny-qwen2"), &cfg)
        .err()
        .unwrap();
    assert!(err.to_string().contains("pool"), "{err}");
    let pool = Pool::new(
        Box::new(CudaBackend::new(0).unwrap()),
        PoolConfig::default(),
    )
    .unwrap();
    let mut e = colo_train::ColoTrainer::from_dir(pool, &fixture_dir("tiny-qwen2"), &cfg).unwrap();
    // On CUDA the caching allocator sub-allocates the tag's segments, so
    // a tensor is inside the pool's range rather than at an allocation's
    // start.
    for (_, p) in e.parameters() {
        assert_eq!(p.device(), Device::Cuda(0));
        assert!(e.pool().contains(colo_train::storage_addr(&p)));
    }
    let (param_bytes, _, _) = e.state_bytes();
    let resident = e
        .pool()
        .stats()
        .tag(tags::TRAIN_PARAMS)
        .unwrap()
        .resident_bytes;
    assert!(resident >= param_bytes, "{resident} < {param_bytes}");
    let seqs = seqs();
    let a = cpu.score(&seqs, true).unwrap();
    let b = e.score(&seqs, true).unwrap();
    assert_eq!(b.log_probs.device(), Device::Cpu);
    let d = rel_diff(&b.log_probs, &a.log_probs);
    assert!(d < 1e-4, "CUDA log-probs differ from the CPU's by {d:e}");
    let adv = advantages(&seqs);
    let batch = PolicyBatch::new(seqs.clone(), &b.log_probs, &adv, None, None).unwrap();
    let m = e.update_policy(&batch, &LossConfig::default()).unwrap();
    assert!(m.grad_norm.is_finite() && m.grad_norm > 0.0, "{m:?}");
    let ms: Vec<f64> = (0..4).map(|_| e.sft_step(&seqs).unwrap().loss).collect();
    assert!(ms[3] < ms[0], "{ms:?}");
}
