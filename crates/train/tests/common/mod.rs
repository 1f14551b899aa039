//! Shared helpers of the integration tests: fixture engines and batches.
#![allow(dead_code)]

pub mod in_process;

use std::path::PathBuf;
use std::sync::Arc;

use colo_mem::{Pool, PoolConfig};
use colo_train::{
    ColoTrainer, MicroBatchConfig, OptimConfig, PolicyBatch, SeqBatch, TrainEngine, TrainerConfig,
};
use tch::{Kind, Tensor};

pub const MODELS: [&str; 2] = ["tiny-qwen2", "tiny-llama"];

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// A scratch directory unique to this process and test.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("colo-train-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A config with a learning rate large enough to move the tiny models.
pub fn config(micro_batch_size: usize) -> TrainerConfig {
    TrainerConfig {
        optim: OptimConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            grad_clip: Some(1.0),
            ..Default::default()
        },
        micro_batch: MicroBatchConfig {
            micro_batch_size,
            ..Default::default()
        },
        ..Default::default()
    }
}

pub fn engine_with(name: &str, cfg: &TrainerConfig) -> ColoTrainer {
    let pool = Pool::host(PoolConfig::default()).unwrap();
    ColoTrainer::from_dir(pool, &fixture_dir(name), cfg).unwrap()
}

pub fn engine(name: &str, micro_batch_size: usize) -> ColoTrainer {
    engine_with(name, &config(micro_batch_size))
}

/// Micro-batches of consecutive rows within `max_tokens` padded tokens.
pub fn engine_by_tokens(name: &str, max_tokens: usize) -> ColoTrainer {
    let mut cfg = config(1);
    cfg.micro_batch.max_tokens = Some(max_tokens);
    engine_with(name, &cfg)
}

pub fn pool_of(e: &ColoTrainer) -> &Arc<Pool> {
    e.pool()
}

/// Four right-padded (prompt, response) rows of different lengths, ids in
/// the fixtures' vocabulary.
pub fn seqs() -> SeqBatch {
    let tok = |i: usize, j: usize| ((i * 37 + j * 11) % 370 + 3) as u32;
    let rows: Vec<(Vec<u32>, Vec<u32>)> = [(3, 5), (2, 7), (4, 2), (1, 6)]
        .iter()
        .enumerate()
        .map(|(i, &(p, r))| {
            (
                (0..p).map(|j| tok(i, j)).collect(),
                (p..p + r).map(|j| tok(i, j)).collect(),
            )
        })
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = rows.iter().map(|(p, r)| (&p[..], &r[..])).collect();
    SeqBatch::from_prompt_response(&pairs, 0).unwrap()
}

/// Advantages that differ by row and token, zero off the response.
pub fn advantages(seqs: &SeqBatch) -> Tensor {
    let (b, s) = (seqs.batch_size(), seqs.seq_len());
    let v: Vec<f32> = (0..b * s)
        .map(|k| ((k * 7) % 5) as f32 * 0.5 - 1.0)
        .collect();
    Tensor::from_slice(&v).view([b as i64, s as i64]) * seqs.response_mask()
}

/// An on-policy batch: old log-probs scored by the engine itself, and a
/// reference that differs a little from them.
pub fn policy_batch(e: &mut ColoTrainer) -> PolicyBatch {
    let seqs = seqs();
    let old = e.score(&seqs, false).unwrap().log_probs;
    let reference = &old - 0.1;
    let adv = advantages(&seqs);
    PolicyBatch::new(seqs, &old, &adv, Some(&reference), None).unwrap()
}

/// Every element as float32, flattened.
pub fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(&t.flatten(0, -1).to_kind(Kind::Float)).unwrap()
}

/// A (batch, seq) tensor as host rows of float32.
pub fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    Vec::<Vec<f32>>::try_from(&t.to_kind(Kind::Float)).unwrap()
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (to_vec(a), to_vec(b));
    let num: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Every parameter, moment and master weight, as bits.
pub fn state_bits(e: &ColoTrainer) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = e
        .parameters()
        .iter()
        .map(|(_, t)| to_vec(t).iter().map(|x| x.to_bits()).collect())
        .collect();
    for (_, m, v) in e.optimizer_state() {
        out.push(to_vec(&m).iter().map(|x| x.to_bits()).collect());
        out.push(to_vec(&v).iter().map(|x| x.to_bits()).collect());
    }
    for (_, w) in e.master_weights() {
        out.push(to_vec(&w).iter().map(|x| x.to_bits()).collect());
    }
    out
}

/// Three prompts (4, 2 and 6 tokens), two samples each, responses of
/// different lengths.
pub fn grouped() -> SeqBatch {
    let tok = |i: usize, j: usize| ((i * 41 + j * 13) % 350 + 3) as u32;
    let prompts: Vec<Vec<u32>> = [4, 2, 6]
        .iter()
        .enumerate()
        .map(|(g, &n)| (0..n).map(|j| tok(g, j)).collect())
        .collect();
    let rows: Vec<(Vec<u32>, Vec<u32>)> = [(0, 3), (0, 5), (1, 2), (1, 6), (2, 1), (2, 4)]
        .iter()
        .enumerate()
        .map(|(r, &(g, n))| (prompts[g].clone(), (0..n).map(|j| tok(7 + r, j)).collect()))
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = rows.iter().map(|(p, r)| (&p[..], &r[..])).collect();
    SeqBatch::from_prompt_response(&pairs, 0).unwrap()
}

/// 16 rows of a 20-token prompt and a 40-token response (token ids within
/// the fixtures' vocabulary): the batch the peak-memory tests compare
/// micro-batch settings on.
pub fn sixteen_rows_of_sixty_tokens() -> SeqBatch {
    let tok = |i: usize, j: usize| ((i * 37 + j * 11) % 370 + 3) as u32;
    let rows: Vec<(Vec<u32>, Vec<u32>)> = (0..16)
        .map(|i| {
            (
                (0..20).map(|j| tok(i, j)).collect(),
                (20..60).map(|j| tok(i, j)).collect(),
            )
        })
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = rows.iter().map(|(p, r)| (&p[..], &r[..])).collect();
    SeqBatch::from_prompt_response(&pairs, 0).unwrap()
}

/// The update's peak of allocated bytes above the training state, for a
/// policy update of `seqs` on the tiny Llama fixture with `cfg` on one
/// lane (peaks that do not depend on timing).
pub fn update_peak_above_state(mut cfg: TrainerConfig, seqs: &SeqBatch) -> u64 {
    cfg.cpu_threads = 1;
    let mut e = engine_with("tiny-llama", &cfg);
    let old = e.score(seqs, false).unwrap().log_probs;
    let batch = PolicyBatch::new(seqs.clone(), &old, &advantages(seqs), None, None).unwrap();
    let state = e.pool().stats().resident_bytes;
    e.pool().reset_peak();
    e.update_policy(&batch, &colo_train::LossConfig::default())
        .unwrap();
    e.pool().stats().peak_allocated_bytes - state
}

/// This process's resident bytes (`VmRSS`).
pub fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

/// `work`'s result and the most resident bytes seen while it ran
/// (sampled every millisecond).
pub fn peak_resident<T>(work: impl FnOnce() -> T) -> (T, u64) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = resident();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(resident());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            peak.max(resident())
        });
        let out = work();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (out, sampler.join().unwrap())
    })
}
