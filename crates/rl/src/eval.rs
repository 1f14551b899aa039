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

use std::collections::BTreeMap;

use colo_model::Tokenizer;
use colo_rollout::{Engine, Request, SamplingParams};
use serde::{Deserialize, Serialize};

use crate::data::{Dataset, Prompt};
use crate::reward::{Reward, RewardInput, Scored};
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
    /// Keep each prompt's greedy completion ([`EvalResult::generations`]).
    pub keep_generations: bool,
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
            keep_generations: false,
        }
    }
}

/// The measured numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalResult {
    /// The greedy completions' tally (what workers add up; its
    /// [`Tally::accuracy`] and [`Tally::score_mean`] are the result's).
    pub all: Tally,
    /// The greedy completions' tallies per `data_source` of the rows
    /// (verl's per-source validation metrics); empty when no row names one.
    pub by_source: BTreeMap<String, Tally>,
    /// Fraction of prompts with at least one right completion among `k`
    /// samples at temperature 1 (`None` when `k` is 0).
    pub pass_at_k: Option<f64>,
    pub k: usize,
    /// Mean length in tokens of the greedy completions (stop token included).
    pub mean_response_len: f64,
    /// Each prompt's greedy completion, when [`EvalConfig::keep_generations`].
    pub generations: Vec<EvalGeneration>,
}

/// One prompt's greedy completion and its reward.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalGeneration {
    /// The prompt as the model saw it, special tokens left out.
    pub input: String,
    pub output: String,
    pub ground_truth: String,
    pub scored: Scored,
}

impl EvalResult {
    /// Prompts evaluated.
    pub fn n(&self) -> usize {
        self.all.n
    }

    /// Fraction (0..=1) of prompts whose greedy completion is right.
    pub fn accuracy(&self) -> f64 {
        self.all.accuracy()
    }

    /// Mean reward of the greedy completions (the accuracy for a 0/1
    /// rule; partial credit shows here).
    pub fn score_mean(&self) -> f64 {
        self.all.score_mean()
    }
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
    let (scores, tokens, texts) = score(engine, prompts, &ids, greedy, tokenizer, reward)?;
    let first: Vec<&Scored> = scores.iter().map(|s| &s[0]).collect();
    let mut generations = Vec::new();
    if cfg.keep_generations {
        for ((p, ids), (output, scored)) in
            prompts.iter().zip(&ids).zip(texts.into_iter().zip(&first))
        {
            generations.push(EvalGeneration {
                input: tokenizer.decode(ids, true)?,
                output,
                ground_truth: p.ground_truth.clone(),
                scored: (*scored).clone(),
            });
        }
    }
    let all = Tally::of(&first);
    let mut by_source: BTreeMap<String, Vec<&Scored>> = BTreeMap::new();
    if prompts.iter().any(|p| data_source(p).is_some()) {
        for (p, &s) in prompts.iter().zip(&first) {
            let source = data_source(p).unwrap_or(UNKNOWN_SOURCE);
            by_source.entry(source.to_owned()).or_default().push(s);
        }
    }
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
            let (scores, ..) = score(engine, prompts, &ids, sampled, tokenizer, reward)?;
            let hits = scores
                .iter()
                .filter(|s| s.iter().any(|x| x.score >= RIGHT))
                .count();
            Some(frac(hits, prompts.len()))
        }
    };
    Ok(EvalResult {
        all,
        by_source: by_source
            .into_iter()
            .map(|(k, v)| (k, Tally::of(&v)))
            .collect(),
        pass_at_k,
        k: cfg.k,
        mean_response_len,
        generations,
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
    Ok(evaluate(engine, data, tokenizer, reward, &cfg)?.accuracy())
}

fn frac(a: usize, b: usize) -> f64 {
    a as f64 / b as f64
}

/// The group of rows without a `data_source` when others have one (verl's
/// name for it).
pub const UNKNOWN_SOURCE: &str = "unknown";

/// A row's `data_source`, if it names one.
fn data_source(p: &Prompt) -> Option<&str> {
    p.extra.get(crate::reward::verl::DATA_SOURCE)?.as_str()
}

/// Sums over evaluated prompts (one greedy completion each): what the
/// data-parallel controller adds up across workers before it divides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Prompts whose completion scored at least [`RIGHT`].
    pub right: usize,
    /// Σ reward.
    pub score_sum: f64,
    /// Prompts.
    pub n: usize,
    /// The numbers the reward returned beside its scores ([`Scored::extra`]),
    /// by name: each one's sum over the completions that returned it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Sum>,
}

/// A sum and how many values went into it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Sum {
    pub sum: f64,
    pub n: usize,
}

impl std::ops::AddAssign for Sum {
    fn add_assign(&mut self, other: Sum) {
        (self.sum, self.n) = (self.sum + other.sum, self.n + other.n);
    }
}

impl Tally {
    pub(crate) fn of(scores: &[&Scored]) -> Self {
        let mut extra: BTreeMap<String, Sum> = BTreeMap::new();
        for (name, &sum) in scores.iter().flat_map(|s| &s.extra) {
            *extra.entry(name.clone()).or_default() += Sum { sum, n: 1 };
        }
        Tally {
            right: scores.iter().filter(|s| s.score >= RIGHT).count(),
            score_sum: scores.iter().map(|s| f64::from(s.score)).sum(),
            n: scores.len(),
            extra,
        }
    }

    /// Why these counts cannot come from one evaluation, if they cannot:
    /// more right than evaluated, a sum that is not finite, an extra
    /// counted over more completions than there are.
    pub fn inconsistency(&self) -> Option<String> {
        let n = self.n;
        if self.right > n {
            return Some(format!("right = {} of n = {n} prompts", self.right));
        }
        if !self.score_sum.is_finite() {
            return Some(format!("score_sum = {}", self.score_sum));
        }
        (self.extra.iter())
            .find(|(_, s)| s.n > n || !s.sum.is_finite())
            .map(|(name, s)| format!("extra {name:?}: sum {} over {} of n = {n}", s.sum, s.n))
    }

    /// Fraction right (0 for no prompts).
    pub fn accuracy(&self) -> f64 {
        frac(self.right, self.n.max(1))
    }

    /// Mean reward (0 for no prompts).
    pub fn score_mean(&self) -> f64 {
        self.score_sum / self.n.max(1) as f64
    }

    /// The mean of each extra number over the completions that returned it
    /// (verl's `val-aux/…/{name}/mean@1`).
    pub fn extra_means(&self) -> BTreeMap<String, f64> {
        (self.extra.iter())
            .map(|(name, s)| (name.clone(), s.sum / s.n.max(1) as f64))
            .collect()
    }
}

/// Two parts' tallies together.
impl std::ops::Add for Tally {
    type Output = Tally;

    fn add(mut self, other: Tally) -> Tally {
        for (name, s) in other.extra {
            *self.extra.entry(name).or_default() += s;
        }
        Tally {
            right: self.right + other.right,
            score_sum: self.score_sum + other.score_sum,
            n: self.n + other.n,
            extra: self.extra,
        }
    }
}

/// Generates for every prompt in one batched call; returns, per prompt,
/// each completion's reward (with its extra numbers), the total
/// completion tokens, and the completions' texts in order.
fn score(
    engine: &mut Engine,
    prompts: &[Prompt],
    ids: &[Vec<u32>],
    params: SamplingParams,
    tokenizer: &Tokenizer,
    reward: &mut dyn Reward,
) -> Result<(Vec<Vec<Scored>>, usize, Vec<String>)> {
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
    let scores = (reward.score_batch_extra(&inputs))
        .and_then(|s| crate::reward::finite(&reward.name(), &inputs, s))
        .map_err(|e| crate::data::with_origin(e, prompts))?;
    Ok((
        scores.chunks(params.n).map(<[Scored]>::to_vec).collect(),
        tokens,
        texts.into_iter().map(|(_, t)| t).collect(),
    ))
}
