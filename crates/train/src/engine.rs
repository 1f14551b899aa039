//! The interface the RL loop drives, and the typed results it gets back.
//!
//! A small trait so that the loop does not depend on how the engine runs
//! (colo's libtorch implementation is [`crate::ColoTrainer`]; a second
//! backend implements the same methods instead of copying the worker).

use std::path::Path;

use serde::Serialize;
use tch::Tensor;

use crate::batch::{CriticBatch, PolicyBatch, SeqBatch};
use crate::losses::{CriticLossConfig, LossConfig};
use crate::offload::Offload;
use crate::Result;

/// Per-token results of a no-grad scoring pass, (batch, seq) float32,
/// aligned with the tokens (column `t`: token `t` given the ones before
/// it), zero outside the response mask, on the CPU whatever the engine's
/// device, in ordinary memory (not in a discardable pool tag).
#[derive(Debug)]
pub struct Scores {
    pub log_probs: Tensor,
    /// Entropy of the next-token distribution that produced token `t`, if
    /// asked for.
    pub entropy: Option<Tensor>,
}

impl Clone for Scores {
    /// Shares the tensors.
    fn clone(&self) -> Self {
        Scores {
            log_probs: self.log_probs.shallow_clone(),
            entropy: self.entropy.as_ref().map(Tensor::shallow_clone),
        }
    }
}

/// What one optimizer step did (common to every kind of update).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepStats {
    /// Global L2 norm of the accumulated gradient *before* clipping.
    pub grad_norm: f64,
    /// The learning rate this step used.
    pub lr: f64,
    /// Micro-batches accumulated.
    pub micro_batches: usize,
    /// False when the gradient norm was not finite: nothing was changed.
    pub updated: bool,
}

/// Metrics of one policy update (verl's `actor/…` names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PolicyMetrics {
    /// The policy-gradient loss of the whole batch.
    pub pg_loss: f64,
    pub pg_clipfrac: f64,
    pub pg_clipfrac_lower: f64,
    /// k1 estimate of KL(π_old ‖ π_θ) over response tokens.
    pub ppo_kl: f64,
    /// Entropy of the policy, aggregated like the loss.
    pub entropy: f64,
    /// The KL-to-reference loss term, when the config has one.
    pub kl_loss: Option<f64>,
    pub grad_norm: f64,
    pub lr: f64,
}

/// Metrics of one supervised step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SftMetrics {
    /// Mean next-token cross-entropy over the response tokens.
    pub loss: f64,
    pub tokens: usize,
    pub grad_norm: f64,
    pub lr: f64,
}

/// Metrics of one critic update (verl's `critic/…` names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CriticMetrics {
    pub vf_loss: f64,
    pub vf_clipfrac: f64,
    /// Mean predicted value over response tokens.
    pub vpred_mean: f64,
    pub grad_norm: f64,
    pub lr: f64,
}

/// What [`TrainEngine::visit_parameters`] calls with named parameters.
pub type ParamVisitor<'a> = dyn FnMut(&[(String, Tensor)]) -> Result<()> + 'a;

/// A training engine for one model on one device.
///
/// Batches are right-padded (batch, seq) token sequences ([`SeqBatch`]);
/// every per-token tensor in and out is (batch, seq) float32, aligned with
/// the tokens.
pub trait TrainEngine {
    /// Log-probabilities (and entropy) of the response tokens without a
    /// gradient, in micro-batches: old and reference log-probs, (batch,
    /// seq) float32 on the CPU.
    fn score(&mut self, batch: &SeqBatch, with_entropy: bool) -> Result<Scores>;

    /// The critic's value of each response token, no gradient, (batch,
    /// seq) float32 on the CPU. Needs a value head.
    fn values(&mut self, batch: &SeqBatch) -> Result<Tensor>;

    /// One optimizer step on the policy loss (PPO/GSPO, optional entropy
    /// bonus and KL loss), accumulated over micro-batches.
    fn update_policy(&mut self, batch: &PolicyBatch, cfg: &LossConfig) -> Result<PolicyMetrics>;

    /// One optimizer step on the clipped value loss. Needs a value head.
    fn update_critic(
        &mut self,
        batch: &CriticBatch,
        cfg: &CriticLossConfig,
    ) -> Result<CriticMetrics>;

    /// One optimizer step on the next-token cross-entropy of the response
    /// tokens (supervised fine-tuning).
    fn sft_step(&mut self, batch: &SeqBatch) -> Result<SftMetrics>;

    /// Calls `visit` with the model's parameters (Hugging Face names, no
    /// value head): all at once, or for a sharded engine one unit at a
    /// time, gathered for the call and released after (every peer must
    /// call it). What the rollout engine's weight sync reads.
    fn visit_parameters(&self, visit: &mut ParamVisitor<'_>) -> Result<()> {
        visit(&self.named_parameters())
    }

    /// The bytes this engine's all-gathers have sent to and received from
    /// its peers since it was built (a sharded engine's; `None` for one
    /// that gathers nothing). Read around [`TrainEngine::visit_parameters`]
    /// it is what a weight sync moved.
    fn gathered_traffic(&self) -> Option<crate::Traffic> {
        None
    }

    /// Moves the chosen parts of the state to host memory. Cached
    /// activation blocks stay mapped: [`TrainEngine::release_cache`] returns
    /// them, when something else needs the room.
    fn offload(&mut self, what: Offload) -> Result<()>;

    /// Brings offloaded parts back, bit-exactly, at the same addresses.
    fn reload(&mut self, what: Offload) -> Result<()>;

    /// Returns cached transient memory (activations) to the device.
    fn release_cache(&mut self) -> u64;

    /// The parameters under their Hugging Face names, sharing storage (for
    /// handing weights to the rollout engine). Valid while the parameters
    /// are resident.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;

    /// Optimizer steps taken.
    fn step(&self) -> u64;

    /// Writes model, optimizer and step atomically to `dir`.
    fn save_checkpoint(&self, dir: &Path) -> Result<()>;

    /// [`TrainEngine::save_checkpoint`] with `global_step`, the caller's
    /// step count, in the checkpoint's state, and `extra` run on the
    /// temporary directory before the rename, so that the files a caller
    /// adds (a tokenizer, its own state) are part of the same atomic
    /// checkpoint.
    fn save_checkpoint_with<E: From<crate::Error>>(
        &self,
        dir: &Path,
        global_step: Option<u64>,
        extra: impl FnOnce(&Path) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E>
    where
        Self: Sized;

    /// Writes the model alone as a Hugging Face directory (`config.json`
    /// and the weights, in the engine's kind): what a rollout engine is
    /// built from. Needs the parameters resident.
    fn save_model(&self, dir: &Path) -> Result<()>;

    /// Restores model, optimizer and step from a checkpoint of the same
    /// shapes.
    fn load_checkpoint(&mut self, dir: &Path) -> Result<()>;
}
