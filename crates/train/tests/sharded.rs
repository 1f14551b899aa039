//! Sharded data parallelism (issue 37): two or four peers, each keeping
//! its share of the parameters, gradients and AdamW state and holding
//! its share of the batch, train like one unsharded trainer with the
//! whole batch; each keeps ~1/N of the state's bytes; their checkpoint is
//! an ordinary one that loads into any number of peers.
//!
//! The peers are threads joined by an in-process collective (colo-py's
//! tests run the same trainer over torch.distributed's gloo across
//! processes).

mod common;

use colo_algo::LossAggMode;
use colo_mem::{tags, Pool, PoolConfig};
use colo_model::{ModelConfig, Weights};
use colo_train::{
    ColoTrainer, LossConfig, PolicyBatch, PolicyMetrics, SeqBatch, TrainEngine, TrainerConfig,
};
use common::in_process::InProcess;
use common::{config, fixture_dir, scratch_dir};
use tch::{Device, Kind, Tensor};

/// Eight (prompt, response) rows of different lengths.
fn rows() -> Vec<(Vec<u32>, Vec<u32>)> {
    let tok = |i: usize, j: usize| ((i * 37 + j * 11) % 370 + 3) as u32;
    [
        (3, 5),
        (2, 7),
        (4, 2),
        (1, 6),
        (2, 3),
        (3, 8),
        (5, 4),
        (2, 2),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(p, r))| {
        (
            (0..p).map(|j| tok(i, j)).collect(),
            (p..p + r).map(|j| tok(i, j)).collect(),
        )
    })
    .collect()
}

fn seqs_of(range: std::ops::Range<usize>) -> SeqBatch {
    let all = rows();
    let pairs: Vec<(&[u32], &[u32])> = all[range].iter().map(|(p, r)| (&p[..], &r[..])).collect();
    SeqBatch::from_prompt_response(&pairs, 0).unwrap()
}

/// Rows `range` as a policy batch scored by `e` (every peer scores at once:
/// a sharded trainer's scoring gathers), advantages by global row.
fn batch_of(e: &mut ColoTrainer, range: std::ops::Range<usize>, step: usize) -> PolicyBatch {
    let seqs = seqs_of(range.clone());
    let (b, s) = (seqs.batch_size(), seqs.seq_len());
    let adv: Vec<f32> = (0..b * s)
        .map(|k| (((range.start + k / s) * 3 + (k % s) * 7 + step) % 5) as f32 * 0.5 - 1.0)
        .collect();
    let adv = Tensor::from_slice(&adv).view([b as i64, s as i64]) * seqs.response_mask();
    let old = e.score(&seqs, false).unwrap().log_probs;
    let reference = &old - 0.1;
    PolicyBatch::new(seqs, &old, &adv, Some(&reference), None).unwrap()
}

fn loss() -> LossConfig {
    let mut cfg = LossConfig {
        use_kl_loss: true,
        ..Default::default()
    };
    cfg.policy.loss_agg_mode = LossAggMode::TokenMean;
    cfg
}

fn trainer_config(kind: Kind) -> TrainerConfig {
    TrainerConfig {
        kind,
        cpu_threads: 1,
        ..config(2)
    }
}

fn sharded(name: &str, cfg: &TrainerConfig, peer: InProcess) -> ColoTrainer {
    let dir = fixture_dir(name);
    let model_cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = Weights::from_dir(&dir, Kind::Float, Device::Cpu).unwrap();
    let pool = Pool::host(PoolConfig::default()).unwrap();
    ColoTrainer::new_sharded(pool, &model_cfg, &weights, cfg, Box::new(peer)).unwrap()
}

/// The whole model's parameters as float32 copies (gathered when sharded).
fn weights_of(e: &ColoTrainer) -> Vec<(String, Tensor)> {
    e.with_gathered(|t| {
        Ok(t.parameters()
            .into_iter()
            .map(|(n, p)| (n, p.to_kind(Kind::Float).copy()))
            .collect())
    })
    .unwrap()
}

/// Bytes the pool holds in `tag`.
fn tag_bytes(e: &ColoTrainer, tag: &str) -> u64 {
    e.pool().stats().tag(tag).map_or(0, |t| t.allocated_bytes)
}

/// `world` sharded peers, `steps` updates, each peer with its contiguous
/// share of the rows; `work(peer, rank)` runs after the updates on each
/// peer's thread. The metrics of every step on every peer, and the work's
/// results.
fn run_peers<T: Send>(
    world: usize,
    cfg: &TrainerConfig,
    steps: usize,
    work: impl Fn(&mut ColoTrainer, usize) -> T + Sync,
) -> Vec<(Vec<PolicyMetrics>, T)> {
    let n = rows().len();
    std::thread::scope(|s| {
        let handles: Vec<_> = InProcess::group(world)
            .into_iter()
            .enumerate()
            .map(|(rank, peer)| {
                let work = &work;
                s.spawn(move || {
                    let mut e = sharded("tiny-qwen2", cfg, peer);
                    let mine = rank * n / world..(rank + 1) * n / world;
                    let metrics = (0..steps)
                        .map(|step| {
                            let b = batch_of(&mut e, mine.clone(), step);
                            e.update_policy(&b, &loss()).unwrap()
                        })
                        .collect();
                    (metrics, work(&mut e, rank))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() <= tol * b.abs() + 1e-6,
        "{what}: sharded {a} vs one trainer {b}"
    );
}

#[test]
fn sharded_peers_train_like_one_trainer_for_three_steps() {
    let cfg = trainer_config(Kind::Float);
    let mut one = common::engine_with("tiny-qwen2", &cfg);
    let m1: Vec<PolicyMetrics> = (0..3)
        .map(|step| {
            let b = batch_of(&mut one, 0..rows().len(), step);
            one.update_policy(&b, &loss()).unwrap()
        })
        .collect();
    let want = weights_of(&one);
    for world in [2, 4] {
        let peers = run_peers(world, &cfg, 3, |e, _| weights_of(e));
        for (step, m) in m1.iter().enumerate() {
            for (metrics, _) in &peers {
                let m2 = &metrics[step];
                let at = |k: &str| format!("{world} peers, step {step}: {k}");
                close(m2.grad_norm, m.grad_norm, 1e-4, &at("grad_norm"));
                close(m2.pg_loss, m.pg_loss, 1e-4, &at("pg_loss"));
                close(m2.entropy, m.entropy, 1e-4, &at("entropy"));
                close(
                    m2.kl_loss.unwrap(),
                    m.kl_loss.unwrap(),
                    1e-4,
                    &at("kl_loss"),
                );
            }
        }
        let fresh = weights_of(&common::engine_with("tiny-qwen2", &cfg));
        for (_, got) in &peers {
            for (((name, g), (_, w)), (_, f)) in got.iter().zip(&want).zip(&fresh) {
                let moved = (w - f).norm().double_value(&[]);
                let off = (g - w).norm().double_value(&[]);
                assert!(
                    off <= 1e-3 * moved.max(1e-6),
                    "{world} peers: {name} is {off} from one trainer's (the update moved it {moved})"
                );
            }
        }
    }
}

#[test]
fn each_peer_keeps_its_share_of_the_state_bytes() {
    for kind in [Kind::Float, Kind::BFloat16] {
        let cfg = trainer_config(kind);
        let one = common::engine_with("tiny-qwen2", &cfg);
        let whole: Vec<u64> = [tags::TRAIN_PARAMS, tags::TRAIN_GRADS, tags::OPTIMIZER]
            .iter()
            .map(|t| tag_bytes(&one, t))
            .collect();
        for world in [2, 4] {
            let peers = run_peers(world, &cfg, 1, |e, _| {
                let held = [tags::TRAIN_PARAMS, tags::TRAIN_GRADS, tags::OPTIMIZER]
                    .map(|t| tag_bytes(e, t));
                // The state's accessors name the units' shards.
                let names: Vec<String> = e.gradients().into_iter().map(|(n, _)| n).collect();
                assert_eq!(names, ["root", "model.layers.0", "model.layers.1"]);
                assert_eq!(e.state_names(), names);
                assert_eq!(e.optimizer_state().len(), 3);
                // Between passes no gathered weight is left in use.
                let gathered = e
                    .pool()
                    .stats()
                    .tag(tags::GATHERED_PARAMS)
                    .map_or(0, |t| t.allocated_bytes);
                (held, gathered)
            });
            for (_, (held, gathered)) in &peers {
                assert_eq!(*gathered, 0, "gathered weights outlived the passes");
                for ((tag, h), w) in ["train_params", "train_grads", "optimizer"]
                    .iter()
                    .zip(held)
                    .zip(&whole)
                {
                    let share = *h as f64 / *w as f64;
                    let want = 1.0 / world as f64;
                    assert!(
                        (share - want).abs() < 0.02,
                        "{kind:?}, {world} peers: {tag} holds {h} bytes, {share:.3} of one trainer's {w}"
                    );
                }
            }
        }
    }
}

/// A weight sync's visit gathers every unit once: each peer sends its
/// shard of each unit to the `N − 1` others and receives theirs, each
/// unit padded to a multiple of `N` (the count from the buffers the
/// collective was handed, against the units recomputed from the names and
/// shapes here). The training passes' gathers are counted too, before it.
#[test]
fn a_weight_sync_moves_every_units_shards_once() {
    for kind in [Kind::Float, Kind::BFloat16] {
        let cfg = trainer_config(kind);
        let one = common::engine_with("tiny-qwen2", &cfg);
        let mut units: std::collections::BTreeMap<String, u64> = Default::default();
        for (name, p) in TrainEngine::named_parameters(&one) {
            let unit = match name.strip_prefix("model.layers.") {
                Some(rest) => rest.split('.').next().unwrap().to_owned(),
                None => "root".into(),
            };
            *units.entry(unit).or_default() += p.numel() as u64;
        }
        assert_eq!(units.len(), 3, "{units:?}");
        let elt = kind.elt_size_in_bytes() as u64;
        for world in [2u64, 4] {
            let per_peer: u64 = units.values().map(|n| n.div_ceil(world)).sum();
            let want = per_peer * (world - 1) * elt;
            let peers = run_peers(world as usize, &cfg, 1, |e, _| {
                let before = e.gathered_traffic().unwrap();
                e.visit_parameters(&mut |_| Ok(())).unwrap();
                (before, e.gathered_traffic().unwrap().since(before))
            });
            for (_, (trained, sync)) in &peers {
                assert!(trained.received > want, "{kind:?}, {world}: {trained:?}");
                assert_eq!(
                    (sync.sent, sync.received),
                    (want, want),
                    "{kind:?}, {world} peers"
                );
            }
        }
    }
    let one = common::engine_with("tiny-qwen2", &trainer_config(Kind::Float));
    assert_eq!(one.gathered_traffic(), None);
}

#[test]
fn sharded_scores_equal_one_trainers() {
    let cfg = trainer_config(Kind::Float);
    let mut one = common::engine_with("tiny-qwen2", &cfg);
    let want = one.score(&seqs_of(0..8), true).unwrap();
    let got: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (InProcess::group(2).into_iter().enumerate())
            .map(|(rank, peer)| {
                let cfg = &cfg;
                s.spawn(move || {
                    let mut e = sharded("tiny-qwen2", cfg, peer);
                    // Peer 1 scores fewer micro-batches: it still takes part.
                    let rows = if rank == 0 { 0..8 } else { 0..1 };
                    e.score(&seqs_of(rows), true).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let d = (&got[0].log_probs - &want.log_probs)
        .abs()
        .max()
        .double_value(&[]);
    assert!(d < 1e-5, "log-probs differ by {d}");
    let e = (got[0].entropy.as_ref().unwrap() - want.entropy.as_ref().unwrap())
        .abs()
        .max()
        .double_value(&[]);
    assert!(e < 1e-5, "entropy differs by {e}");
}

#[test]
fn a_sharded_checkpoint_resumes_on_one_trainer_and_on_other_peer_counts() {
    let cfg = trainer_config(Kind::BFloat16);
    let dir = scratch_dir("sharded-checkpoint").join("step-2");
    let dir = &dir;
    let peers = run_peers(2, &cfg, 2, |e, _| {
        e.save_checkpoint(dir).unwrap();
        weights_of(e)
    });
    let saved = &peers[0].1;
    // The optimizer state stays sharded: one file a peer and their layout.
    for f in [
        "optimizer_shards.json",
        "optimizer-rank-0-of-2.safetensors",
        "optimizer-rank-1-of-2.safetensors",
    ] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    assert!(!dir.join("optimizer.safetensors").exists());
    let staged = dir.parent().unwrap().read_dir().unwrap().count();
    assert_eq!(staged, 1, "only the checkpoint is left beside it");
    colo_train::checkpoint::check_complete(dir).unwrap();
    // One unsharded trainer: the same weights, then the same next step as
    // four sharded peers loaded from the same checkpoint.
    let mut one = common::engine_with("tiny-qwen2", &cfg);
    one.load_checkpoint(dir).unwrap();
    for ((name, a), (_, b)) in weights_of(&one).iter().zip(saved) {
        assert!(a.equal(b), "{name} differs after loading");
    }
    let b = batch_of(&mut one, 0..rows().len(), 2);
    let m1 = one.update_policy(&b, &loss()).unwrap();
    let after = weights_of(&one);
    let n = rows().len();
    let four: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (InProcess::group(4).into_iter().enumerate())
            .map(|(rank, peer)| {
                let cfg = &cfg;
                s.spawn(move || {
                    let mut e = sharded("tiny-qwen2", cfg, peer);
                    e.load_checkpoint(dir).unwrap();
                    assert_eq!(e.step(), 2);
                    let b = batch_of(&mut e, rank * n / 4..(rank + 1) * n / 4, 2);
                    (e.update_policy(&b, &loss()).unwrap(), weights_of(&e))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    close(
        four[0].0.grad_norm,
        m1.grad_norm,
        1e-2,
        "grad_norm after resume",
    );
    for ((name, a), (_, b)) in four[0].1.iter().zip(&after) {
        let d = (a - b).abs().max().double_value(&[]);
        // bf16 weights: within a few ulps of the unsharded update.
        assert!(
            d <= 2e-2 * b.abs().max().double_value(&[]).max(1e-3),
            "{name}: {d}"
        );
    }
    // A shard missing: the checkpoint is incomplete, naming the file.
    std::fs::remove_file(dir.join("optimizer-rank-1-of-2.safetensors")).unwrap();
    let err = colo_train::checkpoint::check_complete(dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("optimizer-rank-1-of-2.safetensors"), "{err}");
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}

#[test]
fn a_mismatched_collective_is_refused() {
    let cfg = trainer_config(Kind::Float);
    let mut one = common::engine_with("tiny-qwen2", &cfg);
    let e = sharded("tiny-qwen2", &cfg, InProcess::group(1).pop().unwrap());
    assert!(e.is_sharded() && e.writes_checkpoints());
    assert!(!one.is_sharded());
    let mut e = e;
    let err = e.set_collective(None).unwrap_err().to_string();
    assert!(err.contains("sharded trainer"), "{err}");
    drop(one.set_collective(None));
    // A critic stays whole: a value head is refused, naming it.
    let dir = fixture_dir("tiny-qwen2");
    let with_head = TrainerConfig {
        value_head: Some(Default::default()),
        ..cfg
    };
    let err = ColoTrainer::from_dir_sharded(
        Pool::host(PoolConfig::default()).unwrap(),
        &dir,
        &with_head,
        Box::new(InProcess::group(1).pop().unwrap()),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("value head"), "{err}");
}
