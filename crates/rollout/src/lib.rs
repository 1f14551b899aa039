//! # colo-rollout: the generation engine of colo
//!
//! Generates completions for RL: `n` samples per prompt with per-token
//! log-probabilities, over a **paged KV cache** that lives in colo-mem's
//! `kv_cache` tag and **weights** in the `weights` tag, so that the RL loop
//! can release both while the trainer runs and bring them back — at the same
//! addresses — in stages (weights, weight update, then KV cache: SGLang's
//! multi-stage awake).
//!
//! ```no_run
//! use colo_mem::{Pool, PoolConfig};
//! use colo_rollout::{Engine, EngineConfig, Request, SamplingParams};
//!
//! let pool = Pool::host(PoolConfig::default())?;
//! let dir = std::path::Path::new("testdata/tiny-qwen2");
//! let mut engine = Engine::from_dir(dir, pool, &EngineConfig::with_kv_tokens(4096))?;
//! let params = SamplingParams { n: 8, max_new_tokens: 64, temperature: 1.0, seed: 7, ..Default::default() };
//! let out = engine.generate(vec![Request::new(vec![278, 28, 274], params)])?;
//! for c in &out[0].as_ref().unwrap().completions {
//!     println!("{:?} {:?} {}", c.tokens, c.logprobs, c.finish_reason);
//! }
//! // Colocated step: free the memory for training, then wake in stages.
//! engine.release(&["weights", "kv_cache"])?;
//! # let trainer_params: Vec<(String, candle_core::Tensor)> = Vec::new();
//! engine.resume(&["weights"])?;
//! engine.update_weights(&trainer_params)?; // in place, addresses unchanged
//! engine.resume(&["kv_cache"])?;
//! # Ok::<(), colo_rollout::Error>(())
//! ```
//!
//! # Layout
//!
//! [`config`] (`EngineConfig` → validated) · [`request`] (what goes in and
//! comes out) · [`sampling`] · [`block_table`] (free list, reference counts)
//! · [`kv_cache`] (block storage in the pool) · [`attention`] (paged decode
//! attention) · `forward` (prefill and batched decode from colo-model's
//! pieces) · `scheduler` (admission, copy on write, preemption) ·
//! [`Engine`] (`engine.rs`: generation; `memory.rs`: release, resume,
//! update_weights) · [`RolloutEngine`], the trait the RL loop uses.
//!
//! # Design decisions
//!
//! - **Blocks as in vLLM, sizing as in SGLang.** Fixed-size blocks, a block
//!   table per sequence, reference counts for sharing; the pool is a
//!   fraction of the capacity left after the weights (`mem_fraction`, like
//!   `mem_fraction_static`) or an explicit token count.
//! - **One prefill per prompt.** A request's prompt is prefilled once; its
//!   `n` samples fork from it sharing the prompt's blocks, and the last,
//!   partial block is copied on the first write (copy on write). No radix
//!   tree or cross-request prefix cache: RL prompts rarely repeat across
//!   requests, and it keeps `release(kv_cache)` trivially safe.
//! - **Allocated once, written in place.** Every KV buffer and every weight
//!   is allocated once in its tag and never reallocated, so addresses are
//!   stable across any number of release/resume cycles (what CUDA graphs
//!   need); `update_weights` copies into the existing storage.
//! - **Preemption by recompute, never out of memory.** When blocks run
//!   out, the newest sequence is freed and later recomputed from its tokens
//!   (vLLM's recompute mode; no swap space). A request that could not fit
//!   even alone is refused when added.
//! - **Deterministic.** Each token's random number is a hash of (seed,
//!   sample index, step), not a shared RNG stream, so batching and
//!   preemption do not change which token is drawn.
//! - **Log-probabilities the trainer can check.** Each token's log-prob is
//!   under the temperature-scaled distribution before top-k/top-p (the
//!   quantity a trainer recomputes); greedy requests report temperature 1.
//! - **CPU kernels where candle would copy.** Decode is one `(batch, 1)`
//!   forward of all running sequences through colo-model's projections and
//!   MLP; attention reads the blocks in place in plain Rust (rayon over
//!   sequences) instead of gathering and padding K/V tensors. float32 on
//!   the CPU only, for now.
//! - **Synchronous core, step API.** `add_request` + `step` (like vLLM's
//!   `LLMEngine`) with `generate` on top; lifecycle calls with requests in
//!   flight are errors, not waits.

pub mod attention;
pub mod block_table;
pub mod config;
mod engine;
mod error;
mod forward;
pub mod kv_cache;
mod memory;
pub mod request;
pub mod sampling;
mod scheduler;
mod weights;

use candle_core::Tensor;

pub use config::{EngineConfig, KvBudget, ValidConfig};
pub use engine::{Engine, EngineStats};
pub use error::{Error, Result};
pub use request::{Completion, FinishReason, Request, RequestOutput, SamplingParams};
pub use weights::{data_address, WeightUpdate};

/// What the RL loop needs from a rollout engine; [`Engine`] implements it.
pub trait RolloutEngine {
    /// Completions for every request (each entry fails on its own).
    fn generate(&mut self, requests: Vec<Request>) -> Result<Vec<Result<RequestOutput>>>;
    /// Releases the memory of `tags` (`weights`, `kv_cache`).
    fn release(&mut self, tags: &[&str]) -> Result<()>;
    /// Brings `tags` back at the same addresses.
    fn resume(&mut self, tags: &[&str]) -> Result<()>;
    /// Writes named tensors into the weights in place.
    fn update_weights(&mut self, tensors: &[(String, Tensor)]) -> Result<WeightUpdate>;
}

impl RolloutEngine for Engine {
    fn generate(&mut self, requests: Vec<Request>) -> Result<Vec<Result<RequestOutput>>> {
        Engine::generate(self, requests)
    }
    fn release(&mut self, tags: &[&str]) -> Result<()> {
        Engine::release(self, tags)
    }
    fn resume(&mut self, tags: &[&str]) -> Result<()> {
        Engine::resume(self, tags)
    }
    fn update_weights(&mut self, tensors: &[(String, Tensor)]) -> Result<WeightUpdate> {
        Engine::update_weights(self, tensors)
    }
}
