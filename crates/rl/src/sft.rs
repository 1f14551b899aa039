//! Supervised fine-tuning of the built-in model on the built-in task: what
//! `colo sft` runs, and how the committed starting checkpoint
//! (`crates/rl/builtin/model.safetensors`) was made.
//!
//! From a seeded random initialisation, each step takes a seeded batch of
//! training problems — the prompt's tokens (with BOS), then the answer and
//! the end-of-sequence token as the response — and runs one colo-train
//! [`TrainEngine::sft_step`] (token-mean cross-entropy on the response,
//! AdamW, constant learning rate after a short warmup). Every `eval_every`
//! steps the weights are handed to a colo-rollout engine in memory (as the
//! RL loop does) and [`crate::eval::evaluate`] measures greedy accuracy and
//! pass@k on the held-out problems.
//!
//! Why a *constant* learning rate: the starting checkpoint is an early
//! point of this run, picked where greedy accuracy is still partial and
//! pass@8 is high (see `crates/rl/README.md`). With a constant schedule the
//! weights after step `s` do not depend on the total number of steps, so
//! `--steps s` reproduces exactly the point that the periodic evaluation
//! measured.

use std::path::{Path, PathBuf};

use colo_mem::{Pool, PoolConfig};
use colo_model::{ModelConfig, Tokenizer, Weights};
use colo_rollout::{Engine, EngineConfig};
use colo_train::{
    ColoTrainer, MicroBatchConfig, OptimConfig, SeqBatch, TrainEngine, TrainerConfig,
};
use tch::Tensor;

use crate::data::{Batches, Dataset, Fields};
use crate::eval::{evaluate, EvalConfig, EvalResult};
use crate::rng::SplitMix64;
use crate::task::{self, ArithmeticTask};
use crate::{reward, vocab, Error, Result, RewardSpec};

/// The settings of an SFT run. The defaults made the committed checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct SftConfig {
    pub steps: usize,
    /// Peak (and, after warmup, constant) learning rate.
    pub lr: f64,
    pub warmup_steps: usize,
    /// Problems per step.
    pub batch_size: usize,
    /// Seeds the initial weights and the order of the batches.
    pub seed: u64,
    /// Evaluate every this many steps (0: only at the end).
    pub eval_every: usize,
    /// Samples per prompt for pass@k (0: greedy accuracy only).
    pub eval_k: usize,
    /// Held-out problems evaluated (`None`: all).
    pub eval_limit: Option<usize>,
    /// Standard deviation of the initial weight matrices.
    pub init_std: f64,
    pub task: ArithmeticTask,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            steps: DEFAULT_STEPS,
            lr: DEFAULT_LR,
            warmup_steps: 10,
            batch_size: DEFAULT_BATCH_SIZE,
            seed: DEFAULT_SEED,
            eval_every: 100,
            eval_k: 8,
            eval_limit: None,
            init_std: 0.02,
            task: ArithmeticTask::default(),
        }
    }
}

/// The settings that made the committed checkpoint (`colo sft`'s defaults).
pub const DEFAULT_STEPS: usize = 640;
pub const DEFAULT_LR: f64 = 1e-3;
pub const DEFAULT_BATCH_SIZE: usize = 64;
pub const DEFAULT_SEED: u64 = 0;

/// Longest answer: three digits and the end-of-sequence token, plus slack
/// so a model that does not stop is seen as wrong, not cut to right.
const MAX_NEW_TOKENS: usize = 6;

/// What the run reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum SftEvent {
    /// After optimizer step `step` (1-based): the batch's mean token loss.
    Step { step: usize, loss: f64, lr: f64 },
    /// The held-out evaluation after step `step` (0: the initialisation).
    Eval { step: usize, result: EvalResult },
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct SftReport {
    /// Loss of every step, in order.
    pub losses: Vec<f64>,
    /// Every evaluation, by step.
    pub evals: Vec<(usize, EvalResult)>,
    /// The checkpoint directory (config, weights, tokenizer).
    pub out: PathBuf,
}

/// Runs SFT and writes a Hugging Face checkpoint of the final weights to
/// `out` (`config.json`, `model.safetensors`, `tokenizer.json`,
/// `tokenizer_config.json`; the task's JSONL under `out/data/`).
pub fn run(cfg: &SftConfig, out: &Path, mut on_event: impl FnMut(&SftEvent)) -> Result<SftReport> {
    if cfg.steps == 0 || cfg.batch_size == 0 {
        return Err(Error::Dataset(
            "SFT needs steps and batch_size of at least 1".into(),
        ));
    }
    let (train_path, val_path) = cfg.task.write_jsonl(&out.join("data"))?;
    task::write_model_files(out)?;
    let tokenizer = Tokenizer::from_dir(out)?;
    let train = Dataset::from_files(&[train_path], &Fields::default(), None)?;
    let val = Dataset::from_files(&[val_path], &Fields::default(), None)?;
    let examples = tokenize(&train, &tokenizer)?;

    let model_cfg = task::model_config();
    let weights = random_weights(&model_cfg, cfg.init_std, cfg.seed)?;
    let pool = Pool::host(PoolConfig::default())?;
    let mut trainer = ColoTrainer::new(pool.clone(), &model_cfg, &weights, &trainer_config(cfg))
        .map_err(|e| Error::context("building the SFT trainer", e))?;
    // Enough KV for the engine's largest decode batch of short sequences.
    let engine_cfg = EngineConfig::with_kv_tokens(16 * 1024);
    let mut engine = Engine::new(
        &model_cfg,
        &weights,
        Some(tokenizer.clone()),
        pool,
        &engine_cfg,
    )
    .map_err(|e| Error::context("building the evaluation engine", e))?;
    drop(weights);
    let mut reward = reward::build(&RewardSpec::ExactMatch {})?;
    let eval_cfg = EvalConfig {
        k: cfg.eval_k,
        seed: cfg.seed,
        limit: cfg.eval_limit,
        ..EvalConfig::greedy(MAX_NEW_TOKENS, model_cfg.eos_token_ids.clone())
    };

    let batches = Batches::new(&train, cfg.batch_size, cfg.seed, true, "the batch size")?;
    let mut report = SftReport {
        losses: Vec::with_capacity(cfg.steps),
        evals: Vec::new(),
        out: out.to_owned(),
    };
    for (i, batch) in batches.from_step(0).take(cfg.steps).enumerate() {
        let step = i + 1;
        let pairs: Vec<(&[u32], &[u32])> = batch
            .prompts
            .iter()
            .map(|p| {
                let (q, a) = &examples[p.prompt_id as usize];
                (q.as_slice(), a.as_slice())
            })
            .collect();
        let seqs = SeqBatch::from_prompt_response(&pairs, vocab::PAD_ID)?;
        let m = trainer
            .sft_step(&seqs)
            .map_err(|e| Error::context(format!("SFT step {step}"), e))?;
        // A blown-up model shows as a loss that is not a number, or (where
        // the norms' sums overflow to a uniform output, as on AVX-512 EPYC
        // CPUs) as a gradient norm that is not: the trainer skips such an
        // update, and every later step would repeat the same loss.
        let what = if !m.loss.is_finite() {
            Some(("loss", m.loss))
        } else if !m.grad_norm.is_finite() {
            Some(("gradient norm", m.grad_norm))
        } else {
            None
        };
        if let Some((what, value)) = what {
            return Err(Error::Diverged(format!(
                "SFT step {step}: the {what} is {value}: training diverged (lr {:e}); lower the \
                 learning rate. No checkpoint was written",
                cfg.lr
            )));
        }
        report.losses.push(m.loss);
        on_event(&SftEvent::Step {
            step,
            loss: m.loss,
            lr: m.lr,
        });
        let due = cfg.eval_every > 0 && step % cfg.eval_every == 0;
        if due || step == cfg.steps {
            engine
                .update_weights(&trainer.named_parameters())
                .map_err(|e| {
                    Error::context(format!("handing step {step}'s weights to the engine"), e)
                })?;
            let result = evaluate(&mut engine, &val, &tokenizer, reward.as_mut(), &eval_cfg)?;
            report.evals.push((step, result.clone()));
            on_event(&SftEvent::Eval { step, result });
        }
    }
    trainer.model()?.save_dir(out)?;
    Ok(report)
}

fn trainer_config(cfg: &SftConfig) -> TrainerConfig {
    TrainerConfig {
        optim: OptimConfig {
            lr: cfg.lr,
            warmup_steps: cfg.warmup_steps as u64,
            // A tiny model far from overfitting 8,000 problems: no decay.
            weight_decay: 0.0,
            ..OptimConfig::default()
        },
        // The whole batch in one forward: a few hundred tokens.
        micro_batch: MicroBatchConfig {
            micro_batch_size: cfg.batch_size,
            ..Default::default()
        },
        value_head: None,
        ..TrainerConfig::default()
    }
}

/// `(prompt, response)` token ids of every problem, by prompt id: BOS and
/// the prompt's characters; the answer's characters and EOS.
fn tokenize(data: &Dataset, tok: &Tokenizer) -> Result<Vec<(Vec<u32>, Vec<u32>)>> {
    data.prompts
        .iter()
        .map(|p| {
            let prompt = p.encode(tok)?;
            let mut answer = tok.encode(&p.ground_truth, false)?;
            answer.push(vocab::EOS_ID);
            Ok((prompt, answer))
        })
        .collect()
}

/// Seeded initial weights for `cfg`, as transformers initialises them
/// (matrices normal with standard deviation `std`, norms one, biases zero).
/// colo-model's `Weights::random` draws from libtorch's global generator;
/// a checkpoint that is committed must be reproducible from its command.
pub fn random_weights(cfg: &ModelConfig, std: f64, seed: u64) -> Result<Weights> {
    let mut tensors = std::collections::HashMap::new();
    for (i, (name, shape)) in cfg.parameter_shapes().into_iter().enumerate() {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else if name.ends_with(".bias") {
            vec![0.0; n]
        } else {
            let mut g = SplitMix64::derive(seed, i as u64);
            (0..n).map(|_| (std * normal(&mut g)) as f32).collect()
        };
        let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        tensors.insert(
            name,
            Tensor::f_from_slice(&values)?.f_view(shape.as_slice())?,
        );
    }
    Ok(Weights::from_tensors(tensors))
}

/// A standard normal draw (Box–Muller).
fn normal(g: &mut SplitMix64) -> f64 {
    let unit = |g: &mut SplitMix64| ((g.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (u1, u2) = (unit(g), unit(g));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_weights_are_seeded_and_scaled() {
        let cfg = task::model_config();
        let a = random_weights(&cfg, 0.02, 1).unwrap();
        let b = random_weights(&cfg, 0.02, 1).unwrap();
        let c = random_weights(&cfg, 0.02, 2).unwrap();
        let name = "model.layers.0.mlp.up_proj.weight";
        let shape = [cfg.intermediate_size, cfg.hidden_size];
        let get = |w: &Weights| {
            Vec::<f32>::try_from(w.get(name, &shape).unwrap().flatten(0, -1)).unwrap()
        };
        assert_eq!(get(&a), get(&b));
        assert_ne!(get(&a), get(&c));
        let v = get(&a);
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32).sqrt();
        assert!(
            mean.abs() < 0.002 && (sd - 0.02).abs() < 0.001,
            "{mean} {sd}"
        );
        let norm =
            Vec::<f32>::try_from(a.get("model.norm.weight", &[cfg.hidden_size]).unwrap()).unwrap();
        assert!(norm.iter().all(|&x| x == 1.0));
    }
}
