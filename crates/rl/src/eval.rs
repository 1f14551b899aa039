//! Held-out evaluation with the rollout engine: greedy accuracy (what a run
//! reports as `eval/accuracy`) and pass@k at temperature 1 (how often
//! sampling finds the answer — the headroom GRPO can turn into accuracy).
//!
//! Both are one batched [`Engine::generate`] call over the whole set: the
//! engine's continuous batching schedules the prompts, so evaluating 500
//! short prompts costs a few decode steps of a large batch rather than 500
//! small generations. The RL loop calls [`greedy_accuracy`] before the first
//! step and at the end; `colo sft` calls [`evaluate`] to choose its
//! checkpoint by both numbers.
//!
//! A sample counts as right when its reward is at least [`RIGHT`] (rule
//! rewards score 0 or 1), so "accuracy" means the same thing whatever the
//! reward's scale of partial credit.

use colo_model::Tokenizer;
use colo_rollout::{Engine, Request, SamplingParams};

use crate::data::{Dataset, Prompt};
use crate::reward::{Reward, RewardInput};
use crate::{Error, Result};

/// The reward at or above which a sample counts as right.
pub const RIGHT: f32 = 1.0;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalConfig {
    /// Longest completion (the end-of-sequence token included).
    pub max_new_tokens: usize,
    /// Samples per prompt for pass@k at temperature 1; 0 skips pass@k.
    pub k: usize,
    /// Seed of the pass@k samples (greedy needs none).
    pub seed: u64,
    /// Evaluate only the first this many prompts (`None`: all).
    pub limit: Option<usize>,
    /// Token ids that end a completion (the model's end-of-sequence ids).
    pub stop_token_ids: Vec<u32>,
}

impl EvalConfig {
    /// Greedy accuracy only, ending completions at `stop_token_ids`.
    pub fn greedy(max_new_tokens: usize, stop_token_ids: Vec<u32>) -> Self {
        EvalConfig {
            max_new_tokens,
            k: 0,
            seed: 0,
            limit: None,
            stop_token_ids,
        }
    }
}

/// The measured numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalResult {
    /// Fraction (0..=1) of prompts whose greedy completion is right.
    pub accuracy: f64,
    /// Fraction of prompts with at least one right completion among `k`
    /// samples at temperature 1 (`None` when `k` is 0).
    pub pass_at_k: Option<f64>,
    pub k: usize,
    /// Mean length in tokens of the greedy completions (stop token included).
    pub mean_response_len: f64,
    /// Prompts evaluated.
    pub n: usize,
}

/// Greedy accuracy and, if `cfg.k > 0`, pass@k of `engine` on `data`.
pub fn evaluate(
    engine: &mut Engine,
    data: &Dataset,
    tokenizer: &Tokenizer,
    reward: &mut dyn Reward,
    cfg: &EvalConfig,
) -> Result<EvalResult> {
    let prompts = &data.prompts[..cfg.limit.unwrap_or(usize::MAX).min(data.len())];
    if prompts.is_empty() {
        return Err(Error::Dataset(
            "evaluation needs at least one prompt".into(),
        ));
    }
    let ids = prompts
        .iter()
        .map(|p| p.encode(tokenizer))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let greedy = SamplingParams {
        stop_token_ids: cfg.stop_token_ids.clone(),
        ..SamplingParams::greedy(cfg.max_new_tokens)
    };
    let (right, tokens) = score(engine, prompts, &ids, greedy, tokenizer, reward)?;
    let accuracy = frac(right.iter().filter(|r| r[0]).count(), prompts.len());
    let mean_response_len = tokens as f64 / prompts.len() as f64;
    let pass_at_k = match cfg.k {
        0 => None,
        k => {
            let sampled = SamplingParams {
                n: k,
                max_new_tokens: cfg.max_new_tokens,
                temperature: 1.0,
                stop_token_ids: cfg.stop_token_ids.clone(),
                seed: cfg.seed,
                ..SamplingParams::default()
            };
            let (right, _) = score(engine, prompts, &ids, sampled, tokenizer, reward)?;
            let hits = right.iter().filter(|r| r.iter().any(|&x| x)).count();
            Some(frac(hits, prompts.len()))
        }
    };
    Ok(EvalResult {
        accuracy,
        pass_at_k,
        k: cfg.k,
        mean_response_len,
        n: prompts.len(),
    })
}

/// Greedy accuracy only: the cheap number the RL loop logs.
pub fn greedy_accuracy(
    engine: &mut Engine,
    data: &Dataset,
    tokenizer: &Tokenizer,
    reward: &mut dyn Reward,
    cfg: &EvalConfig,
) -> Result<f64> {
    let cfg = EvalConfig {
        k: 0,
        ..cfg.clone()
    };
    Ok(evaluate(engine, data, tokenizer, reward, &cfg)?.accuracy)
}

fn frac(a: usize, b: usize) -> f64 {
    a as f64 / b as f64
}

/// Generates for every prompt in one batched call; returns, per prompt,
/// whether each completion is right, and the total completion tokens.
fn score(
    engine: &mut Engine,
    prompts: &[Prompt],
    ids: &[Vec<u32>],
    params: SamplingParams,
    tokenizer: &Tokenizer,
    reward: &mut dyn Reward,
) -> Result<(Vec<Vec<bool>>, usize)> {
    let requests = ids
        .iter()
        .map(|p| Request::new(p.clone(), params.clone()))
        .collect();
    let outputs = engine
        .generate(requests)
        .map_err(|e| Error::context("evaluation", e))?;
    let mut texts = Vec::new();
    let mut tokens = 0;
    for (p, out) in prompts.iter().zip(outputs) {
        let out = out.map_err(|e| Error::context(format!("evaluating prompt {:?}", p.text), e))?;
        for c in out.completions {
            tokens += c.tokens.len();
            texts.push((p, tokenizer.decode(&c.tokens, true)?));
        }
    }
    let inputs: Vec<RewardInput<'_>> = texts
        .iter()
        .enumerate()
        .map(|(i, (p, text))| RewardInput {
            sample: i as u64,
            prompt_id: p.prompt_id,
            prompt: &p.text,
            completion: text,
            ground_truth: &p.ground_truth,
            extra: Some(&p.extra),
        })
        .collect();
    let scores = reward.score_batch(&inputs)?;
    let right = scores
        .chunks(params.n)
        .map(|c| c.iter().map(|&s| s >= RIGHT).collect())
        .collect();
    Ok((right, tokens))
}
