//! A sharded load reads only each peer's slice of a checkpoint: saved by
//! 2 or 3 sharded peers (different padding) or by one unsharded trainer,
//! loaded into 1 to 4 peers, every moment, master and weight comes back
//! bit for bit, each peer reads the bytes of its own elements and no more,
//! and the loader never holds more than a chunk of them.
//!
//! The peers are threads joined by an in-process collective.

mod common;

use colo_mem::{Pool, PoolConfig};
use colo_model::{ModelConfig, Weights};
use colo_train::optimizer_shards::ShardLayout;
use colo_train::{ColoTrainer, LossConfig, ShardRead, TrainEngine, TrainerConfig};
use common::in_process::InProcess;
use common::{fixture_dir, peak_resident, resident, scratch_dir};
use tch::{Device, Kind, Tensor};

fn trainer_config() -> TrainerConfig {
    TrainerConfig {
        kind: Kind::BFloat16,
        cpu_threads: 1,
        ..common::config(2)
    }
}

fn sharded(cfg: &TrainerConfig, peer: InProcess) -> ColoTrainer {
    sharded_from(&fixture_dir("tiny-qwen2"), cfg, peer)
}

fn sharded_from(dir: &std::path::Path, cfg: &TrainerConfig, peer: InProcess) -> ColoTrainer {
    let model_cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = Weights::from_dir(dir, Kind::Float, Device::Cpu).unwrap();
    let pool = Pool::host(PoolConfig::default()).unwrap();
    ColoTrainer::new_sharded(pool, &model_cfg, &weights, cfg, Box::new(peer)).unwrap()
}

/// Each unit's (exp_avg, exp_avg_sq, master) as this trainer holds them:
/// a sharded trainer's flat shards, an unsharded one's per-parameter
/// tensors.
fn state(e: &ColoTrainer) -> Vec<[Tensor; 3]> {
    (e.optimizer_state().into_iter().zip(e.master_weights()))
        .map(|((_, m, v), (_, w))| [m.copy(), v.copy(), w.copy()])
        .collect()
}

/// The whole model's weights (gathered when sharded; every peer calls).
fn weights_of(e: &ColoTrainer) -> Vec<(String, Tensor)> {
    e.with_gathered(|t| {
        Ok(t.parameters()
            .into_iter()
            .map(|(n, p)| (n, p.copy()))
            .collect())
    })
    .unwrap()
}

/// The unit of parameter `name`, as a sharded trainer groups them: the
/// root (everything outside the layers), then each layer.
fn unit_of(name: &str) -> usize {
    match name.strip_prefix("model.layers.") {
        Some(rest) => 1 + rest.split('.').next().unwrap().parse::<usize>().unwrap(),
        None => 0,
    }
}

/// Runs `work` on `world` sharded peers, one thread each.
fn on_peers<T: Send>(world: usize, work: impl Fn(ColoTrainer) -> T + Sync) -> Vec<T> {
    let cfg = trainer_config();
    std::thread::scope(|s| {
        let hs: Vec<_> = (InProcess::group(world).into_iter())
            .map(|peer| {
                let (work, cfg) = (&work, &cfg);
                s.spawn(move || work(sharded(cfg, peer)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One update, so the moments are not zero, then a checkpoint in `dir`:
/// each peer's state.
fn train_and_save(e: &mut ColoTrainer, dir: &std::path::Path) -> Vec<[Tensor; 3]> {
    let b = common::policy_batch(e);
    e.update_policy(&b, &LossConfig::default()).unwrap();
    e.save_checkpoint(dir).unwrap();
    state(e)
}

/// Every unit's state, the peers' shards concatenated in rank order.
fn joined(peers: &[Vec<[Tensor; 3]>]) -> Vec<[Tensor; 3]> {
    (0..peers[0].len())
        .map(|u| {
            std::array::from_fn(|k| {
                let parts: Vec<&Tensor> = peers.iter().map(|p| &p[u][k]).collect();
                Tensor::cat(&parts, 0)
            })
        })
        .collect()
}

/// Each unit's elements (the parameters' counts summed, no padding).
fn unit_elements(dir: &std::path::Path) -> Vec<i64> {
    let layout = ShardLayout::read(dir).unwrap();
    (layout.units.iter())
        .map(|u| u.shapes.iter().map(|s| s.iter().product::<i64>()).sum())
        .collect()
}

/// Peer `rank` of `world`'s elements of a unit of `numel` elements: its
/// shard's, padding left out.
fn elements_of(numel: i64, rank: i64, world: i64) -> i64 {
    let n = (numel + world - 1) / world;
    (numel.min((rank + 1) * n) - (rank * n).min(numel)).max(0)
}

/// Loads `dir` into 1 to 4 peers: the state equals `want` (the first
/// `numel[u]` elements of each unit, padding zero), the weights equal
/// `weights`, each peer read exactly its elements' bytes.
fn loads_exactly(
    dir: &std::path::Path,
    want: &[[Tensor; 3]],
    weights: &[(String, Tensor)],
    numel: &[i64],
) {
    for world in 1..=4usize {
        let peers = on_peers(world, |mut e| {
            let read = e.load_sharded_checkpoint(dir).unwrap();
            (state(&e), weights_of(&e), read)
        });
        let (states, rest): (Vec<_>, Vec<_>) =
            (peers.into_iter()).map(|(s, w, r)| (s, (w, r))).unzip();
        for (u, (got, want)) in joined(&states).iter().zip(want).enumerate() {
            for (k, what) in ["exp_avg", "exp_avg_sq", "master"].iter().enumerate() {
                let n = numel[u];
                let at = format!("{world} peers, unit {u}: {what}");
                assert!(
                    got[k].narrow(0, 0, n).equal(&want[k].narrow(0, 0, n)),
                    "{at}"
                );
                let pad = got[k].narrow(0, n, got[k].size()[0] - n);
                assert_eq!(pad.abs().sum(Kind::Float).double_value(&[]), 0.0, "{at}");
            }
        }
        for (got, _) in &rest {
            for ((name, a), (_, b)) in got.iter().zip(weights) {
                assert!(a.equal(b), "{world} peers: weight {name}");
            }
        }
        let reads: Vec<ShardRead> = rest.iter().map(|r| r.1).collect();
        eprintln!("{world} peers: {reads:?}");
        check_bytes(world, numel, &reads);
    }
}

/// Each peer of `world` read its elements' bytes (two bf16 weight bytes
/// and twelve float32 state bytes an element) and no more; the loader's
/// buffer never held more than twice a unit's shard in float32.
fn check_bytes(world: usize, numel: &[i64], reads: &[ShardRead]) {
    let w = world as i64;
    let largest_shard = numel.iter().map(|n| (n + w - 1) / w).max().unwrap() as u64;
    for (rank, read) in reads.iter().enumerate() {
        let mine: i64 = numel.iter().map(|&n| elements_of(n, rank as i64, w)).sum();
        assert_eq!(
            read.bytes_read,
            mine as u64 * (2 + 12),
            "peer {rank} of {world}: {read:?}"
        );
        // About its share of the files (their padding is nobody's).
        let share = read.file_bytes as f64 / world as f64;
        assert!(
            (read.bytes_read as f64) < share * 1.01 + 64.0,
            "peer {rank} of {world}: read {} of {} bytes",
            read.bytes_read,
            read.file_bytes
        );
        assert!(read.peak_bytes > 0 && read.peak_bytes <= 2 * 4 * largest_shard);
    }
}

#[test]
fn a_sharded_checkpoint_loads_into_one_to_four_peers_reading_only_their_slices() {
    for saved in [2usize, 3] {
        let dir = scratch_dir(&format!("slices-{saved}")).join("step-1");
        let dir = &dir;
        let peers = on_peers(saved, |mut e| (train_and_save(&mut e, dir), weights_of(&e)));
        let (states, weights): (Vec<_>, Vec<_>) = peers.into_iter().unzip();
        let numel = unit_elements(dir);
        loads_exactly(dir, &joined(&states), &weights[0], &numel);
        std::fs::remove_dir_all(dir.parent().unwrap()).ok();
    }
}

#[test]
fn an_unsharded_checkpoint_loads_into_peers_reading_only_their_slices() {
    let dir = scratch_dir("slices-unsharded").join("step-1");
    let mut one = common::engine_with("tiny-qwen2", &trainer_config());
    let per_param = train_and_save(&mut one, &dir);
    let weights = weights_of(&one);
    let names: Vec<String> = one.master_weights().into_iter().map(|(n, _)| n).collect();
    let units = 1 + names.iter().map(|n| unit_of(n)).max().unwrap();
    let mut numel = vec![0i64; units];
    let want: Vec<[Tensor; 3]> = (0..units)
        .map(|u| {
            std::array::from_fn(|k| {
                let parts: Vec<Tensor> = (names.iter().zip(&per_param))
                    .filter(|(n, _)| unit_of(n) == u)
                    .map(|(_, s)| s[k].flatten(0, -1))
                    .collect();
                let flat = Tensor::cat(&parts, 0);
                numel[u] = flat.size()[0];
                flat
            })
        })
        .collect();
    loads_exactly(&dir, &want, &weights, &numel);
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}

#[test]
fn a_checkpoint_without_masters_gives_a_peers_masters_from_its_float32_weights() {
    let dir = scratch_dir("slices-f32").join("step-1");
    let f32_cfg = TrainerConfig {
        kind: Kind::Float,
        ..trainer_config()
    };
    let mut one = common::engine_with("tiny-qwen2", &f32_cfg);
    let b = common::policy_batch(&mut one);
    one.update_policy(&b, &LossConfig::default()).unwrap();
    one.save_checkpoint(&dir).unwrap();
    let saved = weights_of(&one);
    let peers = on_peers(2, |mut e| {
        e.load_sharded_checkpoint(&dir).unwrap();
        state(&e)
    });
    // The masters, unflattened in the units' order.
    let masters: Vec<Tensor> = joined(&peers).into_iter().map(|[_, _, w]| w).collect();
    let mut at = vec![0i64; masters.len()];
    for (name, w) in &saved {
        let u = unit_of(name);
        let n = w.numel() as i64;
        let got = masters[u].narrow(0, at[u], n).view_as(w);
        assert!(got.equal(w), "master of {name}: not the float32 weight");
        at[u] += n;
    }
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}

/// A non-finite value found part-way through a load is an error naming
/// the tensor, which says the peer's shards are now partly loaded.
#[test]
fn a_value_found_non_finite_part_way_says_the_shards_are_partly_loaded() {
    let dir = scratch_dir("slices-nan").join("step-1");
    let mut one = common::engine_with("tiny-qwen2", &trainer_config());
    train_and_save(&mut one, &dir);
    let path = dir.join("optimizer.safetensors");
    let mut tensors = Tensor::read_safetensors(&path).unwrap();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let (name, t) = tensors
        .iter_mut()
        .rev()
        .find(|(n, _)| n.ends_with(".exp_avg"))
        .unwrap();
    let name = name.clone();
    let _ = t.view(-1).get(0).fill_(f64::NAN);
    Tensor::write_safetensors(&tensors, &path).unwrap();
    let errors = on_peers(1, |mut e| {
        e.load_sharded_checkpoint(&dir).unwrap_err().to_string()
    });
    assert!(
        errors[0].contains(&name) && errors[0].contains("partly loaded"),
        "{}",
        errors[0]
    );
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}

/// The resident set while each of two sharded peers of the model in
/// `COLO_LOAD_MODEL` (e.g. `colo init-model --preset qwen2.5-0.5b`) loads
/// the checkpoint they saved, one peer at a time: it rises by the loader's
/// chunks, not by the state. Needs ~12 GB at 0.5 B.
#[test]
#[ignore = "a measurement: COLO_LOAD_MODEL=DIR cargo test -- --ignored"]
fn the_resident_set_of_a_sharded_load_rises_by_chunks_not_by_the_state() {
    let model = std::path::PathBuf::from(std::env::var("COLO_LOAD_MODEL").unwrap());
    let dir = scratch_dir("resident").join("step-0");
    let (cfg, one_at_a_time) = (trainer_config(), std::sync::Mutex::new(()));
    let after_save = std::sync::Barrier::new(2);
    let reports: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (InProcess::group(2).into_iter())
            .map(|peer| {
                let (cfg, dir, model) = (&cfg, &dir, &model);
                let (lock, after_save) = (&one_at_a_time, &after_save);
                s.spawn(move || {
                    let mut e = {
                        let _one = lock.lock().unwrap();
                        sharded_from(model, cfg, peer)
                    };
                    e.save_checkpoint(dir).unwrap();
                    after_save.wait();
                    let _one = lock.lock().unwrap();
                    let before = resident();
                    let (read, peak) = peak_resident(|| e.load_sharded_checkpoint(dir).unwrap());
                    (before, peak, read)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, (before, peak, read)) in reports.iter().enumerate() {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        eprintln!(
            "peer {rank}: resident {:.0} MiB before the load, peak {:+.1} MiB during it; \
             read {:.0} of {:.0} MiB, loader's peak {:.1} MiB",
            mib(*before),
            mib(peak.saturating_sub(*before)),
            mib(read.bytes_read),
            mib(read.file_bytes),
            mib(read.peak_bytes)
        );
        let bound = (read.bytes_read / 8).max(64 << 20);
        assert!(
            peak.saturating_sub(*before) < bound,
            "peer {rank}: {read:?}"
        );
    }
    std::fs::remove_dir_all(dir.parent().unwrap()).ok();
}
