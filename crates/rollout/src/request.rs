//! What callers submit and what they get back.

use serde::{Deserialize, Serialize};

/// How to sample the completions of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Completions per prompt; they share the prompt's KV blocks.
    pub n: usize,
    pub max_new_tokens: usize,
    /// 0 is greedy; otherwise logits are divided by it.
    pub temperature: f64,
    /// Keep the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches
    /// `top_p`, in (0, 1] (1: all).
    pub top_p: f64,
    /// Generating one of these ends the completion (the token is kept).
    pub stop_token_ids: Vec<u32>,
    /// The decoded completion containing one of these ends it (the tokens
    /// up to and including the one that completes the match are kept).
    /// Needs an engine with a tokenizer.
    pub stop_strings: Vec<String>,
    /// Completion `i` draws its random numbers from `(seed, i, step)`.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            max_new_tokens: 16,
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of `max_new_tokens`.
    pub fn greedy(max_new_tokens: usize) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_new_tokens,
            ..Self::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Why these parameters cannot be used, if they cannot.
    pub fn check(&self) -> Option<String> {
        if self.n == 0 {
            return Some("n must be at least 1".into());
        }
        if self.max_new_tokens == 0 {
            return Some("max_new_tokens must be at least 1".into());
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Some(format!(
                "temperature must be finite and ≥ 0, got {}",
                self.temperature
            ));
        }
        if self.top_k == Some(0) {
            return Some("top_k must be at least 1 (or absent)".into());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Some(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return Some("stop strings must not be empty".into());
        }
        None
    }
}

/// One prompt to complete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
}

impl Request {
    pub fn new(prompt: Vec<u32>, params: SamplingParams) -> Self {
        Request { prompt, params }
    }
}

/// Why a completion ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_new_tokens` generated, or the model's context is full.
    Length,
    /// A stop token id was generated (it is the last token).
    StopToken(u32),
    /// The text contains this stop string.
    StopString(String),
}

impl FinishReason {
    /// The OpenAI / vLLM name: `length` or `stop`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::StopToken(_) | FinishReason::StopString(_) => "stop",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One sampled continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// Generated token ids only (no prompt).
    pub tokens: Vec<u32>,
    /// `log p(tokens[i])` under the distribution it was sampled from:
    /// temperature applied, before top-k / top-p truncation (temperature 1
    /// for greedy requests). The quantity a trainer recomputes.
    pub logprobs: Vec<f32>,
    pub finish_reason: FinishReason,
}

/// The completions of one request, in sample order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestOutput {
    pub id: u64,
    pub completions: Vec<Completion>,
}
