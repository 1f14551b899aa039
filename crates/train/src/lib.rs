//! # colo-train: the training engine
//!
//! Trains a [`colo_model::Model`] (Qwen2 / Llama on libtorch through
//! `tch`) for colo's RL loop: per-token log-probabilities and entropy of
//! given sequences (a no-grad scoring pass for old and reference
//! log-probs), a value head for a critic, policy updates with colo-algo's
//! PPO/GSPO loss, KL loss and aggregation, a supervised step, AdamW,
//! global gradient-norm clipping, micro-batches with gradient
//! accumulation, warmup + constant/cosine learning rates, offload of
//! parameters / gradients / optimizer state to host memory and back, and
//! atomic checkpoints. float32 or bfloat16 parameters, on the CPU or a
//! CUDA GPU ([`TrainerConfig::kind`], [`TrainerConfig::device`]).
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
//! let advantages = seqs.response_mask() * 0.5; // (batch, seq)
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
//! | `train_params` | parameters (and the value head), in the engine's kind | Backup |
//! | `train_grads` | one float32 gradient accumulator per parameter | Backup |
//! | `optimizer` | AdamW's two float32 moments per parameter (and float32 master weights for bf16) | Backup |
//! | `activations` | forward/backward transients and the optimizer's temporaries (while a pass runs) | the pool's default |
//!
//! Each parameter, accumulator and optimizer tensor is a single
//! allocation made by libtorch inside `region_with_threshold(tag, 1)` when
//! the engine is built; optimizer steps, accumulation and checkpoint loads
//! write into it with in-place ops under `tch::no_grad`, so it keeps its
//! address and its tag forever, and [`TrainEngine::offload`] /
//! [`TrainEngine::reload`] are plain pause / resume of the tags.
//!
//! # Design decisions
//!
//! - **A trait for the loop, one implementation.** [`TrainEngine`] is what
//!   colo-rl calls; [`ColoTrainer`] implements it on libtorch.
//! - **libtorch does the arithmetic.** Forward and backward are autograd's;
//!   the log-probabilities are `log_softmax` + `gather` ([`ops`]), AdamW is
//!   libtorch's in-place element-wise ops ([`adamw`]).
//! - **Gradients are returned, then accumulated in place.** Each
//!   micro-batch's backward returns the parameters' gradients
//!   (`torch.autograd.grad`); they are added into the `train_grads`
//!   accumulators and dropped. No `.grad` is ever set, so autograd holds
//!   no gradient memory between micro-batches.
//! - **Batch-wide denominators.** Each micro-batch's loss divides by the
//!   whole batch's token or sequence count (colo-algo's `AggScale`), so
//!   the accumulated gradient equals the full-batch gradient (tested).
//! - **No graph for scoring.** Scoring runs the same model under
//!   `tch::no_grad`: no autograd graph, no activations kept.
//! - **LM head on the response window only**, so long prompts cost no
//!   (seq, vocab) logits, and one (batch, window, vocab) float32 tensor is
//!   kept for the backward.
//! - **Results are not in discardable memory.** Scoring writes each
//!   micro-batch's small (rows, window) result into (batch, seq) tensors
//!   made outside any region; the large tensors never leave the pass.
//!   Callers build batches on the CPU and read results on the CPU: the
//!   engine moves each micro-batch to its device and hands log-probs,
//!   entropy and values back as float32 CPU tensors (no copy on the CPU).
//! - **Mixed precision for bf16**: float32 accumulators, moments and
//!   master weights, float32 log-probabilities.
//! - **Misuse is an error**: training while something is offloaded,
//!   offloading twice, a checkpoint of the wrong shape (naming the tensor),
//!   CUDA without a GPU, a pool of another device than the engine's (a
//!   CUDA engine needs a CUDA pool, whose regions route libtorch's CUDA
//!   allocations into the tags).

pub mod adamw;
pub mod batch;
mod buffers;
pub mod checkpoint;
pub mod checkpointing;
pub mod collective;
pub mod config;
pub mod engine;
mod error;
mod forward;
mod lanes;
pub mod lora;
pub mod losses;
pub mod offload;
pub mod ops;
pub mod optimizer_shards;
mod param_lanes;
pub mod schedule;
mod scorer;
pub mod shard_read;
mod sharded_checkpoint;
mod sharded_pass;
mod sharded_trainer;
pub mod sharding;
pub mod trainer;
pub mod value_head;

pub use adamw::{AdamW, AdamWParams};
pub use batch::{CriticBatch, PolicyBatch, SeqBatch};
pub use buffers::storage_addr;
pub use collective::{Collective, ReduceOp, Solo, Traffic};
pub use config::{
    check_target, device_name, kind_name, parse_device, parse_kind, MicroBatchConfig, MicroBatches,
    Optim, OptimConfig, Split,
};
pub use engine::{
    CriticMetrics, ParamVisitor, PolicyMetrics, Scores, SftMetrics, StepStats, TrainEngine,
};
pub use error::{Error, Result};
pub use lora::{Lora, LoraConfig, TargetModules};
pub use losses::{CriticLossConfig, LossConfig};
pub use offload::Offload;
pub use schedule::{LrSchedule, ScheduleKind};
pub use scorer::Scorer;
pub use shard_read::ShardRead;
pub use trainer::{ColoTrainer, TrainerConfig, ValueHeadConfig};
pub use value_head::{ValueHead, VALUE_HEAD_WEIGHT};
