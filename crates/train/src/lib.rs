//! # colo-train: the training engine
//!
//! Trains a [`colo_model::Model`] (Qwen2 / Llama on candle) for colo's RL
//! loop: per-token log-probabilities and entropy of given sequences (a
//! no-grad scoring pass for old and reference log-probs), a value head for
//! a critic, policy updates with colo-algo's PPO/GSPO loss, KL loss and
//! aggregation, a supervised step, AdamW, global gradient-norm clipping,
//! micro-batches with gradient accumulation, warmup + constant/cosine
//! learning rates, offload of parameters / gradients / optimizer state to
//! host memory and back, and atomic checkpoints.
//!
//! ```no_run
//! use colo_mem::{Pool, PoolConfig};
//! use colo_train::{
//!     ColoTrainer, LossConfig, Offload, PolicyBatch, SeqBatch, TrainEngine, TrainerConfig,
//! };
//!
//! # fn main() -> colo_train::Result<()> {
//! let pool = Pool::host(PoolConfig::default())?;
//! let mut engine =
//!     ColoTrainer::from_dir(pool, "testdata/tiny-qwen2".as_ref(), &TrainerConfig::default())?;
//! // Two right-padded sequences: prompt, then the response that is trained.
//! let seqs = SeqBatch::from_prompt_response(&[(&[1, 5, 9], &[7, 7, 2]), (&[1, 4], &[3, 2])], 0)?;
//! let old = engine.score(&seqs, false)?.log_probs; // (batch, seq), no grad
//! let advantages = seqs.response_mask().affine(0.5, 0.0)?; // (batch, seq)
//! let batch = PolicyBatch::new(seqs, &old, &advantages, None, None)?;
//! let m = engine.update_policy(&batch, &LossConfig::default())?;
//! println!("pg_loss {} grad_norm {} lr {}", m.pg_loss, m.grad_norm, m.lr);
//! engine.offload(Offload::ALL)?; // the rollout engine gets the memory
//! engine.reload(Offload::ALL)?;
//! engine.save_checkpoint("ckpt/step-1".as_ref())?;
//! # Ok(())
//! # }
//! ```
//!
//! # Shapes
//!
//! Batches are right-padded token sequences, (batch, seq). Every per-token
//! tensor in and out — log-probs, entropy, advantages, values, masks — is
//! (batch, seq) float32 aligned with the tokens: column `t` belongs to
//! token `t` (its log-probability is that of token `t` given the tokens
//! before it). The response mask says which columns count.
//!
//! # Memory
//!
//! | tag (`colo_mem::tags`) | holds | policy |
//! |---|---|---|
//! | `train_params` | parameters (and the value head) | Backup |
//! | `train_grads` | one gradient accumulator per parameter | Backup |
//! | `optimizer` | AdamW's two moments per parameter | Backup |
//! | `activations` | forward/backward transients (while a pass runs) | the pool's default |
//!
//! Each parameter, accumulator and moment is a single allocation made when
//! the engine is built; optimizer steps, accumulation and checkpoint loads
//! write into it in place, so it keeps its address and its tag forever,
//! and [`TrainEngine::offload`] / [`TrainEngine::reload`] are plain
//! pause / resume of the tags.
//!
//! # Design decisions
//!
//! - **A trait for the loop, one implementation.** [`TrainEngine`] is what
//!   colo-rl calls; [`ColoTrainer`] implements it on candle, float32 on the
//!   CPU.
//! - **Hand-written AdamW and accumulation over raw slices**
//!   ([`adamw`]): one pass per parameter that reads the accumulated
//!   gradient, folds in the clipping coefficient, and updates the moments
//!   and the parameter in place — no temporaries, no reallocation, and
//!   PyTorch's arithmetic.
//! - **Batch-wide denominators.** Each micro-batch's loss divides by the
//!   whole batch's token or sequence count (colo-algo's `AggScale`), so
//!   the accumulated gradient equals the full-batch gradient (tested).
//! - **No graph for scoring.** A second model shares the parameters'
//!   storage through detached tensors; scoring passes build no autograd
//!   graph and keep no activations alive.
//! - **LM head on the response window only**, so long prompts cost no
//!   (seq, vocab) logits, and the log-probabilities are one fused op with a
//!   hand-written backward ([`ops::token_logprobs`]) instead of six passes
//!   over the logits and as many backward.
//! - **Results never live in discardable memory.** Tensors returned by a
//!   pass are copied out of the `activations` tag before they are handed
//!   back.
//! - **Misuse is an error**: training while something is offloaded,
//!   offloading twice, a checkpoint of the wrong shape (naming the tensor).

pub mod adamw;
pub mod batch;
mod buffers;
pub mod checkpoint;
pub mod config;
pub mod engine;
mod error;
mod forward;
pub mod losses;
pub mod offload;
pub mod ops;
pub mod schedule;
pub mod trainer;
pub mod value_head;

pub use adamw::{AdamW, AdamWParams};
pub use batch::{CriticBatch, PolicyBatch, SeqBatch};
pub use buffers::storage_addr;
pub use config::{MicroBatchConfig, MicroBatches, Optim, OptimConfig};
pub use engine::{CriticMetrics, PolicyMetrics, Scores, SftMetrics, StepStats, TrainEngine};
pub use error::{Error, Result};
pub use losses::{CriticLossConfig, LossConfig};
pub use offload::Offload;
pub use schedule::{LrSchedule, ScheduleKind};
pub use trainer::{ColoTrainer, TrainerConfig, ValueHeadConfig};
pub use value_head::{ValueHead, VALUE_HEAD_WEIGHT};
