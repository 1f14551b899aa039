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
//! # let trainer_params: Vec<(String, tch::Tensor)> = Vec::new();
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
//! · [`kv_cache`] (block storage in the pool) · [`attention`] (gathering a
//! batch's keys and values from the pages) · `forward` (prefill and batched decode from colo-model's
//! pieces) · `scheduler` (admission, copy on write, preemption) ·
//! [`Engine`] (`engine.rs`: generation; `memory.rs`: release, resume,
//! update_weights) · [`lora`] (LoRA adapters applied at decode rather than
//! merged at the switch) · [`tensor_parallel`] (one rank's slice of the model,
//! [`TensorParallel`], the group it sums over) · [`RolloutEngine`], the
//! trait the RL loop uses.
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
//! - **Allocated once, written in place.** The KV cache (one key and one
//!   value tensor per layer) and every weight are allocated once in their
//!   tags, each inside a one-allocation colo-mem `region`, and never reallocated, so
//!   addresses are stable across any number of release/resume cycles
//!   (what CUDA graphs need); `update_weights` `copy_`s into the existing
//!   storage under `no_grad`.
//! - **Preemption by recompute, never out of memory.** When blocks run
//!   out, the newest sequence is freed and later recomputed from its tokens
//!   (vLLM's recompute mode; no swap space). A request that could not fit
//!   even alone is refused when added.
//! - **Deterministic.** Each token's random number is a hash of (seed,
//!   sample index, step), not a shared RNG stream, so batching and
//!   preemption do not change which token is drawn (a counter-based
//!   generator per request: nothing to seed, store or advance; see
//!   [`sampling`]). Identical runs are bit-identical; across batchings the
//!   logits can differ by float rounding (matrix products of other shapes),
//!   so log-probs agree to ~1e-6 and tokens are the same unless a draw
//!   falls within that rounding of a boundary.
//! - **Log-probabilities the trainer can check.** Each token's log-prob is
//!   under the temperature-scaled distribution before top-k/top-p (the
//!   quantity a trainer recomputes); greedy requests report temperature 1.
//! - **libtorch's kernels, one forward per step.** Decode is one
//!   `(batch, 1)` forward of all running sequences through colo-model's
//!   pieces: the new keys and values go into the pages with one
//!   `index_copy_` per buffer, and each layer attends over K/V gathered
//!   from the pages with `index_select` into a reused scratch buffer, with
//!   two batched matrix products and a softmax ([`attention`]). Rows that
//!   share a prompt's blocks attend to that prefix together (its K/V read
//!   once per group) and to the rest alone, the two parts merged through
//!   their log-sum-exps (cascade attention). Sampling is vectorised over
//!   the batch ([`sampling`]); per step only token ids, positions and slot
//!   indices go to the device and only the chosen tokens and their
//!   log-probabilities come back. No hand-written kernels and no thread
//!   pool of our own: libtorch's intra-op threads parallelise every
//!   operation.
//! - **CUDA graphs for decode.** On CUDA a small model's decode step is
//!   bound by launching its kernels, so the engine replays it as CUDA
//!   graphs, one per (rows, keys) power-of-two bucket, with fixed input
//!   buffers and their memory in tag `cuda_graph`, paused and resumed with
//!   `kv_cache` ([`graphs`]; `EngineConfig::enforce_eager` turns it off).
//! - **The model's kind and device.** The engine runs whatever kind
//!   (float32, bfloat16, …) and device its weights have
//!   ([`Engine::from_dir_on`]); logits are sampled in float32.
//! - **Synchronous core, step API.** `add_request` + `step` (like vLLM's
//!   `LLMEngine`) with `generate` on top; lifecycle calls with requests in
//!   flight are errors, not waits.

pub mod attention;
pub mod block_table;
pub mod config;
mod engine;
mod error;
mod forward;
pub mod graphs;
pub mod kv_cache;
pub mod lora;
mod memory;
pub mod request;
pub mod sampling;
mod scheduler;
pub mod tensor_parallel;
mod weights;

use tch::Tensor;

pub use config::{EngineConfig, KvBudget, ValidConfig};
pub use engine::{Engine, EngineStats};
pub use error::{Error, Result};
pub use lora::DecodeLora;
pub use request::{Completion, FinishReason, Request, RequestOutput, SamplingParams};
pub use tensor_parallel::{LocalGroup, Shard, TensorParallel};
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
